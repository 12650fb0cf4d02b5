#include "codegen/fusion/decompose_program.h"

#include <map>
#include <set>

#include "codegen/ir/builder.h"
#include "codegen/ir/decompose.h"

namespace sf {

namespace {

// The node as a one-op graph on its local operand types.
Graph one_op_graph(const Node& n, const std::vector<TensorType>& in) {
  GraphBuilder b("op");
  std::vector<Value> params;
  for (size_t k = 0; k < in.size(); ++k) params.push_back(b.param("p" + std::to_string(k), in[k].dtype, in[k].shape));
  b.ret(b.op(n.op, params, {}, n.attrs.items, n.loc));
  Result<Graph> g = b.finish();
  if (!g.ok()) throw DiagError{g.error()};
  return std::move(g).value();
}

}  // namespace

LocalProgram decompose_program(LocalProgram p) {
  std::vector<LocalStep> out;
  // A redistribute's result -> the value its users read instead.
  std::map<int, int> alias;
  const std::set<int> returned(p.output_values.begin(), p.output_values.end());
  for (LocalStep& s : p.steps) {
    for (int& v : s.in)
      if (auto a = alias.find(v); a != alias.end()) v = a->second;
    if (s.kind != LocalStep::Kind::Compute) {
      out.push_back(std::move(s));
      continue;
    }
    if (s.node.op == OpKind::Redistribute && !returned.count(s.out)) {
      alias[s.out] = s.in[0];  // already resolved above
      continue;
    }
    if (s.node.op == OpKind::Redistribute) {
      // Returned: the output needs a value of its own, so the identity is a copy.
      Node copy = s.node;
      copy.op = OpKind::Cast;
      copy.attrs = normalize_attrs(OpKind::Cast, {AttrValue(copy.type.dtype)}, {});
      s.node = std::move(copy);
      out.push_back(std::move(s));
      continue;
    }
    if (op_info(s.node.op).category != OpCategory::Composite) {
      out.push_back(std::move(s));
      continue;
    }
    std::vector<TensorType> in;
    for (int v : s.in) in.push_back(p.types[static_cast<size_t>(v)]);
    Graph prim = decompose(one_op_graph(s.node, in));
    // Inline the primitives: params are the step's operands, the graph's output is
    // the step's result; everything between gets a fresh local value.
    std::vector<int> local(prim.nodes().size(), -1);
    for (size_t k = 0; k < prim.params().size(); ++k) local[static_cast<size_t>(prim.params()[k])] = s.in[k];
    ValueId result = prim.outputs()[0].value;
    std::string base = p.names[static_cast<size_t>(s.out)];
    for (size_t i = 0; i < prim.nodes().size(); ++i) {
      const Node& n = prim.nodes()[i];
      if (n.op == OpKind::Param) continue;
      int v = static_cast<int>(i) == result ? s.out : -1;
      if (v < 0) {
        p.types.push_back(n.type);
        p.names.push_back(base + "_" + std::string(op_name(n.op)) + std::to_string(i));
        v = static_cast<int>(p.types.size()) - 1;
      }
      local[i] = v;
      LocalStep c;
      c.kind = LocalStep::Kind::Compute;
      for (ValueId x : n.inputs) c.in.push_back(local[static_cast<size_t>(x)]);
      c.out = v;
      c.node = n;
      c.node.loc = s.node.loc;
      out.push_back(std::move(c));
    }
  }
  p.steps = std::move(out);
  return p;
}

}  // namespace sf
