#include "codegen/dist/explain.h"

#include <cstdio>

namespace sf {

namespace {

std::string seconds(double s) {
  char buf[32];
  if (s == 0) return "0";
  if (s < 1e-3) std::snprintf(buf, sizeof buf, "%.3g us", s * 1e6);
  else std::snprintf(buf, sizeof buf, "%.3g ms", s * 1e3);
  return buf;
}

std::string value_name(const Graph& g, ValueId v) {
  const Node& n = g.node(v);
  if (!n.name.empty()) return n.name;
  if (n.op == OpKind::Constant) return attr_value_str(*n.attrs.find("value"), g.mesh());
  return "v" + std::to_string(v);
}

}  // namespace

std::string explain_sharding(const Graph& g, const ShardingPlan& plan, const DeviceMesh& mesh) {
  const Mesh& m = mesh.mesh();
  std::string out = "sharding (cost: modelled redistribution time of the choice; alternatives in parentheses):\n";
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const Node& n = g.nodes()[i];
    if (n.op == OpKind::Constant) continue;
    const NodeSharding& ns = plan.nodes[i];
    std::string line = "  " + value_name(g, static_cast<ValueId>(i)) + ": " + n.type.str() + " " + ns.output.str(m);
    if (n.op == OpKind::Param) {
      line += n.placement ? "  param, as declared" : "  param, replicated (no placement given)";
    } else {
      line += "  = " + std::string(op_name(n.op)) + "(";
      for (size_t k = 0; k < n.inputs.size(); ++k) {
        line += (k ? ", " : "") + value_name(g, n.inputs[k]);
        if (g.node(n.inputs[k]).op != OpKind::Constant) line += " " + ns.inputs[k].str(m);
      }
      line += ")  cost " + seconds(ns.cost) + " (" + std::to_string(ns.candidates) + " strategies";
      if (ns.runner_up >= 0) line += ", next best " + seconds(ns.runner_up);
      line += ")";
      // A cumsum over its sharded dim: the chunk totals carried over these mesh dims.
      for (size_t c = 0; c < ns.carry.size(); ++c)
        line += (c ? ", " : "  carry over ") + m.dims[static_cast<size_t>(ns.carry[c])].name;
    }
    if (!(ns.value == ns.output)) line += "  then constrained to " + ns.value.str(m);
    out += line + "\n";
  }
  for (size_t o = 0; o < g.outputs().size(); ++o) {
    const Output& op = g.outputs()[o];
    out += "  return " + op.name + " " + plan.outputs[o].str(m) +
           (op.placement ? "" : "  (no placement given: returned as produced)") + "\n";
  }
  return out;
}

std::string step_line(const LocalProgram& p, const LocalStep& s, const DeviceMesh& mesh) {
  auto name = [&](int v) { return p.names[static_cast<size_t>(v)]; };
  std::string md = s.mesh_dim < mesh.ndim() ? mesh.mesh().dims[static_cast<size_t>(s.mesh_dim)].name : "?";
  switch (s.kind) {
    case LocalStep::Kind::Compute: {
      std::string line = std::string(op_name(s.node.op)) + " ";
      for (size_t k = 0; k < s.in.size(); ++k) line += (k ? ", " : "") + name(s.in[k]);
      if (s.node.op == OpKind::Constant) line += attr_value_str(*s.node.attrs.find("value"), mesh.mesh());
      // Generators and tril/triu: local_node gives each rank its own attributes.
      const OpCategory cat = op_info(s.node.op).category;
      if (cat == OpCategory::Generator || cat == OpCategory::Positional)
        for (const auto& [key, value] : s.node.attrs.items)
          line += (line.back() == ' ' ? "" : " ") + key + "=" + attr_value_str(value, mesh.mesh());
      // A vocabulary-parallel lookup: the first row the rank holds.
      // (embedding, index_select and gather are the ops with an `offset`).
      if (const AttrValue* off = s.node.attrs.find("offset"); off)
        line += " offset=" + attr_value_str(*off, mesh.mesh());
      return line + " -> " + name(s.out) + "  " + p.types[static_cast<size_t>(s.out)].str();
    }
    case LocalStep::Kind::Slice:
      return "slice " + name(s.in[0]) + " -> " + name(s.out) + " [" + md + "]  " + p.types[static_cast<size_t>(s.out)].str();
    case LocalStep::Kind::Partialize:
      return "partialize " + name(s.in[0]) + " -> " + name(s.out) + " [" + md + "]" + (s.keep ? "" : " (zeros)");
    case LocalStep::Kind::Concat: {
      std::string line = "concat ";
      for (size_t k = 0; k < s.in.size(); ++k) line += (k ? ", " : "") + name(s.in[k]);
      return line + " -> " + name(s.out) + " [dim " + std::to_string(s.dim) + "]  " +
             p.types[static_cast<size_t>(s.out)].str();
    }
    case LocalStep::Kind::Start: {
      // The Start names the value its Wait will produce.
      std::string out_name = "?";
      for (const LocalStep& w : p.steps)
        if (w.kind == LocalStep::Kind::Wait && w.handle == s.handle) out_name = name(w.out);
      if (s.ring_steps > 0)
        return "ring_shift " + name(s.in[0]) + " -> " + out_name + " [" + md + ", dim " + std::to_string(s.dim) +
               ", step " + std::to_string(s.ring_step) + "/" + std::to_string(s.ring_steps) + ", to " +
               (s.ring_to > 0 ? "+" : "") + std::to_string(s.ring_to) + "]";
      std::string line = std::string(collective_name(s.collective)) + " " + name(s.in[0]) + " -> " + out_name + " [" + md;
      switch (s.collective) {
        case CollectiveKind::AllGather: line += ", dim " + std::to_string(s.dim); break;
        case CollectiveKind::ReduceScatter: line += ", dim " + std::to_string(s.dim) + ", " + std::string(reduce_op_name(s.op)); break;
        case CollectiveKind::AllReduce: line += ", " + std::string(reduce_op_name(s.op)); break;
        case CollectiveKind::AllToAll: line += ", split " + std::to_string(s.dim) + ", concat " + std::to_string(s.dim2); break;
      }
      return line + "]";
    }
    case LocalStep::Kind::Wait: return "wait " + name(s.out) + "  " + p.types[static_cast<size_t>(s.out)].str();
    case LocalStep::Kind::Kernel: {
      const LocalKernel& k = p.kernels[static_cast<size_t>(s.kernel)];
      std::string line = "kernel " + k.name + " ";
      for (size_t i = 0; i < s.in.size(); ++i) line += (i ? ", " : "") + name(s.in[i]);
      line += " -> ";
      for (size_t i = 0; i < s.outs.size(); ++i) line += (i ? ", " : "") + name(s.outs[i]);
      return line;
    }
  }
  return "?";
}

std::string explain_kernels(const LocalProgram& p) {
  auto kb = [](int64_t b) {
    char buf[32];
    if (b < 1024) std::snprintf(buf, sizeof buf, "%lld B", static_cast<long long>(b));
    else if (b < 1024 * 1024) std::snprintf(buf, sizeof buf, "%.1f KiB", static_cast<double>(b) / 1024);
    else std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(b) / (1024 * 1024));
    return std::string(buf);
  };
  int ops = 0;
  for (const LocalKernel& k : p.kernels) ops += static_cast<int>(k.ops.size());
  std::string out = "kernels (rank " + std::to_string(p.rank) + "): " + std::to_string(p.kernels.size()) +
                    " for " + std::to_string(ops) + " ops\n";
  for (const LocalKernel& k : p.kernels) {
    out += "  " + k.name + " [" + std::string(kernel_kind_name(k.kind)) + "]: ";
    for (size_t i = 0; i < k.ops.size(); ++i) out += (i ? " " : "") + k.ops[i];
    out += "  reads " + kb(k.bytes_read) + ", writes " + kb(k.bytes_written) + ", " + std::to_string(k.flops) +
           " flops";
    if (k.bytes_saved > 0) out += ", fusion saves " + kb(k.bytes_saved);
    out += "\n";
  }
  return out;
}

std::string explain_schedule(const LocalProgram& p, const DeviceMesh& mesh) {
  std::string out = "schedule (rank " + std::to_string(p.rank) + " of " + std::to_string(mesh.world()) + "):\n";
  for (const LocalStep& s : p.steps) out += "  " + step_line(p, s, mesh) + "\n";
  out += "  return";
  for (size_t o = 0; o < p.output_values.size(); ++o)
    out += (o ? ", " : " ") + p.names[static_cast<size_t>(p.output_values[o])] + " " + p.output_specs[o].str(mesh.mesh());
  return out + "\n";
}

}  // namespace sf
