// --dump-after=STAGE|all: the IR after each named stage of the pipeline, in pipeline
// order (parse, propagate, lower, decompose, fuse, schedule, emit), with
// "(unchanged)" when a stage did nothing (LLVM's -print-after-all habit).
#include <iostream>
#include <set>
#include <sstream>

#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>
#include <llvm/Support/raw_ostream.h>

#include "codegen/dist/explain.h"
#include "codegen/dist/lower.h"
#include "codegen/dist/schedule.h"
#include "codegen/fusion/decompose_program.h"
#include "codegen/fusion/fuse.h"
#include "codegen/fusion/verify_programs.h"
#include "codegen/ir/printer.h"
#include "codegen/kernels/host_runner.h"
#include "tools/shardfuse/commands.h"

namespace sf::cli {

const std::vector<std::string>& dump_stages() {
  static const std::vector<std::string> s{"parse", "propagate", "lower", "decompose", "fuse", "schedule", "emit"};
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
      std::cerr << "error: --dump-after: unknown stage '" << s
                << "' (expected all or a comma list of parse, propagate, lower, decompose, fuse, schedule, emit)\n";
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

void stage(const std::set<std::string>& want, const std::string& name, const std::string& text,
           const std::string& before) {
  if (!want.count(name)) return;
  std::cout << "; ---- after " << name << (text == before ? " (unchanged)" : "") << " ----\n" << text << "\n";
}

}  // namespace

void dump_pipeline(const Graph& g, const std::set<std::string>& want, int rank, const llvmb::Target& target) {
  if (want.empty()) return;
  DeviceMesh mesh(g.mesh());
  std::string parsed = print_graph(g);
  stage(want, "parse", parsed, "");
  ShardingPlan plan = propagate(g, mesh);
  std::string sharded = explain_sharding(g, plan, mesh);
  stage(want, "propagate", sharded, "");
  // Every rank goes through the stages (fusion decides for all alike); rank `rank` is shown.
  std::vector<LocalProgram> ps;
  for (int r = 0; r < mesh.world(); ++r) ps.push_back(lower(g, plan, mesh, r));
  std::string lowered = program_text(ps[static_cast<size_t>(rank)], mesh);
  stage(want, "lower", lowered, "");
  for (LocalProgram& p : ps) p = decompose_program(std::move(p));
  std::string decomposed = program_text(ps[static_cast<size_t>(rank)], mesh);
  stage(want, "decompose", decomposed, lowered);
  ps = fuse_all(std::move(ps));
  std::string fused = explain_kernels(ps[static_cast<size_t>(rank)]) + program_text(ps[static_cast<size_t>(rank)], mesh);
  stage(want, "fuse", fused, "");
  LocalProgram sched = schedule(ps[static_cast<size_t>(rank)]);
  stage(want, "schedule", program_text(sched, mesh), program_text(ps[static_cast<size_t>(rank)], mesh));
  if (!want.count("emit")) return;
  std::cout << "; ---- after emit (" << target.str() << ") ----\n";
  for (const LocalKernel& k : sched.kernels) {
    std::optional<KernelKind> kind = kernel_kind_of(k);
    std::cout << "; kernel " << k.name << "\n";
    if (!kind) {
      std::cout << ";   no emitter for " << k.kind << " kernels yet\n";
      continue;
    }
    Result<EmittedKernel> e = emitter_for(*kind).emit(KernelSpec{"sf_" + k.name, *kind, k.group}, {}, target);
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
