// kv_tma_layout (attention.h): the tensor map TMA reads k's or v's heads through,
// from the operand's index map. The maps here are written by hand as the views
// make them (element.h's strided steps); the expected dims and byte strides are the
// layouts worked out in the comments. The simulated kernels that read through such
// maps are in flash_attention_wgmma_test.cpp (TmaReadsHeadsOfPermutedProjections).
#include <gtest/gtest.h>

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
}  // namespace sf
