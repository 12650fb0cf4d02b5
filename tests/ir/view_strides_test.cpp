// Strides through views (codegen/ir/view_strides.h), worked out by hand from torch's
// view rule: a reshape keeps one stride per dim only where the dims it merges lie one
// after the other in memory.
#include <gtest/gtest.h>

#include "codegen/ir/view_strides.h"

namespace sf {
namespace ir_view_strides_test {

using S = std::vector<int64_t>;
using Opt = std::optional<S>;

TEST(ReshapeStrides, SplitsAndMergesOfDenseDims) {
  // [2, 8, 16] dense is (128, 16, 1); its last dim split in heads of 4.
  EXPECT_EQ(reshape_strides({2, 8, 16}, {128, 16, 1}, {2, 8, 4, 4}), Opt(S{128, 16, 4, 1}));
  EXPECT_EQ(reshape_strides({2, 8, 4, 4}, {128, 16, 4, 1}, {16, 16}), Opt(S{16, 1}));
  EXPECT_EQ(reshape_strides({6}, {1}, {1, 2, 1, 3}), Opt(S{0, 3, 0, 1}));
}

TEST(ReshapeStrides, SplitsOfAStridedDimKeepItsStride) {
  // Every other element of 12 ([6] at stride 2) as [2, 3]: rows 6 apart, columns 2.
  EXPECT_EQ(reshape_strides({6}, {2}, {2, 3}), Opt(S{6, 2}));
  // A transposed [4, 3] (strides (1, 4)) split along each dim on its own.
  EXPECT_EQ(reshape_strides({4, 3}, {1, 4}, {2, 2, 3}), Opt(S{2, 1, 4}));
}

TEST(ReshapeStrides, MergesOfDimsApartInMemoryHaveNone) {
  // ctx [b, h, s, d] = [2, 4, 8, 4] permuted to [b, s, h, d]: strides (128, 4, 32, 1);
  // merging h and d (32 and 1, not 4 and 1) is what torch's view refuses.
  EXPECT_EQ(reshape_strides({2, 8, 4, 4}, {128, 4, 32, 1}, {2, 8, 16}), std::nullopt);
  // A transposed matrix flattened.
  EXPECT_EQ(reshape_strides({4, 3}, {1, 4}, {12}), std::nullopt);
  // Merging across a run boundary the other way: (3, 4) dense then 2 stride-24 rows.
  EXPECT_EQ(reshape_strides({2, 3, 4}, {24, 4, 1}, {6, 4}), std::nullopt);
  EXPECT_EQ(reshape_strides({2, 3, 4}, {24, 4, 1}, {2, 12}), Opt(S{24, 1}));
}

TEST(ReshapeStrides, WrongSizesAndEmptyTensors) {
  EXPECT_EQ(reshape_strides({2, 3}, {3, 1}, {7}), std::nullopt);
  EXPECT_EQ(reshape_strides({2, 3}, {3}, {6}), std::nullopt);  // a stride missing
  EXPECT_EQ(reshape_strides({0, 3}, {1, 5}, {3, 0}), Opt(S{0, 1}));
}

Node view(OpKind op, Shape out, std::vector<std::pair<std::string, AttrValue>> attrs) {
  Node n;
  n.op = op;
  n.type = {DType::F32, std::move(out)};
  for (auto& [k, v] : attrs) n.attrs.items.emplace_back(k, v);
  return n;
}

TEST(ViewStrides, TransposePermuteAndExpand) {
  EXPECT_EQ(view_strides(view(OpKind::Transpose, {4, 3}, {{"dim0", AttrValue(int64_t{0})}, {"dim1", AttrValue(int64_t{-1})}}),
                         {3, 4}, {4, 1}),
            Opt(S{1, 4}));
  EXPECT_EQ(view_strides(view(OpKind::Permute, {4, 2, 3}, {{"dims", AttrValue(S{2, 0, 1})}}), {2, 3, 4}, {12, 4, 1}),
            Opt(S{1, 12, 4}));
  // [3, 1] to [2, 3, 5]: a new leading dim and the size-1 dim read one element.
  EXPECT_EQ(view_strides(view(OpKind::Expand, {2, 3, 5}, {{"shape", AttrValue(S{2, 3, 5})}}), {3, 1}, {1, 1}),
            Opt(S{0, 1, 0}));
  EXPECT_EQ(view_strides(view(OpKind::Slice, {2}, {}), {4}, {1}), std::nullopt);  // not a strided view
}

}  // namespace ir_view_strides_test
}  // namespace sf
