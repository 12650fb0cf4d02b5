#include "runtime/core/run_tool.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <thread>

extern char** environ;

namespace sf {
namespace {

Diag error(std::string message) { return Diag{"", {}, std::move(message)}; }

std::string errno_str(int e) { return std::strerror(e); }

// Closes a descriptor when it goes out of scope.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

// posix_spawn's attribute and file-action objects, destroyed on every path.
struct SpawnSetup {
  posix_spawn_file_actions_t actions;
  posix_spawnattr_t attr;
  SpawnSetup() {
    posix_spawn_file_actions_init(&actions);
    posix_spawnattr_init(&attr);
  }
  ~SpawnSetup() {
    posix_spawn_file_actions_destroy(&actions);
    posix_spawnattr_destroy(&attr);
  }
  SpawnSetup(const SpawnSetup&) = delete;
  SpawnSetup& operator=(const SpawnSetup&) = delete;
};

// waitpid that retries on EINTR; the status, or -1 with errno set.
pid_t wait_for(pid_t pid, int* status, int flags) {
  pid_t r;
  do {
    r = ::waitpid(pid, status, flags);
  } while (r < 0 && errno == EINTR);
  return r;
}

std::string read_all(int fd) {
  std::string out;
  char buf[65536];
  off_t offset = 0;
  while (out.size() < kMaxToolOutputBytes) {
    size_t want = std::min(sizeof buf, kMaxToolOutputBytes - out.size());
    ssize_t n = ::pread(fd, buf, want, offset);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
    offset += n;
  }
  return out;
}

}  // namespace

std::string ToolRun::status_str() const {
  if (timed_out) {
    long long ms = timeout.count();
    return "timed out after " + (ms % 1000 == 0 ? std::to_string(ms / 1000) + " s" : std::to_string(ms) + " ms");
  }
  if (signal != 0) return "killed by signal " + std::to_string(signal) + " (" + strsignal(signal) + ")";
  return "exited with status " + std::to_string(exit_code);
}

Result<ToolRun> run_tool(const std::vector<std::string>& args, std::chrono::milliseconds timeout) {
  if (args.empty() || args[0].empty()) return error("run_tool: no program to run");
  const std::string& program = args[0];

  // The log: a temporary file unlinked at once, so nothing is left behind whatever
  // happens; the child writes through its copy of the descriptor, we read it back.
  const char* base = std::getenv("TMPDIR");
  std::string tmpl = std::string(base && *base ? base : "/tmp") + "/sf-tool-XXXXXX";
  Fd log(::mkostemp(tmpl.data(), O_CLOEXEC));
  if (log.get() < 0)
    return error("cannot run " + program + ": cannot create a temporary log file " + tmpl + ": " +
                 errno_str(errno));
  ::unlink(tmpl.c_str());

  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);

  SpawnSetup s;
  // dup2 first: should the log be descriptor 0 (stdin closed here), /dev/null then
  // replaces it only after it was copied.
  posix_spawn_file_actions_adddup2(&s.actions, log.get(), 1);
  posix_spawn_file_actions_adddup2(&s.actions, log.get(), 2);
  posix_spawn_file_actions_addopen(&s.actions, 0, "/dev/null", O_RDONLY, 0);
  // Its own process group, so a timeout kills the driver's children too.
  posix_spawnattr_setpgroup(&s.attr, 0);
  sigset_t none, defaults;
  sigemptyset(&none);
  sigemptyset(&defaults);
  sigaddset(&defaults, SIGPIPE);
  posix_spawnattr_setsigmask(&s.attr, &none);
  posix_spawnattr_setsigdefault(&s.attr, &defaults);
  posix_spawnattr_setflags(&s.attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);

  pid_t pid = 0;
  int rc = ::posix_spawn(&pid, program.c_str(), &s.actions, &s.attr, argv.data(), environ);
  if (rc != 0) return error("cannot run " + program + ": " + errno_str(rc));

  ToolRun run;
  run.timeout = timeout;
  int status = 0;
  if (timeout.count() <= 0) {
    if (wait_for(pid, &status, 0) < 0) return error("waiting for " + program + ": " + errno_str(errno));
  } else {
    // Polling with a growing interval (1 ms to 20 ms): portable, and costs nothing
    // next to a tool's own run time.
    auto deadline = std::chrono::steady_clock::now() + timeout;
    auto nap = std::chrono::milliseconds(1);
    for (;;) {
      pid_t r = wait_for(pid, &status, WNOHANG);
      if (r < 0) return error("waiting for " + program + ": " + errno_str(errno));
      if (r == pid) break;
      if (std::chrono::steady_clock::now() >= deadline) {
        ::kill(-pid, SIGKILL);
        if (wait_for(pid, &status, 0) < 0) return error("waiting for " + program + ": " + errno_str(errno));
        // It may have exited on its own just before the kill.
        run.timed_out = WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
        break;
      }
      std::this_thread::sleep_for(nap);
      nap = std::min(nap * 2, std::chrono::milliseconds(20));
    }
  }
  if (WIFEXITED(status)) run.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) run.signal = WTERMSIG(status);
  run.output = read_all(log.get());
  return run;
}

std::string quote_tool_output(const std::string& output, int max_lines) {
  std::string out;
  size_t pos = 0;
  int lines = 0;
  while (pos < output.size()) {
    size_t end = output.find('\n', pos);
    if (end == std::string::npos) end = output.size();
    if (lines == max_lines) {
      out += "  ...\n";
      break;
    }
    out += "  " + output.substr(pos, end - pos) + "\n";
    ++lines;
    pos = end + 1;
  }
  if (!out.empty()) out.pop_back();  // no trailing newline
  return out;
}

}  // namespace sf
