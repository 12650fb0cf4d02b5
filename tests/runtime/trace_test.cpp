// Chrome trace files (runtime/io/trace.h): valid JSON, one process per rank with
// "compute" and "comm" threads, complete events with their args, written whole.
#include <gtest/gtest.h>

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "runtime/io/trace.h"
#include "tests/result_util.h"
#include "tests/tools/cli_util.h"  // TempDir

namespace sf {
namespace runtime_trace_test {

namespace fs = std::filesystem;
using json = nlohmann::json;

json read_json(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return json::parse(ss.str());  // throws (fails the test) when not valid JSON
}

// Process and thread names from the metadata events: pid -> name, (pid, tid) -> name.
struct Names {
  std::map<int, std::string> process;
  std::map<std::pair<int, int>, std::string> thread;
};
Names names_of(const json& trace) {
  Names n;
  for (const json& e : trace.at("traceEvents")) {
    if (e.at("ph") != "M") continue;
    if (e.at("name") == "process_name") n.process[e.at("pid")] = e.at("args").at("name");
    if (e.at("name") == "thread_name") n.thread[{e.at("pid"), e.at("tid")}] = e.at("args").at("name");
  }
  return n;
}

TEST(Trace, ValidJsonWithAProcessPerRankAndBothStreams) {
  TraceWriter w;
  w.add(0, Stream::Compute, "k0_matmul", 0, 10.5, {{"bytes", 1000}, {"flops", 2000}, {"step", 0}}, "kernel");
  w.add(1, Stream::Comm, "all_reduce v10", 10.5, 20, {{"bytes", 800}, {"flops", 0}, {"step", 2}}, "collective");
  w.add(1, Stream::Compute, "k0_matmul", 0, 12, {{"bytes", 1000}, {"flops", 2000}, {"step", 0}});
  w.add_rank(2);  // a rank with nothing on it still gets its tracks
  w.set_metadata("graph", "mlp");
  TempDir d;
  ASSERT_TRUE(succeeded(w.write(d / "t.json")));
  json t = read_json(d / "t.json");

  Names n = names_of(t);
  EXPECT_EQ(n.process, (std::map<int, std::string>{{0, "rank 0"}, {1, "rank 1"}, {2, "rank 2"}}));
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ((n.thread[{r, static_cast<int>(Stream::Compute)}]), "compute");
    EXPECT_EQ((n.thread[{r, static_cast<int>(Stream::Comm)}]), "comm");
  }
  int complete = 0;
  for (const json& e : t.at("traceEvents")) {
    if (e.at("ph") != "X") continue;
    ++complete;
    EXPECT_TRUE(e.contains("ts") && e.contains("dur") && e.contains("pid") && e.contains("tid")) << e.dump();
    EXPECT_TRUE(e.at("args").contains("bytes")) << e.dump();
    EXPECT_TRUE(e.at("args").contains("flops")) << e.dump();
    EXPECT_TRUE(e.at("args").contains("step")) << e.dump();
    if (e.at("name") == "all_reduce v10") {
      EXPECT_EQ(e.at("pid"), 1);
      EXPECT_EQ(e.at("tid"), static_cast<int>(Stream::Comm));
      EXPECT_DOUBLE_EQ(e.at("ts").get<double>(), 10.5);
      EXPECT_DOUBLE_EQ(e.at("dur").get<double>(), 20);
      EXPECT_EQ(e.at("args").at("bytes"), 800);
      EXPECT_EQ(e.at("cat"), "collective");
    }
  }
  EXPECT_EQ(complete, 3);
  EXPECT_EQ(t.at("otherData").at("graph"), "mlp");
  // Nothing but the trace is left in the directory.
  EXPECT_EQ(std::distance(fs::directory_iterator(d.str()), fs::directory_iterator()), 1);
}

TEST(Trace, ThreadsCanAddConcurrently) {
  TraceWriter w;
  std::vector<std::thread> ts;
  for (int r = 0; r < 4; ++r)
    ts.emplace_back([&w, r] {
      for (int i = 0; i < 500; ++i) w.add(r, i % 2 ? Stream::Comm : Stream::Compute, "e", i, 1);
    });
  for (std::thread& t : ts) t.join();
  EXPECT_EQ(w.size(), 2000u);
  json j = w.to_json();
  EXPECT_EQ(names_of(j).process.size(), 4u);
}

TEST(Trace, AFailedWriteLeavesTheOldFileAndSaysWhy) {
  TempDir d;
  TraceWriter w;
  w.add(0, Stream::Compute, "k", 0, 1);
  Result<void> e = w.write(d / "missing-dir/t.json");
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.error().file, d / "missing-dir/t.json");
  EXPECT_NE(e.error().message.find("cannot write the trace"), std::string::npos);

  ASSERT_TRUE(succeeded(w.write(d / "t.json")));
  w.add(0, Stream::Compute, "k2", 1, 1);
  ASSERT_TRUE(succeeded(w.write(d / "t.json")));  // replaced whole
  EXPECT_EQ(read_json(d / "t.json").at("traceEvents").size(), 6u + 2u);  // rank 0's 6 metadata events, 2 events
}

}  // namespace runtime_trace_test
}  // namespace sf
