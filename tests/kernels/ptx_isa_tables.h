// The PTX ISA's tensor-core fragment figures written out cell by cell, and what they
// say each lane holds: the independent side of the host proofs of tensor-core index
// math (mma_layout_test.cpp checks codegen/kernels/mma_layout.h against them;
// matmul_mma_test.cpp simulates whole warps of the emitted kernel with them as the
// hardware). Test code only: nothing in the emitters may include this.
#pragma once

#include <array>
#include <cstdint>

#include "codegen/kernels/mma_layout.h"

namespace sf::kernels::isa {

constexpr int kLanes = 32;

// ---- the PTX ISA's figures, written out ------------------------------------------------
// PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type": each figure
// draws the matrix and labels every cell "T<lane> : <element>". One grid here is the
// lanes, one the element indices (a digit per cell), transcribed cell by cell.

// A, 16 x 16 (rows m, columns k), elements a0..a7.
constexpr int kAFigLane[16][16] = {
    { 0,  0,  1,  1,  2,  2,  3,  3,  0,  0,  1,  1,  2,  2,  3,  3},
    { 4,  4,  5,  5,  6,  6,  7,  7,  4,  4,  5,  5,  6,  6,  7,  7},
    { 8,  8,  9,  9, 10, 10, 11, 11,  8,  8,  9,  9, 10, 10, 11, 11},
    {12, 12, 13, 13, 14, 14, 15, 15, 12, 12, 13, 13, 14, 14, 15, 15},
    {16, 16, 17, 17, 18, 18, 19, 19, 16, 16, 17, 17, 18, 18, 19, 19},
    {20, 20, 21, 21, 22, 22, 23, 23, 20, 20, 21, 21, 22, 22, 23, 23},
    {24, 24, 25, 25, 26, 26, 27, 27, 24, 24, 25, 25, 26, 26, 27, 27},
    {28, 28, 29, 29, 30, 30, 31, 31, 28, 28, 29, 29, 30, 30, 31, 31},
    { 0,  0,  1,  1,  2,  2,  3,  3,  0,  0,  1,  1,  2,  2,  3,  3},
    { 4,  4,  5,  5,  6,  6,  7,  7,  4,  4,  5,  5,  6,  6,  7,  7},
    { 8,  8,  9,  9, 10, 10, 11, 11,  8,  8,  9,  9, 10, 10, 11, 11},
    {12, 12, 13, 13, 14, 14, 15, 15, 12, 12, 13, 13, 14, 14, 15, 15},
    {16, 16, 17, 17, 18, 18, 19, 19, 16, 16, 17, 17, 18, 18, 19, 19},
    {20, 20, 21, 21, 22, 22, 23, 23, 20, 20, 21, 21, 22, 22, 23, 23},
    {24, 24, 25, 25, 26, 26, 27, 27, 24, 24, 25, 25, 26, 26, 27, 27},
    {28, 28, 29, 29, 30, 30, 31, 31, 28, 28, 29, 29, 30, 30, 31, 31},
};
constexpr const char* kAFigElem[16] = {
    "0101010145454545", "0101010145454545", "0101010145454545", "0101010145454545",
    "0101010145454545", "0101010145454545", "0101010145454545", "0101010145454545",
    "2323232367676767", "2323232367676767", "2323232367676767", "2323232367676767",
    "2323232367676767", "2323232367676767", "2323232367676767", "2323232367676767",
};

// B, 16 x 8 (rows k, columns n), elements b0..b3.
constexpr int kBFigLane[16][8] = {
    {0, 4,  8, 12, 16, 20, 24, 28}, {0, 4,  8, 12, 16, 20, 24, 28},
    {1, 5,  9, 13, 17, 21, 25, 29}, {1, 5,  9, 13, 17, 21, 25, 29},
    {2, 6, 10, 14, 18, 22, 26, 30}, {2, 6, 10, 14, 18, 22, 26, 30},
    {3, 7, 11, 15, 19, 23, 27, 31}, {3, 7, 11, 15, 19, 23, 27, 31},
    {0, 4,  8, 12, 16, 20, 24, 28}, {0, 4,  8, 12, 16, 20, 24, 28},
    {1, 5,  9, 13, 17, 21, 25, 29}, {1, 5,  9, 13, 17, 21, 25, 29},
    {2, 6, 10, 14, 18, 22, 26, 30}, {2, 6, 10, 14, 18, 22, 26, 30},
    {3, 7, 11, 15, 19, 23, 27, 31}, {3, 7, 11, 15, 19, 23, 27, 31},
};
constexpr const char* kBFigElem[16] = {
    "00000000", "11111111", "00000000", "11111111", "00000000", "11111111", "00000000", "11111111",
    "22222222", "33333333", "22222222", "33333333", "22222222", "33333333", "22222222", "33333333",
};

// C and D (f32), 16 x 8 (rows m, columns n), elements c0..c3.
constexpr int kCFigLane[16][8] = {
    { 0,  0,  1,  1,  2,  2,  3,  3}, { 4,  4,  5,  5,  6,  6,  7,  7},
    { 8,  8,  9,  9, 10, 10, 11, 11}, {12, 12, 13, 13, 14, 14, 15, 15},
    {16, 16, 17, 17, 18, 18, 19, 19}, {20, 20, 21, 21, 22, 22, 23, 23},
    {24, 24, 25, 25, 26, 26, 27, 27}, {28, 28, 29, 29, 30, 30, 31, 31},
    { 0,  0,  1,  1,  2,  2,  3,  3}, { 4,  4,  5,  5,  6,  6,  7,  7},
    { 8,  8,  9,  9, 10, 10, 11, 11}, {12, 12, 13, 13, 14, 14, 15, 15},
    {16, 16, 17, 17, 18, 18, 19, 19}, {20, 20, 21, 21, 22, 22, 23, 23},
    {24, 24, 25, 25, 26, 26, 27, 27}, {28, 28, 29, 29, 30, 30, 31, 31},
};
constexpr const char* kCFigElem[16] = {
    "01010101", "01010101", "01010101", "01010101", "01010101", "01010101", "01010101", "01010101",
    "23232323", "23232323", "23232323", "23232323", "23232323", "23232323", "23232323", "23232323",
};

// PTX ISA, "Warp-level matrix load instruction: ldmatrix": one 8 x 8 matrix as stored
// (row r = the 16 bytes lane 8j + r pointed at), each cell's receiving lane and the half
// of its register (0 low, 1 high) without .trans. With .trans the lanes receive the
// transposed matrix in this same pattern, so stored cell (r, c) goes where (c, r) goes
// here.
constexpr int kLdFigLane[8][8] = {
    { 0,  0,  1,  1,  2,  2,  3,  3}, { 4,  4,  5,  5,  6,  6,  7,  7},
    { 8,  8,  9,  9, 10, 10, 11, 11}, {12, 12, 13, 13, 14, 14, 15, 15},
    {16, 16, 17, 17, 18, 18, 19, 19}, {20, 20, 21, 21, 22, 22, 23, 23},
    {24, 24, 25, 25, 26, 26, 27, 27}, {28, 28, 29, 29, 30, 30, 31, 31},
};
constexpr const char* kLdFigHalf[8] = {
    "01010101", "01010101", "01010101", "01010101", "01010101", "01010101", "01010101", "01010101",
};

// PTX ISA, "Matrix Fragments for mma.m16n8k8" with .tf32 A/B: each register holds one
// 32-bit element.
// A, 16 x 8 (rows m, columns k), elements a0..a3.
constexpr int kA32FigLane[16][8] = {
    { 0,  1,  2,  3,  0,  1,  2,  3}, { 4,  5,  6,  7,  4,  5,  6,  7},
    { 8,  9, 10, 11,  8,  9, 10, 11}, {12, 13, 14, 15, 12, 13, 14, 15},
    {16, 17, 18, 19, 16, 17, 18, 19}, {20, 21, 22, 23, 20, 21, 22, 23},
    {24, 25, 26, 27, 24, 25, 26, 27}, {28, 29, 30, 31, 28, 29, 30, 31},
    { 0,  1,  2,  3,  0,  1,  2,  3}, { 4,  5,  6,  7,  4,  5,  6,  7},
    { 8,  9, 10, 11,  8,  9, 10, 11}, {12, 13, 14, 15, 12, 13, 14, 15},
    {16, 17, 18, 19, 16, 17, 18, 19}, {20, 21, 22, 23, 20, 21, 22, 23},
    {24, 25, 26, 27, 24, 25, 26, 27}, {28, 29, 30, 31, 28, 29, 30, 31},
};
constexpr const char* kA32FigElem[16] = {
    "00002222", "00002222", "00002222", "00002222", "00002222", "00002222", "00002222", "00002222",
    "11113333", "11113333", "11113333", "11113333", "11113333", "11113333", "11113333", "11113333",
};
// B, 8 x 8 (rows k, columns n), elements b0, b1.
constexpr int kB32FigLane[8][8] = {
    {0, 4,  8, 12, 16, 20, 24, 28}, {1, 5,  9, 13, 17, 21, 25, 29},
    {2, 6, 10, 14, 18, 22, 26, 30}, {3, 7, 11, 15, 19, 23, 27, 31},
    {0, 4,  8, 12, 16, 20, 24, 28}, {1, 5,  9, 13, 17, 21, 25, 29},
    {2, 6, 10, 14, 18, 22, 26, 30}, {3, 7, 11, 15, 19, 23, 27, 31},
};
constexpr const char* kB32FigElem[8] = {
    "00000000", "00000000", "00000000", "00000000", "11111111", "11111111", "11111111", "11111111",
};

// A figure read backwards: (lane, element) -> cell, and how often the grid names each.
struct FigureMap {
  std::array<std::array<RowCol, 8>, kLanes> at{};
  std::array<std::array<int, 8>, kLanes> times{};
};

template <int R, int C>
inline FigureMap invert(const int (&lane)[R][C], const char* const (&elem)[R], bool transpose = false) {
  FigureMap m;
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) {
      int l = lane[r][c], i = elem[r][c] - '0';
      m.at[l][i] = transpose ? RowCol{c, r} : RowCol{r, c};
      ++m.times[l][i];
    }
  return m;
}

inline const FigureMap& fig_a() { static const FigureMap m = invert(kAFigLane, kAFigElem); return m; }
inline const FigureMap& fig_b() { static const FigureMap m = invert(kBFigLane, kBFigElem); return m; }
inline const FigureMap& fig_c() { static const FigureMap m = invert(kCFigLane, kCFigElem); return m; }
inline const FigureMap& fig_ld(bool trans) {
  static const FigureMap plain = invert(kLdFigLane, kLdFigHalf);
  static const FigureMap transposed = invert(kLdFigLane, kLdFigHalf, /*transpose=*/true);
  return trans ? transposed : plain;
}

// ---- wgmma (sm_90a) ------------------------------------------------------------------------
// PTX ISA, "Register Fragments and Shared Memory Matrix Layouts" of wgmma.mma_async.

// "WGMMA .m64nNk16 register fragment layout for accumulator matrix D": warp w of the
// warpgroup holds rows 16w .. 16w + 15; within them each 8-column block j repeats the
// mma.m16n8 C figure above with its elements numbered 4j .. 4j + 3 (d4j, d4j+1 in the
// upper 8 rows, d4j+2, d4j+3 in the lower). Element i of warpgroup thread t:
inline RowCol isa_wgmma_d(int t, int i) {
  RowCol c = fig_c().at[t % kLanes][i % 4];
  return {16 * (t / kLanes) + c.row, 8 * (i / 4) + c.col};
}

// "WGMMA .m64nNk16 register fragment layout for matrix A" (A from registers, 16-bit
// elements): warp w of the warpgroup holds rows 16w .. 16w + 15 of the 64 x 16 A,
// each lane the cells the mma.m16n8k16 A figure above gives it, elements a0..a7
// (two to a .b32 register, the even one in the low half). Element i of warpgroup
// thread t:
inline RowCol isa_wgmma_a(int t, int i) {
  RowCol c = fig_a().at[t % kLanes][i];
  return {16 * (t / kLanes) + c.row, c.col};
}

// The matrix descriptor's fields ("Matrix Descriptor Format"): bits 0-13 start
// address >> 4, 16-29 leading dimension byte offset >> 4, 32-45 stride dimension
// byte offset >> 4, 49-51 base offset, 62-63 swizzle mode (1 = 128-byte).
struct WgmmaDesc {
  int64_t start = 0, lbo = 0, sbo = 0;
  int base_offset = 0, swizzle = 0;
};
inline WgmmaDesc decode_wgmma_desc(uint64_t d) {
  return {static_cast<int64_t>(d & 0x3FFF) << 4, static_cast<int64_t>((d >> 16) & 0x3FFF) << 4,
          static_cast<int64_t>((d >> 32) & 0x3FFF) << 4, static_cast<int>((d >> 49) & 7), static_cast<int>(d >> 62)};
}

// The byte address of element (mn, k) of `eb` bytes, k < 32 / eb, of an operand under the
// canonical 128-byte-swizzle layouts ("Shared Memory Matrix Layout"; swizzle atom:
// 8 rows of 128 bytes, its 16-byte units permuted within each row by the row's
// index in the atom, as address bits 4-6 ^= bits 7-9).
//   K-major (imm-trans 0): rows are m (n), 128 bytes each, k contiguous inside the
//     row; 8-row groups `sbo` apart; the leading byte offset is unused.
//   MN-major (imm-trans 1): rows are k, m (n) contiguous inside the row, 128 bytes
//     per atom row; atoms along m (n) `lbo` apart, 8-row groups of k `sbo` apart.
inline int64_t wgmma_operand_addr(const WgmmaDesc& d, bool mn_major, int64_t mn, int64_t k, int64_t eb = 2) {
  const int64_t atom = 128 / eb;  // elements in an atom's 128-byte row
  int64_t a = mn_major ? d.start + (mn / atom) * d.lbo + (mn % atom) * eb + (k / 8) * d.sbo + (k % 8) * 128
                       : d.start + (mn / 8) * d.sbo + (mn % 8) * 128 + k * eb;
  return a ^ (((a >> 7) & 7) << 4);
}

inline const FigureMap& fig_a32() { static const FigureMap m = invert(kA32FigLane, kA32FigElem); return m; }
inline const FigureMap& fig_b32() { static const FigureMap m = invert(kB32FigLane, kB32FigElem); return m; }
inline RowCol isa_a32(int lane, int i) { return fig_a32().at[lane][i]; }
inline RowCol isa_b32(int lane, int i) { return fig_b32().at[lane][i]; }

inline RowCol isa_a(int lane, int i) { return fig_a().at[lane][i]; }
inline RowCol isa_b(int lane, int i) { return fig_b().at[lane][i]; }
inline RowCol isa_c(int lane, int i) { return fig_c().at[lane][i]; }
inline RowCol isa_ld(int lane, int half, bool trans) { return fig_ld(trans).at[lane][half]; }

}  // namespace sf::kernels::isa
