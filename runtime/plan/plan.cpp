#include "runtime/plan/plan.h"

#include <sstream>

#include <algorithm>
#include <cstdint>
#include <limits>

#include <nlohmann/json.hpp>

#include "runtime/io/json_reader.h"
#include "runtime/plan/plan_json.h"
#include "runtime/plan/plan_verify.h"

namespace sf {

using nlohmann::json;

nlohmann::json tensor_map_to_json(const PlanTensorMap& m) {
  const size_t r = static_cast<size_t>(m.rank);
  json j = {{"dtype", std::string(dtype_name(m.dtype))},
            {"dims", std::vector<int64_t>(m.dims.begin(), m.dims.begin() + r)},
            {"strides", std::vector<int64_t>(m.strides.begin(), m.strides.begin() + (r - 1))},
            {"box", std::vector<int>(m.box.begin(), m.box.begin() + r)}};
  // An input's map keeps the one key it always had; a TMA store's names its output.
  if (m.output >= 0) j["output"] = m.output;
  else j["input"] = m.input;
  return j;
}

namespace {

json shape_json(const Shape& s) { return json(std::vector<int64_t>(s.begin(), s.end())); }

}  // namespace

std::string plan_to_json(const Plan& p) {
  json j;
  j["version"] = Plan::kVersion;
  j["graph"] = p.graph;
  j["mesh"] = p.mesh;
  j["world"] = p.world;
  j["arch"] = p.arch;
  if (!p.precision.empty()) j["precision"] = p.precision;
  if (!p.graph_digest.empty()) j["graph_digest"] = p.graph_digest;
  if (!p.host_object.empty()) j["host_object"] = p.host_object;
  j["params"] = p.params;
  j["outputs"] = p.outputs;
  j["kernels"] = json::array();
  for (const PlanKernel& k : p.kernels) {
    json kj{{"id", k.id},         {"entry", k.entry},        {"kind", std::string(kernel_kind_name(k.kind))},
            {"ptx", k.ptx_file},  {"grid", k.grid},          {"block", k.block},
            {"shared_bytes", k.shared_bytes}, {"registers", k.registers}, {"spill_bytes", k.spill_bytes},
            {"bytes_read", k.bytes_read}, {"bytes_written", k.bytes_written}, {"flops", k.flops},
            {"ops", k.ops}};
    if (k.zero_outputs) kj["zero_outputs"] = true;
    if (k.persistent) kj["persistent"] = true;
    if (k.cluster > 1) kj["cluster"] = k.cluster;
    if (k.workspace_bytes > 0) kj["workspace_bytes"] = k.workspace_bytes;
    if (!k.config.empty()) kj["config"] = k.config;
    if (!k.config_source.empty()) kj["config_source"] = k.config_source;
    for (const PlanTensorMap& m : k.tensor_maps) kj["tensor_maps"].push_back(tensor_map_to_json(m));
    if (!k.host_symbol.empty()) {
      kj["host"] = {{"symbol", k.host_symbol}, {"config", k.host_config}};
      if (k.host_zero_outputs) kj["host"]["zero_outputs"] = true;
    }
    j["kernels"].push_back(kj);
  }
  j["ranks"] = json::array();
  for (const PlanRank& r : p.ranks) {
    json rj;
    rj["rank"] = r.rank;
    rj["buffers"] = json::array();
    for (const PlanBuffer& b : r.buffers)
      rj["buffers"].push_back({{"name", b.name}, {"dtype", std::string(dtype_name(b.dtype))},
                               {"shape", shape_json(b.shape)},
                               {"bytes", numel(b.shape) * dtype_size(b.dtype)}});
    rj["inputs"] = r.inputs;
    rj["input_placements"] = r.input_specs;
    rj["outputs"] = r.outputs;
    rj["output_placements"] = r.output_specs;
    rj["steps"] = json::array();
    for (const PlanStep& s : r.steps) {
      json sj{{"op", s.op}, {"stream", s.stream}};
      if (!s.kernel.empty()) sj["kernel"] = s.kernel;
      if (!s.in.empty()) sj["in"] = s.in;
      if (!s.out.empty()) sj["out"] = s.out;
      if (s.handle >= 0) sj["handle"] = s.handle;
      if (!s.mesh_dim.empty()) sj["mesh_dim"] = s.mesh_dim;
      if (!s.group.empty()) sj["group"] = s.group;
      if (s.op == "all_gather" || s.op == "reduce_scatter" || s.op == "all_to_all" || s.op == "slice" ||
          s.op == "concat")
        sj["dim"] = s.dim;
      if (s.collective() == CollectiveKind::AllToAll) sj["dim2"] = s.dim2;
      if (!s.reduce_op.empty()) sj["reduce_op"] = s.reduce_op;
      if (!s.sizes.empty()) sj["sizes"] = s.sizes;
      if (!s.sizes2.empty()) sj["sizes2"] = s.sizes2;
      if (!s.offset.empty()) sj["offset"] = s.offset;
      if (s.op == "partialize") sj["keep"] = s.keep;
      if (s.op == "gemm") {
        sj["name"] = s.gemm.name;
        sj.update(gemm_desc_to_json(s.gemm.desc));
      }
      rj["steps"].push_back(sj);
    }
    j["ranks"].push_back(rj);
  }
  return j.dump(1) + "\n";
}

namespace {

// Bounds on what plan.json may ask for (docs/plan.md, "Limits"): far above any Plan
// `compile` writes, low enough that no count below overflows int64 or int.
constexpr int64_t kIntMax = std::numeric_limits<int>::max();
constexpr size_t kMaxEntries = size_t{1} << 24;  // per array: ranks, steps, buffers, ids
constexpr size_t kMaxRank = 64;                 // tensor dims of a buffer, sizes of a step

// plan.json's reader (runtime/io/json_reader.h) with the Plan's own checks.
struct Reader : json_read::Reader {
  // Indices into the rank's buffers.
  std::vector<int> buffer_ids(const json& v, const std::string& path, int nbuf) const {
    std::vector<int> out;
    for (size_t i = 0; i < array(v, path, kMaxEntries).size(); ++i) {
      const int64_t b = integer(v[i], item(path, i), INT32_MIN, std::numeric_limits<int>::max());
      if (b < 0 || b >= nbuf)
        fail(item(path, i), "buffer " + std::to_string(b) + " does not exist (the rank has " + std::to_string(nbuf) +
                                " buffer(s))");
      out.push_back(static_cast<int>(b));
    }
    return out;
  }
};

// A kernel's tensor map: rank 2 to 5; extents in 1..2^32; strides positive multiples
// of 16 bytes below 2^40; a box of 1..256 elements a dim whose innermost side is at most
// 128 bytes (the 128-byte swizzle). Whether it lies inside its buffer is verify_plan's.
PlanTensorMap read_tensor_map(const json_read::Reader& rd, const json& mj, const std::string& path) {
  PlanTensorMap m;
  // Over an input ("input") or, a TMA store's, an output ("output"): exactly one.
  if (mj.contains("output")) {
    if (mj.contains("input")) rd.fail(path, "names both an input and an output (a map is over one buffer)");
    m.output = static_cast<int>(rd.integer(mj, path, "output", 0, kMaxEntries));
  } else {
    m.input = static_cast<int>(rd.integer(mj, path, "input", 0, kMaxEntries));
  }
  const std::string dt = rd.string(mj, path, "dtype");
  std::optional<DType> t = parse_dtype(dt);
  if (!t || (*t != DType::BF16 && *t != DType::F16 && *t != DType::F32))
    rd.fail(path + ".dtype", "\"" + dt + "\" is not a tensor map dtype (bf16, f16 or f32)");
  m.dtype = *t;
  constexpr size_t kRank = kPlanTensorMapRank;
  std::vector<int64_t> dims = rd.integers(rd.at(mj, path, "dims"), path + ".dims", 1, int64_t{1} << 32, kRank);
  if (dims.size() < 2) rd.fail(path + ".dims", "needs 2 to " + std::to_string(kRank) + " extents");
  m.rank = static_cast<int>(dims.size());
  std::vector<int64_t> strides =
      rd.integers(rd.at(mj, path, "strides"), path + ".strides", 16, (int64_t{1} << 40) - 1, kRank - 1);
  if (strides.size() + 1 != dims.size()) rd.fail(path + ".strides", "needs one stride per dim after the first");
  std::vector<int64_t> box = rd.integers(rd.at(mj, path, "box"), path + ".box", 1, 256, kRank);
  if (box.size() != dims.size()) rd.fail(path + ".box", "needs one extent per dim");
  for (size_t i = 0; i < kRank; ++i) {
    m.dims[i] = i < dims.size() ? dims[i] : 1;
    m.box[i] = i < box.size() ? static_cast<int>(box[i]) : 1;
  }
  for (size_t i = 0; i + 1 < kRank; ++i) {
    m.strides[i] = i < strides.size() ? strides[i] : 0;
    if (i < strides.size() && strides[i] % 16 != 0)
      rd.fail(Reader::item(path + ".strides", i), std::to_string(strides[i]) + " is not a multiple of 16 bytes");
  }
  if (int64_t{m.box[0]} * dtype_size(m.dtype) > 128)
    rd.fail(path + ".box", "the innermost box side is " + std::to_string(int64_t{m.box[0]} * dtype_size(m.dtype)) +
                               " bytes, more than the 128-byte swizzle's 128");
  return m;
}

// A gemm step's call (docs/plan.md): every field required, numbers in range, the
// library, dtype and epilogue known. Whether it fits its buffers is verify_plan's.
PlanGemm read_gemm(const Reader& rd, const json& sj, const std::string& spath) {
  PlanGemm g;
  g.name = rd.string_or(sj, spath, "name");
  g.desc = read_plan_gemm_desc(rd, sj, spath);
  return g;
}

}  // namespace

PlanTensorMap read_plan_tensor_map(const json_read::Reader& rd, const nlohmann::json& mj, const std::string& path) {
  return read_tensor_map(rd, mj, path);
}

nlohmann::json gemm_desc_to_json(const GemmDesc& d) {
  json sj = {{"library", std::string(gemm_library_name(d.library))}, {"dtype", std::string(dtype_name(d.dtype))}};
  for (auto [key, v] : {std::pair<const char*, int64_t>{"m", d.m}, {"n", d.n}, {"k", d.k}, {"batch", d.batch},
                        {"lda", d.lda}, {"ldb", d.ldb}, {"ldc", d.ldc}, {"stride_a", d.stride_a},
                        {"stride_b", d.stride_b}, {"stride_c", d.stride_c}})
    sj[key] = v;
  sj["trans_a"] = d.trans_a;
  sj["trans_b"] = d.trans_b;
  sj["epilogue"] = std::string(gemm_epilogue_name(d.epilogue));
  if (d.tf32) sj["tf32"] = true;
  return sj;
}

GemmDesc read_plan_gemm_desc(const json_read::Reader& rd, const json& sj, const std::string& spath) {
  GemmDesc d;
  const std::string lib = rd.string(sj, spath, "library");
  std::optional<GemmLibrary> l = parse_gemm_library(lib);
  if (!l) rd.fail(spath + ".library", "unknown library \"" + lib + "\" (cublaslt or cublas)");
  d.library = *l;
  const std::string dt = rd.string(sj, spath, "dtype");
  std::optional<DType> t = parse_dtype(dt);
  if (!t) rd.fail(spath + ".dtype", "unknown dtype \"" + dt + "\"");
  d.dtype = *t;
  const std::string epi = rd.string(sj, spath, "epilogue");
  std::optional<GemmEpilogue> e = parse_gemm_epilogue(epi);
  if (!e)
    rd.fail(spath + ".epilogue",
            "unknown epilogue \"" + epi + "\" (none, bias, relu, bias_relu, gelu_tanh, bias_gelu_tanh)");
  d.epilogue = *e;
  d.m = rd.integer(sj, spath, "m", 1, kMaxGemmDim);
  d.n = rd.integer(sj, spath, "n", 1, kMaxGemmDim);
  d.k = rd.integer(sj, spath, "k", 1, kMaxGemmDim);
  d.batch = rd.integer(sj, spath, "batch", 1, kMaxGemmDim);
  d.lda = rd.integer(sj, spath, "lda", 1, kMaxPlanElements);
  d.ldb = rd.integer(sj, spath, "ldb", 1, kMaxPlanElements);
  d.ldc = rd.integer(sj, spath, "ldc", 1, kMaxPlanElements);
  d.stride_a = rd.integer(sj, spath, "stride_a", 0, kMaxPlanElements);
  d.stride_b = rd.integer(sj, spath, "stride_b", 0, kMaxPlanElements);
  d.stride_c = rd.integer(sj, spath, "stride_c", 0, kMaxPlanElements);
  for (const char* key : {"trans_a", "trans_b"})
    if (!sj.contains(key)) rd.fail(spath, std::string("missing \"") + key + "\"");
  d.trans_a = rd.boolean_or(sj, spath, "trans_a", false);
  d.trans_b = rd.boolean_or(sj, spath, "trans_b", false);
  d.tf32 = rd.boolean_or(sj, spath, "tf32", false);
  return d;
}

Result<Plan> plan_from_json(const std::string& text, const std::string& file) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::parse_error& e) {
    // e.byte is 1-based, one past the offending character; give its line:col.
    size_t at = e.byte == 0 ? 0 : std::min(static_cast<size_t>(e.byte - 1), text.size());
    SourceLoc loc{1, 1};
    for (size_t i = 0; i < at; ++i) {
      if (text[i] == '\n') {
        ++loc.line;
        loc.col = 1;
      } else {
        ++loc.col;
      }
    }
    std::string what = e.what();
    // "[json.exception.parse_error.101] parse error at line 4, column 1: <why>": keep <why>.
    if (size_t colon = what.find(": "); colon != std::string::npos) what = what.substr(colon + 2);
    return Diag{file, loc, "not valid JSON: " + what};
  }
  const Reader rd{{file}};
  try {
    if (!j.is_object()) rd.fail("(top level)", "expected an object");
    if (!j.contains("version") || j["version"] != Plan::kVersion)
      return Diag{file, {}, "plan version " + (j.contains("version") ? Reader::shown(j["version"]) : std::string("missing")) +
                                ", this shardfuse reads version " + std::to_string(Plan::kVersion) +
                                " (compile the graph again with this shardfuse)"};
    Plan p;
    p.graph = rd.string(j, "", "graph");
    p.mesh = rd.string(j, "", "mesh");
    p.world = static_cast<int>(rd.integer(j, "", "world", 1, kMaxPlanWorld));
    p.arch = rd.string(j, "", "arch");
    p.precision = rd.string_or(j, "", "precision");
    if (!p.precision.empty() && p.precision != "fused" && p.precision != "eager")
      rd.fail("precision", "\"" + p.precision + "\" is not \"fused\" or \"eager\"");
    p.graph_digest = rd.string_or(j, "", "graph_digest");
    p.host_object = rd.string_or(j, "", "host_object");
    p.params = rd.strings(rd.at(j, "", "params"), "params", kMaxEntries);
    p.outputs = rd.strings(rd.at(j, "", "outputs"), "outputs", kMaxEntries);
    const json& kernels = rd.array(rd.at(j, "", "kernels"), "kernels", kMaxEntries);
    for (size_t ki = 0; ki < kernels.size(); ++ki) {
      const json& kj = kernels[ki];
      const std::string path = Reader::item("kernels", ki);
      PlanKernel k;
      k.id = rd.string(kj, path, "id");
      k.entry = rd.string(kj, path, "entry");
      const std::string kind = rd.string(kj, path, "kind");
      std::optional<KernelKind> parsed_kind = parse_kernel_kind(kind);
      if (!parsed_kind) rd.fail(path + ".kind", "unknown kernel kind \"" + kind + "\" (pointwise, reduction, matmul or gather)");
      k.kind = *parsed_kind;
      k.ptx_file = rd.string(kj, path, "ptx");
      std::vector<int64_t> grid = rd.integers(rd.at(kj, path, "grid"), path + ".grid", 0, kIntMax, 3);
      std::vector<int64_t> block = rd.integers(rd.at(kj, path, "block"), path + ".block", 1, kIntMax, 3);
      if (grid.size() != 3) rd.fail(path + ".grid", "needs 3 entries (x, y, z)");
      if (block.size() != 3) rd.fail(path + ".block", "needs 3 entries (x, y, z)");
      for (size_t d = 0; d < 3; ++d) {
        k.grid[d] = grid[d];
        k.block[d] = static_cast<int>(block[d]);
      }
      k.shared_bytes = static_cast<int>(rd.integer(kj, path, "shared_bytes", 0, kIntMax));
      k.registers = static_cast<int>(rd.integer_or(kj, path, "registers", -1, kIntMax, -1));
      k.spill_bytes = rd.integer_or(kj, path, "spill_bytes", -1, INT64_MAX, -1);
      k.bytes_read = rd.integer_or(kj, path, "bytes_read", 0, INT64_MAX, 0);
      k.bytes_written = rd.integer_or(kj, path, "bytes_written", 0, INT64_MAX, 0);
      k.flops = rd.integer_or(kj, path, "flops", 0, INT64_MAX, 0);
      if (kj.contains("ops")) k.ops = rd.strings(kj.at("ops"), path + ".ops", kMaxEntries);
      k.zero_outputs = rd.boolean_or(kj, path, "zero_outputs", false);
      k.persistent = rd.boolean_or(kj, path, "persistent", false);
      k.cluster = static_cast<int>(rd.integer_or(kj, path, "cluster", 1, 8, 1));  // CUDA's portable cluster size
      // As much as the largest buffer a Plan may hold (kMaxPlanElements 8-byte
      // elements), so a hostile value cannot ask for more.
      k.workspace_bytes = rd.integer_or(kj, path, "workspace_bytes", 0, kMaxPlanElements * 8, 0);
      k.config = rd.string_or(kj, path, "config");
      k.config_source = rd.string_or(kj, path, "config_source");
      if (kj.contains("tensor_maps")) {
        const json& maps = rd.array(kj.at("tensor_maps"), path + ".tensor_maps", 8);
        for (size_t mi = 0; mi < maps.size(); ++mi) k.tensor_maps.push_back(read_tensor_map(rd, maps[mi], Reader::item(path + ".tensor_maps", mi)));
      }
      if (kj.contains("host")) {
        const json& h = rd.object(kj.at("host"), path + ".host");
        k.host_symbol = rd.string(h, path + ".host", "symbol");
        if (k.host_symbol.empty()) rd.fail(path + ".host.symbol", "must not be empty");
        k.host_config = rd.string_or(h, path + ".host", "config");
        k.host_zero_outputs = rd.boolean_or(h, path + ".host", "zero_outputs", false);
      }
      p.kernels.push_back(std::move(k));
    }
    const json& ranks = rd.array(rd.at(j, "", "ranks"), "ranks", kMaxEntries);
    for (size_t ri = 0; ri < ranks.size(); ++ri) {
      const json& rj = ranks[ri];
      const std::string path = Reader::item("ranks", ri);
      PlanRank r;
      r.rank = static_cast<int>(rd.integer(rj, path, "rank", 0, kIntMax));
      const json& buffers = rd.array(rd.at(rj, path, "buffers"), path + ".buffers", kMaxEntries);
      for (size_t bi = 0; bi < buffers.size(); ++bi) {
        const json& bj = buffers[bi];
        const std::string bpath = Reader::item(path + ".buffers", bi);
        PlanBuffer b;
        b.name = rd.string(bj, bpath, "name");
        const std::string dt = rd.string(bj, bpath, "dtype");
        auto parsed = parse_dtype(dt);
        if (!parsed) rd.fail(bpath + ".dtype", "unknown dtype \"" + dt + "\"");
        b.dtype = *parsed;
        b.shape = rd.integers(rd.at(bj, bpath, "shape"), bpath + ".shape", 0, kMaxPlanElements, kMaxRank);
        r.buffers.push_back(std::move(b));
      }
      const int nbuf = static_cast<int>(r.buffers.size());
      r.inputs = rd.buffer_ids(rd.at(rj, path, "inputs"), path + ".inputs", nbuf);
      r.input_specs = rd.strings(rd.at(rj, path, "input_placements"), path + ".input_placements", kMaxEntries);
      r.outputs = rd.buffer_ids(rd.at(rj, path, "outputs"), path + ".outputs", nbuf);
      r.output_specs = rd.strings(rd.at(rj, path, "output_placements"), path + ".output_placements", kMaxEntries);
      const json& steps = rd.array(rd.at(rj, path, "steps"), path + ".steps", kMaxEntries);
      for (size_t si = 0; si < steps.size(); ++si) {
        const json& sj = steps[si];
        const std::string spath = Reader::item(path + ".steps", si);
        PlanStep s;
        s.op = rd.string(sj, spath, "op");
        s.stream = rd.string(sj, spath, "stream");
        s.kernel = rd.string_or(sj, spath, "kernel");
        if (sj.contains("in")) s.in = rd.buffer_ids(sj.at("in"), spath + ".in", nbuf);
        if (sj.contains("out")) s.out = rd.buffer_ids(sj.at("out"), spath + ".out", nbuf);
        s.handle = static_cast<int>(rd.integer_or(sj, spath, "handle", -1, kIntMax, -1));
        s.mesh_dim = rd.string_or(sj, spath, "mesh_dim");
        s.group = rd.ints_or(sj, spath, "group", INT32_MIN, kIntMax, kMaxPlanWorld);
        s.dim = static_cast<int>(rd.integer_or(sj, spath, "dim", -static_cast<int64_t>(kMaxRank), kMaxRank, 0));
        s.dim2 = static_cast<int>(rd.integer_or(sj, spath, "dim2", -static_cast<int64_t>(kMaxRank), kMaxRank, 0));
        s.reduce_op = rd.string_or(sj, spath, "reduce_op");
        s.sizes = rd.integers_or(sj, spath, "sizes", INT64_MIN, INT64_MAX, kMaxPlanWorld);
        s.sizes2 = rd.integers_or(sj, spath, "sizes2", INT64_MIN, INT64_MAX, kMaxPlanWorld);
        s.offset = rd.integers_or(sj, spath, "offset", INT64_MIN, INT64_MAX, kMaxRank);
        s.keep = rd.boolean_or(sj, spath, "keep", true);
        if (s.op == "gemm") s.gemm = read_gemm(rd, sj, spath);
        r.steps.push_back(std::move(s));
      }
      p.ranks.push_back(std::move(r));
    }
    SF_TRY(verify_plan(p, file));
    return p;
  } catch (const DiagError& e) {
    return e.diag;
  } catch (const json::exception& e) {
    return Diag{file, {}, std::string("malformed plan: ") + e.what()};
  }
}

Result<Mesh> parse_plan_mesh(const std::string& s, const std::string& file) {
  Mesh m;
  std::istringstream in(s);
  std::string tok;
  while (in >> tok) {
    size_t eq = tok.find('=');
    int64_t n = 0;
    try {
      if (eq == std::string::npos || eq == 0) throw std::invalid_argument(tok);
      size_t used = 0;
      n = std::stoll(tok.substr(eq + 1), &used);
      if (used != tok.size() - eq - 1 || n < 1) throw std::invalid_argument(tok);
    } catch (const std::exception&) {
      return Diag{file, {}, "\"mesh\": \"" + s + "\" is not a list of name=size"};
    }
    m.dims.push_back({tok.substr(0, eq), n});
  }
  return m;
}

}  // namespace sf
