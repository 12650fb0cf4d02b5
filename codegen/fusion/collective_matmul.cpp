// Collective-matmul decomposition: the estimates that decide, and decompose_collective_matmuls.
#include "codegen/fusion/collective_matmul.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <optional>
#include <set>

#include "codegen/fusion/collective_matmul_internal.h"
#include "runtime/core/device_mesh.h"

namespace sf {

using namespace collective_matmul_detail;

std::optional<DecomposeMode> parse_decompose_mode(const std::string& s) {
  if (s == "auto") return DecomposeMode::Auto;
  if (s == "always") return DecomposeMode::Always;
  if (s == "never") return DecomposeMode::Never;
  return std::nullopt;
}

namespace {

int64_t bytes_of(const TensorType& t) { return numel(t.shape) * dtype_size(t.dtype); }

std::string us(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f us", s * 1e6);
  return buf;
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
