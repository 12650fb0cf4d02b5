// The reduction emitter's NVPTX kernel: rows held in registers or read per pass, block reductions.
#include "codegen/kernels/reduction_internal.h"

#include <llvm/IR/GlobalVariable.h>
#include <llvm/IR/IntrinsicsNVPTX.h>

#include "codegen/kernels/matmul_split_k.h"

namespace sf::reduction_detail {

namespace {

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
    // i32 index arithmetic where every value formed fits (indices below numel(X), rows
    // or any value of the group, as a sliced operand, plus one block or grid of slack):
    // half the registers, cheaper division.
    int64_t largest = std::max({numel(p_.x), p_.rows, kernels::largest_value(g_)});
    if (p_.split > 1) largest += p_.share;  // a share's end, past the row's
    it_ = largest + 2048 + int64_t{cfg_.max_blocks} * cfg_.rows_per_block < (int64_t{1} << 31) ? b_.getInt32Ty() : b_.getInt64Ty();
    llvm::Value *tid = nullptr, *bid = nullptr, *nblocks = nullptr;
    split_ = nullptr;
    std::vector<llvm::Value*> in, out;
    if (!simulate_) {
      llvm::Type* gptr = llvm::PointerType::get(c, 1);  // addrspace(1): global memory
      const size_t nargs = np + no + (p_.split > 1 ? 1 : 0);  // a split's workspace last
      auto* fty = llvm::FunctionType::get(b_.getVoidTy(), std::vector<llvm::Type*>(nargs, gptr), false);
      fn_ = llvm::Function::Create(fty, llvm::Function::ExternalLinkage, spec_.entry, m_);
      llvmb::mark_kernel(*fn_, static_cast<int>(block_threads(cfg_)));
      for (size_t i = 0; i < np + no; ++i) {
        llvm::Argument* a = fn_->getArg(static_cast<unsigned>(i));
        a->setName(i < np ? "in" + std::to_string(i) : "out" + std::to_string(i - np));
        if (i < np) a->addAttr(llvm::Attribute::ReadOnly);
        (i < np ? in : out).push_back(a);
      }
      if (p_.split > 1) {
        ws_ = fn_->getArg(static_cast<unsigned>(np + no));
        ws_->setName("workspace");
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
      if (p_.split > 1)
        ws_ = b_.CreateAlignedLoad(ptr, b_.CreateConstInBoundsGEP1_64(ptr, fn_->getArg(0), np + no), llvm::Align(8));
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
      hook_trace_ = field(4);
    }
    fn_->setDoesNotThrow();
    start(std::move(in), std::move(out));

    const int tpr = cfg_.threads_per_row, rpb = cfg_.rows_per_block;
    tid32_ = b_.CreateTrunc(tid, b_.getInt32Ty());
    if (p_.outer) {
      // Rows fastest: a warp's lanes read neighbouring rows, which are neighbours in
      // memory (Plan::outer).
      sub_ = b_.CreateURem(tid, k(rpb), "row.in.block");
      lr_ = b_.CreateUDiv(tid, k(rpb), "thread.in.row");
    } else {
      sub_ = b_.CreateUDiv(tid, k(tpr), "row.in.block");
      lr_ = b_.CreateURem(tid, k(tpr), "thread.in.row");
    }
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
    // Split rows: block y folds the row's elements [y * share, (y + 1) * share).
    llvm::Value* lo = k(0);
    if (split_) {
      lo = b_.CreateMul(split_, k(p_.share), "share.lo", true, true);
      llvm::Value* hi = b_.CreateBinaryIntrinsic(llvm::Intrinsic::smin, b_.CreateAdd(lo, k(p_.share), "", true, true), k(p_.n));
      nloop = b_.CreateSelect(valid, hi, k(0), "row.elems");
    }
    llvm::Value* jfirst = b_.CreateAdd(lo, lr_, "", true, true);
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
            ? emit_loop(b_, jfirst, nloop, k(tpr), "j",
                        [&](llvm::Value* j) {
                          llvm::Value* i = x_index(j);
                          trace(i);
                          return fold_element(pass, part, i);
                        })
            // `vector` adjacent elements per thread and step (contiguous rows, vector
            // dividing n), each param read in dense runs loaded once per step.
            : emit_loop(b_, b_.CreateAdd(lo, b_.CreateMul(lr_, k(vector), "", true, true), "", true, true), nloop,
                        k(int64_t{tpr} * vector), "j",
                        [&](llvm::Value* j) -> Result<void> {
                          std::map<std::string, std::vector<Elem>> lanes;
                          llvm::Value* i = x_index(j);
                          trace(i);
                          set_vector_slots(i, vector, lanes);
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
      if (split_)
        if (Result<void> r = meet_shares(pass, vals, grp, valid, rowc); !r) return r;
      for (size_t q = 0; q < pass.size(); ++q) prog_->set_reduced(pass[q], folds_.at(pass[q]).finish(vals[q], p_.n));
    }

    if (Result<void> r = store_row_outputs(valid, rowc); !r) return r;
    if (shares_met_) {
      // The blocks that were not the group's last come here straight from the count.
      b_.CreateBr(shares_met_);
      b_.SetInsertPoint(shares_met_);
      shares_met_ = nullptr;
    }
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
    for (size_t q = 0; q < ro->size(); ++q) cg_->store((*ro)[q], out_[p_.row_outputs[q]], rowc);
    b_.CreateBr(done);
    b_.SetInsertPoint(done);
    return {};
  }

  // Split rows (Plan::split): the row's first thread stores this share's partials in
  // the workspace, and the block counts itself in on group `grp`'s counter (the
  // fence-count protocol of split-K, matmul_split_k.h). Blocks that are not the
  // group's last go on at shares_met_, after the row's stores; in the last, the row's
  // first thread takes every share's partials back in share order (0, 1, ...), so
  // the row's value is the same whichever block came last.
  Result<void> meet_shares(const std::vector<ValueId>& pass, std::vector<llvm::Value*>& vals, llvm::Value* grp,
                           llvm::Value* valid, llvm::Value* rowc) {
    llvm::LLVMContext& c = m_.getContext();
    llvm::Value* first = b_.CreateAnd(valid, b_.CreateICmpEQ(lr_, k(0)), "row.first");
    llvm::BasicBlock* st = llvm::BasicBlock::Create(c, "share.store", fn_);
    llvm::BasicBlock* stored = llvm::BasicBlock::Create(c, "share.stored", fn_);
    b_.CreateCondBr(first, st, stored);
    b_.SetInsertPoint(st);
    for (size_t q = 0; q < pass.size(); ++q)
      b_.CreateAlignedStore(vals[q], partial(q, split_, rowc), slot_align(vals[q]->getType()));
    b_.CreateBr(stored);
    b_.SetInsertPoint(stored);

    shares_met_ = llvm::BasicBlock::Create(c, "shares.met", fn_);
    matmul_detail::SplitKWorkspace ws;
    ws.b = &b_;
    ws.fn = fn_;
    ws.ws = ws_;
    ws.sums = p_.ws_partials / 4;  // the counters start after the partials (in f32 words)
    ws.item = grp;
    ws.tid = tid32_;
    ws.flag = b_.CreateConstInBoundsGEP1_64(b_.getInt8Ty(), smem_, static_cast<uint64_t>(p_.flag_offset));
    ws.split = p_.split;
    ws.host = simulate_;
    ws.barrier = [this] { barrier(); };
    llvm::BasicBlock* met = shares_met_;
    ws.leave = [this, met] { b_.CreateBr(met); };
    ws.arrive();

    // The group's last block: the row's first thread folds the shares in order and
    // zeroes them behind it; the row's other threads keep their own (unused) values.
    llvm::BasicBlock* from = b_.GetInsertBlock();
    llvm::BasicBlock* take = llvm::BasicBlock::Create(c, "shares.take", fn_);
    llvm::BasicBlock* taken = llvm::BasicBlock::Create(c, "shares.taken", fn_);
    b_.CreateCondBr(first, take, taken);
    b_.SetInsertPoint(take);
    std::vector<llvm::AllocaInst*> acc;
    for (size_t q = 0; q < pass.size(); ++q) {
      acc.push_back(entry_alloca(vals[q]->getType(), "shares"));
      b_.CreateStore(folds_.at(pass[q]).identity(), acc.back());
    }
    // A loop, not unrolled code: a split may have up to 65535 shares.
    Result<void> looped = emit_loop(b_, k(0), k(p_.split), k(1), "share", [&](llvm::Value* s) -> Result<void> {
      for (size_t q = 0; q < pass.size(); ++q) {
        llvm::Type* t = vals[q]->getType();
        const llvm::Align align = slot_align(t);
        llvm::Value* at = partial(q, s, rowc);
        llvm::Value* v = b_.CreateAlignedLoad(t, at, align, /*isVolatile=*/true);
        b_.CreateAlignedStore(llvm::Constant::getNullValue(t), at, align);
        b_.CreateStore(folds_.at(pass[q]).combine(b_.CreateLoad(t, acc[q]), v), acc[q]);
      }
      return {};
    });
    if (!looped) return looped;
    std::vector<llvm::Value*> total;
    for (size_t q = 0; q < pass.size(); ++q) total.push_back(b_.CreateLoad(vals[q]->getType(), acc[q]));
    llvm::BasicBlock* took = b_.GetInsertBlock();
    b_.CreateBr(taken);
    b_.SetInsertPoint(taken);
    for (size_t q = 0; q < pass.size(); ++q) {
      llvm::PHINode* phi = b_.CreatePHI(vals[q]->getType(), 2);
      phi->addIncoming(total[q], took);
      phi->addIncoming(vals[q], from);
      vals[q] = phi;
    }
    return {};
  }

  // A partial's alignment in its 8-byte slot: its store size (f32, or an integer fold's
  // i32 or i64).
  llvm::Align slot_align(llvm::Type* t) const { return llvm::Align(m_.getDataLayout().getTypeStoreSize(t).getFixedValue()); }

  // The workspace slot of reduction `q`'s partial of share `s` for row `row` (8 bytes
  // each, reduction-major, then share, then row).
  llvm::Value* partial(size_t q, llvm::Value* s, llvm::Value* row) {
    llvm::Type* i64 = b_.getInt64Ty();
    llvm::Value* at = b_.CreateAdd(
        b_.CreateMul(b_.CreateAdd(b_.getInt64(static_cast<uint64_t>(q) * static_cast<uint64_t>(p_.split)),
                                  b_.CreateZExt(s, i64), "", true, true),
                     b_.getInt64(static_cast<uint64_t>(std::max<int64_t>(p_.rows, 1))), "", true, true),
        b_.CreateZExt(row, i64), "", true, true);
    return b_.CreateInBoundsGEP(i64, ws_, at);
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
      trace(first.back());
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
        Result<Elem> e = prog_->x_output(v, kernels::dense_index(g_.node(v).type.shape));
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
    if (p_.outer) return outer_reduce(pass, vals, slot0);
    const int width = std::min(cfg_.threads_per_row, 32);
    for (int off = width / 2; off >= 1; off /= 2)
      for (size_t q = 0; q < pass.size(); ++q) vals[q] = folds_.at(pass[q]).combine(vals[q], shuffle(vals[q], off));
    if (p_.warps_per_row == 1) return;
    // Lane 0 of each warp writes slot warp of the row's warps_per_row.
    const int wpr = p_.warps_per_row;
    llvm::Value* row_slots = b_.CreateMul(sub_, k(wpr), "row.slots", true, true);
    combine_in_shared(pass, vals, slot0, b_.CreateICmpEQ(lane_, k(0)), b_.CreateAdd(row_slots, warp_, "", true, true),
                      row_slots, 1, wpr);
  }

  // An outer reduction's block_reduce: the row's lanes within a warp (outer_lanes of
  // them, rows_per_block apart) by a butterfly, then the row_slots partials left
  // through shared memory (slot s of row r at s * rows_per_block + r: a warp's 32
  // rows in 32 consecutive words).
  void outer_reduce(const std::vector<ValueId>& pass, std::vector<llvm::Value*>& vals, size_t slot0) {
    const int rpb = cfg_.rows_per_block;
    for (int off = p_.outer_lanes / 2; off >= 1; off /= 2)
      for (size_t q = 0; q < pass.size(); ++q)
        vals[q] = folds_.at(pass[q]).combine(vals[q], shuffle(vals[q], off * rpb));
    if (p_.row_slots == 1) return;
    llvm::Value* mine = b_.CreateUDiv(lr_, k(p_.outer_lanes), "row.slot");
    combine_in_shared(pass, vals, slot0, b_.CreateICmpEQ(b_.CreateURem(lr_, k(p_.outer_lanes)), k(0)),
                      b_.CreateAdd(b_.CreateMul(mine, k(rpb), "", true, true), sub_, "", true, true), sub_, rpb,
                      p_.row_slots);
  }

  // The row's partials through shared memory: the threads where `writer` holds store
  // theirs at slot `at`, one barrier, then every thread combines the row's `count`
  // slots base, base + stride, ... in that order, so all end with the same value.
  void combine_in_shared(const std::vector<ValueId>& pass, std::vector<llvm::Value*>& vals, size_t slot0,
                         llvm::Value* writer, llvm::Value* at, llvm::Value* base, int64_t stride, int count) {
    llvm::LLVMContext& c = m_.getContext();
    llvm::BasicBlock* st = llvm::BasicBlock::Create(c, "slot.store", fn_);
    llvm::BasicBlock* done = llvm::BasicBlock::Create(c, "slot.stored", fn_);
    b_.CreateCondBr(writer, st, done);
    b_.SetInsertPoint(st);
    for (size_t q = 0; q < pass.size(); ++q) b_.CreateStore(vals[q], slot_ptr(slot0 + q, vals[q]->getType(), at));
    b_.CreateBr(done);
    b_.SetInsertPoint(done);
    barrier();
    for (size_t q = 0; q < pass.size(); ++q) {
      llvm::Type* t = vals[q]->getType();
      llvm::Value* r = b_.CreateLoad(t, slot_ptr(slot0 + q, t, base));
      for (int s = 1; s < count; ++s)
        r = folds_.at(pass[q]).combine(r, b_.CreateLoad(t, slot_ptr(slot0 + q, t, b_.CreateAdd(base, k(s * stride), "", true, true))));
      vals[q] = r;
    }
  }

  llvm::Value* slot_ptr(size_t red, llvm::Type* t, llvm::Value* index) {
    llvm::Value* base = b_.CreateConstInBoundsGEP1_64(b_.getInt8Ty(), smem_, static_cast<uint64_t>(p_.smem_offset[red]));
    return b_.CreateInBoundsGEP(t, base, index);
  }

  // Simulation only: reports X index `i` to the trace hook, where one is set.
  void trace(llvm::Value* i) {
    if (!simulate_) return;
    llvm::LLVMContext& c = m_.getContext();
    llvm::BasicBlock* call = llvm::BasicBlock::Create(c, "trace", fn_);
    llvm::BasicBlock* done = llvm::BasicBlock::Create(c, "traced", fn_);
    b_.CreateCondBr(b_.CreateIsNotNull(hook_trace_), call, done);
    b_.SetInsertPoint(call);
    auto* fty = llvm::FunctionType::get(b_.getVoidTy(), {b_.getPtrTy(), b_.getInt32Ty(), b_.getInt64Ty()}, false);
    b_.CreateCall(fty, hook_trace_, {hook_ctx_, tid32_, b_.CreateSExt(i, b_.getInt64Ty())});
    b_.CreateBr(done);
    b_.SetInsertPoint(done);
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
  llvm::Value* split_ = nullptr;  // blockIdx.y when the rows are split over blocks (Plan::split)
  llvm::Value* ws_ = nullptr;     // the split's workspace (the kernel's last argument)
  llvm::BasicBlock* shares_met_ = nullptr;  // where a split's blocks meet after the row's stores
  llvm::Value* smem_ = nullptr;
  llvm::Value *hooks_ = nullptr, *hook_ctx_ = nullptr, *hook_barrier_ = nullptr, *hook_shfl_ = nullptr,
              *hook_trace_ = nullptr;
  llvm::Value *tid32_ = nullptr, *sub_ = nullptr, *lr_ = nullptr, *warp_ = nullptr, *lane_ = nullptr;
};

}  // namespace

Result<void> build_nvptx(const KernelSpec& spec, const KernelConfig& cfg, const Plan& plan, const llvmb::Target& target,
                         llvm::Module& m, bool simulate) {
  return NvptxBuilder(spec, cfg, plan, target, m, simulate).build();
}

}  // namespace sf::reduction_detail
