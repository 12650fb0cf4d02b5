// --dump-after=STAGE|all: the IR after each named stage, in order: parse, propagate,
// the pipeline's own stages (codegen/fusion/pipeline.h: lower, decompose,
// collective-matmul, fuse, schedule) as the command runs them, and emit; with
// "(unchanged)" when a stage did nothing (LLVM's -print-after-all habit).
#include <iostream>
#include <memory>
#include <set>
#include <sstream>

#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>
#include <llvm/Support/raw_ostream.h>

#include "codegen/ir/decompose.h"
#include "codegen/dist/explain.h"
#include "codegen/fusion/fuse.h"
#include "codegen/fusion/pipeline.h"
#include "codegen/fusion/verify_programs.h"
#include "codegen/ir/printer.h"
#include "codegen/kernels/host_runner.h"
#include "tools/shardfuse/commands.h"

namespace sf::cli {

const std::vector<std::string>& dump_stages() {
  static const std::vector<std::string> s = [] {
    std::vector<std::string> v{"parse", "propagate"};
    v.insert(v.end(), all_pipeline_stages().begin(), all_pipeline_stages().end());
    v.push_back("emit");
    return v;
  }();
  return s;
}

std::string stage_list() {
  std::string s;
  for (const std::string& n : dump_stages()) s += (s.empty() ? "" : ", ") + n;
  return s;
}

std::optional<std::set<std::string>> parse_dump_after(const std::string& arg) {
  std::set<std::string> want;
  if (arg.empty()) return want;
  std::stringstream ss(arg);
  std::string s;
  while (std::getline(ss, s, ',')) {
    if (s == "all") {
      want.insert(dump_stages().begin(), dump_stages().end());
      continue;
    }
    if (std::find(dump_stages().begin(), dump_stages().end(), s) == dump_stages().end()) {
      std::cerr << "error: --dump-after: unknown stage '" << s << "' (expected all or a comma list of " << stage_list()
                << ")\n";
      return std::nullopt;
    }
    want.insert(s);
  }
  return want;
}

void add_verify_each_option(CLI::App* cmd) {
  cmd->add_flag_callback("--verify-each", [] { set_verify_each(true); },
                         "check every rank's programs after each stage (lower, decompose, collective-matmul, fuse, "
                         "schedule): values defined before use, collectives matched on every member with equal "
                         "shapes, buffers in bounds; a broken stage is an internal error (exit 3). Also on when "
                         "SHARDFUSE_VERIFY_EACH=1");
}

namespace {

std::string program_text(const LocalProgram& p, const DeviceMesh& mesh) {
  std::string s;
  for (const LocalStep& st : p.steps) s += "  " + step_line(p, st, mesh) + "\n";
  return s;
}

void print_stage(const std::string& name, const std::string& text, bool unchanged) {
  std::cout << "; ---- after " << name << (unchanged ? " (unchanged)" : "") << " ----\n" << text << "\n";
}

}  // namespace

PipelineDump::PipelineDump(const Graph& g, std::set<std::string> want, int rank, const CommRates& comm)
    : want_(std::move(want)), rank_(rank), mesh_(std::make_shared<const DeviceMesh>(g.mesh())) {
  if (want_.count("parse")) print_stage("parse", print_graph(g), false);
  if (want_.count("propagate")) {
    const Graph gs = decompose_for_sharding(g);  // what the command propagates (compile_plan)
    print_stage("propagate", explain_sharding(gs, propagate(gs, *mesh_, comm), *mesh_), false);
  }
}

std::function<void(std::string_view, const std::vector<LocalProgram>&)> PipelineDump::observer() {
  if (want_.empty()) return {};
  return [this](std::string_view stage, const std::vector<LocalProgram>& ps) {
    const LocalProgram& p = ps[static_cast<size_t>(rank_)];
    std::string text = explain_kernels(p) + program_text(p, *mesh_);
    if (want_.count(std::string(stage))) print_stage(std::string(stage), text, stage != "lower" && text == last_text_);
    last_text_ = std::move(text);
    last_ = p;
  };
}

void PipelineDump::emit(const llvmb::Target& target) const {
  if (!want_.count("emit") || !last_) return;
  std::cout << "; ---- after emit (" << target.str() << ") ----\n";
  for (const LocalKernel& k : last_->kernels) {
    std::cout << "; kernel " << k.name << "\n";
    Result<EmittedKernel> e = emitter_for(k.kind).emit(KernelSpec{"sf_" + k.name, k.kind, k.group}, {}, target);
    if (!e.ok()) {
      std::cout << ";   " << e.error().message << "\n";
      continue;
    }
    std::string ir;
    llvm::raw_string_ostream os(ir);
    e->module->print(os, nullptr);
    std::cout << os.str() << "\n";
  }
}

}  // namespace sf::cli
