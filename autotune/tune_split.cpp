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
#include "runtime/cuda_driver.h"
#include "runtime/json_reader.h"
#include "runtime/plan_json.h"

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

// A file name the directory may hold: no separators, no "..", printable.
bool plain_name(const std::string& n) {
  if (n.empty() || n.size() > 128 || n == "." || n == "..") return false;
  for (char c : n)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.')) return false;
  return true;
}

}  // namespace

std::string tune_code_hash(const PtxArtifact& a) {
  std::string launch;
  for (int64_t g : a.launch.grid) launch += std::to_string(g) + ",";
  for (int b : a.launch.block) launch += std::to_string(b) + ",";
  launch += std::to_string(a.launch.shared_bytes) + (a.zero_outputs ? ",z" : "");
  return fnv1a_hex(a.ptx + "\n" + a.entry + "\n" + launch);
}

std::optional<Diag> write_tune_candidates(const TuneCandidateSet& s, const std::string& dir) {
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
      const PtxArtifact& a = c.artifact;
      const std::string file = "k" + std::to_string(ki) + "_c" + std::to_string(ci) + ".ptx";
      write(file, a.ptx);
      json cj = {{"config", c.config},
                 {"code", c.code},
                 {"ptx", file},
                 {"entry", a.entry},
                 {"grid", a.launch.grid},
                 {"block", a.launch.block},
                 {"shared_bytes", a.launch.shared_bytes},
                 {"zero_outputs", a.zero_outputs},
                 {"inputs", specs_json(a.inputs)},
                 {"outputs", specs_json(a.outputs)},
                 {"tensor_maps", json::array()}};
      for (const PlanTensorMap& m : a.tensor_maps) cj["tensor_maps"].push_back(tensor_map_to_json(m));
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
  return std::nullopt;
}

Result<TuneCandidateSet> read_tune_candidates(const std::string& dir) {
  const std::string file = (fs::path(dir) / "candidates.json").string();
  Result<std::string> text = read_regular_file(file, kMaxJsonBytes, "tune candidate file");
  if (!text) return text.error();
  json j = json::parse(*text, nullptr, false);
  if (j.is_discarded()) return Diag{file, {}, "not valid JSON"};
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
        const std::string ptx = rd.string(cj, cp, "ptx");
        if (!plain_name(ptx)) rd.fail(cp + ".ptx", "\"" + ptx + "\" is not a file name inside the directory");
        Result<std::string> code = read_regular_file((fs::path(dir) / ptx).string(), kMaxPtxBytes, "PTX file");
        if (!code) rd.fail(cp + ".ptx", code.error().message);
        PtxArtifact& a = c.artifact;
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
        a.inputs = read_specs(rd, rd.at(cj, cp, "inputs"), cp + ".inputs");
        a.outputs = read_specs(rd, rd.at(cj, cp, "outputs"), cp + ".outputs");
        const json& maps = rd.array(rd.at(cj, cp, "tensor_maps"), cp + ".tensor_maps", 8);
        for (size_t mi = 0; mi < maps.size(); ++mi) {
          PlanTensorMap m = read_plan_tensor_map(rd, maps[mi], json_read::Reader::item(cp + ".tensor_maps", mi));
          if (m.input >= static_cast<int>(a.inputs.size()))
            rd.fail(json_read::Reader::item(cp + ".tensor_maps", mi) + ".input", "no such input");
          a.tensor_maps.push_back(m);
        }
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

std::optional<Diag> write_tune_measurements(const TuneMeasurements& m, const std::string& dir) {
  json j = {{"format", kMeasuredFormat}, {"version", kVersion}, {"device", m.device},
            {"arch", m.arch},            {"driver_version", m.driver_version}, {"date", m.date},
            {"results", json::array()}};
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
  return std::nullopt;
}

Result<TuneMeasurements> read_tune_measurements(const std::string& dir) {
  const std::string file = (fs::path(dir) / "measurements.json").string();
  Result<std::string> text = read_regular_file(file, kMaxJsonBytes, "tune measurement file");
  if (!text) return text.error();
  json j = json::parse(*text, nullptr, false);
  if (j.is_discarded()) return Diag{file, {}, "not valid JSON"};
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
  // What an earlier run on this device measured, by kernel and code.
  std::map<std::pair<std::string, std::string>, const TuneMeasurement*> before;
  if (done && done->device == m.device && done->arch == m.arch && done->driver_version == m.driver_version)
    for (const TuneMeasurement& r : done->results) before.emplace(std::pair{r.kernel, r.code}, &r);
  for (const TuneCandidateKernel& k : s.kernels) {
    if (k.candidates.empty()) continue;
    std::unique_ptr<CudaRunner> runner;
    for (const TuneCandidate& c : k.candidates) {
      if (auto it = before.find({k.key, c.code}); it != before.end()) {
        m.results.push_back(*it->second);
        continue;
      }
      if (!runner) {
        Result<std::unique_ptr<CudaRunner>> r =
            CudaRunner::create(random_tensors(k.params, k.int_bounds, 1), k.candidates[0].artifact.outputs);
        if (!r) return Diag{"", {}, k.name + ": " + r.error().message};
        runner = std::move(r).value();
      }
      TuneMeasurement r{k.key, c.code, c.config, std::nullopt, ""};
      Result<Measurement> t = runner->run(c.artifact, opts);
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
