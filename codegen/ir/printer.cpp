#include "codegen/ir/printer.h"

#include <unordered_set>

namespace sf {

namespace {

class Printer {
 public:
  explicit Printer(const Graph& g) : g_(g), uses_(g.use_counts()), names_(g.nodes().size()) {
    std::unordered_set<std::string> taken;
    for (const Node& n : g.nodes())
      if (!n.name.empty()) taken.insert(n.name);
    // Anonymous values that cannot be inlined (used more than once, or carrying a
    // constraint) get a fresh name that no value of the graph has.
    for (size_t i = 0; i < g.nodes().size(); ++i) {
      const Node& n = g.nodes()[i];
      if (!n.name.empty()) {
        names_[i] = n.name;
      } else if (n.op != OpKind::Constant && !inline_ok(static_cast<ValueId>(i))) {
        std::string cand = "v" + std::to_string(i);
        while (taken.count(cand)) cand += "_";
        taken.insert(cand);
        names_[i] = cand;
      }
    }
  }

  std::string print() {
    std::string out;
    const Mesh& mesh = g_.mesh();
    if (!mesh.dims.empty()) out += "mesh " + mesh.str() + "\n\n";
    std::string head = "graph " + g_.name() + "(";
    out += head;
    size_t col = head.size();
    const std::string indent(head.size(), ' ');
    for (size_t i = 0; i < g_.params().size(); ++i) {
      const Node& p = g_.node(g_.params()[i]);
      std::string s = p.name + ": " + p.type.str();
      if (p.placement) s += " " + p.placement->str(mesh);
      if (i + 1 < g_.params().size()) s += ",";
      // Wrap the parameter list at 80 columns, aligned after the '('.
      if (i > 0) {
        if (col + 1 + s.size() > 80) {
          out += "\n" + indent;
          col = indent.size();
        } else {
          out += " ";
          ++col;
        }
      }
      out += s;
      col += s.size();
    }
    out += ") {\n";
    for (size_t i = 0; i < g_.nodes().size(); ++i) {
      const Node& n = g_.nodes()[i];
      if (n.op == OpKind::Param || names_[i].empty()) continue;
      out += "  " + names_[i] + " = " + call(n);
      if (n.placement) out += " " + n.placement->str(mesh);
      out += "\n";
    }
    out += "  return ";
    for (size_t i = 0; i < g_.outputs().size(); ++i) {
      const Output& o = g_.outputs()[i];
      if (i) out += ", ";
      out += expr(o.value);
      if (o.placement) out += " " + o.placement->str(mesh);
    }
    out += "\n}\n";
    return out;
  }

 private:
  bool inline_ok(ValueId v) const {
    const Node& n = g_.node(v);
    return n.name.empty() && !n.placement && uses_[static_cast<size_t>(v)] == 1;
  }

  std::string expr(ValueId v) const {
    const Node& n = g_.node(v);
    if (!names_[static_cast<size_t>(v)].empty()) return names_[static_cast<size_t>(v)];
    if (n.op == OpKind::Constant) return literal(n);
    return call(n);
  }

  static std::string literal(const Node& n) {
    double v = n.attrs.get_float("value");
    if (n.attrs.get_dtype("dtype") == DType::I64) return std::to_string(static_cast<int64_t>(v));
    return attr_value_str(AttrValue(v), Mesh{});
  }

  std::string call(const Node& n) const {
    std::string s = std::string(op_name(n.op)) + "(";
    bool first = true;
    auto sep = [&] {
      if (!first) s += ", ";
      first = false;
    };
    for (ValueId in : n.inputs) {
      sep();
      s += expr(in);
    }
    // Required attributes positionally, optional ones only when not the default; a
    // variadic op's (concat's, scaled_dot_product_attention's) by name, since its
    // positional arguments are operands.
    auto schema = op_info(n.op).attrs;
    const bool variadic = op_info(n.op).arity < 0;
    for (size_t i = 0; i < schema.size(); ++i) {
      const AttrValue& v = n.attrs.items[i].second;
      if (!schema[i].default_value && !variadic) {
        sep();
        s += attr_value_str(v, g_.mesh());
      } else if (!schema[i].default_value || !(v == *schema[i].default_value)) {
        sep();
        s += std::string(schema[i].name) + "=" + attr_value_str(v, g_.mesh());
      }
    }
    return s + ")";
  }

  const Graph& g_;
  std::vector<int> uses_;
  std::vector<std::string> names_;
};

}  // namespace

std::string print_graph(const Graph& g) { return Printer(g).print(); }

}  // namespace sf
