// Running the shardfuse binary as a user would, for the CLI tests.
#pragma once

#include <stdlib.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

namespace sf {

namespace fs = std::filesystem;

struct CliResult {
  int code = -1;
  std::string out;  // stdout and stderr together
};

inline CliResult shardfuse_with_prefix(const std::string& prefix, const std::string& args) {
  std::string cmd = prefix + std::string(SF_BINARY) + " " + args + " 2>&1";
  CliResult r;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

inline CliResult shardfuse(const std::string& args) { return shardfuse_with_prefix("", args); }

// The same with environment assignments ("A=1 B=2") in front of the command.
inline CliResult shardfuse_env(const std::string& env, const std::string& args) {
  return shardfuse_with_prefix(env + " ", args);
}

inline std::string example(const std::string& name) { return std::string(SF_SOURCE_DIR) + "/examples/" + name; }

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "sf-cli-XXXXXX").string();
    path_ = mkdtemp(tmpl.data());
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string operator/(const std::string& f) const { return (fs::path(path_) / f).string(); }
  const std::string& str() const { return path_; }

 private:
  std::string path_;
};

inline void write_file(const std::string& path, const std::string& text) { std::ofstream(path) << text; }
// A whole file's text ("" when it cannot be read).
inline std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), {});
}


}  // namespace sf
