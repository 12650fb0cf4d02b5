// The one collective kind (issue 17: it was spelled as an enum in the Gloo backend,
// another in the NCCL one, and strings in Plan steps): what the runtime's
// communicators run, the Plan's collective steps name, and the benchmarks sweep.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace sf {

enum class CollectiveKind : uint8_t { AllReduce, AllGather, ReduceScatter, AllToAll };
inline constexpr CollectiveKind kAllCollectives[] = {CollectiveKind::AllReduce, CollectiveKind::AllGather,
                                                     CollectiveKind::ReduceScatter, CollectiveKind::AllToAll};

// "all_reduce", "all_gather", "reduce_scatter", "all_to_all": the names of the `.sf`
// ops, the Plan's step ops and nccl-tests' binaries.
constexpr std::string_view collective_name(CollectiveKind c) {
  switch (c) {
    case CollectiveKind::AllReduce: return "all_reduce";
    case CollectiveKind::AllGather: return "all_gather";
    case CollectiveKind::ReduceScatter: return "reduce_scatter";
    case CollectiveKind::AllToAll: return "all_to_all";
  }
  return "?";
}

// nccl-tests' bus bandwidth factor (busbw = algbw x bus_factor): the share of the
// buffer each rank's busiest link carries in a ring over n members, 2(n-1)/n for
// all_reduce, (n-1)/n for the others; 0 for a group of one. The timeline model and
// bench_collectives both use it.
constexpr double bus_factor(CollectiveKind c, int n) {
  if (n <= 1) return 0.0;
  const double f = static_cast<double>(n - 1) / n;
  return c == CollectiveKind::AllReduce ? 2 * f : f;
}

// The kind a name spells; nullopt for any other text.
constexpr std::optional<CollectiveKind> parse_collective(std::string_view s) {
  for (CollectiveKind c : kAllCollectives)
    if (collective_name(c) == s) return c;
  return std::nullopt;
}

}  // namespace sf
