// Collective-matmul rewrites: the all_gather and reduce_scatter rings, an all_reduce split in two.
#include "codegen/fusion/collective_matmul_internal.h"

#include <algorithm>
#include <cstddef>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace sf::collective_matmul_detail {

namespace {

TensorType with_extent(TensorType t, int dim, int64_t extent) {
  t.shape[static_cast<size_t>(dim)] = extent;
  return t;
}

// Where each member's block starts along the collective's dim.
std::vector<int64_t> offsets_of(const std::vector<int64_t>& sizes) {
  std::vector<int64_t> offset(sizes.size(), 0);
  for (size_t k = 1; k < sizes.size(); ++k) offset[k] = offset[k - 1] + sizes[k - 1];
  return offset;
}

int new_value(LocalProgram& p, const TensorType& t, const std::string& name) {
  p.types.push_back(t);
  p.names.push_back(name);
  return static_cast<int>(p.types.size()) - 1;
}

// Step `step` (1-based) of `steps` shifts: this member sends `value` (extent
// `send` along dim) to member `to`, `rel` places on from it, and receives extent
// `recv` from member `from` (positions in the group of n).
LocalStep shift_start(const LocalStep& like, int value, int dim, int n, int to, int rel, int64_t send, int from,
                      int64_t recv, int handle, int step, int steps) {
  LocalStep s;
  s.kind = LocalStep::Kind::Start;
  s.collective = CollectiveKind::AllToAll;
  s.mesh_dim = like.mesh_dim;
  s.dim = s.dim2 = dim;
  s.sizes.assign(static_cast<size_t>(n), 0);
  s.sizes2.assign(static_cast<size_t>(n), 0);
  s.sizes[static_cast<size_t>(to)] = send;
  s.sizes2[static_cast<size_t>(from)] = recv;
  s.in = {value};
  s.handle = handle;
  s.ring_step = step;
  s.ring_steps = steps;
  s.ring_to = rel;
  return s;
}

LocalStep wait_step(int handle, int out) {
  LocalStep w;
  w.kind = LocalStep::Kind::Wait;
  w.handle = handle;
  w.out = out;
  return w;
}

// The step producing a matmul's right operand when it is a view (transpose, permute)
// used by that matmul only: each per-shard matmul gets a copy of it, which fusion
// folds into the matmul, rather than one shared value a kernel would have to export.
std::optional<size_t> private_view(const LocalProgram& p, const LocalStep& mm) {
  const Uses u = uses_of(p);
  auto prod = u.producer.find(mm.in[1]);
  if (prod == u.producer.end()) return std::nullopt;
  const LocalStep& v = p.steps[prod->second];
  if (v.kind != LocalStep::Kind::Compute || (v.node.op != OpKind::Transpose && v.node.op != OpKind::Permute))
    return std::nullopt;
  if (u.outputs.count(mm.in[1]) || u.users.at(mm.in[1]).size() != 1) return std::nullopt;
  return prod->second;
}

// Before a per-shard copy of a matmul: a copy of its private view, if it has one.
void copy_view(LocalProgram& p, std::optional<size_t> view, LocalStep& mm_copy, std::vector<LocalStep>& block,
               int shard) {
  if (!view) return;
  LocalStep v = p.steps[*view];
  v.out = new_value(p, p.types[static_cast<size_t>(v.out)],
                    p.names[static_cast<size_t>(v.out)] + "_" + std::to_string(shard));
  mm_copy.in[1] = v.out;
  block.push_back(std::move(v));
}

// Puts the steps back in an order where every value is defined before its use and
// every wait follows its start, moving as little as it can (Kahn's algorithm taking
// the earliest ready step first; an order that already holds is kept). A spliced
// block of several branches sits at the last branch's step, after the users of the
// earlier branches' results: the stage verifier found `reshape` reading q's concat
// before it (tp_attention, --decompose always).
void restore_order(LocalProgram& p) {
  const size_t n = p.steps.size();
  std::vector<int> producer(p.types.size(), -1);  // value -> the step defining it
  std::map<int, size_t> start_of;
  for (size_t i = 0; i < n; ++i) {
    const LocalStep& s = p.steps[i];
    if (s.out >= 0) producer[static_cast<size_t>(s.out)] = static_cast<int>(i);
    for (int v : s.outs) producer[static_cast<size_t>(v)] = static_cast<int>(i);
    if (s.kind == LocalStep::Kind::Start) start_of[s.handle] = i;
  }
  std::vector<std::vector<size_t>> users(n);
  std::vector<int> pending(n, 0);
  auto depend = [&](size_t before, size_t after) {
    users[before].push_back(after);
    ++pending[after];
  };
  for (size_t i = 0; i < n; ++i) {
    const LocalStep& s = p.steps[i];
    for (int v : s.in)
      if (int d = producer[static_cast<size_t>(v)]; d >= 0 && static_cast<size_t>(d) != i) depend(static_cast<size_t>(d), i);
    if (s.kind == LocalStep::Kind::Wait)
      if (auto it = start_of.find(s.handle); it != start_of.end()) depend(it->second, i);
  }
  std::set<size_t> ready;
  for (size_t i = 0; i < n; ++i)
    if (pending[i] == 0) ready.insert(i);
  std::vector<size_t> order;
  while (!ready.empty()) {
    const size_t i = *ready.begin();
    ready.erase(ready.begin());
    order.push_back(i);
    for (size_t u : users[i])
      if (--pending[u] == 0) ready.insert(u);
  }
  if (order.size() != n) return;  // a cycle: left as it is, for the verifier to name
  std::vector<LocalStep> steps;
  for (size_t i : order) steps.push_back(std::move(p.steps[i]));
  p.steps = std::move(steps);
}

// Replaces the steps in `drop` by `block`, placed where step `at` was.
void splice(LocalProgram& p, const std::set<size_t>& drop, size_t at, std::vector<LocalStep> block) {
  std::vector<LocalStep> steps;
  for (size_t i = 0; i < p.steps.size(); ++i) {
    if (i == at)
      for (LocalStep& b : block) steps.push_back(std::move(b));
    if (!drop.count(i)) steps.push_back(std::move(p.steps[i]));
  }
  p.steps = std::move(steps);
  restore_order(p);
}

// A Slice step of `value`'s extent `e` from `offset` along `dim`, appended to
// `block`; returns the slice's value.
int slice_of(LocalProgram& p, int value, int dim, int64_t offset, int64_t e, int mesh_dim, int chunk,
             std::vector<LocalStep>& block) {
  const TensorType t = p.types[static_cast<size_t>(value)];
  LocalStep sl;
  sl.kind = LocalStep::Kind::Slice;
  sl.mesh_dim = mesh_dim;
  sl.in = {value};
  sl.shape = with_extent(t, dim, e).shape;
  sl.offset.assign(t.shape.size(), 0);
  sl.offset[static_cast<size_t>(dim)] = offset;
  sl.out = new_value(p, with_extent(t, dim, e), p.names[static_cast<size_t>(value)] + "_c" + std::to_string(chunk));
  block.push_back(sl);
  return sl.out;
}

// Appends a per-shard copy of `c` (shard j: extent e from `offset` along the
// gathered dim) on `v` (standing for the chain's input `in`); `views` gives each
// matmul step's private view, if any. The other operand of a binary step that
// varies along the shard dim (a residual, a bias along the columns) is sliced to
// the shard. Returns the copy's result.
int copy_chain(LocalProgram& p, const Chain& c, int in, int v, int j, int64_t offset, int64_t e, int mesh_dim,
               const std::map<size_t, std::optional<size_t>>& views, std::vector<LocalStep>& block) {
  int prev = in;
  for (size_t k = 0; k < c.steps.size(); ++k) {
    LocalStep step = p.steps[c.steps[k]];
    for (int& a : step.in)
      if (a == prev) a = v;
    const OpCategory cat = op_info(step.node.op).category;
    if (cat == OpCategory::Binary || cat == OpCategory::Compare) {
      const int out_rank = rank_of(p.types[static_cast<size_t>(step.out)]);
      for (int& a : step.in) {
        if (a == v) continue;
        if (const int td = term_dim(p.types[static_cast<size_t>(a)], out_rank, c.dims[k]); td >= 0)
          a = slice_of(p, a, td, offset, e, mesh_dim, j, block);
      }
    }
    prev = step.out;
    step.node.type = with_extent(p.types[static_cast<size_t>(step.out)], c.dims[k], e);
    step.out = new_value(p, step.node.type, p.names[static_cast<size_t>(step.out)] + "_s" + std::to_string(j));
    v = step.out;
    if (step.node.op == OpKind::Matmul) copy_view(p, views.at(c.steps[k]), step, block, j);
    block.push_back(std::move(step));
  }
  return v;
}

}  // namespace

void rewrite_all_gather(LocalProgram& p, const AgMatch& m, int pos) {
  const LocalStep st = p.steps[m.start];
  const std::vector<int64_t> sizes = st.sizes;
  const int n = static_cast<int>(sizes.size());
  const int d = st.dim;
  const int xg = p.steps[m.wait].out;
  const int branch_in = m.prefix.steps.empty() ? xg : p.steps[m.prefix.steps.back()].out;
  std::set<size_t> drop{m.start, m.wait};
  std::map<size_t, std::optional<size_t>> views;  // matmul step -> its private view
  std::set<int> chain_values{xg};
  for (size_t k : m.all_steps()) chain_values.insert(p.steps[k].out);
  for (size_t k : m.all_steps()) {
    drop.insert(k);
    if (p.steps[k].node.op != OpKind::Matmul) continue;
    // A right operand the chain itself computes (the gathered weight) is not a view
    // to copy beside each shard's matmul.
    views[k] = chain_values.count(p.steps[k].in[1]) ? std::nullopt : private_view(p, p.steps[k]);
    if (views[k]) drop.insert(*views[k]);
  }
  const std::vector<int64_t> offset = offsets_of(sizes);
  std::vector<LocalStep> block;
  std::vector<std::vector<int>> parts(m.branches.size(), std::vector<int>(static_cast<size_t>(n), -1));
  int cur = st.in[0];
  for (int s = 0; s < n; ++s) {
    const int j = (pos + s) % n, jn = (j + 1) % n;
    const int64_t e = sizes[static_cast<size_t>(j)], off = offset[static_cast<size_t>(j)];
    int handle = -1, next = -1;
    if (s < n - 1) {
      handle = p.num_handles++;
      next = new_value(p, with_extent(p.types[static_cast<size_t>(xg)], d, sizes[static_cast<size_t>(jn)]),
                       p.names[static_cast<size_t>(xg)] + "_r" + std::to_string(s + 1));
      block.push_back(shift_start(st, cur, d, n, (pos + n - 1) % n, -1, e, (pos + 1) % n,
                                  sizes[static_cast<size_t>(jn)], handle, s + 1, n - 1));
    }
    const int shared = copy_chain(p, m.prefix, xg, cur, j, off, e, st.mesh_dim, views, block);
    for (size_t b = 0; b < m.branches.size(); ++b)
      parts[b][static_cast<size_t>(j)] =
          copy_chain(p, m.branches[b], branch_in, shared, j, off, e, st.mesh_dim, views, block);
    if (s < n - 1) {
      block.push_back(wait_step(handle, next));
      cur = next;
    }
  }
  size_t at = 0;
  for (size_t b = 0; b < m.branches.size(); ++b) {
    LocalStep cat;
    cat.kind = LocalStep::Kind::Concat;
    cat.in = parts[b];
    cat.out = p.steps[m.branches[b].steps.back()].out;
    cat.dim = m.branches[b].dims.back();
    block.push_back(std::move(cat));
    at = std::max(at, m.branches[b].steps.back());
  }
  splice(p, drop, at, std::move(block));
}

namespace {

// When `v` is a decomposed all-gather's concat along `dim` whose parts are exactly
// the chunks `sizes` (the sequence-parallel MLP: sequence shards gathered in, the
// same shards scattered out), its parts: chunk j of `v` is part j, so each chunk
// flows from the gather's ring to the scatter without being copied into the whole
// tensor and sliced out again. The match depends only on sizes every rank shares,
// so every rank's program takes the same shape.
std::optional<std::vector<int>> concat_parts(const LocalProgram& p, const Uses& u, int v, int dim,
                                             const std::vector<int64_t>& sizes) {
  auto prod = u.producer.find(v);
  if (prod == u.producer.end()) return std::nullopt;
  const LocalStep& cat = p.steps[prod->second];
  if (cat.kind != LocalStep::Kind::Concat || cat.dim != dim || cat.in.size() != sizes.size()) return std::nullopt;
  for (size_t k = 0; k < sizes.size(); ++k)
    if (p.types[static_cast<size_t>(cat.in[k])].shape[static_cast<size_t>(dim)] != sizes[k]) return std::nullopt;
  return cat.in;
}

}  // namespace

void rewrite_reduce_scatter(LocalProgram& p, const RsMatch& m, int pos) {
  const LocalStep st = p.steps[m.start];
  const LocalStep mm = p.steps[m.matmul];
  const std::vector<int64_t> sizes = st.sizes;
  const int n = static_cast<int>(sizes.size());
  const int d = st.dim;
  const int lhs = mm.in[0];
  const TensorType vt = p.types[static_cast<size_t>(st.in[0])];
  const int out_final = p.steps[m.wait].out;
  const std::vector<int64_t> offset = offsets_of(sizes);
  std::vector<LocalStep> block;
  std::vector<int> received;  // this member's chunk of every other member's partial sum
  int own_part = -1;
  const std::optional<size_t> view = private_view(p, mm);
  const Uses u = uses_of(p);
  const std::optional<std::vector<int>> parts = concat_parts(p, u, lhs, m.lhs_dim, sizes);
  // A term that is a replicated value partialised over this mesh dim (DTensor's
  // residual or bias: the value on one member, zeros on the others) sums to that
  // value, so it is added once, to this member's reduced chunk, rather than chunk
  // by chunk on every member (most of which would slice and add zeros).
  std::vector<std::optional<size_t>> partialised(m.terms.size());
  for (size_t k = 0; k < m.terms.size(); ++k) {
    auto prod = u.producer.find(m.terms[k]);
    if (prod == u.producer.end()) continue;
    const LocalStep& ps = p.steps[prod->second];
    if (ps.kind == LocalStep::Kind::Partialize && ps.op == ReduceOp::Sum && ps.mesh_dim == st.mesh_dim)
      partialised[k] = prod->second;
  }
  for (int s = 0; s < n; ++s) {
    const int j = (pos + s + 1) % n;
    const int64_t e = sizes[static_cast<size_t>(j)];
    LocalStep part = mm;
    part.in[0] = parts ? (*parts)[static_cast<size_t>(j)]
                       : slice_of(p, lhs, m.lhs_dim, offset[static_cast<size_t>(j)], e, st.mesh_dim, j, block);
    copy_view(p, view, part, block, j);
    part.node.type = with_extent(vt, d, e);
    part.out = new_value(p, part.node.type, p.names[static_cast<size_t>(mm.out)] + "_c" + std::to_string(j));
    block.push_back(part);
    // The terms added to the matmul's result, each cut to chunk j's rows unless it
    // broadcasts along them: epilogue adds that fuse into the chunk's matmul.
    for (size_t k = 0; k < m.terms.size(); ++k) {
      if (partialised[k]) continue;
      const int t = m.terms[k];
      const TensorType tt = p.types[static_cast<size_t>(t)];
      int piece = t;
      if (const int td = term_dim(tt, rank_of(vt), d); td >= 0)
        piece = slice_of(p, t, td, offset[static_cast<size_t>(j)], e, st.mesh_dim, j, block);
      LocalStep add = p.steps[m.adds[k]];
      add.in = {part.out, piece};
      add.node.type = part.node.type;
      add.out = new_value(p, part.node.type, p.names[static_cast<size_t>(add.out)] + "_c" + std::to_string(j));
      part.out = add.out;
      block.push_back(std::move(add));
    }
    if (s == n - 1) {  // j == pos: the member's own chunk, summed below
      own_part = part.out;
      break;
    }
    // Chunk j goes straight to its owner, member j, while the next chunk's matmul
    // runs; this member's chunk arrives from the member for which it is chunk s + 1.
    const int handle = p.num_handles++;
    const int recv = new_value(p, with_extent(vt, d, sizes[static_cast<size_t>(pos)]),
                               p.names[static_cast<size_t>(mm.out)] + "_r" + std::to_string(s + 1));
    block.push_back(shift_start(st, part.out, d, n, j, s + 1, e, (pos + n - s - 1) % n,
                                sizes[static_cast<size_t>(pos)], handle, s + 1, n - 1));
    block.push_back(wait_step(handle, recv));
    received.push_back(recv);
  }
  // The local reduction: the member's own partial chunk, the partialised terms'
  // replicated values (this member's rows of them) and the n - 1 chunks received,
  // in that order: all but the last received fuse into the own chunk's matmul as
  // its epilogue (they have arrived by then), the last one is a small kernel after.
  std::vector<int> summands;
  std::set<size_t> drop;
  for (size_t k = 0; k < m.terms.size(); ++k) {
    if (!partialised[k]) continue;
    const int whole = p.steps[*partialised[k]].in[0];
    const TensorType tt = p.types[static_cast<size_t>(whole)];
    const int td = term_dim(tt, rank_of(vt), d);
    summands.push_back(td < 0 ? whole
                              : slice_of(p, whole, td, offset[static_cast<size_t>(pos)], sizes[static_cast<size_t>(pos)],
                                         st.mesh_dim, pos, block));
    // The partialisation is dead once its only user, the add, is gone.
    if (!u.outputs.count(m.terms[k]) && u.users.at(m.terms[k]).size() == 1) drop.insert(*partialised[k]);
  }
  summands.insert(summands.end(), received.begin(), received.end());
  int acc = own_part;
  for (size_t k = 0; k < summands.size(); ++k) {
    LocalStep add;
    add.kind = LocalStep::Kind::Compute;
    add.node.op = OpKind::Add;
    add.node.type = with_extent(vt, d, sizes[static_cast<size_t>(pos)]);
    add.in = {acc, summands[k]};
    add.out = k + 1 == summands.size()
                  ? out_final
                  : new_value(p, add.node.type, p.names[static_cast<size_t>(mm.out)] + "_acc" + std::to_string(k + 1));
    acc = add.out;
    block.push_back(std::move(add));
  }
  drop.insert({m.matmul, m.start, m.wait});
  drop.insert(m.adds.begin(), m.adds.end());
  if (view) drop.insert(*view);
  // With terms, at the collective: every term exists there (a term may be computed
  // after the matmul).
  splice(p, drop, m.terms.empty() ? m.matmul : m.start, std::move(block));
}

// --- matmul -> all_reduce ----------------------------------------------------------

// Replaces the all_reduce by a reduce_scatter along m.dim (torch.chunk's split over
// the n members) and an all_gather of the reduced chunk back into the all_reduce's
// result, the identity all_reduce = all_gather o reduce_scatter. Returns the
// reduce_scatter's start, which stays at m.start.
size_t split_all_reduce(LocalProgram& p, const ArMatch& m, int pos, int n) {
  const int out = p.steps[m.wait].out;
  const TensorType t = p.types[static_cast<size_t>(out)];
  std::vector<int64_t> sizes;
  for (int k = 0; k < n; ++k) sizes.push_back(chunk_of(t.shape[static_cast<size_t>(m.dim)], n, k).size);
  const int chunk = new_value(p, with_extent(t, m.dim, sizes[static_cast<size_t>(pos)]),
                              p.names[static_cast<size_t>(p.steps[m.start].in[0])] + "_rs");
  LocalStep& rs = p.steps[m.start];
  rs.collective = CollectiveKind::ReduceScatter;
  rs.dim = m.dim;
  rs.sizes = sizes;
  LocalStep ag = rs;
  ag.collective = CollectiveKind::AllGather;
  ag.in = {chunk};
  ag.handle = p.num_handles++;
  LocalStep& rw = p.steps[m.wait];
  rw.out = chunk;
  rw.collective = CollectiveKind::ReduceScatter;
  LocalStep aw = rw;
  aw.collective = CollectiveKind::AllGather;
  aw.handle = ag.handle;
  aw.out = out;
  const auto at = p.steps.begin() + static_cast<std::ptrdiff_t>(m.wait + 1);
  p.steps.insert(at, {std::move(ag), std::move(aw)});
  return m.start;
}

// Drops concats that nothing reads any more (decomposed reduce-scatters took their
// parts instead, concat_parts).
void drop_dead_concats(LocalProgram& p) {
  const Uses u = uses_of(p);
  std::erase_if(p.steps, [&](const LocalStep& s) {
    return s.kind == LocalStep::Kind::Concat && !u.outputs.count(s.out) && !u.users.count(s.out);
  });
}

}  // namespace sf::collective_matmul_detail
