// run_tool: exit status, captured output, signals, the timeout and programs that
// cannot be run; quote_tool_output's truncation. /bin/sh stands in for the tools.
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <string>
#include <thread>

#include "runtime/core/run_tool.h"

namespace sf {
namespace ir_run_tool_test {

using namespace std::chrono_literals;

TEST(RunTool, CapturesStdoutAndStderrAndTheExitCode) {
  auto run = run_tool({"/bin/sh", "-c", "echo to-stdout; echo to-stderr >&2; exit 3"});
  ASSERT_TRUE(run.ok()) << run.error().str();
  EXPECT_FALSE(run->ok());
  EXPECT_EQ(run->exit_code, 3);
  EXPECT_EQ(run->signal, 0);
  EXPECT_FALSE(run->timed_out);
  EXPECT_EQ(run->output, "to-stdout\nto-stderr\n");
  EXPECT_EQ(run->status_str(), "exited with status 3");
}

TEST(RunTool, SucceedsWithStdinAtEof) {
  auto run = run_tool({"/bin/sh", "-c", "cat"}, 10s);  // would wait forever on a terminal
  ASSERT_TRUE(run.ok()) << run.error().str();
  EXPECT_TRUE(run->ok());
  EXPECT_EQ(run->output, "");
}

TEST(RunTool, ReportsASignal) {
  auto run = run_tool({"/bin/sh", "-c", "kill -SEGV $$"});
  ASSERT_TRUE(run.ok()) << run.error().str();
  EXPECT_FALSE(run->ok());
  EXPECT_EQ(run->signal, 11);
  EXPECT_FALSE(run->timed_out);
  EXPECT_EQ(run->status_str().rfind("killed by signal 11", 0), 0u) << run->status_str();
}

TEST(RunTool, KillsTheToolAndItsChildrenAfterTheTimeout) {
  auto start = std::chrono::steady_clock::now();
  // The shell waits for a child: both must go for the run to end early.
  auto run = run_tool({"/bin/sh", "-c", "sleep 30 & echo $!; wait"}, 300ms);
  auto took = std::chrono::steady_clock::now() - start;
  ASSERT_TRUE(run.ok()) << run.error().str();
  EXPECT_TRUE(run->timed_out);
  EXPECT_FALSE(run->ok());
  EXPECT_EQ(run->signal, 9);
  EXPECT_EQ(run->status_str(), "timed out after 300 ms");
  EXPECT_LT(took, 10s);
  // The shell's child (the output is its pid) was killed too: it is gone, or a
  // zombie until whoever adopted it reaps it.
  const std::string stat = "/proc/" + std::to_string(std::stoi(run->output)) + "/stat";
  auto dead = [&] {
    std::ifstream f(stat);
    std::string line;
    if (!std::getline(f, line)) return true;
    size_t paren = line.rfind(')');
    return paren != std::string::npos && line.substr(paren + 2, 1) == "Z";
  };
  for (int i = 0; i < 200 && !dead(); ++i) std::this_thread::sleep_for(10ms);
  EXPECT_TRUE(dead()) << stat;
}

TEST(RunTool, AProgramThatCannotRunIsADiag) {
  auto run = run_tool({"/nonexistent/tool", "--version"});
  ASSERT_FALSE(run.ok());
  EXPECT_EQ(run.error().message, "cannot run /nonexistent/tool: No such file or directory");
  EXPECT_FALSE(run_tool({}).ok());
}

TEST(RunTool, QuotesTheFirstLines) {
  EXPECT_EQ(quote_tool_output(""), "");
  EXPECT_EQ(quote_tool_output("one\ntwo\n"), "  one\n  two");
  EXPECT_EQ(quote_tool_output("a\nb\nc\nd", 2), "  a\n  b\n  ...");
  EXPECT_EQ(quote_tool_output("a\nb\n", 2), "  a\n  b");
}

}  // namespace ir_run_tool_test
}  // namespace sf
