#include "codegen/fusion/timeline.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "codegen/ir/attention_match.h"
#include "runtime/core/file_io.h"
#include "codegen/ir/ops.h"

namespace sf {

using json = nlohmann::json;

// --- the collectives ----------------------------------------------------------------------

bool is_ring_shift(const LocalStep& s) {
  return s.kind == LocalStep::Kind::Start && s.collective == CollectiveKind::AllToAll && s.ring_steps > 0;
}

int64_t collective_bytes(const LocalProgram& p, size_t step, int n) {
  const LocalStep& s = p.steps[step];
  if (s.in.empty()) return 0;
  const TensorType& t = p.types[static_cast<size_t>(s.in[0])];
  const int64_t es = dtype_size(t.dtype);
  const int64_t whole = numel(t.shape) * es;
  // Bytes of one index along `dim` (the product of the other extents).
  auto slab = [&](int dim) {
    int64_t b = es;
    for (int i = 0; i < t.rank(); ++i)
      if (i != dim) b *= t.shape[static_cast<size_t>(i)];
    return b;
  };
  auto largest = [](const std::vector<int64_t>& v) { return v.empty() ? int64_t{0} : *std::max_element(v.begin(), v.end()); };
  const bool sized = !s.sizes.empty() && s.dim >= 0 && s.dim < t.rank();
  if (is_ring_shift(s)) return sized ? largest(s.sizes) * slab(s.dim) : whole;
  switch (s.collective) {
    case CollectiveKind::AllGather: return sized ? n * largest(s.sizes) * slab(s.dim) : n * whole;
    case CollectiveKind::ReduceScatter:
    case CollectiveKind::AllToAll: return sized ? n * largest(s.sizes) * slab(s.dim) : whole;
    case CollectiveKind::AllReduce: return whole;
  }
  return 0;
}

// --- compute work --------------------------------------------------------------------

StepWork step_work(const LocalProgram& p, size_t step) {
  const LocalStep& s = p.steps[step];
  auto bytes_of = [&](int v) {
    const TensorType& t = p.types[static_cast<size_t>(v)];
    return numel(t.shape) * dtype_size(t.dtype);
  };
  StepWork w;
  switch (s.kind) {
    case LocalStep::Kind::Kernel: {
      const LocalKernel& k = p.kernels[static_cast<size_t>(s.kernel)];
      w.flops = k.flops;
      w.bytes = k.bytes_read + k.bytes_written;
      // A matmul of 16-bit operands runs on the tensor cores (sm_80+); its epilogue
      // stays on the CUDA cores.
      // A causal attention's matmuls do the share of their work it lets through (its
      // k.flops counts the same share).
      const double share = k.kind == KernelKind::Attention ? attention_visible_fraction(k.group) : 1.0;
      for (const Node& n : k.group.nodes())
        if (n.op == OpKind::Matmul && (n.type.dtype == DType::BF16 || n.type.dtype == DType::F16) &&
            !n.inputs.empty()) {
          const Shape& a = k.group.node(n.inputs[0]).type.shape;
          int64_t mm = a.empty() ? 0 : static_cast<int64_t>(share * static_cast<double>(2 * numel(n.type.shape) * a.back()));
          w.tensor_flops += std::min(mm, w.flops);
          w.flops -= std::min(mm, w.flops);
        }
      break;
    }
    case LocalStep::Kind::Compute: {
      for (int v : s.in) w.bytes += bytes_of(v);
      if (s.out >= 0) {
        w.bytes += bytes_of(s.out);
        const TensorType& o = p.types[static_cast<size_t>(s.out)];
        w.flops = numel(o.shape);
        if (s.node.op == OpKind::Matmul && !s.in.empty()) {
          const TensorType& a = p.types[static_cast<size_t>(s.in[0])];
          if (a.rank() > 0) w.flops = 2 * numel(o.shape) * a.shape.back();  // one multiply-add per K
          if (a.dtype == DType::BF16 || a.dtype == DType::F16) std::swap(w.flops, w.tensor_flops);
        }
      }
      break;
    }
    case LocalStep::Kind::Slice:
    case LocalStep::Kind::Partialize:
    case LocalStep::Kind::Concat:
      if (s.out >= 0) w.bytes = 2 * bytes_of(s.out);
      break;
    case LocalStep::Kind::Start:
    case LocalStep::Kind::Wait: break;
  }
  return w;
}

double roofline_us(const StepWork& w, const DeviceRates& r) {
  // The work of a step at the fp32 rate plus its 16-bit matmul work at the tensor
  // rate, against its bytes.
  const double simt = r.roofline_s(static_cast<double>(w.flops), r.fp32_flops_s, 0);
  const double tensor = r.roofline_s(static_cast<double>(w.tensor_flops), r.tensor16_flops_s, 0);
  const double memory = r.roofline_s(0, 0, static_cast<double>(w.bytes));
  return (std::max(simt + tensor, memory) + r.launch_s) * 1e6;
}

TimelineModel timeline_model(const SystemSpec& sys, std::function<double(const LocalProgram&, size_t)> compute_us) {
  TimelineModel m;
  m.comm = comm_rates(sys);
  m.compute_us = std::move(compute_us);
  return m;
}

// --- the discrete-event simulation ----------------------------------------------------------

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

struct Coll {
  CollectiveKind kind = CollectiveKind::AllGather;
  bool shift = false;  // one step of a decomposed collective matmul's ring
  int handle = -1, mesh_dim = 0;
  std::vector<int> members;       // ranks, in group order
  std::vector<size_t> step;       // per member: its Start step
  std::vector<int> wait_value;    // per member: the value its Wait produces (-1: none)
  std::vector<bool> seen;         // per member: its program has this Start
  LinkClass link = LinkClass::NvLink;
  LinkSpec spec;
  int64_t bytes = 0;
  double nominal = 0, remaining = 0;
  int arrived = 0;
  std::vector<double> ready;  // per member
  bool started = false, done = false;
  double start = 0, end = 0;
};

struct Item {  // an entry of a rank's compute stream
  size_t step = 0;
  int coll = -1;   // a Wait: the collective waited for
  double cost = 0;  // unslowed time
  double issue = 0;
};

struct CommItem {
  int coll = -1;
  size_t step = 0;
  double issue = 0;
  size_t drain_before = 0;  // Blocking: compute items before this one must have finished
};

struct RankState {
  std::vector<Item> cq;
  size_t cpos = 0;
  bool running = false;
  double remaining = 0, started = 0;
  std::vector<CommItem> commq;
  size_t commpos = 0;
  bool arrived = false;
  int comm_running = -1;
  std::vector<double> value_ready;
  double compute_sum = 0;
};

int member_index(const Coll& c, int rank) {
  for (size_t i = 0; i < c.members.size(); ++i)
    if (c.members[i] == rank) return static_cast<int>(i);
  return -1;
}

std::string step_name(const LocalProgram& p, size_t step) {
  const LocalStep& s = p.steps[step];
  auto name = [&](int v) { return v >= 0 && static_cast<size_t>(v) < p.names.size() ? p.names[static_cast<size_t>(v)] : "v" + std::to_string(v); };
  switch (s.kind) {
    case LocalStep::Kind::Kernel: return p.kernels[static_cast<size_t>(s.kernel)].name;
    case LocalStep::Kind::Compute: return std::string(op_name(s.node.op)) + " " + name(s.out);
    case LocalStep::Kind::Slice: return "slice " + name(s.out);
    case LocalStep::Kind::Partialize: return "partialize " + name(s.out);
    case LocalStep::Kind::Concat: return "concat " + name(s.out);
    case LocalStep::Kind::Start:
      return std::string(collective_name(s.collective)) + " " + (s.in.empty() ? std::string("?") : name(s.in[0]));
    case LocalStep::Kind::Wait: return "wait " + name(s.out);
  }
  return "?";
}

TimelineEvent::Kind event_kind(LocalStep::Kind k) {
  switch (k) {
    case LocalStep::Kind::Kernel: return TimelineEvent::Kind::Kernel;
    case LocalStep::Kind::Compute: return TimelineEvent::Kind::Op;
    case LocalStep::Kind::Slice: return TimelineEvent::Kind::Slice;
    case LocalStep::Kind::Partialize: return TimelineEvent::Kind::Partialize;
    case LocalStep::Kind::Concat: return TimelineEvent::Kind::Concat;
    case LocalStep::Kind::Start:
    case LocalStep::Kind::Wait: return TimelineEvent::Kind::Collective;
  }
  return TimelineEvent::Kind::Kernel;
}

// Time within [a, b) covered by the (sorted, disjoint) intervals.
double covered(const std::vector<std::pair<double, double>>& iv, double a, double b) {
  double sum = 0;
  auto it = std::lower_bound(iv.begin(), iv.end(), std::make_pair(a, -kInf),
                             [](const auto& x, const auto& y) { return x.second < y.first; });
  for (; it != iv.end() && it->first < b; ++it) sum += std::max(0.0, std::min(b, it->second) - std::max(a, it->first));
  return sum;
}

}  // namespace

Result<Timeline> simulate_timeline(const std::vector<LocalProgram>& programs, const DeviceMesh& mesh,
                                   const TimelineModel& model, CommMode mode) {
  const int world = mesh.world();
  if (static_cast<int>(programs.size()) != world)
    return Diag{"", {}, "timeline: " + std::to_string(programs.size()) + " program(s) for a mesh of " +
                            std::to_string(world) + " rank(s)"};
  if (!model.compute_us) return Diag{"", {}, "timeline: no compute-time function"};
  if (model.comm.gpus_per_node < 1) return Diag{"", {}, "timeline: gpus_per_node must be >= 1"};
  for (const LinkSpec* l : {&model.comm.intra, &model.comm.inter})
    if (!(l->sm_fraction >= 0 && l->sm_fraction < 1) || !(l->comm_slowdown >= 0 && l->comm_slowdown < 1))
      return Diag{"", {}, "timeline: sm_fraction and comm_slowdown must be in [0, 1)"};
  const size_t W = static_cast<size_t>(world);

  // Hand-built programs may be malformed: every id a step uses must exist.
  for (int r = 0; r < world; ++r) {
    const LocalProgram& p = programs[static_cast<size_t>(r)];
    const int nv = static_cast<int>(p.types.size());
    auto bad = [&](size_t i, const std::string& what) {
      return Diag{"", {}, "timeline: rank " + std::to_string(r) + " step " + std::to_string(i) + ": " + what};
    };
    if (p.names.size() < p.types.size()) return bad(0, "fewer value names than values");
    for (size_t i = 0; i < p.steps.size(); ++i) {
      const LocalStep& s = p.steps[i];
      for (int v : s.in)
        if (v < 0 || v >= nv) return bad(i, "operand v" + std::to_string(v) + " is not a value");
      for (int v : s.outs)
        if (v < 0 || v >= nv) return bad(i, "result v" + std::to_string(v) + " is not a value");
      if (s.out >= nv) return bad(i, "result v" + std::to_string(s.out) + " is not a value");
      if (s.kind == LocalStep::Kind::Kernel && (s.kernel < 0 || s.kernel >= static_cast<int>(p.kernels.size())))
        return bad(i, "kernel " + std::to_string(s.kernel) + " does not exist");
    }
  }

  // Collectives, matched across ranks by (handle, group).
  std::vector<Coll> colls;
  std::map<std::pair<int, std::vector<int>>, int> coll_of;
  std::vector<std::map<int, int>> handle_coll(W);  // per rank: handle -> collective
  for (int r = 0; r < world; ++r) {
    const LocalProgram& p = programs[static_cast<size_t>(r)];
    for (size_t i = 0; i < p.steps.size(); ++i) {
      const LocalStep& s = p.steps[i];
      if (s.kind != LocalStep::Kind::Start) continue;
      if (s.mesh_dim < 0 || s.mesh_dim >= std::max(1, mesh.ndim()))
        return Diag{"", {}, "timeline: rank " + std::to_string(r) + " step " + std::to_string(i) + ": mesh dim " +
                                std::to_string(s.mesh_dim) + " is not a dim of the mesh"};
      if (s.in.empty()) return Diag{"", {}, "timeline: rank " + std::to_string(r) + " step " + std::to_string(i) + ": a collective without an operand"};
      std::vector<int> group = mesh.ndim() == 0 ? std::vector<int>{0} : mesh.group(r, s.mesh_dim);
      auto key = std::make_pair(s.handle, group);
      auto [it, fresh] = coll_of.emplace(key, static_cast<int>(colls.size()));
      if (fresh) {
        Coll c;
        c.kind = s.collective;
        c.shift = is_ring_shift(s);
        c.handle = s.handle;
        c.mesh_dim = s.mesh_dim;
        c.members = group;
        c.step.assign(group.size(), 0);
        c.wait_value.assign(group.size(), -1);
        c.seen.assign(group.size(), false);
        c.ready.assign(group.size(), 0);
        colls.push_back(std::move(c));
      }
      Coll& c = colls[static_cast<size_t>(it->second)];
      if (c.kind != s.collective)
        return Diag{"", {}, "timeline: collective " + std::to_string(s.handle) + " is " +
                                std::string(collective_name(c.kind)) + " on rank " + std::to_string(c.members[0]) +
                                " but " + std::string(collective_name(s.collective)) + " on rank " + std::to_string(r)};
      int m = member_index(c, r);
      if (c.seen[static_cast<size_t>(m)])
        return Diag{"", {}, "timeline: rank " + std::to_string(r) + " starts collective " + std::to_string(s.handle) + " twice"};
      c.seen[static_cast<size_t>(m)] = true;
      c.step[static_cast<size_t>(m)] = i;
      handle_coll[static_cast<size_t>(r)][s.handle] = it->second;
    }
    for (size_t i = 0; i < p.steps.size(); ++i) {
      const LocalStep& s = p.steps[i];
      if (s.kind != LocalStep::Kind::Wait) continue;
      auto h = handle_coll[static_cast<size_t>(r)].find(s.handle);
      if (h == handle_coll[static_cast<size_t>(r)].end())
        return Diag{"", {}, "timeline: rank " + std::to_string(r) + " step " + std::to_string(i) +
                                " waits for collective " + std::to_string(s.handle) + ", which it never starts"};
      Coll& c = colls[static_cast<size_t>(h->second)];
      c.wait_value[static_cast<size_t>(member_index(c, r))] = s.out;
    }
  }
  for (Coll& c : colls) {
    for (size_t m = 0; m < c.members.size(); ++m)
      if (!c.seen[m]) {
        int first = -1;
        for (size_t k = 0; k < c.members.size(); ++k)
          if (c.seen[k]) first = c.members[k];
        return Diag{"", {}, "timeline: rank " + std::to_string(first) + " issues " +
                                std::string(collective_name(c.kind)) + " (handle " + std::to_string(c.handle) +
                                ") with rank " + std::to_string(c.members[m]) + ", whose program has no such collective"};
      }
    const int n = static_cast<int>(c.members.size());
    const int node0 = c.members[0] / model.comm.gpus_per_node;
    bool one_node = std::all_of(c.members.begin(), c.members.end(), [&](int r) { return r / model.comm.gpus_per_node == node0; });
    c.link = one_node ? LinkClass::NvLink : LinkClass::Ib;
    c.spec = one_node ? model.comm.intra : model.comm.inter;
    for (size_t m = 0; m < c.members.size(); ++m)
      c.bytes = std::max(c.bytes, collective_bytes(programs[static_cast<size_t>(c.members[m])], c.step[m], n));
    c.nominal = n <= 1 ? 0
                : c.shift ? shift_us(static_cast<double>(c.bytes), c.spec)
                          : collective_us(c.kind, n, static_cast<double>(c.bytes), c.spec);
    if (n > 1 && (c.spec.bandwidth_GB_s <= 0 || !std::isfinite(c.nominal)))
      return Diag{"", {}, "timeline: the " + std::string(link_class_name(c.link)) + " link has no bandwidth"};
    c.remaining = c.nominal;
  }

  // Each rank's two streams, in issue order.
  std::vector<RankState> st(W);
  for (int r = 0; r < world; ++r) {
    const LocalProgram& p = programs[static_cast<size_t>(r)];
    RankState& rs = st[static_cast<size_t>(r)];
    rs.value_ready.assign(p.types.size(), 0);
    for (const LocalStep& s : p.steps) {
      for (int v : s.outs)
        if (v >= 0 && static_cast<size_t>(v) < rs.value_ready.size()) rs.value_ready[static_cast<size_t>(v)] = kInf;
      if (s.out >= 0 && static_cast<size_t>(s.out) < rs.value_ready.size()) rs.value_ready[static_cast<size_t>(s.out)] = kInf;
    }
    for (size_t i = 0; i < p.steps.size(); ++i) {
      const LocalStep& s = p.steps[i];
      const double issue = static_cast<double>(i + 1) * model.host_issue_us;
      switch (s.kind) {
        case LocalStep::Kind::Start: {
          int c = handle_coll[static_cast<size_t>(r)].at(s.handle);
          rs.commq.push_back(CommItem{c, i, issue, rs.cq.size()});
          // Blocking: the compute stream waits for it right away.
          if (mode == CommMode::Blocking) rs.cq.push_back(Item{i, c, 0, issue});
          break;
        }
        case LocalStep::Kind::Wait:
          if (mode == CommMode::Overlapped) rs.cq.push_back(Item{i, handle_coll[static_cast<size_t>(r)].at(s.handle), 0, issue});
          break;
        case LocalStep::Kind::Kernel:
        case LocalStep::Kind::Compute:
        case LocalStep::Kind::Slice:
        case LocalStep::Kind::Partialize:
        case LocalStep::Kind::Concat: {
          double cost = model.compute_us(p, i);
          if (!std::isfinite(cost) || cost < 0)
            return Diag{"", {}, "timeline: rank " + std::to_string(r) + " step " + std::to_string(i) + " (" +
                                    step_name(p, i) + "): compute time " + std::to_string(cost) + " us"};
          rs.cq.push_back(Item{i, -1, cost, issue});
          rs.compute_sum += cost;
          break;
        }
      }
    }
  }

  Timeline out;
  out.ranks.resize(W);
  for (int r = 0; r < world; ++r) out.ranks[static_cast<size_t>(r)].rank = r;

  auto finish_compute = [&](int r, double t) {
    RankState& rs = st[static_cast<size_t>(r)];
    const LocalProgram& p = programs[static_cast<size_t>(r)];
    const Item& it = rs.cq[rs.cpos];
    const LocalStep& s = p.steps[it.step];
    StepWork w = step_work(p, it.step);
    TimelineEvent e;
    e.kind = event_kind(s.kind);
    e.stream = Stream::Compute;
    e.name = step_name(p, it.step);
    e.step = it.step;
    e.start_us = it.cost > 0 ? rs.started : t;
    e.end_us = t;
    e.bytes = w.bytes;
    e.flops = w.flops;
    e.work_us = it.cost;
    out.ranks[static_cast<size_t>(r)].events.push_back(std::move(e));
    for (int v : s.outs)
      if (v >= 0 && static_cast<size_t>(v) < rs.value_ready.size()) rs.value_ready[static_cast<size_t>(v)] = t;
    if (s.out >= 0 && static_cast<size_t>(s.out) < rs.value_ready.size()) rs.value_ready[static_cast<size_t>(s.out)] = t;
    rs.running = false;
    ++rs.cpos;
  };
  std::vector<std::vector<TimelineEvent>> comm_events(W);
  auto finish_coll = [&](int ci, double t) {
    Coll& c = colls[static_cast<size_t>(ci)];
    c.done = true;
    c.end = t;
    for (size_t m = 0; m < c.members.size(); ++m) {
      const int r = c.members[m];
      RankState& rs = st[static_cast<size_t>(r)];
      rs.comm_running = -1;
      rs.arrived = false;
      ++rs.commpos;
      if (int v = c.wait_value[m]; v >= 0 && static_cast<size_t>(v) < rs.value_ready.size())
        rs.value_ready[static_cast<size_t>(v)] = t;
      if (c.members.size() <= 1) continue;  // a group of one: free, not an event
      const LocalProgram& p = programs[static_cast<size_t>(r)];
      TimelineEvent e;
      e.kind = TimelineEvent::Kind::Collective;
      e.stream = Stream::Comm;
      e.name = step_name(p, c.step[m]);
      e.step = c.step[m];
      e.start_us = c.start;
      e.end_us = t;
      e.bytes = c.bytes;
      e.work_us = c.nominal;
      e.comm = c.kind;
      e.group = c.members;
      e.link = c.link;
      e.ready_us = c.ready[m];
      comm_events[static_cast<size_t>(r)].push_back(std::move(e));
    }
  };

  double t = 0;
  std::vector<int> active;  // collectives that have started and not finished
  for (;;) {
    // Everything that can happen at time t.
    bool changed = true;
    while (changed) {
      changed = false;
      for (int r = 0; r < world; ++r) {
        RankState& rs = st[static_cast<size_t>(r)];
        while (!rs.running && rs.cpos < rs.cq.size()) {
          const Item& it = rs.cq[rs.cpos];
          if (it.issue > t) break;
          if (it.coll >= 0) {  // a Wait
            if (!colls[static_cast<size_t>(it.coll)].done) break;
            ++rs.cpos;
            changed = true;
            continue;
          }
          rs.running = true;
          rs.started = t;
          rs.remaining = it.cost;
          changed = true;
          if (it.cost <= 0) {
            finish_compute(r, t);
            continue;
          }
          break;
        }
        if (rs.comm_running < 0 && !rs.arrived && rs.commpos < rs.commq.size()) {
          const CommItem& ci = rs.commq[rs.commpos];
          const LocalStep& s = programs[static_cast<size_t>(r)].steps[ci.step];
          bool operand = rs.value_ready[static_cast<size_t>(s.in[0])] <= t;
          bool drained = mode == CommMode::Overlapped || rs.cpos >= ci.drain_before;
          if (ci.issue <= t && operand && drained) {
            Coll& c = colls[static_cast<size_t>(ci.coll)];
            rs.arrived = true;
            c.ready[static_cast<size_t>(member_index(c, r))] = t;
            ++c.arrived;
            changed = true;
            if (c.arrived == static_cast<int>(c.members.size())) {
              c.started = true;
              c.start = t;
              for (int m : c.members) st[static_cast<size_t>(m)].comm_running = ci.coll;
              if (c.nominal <= 0) finish_coll(ci.coll, t);
              else active.push_back(ci.coll);
            }
          }
        }
      }
    }

    bool all_done = true;
    for (const RankState& rs : st)
      if (rs.cpos < rs.cq.size() || rs.commpos < rs.commq.size()) all_done = false;
    if (all_done) break;

    // The next moment anything changes: a kernel or collective ends, or the host
    // issues a step. Rates are constant until then.
    auto kernel_rate = [&](int r) {
      int c = st[static_cast<size_t>(r)].comm_running;
      return c >= 0 ? 1.0 - colls[static_cast<size_t>(c)].spec.sm_fraction : 1.0;
    };
    auto coll_rate = [&](const Coll& c) {
      double rate = 1.0;
      for (int m : c.members)
        if (st[static_cast<size_t>(m)].running) rate = std::min(rate, 1.0 - c.spec.comm_slowdown);
      return rate;
    };
    double next = kInf;
    for (int r = 0; r < world; ++r) {
      const RankState& rs = st[static_cast<size_t>(r)];
      if (rs.running) next = std::min(next, t + rs.remaining / kernel_rate(r));
      if (!rs.running && rs.cpos < rs.cq.size() && rs.cq[rs.cpos].issue > t) next = std::min(next, rs.cq[rs.cpos].issue);
      if (!rs.arrived && rs.commpos < rs.commq.size() && rs.commq[rs.commpos].issue > t)
        next = std::min(next, rs.commq[rs.commpos].issue);
    }
    for (int ci : active) {
      const Coll& c = colls[static_cast<size_t>(ci)];
      next = std::min(next, t + c.remaining / coll_rate(c));
    }
    if (!std::isfinite(next)) {
      std::string why = "timeline: the programs deadlock:";
      for (int r = 0; r < world; ++r) {
        const RankState& rs = st[static_cast<size_t>(r)];
        const LocalProgram& p = programs[static_cast<size_t>(r)];
        if (rs.cpos < rs.cq.size()) why += " rank " + std::to_string(r) + " at step " + std::to_string(rs.cq[rs.cpos].step) + " (" + step_name(p, rs.cq[rs.cpos].step) + ");";
        else if (rs.commpos < rs.commq.size()) why += " rank " + std::to_string(r) + " at " + step_name(p, rs.commq[rs.commpos].step) + ";";
      }
      return Diag{"", {}, why};
    }

    // Advance to `next`; whatever ends within rounding of it ends there.
    const double dt = next - t;
    const double eps = 1e-9 * std::max(1.0, std::abs(next));
    std::vector<double> krate(W), crate(colls.size());
    for (int r = 0; r < world; ++r) krate[static_cast<size_t>(r)] = kernel_rate(r);
    for (int ci : active) crate[static_cast<size_t>(ci)] = coll_rate(colls[static_cast<size_t>(ci)]);
    t = next;
    for (int r = 0; r < world; ++r) {
      RankState& rs = st[static_cast<size_t>(r)];
      if (!rs.running) continue;
      double rate = krate[static_cast<size_t>(r)];
      if (rs.remaining / rate <= dt + eps) {
        rs.remaining = 0;
        finish_compute(r, t);
      } else {
        rs.remaining -= dt * rate;
      }
    }
    std::vector<int> still;
    for (int ci : active) {
      Coll& c = colls[static_cast<size_t>(ci)];
      double rate = crate[static_cast<size_t>(ci)];
      if (c.remaining / rate <= dt + eps) {
        c.remaining = 0;
        finish_coll(ci, t);
      } else {
        c.remaining -= dt * rate;
        still.push_back(ci);
      }
    }
    active = std::move(still);
  }

  // Totals, and how much of each collective ran while the rank's compute stream was busy.
  for (int r = 0; r < world; ++r) {
    RankTimeline& rt = out.ranks[static_cast<size_t>(r)];
    std::vector<std::pair<double, double>> busy;
    for (const TimelineEvent& e : rt.events)
      if (e.end_us > e.start_us) busy.emplace_back(e.start_us, e.end_us);
    for (TimelineEvent& e : comm_events[static_cast<size_t>(r)]) {
      e.hidden_us = covered(busy, e.start_us, e.end_us);
      rt.comm_us += e.dur_us();
      rt.hidden_us += e.hidden_us;
      ++rt.collectives;
      rt.events.push_back(std::move(e));
    }
    rt.compute_us = st[static_cast<size_t>(r)].compute_sum;
    for (const TimelineEvent& e : rt.events) rt.finish_us = std::max(rt.finish_us, e.end_us);
    out.total_us = std::max(out.total_us, rt.finish_us);
    out.compute_us = std::max(out.compute_us, rt.compute_us);
  }
  return out;
}

double overlap_efficiency(double ect_overlapped, double ect_serial) {
  if (!(ect_serial > 0)) return 0;  // nothing to hide: 0/0 is taken as 0
  return 1.0 - ect_overlapped / ect_serial;
}

Result<OverlapReport> simulate_overlap(const std::vector<LocalProgram>& baseline,
                                       const std::vector<LocalProgram>& overlapped, const DeviceMesh& mesh,
                                       const TimelineModel& model) {
  Result<Timeline> serial = simulate_timeline(baseline, mesh, model, CommMode::Blocking);
  if (!serial) return serial.error();
  Result<Timeline> over = simulate_timeline(overlapped, mesh, model, CommMode::Overlapped);
  if (!over) return over.error();
  OverlapReport rep;
  rep.serial = std::move(serial).value();
  rep.overlapped = std::move(over).value();
  rep.t_compute = rep.serial.compute_us;
  rep.ect_serial = rep.serial.total_us - rep.t_compute;
  rep.ect_overlapped = rep.overlapped.total_us - rep.t_compute;
  // Rounding in the event loop leaves ~1e-12 of "communication" on a program without any.
  const double tiny = 1e-9 * std::max(1.0, rep.serial.total_us);
  if (std::abs(rep.ect_serial) <= tiny) rep.ect_serial = 0;
  if (std::abs(rep.ect_overlapped) <= tiny) rep.ect_overlapped = 0;
  for (const RankTimeline& r : rep.serial.ranks)
    if (r.collectives > 0) rep.has_comm = true;
  rep.e_overlap = overlap_efficiency(rep.ect_overlapped, rep.ect_serial);
  return rep;
}

Result<OverlapReport> simulate_overlap(const std::vector<LocalProgram>& programs, const DeviceMesh& mesh,
                                       const TimelineModel& model) {
  return simulate_overlap(programs, programs, mesh, model);
}

void add_to_trace(const Timeline& t, TraceWriter& w) {
  for (const RankTimeline& r : t.ranks) {
    w.add_rank(r.rank);
    for (const TimelineEvent& e : r.events) {
      json args = {{"step", e.step}, {"bytes", e.bytes}, {"flops", e.flops}};
      if (e.kind == TimelineEvent::Kind::Collective) {
        args["group"] = e.group;
        args["link"] = std::string(link_class_name(e.link));
        args["model_us"] = e.work_us;
        args["ready_us"] = e.ready_us;
        args["waited_for_peers_us"] = e.start_us - e.ready_us;
        args["hidden_us"] = e.hidden_us;
      } else {
        args["work_us"] = e.work_us;
      }
      const char* cat = "kernel";
      switch (e.kind) {
        case TimelineEvent::Kind::Kernel: cat = "kernel"; break;
        case TimelineEvent::Kind::Op: cat = "op"; break;
        case TimelineEvent::Kind::Slice:
        case TimelineEvent::Kind::Partialize:
        case TimelineEvent::Kind::Concat: cat = "copy"; break;
        case TimelineEvent::Kind::Collective: cat = "collective"; break;
      }
      w.add(r.rank, e.stream, e.name, e.start_us, e.dur_us(), std::move(args), cat);
    }
  }
}

}  // namespace sf
