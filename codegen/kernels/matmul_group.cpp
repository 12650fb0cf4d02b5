#include "codegen/kernels/matmul_group.h"

#include <functional>
#include <optional>
#include <set>

#include <llvm/IR/Constants.h>
#include <llvm/IR/Function.h>
#include <llvm/IR/GlobalVariable.h>
#include <llvm/IR/IntrinsicsNVPTX.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>

namespace sf::matmul_detail {

using kernels::is_c_identifier;

namespace {

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
  if (m.steps.size() != 1 || m.base != kernels::kIterationIndex || m.steps[0].offset != 0) return std::nullopt;
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
Result<MatmulOperand> find_operand(const Graph& g, const Node& mm, int which, const std::vector<int>& param_slot) {
  ValueId v = mm.inputs[static_cast<size_t>(which)];
  MatmulOperand op;
  op.shape = g.node(v).type.shape;
  op.dtype = g.node(v).type.dtype;
  ValueIndex at = kernels::dense_index(op.shape);
  while (kernels::is_view(g.node(v).op)) {
    const Node& n = g.node(v);
    if (n.op == OpKind::Slice || n.op == OpKind::Concat || n.op == OpKind::Gather || n.op == OpKind::IndexSelect)
      return diag(std::string("operand ") + (which == 0 ? "A" : "B") + " goes through " + who(n) +
                      "; a matmul kernel reads params in place only through views without an offset "
                      "(transpose, permute, expand, reshape), so a slice, concat or lookup gets a kernel of its own",
                  n.loc);
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

}  // namespace

Result<MatmulGroup> analyse_matmul(const KernelSpec& spec) {
  const Graph& g = spec.group;
  if (!is_c_identifier(spec.entry)) return diag("entry '" + spec.entry + "' is not a C identifier");
  if (g.outputs().empty()) return diag("group '" + g.name() + "' has no outputs");
  MatmulGroup p;
  p.allow_tf32 = spec.allow_tf32;
  p.tma = spec.tma;
  int count = 0;
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const Node& n = g.nodes()[i];
    if (n.op == OpKind::Matmul) {
      if (count++ == 1)
        return diag("group '" + g.name() + "' holds more than one matmul (a kernel computes one)", n.loc);
      p.mm = static_cast<ValueId>(i);
      continue;
    }
    if (n.op == OpKind::Param || n.op == OpKind::Constant || kernels::is_elementwise(n.op) || kernels::is_view(n.op) ||
        kernels::is_coordinate_op(n.op))
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
  Result<MatmulOperand> a = find_operand(g, mm, 0, slot);
  if (!a) return a.error();
  Result<MatmulOperand> b = find_operand(g, mm, 1, slot);
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
  auto bstrides = [&](const MatmulOperand& o) {
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
  std::function<Result<void>(ValueId, const ValueIndex&)> walk = [&](ValueId v, const ValueIndex& at) -> Result<void> {
    if (!seen.insert(std::to_string(v) + "#" + at.key()).second) return {};
    const Node& n = g.node(v);
    if (v == p.mm) {
      bool same = at.prefix.contiguous() && at.space == p.out && at.unshifted();
      for (size_t d = 0; d < at.src.size() && same; ++d) same = p.out[d] == 1 || at.src[d] == static_cast<int>(d);
      if (!same) return diag("the epilogue reads the matmul's result at another element than its own (a view after the matmul)", n.loc);
      return {};
    }
    for (ValueId u : n.inputs) {
      std::optional<ValueIndex> ui = kernels::operand_index(n, at, g.node(u).type.shape);
      if (!ui) return diag("internal: no index for " + who(n), n.loc);
      SF_TRY(walk(u, *ui));
    }
    return {};
  };
  for (size_t o = 0; o < g.outputs().size(); ++o)
    SF_TRY(walk(g.outputs()[o].value, p.out_at[o]));
  p.bare = g.outputs().size() == 1 && g.outputs()[0].value == p.mm;
  return p;
}

// ---- the epilogue -------------------------------------------------------------------------------


// ---- shared emission helpers -----------------------------------------------------------------------




BatchIndex batch_index(llvm::IRBuilderBase& b, const MatmulGroup& p, llvm::Value* z) {
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

int64_t max_shared_bytes(int sm) {
  if (sm >= 90) return 227 * 1024;
  if (sm == 80 || sm == 87) return 163 * 1024;
  if (sm == 86 || sm == 89) return 99 * 1024;
  if (sm == 75) return 64 * 1024;
  if (sm >= 70) return 96 * 1024;
  return 48 * 1024;
}


NvptxEntry begin_nvptx_matmul(llvm::Module& m, llvm::IRBuilderBase& b, const KernelSpec& spec, int threads,
                              uint64_t smem_align, int extra) {
  kernels::KernelEntry k = kernels::begin_nvptx_kernel(m, b, spec.entry, spec.group.params().size(),
                                                       spec.group.outputs().size(), threads, static_cast<size_t>(extra));
  NvptxEntry e;
  e.fn = k.fn;
  e.in = std::move(k.in);
  e.out = std::move(k.out);
  e.extra = std::move(k.extra);
  auto* arr = llvm::ArrayType::get(b.getInt8Ty(), 0);
  auto* gv = new llvm::GlobalVariable(m, arr, false, llvm::GlobalValue::ExternalLinkage, nullptr, "sf_smem", nullptr,
                                      llvm::GlobalValue::NotThreadLocal, 3);
  gv->setAlignment(llvm::Align(smem_align));
  e.smem = gv;
  return e;
}

llvm::Value* nvptx_sreg(llvm::IRBuilderBase& b, llvm::Intrinsic::ID id, llvm::Type* index_type) {
  return b.CreateZExt(b.CreateIntrinsic(id, {}, {}), index_type);
}

TileOrigin group_m_tile(llvm::IRBuilderBase& b, const MatmulGroup& p, llvm::Value* bx, int bm, int bn, int group_m) {
  llvm::Type* it = bx->getType();
  auto k = [&](int64_t v) { return llvm::ConstantInt::get(it, static_cast<uint64_t>(v)); };
  const int64_t npm = ceil_div(p.M, bm), npn = ceil_div(p.N, bn);
  const int64_t in_group = int64_t{group_m} * npn;
  llvm::Value* group = b.CreateUDiv(bx, k(in_group));
  llvm::Value* first_m = b.CreateMul(group, k(group_m), "", true, true);
  llvm::Value* gsize = b.CreateBinaryIntrinsic(llvm::Intrinsic::smin, b.CreateSub(k(npm), first_m), k(group_m));
  llvm::Value* within = b.CreateURem(bx, k(in_group));
  llvm::Value* pid_m = b.CreateAdd(first_m, b.CreateURem(within, gsize), "pid_m", true, true);
  llvm::Value* pid_n = b.CreateUDiv(within, gsize, "pid_n");
  return {b.CreateMul(pid_m, k(bm), "m0", true, true), b.CreateMul(pid_n, k(bn), "n0", true, true)};
}

LaunchShape matmul_launch_shape(const MatmulGroup& p, int bm, int bn, int threads, int64_t shared_bytes, int split) {
  LaunchShape l;
  int64_t tiles = ceil_div(p.M, bm) * ceil_div(p.N, bn);
  l.grid = {std::max<int64_t>(tiles, 1), std::max<int64_t>(p.nbatch, 1), split};
  l.block = {threads, 1, 1};
  l.zero_outputs = split > 1 && !split_k_uses_workspace(p);
  // Split-K in a workspace: the f32 partial sums of every output element, then a
  // u32 arrival counter per output tile and batch (MmaTiling::split_ws).
  if (split > 1 && split_k_uses_workspace(p))
    l.workspace_bytes = 4 * (std::max<int64_t>(p.nbatch, 1) * p.M * p.N + std::max<int64_t>(tiles, 1) * std::max<int64_t>(p.nbatch, 1));
  l.shared_bytes = static_cast<int>(shared_bytes);
  return l;
}

bool split_k_uses_workspace(const MatmulGroup& p) { return !(p.bare && p.dtype == DType::F32); }

std::optional<std::string> split_k_unfit(const MatmulGroup& p, const KernelConfig& c) {
  const std::string sk = "split_k = " + std::to_string(c.split_k);
  if (!pow2(c.split_k) || c.split_k > 64) return sk + " is not a power of two in 1..64";
  if (c.split_k == 1) return std::nullopt;
  if (c.block_k < 1) return std::nullopt;
  const int64_t tiles = ceil_div(p.K, int64_t{c.block_k});
  if (tiles % c.split_k != 0)
    return sk + " does not divide the " + std::to_string(tiles) + " K tiles of block_k = " + std::to_string(c.block_k) +
           " (K = " + std::to_string(p.K) + ")";
  return std::nullopt;
}

Result<void> check_matmul_grid(const MatmulGroup& p, int bm, int bn) {
  int64_t tiles = ceil_div(p.M, bm) * ceil_div(p.N, bn);
  if (tiles > 0x7FFFFFFF) return diag(std::to_string(tiles) + " tiles exceed the grid's x limit 2^31-1");
  if (p.nbatch > 65535) return diag("batch of " + std::to_string(p.nbatch) + " matrices exceeds the grid's y limit 65535");
  return {};
}

EmittedKernel new_matmul_kernel(const KernelSpec& spec, const llvmb::Target& target) {
  EmittedKernel k;
  k.context = std::make_unique<llvm::LLVMContext>();
  k.module = std::make_unique<llvm::Module>(spec.entry, *k.context);
  llvmb::prepare_module(*k.module, target);
  k.entry = spec.entry;
  return k;
}

}  // namespace sf::matmul_detail
