// The system file: autotune/system.h.
#include "autotune/system.h"

#include <cmath>
#include <limits>
#include <set>

#include <nlohmann/json.hpp>

#include "runtime/core/file_io.h"

namespace sf {

using json = nlohmann::json;

// --- the system file -----------------------------------------------------------------

namespace {

constexpr const char* kSystemFormat = "shardfuse-system";
constexpr int kSystemVersion = 1;

SourceLoc loc_at(const std::string& text, size_t at) {
  SourceLoc loc{1, 1};
  for (size_t i = 0; i < at && i < text.size(); ++i) {
    if (text[i] == '\n') {
      ++loc.line;
      loc.col = 1;
    } else {
      ++loc.col;
    }
  }
  return loc;
}

// Where field `path` ("links.ib.alpha_us") is written: each component's quoted key
// searched for after the previous one. Good enough for the hand-written files this
// reads (a key repeated in an earlier sibling can mislead it); no location when a
// component is missing, since then there is nothing to point at but its parent.
SourceLoc locate(const std::string& text, const std::vector<std::string>& path) {
  size_t at = 0;
  size_t found = std::string::npos;
  for (const std::string& k : path) {
    size_t p = text.find("\"" + k + "\"", at);
    if (p == std::string::npos) return found == std::string::npos ? SourceLoc{} : loc_at(text, found);
    found = p;
    at = p + k.size() + 2;
  }
  return found == std::string::npos ? SourceLoc{} : loc_at(text, found);
}

std::string join_path(const std::vector<std::string>& path) {
  std::string s;
  for (const std::string& k : path) s += (s.empty() ? "" : ".") + k;
  return s;
}

// Reads one object's fields, checking types and ranges; throws DiagError located at
// the field (turned into a Diag by parse_system).
class Fields {
 public:
  Fields(const std::string& text, const std::string& file, const json& obj, std::vector<std::string> path)
      : text_(text), file_(file), obj_(obj), path_(std::move(path)) {
    if (!obj_.is_object()) fail_at(path_, "expected an object");
  }

  [[noreturn]] void fail_at(const std::vector<std::string>& path, const std::string& msg) const {
    throw DiagError{Diag{file_, locate(text_, path), (path.empty() ? std::string() : join_path(path) + ": ") + msg}};
  }
  [[noreturn]] void fail(const std::string& key, const std::string& msg) const { fail_at(sub(key), msg); }

  std::vector<std::string> sub(const std::string& key) const {
    std::vector<std::string> p = path_;
    p.push_back(key);
    return p;
  }

  const json* find(const std::string& key) {
    seen_.insert(key);
    auto it = obj_.find(key);
    return it == obj_.end() ? nullptr : &*it;
  }
  const json& need(const std::string& key) {
    const json* v = find(key);
    if (!v) fail_at(path_, "missing field \"" + key + "\"");
    return *v;
  }

  std::string str(const std::string& key, bool required, std::string def = {}) {
    const json* v = required ? &need(key) : find(key);
    if (!v) return def;
    if (!v->is_string()) fail(key, "expected a string, found " + v->dump());
    return v->get<std::string>();
  }

  // A number in [lo, hi) (or [lo, hi] when hi_closed), or > lo when lo_open.
  double num(const std::string& key, bool required, double def, double lo, bool lo_open, double hi,
             const std::string& range) {
    const json* v = required ? &need(key) : find(key);
    if (!v) return def;
    if (!v->is_number()) fail(key, "expected a number " + range + ", found " + v->dump());
    double d = v->get<double>();
    if (!std::isfinite(d) || (lo_open ? d <= lo : d < lo) || d >= hi) fail(key, "expected a number " + range + ", found " + v->dump());
    return d;
  }
  double positive(const std::string& key, bool required = true, double def = 0) {
    return num(key, required, def, 0, true, std::numeric_limits<double>::infinity(), "> 0");
  }
  double non_negative(const std::string& key, bool required = true, double def = 0) {
    return num(key, required, def, 0, false, std::numeric_limits<double>::infinity(), ">= 0");
  }
  double fraction(const std::string& key, bool required = true, double def = 0) {
    return num(key, required, def, 0, false, 1, "in [0, 1)");
  }
  int count(const std::string& key) {
    const json& v = need(key);
    if (!v.is_number_integer() || v.get<int64_t>() < 1 || v.get<int64_t>() > (1 << 20))
      fail(key, "expected a whole number >= 1, found " + v.dump());
    return static_cast<int>(v.get<int64_t>());
  }

  // Every field is one this reader knows ("notes" is allowed anywhere, as a comment).
  void no_others() const {
    for (auto it = obj_.begin(); it != obj_.end(); ++it) {
      if (seen_.count(it.key()) || it.key() == "notes") continue;
      std::string known;
      for (const std::string& k : seen_) known += (known.empty() ? "" : ", ") + k;
      fail(it.key(), "unknown field (known here: " + known + ", notes)");
    }
  }

  const std::string& text() const { return text_; }
  const std::string& file() const { return file_; }

 private:
  const std::string& text_;
  const std::string& file_;
  const json& obj_;
  std::vector<std::string> path_;
  std::set<std::string> seen_;
};

LinkSpec parse_link(Fields& parent, const std::string& key) {
  Fields f(parent.text(), parent.file(), parent.need(key), parent.sub(key));
  LinkSpec l;
  l.bandwidth_GB_s = f.positive("bandwidth_GB_s");
  l.alpha_us = f.non_negative("alpha_us");
  // 1 would stop kernels outright while NCCL runs; the model needs some progress.
  l.sm_fraction = f.fraction("sm_fraction");
  l.comm_slowdown = f.fraction("comm_slowdown", false, 0);
  std::string a = f.str("algorithm", false, "ring");
  if (a == "ring") l.algorithm = CollAlgorithm::Ring;
  else if (a == "tree") l.algorithm = CollAlgorithm::Tree;
  else f.fail("algorithm", "expected \"ring\" or \"tree\", found \"" + a + "\"");
  f.no_others();
  return l;
}

SystemSpec parse_system_json(const json& j, const std::string& text, const std::string& file) {
  Fields top(text, file, j, {});
  SystemSpec s;
  if (top.str("format", true) != kSystemFormat)
    top.fail("format", std::string("expected \"") + kSystemFormat + "\" (is this a shardfuse system file?)");
  const json& v = top.need("version");
  if (!v.is_number_integer() || v.get<int64_t>() != kSystemVersion)
    top.fail("version", "this shardfuse reads version " + std::to_string(kSystemVersion) + ", found " + v.dump());
  s.name = top.str("name", true);
  if (auto it = j.find("notes"); it != j.end()) {
    const json* n = &*it;
    if (n->is_string()) {
      s.notes.push_back(n->get<std::string>());
    } else if (n->is_array()) {
      for (const json& line : *n) {
        if (!line.is_string()) top.fail("notes", "expected a string or an array of strings");
        s.notes.push_back(line.get<std::string>());
      }
    } else {
      top.fail("notes", "expected a string or an array of strings");
    }
  }
  {
    Fields g(text, file, top.need("gpu"), top.sub("gpu"));
    s.gpu.name = g.str("name", true);
    s.gpu.arch = g.str("arch", true);
    s.gpu.device_name = g.str("device_name", false);
    s.gpu.fp32_tflops = g.positive("fp32_tflops");
    s.gpu.bf16_tflops = g.non_negative("bf16_tflops", false, 0);
    s.gpu.hbm_GB_s = g.positive("hbm_GB_s");
    s.gpu.launch_us = g.non_negative("launch_us");
    g.no_others();
  }
  s.nodes = top.count("nodes");
  s.gpus_per_node = top.count("gpus_per_node");
  {
    Fields links(text, file, top.need("links"), top.sub("links"));
    s.nvlink = parse_link(links, "nvlink");
    if (links.find("ib")) {
      s.ib = parse_link(links, "ib");
      s.has_ib = true;
    } else if (s.nodes > 1) {
      top.fail("links", "missing field \"ib\": a system of " + std::to_string(s.nodes) +
                            " nodes needs the link between nodes");
    }
    links.no_others();
  }
  top.no_others();
  return s;
}

}  // namespace

Result<SystemSpec> parse_system(const std::string& text, const std::string& file) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::parse_error& e) {
    // e.byte is 1-based, one past the offending character.
    SourceLoc loc = loc_at(text, e.byte == 0 ? 0 : static_cast<size_t>(e.byte - 1));
    std::string what = e.what();
    if (size_t colon = what.find(": "); colon != std::string::npos) what = what.substr(colon + 2);
    return Diag{file, loc, "not valid JSON: " + what};
  }
  try {
    return parse_system_json(j, text, file);
  } catch (const DiagError& e) {
    return e.diag;
  }
}

Result<SystemSpec> load_system(const std::string& path) {
  Result<std::string> text = read_regular_file(path, kMaxJsonFileBytes, "");
  if (!text) return Diag{path, {}, "cannot read the system file: " + text.error().message};
  return parse_system(*text, path);
}

DeviceRates device_rates(const GpuSpec& gpu) {
  DeviceRates r;
  r.name = gpu.name;
  r.hbm_bytes_s = gpu.hbm_GB_s * 1e9;
  r.fp32_flops_s = gpu.fp32_tflops * 1e12;
  r.tensor16_flops_s = gpu.bf16_tflops > 0 ? gpu.bf16_tflops * 1e12 : r.fp32_flops_s;
  Result<DeviceRates> table = arch_rates(gpu.arch);
  r.tf32_flops_s = table && table->tensor16_flops_s > 0 ? r.tensor16_flops_s * table->tf32_flops_s / table->tensor16_flops_s
                                                        : r.tensor16_flops_s / 2;
  r.launch_s = gpu.launch_us * 1e-6;
  return r;
}

CommRates comm_rates(const SystemSpec& sys) {
  CommRates c;
  c.name = sys.name;
  c.gpus_per_node = sys.gpus_per_node;
  c.intra = sys.nvlink;
  // A system of one node has no link between nodes; a group that would span nodes
  // (a world larger than the system, refused by simulate) is priced on NVLink.
  c.inter = sys.has_ib ? sys.ib : sys.nvlink;
  return c;
}

}  // namespace sf
