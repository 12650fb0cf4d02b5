#include "codegen/dist/schedule.h"

#include <algorithm>
#include <map>

namespace sf {

// A list scheduler over the program's dependence graph (a step depends on the
// steps producing its operands, a Wait on its Start, a Start on the previous
// Start). At every point it takes, in this order: a ready Start (a collective goes
// out as soon as its operand exists), a ready local step, and only when nothing
// else can run, the oldest ready Wait. Ties go to the earlier step of the lowered
// program, so the result is deterministic and the same on every rank.
//
// Except for a ring shift's Wait (a decomposed collective matmul): it is sunk to its
// first user in program order and no further. An all-gather ring's step is [wait
// for shard s, shard s's chain, next shift]: the next shift needs the shard that
// arrived, so sinking its wait past the later shards' chains would leave the ring
// nothing to hide behind. (A reduce-scatter's chunks are first used by the rank's
// own chunk's matmul, which comes last, so their waits sink to it.)
LocalProgram schedule(LocalProgram p) {
  const std::vector<LocalStep>& st = p.steps;
  size_t n = st.size();
  std::map<int, size_t> producer, start_of;
  for (size_t i = 0; i < n; ++i) {
    if (st[i].out >= 0) producer[st[i].out] = i;
    for (int v : st[i].outs) producer[v] = i;
    if (st[i].kind == LocalStep::Kind::Start) start_of[st[i].handle] = i;
  }
  std::vector<std::vector<size_t>> users(n);
  std::vector<int> missing(n, 0);
  auto depend = [&](size_t on, size_t who) {
    users[on].push_back(who);
    ++missing[who];
  };
  size_t prev_start = n;
  for (size_t i = 0; i < n; ++i) {
    for (int v : st[i].in)
      if (auto it = producer.find(v); it != producer.end()) depend(it->second, i);
    if (st[i].kind == LocalStep::Kind::Wait) depend(start_of.at(st[i].handle), i);
    if (st[i].kind == LocalStep::Kind::Start) {
      if (prev_start < n) depend(prev_start, i);
      prev_start = i;
    }
  }
  // Ring waits: the index of their first user in program order (n if none).
  std::map<size_t, size_t> ring_wait_use;
  for (size_t i = 0; i < n; ++i) {
    if (st[i].kind != LocalStep::Kind::Wait || st[start_of.at(st[i].handle)].ring_steps == 0) continue;
    size_t first = n;
    for (size_t u : users[i]) first = std::min(first, u);
    ring_wait_use[i] = first;
  }
  auto rank_of = [&](size_t i) {
    switch (st[i].kind) {
      case LocalStep::Kind::Start: return 0;
      case LocalStep::Kind::Wait: return 2;
      default: return 1;
    }
  };
  std::vector<bool> done(n, false);
  std::vector<LocalStep> order;
  order.reserve(n);
  for (size_t k = 0; k < n; ++k) {
    size_t pick = n;
    for (size_t i = 0; i < n; ++i)
      if (!done[i] && missing[i] == 0 && (pick == n || rank_of(i) < rank_of(pick))) pick = i;
    if (rank_of(pick) == 1)  // a local step: unless a ring wait's user comes before it
      for (const auto& [w, use] : ring_wait_use)
        if (!done[w] && missing[w] == 0 && use < pick) {
          pick = w;
          break;
        }
    done[pick] = true;
    for (size_t u : users[pick]) --missing[u];
    order.push_back(st[pick]);
  }
  p.steps = std::move(order);
  return p;
}

}  // namespace sf
