#include "runtime/plan.h"

#include <algorithm>

#include <nlohmann/json.hpp>

namespace sf {

using nlohmann::json;

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
  j["params"] = p.params;
  j["outputs"] = p.outputs;
  j["kernels"] = json::array();
  for (const PlanKernel& k : p.kernels) {
    json kj{{"id", k.id},         {"entry", k.entry},        {"kind", k.kind},
            {"ptx", k.ptx_file},  {"grid", k.grid},          {"block", k.block},
            {"shared_bytes", k.shared_bytes}, {"registers", k.registers}, {"spill_bytes", k.spill_bytes},
            {"bytes_read", k.bytes_read}, {"bytes_written", k.bytes_written}, {"flops", k.flops},
            {"ops", k.ops}};
    if (k.zero_outputs) kj["zero_outputs"] = true;
    if (!k.config.empty()) kj["config"] = k.config;
    if (!k.config_source.empty()) kj["config_source"] = k.config_source;
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
      if (s.op == "all_to_all") sj["dim2"] = s.dim2;
      if (!s.reduce_op.empty()) sj["reduce_op"] = s.reduce_op;
      if (!s.sizes.empty()) sj["sizes"] = s.sizes;
      if (!s.sizes2.empty()) sj["sizes2"] = s.sizes2;
      if (!s.offset.empty()) sj["offset"] = s.offset;
      if (s.op == "partialize") sj["keep"] = s.keep;
      rj["steps"].push_back(sj);
    }
    j["ranks"].push_back(rj);
  }
  return j.dump(1) + "\n";
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
  auto fail = [&](const std::string& m) { return Diag{file, {}, m}; };
  try {
    if (!j.contains("version") || j["version"] != Plan::kVersion)
      return fail("plan version " + (j.contains("version") ? j["version"].dump() : std::string("missing")) +
                  ", this shardfuse reads version " + std::to_string(Plan::kVersion));
    Plan p;
    p.graph = j.at("graph").get<std::string>();
    p.mesh = j.at("mesh").get<std::string>();
    p.world = j.at("world").get<int>();
    p.arch = j.at("arch").get<std::string>();
    p.params = j.at("params").get<std::vector<std::string>>();
    p.outputs = j.at("outputs").get<std::vector<std::string>>();
    for (const json& kj : j.at("kernels")) {
      PlanKernel k;
      k.id = kj.at("id");
      k.entry = kj.at("entry");
      k.kind = kj.at("kind");
      k.ptx_file = kj.at("ptx");
      k.grid = kj.at("grid");
      k.block = kj.at("block");
      k.shared_bytes = kj.at("shared_bytes");
      k.registers = kj.value("registers", -1);
      k.spill_bytes = kj.value("spill_bytes", int64_t{-1});
      k.bytes_read = kj.value("bytes_read", int64_t{0});
      k.bytes_written = kj.value("bytes_written", int64_t{0});
      k.flops = kj.value("flops", int64_t{0});
      k.ops = kj.value("ops", std::vector<std::string>{});
      k.zero_outputs = kj.value("zero_outputs", false);
      k.config = kj.value("config", std::string());
      k.config_source = kj.value("config_source", std::string());
      p.kernels.push_back(std::move(k));
    }
    for (const json& rj : j.at("ranks")) {
      PlanRank r;
      r.rank = rj.at("rank");
      for (const json& bj : rj.at("buffers")) {
        PlanBuffer b;
        b.name = bj.at("name");
        auto dt = parse_dtype(bj.at("dtype").get<std::string>());
        if (!dt) return fail("rank " + std::to_string(r.rank) + ": unknown dtype " + bj.at("dtype").dump());
        b.dtype = *dt;
        b.shape = bj.at("shape").get<Shape>();
        r.buffers.push_back(std::move(b));
      }
      r.inputs = rj.at("inputs").get<std::vector<int>>();
      r.input_specs = rj.at("input_placements").get<std::vector<std::string>>();
      r.outputs = rj.at("outputs").get<std::vector<int>>();
      r.output_specs = rj.at("output_placements").get<std::vector<std::string>>();
      auto buf_ok = [&](int b) { return b >= 0 && b < static_cast<int>(r.buffers.size()); };
      for (int b : r.inputs)
        if (!buf_ok(b)) return fail("rank " + std::to_string(r.rank) + ": input buffer " + std::to_string(b) + " out of range");
      for (int b : r.outputs)
        if (!buf_ok(b)) return fail("rank " + std::to_string(r.rank) + ": output buffer " + std::to_string(b) + " out of range");
      for (const json& sj : rj.at("steps")) {
        PlanStep s;
        s.op = sj.at("op");
        s.stream = sj.at("stream");
        s.kernel = sj.value("kernel", std::string());
        s.in = sj.value("in", std::vector<int>{});
        s.out = sj.value("out", std::vector<int>{});
        s.handle = sj.value("handle", -1);
        s.mesh_dim = sj.value("mesh_dim", std::string());
        s.group = sj.value("group", std::vector<int>{});
        s.dim = sj.value("dim", 0);
        s.dim2 = sj.value("dim2", 0);
        s.reduce_op = sj.value("reduce_op", std::string());
        s.sizes = sj.value("sizes", std::vector<int64_t>{});
        s.sizes2 = sj.value("sizes2", std::vector<int64_t>{});
        s.offset = sj.value("offset", std::vector<int64_t>{});
        s.keep = sj.value("keep", true);
        for (int b : s.in)
          if (!buf_ok(b)) return fail("rank " + std::to_string(r.rank) + ": step " + s.op + " reads buffer " + std::to_string(b) + ", out of range");
        for (int b : s.out)
          if (!buf_ok(b)) return fail("rank " + std::to_string(r.rank) + ": step " + s.op + " writes buffer " + std::to_string(b) + ", out of range");
        const std::string at = "rank " + std::to_string(r.rank) + ", step " + std::to_string(r.steps.size()) + " (" + s.op + ")";
        const bool collective = s.op == "all_gather" || s.op == "reduce_scatter" || s.op == "all_reduce" || s.op == "all_to_all";
        if (s.op != "kernel" && !collective && s.op != "wait" && s.op != "slice" && s.op != "partialize" && s.op != "concat")
          return fail(at + ": unknown op");
        if ((collective || s.op == "slice" || s.op == "partialize") && s.in.size() != 1)
          return fail(at + ": needs exactly one \"in\" buffer");
        if ((s.op == "wait" || s.op == "slice" || s.op == "partialize" || s.op == "concat") && s.out.size() != 1)
          return fail(at + ": needs exactly one \"out\" buffer");
        if (s.op == "concat" && s.in.empty()) return fail(at + ": needs its parts as \"in\"");
        if ((collective || s.op == "wait") && s.handle < 0) return fail(at + ": needs a \"handle\"");
        if (s.op == "kernel") {
          bool found = false;
          for (const PlanKernel& k : p.kernels) found |= k.id == s.kernel;
          if (!found) return fail("rank " + std::to_string(r.rank) + ": unknown kernel '" + s.kernel + "'");
        }
        r.steps.push_back(std::move(s));
      }
      p.ranks.push_back(std::move(r));
    }
    if (static_cast<int>(p.ranks.size()) != p.world)
      return fail(std::to_string(p.ranks.size()) + " ranks for a world of " + std::to_string(p.world));
    return p;
  } catch (const json::exception& e) {
    return fail(std::string("malformed plan: ") + e.what());
  }
}

}  // namespace sf
