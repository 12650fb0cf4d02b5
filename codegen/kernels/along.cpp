#include "codegen/kernels/along.h"

#include <algorithm>

#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/IntrinsicsNVPTX.h>

#include "codegen/kernels/element.h"

namespace sf {

namespace {

using kernels::Elem;
using kernels::ElementCodegen;
using kernels::emit_loop;

Diag fail(std::string msg) { return Diag{"", {}, "along-dim emitter: " + std::move(msg)}; }

// The group's op and the operand viewed as [outer, len, inner].
struct Along {
  OpKind op = OpKind::Cumsum;
  DType in = DType::F32, out = DType::F32;
  int64_t outer = 1, len = 1, inner = 1;
  int64_t rows() const { return outer * inner; }
};

std::optional<ValueId> along_node(const Graph& g) {
  std::optional<ValueId> found;
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const Node& n = g.nodes()[i];
    if (n.op == OpKind::Param) continue;
    if (op_info(n.op).category != OpCategory::AlongDim || found) return std::nullopt;
    found = static_cast<ValueId>(i);
  }
  return found;
}

Result<Along> check(const KernelSpec& spec) {
  const Graph& g = spec.group;
  std::optional<ValueId> v = along_node(g);
  if (!v || g.params().size() != 1 || g.outputs().size() != 1 || g.outputs()[0].value != *v)
    return fail("the group must be one cumsum, argmax or argmin of a param, and return it");
  const Node& n = g.node(*v);
  const TensorType& x = g.node(n.inputs[0]).type;
  const int dim = *normalize_dim(n.attrs.get_int("dim"), x.rank());
  Along a;
  a.op = n.op;
  a.in = x.dtype;
  a.out = n.type.dtype;
  for (int d = 0; d < x.rank(); ++d) {
    const int64_t s = x.shape[static_cast<size_t>(d)];
    (d < dim ? a.outer : d == dim ? a.len : a.inner) *= s;
  }
  if (a.op != OpKind::Cumsum && a.len == 0 && a.rows() > 0)
    return fail(std::string(op_name(a.op)) + " over an empty dim of " + x.str() + " has no index to return");
  return a;
}

// The body for row r (an i64 below a.rows()): the row's elements are
// x[base + k * inner], base = (r / inner) * len * inner + r % inner.
class RowCode {
 public:
  RowCode(ElementCodegen& cg, const Along& a, llvm::Value* x, llvm::Value* out, llvm::Value* acc,
          llvm::Value* best_k)
      : cg_(cg), b_(cg.builder()), a_(a), x_(x), out_(out), acc_(acc), best_k_(best_k) {}

  Result<void> row(llvm::Value* r) {
    llvm::Value* inner = b_.getInt64(a_.inner);
    llvm::Value* base = b_.CreateAdd(b_.CreateMul(b_.CreateUDiv(r, inner), b_.getInt64(a_.len * a_.inner)),
                                     b_.CreateURem(r, inner));
    auto at = [&](llvm::Value* k) { return b_.CreateAdd(base, b_.CreateMul(k, inner)); };
    if (a_.op == OpKind::Cumsum) {
      b_.CreateStore(is_float(a_.out) ? static_cast<llvm::Value*>(llvm::ConstantFP::get(b_.getFloatTy(), 0.0))
                                      : b_.getInt64(0),
                     acc_);
      return emit_loop(b_, b_.getInt64(0), b_.getInt64(a_.len), b_.getInt64(1), "k", [&](llvm::Value* k) -> Result<void> {
        llvm::Value* i = at(k);
        llvm::Value* s = b_.CreateLoad(acc_type(), acc_);
        // Integers and bools widen to i64 (the result's dtype); floats are f32 already.
        Elem v = cg_.load(a_.in, x_, i);
        llvm::Value* e = is_float(a_.out) ? v.value : cg_.convert(v, DType::I64).value;
        s = is_float(a_.out) ? b_.CreateFAdd(s, e) : b_.CreateAdd(s, e);  // i64 wraps, as torch's
        b_.CreateStore(s, acc_);
        cg_.store(Elem{s, a_.out}, out_, i);
        return {};
      });
    }
    if (a_.len == 0) return {};  // no rows then (check())
    b_.CreateStore(cg_.load(a_.in, x_, base).value, acc_);
    b_.CreateStore(b_.getInt64(0), best_k_);
    Result<void> loop =
        emit_loop(b_, b_.getInt64(1), b_.getInt64(a_.len), b_.getInt64(1), "k", [&](llvm::Value* k) -> Result<void> {
          llvm::Value* best = b_.CreateLoad(acc_type(), acc_);
          llvm::Value* v = cg_.load(a_.in, x_, at(k)).value;
          llvm::Value* take = replaces(v, best);
          b_.CreateStore(b_.CreateSelect(take, v, best), acc_);
          b_.CreateStore(b_.CreateSelect(take, k, b_.CreateLoad(b_.getInt64Ty(), best_k_)), best_k_);
          return {};
        });
    if (!loop) return loop;
    cg_.store(Elem{b_.CreateLoad(b_.getInt64Ty(), best_k_), DType::I64}, out_, r);
    return {};
  }

  // The running value's type: f32 for float operands (16-bit ones widened, exact),
  // i64 for a cumsum of integers, the operand's compute type for an arg-reduction.
  llvm::Type* acc_type() const {
    if (is_float(a_.in)) return b_.getFloatTy();
    if (a_.op == OpKind::Cumsum) return b_.getInt64Ty();
    return kernels::compute_type(b_.getContext(), a_.in);
  }

 private:
  // Whether v takes the place of the best so far: strictly beyond it (a tie keeps the
  // first index), or the row's first NaN (a NaN best is never replaced).
  llvm::Value* replaces(llvm::Value* v, llvm::Value* best) {
    const bool is_max = a_.op == OpKind::Argmax;
    if (!is_float(a_.in)) return is_max ? b_.CreateICmpSGT(v, best) : b_.CreateICmpSLT(v, best);
    llvm::Value* beyond = is_max ? b_.CreateFCmpOGT(v, best) : b_.CreateFCmpOLT(v, best);
    llvm::Value* first_nan = b_.CreateAnd(b_.CreateFCmpUNO(v, v), b_.CreateFCmpORD(best, best));
    return b_.CreateOr(beyond, first_nan);
  }

  ElementCodegen& cg_;
  llvm::IRBuilderBase& b_;
  const Along& a_;
  llvm::Value *x_, *out_, *acc_, *best_k_;
};

}  // namespace

bool is_along_group(const KernelSpec& spec) { return along_node(spec.group).has_value(); }

Result<EmittedKernel> emit_along(const KernelSpec& spec, const KernelConfig& config, const llvmb::Target& target) {
  Result<Along> a = check(spec);
  if (!a) return a.error();
  const bool gpu = target.kind == llvmb::Target::Kind::NVPTX;
  if (config.block < 32 || config.block > 1024 || config.max_blocks < 1)
    return fail("block must be 32..1024 and max_blocks >= 1");
  if (!gpu)
    if (std::optional<std::string> e = kernels::host_knob_error(config)) return fail(*e);
  EmittedKernel k;
  k.context = std::make_unique<llvm::LLVMContext>();
  k.module = std::make_unique<llvm::Module>(spec.entry, *k.context);
  llvmb::prepare_module(*k.module, target);
  k.entry = spec.entry;
  llvm::IRBuilder<> b(*k.context);
  ElementCodegen cg(b, *k.module, target, spec.precision);
  kernels::KernelEntry ke = kernels::begin_kernel(*k.module, b, spec.entry, 1, 1, target, config.block);
  // The running value and index live in allocas of the entry block (promoted to
  // registers by the pass pipeline's SROA/mem2reg).
  RowCode probe(cg, *a, nullptr, nullptr, nullptr, nullptr);
  llvm::Value* acc = b.CreateAlloca(probe.acc_type(), nullptr, "acc");
  llvm::Value* best_k = b.CreateAlloca(b.getInt64Ty(), nullptr, "best_k");
  RowCode rows(cg, *a, ke.in[0], ke.out[0], acc, best_k);
  auto body = [&](llvm::Value* r) { return rows.row(r); };
  Result<void> r;
  if (gpu) {
    auto sreg = [&](llvm::Intrinsic::ID id) { return b.CreateZExt(b.CreateIntrinsic(id, {}, {}), b.getInt64Ty()); };
    llvm::Value* tid = sreg(llvm::Intrinsic::nvvm_read_ptx_sreg_tid_x);
    llvm::Value* bid = sreg(llvm::Intrinsic::nvvm_read_ptx_sreg_ctaid_x);
    llvm::Value* nb = sreg(llvm::Intrinsic::nvvm_read_ptx_sreg_nctaid_x);
    llvm::Value* blk = b.getInt64(config.block);
    r = emit_loop(b, b.CreateAdd(b.CreateMul(bid, blk), tid), b.getInt64(a->rows()), b.CreateMul(nb, blk), "row", body);
    const int64_t blocks = std::min<int64_t>(std::max<int64_t>((a->rows() + config.block - 1) / config.block, 1),
                                             config.max_blocks);
    k.launch.grid = {blocks, 1, 1};
    k.launch.block = {config.block, 1, 1};
  } else {
    r = emit_loop(b, b.getInt64(0), b.getInt64(a->rows()), b.getInt64(1), "row", body);
  }
  if (!r) return r.error();
  b.CreateRetVoid();
  if (auto err = llvmb::verify(*k.module)) return fail("internal: invalid module: " + *err);
  return k;
}

}  // namespace sf
