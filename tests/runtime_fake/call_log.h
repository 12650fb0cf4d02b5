// FAKE_CUDA_LOG for one scope: the fake driver (tests/fake_cuda) appends a line per
// call of interest to that file, which a test reads back.
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace sf {

class CallLog {
 public:
  explicit CallLog(const std::string& name = "sf-fake-log")
      : path_((std::filesystem::temp_directory_path() / (name + "-" + std::to_string(::getpid()))).string()) {
    std::filesystem::remove(path_);
    ::setenv("FAKE_CUDA_LOG", path_.c_str(), 1);
  }
  ~CallLog() {
    ::unsetenv("FAKE_CUDA_LOG");
    std::filesystem::remove(path_);
  }
  CallLog(const CallLog&) = delete;
  CallLog& operator=(const CallLog&) = delete;

  // The lines logged so far that start with `prefix` (all of them for "").
  std::vector<std::string> lines(const std::string& prefix = "") const {
    std::ifstream in(path_);
    std::vector<std::string> out;
    for (std::string l; std::getline(in, l);)
      if (l.rfind(prefix, 0) == 0) out.push_back(l);
    return out;
  }

 private:
  std::string path_;
};

}  // namespace sf
