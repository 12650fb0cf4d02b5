#include "codegen/fusion/fuse_attention.h"

#include <algorithm>

#include "codegen/ir/attention_match.h"
#include "codegen/ir/view_strides.h"
#include "runtime/core/tensor.h"

namespace sf {

namespace {

// Whether the attention's result `out` can be stored through `views` (its store
// takes a stride per dim of the result: codegen/ir/view_strides.h).
bool stored_through(const LocalProgram& prog, int out, const std::vector<size_t>& views) {
  const LocalStep& last = prog.steps[views.back()];
  std::vector<int64_t> strides = contiguous_strides(last.node.type.shape);
  for (size_t k = views.size(); k-- > 0;) {
    const LocalStep& v = prog.steps[views[k]];
    const int operand = k == 0 ? out : prog.steps[views[k - 1]].out;
    std::optional<std::vector<int64_t>> s =
        operand_strides(v.node, prog.types[static_cast<size_t>(operand)].shape, strides);
    if (!s) return false;
    strides = std::move(*s);
  }
  return true;
}

// Whether op k may be evaluated again for every block of query rows that reads a key
// tile: views (no arithmetic: index arithmetic on the load) and casts.
bool recomputed_cheaply(OpKind k) { return op_info(k).category == OpCategory::Movement || k == OpKind::Cast; }

}  // namespace

std::vector<std::vector<size_t>> find_attention_groups(const AttentionSearch& a) {
  const LocalProgram& prog = a.p;
  const std::map<int, size_t>& producer = a.producer;
  const std::map<int, std::vector<size_t>>& users = a.users;
  const std::set<size_t>& inlined = a.inlined;
  const FusionOptions& opts = a.opts;
  auto type = [&](int v) -> const TensorType& { return prog.types[static_cast<size_t>(v)]; };
  std::vector<std::vector<size_t>> found;
  std::set<int> returned(prog.output_values.begin(), prog.output_values.end());
  AttentionFlow f;
  f.node = [&](int v) -> const Node* {
    auto it = producer.find(v);
    if (it == producer.end() || prog.steps[it->second].kind != LocalStep::Kind::Compute) return nullptr;
    return &prog.steps[it->second].node;
  };
  f.type = [&](int v) -> const TensorType& { return type(v); };
  f.operands = [&](int v) { return prog.steps[producer.at(v)].in; };
  f.users = [&](int v) {
    std::vector<int> u;
    if (auto it = users.find(v); it != users.end())
      for (size_t s : it->second) u.push_back(prog.steps[s].kind == LocalStep::Kind::Compute ? prog.steps[s].out : -1);
    return u;
  };
  f.returned = [&](int v) { return returned.count(v) > 0; };
  std::set<size_t> taken;
  for (size_t i = 0; i < prog.steps.size(); ++i) {
    const LocalStep& s = prog.steps[i];
    if (s.kind != LocalStep::Kind::Compute || s.node.op != OpKind::Matmul) continue;
    std::optional<AttentionMatch> m = match_attention(f, s.out);
    if (!m || m->e > kMaxFusedHeadDim || m->ev > kMaxFusedHeadDim || !is_float(type(m->scores).dtype)) continue;
    std::set<size_t> members;
    std::vector<int> core{m->scores, m->out};
    core.insert(core.end(), m->chain.begin(), m->chain.end());
    core.insert(core.end(), m->softmax.begin(), m->softmax.end());
    bool usable = true;
    for (int v : core) {
      size_t st = producer.at(v);
      usable =
          usable && !opts.isolate.count(st) && !opts.no_attention.count(st) && !inlined.count(st) && !taken.count(st);
      members.insert(st);
    }
    if (!usable) continue;
    // The views after it, as far as its store can follow them.
    std::vector<size_t> views;
    for (int v = m->out;;) {
      auto u = users.find(v);
      if (returned.count(v) || u == users.end() || u->second.size() != 1) break;
      const LocalStep& n = prog.steps[u->second[0]];
      if (n.kind != LocalStep::Kind::Compute || opts.isolate.count(u->second[0]) ||
          (n.node.op != OpKind::Transpose && n.node.op != OpKind::Permute && n.node.op != OpKind::Reshape))
        break;
      views.push_back(u->second[0]);
      v = n.out;
    }
    while (!views.empty() && !stored_through(prog, m->out, views)) views.pop_back();
    members.insert(views.begin(), views.end());
    // The ops that compute only for it: pointwise producers all of whose readers are
    // in the kernel, to a fixpoint. On k's and v's side only views and casts join: the
    // kernel evaluates a key tile once per block of query rows (L / block_m times over,
    // Hq / Hkv more under GQA), so arithmetic there (RoPE's cos, sin and products)
    // is left to a kernel that computes each element once.
    const size_t scores_step = producer.at(m->scores), out_step = producer.at(m->out);
    std::set<size_t> kv_side;
    auto reads_as_kv = [&](size_t reader, int v) {
      return kv_side.count(reader) > 0 || (reader == scores_step && v == m->kt) || (reader == out_step && v == m->v);
    };
    for (bool grew = true; grew && static_cast<int>(members.size()) < opts.max_ops;) {
      grew = false;
      for (size_t st : std::vector<size_t>(members.begin(), members.end()))
        for (int v : prog.steps[st].in) {
          auto pr = producer.find(v);
          if (pr == producer.end() || members.count(pr->second)) continue;
          const size_t q = pr->second;
          const LocalStep& ps = prog.steps[q];
          if (ps.kind != LocalStep::Kind::Compute || ps.node.op == OpKind::Constant || !index_computed(ps.node.op) ||
              inlined.count(q) || opts.isolate.count(q) || taken.count(q) || returned.count(v))
            continue;
          const std::vector<size_t>& readers = users.at(v);
          if (!std::all_of(readers.begin(), readers.end(), [&](size_t x) { return members.count(x) > 0; })) continue;
          const bool kv = std::any_of(readers.begin(), readers.end(), [&](size_t x) { return reads_as_kv(x, v); });
          if (kv && !recomputed_cheaply(ps.node.op)) continue;
          if (static_cast<int>(members.size()) >= opts.max_ops) break;
          members.insert(q);
          if (kv) kv_side.insert(q);
          grew = true;
        }
    }
    if (a.cycle(members)) continue;
    taken.insert(members.begin(), members.end());
    found.emplace_back(members.begin(), members.end());
  }
  return found;
}

}  // namespace sf
