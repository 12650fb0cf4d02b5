// The tensor-core matmul's instructions: matmul_mma_isa.h.
#include "codegen/kernels/matmul_mma_isa.h"

#include <llvm/IR/Constants.h>
#include <llvm/IR/Function.h>
#include <llvm/IR/InlineAsm.h>
#include <llvm/IR/Instructions.h>
#include <llvm/IR/Intrinsics.h>
#include <llvm/IR/IntrinsicsNVPTX.h>
#include <llvm/IR/LLVMContext.h>

namespace sf::matmul_detail {

void ptx_stmt(llvm::IRBuilderBase& b, const std::string& text) {
  auto* fty = llvm::FunctionType::get(b.getVoidTy(), false);
  b.CreateCall(llvm::InlineAsm::get(fty, text, "~{memory}", /*hasSideEffects=*/true));
}

llvm::Value* wgmma_descriptor(llvm::IRBuilderBase& b, llvm::Value* addr, int64_t lbo, int64_t sbo) {
  llvm::Type* i64 = b.getInt64Ty();
  llvm::Value* start = b.CreateAnd(b.CreateLShr(b.CreateZExt(addr, i64), 4), 0x3FFF);
  const uint64_t fixed = ((static_cast<uint64_t>(lbo) >> 4) & 0x3FFF) << 16 |
                         ((static_cast<uint64_t>(sbo) >> 4) & 0x3FFF) << 32 | uint64_t{1} << 62;
  return b.CreateOr(start, llvm::ConstantInt::get(i64, fixed));
}

std::vector<llvm::Value*> wgmma_inline(llvm::IRBuilderBase& b, const std::vector<llvm::Value*>& a_regs, llvm::Value* da,
                                       llvm::Value* db, std::vector<llvm::Value*> d, const std::string& type, int trans_a,
                                       int trans_b) {
  const size_t n = d.size();
  const bool tf32 = type == "tf32", ra = !a_regs.empty();
  // $0 .. $n-1: D; then A (four registers, or its descriptor), B's descriptor, and
  // scale-d (a predicate in the instruction, set from a register); the accumulators
  // tied to D.
  const int64_t a0 = static_cast<int64_t>(n), bi = a0 + (ra ? 4 : 1), sd = bi + 1;
  std::string text = "{\n.reg .pred p;\nsetp.ne.b32 p, $" + num(sd) + ", 0;\nwgmma.mma_async.sync.aligned.m64n" +
                     num(int64_t(2 * n)) + (tf32 ? "k8" : "k16") + ".f32." + type + "." + type + " {";
  std::string cons;
  for (size_t i = 0; i < n; ++i) {
    text += (i ? ", $" : "$") + num(int64_t(i));
    cons += "=f,";
  }
  text += "}, ";
  if (ra) {
    text += "{$" + num(a0) + ", $" + num(a0 + 1) + ", $" + num(a0 + 2) + ", $" + num(a0 + 3) + "}";
    cons += "r,r,r,r,";
  } else {
    text += "$" + num(a0);
    cons += "l,";
  }
  // TF32 has no imm-trans operands (both operands are K-major); A from registers no
  // imm-trans-a.
  text += ", $" + num(bi) + ", p, 1, 1" + (tf32 ? std::string() : (ra ? "" : ", " + num(trans_a)) + ", " + num(trans_b)) +
          ";\n}";
  cons += "l,r";
  for (size_t i = 0; i < n; ++i) cons += "," + num(int64_t(i));
  cons += ",~{memory}";
  llvm::Type* f32 = b.getFloatTy();
  std::vector<llvm::Type*> outs(n, f32);
  std::vector<llvm::Type*> ins;
  std::vector<llvm::Value*> args;
  if (ra) {
    ins.assign(4, b.getInt32Ty());
    args.assign(a_regs.begin(), a_regs.end());
  } else {
    ins.push_back(b.getInt64Ty());
    args.push_back(da);
  }
  ins.push_back(b.getInt64Ty());
  ins.push_back(b.getInt32Ty());
  ins.insert(ins.end(), n, f32);
  args.push_back(db);
  args.push_back(b.getInt32(1));
  args.insert(args.end(), d.begin(), d.end());
  auto* fty = llvm::FunctionType::get(llvm::StructType::get(b.getContext(), outs), ins, false);
  llvm::Value* r = b.CreateCall(llvm::InlineAsm::get(fty, text, cons, /*hasSideEffects=*/true), args);
  for (size_t i = 0; i < n; ++i) d[i] = b.CreateExtractValue(r, {static_cast<unsigned>(i)});
  return d;
}

void mbar_init_ptx(llvm::IRBuilderBase& b, llvm::Value* bar, int count) {
  llvm::Type* i32 = b.getInt32Ty();
  auto* fty = llvm::FunctionType::get(b.getVoidTy(), {i32, i32}, false);
  b.CreateCall(llvm::InlineAsm::get(fty, "mbarrier.init.shared::cta.b64 [$0], $1;", "r,r,~{memory}", true),
               {bar, b.getInt32(static_cast<uint32_t>(count))});
}

void mbar_arrive_ptx(llvm::IRBuilderBase& b, llvm::Value* bar) {
  auto* fty = llvm::FunctionType::get(b.getVoidTy(), {b.getInt32Ty()}, false);
  b.CreateCall(llvm::InlineAsm::get(fty, "mbarrier.arrive.shared::cta.b64 _, [$0];", "r,~{memory}", true), {bar});
}

void setmaxnreg_ptx(llvm::IRBuilderBase& b, int count, bool inc) {
  ptx_stmt(b, std::string("setmaxnreg.") + (inc ? "inc" : "dec") + ".sync.aligned.u32 " + std::to_string(count) + ";");
}

void named_barrier_ptx(llvm::IRBuilderBase& b, llvm::Value* id, int threads, bool sync) {
  llvm::Type* i32 = b.getInt32Ty();
  auto* fty = llvm::FunctionType::get(b.getVoidTy(), {i32}, false);
  const std::string text = std::string(sync ? "bar.sync" : "bar.arrive") + " $0, " + std::to_string(threads) + ";";
  llvm::CallInst* call = b.CreateCall(llvm::InlineAsm::get(fty, text, "r,~{memory}", true), {b.CreateZExtOrTrunc(id, i32)});
  call->setConvergent();
}

void mbar_expect_tx_ptx(llvm::IRBuilderBase& b, llvm::Value* bar, llvm::Value* bytes) {
  llvm::Type* i32 = b.getInt32Ty();
  auto* fty = llvm::FunctionType::get(b.getVoidTy(), {i32, i32}, false);
  b.CreateCall(llvm::InlineAsm::get(fty, "mbarrier.arrive.expect_tx.shared::cta.b64 _, [$0], $1;", "r,r,~{memory}", true),
               {bar, bytes});
}

llvm::Value* mbar_try_wait_ptx(llvm::IRBuilderBase& b, llvm::Value* bar, llvm::Value* parity) {
  llvm::Type* i32 = b.getInt32Ty();
  auto* fty = llvm::FunctionType::get(i32, {i32, i32}, false);
  return b.CreateCall(
      llvm::InlineAsm::get(fty, "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [$1], $2;\nselp.b32 $0, 1, 0, p;\n}",
                           "=r,r,r,~{memory}", true),
      {bar, parity});
}

namespace {

// An inline-PTX bulk tensor copy: `text` (the instruction and its first operands `args`,
// of types `ty` and constraints `cons`, up to the coordinates' "{"), the coordinates
// (i32), "}], [" the 32-bit shared address `last` "]", then `tail`.
// `mask`: then ", " a 16-bit operand (a multicast's CTA mask).
void bulk_tensor_ptx(llvm::IRBuilderBase& b, std::string text, std::vector<llvm::Type*> ty, std::vector<llvm::Value*> args,
                     std::string cons, const std::vector<llvm::Value*>& coords, const std::string& tail,
                     llvm::Value* last, llvm::Value* mask = nullptr) {
  const size_t first = args.size();
  for (size_t i = 0; i < coords.size(); ++i) {
    text += (i ? ", $" : "$") + num(int64_t(first + i));
    ty.push_back(b.getInt32Ty());
    args.push_back(coords[i]);
    cons += ",r";
  }
  text += "}], [$" + num(int64_t(first + coords.size())) + "]";
  ty.push_back(b.getInt32Ty());
  args.push_back(last);
  cons += ",r";
  if (mask) {
    text += ", $" + num(int64_t(first + coords.size() + 1));
    ty.push_back(b.getInt16Ty());
    args.push_back(mask);
    cons += ",h";
  }
  text += tail;
  cons += ",~{memory}";
  b.CreateCall(llvm::InlineAsm::get(llvm::FunctionType::get(b.getVoidTy(), ty, false), text, cons, true), args);
}

llvm::Value* map_address(llvm::IRBuilderBase& b, llvm::Value* map) {
  return b.CreatePtrToInt(b.CreateAddrSpaceCast(map, b.getPtrTy()), b.getInt64Ty());
}

}  // namespace

void tma_load_ptx(llvm::IRBuilderBase& b, llvm::Value* map, llvm::Value* dst, const std::vector<llvm::Value*>& coords,
                  llvm::Value* bar) {
  const std::string r = num(int64_t(coords.size()));
  bulk_tensor_ptx(b, "cp.async.bulk.tensor." + r + "d.shared::cluster.global.mbarrier::complete_tx::bytes [$0], [$1, {",
                  {b.getInt32Ty(), b.getInt64Ty()}, {dst, map_address(b, map)}, "r,l", coords, ";", bar);
}

void tma_load_multicast_ptx(llvm::IRBuilderBase& b, llvm::Value* map, llvm::Value* dst,
                            const std::vector<llvm::Value*>& coords, llvm::Value* bar, int mask) {
  const std::string r = num(int64_t(coords.size()));
  bulk_tensor_ptx(b,
                  "cp.async.bulk.tensor." + r +
                      "d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [$0], [$1, {",
                  {b.getInt32Ty(), b.getInt64Ty()}, {dst, map_address(b, map)}, "r,l", coords, ";", bar,
                  b.getInt16(static_cast<uint16_t>(mask)));
}

void mbar_arrive_cluster_ptx(llvm::IRBuilderBase& b, llvm::Value* bar, llvm::Value* rank) {
  llvm::Type* i32 = b.getInt32Ty();
  auto* fty = llvm::FunctionType::get(b.getVoidTy(), {i32, i32}, false);
  b.CreateCall(llvm::InlineAsm::get(fty,
                                    "{\n.reg .b32 r;\nmapa.shared::cluster.u32 r, $0, $1;\n"
                                    "mbarrier.arrive.release.cluster.shared::cluster.b64 _, [r];\n}",
                                    "r,r,~{memory}", true),
               {bar, b.CreateZExtOrTrunc(rank, i32)});
}

void cluster_sync_ptx(llvm::IRBuilderBase& b) {
  auto* fty = llvm::FunctionType::get(b.getVoidTy(), false);
  llvm::CallInst* call = b.CreateCall(llvm::InlineAsm::get(
      fty, "barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;", "~{memory}", true));
  call->setConvergent();
}

void tma_store_ptx(llvm::IRBuilderBase& b, llvm::Value* map, llvm::Value* src, const std::vector<llvm::Value*>& coords) {
  const std::string r = num(int64_t(coords.size()));
  bulk_tensor_ptx(b, "cp.async.bulk.tensor." + r + "d.global.shared::cta.bulk_group [$0, {", {b.getInt64Ty()},
                  {map_address(b, map)}, "l", coords, ";", src);
}

void MmaIsa::tma_store(llvm::Value* map, llvm::Value* src_off, const std::vector<llvm::Value*>& coords) {
  if (sim_) {  // the hook takes five coordinates, those past the map's rank 0
    std::vector<llvm::Value*> args = {map, smem_at(src_off)};
    for (size_t i = 0; i < 5; ++i) args.push_back(i < coords.size() ? coords[i] : b_.getInt32(0));
    sim_call(19, args);
    return;
  }
  tma_store_ptx(b_, map, shared_addr(src_off), coords);
}

void MmaIsa::bulk_commit() {
  if (sim_) sim_call(20, {});
  else ptx_stmt(b_, "cp.async.bulk.commit_group;");
}

void MmaIsa::bulk_wait(int pending, bool read) {
  if (sim_) sim_call(21, {b_.getInt32(static_cast<uint32_t>(pending)), b_.getInt32(read ? 1 : 0)});
  else ptx_stmt(b_, std::string("cp.async.bulk.wait_group") + (read ? ".read " : " ") + num(pending) + ";");
}

void MmaIsa::store_fence() {
  if (sim_) sim_call(22, {});
  else ptx_stmt(b_, "fence.proxy.async.shared::cta;");
}

void MmaIsa::if_thread0(const std::function<void()>& body) {
  llvm::LLVMContext& c = m_.getContext();
  llvm::BasicBlock* yes = llvm::BasicBlock::Create(c, "t0", fn_);
  llvm::BasicBlock* after = llvm::BasicBlock::Create(c, "t0.done", fn_);
  b_.CreateCondBr(b_.CreateICmpEQ(tid_, k(0)), yes, after);
  b_.SetInsertPoint(yes);
  body();
  b_.CreateBr(after);
  b_.SetInsertPoint(after);
}

void MmaIsa::mbar_arrive(llvm::Value* off) {
  if (sim_) {
    sim_call(14, {smem_operand(off)});
    return;
  }
  mbar_arrive_ptx(b_, smem_operand(off));
}

void MmaIsa::named_barrier(llvm::Value* id, int threads, bool sync) {
  if (sim_) {
    sim_call(15, {b_.CreateZExtOrTrunc(id, i32_), b_.getInt32(static_cast<uint32_t>(threads)), b_.getInt32(sync ? 1 : 0)});
    return;
  }
  named_barrier_ptx(b_, id, threads, sync);
}

void MmaIsa::tma_load(llvm::Value* map, llvm::Value* dst, const std::vector<llvm::Value*>& coords, llvm::Value* bar) {
  if (sim_) {  // the hook takes five coordinates, those past the map's rank 0
    std::vector<llvm::Value*> args = {map, dst};
    for (size_t i = 0; i < 5; ++i) args.push_back(i < coords.size() ? coords[i] : b_.getInt32(0));
    args.push_back(bar);
    sim_call(10, args);
    return;
  }
  tma_load_ptx(b_, map, dst, coords, bar);
}

void MmaIsa::tma_load_multicast(llvm::Value* map, llvm::Value* dst, const std::vector<llvm::Value*>& coords,
                                llvm::Value* bar, int mask) {
  if (sim_) {
    std::vector<llvm::Value*> args = {map, dst};
    for (size_t i = 0; i < 5; ++i) args.push_back(i < coords.size() ? coords[i] : b_.getInt32(0));
    args.push_back(bar);
    args.push_back(b_.getInt32(static_cast<uint32_t>(mask)));
    sim_call(23, args);
    return;
  }
  tma_load_multicast_ptx(b_, map, dst, coords, bar, mask);
}

void MmaIsa::mbar_arrive_cluster(llvm::Value* off, llvm::Value* rank) {
  if (sim_) {
    sim_call(24, {smem_operand(off), b_.CreateZExtOrTrunc(rank, i32_)});
    return;
  }
  mbar_arrive_cluster_ptx(b_, smem_operand(off), rank);
}

void MmaIsa::cluster_sync() {
  if (sim_) sim_call(25, {});
  else cluster_sync_ptx(b_);
}

void MmaIsa::mbar_wait_at(llvm::Value* off, llvm::Value* parity) {
  llvm::LLVMContext& c = m_.getContext();
  llvm::BasicBlock* spin = llvm::BasicBlock::Create(c, "mbar.wait", fn_);
  llvm::BasicBlock* done = llvm::BasicBlock::Create(c, "mbar.done", fn_);
  llvm::Value* bar = smem_operand(off);
  llvm::Value* par = b_.CreateZExtOrTrunc(parity, i32_);
  b_.CreateBr(spin);
  b_.SetInsertPoint(spin);
  llvm::Value* ok;
  if (sim_) {
    auto* fty = llvm::FunctionType::get(i32_, {b_.getPtrTy(), i32_, b_.getPtrTy(), i32_}, false);
    ok = b_.CreateCall(fty, hook_[13], {hook_[0], tid32_, bar, par});
  } else {
    ok = mbar_try_wait_ptx(b_, bar, par);
  }
  b_.CreateCondBr(b_.CreateICmpNE(ok, b_.getInt32(0)), done, spin);
  b_.SetInsertPoint(done);
}

void MmaIsa::commit() {
  if (!sim_) b_.CreateIntrinsic(llvm::Intrinsic::nvvm_cp_async_commit_group, {}, {});
  else sim_call(6, {});
}

void MmaIsa::wait(int pending) {
  if (!sim_)
    b_.CreateIntrinsic(llvm::Intrinsic::nvvm_cp_async_wait_group, {}, {b_.getInt32(static_cast<uint32_t>(pending))});
  else sim_call(7, {b_.getInt32(static_cast<uint32_t>(pending))});
}

void MmaIsa::wgmma_commit() {
  if (!sim_) asm_stmt("wgmma.commit_group.sync.aligned;");
  else sim_call(8, {});
}

void MmaIsa::wgmma_wait(int pending) {
  if (!sim_) asm_stmt("wgmma.wait_group.sync.aligned " + num(pending) + ";");
  else sim_call(9, {b_.getInt32(static_cast<uint32_t>(pending))});
}

void MmaIsa::sim_call(int h, std::vector<llvm::Value*> extra) {
  std::vector<llvm::Type*> types = {b_.getPtrTy(), i32_};
  std::vector<llvm::Value*> args = {hook_[0], tid32_};
  for (llvm::Value* v : extra) {
    types.push_back(v->getType());
    args.push_back(v);
  }
  b_.CreateCall(llvm::FunctionType::get(b_.getVoidTy(), types, false), hook_[h], args);
}

void MmaIsa::set_max_regs(int count, bool inc) {
  if (sim_) sim_call(17, {b_.getInt32(static_cast<uint32_t>(count)), b_.getInt32(inc ? 1 : 0)});
  else setmaxnreg_ptx(b_, count, inc);
}

void MmaIsa::barrier() {
  if (!sim_) {
    b_.CreateIntrinsic(llvm::Intrinsic::nvvm_barrier0, {}, {});
    return;
  }
  auto* fty = llvm::FunctionType::get(b_.getVoidTy(), {b_.getPtrTy()}, false);
  b_.CreateCall(fty, hook_[1], {hook_[0]});
}

std::vector<llvm::Value*> MmaIsa::ldmatrix_x4(llvm::Value* row_ptr, bool trans) {
  std::vector<llvm::Value*> r;
  if (!sim_) {
    llvm::Intrinsic::ID id = trans ? llvm::Intrinsic::nvvm_ldmatrix_sync_aligned_m8n8_x4_trans_b16
                                   : llvm::Intrinsic::nvvm_ldmatrix_sync_aligned_m8n8_x4_b16;
    llvm::Value* v = b_.CreateIntrinsic(id, {row_ptr->getType()}, {row_ptr});
    for (unsigned i = 0; i < 4; ++i) r.push_back(b_.CreateExtractValue(v, {i}));
    return r;
  }
  llvm::Value* out = entry_alloca(llvm::ArrayType::get(i32_, 4));
  auto* fty = llvm::FunctionType::get(b_.getVoidTy(), {b_.getPtrTy(), i32_, b_.getPtrTy(), i32_, b_.getPtrTy()}, false);
  b_.CreateCall(fty, hook_[2], {hook_[0], tid32_, row_ptr, b_.getInt32(trans ? 1 : 0), out});
  for (unsigned i = 0; i < 4; ++i)
    r.push_back(b_.CreateAlignedLoad(i32_, b_.CreateConstInBoundsGEP1_32(i32_, out, i), llvm::Align(4)));
  return r;
}

std::vector<llvm::Value*> MmaIsa::mma(const std::vector<llvm::Value*>& a, const std::vector<llvm::Value*>& bf,
                              const std::vector<llvm::Value*>& c) {
  const bool f16 = p_.dtype == DType::F16;
  const bool tf32 = p_.dtype == DType::F32;
  std::vector<llvm::Value*> d;
  if (!sim_) {
    std::vector<llvm::Value*> args;
    llvm::Type* h2 = llvm::FixedVectorType::get(b_.getHalfTy(), 2);
    for (llvm::Value* v : a) args.push_back(f16 ? b_.CreateBitCast(v, h2) : v);
    for (llvm::Value* v : bf) args.push_back(f16 ? b_.CreateBitCast(v, h2) : v);
    for (llvm::Value* v : c) args.push_back(v);
    llvm::Intrinsic::ID id = tf32  ? llvm::Intrinsic::nvvm_mma_m16n8k8_row_col_tf32
                             : f16 ? llvm::Intrinsic::nvvm_mma_m16n8k16_row_col_f32_f32
                                   : llvm::Intrinsic::nvvm_mma_m16n8k16_row_col_bf16;
    llvm::Value* v = b_.CreateIntrinsic(id, {}, args);
    for (unsigned i = 0; i < 4; ++i) d.push_back(b_.CreateExtractValue(v, {i}));
    return d;
  }
  llvm::Value* av = entry_alloca(llvm::ArrayType::get(i32_, 4));
  llvm::Value* bv = entry_alloca(llvm::ArrayType::get(i32_, 2));  // TF32 fills all four and both
  llvm::Value* cv = entry_alloca(llvm::ArrayType::get(f32_, 4));
  for (unsigned i = 0; i < 4; ++i) b_.CreateAlignedStore(a[i], b_.CreateConstInBoundsGEP1_32(i32_, av, i), llvm::Align(4));
  for (unsigned i = 0; i < 2; ++i) b_.CreateAlignedStore(bf[i], b_.CreateConstInBoundsGEP1_32(i32_, bv, i), llvm::Align(4));
  for (unsigned i = 0; i < 4; ++i) b_.CreateAlignedStore(c[i], b_.CreateConstInBoundsGEP1_32(f32_, cv, i), llvm::Align(4));
  auto* fty = llvm::FunctionType::get(b_.getVoidTy(),
                                      {b_.getPtrTy(), i32_, i32_, b_.getPtrTy(), b_.getPtrTy(), b_.getPtrTy()}, false);
  b_.CreateCall(fty, hook_[3], {hook_[0], tid32_, b_.getInt32(tf32 ? 2 : f16 ? 1 : 0), av, bv, cv});
  for (unsigned i = 0; i < 4; ++i)
    d.push_back(b_.CreateAlignedLoad(f32_, b_.CreateConstInBoundsGEP1_32(f32_, cv, i), llvm::Align(4)));
  return d;
}

llvm::Value* MmaIsa::entry_alloca(llvm::Type* t) {
  llvm::IRBuilderBase::InsertPointGuard guard(b_);
  llvm::BasicBlock& entry = fn_->getEntryBlock();
  b_.SetInsertPoint(&entry, entry.getFirstInsertionPt());
  return b_.CreateAlloca(t);
}

void MmaIsa::asm_stmt(const std::string& text) {
  if (!sim_) ptx_stmt(b_, text);
}

llvm::Value* MmaIsa::shared_addr(llvm::Value* off) {
  llvm::Value* o = b_.CreateZExtOrTrunc(off, i32_);
  if (sim_) return o;
  return b_.CreateAdd(b_.CreatePtrToInt(smem_, i32_), o);
}

llvm::Value* MmaIsa::descriptor(llvm::Value* addr, int64_t lbo, int64_t sbo) { return wgmma_descriptor(b_, addr, lbo, sbo); }

std::vector<llvm::Value*> MmaIsa::wgmma(llvm::Value* da, llvm::Value* db, std::vector<llvm::Value*> d) {
  const bool f16 = p_.dtype == DType::F16, tf32 = p_.dtype == DType::F32;
  const int trans_a = t_.a_kc ? 0 : 1, trans_b = t_.b_kc ? 0 : 1;
  const size_t n = d.size();
  if (sim_) {
    llvm::Value* buf = entry_alloca(llvm::ArrayType::get(f32_, n));
    for (size_t i = 0; i < n; ++i)
      b_.CreateAlignedStore(d[i], b_.CreateConstInBoundsGEP1_64(f32_, buf, i), llvm::Align(4));
    const int32_t mode = (f16 ? 1 : 0) | trans_a << 1 | trans_b << 2 | (tf32 ? 8 : 0) | t_.bn << 8;
    llvm::Type* ptr = b_.getPtrTy();
    auto* fty = llvm::FunctionType::get(b_.getVoidTy(), {ptr, i32_, b_.getInt64Ty(), b_.getInt64Ty(), i32_, ptr}, false);
    b_.CreateCall(fty, hook_[4], {hook_[0], tid32_, da, db, b_.getInt32(static_cast<uint32_t>(mode)), buf});
    for (size_t i = 0; i < n; ++i)
      d[i] = b_.CreateAlignedLoad(f32_, b_.CreateConstInBoundsGEP1_64(f32_, buf, i), llvm::Align(4));
    return d;
  }
  return wgmma_inline(b_, {}, da, db, std::move(d), tf32 ? "tf32" : f16 ? "f16" : "bf16", trans_a, trans_b);
}

}  // namespace sf::matmul_detail
