// `shardfuse run G.sf`: execute a graph on inputs from .npy files or seeded random,
// optionally compare with the reference evaluator and save the outputs.
//
// Until the distribution and codegen stages exist, "execute" means: decompose the
// composites (what every later stage consumes) and evaluate that primitive graph;
// --check compares it with the reference evaluator on the original graph.
#include <cmath>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <sstream>

#include "codegen/ir/decompose.h"
#include "codegen/reference/compare.h"
#include "codegen/reference/evaluate.h"
#include "runtime/npy.h"
#include "tools/shardfuse/commands.h"

namespace sf::cli {

namespace {

struct RunOptions {
  std::string file;
  std::optional<int64_t> world;
  std::string device = "cpu";
  std::string inputs_dir;
  std::string outputs_dir;
  uint64_t seed = 0;
  bool check = false;
};

std::optional<std::vector<Tensor>> load_inputs(const Graph& g, const RunOptions& o) {
  if (o.inputs_dir.empty()) return random_inputs(g, o.seed);
  std::vector<Tensor> in;
  for (ValueId p : g.params()) {
    const Node& n = g.node(p);
    std::string path = (std::filesystem::path(o.inputs_dir) / (n.name + ".npy")).string();
    Result<Tensor> t = read_npy(path, n.type, n.name);
    if (!t.ok()) {
      std::cerr << t.error().str() << "\n";
      return std::nullopt;
    }
    in.push_back(std::move(t).value());
  }
  return in;
}

std::string preview(const Tensor& t) {
  std::ostringstream os;
  os << std::setprecision(6) << "[";
  int64_t n = std::min<int64_t>(t.numel(), 6);
  for (int64_t i = 0; i < n; ++i) os << (i ? ", " : "") << t.get(i);
  if (t.numel() > n) os << ", ...";
  os << "]";
  return os.str();
}

int run(const RunOptions& o) {
  std::optional<Graph> g = load_graph(o.file);
  if (!g) return 1;
  std::optional<int64_t> world = resolve_world(*g, o.world);
  if (!world) return 1;
  std::optional<std::vector<Tensor>> inputs = load_inputs(*g, o);
  if (!inputs) return 1;

  Graph lowered = decompose(*g);
  Result<std::vector<Tensor>> out = evaluate(lowered, *inputs);
  if (!out.ok()) {
    Diag d = out.error();
    if (d.file.empty()) d.file = o.file;
    std::cerr << d.str() << "\n";
    return 1;
  }

  std::optional<std::vector<Tensor>> want;
  if (o.check) {
    Result<std::vector<Tensor>> ref = evaluate(*g, *inputs);
    if (!ref.ok()) {
      std::cerr << ref.error().str() << "\n";
      return 1;
    }
    want = std::move(ref).value();
  }

  std::cout << "graph " << g->name() << ": " << *world << " rank(s), device " << o.device
            << ", inputs " << (o.inputs_dir.empty() ? "random (seed " + std::to_string(o.seed) + ")" : o.inputs_dir)
            << "\n";
  bool all_ok = true;
  for (size_t i = 0; i < g->outputs().size(); ++i) {
    const Output& op = g->outputs()[i];
    const Tensor& t = (*out)[i];
    std::cout << "  " << op.name << ": " << t.type().str() << " " << preview(t);
    if (want) {
      Comparison c = compare(t, (*want)[i], default_tolerance(t.dtype()));
      std::cout << std::setprecision(3) << "  max_abs_err=" << c.max_abs_err
                << " max_rel_err=" << c.max_rel_err << (c.ok() ? "  ok" : "  MISMATCH");
      if (!c.ok()) {
        all_ok = false;
        std::cout << " (" << c.mismatches << " element(s), first at flat index " << c.first_mismatch << ")";
      }
    }
    std::cout << "\n";
  }

  if (!o.outputs_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(o.outputs_dir, ec);
    if (ec) {
      std::cerr << o.outputs_dir << ": error: cannot create directory: " << ec.message() << "\n";
      return 1;
    }
    for (size_t i = 0; i < g->outputs().size(); ++i) {
      std::string path = (std::filesystem::path(o.outputs_dir) / (g->outputs()[i].name + ".npy")).string();
      if (auto err = write_npy(path, (*out)[i])) {
        std::cerr << err->str() << "\n";
        return 1;
      }
    }
    std::cout << "saved " << g->outputs().size() << " output(s) to " << o.outputs_dir << "\n";
  }
  if (want) std::cout << (all_ok ? "check: ok\n" : "check: MISMATCH\n");
  return all_ok ? 0 : 1;
}

}  // namespace

void add_run(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<RunOptions>();
  auto* cmd = app.add_subcommand("run", "Execute a graph and optionally check it against the reference");
  cmd->add_option("graph", o->file, "the .sf graph file")->required();
  cmd->add_option("--world", o->world, "number of ranks; must equal the product of the mesh line")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  cmd->add_option("--device", o->device, "where kernels run (only cpu for now; cuda comes with the CUDA runtime)")
      ->check(CLI::IsMember({"cpu"}));
  cmd->add_option("--inputs", o->inputs_dir, "read DIR/<param>.npy as each parameter's global tensor")
      ->check(CLI::ExistingDirectory);
  cmd->add_option("--save-outputs", o->outputs_dir,
                  "write each returned value, at its global shape, to DIR/<name>.npy "
                  "(float32 for f32/bf16, float16 for f16)");
  cmd->add_option("--seed", o->seed, "seed for random inputs when --inputs is not given (default 0)");
  cmd->add_flag("--check", o->check,
                "compare with the reference evaluator; print max abs/rel error, exit 1 on mismatch");
  cmd->footer(
      "Examples:\n"
      "  shardfuse run examples/tp_mlp.sf --check\n"
      "  shardfuse run examples/tp_mlp.sf --inputs in/ --save-outputs out/   # in/x.npy, in/w1.npy, ...");
  cmd->callback([o, &exit_code] { exit_code = run(*o); });
}

}  // namespace sf::cli
