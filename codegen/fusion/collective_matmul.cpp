#include "codegen/fusion/collective_matmul.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <optional>
#include <set>

#include "runtime/core/device_mesh.h"

namespace sf {

std::optional<DecomposeMode> parse_decompose_mode(const std::string& s) {
  if (s == "auto") return DecomposeMode::Auto;
  if (s == "always") return DecomposeMode::Always;
  if (s == "never") return DecomposeMode::Never;
  return std::nullopt;
}

namespace {

int rank_of(const TensorType& t) { return static_cast<int>(t.shape.size()); }
int64_t bytes_of(const TensorType& t) { return numel(t.shape) * dtype_size(t.dtype); }

TensorType with_extent(TensorType t, int dim, int64_t extent) {
  t.shape[static_cast<size_t>(dim)] = extent;
  return t;
}

std::string us(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f us", s * 1e6);
  return buf;
}

struct Uses {
  std::map<int, std::vector<size_t>> users;  // value -> steps reading it
  std::map<int, size_t> producer;
  std::set<int> outputs;
};

Uses uses_of(const LocalProgram& p) {
  Uses u;
  for (size_t i = 0; i < p.steps.size(); ++i) {
    const LocalStep& s = p.steps[i];
    for (int v : s.in) u.users[v].push_back(i);
    if (s.out >= 0) u.producer[s.out] = i;
    for (int v : s.outs) u.producer[v] = i;
  }
  u.outputs.insert(p.output_values.begin(), p.output_values.end());
  return u;
}

size_t wait_of(const LocalProgram& p, int handle) {
  for (size_t i = 0; i < p.steps.size(); ++i)
    if (p.steps[i].kind == LocalStep::Kind::Wait && p.steps[i].handle == handle) return i;
  return p.steps.size();
}

const DeviceRates& rates(const DecomposeOptions& o) { return o.rates ? *o.rates : default_device_rates(); }

// A roofline estimate of one compute step, in seconds (no launch).
double step_time(const LocalProgram& p, const LocalStep& s, const DecomposeOptions& o) {
  if (s.kind != LocalStep::Kind::Compute) return 0;
  const TensorType& out = p.types[static_cast<size_t>(s.out)];
  double bytes = static_cast<double>(bytes_of(out)), flops = static_cast<double>(numel(out.shape));
  for (int v : s.in) bytes += static_cast<double>(bytes_of(p.types[static_cast<size_t>(v)]));
  const DeviceRates& r = rates(o);
  double rate = r.fp32_flops_s;
  if (s.node.op == OpKind::Matmul) {
    const TensorType& a = p.types[static_cast<size_t>(s.in[0])];
    flops = 2.0 * static_cast<double>(numel(out.shape)) * static_cast<double>(a.shape.back());
    rate = r.matmul_flops_s(a.dtype, o.allow_tf32);
  }
  return r.roofline_s(flops, rate, bytes);
}

// The time of the compute that could run while a collective on `from` is in flight:
// every compute step after `from` exists that does not depend on `avoid` (the
// collective's result, or its operand for a reduce_scatter), other than `skip`.
double independent_time(const LocalProgram& p, int from, int avoid, const std::set<size_t>& skip,
                        const DecomposeOptions& o) {
  const Uses u = uses_of(p);
  size_t begin = 0;
  if (auto it = u.producer.find(from); it != u.producer.end()) begin = it->second + 1;
  std::set<int> tainted{avoid};
  double t = 0;
  for (size_t i = 0; i < p.steps.size(); ++i) {
    const LocalStep& s = p.steps[i];
    bool dep = std::any_of(s.in.begin(), s.in.end(), [&](int v) { return tainted.count(v) > 0; });
    if (s.kind == LocalStep::Kind::Start && dep) {
      // Its Wait's value depends on it too.
      size_t w = wait_of(p, s.handle);
      if (w < p.steps.size()) tainted.insert(p.steps[w].out);
    }
    if (dep) {
      if (s.out >= 0) tainted.insert(s.out);
      tainted.insert(s.outs.begin(), s.outs.end());
      continue;
    }
    if (i >= begin && !skip.count(i)) t += step_time(p, s, o);
  }
  return t;
}

// --- all_gather -> matmul ----------------------------------------------------------

// A run of row-wise compute steps, each consuming the previous one's result.
struct Chain {
  std::vector<size_t> steps;
  std::vector<int> dims;  // per step: its output's shard dim
  bool has_matmul = false;
};

struct AgMatch {
  size_t start = 0, wait = 0;
  // Row-wise ops every consumer shares (a cast, say), then one branch per consumer
  // of their result (Megatron's q, k and v projections), each with one matmul.
  Chain prefix;
  std::vector<Chain> branches;
  std::vector<size_t> all_steps() const {
    std::vector<size_t> v = prefix.steps;
    for (const Chain& b : branches) v.insert(v.end(), b.steps.begin(), b.steps.end());
    return v;
  }
  std::string what(const LocalProgram& p) const {
    std::string w;
    for (const Chain& b : branches)
      w += (w.empty() ? "" : ", ") + p.names[static_cast<size_t>(p.steps[b.steps.back()].out)];
    return w;
  }
};

// Whether `s` (one of whose operands is `cur`, sharded along `d`) maps shards of cur
// to shards of its output along the same dim.
bool rowwise(const LocalProgram& p, const LocalStep& s, int cur, int d, bool after_matmul, int* out_dim,
             std::string* why) {
  if (s.kind != LocalStep::Kind::Compute) return false;
  const TensorType& ct = p.types[static_cast<size_t>(cur)];
  const TensorType& out = p.types[static_cast<size_t>(s.out)];
  switch (op_info(s.node.op).category) {
    case OpCategory::Unary:
      *out_dim = d;
      return rank_of(out) == rank_of(ct);
    case OpCategory::Binary:
    case OpCategory::Compare: {
      // An other operand that varies along the shard dim (a residual along the rows,
      // a bias along the columns) is sliced per shard (copy_chain).
      if (rank_of(out) != rank_of(ct)) return false;
      for (int v : s.in)
        if (v != cur && rank_of(p.types[static_cast<size_t>(v)]) > rank_of(ct)) return false;
      *out_dim = d;
      return true;
    }
    case OpCategory::Movement: {
      // Before the matmul, a transpose or permute moves the shard dim: FSDP gathers a
      // weight along its rows (out-features) and transposes it into the right operand.
      if (after_matmul) return false;
      const int r = rank_of(ct);
      auto norm = [r](int64_t x) { return static_cast<int>(x < 0 ? x + r : x); };
      if (s.node.op == OpKind::Transpose) {
        const int a = norm(s.node.attrs.get_int("dim0")), b = norm(s.node.attrs.get_int("dim1"));
        *out_dim = d == a ? b : d == b ? a : d;
        return true;
      }
      if (s.node.op == OpKind::Permute) {
        const std::vector<int64_t>& dims = s.node.attrs.get_ints("dims");
        for (size_t k = 0; k < dims.size(); ++k)
          if (norm(dims[k]) == d) {
            *out_dim = static_cast<int>(k);
            return true;
          }
      }
      return false;
    }
    case OpCategory::Matmul: {
      if (!after_matmul && s.in.size() == 2 && s.in[1] == cur && s.in[0] != cur) {
        // The right operand (FSDP's weight gather): its shards are column blocks of
        // the result when the shard dim is N, the right operand's last dim.
        const int rr = rank_of(ct);
        if (rr < 2 || d == rr - 2) {
          if (why) *why = "the gathered dim is the contracted one";
          return false;
        }
        if (d != rr - 1) {
          if (why) *why = "the gathered dim is a batch dim of the matmul's right operand";
          return false;
        }
        *out_dim = rank_of(out) - 1;
        return true;
      }
      if (after_matmul || s.in.size() != 2 || s.in[0] != cur || s.in[1] == cur) return false;
      const int lr = rank_of(ct);
      const TensorType& b = p.types[static_cast<size_t>(s.in[1])];
      if (lr < 2 || d == lr - 1) {
        if (why) *why = "the gathered dim is the contracted one";
        return false;
      }
      if (d < lr - 2 && rank_of(b) > 2) {
        int idx = d - (lr - rank_of(b));
        if (idx >= 0 && b.shape[static_cast<size_t>(idx)] != 1) return false;
      }
      *out_dim = d + (rank_of(out) - lr);
      return true;
    }
    default: return false;
  }
}

// Follows row-wise single-consumer steps from step `first` (which consumes `cur`,
// sharded along `d`); a matmul may come once, and only if `allow_matmul`.
Chain walk(const LocalProgram& p, const Uses& u, size_t first, int cur, int d, bool allow_matmul, std::string* why) {
  Chain c;
  size_t next = first;
  while (true) {
    const LocalStep& s = p.steps[next];
    int od = d;
    const bool is_mm = s.kind == LocalStep::Kind::Compute && s.node.op == OpKind::Matmul;
    if ((is_mm && !allow_matmul) || !rowwise(p, s, cur, d, c.has_matmul, &od, why)) break;
    c.has_matmul = c.has_matmul || is_mm;
    c.steps.push_back(next);
    c.dims.push_back(od);
    cur = s.out;
    d = od;
    auto it = u.users.find(cur);
    if (u.outputs.count(cur) || it == u.users.end() || it->second.size() != 1) break;
    next = it->second[0];
  }
  return c;
}

std::optional<AgMatch> match_all_gather(const LocalProgram& p, size_t start, std::string* why) {
  const LocalStep& st = p.steps[start];
  AgMatch m;
  m.start = start;
  m.wait = wait_of(p, st.handle);
  if (m.wait >= p.steps.size()) return std::nullopt;
  const Uses u = uses_of(p);
  int cur = p.steps[m.wait].out, d = st.dim;
  auto users = [&](int v) -> const std::vector<size_t>* {
    auto it = u.users.find(v);
    return u.outputs.count(v) || it == u.users.end() ? nullptr : &it->second;
  };
  // The shared prefix: row-wise ops, no matmul, up to a value with several users.
  if (const std::vector<size_t>* us = users(cur); us && us->size() == 1) {
    m.prefix = walk(p, u, (*us)[0], cur, d, /*allow_matmul=*/false, why);
    if (!m.prefix.steps.empty()) {
      cur = p.steps[m.prefix.steps.back()].out;
      d = m.prefix.dims.back();
    }
  }
  const std::vector<size_t>* us = users(cur);
  if (!us) return std::nullopt;
  for (size_t first : *us) {
    Chain b = walk(p, u, first, cur, d, /*allow_matmul=*/true, why);
    if (!b.has_matmul) {
      if (why && why->empty()) *why = "a user of the gathered value is not a row-wise matmul chain";
      return std::nullopt;
    }
    m.branches.push_back(std::move(b));
  }
  return m;
}

// --- matmul -> reduce_scatter ------------------------------------------------------

// A collective's operand that is a matmul's result plus terms that do not depend on
// it: v = add(...add(matmul, t1)..., tk), each intermediate used once and of the
// matmul's shape (the residual or bias that DTensor adds to partial sums, as
// `partialize x`). Summing over the ranks distributes over the adds, so each chunk
// of the ring can add its rows of every term.
struct MatmulSum {
  size_t matmul = 0;
  std::vector<size_t> adds;  // from the matmul outward
  std::vector<int> terms;    // the other operand of each add
};

// Whether `cur` (used once) is such a sum; fills `m` if so. Each add is tried both
// ways round: the operand that continues the chain must be a single-use value of
// the add's shape; the other one is a term.
bool walk_matmul_sum(const LocalProgram& p, const Uses& u, int cur, MatmulSum& m) {
  auto prod = u.producer.find(cur);
  if (prod == u.producer.end() || p.steps[prod->second].kind != LocalStep::Kind::Compute) return false;
  const LocalStep& s = p.steps[prod->second];
  if (s.node.op == OpKind::Matmul) {
    m.matmul = prod->second;
    return true;
  }
  if (s.node.op != OpKind::Add || s.in.size() != 2) return false;
  const TensorType& ct = p.types[static_cast<size_t>(cur)];
  for (size_t k = 0; k < 2; ++k) {
    const int a = s.in[k], b = s.in[1 - k];
    auto users = u.users.find(a);
    const bool single = !u.outputs.count(a) && users != u.users.end() && users->second.size() == 1;
    if (!single || p.types[static_cast<size_t>(a)].shape != ct.shape || p.types[static_cast<size_t>(b)].dtype != ct.dtype)
      continue;
    MatmulSum sub;
    if (!walk_matmul_sum(p, u, a, sub)) continue;
    m = std::move(sub);
    m.adds.push_back(prod->second);
    m.terms.push_back(b);
    return true;
  }
  return false;
}

std::optional<MatmulSum> matmul_plus_terms(const LocalProgram& p, const Uses& u, int v, std::string* why) {
  auto users = u.users.find(v);
  if (u.outputs.count(v) || users == u.users.end() || users->second.size() != 1) {
    *why = "its operand has other users";
    return std::nullopt;
  }
  MatmulSum m;
  if (!walk_matmul_sum(p, u, v, m)) {
    *why = "its operand is not a matmul's result (plus terms added to it)";
    return std::nullopt;
  }
  return m;
}

// Where a term of `out_rank` dims is cut for a chunk along dim `d` of the result:
// its own dim, or -1 when it broadcasts along d (absent or of extent 1).
int term_dim(const TensorType& t, int out_rank, int d) {
  const int idx = d - (out_rank - rank_of(t));
  return idx >= 0 && t.shape[static_cast<size_t>(idx)] != 1 ? idx : -1;
}

struct RsMatch {
  size_t matmul = 0, start = 0, wait = 0;
  int lhs_dim = 0;  // the scattered dim, as a dim of the matmul's left operand
  std::vector<size_t> adds;  // terms added to the matmul's result before the collective
  std::vector<int> terms;
};

std::optional<RsMatch> match_reduce_scatter(const LocalProgram& p, size_t start, std::string* why) {
  const LocalStep& st = p.steps[start];
  if (st.op != ReduceOp::Sum) {
    *why = "not a sum";
    return std::nullopt;
  }
  const Uses u = uses_of(p);
  const int v = st.in[0];
  std::optional<MatmulSum> sum = matmul_plus_terms(p, u, v, why);
  if (!sum) return std::nullopt;
  RsMatch m;
  m.matmul = sum->matmul;
  m.adds = sum->adds;
  m.terms = sum->terms;
  m.start = start;
  m.wait = wait_of(p, st.handle);
  if (m.wait >= p.steps.size()) return std::nullopt;
  const LocalStep& mm = p.steps[m.matmul];
  const TensorType& a = p.types[static_cast<size_t>(mm.in[0])];
  const TensorType& b = p.types[static_cast<size_t>(mm.in[1])];
  const TensorType& out = p.types[static_cast<size_t>(v)];
  const int lr = rank_of(a);
  m.lhs_dim = st.dim - (rank_of(out) - lr);
  if (lr < 2 || m.lhs_dim < 0 || m.lhs_dim >= lr - 1) {
    *why = "the scattered dim is not a row dim of the matmul's left operand";
    return std::nullopt;
  }
  if (m.lhs_dim < lr - 2 && rank_of(b) > 2) {
    int idx = m.lhs_dim - (lr - rank_of(b));
    if (idx >= 0 && b.shape[static_cast<size_t>(idx)] != 1) {
      *why = "the scattered dim is a batch dim of both operands";
      return std::nullopt;
    }
  }
  return m;
}

// --- rewriting ---------------------------------------------------------------------

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

// An all_reduce(sum) of a matmul's result, which could become a reduce_scatter
// (decomposed into the matmul's ring) followed by an all_gather.
struct ArMatch {
  size_t matmul = 0, start = 0, wait = 0;
  std::vector<size_t> adds;  // terms added to the matmul's result first
  int dim = 0;  // the dim to scatter and gather: the matmul's output row dim (M)
};

std::optional<ArMatch> match_all_reduce(const LocalProgram& p, size_t start) {
  const LocalStep& st = p.steps[start];
  if (st.op != ReduceOp::Sum) return std::nullopt;
  const Uses u = uses_of(p);
  const int v = st.in[0];
  std::string why;
  std::optional<MatmulSum> sum = matmul_plus_terms(p, u, v, &why);
  if (!sum) return std::nullopt;
  ArMatch m;
  m.matmul = sum->matmul;
  m.adds = sum->adds;
  m.start = start;
  m.wait = wait_of(p, st.handle);
  if (m.wait >= p.steps.size()) return std::nullopt;
  const int lr = rank_of(p.types[static_cast<size_t>(p.steps[m.matmul].in[0])]);
  if (lr < 2) return std::nullopt;
  // M, the left operand's last row dim, is a row dim whatever the batch dims do.
  m.dim = rank_of(p.types[static_cast<size_t>(v)]) - 2;
  return m;
}

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

// The estimated time of matmul -> reduce_scatter as n per-chunk matmuls, each
// chunk sent to its owner while the next one is computed; the chunks received
// are added in the last matmul's epilogue (free beside its flops), but for the
// last one, a kernel reading two chunks and writing one (`bytes`: the matmul's
// whole result; `t_mm`: the matmul alone, with its launch).
double rs_ring_time(double bytes, double t_mm, int n, const LinkSpec& link, const DecomposeOptions& o) {
  const double t_step = shift_us(bytes / n, link) * 1e-6;
  const double t_part = (t_mm - rates(o).launch_s) / n + rates(o).launch_s;
  const double t_last_add = rates(o).launch_s + 3 * bytes / n / rates(o).hbm_bytes_s;
  return t_part + (n - 1) * std::max(t_part, t_step) + t_last_add;
}

// The matmul and the adds of its terms (which fuse into it: one launch), and the
// steps they are.
double matmul_sum_time(const LocalProgram& p, size_t matmul, const std::vector<size_t>& adds,
                       const DecomposeOptions& o, std::set<size_t>* steps) {
  double t = rates(o).launch_s + step_time(p, p.steps[matmul], o);
  steps->insert(matmul);
  for (size_t a : adds) {
    t += step_time(p, p.steps[a], o);
    steps->insert(a);
  }
  return t;
}

// Drops concats that nothing reads any more (decomposed reduce-scatters took their
// parts instead, concat_parts).
void drop_dead_concats(LocalProgram& p) {
  const Uses u = uses_of(p);
  std::erase_if(p.steps, [&](const LocalStep& s) {
    return s.kind == LocalStep::Kind::Concat && !u.outputs.count(s.out) && !u.users.count(s.out);
  });
}

}  // namespace

std::vector<DecomposeDecision> decompose_collective_matmuls(std::vector<LocalProgram>& programs,
                                                            const DeviceMesh& mesh, const DecomposeOptions& o) {
  std::vector<DecomposeDecision> decisions;
  if (programs.empty()) return decisions;
  // Decide on rank 0, then rewrite every rank at the same steps: later steps move
  // after each rewrite, so look again from the start until nothing matches.
  std::set<std::pair<std::string, int>> seen;  // (collective operand name, kind) decided already
  bool changed = true;
  while (changed) {
    changed = false;
    const LocalProgram& p0 = programs[0];
    for (size_t i = 0; i < p0.steps.size() && !changed; ++i) {
      const LocalStep s = p0.steps[i];  // a copy: rewriting rank 0 moves the steps
      if (s.kind != LocalStep::Kind::Start || s.ring_steps > 0) continue;
      if (s.collective != CollectiveKind::AllGather && s.collective != CollectiveKind::ReduceScatter && s.collective != CollectiveKind::AllReduce)
        continue;
      const std::string operand = p0.names[static_cast<size_t>(s.in[0])];
      if (!seen.insert({operand, static_cast<int>(s.collective)}).second) continue;
      const int n = s.collective == CollectiveKind::AllReduce ? static_cast<int>(mesh.group(p0.rank, s.mesh_dim).size())
                                                    : static_cast<int>(s.sizes.size());
      // The link class this mesh dim's groups cross (the one performance model).
      const LinkSpec& link = o.comm.link(o.comm.link_class(mesh, s.mesh_dim));
      DecomposeDecision dd;
      std::string why;
      if (s.collective == CollectiveKind::AllGather) {
        std::optional<AgMatch> m = match_all_gather(p0, i, &why);
        if (!m) continue;  // not a collective matmul: nothing to say
        dd.what = "all_gather " + operand + " -> matmul" + (m->branches.size() > 1 ? "s" : "") + " -> " +
                  m->what(p0);
        if (n < 2) continue;
        const TensorType& xg = p0.types[static_cast<size_t>(p0.steps[m->wait].out)];
        double t_comm = collective_us(CollectiveKind::AllGather, n, static_cast<double>(bytes_of(xg)), link) * 1e-6;
        const std::vector<size_t> steps = m->all_steps();
        double t_chain = rates(o).launch_s * static_cast<double>(m->branches.size());
        for (size_t c : steps) t_chain += step_time(p0, p0.steps[c], o);
        std::set<size_t> skip(steps.begin(), steps.end());
        double t_indep = independent_time(p0, s.in[0], p0.steps[m->wait].out, skip, o);
        double plain = t_chain + std::max(0.0, t_comm - t_indep);
        double t_step = shift_us(static_cast<double>(bytes_of(xg)) / n, link) * 1e-6;
        const double launches = rates(o).launch_s * static_cast<double>(m->branches.size());
        double t_part = (t_chain - launches) / n + launches;
        double concat = 0;
        for (const Chain& b : m->branches)
          concat += rates(o).launch_s + 2.0 * static_cast<double>(bytes_of(p0.types[static_cast<size_t>(p0.steps[b.steps.back()].out)])) /
                                     rates(o).hbm_bytes_s;
        double ring = t_part + (n - 1) * std::max(t_part, t_step) + concat;
        dd.decomposed = o.mode == DecomposeMode::Always || (o.mode == DecomposeMode::Auto && ring < plain);
        dd.why = "estimated " + us(plain) + " as is (" + us(t_comm) + " all_gather, " + us(t_indep) +
                 " independent compute to hide it) vs " + us(ring) + " in " + std::to_string(n) + " ring steps";
        if (dd.decomposed) {
          for (LocalProgram& p : programs) {
            const int pos = static_cast<int>(mesh.coord(p.rank)[static_cast<size_t>(s.mesh_dim)]);
            std::string w2;
            std::optional<AgMatch> mr = match_all_gather(p, i, &w2);
            if (mr) rewrite_all_gather(p, *mr, pos);
          }
          changed = true;
        }
      } else if (s.collective == CollectiveKind::AllReduce) {
        // Megatron's rowwise linear: all_reduce = all_gather o reduce_scatter, and the
        // reduce_scatter half hides behind the matmul's ring; the all_gather stays.
        std::optional<ArMatch> m = match_all_reduce(p0, i);
        if (!m) continue;
        dd.what = "matmul " + p0.names[static_cast<size_t>(p0.steps[m->matmul].out)] + " -> all_reduce";
        if (n < 2) continue;
        const double bytes = static_cast<double>(bytes_of(p0.types[static_cast<size_t>(s.in[0])]));
        const double t_ar = collective_us(CollectiveKind::AllReduce, n, bytes, link) * 1e-6;
        const double t_ag = collective_us(CollectiveKind::AllGather, n, bytes, link) * 1e-6;
        std::set<size_t> mm_steps;
        const double t_mm = matmul_sum_time(p0, m->matmul, m->adds, o, &mm_steps);
        const double t_indep = independent_time(p0, s.in[0], s.in[0], mm_steps, o);
        const double plain = t_mm + std::max(0.0, t_ar - t_indep);
        const double ring = rs_ring_time(bytes, t_mm, n, link, o) + std::max(0.0, t_ag - t_indep);
        dd.decomposed = o.mode == DecomposeMode::Always || (o.mode == DecomposeMode::Auto && ring < plain);
        dd.why = "estimated " + us(plain) + " as is (" + us(t_ar) + " all_reduce, " + us(t_indep) +
                 " independent compute to hide it) vs " + us(ring) + " as a reduce_scatter in " + std::to_string(n) +
                 " ring steps and an all_gather (dim " + std::to_string(m->dim) + ")";
        if (dd.decomposed) {
          for (LocalProgram& p : programs) {
            const int pos = static_cast<int>(mesh.coord(p.rank)[static_cast<size_t>(s.mesh_dim)]);
            std::optional<ArMatch> mr = match_all_reduce(p, i);
            if (!mr) continue;
            const size_t rs = split_all_reduce(p, *mr, pos, n);
            std::string w2;
            if (std::optional<RsMatch> ms = match_reduce_scatter(p, rs, &w2)) rewrite_reduce_scatter(p, *ms, pos);
          }
          changed = true;
        }
      } else {
        std::optional<RsMatch> m = match_reduce_scatter(p0, i, &why);
        if (!m) continue;
        dd.what = "matmul " + p0.names[static_cast<size_t>(p0.steps[m->matmul].out)] + " -> reduce_scatter";
        if (n < 2) continue;
        const TensorType& vt = p0.types[static_cast<size_t>(s.in[0])];
        double t_comm = collective_us(CollectiveKind::ReduceScatter, n, static_cast<double>(bytes_of(vt)), link) * 1e-6;
        std::set<size_t> mm_steps;
        double t_mm = matmul_sum_time(p0, m->matmul, m->adds, o, &mm_steps);
        double t_indep = independent_time(p0, s.in[0], s.in[0], mm_steps, o);
        double plain = t_mm + std::max(0.0, t_comm - t_indep);
        double ring = rs_ring_time(static_cast<double>(bytes_of(vt)), t_mm, n, link, o);
        dd.decomposed = o.mode == DecomposeMode::Always || (o.mode == DecomposeMode::Auto && ring < plain);
        dd.why = "estimated " + us(plain) + " as is (" + us(t_comm) + " reduce_scatter, " + us(t_indep) +
                 " independent compute to hide it) vs " + us(ring) + " in " + std::to_string(n) + " ring steps";
        if (dd.decomposed) {
          for (LocalProgram& p : programs) {
            const int pos = static_cast<int>(mesh.coord(p.rank)[static_cast<size_t>(s.mesh_dim)]);
            std::string w2;
            std::optional<RsMatch> mr = match_reduce_scatter(p, i, &w2);
            if (mr) rewrite_reduce_scatter(p, *mr, pos);
          }
          changed = true;
        }
      }
      if (o.mode == DecomposeMode::Never) dd.why = "--no-decompose";
      decisions.push_back(std::move(dd));
    }
  }
  if (std::any_of(decisions.begin(), decisions.end(), [](const DecomposeDecision& d) { return d.decomposed; }))
    for (LocalProgram& p : programs) drop_dead_concats(p);
  return decisions;
}

}  // namespace sf
