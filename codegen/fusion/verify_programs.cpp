#include "codegen/fusion/verify_programs.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <map>
#include <string>

#include "runtime/core/collective_check.h"

namespace sf {

namespace {

// A step named without trusting its fields (they are what is being checked).
std::string describe(const LocalProgram& p, const LocalStep& s) {
  switch (s.kind) {
    case LocalStep::Kind::Compute: return std::string(op_name(s.node.op));
    case LocalStep::Kind::Slice: return "slice";
    case LocalStep::Kind::Partialize: return "partialize";
    case LocalStep::Kind::Concat: return "concat";
    case LocalStep::Kind::Start: return std::string(collective_name(s.collective)) + " h" + std::to_string(s.handle);
    case LocalStep::Kind::Wait: return "wait h" + std::to_string(s.handle);
    case LocalStep::Kind::Kernel:
      if (s.kernel >= 0 && s.kernel < static_cast<int>(p.kernels.size()))
        return "kernel " + p.kernels[static_cast<size_t>(s.kernel)].name;
      return "kernel #" + std::to_string(s.kernel);
  }
  return "?";
}

struct Call {
  int rank;
  size_t step;
  CollectiveCall call;
};

class Verifier {
 public:
  Verifier(const std::vector<LocalProgram>& ps, const DeviceMesh& mesh, std::string_view stage)
      : ps_(ps), mesh_(mesh), stage_(stage) {}

  Result<void> run() {
    if (static_cast<int>(ps_.size()) != mesh_.world())
      return fail(std::to_string(ps_.size()) + " program(s) for a world of " + std::to_string(mesh_.world()));
    for (size_t r = 0; r < ps_.size(); ++r)
      SF_TRY(program(ps_[r], static_cast<int>(r)));
    return match_collectives();
  }

 private:
  Diag fail(const std::string& what) const { return Diag{"", {}, "after " + std::string(stage_) + ": " + what}; }
  Diag at(const LocalProgram& p, size_t i, const std::string& what) const {
    return fail("rank " + std::to_string(p.rank) + ", step " + std::to_string(i) + " (" + describe(p, p.steps[i]) +
                "): " + what);
  }

  Result<void> program(const LocalProgram& p, int r) {
    const std::string who = "rank " + std::to_string(r);
    if (p.rank != r) return fail(who + "'s program says it is rank " + std::to_string(p.rank));
    const int nv = static_cast<int>(p.types.size());
    if (p.names.size() != p.types.size())
      return fail(who + ": " + std::to_string(p.names.size()) + " names for " + std::to_string(nv) + " values");
    if (r > 0 && (p.param_values.size() != ps_[0].param_values.size() ||
                  p.output_values.size() != ps_[0].output_values.size()))
      return fail(who + " has " + std::to_string(p.param_values.size()) + " params and " +
                  std::to_string(p.output_values.size()) + " outputs; rank 0 has " +
                  std::to_string(ps_[0].param_values.size()) + " and " + std::to_string(ps_[0].output_values.size()));
    if (p.output_specs.size() != p.output_values.size())
      return fail(who + ": " + std::to_string(p.output_specs.size()) + " output placements for " +
                  std::to_string(p.output_values.size()) + " outputs");
    auto name = [&](int v) { return "%" + p.names[static_cast<size_t>(v)] + " (value " + std::to_string(v) + ")"; };
    auto type = [&](int v) -> const TensorType& { return p.types[static_cast<size_t>(v)]; };
    std::vector<bool> defined(static_cast<size_t>(nv), false);
    for (int v : p.param_values) {
      if (v < 0 || v >= nv) return fail(who + ": param value " + std::to_string(v) + " out of range");
      defined[static_cast<size_t>(v)] = true;
    }
    struct Open {
      size_t step;
      TensorType result;
    };
    std::map<int, Open> open;  // handle -> its start
    for (size_t i = 0; i < p.steps.size(); ++i) {
      const LocalStep& s = p.steps[i];
      for (int v : s.in) {
        if (v < 0 || v >= nv) return at(p, i, "reads value " + std::to_string(v) + ", which does not exist");
        if (!defined[static_cast<size_t>(v)]) return at(p, i, "uses " + name(v) + " before it is defined");
      }
      std::vector<int> outs = s.outs;
      if (s.out >= 0) outs.insert(outs.begin(), s.out);
      for (int v : outs)
        if (v >= nv) return at(p, i, "writes value " + std::to_string(v) + ", which does not exist");
      auto arity = [&](size_t in, bool out) -> Result<void> {
        if (s.in.size() != in || (s.out >= 0) != out || !s.outs.empty())
          return at(p, i, "takes " + std::to_string(s.in.size()) + " operand(s) and " +
                              std::to_string(s.outs.size() + (s.out >= 0)) + " result(s)");
        return {};
      };
      switch (s.kind) {
        case LocalStep::Kind::Compute:
          if (s.out < 0) return at(p, i, "has no result");
          if (type(s.out) != s.node.type)
            return at(p, i, "defines " + name(s.out) + " as " + type(s.out).str() + ", but its op gives " +
                                s.node.type.str());
          break;
        case LocalStep::Kind::Kernel: {
          if (s.kernel < 0 || s.kernel >= static_cast<int>(p.kernels.size()))
            return at(p, i, "names kernel " + std::to_string(s.kernel) + " of " + std::to_string(p.kernels.size()));
          if (s.out >= 0) return at(p, i, "a kernel step writes its `outs`, not `out`");
          const Graph& grp = p.kernels[static_cast<size_t>(s.kernel)].group;
          if (grp.params().size() != s.in.size() || grp.outputs().size() != s.outs.size())
            return at(p, i, "passes " + std::to_string(s.in.size()) + " operand(s) and " + std::to_string(s.outs.size()) +
                                " result(s) to a kernel of " + std::to_string(grp.params().size()) + " and " +
                                std::to_string(grp.outputs().size()));
          for (size_t k = 0; k < s.in.size(); ++k)
            if (type(s.in[k]) != grp.node(grp.params()[k]).type)
              return at(p, i, "operand " + std::to_string(k) + " " + name(s.in[k]) + " is " + type(s.in[k]).str() +
                                  ", the kernel reads " + grp.node(grp.params()[k]).type.str());
          for (size_t k = 0; k < s.outs.size(); ++k)
            if (s.outs[k] < 0 || type(s.outs[k]) != grp.node(grp.outputs()[k].value).type)
              return at(p, i, "result " + std::to_string(k) + " is " +
                                  (s.outs[k] < 0 ? std::string("missing") : type(s.outs[k]).str()) +
                                  ", the kernel writes " + grp.node(grp.outputs()[k].value).type.str());
          break;
        }
        case LocalStep::Kind::Slice: {
          SF_TRY(arity(1, true));
          const TensorType &in = type(s.in[0]), &out = type(s.out);
          bool fits = in.dtype == out.dtype && s.offset.size() == in.shape.size() && out.shape == s.shape &&
                      out.shape.size() == in.shape.size();
          for (size_t d = 0; fits && d < in.shape.size(); ++d)
            fits = s.offset[d] >= 0 && s.offset[d] <= in.shape[d] && out.shape[d] <= in.shape[d] - s.offset[d];
          if (!fits) return at(p, i, "a block of " + out.str() + " at its offset does not fit in " + in.str());
          break;
        }
        case LocalStep::Kind::Partialize:
          SF_TRY(arity(1, true));
          if (type(s.in[0]) != type(s.out)) return at(p, i, "from " + type(s.in[0]).str() + " into " + type(s.out).str());
          break;
        case LocalStep::Kind::Concat: {
          if (s.in.empty() || s.out < 0) return at(p, i, "joins nothing or into nothing");
          const TensorType& out = type(s.out);
          if (s.dim < 0 || s.dim >= out.rank()) return at(p, i, "along dim " + std::to_string(s.dim) + " of " + out.str());
          int64_t total = 0;
          for (int v : s.in) {
            const TensorType& t = type(v);
            bool fits = t.dtype == out.dtype && t.rank() == out.rank();
            for (int d = 0; fits && d < out.rank(); ++d)
              if (d != s.dim) fits = t.shape[static_cast<size_t>(d)] == out.shape[static_cast<size_t>(d)];
            if (!fits) return at(p, i, "part " + t.str() + " does not join into " + out.str());
            total += t.shape[static_cast<size_t>(s.dim)];
          }
          if (total != out.shape[static_cast<size_t>(s.dim)])
            return at(p, i, "the parts add up to " + std::to_string(total) + " along dim " + std::to_string(s.dim) +
                                " of " + out.str());
          break;
        }
        case LocalStep::Kind::Start: {
          SF_TRY(arity(1, false));
          if (s.mesh_dim < 0 || s.mesh_dim >= mesh_.ndim())
            return at(p, i, "along mesh dim " + std::to_string(s.mesh_dim) + " of " + std::to_string(mesh_.ndim()));
          if (open.count(s.handle)) return at(p, i, "handle h" + std::to_string(s.handle) + " is started again before its wait");
          const std::vector<int> group = mesh_.group(r, s.mesh_dim);
          CollectiveCall c;
          c.kind = s.collective;
          c.op = s.op;
          c.dim = s.dim;
          c.dim2 = s.dim2;
          c.sizes = s.sizes;
          c.sizes2 = s.sizes2;
          c.in = type(s.in[0]);
          c.members = static_cast<int>(group.size());
          c.member = static_cast<int>(std::find(group.begin(), group.end(), r) - group.begin());
          Result<TensorType> result = collective_result(c);
          if (!result) return at(p, i, result.error().message);
          open.emplace(s.handle, Open{i, *result});
          calls_.push_back({r, i, std::move(c)});
          break;
        }
        case LocalStep::Kind::Wait: {
          SF_TRY(arity(0, true));
          auto it = open.find(s.handle);
          if (it == open.end()) return at(p, i, "waits for h" + std::to_string(s.handle) + ", which is not started");
          if (type(s.out) != it->second.result)
            return at(p, i, "receives into " + name(s.out) + " of " + type(s.out).str() + ", but the collective at step " +
                                std::to_string(it->second.step) + " gives " + it->second.result.str());
          open.erase(it);
          break;
        }
      }
      for (int v : outs) {
        if (v < 0) continue;
        if (defined[static_cast<size_t>(v)]) return at(p, i, "defines " + name(v) + " again");
        defined[static_cast<size_t>(v)] = true;
      }
    }
    if (!open.empty()) {
      const size_t i = open.begin()->second.step;
      return at(p, i, "is started but never waited for");
    }
    for (size_t o = 0; o < p.output_values.size(); ++o) {
      const int v = p.output_values[o];
      if (v < 0 || v >= nv || !defined[static_cast<size_t>(v)])
        return fail(who + ": output " + std::to_string(o) + " (value " + std::to_string(v) + ") is never defined");
    }
    return {};
  }

  // The k-th collective a member issues along a mesh dim meets the k-th of every
  // other member of its group (as Gloo's and NCCL's communicators order them).
  Result<void> match_collectives() const {
    for (int d = 0; d < mesh_.ndim(); ++d) {
      std::vector<std::vector<const Call*>> seq(ps_.size());
      for (const Call& c : calls_)
        if (ps_[static_cast<size_t>(c.rank)].steps[c.step].mesh_dim == d) seq[static_cast<size_t>(c.rank)].push_back(&c);
      const std::string dname = mesh_.mesh().dims[static_cast<size_t>(d)].name;
      for (const std::vector<int>& group : mesh_.groups(d)) {
        const int a = group.front();
        for (int b : group) {
          const auto &sa = seq[static_cast<size_t>(a)], &sb = seq[static_cast<size_t>(b)];
          for (size_t k = 0; k < std::min(sa.size(), sb.size()); ++k)
            if (std::optional<std::string> why = collective_mismatch(sa[k]->call, sb[k]->call))
              return at(ps_[static_cast<size_t>(b)], sb[k]->step,
                        "does not match rank " + std::to_string(a) + "'s step " + std::to_string(sa[k]->step) +
                            " (collective " + std::to_string(k) + " along " + dname + "): " + *why);
          if (sa.size() != sb.size()) {
            const Call& extra = sa.size() > sb.size() ? *sa[sb.size()] : *sb[sa.size()];
            const int missing = sa.size() > sb.size() ? b : a;
            return at(ps_[static_cast<size_t>(extra.rank)], extra.step,
                      "has no partner on rank " + std::to_string(missing) + " (rank " + std::to_string(a) + " issues " +
                          std::to_string(sa.size()) + " collective(s) along " + dname + ", rank " + std::to_string(b) +
                          " " + std::to_string(sb.size()) + ")");
          }
        }
      }
    }
    return {};
  }

  const std::vector<LocalProgram>& ps_;
  const DeviceMesh& mesh_;
  std::string_view stage_;
  std::vector<Call> calls_;
};

}  // namespace

Result<void> verify_programs(const std::vector<LocalProgram>& programs, const DeviceMesh& mesh,
                                    std::string_view stage) {
  return Verifier(programs, mesh, stage).run();
}

namespace {
std::atomic<bool> verify_each_switch{false};
}  // namespace

void set_verify_each(bool on) { verify_each_switch = on; }

bool verify_each_from_env() {
  if (verify_each_switch) return true;
  const char* v = std::getenv("SHARDFUSE_VERIFY_EACH");
  return v && *v && std::string_view(v) != "0";
}

}  // namespace sf
