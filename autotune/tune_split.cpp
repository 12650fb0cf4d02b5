// The tuner split across two machines: autotune/tune_split.h.
#include "autotune/tune_split.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <random>

#include <nlohmann/json.hpp>

#include "autotune/problem.h"
#include "autotune/tuner.h"
#include "runtime/core/file_io.h"
#include "runtime/gpu/cuda_driver.h"
#include "runtime/io/json_reader.h"
#include "runtime/plan/plan_json.h"

namespace sf {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr const char* kMarker = ".shardfuse-tune-candidates";
constexpr const char* kFormat = "shardfuse tune candidates";
constexpr const char* kMeasuredFormat = "shardfuse tune measurements";
constexpr int kVersion = 1;  // measurements.json
// candidates.json: 2 carries each kernel's params, integer bounds and outputs (1 had
// only the group's text, which the GPU machine had to parse).
constexpr int kCandidatesVersion = 2;
constexpr size_t kMaxArguments = 1024;  // params or outputs of one kernel
constexpr size_t kMaxKernels = 4096, kMaxCandidates = 4096;
constexpr uint64_t kMaxJsonBytes = uint64_t{256} << 20, kMaxPtxBytes = uint64_t{64} << 20;
constexpr uint64_t kMaxArgumentBytes = uint64_t{64} << 30;  // a kernel's inputs and outputs, on the host and the GPU


json specs_json(const std::vector<KernelArgSpec>& v) {
  json a = json::array();
  for (const KernelArgSpec& s : v) a.push_back({{"dtype", std::string(dtype_name(s.dtype))}, {"elements", s.elements}});
  return a;
}

std::vector<KernelArgSpec> read_specs(const json_read::Reader& rd, const json& v, const std::string& path) {
  std::vector<KernelArgSpec> out;
  for (size_t i = 0; i < rd.array(v, path, 1024).size(); ++i) {
    const std::string p = json_read::Reader::item(path, i);
    KernelArgSpec s;
    const std::string dt = rd.string(v[i], p, "dtype");
    std::optional<DType> t = parse_dtype(dt);
    if (!t) rd.fail(p + ".dtype", "\"" + dt + "\" is not a dtype");
    s.dtype = *t;
    s.elements = rd.integer(v[i], p, "elements", 0, int64_t{1} << 40);
    out.push_back(s);
  }
  return out;
}

// A PTX artifact's fields beside its file's name (the text is in that file).
json ptx_artifact_json(const PtxArtifact& a, const std::string& file) {
  json cj = {{"ptx", file},
             {"entry", a.entry},
             {"grid", a.launch.grid},
             {"block", a.launch.block},
             {"shared_bytes", a.launch.shared_bytes},
             {"zero_outputs", a.zero_outputs},
             {"workspace_bytes", a.workspace_bytes},
             {"persistent", a.persistent},
             {"cluster", a.launch.cluster},
             {"inputs", specs_json(a.inputs)},
             {"outputs", specs_json(a.outputs)},
             {"tensor_maps", json::array()}};
  for (const PlanTensorMap& m : a.tensor_maps) cj["tensor_maps"].push_back(tensor_map_to_json(m));
  return cj;
}

// `file` (a regular file of at most kMaxJsonBytes) parsed as JSON.
Result<json> read_json_file(const std::string& file, std::string_view what) {
  Result<std::string> text = read_regular_file(file, kMaxJsonBytes, what);
  if (!text) return text.error();
  json j = json::parse(*text, nullptr, false);
  if (j.is_discarded()) return Diag{file, {}, "not valid JSON"};
  return j;
}

std::vector<int> to_ints(const std::vector<int64_t>& v) { return {v.begin(), v.end()}; }

// A file name the directory may hold: no separators, no "..", printable.
bool plain_name(const std::string& n) {
  if (n.empty() || n.size() > 128 || n == "." || n == "..") return false;
  for (char c : n)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.')) return false;
  return true;
}

// A PTX artifact's fields at `cp` (ptx_artifact_json's), its text from the file named.
PtxArtifact read_ptx_artifact(const json_read::Reader& rd, const std::string& dir, const json& cj,
                              const std::string& cp) {
  PtxArtifact a;
  const std::string ptx = rd.string(cj, cp, "ptx");
  if (!plain_name(ptx)) rd.fail(cp + ".ptx", "\"" + ptx + "\" is not a file name inside the directory");
  Result<std::string> code = read_regular_file((fs::path(dir) / ptx).string(), kMaxPtxBytes, "PTX file");
  if (!code) rd.fail(cp + ".ptx", code.error().message);
  a.ptx = *code;
  a.entry = rd.string(cj, cp, "entry");
  std::vector<int64_t> grid = rd.integers(rd.at(cj, cp, "grid"), cp + ".grid", 1, (int64_t{1} << 31) - 1, 3);
  std::vector<int64_t> block = rd.integers(rd.at(cj, cp, "block"), cp + ".block", 1, 1024, 3);
  if (grid.size() != 3 || block.size() != 3) rd.fail(cp, "grid and block need 3 extents each");
  for (size_t d = 0; d < 3; ++d) {
    a.launch.grid[d] = grid[d];
    a.launch.block[d] = static_cast<int>(block[d]);
  }
  if (int64_t{a.launch.block[0]} * a.launch.block[1] * a.launch.block[2] > 1024)
    rd.fail(cp + ".block", "more than 1024 threads");
  a.launch.shared_bytes = static_cast<int>(rd.integer(cj, cp, "shared_bytes", 0, 256 * 1024));
  a.zero_outputs = rd.boolean_or(cj, cp, "zero_outputs", false);
  a.workspace_bytes = rd.integer_or(cj, cp, "workspace_bytes", 0, kMaxPlanElements * 8, 0);
  a.persistent = rd.boolean_or(cj, cp, "persistent", false);
  a.launch.cluster = static_cast<int>(rd.integer_or(cj, cp, "cluster", 1, 8, 1));
  if (a.launch.grid[0] % a.launch.cluster != 0) rd.fail(cp + ".grid", "is not whole clusters of " + std::to_string(a.launch.cluster));
  a.inputs = read_specs(rd, rd.at(cj, cp, "inputs"), cp + ".inputs");
  a.outputs = read_specs(rd, rd.at(cj, cp, "outputs"), cp + ".outputs");
  const json& maps = rd.array(rd.at(cj, cp, "tensor_maps"), cp + ".tensor_maps", 8);
  for (size_t mi = 0; mi < maps.size(); ++mi) {
    PlanTensorMap m = read_plan_tensor_map(rd, maps[mi], json_read::Reader::item(cp + ".tensor_maps", mi));
    if (m.output >= 0 ? m.output >= static_cast<int>(a.outputs.size()) : m.input >= static_cast<int>(a.inputs.size()))
      rd.fail(json_read::Reader::item(cp + ".tensor_maps", mi) + (m.output >= 0 ? ".output" : ".input"),
              m.output >= 0 ? "no such output" : "no such input");
    a.tensor_maps.push_back(m);
  }
  return a;
}

// A library GEMM candidate at `gp`: the call (a Plan gemm step's fields), its
// arguments among the kernel's params and outputs, and the epilogue kernel of a split
// candidate with where each of its arguments comes from. Whether the call fits those
// buffers is checked by the CUDA Runner that runs it (gemm_check).
std::shared_ptr<const GemmArtifact> read_gemm_candidate(const json_read::Reader& rd, const std::string& dir,
                                                        const json& gj, const std::string& gp,
                                                        const std::vector<KernelArgSpec>& params,
                                                        const std::vector<KernelArgSpec>& outs) {
  if (!gj.is_object()) rd.fail(gp, "is not an object");
  auto g = std::make_shared<GemmArtifact>();
  g->desc = read_plan_gemm_desc(rd, gj, gp);
  const auto np = static_cast<int64_t>(params.size()), no = static_cast<int64_t>(outs.size());
  g->a = static_cast<int>(rd.integer(gj, gp, "a", 0, np - 1));
  g->b = static_cast<int>(rd.integer(gj, gp, "b", 0, np - 1));
  g->bias = static_cast<int>(rd.integer(gj, gp, "bias", -1, np - 1));
  const bool split = gj.contains("epilogue_kernel");
  g->c = static_cast<int>(rd.integer(gj, gp, "c", split ? kGemmProduct : 0, no - 1));
  if (split) {
    g->epilogue = std::make_shared<const PtxArtifact>(read_ptx_artifact(rd, dir, gj["epilogue_kernel"], gp + ".epilogue_kernel"));
    g->epilogue_in = to_ints(rd.integers(rd.at(gj, gp, "epilogue_in"), gp + ".epilogue_in", kGemmProduct, np - 1,
                                         kMaxArguments));
    g->epilogue_out = to_ints(rd.integers(rd.at(gj, gp, "epilogue_out"), gp + ".epilogue_out", 0, no - 1,
                                          kMaxArguments));
    if (g->epilogue_in.size() != g->epilogue->inputs.size() || g->epilogue_out.size() != g->epilogue->outputs.size())
      rd.fail(gp, "epilogue_in and epilogue_out are not one per argument of the epilogue kernel");
  }
  return g;
}

}  // namespace

std::string tune_code_hash(const PtxArtifact& a) {
  std::string launch;
  for (int64_t g : a.launch.grid) launch += std::to_string(g) + ",";
  for (int b : a.launch.block) launch += std::to_string(b) + ",";
  launch += std::to_string(a.launch.shared_bytes) + (a.zero_outputs ? ",z" : "");
  if (a.workspace_bytes > 0) launch += ",w" + std::to_string(a.workspace_bytes);
  if (a.persistent) launch += ",p";
  return fnv1a_hex(a.ptx + "\n" + a.entry + "\n" + launch);
}

std::string tune_code_hash(const GemmArtifact& g) {
  std::string text = gemm_desc_to_json(g.desc).dump() + "\n" + std::to_string(g.a) + "," + std::to_string(g.b) + "," +
                     std::to_string(g.bias) + "," + std::to_string(g.c);
  if (g.epilogue) {
    text += "\nepilogue " + tune_code_hash(*g.epilogue) + " in";
    for (int i : g.epilogue_in) text += " " + std::to_string(i);
    text += " out";
    for (int i : g.epilogue_out) text += " " + std::to_string(i);
  }
  return fnv1a_hex(text);
}

Result<void> write_tune_candidates(const TuneCandidateSet& s, const std::string& dir) {
  std::error_code ec;
  if (dir.empty()) return Diag{dir, {}, "the candidate directory name is empty"};
  fs::path target = fs::absolute(dir, ec).lexically_normal();
  if (ec) return Diag{dir, {}, "cannot resolve the path: " + ec.message()};
  if (target.filename().empty() && target.has_relative_path()) target = target.parent_path();
  if (!target.has_relative_path()) return Diag{dir, {}, "is the root directory: refusing to replace it"};
  const fs::file_status st = fs::symlink_status(target, ec);
  if (fs::exists(st)) {
    if (!fs::is_directory(st)) return Diag{dir, {}, "exists and is not a directory: refusing to replace it"};
    if (!fs::is_empty(target, ec) && !fs::exists(target / kMarker, ec))
      return Diag{dir, {}, "is a directory that tune --emit-candidates did not write: refusing to replace it"};
  }
  fs::path parent = target.parent_path();
  fs::create_directories(parent, ec);
  std::mt19937_64 rng(std::random_device{}());
  fs::path tmp = parent / (target.filename().string() + ".tmp-" + std::to_string(rng() % 1000000000));
  if (!fs::create_directory(tmp, ec)) return Diag{dir, {}, "cannot create " + tmp.string()};
  json j = {{"format", kFormat}, {"version", kCandidatesVersion}, {"arch", s.arch}, {"kernels", json::array()}};
  bool ok = true;
  auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream f(tmp / name, std::ios::binary);
    f << text;
    f.close();
    ok = ok && static_cast<bool>(f);
  };
  for (size_t ki = 0; ki < s.kernels.size(); ++ki) {
    const TuneCandidateKernel& k = s.kernels[ki];
    json kj = {{"key", k.key}, {"name", k.name}, {"group", k.group}, {"params", json::array()},
               {"outputs", json::array()}, {"candidates", json::array()}};
    for (size_t i = 0; i < k.params.size(); ++i)
      kj["params"].push_back({{"dtype", dtype_name(k.params[i].dtype)},
                              {"shape", k.params[i].shape},
                              {"int_bound", i < k.int_bounds.size() ? k.int_bounds[i] : 8}});
    for (const TensorType& t : k.outputs) kj["outputs"].push_back({{"dtype", dtype_name(t.dtype)}, {"shape", t.shape}});
    for (size_t ci = 0; ci < k.candidates.size(); ++ci) {
      const TuneCandidate& c = k.candidates[ci];
      const std::string file = "k" + std::to_string(ki) + "_c" + std::to_string(ci) + ".ptx";
      json cj = {{"config", c.config}, {"code", c.code}};
      if (c.gemm) {
        const GemmArtifact& g = *c.gemm;
        json gj = gemm_desc_to_json(g.desc);
        gj.update({{"a", g.a}, {"b", g.b}, {"bias", g.bias}, {"c", g.c}});
        if (g.epilogue) {
          write(file, g.epilogue->ptx);
          gj["epilogue_kernel"] = ptx_artifact_json(*g.epilogue, file);
          gj["epilogue_in"] = g.epilogue_in;
          gj["epilogue_out"] = g.epilogue_out;
        }
        cj["gemm"] = gj;
      } else {
        write(file, c.artifact.ptx);
        cj.update(ptx_artifact_json(c.artifact, file));
      }
      kj["candidates"].push_back(cj);
    }
    j["kernels"].push_back(kj);
  }
  write("candidates.json", j.dump(1) + "\n");
  write(kMarker, "written by shardfuse tune --emit-candidates\n");
  if (!ok) {
    fs::remove_all(tmp, ec);
    return Diag{dir, {}, "cannot write the candidate files"};
  }
  if (std::optional<std::string> why = swap_in_directory(tmp.string(), target.string())) return Diag{dir, {}, *why};
  return {};
}

Result<TuneCandidateSet> read_tune_candidates(const std::string& dir) {
  const std::string file = (fs::path(dir) / "candidates.json").string();
  Result<json> parsed = read_json_file(file, "tune candidate file");
  if (!parsed) return parsed.error();
  json j = std::move(parsed).value();
  const json_read::Reader rd{file};
  try {
    if (rd.string(j, "", "format") != kFormat) rd.fail("format", "is not \"" + std::string(kFormat) + "\"");
    if (rd.integer(j, "", "version", 0, 1 << 20) != kCandidatesVersion)
      rd.fail("version", "version " + json_read::Reader::shown(j["version"]) + " is not " +
                             std::to_string(kCandidatesVersion) +
                             ", the one this shardfuse reads: emit the candidates again with this version");
    TuneCandidateSet s;
    s.arch = rd.string(j, "", "arch");
    const json& ks = rd.array(rd.at(j, "", "kernels"), "kernels", kMaxKernels);
    for (size_t ki = 0; ki < ks.size(); ++ki) {
      const std::string path = json_read::Reader::item("kernels", ki);
      TuneCandidateKernel k;
      k.key = rd.string(ks[ki], path, "key");
      k.name = rd.string(ks[ki], path, "name");
      k.group = rd.string(ks[ki], path, "group");
      // The group's params and outputs are what the runner allocates and fills: every
      // candidate must take exactly them, and they must fit a GPU.
      auto read_types = [&](const char* key, bool bounds) {
        const std::string lp = path + "." + key;
        const json& list = rd.array(rd.at(ks[ki], path, key), lp, kMaxArguments);
        std::vector<TensorType> types;
        for (size_t i = 0; i < list.size(); ++i) {
          const std::string ip = json_read::Reader::item(lp, i);
          const std::string dn = rd.string(list[i], ip, "dtype");
          std::optional<DType> dt = parse_dtype(dn);
          if (!dt) rd.fail(ip + ".dtype", "\"" + dn + "\" is not a dtype");
          const Shape shape = rd.integers(rd.at(list[i], ip, "shape"), ip + ".shape", 0, int64_t{1} << 40, 8);
          int64_t n = 1;
          for (int64_t e : shape)
            if (__builtin_mul_overflow(n, e, &n) || n > (int64_t{1} << 40)) rd.fail(ip + ".shape", "is too large");
          types.push_back(TensorType{*dt, shape});
          if (bounds) k.int_bounds.push_back(rd.integer(list[i], ip, "int_bound", 1, int64_t{1} << 31));
        }
        return types;
      };
      k.params = read_types("params", true);
      k.outputs = read_types("outputs", false);
      std::vector<KernelArgSpec> params, outs;
      int64_t bytes = 0;
      for (const TensorType& t : k.params) params.push_back({t.dtype, numel(t.shape)});
      for (const TensorType& t : k.outputs) outs.push_back({t.dtype, numel(t.shape)});
      for (const auto* list : {&params, &outs})
        for (const KernelArgSpec& a : *list) bytes += a.bytes();
      if (static_cast<uint64_t>(bytes) > kMaxArgumentBytes)
        rd.fail(path + ".params", "the arguments take " + bytes_str(static_cast<uint64_t>(bytes)) + ", more than the " +
                                     bytes_str(kMaxArgumentBytes) + " a candidate may be measured with");
      const json& cs = rd.array(rd.at(ks[ki], path, "candidates"), path + ".candidates", kMaxCandidates);
      for (size_t ci = 0; ci < cs.size(); ++ci) {
        const std::string cp = json_read::Reader::item(path + ".candidates", ci);
        const json& cj = cs[ci];
        TuneCandidate c;
        c.config = rd.string(cj, cp, "config");
        c.code = rd.string(cj, cp, "code");
        if (cj.contains("gemm")) {
          c.gemm = read_gemm_candidate(rd, dir, cj["gemm"], cp + ".gemm", params, outs);
          if (tune_code_hash(*c.gemm) != c.code)
            rd.fail(cp + ".code", "does not match the GEMM's call and arguments (an edited file?)");
          k.candidates.push_back(std::move(c));
          continue;
        }
        PtxArtifact& a = c.artifact;
        a = read_ptx_artifact(rd, dir, cj, cp);
        if (a.inputs != params) rd.fail(cp + ".inputs", "are not the group's params (their dtypes and sizes)");
        if (a.outputs != outs) rd.fail(cp + ".outputs", "are not the group's outputs (their dtypes and sizes)");
        if (tune_code_hash(a) != c.code)
          rd.fail(cp + ".code", "does not match the PTX and launch shape (an edited file?)");
        k.candidates.push_back(std::move(c));
      }
      s.kernels.push_back(std::move(k));
    }
    return s;
  } catch (const DiagError& e) {
    return e.diag;
  }
}

Result<void> write_tune_measurements(const TuneMeasurements& m, const std::string& dir) {
  json j = {{"format", kMeasuredFormat}, {"version", kVersion}, {"device", m.device},
            {"arch", m.arch},            {"driver_version", m.driver_version}, {"date", m.date},
            {"results", json::array()}};
  const GemmLibraries& l = m.libraries;
  j["libraries"] = l.error.empty() ? json{{"cublas", l.cublas_version}, {"cublaslt", l.cublaslt_version}}
                                   : json{{"error", l.error}};
  if (!l.cublaslt_error.empty()) j["libraries"]["cublaslt_error"] = l.cublaslt_error;
  for (const TuneMeasurement& r : m.results) {
    json rj = {{"kernel", r.kernel}, {"code", r.code}, {"config", r.config}};
    if (r.time)
      rj["time"] = {{"median_us", r.time->median_us}, {"p20_us", r.time->p20_us}, {"p80_us", r.time->p80_us},
                    {"min_us", r.time->min_us},       {"max_us", r.time->max_us}, {"mean_us", r.time->mean_us},
                    {"reps", r.time->reps},           {"outliers", r.time->outliers}};
    else
      rj["error"] = r.error;
    j["results"].push_back(rj);
  }
  const fs::path target = fs::path(dir) / "measurements.json";
  const fs::path tmp = fs::path(dir) / ("measurements.json.tmp-" + std::to_string(std::random_device{}() % 1000000000));
  {
    std::ofstream f(tmp, std::ios::binary);
    f << j.dump(1) << "\n";
    f.close();
    if (!f) {
      std::error_code ec;
      fs::remove(tmp, ec);
      return Diag{target.string(), {}, "cannot write it"};
    }
  }
  std::error_code ec;
  fs::rename(tmp, target, ec);
  if (ec) {
    fs::remove(tmp, ec);
    return Diag{target.string(), {}, "cannot move it into place"};
  }
  return {};
}

Result<TuneMeasurements> read_tune_measurements(const std::string& dir) {
  const std::string file = (fs::path(dir) / "measurements.json").string();
  Result<json> parsed = read_json_file(file, "tune measurement file");
  if (!parsed) return parsed.error();
  json j = std::move(parsed).value();
  const json_read::Reader rd{file};
  try {
    if (rd.string(j, "", "format") != kMeasuredFormat)
      rd.fail("format", "is not \"" + std::string(kMeasuredFormat) + "\"");
    if (rd.integer(j, "", "version", 0, 1 << 20) != kVersion)
      rd.fail("version", "is not " + std::to_string(kVersion) + ", the one this shardfuse reads");
    TuneMeasurements m;
    m.device = rd.string(j, "", "device");
    if (m.device.empty()) rd.fail("device", "is empty");
    m.arch = rd.string(j, "", "arch");
    m.driver_version = static_cast<int>(rd.integer(j, "", "driver_version", 1, 1 << 30));
    m.date = rd.string(j, "", "date");
    // The libraries (files from before they were recorded have none: no library
    // measurement can be in them either).
    if (!j.contains("libraries")) {
      m.libraries.error = "tune --measure recorded no GEMM library";
    } else {
      const json& lj = j["libraries"];
      if (!lj.is_object()) rd.fail("libraries", "is not an object");
      m.libraries.error = rd.string_or(lj, "libraries", "error");
      m.libraries.cublas_version = rd.string_or(lj, "libraries", "cublas");
      m.libraries.cublaslt_version = rd.string_or(lj, "libraries", "cublaslt");
      m.libraries.cublaslt_error = rd.string_or(lj, "libraries", "cublaslt_error");
      if (m.libraries.error.empty() && m.libraries.cublas_version.empty())
        rd.fail("libraries", "names neither cuBLAS's version nor an error");
      if (m.libraries.error.empty() && m.libraries.cublaslt_version.empty() && m.libraries.cublaslt_error.empty())
        rd.fail("libraries", "names neither cuBLASLt's version nor why it is missing");
    }
    const json& rs = rd.array(rd.at(j, "", "results"), "results", kMaxKernels * kMaxCandidates);
    for (size_t i = 0; i < rs.size(); ++i) {
      const std::string p = json_read::Reader::item("results", i);
      TuneMeasurement r;
      r.kernel = rd.string(rs[i], p, "kernel");
      r.code = rd.string(rs[i], p, "code");
      r.config = rd.string(rs[i], p, "config");
      if (rs[i].contains("time")) {
        const json& t = rs[i]["time"];
        const std::string tp = p + ".time";
        auto us = [&](const char* key) {
          const json& v = rd.at(t, tp, key);
          if (!v.is_number() || !(v.get<double>() >= 0) || v.get<double>() > 1e12)
            rd.fail(tp + "." + key, json_read::Reader::shown(v) + " is not a time in microseconds");
          return v.get<double>();
        };
        Measurement x;
        x.median_us = us("median_us");
        x.p20_us = us("p20_us");
        x.p80_us = us("p80_us");
        x.min_us = us("min_us");
        x.max_us = us("max_us");
        x.mean_us = us("mean_us");
        x.reps = static_cast<int>(rd.integer(t, tp, "reps", 1, 1 << 30));
        x.outliers = static_cast<int>(rd.integer(t, tp, "outliers", 0, 1 << 30));
        r.time = x;
      } else {
        r.error = rd.string(rs[i], p, "error");
      }
      m.results.push_back(std::move(r));
    }
    return m;
  } catch (const DiagError& e) {
    return e.diag;
  }
}

namespace {

class RecordingRunner final : public Runner {
 public:
  explicit RecordingRunner(TuneCandidateKernel* k) : k_(k) {}
  Result<Measurement> run(const Artifact& a, const BenchOptions&) override {
    TuneCandidate c;
    if (const auto* g = dynamic_cast<const GemmArtifact*>(&a)) {
      c.config = extern_config_str(std::string(gemm_library_name(g->desc.library)) +
                                   (g->epilogue ? std::string(kGemmEpilogueSuffix) : ""));
      c.code = tune_code_hash(*g);
      c.gemm = std::make_shared<const GemmArtifact>(*g);
    } else if (const auto* p = dynamic_cast<const PtxArtifact*>(&a)) {
      c = TuneCandidate{p->config, tune_code_hash(*p), *p, nullptr};
    } else {
      return Diag{"", {}, "not a candidate tune --measure can run"};
    }
    bool seen = false;
    for (const TuneCandidate& x : k_->candidates) seen = seen || x.code == c.code;
    if (!seen) k_->candidates.push_back(std::move(c));
    return Diag{"", {}, "recorded for tune --measure"};
  }

 private:
  TuneCandidateKernel* k_;
};

class ReplayRunner final : public Runner {
 public:
  ReplayRunner(const TuneMeasurements& m, std::string dir) : dir_(std::move(dir)) {
    for (const TuneMeasurement& r : m.results) by_code_[r.code] = &r;
  }
  Result<Measurement> run(const Artifact& a, const BenchOptions&) override {
    const auto* p = dynamic_cast<const PtxArtifact*>(&a);
    const auto* g = dynamic_cast<const GemmArtifact*>(&a);
    if (!p && !g) return Diag{"", {}, "not a candidate tune --measure runs"};
    auto it = by_code_.find(p ? tune_code_hash(*p) : tune_code_hash(*g));
    if (it == by_code_.end())
      return Diag{"", {}, "not in " + dir_ + "/measurements.json (emit and measure the candidates again)"};
    if (!it->second->time) return Diag{"", {}, "failed on the GPU: " + it->second->error};
    return *it->second->time;
  }

 private:
  std::string dir_;
  std::map<std::string, const TuneMeasurement*> by_code_;
};

}  // namespace

std::unique_ptr<Runner> make_recording_runner(TuneCandidateKernel* k) { return std::make_unique<RecordingRunner>(k); }

std::unique_ptr<Runner> make_replay_runner(const TuneMeasurements& m, const std::string& dir) {
  return std::make_unique<ReplayRunner>(m, dir);
}

Result<TuneMeasurements> measure_tune_candidates(const TuneCandidateSet& s, const BenchOptions& opts,
                                                 const std::function<void(const std::string&)>& progress,
                                                 const TuneMeasurements* done) {
  Result<cuda::DeviceInfo> dev = cuda::device_info(0);
  if (!dev) return dev.error();
  if (dev->arch() != s.arch)
    return Diag{"", {}, "the candidates are for " + s.arch + ", and GPU 0 is " + dev->name + " (" + dev->arch() +
                            "): emit them again with --arch " + dev->arch()};
  TuneMeasurements m;
  m.device = dev->name;
  m.arch = dev->arch();
  m.driver_version = dev->driver_version;
  m.date = now_utc();
  m.libraries = local_gemm_libraries();
  // What an earlier run on this device measured, by kernel and code.
  std::map<std::pair<std::string, std::string>, const TuneMeasurement*> before;
  if (done && done->device == m.device && done->arch == m.arch && done->driver_version == m.driver_version)
    for (const TuneMeasurement& r : done->results) before.emplace(std::pair{r.kernel, r.code}, &r);
  for (const TuneCandidateKernel& k : s.kernels) {
    if (k.candidates.empty()) continue;
    std::unique_ptr<CudaRunner> runner;
    std::vector<KernelArgSpec> outputs;
    for (const TensorType& t : k.outputs) outputs.push_back({t.dtype, numel(t.shape)});
    for (const TuneCandidate& c : k.candidates) {
      if (auto it = before.find({k.key, c.code}); it != before.end()) {
        m.results.push_back(*it->second);
        continue;
      }
      if (!runner) {
        Result<std::unique_ptr<CudaRunner>> r =
            CudaRunner::create(random_tensors(k.params, k.int_bounds, 1), outputs);
        if (!r) return Diag{"", {}, k.name + ": " + r.error().message};
        runner = std::move(r).value();
      }
      TuneMeasurement r{k.key, c.code, c.config, std::nullopt, ""};
      Result<Measurement> t = c.gemm ? runner->run(*c.gemm, opts) : runner->run(c.artifact, opts);
      if (t) r.time = *t;
      else r.error = t.error().message;
      if (progress)
        progress(k.name + " " + c.config + ": " +
                 (t ? std::to_string(t->median_us) + " us" : "failed: " + t.error().message));
      m.results.push_back(std::move(r));
      if (runner->lost()) {
        m.stopped_at_fault = true;
        return m;
      }
    }
  }
  return m;
}

}  // namespace sf
