#include "runtime/core/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <random>
#include <sstream>

namespace sf {

namespace {

std::string kind_of(mode_t m) {
  if (S_ISDIR(m)) return "a directory";
  if (S_ISFIFO(m)) return "a FIFO (named pipe)";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISSOCK(m)) return "a socket";
  return "not a regular file";
}

}  // namespace

std::string bytes_str(uint64_t n) {
  const char* units[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int u = 0;
  double v = static_cast<double>(n);
  while (v >= 1024 && u < 6) {
    v /= 1024;
    ++u;
  }
  std::ostringstream os;
  if (u == 0)
    os << n << " bytes";
  else
    os << (v == static_cast<double>(static_cast<uint64_t>(v)) ? static_cast<uint64_t>(v) : v) << " " << units[u];
  return os.str();
}

Result<int> open_regular_file(const std::string& path, uint64_t max_bytes, std::string_view what) {
  const std::string expected = what.empty() ? std::string() : " (expected a " + std::string(what) + ")";
  // O_NONBLOCK: opening a FIFO for reading otherwise waits for a writer forever.
  int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) {
    int e = errno;
    return Diag{path, {}, "cannot open file: " + std::string(std::strerror(e)) + expected};
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    return Diag{path, {}, "cannot open file: " + std::string(std::strerror(e))};
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return Diag{path, {}, "is " + kind_of(st.st_mode) + ", not a regular file" + expected};
  }
  if (static_cast<uint64_t>(st.st_size) > max_bytes) {
    ::close(fd);
    return Diag{path, {}, "file is " + bytes_str(static_cast<uint64_t>(st.st_size)) + ", over the " +
                              bytes_str(max_bytes) + " limit" + expected};
  }
  // Reads of a regular file never block anyway; clear the flag so that callers
  // (fdopen'd streams) see an ordinary descriptor.
  int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  return fd;
}

Result<std::string> read_regular_file(const std::string& path, uint64_t max_bytes, std::string_view what) {
  Result<int> fd = open_regular_file(path, max_bytes, what);
  if (!fd) return fd.error();
  std::string text;
  char buf[1 << 16];
  for (;;) {
    ssize_t n = ::read(*fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      int e = errno;
      ::close(*fd);
      return Diag{path, {}, "cannot read file: " + std::string(std::strerror(e))};
    }
    if (n == 0) break;
    // A file that grows while we read it is held to the cap too.
    if (text.size() + static_cast<size_t>(n) > max_bytes) {
      ::close(*fd);
      return Diag{path, {}, "file is over the " + bytes_str(max_bytes) + " limit"};
    }
    text.append(buf, static_cast<size_t>(n));
  }
  ::close(*fd);
  return text;
}

std::optional<std::string> swap_in_directory(const std::string& tmp_dir, const std::string& target_dir) {
  namespace fs = std::filesystem;
  const fs::path tmp(tmp_dir), target(target_dir);
  std::error_code ec;
  fs::path old;
  if (fs::exists(fs::symlink_status(target, ec))) {
    std::mt19937_64 rng(std::random_device{}());
    old = target.parent_path() / (target.filename().string() + ".old-" + std::to_string(rng() % 1000000000));
    fs::rename(target, old, ec);
    if (ec) {
      std::error_code ec2;
      fs::remove_all(tmp, ec2);
      return "cannot replace the existing directory: " + ec.message();
    }
  }
  fs::rename(tmp, target, ec);
  if (ec) {
    std::error_code ec2;
    if (!old.empty()) fs::rename(old, target, ec2);
    fs::remove_all(tmp, ec2);
    return "cannot move the new directory into place: " + ec.message();
  }
  if (!old.empty()) fs::remove_all(old, ec);
  return std::nullopt;
}

}  // namespace sf
