// The tensor-core matmul's epilogue: matmul_mma_epilogue.h says which path a kernel
// takes; docs/kernels.md ("Outputs") draws the staged one.
#include "codegen/kernels/matmul_mma_epilogue.h"

#include <algorithm>
#include <tuple>

#include <llvm/IR/Constants.h>
#include <llvm/IR/Function.h>
#include <llvm/IR/LLVMContext.h>

#include "codegen/kernels/matmul_group.h"
#include "codegen/kernels/matmul_split_k.h"

namespace sf::matmul_detail {

namespace {

constexpr int64_t kChunkPad = 16;  // bytes after each row of a chunked staging area

class Epilogue {
 public:
  Epilogue(MmaEpilogueFrame& f) : f_(f), b_(*f.b), p_(*f.p), t_(*f.t), area_cols_(t_.ni * 8) {}

  Result<void> emit(const std::vector<llvm::Value*>& acc_in) {
    MatmulEpilogue epi(*f_.g, p_, *f_.cg, f_.in);
    g_ = b_.CreateLShr(f_.lane, k(2));
    tig2_ = mul(b_.CreateAnd(f_.lane, k(3)), 2);
    std::vector<llvm::Value*> acc = acc_in;
    if (t_.split > 1 && !t_.split_ws) {
      each_piece(1, [&](const Piece& pc) {
        add_f32_atomic(b_, f_.fn, pc.ok, f_.out[0], pc.flat, acc[pc.acc]);  // the zeroed output
        return Result<void>();
      });
      finish();
      return {};
    }
    if (t_.split_ws) acc = arrive(acc);
    if (t_.chunk_off >= 0 && f_.warp_barrier) {
      // Misaligned outputs too: write_back tests each one's alignment.
      if (Result<void> r = staged_chunks(epi, acc); !r) return r;
      finish();
      return {};
    }
    if (!mma_staging_unfit(*f_.g, p_, t_)) {
      llvm::LLVMContext& c = b_.getContext();
      // Every warp is past its last read of the pipeline's shared memory (and, with
      // TMA, every copy into it has completed: the consumers waited for each).
      f_.barrier();
      llvm::BasicBlock* staged = llvm::BasicBlock::Create(c, "epi.staged", f_.fn);
      llvm::BasicBlock* direct = llvm::BasicBlock::Create(c, "epi.direct", f_.fn);
      b_.CreateCondBr(aligned16(), staged, direct);
      b_.SetInsertPoint(staged);
      if (Result<void> r = stage(epi, acc); !r) return r;
      f_.barrier();  // the warp's chunks are in shared memory (a block barrier: the simulation has no warp one)
      write_back();
      finish();
      b_.SetInsertPoint(direct);
    }
    if (Result<void> r = direct_stores(epi, acc); !r) return r;
    finish();
    return {};
  }

 private:
  llvm::Value* k(int64_t v) { return llvm::ConstantInt::get(f_.it, static_cast<uint64_t>(v)); }
  llvm::Value* add(llvm::Value* x, llvm::Value* y) { return b_.CreateAdd(x, y, "", true, true); }
  llvm::Value* mul(llvm::Value* x, int64_t s) { return s == 1 ? x : b_.CreateMul(x, k(s), "", true, true); }
  void finish() {
    if (f_.exit) b_.CreateBr(f_.exit);
    else b_.CreateRetVoid();
  }
  llvm::Value* guard(llvm::Value* ok) { return f_.active ? b_.CreateAnd(f_.active, ok) : ok; }

  // The fragment rows (accumulator element i's row: lane / 4, + 8 for c2 and c3, per
  // m step) and the row's columns, mma_layout.h's mma_c_elem.
  llvm::Value* frag_row(int i, int half) { return add(add(add(f_.m0, f_.wm0), g_), k(i * t_.m_step + half * 8)); }
  llvm::Value* frag_col(int j) { return add(add(add(f_.n0, f_.wn0), tig2_), k(j * 8)); }

  // One piece of the fragments: an accumulator element (width 1) or a fragment row's
  // two adjacent columns (width 2, the first even), with O's coordinates, flat index
  // and bounds (with N even, col < N covers col + 1 too), and the local row in the
  // warp's tile (i * 16 + half * 8 + lane / 4) for the staging area. A pair also has
  // `safe` coordinates: row and column clamped into O (the column to N - 2, the
  // pair's first), the same as the real ones wherever `ok`. The epilogue's values at
  // them can be computed without a branch, every load in bounds (a piece outside O
  // computes values it never stores), so that the two fragment rows' loads of one
  // bias column are one load, and a batch of pairs is straight-line code.
  struct Piece {
    size_t acc = 0;  // accumulator index of the (first) element
    llvm::Value *ok = nullptr, *flat = nullptr, *col = nullptr, *local_row = nullptr;
    int i = 0, half = 0, j = 0;
    std::vector<llvm::Value*> coords;
    std::vector<llvm::Value*> safe;  // width 2 only
    llvm::Value* safe_flat = nullptr;
  };
  using PieceFn = std::function<Result<void>(const Piece&)>;
  Result<void> each_piece(int width, const PieceFn& fn) {
    for (int i = 0; i < t_.mi; ++i)
      for (int half = 0; half < 2; ++half)
        for (int j = 0; j < t_.ni; ++j)
          for (int e = 0; e < 2; e += width)
            if (Result<void> r = fn(piece(i, half, j, e, width)); !r) return r;
    return {};
  }
  // The piece at accumulator (i, j, half, e). The row's values repeat for each of the
  // row's pieces; LLVM folds the copies.
  Piece piece(int i, int half, int j, int e, int width) {
    llvm::Value* row = frag_row(i, half);
    llvm::Value* row_ok = b_.CreateICmpSLT(row, k(p_.M));
    Piece pc;
    pc.acc = acc_index(i, j, half, e);
    pc.i = i;
    pc.half = half;
    pc.j = j;
    pc.col = add(frag_col(j), k(e));
    pc.coords = f_.batch_coords;
    pc.coords.push_back(row);
    pc.coords.push_back(pc.col);
    pc.ok = guard(b_.CreateAnd(row_ok, b_.CreateICmpSLT(pc.col, k(p_.N))));
    pc.flat = add(add(f_.zbase, mul(row, p_.N)), pc.col);
    pc.local_row = add(g_, k(i * 16 + half * 8));
    if (width == 2) {
      llvm::Value* srow = b_.CreateBinaryIntrinsic(llvm::Intrinsic::smin, row, k(p_.M - 1));
      llvm::Value* scol = b_.CreateBinaryIntrinsic(llvm::Intrinsic::smin, pc.col, k(p_.N - 2));
      pc.safe = f_.batch_coords;
      pc.safe.push_back(srow);
      pc.safe.push_back(scol);
      pc.safe_flat = add(add(f_.zbase, mul(srow, p_.N)), scol);
    }
    return pc;
  }
  size_t acc_index(int i, int j, int half, int e) const {
    return static_cast<size_t>((i * t_.ni + j) * 4 + half * 2 + e);
  }

  // Split-K in the workspace (matmul_split_k.h, the threadFenceReduction pattern):
  // every block adds its partial sums and counts itself in; the last block takes the
  // totals back as its accumulators and goes on to the epilogue, the others leave.
  std::vector<llvm::Value*> arrive(const std::vector<llvm::Value*>& acc) {
    SplitKWorkspace w;
    w.b = &b_;
    w.fn = f_.fn;
    w.ws = f_.ws;
    w.sums = std::max<int64_t>(p_.nbatch, 1) * p_.M * p_.N;
    w.item = f_.item;
    w.tid = f_.tid;
    w.flag = f_.flag;
    w.split = t_.split;
    w.host = f_.host;
    w.barrier = f_.split_barrier;
    w.leave = [this] { finish(); };
    std::vector<llvm::Value*> total(acc.size(), llvm::ConstantFP::get(b_.getFloatTy(), 0.0));
    if (p_.N % 2 == 0) {
      // A fragment row's two adjacent columns (the first even, so with N even the
      // pair's flat index is even and its 8 bytes aligned) as one access each way.
      each_piece(2, [&](const Piece& pc) {
        w.add_pair(pc.ok, pc.flat, acc[pc.acc], acc[pc.acc + 1]);
        return Result<void>();
      });
      w.arrive();
      each_piece(2, [&](const Piece& pc) {
        std::tie(total[pc.acc], total[pc.acc + 1]) = w.take_pair(pc.ok, pc.flat);
        return Result<void>();
      });
      return total;
    }
    each_piece(1, [&](const Piece& pc) {
      w.add(pc.ok, pc.flat, acc[pc.acc]);
      return Result<void>();
    });
    w.arrive();
    each_piece(1, [&](const Piece& pc) {
      total[pc.acc] = w.take(pc.ok, pc.flat);
      return Result<void>();
    });
    return total;
  }

  // The direct path: with N even, each fragment row's two adjacent columns (the first
  // even) as one 2-element access per output where every output pointer is aligned
  // to two elements (one uniform test), else one element at a time.
  //
  // The pairs go in batches (batch_pairs): the loads of an epilogue input (a bias)
  // cannot pass a store before them, which may write the same memory, so a pair's
  // load placed after the previous pair's stores waits its whole latency before the
  // pair's math can start, 64 times a thread in a 128 x 256 tile. Each batch's values
  // are computed before the previous batch is stored, and a batch holds both fragment
  // rows (half 0 and 1) of its columns, which read one bias element: loaded once.
  Result<void> direct_stores(MatmulEpilogue& epi, const std::vector<llvm::Value*>& acc) {
    llvm::Value* aligned = p_.N % 2 == 0 ? epi.pairs_aligned(f_.out) : nullptr;
    if (!aligned)
      return each_piece(1, [&](const Piece& pc) {
        return epi.store_element(f_.fn, pc.ok, pc.coords, pc.flat, acc[pc.acc], f_.out);
      });
    return batched_pairs(epi, acc, [&](const Piece& pc, const std::vector<MatmulEpilogue::PairValue>& v) {
      epi.store_pair_values(f_.fn, pc.ok, pc.flat, v, f_.out, aligned);
    });
  }

  // Every fragment pair through the epilogue in batches of
  // MmaTiling::epilogue_batch_columns() n8 tiles of both fragment rows, each batch's
  // values computed (at the pieces' safe coordinates, straight-line code) before
  // `store` takes the previous batch's.
  using StorePair = std::function<void(const Piece&, const std::vector<MatmulEpilogue::PairValue>&)>;
  // `jlo`, `jhi`: the n8 tiles [jlo, jhi) only (-1: to the last).
  Result<void> batched_pairs(MatmulEpilogue& epi, const std::vector<llvm::Value*>& acc, const StorePair& store,
                             int jlo = 0, int jhi = -1) {
    if (jhi < 0) jhi = t_.ni;
    using Batch = std::vector<std::pair<Piece, std::vector<MatmulEpilogue::PairValue>>>;
    Batch last;
    auto flush = [&] {
      for (const auto& [pc, v] : last) store(pc, v);
    };
    const int per = std::min(jhi - jlo, t_.epilogue_batch_columns());
    for (int i = 0; i < t_.mi; ++i)
      for (int j0 = jlo; j0 < jhi; j0 += per) {
        Batch batch;
        for (int half = 0; half < 2; ++half)
          for (int j = j0; j < std::min(jhi, j0 + per); ++j) {
            Piece pc = piece(i, half, j, 0, 2);
            Result<std::vector<MatmulEpilogue::PairValue>> v =
                epi.pair_values(pc.safe, pc.safe_flat, acc[pc.acc], acc[pc.acc + 1]);
            if (!v) return v.error();
            batch.emplace_back(std::move(pc), std::move(*v));
          }
        flush();
        last = std::move(batch);
      }
    flush();
    return {};
  }

  // ---- the staged paths ----

  // A warp's staging area: area_cols_ columns from the n8 tile j0_ of its rows_w
  // accumulator rows (local row lr = i * 16 + half * 8 + lane / 4, local column lc =
  // (j - j0_) * 8 + 2 * (lane % 4) + e), one area per output, each row `row_bytes(o)`
  // long in 16-byte chunks, chunk ch of row lr at ch ^ (lr % 8) (fewer bits for rows
  // under 8 chunks): a fragment store's eight rows hit eight chunks, and a read's
  // eight lanes one row's eight. The whole staged path: the warp's whole tile
  // (area_cols_ = ni * 8) at the start of the pipeline's memory. In chunks:
  // chunk_cols at a time at chunk_off, and rows padded by 16 bytes instead of
  // swizzled (kChunkPad): a fragment store's eight rows then start 4 banks apart
  // (conflict-free for 16-bit outputs), and each address is one register plus a
  // constant for every chunk, where the swizzle's XOR makes one register per n8 tile
  // live across the chunks, more than the accumulators leave (168 registers a thread
  // spilled 676 bytes in the 128 x 256 GEMM).
  int rows_w() const { return t_.mi * 16; }
  int64_t out_bytes(size_t o) const {
    return dtype_size(f_.g->node(f_.g->outputs()[o].value).type.dtype);
  }
  int64_t row_bytes(size_t o) const { return area_cols_ * out_bytes(o); }
  int64_t row_stride(size_t o) const { return row_bytes(o) + (padded_ ? kChunkPad : 0); }
  // The byte offset of output o's area within the warp's.
  int64_t area_offset(size_t o) const {
    int64_t off = 0;
    for (size_t q = 0; q < o; ++q) off += int64_t{rows_w()} * row_stride(q);
    return off;
  }
  int64_t warp_bytes() const { return area_offset(f_.out.size()); }
  llvm::Value* chunk_at(size_t o, llvm::Value* lr, llvm::Value* chunk) {
    const int64_t cpr = row_bytes(o) / 16;
    llvm::Value* swz = padded_ ? chunk : b_.CreateXor(chunk, b_.CreateAnd(lr, k(std::min<int64_t>(cpr, 8) - 1)));
    llvm::Value* area = add(mul(f_.warp, warp_bytes()), k(area_base_ + area_offset(o)));
    return add(area, add(mul(lr, row_stride(o)), b_.CreateShl(swz, k(4))));
  }
  llvm::Value* smem_at(llvm::Value* off) { return b_.CreateInBoundsGEP(b_.getInt8Ty(), f_.smem, off); }

  llvm::Value* aligned16() {
    llvm::Value* bits = b_.getInt64(0);
    for (llvm::Value* o : f_.out) bits = b_.CreateOr(bits, b_.CreateAnd(b_.CreatePtrToInt(o, b_.getInt64Ty()), 15));
    return b_.CreateICmpEQ(bits, b_.getInt64(0), "out.aligned16");
  }

  // Every fragment pair through the epilogue (batched_pairs), each in-bounds pair's
  // outputs written to their areas (a packed conversion and one 4- or 8-byte shared
  // store).
  Result<void> stage(MatmulEpilogue& epi, const std::vector<llvm::Value*>& acc, int jhi = -1) {
    llvm::LLVMContext& c = b_.getContext();
    return batched_pairs(epi, acc, [&](const Piece& pc, const std::vector<MatmulEpilogue::PairValue>& v) {
      // A warp's own chunk area takes every piece, out of bounds too (write_back stores
      // only what is inside O): straight-line code.
      llvm::BasicBlock* st = padded_ || boxes_ ? nullptr : llvm::BasicBlock::Create(c, "stage", f_.fn);
      llvm::BasicBlock* next = padded_ || boxes_ ? nullptr : llvm::BasicBlock::Create(c, "stage.next", f_.fn);
      if (st) {
        b_.CreateCondBr(pc.ok, st, next);
        b_.SetInsertPoint(st);
      }
      llvm::Value* lc = add(tig2_, k((pc.j - j0_) * 8));
      for (size_t o = 0; o < v.size(); ++o) {
        const int64_t s = out_bytes(o);
        llvm::Value* byte = mul(lc, s);
        llvm::Value* off = boxes_ ? box_at(o, pc)
                                  : add(chunk_at(o, pc.local_row, b_.CreateLShr(byte, k(4))), b_.CreateAnd(byte, k(15)));
        b_.CreateAlignedStore(f_.cg->narrow_vector(v[o].first.dtype, {v[o].first.value, v[o].second.value}),
                              smem_at(off), llvm::Align(static_cast<uint64_t>(2 * s)));
      }
      if (st) {
        b_.CreateBr(next);
        b_.SetInsertPoint(next);
      }
    }, j0_, jhi);
  }

  // Staged in chunks: chunk_cols columns at a time through the warp's own area, the
  // lanes meeting before reading what the others wrote and before the next chunk
  // overwrites what they read.
  Result<void> staged_chunks(MatmulEpilogue& epi, const std::vector<llvm::Value*>& acc) {
    const int per = t_.chunk_cols / 8;
    area_base_ = t_.chunk_off;
    area_cols_ = t_.chunk_cols;
    if (t_.tma_store) return tma_chunks(epi, acc);
    padded_ = true;
    std::vector<llvm::Value*> aligned;
    for (llvm::Value* o : f_.out)
      aligned.push_back(b_.CreateICmpEQ(b_.CreateAnd(b_.CreatePtrToInt(o, b_.getInt64Ty()), 15), b_.getInt64(0)));
    for (j0_ = 0; j0_ < t_.ni; j0_ += per) {
      if (Result<void> r = stage(epi, acc, j0_ + per); !r) return r;
      f_.warp_barrier();
      write_back(aligned);
      f_.warp_barrier();
    }
    j0_ = 0;
    return {};
  }

  // ---- TMA stores (MmaTiling::tma_store) ----
  // Chunk c of the warp's columns goes through area c % store_bufs: staged by every
  // lane, made visible to the async proxy (each lane's fence.proxy.async, then the
  // warp's barrier), and stored by the first lane, one cp.async.bulk.tensor a box of 16
  // rows x 128 bytes, committed as one bulk group. Before an area is written again,
  // the first lane waits until the group that read it last has read it (.read; at an
  // item's first chunk every group, the last item's included), and the warp meets.
  // The kernel's end waits for every group to complete (MmaKernel).
  Result<void> tma_chunks(MatmulEpilogue& epi, const std::vector<llvm::Value*>& acc) {
    boxes_ = true;
    const int per = t_.chunk_cols / 8;
    // The lane's part of every box address (box_at): its fragment row within 8 rows
    // (lane / 4, bits 7-9) and, swizzled by it, its 16-byte unit's low part and its
    // place in the unit, the same for every piece of the epilogue.
    for (size_t o = 0; o < f_.out.size(); ++o) {
      const int64_t s = out_bytes(o);
      llvm::Value* v = mul(tig2_, s);  // the pair's byte within the n8 tile's 8 x s bytes
      llvm::Value* x = g_;             // the fragment row % 8 (lane / 4)
      llvm::Value* unit = b_.CreateXor(b_.CreateLShr(v, k(4)), x);
      lane_part_.push_back(add(mul(x, 128), add(b_.CreateShl(unit, k(4)), b_.CreateAnd(v, k(15)))));
    }
    warp_area_ = mul(f_.warp, t_.store_bufs * warp_bytes());
    int c = 0;
    for (j0_ = 0; j0_ < t_.ni; j0_ += per, ++c) {
      buf_ = c % t_.store_bufs;
      if (c == 0 || c >= t_.store_bufs) {
        if_lane0([&] { f_.bulk_wait(c == 0 ? 0 : t_.store_bufs - 1, /*read=*/true); });
        f_.warp_barrier();
      }
      if (Result<void> r = stage(epi, acc, j0_ + per); !r) return r;
      f_.store_fence();
      f_.warp_barrier();
      if_lane0([&] { store_boxes(); });
    }
    j0_ = 0;
    return {};
  }

  void if_lane0(const std::function<void()>& body) {
    llvm::LLVMContext& c = b_.getContext();
    llvm::BasicBlock* yes = llvm::BasicBlock::Create(c, "tma.lane0", f_.fn);
    llvm::BasicBlock* after = llvm::BasicBlock::Create(c, "tma.lane0.done", f_.fn);
    b_.CreateCondBr(b_.CreateICmpEQ(f_.lane, k(0)), yes, after);
    b_.SetInsertPoint(yes);
    body();
    b_.CreateBr(after);
    b_.SetInsertPoint(after);
  }

  // The shared byte offset of piece `pc`'s pair of output o in the current area: box
  // (i, unit / 8) of the output's, row (half * 8 + lane / 4) of the box's 16, 16-byte
  // unit (unit % 8) ^ (row % 8) (TMA's 128-byte swizzle), then the pair's byte. The
  // lane's part (lane_part_) keeps bits 4-6 its own unit's low bit XOR its row; the n8
  // tile's units flip them by a constant, and the rest adds whole 1024-byte blocks.
  llvm::Value* box_at(size_t o, const Piece& pc) {
    const int64_t s = out_bytes(o), boxes_per_row = row_bytes(o) / 128;
    const int64_t unit0 = int64_t{pc.j - j0_} * 8 * s / 16;  // the n8 tile's first 16-byte unit
    const int64_t box = int64_t{pc.i} * boxes_per_row + unit0 / 8;
    llvm::Value* swizzled = b_.CreateXor(lane_part_[o], k((unit0 % 8) << 4));
    return add(warp_area_, add(swizzled, k(box_offset(o, box) + pc.half * 1024)));
  }
  // Box `box` of output o in the current area, less the warp's area (warp_area_).
  int64_t box_offset(size_t o, int64_t box) const {
    return area_base_ + buf_ * warp_bytes() + area_offset(o) + box * 2048;
  }

  // The first lane: every box of the current area to its output's tensor map, at the
  // warp's rows of each m step and the chunk's columns (boxes wholly past M or N
  // skipped; TMA writes none of a box's elements outside O), as one bulk group.
  void store_boxes() {
    llvm::LLVMContext& c = b_.getContext();
    for (size_t o = 0; o < f_.out.size(); ++o) {
      const int64_t s = out_bytes(o), boxes_per_row = row_bytes(o) / 128, box_cols = 128 / s;
      for (int i = 0; i < t_.mi; ++i)
        for (int64_t bc = 0; bc < boxes_per_row; ++bc) {
          llvm::Value* row = add(add(f_.m0, f_.wm0), k(int64_t{i} * t_.m_step));
          llvm::Value* col = add(add(f_.n0, f_.wn0), k(int64_t{j0_} * 8 + bc * box_cols));
          llvm::BasicBlock* st = llvm::BasicBlock::Create(c, "tma.box", f_.fn);
          llvm::BasicBlock* next = llvm::BasicBlock::Create(c, "tma.box.next", f_.fn);
          b_.CreateCondBr(b_.CreateAnd(b_.CreateICmpSLT(row, k(p_.M)), b_.CreateICmpSLT(col, k(p_.N))), st, next);
          b_.SetInsertPoint(st);
          const int64_t fixed = box_offset(o, int64_t{i} * boxes_per_row + bc);
          std::vector<llvm::Value*> coords = {b_.CreateZExtOrTrunc(col, b_.getInt32Ty()),
                                              b_.CreateZExtOrTrunc(row, b_.getInt32Ty())};
          if (p_.nbatch > 1) coords.push_back(b_.CreateZExtOrTrunc(f_.batch, b_.getInt32Ty()));
          f_.tma_store(f_.out_maps[o], add(warp_area_, k(fixed)), coords);
          b_.CreateBr(next);
          b_.SetInsertPoint(next);
        }
    }
    f_.bulk_commit();
  }

  // Each output's area back a 16-byte chunk per lane, consecutive lanes on consecutive
  // chunks of a row, each chunk stored with one 128-bit access where it is inside O
  // (N fills whole chunks, so a chunk is all in or all out).
  // `aligned` (staged in chunks): per output, whether its pointer is 16-byte aligned;
  // a chunk of a misaligned one is stored as an element-aligned vector, which the
  // backend splits into element stores. Empty: every output is (the whole staged
  // path's run-time test).
  void write_back(const std::vector<llvm::Value*>& aligned = {}) {
    llvm::LLVMContext& c = b_.getContext();
    llvm::Type* v4 = llvm::FixedVectorType::get(b_.getInt32Ty(), 4);
    for (size_t o = 0; o < f_.out.size(); ++o) {
      const int64_t s = out_bytes(o), cpr = row_bytes(o) / 16, per = 16 / s;
      const int64_t chunks = int64_t{rows_w()} * cpr;  // a multiple of 32
      for (int64_t q = 0; q * 32 < chunks; ++q) {
        llvm::Value* e = add(f_.lane, k(q * 32));
        llvm::Value* lr = b_.CreateLShr(e, k(log2i(cpr)));
        llvm::Value* ch = b_.CreateAnd(e, k(cpr - 1));
        llvm::Value* row = add(add(f_.m0, f_.wm0), add(mul(b_.CreateLShr(lr, k(4)), t_.m_step), b_.CreateAnd(lr, k(15))));
        llvm::Value* col = add(add(f_.n0, f_.wn0), add(mul(ch, per), k(int64_t{j0_} * 8)));
        llvm::Value* ok = guard(b_.CreateAnd(b_.CreateICmpSLT(row, k(p_.M)), b_.CreateICmpSLT(col, k(p_.N))));
        llvm::BasicBlock* st = llvm::BasicBlock::Create(c, "wb", f_.fn);
        llvm::BasicBlock* next = llvm::BasicBlock::Create(c, "wb.next", f_.fn);
        b_.CreateCondBr(ok, st, next);
        b_.SetInsertPoint(st);
        llvm::Value* v = b_.CreateAlignedLoad(v4, smem_at(chunk_at(o, lr, ch)), llvm::Align(16));
        llvm::Value* flat = add(f_.zbase, add(mul(row, p_.N), col));
        llvm::Value* dst = b_.CreateInBoundsGEP(b_.getInt8Ty(), f_.out[o], mul(flat, s));
        if (aligned.empty()) {
          b_.CreateAlignedStore(v, dst, llvm::Align(16));
        } else {
          llvm::BasicBlock* vec = llvm::BasicBlock::Create(c, "wb.v4", f_.fn);
          llvm::BasicBlock* elems = llvm::BasicBlock::Create(c, "wb.elems", f_.fn);
          b_.CreateCondBr(aligned[o], vec, elems);
          b_.SetInsertPoint(vec);
          b_.CreateAlignedStore(v, dst, llvm::Align(16));
          b_.CreateBr(next);
          b_.SetInsertPoint(elems);
          b_.CreateAlignedStore(v, dst, llvm::Align(static_cast<uint64_t>(s)));
        }
        b_.CreateBr(next);
        b_.SetInsertPoint(next);
      }
    }
  }

  MmaEpilogueFrame& f_;
  llvm::IRBuilder<>& b_;
  const MatmulGroup& p_;
  const MmaTiling& t_;
  llvm::Value *g_ = nullptr, *tig2_ = nullptr;
  int64_t area_base_ = 0;  // the staging areas' first byte
  int area_cols_ = 0;      // the columns a warp's area holds
  int j0_ = 0;             // the n8 tile the area's first column belongs to
  bool padded_ = false;    // rows padded by kChunkPad bytes, not swizzled
  // TMA stores: the areas are TMA's boxes (box_at), `buf_` the one being written, the
  // warp's first area and each output's lane part of the addresses.
  bool boxes_ = false;
  int buf_ = 0;
  llvm::Value* warp_area_ = nullptr;
  std::vector<llvm::Value*> lane_part_;
};

// Why the outputs cannot be staged in 16-byte chunks (either staged path), or nullopt
// with `bytes` their element sizes summed.
std::optional<std::string> outputs_unstageable(const Graph& g, const MatmulGroup& p, int64_t& bytes) {
  bytes = 0;
  for (const auto& o : g.outputs()) {
    const int64_t s = dtype_size(g.node(o.value).type.dtype);
    if (s != 2 && s != 4) return "an output of " + num(s) + "-byte elements";
    if ((p.N * s) % 16 != 0) return "N = " + num(p.N) + " does not fill whole 16-byte chunks";
    bytes += s;
  }
  return std::nullopt;
}

// TMA stores (MmaTiling::tma_store): each warp's areas as TMA's boxes, 16 rows of 128
// bytes with the 128-byte swizzle, every box 1024-byte aligned (where the swizzle's
// pattern starts); two areas a warp where they fit beside the pipeline, else one; and
// a tensor map an output, [N, M(, batch)] innermost first, each box 128 bytes of a
// row by 16 rows. "" with `t` placed, or why the outputs cannot be stored so (t unchanged).
std::string tma_store_area(const Graph& g, const MatmulGroup& p, MmaTiling& t, int cols, int64_t rows, int64_t bytes,
                           int64_t max_shared) {
  if (g.outputs().size() > 6)
    return num(int64_t(g.outputs().size())) + " outputs, more than the 6 tensor maps a kernel has left for them";
  std::vector<TensorMapSpec> maps;
  for (size_t o = 0; o < g.outputs().size(); ++o) {
    const DType dt = g.node(g.outputs()[o].value).type.dtype;
    const int64_t s = dtype_size(dt);
    if (dt != DType::BF16 && dt != DType::F16 && dt != DType::F32)
      return "an output of " + std::string(dtype_name(dt)) + " (TMA stores take bf16, f16 and f32)";
    if ((cols * s) % 128 != 0)
      return "a warp's chunk of " + num(cols) + " columns is not whole 128-byte rows of " + num(s) + "-byte elements";
    TensorMapSpec m;
    m.output = static_cast<int>(o);
    m.dtype = dt;
    m.rank = p.nbatch > 1 ? 3 : 2;
    m.dims = {p.N, p.M, std::max<int64_t>(p.nbatch, 1), 1, 1};
    m.strides = {p.N * s, p.M * p.N * s, 0, 0};
    m.box = {static_cast<int>(128 / s), 16, 1, 1, 1};
    maps.push_back(m);
  }
  const int64_t off = (t.shared_bytes + 1023) / 1024 * 1024;
  const int64_t area = int64_t{t.threads / 32} * rows * cols * bytes;  // one area a warp
  const int bufs = off + 2 * area <= max_shared ? 2 : 1;
  if (off + bufs * area > max_shared)
    return "the staging areas (" + num(area) + " bytes) do not fit in shared memory beside the pipeline's " + num(off);
  t.chunk_off = off;
  t.chunk_cols = cols;
  t.shared_bytes = off + bufs * area;
  t.tma_store = true;
  t.store_bufs = bufs;
  t.maps.insert(t.maps.end(), maps.begin(), maps.end());
  return {};
}

}  // namespace

std::optional<std::string> mma_staging_unfit(const Graph& g, const MatmulGroup& p, const MmaTiling& t) {
  if (t.split > 1 && !t.split_ws) return "split-K adds partial sums";
  if (t.persistent && t.ws) return "the persistent producer refills the pipeline's shared memory during the epilogue";
  int64_t bytes = 0;
  if (std::optional<std::string> why = outputs_unstageable(g, p, bytes)) return why;
  const int64_t need = int64_t{t.bm} * t.bn * bytes;
  if (need > t.stages * t.stage_bytes)
    return "the outputs' tiles need " + num(need) + " bytes of shared memory, more than the pipeline's " +
           num(t.stages * t.stage_bytes);
  return std::nullopt;
}

std::string mma_chunk_area(const Graph& g, const MatmulGroup& p, MmaTiling& t, int64_t max_shared) {
  static_assert(kChunkPad == 16);
  if (!t.persistent || !t.ws) return "not a persistent warp-specialised kernel";
  if (t.split > 1 && !t.split_ws) return "split-K adds partial sums";
  // Warp w's barrier is named barrier 4 + w (1 and 2 are ping-pong's turns, 3 split-K's).
  if (t.threads / 32 > 12) return num(t.threads / 32) + " consumer warps, more than the 12 named barriers left";
  int64_t bytes = 0;
  if (std::optional<std::string> why = outputs_unstageable(g, p, bytes)) return *why;
  // 64 columns (128 bytes a bf16 row: one 16-byte chunk a lane over 4 rows), or the
  // whole tile's columns when fewer; a whole number of chunks over the tile, rows of a
  // power of two 16-byte chunks, and the area a whole number of 32-chunk rounds.
  const int cols = std::min(t.ni * 8, 64);
  const int64_t rows = int64_t{t.mi} * 16;
  const std::string shape = "block_n = " + num(t.bn) + " does not split into whole chunks of 16-byte pieces";
  if (t.ni % (cols / 8) != 0) return shape;
  for (const auto& o : g.outputs()) {
    const int64_t cpr = cols * dtype_size(g.node(o.value).type.dtype) / 16;
    if (cpr < 1 || (cpr & (cpr - 1)) != 0 || (rows * cpr) % 32 != 0) return shape;
  }
  if (t.want_tma_store) return tma_store_area(g, p, t, cols, rows, bytes, max_shared);
  const int64_t off = (t.shared_bytes + 127) / 128 * 128;
  const int64_t area = int64_t{t.threads / 32} * rows * (cols * bytes + kChunkPad * static_cast<int64_t>(g.outputs().size()));
  if (off + area > max_shared)
    return "the staging areas (" + num(area) + " bytes) do not fit in shared memory beside the pipeline's " + num(off);
  t.chunk_off = off;
  t.chunk_cols = cols;
  t.shared_bytes = off + area;
  return {};
}

std::string mma_epilogue_path(const Graph& g, const MatmulGroup& p, const KernelConfig& c, int sm, bool wgmma_arch) {
  Result<MmaTiling> t = mma_tiling(p, c, sm, wgmma_arch);
  if (!t) return {};
  const std::string no_chunks = mma_chunk_area(g, p, *t, max_shared_bytes(sm));
  if (t->split > 1 && !t->split_ws) return {};  // split_k's clause says where the sums go
  if (t->tma_store)
    return ", epilogue staged through each consumer warp's own shared memory " + num(t->chunk_cols) + " columns at a time (" +
           num(t->store_bufs) + (t->store_bufs == 1 ? " area" : " areas") +
           "), stored by TMA (cp.async.bulk.tensor, a tensor map an output)";
  if (t->want_tma_store) return ", no TMA stores, which the config asks for: " + no_chunks;
  if (t->chunk_off >= 0)
    return ", epilogue staged through each consumer warp's own shared memory " + num(t->chunk_cols) +
           " columns at a time, stored 128 bits at a time";
  if (t->persistent && t->ws) return ", epilogue stored directly: " + no_chunks;
  if (std::optional<std::string> why = mma_staging_unfit(g, p, *t)) return ", epilogue stored directly: " + *why;
  return ", epilogue staged through the pipeline's shared memory, stored 128 bits at a time where the outputs are "
         "16-byte aligned";
}

Result<void> emit_mma_epilogue(MmaEpilogueFrame& f, const std::vector<llvm::Value*>& acc) {
  return Epilogue(f).emit(acc);
}

}  // namespace sf::matmul_detail
