// The tensor-core index maps (codegen/kernels/mma_layout.h) proven on the host
// (STYLE.md #14), no GPU needed:
//   - every fragment map against a table written out here from the PTX ISA's figures
//     (the grids below: for every cell of the matrix, the lane and the element index the
//     figure writes in it), plus hand-picked cells;
//   - every map a bijection onto its matrix;
//   - one warp simulated: the emitter's side (placing operands in registers, choosing
//     ldmatrix addresses, reading D back) uses mma_layout.h, the hardware's side (what
//     mma and ldmatrix do with the registers) uses the ISA tables, and the result must
//     be the plain product A * B + C, through ldmatrix from swizzled shared memory too.
//     The same simulation with mma_layout.h on both sides must agree as well;
//   - the swizzle: a bijection per row and per tile, conflict-free ldmatrix and cp.async
//     phases in a 32-bank model, and conflicting ldmatrix phases without it.
#include "codegen/kernels/mma_layout.h"
#include "tests/kernels/ptx_isa_tables.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace sf::kernels {
namespace kernels_mma_layout_test {

using namespace isa;


// What the simulated hardware believes mma and ldmatrix do.
struct Hardware {
  const char* name;
  RowCol (*a)(int lane, int i);
  RowCol (*b)(int lane, int i);
  RowCol (*c)(int lane, int i);
  RowCol (*ld)(int lane, int half, bool trans);
};
const Hardware kIsa{"the ISA figures", isa_a, isa_b, isa_c, isa_ld};
const Hardware kModule{"mma_layout.h", mma_a_elem, mma_b_elem, mma_c_elem, ldmatrix_elem};

// ---- matrices, 16-bit values and registers ------------------------------------------------

// A row-major float matrix whose accessor reports (instead of reading out of bounds)
// a position a wrong map produced.
struct Mat {
  int rows = 0, cols = 0;
  std::vector<float> v;
  Mat(int r, int c, float fill = 0) : rows(r), cols(c), v(static_cast<size_t>(r) * c, fill) {}
  float& at(int r, int c) {
    static float sink;
    if (r < 0 || r >= rows || c < 0 || c >= cols) {
      ADD_FAILURE() << "(" << r << ", " << c << ") outside " << rows << " x " << cols;
      return sink = std::numeric_limits<float>::quiet_NaN();
    }
    return v[static_cast<size_t>(r) * cols + c];
  }
  float at(int r, int c) const { return const_cast<Mat*>(this)->at(r, c); }
};

// Small integers, exact in bf16 and in every f32 sum here.
Mat random_ints(int rows, int cols, std::mt19937& rng) {
  std::uniform_int_distribution<int> d(-4, 4);
  Mat m(rows, cols);
  for (float& x : m.v) x = static_cast<float>(d(rng));
  return m;
}

Mat plain_product_plus(const Mat& a, const Mat& b, const Mat& c) {
  Mat d(a.rows, b.cols);
  for (int i = 0; i < a.rows; ++i)
    for (int j = 0; j < b.cols; ++j) {
      float s = c.at(i, j);
      for (int k = 0; k < a.cols; ++k) s += a.at(i, k) * b.at(k, j);
      d.at(i, j) = s;
    }
  return d;
}

uint16_t to_bf16(float x) { return static_cast<uint16_t>(std::bit_cast<uint32_t>(x) >> 16); }
float from_bf16(uint32_t h) { return std::bit_cast<float>((h & 0xFFFFu) << 16); }

uint32_t half_of(uint32_t reg, int half) { return (reg >> (16 * half)) & 0xFFFFu; }
void set_half(uint32_t& reg, int half, uint16_t h) {
  reg = (reg & ~(0xFFFFu << (16 * half))) | (static_cast<uint32_t>(h) << (16 * half));
}

// A warp's 16-bit operand registers (A: 4 per lane, B: 2) and f32 accumulators.
using Regs = std::array<std::array<uint32_t, 4>, kLanes>;
using Acc = std::array<std::array<float, 4>, kLanes>;

// ---- the emitter's side: mma_layout.h ---------------------------------------------------

// The A fragment of the 16 x 16 block at (m0, k0) of `a`.
Regs a_fragment(const Mat& a, int m0, int k0) {
  Regs f{};
  for (int lane = 0; lane < kLanes; ++lane)
    for (int i = 0; i < 8; ++i) {
      RowCol p = mma_a_elem(lane, i);
      set_half(f[lane][i / 2], i % 2, to_bf16(a.at(m0 + p.row, k0 + p.col)));
    }
  return f;
}

// The B fragment of the 16 x 8 block at (k0, n0) of `b` (K x N).
Regs b_fragment(const Mat& b, int k0, int n0) {
  Regs f{};
  for (int lane = 0; lane < kLanes; ++lane)
    for (int i = 0; i < 4; ++i) {
      RowCol p = mma_b_elem(lane, i);
      set_half(f[lane][i / 2], i % 2, to_bf16(b.at(k0 + p.row, n0 + p.col)));
    }
  return f;
}

Acc c_fragment(const Mat& c, int m0, int n0) {
  Acc f{};
  for (int lane = 0; lane < kLanes; ++lane)
    for (int i = 0; i < 4; ++i) {
      RowCol p = mma_c_elem(lane, i);
      f[lane][i] = c.at(m0 + p.row, n0 + p.col);
    }
  return f;
}

void store_d(const Acc& f, Mat& d, int m0, int n0) {
  for (int lane = 0; lane < kLanes; ++lane)
    for (int i = 0; i < 4; ++i) {
      RowCol p = mma_c_elem(lane, i);
      d.at(m0 + p.row, n0 + p.col) = f[lane][i];
    }
}

// `m` in a swizzled shared tile with rows of 2 * m.cols bytes, bf16, through
// swizzle_offset_b16. Bytes no element lands on stay 0xFF: a bf16 NaN.
std::vector<uint8_t> swizzled_tile(const Mat& m) {
  int row_bytes = 2 * m.cols;
  std::vector<uint8_t> smem(static_cast<size_t>(m.rows) * row_bytes, 0xFF);
  for (int r = 0; r < m.rows; ++r)
    for (int c = 0; c < m.cols; ++c) {
      int off = swizzle_offset_b16(r, c, row_bytes);
      if (off < 0 || off + 2 > static_cast<int>(smem.size())) {
        ADD_FAILURE() << "element (" << r << ", " << c << ") at byte " << off << " outside the tile";
        continue;
      }
      uint16_t h = to_bf16(m.at(r, c));
      smem[off] = static_cast<uint8_t>(h & 0xFF);
      smem[off + 1] = static_cast<uint8_t>(h >> 8);
    }
  return smem;
}

// ---- the hardware's side -----------------------------------------------------------------

// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 of one warp: gather A, B and C from
// the registers by `hw`'s maps, D = A * B + C, scatter D by `hw`'s C map. A cell no
// element lands on stays NaN, and so does every D it feeds.
void mma(const Hardware& hw, const Regs& a, const Regs& b, Acc& acc) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Mat am(16, 16, nan), bm(16, 8, nan), cm(16, 8, nan);
  for (int lane = 0; lane < kLanes; ++lane) {
    for (int i = 0; i < 8; ++i) {
      RowCol p = hw.a(lane, i);
      am.at(p.row, p.col) = from_bf16(half_of(a[lane][i / 2], i % 2));
    }
    for (int i = 0; i < 4; ++i) {
      RowCol p = hw.b(lane, i);
      bm.at(p.row, p.col) = from_bf16(half_of(b[lane][i / 2], i % 2));
      RowCol q = hw.c(lane, i);
      cm.at(q.row, q.col) = acc[lane][i];
    }
  }
  Mat dm = plain_product_plus(am, bm, cm);
  for (int lane = 0; lane < kLanes; ++lane)
    for (int i = 0; i < 4; ++i) {
      RowCol q = hw.c(lane, i);
      acc[lane][i] = dm.at(q.row, q.col);
    }
}

// ldmatrix.sync.aligned.m8n8.x<num>[.trans].shared.b16 of one warp: lane 8j + r points at
// row r of matrix j (lanes from 8 * num on are not read); register j of every lane
// receives matrix j by `hw`'s map. `phases` gets each matrix's 8 row addresses.
Regs ldmatrix(const Hardware& hw, int num, bool trans, const std::vector<uint8_t>& smem,
              const std::array<int, kLanes>& addr, std::vector<std::vector<int>>* phases = nullptr) {
  uint16_t m[4][8][8] = {};
  for (int j = 0; j < num; ++j) {
    std::vector<int> phase;
    for (int r = 0; r < 8; ++r) {
      int a = addr[8 * j + r];
      phase.push_back(a);
      if (a < 0 || a % 16 != 0 || a + 16 > static_cast<int>(smem.size())) {
        ADD_FAILURE() << "lane " << 8 * j + r << " points at byte " << a << ": not a 16-byte row of the tile";
        continue;
      }
      for (int c = 0; c < 8; ++c) m[j][r][c] = static_cast<uint16_t>(smem[a + 2 * c] | (smem[a + 2 * c + 1] << 8));
    }
    if (phases) phases->push_back(phase);
  }
  Regs out{};
  for (int lane = 0; lane < kLanes; ++lane)
    for (int j = 0; j < num; ++j)
      for (int half = 0; half < 2; ++half) {
        RowCol p = hw.ld(lane, half, trans);
        if (p.row < 0 || p.row >= 8 || p.col < 0 || p.col >= 8) {
          ADD_FAILURE() << "lane " << lane << " half " << half << ": (" << p.row << ", " << p.col << ")";
          continue;
        }
        set_half(out[lane][j], half, m[j][p.row][p.col]);
      }
  return out;
}

// ---- the bank model ----------------------------------------------------------------------
// 32 banks of 4 bytes (CUDA C++ Programming Guide, "Shared Memory"): accesses made
// together take as many wavefronts as the most distinct 4-byte words one bank must
// deliver (the same word is broadcast).

int wavefronts(const std::vector<int>& addrs, int bytes_each) {
  std::array<std::set<int>, 32> words;
  for (int a : addrs) {
    if (a < 0) {
      ADD_FAILURE() << "negative shared address " << a;
      continue;
    }
    for (int w = a / 4; w < (a + bytes_each) / 4; ++w) words[w % 32].insert(w);
  }
  size_t most = 0;
  for (const auto& s : words) most = std::max(most, s.size());
  return static_cast<int>(most);
}

int banks_touched(const std::vector<int>& addrs, int bytes_each) {
  std::set<int> banks;
  for (int a : addrs) {
    if (a < 0) {
      ADD_FAILURE() << "negative shared address " << a;
      continue;
    }
    for (int w = a / 4; w < (a + bytes_each) / 4; ++w) banks.insert(w % 32);
  }
  return static_cast<int>(banks.size());
}

std::string str(RowCol p) {
  std::ostringstream s;
  s << "(" << p.row << ", " << p.col << ")";
  return s.str();
}

// ---- the tables themselves -----------------------------------------------------------

TEST(MmaLayoutIsa, FiguresNameEveryLaneAndElementExactlyOnce) {
  auto once = [](const FigureMap& m, int elems, const char* what) {
    for (int lane = 0; lane < kLanes; ++lane)
      for (int i = 0; i < elems; ++i) EXPECT_EQ(m.times[lane][i], 1) << what << " lane " << lane << " element " << i;
  };
  once(fig_a(), 8, "A");
  once(fig_b(), 4, "B");
  once(fig_c(), 4, "C");
  once(fig_ld(false), 2, "ldmatrix");
  once(fig_ld(true), 2, "ldmatrix.trans");
}

// ---- fragment maps against the figures ---------------------------------------------------

TEST(MmaLayoutIsa, AFragmentMatchesTheFigure) {
  for (int lane = 0; lane < kLanes; ++lane)
    for (int i = 0; i < 8; ++i)
      EXPECT_EQ(mma_a_elem(lane, i), isa_a(lane, i)) << "lane " << lane << " a" << i << ": " << str(mma_a_elem(lane, i))
                                                     << ", the figure says " << str(isa_a(lane, i));
}

TEST(MmaLayoutIsa, BFragmentMatchesTheFigure) {
  for (int lane = 0; lane < kLanes; ++lane)
    for (int i = 0; i < 4; ++i)
      EXPECT_EQ(mma_b_elem(lane, i), isa_b(lane, i)) << "lane " << lane << " b" << i << ": " << str(mma_b_elem(lane, i))
                                                     << ", the figure says " << str(isa_b(lane, i));
}

TEST(MmaLayoutIsa, CFragmentMatchesTheFigure) {
  for (int lane = 0; lane < kLanes; ++lane)
    for (int i = 0; i < 4; ++i)
      EXPECT_EQ(mma_c_elem(lane, i), isa_c(lane, i)) << "lane " << lane << " c" << i << ": " << str(mma_c_elem(lane, i))
                                                     << ", the figure says " << str(isa_c(lane, i));
}

// Cells read off the figures one at a time, for the corners and the register boundaries.
TEST(MmaLayoutIsa, HandPickedCells) {
  EXPECT_EQ(mma_a_elem(0, 0), (RowCol{0, 0}));
  EXPECT_EQ(mma_a_elem(0, 1), (RowCol{0, 1}));
  EXPECT_EQ(mma_a_elem(0, 2), (RowCol{8, 0}));
  EXPECT_EQ(mma_a_elem(0, 4), (RowCol{0, 8}));
  EXPECT_EQ(mma_a_elem(5, 3), (RowCol{9, 3}));
  EXPECT_EQ(mma_a_elem(31, 7), (RowCol{15, 15}));
  EXPECT_EQ(mma_b_elem(0, 1), (RowCol{1, 0}));
  EXPECT_EQ(mma_b_elem(6, 2), (RowCol{12, 1}));
  EXPECT_EQ(mma_b_elem(31, 3), (RowCol{15, 7}));
  EXPECT_EQ(mma_c_elem(3, 1), (RowCol{0, 7}));
  EXPECT_EQ(mma_c_elem(31, 3), (RowCol{15, 7}));
  EXPECT_EQ(ldmatrix_elem(5, 1, false), (RowCol{1, 3}));
  EXPECT_EQ(ldmatrix_elem(5, 1, true), (RowCol{3, 1}));
}

// ---- bijections -------------------------------------------------------------------------

void expect_covers_once(RowCol (*f)(int, int), int elems, int rows, int cols, const char* what) {
  std::vector<int> hits(static_cast<size_t>(rows) * cols, 0);
  for (int lane = 0; lane < kLanes; ++lane)
    for (int i = 0; i < elems; ++i) {
      RowCol p = f(lane, i);
      if (p.row < 0 || p.row >= rows || p.col < 0 || p.col >= cols) {
        ADD_FAILURE() << what << " lane " << lane << " element " << i << " at " << str(p);
        continue;
      }
      ++hits[static_cast<size_t>(p.row) * cols + p.col];
    }
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c)
      EXPECT_EQ(hits[static_cast<size_t>(r) * cols + c], 1) << what << " cell (" << r << ", " << c << ")";
}

TEST(MmaLayoutBijection, AFragmentCoversTheSixteenBySixteenTileOnce) {
  expect_covers_once(mma_a_elem, 8, 16, 16, "A");  // 32 x 8 = 256 = 16 x 16
}
TEST(MmaLayoutBijection, BFragmentCoversTheSixteenByEightTileOnce) {
  expect_covers_once(mma_b_elem, 4, 16, 8, "B");  // 32 x 4 = 128 = 16 x 8
}
TEST(MmaLayoutBijection, CFragmentCoversTheSixteenByEightTileOnce) {
  expect_covers_once(mma_c_elem, 4, 16, 8, "C");
}

// ---- ldmatrix ----------------------------------------------------------------------------

TEST(LdmatrixLayout, ElementMatchesTheFigure) {
  for (bool trans : {false, true})
    for (int lane = 0; lane < kLanes; ++lane)
      for (int half = 0; half < 2; ++half)
        EXPECT_EQ(ldmatrix_elem(lane, half, trans), isa_ld(lane, half, trans))
            << (trans ? ".trans" : "") << " lane " << lane << " half " << half;
}

// The ISA's address table: .x1 reads threads 0-7, .x2 0-15, .x4 0-31, and thread 8j + r
// (the table's rows) holds the address of row r of matrix j.
TEST(LdmatrixLayout, RowProvidersMatchTheIsaAddressTable) {
  struct Row { int first_lane, matrix; };
  for (Row t : {Row{0, 0}, Row{8, 1}, Row{16, 2}, Row{24, 3}})
    for (int r = 0; r < 8; ++r)
      EXPECT_EQ(ldmatrix_row_provider(t.first_lane + r), (LdmatrixRow{t.matrix, r})) << "lane " << t.first_lane + r;
  // .x1, .x2 and .x4 each name every row of their 1, 2, 4 matrices once.
  for (int num : {1, 2, 4}) {
    std::set<std::pair<int, int>> rows;
    for (int lane = 0; lane < 8 * num; ++lane) {
      LdmatrixRow p = ldmatrix_row_provider(lane);
      EXPECT_LT(p.matrix, num) << ".x" << num << " lane " << lane;
      rows.insert({p.matrix, p.row});
    }
    EXPECT_EQ(rows.size(), static_cast<size_t>(8 * num)) << ".x" << num;
  }
}

TEST(LdmatrixLayout, X4DeliversFourMatricesOnce) {
  for (bool trans : {false, true}) {
    std::vector<int> hits(4 * 64, 0);
    for (int lane = 0; lane < kLanes; ++lane)
      for (int reg = 0; reg < 4; ++reg)
        for (int half = 0; half < 2; ++half) {
          RowCol p = ldmatrix_elem(lane, half, trans);
          ASSERT_TRUE(p.row >= 0 && p.row < 8 && p.col >= 0 && p.col < 8) << str(p);
          ++hits[reg * 64 + p.row * 8 + p.col];
        }
    for (int e = 0; e < 4 * 64; ++e) EXPECT_EQ(hits[e], 1) << (trans ? ".trans" : "") << " matrix " << e / 64 << " element " << e % 64;
  }
}

// The x4 addresses: 32 distinct 8-element rows covering the 16 x 16 block once, matrix j
// (lanes 8j..8j+7, rows in order) at the quadrant the header documents.
TEST(LdmatrixLayout, X4AddressesCoverTheBlockInFragmentOrder) {
  struct Case { const char* what; RowCol (*addr)(int); std::array<RowCol, 4> quadrant; };
  const Case cases[] = {
      {"A", [](int l) { return ldmatrix_x4_a_addr(l); }, {RowCol{0, 0}, {8, 0}, {0, 8}, {8, 8}}},
      {"B KxN", [](int l) { return ldmatrix_x4_b_addr(l, SmemB::KxN); }, {RowCol{0, 0}, {8, 0}, {0, 8}, {8, 8}}},
      {"B NxK", [](int l) { return ldmatrix_x4_b_addr(l, SmemB::NxK); }, {RowCol{0, 0}, {0, 8}, {8, 0}, {8, 8}}},
  };
  for (const Case& c : cases) {
    std::set<std::pair<int, int>> seen;
    for (int lane = 0; lane < kLanes; ++lane) {
      RowCol p = c.addr(lane);
      RowCol q = c.quadrant[lane / 8];
      EXPECT_EQ(p, (RowCol{q.row + lane % 8, q.col})) << c.what << " lane " << lane;
      seen.insert({p.row, p.col});
    }
    EXPECT_EQ(seen.size(), 32u) << c.what;
  }
  EXPECT_FALSE(ldmatrix_b_trans(SmemB::NxK));
  EXPECT_TRUE(ldmatrix_b_trans(SmemB::KxN));
}

// ---- one warp, simulated -------------------------------------------------------------------

// Registers placed by mma_layout.h, mma run by `hw`, D read back by mma_layout.h.
TEST(MmaLayoutWarpSim, MmaMatchesThePlainProduct) {
  for (const Hardware* hw : {&kIsa, &kModule})
    for (uint32_t seed = 1; seed <= 20; ++seed) {
      std::mt19937 rng(seed);
      Mat a = random_ints(16, 16, rng), b = random_ints(16, 8, rng), c = random_ints(16, 8, rng);
      Acc acc = c_fragment(c, 0, 0);
      mma(*hw, a_fragment(a, 0, 0), b_fragment(b, 0, 0), acc);
      Mat d(16, 8);
      store_d(acc, d, 0, 0);
      Mat want = plain_product_plus(a, b, c);
      for (int i = 0; i < 16; ++i)
        for (int j = 0; j < 8; ++j)
          ASSERT_EQ(d.at(i, j), want.at(i, j)) << "hardware " << hw->name << ", seed " << seed << ", D(" << i << ", " << j << ")";
    }
}

// ldmatrix.x4 of a 16 x 16 block of a swizzled A tile (32 rows x K, K = 32 or 64: rows of
// 64 or 128 bytes), at every warp row offset and k step, gives exactly the registers
// a_fragment places, and each matrix (one phase) is one wavefront.
TEST(MmaLayoutWarpSim, LdmatrixOfASwizzledATileGivesTheAFragment) {
  for (const Hardware* hw : {&kIsa, &kModule})
    for (int k : {32, 64}) {
      std::mt19937 rng(static_cast<uint32_t>(k));
      Mat a = random_ints(32, k, rng);
      std::vector<uint8_t> smem = swizzled_tile(a);
      for (int m0 = 0; m0 < 32; m0 += 16)
        for (int k0 = 0; k0 < k; k0 += 16) {
          std::array<int, kLanes> addr{};
          for (int lane = 0; lane < kLanes; ++lane) {
            RowCol p = ldmatrix_x4_a_addr(lane);
            addr[lane] = swizzle_offset_b16(m0 + p.row, k0 + p.col, 2 * k);
          }
          std::vector<std::vector<int>> phases;
          Regs got = ldmatrix(*hw, 4, false, smem, addr, &phases);
          Regs want = a_fragment(a, m0, k0);
          for (int lane = 0; lane < kLanes; ++lane)
            for (int reg = 0; reg < 4; ++reg)
              ASSERT_EQ(got[lane][reg], want[lane][reg]) << "hardware " << hw->name << ", K " << k << ", block (" << m0 << ", "
                                                         << k0 << "), lane " << lane << ", register " << reg;
          for (const auto& ph : phases) EXPECT_EQ(wavefronts(ph, 16), 1) << "K " << k << ", block (" << m0 << ", " << k0 << ")";
        }
    }
}

// The same with A stored K x M (m contiguous, K = 32 rows, M = 32 or 64 columns), read
// with .trans at ldmatrix_x4_a_trans_addr: the registers must again be a_fragment's.
TEST(MmaLayoutWarpSim, LdmatrixTransOfASwizzledKxMTileGivesTheAFragment) {
  for (const Hardware* hw : {&kIsa, &kModule})
    for (int m : {32, 64}) {
      std::mt19937 rng(static_cast<uint32_t>(100 + m));
      Mat a = random_ints(m, 32, rng);  // M x K
      Mat stored(32, m);                // K x M, as it sits in shared memory
      for (int i = 0; i < m; ++i)
        for (int kk = 0; kk < 32; ++kk) stored.at(kk, i) = a.at(i, kk);
      std::vector<uint8_t> smem = swizzled_tile(stored);
      for (int m0 = 0; m0 < m; m0 += 16)
        for (int k0 = 0; k0 < 32; k0 += 16) {
          std::array<int, kLanes> addr{};
          for (int lane = 0; lane < kLanes; ++lane) {
            RowCol p = ldmatrix_x4_a_trans_addr(lane);
            addr[lane] = swizzle_offset_b16(k0 + p.row, m0 + p.col, 2 * m);
          }
          std::vector<std::vector<int>> phases;
          Regs got = ldmatrix(*hw, 4, /*trans=*/true, smem, addr, &phases);
          Regs want = a_fragment(a, m0, k0);
          for (int lane = 0; lane < kLanes; ++lane)
            for (int reg = 0; reg < 4; ++reg)
              ASSERT_EQ(got[lane][reg], want[lane][reg]) << "hardware " << hw->name << ", M " << m << ", block (" << m0
                                                         << ", " << k0 << "), lane " << lane << ", register " << reg;
          for (const auto& ph : phases) EXPECT_EQ(wavefronts(ph, 16), 1) << "M " << m << ", block (" << m0 << ", " << k0 << ")";
        }
    }
}

// The B tile (K = 32 rows x N, or N rows x K = 32; N and K 32 or 64) read with x4
// (two n8 tiles) and with x2 (one; lanes 16..31 point nowhere), .trans for KxN only.
TEST(MmaLayoutWarpSim, LdmatrixOfASwizzledBTileGivesTheBFragments) {
  for (const Hardware* hw : {&kIsa, &kModule})
    for (SmemB layout : {SmemB::KxN, SmemB::NxK})
      for (int width : {32, 64}) {
        const char* lname = layout == SmemB::KxN ? "KxN" : "NxK";
        int kdim = layout == SmemB::KxN ? 32 : width, ndim = layout == SmemB::KxN ? width : 32;
        std::mt19937 rng(static_cast<uint32_t>(width + 7 * static_cast<int>(layout)));
        Mat b = random_ints(kdim, ndim, rng);  // K x N
        Mat stored = b;                        // as it sits in shared memory
        if (layout == SmemB::NxK) {
          stored = Mat(ndim, kdim);
          for (int kk = 0; kk < kdim; ++kk)
            for (int n = 0; n < ndim; ++n) stored.at(n, kk) = b.at(kk, n);
        }
        std::vector<uint8_t> smem = swizzled_tile(stored);
        for (int k0 = 0; k0 < kdim; k0 += 16)
          for (int n0 = 0; n0 < ndim; n0 += 16)
            for (int num : {2, 4}) {
              std::array<int, kLanes> addr{};
              for (int lane = 0; lane < kLanes; ++lane) {
                RowCol p = ldmatrix_x4_b_addr(lane, layout);
                RowCol at = layout == SmemB::KxN ? RowCol{k0 + p.row, n0 + p.col} : RowCol{n0 + p.row, k0 + p.col};
                addr[lane] = lane < 8 * num ? swizzle_offset_b16(at.row, at.col, 2 * stored.cols) : -1;
              }
              std::vector<std::vector<int>> phases;
              Regs got = ldmatrix(*hw, num, ldmatrix_b_trans(layout), smem, addr, &phases);
              for (int tile = 0; tile < num / 2; ++tile) {
                Regs want = b_fragment(b, k0, n0 + 8 * tile);
                for (int lane = 0; lane < kLanes; ++lane)
                  for (int reg = 0; reg < 2; ++reg)
                    ASSERT_EQ(got[lane][2 * tile + reg], want[lane][reg])
                        << "hardware " << hw->name << ", " << lname << " width " << width << ", .x" << num << ", block (" << k0
                        << ", " << n0 << "), n8 tile " << tile << ", lane " << lane << ", register " << reg;
              }
              for (const auto& ph : phases) EXPECT_EQ(wavefronts(ph, 16), 1) << lname << " width " << width;
            }
      }
}

// What the emitter will do for one warp's 16 x N strip: A (16 x K) and B (KxN or NxK)
// in swizzled shared tiles, per k step one ldmatrix.x4 of A and one per 16 columns of B,
// two mma per B load, C in and D out through the C fragment: D must be A * B + C.
TEST(MmaLayoutWarpSim, SharedTilesThroughLdmatrixAndMmaGiveThePlainProduct) {
  for (const Hardware* hw : {&kIsa, &kModule})
    for (SmemB layout : {SmemB::KxN, SmemB::NxK})
      for (int kdim : {32, 64})
        for (int ndim : {32, 64}) {
          std::mt19937 rng(static_cast<uint32_t>(kdim * 131 + ndim));
          Mat a = random_ints(16, kdim, rng), b = random_ints(kdim, ndim, rng), c = random_ints(16, ndim, rng);
          Mat bs = b;
          if (layout == SmemB::NxK) {
            bs = Mat(ndim, kdim);
            for (int kk = 0; kk < kdim; ++kk)
              for (int n = 0; n < ndim; ++n) bs.at(n, kk) = b.at(kk, n);
          }
          std::vector<uint8_t> sa = swizzled_tile(a), sb = swizzled_tile(bs);
          std::vector<Acc> acc;
          for (int n0 = 0; n0 < ndim; n0 += 8) acc.push_back(c_fragment(c, 0, n0));
          for (int k0 = 0; k0 < kdim; k0 += 16) {
            std::array<int, kLanes> addr{};
            for (int lane = 0; lane < kLanes; ++lane) {
              RowCol p = ldmatrix_x4_a_addr(lane);
              addr[lane] = swizzle_offset_b16(p.row, k0 + p.col, 2 * kdim);
            }
            Regs af = ldmatrix(*hw, 4, false, sa, addr);
            for (int n0 = 0; n0 < ndim; n0 += 16) {
              for (int lane = 0; lane < kLanes; ++lane) {
                RowCol p = ldmatrix_x4_b_addr(lane, layout);
                addr[lane] = layout == SmemB::KxN ? swizzle_offset_b16(k0 + p.row, n0 + p.col, 2 * ndim)
                                                  : swizzle_offset_b16(n0 + p.row, k0 + p.col, 2 * kdim);
              }
              Regs bf = ldmatrix(*hw, 4, ldmatrix_b_trans(layout), sb, addr);
              for (int tile = 0; tile < 2; ++tile) {
                Regs one{};
                for (int lane = 0; lane < kLanes; ++lane) one[lane] = {bf[lane][2 * tile], bf[lane][2 * tile + 1], 0, 0};
                mma(*hw, af, one, acc[n0 / 8 + tile]);
              }
            }
          }
          Mat d(16, ndim);
          for (int n0 = 0; n0 < ndim; n0 += 8) store_d(acc[n0 / 8], d, 0, n0);
          Mat want = plain_product_plus(a, b, c);
          for (int i = 0; i < 16; ++i)
            for (int j = 0; j < ndim; ++j)
              ASSERT_EQ(d.at(i, j), want.at(i, j)) << "hardware " << hw->name << ", " << (layout == SmemB::KxN ? "KxN" : "NxK")
                                                   << ", K " << kdim << ", N " << ndim << ", D(" << i << ", " << j << ")";
        }
}

// ---- swizzle -------------------------------------------------------------------------------

// The formula, written out for the first 8 rows (they repeat every 8): row r's entry c is
// the physical chunk of logical chunk c.
TEST(SwizzleLayout, MatchesTheWrittenOutPattern) {
  const char* const rows64[8] = {"0123", "0123", "1032", "1032", "2301", "2301", "3210", "3210"};
  const char* const rows128[8] = {"01234567", "10325476", "23016745", "32107654",
                                  "45670123", "54761032", "67452301", "76543210"};
  for (int r = 0; r < 24; ++r) {
    for (int c = 0; c < 4; ++c) EXPECT_EQ(swizzle_chunk(r, c, 64), rows64[r % 8][c] - '0') << "64-byte row " << r << " chunk " << c;
    for (int c = 0; c < 8; ++c) EXPECT_EQ(swizzle_chunk(r, c, 128), rows128[r % 8][c] - '0') << "128-byte row " << r << " chunk " << c;
  }
}

TEST(SwizzleLayout, EveryRowIsAPermutationOfItsChunks) {
  for (int row_bytes : {64, 128})
    for (int rows : {8, 16, 32, 64, 128})
      for (int r = 0; r < rows; ++r) {
        std::set<int> phys;
        for (int c = 0; c < row_bytes / 16; ++c) {
          int p = swizzle_chunk(r, c, row_bytes);
          EXPECT_TRUE(p >= 0 && p < row_bytes / 16) << row_bytes << "-byte row " << r << " chunk " << c << " -> " << p;
          phys.insert(p);
        }
        EXPECT_EQ(phys.size(), static_cast<size_t>(row_bytes / 16)) << row_bytes << "-byte row " << r;
      }
}

// Every element of the tile lands on its own 2 bytes inside its own row, and the 8
// elements of a chunk stay contiguous and in order (ldmatrix and cp.async move 16 bytes).
TEST(SwizzleLayout, EveryElementLandsOnceWithChunksKeptWhole) {
  for (int row_bytes : {64, 128})
    for (int rows : {8, 16, 32, 64, 128}) {
      std::vector<int> hits(static_cast<size_t>(rows) * row_bytes / 2, 0);
      for (int r = 0; r < rows; ++r)
        for (int c = 0; c < row_bytes / 2; ++c) {
          int off = swizzle_offset_b16(r, c, row_bytes);
          ASSERT_TRUE(off >= r * row_bytes && off < (r + 1) * row_bytes && off % 2 == 0)
              << row_bytes << "-byte rows, (" << r << ", " << c << ") at " << off;
          EXPECT_EQ(off, swizzle_offset_b16(r, c - c % 8, row_bytes) + 2 * (c % 8));
          EXPECT_EQ(off % 16, 2 * (c % 8));
          ++hits[off / 2];
        }
      for (size_t e = 0; e < hits.size(); ++e) EXPECT_EQ(hits[e], 1) << row_bytes << "-byte rows, " << rows << " rows, halfword " << e;
    }
}

// One ldmatrix phase: 8 consecutive rows (any start, not only multiples of 8), one
// logical chunk. 32 distinct banks, one wavefront.
TEST(SwizzleLayout, LdmatrixPhasesAreConflictFree) {
  for (int row_bytes : {64, 128})
    for (int rows : {8, 16, 32, 64, 128})
      for (int r0 = 0; r0 + 8 <= rows; ++r0)
        for (int c = 0; c < row_bytes / 16; ++c) {
          std::vector<int> phase;
          for (int r = r0; r < r0 + 8; ++r) phase.push_back(swizzle_offset_b16(r, 8 * c, row_bytes));
          EXPECT_EQ(banks_touched(phase, 16), 32) << row_bytes << "-byte rows, rows " << r0 << ".." << r0 + 7 << ", chunk " << c;
          EXPECT_EQ(wavefronts(phase, 16), 1) << row_bytes << "-byte rows, rows " << r0 << ".." << r0 + 7 << ", chunk " << c;
        }
}

// cp.async of a tile, 16 bytes per thread, thread t copying the t-th chunk of the tile in
// row-major order (the global tile's order): a quarter warp (8 consecutive chunks: one
// 128-byte row, or two 64-byte rows) writes 32 distinct banks.
TEST(SwizzleLayout, CpAsyncPhasesAreConflictFree) {
  for (int row_bytes : {64, 128})
    for (int rows : {8, 16, 32, 64, 128}) {
      int chunks = row_bytes / 16;
      for (int q0 = 0; q0 < rows * chunks; q0 += 8) {
        std::vector<int> phase;
        for (int q = q0; q < q0 + 8; ++q) phase.push_back(swizzle_offset_b16(q / chunks, 8 * (q % chunks), row_bytes));
        EXPECT_EQ(banks_touched(phase, 16), 32) << row_bytes << "-byte rows, chunks " << q0 << "..";
        EXPECT_EQ(wavefronts(phase, 16), 1) << row_bytes << "-byte rows, chunks " << q0 << "..";
      }
    }
}

// The swizzle earns its place: in the plain row-major layout the same ldmatrix phase hits
// one 16-byte bank group 8 times (128-byte rows) or two groups 4 times (64-byte rows).
TEST(SwizzleLayout, WithoutTheXorLdmatrixPhasesConflict) {
  for (int row_bytes : {64, 128})
    for (int c = 0; c < row_bytes / 16; ++c) {
      std::vector<int> plain, swizzled;
      for (int r = 0; r < 8; ++r) {
        plain.push_back(r * row_bytes + 16 * c);
        swizzled.push_back(swizzle_offset_b16(r, 8 * c, row_bytes));
      }
      EXPECT_EQ(wavefronts(plain, 16), row_bytes == 128 ? 8 : 4) << row_bytes << "-byte rows, chunk " << c;
      EXPECT_EQ(banks_touched(plain, 16), row_bytes == 128 ? 4 : 8) << row_bytes << "-byte rows, chunk " << c;
      EXPECT_EQ(wavefronts(swizzled, 16), 1) << row_bytes << "-byte rows, chunk " << c;
    }
}

}  // namespace kernels_mma_layout_test
}  // namespace sf::kernels
