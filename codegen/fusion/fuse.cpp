#include "codegen/fusion/fuse.h"

#include <algorithm>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>

#include "codegen/fusion/fuse_attention.h"
#include "codegen/ir/attention_match.h"
#include "codegen/ir/builder.h"
#include "codegen/ir/view_strides.h"

namespace sf {

namespace {

KernelKind step_kind(const Node& n) {
  // Elementwise ops, views, generators, tril/triu and literals: one index space.
  if (index_computed(n.op) || op_info(n.op).category == OpCategory::Leaf) return KernelKind::Pointwise;
  switch (op_info(n.op).category) {
    case OpCategory::Reduce: return KernelKind::Reduction;
    case OpCategory::Matmul: return KernelKind::Matmul;
    default: return KernelKind::Gather;  // embedding, collectives, composites: not fusible, a kernel of its own
  }
}

// Views that read their operands at other elements than their own index space's:
// slice (a strided part) and concat (a select between operands). Each element of the
// operands is computed at most once per element of the result, so a group's values may
// live in another index space than its result as long as none of them escapes.
// gather and index_select read x at the rows their index names, the same way.
bool reindexes(OpKind k) {
  return k == OpKind::Slice || k == OpKind::Concat || k == OpKind::Gather || k == OpKind::IndexSelect;
}

// Views that keep one stride per dim where their operand has one (view_strides): a
// matmul reads a chain of them in place, when the chain's strides exist (matmul_reads).
bool is_strided_view(OpKind k) {
  return k == OpKind::Transpose || k == OpKind::Permute || k == OpKind::Reshape || k == OpKind::Expand;
}

struct Group {
  KernelKind kind = KernelKind::Pointwise;
  std::vector<size_t> steps;  // indices into the program's steps, in program order
  int64_t numel = 0;          // pointwise: the index space; matmul: its output's
  Shape full;                 // reduction: the reduced tensor's shape
  std::vector<int> rdims;     // reduction: the reduced dims, normalised and sorted
  int64_t reduced_numel = 0;
  bool views_only = true;     // pointwise made of views a matmul reads through (is_strided_view)
  bool reindexing = false;    // holds a slice or concat
};

// Decides groups on one rank's program. Ranks' programs have the same steps (SPMD)
// but, with uneven shards, not the same shapes; FuseAll below runs one Fuser per
// rank and merges only where every rank agrees, so every rank fuses alike.
class Fuser {
 public:
  Fuser(LocalProgram p, const FusionOptions& o) : p_(std::move(p)), opts_(o) {
    for (size_t i = 0; i < p_.steps.size(); ++i) {
      const LocalStep& s = p_.steps[i];
      if (s.out >= 0) producer_[s.out] = i;
      for (int v : s.outs) producer_[v] = i;
      for (int v : s.in) users_[v].push_back(i);
    }
    group_of_.assign(p_.steps.size(), -1);
    // A decomposed reduce-scatter's last transfer: it starts as the rank's own
    // chunk's matmul does, so that matmul must not wait for it. (Earlier ones have
    // had a whole chunk's matmul to arrive in, and fuse into its epilogue.)
    std::set<int> last_transfers;
    for (const LocalStep& s : p_.steps)
      if (s.kind == LocalStep::Kind::Start && s.ring_steps > 0 && s.ring_to > 0 && s.ring_step == s.ring_steps)
        last_transfers.insert(s.handle);
    for (const LocalStep& s : p_.steps)
      if (s.kind == LocalStep::Kind::Wait && last_transfers.count(s.handle)) late_values_.insert(s.out);
    if (opts_.enabled) find_inlined();
    if (opts_.enabled && opts_.attention) find_attention();
  }

  bool fusible_step(size_t i) const {
    const LocalStep& s = p_.steps[i];
    return s.kind == LocalStep::Kind::Compute && s.node.op != OpKind::Constant && !inlined_.count(i) &&
           group_of_[i] < 0;
  }
  // The attention kernels this rank would make (find_attention), each its steps.
  const std::vector<std::vector<size_t>>& attention_groups() const { return attention_; }
  // Makes `steps` one attention kernel (every rank found it: fuse_all).
  void form_attention(const std::vector<size_t>& steps) {
    Group g;
    g.kind = KernelKind::Attention;
    g.steps = steps;
    g.views_only = false;
    groups_.push_back(std::move(g));
    for (size_t s : steps) group_of_[s] = static_cast<int>(groups_.size()) - 1;
  }
  size_t num_steps() const { return p_.steps.size(); }
  // The groups step i could join on this rank, best first.
  std::vector<int> candidates(size_t i) const {
    std::vector<int> c;
    for (int gi : operand_groups(i)) {
      if (opts_.isolate.count(groups_[static_cast<size_t>(gi)].steps.front())) continue;
      if (compatible(groups_[static_cast<size_t>(gi)], i) && !creates_cycle(static_cast<size_t>(gi), i)) c.push_back(gi);
    }
    return c;
  }
  // The groups of step i's operands, whether or not i could join them: a group that
  // i's other operands depend on (RoPE's x * cos beside rotate_half(x) * sin, where x
  // is computed) is no candidate, as i joining it alone would make a cycle, but it
  // may merge with the group i joins (mergeable checks the two together).
  std::vector<int> operand_groups(size_t i) const {
    std::vector<int> c;
    if (!opts_.enabled || opts_.isolate.count(i)) return c;
    for (int v : p_.steps[i].in) {
      auto it = producer_.find(v);
      if (it == producer_.end()) continue;
      int gi = group_of_[it->second];
      if (gi >= 0 && std::find(c.begin(), c.end(), gi) == c.end()) c.push_back(gi);
    }
    return c;
  }
  void join(int into, size_t i) {
    if (into >= 0) {
      add_to(static_cast<size_t>(into), i);
    } else {
      groups_.push_back(start_group(i));
      group_of_[i] = static_cast<int>(groups_.size()) - 1;
    }
  }
  LocalProgram finish() { return build(); }

  // Whether group `from` may merge into group `into` once step i has joined `into`
  // (i reads values of both). Where a slice or concat is involved: a concat joins
  // its operands' groups, and RoPE's x * cos + rotate_half(x) * sin ends as one kernel.
  // And a matmul's second operand's views (matmul_reads), as its first operand's joined.
  // Two pointwise groups of one index space merge; a group of another space only into
  // a slice's or concat's, when none of its values is used outside the two.
  bool mergeable(int into, int from, size_t i) const {
    if (into < 0 || from < 0 || into == from) return false;
    const Group& a = groups_[static_cast<size_t>(into)];
    const Group& b = groups_[static_cast<size_t>(from)];
    if (b.steps.empty()) return false;
    // A matmul that joined one operand's views takes the other operand's too.
    if (a.kind == KernelKind::Matmul && b.kind == KernelKind::Pointwise && b.views_only && a.steps.back() == i &&
        p_.steps[i].node.op == OpKind::Matmul) {
      if (static_cast<int>(a.steps.size() + b.steps.size()) > opts_.max_ops || !matmul_reads(b, i)) return false;
      std::set<size_t> both(a.steps.begin(), a.steps.end());
      both.insert(b.steps.begin(), b.steps.end());
      return !cycle_through_others(both);
    }
    if (a.kind != KernelKind::Pointwise || b.kind != KernelKind::Pointwise) return false;
    if (!a.reindexing && !b.reindexing) return false;
    if (static_cast<int>(a.steps.size() + b.steps.size()) > opts_.max_ops) return false;
    std::set<size_t> both(a.steps.begin(), a.steps.end());
    both.insert(b.steps.begin(), b.steps.end());
    if (b.numel != a.numel && !(reindexes(p_.steps[i].node.op) && closed(b, both))) return false;
    return !cycle_through_others(both);
  }
  size_t num_groups() const { return groups_.size(); }

  // Whether reduction groups `a` and `b` may become one kernel as siblings (Inductor's
  // horizontal fusion of reductions over one iteration domain): they reduce one shape
  // over the same dims, read a value in common (a layer norm backward's dy, in the
  // sums of dy * xhat and of dy), and neither reads the other's values, directly or
  // through other steps; the kernel then reads the common value once, in one pass.
  bool siblings(size_t a, size_t b) const {
    const Group& x = groups_[a];
    const Group& y = groups_[b];
    if (a == b || x.kind != KernelKind::Reduction || y.kind != KernelKind::Reduction || x.steps.empty() ||
        y.steps.empty())
      return false;
    if (x.full != y.full || x.rdims != y.rdims) return false;
    if (static_cast<int>(x.steps.size() + y.steps.size()) > opts_.max_ops) return false;
    for (const Group* g : {&x, &y})
      for (size_t st : g->steps)
        if (opts_.isolate.count(st)) return false;
    const std::vector<int> xr = reads_from_outside(x), yr = reads_from_outside(y);
    const std::set<int> xin(xr.begin(), xr.end()), yin(yr.begin(), yr.end());
    for (size_t st : x.steps)
      if (yin.count(p_.steps[st].out)) return false;
    for (size_t st : y.steps)
      if (xin.count(p_.steps[st].out)) return false;
    if (std::none_of(xin.begin(), xin.end(), [&](int v) { return yin.count(v) > 0; })) return false;
    std::set<size_t> both(x.steps.begin(), x.steps.end());
    both.insert(y.steps.begin(), y.steps.end());
    return !cycle_through_others(both);
  }

  void merge(int into, int from) {
    Group& a = groups_[static_cast<size_t>(into)];
    Group& b = groups_[static_cast<size_t>(from)];
    for (size_t s : b.steps) group_of_[s] = into;
    a.steps.insert(a.steps.end(), b.steps.begin(), b.steps.end());
    std::sort(a.steps.begin(), a.steps.end());
    a.views_only = a.views_only && b.views_only;
    a.reindexing = a.kind == KernelKind::Pointwise || a.reindexing;  // a matmul takes views only
    b.steps.clear();  // gets no kernel
  }

 private:
  bool is_constant_value(int v) const {
    auto it = producer_.find(v);
    return it != producer_.end() && p_.steps[it->second].kind == LocalStep::Kind::Compute &&
           p_.steps[it->second].node.op == OpKind::Constant;
  }
  const TensorType& type(int v) const { return p_.types[static_cast<size_t>(v)]; }

  // The values group g's steps read that it does not compute, in the order they are
  // first read (literals and inlined values aside: the kernel makes those itself): the
  // kernel's inputs.
  std::vector<int> reads_from_outside(const Group& g) const {
    std::set<int> produced;
    std::vector<int> in;
    for (size_t i : g.steps) produced.insert(p_.steps[i].out);
    for (size_t i : g.steps)
      for (int v : p_.steps[i].in)
        if (!produced.count(v) && !is_constant_value(v) && !is_inlined_value(v) &&
            std::find(in.begin(), in.end(), v) == in.end())
          in.push_back(v);
    return in;
  }

  // Values made from their index alone (arange, full, and elementwise ops, views and
  // tril/triu of such values and literals: a causal mask) are recomputed in every
  // kernel that reads them, as literals are folded, instead of being written by a
  // kernel of their own and read back. A value stays materialised when it leaves the
  // kernels (returned, or read by a collective, slice or concat), when an op reads it
  // from memory (a matmul's or an embedding's operand), or when its step is isolated.
  // Every rank decides alike: it depends only on the steps, which ranks share.
  // A value is inlined only while what it brings into each kernel that reads it stays
  // within max_ops (counted with repeats, an upper bound), so that a long generated
  // chain read by many kernels is written once instead of compiled into each.
  // And a value whose chain calls a transcendental (exp, log, sin, cos, tanh, pow,
  // erf, ...) is written once where a step that is not inlined reads it with more
  // dims than it has: that step would run the calls at every element of its own,
  // broadcast, output. A RoPE's cos and sin tables, [s, d] from arange, pow, cos and
  // sin, read by q [b, h, s, d], cost libdevice's calls b x h times over otherwise.
  // The test uses ranks, not sizes, so every rank decides alike.
  void find_inlined() {
    std::set<size_t> written;  // steps the rule above takes out
    for (;;) {
      inline_pass(written);
      bool more = false;
      for (size_t i : inlined_) {
        if (!inlined_costly_.count(i)) continue;
        const size_t rank = type(p_.steps[i].out).shape.size();
        for (size_t u : users_[p_.steps[i].out]) {
          const LocalStep& r = p_.steps[u];
          if (!inlined_.count(u) && r.out >= 0 && type(r.out).shape.size() > rank) {
            more |= written.insert(i).second;
            break;
          }
        }
      }
      if (!more) return;
    }
  }
  static bool transcendental(OpKind op) {
    switch (op) {
      case OpKind::Exp: case OpKind::Log: case OpKind::Sqrt: case OpKind::Rsqrt: case OpKind::Tanh:
      case OpKind::Sigmoid: case OpKind::Silu: case OpKind::Sin: case OpKind::Cos: case OpKind::Erf:
      case OpKind::Pow: return true;
      default: return false;
    }
  }
  void inline_pass(const std::set<size_t>& written) {
    inlined_.clear();
    inlined_weight_.clear();
    inlined_costly_.clear();
    std::set<int> materialised(p_.output_values.begin(), p_.output_values.end());
    for (const LocalStep& s : p_.steps) {
      const bool computes_in_place = s.kind == LocalStep::Kind::Compute &&
                                     (index_computed(s.node.op) || op_info(s.node.op).category == OpCategory::Reduce);
      if (!computes_in_place) materialised.insert(s.in.begin(), s.in.end());
    }
    for (size_t i = 0; i < p_.steps.size(); ++i) {
      const LocalStep& s = p_.steps[i];
      if (s.kind != LocalStep::Kind::Compute || !index_computed(s.node.op) || opts_.isolate.count(i) ||
          materialised.count(s.out) || written.count(i))
        continue;
      const bool from_index =
          std::all_of(s.in.begin(), s.in.end(), [&](int v) { return is_constant_value(v) || is_inlined_value(v); });
      if (!from_index) continue;
      int weight = 1;
      for (int v : s.in)
        if (is_inlined_value(v)) weight = std::min(weight + inlined_weight_[producer_.at(v)], opts_.max_ops + 1);
      if (weight > opts_.max_ops) continue;
      inlined_.insert(i);
      inlined_weight_[i] = weight;
      bool costly = transcendental(s.node.op);
      for (int v : s.in) costly |= is_inlined_value(v) && inlined_costly_.count(producer_.at(v)) > 0;
      if (costly) inlined_costly_.insert(i);
    }
  }
  bool is_inlined_value(int v) const {
    auto it = producer_.find(v);
    return it != producer_.end() && inlined_.count(it->second) > 0;
  }
  bool reads_inlined(size_t i) const {
    const std::vector<int>& in = p_.steps[i].in;
    return std::any_of(in.begin(), in.end(), [&](int v) { return is_inlined_value(v); });
  }
  // The inlined steps a group recomputes (what its steps read, transitively), in order.
  std::vector<size_t> inlined_reads(const Group& g) const {
    std::set<size_t> found;
    std::vector<int> work;
    for (size_t i : g.steps) work.insert(work.end(), p_.steps[i].in.begin(), p_.steps[i].in.end());
    while (!work.empty()) {
      int v = work.back();
      work.pop_back();
      if (!is_inlined_value(v)) continue;
      size_t i = producer_.at(v);
      if (found.insert(i).second) work.insert(work.end(), p_.steps[i].in.begin(), p_.steps[i].in.end());
    }
    return {found.begin(), found.end()};
  }

  // Every attention of the program as the steps of one kernel (fuse_attention.h).
  void find_attention() {
    AttentionSearch a{p_, producer_, users_, inlined_, opts_,
                      [this](const std::set<size_t>& m) { return cycle_through_others(m); }};
    attention_ = find_attention_groups(a);
  }

  Group start_group(size_t i) const {
    const Node& n = p_.steps[i].node;
    Group g;
    g.kind = step_kind(n);
    g.steps = {i};
    g.numel = numel(n.type.shape);
    // A matmul reads its operands in place: a view of a recomputed value is no such operand.
    g.views_only = is_strided_view(n.op) && !reads_inlined(i);
    g.reindexing = reindexes(n.op);
    if (g.kind == KernelKind::Reduction) {
      const TensorType& x = type(p_.steps[i].in[0]);
      g.full = x.shape;
      g.rdims = reduced_dims(n.attrs, x.rank());
      g.reduced_numel = numel(n.type.shape);
    }
    return g;
  }

  void add_to(size_t gi, size_t i) {
    Group& g = groups_[gi];
    const Node& n = p_.steps[i].node;
    KernelKind k = step_kind(n);
    if (g.kind == KernelKind::Pointwise && k == KernelKind::Reduction) {
      Group r = start_group(i);
      r.steps = g.steps;
      g = r;
    } else if (g.kind == KernelKind::Pointwise && k == KernelKind::Matmul) {
      g.kind = KernelKind::Matmul;
      g.numel = numel(n.type.shape);
    } else if (g.kind == KernelKind::Pointwise) {
      g.numel = numel(n.type.shape);  // a slice or concat may move the group to its result's space
    }
    g.views_only = g.views_only && is_strided_view(n.op) && !reads_inlined(i);
    g.reindexing = g.reindexing || reindexes(n.op);
    g.steps.push_back(i);
    group_of_[i] = static_cast<int>(gi);
  }

  // Whether step i may join group g (kinds and index spaces agree).
  bool compatible(const Group& g, size_t i) const {
    const LocalStep& s = p_.steps[i];
    const Node& n = s.node;
    KernelKind k = step_kind(n);
    if (k == KernelKind::Gather || g.kind == KernelKind::Gather) return false;
    if (static_cast<int>(g.steps.size()) >= opts_.max_ops) return false;
    int64_t out = numel(n.type.shape);
    switch (g.kind) {
      case KernelKind::Pointwise:
        if (k == KernelKind::Pointwise) return out == g.numel || (reindexes(n.op) && closed(g, {i}));
        if (k == KernelKind::Reduction) {
          // The chain becomes the reduction's prologue, in the reduced tensor's space.
          return feeds_only(g, i, 0) && numel(type(s.in[0]).shape) == g.numel;
        }
        // An operand read in place through views; only params' or other kernels'
        // outputs go through them (their operand is not computed in this group).
        if (k == KernelKind::Matmul) return g.views_only && matmul_reads(g, i);
        return false;
      case KernelKind::Reduction:
        // A slice or concat in the epilogue would read row values at other rows.
        if (k == KernelKind::Pointwise) return !reindexes(n.op) && (out == numel(g.full) || out == g.reduced_numel);
        if (k == KernelKind::Reduction) {
          const TensorType& x = type(s.in[0]);
          return x.shape == g.full && reduced_dims(n.attrs, x.rank()) == g.rdims;
        }
        return false;
      // The epilogue is elementwise on the matmul's output space: views after a matmul
      // would need the store's index remapped per element, so they start a new kernel.
      //
      // Nor does it read what a decomposed reduce-scatter's last transfer brings:
      // the rank's own chunk's matmul would wait for that transfer instead of running
      // while it travels. The chunks that came earlier are added in that matmul's
      // epilogue; the last one, in a small kernel after it.
      //
      // Nor does it widen what a reduction reads (a norm's cast of the residual to f32
      // after the output projection): the epilogue would write the wide values for the
      // reduction to read back, where the reduction's prologue widens them in registers.
      case KernelKind::Matmul:
        if (std::any_of(s.in.begin(), s.in.end(), [&](int v) { return late_values_.count(v) > 0; })) return false;
        if (widens(i) && reaches_reduction(i)) return false;
        return k == KernelKind::Pointwise && out == g.numel && op_info(n.op).category != OpCategory::Movement;
      case KernelKind::Gather:
      case KernelKind::Attention: return false;
    }
    return false;
  }

  // Whether step i is a cast to a wider dtype.
  bool widens(size_t i) const {
    const LocalStep& s = p_.steps[i];
    return s.node.op == OpKind::Cast && s.in.size() == 1 &&
           dtype_size(s.node.type.dtype) > dtype_size(type(s.in[0]).dtype);
  }
  // Whether a reduction reads step i's value, directly or through elementwise ops and
  // views.
  bool reaches_reduction(size_t i) const {
    std::set<size_t> seen;
    std::vector<size_t> work{i};
    while (!work.empty()) {
      const size_t x = work.back();
      work.pop_back();
      auto u = users_.find(p_.steps[x].out);
      if (u == users_.end()) continue;
      for (size_t r : u->second) {
        const LocalStep& rs = p_.steps[r];
        if (rs.kind != LocalStep::Kind::Compute || !seen.insert(r).second) continue;
        if (op_info(rs.node.op).category == OpCategory::Reduce) return true;
        if (index_computed(rs.node.op)) work.push_back(r);
      }
    }
    return false;
  }

  // Whether matmul step i can read what views-only group g gives it in place: the
  // chain from each operand down to the value g reads has a stride per dim (a
  // reshape of a permuted head split, [b, h, s, d] -> [b, s, h * d], has none), and
  // no value of g is needed elsewhere (the matmul kernel writes only its own output).
  bool matmul_reads(const Group& g, size_t i) const {
    std::set<size_t> in_g(g.steps.begin(), g.steps.end());
    for (int v : p_.steps[i].in) {
      std::vector<size_t> chain;  // from the operand down
      for (auto it = producer_.find(v); it != producer_.end() && in_g.count(it->second);
           it = producer_.find(p_.steps[it->second].in.at(0)))
        chain.push_back(it->second);
      if (chain.empty()) continue;
      Shape shape = type(p_.steps[chain.back()].in.at(0)).shape;
      std::vector<int64_t> strides = contiguous_strides(shape);
      for (size_t c = chain.size(); c-- > 0;) {
        const Node& n = p_.steps[chain[c]].node;
        std::optional<std::vector<int64_t>> st = view_strides(n, shape, strides);
        if (!st) return false;
        strides = std::move(st).value();
        shape = n.type.shape;
      }
    }
    // Transposes and permutes are read in place whatever else reads their values
    // (those users get a kernel of their own); a reshape or expand too only when the
    // matmul is their one user.
    const bool only_permutes = std::all_of(g.steps.begin(), g.steps.end(), [&](size_t m) {
      return p_.steps[m].node.op == OpKind::Transpose || p_.steps[m].node.op == OpKind::Permute;
    });
    return only_permutes || closed(g, {i});
  }

  // Whether group g's values reach step i only through operand `k`.
  bool feeds_only(const Group& g, size_t i, size_t k) const {
    const LocalStep& s = p_.steps[i];
    for (size_t j = 0; j < s.in.size(); ++j) {
      auto it = producer_.find(s.in[j]);
      if (j != k && it != producer_.end() && group_of_[it->second] >= 0 &&
          &groups_[static_cast<size_t>(group_of_[it->second])] == &g)
        return false;
    }
    return true;
  }

  // Whether no value of group g is returned or used outside g and `also` (steps):
  // then its values may be computed in another index space than the kernel's outputs.
  bool closed(const Group& g, const std::set<size_t>& also) const {
    std::set<int> outputs(p_.output_values.begin(), p_.output_values.end());
    for (size_t m : g.steps) {
      int v = p_.steps[m].out;
      if (outputs.count(v)) return false;
      auto it = users_.find(v);
      if (it == users_.end()) continue;
      for (size_t u : it->second)
        if (group_of_[u] != group_of_[m] && !also.count(u)) return false;
    }
    return true;
  }

  // Joining i to group gi must not make a cycle: no operand of i may be produced,
  // outside the group, by a step that depends on the group.
  bool creates_cycle(size_t gi, size_t i) const {
    std::set<size_t> members(groups_[gi].steps.begin(), groups_[gi].steps.end());
    std::vector<size_t> work;
    for (int v : p_.steps[i].in) {
      auto it = producer_.find(v);
      if (it != producer_.end() && !members.count(it->second)) work.push_back(it->second);
    }
    return reaches(members, std::move(work));
  }

  // Whether steps `members` as one kernel would make a cycle: a step outside them that
  // depends on one of them and that one of them depends on (merging two groups).
  bool cycle_through_others(const std::set<size_t>& members) const {
    std::vector<size_t> work;
    for (size_t m : members)
      for (int v : p_.steps[m].in)
        if (auto it = producer_.find(v); it != producer_.end() && !members.count(it->second))
          work.push_back(it->second);
    return reaches(members, std::move(work));
  }

  // Whether walking back from `work` (steps outside `members`) through their operands
  // reaches a member.
  bool reaches(const std::set<size_t>& members, std::vector<size_t> work) const {
    std::set<size_t> seen;
    size_t first = *members.begin();
    while (!work.empty()) {
      size_t x = work.back();
      work.pop_back();
      if (x < first || !seen.insert(x).second) continue;
      if (members.count(x)) return true;
      for (int v : p_.steps[x].in)
        if (auto it = producer_.find(v); it != producer_.end()) work.push_back(it->second);
      if (p_.steps[x].kind == LocalStep::Kind::Wait)  // through its Start
        for (size_t y = 0; y < x; ++y)
          if (p_.steps[y].kind == LocalStep::Kind::Start && p_.steps[y].handle == p_.steps[x].handle) work.push_back(y);
    }
    return false;
  }

  LocalProgram build() {
    // Which values escape their group: used by another group, a non-compute step,
    // or returned.
    std::set<int> outputs(p_.output_values.begin(), p_.output_values.end());
    std::map<int, std::set<int>> users;  // value -> groups using it (-1: not a kernel)
    for (size_t i = 0; i < p_.steps.size(); ++i)
      if (!inlined_.count(i))  // an inlined step runs inside the kernels that read it
        for (int v : p_.steps[i].in) users[v].insert(group_of_[i]);

    std::vector<LocalStep> units;       // the new steps, before ordering
    std::vector<size_t> unit_pos;       // first original position, for a stable order
    for (size_t i = 0; i < p_.steps.size(); ++i) {
      const LocalStep& s = p_.steps[i];
      bool grouped = group_of_[i] >= 0;
      bool dead_constant = s.kind == LocalStep::Kind::Compute && s.node.op == OpKind::Constant &&
                           !outputs.count(s.out) && !users[s.out].count(-1);
      if (grouped || dead_constant || inlined_.count(i)) continue;
      units.push_back(s);
      unit_pos.push_back(i);
    }
    for (size_t gi = 0; gi < groups_.size(); ++gi) {
      // A group none of whose values is returned or used elsewhere is dead code
      // (`v = tanh(x)` never used): it gets no kernel, which would have no outputs.
      std::optional<LocalStep> k = kernel_step(gi, users, outputs);
      if (!k) continue;
      units.push_back(std::move(*k));
      unit_pos.push_back(groups_[gi].steps.front());
    }
    // Kahn's algorithm, earliest original position first: a valid program order
    // (the scheduler reorders it afterwards).
    std::map<int, size_t> prod;
    for (size_t u = 0; u < units.size(); ++u) {
      if (units[u].out >= 0) prod[units[u].out] = u;
      for (int v : units[u].outs) prod[v] = u;
    }
    std::vector<std::vector<size_t>> after(units.size());
    std::vector<int> missing(units.size(), 0);
    std::map<int, size_t> start_of;
    for (size_t u = 0; u < units.size(); ++u)
      if (units[u].kind == LocalStep::Kind::Start) start_of[units[u].handle] = u;
    for (size_t u = 0; u < units.size(); ++u) {
      std::set<size_t> deps;
      for (int v : units[u].in)
        if (auto it = prod.find(v); it != prod.end()) deps.insert(it->second);
      if (units[u].kind == LocalStep::Kind::Wait) deps.insert(start_of.at(units[u].handle));
      for (size_t d : deps) {
        after[d].push_back(u);
        ++missing[u];
      }
    }
    std::vector<bool> done(units.size(), false);
    std::vector<LocalStep> ordered;
    for (size_t k = 0; k < units.size(); ++k) {
      size_t pick = units.size();
      for (size_t u = 0; u < units.size(); ++u)
        if (!done[u] && missing[u] == 0 && (pick == units.size() || unit_pos[u] < unit_pos[pick])) pick = u;
      done[pick] = true;
      for (size_t a : after[pick]) --missing[a];
      ordered.push_back(std::move(units[pick]));
    }
    p_.steps = std::move(ordered);
    return std::move(p_);
  }

  std::optional<LocalStep> kernel_step(size_t gi, std::map<int, std::set<int>>& users, const std::set<int>& outputs) {
    const Group& g = groups_[gi];
    std::set<size_t> members(g.steps.begin(), g.steps.end());
    const std::vector<int> inputs = reads_from_outside(g);
    std::vector<int> outs;
    LocalKernel k;
    k.kind = g.kind;
    int64_t flops = 0;
    const std::vector<size_t> recomputed = inlined_reads(g);
    for (size_t i : recomputed) k.ops.push_back(std::string(op_name(p_.steps[i].node.op)));
    for (size_t i : g.steps) {
      int v = p_.steps[i].out;
      const std::set<int>& u = users[v];
      bool escapes = outputs.count(v) || std::any_of(u.begin(), u.end(), [&](int x) { return x != static_cast<int>(gi); });
      int64_t bytes = numel(type(v).shape) * dtype_size(type(v).dtype);
      if (escapes) {
        outs.push_back(v);
        k.bytes_written += bytes;
      } else {
        k.bytes_saved += 2 * bytes;  // written by one kernel and read by the next, unfused
      }
      const Node& n = p_.steps[i].node;
      k.ops.push_back(std::string(op_name(n.op)));
      if (n.op == OpKind::Matmul) {
        const TensorType& a = type(p_.steps[i].in[0]);
        flops += 2 * numel(n.type.shape) * a.shape.back();
      } else if (op_info(n.op).category == OpCategory::Reduce) {
        flops += numel(type(p_.steps[i].in[0]).shape);
      } else if (op_info(n.op).category != OpCategory::Movement) {
        flops += numel(n.type.shape);
      }
    }
    if (outs.empty()) return std::nullopt;
    for (int v : inputs) k.bytes_read += numel(type(v).shape) * dtype_size(type(v).dtype);
    k.flops = flops;
    // Named by its kind and first few computing ops (views say little): k9_matmul_add_mul_erf.
    k.name = "k" + std::to_string(gi);
    int named = 0;
    for (size_t i : g.steps) {
      const Node& n = p_.steps[i].node;
      if (op_info(n.op).category == OpCategory::Movement || named == 4) continue;
      k.name += "_" + std::string(op_name(n.op));
      ++named;
    }
    if (named == 0 || k.kind == KernelKind::Attention) k.name = "k" + std::to_string(gi) + "_" + std::string(kernel_kind_name(k.kind));
    k.group = group_graph(g, inputs, outs, k.name);
    // A causal attention skips the key tiles past the diagonal: its work is the pairs
    // it lets through.
    if (k.kind == KernelKind::Attention)
      k.flops = static_cast<int64_t>(static_cast<double>(k.flops) * attention_visible_fraction(k.group));
    k.steps = g.steps;
    k.steps.insert(k.steps.end(), recomputed.begin(), recomputed.end());
    std::sort(k.steps.begin(), k.steps.end());

    LocalStep s;
    s.kind = LocalStep::Kind::Kernel;
    s.kernel = static_cast<int>(p_.kernels.size());
    s.in = inputs;
    s.outs = outs;
    p_.kernels.push_back(std::move(k));
    return s;
  }

  Graph group_graph(const Group& g, const std::vector<int>& inputs, const std::vector<int>& outs,
                    const std::string& name) const {
    GraphBuilder b(name);
    std::map<int, Value> val;
    for (size_t k = 0; k < inputs.size(); ++k) {
      const TensorType& t = type(inputs[k]);
      val.emplace(inputs[k], b.param("in" + std::to_string(k), t.dtype, t.shape));
    }
    // A value the group does not compute or read: a literal folded into the kernel,
    // or an inlined value, recomputed here from its own operands.
    std::function<Value(int)> operand = [&](int v) -> Value {
      auto it = val.find(v);
      if (it != val.end()) return it->second;
      const LocalStep& p = p_.steps[producer_.at(v)];
      Value x;
      if (p.node.op == OpKind::Constant) {
        x = b.constant(p.node.attrs.get_float("value"), p.node.attrs.get_dtype("dtype"));
      } else {
        std::vector<Value> in;
        for (int u : p.in) in.push_back(operand(u));
        x = b.op(p.node.op, in, {}, p.node.attrs.items, p.node.loc);
      }
      val.emplace(v, x);
      return x;
    };
    for (size_t i : g.steps) {
      const LocalStep& s = p_.steps[i];
      std::vector<Value> in;
      for (int v : s.in) in.push_back(operand(v));
      val.emplace(s.out, b.op(s.node.op, in, {}, s.node.attrs.items, s.node.loc));
    }
    for (int v : outs) b.ret(val.at(v));
    Result<Graph> r = b.finish();
    if (!r.ok()) throw DiagError{r.error()};
    return std::move(r).value();
  }

  LocalProgram p_;
  FusionOptions opts_;
  std::map<int, size_t> producer_;
  std::map<int, std::vector<size_t>> users_;  // value -> the steps reading it
  std::set<int> late_values_;  // values that must not join a matmul's epilogue (above)
  std::set<size_t> inlined_;   // steps recomputed in the kernels that read them (find_inlined)
  std::map<size_t, int> inlined_weight_;  // ops an inlined step brings into a kernel
  std::set<size_t> inlined_costly_;       // inlined steps whose chain calls a transcendental
  std::vector<int> group_of_;
  std::vector<Group> groups_;
  std::vector<std::vector<size_t>> attention_;  // find_attention
};

}  // namespace

std::vector<LocalProgram> fuse_all(std::vector<LocalProgram> programs, const FusionOptions& opts) {
  for (const LocalProgram& p : programs)
    if (p.steps.size() != programs[0].steps.size())
      throw std::logic_error("fuse_all: rank " + std::to_string(p.rank) + "'s program differs from rank 0's (not SPMD)");
  std::vector<Fuser> f;
  for (LocalProgram& p : programs) f.emplace_back(std::move(p), opts);
  if (f.empty()) return {};
  // Attention kernels first, where every rank found the same one.
  for (const std::vector<size_t>& a : f[0].attention_groups()) {
    bool everywhere = true;
    for (size_t r = 1; r < f.size() && everywhere; ++r) {
      const std::vector<std::vector<size_t>>& other = f[r].attention_groups();
      everywhere = std::find(other.begin(), other.end(), a) != other.end();
    }
    if (everywhere)
      for (Fuser& x : f) x.form_attention(a);
  }
  for (size_t i = 0; i < f[0].num_steps(); ++i) {
    if (!f[0].fusible_step(i)) continue;
    // The first group of rank 0's choices that every rank also allows.
    int into = -1;
    for (int gi : f[0].candidates(i)) {
      bool everywhere = true;
      for (size_t r = 1; r < f.size() && everywhere; ++r) {
        std::vector<int> c = f[r].candidates(i);
        everywhere = std::find(c.begin(), c.end(), gi) != c.end();
      }
      if (everywhere) {
        into = gi;
        break;
      }
    }
    std::vector<int> others = f[0].operand_groups(i);
    for (Fuser& x : f) x.join(into, i);
    // A slice's or concat's other operand groups (and a RoPE's diamond) merge in too,
    // where every rank allows it.
    for (int gi : others) {
      bool everywhere = true;
      for (size_t r = 0; r < f.size() && everywhere; ++r) everywhere = f[r].mergeable(into, gi, i);
      if (everywhere)
        for (Fuser& x : f) x.merge(into, gi);
    }
  }
  // Sibling reductions (Fuser::siblings), where every rank allows it: each group takes
  // in every later one it is a sibling of, in order.
  for (size_t a = 0; a < f[0].num_groups(); ++a)
    for (size_t b = a + 1; b < f[0].num_groups(); ++b) {
      bool everywhere = true;
      for (size_t r = 0; r < f.size() && everywhere; ++r) everywhere = f[r].siblings(a, b);
      if (everywhere)
        for (Fuser& x : f) x.merge(static_cast<int>(a), static_cast<int>(b));
    }
  std::vector<LocalProgram> out;
  for (Fuser& x : f) out.push_back(x.finish());
  return out;
}

LocalProgram fuse(LocalProgram p, const FusionOptions& opts) {
  std::vector<LocalProgram> one;
  one.push_back(std::move(p));
  return std::move(fuse_all(std::move(one), opts)[0]);
}

}  // namespace sf
