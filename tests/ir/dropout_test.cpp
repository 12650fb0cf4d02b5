// dropout's random numbers (codegen/ir/dropout.h): Philox4x32-10 against the
// published known-answer vectors, the element -> (counter, lane) mapping, and the
// keep threshold, all with values written out by hand from the definitions.
#include <gtest/gtest.h>

#include "codegen/ir/dropout.h"

namespace sf {
namespace ir_dropout_test {

// Random123's tests/kat_vectors (D. E. Shaw Research; the paper's reference
// implementation), the three "philox4x32 10" lines: counter (4 words), key (2 words),
// expected output (4 words).
struct Kat {
  PhiloxCounter ctr;
  PhiloxKey key;
  PhiloxCounter want;
};
constexpr Kat kKats[] = {
    {{0x00000000, 0x00000000, 0x00000000, 0x00000000}, {0x00000000, 0x00000000},
     {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
    {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff},
     {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
    {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0},
     {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
};

TEST(Philox4x32_10, MatchesTheKnownAnswerVectors) {
  for (const Kat& k : kKats) {
    PhiloxCounter got = philox4x32_10(k.ctr, k.key);
    for (size_t i = 0; i < 4; ++i) EXPECT_EQ(got[i], k.want[i]) << std::hex << "ctr " << k.ctr[0] << " word " << i;
  }
}

TEST(DropoutWord, FourConsecutiveElementsShareOneCounterAndTheSeedIsTheKey) {
  // Elements 0..3 of seed 0: counter 0, key 0, the first KAT line's words in order.
  for (uint64_t i = 0; i < 4; ++i) EXPECT_EQ(dropout_word(0, i), kKats[0].want[i]) << i;
  // Element 4n + l reads lane l of counter (lo32(n), hi32(n), 0, 0); the key is
  // (lo32(seed), hi32(seed)).
  const uint64_t seed = 0x299f31d0a4093822;
  const uint64_t n = 0x123456789a;  // above 2^32: the counter's second word is used
  PhiloxCounter words = philox4x32_10({0x3456789a, 0x12, 0, 0}, {0xa4093822, 0x299f31d0});
  for (uint64_t l = 0; l < 4; ++l) EXPECT_EQ(dropout_word(seed, 4 * n + l), words[l]) << l;
  EXPECT_NE(dropout_word(1, 0), dropout_word(0, 0));
}

TEST(DropoutThreshold, IsCeilOfPTimes2To32) {
  EXPECT_EQ(dropout_threshold(0.0), 0u);                        // keeps every word
  EXPECT_EQ(dropout_threshold(1.0), uint64_t{1} << 32);          // keeps none
  EXPECT_EQ(dropout_threshold(0.5), uint64_t{1} << 31);
  EXPECT_EQ(dropout_threshold(0.25), uint64_t{1} << 30);
  // 0.1 is 0x1.999999999999ap-4; times 2^32 that is 429496729.6000000238...
  EXPECT_EQ(dropout_threshold(0.1), 429496730u);
  EXPECT_EQ(dropout_threshold(0x1p-32), 1u);
  EXPECT_EQ(dropout_threshold(0x1p-40), 1u);  // the smallest p still drops word 0
  // The integer test is the uniform test: u = w * 2^-32 >= p  <=>  w >= threshold.
  for (double p : {0.1, 0.3, 0.5, 0.7, 0.9, 0x1p-33})
    for (uint32_t w : {0u, 1u, 429496729u, 429496730u, 0x80000000u, 0xffffffffu, 0x7fffffffu})
      EXPECT_EQ(dropout_uniform(w) >= p, w >= dropout_threshold(p)) << p << " " << w;
  EXPECT_EQ(dropout_uniform(0xffffffffu), 1.0 - 0x1p-32);
}

TEST(DropoutScale, IsOneOverOneMinusPAndZeroForPOne) {
  EXPECT_EQ(dropout_scale(0.0), 1.0);
  EXPECT_EQ(dropout_scale(0.5), 2.0);
  EXPECT_EQ(dropout_scale(0.75), 4.0);
  EXPECT_EQ(dropout_scale(1.0), 0.0);
}

TEST(DropoutIndex, BlockOriginAndGlobalStrides) {
  Attrs whole = normalize_attrs(OpKind::Dropout, {}, {{"seed", int64_t{1}}});
  DropoutIndex a = dropout_index({3, 4}, whole);
  EXPECT_EQ(a.base, 0);
  EXPECT_EQ(a.strides, (std::vector<int64_t>{4, 1}));
  // Rows 2.. and columns 3.. of a [5, 7] tensor: element (0, 0) is 2 * 7 + 3.
  Attrs block = normalize_attrs(OpKind::Dropout, {},
                                {{"seed", int64_t{1}}, {"origin", std::vector<int64_t>{2, 3}},
                                 {"global_shape", std::vector<int64_t>{5, 7}}});
  DropoutIndex b = dropout_index({2, 4}, block);
  EXPECT_EQ(b.base, 17);
  EXPECT_EQ(b.strides, (std::vector<int64_t>{7, 1}));
}

}  // namespace ir_dropout_test
}  // namespace sf
