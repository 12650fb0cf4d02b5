// What the `exec` CLI tests share (exec_cli_test.cpp, exec_tma_cli_test.cpp): compiling
// a graph into a Plan, reading it back, and the launches the fake driver logged.
#pragma once

#include <gtest/gtest.h>

#include <regex>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "runtime/plan/plan.h"
#include "tests/tools/cli_util.h"

namespace sf::exec_test {

// Compiles `graph` into t/<name> for `arch`; the Plan directory.
inline std::string compile_to(const TempDir& t, const std::string& graph, const std::string& name,
                       const std::string& extra = "", const std::string& arch = "sm_90a") {
  std::string dir = t / name;
  CliResult r = shardfuse("compile " + graph + " --no-ptxas --arch " + arch + " -o " + dir + " " + extra);
  EXPECT_EQ(r.code, 0) << r.out;
  return dir;
}

inline Plan read_plan(const std::string& dir) {
  Result<Plan> p = plan_from_json(read_text(dir + "/plan.json"), dir + "/plan.json");
  EXPECT_TRUE(p) << p.error().str();
  return p ? *p : Plan{};
}

#ifdef SF_FAKE_CUDA
struct Launch {
  std::string entry, grid, block;
  int shared = 0, args = 0;
  bool graph = false;
  bool operator<(const Launch& o) const {
    return std::tie(entry, grid, block, shared, args) < std::tie(o.entry, o.grid, o.block, o.shared, o.args);
  }
};

inline std::vector<Launch> launches_in(const std::string& log) {
  std::vector<Launch> out;
  std::istringstream in(log);
  std::string line;
  std::regex re("^launch (\\S+) grid=(\\S+) block=(\\S+) shared=(\\d+) args=(\\d+)(?: cluster=\\d+)?(?: stream=\\S+)?( graph)?");
  std::smatch m;
  while (std::getline(in, line))
    if (std::regex_search(line, m, re))
      out.push_back({m[1], m[2], m[3], std::stoi(m[4]), std::stoi(m[5]), m[6].matched});
  return out;
}

inline std::string fake_env(const std::string& log) {
  return std::string("SHARDFUSE_LIBCUDA=") + SF_FAKE_CUDA + " FAKE_CUDA_LOG=" + log;
}
#endif

}  // namespace sf::exec_test
