#include "autotune/ptxas.h"

#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include "runtime/core/run_tool.h"

namespace sf {
namespace {

namespace fs = std::filesystem;

Diag error(std::string message) { return Diag{"", {}, std::move(message)}; }

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\r')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }

std::vector<std::string_view> split(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  size_t start = 0;
  for (size_t i = 0; i <= s.size(); ++i) {
    if (i == s.size() || s[i] == sep) {
      out.push_back(s.substr(start, i - start));
      start = i + 1;
    }
  }
  return out;
}

// Leading integer of `s` (after spaces); the rest goes to `rest`.
std::optional<int64_t> leading_int(std::string_view s, std::string_view* rest) {
  s = trim(s);
  int64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p == s.data()) return std::nullopt;
  *rest = trim(s.substr(static_cast<size_t>(p - s.data())));
  return v;
}

// The text between the first pair of single quotes after `from`.
std::string quoted(std::string_view s, size_t from = 0) {
  size_t a = s.find('\'', from);
  if (a == std::string_view::npos) return "";
  size_t b = s.find('\'', a + 1);
  if (b == std::string_view::npos) return "";
  return std::string(s.substr(a + 1, b - a - 1));
}

struct Props {
  int64_t stack = 0, spill_stores = 0, spill_loads = 0;
};

// One comma-separated field of a "Used ..." or properties line: "[Used|used] N unit".
void apply_field(std::string_view field, KernelResources* k, Props* p) {
  field = trim(field);
  if (starts_with(field, "Used ") || starts_with(field, "used ")) field.remove_prefix(5);
  std::string_view unit;
  std::optional<int64_t> n = leading_int(field, &unit);
  if (!n) return;
  if (k) {
    if (unit == "registers" || unit == "register") k->registers = static_cast<int>(*n);
    else if (unit == "barriers" || unit == "barrier") k->barriers = static_cast<int>(*n);
    else if (unit == "bytes smem") k->shared_bytes = *n;
    else if (unit == "bytes cmem[0]") k->constant_bytes = *n;
    else if (unit == "bytes cumulative stack size") k->cumulative_stack_bytes = *n;
  }
  if (p) {
    if (unit == "bytes stack frame") p->stack = *n;
    else if (unit == "bytes spill stores") p->spill_stores = *n;
    else if (unit == "bytes spill loads") p->spill_loads = *n;
  }
}

bool valid_arch(const std::string& a) {
  if (!starts_with(a, "sm_") || a.size() < 5) return false;
  size_t i = 3;
  while (i < a.size() && a[i] >= '0' && a[i] <= '9') ++i;
  if (i < 5) return false;  // at least two digits
  return i == a.size() || (i + 1 == a.size() && (a[i] == 'a' || a[i] == 'f'));
}

bool executable(const std::string& p) { return !p.empty() && ::access(p.c_str(), X_OK) == 0; }

void replace_all(std::string& s, const std::string& from, const std::string& to) {
  if (from.empty()) return;
  for (size_t pos = s.find(from); pos != std::string::npos; pos = s.find(from, pos + to.size()))
    s.replace(pos, from.size(), to);
}

// A private temporary directory, removed with everything in it when this dies.
class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base && *base ? base : "/tmp") + "/sf-ptxas-XXXXXX";
    if (::mkdtemp(tmpl.data())) path_ = tmpl;
  }
  ~TempDir() {
    if (path_.empty()) return;
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace

Result<std::string> find_ptxas() {
  if (const char* env = std::getenv("SHARDFUSE_PTXAS"); env && *env) {
    if (executable(env)) return std::string(env);
    return error(std::string("ptxas not found: SHARDFUSE_PTXAS=") + env + " is not an executable");
  }
#ifdef SF_PTXAS_PATH
  if (executable(SF_PTXAS_PATH)) return std::string(SF_PTXAS_PATH);
#endif
  if (const char* path = std::getenv("PATH")) {
    for (std::string_view dir : split(path, ':')) {
      if (dir.empty()) continue;
      std::string candidate = std::string(dir) + "/ptxas";
      if (executable(candidate)) return candidate;
    }
  }
  std::string tried;
#ifdef SF_PTXAS_PATH
  tried = std::string(SF_PTXAS_PATH) + ", ";
#endif
  return error("ptxas not found (tried " + tried +
               "PATH; install the CUDA toolkit or set SHARDFUSE_PTXAS)");
}

std::vector<KernelResources> parse_ptxas_info(std::string_view log) {
  std::vector<KernelResources> entries;
  std::map<std::string, Props> props;  // by function name, entry or not
  int current = -1;                    // the entry the next "Used" line belongs to
  std::string props_for;               // the function the next properties line describes
  std::vector<std::string> module_notes;  // notes before the first entry: every entry's

  for (std::string_view raw : split(log, '\n')) {
    std::string_view line = trim(raw);
    if (starts_with(line, "ptxas info")) {
      size_t colon = line.find(':');
      if (colon == std::string_view::npos) continue;
      std::string_view text = trim(line.substr(colon + 1));
      if (starts_with(text, "Compiling entry function")) {
        KernelResources k;
        k.name = quoted(text);
        size_t for_pos = text.find(" for ");
        if (for_pos != std::string_view::npos) k.arch = quoted(text, for_pos);
        k.notes = module_notes;
        entries.push_back(std::move(k));
        current = static_cast<int>(entries.size()) - 1;
      } else if (starts_with(text, "(C")) {
        if (current >= 0) entries[static_cast<size_t>(current)].notes.emplace_back(text);
        else if (entries.empty()) module_notes.emplace_back(text);
      } else if (starts_with(text, "Compiling function")) {
        current = -1;  // a non-entry function's lines (relocatable mode) are not ours
      } else if (starts_with(text, "Function properties for ")) {
        props_for = std::string(trim(text.substr(std::strlen("Function properties for "))));
      } else if (starts_with(text, "Used ") && current >= 0) {
        for (std::string_view f : split(text, ',')) apply_field(f, &entries[current], nullptr);
      }
    } else if (line.find("bytes stack frame") != std::string_view::npos && !props_for.empty()) {
      Props p;
      for (std::string_view f : split(line, ',')) apply_field(f, nullptr, &p);
      props[props_for] = p;
      props_for.clear();
    }
  }
  for (KernelResources& k : entries) {
    auto it = props.find(k.name);
    if (it == props.end()) continue;
    k.stack_frame_bytes = it->second.stack;
    k.spill_store_bytes = it->second.spill_stores;
    k.spill_load_bytes = it->second.spill_loads;
  }
  return entries;
}

Diag ptxas_error_diag(std::string_view log, const std::string& file) {
  Diag d;
  d.file = file;
  std::vector<std::string> lines;
  std::string first;  // the first line without its "line N: ", which d.loc carries
  for (std::string_view raw : split(log, '\n')) {
    std::string_view line = trim(raw);
    if (!starts_with(line, "ptxas")) continue;
    // "ptxas /tmp/x/kernel.ptx, line 29; error   : Unknown modifier '.xf32'"
    size_t at = line.find(", line ");
    size_t semi = line.find(';');
    if (at != std::string_view::npos && semi != std::string_view::npos && semi > at) {
      std::string_view kind_msg = trim(line.substr(semi + 1));
      if (!starts_with(kind_msg, "error")) continue;  // warnings are not why it failed
      std::string_view rest;
      std::optional<int64_t> n = leading_int(line.substr(at + 7, semi - at - 7), &rest);
      size_t colon = kind_msg.find(':');
      std::string msg(trim(colon == std::string_view::npos ? kind_msg : kind_msg.substr(colon + 1)));
      if (n && d.loc.line == 0) d.loc = {static_cast<int>(*n), 0};
      if (lines.empty()) first = msg;
      lines.push_back((n ? "line " + std::to_string(*n) + ": " : std::string()) + msg);
    } else if (starts_with(line, "ptxas fatal") || starts_with(line, "ptxas error")) {
      size_t colon = line.find(':');
      lines.push_back(std::string(trim(colon == std::string_view::npos ? line : line.substr(colon + 1))));
      if (lines.size() == 1) first = lines[0];
    }
  }
  if (lines.empty()) {
    std::string all(trim(log));
    d.message = "ptxas rejected the PTX" + (all.empty() ? std::string() : ": " + all);
    return d;
  }
  d.message = "ptxas: " + first;
  for (size_t i = 1; i < lines.size(); ++i) d.message += "\n  " + lines[i];
  return d;
}

Result<std::vector<KernelResources>> run_ptxas(std::string_view ptx, const PtxasOptions& o) {
  if (!valid_arch(o.arch)) return error("ptxas: '" + o.arch + "' is not an arch like sm_90a");
  if (o.opt_level < 0 || o.opt_level > 3) return error("ptxas: -O" + std::to_string(o.opt_level) + " is not 0..3");
  auto ptxas = find_ptxas();
  if (!ptxas) return ptxas.error();

  TempDir dir;
  if (dir.path().empty()) return error(std::string("ptxas: cannot create a temporary directory: ") + std::strerror(errno));
  // Only a plain file name goes into the path; anything else would escape the dir.
  std::string name = o.ptx_name;
  if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..") name = "kernel.ptx";
  const std::string ptx_path = dir.path() + "/" + name;
  const std::string cubin_path = dir.path() + "/out.cubin";
  {
    std::ofstream f(ptx_path, std::ios::binary);
    f.write(ptx.data(), static_cast<std::streamsize>(ptx.size()));
    if (!f) return error("ptxas: cannot write " + ptx_path);
  }

  std::vector<std::string> args = {*ptxas, "-v", "-O" + std::to_string(o.opt_level), "-arch=" + o.arch};
  if (o.max_registers > 0) args.push_back("--maxrregcount=" + std::to_string(o.max_registers));
  args.insert(args.end(), {"-o", cubin_path, ptx_path});
  // stdout and stderr (where -v writes) both into the log. No timeout: ptxas on a
  // large kernel may take long, and it always finished so far.
  Result<ToolRun> run = run_tool(args);
  if (!run) return with_context("ptxas: ", run.error());
  std::string log = std::move(run->output);
  replace_all(log, ptx_path, name);

  if (run->signal != 0) return error("ptxas " + run->status_str() + "\n" + log);
  if (!run->ok()) return ptxas_error_diag(log, name);
  return parse_ptxas_info(log);
}

Result<std::string> ptxas_version() {
  auto ptxas = find_ptxas();
  if (!ptxas) return ptxas.error();
  Result<ToolRun> run = run_tool({*ptxas, "--version"}, std::chrono::seconds(60));
  if (!run) return with_context("ptxas: ", run.error());
  std::string version;
  // "Cuda compilation tools, release 13.0, V13.0.88": the last word of that line.
  for (std::string_view line : split(run->output, '\n'))
    if (line.find("release") != std::string_view::npos) version = std::string(trim(line.substr(line.rfind(' ') + 1)));
  if (!run->ok() || version.empty())
    return error("ptxas: '" + *ptxas + " --version' did not print a release line");
  return version;
}

}  // namespace sf
