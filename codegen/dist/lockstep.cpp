#include "codegen/dist/lockstep.h"

#include "runtime/core/host_collectives.h"
#include "runtime/core/shard.h"
#include "codegen/reference/evaluate.h"

namespace sf {

namespace {

// Whether `s` needs no communication (compute, kernel, slice, partialize, concat).
bool is_local_step(const LocalStep& s) {
  switch (s.kind) {
    case LocalStep::Kind::Compute:
    case LocalStep::Kind::Kernel:
    case LocalStep::Kind::Slice:
    case LocalStep::Kind::Partialize:
    case LocalStep::Kind::Concat: return true;
    case LocalStep::Kind::Start:
    case LocalStep::Kind::Wait: return false;
  }
  return false;
}

// Runs such a step of program `p` on `v` (indexed by local value id); on failure the
// kernel or op's message, and nothing written.
Result<void> run_local_step(const LocalProgram& p, const LocalStep& s, std::vector<Tensor>& v,
                            const KernelRunner& kernels) {
  auto at = [&](int id) -> Tensor& { return v[static_cast<size_t>(id)]; };
  std::vector<const Tensor*> args;
  for (int a : s.in) args.push_back(&at(a));
  switch (s.kind) {
    case LocalStep::Kind::Compute: {
      Result<Tensor> t = evaluate_node(s.node, args);
      if (!t.ok()) return t.error();
      at(s.out) = std::move(t).value();
      return {};
    }
    case LocalStep::Kind::Kernel: {
      const LocalKernel& k = p.kernels[static_cast<size_t>(s.kernel)];
      Result<std::vector<Tensor>> t = kernels.run(k, args);
      if (!t.ok()) return with_context("kernel " + k.name + ": ", t.error());
      for (size_t o = 0; o < s.outs.size(); ++o) at(s.outs[o]) = std::move((*t)[o]);
      return {};
    }
    case LocalStep::Kind::Slice: at(s.out) = slice_block(at(s.in[0]), s.offset, s.shape); return {};
    case LocalStep::Kind::Partialize: {
      const Tensor& x = at(s.in[0]);
      at(s.out) = s.keep ? x : Tensor(x.dtype(), x.shape());
      return {};
    }
    case LocalStep::Kind::Concat: {
      std::vector<Tensor> parts;
      for (int a : s.in) parts.push_back(at(a));
      at(s.out) = concat(parts, s.dim);
      return {};
    }
    case LocalStep::Kind::Start:
    case LocalStep::Kind::Wait: break;
  }
  return Diag{"", {}, "internal: not a local step"};
}

// One collective over one group: member k's result, from member k's input and step.
std::vector<Tensor> run_group(const std::vector<const LocalStep*>& steps, const std::vector<Tensor>& in) {
  const LocalStep& s = *steps[0];
  switch (s.collective) {
    case CollectiveKind::AllGather: return host_all_gather(in, s.dim);
    case CollectiveKind::AllReduce: return host_all_reduce(in, s.op);
    case CollectiveKind::ReduceScatter: return host_reduce_scatter(in, s.dim, s.sizes, s.op);
    case CollectiveKind::AllToAll: {
      std::vector<std::vector<int64_t>> send;
      for (const LocalStep* m : steps) send.push_back(m->sizes);
      return host_all_to_all(in, s.dim, send, s.dim2);
    }
  }
  throw DiagError{Diag{"", {}, "simulate: not a collective"}};
}

}  // namespace

Result<std::vector<std::vector<Tensor>>> simulate(const std::vector<LocalProgram>& programs, const DeviceMesh& mesh,
                                                  const std::vector<std::vector<Tensor>>& inputs,
                                                  const KernelRunner& kernels) {
  size_t world = programs.size();
  for (const LocalProgram& p : programs)
    if (p.steps.size() != programs[0].steps.size())
      return Diag{"", {}, "simulate: rank " + std::to_string(p.rank) + " has " + std::to_string(p.steps.size()) +
                              " steps, rank 0 has " + std::to_string(programs[0].steps.size()) + " (not SPMD)"};
  std::vector<std::vector<Tensor>> vals(world), pending(world);
  for (size_t r = 0; r < world; ++r) {
    vals[r].resize(programs[r].types.size());
    pending[r].resize(static_cast<size_t>(programs[r].num_handles));
    for (size_t p = 0; p < programs[r].param_values.size(); ++p)
      vals[r][static_cast<size_t>(programs[r].param_values[p])] = inputs[r][p];
  }
  try {
    for (size_t i = 0; i < programs[0].steps.size(); ++i) {
      const LocalStep& s0 = programs[0].steps[i];
      if (s0.kind == LocalStep::Kind::Start) {
        for (const std::vector<int>& g : mesh.groups(s0.mesh_dim)) {
          std::vector<const LocalStep*> steps;
          std::vector<Tensor> in;
          for (int r : g) {
            const LocalStep& s = programs[static_cast<size_t>(r)].steps[i];
            steps.push_back(&s);
            in.push_back(vals[static_cast<size_t>(r)][static_cast<size_t>(s.in[0])]);
          }
          std::vector<Tensor> out = run_group(steps, in);
          for (size_t k = 0; k < g.size(); ++k)
            pending[static_cast<size_t>(g[k])][static_cast<size_t>(steps[k]->handle)] = std::move(out[k]);
        }
        continue;
      }
      for (size_t r = 0; r < world; ++r) {
        const LocalStep& s = programs[r].steps[i];
        std::vector<Tensor>& v = vals[r];
        if (s.kind == LocalStep::Kind::Wait) {
          v[static_cast<size_t>(s.out)] = std::move(pending[r][static_cast<size_t>(s.handle)]);
        } else if (is_local_step(s)) {
          if (Result<void> err = run_local_step(programs[r], s, v, kernels); !err.ok())
            return with_context("rank " + std::to_string(r) + ": ", err.error());
        }
      }
    }
  } catch (const DiagError& e) {
    return e.diag;
  }
  std::vector<std::vector<Tensor>> out(world);
  for (size_t r = 0; r < world; ++r)
    for (int o : programs[r].output_values) out[r].push_back(vals[r][static_cast<size_t>(o)]);
  return out;
}

}  // namespace sf
