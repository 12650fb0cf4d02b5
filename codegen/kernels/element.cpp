#include "codegen/kernels/element.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <numeric>
#include <set>

#include <llvm/IR/Constants.h>
#include <llvm/IR/Function.h>
#include <llvm/IR/Intrinsics.h>
#include <llvm/IR/IntrinsicsNVPTX.h>
#include <llvm/IR/Metadata.h>
#include <llvm/IR/Module.h>

namespace sf::kernels {

bool is_c_identifier(const std::string& s) {
  if (s.empty() || !(std::isalpha(static_cast<unsigned char>(s[0])) || s[0] == '_')) return false;
  return std::all_of(s.begin(), s.end(), [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; });
}

// ---- types --------------------------------------------------------------------------

llvm::Type* storage_type(llvm::LLVMContext& c, DType t) {
  switch (t) {
    case DType::F32: return llvm::Type::getFloatTy(c);
    case DType::F16: return llvm::Type::getHalfTy(c);
    // bf16 travels as its bit pattern: widening is a shift, which every target has,
    // and only NVPTX sm_80+ has a bf16 conversion instruction (see narrow()).
    case DType::BF16: return llvm::Type::getInt16Ty(c);
    case DType::I32: return llvm::Type::getInt32Ty(c);
    case DType::I64: return llvm::Type::getInt64Ty(c);
    case DType::Bool: return llvm::Type::getInt8Ty(c);
  }
  return nullptr;
}

llvm::Type* compute_type(llvm::LLVMContext& c, DType t) {
  switch (t) {
    case DType::F32:
    case DType::F16:
    case DType::BF16: return llvm::Type::getFloatTy(c);
    case DType::I32: return llvm::Type::getInt32Ty(c);
    case DType::I64: return llvm::Type::getInt64Ty(c);
    case DType::Bool: return llvm::Type::getInt1Ty(c);
  }
  return nullptr;
}

// ---- categories ------------------------------------------------------------------------

bool is_elementwise(OpKind k) {
  switch (op_info(k).category) {
    case OpCategory::Unary:
    case OpCategory::Binary:
    case OpCategory::Compare:
    case OpCategory::Where: return true;
    case OpCategory::Leaf:
    case OpCategory::Reduce:
    case OpCategory::Matmul:
    case OpCategory::Movement:
    case OpCategory::Gather:
    case OpCategory::Composite:
    case OpCategory::Collective:
    case OpCategory::Generator:
    case OpCategory::Positional:
    case OpCategory::AlongDim: return false;
  }
  return false;
}

bool is_view(OpKind k) { return op_info(k).category == OpCategory::Movement; }

bool is_coordinate_op(OpKind k) {
  const OpCategory c = op_info(k).category;
  return c == OpCategory::Generator || c == OpCategory::Positional;
}

std::optional<int> sm_version(const std::string& arch) {
  if (arch.size() < 5 || arch.compare(0, 3, "sm_") != 0) return std::nullopt;
  int v = 0;
  size_t i = 3;
  for (; i < arch.size() && std::isdigit(static_cast<unsigned char>(arch[i])); ++i) v = v * 10 + (arch[i] - '0');
  if (i == 3 || (i < arch.size() && arch.substr(i) != "a")) return std::nullopt;
  return v;
}

// ---- element code -----------------------------------------------------------------------

ElementCodegen::ElementCodegen(llvm::IRBuilderBase& b, llvm::Module& m, const llvmb::Target& target,
                               Precision precision)
    : b_(b), m_(m), target_(target), precision_(precision) {
  if (target.kind == llvmb::Target::Kind::NVPTX) sm_ = sm_version(target.arch).value_or(0);
}

Elem ElementCodegen::load(DType t, llvm::Value* ptr, llvm::Value* index) {
  llvm::Type* st = storage_type(b_.getContext(), t);
  llvm::Value* p = b_.CreateInBoundsGEP(st, ptr, index);
  llvm::Value* v = b_.CreateAlignedLoad(st, p, llvm::Align(static_cast<uint64_t>(dtype_size(t))));
  return {widen(t, v), t};
}

void ElementCodegen::store(Elem v, llvm::Value* ptr, llvm::Value* index) {
  llvm::Type* st = storage_type(b_.getContext(), v.dtype);
  llvm::Value* p = b_.CreateInBoundsGEP(st, ptr, index);
  b_.CreateAlignedStore(narrow(v.dtype, v.value), p, llvm::Align(static_cast<uint64_t>(dtype_size(v.dtype))));
}

llvm::Value* ElementCodegen::widen(DType t, llvm::Value* stored) {
  llvm::LLVMContext& c = b_.getContext();
  switch (t) {
    case DType::F16: return b_.CreateFPExt(stored, llvm::Type::getFloatTy(c));
    case DType::BF16: {
      // A bf16 is the top half of the f32 with the same value: exact, every target.
      llvm::Value* w = b_.CreateShl(b_.CreateZExt(stored, b_.getInt32Ty()), 16);
      return b_.CreateBitCast(w, llvm::Type::getFloatTy(c));
    }
    case DType::Bool: return b_.CreateICmpNE(stored, b_.getInt8(0));
    case DType::F32:
    case DType::I32:
    case DType::I64: return stored;
  }
  return stored;
}

llvm::Value* ElementCodegen::bf16_round_bits(llvm::Value* f) {
  // Round to nearest even on the bits (dtype.cpp's f32_to_bf16_bits): add 0x7FFF plus
  // the lowest kept bit; a carry out of the mantissa correctly reaches Inf. A NaN keeps
  // its top mantissa bits with the quiet bit set (adding could turn it into Inf).
  llvm::Value* x = b_.CreateBitCast(f, b_.getInt32Ty());
  llvm::Value* hi = b_.CreateLShr(x, 16);
  llvm::Value* is_nan = b_.CreateICmpUGT(b_.CreateAnd(x, 0x7FFFFFFFu), b_.getInt32(0x7F800000u));
  llvm::Value* lsb = b_.CreateAnd(hi, 1);
  llvm::Value* rounded = b_.CreateLShr(b_.CreateAdd(x, b_.CreateAdd(lsb, b_.getInt32(0x7FFF))), 16);
  llvm::Value* quiet = b_.CreateOr(hi, 0x40);
  return b_.CreateTrunc(b_.CreateSelect(is_nan, quiet, rounded), b_.getInt16Ty());
}

llvm::Value* ElementCodegen::narrow_vector(DType t, const std::vector<llvm::Value*>& lanes) {
  llvm::LLVMContext& c = b_.getContext();
  llvm::Type* st = storage_type(c, t);
  const auto n = static_cast<unsigned>(lanes.size());
  llvm::Value* vec = llvm::PoisonValue::get(llvm::FixedVectorType::get(st, n));
  const bool half = t == DType::F16 || t == DType::BF16;
  if (sm_ >= 80 && half && n % 2 == 0) {
    // cvt.rn.{bf16,f16}x2.f32 d, a, b puts a's conversion in d's upper half and b's in
    // its lower half (PTX ISA, "cvt"); the lower half is the element at the lower
    // address, vector element 0. So lane l + 1 is the first operand.
    auto id = t == DType::BF16 ? llvm::Intrinsic::nvvm_ff2bf16x2_rn : llvm::Intrinsic::nvvm_ff2f16x2_rn;
    auto* s2 = llvm::FixedVectorType::get(st, 2);
    for (unsigned l = 0; l < n; l += 2) {
      llvm::Value* packed = b_.CreateIntrinsic(id, {}, {lanes[l + 1], lanes[l]});
      if (t == DType::BF16) packed = b_.CreateBitCast(packed, s2);  // bf16 is stored as its i16 bits
      vec = b_.CreateInsertElement(vec, b_.CreateExtractElement(packed, uint64_t{0}), uint64_t{l});
      vec = b_.CreateInsertElement(vec, b_.CreateExtractElement(packed, uint64_t{1}), uint64_t{l + 1});
    }
    return vec;
  }
  for (unsigned l = 0; l < n; ++l) vec = b_.CreateInsertElement(vec, narrow(t, lanes[l]), uint64_t{l});
  return vec;
}

std::vector<Elem> ElementCodegen::load_vector(DType t, llvm::Value* ptr, llvm::Value* index, int n) {
  llvm::Type* st = storage_type(b_.getContext(), t);
  const int64_t pe = vector_piece_bytes(t, n) / dtype_size(t);
  std::vector<Elem> out;
  for (int64_t piece = 0; piece < n / pe; ++piece) {
    llvm::Value* at = piece == 0 ? index : b_.CreateAdd(index, llvm::ConstantInt::get(index->getType(), static_cast<uint64_t>(piece * pe)), "", true, true);
    llvm::Value* p = b_.CreateInBoundsGEP(st, ptr, at);
    llvm::Align align(static_cast<uint64_t>(pe * dtype_size(t)));
    if (pe == 1) {
      out.push_back({widen(t, b_.CreateAlignedLoad(st, p, align)), t});
      continue;
    }
    if (t == DType::BF16) {
      // Two bf16 a 32-bit word: the low one is the word shifted up 16, the high one the
      // word with its low half cleared, each one instruction (extracting 16-bit lanes
      // first took three: unpack, widen, shift).
      llvm::Value* words = b_.CreateAlignedLoad(llvm::FixedVectorType::get(b_.getInt32Ty(), static_cast<unsigned>(pe / 2)), p, align);
      for (int64_t l = 0; l < pe; l += 2) {
        llvm::Value* w = b_.CreateExtractElement(words, static_cast<uint64_t>(l / 2));
        out.push_back({b_.CreateBitCast(b_.CreateShl(w, 16), b_.getFloatTy()), t});
        out.push_back({b_.CreateBitCast(b_.CreateAnd(w, b_.getInt32(0xFFFF0000u)), b_.getFloatTy()), t});
      }
      continue;
    }
    llvm::Value* vec = b_.CreateAlignedLoad(llvm::FixedVectorType::get(st, static_cast<unsigned>(pe)), p, align);
    for (int64_t l = 0; l < pe; ++l) out.push_back({widen(t, b_.CreateExtractElement(vec, static_cast<uint64_t>(l))), t});
  }
  return out;
}

void ElementCodegen::store_vector(DType t, llvm::Value* ptr, llvm::Value* index, const std::vector<llvm::Value*>& lanes) {
  const int n = static_cast<int>(lanes.size());
  llvm::Type* st = storage_type(b_.getContext(), t);
  const int64_t pe = vector_piece_bytes(t, n) / dtype_size(t);
  for (int64_t piece = 0; piece < n / pe; ++piece) {
    llvm::Value* at = piece == 0 ? index : b_.CreateAdd(index, llvm::ConstantInt::get(index->getType(), static_cast<uint64_t>(piece * pe)), "", true, true);
    llvm::Value* p = b_.CreateInBoundsGEP(st, ptr, at);
    llvm::Align align(static_cast<uint64_t>(pe * dtype_size(t)));
    if (pe == 1) {
      b_.CreateAlignedStore(narrow(t, lanes[static_cast<size_t>(piece)]), p, align);
      continue;
    }
    std::vector<llvm::Value*> part(lanes.begin() + piece * pe, lanes.begin() + (piece + 1) * pe);
    b_.CreateAlignedStore(narrow_vector(t, part), p, align);
  }
}

llvm::Value* ElementCodegen::narrow(DType t, llvm::Value* v) {
  llvm::LLVMContext& c = b_.getContext();
  switch (t) {
    case DType::F16: return b_.CreateFPTrunc(v, llvm::Type::getHalfTy(c));  // round to nearest even
    case DType::BF16:
      // sm_80+ has cvt.rn.bf16.f32 (PTX ISA 7.0). LLVM's host lowering of the same
      // fptrunc calls a compiler-rt function (__truncsfbf2) the JIT may not find, and
      // older GPUs lack the instruction: integer rounding there.
      if (sm_ >= 80)
        return b_.CreateBitCast(b_.CreateFPTrunc(v, llvm::Type::getBFloatTy(c)), b_.getInt16Ty());
      return bf16_round_bits(v);
    case DType::Bool: return b_.CreateZExt(v, b_.getInt8Ty());
    case DType::F32:
    case DType::I32:
    case DType::I64: return v;
  }
  return v;
}

Elem ElementCodegen::constant(double v, DType t) {
  llvm::LLVMContext& c = b_.getContext();
  double r = round_to_dtype(v, t);
  switch (t) {
    case DType::F32:
    case DType::F16:
    case DType::BF16: return {llvm::ConstantFP::get(llvm::Type::getFloatTy(c), static_cast<float>(r)), t};
    case DType::I32: return {b_.getInt32(static_cast<uint32_t>(static_cast<int32_t>(r))), t};
    case DType::I64: return {b_.getInt64(static_cast<uint64_t>(saturating_i64(r))), t};
    case DType::Bool: return {b_.getInt1(r != 0.0), t};
  }
  return {nullptr, t};
}

llvm::Value* ElementCodegen::round_to(DType t, llvm::Value* v) {
  switch (t) {
    case DType::F16:
    case DType::BF16: return widen(t, narrow(t, v));
    case DType::F32:
    case DType::I32:
    case DType::I64:
    case DType::Bool: return v;
  }
  return v;
}

llvm::Value* ElementCodegen::int_to_bf16(llvm::Value* x) {
  // int -> f32 -> bf16 would round twice (16842753 = 2^24 + 2^16 + 1 becomes 2^24
  // instead of 2^24 + 2^17). Rounding to odd at 24 bits first and then to nearest
  // even at 8 bits is one correct rounding, since 24 >= 8 + 2 (the reference's
  // i64_to_double_round_odd uses the same argument).
  llvm::Value* v = b_.CreateSExt(x, b_.getInt64Ty());
  llvm::Value* neg = b_.CreateICmpSLT(v, b_.getInt64(0));
  llvm::Value* mag = b_.CreateSelect(neg, b_.CreateSub(b_.getInt64(0), v), v);  // |INT64_MIN| = 2^63 unsigned
  llvm::Value* lz = b_.CreateBinaryIntrinsic(llvm::Intrinsic::ctlz, mag, b_.getFalse());
  llvm::Value* shift = b_.CreateBinaryIntrinsic(llvm::Intrinsic::smax, b_.CreateSub(b_.getInt64(64 - 24), lz),
                                                b_.getInt64(0));
  llvm::Value* kept = b_.CreateLShr(mag, shift);
  llvm::Value* mask = b_.CreateSub(b_.CreateShl(b_.getInt64(1), shift), b_.getInt64(1));
  llvm::Value* sticky = b_.CreateZExt(b_.CreateICmpNE(b_.CreateAnd(mag, mask), b_.getInt64(0)), b_.getInt64Ty());
  kept = b_.CreateOr(kept, sticky);
  llvm::Type* f32 = b_.getFloatTy();
  llvm::Value* f = b_.CreateUIToFP(kept, f32);  // exact: kept < 2^24
  // 2^shift as float bits; shift <= 40, so the product is exact.
  llvm::Value* scale_bits = b_.CreateShl(b_.CreateAdd(b_.CreateTrunc(shift, b_.getInt32Ty()), b_.getInt32(127)), 23);
  f = b_.CreateFMul(f, b_.CreateBitCast(scale_bits, f32));
  f = b_.CreateSelect(neg, b_.CreateFNeg(f), f);
  return round_to(DType::BF16, f);
}

Elem ElementCodegen::convert(Elem v, DType to) {
  if (v.dtype == to) return v;
  llvm::LLVMContext& c = b_.getContext();
  llvm::Type* ct = compute_type(c, to);
  const DType from = v.dtype;
  if (is_float(from)) {
    if (is_float(to)) return {round_to(to, v.value), to};  // the value is exact in f32
    if (to == DType::Bool) return {b_.CreateFCmpUNE(v.value, llvm::ConstantFP::get(v.value->getType(), 0.0)), to};
    // Truncates toward zero, saturates, NaN -> 0: exactly round_to_dtype's rule.
    return {b_.CreateIntrinsic(llvm::Intrinsic::fptosi_sat, {ct, v.value->getType()}, {v.value}), to};
  }
  if (from == DType::Bool) {
    if (is_float(to)) return {b_.CreateUIToFP(v.value, ct), to};
    return {b_.CreateZExt(v.value, ct), to};
  }
  // from i32 / i64
  if (to == DType::Bool) return {b_.CreateICmpNE(v.value, llvm::ConstantInt::get(v.value->getType(), 0)), to};
  if (is_integer(to)) return {b_.CreateSExtOrTrunc(v.value, ct), to};
  if (to == DType::BF16) return {int_to_bf16(v.value), to};
  // sitofp rounds once to nearest even (cvt.rn.f32.s64, cvtsi2ss). For f16 rounding
  // that f32 again is still one rounding: below 2^24 the f32 is exact, above it the
  // f16 is Inf either way (f16's largest finite value is 65504).
  return {round_to(to, b_.CreateSIToFP(v.value, ct)), to};
}

llvm::Value* ElementCodegen::to_compute(Elem v, DType result) {
  llvm::Type* ct = compute_type(b_.getContext(), result);
  if (is_float(result)) {
    if (is_float(v.dtype)) return v.value;
    // An operand is read exactly, as the reference's a.get() does; the op then rounds.
    if (v.dtype == DType::Bool) return b_.CreateUIToFP(v.value, ct);
    return b_.CreateSIToFP(v.value, ct);
  }
  if (is_integer(result)) {
    if (v.dtype == DType::Bool) return b_.CreateZExt(v.value, ct);
    if (is_integer(v.dtype)) return b_.CreateSExtOrTrunc(v.value, ct);
  }
  return convert(v, result).value;
}

llvm::Value* ElementCodegen::math(MathFn f, llvm::Value* x, llvm::Value* y) {
  const bool gpu = target_.kind == llvmb::Target::Kind::NVPTX;
  llvm::Type* f32 = b_.getFloatTy();
  if (f == MathFn::Rsqrt && !gpu) {
    // libm has no rsqrtf; the reference is 1 / sqrt(x) with IEEE operations.
    llvm::Value* s = b_.CreateUnaryIntrinsic(llvm::Intrinsic::sqrt, x);
    return b_.CreateFDiv(llvm::ConstantFP::get(f32, 1.0), s);
  }
  const char* name = nullptr;
  switch (f) {
    case MathFn::Exp: name = gpu ? "__nv_expf" : "expf"; break;
    case MathFn::Log: name = gpu ? "__nv_logf" : "logf"; break;
    case MathFn::Tanh: name = gpu ? "__nv_tanhf" : "tanhf"; break;
    case MathFn::Erf: name = gpu ? "__nv_erff" : "erff"; break;
    case MathFn::Sin: name = gpu ? "__nv_sinf" : "sinf"; break;
    case MathFn::Cos: name = gpu ? "__nv_cosf" : "cosf"; break;
    case MathFn::Rsqrt: name = "__nv_rsqrtf"; break;
    case MathFn::Pow: name = gpu ? "__nv_powf" : "powf"; break;
  }
  const bool binary = f == MathFn::Pow;
  llvm::FunctionType* ft = binary ? llvm::FunctionType::get(f32, {f32, f32}, false)
                                  : llvm::FunctionType::get(f32, {f32}, false);
  llvm::FunctionCallee callee = m_.getOrInsertFunction(name, ft);
  if (auto* fn = llvm::dyn_cast<llvm::Function>(callee.getCallee())) {
    // Pure functions (errno is not observed): lets LLVM hoist, CSE and vectorise them.
    fn->setDoesNotThrow();
    fn->setDoesNotAccessMemory();
    fn->setWillReturn();
  }
  llvm::CallInst* call = binary ? b_.CreateCall(callee, {x, y}) : b_.CreateCall(callee, {x});
  call->setDoesNotThrow();
  call->setDoesNotAccessMemory();
  return call;
}

llvm::Value* ElementCodegen::int_pow(llvm::Value* a, llvm::Value* e, llvm::Type* result) {
  // Square and multiply in i64, wrapping (the reference's loop in uint64). A negative
  // exponent follows torch's integer pow (ATen powi): 1 for base 1, +-1 for base -1,
  // else 0; the reference rejects it, so no test data has one.
  llvm::Type* i64 = b_.getInt64Ty();
  llvm::Value* neg = b_.CreateICmpSLT(e, b_.getInt64(0));
  llvm::Value* odd = b_.CreateICmpNE(b_.CreateAnd(e, 1), b_.getInt64(0));
  llvm::Value* minus_one = b_.CreateSelect(odd, b_.getInt64(static_cast<uint64_t>(-1)), b_.getInt64(1));
  llvm::Value* neg_result =
      b_.CreateSelect(b_.CreateICmpEQ(a, b_.getInt64(1)), b_.getInt64(1),
                      b_.CreateSelect(b_.CreateICmpEQ(a, b_.getInt64(static_cast<uint64_t>(-1))), minus_one,
                                      b_.getInt64(0)));
  llvm::Value* e0 = b_.CreateSelect(neg, b_.getInt64(0), e);

  llvm::Function* fn = b_.GetInsertBlock()->getParent();
  llvm::LLVMContext& c = b_.getContext();
  llvm::BasicBlock* pre = b_.GetInsertBlock();
  llvm::BasicBlock* head = llvm::BasicBlock::Create(c, "pow.head", fn);
  llvm::BasicBlock* body = llvm::BasicBlock::Create(c, "pow.body", fn);
  llvm::BasicBlock* done = llvm::BasicBlock::Create(c, "pow.done", fn);
  b_.CreateBr(head);

  b_.SetInsertPoint(head);
  llvm::PHINode* r = b_.CreatePHI(i64, 2, "pow.r");
  llvm::PHINode* base = b_.CreatePHI(i64, 2, "pow.base");
  llvm::PHINode* ex = b_.CreatePHI(i64, 2, "pow.e");
  r->addIncoming(b_.getInt64(1), pre);
  base->addIncoming(a, pre);
  ex->addIncoming(e0, pre);
  b_.CreateCondBr(b_.CreateICmpNE(ex, b_.getInt64(0)), body, done);

  b_.SetInsertPoint(body);
  llvm::Value* bit = b_.CreateICmpNE(b_.CreateAnd(ex, 1), b_.getInt64(0));
  llvm::Value* r2 = b_.CreateSelect(bit, b_.CreateMul(r, base), r);
  llvm::Value* base2 = b_.CreateMul(base, base);
  llvm::Value* ex2 = b_.CreateLShr(ex, 1);
  r->addIncoming(r2, body);
  base->addIncoming(base2, body);
  ex->addIncoming(ex2, body);
  b_.CreateBr(head);

  b_.SetInsertPoint(done);
  llvm::Value* out = b_.CreateSelect(neg, neg_result, r);
  return b_.CreateTrunc(out, result);
}

Result<Elem> ElementCodegen::compare(OpKind k, Elem a, Elem b) {
  llvm::CmpInst::Predicate fp = llvm::CmpInst::FCMP_OEQ, ip = llvm::CmpInst::ICMP_EQ;
  switch (k) {
    case OpKind::Eq: fp = llvm::CmpInst::FCMP_OEQ; ip = llvm::CmpInst::ICMP_EQ; break;
    case OpKind::Ne: fp = llvm::CmpInst::FCMP_UNE; ip = llvm::CmpInst::ICMP_NE; break;  // NaN != x
    case OpKind::Lt: fp = llvm::CmpInst::FCMP_OLT; ip = llvm::CmpInst::ICMP_SLT; break;
    case OpKind::Le: fp = llvm::CmpInst::FCMP_OLE; ip = llvm::CmpInst::ICMP_SLE; break;
    case OpKind::Gt: fp = llvm::CmpInst::FCMP_OGT; ip = llvm::CmpInst::ICMP_SGT; break;
    case OpKind::Ge: fp = llvm::CmpInst::FCMP_OGE; ip = llvm::CmpInst::ICMP_SGE; break;
    default: return Diag{"", {}, std::string(op_name(k)) + " is not a comparison"};
  }
  const bool af = is_float(a.dtype), bf = is_float(b.dtype);
  if (!af && !bf) {  // exact in the wider integer type (bool as 0/1)
    DType t = (a.dtype == DType::I64 || b.dtype == DType::I64) ? DType::I64 : DType::I32;
    return Elem{b_.CreateICmp(ip, to_compute(a, t), to_compute(b, t)), DType::Bool};
  }
  if (af && bf)  // every f32/f16/bf16 value is exact in f32
    return Elem{b_.CreateFCmp(fp, a.value, b.value), DType::Bool};
  // An integer against a float: the reference compares in double, where i32 is exact
  // and i64 rounds as static_cast<double> does; f32 would merge neighbouring integers.
  auto to_f64 = [&](Elem v) -> llvm::Value* {
    llvm::Type* f64 = b_.getDoubleTy();
    if (is_float(v.dtype)) return b_.CreateFPExt(v.value, f64);
    if (v.dtype == DType::Bool) return b_.CreateUIToFP(v.value, f64);
    return b_.CreateSIToFP(v.value, f64);
  };
  return Elem{b_.CreateFCmp(fp, to_f64(a), to_f64(b)), DType::Bool};
}

namespace {
void allow_contract(llvm::Value* v) {
  // Inductor and nvcc contract a*b+c into an FMA by default: one rounding fewer,
  // within the reference tolerances.
  if (auto* i = llvm::dyn_cast<llvm::Instruction>(v)) i->setHasAllowContract(true);
}
}  // namespace

Result<Elem> ElementCodegen::elementwise(OpKind k, std::span<const Elem> args, DType result, bool rounded_to_16bit) {
  auto fail = [&](const std::string& why) -> Result<Elem> {
    return Diag{"", {}, std::string(op_name(k)) + ": " + why};
  };
  if (!is_elementwise(k)) return fail("not an elementwise op");
  if (static_cast<int>(args.size()) != op_info(k).arity) return fail("wrong number of operands");
  const bool fl = is_float(result);
  switch (k) {
    case OpKind::Exp: case OpKind::Log: case OpKind::Sqrt: case OpKind::Rsqrt: case OpKind::Tanh:
    case OpKind::Erf: case OpKind::Sin: case OpKind::Cos: case OpKind::Sigmoid: case OpKind::Silu:
    case OpKind::Reciprocal: case OpKind::Div:
      if (!fl) return fail("needs a float result, got " + std::string(dtype_name(result)));
      break;
    default: break;
  }
  // Operands in the result's compute type, in operand order (so the IR is the same
  // whatever order a compiler evaluates call arguments in).
  const OpCategory cat = op_info(k).category;
  const bool arith = (cat == OpCategory::Unary && k != OpKind::Cast) || cat == OpCategory::Binary;
  llvm::Value* x = arith ? to_compute(args[0], result) : nullptr;
  llvm::Value* y = arith && args.size() > 1 ? to_compute(args[1], result) : nullptr;
  llvm::Type* f32 = b_.getFloatTy();
  llvm::Value* one = llvm::ConstantFP::get(f32, 1.0);
  llvm::Value* zero = llvm::ConstantFP::get(f32, 0.0);
  llvm::Value* v = nullptr;
  // Ops that are exact on operands already in the result dtype need no rounding.
  bool exact = false;

  switch (k) {
    case OpKind::Neg: v = fl ? b_.CreateFNeg(x) : b_.CreateNeg(x); exact = true; break;
    case OpKind::Abs:
      v = fl ? b_.CreateUnaryIntrinsic(llvm::Intrinsic::fabs, x)
             : b_.CreateBinaryIntrinsic(llvm::Intrinsic::abs, x, b_.getFalse());  // abs(INT_MIN) wraps
      exact = true;
      break;
    case OpKind::Relu:
      // ugt is true for NaN: relu(NaN) = NaN; relu(-0.0) = +0.0, as the reference.
      v = fl ? b_.CreateSelect(b_.CreateFCmpUGT(x, zero), x, zero)
             : b_.CreateBinaryIntrinsic(llvm::Intrinsic::smax, x, llvm::ConstantInt::get(x->getType(), 0));
      exact = true;
      break;
    case OpKind::Exp: v = math(MathFn::Exp, x); break;
    case OpKind::Log: v = math(MathFn::Log, x); break;
    case OpKind::Sqrt: v = b_.CreateUnaryIntrinsic(llvm::Intrinsic::sqrt, x); break;  // sqrt.rn.f32
    case OpKind::Rsqrt: v = math(MathFn::Rsqrt, x); break;
    case OpKind::Tanh: v = math(MathFn::Tanh, x); break;
    case OpKind::Erf:
      // A value rounded to 8 (bf16) or 11 (f16) bits before anyone sees it (a 16-bit
      // node, checked at 16-bit tolerance, or an f32 one that reaches the outputs only
      // through such a rounding, as in a bf16 GELU) under Fused precision:
      // erf_for_16bit's 2e-7 cannot move it by more than libdevice's own 2 ulp can.
      // Eager precision keeps libdevice, to match eager PyTorch bit for bit.
      v = (result == DType::BF16 || result == DType::F16 || rounded_to_16bit) && precision_ == Precision::Fused
              ? erf_for_16bit(x)
              : math(MathFn::Erf, x);
      break;
    case OpKind::Sin: v = math(MathFn::Sin, x); break;
    case OpKind::Cos: v = math(MathFn::Cos, x); break;
    case OpKind::Sigmoid:
    case OpKind::Silu: {
      llvm::Value* s = b_.CreateFDiv(one, b_.CreateFAdd(one, math(MathFn::Exp, b_.CreateFNeg(x))));
      v = k == OpKind::Silu ? b_.CreateFMul(x, s) : s;  // x * sigmoid(x): silu(-inf) is NaN, as the reference
      break;
    }
    case OpKind::Reciprocal: v = b_.CreateFDiv(one, x); break;
    case OpKind::Cast: return convert(args[0], result);

    case OpKind::Add: v = fl ? b_.CreateFAdd(x, y) : b_.CreateAdd(x, y); allow_contract(v); break;
    case OpKind::Sub: v = fl ? b_.CreateFSub(x, y) : b_.CreateSub(x, y); allow_contract(v); break;
    case OpKind::Mul: v = fl ? b_.CreateFMul(x, y) : b_.CreateMul(x, y); allow_contract(v); break;
    case OpKind::Div: v = b_.CreateFDiv(x, y); break;  // true division (div.rn.f32, not div.approx)
    case OpKind::Maximum:
    case OpKind::Minimum: {
      const bool mx = k == OpKind::Maximum;
      // llvm.maximum propagates NaN (max.NaN.f32 on sm_80+), as torch.maximum does.
      v = fl ? b_.CreateBinaryIntrinsic(mx ? llvm::Intrinsic::maximum : llvm::Intrinsic::minimum, x, y)
             : b_.CreateBinaryIntrinsic(mx ? llvm::Intrinsic::smax : llvm::Intrinsic::smin, x, y);
      exact = true;
      break;
    }
    case OpKind::Pow:
      if (fl) {
        v = math(MathFn::Pow, x, y);
      } else {
        // In i64 whatever the result: an i64 exponent must not be truncated first.
        llvm::Value* a = to_compute(args[0], DType::I64);
        llvm::Value* e = to_compute(args[1], DType::I64);
        v = int_pow(a, e, compute_type(b_.getContext(), result));
      }
      break;

    case OpKind::Eq:
    case OpKind::Ne:
    case OpKind::Lt:
    case OpKind::Le:
    case OpKind::Gt:
    case OpKind::Ge: return compare(k, args[0], args[1]);

    case OpKind::Where: {
      Elem c = convert(args[0], DType::Bool);
      Elem a = convert(args[1], result), b = convert(args[2], result);  // each rounded to the result
      return Elem{b_.CreateSelect(c.value, a.value, b.value), result};
    }

    case OpKind::Param:
    case OpKind::Constant:
    case OpKind::Sum:
    case OpKind::Max:
    case OpKind::Min:
    case OpKind::Mean:
    case OpKind::Matmul:
    case OpKind::Transpose:
    case OpKind::Permute:
    case OpKind::Reshape:
    case OpKind::Expand:
    case OpKind::Slice:
    case OpKind::Concat:
    case OpKind::Gather:
    case OpKind::IndexSelect:
    case OpKind::Embedding:
    case OpKind::ScatterAdd:
    case OpKind::Gelu:
    case OpKind::GeluTanh:
    case OpKind::Softmax:
    case OpKind::LayerNorm:
    case OpKind::RmsNorm:
    case OpKind::AllGather:
    case OpKind::ReduceScatter:
    case OpKind::AllReduce:
    case OpKind::AllToAll:
    case OpKind::Redistribute:
    case OpKind::LogSoftmax:
    case OpKind::CrossEntropy:
    case OpKind::ScaledDotProductAttention:
    case OpKind::Arange:
    case OpKind::Full:
    case OpKind::Tril:
    case OpKind::Triu:
    case OpKind::Cumsum:
    case OpKind::Argmax:
    case OpKind::Argmin: return fail("not an elementwise op");
    case OpKind::Dropout: return fail("not an elementwise op");
  }
  if (exact) {
    bool all_same = true;
    for (const Elem& a : args) all_same = all_same && a.dtype == result;
    if (all_same) return Elem{v, result};
  }
  return Elem{node_result(result, v), result};
}

MaskedRow masked_row(llvm::IRBuilderBase& b, llvm::Value* index, int64_t offset, int64_t rows) {
  llvm::Value* off = b.getInt64(static_cast<uint64_t>(offset));
  llvm::Value* rel = b.CreateSub(index, off);  // wraps below offset; only read where index >= offset
  llvm::Value* in_range = b.CreateAnd(b.CreateICmpSGE(index, off), b.CreateICmpULT(rel, b.getInt64(static_cast<uint64_t>(rows))));
  return {b.CreateSelect(in_range, rel, b.getInt64(0)), in_range};
}

namespace {

std::string param_name(size_t i, size_t num_in, size_t num_out) {
  if (i < num_in) return "in" + std::to_string(i);
  if (i < num_in + num_out) return "out" + std::to_string(i - num_in);
  return "tmap" + std::to_string(i - num_in - num_out);
}

}  // namespace

KernelEntry begin_nvptx_kernel(llvm::Module& m, llvm::IRBuilderBase& b, const std::string& entry, size_t num_in,
                               size_t num_out, int max_threads, size_t num_extra) {
  llvm::LLVMContext& c = m.getContext();
  KernelEntry k;
  const size_t n = num_in + num_out + num_extra;
  llvm::Type* gptr = llvm::PointerType::get(c, 1);  // addrspace(1): global memory
  auto* fty = llvm::FunctionType::get(b.getVoidTy(), std::vector<llvm::Type*>(n, gptr), false);
  k.fn = llvm::Function::Create(fty, llvm::Function::ExternalLinkage, entry, m);
  llvmb::mark_kernel(*k.fn, max_threads);
  for (size_t i = 0; i < n; ++i) {
    llvm::Argument* a = k.fn->getArg(static_cast<unsigned>(i));
    a->setName(param_name(i, num_in, num_out));
    if (i < num_in || i >= num_in + num_out) a->addAttr(llvm::Attribute::ReadOnly);
    (i < num_in ? k.in : i < num_in + num_out ? k.out : k.extra).push_back(a);
  }
  b.SetInsertPoint(llvm::BasicBlock::Create(c, "entry", k.fn));
  k.fn->setDoesNotThrow();
  return k;
}

KernelEntry begin_host_kernel(llvm::Module& m, llvm::IRBuilderBase& b, const std::string& entry, size_t num_in,
                              size_t num_out, const std::vector<llvm::Type*>& host_extra, size_t num_extra) {
  KernelEntry k;
  std::vector<llvm::Type*> params{b.getPtrTy()};
  params.insert(params.end(), host_extra.begin(), host_extra.end());
  auto* fty = llvm::FunctionType::get(b.getVoidTy(), params, false);
  k.fn = llvm::Function::Create(fty, llvm::Function::ExternalLinkage, entry, m);
  k.fn->getArg(0)->setName("args");
  b.SetInsertPoint(llvm::BasicBlock::Create(m.getContext(), "entry", k.fn));
  for (size_t i = 0; i < num_in + num_out + num_extra; ++i) {
    llvm::Value* slot = b.CreateConstInBoundsGEP1_64(b.getPtrTy(), k.fn->getArg(0), i);
    llvm::Value* p = b.CreateAlignedLoad(b.getPtrTy(), slot, llvm::Align(8), param_name(i, num_in, num_out));
    (i < num_in ? k.in : i < num_in + num_out ? k.out : k.extra).push_back(p);
  }
  k.fn->setDoesNotThrow();
  return k;
}

KernelEntry begin_kernel(llvm::Module& m, llvm::IRBuilderBase& b, const std::string& entry, size_t num_in,
                         size_t num_out, const llvmb::Target& target, int max_threads,
                         const std::vector<llvm::Type*>& host_extra, size_t num_extra) {
  if (target.kind == llvmb::Target::Kind::NVPTX)
    return begin_nvptx_kernel(m, b, entry, num_in, num_out, max_threads, num_extra);
  return begin_host_kernel(m, b, entry, num_in, num_out, host_extra, num_extra);
}

LoopHints host_loop_hints(const KernelConfig& c) { return LoopHints{c.host_vector, c.host_interleave}; }

std::optional<std::string> host_knob_error(const KernelConfig& c) {
  // 64 lanes is LLVM's own limit for a width hint (VectorizerParams::MaxVectorWidth;
  // like the interleave count, only powers of two are taken), a 2048-bit f32
  // vector: four AVX-512 registers.
  const int v = c.host_vector;
  if (v < 0 || v > 64 || (v & (v - 1)) != 0)
    return "host_vector = " + std::to_string(v) + " is not 0 (LLVM's choice) or a power of two in 1..64";
  // LLVM takes an interleave count only when it is a power of two up to 16
  // (LoopVectorizeHints::Hint::validate, MaxInterleaveFactor) and silently drops any
  // other: 3 would build what 0 builds, a config the autotuner would time twice.
  const int il = c.host_interleave;
  if (il < 0 || il > 16 || (il & (il - 1)) != 0)
    return "host_interleave = " + std::to_string(il) + " is not 0 (LLVM's choice) or a power of two in 1..16";
  // The matmul's accumulator row is an alloca of host_tile_n elements: 1024 f32
  // (4 KiB; 8 KiB for i64 accumulators) is already far past what L1 keeps beside B.
  if (c.host_tile_n < 0 || c.host_tile_n > 1024)
    return "host_tile_n = " + std::to_string(c.host_tile_n) + " is outside 1..1024 (0: the emitter's default)";
  return std::nullopt;
}

llvm::MDNode* loop_metadata(llvm::LLVMContext& c, const LoopHints& h) {
  if (!h.any()) return nullptr;
  auto i32 = [&](int v) { return llvm::ConstantAsMetadata::get(llvm::ConstantInt::get(llvm::Type::getInt32Ty(c), static_cast<uint64_t>(v))); };
  auto hint = [&](const char* key, llvm::Metadata* v) -> llvm::Metadata* {
    return llvm::MDNode::get(c, {llvm::MDString::get(c, key), v});
  };
  // Self-reference first (what makes the node a loop ID), as clang builds it.
  llvm::TempMDTuple self = llvm::MDNode::getTemporary(c, {});
  std::vector<llvm::Metadata*> ops{self.get()};
  // Enabling both sets the width and allows reordering float reductions; width 1
  // with no interleaving is plain "stay scalar" and must not say enable (width 1 +
  // interleave 1 + enable would be read as suppressed, which is the same thing).
  const bool enable = h.vector_width > 1 || (h.vector_width == 1 && h.interleave > 1);
  if (enable) ops.push_back(hint("llvm.loop.vectorize.enable", llvm::ConstantAsMetadata::get(llvm::ConstantInt::getTrue(c))));
  if (h.vector_width > 0) ops.push_back(hint("llvm.loop.vectorize.width", i32(h.vector_width)));
  if (h.interleave > 0) ops.push_back(hint("llvm.loop.interleave.count", i32(h.interleave)));
  // The O3 pipeline fully unrolls loops with small constant trip counts (a reduction
  // chunk of 64, a row of 7) in LoopFullUnroll, before LoopVectorize reads the hints,
  // and partially unrolls the vector loop after it: a hinted loop is not unrolled,
  // so its body is exactly vector_width x interleave elements.
  ops.push_back(llvm::MDNode::get(c, {llvm::MDString::get(c, "llvm.loop.unroll.disable")}));
  llvm::MDNode* id = llvm::MDNode::getDistinct(c, ops);
  id->replaceOperandWith(0, id);
  return id;
}

Result<void> emit_loop(llvm::IRBuilderBase& b, llvm::Value* begin, llvm::Value* end, llvm::Value* step,
                       const std::string& name, const std::function<Result<void>(llvm::Value*)>& body,
                       const LoopHints& hints) {
  llvm::LLVMContext& c = b.getContext();
  llvm::Function* fn = b.GetInsertBlock()->getParent();
  llvm::BasicBlock* pre = b.GetInsertBlock();
  llvm::BasicBlock* head = llvm::BasicBlock::Create(c, name + ".head", fn);
  llvm::BasicBlock* bodyb = llvm::BasicBlock::Create(c, name + ".body", fn);
  llvm::BasicBlock* exit = llvm::BasicBlock::Create(c, name + ".exit", fn);
  b.CreateBr(head);
  b.SetInsertPoint(head);
  llvm::PHINode* i = b.CreatePHI(begin->getType(), 2, name);
  i->addIncoming(begin, pre);
  b.CreateCondBr(b.CreateICmpSLT(i, end), bodyb, exit);
  b.SetInsertPoint(bodyb);
  Result<void> r = body(i);
  if (!r) return r;
  llvm::Value* next = b.CreateAdd(i, step, name + ".next", /*HasNUW=*/true, /*HasNSW=*/true);
  i->addIncoming(next, b.GetInsertBlock());
  llvm::BranchInst* latch = b.CreateBr(head);
  if (llvm::MDNode* md = loop_metadata(c, hints)) latch->setMetadata(llvm::LLVMContext::MD_loop, md);
  b.SetInsertPoint(exit);
  return {};
}

}  // namespace sf::kernels
