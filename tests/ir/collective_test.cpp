// The one collective kind (runtime/core/collective.h): its names are the `.sf` ops' and
// the Plan steps' ("all_reduce", ...), every kind parses back from its name, and
// nothing else parses (another step's op, a near miss, a different case).
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "runtime/core/collective.h"
#include "codegen/ir/ops.h"

namespace sf {
namespace ir_collective_test {

TEST(CollectiveKind, NamesAreTheOpNamesAndParseBack) {
  std::set<std::string> names;
  for (CollectiveKind c : kAllCollectives) {
    const std::string n(collective_name(c));
    names.insert(n);
    EXPECT_EQ(parse_collective(n), c) << n;
    // The graph format has an op of that name (per-rank collectives, docs/graph-format.md).
    EXPECT_TRUE(find_op(n).has_value()) << n;
  }
  EXPECT_EQ(names, (std::set<std::string>{"all_reduce", "all_gather", "reduce_scatter", "all_to_all"}));
  for (const char* other : {"kernel", "gemm", "wait", "slice", "all_reduce ", "All_Reduce", "allreduce", ""})
    EXPECT_FALSE(parse_collective(other).has_value()) << other;
}

TEST(CollectiveKind, EveryCollectiveOpMapsToItsKindAndNoOtherOpDoes) {
  std::set<CollectiveKind> seen;
  for (const OpInfo& op : all_ops()) {
    std::optional<CollectiveKind> c = op_collective(op.kind);
    // redistribute is in the Collective category too, but plans its collectives.
    EXPECT_EQ(c.has_value(), op.category == OpCategory::Collective && op.kind != OpKind::Redistribute) << op.name;
    if (!c) continue;
    EXPECT_EQ(collective_name(*c), op.name);
    seen.insert(*c);
  }
  EXPECT_EQ(seen.size(), std::size(kAllCollectives));  // every kind has its op
}

}  // namespace ir_collective_test
}  // namespace sf
