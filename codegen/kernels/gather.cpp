#include "codegen/kernels/gather.h"

#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/IntrinsicsNVPTX.h>

#include "codegen/kernels/element.h"

namespace sf {

namespace {

using kernels::Elem;
using kernels::ElementCodegen;
using kernels::emit_loop;

struct Shape3 {
  int idx_param = 0, weight_param = 1;
  int64_t n = 0, rows = 0, cols = 0, offset = 0;
  DType idx_dtype = DType::I64, dtype = DType::F32;
};

Result<Shape3> check(const KernelSpec& spec) {
  const Graph& g = spec.group;
  std::optional<ValueId> emb;
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const Node& n = g.nodes()[i];
    if (n.op == OpKind::Param) continue;
    if (n.op != OpKind::Embedding || emb) return Diag{"", {}, "gather emitter: the group must be one embedding of two params"};
    emb = static_cast<ValueId>(i);
  }
  if (!emb || g.outputs().size() != 1 || g.outputs()[0].value != *emb)
    return Diag{"", {}, "gather emitter: the group must be one embedding and return it"};
  const Node& e = g.node(*emb);
  Shape3 s;
  for (size_t p = 0; p < g.params().size(); ++p) {
    if (g.params()[p] == e.inputs[0]) s.idx_param = static_cast<int>(p);
    if (g.params()[p] == e.inputs[1]) s.weight_param = static_cast<int>(p);
  }
  if (g.node(e.inputs[0]).op != OpKind::Param || g.node(e.inputs[1]).op != OpKind::Param)
    return Diag{"", {}, "gather emitter: indices and weight must be kernel inputs"};
  const TensorType& w = g.node(e.inputs[1]).type;
  s.rows = w.shape[0];
  s.cols = w.shape[1];
  s.n = numel(e.type.shape);
  s.idx_dtype = g.node(e.inputs[0]).type.dtype;
  s.dtype = w.dtype;
  s.offset = e.attrs.get_int("offset");
  return s;
}

// out[f] for the flat output index f (an i64).
void element(ElementCodegen& cg, const Shape3& s, llvm::Value* idx, llvm::Value* w, llvm::Value* out, llvm::Value* f) {
  llvm::IRBuilderBase& b = cg.builder();
  llvm::Value* cols = b.getInt64(s.cols);
  llvm::Value* i = b.CreateUDiv(f, cols);
  llvm::Value* c = b.CreateURem(f, cols);
  Elem zero = cg.constant(0.0, s.dtype);
  if (s.rows == 0) {  // no row to read: every index is out of range
    cg.store(zero, out, f);
    return;
  }
  llvm::Value* index = cg.convert(cg.load(s.idx_dtype, idx, i), DType::I64).value;
  // Out-of-range rows read row 0 (there when rows > 0) and are zeroed after.
  kernels::MaskedRow row = kernels::masked_row(b, index, s.offset, s.rows);
  Elem v = cg.load(s.dtype, w, b.CreateAdd(b.CreateMul(row.row, cols), c));
  cg.store(Elem{b.CreateSelect(row.in_range, v.value, zero.value), s.dtype}, out, f);
}

}  // namespace

Result<EmittedKernel> emit_gather(const KernelSpec& spec, const KernelConfig& config, const llvmb::Target& target) {
  Result<Shape3> s = check(spec);
  if (!s) return s.error();
  bool gpu = target.kind == llvmb::Target::Kind::NVPTX;
  if (config.block < 32 || config.block > 1024 || config.max_blocks < 1)
    return Diag{"", {}, "gather emitter: block must be 32..1024 and max_blocks >= 1"};
  if (!gpu)
    if (std::optional<std::string> e = kernels::host_knob_error(config)) return Diag{"", {}, "gather emitter: " + *e};
  EmittedKernel k;
  k.context = std::make_unique<llvm::LLVMContext>();
  k.module = std::make_unique<llvm::Module>(spec.entry, *k.context);
  llvmb::prepare_module(*k.module, target);
  k.entry = spec.entry;
  llvm::IRBuilder<> b(*k.context);
  ElementCodegen cg(b, *k.module, target, spec.precision);
  const size_t np = spec.group.params().size();
  kernels::KernelEntry ke = kernels::begin_kernel(*k.module, b, spec.entry, np, 1, target, config.block);
  llvm::Value* idx = ke.in[static_cast<size_t>(s->idx_param)];
  llvm::Value* w = ke.in[static_cast<size_t>(s->weight_param)];
  llvm::Value* out = ke.out[0];
  auto body = [&](llvm::Value* f) -> Result<void> {
    element(cg, *s, idx, w, out, f);
    return {};
  };
  Result<void> r;
  if (gpu) {
    auto sreg = [&](llvm::Intrinsic::ID id) { return b.CreateZExt(b.CreateIntrinsic(id, {}, {}), b.getInt64Ty()); };
    llvm::Value* tid = sreg(llvm::Intrinsic::nvvm_read_ptx_sreg_tid_x);
    llvm::Value* bid = sreg(llvm::Intrinsic::nvvm_read_ptx_sreg_ctaid_x);
    llvm::Value* nb = sreg(llvm::Intrinsic::nvvm_read_ptx_sreg_nctaid_x);
    llvm::Value* blk = b.getInt64(config.block);
    r = emit_loop(b, b.CreateAdd(b.CreateMul(bid, blk), tid), b.getInt64(s->n), b.CreateMul(nb, blk), "f", body);
    int64_t blocks = std::min<int64_t>(std::max<int64_t>((s->n + config.block - 1) / config.block, 1), config.max_blocks);
    k.launch.grid = {blocks, 1, 1};
    k.launch.block = {config.block, 1, 1};
  } else {
    // One loop over the output's flat index; host_vector/host_interleave are its
    // vectoriser hints (the row loads become gathers when vectorised).
    r = emit_loop(b, b.getInt64(0), b.getInt64(s->n), b.getInt64(1), "f", body, kernels::host_loop_hints(config));
  }
  if (!r) return r.error();
  b.CreateRetVoid();
  if (auto err = llvmb::verify(*k.module)) return Diag{"", {}, "gather emitter: invalid module: " + *err};
  return k;
}

}  // namespace sf
