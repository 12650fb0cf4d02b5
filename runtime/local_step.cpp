#include "runtime/local_step.h"

#include "codegen/dist/host_collectives.h"
#include "codegen/dist/shard.h"
#include "codegen/reference/evaluate.h"

namespace sf {

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

std::optional<Diag> run_local_step(const LocalProgram& p, const LocalStep& s, std::vector<Tensor>& v,
                                          const KernelRunner& kernels) {
  auto at = [&](int id) -> Tensor& { return v[static_cast<size_t>(id)]; };
  std::vector<const Tensor*> args;
  for (int a : s.in) args.push_back(&at(a));
  switch (s.kind) {
    case LocalStep::Kind::Compute: {
      Result<Tensor> t = evaluate_node(s.node, args);
      if (!t.ok()) return t.error();
      at(s.out) = std::move(t).value();
      return std::nullopt;
    }
    case LocalStep::Kind::Kernel: {
      const LocalKernel& k = p.kernels[static_cast<size_t>(s.kernel)];
      Result<std::vector<Tensor>> t = kernels.run(k, args);
      if (!t.ok()) return with_context("kernel " + k.name + ": ", t.error());
      for (size_t o = 0; o < s.outs.size(); ++o) at(s.outs[o]) = std::move((*t)[o]);
      return std::nullopt;
    }
    case LocalStep::Kind::Slice: at(s.out) = slice_block(at(s.in[0]), s.offset, s.shape); return std::nullopt;
    case LocalStep::Kind::Partialize: {
      const Tensor& x = at(s.in[0]);
      at(s.out) = s.keep ? x : Tensor(x.dtype(), x.shape());
      return std::nullopt;
    }
    case LocalStep::Kind::Concat: {
      std::vector<Tensor> parts;
      for (int a : s.in) parts.push_back(at(a));
      at(s.out) = concat(parts, s.dim);
      return std::nullopt;
    }
    case LocalStep::Kind::Start:
    case LocalStep::Kind::Wait: break;
  }
  return Diag{"", {}, "internal: not a local step"};
}

}  // namespace sf
