#include "codegen/kernels/matmul.h"

#include <algorithm>
#include <cctype>
#include <functional>
#include <numeric>
#include <optional>
#include <set>

#include <llvm/IR/Constants.h>
#include <llvm/IR/Function.h>
#include <llvm/IR/GlobalVariable.h>
#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/Intrinsics.h>
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
using kernels::ValueIndex;

Diag diag(std::string msg, SourceLoc loc = {}) { return Diag{"", loc, "matmul: " + std::move(msg)}; }

bool pow2(int64_t v) { return v > 0 && (v & (v - 1)) == 0; }
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// ---- the group ------------------------------------------------------------------------------

// A matmul operand read in place: the param it is a view of, and for each of the
// operand's logical dims ([..., M, K] for A, [..., K, N] for B) the element stride into
// that param (0 where a dim is broadcast by an expand).
struct Operand {
  int param = -1;  // index among the group's params
  DType dtype = DType::F32;
  Shape shape;
  std::vector<int64_t> strides;
};

// What emission needs to know about a group, found once from the graph.
struct Plan {
  ValueId mm = -1;
  DType dtype = DType::F32;  // the matmul's (and both operands')
  Shape out;                 // the matmul's output shape O = [batch..., M, N]
  Shape batch;
  int64_t nbatch = 1, M = 0, N = 0, K = 0;
  Operand a, b;
  // Per batch dim of O: the element stride of A and B (0 where broadcast).
  std::vector<int64_t> a_bstride, b_bstride;
  int64_t sam = 0, sak = 0, sbk = 0, sbn = 0;  // strides of A's M, K and B's K, N dims
  std::vector<ValueIndex> out_at;             // each output's index over O
  bool bare = false;  // the kernel's one output is the matmul's own result (no epilogue)
};

// The index over O of a value of `shape` written at O's flat index: shapes equal but
// for size-1 dims, so both have the same C-order flat index. nullopt otherwise.
std::optional<ValueIndex> aligned_index(const Shape& shape, const Shape& o) {
  std::vector<int> sd, od;
  for (size_t d = 0; d < shape.size(); ++d)
    if (shape[d] != 1) sd.push_back(static_cast<int>(d));
  for (size_t d = 0; d < o.size(); ++d)
    if (o[d] != 1) od.push_back(static_cast<int>(d));
  if (sd.size() != od.size()) return std::nullopt;
  ValueIndex r{kernels::IndexMap{}, o, std::vector<int>(shape.size(), -1)};
  for (size_t k = 0; k < sd.size(); ++k) {
    if (shape[static_cast<size_t>(sd[k])] != o[static_cast<size_t>(od[k])]) return std::nullopt;
    r.src[static_cast<size_t>(sd[k])] = od[k];
  }
  return r;
}

std::string who(const Node& n) { return std::string(op_name(n.op)) + (n.name.empty() ? "" : " '" + n.name + "'"); }

// The element stride of each dim of `shape` under `m`, a map from the flat index
// over `shape` to an element offset; nullopt when the offset is not a sum of one
// stride per dim. Views that keep strides (transpose, permute, expand, a reshape of
// something dense) give a map of at most one step whose dims, normalised, each cover
// one or more whole dims of `shape`; a reshape that splits a strided dim does not.
std::optional<std::vector<int64_t>> dim_strides(const kernels::IndexMap& m, const Shape& shape) {
  if (m.contiguous()) return contiguous_strides(shape);
  if (m.steps.size() != 1) return std::nullopt;
  const kernels::StridedStep& s = m.steps[0];
  std::vector<int64_t> out(shape.size(), 0);
  // Innermost first: dim j of `shape` is the next factor n_j of the map's current
  // dim d, whose coordinate it advances by (size[d] / rem) steps of stride[d].
  int d = static_cast<int>(s.shape.size()) - 1;
  int64_t rem = d >= 0 ? s.shape[static_cast<size_t>(d)] : 1;
  for (size_t j = shape.size(); j-- > 0;) {
    const int64_t n = shape[j];
    if (n == 1) continue;
    if (d < 0 || rem % n != 0) return std::nullopt;
    out[j] = s.strides[static_cast<size_t>(d)] * (s.shape[static_cast<size_t>(d)] / rem);
    rem /= n;
    if (rem == 1 && --d >= 0) rem = s.shape[static_cast<size_t>(d)];
  }
  if (d >= 0) return std::nullopt;
  return out;
}

// Follows operand `which` of the matmul through views down to a param.
Result<Operand> find_operand(const Graph& g, const Node& mm, int which, const std::vector<int>& param_slot) {
  ValueId v = mm.inputs[static_cast<size_t>(which)];
  Operand op;
  op.shape = g.node(v).type.shape;
  op.dtype = g.node(v).type.dtype;
  ValueIndex at = kernels::dense_index(op.shape);
  while (kernels::is_view(g.node(v).op)) {
    const Node& n = g.node(v);
    std::optional<ValueIndex> ui = kernels::operand_index(n, at, g.node(n.inputs[0]).type.shape);
    if (!ui) return diag("internal: no index for " + who(n), n.loc);
    at = *ui;
    v = n.inputs[0];
  }
  const Node& p = g.node(v);
  const char* name = which == 0 ? "A" : "B";
  if (p.op != OpKind::Param)
    return diag(std::string("operand ") + name + " is computed in the group (" + who(p) +
                    "); a matmul kernel reads only params, through transposes and permutes",
                p.loc);
  op.param = param_slot[static_cast<size_t>(v)];
  std::optional<std::vector<int64_t>> st = dim_strides(kernels::offset_map(at, p.type.shape), op.shape);
  if (!st)
    return diag(std::string("operand ") + name + " is a reshape of a strided view of a param (" +
                    kernels::offset_map(at, p.type.shape).str() +
                    "), which has no stride per dim; only views with one are read in place",
                p.loc);
  op.strides = *st;
  return op;
}

Result<Plan> analyse(const KernelSpec& spec) {
  const Graph& g = spec.group;
  if (!is_c_identifier(spec.entry)) return diag("entry '" + spec.entry + "' is not a C identifier");
  if (g.outputs().empty()) return diag("group '" + g.name() + "' has no outputs");
  Plan p;
  int count = 0;
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const Node& n = g.nodes()[i];
    if (n.op == OpKind::Matmul) {
      if (count++ == 1)
        return diag("group '" + g.name() + "' holds more than one matmul (a kernel computes one)", n.loc);
      p.mm = static_cast<ValueId>(i);
      continue;
    }
    if (n.op == OpKind::Param || n.op == OpKind::Constant || kernels::is_elementwise(n.op) || kernels::is_view(n.op))
      continue;
    return diag("group '" + g.name() + "' contains " + who(n) + ", which is neither elementwise nor a view (the " +
                    (op_info(n.op).category == OpCategory::Composite ? "graph must be decomposed first"
                                                                     : "fusion pass must give it another kernel kind") +
                    ")",
                n.loc);
  }
  if (count == 0) return diag("group '" + g.name() + "' has no matmul (a pointwise kernel's job)");
  const Node& mm = g.node(p.mm);
  p.dtype = mm.type.dtype;
  if (p.dtype == DType::Bool) return diag("bool matmul is not supported", mm.loc);
  p.out = mm.type.shape;
  const size_t r = p.out.size();
  p.batch.assign(p.out.begin(), p.out.end() - 2);
  p.nbatch = numel(p.batch);
  p.M = p.out[r - 2];
  p.N = p.out[r - 1];
  std::vector<int> slot(g.nodes().size(), -1);
  for (size_t i = 0; i < g.params().size(); ++i) slot[static_cast<size_t>(g.params()[i])] = static_cast<int>(i);
  Result<Operand> a = find_operand(g, mm, 0, slot);
  if (!a) return a.error();
  Result<Operand> b = find_operand(g, mm, 1, slot);
  if (!b) return b.error();
  p.a = *a;
  p.b = *b;
  p.K = p.a.shape.back();
  const size_t ra = p.a.shape.size(), rb = p.b.shape.size(), nb = p.batch.size();
  p.sam = p.a.strides[ra - 2];
  p.sak = p.a.strides[ra - 1];
  p.sbk = p.b.strides[rb - 2];
  p.sbn = p.b.strides[rb - 1];
  // Batch dims broadcast right-aligned, as NumPy's: O's batch dim e is the operand's
  // batch dim e - (nb - its batch rank), when that exists and is not of size 1.
  auto bstrides = [&](const Operand& o) {
    std::vector<int64_t> s(nb, 0);
    const size_t ob = o.shape.size() - 2;
    for (size_t e = nb - ob; e < nb; ++e) {
      size_t d = e - (nb - ob);
      if (o.shape[d] != 1) s[e] = o.strides[d];
    }
    return s;
  };
  p.a_bstride = bstrides(p.a);
  p.b_bstride = bstrides(p.b);
  for (const Output& o : g.outputs()) {
    const Node& n = g.node(o.value);
    std::optional<ValueIndex> at = aligned_index(n.type.shape, p.out);
    if (!at)
      return diag("output '" + o.name + "' is " + n.type.str() + ", not on the matmul's output space " +
                      shape_str(p.out) + " (an epilogue is elementwise on the matmul's result)",
                  o.loc);
    p.out_at.push_back(*at);
  }
  // The epilogue has the matmul's value only at the element being computed: every
  // read of it must be at O's own index (fusion never puts a view after the matmul).
  std::set<std::string> seen;
  std::function<std::optional<Diag>(ValueId, const ValueIndex&)> walk = [&](ValueId v, const ValueIndex& at) -> std::optional<Diag> {
    if (!seen.insert(std::to_string(v) + "#" + at.key()).second) return std::nullopt;
    const Node& n = g.node(v);
    if (v == p.mm) {
      bool same = at.prefix.contiguous() && at.space == p.out;
      for (size_t d = 0; d < at.src.size() && same; ++d) same = p.out[d] == 1 || at.src[d] == static_cast<int>(d);
      if (!same) return diag("the epilogue reads the matmul's result at another element than its own (a view after the matmul)", n.loc);
      return std::nullopt;
    }
    for (ValueId u : n.inputs) {
      std::optional<ValueIndex> ui = kernels::operand_index(n, at, g.node(u).type.shape);
      if (!ui) return diag("internal: no index for " + who(n), n.loc);
      if (auto d = walk(u, *ui)) return d;
    }
    return std::nullopt;
  };
  for (size_t o = 0; o < g.outputs().size(); ++o)
    if (auto d = walk(g.outputs()[o].value, p.out_at[o])) return *d;
  p.bare = g.outputs().size() == 1 && g.outputs()[0].value == p.mm;
  return p;
}

// ---- the epilogue -------------------------------------------------------------------------------

// The group's outputs at one element of O, given the matmul's value there: element.h's
// GroupValues with two hooks. The matmul node is the accumulator at hand, and a param
// read over O itself (not through a reshape) is loaded at sum(coord * stride) of O's
// coordinates, which the kernel has as values: no divisions, where the flat index
// would need one per dim.
class Epilogue {
 public:
  Epilogue(const Graph& g, const Plan& p, ElementCodegen& cg, std::vector<llvm::Value*> inputs)
      : g_(g), p_(p), cg_(cg), inputs_(inputs), values_(g, cg, std::move(inputs)) {}

  // `coords`: O's coordinates (index-typed values), `flat`: O's flat index there,
  // `mm`: the matmul's element (already rounded to its dtype).
  Result<std::vector<Elem>> outputs(const std::vector<llvm::Value*>& coords, llvm::Value* flat, Elem mm) {
    values_.at_index(flat, [&](ValueId v, const ValueIndex& at) -> std::optional<Elem> {
      if (v == p_.mm) return mm;  // analyse() checked every read of it is at O's own index
      const Node& n = g_.node(v);
      if (n.op != OpKind::Param || !at.prefix.contiguous() || at.space != p_.out) return std::nullopt;
      return cg_.load(n.type.dtype, inputs_[static_cast<size_t>(values_.param_slot(v))], offset(n, at, coords));
    });
    std::vector<Elem> out;
    for (size_t o = 0; o < g_.outputs().size(); ++o) {
      Result<Elem> e = values_.value(g_.outputs()[o].value, p_.out_at[o]);
      if (!e) return Diag{"", e.error().loc, "matmul epilogue: " + e.error().message};
      out.push_back(*e);
    }
    return out;
  }

 private:
  llvm::Value* offset(const Node& n, const ValueIndex& at, const std::vector<llvm::Value*>& coords) {
    llvm::IRBuilderBase& b = cg_.builder();
    llvm::Type* it = coords.back()->getType();
    std::vector<int64_t> cs = contiguous_strides(n.type.shape), per_space(at.space.size(), 0);
    for (size_t d = 0; d < at.src.size(); ++d)
      if (at.src[d] >= 0 && n.type.shape[d] != 1) per_space[static_cast<size_t>(at.src[d])] += cs[d];
    llvm::Value* off = nullptr;
    for (size_t s = 0; s < per_space.size(); ++s) {
      if (per_space[s] == 0) continue;
      llvm::Value* c = coords[s];
      if (per_space[s] != 1) c = b.CreateMul(c, llvm::ConstantInt::get(it, static_cast<uint64_t>(per_space[s])), "", true, true);
      off = off ? b.CreateAdd(off, c, "", true, true) : c;
    }
    return off ? off : llvm::ConstantInt::get(it, 0);
  }

  const Graph& g_;
  const Plan& p_;
  ElementCodegen& cg_;
  std::vector<llvm::Value*> inputs_;
  kernels::GroupValues values_;
};

// ---- shared emission helpers -----------------------------------------------------------------------


// O's batch coordinates of batch index z (index-typed), and the element offsets of
// A's and B's matrices for it.
struct BatchIndex {
  std::vector<llvm::Value*> coords;
  llvm::Value* a_off = nullptr;
  llvm::Value* b_off = nullptr;
};

BatchIndex batch_index(llvm::IRBuilderBase& b, const Plan& p, llvm::Value* z) {
  llvm::Type* it = z->getType();
  auto k = [&](int64_t v) { return llvm::ConstantInt::get(it, static_cast<uint64_t>(v)); };
  BatchIndex r;
  const size_t nb = p.batch.size();
  int64_t inner = 1;
  r.coords.assign(nb, nullptr);
  for (size_t e = nb; e-- > 0;) {
    llvm::Value* c = k(0);
    if (p.batch[e] != 1) {
      c = inner > 1 ? b.CreateUDiv(z, k(inner)) : z;
      if (inner * p.batch[e] < p.nbatch) c = b.CreateURem(c, k(p.batch[e]));  // the outermost needs none
    }
    r.coords[e] = c;
    inner *= p.batch[e];
  }
  auto offset = [&](const std::vector<int64_t>& strides) -> llvm::Value* {
    llvm::Value* off = k(0);
    for (size_t e = 0; e < nb; ++e)
      if (strides[e] != 0) off = b.CreateAdd(off, b.CreateMul(r.coords[e], k(strides[e]), "", true, true), "", true, true);
    return off;
  };
  r.a_off = offset(p.a_bstride);
  r.b_off = offset(p.b_bstride);
  return r;
}

// ---- NVPTX: the tiled kernel --------------------------------------------------------------------

// Maximum shared memory one block may use (opt-in dynamic shared memory), per the
// CUDA C++ Programming Guide's "Technical Specifications per Compute Capability":
// 227 KiB on sm_90, 163 KiB on sm_80/87, 99 KiB on sm_86/89, 96 KiB on sm_70/72,
// 64 KiB on sm_75, 48 KiB before Volta.
int64_t max_shared_bytes(int sm) {
  if (sm >= 90) return 227 * 1024;
  if (sm == 80 || sm == 87) return 163 * 1024;
  if (sm == 86 || sm == 89) return 99 * 1024;
  if (sm == 75) return 64 * 1024;
  if (sm >= 70) return 96 * 1024;
  return 48 * 1024;
}

// How a block's threads cover its tile, and where the tiles sit in shared memory.
struct Tiling {
  int bm = 0, bn = 0, bk = 0, threads = 0, stages = 0, group_m = 0;
  int tm = 0, tn = 0;  // the threads as a tm x tn grid over the tile
  int rm = 0, rn = 0;  // each thread's register tile: rm rows x rn columns, contiguous
  // Shared memory holds f32 tiles As[stage][k][m] and Bs[stage][k][n] (k-major, so a
  // thread's rm (rn) values for one k are adjacent: vector loads). Rows are padded by
  // 4 floats where the global loads walk k, whose stores would otherwise hit one bank.
  int lda = 0, ldb = 0;
  bool a_kfast = false, b_kfast = false;  // the global load order of each tile
  int va = 1, vb = 1;                      // widths of the shared vector loads
  int64_t stage_floats = 0;
  int64_t shared_bytes = 0;
  int64_t kt = 0;  // K tiles one block walks (all of them unless split-K)
  int split = 1;   // split-K: blocks (grid z) that each sum kt of the K tiles
  // Copies by cp.async (PTX ISA 7.0, sm_80+) straight into shared memory, no
  // registers on the way: f32 only, where shared memory holds the storage type.
  bool async = false;
};

Result<Tiling> make_tiling(const KernelConfig& c, const Plan& p, int sm) {
  auto bad = [](const std::string& s) -> Result<Tiling> { return diag(s); };
  auto num = [](int64_t v) { return std::to_string(v); };
  if (!pow2(c.split_k) || c.split_k > 64) return bad("split_k = " + num(c.split_k) + " is not a power of two in 1..64");
  if (c.split_k > 1) {
    // Each split adds its partial sums into the output atomically: nothing may be
    // applied to them first, and PTX has f32 atomic adds (f16/bf16 ones only on some
    // archs and not for every layout).
    if (!p.bare)
      return bad("split_k = " + num(c.split_k) +
                 " needs the matmul's own result as the kernel's only output (an epilogue would see partial sums)");
    if (p.dtype != DType::F32)
      return bad("split_k = " + num(c.split_k) + " needs an f32 matmul (partial sums are added with f32 atomics), not " +
                 std::string(dtype_name(p.dtype)));
    int64_t tiles = ceil_div(p.K, int64_t{c.block_k});
    if (tiles % c.split_k != 0)
      return bad("split_k = " + num(c.split_k) + " does not divide the " + num(tiles) + " K tiles of block_k = " +
                 num(c.block_k) + " (K = " + num(p.K) + ")");
  }
  if (!pow2(c.block_m) || c.block_m > 256) return bad("block_m = " + num(c.block_m) + " is not a power of two in 1..256");
  if (!pow2(c.block_n) || c.block_n > 256) return bad("block_n = " + num(c.block_n) + " is not a power of two in 1..256");
  if (!pow2(c.block_k) || c.block_k > 128) return bad("block_k = " + num(c.block_k) + " is not a power of two in 1..128");
  if (!pow2(c.warps) || c.warps > 32)
    return bad("warps = " + num(c.warps) + " is not a power of two in 1..32 (at most 1024 threads)");
  if (c.stages < 1 || c.stages > 8) return bad("stages = " + num(c.stages) + " is outside 1..8");
  if (c.group_m < 1) return bad("group_m = " + num(c.group_m) + " must be positive");
  Tiling t;
  t.bm = c.block_m;
  t.bn = c.block_n;
  t.bk = c.block_k;
  t.threads = c.warps * 32;
  t.stages = c.stages;
  t.group_m = c.group_m;
  // The threads as a tm x tn grid (both powers of two dividing the tile's sides),
  // choosing the squarest register tile: rm + rn shared loads feed rm * rn FMAs.
  for (int tn = 1; tn <= t.threads; tn *= 2) {
    int tm = t.threads / tn;
    if (tn > t.bn || tm > t.bm) continue;
    int rm = t.bm / tm, rn = t.bn / tn;
    if (t.tm == 0 || rm + rn < t.rm + t.rn || (rm + rn == t.rm + t.rn && rn > t.rn)) {
      t.tm = tm;
      t.tn = tn;
      t.rm = rm;
      t.rn = rn;
    }
  }
  if (t.tm == 0)
    return bad("a " + num(t.bm) + "x" + num(t.bn) + " tile has fewer elements than warps * 32 = " + num(t.threads) +
               " threads (each thread needs at least one)");
  // A thread has at most 255 registers; 128 accumulators plus the A/B fragments,
  // the prefetched tile and the addresses are already about all of them.
  if (t.rm * t.rn > 128)
    return bad("each thread would hold " + num(t.rm * t.rn) + " accumulators (" + num(t.bm) + "x" + num(t.bn) + " / " +
               num(t.threads) + " threads); at most 128 fit in registers");
  // Coalesced global loads: consecutive threads walk the operand's unit-stride dim.
  t.a_kfast = !(p.sam == 1 && p.sak != 1);
  t.b_kfast = p.sbk == 1 && p.sbn != 1;
  t.lda = t.bm + (t.a_kfast ? 4 : 0);
  t.ldb = t.bn + (t.b_kfast ? 4 : 0);
  t.stage_floats = int64_t{t.bk} * (t.lda + t.ldb);
  t.shared_bytes = t.stage_floats * t.stages * 4;
  auto gcd4 = [](std::initializer_list<int64_t> v) {
    int64_t g = 4;
    for (int64_t x : v) g = std::gcd(g, x);
    return static_cast<int>(g);
  };
  t.va = gcd4({t.rm, t.lda, t.stage_floats});
  t.vb = gcd4({t.rn, t.ldb, t.stage_floats, int64_t{t.bk} * t.lda});
  if (sm > 0 && t.shared_bytes > max_shared_bytes(sm))
    return bad("the tiles need " + num(t.shared_bytes) + " bytes of shared memory (" + num(t.stages) + " stages of " +
               num(t.bm) + "x" + num(t.bk) + " and " + num(t.bk) + "x" + num(t.bn) + " f32), more than sm_" + num(sm) +
               "'s " + num(max_shared_bytes(sm)) + " per block");
  t.split = c.split_k;
  t.kt = ceil_div(p.K, t.bk) / t.split;
  t.async = sm >= 80 && t.stages >= 2 && p.dtype == DType::F32;
  return t;
}

LaunchShape matmul_launch(const Plan& p, const Tiling& t) {
  LaunchShape l;
  int64_t tiles = ceil_div(p.M, t.bm) * ceil_div(p.N, t.bn);
  l.grid = {std::max<int64_t>(tiles, 1), std::max<int64_t>(p.nbatch, 1), t.split};
  l.block = {t.threads, 1, 1};
  l.zero_outputs = t.split > 1;
  l.shared_bytes = static_cast<int>(t.shared_bytes);
  return l;
}

Result<bool> check_grid(const Plan& p, const Tiling& t) {
  int64_t tiles = ceil_div(p.M, t.bm) * ceil_div(p.N, t.bn);
  if (tiles > 0x7FFFFFFF) return diag(std::to_string(tiles) + " tiles exceed the grid's x limit 2^31-1");
  if (p.nbatch > 65535)
    return diag("batch of " + std::to_string(p.nbatch) + " matrices exceeds the grid's y limit 65535");
  return true;
}

// Whether every index the kernel forms fits i32 (half the registers and cheaper
// arithmetic than i64): the operands' offsets over tiles padded past M, N and one K
// tile past K (the last prefetch), and every tensor's size.
bool fits_i32(const Graph& g, const Plan& p, const Tiling& t) {
  const int64_t lim = int64_t{1} << 31;
  int64_t mp = ceil_div(p.M, t.bm) * t.bm + t.bm, np = ceil_div(p.N, t.bn) * t.bn + t.bn, kp = (t.kt * t.split + 1) * t.bk;
  auto span = [&](const std::vector<int64_t>& bs, int64_t r, int64_t sr, int64_t c, int64_t sc) {
    int64_t s = (r - 1) * sr + (c - 1) * sc + 1;
    for (size_t e = 0; e < bs.size(); ++e) s += (p.batch[e] - 1) * bs[e];
    return s;
  };
  int64_t worst = std::max({span(p.a_bstride, mp, p.sam, kp, p.sak), span(p.b_bstride, kp, p.sbk, np, p.sbn),
                            p.nbatch * mp * np, mp + t.bm + t.threads, np + t.bn + t.threads, kp + t.bk + t.threads,
                            t.stage_floats * t.stages});
  for (const Node& n : g.nodes()) worst = std::max(worst, numel(n.type.shape));
  return worst < lim / 2;
}

class TiledKernel {
 public:
  // `sim`: the same kernel as a host function running one thread of one block (see
  // emit_matmul_block_on_host); `target` is then the host.
  TiledKernel(const KernelSpec& spec, const Plan& plan, const Tiling& t, const llvmb::Target& target, llvm::Module& m,
              bool sim, bool wide = false)
      : spec_(spec), g_(spec.group), p_(plan), t_(t), target_(target), m_(m), b_(m.getContext()), sim_(sim),
        wide_(wide) {}

  Result<bool> build() {
    llvm::LLVMContext& c = m_.getContext();
    const size_t np = g_.params().size(), no = g_.outputs().size();
    it_ = !wide_ && fits_i32(g_, p_, t_) ? b_.getInt32Ty() : b_.getInt64Ty();
    f32_ = b_.getFloatTy();
    llvm::Value *bx = nullptr, *by = nullptr, *bz = nullptr;
    if (!sim_) {
      llvm::Type* gptr = llvm::PointerType::get(c, 1);  // addrspace(1): global memory
      auto* fty = llvm::FunctionType::get(b_.getVoidTy(), std::vector<llvm::Type*>(np + no, gptr), false);
      fn_ = llvm::Function::Create(fty, llvm::Function::ExternalLinkage, spec_.entry, m_);
      llvmb::mark_kernel(*fn_, t_.threads);
      for (size_t i = 0; i < np + no; ++i) {
        llvm::Argument* a = fn_->getArg(static_cast<unsigned>(i));
        a->setName(i < np ? "in" + std::to_string(i) : "out" + std::to_string(i - np));
        if (i < np) a->addAttr(llvm::Attribute::ReadOnly);
        (i < np ? in_ : out_).push_back(a);
      }
      b_.SetInsertPoint(llvm::BasicBlock::Create(c, "entry", fn_));
      auto sreg = [&](llvm::Intrinsic::ID id) { return b_.CreateZExt(b_.CreateIntrinsic(id, {}, {}), it_); };
      tid_ = sreg(llvm::Intrinsic::nvvm_read_ptx_sreg_tid_x);
      bx = sreg(llvm::Intrinsic::nvvm_read_ptx_sreg_ctaid_x);
      by = sreg(llvm::Intrinsic::nvvm_read_ptx_sreg_ctaid_y);
      if (t_.split > 1) bz = sreg(llvm::Intrinsic::nvvm_read_ptx_sreg_ctaid_z);
      // Dynamic shared memory (`.extern .shared .b8 sf_smem[]`), sized by the launch:
      // static shared memory stops at 48 KiB, and Triton's configs go beyond it.
      auto* arr = llvm::ArrayType::get(f32_, 0);
      auto* gv = new llvm::GlobalVariable(m_, arr, false, llvm::GlobalValue::ExternalLinkage, nullptr, "sf_smem",
                                          nullptr, llvm::GlobalValue::NotThreadLocal, 3);
      gv->setAlignment(llvm::Align(16));
      smem_ = gv;
    } else {
      llvm::Type* i32 = b_.getInt32Ty();
      llvm::Type* ptr = b_.getPtrTy();
      // void entry(ptr args, i32 blockIdx.x, i32 blockIdx.y, i32 threadIdx.x, ptr smem,
      //            ptr barrier, ptr barrier_ctx, i32 blockIdx.z)
      auto* fty = llvm::FunctionType::get(b_.getVoidTy(), {ptr, i32, i32, i32, ptr, ptr, ptr, i32}, false);
      fn_ = llvm::Function::Create(fty, llvm::Function::ExternalLinkage, spec_.entry, m_);
      b_.SetInsertPoint(llvm::BasicBlock::Create(c, "entry", fn_));
      for (size_t i = 0; i < np + no; ++i) {
        llvm::Value* slot = b_.CreateConstInBoundsGEP1_64(ptr, fn_->getArg(0), i);
        (i < np ? in_ : out_).push_back(b_.CreateAlignedLoad(ptr, slot, llvm::Align(8)));
      }
      bx = b_.CreateZExt(fn_->getArg(1), it_);
      by = b_.CreateZExt(fn_->getArg(2), it_);
      tid_ = b_.CreateZExt(fn_->getArg(3), it_);
      smem_ = fn_->getArg(4);
      if (t_.split > 1) bz = b_.CreateZExt(fn_->getArg(7), it_);
    }
    fn_->setDoesNotThrow();
    cg_.emplace(b_, m_, target_);
    if (numel(p_.out) == 0) {  // nothing to compute; the launch still has one block
      b_.CreateRetVoid();
      return true;
    }

    // GROUP_M swizzle (Triton's matmul tutorial): consecutive blocks walk down
    // group_m rows of tiles before moving right, so a wave of blocks shares A's rows
    // and B's columns in L2.
    const int64_t npm = ceil_div(p_.M, t_.bm), npn = ceil_div(p_.N, t_.bn);
    const int64_t in_group = int64_t{t_.group_m} * npn;
    llvm::Value* group = b_.CreateUDiv(bx, k(in_group));
    llvm::Value* first_m = b_.CreateMul(group, k(t_.group_m), "", true, true);
    llvm::Value* gsize = b_.CreateBinaryIntrinsic(llvm::Intrinsic::smin, b_.CreateSub(k(npm), first_m), k(t_.group_m));
    llvm::Value* within = b_.CreateURem(bx, k(in_group));
    llvm::Value* pid_m = b_.CreateAdd(first_m, b_.CreateURem(within, gsize), "pid_m", true, true);
    llvm::Value* pid_n = b_.CreateUDiv(within, gsize, "pid_n");
    m0_ = b_.CreateMul(pid_m, k(t_.bm), "m0", true, true);
    n0_ = b_.CreateMul(pid_n, k(t_.bn), "n0", true, true);
    bi_ = batch_index(b_, p_, by);
    zbase_ = b_.CreateMul(by, k(p_.M * p_.N), "zbase", true, true);
    llvm::Value* tm = b_.CreateUDiv(tid_, k(t_.tn), "tm");
    llvm::Value* tn = b_.CreateURem(tid_, k(t_.tn), "tn");
    a_read_ = b_.CreateMul(tm, k(t_.rm), "", true, true);
    b_read_ = b_.CreateAdd(k(int64_t{t_.bk} * t_.lda), b_.CreateMul(tn, k(t_.rn), "", true, true), "", true, true);
    row0_ = b_.CreateAdd(m0_, a_read_, "row0", true, true);
    col0_ = b_.CreateAdd(n0_, b_.CreateMul(tn, k(t_.rn), "", true, true), "col0", true, true);
    plan_loads();
    // Split-K: this block sums K tiles [bz * kt, (bz + 1) * kt).
    if (bz) kbase_ = b_.CreateMul(bz, k(t_.kt * t_.bk), "kbase", true, true);

    std::vector<llvm::Value*> acc(static_cast<size_t>(t_.rm * t_.rn), llvm::ConstantFP::get(f32_, 0.0));
    if (t_.kt > 0) acc = k_loop();
    return epilogue(acc);
  }

 private:
  llvm::Value* k(int64_t v) { return llvm::ConstantInt::get(it_, static_cast<uint64_t>(v)); }

  // One element a thread copies from global to shared memory per K tile: loop
  // invariants found once.
  struct Copy {
    llvm::Value* kk = nullptr;     // k within the tile
    llvm::Value* base = nullptr;   // the element offset with k = 0
    llvm::Value* ok = nullptr;     // row/column in bounds (and the thread has this slot)
    llvm::Value* slot = nullptr;   // the shared offset within a stage
    llvm::Value* valid = nullptr;  // the thread has this slot at all (nullptr: always)
  };

  // The elements thread tid copies of a rows x bk (A) or bk x cols (B) tile: slots
  // e = tid + l * threads, e walking the operand's unit-stride dim first.
  void plan_loads() {
    auto plan = [&](bool is_a) {
      const int64_t other = is_a ? t_.bm : t_.bn;  // the tile's M (or N) side
      const int64_t total = other * t_.bk;
      const bool kfast = is_a ? t_.a_kfast : t_.b_kfast;
      const int64_t ld = is_a ? t_.lda : t_.ldb;
      std::vector<Copy> out;
      for (int64_t l = 0; l * t_.threads < total; ++l) {
        Copy cp;
        llvm::Value* e = b_.CreateAdd(tid_, k(l * t_.threads), "", true, true);
        if ((l + 1) * t_.threads > total) cp.valid = b_.CreateICmpULT(e, k(total));
        llvm::Value* kk = kfast ? b_.CreateURem(e, k(t_.bk)) : b_.CreateUDiv(e, k(other));
        llvm::Value* mn = kfast ? b_.CreateUDiv(e, k(t_.bk)) : b_.CreateURem(e, k(other));
        cp.kk = kk;
        llvm::Value* g = b_.CreateAdd(is_a ? m0_ : n0_, mn, "", true, true);
        cp.ok = b_.CreateICmpSLT(g, k(is_a ? p_.M : p_.N));
        if (cp.valid) cp.ok = b_.CreateAnd(cp.ok, cp.valid);
        cp.base = b_.CreateAdd(is_a ? bi_.a_off : bi_.b_off, b_.CreateMul(g, k(is_a ? p_.sam : p_.sbn), "", true, true), "",
                               true, true);
        cp.slot = b_.CreateAdd(b_.CreateMul(kk, k(ld), "", true, true), mn, "", true, true);
        if (!is_a) cp.slot = b_.CreateAdd(cp.slot, k(int64_t{t_.bk} * t_.lda), "", true, true);
        out.push_back(cp);
      }
      return out;
    };
    a_copy_ = plan(true);
    b_copy_ = plan(false);
  }

  // The f32 values of the thread's slots of the K tile starting at k0, 0 outside the
  // operands (so the edge tiles need no other checks: 0 * 0 adds nothing). An
  // address outside is clamped to element 0, which exists whenever a tile does.
  std::vector<llvm::Value*> load_tile(llvm::Value* k0) {
    if (kbase_) k0 = b_.CreateAdd(k0, kbase_, "", true, true);
    std::vector<llvm::Value*> vals;
    for (int which = 0; which < 2; ++which) {
      const Operand& op = which == 0 ? p_.a : p_.b;
      const int64_t sk = which == 0 ? p_.sak : p_.sbk;
      for (const Copy& cp : which == 0 ? a_copy_ : b_copy_) {
        llvm::Value* kidx = b_.CreateAdd(k0, cp.kk, "", true, true);
        llvm::Value* ok = b_.CreateAnd(cp.ok, b_.CreateICmpSLT(kidx, k(p_.K)));
        llvm::Value* idx = b_.CreateAdd(cp.base, b_.CreateMul(kidx, k(sk), "", true, true), "", true, true);
        idx = b_.CreateSelect(ok, idx, k(0));
        Elem v = cg_->load(op.dtype, in_[static_cast<size_t>(op.param)], idx);
        vals.push_back(b_.CreateSelect(ok, v.value, llvm::ConstantFP::get(f32_, 0.0)));
      }
    }
    return vals;
  }

  llvm::Value* smem_ptr(llvm::Value* off) { return b_.CreateInBoundsGEP(f32_, smem_, off); }

  void store_tile(const std::vector<llvm::Value*>& vals, llvm::Value* stage) {
    llvm::Value* base = b_.CreateMul(stage, k(t_.stage_floats), "", true, true);
    size_t i = 0;
    for (const std::vector<Copy>* copies : {&a_copy_, &b_copy_}) {
      for (const Copy& cp : *copies) {
        llvm::Value* v = vals[i++];
        llvm::BasicBlock* cont = nullptr;
        if (cp.valid) {  // a slot past the tile: this thread has none
          llvm::BasicBlock* st = llvm::BasicBlock::Create(b_.getContext(), "st", fn_);
          cont = llvm::BasicBlock::Create(b_.getContext(), "st.done", fn_);
          b_.CreateCondBr(cp.valid, st, cont);
          b_.SetInsertPoint(st);
        }
        b_.CreateAlignedStore(v, smem_ptr(b_.CreateAdd(base, cp.slot, "", true, true)), llvm::Align(4));
        if (cont) {
          b_.CreateBr(cont);
          b_.SetInsertPoint(cont);
        }
      }
    }
  }

  // The thread's slots of the K tile starting at k0 copied into `stage` by cp.async
  // (4 bytes each, zero-filled outside the operands by a source size of 0, from a
  // clamped address). Simulated on the host by a plain copy: it completes before the
  // wait, which is one of the orders cp.async allows.
  void issue_tile(llvm::Value* k0, llvm::Value* stage) {
    if (sim_) {
      store_tile(load_tile(k0), stage);  // load_tile adds kbase_
      return;
    }
    if (kbase_) k0 = b_.CreateAdd(k0, kbase_, "", true, true);
    llvm::Value* base = b_.CreateMul(stage, k(t_.stage_floats), "", true, true);
    for (int which = 0; which < 2; ++which) {
      const Operand& op = which == 0 ? p_.a : p_.b;
      const int64_t sk = which == 0 ? p_.sak : p_.sbk;
      for (const Copy& cp : which == 0 ? a_copy_ : b_copy_) {
        llvm::BasicBlock* cont = nullptr;
        if (cp.valid) {
          llvm::BasicBlock* st = llvm::BasicBlock::Create(b_.getContext(), "cp", fn_);
          cont = llvm::BasicBlock::Create(b_.getContext(), "cp.done", fn_);
          b_.CreateCondBr(cp.valid, st, cont);
          b_.SetInsertPoint(st);
        }
        llvm::Value* kidx = b_.CreateAdd(k0, cp.kk, "", true, true);
        llvm::Value* ok = b_.CreateAnd(cp.ok, b_.CreateICmpSLT(kidx, k(p_.K)));
        llvm::Value* idx = b_.CreateAdd(cp.base, b_.CreateMul(kidx, k(sk), "", true, true), "", true, true);
        llvm::Value* src = b_.CreateInBoundsGEP(f32_, in_[static_cast<size_t>(op.param)], b_.CreateSelect(ok, idx, k(0)));
        llvm::Value* dst = smem_ptr(b_.CreateAdd(base, cp.slot, "", true, true));
        llvm::Value* bytes = b_.CreateSelect(ok, b_.getInt32(4), b_.getInt32(0));
        b_.CreateIntrinsic(llvm::Intrinsic::nvvm_cp_async_ca_shared_global_4_s, {}, {dst, src, bytes});
        if (cont) {
          b_.CreateBr(cont);
          b_.SetInsertPoint(cont);
        }
      }
    }
  }

  void commit() {
    if (!sim_) b_.CreateIntrinsic(llvm::Intrinsic::nvvm_cp_async_commit_group, {}, {});
  }
  void wait(int pending) {
    if (!sim_) b_.CreateIntrinsic(llvm::Intrinsic::nvvm_cp_async_wait_group, {}, {b_.getInt32(static_cast<uint32_t>(pending))});
  }

  void barrier() {
    if (!sim_) {
      b_.CreateIntrinsic(llvm::Intrinsic::nvvm_barrier0, {}, {});  // bar.sync 0
      return;
    }
    auto* fty = llvm::FunctionType::get(b_.getVoidTy(), {b_.getPtrTy()}, false);
    b_.CreateCall(fty, fn_->getArg(5), {fn_->getArg(6)});
  }

  // acc[r][c] += A[r][kk] * B[kk][c] for the bk values of one stage, from shared memory.
  std::vector<llvm::Value*> compute(llvm::Value* stage, std::vector<llvm::Value*> acc) {
    llvm::Value* base = b_.CreateMul(stage, k(t_.stage_floats), "", true, true);
    llvm::Value* a0 = b_.CreateAdd(base, a_read_, "", true, true);
    llvm::Value* b0 = b_.CreateAdd(base, b_read_, "", true, true);
    auto read = [&](llvm::Value* start, int n, int v) {
      std::vector<llvm::Value*> out;
      for (int i = 0; i < n; i += v) {
        llvm::Value* p = smem_ptr(b_.CreateAdd(start, k(i), "", true, true));
        if (v == 1) {
          out.push_back(b_.CreateAlignedLoad(f32_, p, llvm::Align(4)));
          continue;
        }
        llvm::Value* vec = b_.CreateAlignedLoad(llvm::FixedVectorType::get(f32_, static_cast<unsigned>(v)), p,
                                                llvm::Align(static_cast<uint64_t>(v) * 4));
        for (int l = 0; l < v; ++l) out.push_back(b_.CreateExtractElement(vec, static_cast<uint64_t>(l)));
      }
      return out;
    };
    for (int kk = 0; kk < t_.bk; ++kk) {
      std::vector<llvm::Value*> a = read(b_.CreateAdd(a0, k(int64_t{kk} * t_.lda), "", true, true), t_.rm, t_.va);
      std::vector<llvm::Value*> bv = read(b_.CreateAdd(b0, k(int64_t{kk} * t_.ldb), "", true, true), t_.rn, t_.vb);
      for (int r = 0; r < t_.rm; ++r)
        for (int c = 0; c < t_.rn; ++c) {
          size_t i = static_cast<size_t>(r * t_.rn + c);
          acc[i] = b_.CreateIntrinsic(llvm::Intrinsic::fmuladd, {f32_}, {a[static_cast<size_t>(r)], bv[static_cast<size_t>(c)], acc[i]});
        }
    }
    return acc;
  }

  // The K loop, one barrier per tile where stages >= 2.
  //  - async (cp.async): stages-1 tiles in flight; each iteration waits for tile kt,
  //    syncs, issues tile kt+stages-1 into the stage tile kt-1 used, computes tile kt.
  //  - stages >= 2 otherwise: the loads of tile kt+1 are issued before tile kt is
  //    computed and stored to the next stage after it (register-staged double
  //    buffering): stage (kt+1) % stages was last read in iteration kt+1-stages <=
  //    kt-1, which every thread has left.
  //  - stages == 1: load, barrier, compute, barrier.
  std::vector<llvm::Value*> k_loop() {
    llvm::LLVMContext& c = m_.getContext();
    const bool prefetch = t_.stages >= 2;
    const size_t nacc = static_cast<size_t>(t_.rm * t_.rn);
    auto stage_of = [&](llvm::Value* kt) {
      return pow2(t_.stages) ? b_.CreateAnd(kt, k(t_.stages - 1)) : b_.CreateURem(kt, k(t_.stages));
    };
    if (t_.async) {
      // stages-1 tiles in flight before the loop, one commit group each.
      for (int st = 0; st + 1 < t_.stages; ++st) {
        if (st < t_.kt) issue_tile(k(int64_t{st} * t_.bk), k(st));
        commit();
      }
    } else if (prefetch) {
      store_tile(load_tile(k(0)), k(0));
      barrier();
    }
    llvm::BasicBlock* pre = b_.GetInsertBlock();
    llvm::BasicBlock* loop = llvm::BasicBlock::Create(c, "k.loop", fn_);
    llvm::BasicBlock* done = llvm::BasicBlock::Create(c, "k.done", fn_);
    b_.CreateBr(loop);
    b_.SetInsertPoint(loop);
    llvm::PHINode* kt = b_.CreatePHI(it_, 2, "kt");
    kt->addIncoming(k(0), pre);
    std::vector<llvm::PHINode*> phis;
    std::vector<llvm::Value*> acc;
    for (size_t i = 0; i < nacc; ++i) {
      llvm::PHINode* ph = b_.CreatePHI(f32_, 2, "acc");
      ph->addIncoming(llvm::ConstantFP::get(f32_, 0.0), pre);
      phis.push_back(ph);
      acc.push_back(ph);
    }
    llvm::Value* next = b_.CreateAdd(kt, k(1), "kt.next", true, true);
    if (t_.async) {
      // Tile kt landed (at most stages-2 younger groups pending) and every thread is
      // past computing kt-1, whose stage the copy of tile kt+stages-1 overwrites.
      wait(t_.stages - 2);
      barrier();
      llvm::Value* ahead = b_.CreateAdd(kt, k(t_.stages - 1), "", true, true);
      llvm::BasicBlock* issue = llvm::BasicBlock::Create(c, "k.issue", fn_);
      llvm::BasicBlock* issued = llvm::BasicBlock::Create(c, "k.issued", fn_);
      b_.CreateCondBr(b_.CreateICmpSLT(ahead, k(t_.kt)), issue, issued);
      b_.SetInsertPoint(issue);
      issue_tile(b_.CreateMul(ahead, k(t_.bk), "", true, true), stage_of(ahead));
      b_.CreateBr(issued);
      b_.SetInsertPoint(issued);
      commit();  // an empty group past the last tile keeps the count uniform
      acc = compute(stage_of(kt), acc);
    } else if (prefetch) {
      // On the last iteration this loads tile kt (all masked to 0): straight-line code
      // is worth more than the few wasted loads of element 0.
      std::vector<llvm::Value*> vals = t_.kt > 1 ? load_tile(b_.CreateMul(next, k(t_.bk), "", true, true))
                                                 : std::vector<llvm::Value*>{};
      acc = compute(stage_of(kt), acc);
      if (t_.kt > 1) {
        store_tile(vals, stage_of(next));
        barrier();
      }
    } else {
      store_tile(load_tile(b_.CreateMul(kt, k(t_.bk), "", true, true)), k(0));
      barrier();
      acc = compute(k(0), acc);
      barrier();
    }
    for (size_t i = 0; i < nacc; ++i) phis[i]->addIncoming(acc[i], b_.GetInsertBlock());
    kt->addIncoming(next, b_.GetInsertBlock());
    b_.CreateCondBr(b_.CreateICmpSLT(next, k(t_.kt)), loop, done);
    b_.SetInsertPoint(done);
    return acc;
  }

  // Each accumulator in bounds: the matmul's value rounded to its dtype, the epilogue,
  // the stores.
  Result<bool> epilogue(const std::vector<llvm::Value*>& acc) {
    llvm::LLVMContext& c = m_.getContext();
    Epilogue epi(g_, p_, *cg_, in_);
    std::vector<llvm::Value*> coords = bi_.coords;
    coords.push_back(nullptr);
    coords.push_back(nullptr);
    for (int r = 0; r < t_.rm; ++r) {
      llvm::Value* row = b_.CreateAdd(row0_, k(r), "row", true, true);
      llvm::Value* row_ok = b_.CreateICmpSLT(row, k(p_.M));
      llvm::Value* row_off = b_.CreateAdd(zbase_, b_.CreateMul(row, k(p_.N), "", true, true), "", true, true);
      for (int cc = 0; cc < t_.rn; ++cc) {
        llvm::Value* col = b_.CreateAdd(col0_, k(cc), "col", true, true);
        llvm::BasicBlock* st = llvm::BasicBlock::Create(c, "epi", fn_);
        llvm::BasicBlock* next = llvm::BasicBlock::Create(c, "epi.next", fn_);
        b_.CreateCondBr(b_.CreateAnd(row_ok, b_.CreateICmpSLT(col, k(p_.N))), st, next);
        b_.SetInsertPoint(st);
        coords[coords.size() - 2] = row;
        coords.back() = col;
        llvm::Value* flat = b_.CreateAdd(row_off, col, "", true, true);
        if (t_.split > 1) {
          // A partial sum: added into the output, which the launch zeroed
          // (LaunchShape::zero_outputs). Relaxed order: only the sum matters.
          llvm::Value* at = b_.CreateInBoundsGEP(f32_, out_[0], flat);
          b_.CreateAtomicRMW(llvm::AtomicRMWInst::FAdd, at, acc[static_cast<size_t>(r * t_.rn + cc)],
                             llvm::MaybeAlign(4), llvm::AtomicOrdering::Monotonic);
          b_.CreateBr(next);
          b_.SetInsertPoint(next);
          continue;
        }
        Elem mm{cg_->round_to(p_.dtype, acc[static_cast<size_t>(r * t_.rn + cc)]), p_.dtype};
        Result<std::vector<Elem>> outs = epi.outputs(coords, flat, mm);
        if (!outs) return outs.error();
        for (size_t o = 0; o < outs->size(); ++o) cg_->store((*outs)[o], out_[o], flat);
        b_.CreateBr(next);
        b_.SetInsertPoint(next);
      }
    }
    b_.CreateRetVoid();
    return true;
  }

  const KernelSpec& spec_;
  const Graph& g_;
  const Plan& p_;
  const Tiling& t_;
  const llvmb::Target& target_;
  llvm::Module& m_;
  llvm::IRBuilder<> b_;
  bool sim_ = false;
  bool wide_ = false;  // i64 indices even where i32 would do
  llvm::Function* fn_ = nullptr;
  std::vector<llvm::Value*> in_, out_;
  std::optional<ElementCodegen> cg_;
  llvm::Type* it_ = nullptr;
  llvm::Type* f32_ = nullptr;
  llvm::Value* smem_ = nullptr;
  llvm::Value* kbase_ = nullptr;  // split-K: the first K element of this block's share
  llvm::Value *tid_ = nullptr, *m0_ = nullptr, *n0_ = nullptr, *zbase_ = nullptr;
  llvm::Value *a_read_ = nullptr, *b_read_ = nullptr, *row0_ = nullptr, *col0_ = nullptr;
  BatchIndex bi_;
  std::vector<Copy> a_copy_, b_copy_;
};

// ---- host ------------------------------------------------------------------------------------------

// Columns per accumulator row on the host when host_tile_n is 0: 64 f32 (256 bytes)
// stay in L1 with the row of B they meet, and the j loop over them is what LLVM
// vectorises.
constexpr int64_t kHostBlockN = 64;

// `void entry(ptr args)`: for each batch, row and block of TN columns (TN =
// host_tile_n, or kHostBlockN when 0), acc[j] += A[i][k] * B[k][j] with k outside j
// (unit-stride B rows vectorise), then the epilogue per element. The j loop carries
// host_vector / host_interleave as vectoriser hints (element.h LoopHints); each acc[j]
// is its own accumulator, so no hint reorders a sum. f32 accumulators for float
// dtypes; integers accumulate in i64 with wrap-around, as the reference (and torch) do.
Result<bool> build_host(const KernelSpec& spec, const Plan& p, const KernelConfig& cfg, const llvmb::Target& target,
                        llvm::Module& m) {
  llvm::LLVMContext& c = m.getContext();
  const Graph& g = spec.group;
  llvm::IRBuilder<> b(c);
  const size_t np = g.params().size(), no = g.outputs().size();
  kernels::KernelEntry ke = kernels::begin_kernel(m, b, spec.entry, np, no, target);
  std::vector<llvm::Value*> in = ke.in, out = ke.out;
  const bool fl = is_float(p.dtype);
  llvm::Type* acc_ty = fl ? b.getFloatTy() : b.getInt64Ty();
  const int64_t TN = cfg.host_tile_n > 0 ? cfg.host_tile_n : kHostBlockN;
  llvm::Value* accbuf = b.CreateAlloca(llvm::ArrayType::get(acc_ty, static_cast<uint64_t>(TN)), nullptr, "acc");
  ElementCodegen cg(b, m, target);
  Epilogue epi(g, p, cg, in);
  auto k = [&](int64_t v) { return b.getInt64(static_cast<uint64_t>(v)); };
  auto mul = [&](llvm::Value* x, int64_t s) -> llvm::Value* {
    return s == 1 ? x : b.CreateMul(x, k(s), "", true, true);
  };
  auto add = [&](llvm::Value* x, llvm::Value* y) { return b.CreateAdd(x, y, "", true, true); };
  auto widen = [&](Elem e) -> llvm::Value* { return fl ? e.value : b.CreateSExt(e.value, b.getInt64Ty()); };
  auto slot = [&](llvm::Value* jj) { return b.CreateInBoundsGEP(acc_ty, accbuf, jj); };
  const llvm::Align acc_align(fl ? 4 : 8);
  llvm::Value* zero = fl ? static_cast<llvm::Value*>(llvm::ConstantFP::get(acc_ty, 0.0)) : k(0);

  Result<bool> r = emit_loop(b, k(0), k(p.nbatch), k(1), "z", [&](llvm::Value* z) -> Result<bool> {
    BatchIndex bi = batch_index(b, p, z);
    llvm::Value* zbase = mul(z, p.M * p.N);
    return emit_loop(b, k(0), k(p.M), k(1), "i", [&](llvm::Value* i) -> Result<bool> {
      llvm::Value* arow = add(bi.a_off, mul(i, p.sam));
      llvm::Value* orow = add(zbase, mul(i, p.N));
      return emit_loop(b, k(0), k(p.N), k(TN), "j0", [&](llvm::Value* j0) -> Result<bool> {
        llvm::Value* jn = b.CreateBinaryIntrinsic(llvm::Intrinsic::smin, b.CreateSub(k(p.N), j0), k(TN));
        Result<bool> r1 = emit_loop(b, k(0), jn, k(1), "clr", [&](llvm::Value* jj) -> Result<bool> {
          b.CreateAlignedStore(zero, slot(jj), acc_align);
          return true;
        });
        if (!r1) return r1;
        llvm::Value* bcol = add(bi.b_off, mul(j0, p.sbn));
        r1 = emit_loop(b, k(0), k(p.K), k(1), "k", [&](llvm::Value* kk) -> Result<bool> {
          llvm::Value* a = widen(cg.load(p.a.dtype, in[static_cast<size_t>(p.a.param)], add(arow, mul(kk, p.sak))));
          llvm::Value* brow = add(bcol, mul(kk, p.sbk));
          return emit_loop(b, k(0), jn, k(1), "j", [&](llvm::Value* jj) -> Result<bool> {
            llvm::Value* bv = widen(cg.load(p.b.dtype, in[static_cast<size_t>(p.b.param)], add(brow, mul(jj, p.sbn))));
            llvm::Value* s = slot(jj);
            llvm::Value* old = b.CreateAlignedLoad(acc_ty, s, acc_align);
            llvm::Value* nv = fl ? b.CreateIntrinsic(llvm::Intrinsic::fmuladd, {acc_ty}, {a, bv, old})
                                 : b.CreateAdd(old, b.CreateMul(a, bv));  // wraps, as the reference's int64
            b.CreateAlignedStore(nv, s, acc_align);
            return true;
          }, kernels::host_loop_hints(cfg));
        });
        if (!r1) return r1;
        return emit_loop(b, k(0), jn, k(1), "epi", [&](llvm::Value* jj) -> Result<bool> {
          llvm::Value* col = add(j0, jj);
          llvm::Value* v = b.CreateAlignedLoad(acc_ty, slot(jj), acc_align);
          Elem mm = fl ? Elem{cg.round_to(p.dtype, v), p.dtype}
                       : Elem{b.CreateTrunc(v, kernels::compute_type(c, p.dtype)), p.dtype};
          std::vector<llvm::Value*> coords = bi.coords;
          coords.push_back(i);
          coords.push_back(col);
          llvm::Value* flat = add(orow, col);
          Result<std::vector<Elem>> outs = epi.outputs(coords, flat, mm);
          if (!outs) return outs.error();
          for (size_t o = 0; o < no; ++o) cg.store((*outs)[o], out[o], flat);
          return true;
        });
      });
    });
  });
  if (!r) return r;
  b.CreateRetVoid();
  return true;
}

EmittedKernel new_kernel(const KernelSpec& spec, const llvmb::Target& target) {
  EmittedKernel k;
  k.context = std::make_unique<llvm::LLVMContext>();
  k.module = std::make_unique<llvm::Module>(spec.entry, *k.context);
  llvmb::prepare_module(*k.module, target);
  k.entry = spec.entry;
  return k;
}

class MatmulEmitter final : public Emitter {
 public:
  Result<EmittedKernel> emit(const KernelSpec& spec, const KernelConfig& config,
                             const llvmb::Target& target) const override {
    return emit_matmul(spec, config, target);
  }
};

}  // namespace

Result<EmittedKernel> emit_matmul(const KernelSpec& spec, const KernelConfig& config, const llvmb::Target& target) {
  Result<Plan> plan = analyse(spec);
  if (!plan) return plan.error();
  const bool gpu = target.kind == llvmb::Target::Kind::NVPTX;
  EmittedKernel k;
  if (gpu) {
    std::optional<int> sm = kernels::sm_version(target.arch);
    if (!sm) return diag("unknown NVPTX arch '" + target.arch + "' (expected sm_NN or sm_NNa)");
    if (!is_float(plan->dtype))
      return diag(std::string(dtype_name(plan->dtype)) +
                  " matmul is not supported on NVPTX (it would need i64 accumulators; the host kernel has them)");
    Result<Tiling> t = make_tiling(config, *plan, *sm);
    if (!t) return t.error();
    if (Result<bool> g = check_grid(*plan, *t); !g) return g.error();
    k = new_kernel(spec, target);
    Result<bool> built = TiledKernel(spec, *plan, *t, target, *k.module, /*sim=*/false).build();
    if (!built) return built.error();
    k.launch = matmul_launch(*plan, *t);
  } else {
    if (std::optional<std::string> e = kernels::host_knob_error(config)) return diag(*e);
    k = new_kernel(spec, target);
    Result<bool> built = build_host(spec, *plan, config, target, *k.module);
    if (!built) return built.error();
  }
  if (auto err = llvmb::verify(*k.module))  // an emitter bug, not a user error: say so
    return diag("internal: the emitted module does not verify: " + *err);
  return k;
}

Result<EmittedKernel> emit_matmul_block_on_host(const KernelSpec& spec, const KernelConfig& config, bool wide_index) {
  Result<Plan> plan = analyse(spec);
  if (!plan) return plan.error();
  if (!is_float(plan->dtype)) return diag(std::string(dtype_name(plan->dtype)) + " matmul has no tiled kernel");
  // Checked as for sm_90a: the same limits apply to the kernel being simulated.
  Result<Tiling> t = make_tiling(config, *plan, 90);
  if (!t) return t.error();
  if (Result<bool> g = check_grid(*plan, *t); !g) return g.error();
  const llvmb::Target host = llvmb::Target::host();
  EmittedKernel k = new_kernel(spec, host);
  Result<bool> built = TiledKernel(spec, *plan, *t, host, *k.module, /*sim=*/true, wide_index).build();
  if (!built) return built.error();
  if (auto err = llvmb::verify(*k.module)) return diag("internal: the emitted module does not verify: " + *err);
  k.launch = matmul_launch(*plan, *t);
  return k;
}

const Emitter& matmul_emitter() {
  static const MatmulEmitter e;
  return e;
}

}  // namespace sf
