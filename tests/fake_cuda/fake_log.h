// What the stand-in libraries (fake_libcuda.cpp, tests/fake_nccl/fake_libnccl.cpp)
// share: their log, one file for both so that a test reads the driver's and NCCL's
// calls in the order they happened, and handles that are plain ids.
#pragma once

#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace fake {

// One line to $FAKE_CUDA_LOG (read on every call, so a test can point it at a new
// file); the file is opened for appending and closed again, which flushes it, so
// lines from several processes interleave whole.
inline void log_line(const std::string& line) {
  const char* path = std::getenv("FAKE_CUDA_LOG");
  if (!path || !*path) return;
  if (FILE* f = std::fopen(path, "a")) {
    std::fputs(line.c_str(), f);
    std::fputc('\n', f);
    std::fclose(f);
  }
}

// "0x1a2b", as handles and pointers appear in the log.
inline std::string hex(uint64_t v) {
  char b[32];
  std::snprintf(b, sizeof b, "0x%" PRIx64, v);
  return b;
}

template <class H>
H handle(uint64_t id) {
  return reinterpret_cast<H>(static_cast<uintptr_t>(id));
}
template <class H>
uint64_t id_of(H h) {
  return static_cast<uint64_t>(reinterpret_cast<uintptr_t>(h));
}

}  // namespace fake
