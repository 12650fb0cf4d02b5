#include "runtime/core/collective_check.h"

namespace sf {

namespace {

// Element extents beyond 2^62 are refused before they are summed, so no sum of a
// group's sizes (at most 2^16 members in a Plan, far fewer in a program) overflows.
constexpr int64_t kMaxExtent = int64_t{1} << 46;

std::optional<std::string> sizes_fit(const std::vector<int64_t>& sizes, int members, const char* what) {
  if (static_cast<int>(sizes.size()) != members)
    return std::string(what) + " has " + std::to_string(sizes.size()) + " entries for a group of " +
           std::to_string(members);
  for (int64_t x : sizes)
    if (x < 0 || x > kMaxExtent) return std::string(what) + " has the entry " + std::to_string(x);
  return std::nullopt;
}

int64_t sum(const std::vector<int64_t>& v) {
  int64_t s = 0;
  for (int64_t x : v) s += x;
  return s;
}

}  // namespace

Result<TensorType> collective_result(const CollectiveCall& c) {
  auto fail = [](const std::string& m) { return Diag{"", {}, m}; };
  const int rank = c.in.rank();
  const std::string name(collective_name(c.kind));
  if (c.members < 1 || c.member < 0 || c.member >= c.members) return fail("this rank is not a member of its group");
  TensorType out = c.in;
  auto dim_ok = [&](int d) { return d >= 0 && d < rank; };
  switch (c.kind) {
    case CollectiveKind::AllReduce: return out;
    case CollectiveKind::AllGather: {
      if (!dim_ok(c.dim)) return fail("all_gather along dim " + std::to_string(c.dim) + " of " + c.in.str());
      if (auto e = sizes_fit(c.sizes, c.members, "sizes")) return fail(*e);
      const int64_t mine = c.sizes[static_cast<size_t>(c.member)];
      if (mine != c.in.shape[static_cast<size_t>(c.dim)])
        return fail("sizes[" + std::to_string(c.member) + "] = " + std::to_string(mine) + ", but this member's " +
                    c.in.str() + " has " + std::to_string(c.in.shape[static_cast<size_t>(c.dim)]) + " along dim " +
                    std::to_string(c.dim));
      out.shape[static_cast<size_t>(c.dim)] = sum(c.sizes);
      return out;
    }
    case CollectiveKind::ReduceScatter:
    case CollectiveKind::AllToAll: {
      if (!dim_ok(c.dim)) return fail(name + " along dim " + std::to_string(c.dim) + " of " + c.in.str());
      if (auto e = sizes_fit(c.sizes, c.members, "sizes")) return fail(*e);
      if (sum(c.sizes) != c.in.shape[static_cast<size_t>(c.dim)])
        return fail("sizes " + shape_str(c.sizes) + " do not cut dim " + std::to_string(c.dim) + " of " + c.in.str());
      out.shape[static_cast<size_t>(c.dim)] = c.sizes[static_cast<size_t>(c.member)];
      if (c.kind == CollectiveKind::ReduceScatter) return out;
      if (!dim_ok(c.dim2)) return fail("all_to_all concatenating along dim " + std::to_string(c.dim2) + " of " + c.in.str());
      if (auto e = sizes_fit(c.sizes2, c.members, "sizes2")) return fail(*e);
      out.shape[static_cast<size_t>(c.dim2)] = sum(c.sizes2);
      return out;
    }
  }
  return fail(name + " is not a collective");
}

std::optional<std::string> collective_mismatch(const CollectiveCall& a, const CollectiveCall& b) {
  const std::string an(collective_name(a.kind)), bn(collective_name(b.kind));
  if (a.kind != b.kind) return an + " meets " + bn;
  if (a.members != b.members) return "groups of " + std::to_string(a.members) + " and " + std::to_string(b.members);
  if (a.in.dtype != b.in.dtype) return an + " of " + a.in.str() + " meets one of " + b.in.str();
  if ((a.kind == CollectiveKind::AllReduce || a.kind == CollectiveKind::ReduceScatter) && a.op != b.op)
    return an + " reducing by " + std::string(reduce_op_name(a.op)) + " meets one by " +
           std::string(reduce_op_name(b.op));
  if (a.kind != CollectiveKind::AllReduce && (a.dim != b.dim || (a.kind == CollectiveKind::AllToAll && a.dim2 != b.dim2)))
    return an + " along dim " + std::to_string(a.dim) + " meets one along dim " + std::to_string(b.dim);
  switch (a.kind) {
    case CollectiveKind::AllReduce:
    case CollectiveKind::ReduceScatter:
      if (a.in.shape != b.in.shape) return an + " of " + a.in.str() + " meets one of " + b.in.str();
      if (a.sizes != b.sizes) return an + " with sizes " + shape_str(a.sizes) + " meets one with " + shape_str(b.sizes);
      return std::nullopt;
    case CollectiveKind::AllGather: {
      if (a.sizes != b.sizes) return an + " with sizes " + shape_str(a.sizes) + " meets one with " + shape_str(b.sizes);
      Shape sa = a.in.shape, sb = b.in.shape;
      if (sa.size() == sb.size()) sa[static_cast<size_t>(a.dim)] = sb[static_cast<size_t>(a.dim)] = 0;
      if (sa != sb) return an + " of " + a.in.str() + " meets one of " + b.in.str() + " (only dim " +
                           std::to_string(a.dim) + " may differ)";
      return std::nullopt;
    }
    case CollectiveKind::AllToAll: {
      // What a sends b: a's operand with dim cut to a.sizes[b]. What b takes from
      // a: b's operand with dim cut to b.sizes[b] and dim2 to b.sizes2[a].
      for (int pass = 0; pass < 2; ++pass) {
        const CollectiveCall& from = pass ? b : a;
        const CollectiveCall& to = pass ? a : b;
        if (from.in.rank() != to.in.rank()) return an + " of " + from.in.str() + " meets one of " + to.in.str();
        Shape sent = from.in.shape, expected = to.in.shape;
        sent[static_cast<size_t>(from.dim)] = from.sizes[static_cast<size_t>(to.member)];
        expected[static_cast<size_t>(to.dim)] = to.sizes[static_cast<size_t>(to.member)];
        expected[static_cast<size_t>(to.dim2)] = to.sizes2[static_cast<size_t>(from.member)];
        if (sent != expected)
          return "all_to_all: member " + std::to_string(from.member) + " sends member " + std::to_string(to.member) +
                 " a chunk of " + shape_str(sent) + ", which expects " + shape_str(expected);
      }
      return std::nullopt;
    }
  }
  return an + " is not a collective";
}

}  // namespace sf
