// The reduction emitter's plan: what a group is, decided once, without LLVM (reduction_internal.h).
#include "codegen/kernels/reduction_internal.h"

#include <algorithm>
#include <string>
#include <vector>

namespace sf::reduction_detail {

Diag diag(std::string msg, SourceLoc loc) { return Diag{"", loc, "reduction: " + std::move(msg)}; }

bool is_reduce(OpKind k) { return op_info(k).category == OpCategory::Reduce; }

std::string who(const Node& n) { return std::string(op_name(n.op)) + (n.name.empty() ? "" : " '" + n.name + "'"); }

namespace {

std::string dims_str(const std::vector<int>& d) { return shape_str(Shape(d.begin(), d.end())); }

bool is_pow2(int64_t v) { return v > 0 && (v & (v - 1)) == 0; }

// ---- the plan: what the group is, decided once, without LLVM ------------------------------

// The most elements of a row one thread holds in registers: beyond it the row is
// folded in passes that read it again (Inductor's persistent and looped reductions).
constexpr int64_t kPersistentElems = 32;

// Persistent rows when a thread's share fits kPersistentElems and the row is not split
// over blocks. Vector slots (the thread's elements of one slot adjacent in memory)
// when the reduced dims are X's innermost, so that a row is contiguous: as wide as
// 16 bytes of the narrowest dtype read or written in X space allows, dividing n. Rows
// too long for registers, and split rows, keep the vector width for their loops.
void decide_persistent(Plan& p, const Graph& g, const KernelConfig& c) {
  if (p.n <= 0) return;
  const int64_t tpr = c.threads_per_row;
  int v = 1;
  if (p.red_map.contiguous()) {
    int64_t narrow = 8;
    for (ValueId v : g.params()) narrow = std::min<int64_t>(narrow, dtype_size(g.node(v).type.dtype));
    for (size_t o : p.x_outputs) narrow = std::min<int64_t>(narrow, dtype_size(g.node(g.outputs()[o].value).type.dtype));
    v = static_cast<int>(std::min<int64_t>(8, 16 / std::max<int64_t>(narrow, 1)));
  }
  for (int w = v; w >= 1 && c.split_reduction == 1; w /= 2) {
    if (p.n % w != 0) continue;
    const int64_t slots = (p.n + tpr * w - 1) / (tpr * w);
    if (slots * w > kPersistentElems) continue;
    p.persistent = true;
    p.vector = w;
    p.slots = slots;
    return;
  }
  // Multi-pass: the loops over a row step by `vector` adjacent elements per thread.
  while (v > 1 && p.n % v != 0) v /= 2;
  p.vector = v;
}

}  // namespace

int64_t block_threads(const KernelConfig& c) { return int64_t{c.threads_per_row} * c.rows_per_block; }

namespace {

Result<void> check_config(const KernelConfig& c) {
  const int t = c.threads_per_row;
  if (t < 1 || t > 1024 || (t < 32 ? !is_pow2(t) : t % 32 != 0))
    return diag("threads_per_row = " + std::to_string(t) +
                " must be a power of two below 32 (a part of a warp) or a multiple of 32 up to 1024 (whole warps)");
  if (c.rows_per_block < 1 || block_threads(c) > 1024)
    return diag("rows_per_block = " + std::to_string(c.rows_per_block) + " gives " +
                std::to_string(block_threads(c)) + " threads per block, outside 1..1024 (the CUDA limit)");
  if (block_threads(c) > 32 && block_threads(c) % 32 != 0)
    return diag("threads_per_row * rows_per_block = " + std::to_string(block_threads(c)) +
                " is not a multiple of 32: warp shuffles need whole warps");
  if (c.max_blocks < 1) return diag("max_blocks = " + std::to_string(c.max_blocks) + " must be positive");
  if (c.split_reduction < 1 || c.split_reduction > 65535)
    return diag("split_reduction = " + std::to_string(c.split_reduction) + " is outside 1..65535 (the grid's y limit)");
  return {};
}

}  // namespace

Result<Plan> make_plan(const KernelSpec& spec, const KernelConfig& c, const llvmb::Target& t) {
  const Graph& g = spec.group;
  if (!is_c_identifier(spec.entry)) return diag("entry '" + spec.entry + "' is not a C identifier");
  if (t.kind == llvmb::Target::Kind::NVPTX && !kernels::sm_version(t.arch))
    return diag("unknown NVPTX arch '" + t.arch + "' (expected sm_NN or sm_NNa)");
  if (Result<void> ok = check_config(c); !ok) return ok.error();
  if (g.outputs().empty()) return diag("group '" + g.name() + "' has no outputs");

  Plan p;
  const Node* first = nullptr;
  for (const Node& n : g.nodes()) {
    if (n.op == OpKind::Param || n.op == OpKind::Constant || kernels::is_elementwise(n.op) || kernels::is_view(n.op) ||
        kernels::is_coordinate_op(n.op))
      continue;
    if (!is_reduce(n.op)) {
      return diag("group '" + g.name() + "' contains " + who(n) + ", which is neither elementwise, a view nor a reduction (the " +
                      (op_info(n.op).category == OpCategory::Composite ? "graph must be decomposed first"
                                                                       : "fusion pass must give it another kernel kind") +
                      ")",
                  n.loc);
    }
    const TensorType& xt = g.node(n.inputs[0]).type;
    std::vector<int> rd = reduced_dims(n.attrs, xt.rank());
    if (!first) {
      first = &n;
      p.x = xt.shape;
      p.rdims = rd;
    } else if (xt.shape != p.x || rd != p.rdims) {
      return diag(who(n) + " reduces " + xt.str() + " over dims " + dims_str(rd) + " but " + who(*first) +
                      " reduces " + shape_str(p.x) + " over dims " + dims_str(p.rdims) +
                      " (one kernel reduces one shape over one set of dims)",
                  n.loc);
    }
  }
  if (!first) return diag("group '" + g.name() + "' has no reduction (it is a pointwise kernel)");

  // Rows and the maps from (row, j) to X's flat index.
  const int rank = static_cast<int>(p.x.size());
  std::vector<int64_t> xs = contiguous_strides(p.x);
  std::vector<bool> red(static_cast<size_t>(rank), false);
  for (int d : p.rdims) red[static_cast<size_t>(d)] = true;
  StridedStep rows_step, red_step;
  Shape kept;
  for (int d = 0; d < rank; ++d) {
    auto u = static_cast<size_t>(d);
    (red[u] ? red_step : rows_step).shape.push_back(p.x[u]);
    (red[u] ? red_step : rows_step).strides.push_back(xs[u]);
    if (!red[u]) kept.push_back(p.x[u]);
  }
  p.rows = numel(rows_step.shape);
  p.n = numel(red_step.shape);
  kernels::append_step(p.row_map, rows_step);
  kernels::append_step(p.red_map, red_step);
  std::vector<int64_t> ks = contiguous_strides(kept);
  StridedStep to_row{p.x, std::vector<int64_t>(p.x.size(), 0)};
  for (int d = 0, k = 0; d < rank; ++d)
    if (!red[static_cast<size_t>(d)]) to_row.strides[static_cast<size_t>(d)] = ks[static_cast<size_t>(k++)];
  kernels::append_step(p.x_to_row, to_row);

  // Outputs: per row or per element of X (when both counts agree, n == 1 and the two
  // spaces are the same: a row is one element).
  const int64_t nx = numel(p.x);
  for (size_t o = 0; o < g.outputs().size(); ++o) {
    const Output& out = g.outputs()[o];
    int64_t m = numel(g.node(out.value).type.shape);
    if (m == p.rows) p.row_outputs.push_back(o);
    else if (m == nx) p.x_outputs.push_back(o);
    else
      return diag("output '" + out.name + "' is " + g.node(out.value).type.str() + ": neither one value per row (" +
                      std::to_string(p.rows) + ") nor one per element of " + shape_str(p.x) + " (" + std::to_string(nx) + ")",
                  out.loc);
  }

  // The reductions the outputs need, by level: a reduction's level is one more than
  // the highest level among the reductions its operand depends on.
  std::vector<bool> needed(g.nodes().size(), false);
  for (const Output& o : g.outputs()) needed[static_cast<size_t>(o.value)] = true;
  for (size_t i = g.nodes().size(); i-- > 0;)
    if (needed[i])
      for (ValueId u : g.nodes()[i].inputs) needed[static_cast<size_t>(u)] = true;
  std::vector<int> dep(g.nodes().size(), 0), level(g.nodes().size(), 0);
  int max_level = 0;
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const Node& n = g.nodes()[i];
    for (ValueId u : n.inputs) {
      auto uu = static_cast<size_t>(u);
      dep[i] = std::max(dep[i], is_reduce(g.nodes()[uu].op) ? level[uu] : dep[uu]);
    }
    if (is_reduce(n.op)) {
      level[i] = dep[i] + 1;
      if (needed[i]) max_level = std::max(max_level, level[i]);
    }
  }
  p.passes.resize(static_cast<size_t>(max_level));
  for (size_t i = 0; i < g.nodes().size(); ++i)
    if (needed[i] && is_reduce(g.nodes()[i].op))
      p.passes[static_cast<size_t>(level[i] - 1)].push_back(static_cast<ValueId>(i));

  if (p.n == 0 && p.rows > 0)
    for (const auto& pass : p.passes)
      for (ValueId v : pass) {
        const Node& n = g.node(v);
        if (n.op == OpKind::Max || n.op == OpKind::Min)
          return diag(who(n) + " over empty dims of " + shape_str(p.x) + " has no identity (as torch also says)", n.loc);
      }

  // Cross-warp scratch: one slot per (reduction, row of the block, warp of the row),
  // or for an outer reduction one per (reduction, row of the block, partial of the
  // row left after its shuffles).
  p.warps_per_row = c.threads_per_row > 32 ? c.threads_per_row / 32 : 1;
  p.inner_kept = rank > 0 && !red[static_cast<size_t>(rank - 1)];
  p.outer = p.inner_kept && c.rows_per_block > 1 && c.threads_per_row > 1;
  int per_row = p.warps_per_row;
  if (p.outer) {
    const int64_t warp = std::min<int64_t>(block_threads(c), 32);
    p.outer_lanes = c.rows_per_block < 32 && is_pow2(c.rows_per_block) ? static_cast<int>(warp / c.rows_per_block) : 1;
    p.outer_lanes = std::min(p.outer_lanes, c.threads_per_row);
    p.row_slots = c.threads_per_row / p.outer_lanes;
    per_row = p.row_slots;
  }
  if (per_row > 1) {
    for (const auto& pass : p.passes)
      for (ValueId v : pass) {
        const Node& n = g.node(v);
        int bytes = (n.op == OpKind::Sum && !is_float(n.type.dtype)) || n.type.dtype == DType::I64 ? 8 : 4;
        p.smem_bytes = (p.smem_bytes + bytes - 1) / bytes * bytes;
        p.smem_offset.push_back(p.smem_bytes);
        p.smem_bytes += bytes * c.rows_per_block * per_row;
      }
    p.smem_bytes = (p.smem_bytes + 7) / 8 * 8;
    // Static shared memory: 48 KiB is all a kernel may declare without the dynamic
    // opt-in (an outer reduction of 1024 threads takes 4 or 8 bytes a thread per
    // reduction).
    if (p.smem_bytes > 48 * 1024)
      return diag("the block's partials need " + std::to_string(p.smem_bytes) +
                  " bytes of shared memory, over the 48 KiB of static shared memory: fewer threads per block, or fewer "
                  "reductions in the kernel");
  }
  decide_persistent(p, g, c);
  if (c.split_reduction > 1) {
    // The shares of a row meet in the workspace (Plan::split): one pass, so that the
    // partials are the row's only state, and outputs per row, so that nothing needs
    // the whole row's value back at its elements.
    const std::string what = "split_reduction = " + std::to_string(c.split_reduction);
    if (p.passes.size() != 1)
      return diag(what + " needs one pass over each row (a reduction whose operand needs another reduction's result, "
                         "as softmax's sum needs its max, sees only a share of the row); this group takes " +
                  std::to_string(p.passes.size()));
    if (!p.x_outputs.empty()) {
      const Output& o = g.outputs()[p.x_outputs[0]];
      return diag(what + " needs every output to be one value per row, but '" + o.name + "' has one per element of " +
                      shape_str(p.x),
                  o.loc);
    }
    p.split = c.split_reduction;
    // Shares of whole vectors, so that every share's vectors stay aligned.
    const int64_t v = p.vector;
    p.share = ((p.n + p.split - 1) / p.split + v - 1) / v * v;
    // 8 bytes a (reduction, share, row), checked before it is multiplied out (a
    // product of rows and shares could pass int64).
    constexpr int64_t kMaxWorkspace = int64_t{1} << 32;
    const int64_t per_row = int64_t{8} * static_cast<int64_t>(p.passes[0].size()) * p.split;
    const int64_t rows = std::max<int64_t>(p.rows, 1);
    if (rows > kMaxWorkspace / per_row)
      return diag(what + " over " + std::to_string(p.rows) + " rows needs " + std::to_string(per_row) +
                  " bytes of workspace a row, over 4 GiB in all: fewer shares");
    p.ws_partials = per_row * rows;
    const int64_t groups = (p.rows + c.rows_per_block - 1) / c.rows_per_block;
    p.ws_bytes = p.ws_partials + (4 * std::max<int64_t>(groups, 1) + 7) / 8 * 8;
    // The last-block flag, after the partials' slots.
    p.smem_bytes = (p.smem_bytes + 7) / 8 * 8;
    p.flag_offset = p.smem_bytes;
    p.smem_bytes += 8;
  }
  return p;
}

LaunchShape launch_of(const Plan& p, const KernelConfig& c) {
  LaunchShape l;
  int64_t groups = (p.rows + c.rows_per_block - 1) / c.rows_per_block;
  if (c.grid_stride) groups = std::min<int64_t>(groups, c.max_blocks);
  l.grid = {std::max<int64_t>(groups, 1), c.split_reduction, 1};
  l.block = {static_cast<int>(block_threads(c)), 1, 1};
  l.workspace_bytes = p.ws_bytes;
  return l;
}

}  // namespace sf::reduction_detail
