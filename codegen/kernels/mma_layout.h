// Index maps for a tensor-core matmul (STYLE.md #14): which element of which matrix
// each lane of a warp holds in the registers of `mma.sync.aligned.m16n8k16.row.col`
// with 16-bit A/B (.f16 or .bf16, the same layout) and f32 C/D, which element
// `ldmatrix.sync.aligned.m8n8.{x1,x2,x4}{,.trans}.shared.b16` delivers to each lane,
// and the XOR swizzle of the shared-memory tiles ldmatrix reads. Plain functions with
// no LLVM, so tests/kernels/mma_layout_test.cpp proves them on the host against tables
// written from the PTX ISA's fragment figures, and an index bug fails in CI, not first
// on a GPU. docs/kernels.md ("Tensor-core fragment layouts") walks through them.
//
// Conventions shared by every function here:
//   - lane is 0..31 (%laneid). For mma, groupID = lane / 4 and tig = lane % 4 (the
//     PTX ISA's "threadID_in_group"): the 8 groups of 4 lanes that the figures draw.
//   - A 16-bit operand element i of a fragment lives in .b32 register i / 2, in the
//     low half when i is even: the lower-numbered element is the low half, as when the
//     two elements are loaded from consecutive addresses on a little-endian machine.
//   - Arguments outside the documented ranges give meaningless results; nothing here
//     checks them (the callers are emitters looping over fixed ranges).
#pragma once

namespace sf::kernels {

// A (row, col) position in a matrix or tile.
struct RowCol {
  int row = 0;
  int col = 0;
  bool operator==(const RowCol&) const = default;
};

// ---- mma.m16n8k16, 16-bit A/B, f32 C/D -------------------------------------------
// PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type" (the .f16 and
// .bf16 A/B figures and the f32 C/D figure). .row.col is the only A/B layout m16n8k16
// has; it names how the ISA numbers the fragments (A by rows, B by columns), not how
// memory is laid out.

// Element a_i (i = 0..7: four .b32 registers, two elements each) of lane `lane`, as
// (row, col) = (m, k) of A, 16 x 16 (M x K). Rows groupID (a0,a1,a4,a5) and
// groupID + 8 (a2,a3,a6,a7); columns 2*tig + i % 2, plus 8 for a4..a7.
RowCol mma_a_elem(int lane, int i);

// Element b_i (i = 0..3: two .b32 registers) of lane `lane`, as (row, col) = (k, n)
// of B, 16 x 8 (K x N). Column groupID; rows 2*tig + i % 2, plus 8 for b2,b3.
RowCol mma_b_elem(int lane, int i);

// Element c_i / d_i (i = 0..3: four f32 registers) of lane `lane`, as (row, col) =
// (m, n) of C and D, 16 x 8. Rows groupID (c0,c1) and groupID + 8 (c2,c3); columns
// 2*tig + i % 2.
RowCol mma_c_elem(int lane, int i);

// ---- ldmatrix.m8n8 .b16 -----------------------------------------------------------
// PTX ISA, "Warp-level matrix load instruction: ldmatrix" (the per-lane address table
// and the fragment figure of one 8x8 matrix). One instruction loads 1, 2 or 4 (.x1,
// .x2, .x4) matrices of 8 x 8 16-bit elements; each row of a matrix is 16 contiguous
// bytes at an address some lane supplies (16-byte aligned). Destination register j
// receives matrix j.

// Which matrix row lane `lane` supplies the address of.
struct LdmatrixRow {
  int matrix = 0;  // 0..3
  int row = 0;     // 0..7
  bool operator==(const LdmatrixRow&) const = default;
};

// Lanes 8*j .. 8*j+7 supply rows 0..7 of matrix j. .x1 reads the addresses of lanes
// 0..7 only, .x2 of lanes 0..15, .x4 of all 32; the other lanes' addresses are ignored
// (but every lane still receives its registers).
LdmatrixRow ldmatrix_row_provider(int lane);

// Which element of matrix j lane `lane` receives in destination register j, half
// `half` (0: low 16 bits, 1: high), as (row, col) of the matrix as stored (row r is the
// 16 bytes whose address lane 8*j + r supplied). Without .trans the matrix is
// distributed like an mma accumulator: (lane / 4, 2 * (lane % 4) + half). With .trans
// the lane receives the transposed matrix's element, i.e. the stored
// (2 * (lane % 4) + half, lane / 4): its two halves come from two adjacent rows. The
// position does not depend on j, so j is not an argument.
RowCol ldmatrix_elem(int lane, int half, bool trans);

// ---- feeding mma from shared memory with ldmatrix.x4 -------------------------------
// One ldmatrix.x4 loads a 16 x 16 tile of 16-bit elements as four 8 x 8 matrices,
// matrix j at (8 * (j % 2), 8 * (j / 2)) of the tile: top-left, bottom-left, top-right,
// bottom-right. That is the order of the A fragment's registers (a0a1: rows 0-7 and
// a2a3: rows 8-15 of k 0-7, then a4a5 and a6a7 of k 8-15), so for A the four
// destination registers are the fragment's four registers, in order.

// For a 16 x 16 block of A stored M x K (k contiguous), read without .trans: the
// block position (m, k) of the first of the 8 contiguous elements whose address lane
// `lane` supplies to ldmatrix.x4, (lane % 16, 8 * (lane / 16)). The destination
// registers are then a0a1, a2a3, a4a5, a6a7. (An A stored K x M would need .trans and
// other addresses: ldmatrix_x4_a_trans_addr.)
RowCol ldmatrix_x4_a_addr(int lane);

// The same 16 x 16 block of A stored K x M (m contiguous: `transpose(x) @ w`), read
// with .trans: the stored (k, m) of the 8 contiguous elements lane `lane` points at,
// (lane % 8 + 8 * (lane / 16), 8 * ((lane / 8) % 2)). Matrix j must hold A's (m, k)
// origin (8 * (j % 2), 8 * (j / 2)) as before, i.e. stored rows k 8 * (j / 2) .. +7
// from column m 8 * (j % 2); .trans hands each lane the pair of adjacent k it needs.
RowCol ldmatrix_x4_a_trans_addr(int lane);

// How a 16 x 16 block of B (K x N: k 0..15, n 0..15, two n8 mma tiles) is stored in
// shared memory. The tensor-core emitter is to stage tiles in the global layout (so
// cp.async copies 16-byte pieces unchanged), and B comes both ways: `x @ w` with
// w [K, N] gives KxN, `x @ transpose(w)` (a linear layer's weight [N, K]) gives NxK.
enum class SmemB {
  // Rows are k, n contiguous. Read with ldmatrix.x4.trans: .trans turns the stored
  // k-rows into the k-pairs that b0b1 / b2b3 hold. Matrices in the A order:
  // (k, n) origins (0,0), (8,0), (0,8), (8,8), so registers 0,1 are b0b1, b2b3 of n 0-7
  // and registers 2,3 those of n 8-15. Same addresses as A: (lane % 16, 8 * (lane / 16)).
  KxN,
  // Rows are n, k contiguous. Read with ldmatrix.x4 without .trans: a stored n-row
  // already holds the k-pairs. Matrices (n, k) origins (0,0), (0,8), (8,0), (8,8), so
  // registers 0,1 are b0b1, b2b3 of n 0-7 and 2,3 those of n 8-15 again.
  NxK,
};

// Whether ldmatrix must use .trans for `layout`.
bool ldmatrix_b_trans(SmemB layout);

// The position of the first of the 8 elements whose address lane `lane` supplies to
// ldmatrix.x4 for the B block, in the stored tile's own (row, col): (k, n) for KxN,
// (n, k) for NxK. Registers 0,1 are B fragment registers 0,1 of the n8 tile n 0-7,
// registers 2,3 those of n 8-15 (see SmemB). For .x2 (one n8 tile, lanes 0..15)
// use the same function: lanes 0..15 address exactly matrices 0 and 1.
RowCol ldmatrix_x4_b_addr(int lane, SmemB layout);

// ---- XOR-swizzled shared tiles -----------------------------------------------------
// Shared memory has 32 banks of 4 bytes (CUDA C++ Programming Guide, "Shared Memory",
// compute capability 5.x and later): byte b is in bank (b / 4) % 32, and a 128-byte
// line covers every bank once. A 16-byte access covers 4 banks. The model the tests use:
// 8 such accesses (the 8 row addresses of one ldmatrix matrix, or a quarter warp of
// cp.async / ld.shared.v4) are served together, in one wavefront when they cover 32
// distinct banks, i.e. when the 8 chunks sit at 8 distinct 16-byte positions of a line.
//
// A tile of 16-bit elements has rows of `row_bytes` = 64 or 128 bytes (block_k or
// block_n of 32 or 64 bf16/f16), i.e. 4 or 8 chunks of 16 bytes (8 elements). Unswizzled,
// the 8 rows an ldmatrix matrix reads all start at the same bank (128-byte rows: an
// 8-way conflict) or at two (64-byte rows: 4-way). The swizzle keeps each 16-byte chunk
// whole (so ldmatrix and cp.async still see 16 contiguous bytes) and moves it within its
// row:
//   128-byte rows: physical chunk = chunk ^ (row % 8)
//   64-byte rows:  physical chunk = chunk ^ ((row / 2) % 4)
// For 128-byte rows, 8 consecutive rows have 8 distinct row % 8, so the same logical
// chunk lands on 8 distinct positions. For 64-byte rows, rows 2m and 2m+1 share one
// 128-byte line (the odd row is its upper half, banks 16..31), so they pair up: both
// XOR with the same m % 4, and 8 consecutive rows give 8 distinct
// (row % 2, chunk ^ (m % 4)) = 8 distinct 16-byte positions of a line. A quarter warp
// of cp.async writing a row (128 bytes) or a row pair (2 x 64) in order writes a
// permutation of one line's 8 positions. The tile's base must be 128-byte aligned
// (bank positions are taken from it).

// The physical chunk (0 .. row_bytes/16 - 1) of logical 16-byte chunk `chunk` of row
// `row` (>= 0) of a tile with rows of `row_bytes` (64 or 128) bytes.
int swizzle_chunk(int row, int chunk, int row_bytes);

// The byte offset from the tile's base of 16-bit element (row, col) (col < row_bytes/2)
// of a swizzled tile with rows of `row_bytes` (64 or 128) bytes.
int swizzle_offset_b16(int row, int col, int row_bytes);

}  // namespace sf::kernels
