// dropout's mask as element code (element.h): Philox4x32-10 of the element's global
// index, built from the definition in codegen/ir/dropout.h (the reference evaluator
// calls that C++; tests hold the two together bit for bit).
#include "codegen/kernels/element.h"

#include <array>
#include <utility>

#include <llvm/IR/IntrinsicsNVPTX.h>

#include "codegen/ir/dropout.h"

namespace sf::kernels {

llvm::Value* emit_dropout_word(llvm::IRBuilderBase& b, const llvmb::Target& target, uint64_t seed, llvm::Value* index) {
  llvm::Type* i32 = b.getInt32Ty();
  llvm::Type* i64 = b.getInt64Ty();
  // counter = (lo32(index / 4), hi32(index / 4), 0, 0); index < 2^40, so the high
  // word is small but still computed, as the definition has it.
  llvm::Value* n = b.CreateLShr(index, 2);
  std::array<llvm::Value*, 4> c{b.CreateTrunc(n, i32), b.CreateTrunc(b.CreateLShr(n, 32), i32), b.getInt32(0),
                                b.getInt32(0)};
  // The key is the seed, known when the kernel is built: its bumps are constants.
  auto k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  // The high and low halves of the 64-bit product of two 32-bit words. On NVPTX the
  // high half is llvm.nvvm.mulhi.ui (PTX mul.hi.u32): the portable form, a
  // zero-extended i64 multiply shifted right by 32, is what the host uses, but on
  // NVPTX InstCombine moves the rounds' xors into i64 before the multiplies, so
  // they lose the zext that selects mul.wide.u32 and become mul.lo.s64, an emulated
  // 64-bit multiply (an f32[64, 64] dropout's sm_80 kernel had 40 mul.lo.s64 and 3
  // mul.wide.u32; with the intrinsic, 38 mul.hi.u32 and no mul.lo.s64).
  const bool gpu = target.kind == llvmb::Target::Kind::NVPTX;
  auto mulhilo = [&](uint32_t m, llvm::Value* x) -> std::pair<llvm::Value*, llvm::Value*> {
    if (gpu) return {b.CreateIntrinsic(llvm::Intrinsic::nvvm_mulhi_ui, {}, {b.getInt32(m), x}), b.CreateMul(b.getInt32(m), x)};
    // Below 2^64 but not 2^63: nuw, not nsw.
    llvm::Value* p = b.CreateMul(b.getInt64(m), b.CreateZExt(x, i64), "", /*HasNUW=*/true, /*HasNSW=*/false);
    return {b.CreateTrunc(b.CreateLShr(p, 32), i32), b.CreateTrunc(p, i32)};
  };
  for (int r = 0; r < kPhiloxRounds; ++r) {
    if (r > 0) {
      k0 += kPhiloxW0;  // modulo 2^32
      k1 += kPhiloxW1;
    }
    auto [hi0, lo0] = mulhilo(kPhiloxM0, c[0]);
    auto [hi1, lo1] = mulhilo(kPhiloxM1, c[2]);
    c = {b.CreateXor(b.CreateXor(hi1, c[1]), b.getInt32(k0)), lo1, b.CreateXor(b.CreateXor(hi0, c[3]), b.getInt32(k1)),
         lo0};
  }
  // word = c[index % 4]: selects rather than a dynamically indexed array (registers).
  llvm::Value* lane = b.CreateTrunc(b.CreateAnd(index, b.getInt64(3)), i32);
  llvm::Value* w = b.CreateSelect(b.CreateICmpEQ(lane, b.getInt32(2)), c[2], c[3]);
  w = b.CreateSelect(b.CreateICmpEQ(lane, b.getInt32(1)), c[1], w);
  return b.CreateSelect(b.CreateICmpEQ(lane, b.getInt32(0)), c[0], w);
}

Result<Elem> emit_dropout(ElementCodegen& cg, const Node& n, Elem x, llvm::Value* index, bool rounded_to_16bit) {
  llvm::IRBuilderBase& b = cg.builder();
  const double p = n.attrs.get_float("p");
  // Kept where word >= ceil(p * 2^32) (codegen/ir/dropout.h: u = word * 2^-32 >= p),
  // compared in 64 bits: the threshold is 2^32 for p = 1.
  llvm::Value* word = emit_dropout_word(b, cg.target(), static_cast<uint64_t>(n.attrs.get_int("seed")), index);
  llvm::Value* keep = b.CreateICmpUGE(b.CreateZExt(word, b.getInt64Ty()), b.getInt64(dropout_threshold(p)));
  // x * (keep ? 1/(1-p) : 0), the scale in f32 (every float dtype computes in f32):
  // a multiply, not a select of 0, so a dropped inf or NaN is NaN as in torch.
  llvm::Value* factor = b.CreateSelect(keep, cg.constant(dropout_scale(p), DType::F32).value,
                                       cg.constant(0.0, DType::F32).value);
  const Elem args[] = {x, Elem{factor, DType::F32}};
  return cg.elementwise(OpKind::Mul, args, n.type.dtype, rounded_to_16bit);
}

}  // namespace sf::kernels
