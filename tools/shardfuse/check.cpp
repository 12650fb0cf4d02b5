// `shardfuse check G.sf`: parse, verify, summarise.
#include <charconv>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <limits>
#include <map>
#include <sstream>

#include "codegen/ir/builder.h"
#include "codegen/ir/parser.h"
#include "tools/shardfuse/commands.h"

namespace sf::cli {

CLI::Validator finite_range(double lo, double hi) {
  std::ostringstream desc;
  desc << "FLOAT in [" << lo << " - " << hi << "]";
  return CLI::Validator(
      [lo, hi](std::string& text) -> std::string {
        char* end = nullptr;
        errno = 0;
        double v = std::strtod(text.c_str(), &end);
        std::ostringstream why;
        if (text.empty() || end != text.c_str() + text.size())
          why << "'" << text << "' is not a number";
        else if (!std::isfinite(v) || v < lo || v > hi)
          why << "value " << text << " is not a finite number from " << lo << " to " << hi;
        return why.str();
      },
      desc.str());
}

CLI::Validator uint64_text() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        uint64_t v = 0;
        std::string_view s = text;
        if (s.starts_with('+')) s.remove_prefix(1);
        auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
        if (s.empty() || ec != std::errc() || end != s.data() + s.size())
          return "'" + text + "' is not an integer from 0 to " +
                 std::to_string(std::numeric_limits<uint64_t>::max());
        return std::string();
      },
      "UINT64");
}

CLI::Validator non_empty() {
  return CLI::Validator(
      [](std::string& text) { return text.empty() ? std::string("must not be empty") : std::string(); }, "");
}

namespace {
std::string& graph_file() {
  static std::string file;  // one graph per command: set by load_graph
  return file;
}
}  // namespace

std::string diag_str(Diag d) {
  if (d.file.empty() && d.loc.line > 0) d.file = graph_file();
  return d.str();
}

int report_failure(const Diag& d, const std::string& context) {
  if (d.internal) {  // "[file:line:col: ]error: internal error (...): message"
    Diag bug = d;
    bug.message = "internal error (a bug in shardfuse; please report it with the command line): " + d.message;
    std::cerr << diag_str(bug) << "\n";
    return 3;
  }
  std::cerr << (context.empty() ? "" : context + ": error: ") << (context.empty() ? diag_str(d) : d.message) << "\n";
  return 1;
}

std::optional<Graph> load_graph(const std::string& path) {
  graph_file() = path;
  Result<Graph> g = parse_file(path);
  if (!g.ok()) {
    std::cerr << g.error().str() << "\n";
    return std::nullopt;
  }
  return std::move(g).value();
}

std::optional<Graph> resolve_world(Graph g, std::optional<int64_t> world) {
  int64_t mesh_ranks = g.mesh().world_size();
  if (!world || *world == mesh_ranks) return g;
  if (g.mesh().dims.size() == 1) {
    Mesh m = g.mesh();
    m.dims[0].size = *world;
    Result<Graph> r = remesh(g, m);
    if (!r.ok()) {
      // The Diag has no file (remesh works on the graph): its message alone, so the
      // line reads "error: ..." once.
      std::cerr << "error: graph '" << g.name() << "' does not fit --world " << *world << ": " << r.error().message
                << "\n";
      return std::nullopt;
    }
    return std::move(r).value();
  }
  std::cerr << "error: --world " << *world << " does not match the mesh of graph '" << g.name() << "' ("
            << (g.mesh().dims.empty() ? std::string("no mesh line: 1 rank")
                                      : "'" + g.mesh().str() + "': " + std::to_string(mesh_ranks) + " ranks")
            << "; only a 1-D mesh can be resized)\n";
  return std::nullopt;
}

static void print_summary(const Graph& g) {
  const Mesh& mesh = g.mesh();
  std::cout << "graph " << g.name() << ": mesh "
            << (mesh.dims.empty() ? std::string("(none, 1 rank)")
                                  : mesh.str() + " (" + std::to_string(mesh.world_size()) + " ranks)")
            << "\n";
  std::cout << "params (" << g.params().size() << "):\n";
  for (ValueId p : g.params()) {
    const Node& n = g.node(p);
    std::cout << "  " << n.name << ": " << n.type.str();
    if (n.placement) std::cout << " " << n.placement->str(mesh);
    std::cout << "\n";
  }
  std::map<std::string_view, int> per_op;
  for (const Node& n : g.nodes())
    if (op_info(n.op).category != OpCategory::Leaf) ++per_op[op_name(n.op)];
  std::cout << "ops: " << g.op_count();
  std::string sep = " (";
  for (const auto& [name, count] : per_op) {
    std::cout << sep << name << " " << count;
    sep = ", ";
  }
  std::cout << (per_op.empty() ? "" : ")") << "\n";
  std::cout << "outputs (" << g.outputs().size() << "):\n";
  for (const Output& o : g.outputs()) {
    std::cout << "  " << o.name << ": " << g.node(o.value).type.str();
    if (o.placement) std::cout << " " << o.placement->str(mesh);
    std::cout << "\n";
  }
}

void add_check(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand("check", "Parse and verify a graph, print a summary");
  // Owned by the callback, which the app keeps: CLI11 binds options by reference.
  auto file = std::make_shared<std::string>();
  cmd->add_option("graph", *file, "the .sf graph file")->required();
  cmd->footer(
      "Exit status 0 if the graph is well formed; 1 with 'file:line:col: error: ...' otherwise.\n"
      "Example:\n  shardfuse check examples/tp_mlp.sf");
  cmd->callback([file, &exit_code] {
    std::optional<Graph> g = load_graph(*file);
    if (!g) {
      exit_code = 1;
      return;
    }
    print_summary(*g);
    exit_code = 0;
  });
}

}  // namespace sf::cli
