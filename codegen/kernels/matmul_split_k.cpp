// Split-K through a workspace: matmul_split_k.h.
#include "codegen/kernels/matmul_split_k.h"

#include <llvm/IR/Constants.h>
#include <llvm/IR/DerivedTypes.h>
#include <llvm/IR/Function.h>
#include <llvm/IR/Instructions.h>
#include <llvm/IR/IntrinsicsNVPTX.h>
#include <llvm/IR/LLVMContext.h>

namespace sf::matmul_detail {

void add_f32_atomic(llvm::IRBuilderBase& b, llvm::Function* fn, llvm::Value* ok, llvm::Value* dst, llvm::Value* flat,
                    llvm::Value* v) {
  llvm::LLVMContext& c = b.getContext();
  llvm::BasicBlock* st = llvm::BasicBlock::Create(c, "split.add", fn);
  llvm::BasicBlock* next = llvm::BasicBlock::Create(c, "split.added", fn);
  b.CreateCondBr(ok, st, next);
  b.SetInsertPoint(st);
  b.CreateAtomicRMW(llvm::AtomicRMWInst::FAdd, b.CreateInBoundsGEP(b.getFloatTy(), dst, flat), v, llvm::MaybeAlign(4),
                    llvm::AtomicOrdering::Monotonic);
  b.CreateBr(next);
  b.SetInsertPoint(next);
}

void SplitKWorkspace::add(llvm::Value* ok, llvm::Value* flat, llvm::Value* v) const { add_f32_atomic(*b, fn, ok, ws, flat, v); }

void SplitKWorkspace::fence() const {
  if (host) b->CreateFence(llvm::AtomicOrdering::SequentiallyConsistent);
  else b->CreateIntrinsic(llvm::Intrinsic::nvvm_membar_gl, {}, {});
}

void SplitKWorkspace::add_pair(llvm::Value* ok, llvm::Value* flat, llvm::Value* v0, llvm::Value* v1) const {
  // Two scalar atomics under one branch. sm_90's red.global.add.v2.f32 would halve
  // them, but it needs PTX ISA 8.1 and the emitted PTX stays 8.0 (llvm_compat.h).
  llvm::LLVMContext& c = b->getContext();
  llvm::BasicBlock* st = llvm::BasicBlock::Create(c, "split.add2", fn);
  llvm::BasicBlock* next = llvm::BasicBlock::Create(c, "split.added2", fn);
  b->CreateCondBr(ok, st, next);
  b->SetInsertPoint(st);
  llvm::Value* at = b->CreateInBoundsGEP(b->getFloatTy(), ws, flat);
  b->CreateAtomicRMW(llvm::AtomicRMWInst::FAdd, at, v0, llvm::MaybeAlign(8), llvm::AtomicOrdering::Monotonic);
  b->CreateAtomicRMW(llvm::AtomicRMWInst::FAdd, b->CreateConstInBoundsGEP1_64(b->getFloatTy(), at, 1), v1,
                     llvm::MaybeAlign(4), llvm::AtomicOrdering::Monotonic);
  b->CreateBr(next);
  b->SetInsertPoint(next);
}

void SplitKWorkspace::arrive() const {
  llvm::LLVMContext& c = b->getContext();
  fence();
  barrier();
  llvm::BasicBlock* t0 = llvm::BasicBlock::Create(c, "split.count", fn);
  llvm::BasicBlock* reset = llvm::BasicBlock::Create(c, "split.reset", fn);
  llvm::BasicBlock* counted = llvm::BasicBlock::Create(c, "split.counted", fn);
  b->CreateCondBr(b->CreateICmpEQ(tid, llvm::ConstantInt::get(tid->getType(), 0)), t0, counted);
  b->SetInsertPoint(t0);
  llvm::Value* counter = b->CreateInBoundsGEP(
      b->getInt32Ty(), b->CreateInBoundsGEP(b->getFloatTy(), ws, b->getInt64(static_cast<uint64_t>(sums))), item);
  llvm::Value* before = b->CreateAtomicRMW(llvm::AtomicRMWInst::Add, counter, b->getInt32(1), llvm::MaybeAlign(4),
                                           llvm::AtomicOrdering::Monotonic);
  // The acquire side of the PTX memory model's fence-atomic pattern: every other
  // block fenced its sums before its count (the release side), and this thread
  // fences after reading the count; the barrier below carries that to the block.
  fence();
  llvm::Value* last = b->CreateICmpEQ(before, b->getInt32(static_cast<uint32_t>(split - 1)));
  b->CreateAlignedStore(b->CreateZExt(last, b->getInt32Ty()), flag, llvm::Align(4));
  b->CreateCondBr(last, reset, counted);
  // Every block of the item has counted itself in: nothing else touches the counter
  // in this launch, and the next one finds it zero.
  b->SetInsertPoint(reset);
  b->CreateAlignedStore(b->getInt32(0), counter, llvm::Align(4));
  b->CreateBr(counted);
  b->SetInsertPoint(counted);
  barrier();
  llvm::Value* is_last = b->CreateICmpNE(b->CreateAlignedLoad(b->getInt32Ty(), flag, llvm::Align(4)), b->getInt32(0));
  llvm::BasicBlock* sum = llvm::BasicBlock::Create(c, "split.last", fn);
  llvm::BasicBlock* out = llvm::BasicBlock::Create(c, "split.leave", fn);
  b->CreateCondBr(is_last, sum, out);
  b->SetInsertPoint(out);
  leave();
  b->SetInsertPoint(sum);
  fence();
}

llvm::Value* SplitKWorkspace::take_as(llvm::Type* t, llvm::Value* ok, llvm::Value* flat) const {
  llvm::LLVMContext& c = b->getContext();
  llvm::BasicBlock* from = b->GetInsertBlock();
  llvm::BasicBlock* rd = llvm::BasicBlock::Create(c, "split.take", fn);
  llvm::BasicBlock* next = llvm::BasicBlock::Create(c, "split.taken", fn);
  b->CreateCondBr(ok, rd, next);
  b->SetInsertPoint(rd);
  const llvm::Align align(t->getPrimitiveSizeInBits().getFixedValue() / 8);
  llvm::Value* at = b->CreateInBoundsGEP(b->getFloatTy(), ws, flat);
  llvm::Value* v = b->CreateAlignedLoad(t, at, align, /*isVolatile=*/true);
  b->CreateAlignedStore(llvm::Constant::getNullValue(t), at, align);
  b->CreateBr(next);
  b->SetInsertPoint(next);
  llvm::PHINode* phi = b->CreatePHI(t, 2);
  phi->addIncoming(v, rd);
  phi->addIncoming(llvm::Constant::getNullValue(t), from);
  return phi;
}

llvm::Value* SplitKWorkspace::take(llvm::Value* ok, llvm::Value* flat) const {
  return take_as(b->getFloatTy(), ok, flat);
}

std::pair<llvm::Value*, llvm::Value*> SplitKWorkspace::take_pair(llvm::Value* ok, llvm::Value* flat) const {
  llvm::Value* v = take_as(llvm::FixedVectorType::get(b->getFloatTy(), 2), ok, flat);
  return {b->CreateExtractElement(v, uint64_t{0}), b->CreateExtractElement(v, uint64_t{1})};
}

}  // namespace sf::matmul_detail
