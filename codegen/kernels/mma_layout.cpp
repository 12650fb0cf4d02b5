#include "codegen/kernels/mma_layout.h"

namespace sf::kernels {

namespace {

// The two coordinates every mma figure is drawn in: groups of 4 lanes.
int group_id(int lane) { return lane >> 2; }
int thread_in_group(int lane) { return lane & 3; }

}  // namespace

// ---- mma.m16n8k16 ---------------------------------------------------------------------
// PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type".

RowCol mma_a_elem(int lane, int i) {
  // Bit 0 of i: the half of the register (adjacent columns); bit 1: rows 8-15;
  // bit 2: columns 8-15 (a0..a3 cover k 0-7, a4..a7 k 8-15).
  return {group_id(lane) + 8 * ((i >> 1) & 1), 2 * thread_in_group(lane) + (i & 1) + 8 * ((i >> 2) & 1)};
}

RowCol mma_b_elem(int lane, int i) {
  // B is numbered by columns: the lane's column is its group; bit 0 of i picks one of
  // two adjacent k, bit 1 k 8-15 (b2,b3).
  return {2 * thread_in_group(lane) + (i & 1) + 8 * ((i >> 1) & 1), group_id(lane)};
}

RowCol mma_c_elem(int lane, int i) {
  return {group_id(lane) + 8 * ((i >> 1) & 1), 2 * thread_in_group(lane) + (i & 1)};
}

// ---- ldmatrix ---------------------------------------------------------------------------
// PTX ISA, "Warp-level matrix load instruction: ldmatrix".

LdmatrixRow ldmatrix_row_provider(int lane) { return {(lane >> 3) & 3, lane & 7}; }

RowCol ldmatrix_elem(int lane, int half, bool trans) {
  // Without .trans a lane gets the 32-bit word (lane % 4) of row lane / 4: an 8 x 8
  // matrix of 16-bit elements is 8 rows of four 32-bit words, one word per lane.
  RowCol stored{group_id(lane), 2 * thread_in_group(lane) + (half & 1)};
  return trans ? RowCol{stored.col, stored.row} : stored;
}

RowCol ldmatrix_x4_a_addr(int lane) {
  // Lane 8j + r supplies row r of matrix j, which sits at (8 * (j % 2), 8 * (j / 2)).
  LdmatrixRow p = ldmatrix_row_provider(lane);
  return {8 * (p.matrix & 1) + p.row, 8 * (p.matrix >> 1)};
}

RowCol ldmatrix_x4_a_trans_addr(int lane) {
  // Matrix j covers A's k 8 * (j / 2) .. +7 (the stored rows) at m 8 * (j % 2).
  LdmatrixRow p = ldmatrix_row_provider(lane);
  return {8 * (p.matrix >> 1) + p.row, 8 * (p.matrix & 1)};
}

bool ldmatrix_b_trans(SmemB layout) { return layout == SmemB::KxN; }

RowCol ldmatrix_x4_b_addr(int lane, SmemB layout) {
  LdmatrixRow p = ldmatrix_row_provider(lane);
  switch (layout) {
    // (k, n): k plays the role m plays for A, so the addresses are A's.
    case SmemB::KxN: return ldmatrix_x4_a_addr(lane);
    // (n, k): the stored rows are n; k halves alternate, n halves every two matrices.
    case SmemB::NxK: return {8 * (p.matrix >> 1) + p.row, 8 * (p.matrix & 1)};
  }
  return {};
}

// ---- swizzle ----------------------------------------------------------------------------

int swizzle_chunk(int row, int chunk, int row_bytes) {
  // 64-byte rows pair up in one 128-byte line of banks, so the pair shares one XOR value
  // and the XOR ranges over the row's 4 chunks; 128-byte rows XOR with row % 8 over 8.
  if (row_bytes == 64) return chunk ^ ((row >> 1) & 3);
  return chunk ^ (row & 7);
}

int swizzle_offset_b16(int row, int col, int row_bytes) {
  constexpr int kElemsPerChunk = 16 / 2;
  return row * row_bytes + 16 * swizzle_chunk(row, col / kElemsPerChunk, row_bytes) + 2 * (col % kElemsPerChunk);
}

}  // namespace sf::kernels
