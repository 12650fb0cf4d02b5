// kv_tma_layout (attention.h): the tensor map TMA reads k's or v's heads through,
// from the operand's index map. The maps here are written by hand as the views
// make them (element.h's strided steps); the expected dims and byte strides are the
// layouts worked out in the comments. The simulated kernels that read through such
// maps are in flash_attention_wgmma_test.cpp (TmaReadsHeadsOfPermutedProjections).
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>

#include "codegen/kernels/attention.h"
#include "codegen/kernels/element.h"

namespace sf {
namespace kernels_attention_tma_test {

kernels::IndexMap steps(std::vector<kernels::StridedStep> s) {
  kernels::IndexMap m;
  m.steps = std::move(s);
  return m;
}

// Dense heads [4, 8, 64]: one head dim; a row 128 bytes, a head 1024.
TEST(KvTmaLayout, DenseHeadsAreOneHeadDim) {
  Result<KvTmaLayout> l = kv_tma_layout(kernels::IndexMap{}, 4, 8, 64, 4 * 8 * 64, 2);
  ASSERT_TRUE(l) << l.error().message;
  EXPECT_EQ(l->rank, 3);
  EXPECT_EQ(l->dims, (std::array<int64_t, 5>{64, 8, 4, 1, 1}));
  EXPECT_EQ(l->strides[0], 128);
  EXPECT_EQ(l->strides[1], 1024);
  EXPECT_EQ(l->head_dims, (std::vector<KvTmaLayout::HeadDim>{{1, 4, 0}}));
}

// A projection [2 batches, 8 rows, 4 heads, 64] seen as [2, 4, 8, 64]: one step,
// strides (in elements) 8*4*64 = 2048, 64, 256, 1. Head h = 4 b + n lies at
// 2048 b + 64 n: dims (64, 8, 4 heads, 2 batches), bytes 512 a row, 128 a head,
// 4096 a batch.
TEST(KvTmaLayout, PermutedProjectionTakesAHeadAndABatchDim) {
  Result<KvTmaLayout> l = kv_tma_layout(steps({{{2, 4, 8, 64}, {2048, 64, 256, 1}, 0}}), 8, 8, 64, 4096, 2);
  ASSERT_TRUE(l) << l.error().message;
  EXPECT_EQ(l->rank, 4);
  EXPECT_EQ(l->dims, (std::array<int64_t, 5>{64, 8, 4, 2, 1}));
  EXPECT_EQ(l->strides, (std::array<int64_t, 4>{512, 128, 4096, 0}));
  EXPECT_EQ(l->head_dims, (std::vector<KvTmaLayout::HeadDim>{{1, 4, 0}, {4, 2, 0}}));
}

// k of a fused qkv projection: [2 batches, 8 rows, 3 x 4 heads of 64] (rows 768
// elements apart), k its heads 4 to 7, seen as [2, 4, 8, 64]: one step, strides 6144,
// 64, 768, 1, starting at 256. The first head sits 4 heads in: the head dim's
// coordinates start at 4 and its extent is 8; the batch dim starts at 0.
TEST(KvTmaLayout, ASliceOfHeadsStartsItsHeadCoordinates) {
  Result<KvTmaLayout> l = kv_tma_layout(steps({{{2, 4, 8, 64}, {6144, 64, 768, 1}, 256}}), 8, 8, 64, 12288, 2);
  ASSERT_TRUE(l) << l.error().message;
  EXPECT_EQ(l->rank, 4);
  EXPECT_EQ(l->dims, (std::array<int64_t, 5>{64, 8, 8, 2, 1}));
  EXPECT_EQ(l->strides, (std::array<int64_t, 4>{1536, 128, 12288, 0}));
  EXPECT_EQ(l->head_dims, (std::vector<KvTmaLayout::HeadDim>{{1, 4, 4}, {4, 2, 0}}));
  // v, heads 8 to 11: the last element is the input's last.
  Result<KvTmaLayout> v = kv_tma_layout(steps({{{2, 4, 8, 64}, {6144, 64, 768, 1}, 512}}), 8, 8, 64, 12288, 2);
  ASSERT_TRUE(v) << v.error().message;
  EXPECT_EQ(v->dims, (std::array<int64_t, 5>{64, 8, 12, 2, 1}));
  EXPECT_FALSE(kv_tma_layout(steps({{{2, 4, 8, 64}, {6144, 64, 768, 1}, 512}}), 8, 8, 64, 12287, 2))
      << "one element short of the input";
}

// GQA on top, as the LLaMA block's v: the operand [2, 8, 8, 64] repeats each of 4 kv
// heads twice (step 1: [2 * 4, 2, 8 * 64] with strides 512, 0, 1 over the permuted
// view's flat index), then the permute as above (step 2). Head h = 8 b + 2 n + r lies
// at 2048 b + 64 n: the repeat takes no dim.
TEST(KvTmaLayout, RepeatedHeadsTakeNoDim) {
  Result<KvTmaLayout> l =
      kv_tma_layout(steps({{{8, 2, 512}, {512, 0, 1}, 0}, {{2, 4, 8, 64}, {2048, 64, 256, 1}, 0}}), 16, 8, 64, 4096, 2);
  ASSERT_TRUE(l) << l.error().message;
  EXPECT_EQ(l->rank, 4);
  EXPECT_EQ(l->dims, (std::array<int64_t, 5>{64, 8, 4, 2, 1}));
  EXPECT_EQ(l->strides, (std::array<int64_t, 4>{512, 128, 4096, 0}));
  EXPECT_EQ(l->head_dims, (std::vector<KvTmaLayout::HeadDim>{{2, 4, 0}, {8, 2, 0}}));
  // One kv head repeated for all: a dim of 1, coordinate 0.
  Result<KvTmaLayout> one = kv_tma_layout(steps({{{4, 512}, {0, 1}, 0}}), 4, 8, 64, 512, 2);
  ASSERT_TRUE(one) << one.error().message;
  EXPECT_EQ(one->rank, 3);
  EXPECT_EQ(one->dims[2], 1);
}

TEST(KvTmaLayout, WhatTmaCannotReadIsRefusedSayingWhy) {
  struct Case {
    const char* what;
    kernels::IndexMap map;
    int64_t heads, rows, cols, numel;
    std::string want;
  };
  kernels::IndexMap computed;
  computed.base = kernels::kComputedIndex;
  const std::vector<Case> cases = {
      // [4, 64, 8] transposed: a row's columns 8 apart.
      {"columns apart", steps({{{4, 8, 64}, {512, 1, 8}, 0}}), 4, 8, 64, 2048, "columns are 8 elements apart"},
      // A slice starting one row into the heads (keys past S would not read as zeros).
      {"a slice of rows", steps({{{4, 512}, {512, 1}, 64}}), 4, 8, 64, 2560,
       "the first head starts 64 elements into the input, not a whole number of heads"},
      // Rows 4 elements (8 bytes) apart: a [8, 4] slab with 4-wide rows.
      {"rows off 16 bytes", steps({{{2, 8, 64}, {64, 4, 1}, 0}}), 2, 8, 64, 4096, "not a positive multiple of 16"},
      // Three head dims that do not merge, and GQA's repeat: fine; a fourth: not.
      {"four head dims", steps({{{2, 2, 2, 2, 512}, {4096, 16384, 1024, 2048, 1}, 0}}), 16, 8, 64, 32768,
       "more than 3 dims of a tensor map"},
      {"a computed index", computed, 4, 8, 64, 2048, "computed index"},
      // A reshape across rows and columns: [2 heads, 8 rows, 64] read as [2, 11, 48], so
      // that both a row's 64 columns and the rows run across the dims of 48 and 11.
      {"a reshape across rows and columns", steps({{{2, 11, 48}, {528, 48, 1}, 0}}), 2, 8, 64, 1056,
       "mixes the digits of heads, rows or columns"},
      // A view that reaches past its input (the map is checked against the param).
      {"past the input", kernels::IndexMap{}, 4, 8, 64, 2047, "reach element 2047 of an input of 2047"},
  };
  for (const Case& c : cases) {
    Result<KvTmaLayout> l = kv_tma_layout(c.map, c.heads, c.rows, c.cols, c.numel, 2);
    ASSERT_FALSE(l) << c.what;
    EXPECT_NE(l.error().message.find(c.want), std::string::npos) << c.what << ": " << l.error().message;
  }
}

}  // namespace kernels_attention_tma_test

namespace kernels_attention_tma_fuzz {

// The flat index `x` through `m`'s steps, as emit_index_map computes it.
int64_t evaluate(const kernels::IndexMap& m, int64_t x) {
  for (const kernels::StridedStep& s : m.steps) {
    int64_t off = s.offset, rest = x;
    for (size_t d = s.shape.size(); d-- > 0;) {
      off += (rest % s.shape[d]) * s.strides[d];
      rest /= s.shape[d];
    }
    x = off;
  }
  return x;
}

// A random view of a dense tensor of `n` elements: a factorisation of n into dims,
// permuted, one dim maybe sliced and one broadcast dim maybe inserted. Returns the
// step (from the view's flat index to the tensor's) and the view's shape.
std::pair<kernels::StridedStep, std::vector<int64_t>> random_view(std::mt19937& rng, int64_t n) {
  std::vector<int64_t> dims;
  for (int64_t left = n; left > 1;) {
    std::vector<int64_t> divs;
    for (int64_t d = 2; d <= left; ++d)
      if (left % d == 0) divs.push_back(d);
    const int64_t d = divs[std::uniform_int_distribution<size_t>(0, std::min<size_t>(divs.size() - 1, 3))(rng)];
    dims.push_back(d);
    left /= d;
  }
  if (dims.empty()) dims.push_back(1);
  std::vector<int64_t> strides(dims.size(), 1);
  for (size_t d = dims.size() - 1; d-- > 0;) strides[d] = strides[d + 1] * dims[d + 1];
  std::vector<size_t> perm(dims.size());
  for (size_t i = 0; i < perm.size(); ++i) perm[i] = i;
  if (rng() % 3 != 0) std::shuffle(perm.begin(), perm.end(), rng);
  kernels::StridedStep s;
  for (size_t i : perm) {
    s.shape.push_back(dims[i]);
    s.strides.push_back(strides[i]);
  }
  // A slice (in any step: the next view is built over the sliced shape).
  if (rng() % 3 == 0) {
    const size_t d = rng() % s.shape.size();
    if (s.shape[d] > 1) {
      const int64_t len = std::uniform_int_distribution<int64_t>(1, s.shape[d] - 1)(rng);
      const int64_t start = std::uniform_int_distribution<int64_t>(0, s.shape[d] - len)(rng);
      s.offset += start * s.strides[d];
      s.shape[d] = len;
    }
  }
  if (rng() % 4 == 0) {  // a repeat (expand)
    const size_t at = rng() % (s.shape.size() + 1);
    s.shape.insert(s.shape.begin() + static_cast<std::ptrdiff_t>(at), 2);
    s.strides.insert(s.strides.begin() + static_cast<std::ptrdiff_t>(at), 0);
  }
  return {s, s.shape};
}

// Random chains of one to three views over a param, the operand's rows and columns
// its last two dims or any split of its elements (across the views' dims): wherever kv_tma_layout accepts one, every element of every
// head lies where the layout says (its head coordinates, row and column times the
// map's strides), and the map stays inside the param. Elements of 16 bytes, so that
// the 16-byte rules leave the index arithmetic to be tested. About 880 of 6000
// chains are accepted, 44 of them through several steps. Dropping the check that
// the digits sharing a dim do not carry (apply_step's load) fails here.
TEST(KvTmaLayoutFuzz, AcceptedLayoutsAddressEveryElementAsTheViewsDo) {
  std::mt19937 rng(20261128);
  int accepted = 0, tried = 0, multi_step = 0, with_start = 0, rank4 = 0;
  for (int iter = 0; iter < 6000; ++iter) {
    // Sizes with factors 2, 3 and 5, so that views and the operand's split need not
    // align on the same digits.
    int64_t param = 1;
    while (param < 64 || (param < 2048 && rng() % 3 != 0)) param *= std::array<int64_t, 6>{2, 2, 2, 3, 3, 5}[rng() % 6];
    const int nsteps = std::uniform_int_distribution<int>(1, 3)(rng);
    // Built from the param outwards: each view's space is the next view's input.
    std::vector<kernels::StridedStep> chain;
    int64_t space = param;
    std::vector<int64_t> shape;
    for (int k = 0; k < nsteps; ++k) {
      auto [s, sh] = random_view(rng, space);
      chain.insert(chain.begin(), s);
      space = 1;
      for (int64_t d : sh) space *= d;
      shape = sh;
    }
    if (shape.size() < 2) continue;
    int64_t cols = shape.back(), rows = shape[shape.size() - 2];
    if (rng() % 2 == 0) {  // the operand's own split of the space, across the view's dims
      std::vector<int64_t> divs;
      for (int64_t d = 1; d <= space; ++d)
        if (space % d == 0) divs.push_back(d);
      cols = divs[rng() % divs.size()];
      std::vector<int64_t> rdivs;
      for (int64_t d = 1; d <= space / cols; ++d)
        if ((space / cols) % d == 0) rdivs.push_back(d);
      rows = rdivs[rng() % rdivs.size()];
    }
    const int64_t heads = space / (rows * cols);
    kernels::IndexMap m;
    for (const kernels::StridedStep& s : chain) kernels::append_step(m, s);
    ++tried;
    Result<KvTmaLayout> l = kv_tma_layout(m, heads, rows, cols, param, 16);
    if (!l) continue;
    ++accepted;
    if (m.steps.size() > 1) ++multi_step;
    if (l->rank >= 4) ++rank4;
    const int64_t sj = l->strides[0] / 16;
    int64_t last = 0;
    for (int64_t h = 0; h < heads; ++h) {
      int64_t at = 0;
      for (size_t i = 0; i < l->head_dims.size(); ++i) {
        const KvTmaLayout::HeadDim& d = l->head_dims[i];
        const int64_t c = d.start + (h / d.div) % d.radix;
        ASSERT_LT(c, l->dims[i + 2]);
        at += c * (l->strides[i + 1] / 16);
        if (d.start > 0) ++with_start;
      }
      for (int64_t j = 0; j < rows; ++j)
        for (int64_t e = 0; e < cols; ++e) {
          const int64_t want = evaluate(m, (h * rows + j) * cols + e);
          ASSERT_EQ(at + j * sj + e, want) << "iteration " << iter << ": head " << h << ", row " << j << ", col " << e
                                           << " of map " << m.str();
          last = std::max(last, want);
        }
    }
    ASSERT_LT(last, param);
  }
  // Enough of every kind was accepted for the check to mean something.
  EXPECT_GT(accepted, tried / 10) << accepted << " of " << tried;
  EXPECT_GT(multi_step, 20);
  EXPECT_GT(rank4, 20);
  EXPECT_GT(with_start, 5);
}

}  // namespace kernels_attention_tma_fuzz
}  // namespace sf
