// Collective-matmul pattern matchers: all_gather -> matmul, matmul -> reduce_scatter or all_reduce.
#include "codegen/fusion/collective_matmul_internal.h"

#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace sf::collective_matmul_detail {

int rank_of(const TensorType& t) { return static_cast<int>(t.shape.size()); }

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

// --- all_gather -> matmul ----------------------------------------------------------

namespace {

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

}  // namespace

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
  for (size_t first : *us) m.branches.push_back(walk(p, u, first, cur, d, /*allow_matmul=*/true, why));
  // Branches that meet (SwiGLU's silu(x w1) * (x w3): each matmul's one user is the
  // same mul) end before the step they share. Each branch's steps are copied per shard
  // and its result joined at the end, so a shared step would be computed twice, each
  // copy reading the other branch's whole result before it is joined.
  std::map<size_t, int> in_branches;
  for (const Chain& b : m.branches)
    for (size_t k : b.steps) ++in_branches[k];
  for (Chain& b : m.branches) {
    size_t keep = 0;
    while (keep < b.steps.size() && in_branches[b.steps[keep]] == 1) ++keep;
    b.steps.resize(keep);
    b.dims.resize(keep);
    b.has_matmul = false;
    for (size_t k : b.steps) b.has_matmul = b.has_matmul || p.steps[k].node.op == OpKind::Matmul;
    if (!b.has_matmul) {
      if (why && why->empty()) *why = "a user of the gathered value is not a row-wise matmul chain";
      return std::nullopt;
    }
  }
  return m;
}

// --- matmul -> reduce_scatter ------------------------------------------------------

namespace {

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

}  // namespace

// Where a term of `out_rank` dims is cut for a chunk along dim `d` of the result:
// its own dim, or -1 when it broadcasts along d (absent or of extent 1).
int term_dim(const TensorType& t, int out_rank, int d) {
  const int idx = d - (out_rank - rank_of(t));
  return idx >= 0 && t.shape[static_cast<size_t>(idx)] != 1 ? idx : -1;
}

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

// --- matmul -> all_reduce ----------------------------------------------------------

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

}  // namespace sf::collective_matmul_detail
