// Reading a Plan directory (runtime/plan/plan_exec.h's read_plan_dir): plan.json, each
// kernel's .ptx, checked before anything runs.
#include <filesystem>

#include "runtime/core/file_io.h"
#include "runtime/plan/plan_exec.h"
#include "runtime/plan/plan_verify.h"

namespace sf {

namespace {

namespace fs = std::filesystem;

Diag file_error(const std::string& file, const std::string& what) { return Diag{file, {}, what}; }

// A Plan file, refused unless it is a regular file under kMaxPlanFileBytes (a .ptx
// linked to /dev/zero or a FIFO must not hang `exec`). `missing` is the message for
// a file that is not there at all.
Result<std::string> read_plan_file(const std::string& path, const std::string& missing) {
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(path, ec))) return file_error(path, missing);
  return read_regular_file(path, kMaxPlanFileBytes, "");
}

// Whether `ptx` declares `.entry <name>(` (the name followed by a parameter list).
bool has_entry(const std::string& ptx, const std::string& name) {
  const std::string needle = ".entry " + name;
  for (size_t at = ptx.find(needle); at != std::string::npos; at = ptx.find(needle, at + 1)) {
    size_t end = at + needle.size();
    while (end < ptx.size() && (ptx[end] == ' ' || ptx[end] == '\t' || ptx[end] == '\n' || ptx[end] == '\r')) ++end;
    if (end < ptx.size() && ptx[end] == '(') return true;
  }
  return false;
}

}  // namespace

Result<PlanSource> read_plan_dir(const std::string& dir) {
  const std::string json_path = (fs::path(dir) / "plan.json").string();
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return file_error(dir, "not a Plan directory (it does not exist or is not a directory)");
  Result<std::string> text =
      read_plan_file(json_path, "cannot read it: a Plan directory holds plan.json (shardfuse compile writes one)");
  if (!text) return text.error();
  Result<Plan> plan = plan_from_json(*text, json_path);
  if (!plan) return plan.error();
  PlanSource src;
  src.plan = std::move(plan).value();
  src.dir = dir;
  for (const PlanKernel& k : src.plan.kernels) {
    if (k.ptx_file.empty() || k.ptx_file.find('/') != std::string::npos || k.ptx_file == "." || k.ptx_file == "..")
      return file_error(json_path, "kernel " + k.id + ": \"ptx\": \"" + k.ptx_file +
                                       "\" must be a file name inside the Plan directory");
    if (src.ptx.count(k.ptx_file)) continue;
    const std::string path = (fs::path(dir) / k.ptx_file).string();
    Result<std::string> ptx = read_plan_file(path, "missing: plan.json names it as kernel " + k.id + "'s PTX");
    if (!ptx) return ptx.error();
    if (ptx->empty()) return file_error(path, "empty: kernel " + k.id + " has no PTX");
    src.ptx.emplace(k.ptx_file, std::move(*ptx));
  }
  for (const PlanKernel& k : src.plan.kernels) {
    if (!has_entry(src.ptx.at(k.ptx_file), k.entry))
      return file_error((fs::path(dir) / k.ptx_file).string(),
                        "has no `.entry " + k.entry + "`, the entry plan.json gives kernel " + k.id);
    // A launch passes one pointer per buffer: as many as the entry takes, or the
    // kernel would read parameters that were never passed.
    SF_TRY(verify_kernel_arity(src.plan, k.id, ptx_entry_params(src.ptx.at(k.ptx_file), k.entry),
                               (fs::path(dir) / k.ptx_file).string()));
  }
  return src;
}

}  // namespace sf
