// The tensor-core matmul's products on one stage of shared memory (internal to
// codegen/kernels): the swizzled tiles' addressing, the mma.sync tile (ldmatrix
// fragments) and the wgmma tile (matrix descriptors), members of MmaIsa that the
// kernel of matmul_mma.cpp calls once per K tile.
#include <algorithm>
#include <vector>

#include <llvm/IR/Constants.h>
#include <llvm/IR/IRBuilder.h>

#include "codegen/kernels/matmul_mma_isa.h"

namespace sf::matmul_detail {

// The byte offset of element (row, col) in `tile`, col a multiple of per_chunk (a
// 16-byte chunk): the panel, the row within it, and the row's chunk moved by
// mma_layout.h's swizzle_chunk (chunk ^ row % 8 for 128-byte rows, chunk ^ (row / 2)
// % 4 for 64).
llvm::Value* MmaIsa::tile_offset(const SmemTile& tile, llvm::Value* row, llvm::Value* col) {
  const int cpp = tile.row_bytes() / 16;  // chunks per panel row
  llvm::Value* chunk = b_.CreateLShr(col, k(log2i(tile.per_chunk())));
  llvm::Value* panel = b_.CreateLShr(chunk, k(log2i(cpp)));
  llvm::Value* in = b_.CreateAnd(chunk, k(cpp - 1));
  llvm::Value* x = tile.row_bytes() == 128 ? b_.CreateAnd(row, k(7)) : b_.CreateAnd(b_.CreateLShr(row, k(1)), k(3));
  llvm::Value* phys = b_.CreateXor(in, x);
  return add(add(mul(panel, int64_t{tile.rows} * tile.row_bytes()), mul(row, tile.row_bytes())), mul(phys, 16));
}

// One stage's block tile: per k step of 32 bytes (16 16-bit elements, 8 TF32), an
// ldmatrix.x4 per 16 rows of the warp's A and per 16 columns of its B (two n8
// tiles), then mi x ni mma. The k-contiguous addresses are the same bytes for both
// element sizes: a 16-byte ldmatrix row holds 8 16-bit or 4 32-bit elements, and
// without .trans lane l receives 32 bits at (row l / 4, 4 bytes x (l % 4)), which is
// the TF32 fragment element. 32-bit elements cannot be transposed by ldmatrix, so an
// m- or n-contiguous TF32 operand is read one element per register.
std::vector<llvm::Value*> MmaIsa::compute(llvm::Value* stage, std::vector<llvm::Value*> acc) {
  llvm::Value* abase = mul(stage, t_.stage_bytes);
  llvm::Value* bbase = add(abase, k(t_.a.bytes()));
  const bool tf32 = t_.a.eb == 4;
  const int kstep = 32 / t_.a.eb, half = 16 / t_.a.eb;
  // The lane's part of the ldmatrix addresses (mma_layout.h): ldmatrix_x4_a_addr
  // (= the KxN B addresses) is (lane % 16, 8 * (lane / 16)); ldmatrix_x4_a_trans_addr
  // (= the NxK B addresses) is (lane % 8 + 8 * (lane / 16), 8 * ((lane / 8) % 2)),
  // in 16-bit elements along k.
  llvm::Value* l16 = b_.CreateAnd(lane_, k(15));
  llvm::Value* hi = b_.CreateLShr(lane_, k(4));
  llvm::Value* l8 = add(b_.CreateAnd(lane_, k(7)), mul(hi, 8));
  llvm::Value* mid = b_.CreateAnd(b_.CreateLShr(lane_, k(3)), k(1));
  // TF32 fragments read one element at a time: groupID and threadID_in_group.
  llvm::Value* g = b_.CreateLShr(lane_, k(2));
  llvm::Value* tig = b_.CreateAnd(lane_, k(3));
  for (int ks = 0; ks < t_.bk / kstep; ++ks) {
    std::vector<std::vector<llvm::Value*>> af, bf;
    llvm::Value* k0 = k(int64_t{ks} * kstep);
    for (int i = 0; i < t_.mi; ++i) {
      llvm::Value* m = add(wm0_, k(i * 16));
      if (t_.a_kc) {
        af.push_back(ldmatrix_x4(smem_at(add(abase, tile_offset(t_.a, add(m, l16), add(k0, mul(hi, half))))), false));
      } else if (!tf32) {
        af.push_back(ldmatrix_x4(smem_at(add(abase, tile_offset(t_.a, add(k0, l8), add(m, mul(mid, 8))))), true));
      } else {  // a_r: m = g (+8 for r odd), k = tig (+4 for r >= 2)
        std::vector<llvm::Value*> r;
        for (int e = 0; e < 4; ++e)
          r.push_back(lds32(abase, t_.a, add(k0, add(tig, k(4 * (e / 2)))), add(m, add(g, k(8 * (e % 2))))));
        af.push_back(r);
      }
    }
    for (int j = 0; j < t_.ni / 2; ++j) {
      llvm::Value* n = add(wn0_, k(j * 16));
      if (t_.b_kc || !tf32) {
        llvm::Value* off = t_.b_kc ? tile_offset(t_.b, add(n, l8), add(k0, mul(mid, half)))
                                   : tile_offset(t_.b, add(k0, l16), add(n, mul(hi, 8)));
        std::vector<llvm::Value*> r = ldmatrix_x4(smem_at(add(bbase, off)), !t_.b_kc);
        bf.push_back({r[0], r[1]});
        bf.push_back({r[2], r[3]});
      } else {  // b_r of n8 tile h: n = g, k = tig (+4 for r = 1)
        for (int h = 0; h < 2; ++h) {
          llvm::Value* col = add(n, add(g, k(8 * h)));
          bf.push_back({lds32(bbase, t_.b, add(k0, tig), col), lds32(bbase, t_.b, add(k0, add(tig, k(4))), col)});
        }
      }
    }
    for (int i = 0; i < t_.mi; ++i)
      for (int j = 0; j < t_.ni; ++j) {
        size_t at = static_cast<size_t>((i * t_.ni + j) * 4);
        std::vector<llvm::Value*> c(acc.begin() + static_cast<std::ptrdiff_t>(at),
                                    acc.begin() + static_cast<std::ptrdiff_t>(at + 4));
        std::vector<llvm::Value*> d = mma(af[static_cast<size_t>(i)], bf[static_cast<size_t>(j)], c);
        std::copy(d.begin(), d.end(), acc.begin() + static_cast<std::ptrdiff_t>(at));
      }
  }
  return acc;
}

// One 32-bit element (row, col) of `tile` in the stage at `base`, as raw bits.
llvm::Value* MmaIsa::lds32(llvm::Value* base, const SmemTile& tile, llvm::Value* row, llvm::Value* col) {
  const int per = tile.per_chunk();
  llvm::Value* chunk_col = b_.CreateAnd(col, k(~int64_t{per - 1}));
  llvm::Value* off = add(tile_offset(tile, row, chunk_col), mul(b_.CreateAnd(col, k(per - 1)), tile.eb));
  return b_.CreateAlignedLoad(i32_, smem_at(add(base, off)), llvm::Align(4));
}

// One stage's block tile on the warpgroup's rows: per k step of 16 and per m64 step,
// one wgmma over all bn columns, between a wgmma.fence (the accumulators were last
// written by ordinary instructions) and one commit group, waited for before the
// stage can be refilled.
//   A K-major: rows m of 128 bytes in 64-wide k panels; the k step's 32 bytes start
//     at 32 * (k step % 4) inside the panel (the swizzle applies to the address the
//     hardware forms). Stride byte offset: 8 rows = 1024 bytes.
//   A / B MN-major: rows k of 128 bytes in 64-wide m (n) panels of block_k rows;
//     the k step starts 16 rows (2048 bytes) further. Leading byte offset: the next
//     64-wide panel (block_k * 128 bytes); stride: the next 8 rows of k (1024).
std::vector<llvm::Value*> MmaIsa::compute_wgmma(llvm::Value* stage, std::vector<llvm::Value*> acc) {
  llvm::Value* abase = mul(stage, t_.stage_bytes);
  llvm::Value* bbase = add(abase, k(t_.a.bytes()));
  llvm::Value* wg_row = wg_row_;
  const size_t per = static_cast<size_t>(t_.bn / 2);
  asm_stmt("wgmma.fence.sync.aligned;");
  for (int ks = 0; ks < t_.bk * t_.a.eb / 32; ++ks) {  // k steps of 32 bytes
    llvm::Value* boff = t_.b_kc ? k(int64_t{ks / 4} * t_.b.rows * 128 + (ks % 4) * 32) : k(int64_t{ks} * 2048);
    llvm::Value* db = descriptor(shared_addr(add(bbase, boff)), int64_t{t_.bk} * 128, 1024);
    for (int i = 0; i < t_.mi; ++i) {
      llvm::Value* row = add(wg_row, k(int64_t{i} * 64));
      llvm::Value* aoff = t_.a_kc ? add(k(int64_t{ks / 4} * t_.a.rows * 128 + (ks % 4) * 32), mul(row, 128))
                                  : add(mul(b_.CreateLShr(row, k(6)), int64_t{t_.bk} * 128), k(int64_t{ks} * 2048));
      llvm::Value* da = descriptor(shared_addr(add(abase, aoff)), int64_t{t_.bk} * 128, 1024);
      std::vector<llvm::Value*> d(acc.begin() + static_cast<std::ptrdiff_t>(i * per),
                                  acc.begin() + static_cast<std::ptrdiff_t>((i + 1) * per));
      d = wgmma(da, db, std::move(d));
      std::copy(d.begin(), d.end(), acc.begin() + static_cast<std::ptrdiff_t>(i * per));
    }
  }
  wgmma_commit();
  wgmma_wait(lag_);  // the previous tile's group (lag 1), or this one (lag 0), is done
  return acc;
}

}  // namespace sf::matmul_detail
