// Running an external tool (ptxas, the C compiler driver as a linker) and capturing
// what it prints. Here rather than in autotune/ or codegen/llvm/ because both use it
// and neither may include the other (autotune/ must build without LLVM); it needs
// nothing but POSIX.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "runtime/core/diag.h"

namespace sf {

// How a tool run ended, and everything it wrote to stdout and stderr (interleaved,
// as `>log 2>&1` would; the first kMaxToolOutputBytes of it).
struct ToolRun {
  int exit_code = -1;      // when it exited; -1 when it was killed
  int signal = 0;          // the signal that killed it, 0 when it exited
  bool timed_out = false;  // killed (SIGKILL) because it ran past `timeout`
  std::chrono::milliseconds timeout{0};  // the limit it ran under (0: none)
  std::string output;

  bool ok() const { return exit_code == 0; }
  // "exited with status 1", "killed by signal 11", "timed out after 60 s".
  std::string status_str() const;
};

inline constexpr size_t kMaxToolOutputBytes = size_t{1} << 20;

// Runs argv (no shell; argv[0] is the program's path, PATH is not searched) with
// stdin from /dev/null and stdout and stderr into an unlinked temporary file in
// $TMPDIR (or /tmp), then waits for it. A timeout > 0 bounds the wait: past it the
// tool's whole process group (it gets one of its own, so a driver's children such
// as `ld` go too) is killed with SIGKILL and reaped. The tool starts with an empty
// signal mask and SIGPIPE at its default. A Diag only when it cannot be run at all
// (no such program, no temporary file); a tool that fails is a ToolRun that is not
// ok(). Thread-safe.
Result<ToolRun> run_tool(const std::vector<std::string>& argv,
                         std::chrono::milliseconds timeout = std::chrono::milliseconds(0));

// The first `max_lines` lines of a tool's output, each indented by two spaces, with
// "  ..." when there were more; "" for no output. For Diags that quote a tool.
std::string quote_tool_output(const std::string& output, int max_lines = 20);

}  // namespace sf
