#include "codegen/ir/attention_match.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <set>

namespace sf {

namespace {

bool elementwise(OpKind k) {
  const OpCategory c = op_info(k).category;
  return c == OpCategory::Unary || c == OpCategory::Binary || c == OpCategory::Compare || c == OpCategory::Where;
}

class Matcher {
 public:
  explicit Matcher(const AttentionFlow& f) : f_(f) {}

  std::optional<AttentionMatch> run(int out) {
    AttentionMatch m;
    m.out = out;
    if (!op(out, OpKind::Matmul)) return std::nullopt;
    std::vector<int> o2 = f_.operands(out);
    m.probs = o2[0];
    m.v = o2[1];
    // probs = [cast(] div(e, sum(e)) [)], e = exp(sub(xu, max(xu))), xu = [cast f32(] logits [)]
    const int div = op(m.probs, OpKind::Cast) ? f_.operands(m.probs)[0] : m.probs;
    if (!op(div, OpKind::Div)) return std::nullopt;
    std::vector<int> dv = f_.operands(div);
    const int e = dv[0], sum = dv[1];
    if (!last_dim_reduce(sum, OpKind::Sum) || f_.operands(sum)[0] != e || !op(e, OpKind::Exp)) return std::nullopt;
    const int sub = f_.operands(e)[0];
    if (!op(sub, OpKind::Sub)) return std::nullopt;
    std::vector<int> sv = f_.operands(sub);
    const int xu = sv[0], mx = sv[1];
    if (!last_dim_reduce(mx, OpKind::Max) || f_.operands(mx)[0] != xu || f_.type(xu).dtype != DType::F32)
      return std::nullopt;
    m.logits = op(xu, OpKind::Cast) ? f_.operands(xu)[0] : xu;
    if (m.logits != xu) m.softmax.push_back(xu);
    m.softmax.insert(m.softmax.end(), {mx, sub, e, sum, div});
    if (m.probs != div) m.softmax.push_back(m.probs);
    // Each softmax value is read only by the next steps of the softmax.
    if (!only_read_by(xu, {mx, sub}) || !only_read_by(mx, {sub}) || !only_read_by(sub, {e}) ||
        !only_read_by(e, {sum, div}) || !only_read_by(sum, {div}) ||
        (div != m.probs && !only_read_by(div, {m.probs})) || !only_read_by(m.probs, {out}))
      return std::nullopt;

    // The chain back from the logits (elementwise ops of the scores' shape) to the one
    // matmul it starts from.
    if (!f_.node(m.logits)) return std::nullopt;
    const Shape ss = f_.type(m.logits).shape;
    std::set<int> closure;
    std::vector<int> roots;  // matmuls of the scores' shape the walk stops at
    std::vector<int> work{m.logits};
    while (!work.empty()) {
      const int v = work.back();
      work.pop_back();
      const Node* n = f_.node(v);
      if (!n || n->type.shape != ss || closure.count(v)) continue;
      if (n->op == OpKind::Matmul) {
        if (std::find(roots.begin(), roots.end(), v) == roots.end()) roots.push_back(v);
        continue;
      }
      if (!elementwise(n->op)) continue;
      closure.insert(v);
      for (int u : f_.operands(v)) work.push_back(u);
    }
    if (roots.size() != 1) return std::nullopt;
    m.scores = roots[0];
    // The chain: the closure's values computed from the scores (a fixpoint).
    std::set<int> chain{m.scores};
    for (bool grew = true; grew;) {
      grew = false;
      for (int v : closure) {
        if (chain.count(v)) continue;
        std::vector<int> in = f_.operands(v);
        if (std::any_of(in.begin(), in.end(), [&](int u) { return chain.count(u) > 0; })) grew = chain.insert(v).second;
      }
    }
    if (!chain.count(m.logits)) return std::nullopt;
    chain.erase(m.scores);
    m.chain.assign(chain.begin(), chain.end());
    // Nothing outside reads the scores or the chain: the kernel never writes them.
    std::set<int> allowed(chain.begin(), chain.end());
    allowed.insert(xu);
    for (int v : m.chain)
      if (v != xu && !only_read_within(v, allowed)) return std::nullopt;
    if (m.scores != xu && !only_read_within(m.scores, allowed)) return std::nullopt;

    std::vector<int> o1 = f_.operands(m.scores);
    m.q = o1[0];
    m.kt = o1[1];
    if (!shapes(m)) return std::nullopt;
    m.causal_diagonal = causal(m);
    return m;
  }

 private:
  // The node of v when it is op k.
  const Node* op(int v, OpKind k) const {
    const Node* n = f_.node(v);
    return n && n->op == k ? n : nullptr;
  }
  bool last_dim_reduce(int v, OpKind k) const {
    const Node* n = op(v, k);
    if (!n) return false;
    const int r = n->type.rank();
    return n->attrs.get_bool("keepdim") && r >= 1 && reduced_dims(n->attrs, r) == std::vector<int>{r - 1};
  }
  bool only_read_by(int v, const std::set<int>& readers) const {
    if (f_.returned(v)) return false;
    std::vector<int> u = f_.users(v);
    return !u.empty() && std::all_of(u.begin(), u.end(), [&](int x) { return readers.count(x) > 0; });
  }
  bool only_read_within(int v, const std::set<int>& within) const {
    if (f_.returned(v)) return false;
    std::vector<int> u = f_.users(v);
    return std::all_of(u.begin(), u.end(), [&](int x) { return within.count(x) > 0; });
  }

  // q [..., L, E], kt [..., E, S], v [..., S, Ev], all with the scores' batch dims.
  bool shapes(AttentionMatch& m) const {
    const Shape& s = f_.type(m.scores).shape;
    const size_t r = s.size();
    if (r < 2) return false;
    m.batch.assign(s.begin(), s.end() - 2);
    m.l = s[r - 2];
    m.s = s[r - 1];
    auto batched = [&](const Shape& x) {
      return x.size() == r && std::equal(m.batch.begin(), m.batch.end(), x.begin());
    };
    const Shape &q = f_.type(m.q).shape, &kt = f_.type(m.kt).shape, &v = f_.type(m.v).shape,
                &o = f_.type(m.out).shape;
    if (!batched(q) || !batched(kt) || !batched(v) || !batched(o)) return false;
    m.e = q[r - 1];
    m.ev = v[r - 1];
    return q[r - 2] == m.l && kt[r - 2] == m.e && kt[r - 1] == m.s && v[r - 2] == m.s && o[r - 2] == m.l &&
           o[r - 1] == m.ev;
  }

  // where(tril(full(true), d), x, -inf) in the chain.
  std::optional<int64_t> causal(const AttentionMatch& m) const {
    // Only as the chain's last op: a masked key then gives exp(-inf) = 0 whatever came
    // before, so skipping it is exact (an op after it could turn -inf into NaN).
    const int v = m.logits;
    if (!op(v, OpKind::Where)) return std::nullopt;
    std::vector<int> w = f_.operands(v);
    const Node* fill = op(w[2], OpKind::Constant);
    if (!fill || !std::isinf(fill->attrs.get_float("value")) || fill->attrs.get_float("value") > 0) return std::nullopt;
    const Node* tri = op(w[0], OpKind::Tril);
    if (!tri) return std::nullopt;
    const Node* full = op(f_.operands(w[0])[0], OpKind::Full);
    if (!full || full->attrs.get_float("value") == 0.0) return std::nullopt;  // NaN is true, as bool(NaN)
    // The mask's last two dims are the scores' rows and keys (broadcast over the rest).
    const Shape& ms = tri->type.shape;
    if (ms.size() < 2 || ms[ms.size() - 2] != m.l || ms[ms.size() - 1] != m.s) return std::nullopt;
    return tri->attrs.get_int("diagonal");
  }

  const AttentionFlow& f_;
};

}  // namespace

std::optional<AttentionMatch> match_attention(const AttentionFlow& f, int out) { return Matcher(f).run(out); }

AttentionFlow graph_flow(const Graph& g) {
  auto users = std::make_shared<std::vector<std::vector<int>>>(g.nodes().size());
  for (size_t i = 0; i < g.nodes().size(); ++i)
    for (ValueId u : g.nodes()[i].inputs) (*users)[static_cast<size_t>(u)].push_back(static_cast<int>(i));
  auto returned = std::make_shared<std::set<int>>();
  for (const Output& o : g.outputs()) returned->insert(o.value);
  AttentionFlow f;
  f.node = [&g](int v) -> const Node* {
    if (v < 0 || static_cast<size_t>(v) >= g.nodes().size()) return nullptr;
    return &g.nodes()[static_cast<size_t>(v)];
  };
  f.type = [&g](int v) -> const TensorType& { return g.nodes()[static_cast<size_t>(v)].type; };
  f.operands = [&g](int v) {
    const std::vector<ValueId>& in = g.nodes()[static_cast<size_t>(v)].inputs;
    return std::vector<int>(in.begin(), in.end());
  };
  f.users = [users](int v) { return (*users)[static_cast<size_t>(v)]; };
  f.returned = [returned](int v) { return returned->count(v) > 0; };
  return f;
}

double visible_fraction(const AttentionMatch& m) {
  if (!m.causal_diagonal || m.l <= 0 || m.s <= 0) return 1.0;
  // Row i sees min(max(i + d + 1, 0), S) keys: none for i < -d, i + d + 1 up to row
  // S - d - 1, all S from there (in long double: L, S and d are below 2^41).
  const long double l = static_cast<long double>(m.l), s = static_cast<long double>(m.s),
                    d = static_cast<long double>(*m.causal_diagonal);
  const long double first = std::clamp(-d, 0.0L, l);          // first row that sees a key
  const long double full = std::clamp(s - d - 1, first, l);    // first row that sees them all
  // Rows first .. full - 1 see i + d + 1 keys: an arithmetic series.
  const long double partial = (full - first) * ((first + d + 1) + (full - 1 + d + 1)) / 2;
  const long double seen = partial + (l - full) * s;
  return static_cast<double>(seen / (l * s));
}

double attention_visible_fraction(const Graph& group) {
  AttentionFlow f = graph_flow(group);
  for (size_t i = 0; i < group.nodes().size(); ++i)
    if (group.nodes()[i].op == OpKind::Matmul)
      if (std::optional<AttentionMatch> m = match_attention(f, static_cast<int>(i))) return visible_fraction(*m);
  return 1.0;
}

}  // namespace sf
