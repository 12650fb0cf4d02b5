// Reading the files a user names (graphs, .npy inputs, Plan files, tuning caches,
// system descriptions) safely: only regular files, and never more than a cap.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "runtime/core/diag.h"

namespace sf {

// Caps on what shardfuse reads, so a path linked to /dev/zero or a huge sparse
// file is refused at once instead of read into memory (docs/plan.md lists them).
// The largest of our own files are far below: examples/*.sf are under 4 KiB, a
// transformer block's plan.json is ~200 KiB and its largest .ptx ~300 KiB.
inline constexpr uint64_t kMaxGraphFileBytes = uint64_t{16} << 20;  // a .sf graph
inline constexpr uint64_t kMaxPlanFileBytes = uint64_t{256} << 20;  // plan.json, one .ptx
inline constexpr uint64_t kMaxJsonFileBytes = uint64_t{16} << 20;   // a tuning cache entry, a system file

// Opens `path` for reading and returns its descriptor (blocking reads, close-on-exec;
// the caller closes it). Refuses, with a Diag naming the path, what is not a regular
// file (a directory, a FIFO, a device, a socket) and a file over `max_bytes`. The
// open itself is non-blocking, so a FIFO with no writer is refused rather than
// waited on. `what` says what the file was meant to be ("graph file"), for the message.
Result<int> open_regular_file(const std::string& path, uint64_t max_bytes, std::string_view what);

// The whole content of `path`, opened as open_regular_file does; refuses a file
// that grows past `max_bytes` while it is read.
Result<std::string> read_regular_file(const std::string& path, uint64_t max_bytes, std::string_view what);

// Moves the fully written directory `tmp` (a sibling of `target`) into place as
// `target`: an existing `target` (the caller decided it may be replaced) moves aside
// first and is removed after, so a reader sees the old directory or the new one; on
// failure the old one is put back and `tmp` removed. nullopt, or why it failed.
std::optional<std::string> swap_in_directory(const std::string& tmp, const std::string& target);

// "16 MiB", "1.5 GiB": a byte count for messages.
std::string bytes_str(uint64_t n);

}  // namespace sf
