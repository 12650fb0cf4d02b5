#include "codegen/kernels/reduction.h"

#include <algorithm>
#include <cctype>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <set>

#include <llvm/IR/Constants.h>
#include <llvm/IR/Function.h>
#include <llvm/IR/GlobalVariable.h>
#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/IntrinsicsNVPTX.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>

#include "codegen/kernels/element.h"

namespace sf {

namespace {

using kernels::ElementCodegen;
using kernels::is_c_identifier;
using kernels::emit_loop;
using kernels::Elem;
using kernels::IndexMap;
using kernels::StridedStep;
using kernels::ValueIndex;

Diag diag(std::string msg, SourceLoc loc = {}) { return Diag{"", loc, "reduction: " + std::move(msg)}; }

bool is_reduce(OpKind k) { return op_info(k).category == OpCategory::Reduce; }

std::string who(const Node& n) { return std::string(op_name(n.op)) + (n.name.empty() ? "" : " '" + n.name + "'"); }

std::string dims_str(const std::vector<int>& d) { return shape_str(Shape(d.begin(), d.end())); }

bool is_pow2(int64_t v) { return v > 0 && (v & (v - 1)) == 0; }

// ---- the plan: what the group is, decided once, without LLVM ------------------------------

struct Plan {
  Shape x;
  std::vector<int> rdims;
  int64_t rows = 0, n = 0;
  IndexMap row_map;  // row (flat over the kept dims) -> the X offset of its first element
  IndexMap red_map;  // j (flat over the reduced dims) -> X offset within the row
  IndexMap x_to_row; // X flat index -> its row: how a value read "at its own row" maps
  std::vector<std::vector<ValueId>> passes;  // reductions by dependence level
  std::vector<size_t> row_outputs, x_outputs;
  int warps_per_row = 1;
  int smem_bytes = 0;
  std::vector<int> smem_offset;  // per reduction, in pass order, flattened (bytes)
  // NVPTX persistent rows (decide_persistent): each thread loads its share of a row
  // once, into registers, and every pass and the X-space outputs read them there.
  bool persistent = false;
  int vector = 1;      // elements per register slot: one 16-byte-or-smaller access per operand
  int64_t slots = 0;   // register slots per thread (slots * vector elements)
};

// The most elements of a row one thread holds in registers: beyond it the row is
// folded in passes that read it again (Inductor's persistent and looped reductions).
constexpr int64_t kPersistentElems = 32;

// Persistent rows when a thread's share fits kPersistentElems and the row is not split
// over blocks. Vector slots (the thread's elements of one slot adjacent in memory)
// when the reduced dims are X's innermost, so that a row is contiguous: as wide as
// 16 bytes of the narrowest dtype read or written in X space allows, dividing n. Rows
// too long for registers keep the vector width for their loops (not split rows).
void decide_persistent(Plan& p, const Graph& g, const KernelConfig& c) {
  if (c.split_reduction > 1 || p.n <= 0) return;
  const int64_t tpr = c.threads_per_row;
  int v = 1;
  if (p.red_map.contiguous()) {
    int64_t narrow = 8;
    for (ValueId v : g.params()) narrow = std::min<int64_t>(narrow, dtype_size(g.node(v).type.dtype));
    for (size_t o : p.x_outputs) narrow = std::min<int64_t>(narrow, dtype_size(g.node(g.outputs()[o].value).type.dtype));
    v = static_cast<int>(std::min<int64_t>(8, 16 / std::max<int64_t>(narrow, 1)));
  }
  for (int w = v; w >= 1; w /= 2) {
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

int64_t block_threads(const KernelConfig& c) { return int64_t{c.threads_per_row} * c.rows_per_block; }

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
    if (n.op == OpKind::Param || n.op == OpKind::Constant || kernels::is_elementwise(n.op) || kernels::is_view(n.op))
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

  // Cross-warp scratch: one slot per (reduction, row of the block, warp of the row).
  p.warps_per_row = c.threads_per_row > 32 ? c.threads_per_row / 32 : 1;
  if (p.warps_per_row > 1) {
    for (const auto& pass : p.passes)
      for (ValueId v : pass) {
        const Node& n = g.node(v);
        int bytes = (n.op == OpKind::Sum && !is_float(n.type.dtype)) || n.type.dtype == DType::I64 ? 8 : 4;
        p.smem_bytes = (p.smem_bytes + bytes - 1) / bytes * bytes;
        p.smem_offset.push_back(p.smem_bytes);
        p.smem_bytes += bytes * c.rows_per_block * p.warps_per_row;
      }
    p.smem_bytes = (p.smem_bytes + 7) / 8 * 8;
  }
  decide_persistent(p, g, c);
  if (c.split_reduction > 1) {
    // Each block adds its share of a row into the output atomically, so the kernel
    // must be one f32 sum or mean whose result is its only output: a max has no
    // f32 atomic in PTX, and anything computed from the row's value would see a
    // partial one.
    const std::string what = "split_reduction = " + std::to_string(c.split_reduction);
    if (p.passes.size() != 1 || p.passes[0].size() != 1 || !p.x_outputs.empty() || p.row_outputs.size() != 1 ||
        g.outputs().size() != 1 || g.outputs()[0].value != p.passes[0][0])
      return diag(what + " needs a kernel whose only output is one reduction's result (it adds partial results)");
    const Node& r = g.node(p.passes[0][0]);
    if ((r.op != OpKind::Sum && r.op != OpKind::Mean) || r.type.dtype != DType::F32)
      return diag(what + " needs an f32 sum or mean (partial results are added with f32 atomics), not " + who(r) +
                      " of " + std::string(dtype_name(r.type.dtype)),
                  r.loc);
  }
  return p;
}

LaunchShape launch_of(const Plan& p, const KernelConfig& c) {
  LaunchShape l;
  int64_t groups = (p.rows + c.rows_per_block - 1) / c.rows_per_block;
  if (c.grid_stride) groups = std::min<int64_t>(groups, c.max_blocks);
  l.grid = {std::max<int64_t>(groups, 1), c.split_reduction, 1};
  l.block = {static_cast<int>(block_threads(c)), 1, 1};
  l.zero_outputs = c.split_reduction > 1;
  return l;
}

// ---- accumulation -------------------------------------------------------------------------

// How one reduction folds elements: the accumulator type (f32 for floats, i64 for
// integer sums, the element's type for integer max/min), its identity and combine.
class Fold {
 public:
  Fold(const Node& n, ElementCodegen& cg) : op_(n.op), dt_(n.type.dtype), cg_(cg) {}

  llvm::Type* type() const {
    llvm::LLVMContext& c = cg_.builder().getContext();
    if (is_float(dt_)) return llvm::Type::getFloatTy(c);
    return kernels::compute_type(c, dt_);  // sums are i64 already (the shape rule)
  }
  llvm::Value* identity() const {
    llvm::Type* t = type();
    const bool fl = is_float(dt_);
    switch (op_) {
      case OpKind::Max:
        return fl ? llvm::ConstantFP::getInfinity(t, /*Negative=*/true)
                  : llvm::ConstantInt::get(t, llvm::APInt::getSignedMinValue(t->getIntegerBitWidth()));
      case OpKind::Min:
        return fl ? llvm::ConstantFP::getInfinity(t, false)
                  : llvm::ConstantInt::get(t, llvm::APInt::getSignedMaxValue(t->getIntegerBitWidth()));
      default: return fl ? llvm::ConstantFP::get(t, 0.0) : llvm::ConstantInt::get(t, 0);
    }
  }
  // An element of the operand in the accumulator's type (integer sums widen to i64).
  llvm::Value* element(Elem e) const {
    if (op_ == OpKind::Sum && !is_float(dt_)) return cg_.convert(e, DType::I64).value;
    return e.value;
  }
  llvm::Value* combine(llvm::Value* a, llvm::Value* b) const {
    llvm::IRBuilderBase& bb = cg_.builder();
    const bool fl = is_float(dt_);
    switch (op_) {
      // llvm.maximum/minimum propagate NaN (max.NaN.f32 on sm_80+), as the
      // reference's max_f/min_f and torch.max do.
      case OpKind::Max:
        return bb.CreateBinaryIntrinsic(fl ? llvm::Intrinsic::maximum : llvm::Intrinsic::smax, a, b);
      case OpKind::Min:
        return bb.CreateBinaryIntrinsic(fl ? llvm::Intrinsic::minimum : llvm::Intrinsic::smin, a, b);
      default: return fl ? bb.CreateFAdd(a, b) : bb.CreateAdd(a, b);  // integer sums wrap, as torch's
    }
  }
  // The reduced value, as the node's dtype: sums rounded to it, means divided by n
  // (0 / 0 is NaN for an empty row, as the reference says).
  Elem finish(llvm::Value* acc, int64_t n) const {
    llvm::IRBuilderBase& bb = cg_.builder();
    if (op_ == OpKind::Mean)
      acc = bb.CreateFDiv(acc, llvm::ConstantFP::get(acc->getType(), static_cast<double>(n)));
    if (is_float(dt_)) acc = cg_.node_result(dt_, acc);
    return {acc, dt_};
  }

 private:
  OpKind op_;
  DType dt_;
  ElementCodegen& cg_;
};

// ---- the element program over two index spaces ----------------------------------------------
//
// X space: the flat index i of an element of X (and of any X-space value, read at its
// own C-order flat index). Row space: the flat index r of a row. Reduced values live
// in row space. An X-space value that reads a row-space value at its own row (its
// index map from i is x_to_row) takes the value computed once for the row, before
// the loop over the row's elements: prepare() emits those. Element code is
// element.h's GroupValues, one per space, with hooks that supply reduced and
// prepared values.
class Program {
 public:
  Program(const Graph& g, const Plan& p, ElementCodegen& cg, const std::vector<llvm::Value*>& inputs)
      : g_(g), p_(p), cg_(cg), inputs_(inputs), row_(g, cg, inputs), x_(g, cg, inputs) {}

  // A new row (its code dominates everything emitted for the row after it).
  void set_row(llvm::Value* r) {
    reduced_.clear();
    prepared_.clear();
    row_.at_index(r, [this](ValueId v, const ValueIndex& at) { return row_hook(v, at); });
  }
  // A new element of X (inside a loop body; forgotten at the next one).
  void set_x(llvm::Value* i) {
    x_.at_index(i, [this](ValueId v, const ValueIndex& at) { return x_hook(v, at); });
    cur_ = &x_;
  }
  // Persistent rows: register slot `k` of the thread holds the element at X index
  // `i` for the whole row, its values kept across passes (each is computed, and each
  // operand loaded, once). `lane` may supply a param's value first (a lane of a
  // vector load). Then use_slot(k) makes x_value() read slot k.
  void set_slot(size_t k, llvm::Value* i, kernels::GroupValues::Hook lane) {
    while (slots_.size() <= k) slots_.emplace_back(g_, cg_, inputs_);
    slots_[k].at_index(i, [this, lane = std::move(lane)](ValueId v, const ValueIndex& at) -> std::optional<Elem> {
      if (std::optional<Elem> e = x_hook(v, at)) return e;
      return lane ? lane(v, at) : std::nullopt;
    });
  }
  void use_slot(size_t k) { cur_ = &slots_[k]; }
  // The (param, offset map from X's flat index) pairs X-space code at `roots` reads.
  int param_slot(ValueId v) const { return x_.param_slot(v); }
  std::vector<std::pair<int, IndexMap>> x_reads(const std::vector<std::pair<ValueId, ValueIndex>>& roots) const {
    std::vector<std::pair<int, IndexMap>> r;
    for (const auto& [v, at] : roots)
      for (auto& read : x_.reads(v, at)) r.push_back(std::move(read));
    return r;
  }
  void set_reduced(ValueId v, Elem e) { reduced_[v] = e; }

  Result<Elem> row_value(ValueId v, const ValueIndex& at) { return checked(row_.value(v, at)); }
  Result<Elem> x_value(ValueId v, const ValueIndex& at) { return checked(cur_->value(v, at)); }

  // Emits, at the builder's position, the row-space values that X-space code at the
  // given roots reads, so that the loop body finds them computed.
  Result<void> prepare(const std::vector<std::pair<ValueId, ValueIndex>>& roots) {
    std::vector<ValueId> need;
    std::set<std::string> seen;
    std::function<Result<void>(ValueId, const ValueIndex&)> walk = [&](ValueId v, const ValueIndex& at) -> Result<void> {
      if (!seen.insert(std::to_string(v) + "#" + at.key()).second) return {};
      const Node& n = g_.node(v);
      if (n.op == OpKind::Param || n.op == OpKind::Constant) return {};
      if (row_read(v, at)) {
        if (!is_reduce(n.op) && std::find(need.begin(), need.end(), v) == need.end()) need.push_back(v);
        return {};
      }
      if (is_reduce(n.op)) return other_row(n);
      for (ValueId u : n.inputs) {
        std::optional<ValueIndex> ui = kernels::operand_index(n, at, g_.node(u).type.shape);
        if (!ui) return diag(who(n) + " is neither elementwise nor a view", n.loc);
        if (Result<void> r = walk(u, *ui); !r) return r;
      }
      return {};
    };
    for (const auto& [v, at] : roots)
      if (Result<void> r = walk(v, at); !r) return r;
    std::sort(need.begin(), need.end());  // node order: a stable IR
    for (ValueId v : need) {
      if (prepared_.count(v)) continue;
      Result<Elem> e = row_value(v, kernels::dense_index(g_.node(v).type.shape));
      if (!e) return e.error();
      prepared_.emplace(v, *e);
    }
    return {};
  }

 private:
  // Whether X-space code reading v at `at` reads it at its own row.
  bool row_read(ValueId v, const ValueIndex& at) const {
    const Shape& s = g_.node(v).type.shape;
    return numel(s) == p_.rows && kernels::offset_map(at, s) == p_.x_to_row;
  }

  Diag other_row(const Node& n) const {
    return diag("the reduced value of " + who(n) +
                    " is read at another row's position (a view moves reduced values between rows); "
                    "the fusion pass must split the group there",
                n.loc);
  }

  // Hooks cannot return a Diag: the first one is kept and reported by checked(), and
  // the hook returns poison meanwhile (the module is dropped).
  Elem fail(Diag d, const Node& n) {
    if (!error_) error_ = std::move(d);
    return {llvm::PoisonValue::get(kernels::compute_type(cg_.builder().getContext(), n.type.dtype)), n.type.dtype};
  }
  Result<Elem> checked(Result<Elem> r) {
    if (!error_) return r;
    Diag d = std::move(*error_);
    error_.reset();
    return d;
  }

  std::optional<Elem> reduced(const Node& n, ValueId v) {
    auto it = reduced_.find(v);
    if (it == reduced_.end()) return fail(diag("internal: " + who(n) + " is read before its pass", n.loc), n);
    return it->second;
  }

  std::optional<Elem> row_hook(ValueId v, const ValueIndex& at) {
    const Node& n = g_.node(v);
    if (!is_reduce(n.op)) return std::nullopt;
    if (!kernels::offset_map(at, n.type.shape).contiguous()) return fail(other_row(n), n);
    return reduced(n, v);
  }

  std::optional<Elem> x_hook(ValueId v, const ValueIndex& at) {
    const Node& n = g_.node(v);
    if (n.op == OpKind::Param || n.op == OpKind::Constant) return std::nullopt;
    if (row_read(v, at)) {
      if (is_reduce(n.op)) return reduced(n, v);
      auto it = prepared_.find(v);
      if (it == prepared_.end()) return fail(diag("internal: row value " + who(n) + " was not prepared", n.loc), n);
      return it->second;
    }
    if (is_reduce(n.op)) return fail(other_row(n), n);
    return std::nullopt;
  }

  const Graph& g_;
  const Plan& p_;
  ElementCodegen& cg_;
  std::vector<llvm::Value*> inputs_;
  kernels::GroupValues row_, x_;
  std::deque<kernels::GroupValues> slots_;  // persistent rows' register slots
  kernels::GroupValues* cur_ = &x_;
  std::map<ValueId, Elem> reduced_, prepared_;
  std::optional<Diag> error_;
};


// The parts of a kernel both targets share: the args, the element program, the
// accumulators (entry-block allocas, promoted to registers by SROA) and the per-row
// sequence of passes. The target decides the loops and how partials combine.
class Builder {
 public:
  Builder(const KernelSpec& spec, const KernelConfig& cfg, const Plan& plan, const llvmb::Target& target,
          llvm::Module& m)
      : spec_(spec), g_(spec.group), cfg_(cfg), p_(plan), target_(target), m_(m), b_(m.getContext()) {}

  virtual ~Builder() = default;

 protected:
  llvm::Value* k(int64_t v) const { return llvm::ConstantInt::get(it_, static_cast<uint64_t>(v)); }

  void start(std::vector<llvm::Value*> in, std::vector<llvm::Value*> out) {
    in_ = std::move(in);
    out_ = std::move(out);
    cg_.emplace(b_, m_, target_, spec_.precision);
    prog_.emplace(g_, p_, *cg_, in_);
    for (const auto& pass : p_.passes)
      for (ValueId v : pass) folds_.emplace(v, Fold(g_.node(v), *cg_));
  }

  llvm::AllocaInst* entry_alloca(llvm::Type* t, const std::string& name) {
    llvm::IRBuilder<> e(&fn_->getEntryBlock(), fn_->getEntryBlock().begin());
    return e.CreateAlloca(t, nullptr, name);
  }

  std::vector<std::pair<ValueId, ValueIndex>> pass_roots(const std::vector<ValueId>& pass) const {
    std::vector<std::pair<ValueId, ValueIndex>> r;
    for (ValueId v : pass) r.emplace_back(g_.node(v).inputs[0], kernels::dense_index(p_.x));
    return r;
  }
  std::vector<std::pair<ValueId, ValueIndex>> x_output_roots() const {
    std::vector<std::pair<ValueId, ValueIndex>> r;
    for (size_t o : p_.x_outputs) {
      ValueId v = g_.outputs()[o].value;
      r.emplace_back(v, kernels::dense_index(g_.node(v).type.shape));
    }
    return r;
  }

  // Folds the element at X index `i` of every reduction of `pass` into `accs`.
  Result<void> fold_element(const std::vector<ValueId>& pass, const std::vector<llvm::AllocaInst*>& accs,
                            llvm::Value* i) {
    prog_->set_x(i);
    for (size_t r = 0; r < pass.size(); ++r) {
      const Fold& f = folds_.at(pass[r]);
      Result<Elem> e = prog_->x_value(g_.node(pass[r]).inputs[0], kernels::dense_index(p_.x));
      if (!e) return e.error();
      llvm::Value* acc = b_.CreateLoad(f.type(), accs[r]);
      b_.CreateStore(f.combine(acc, f.element(*e)), accs[r]);
    }
    return {};
  }

  // Every row-space output's value for the current row (computed by every thread,
  // so that the values dominate what follows even where only one thread stores).
  Result<std::vector<Elem>> row_outputs() {
    std::vector<Elem> r;
    for (size_t o : p_.row_outputs) {
      ValueId v = g_.outputs()[o].value;
      Result<Elem> e = prog_->row_value(v, kernels::dense_index(g_.node(v).type.shape));
      if (!e) return e.error();
      r.push_back(*e);
    }
    return r;
  }

  Result<void> store_x_outputs(llvm::Value* i) {
    prog_->set_x(i);
    for (size_t o : p_.x_outputs) {
      ValueId v = g_.outputs()[o].value;
      Result<Elem> e = prog_->x_value(v, kernels::dense_index(g_.node(v).type.shape));
      if (!e) return e.error();
      cg_->store(*e, out_[o], i);
    }
    return {};
  }

  const KernelSpec& spec_;
  const Graph& g_;
  const KernelConfig& cfg_;
  const Plan& p_;
  const llvmb::Target& target_;
  llvm::Module& m_;
  llvm::IRBuilder<> b_;
  llvm::Function* fn_ = nullptr;
  llvm::Type* it_ = nullptr;
  std::vector<llvm::Value*> in_, out_;
  std::optional<ElementCodegen> cg_;
  std::optional<Program> prog_;
  std::map<ValueId, Fold> folds_;
};

// ---- host ---------------------------------------------------------------------------------

// `void entry(ptr args)`: rows one after another. The loops over a row's elements (the
// innermost fold loop of each pass and the X-space output loop) carry host_vector and
// host_interleave as vectoriser hints (element.h LoopHints). Without them LLVM does
// not vectorise a float sum or mean (that would reorder the additions) but does
// vectorise max/min and integer folds; with host_vector > 1 the hint allows the
// reordering, and a float sum becomes per-lane partial sums within each chunk,
// combined at the chunk's end (an error bound no worse than the chunked sum's).
class HostBuilder final : public Builder {
 public:
  using Builder::Builder;

  Result<void> build() {
    it_ = b_.getInt64Ty();
    kernels::KernelEntry ke =
        kernels::begin_kernel(m_, b_, spec_.entry, g_.params().size(), g_.outputs().size(), llvmb::Target::host());
    fn_ = ke.fn;
    start(std::move(ke.in), std::move(ke.out));
    if (p_.rows > 0) {
      Result<void> r = emit_loop(b_, k(0), k(p_.rows), k(1), "row", [&](llvm::Value* row) { return row_body(row); });
      if (!r) return r;
    }
    b_.CreateRetVoid();
    return {};
  }

 private:
  // Partial sums over chunks of about sqrt(n) elements, then over the chunks: the
  // rounding error of an f32 sum grows with the number of additions into one
  // accumulator (n one after another; about 2 sqrt(n) so), without the cost or the
  // Inf/NaN pitfalls of compensated summation. The reference sums in double.
  int64_t chunk() const {
    int64_t c = 16;
    while (c < 4096 && c * c < p_.n) c *= 2;
    return c;
  }

  Result<void> row_body(llvm::Value* row) {
    prog_->set_row(row);
    llvm::Value* base = kernels::emit_index_map(b_, row, p_.row_map);
    auto x_index = [&](llvm::Value* j) {
      return b_.CreateAdd(base, kernels::emit_index_map(b_, j, p_.red_map), "i", true, true);
    };
    for (size_t pi = 0; pi < p_.passes.size(); ++pi) {
      const std::vector<ValueId>& pass = p_.passes[pi];
      std::vector<llvm::AllocaInst*> total, part;
      for (ValueId v : pass) {
        const Fold& f = folds_.at(v);
        total.push_back(entry_alloca(f.type(), "acc"));
        part.push_back(entry_alloca(f.type(), "part"));
        b_.CreateStore(f.identity(), total.back());
      }
      if (p_.n > 0) {
        if (Result<void> r = prog_->prepare(pass_roots(pass)); !r) return r;
        const int64_t C = chunk();
        Result<void> r = emit_loop(b_, k(0), k(p_.n), k(C), "chunk", [&](llvm::Value* c0) -> Result<void> {
          for (size_t q = 0; q < pass.size(); ++q) b_.CreateStore(folds_.at(pass[q]).identity(), part[q]);
          llvm::Value* end = b_.CreateBinaryIntrinsic(llvm::Intrinsic::smin, b_.CreateAdd(c0, k(C), "", true, true), k(p_.n));
          Result<void> inner = emit_loop(b_, c0, end, k(1), "j", [&](llvm::Value* j) { return fold_element(pass, part, x_index(j)); },
                                         kernels::host_loop_hints(cfg_));
          if (!inner) return inner;
          for (size_t q = 0; q < pass.size(); ++q) {
            const Fold& f = folds_.at(pass[q]);
            b_.CreateStore(f.combine(b_.CreateLoad(f.type(), total[q]), b_.CreateLoad(f.type(), part[q])), total[q]);
          }
          return {};
        });
        if (!r) return r;
      }
      for (size_t q = 0; q < pass.size(); ++q) {
        const Fold& f = folds_.at(pass[q]);
        prog_->set_reduced(pass[q], f.finish(b_.CreateLoad(f.type(), total[q]), p_.n));
      }
    }
    Result<std::vector<Elem>> ro = row_outputs();
    if (!ro) return ro.error();
    for (size_t q = 0; q < ro->size(); ++q) cg_->store((*ro)[q], out_[p_.row_outputs[q]], row);
    if (p_.n > 0 && !p_.x_outputs.empty()) {
      if (Result<void> r = prog_->prepare(x_output_roots()); !r) return r;
      return emit_loop(b_, k(0), k(p_.n), k(1), "x", [&](llvm::Value* j) { return store_x_outputs(x_index(j)); },
                       kernels::host_loop_hints(cfg_));
    }
    return {};
  }
};

// ---- NVPTX ---------------------------------------------------------------------------------

// One row per threads_per_row threads, rows_per_block rows per block; with
// grid_stride the blocks loop over groups of rows. Every thread of a block runs the
// same number of row iterations and every pass (threads of rows past the end work
// on an empty row), so barriers and shuffles are never divergent.
class NvptxBuilder final : public Builder {
 public:
  NvptxBuilder(const KernelSpec& spec, const KernelConfig& cfg, const Plan& plan, const llvmb::Target& target,
               llvm::Module& m, bool simulate)
      : Builder(spec, cfg, plan, target, m), simulate_(simulate) {}

  Result<void> build() {
    llvm::LLVMContext& c = m_.getContext();
    const size_t np = g_.params().size(), no = g_.outputs().size();
    // i32 index arithmetic where every value formed fits (indices below numel(X) or
    // rows, plus one block or grid of slack): half the registers, cheaper division.
    int64_t largest = std::max(numel(p_.x), p_.rows);
    it_ = largest + 2048 + int64_t{cfg_.max_blocks} * cfg_.rows_per_block < (int64_t{1} << 31) ? b_.getInt32Ty() : b_.getInt64Ty();
    llvm::Value *tid = nullptr, *bid = nullptr, *nblocks = nullptr;
    split_ = nullptr;
    std::vector<llvm::Value*> in, out;
    if (!simulate_) {
      llvm::Type* gptr = llvm::PointerType::get(c, 1);  // addrspace(1): global memory
      auto* fty = llvm::FunctionType::get(b_.getVoidTy(), std::vector<llvm::Type*>(np + no, gptr), false);
      fn_ = llvm::Function::Create(fty, llvm::Function::ExternalLinkage, spec_.entry, m_);
      llvmb::mark_kernel(*fn_, static_cast<int>(block_threads(cfg_)));
      for (size_t i = 0; i < np + no; ++i) {
        llvm::Argument* a = fn_->getArg(static_cast<unsigned>(i));
        a->setName(i < np ? "in" + std::to_string(i) : "out" + std::to_string(i - np));
        if (i < np) a->addAttr(llvm::Attribute::ReadOnly);
        (i < np ? in : out).push_back(a);
      }
      b_.SetInsertPoint(llvm::BasicBlock::Create(c, "entry", fn_));
      auto sreg = [&](llvm::Intrinsic::ID id) { return b_.CreateZExt(b_.CreateIntrinsic(id, {}, {}), it_); };
      tid = sreg(llvm::Intrinsic::nvvm_read_ptx_sreg_tid_x);
      bid = sreg(llvm::Intrinsic::nvvm_read_ptx_sreg_ctaid_x);
      nblocks = sreg(llvm::Intrinsic::nvvm_read_ptx_sreg_nctaid_x);
      if (cfg_.split_reduction > 1) split_ = sreg(llvm::Intrinsic::nvvm_read_ptx_sreg_ctaid_y);
      if (p_.smem_bytes > 0) {
        // Static shared memory (PTX .shared): a few hundred bytes at most, so the
        // launch needs no dynamic shared memory.
        auto* ty = llvm::ArrayType::get(b_.getInt8Ty(), static_cast<uint64_t>(p_.smem_bytes));
        auto* gv = new llvm::GlobalVariable(m_, ty, false, llvm::GlobalValue::InternalLinkage, llvm::UndefValue::get(ty),
                                            spec_.entry + "_smem", nullptr, llvm::GlobalValue::NotThreadLocal, 3);
        gv->setAlignment(llvm::Align(8));
        smem_ = gv;
      }
    } else {
      // void entry(ptr args, i32 blockIdx.x, i32 threadIdx.x, i32 gridDim.x, ptr hooks, i32 blockIdx.y)
      llvm::Type* i32 = b_.getInt32Ty();
      llvm::Type* ptr = b_.getPtrTy();
      auto* fty = llvm::FunctionType::get(b_.getVoidTy(), {ptr, i32, i32, i32, ptr, i32}, false);
      fn_ = llvm::Function::Create(fty, llvm::Function::ExternalLinkage, spec_.entry, m_);
      b_.SetInsertPoint(llvm::BasicBlock::Create(c, "entry", fn_));
      for (size_t i = 0; i < np + no; ++i) {
        llvm::Value* slot = b_.CreateConstInBoundsGEP1_64(ptr, fn_->getArg(0), i);
        (i < np ? in : out).push_back(b_.CreateAlignedLoad(ptr, slot, llvm::Align(8)));
      }
      bid = b_.CreateZExt(fn_->getArg(1), it_);
      tid = b_.CreateZExt(fn_->getArg(2), it_);
      nblocks = b_.CreateZExt(fn_->getArg(3), it_);
      hooks_ = fn_->getArg(4);
      if (cfg_.split_reduction > 1) split_ = b_.CreateZExt(fn_->getArg(5), it_);
      auto field = [&](int f) {
        return b_.CreateAlignedLoad(ptr, b_.CreateConstInBoundsGEP1_64(ptr, hooks_, static_cast<uint64_t>(f)), llvm::Align(8));
      };
      hook_ctx_ = field(0);
      hook_barrier_ = field(1);
      hook_shfl_ = field(2);
      smem_ = field(3);
    }
    fn_->setDoesNotThrow();
    start(std::move(in), std::move(out));

    const int tpr = cfg_.threads_per_row, rpb = cfg_.rows_per_block;
    tid32_ = b_.CreateTrunc(tid, b_.getInt32Ty());
    sub_ = b_.CreateUDiv(tid, k(tpr), "row.in.block");
    lr_ = b_.CreateURem(tid, k(tpr), "thread.in.row");
    warp_ = b_.CreateUDiv(lr_, k(32), "warp.in.row");
    lane_ = b_.CreateURem(tid, k(32), "lane");
    const int64_t ngroups = (p_.rows + rpb - 1) / rpb;

    llvm::BasicBlock* exit = llvm::BasicBlock::Create(c, "exit", fn_);
    auto rows = [&](int vector) -> Result<void> {
      auto body = [&](llvm::Value* grp) { return p_.persistent ? persistent_body(grp, vector) : group_body(grp, vector); };
      if (cfg_.grid_stride) {
        Result<void> r = emit_loop(b_, bid, k(ngroups), nblocks, "rows", body);
        if (!r) return r;
      } else {
        llvm::BasicBlock* one = llvm::BasicBlock::Create(c, "rows", fn_);
        llvm::BasicBlock* done = llvm::BasicBlock::Create(c, "rows.done", fn_);
        b_.CreateCondBr(b_.CreateICmpSLT(bid, k(ngroups)), one, done);
        b_.SetInsertPoint(one);
        Result<void> r = body(bid);
        if (!r) return r;
        b_.CreateBr(done);
        b_.SetInsertPoint(done);
      }
      return {};
    };
    if (ngroups > 0) {
      if (p_.vector > 1) {
        // Vector slots need every pointer they access aligned to its piece's size; a
        // tensor that starts elsewhere (a view's offset) takes one element per slot.
        llvm::BasicBlock* vec = llvm::BasicBlock::Create(c, "rows.vector", fn_);
        llvm::BasicBlock* scalar = llvm::BasicBlock::Create(c, "rows.scalar", fn_);
        b_.CreateCondBr(aligned_for_vector(), vec, scalar);
        b_.SetInsertPoint(vec);
        if (Result<void> r = rows(p_.vector); !r) return r;
        b_.CreateBr(exit);
        b_.SetInsertPoint(scalar);
      }
      if (Result<void> r = rows(1); !r) return r;
    }
    b_.CreateBr(exit);
    b_.SetInsertPoint(exit);
    b_.CreateRetVoid();
    return {};
  }

 private:
  Result<void> group_body(llvm::Value* grp, int vector) {
    const int tpr = cfg_.threads_per_row;
    llvm::Value* row = b_.CreateAdd(b_.CreateMul(grp, k(cfg_.rows_per_block), "", true, true), sub_, "row", true, true);
    llvm::Value* valid = b_.CreateICmpSLT(row, k(p_.rows), "valid");
    // A thread past the last row computes the last row's row values (every load in
    // bounds) over no elements, and stores nothing.
    llvm::Value* rowc = b_.CreateSelect(valid, row, k(p_.rows - 1));
    llvm::Value* nloop = b_.CreateSelect(valid, k(p_.n), k(0), "row.elems");
    // Split reduction: block y of the split folds elements [y * chunk, (y + 1) * chunk).
    llvm::Value* jfirst = lr_;
    if (split_) {
      const int64_t chunk = (p_.n + cfg_.split_reduction - 1) / cfg_.split_reduction;
      llvm::Value* lo = b_.CreateMul(split_, k(chunk), "split.lo", true, true);
      llvm::Value* hi = b_.CreateBinaryIntrinsic(llvm::Intrinsic::smin, b_.CreateAdd(lo, k(chunk), "", true, true), k(p_.n));
      jfirst = b_.CreateAdd(lo, lr_, "", true, true);
      nloop = b_.CreateSelect(valid, hi, k(0), "row.elems");
    }
    prog_->set_row(rowc);
    llvm::Value* base = kernels::emit_index_map(b_, rowc, p_.row_map);
    auto x_index = [&](llvm::Value* j) {
      return b_.CreateAdd(base, kernels::emit_index_map(b_, j, p_.red_map), "i", true, true);
    };
    size_t slot = 0;  // reductions so far, in pass order: their shared-memory slots
    for (const std::vector<ValueId>& pass : p_.passes) {
      std::vector<llvm::AllocaInst*> part;
      for (ValueId v : pass) {
        const Fold& f = folds_.at(v);
        part.push_back(entry_alloca(f.type(), "part"));
        b_.CreateStore(f.identity(), part.back());
      }
      if (p_.n > 0) {
        if (Result<void> r = prog_->prepare(pass_roots(pass)); !r) return r;
        // Consecutive threads read consecutive elements: coalesced when the reduced
        // dims are X's innermost.
        Result<void> r = vector == 1
            ? emit_loop(b_, jfirst, nloop, k(tpr), "j", [&](llvm::Value* j) { return fold_element(pass, part, x_index(j)); })
            // `vector` adjacent elements per thread and step (contiguous rows, vector
            // dividing n), each param read in dense runs loaded once per step.
            : emit_loop(b_, b_.CreateMul(lr_, k(vector), "", true, true), nloop, k(int64_t{tpr} * vector), "j",
                        [&](llvm::Value* j) -> Result<void> {
                          std::map<std::string, std::vector<Elem>> lanes;
                          set_vector_slots(x_index(j), vector, lanes);
                          for (int l = 0; l < vector; ++l) {
                            prog_->use_slot(static_cast<size_t>(l));
                            for (size_t q = 0; q < pass.size(); ++q) {
                              const Fold& f = folds_.at(pass[q]);
                              Result<Elem> e = prog_->x_value(g_.node(pass[q]).inputs[0], kernels::dense_index(p_.x));
                              if (!e) return e.error();
                              llvm::Value* acc = b_.CreateLoad(f.type(), part[q]);
                              b_.CreateStore(f.combine(acc, f.element(*e)), part[q]);
                            }
                          }
                          return {};
                        });
        if (!r) return r;
      }
      std::vector<llvm::Value*> vals;
      for (size_t q = 0; q < pass.size(); ++q) vals.push_back(b_.CreateLoad(folds_.at(pass[q]).type(), part[q]));
      block_reduce(pass, vals, slot);
      slot += pass.size();
      for (size_t q = 0; q < pass.size(); ++q) prog_->set_reduced(pass[q], folds_.at(pass[q]).finish(vals[q], p_.n));
    }

    if (Result<void> r = store_row_outputs(valid, rowc); !r) return r;
    if (p_.n > 0 && !p_.x_outputs.empty()) {
      if (Result<void> r = prog_->prepare(x_output_roots()); !r) return r;
      Result<void> r = vector == 1
          ? emit_loop(b_, lr_, nloop, k(tpr), "x", [&](llvm::Value* j) { return store_x_outputs(x_index(j)); })
          : emit_loop(b_, b_.CreateMul(lr_, k(vector), "", true, true), nloop, k(int64_t{tpr} * vector), "x",
                      [&](llvm::Value* j) -> Result<void> {
                        std::map<std::string, std::vector<Elem>> lanes;
                        llvm::Value* first = x_index(j);
                        set_vector_slots(first, vector, lanes);
                        return store_vector_outputs(first, vector);
                      });
      if (!r) return r;
    }
    // The next row group writes the same shared slots: every thread must have read
    // this group's first (one pass reads its slots after its only barrier).
    if (p_.smem_bytes > 0 && cfg_.grid_stride) barrier();
    return {};
  }

  // The row-space outputs of the current row, stored by the row's first thread.
  Result<void> store_row_outputs(llvm::Value* valid, llvm::Value* rowc) {
    Result<std::vector<Elem>> ro = row_outputs();
    if (!ro) return ro.error();
    if (ro->empty()) return {};
    llvm::LLVMContext& c = m_.getContext();
    llvm::BasicBlock* st = llvm::BasicBlock::Create(c, "row.store", fn_);
    llvm::BasicBlock* done = llvm::BasicBlock::Create(c, "row.stored", fn_);
    b_.CreateCondBr(b_.CreateAnd(valid, b_.CreateICmpEQ(lr_, k(0))), st, done);
    b_.SetInsertPoint(st);
    for (size_t q = 0; q < ro->size(); ++q) {
      if (split_) {
        // This split's share of the sum (a mean's share already divided by n), added
        // into the output the launch zeroed.
        llvm::Value* at = b_.CreateInBoundsGEP(b_.getFloatTy(), out_[p_.row_outputs[q]], rowc);
        b_.CreateAtomicRMW(llvm::AtomicRMWInst::FAdd, at, (*ro)[q].value, llvm::MaybeAlign(4),
                           llvm::AtomicOrdering::Monotonic);
      } else {
        cg_->store((*ro)[q], out_[p_.row_outputs[q]], rowc);
      }
    }
    b_.CreateBr(done);
    b_.SetInsertPoint(done);
    return {};
  }

  // True when every pointer a vector slot reads or writes in whole runs is aligned to
  // its pieces (the params X-space code reads densely, and the X-space outputs).
  llvm::Value* aligned_for_vector() {
    std::vector<std::pair<ValueId, ValueIndex>> roots = x_output_roots();
    for (const auto& pass : p_.passes)
      for (auto& r : pass_roots(pass)) roots.push_back(r);
    std::vector<std::pair<llvm::Value*, int64_t>> need;
    for (auto& [param, map] : prog_->x_reads(roots))
      if (kernels::dense_runs(map, p_.vector)) {
        DType dt = g_.node(g_.params()[static_cast<size_t>(param)]).type.dtype;
        need.emplace_back(in_[static_cast<size_t>(param)], ElementCodegen::vector_piece_bytes(dt, p_.vector));
      }
    for (size_t o : p_.x_outputs) {
      DType dt = g_.node(g_.outputs()[o].value).type.dtype;
      need.emplace_back(out_[o], ElementCodegen::vector_piece_bytes(dt, p_.vector));
    }
    llvm::Value* bits = b_.getInt64(0);
    for (auto& [ptr, bytes] : need)
      bits = b_.CreateOr(bits, b_.CreateAnd(b_.CreatePtrToInt(ptr, b_.getInt64Ty()), bytes - 1));
    return b_.CreateICmpEQ(bits, b_.getInt64(0), "aligned");
  }

  // A persistent row group: thread t of a row holds slots s = 0..slots-1, slot s the
  // `vector` adjacent elements starting at j = (s * threads_per_row + t) * vector
  // (consecutive threads on consecutive vectors: coalesced). Everything is straight-
  // line code over the slots: each operand is loaded once (one access per slot for
  // params read in dense runs), and every X-space value is computed once and kept
  // for the later passes and the outputs (softmax's exp(x - max) feeds both its sum
  // and its output). Slots past the row's end read the row's first element and fold
  // the identity; they store nothing.
  Result<void> persistent_body(llvm::Value* grp, int vector) {
    const int tpr = cfg_.threads_per_row;
    const int64_t nslots = (p_.n + int64_t{tpr} * vector - 1) / (int64_t{tpr} * vector);
    llvm::Value* row = b_.CreateAdd(b_.CreateMul(grp, k(cfg_.rows_per_block), "", true, true), sub_, "row", true, true);
    llvm::Value* valid = b_.CreateICmpSLT(row, k(p_.rows), "valid");
    llvm::Value* rowc = b_.CreateSelect(valid, row, k(p_.rows - 1));
    llvm::Value* nrow = b_.CreateSelect(valid, k(p_.n), k(0), "row.elems");
    prog_->set_row(rowc);
    llvm::Value* base = kernels::emit_index_map(b_, rowc, p_.row_map);

    std::vector<llvm::Value*> ok, first;  // per slot: in the row; X index of its first element
    // Per slot: (param, map) -> the slot's `vector` elements of it.
    std::vector<std::map<std::string, std::vector<Elem>>> lanes(static_cast<size_t>(nslots));
    for (int64_t sl = 0; sl < nslots; ++sl) {
      llvm::Value* j = b_.CreateMul(b_.CreateAdd(lr_, k(sl * tpr), "", true, true), k(vector), "", true, true);
      ok.push_back(b_.CreateICmpSLT(j, nrow, "slot.ok"));
      llvm::Value* jc = b_.CreateSelect(ok.back(), j, k(0));
      first.push_back(b_.CreateAdd(base, kernels::emit_index_map(b_, jc, p_.red_map), "i", true, true));
      set_vector_slots(first.back(), vector, lanes[static_cast<size_t>(sl)], static_cast<size_t>(sl * vector));
    }

    size_t slot = 0;  // reductions so far, in pass order: their shared-memory slots
    for (const std::vector<ValueId>& pass : p_.passes) {
      if (Result<void> r = prog_->prepare(pass_roots(pass)); !r) return r;
      std::vector<llvm::Value*> vals;
      for (ValueId v : pass) vals.push_back(folds_.at(v).identity());
      for (int64_t e = 0; e < nslots * vector; ++e) {
        prog_->use_slot(static_cast<size_t>(e));
        for (size_t q = 0; q < pass.size(); ++q) {
          const Fold& f = folds_.at(pass[q]);
          Result<Elem> x = prog_->x_value(g_.node(pass[q]).inputs[0], kernels::dense_index(p_.x));
          if (!x) return x.error();
          vals[q] = f.combine(vals[q], b_.CreateSelect(ok[static_cast<size_t>(e / vector)], f.element(*x), f.identity()));
        }
      }
      block_reduce(pass, vals, slot);
      slot += pass.size();
      for (size_t q = 0; q < pass.size(); ++q) prog_->set_reduced(pass[q], folds_.at(pass[q]).finish(vals[q], p_.n));
    }

    if (Result<void> r = store_row_outputs(valid, rowc); !r) return r;
    if (!p_.x_outputs.empty()) {
      if (Result<void> r = prog_->prepare(x_output_roots()); !r) return r;
      for (int64_t sl = 0; sl < nslots; ++sl) {
        if (Result<void> r = store_vector_outputs(first[static_cast<size_t>(sl)], vector,
                                                  static_cast<size_t>(sl * vector), ok[static_cast<size_t>(sl)]);
            !r)
          return r;
      }
    }
    if (p_.smem_bytes > 0 && cfg_.grid_stride) barrier();
    return {};
  }

  // Slots slot0 .. slot0 + vector - 1 of the element program: the `vector` adjacent X
  // elements from index `first` (vector > 1 only where the row is contiguous), params
  // read in dense runs loaded once per (param, map) as vectors kept in `lanes`, which
  // must live as long as the slots are read.
  void set_vector_slots(llvm::Value* first, int vector, std::map<std::string, std::vector<Elem>>& lanes, size_t slot0 = 0) {
    for (int l = 0; l < vector; ++l) {
      llvm::Value* i = l == 0 ? first : b_.CreateAdd(first, k(l), "", true, true);
      kernels::GroupValues::Hook lane;
      if (vector > 1)
        lane = [this, l, vector, &lanes, first](ValueId v, const ValueIndex& at) -> std::optional<Elem> {
          const Node& n = g_.node(v);
          if (n.op != OpKind::Param) return std::nullopt;
          IndexMap map = kernels::offset_map(at, n.type.shape);
          if (!kernels::dense_runs(map, vector)) return std::nullopt;  // a scalar load per element
          return load_lanes(lanes, v, map, first, vector)[static_cast<size_t>(l)];
        };
      prog_->set_slot(slot0 + static_cast<size_t>(l), i, std::move(lane));
    }
  }

  // The X-space outputs of slots slot0 .. slot0 + vector - 1 (from X index `first`):
  // every value first (straight-line, so that later code may reuse them), then the
  // stores, `vector` elements at a time, under `ok` when given.
  Result<void> store_vector_outputs(llvm::Value* first, int vector, size_t slot0 = 0, llvm::Value* ok = nullptr) {
    std::vector<std::vector<Elem>> vals(p_.x_outputs.size());  // [output][lane]
    for (int l = 0; l < vector; ++l) {
      prog_->use_slot(slot0 + static_cast<size_t>(l));
      for (size_t q = 0; q < p_.x_outputs.size(); ++q) {
        ValueId v = g_.outputs()[p_.x_outputs[q]].value;
        Result<Elem> e = prog_->x_value(v, kernels::dense_index(g_.node(v).type.shape));
        if (!e) return e.error();
        vals[q].push_back(*e);
      }
    }
    llvm::BasicBlock* done = nullptr;
    if (ok) {
      llvm::BasicBlock* st = llvm::BasicBlock::Create(m_.getContext(), "slot.store", fn_);
      done = llvm::BasicBlock::Create(m_.getContext(), "slot.stored", fn_);
      b_.CreateCondBr(ok, st, done);
      b_.SetInsertPoint(st);
    }
    for (size_t q = 0; q < p_.x_outputs.size(); ++q) store_lanes(out_[p_.x_outputs[q]], vals[q], first);
    if (ok) {
      b_.CreateBr(done);
      b_.SetInsertPoint(done);
    }
    return {};
  }

  // Param `v`'s `vector` elements from X index `first` through `map` (dense runs),
  // loaded at the first request of the slot's (param, map).
  const std::vector<Elem>& load_lanes(std::map<std::string, std::vector<Elem>>& memo, ValueId v, const IndexMap& map,
                                      llvm::Value* first, int vector) {
    const int p = prog_->param_slot(v);
    std::string key = std::to_string(p) + "#" + map.str();
    if (auto it = memo.find(key); it != memo.end()) return it->second;
    std::vector<Elem> out = cg_->load_vector(g_.node(v).type.dtype, in_[static_cast<size_t>(p)],
                                             kernels::emit_index_map(b_, first, map), vector);
    return memo.emplace(std::move(key), std::move(out)).first->second;
  }

  // Stores one slot's lanes of an X-space output at X indices first, first + 1, ...
  void store_lanes(llvm::Value* out, const std::vector<Elem>& lanes, llvm::Value* first) {
    if (lanes.size() == 1) {
      cg_->store(lanes[0], out, first);
      return;
    }
    std::vector<llvm::Value*> vals;
    for (const Elem& e : lanes) vals.push_back(e.value);
    cg_->store_vector(lanes[0].dtype, out, first, vals);
  }

  // The pass's partials, one per thread, become the row's values in every thread of
  // the row: a butterfly over the row's lanes of a warp (every lane ends with the same
  // value, since each step is commutative), then, for rows wider than a warp, each
  // warp's value through shared memory, combined by every thread in warp order.
  void block_reduce(const std::vector<ValueId>& pass, std::vector<llvm::Value*>& vals, size_t slot0) {
    const int width = std::min(cfg_.threads_per_row, 32);
    for (int off = width / 2; off >= 1; off /= 2)
      for (size_t q = 0; q < pass.size(); ++q) vals[q] = folds_.at(pass[q]).combine(vals[q], shuffle(vals[q], off));
    if (p_.warps_per_row == 1) return;
    llvm::LLVMContext& c = m_.getContext();
    const int wpr = p_.warps_per_row;
    llvm::Value* row_slots = b_.CreateMul(sub_, k(wpr), "row.slots", true, true);
    llvm::BasicBlock* st = llvm::BasicBlock::Create(c, "warp.store", fn_);
    llvm::BasicBlock* done = llvm::BasicBlock::Create(c, "warp.stored", fn_);
    b_.CreateCondBr(b_.CreateICmpEQ(lane_, k(0)), st, done);
    b_.SetInsertPoint(st);
    for (size_t q = 0; q < pass.size(); ++q)
      b_.CreateStore(vals[q], slot_ptr(slot0 + q, vals[q]->getType(), b_.CreateAdd(row_slots, warp_, "", true, true)));
    b_.CreateBr(done);
    b_.SetInsertPoint(done);
    barrier();
    for (size_t q = 0; q < pass.size(); ++q) {
      llvm::Type* t = vals[q]->getType();
      llvm::Value* r = b_.CreateLoad(t, slot_ptr(slot0 + q, t, row_slots));
      for (int w = 1; w < wpr; ++w)
        r = folds_.at(pass[q]).combine(r, b_.CreateLoad(t, slot_ptr(slot0 + q, t, b_.CreateAdd(row_slots, k(w), "", true, true))));
      vals[q] = r;
    }
  }

  llvm::Value* slot_ptr(size_t red, llvm::Type* t, llvm::Value* index) {
    llvm::Value* base = b_.CreateConstInBoundsGEP1_64(b_.getInt8Ty(), smem_, static_cast<uint64_t>(p_.smem_offset[red]));
    return b_.CreateInBoundsGEP(t, base, index);
  }

  void barrier() {
    if (!simulate_) {
      b_.CreateIntrinsic(llvm::Intrinsic::nvvm_barrier0, {}, {});
      return;
    }
    auto* fty = llvm::FunctionType::get(b_.getVoidTy(), {b_.getPtrTy()}, false);
    b_.CreateCall(fty, hook_barrier_, {hook_ctx_});
  }

  llvm::Value* shuffle32(llvm::Value* v, int off) {  // an i32 or a float
    const int block = static_cast<int>(block_threads(cfg_));
    // Every lane of the warp takes part (the block is whole warps, or one part-warp).
    const uint32_t mask = block >= 32 ? 0xFFFFFFFFu : (1u << block) - 1;
    if (!simulate_) {
      // c = 0x1f: the whole warp is one segment; lane ^ off stays in the row's
      // aligned group of threads_per_row lanes (a power of two when below 32).
      auto id = v->getType()->isFloatTy() ? llvm::Intrinsic::nvvm_shfl_sync_bfly_f32 : llvm::Intrinsic::nvvm_shfl_sync_bfly_i32;
      return b_.CreateIntrinsic(id, {}, {b_.getInt32(mask), v, b_.getInt32(static_cast<uint32_t>(off)), b_.getInt32(0x1f)});
    }
    llvm::Type* i32 = b_.getInt32Ty();
    llvm::Value* bits = v->getType()->isFloatTy() ? b_.CreateBitCast(v, i32) : v;
    auto* fty = llvm::FunctionType::get(i32, {b_.getPtrTy(), i32, i32, i32}, false);
    llvm::Value* r = b_.CreateCall(fty, hook_shfl_, {hook_ctx_, tid32_, bits, b_.getInt32(static_cast<uint32_t>(off))});
    return v->getType()->isFloatTy() ? b_.CreateBitCast(r, v->getType()) : r;
  }

  llvm::Value* shuffle(llvm::Value* v, int off) {
    if (!v->getType()->isIntegerTy(64)) return shuffle32(v, off);
    // shfl moves 32 bits: an i64 goes as two halves.
    llvm::Type* i32 = b_.getInt32Ty();
    llvm::Type* i64 = b_.getInt64Ty();
    llvm::Value* lo = shuffle32(b_.CreateTrunc(v, i32), off);
    llvm::Value* hi = shuffle32(b_.CreateTrunc(b_.CreateLShr(v, 32), i32), off);
    return b_.CreateOr(b_.CreateZExt(lo, i64), b_.CreateShl(b_.CreateZExt(hi, i64), 32));
  }

  bool simulate_ = false;
  llvm::Value* split_ = nullptr;  // blockIdx.y when the rows are split over blocks (split_reduction > 1)
  llvm::Value* smem_ = nullptr;
  llvm::Value *hooks_ = nullptr, *hook_ctx_ = nullptr, *hook_barrier_ = nullptr, *hook_shfl_ = nullptr;
  llvm::Value *tid32_ = nullptr, *sub_ = nullptr, *lr_ = nullptr, *warp_ = nullptr, *lane_ = nullptr;
};

Result<EmittedKernel> emit(const KernelSpec& spec, const KernelConfig& config, const llvmb::Target& check_target,
                           const llvmb::Target& target, bool gpu, bool simulate) {
  if (spec.kind != KernelKind::Reduction)
    return diag("kernel '" + spec.entry + "' is a " + std::string(kernel_kind_name(spec.kind)) + " kernel, not a reduction");
  Result<Plan> plan = make_plan(spec, config, check_target);
  if (!plan) return plan.error();
  if (!gpu)
    if (std::optional<std::string> e = kernels::host_knob_error(config)) return diag(*e);
  EmittedKernel k;
  k.context = std::make_unique<llvm::LLVMContext>();
  k.module = std::make_unique<llvm::Module>(spec.entry, *k.context);
  llvmb::prepare_module(*k.module, target);
  k.entry = spec.entry;
  Result<void> built = gpu ? NvptxBuilder(spec, config, *plan, target, *k.module, simulate).build()
                           : HostBuilder(spec, config, *plan, target, *k.module).build();
  if (!built) return built.error();
  if (auto err = llvmb::verify(*k.module))  // an emitter bug, not a user error: say so
    return diag("internal: the emitted module does not verify: " + *err);
  if (gpu) k.launch = launch_of(*plan, config);
  return k;
}

}  // namespace

Result<EmittedKernel> emit_reduction(const KernelSpec& spec, const KernelConfig& config, const llvmb::Target& target) {
  const bool gpu = target.kind == llvmb::Target::Kind::NVPTX;
  return emit(spec, config, target, target, gpu, /*simulate=*/false);
}

Result<EmittedKernel> emit_reduction_block_on_host(const KernelSpec& spec, const KernelConfig& config) {
  // Checked as for sm_90a: the same limits apply to the kernel being simulated.
  return emit(spec, config, llvmb::Target::nvptx("sm_90a"), llvmb::Target::host(), /*gpu=*/true, /*simulate=*/true);
}

namespace {
class ReductionEmitter final : public Emitter {
 public:
  Result<EmittedKernel> emit(const KernelSpec& spec, const KernelConfig& config,
                             const llvmb::Target& target) const override {
    return emit_reduction(spec, config, target);
  }
};
}  // namespace

const Emitter& reduction_emitter() {
  static const ReductionEmitter e;
  return e;
}

Result<KernelConfig> suggest_reduction_config(const KernelSpec& spec, KernelConfig base) {
  base.threads_per_row = 256;
  base.rows_per_block = 1;
  Result<Plan> p = make_plan(spec, base, llvmb::Target::host());
  if (!p) return p.error();
  auto pow2_at_least = [](int64_t v) {
    int64_t r = 1;
    while (r < v) r *= 2;
    return r;
  };
  const bool inner_reduced = !p->rdims.empty() && p->rdims.back() == static_cast<int>(p->x.size()) - 1;
  const int64_t n = std::max<int64_t>(p->n, 1);
  int64_t tpr = inner_reduced ? (n <= 32 ? pow2_at_least(n) : pow2_at_least((n + 7) / 8)) : pow2_at_least((n + 63) / 64);
  tpr = std::clamp<int64_t>(tpr, 1, 256);
  // Fill the block with rows, but not with more rows than there are. Both factors
  // are powers of two, so a block above 32 threads is whole warps.
  int64_t rpb = std::min<int64_t>(256 / tpr, pow2_at_least(std::max<int64_t>(p->rows, 1)));
  base.threads_per_row = static_cast<int>(tpr);
  base.rows_per_block = static_cast<int>(std::max<int64_t>(rpb, 1));
  return base;
}

Result<ReductionInfo> reduction_info(const KernelSpec& spec, const KernelConfig& config) {
  Result<Plan> p = make_plan(spec, config, llvmb::Target::host());
  if (!p) return p.error();
  ReductionInfo r;
  r.x = p->x;
  r.reduced_dims = p->rdims;
  r.rows = p->rows;
  r.row_elems = p->n;
  r.passes = static_cast<int>(p->passes.size());
  r.x_outputs = static_cast<int>(p->x_outputs.size());
  r.row_outputs = static_cast<int>(p->row_outputs.size());
  r.launch = launch_of(*p, config);
  r.static_shared_bytes = p->smem_bytes;
  r.persistent = p->persistent;
  r.vector = p->vector;
  r.elems_per_thread = p->persistent ? p->slots * p->vector : 0;
  return r;
}

}  // namespace sf
