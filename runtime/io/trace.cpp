#include "runtime/io/trace.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <thread>

namespace sf {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string_view stream_name(Stream s) {
  switch (s) {
    case Stream::Compute: return "compute";
    case Stream::Comm: return "comm";
  }
  return "?";
}

void TraceWriter::add(int rank, Stream s, std::string name, double start_us, double dur_us, json args,
                      std::string category) {
  if (!args.is_object()) args = json{{"value", std::move(args)}};
  std::lock_guard<std::mutex> g(mu_);
  ranks_[rank] = true;
  events_.push_back(Event{rank, s, std::move(name), std::move(category), start_us, std::max(0.0, dur_us),
                          std::move(args)});
}

void TraceWriter::add_rank(int rank) {
  std::lock_guard<std::mutex> g(mu_);
  ranks_[rank] = true;
}

void TraceWriter::set_metadata(const std::string& key, json value) {
  std::lock_guard<std::mutex> g(mu_);
  other_[key] = std::move(value);
}

size_t TraceWriter::size() const {
  std::lock_guard<std::mutex> g(mu_);
  return events_.size();
}

json TraceWriter::to_json() const {
  std::vector<Event> events;
  std::vector<int> ranks;
  json other;
  {
    std::lock_guard<std::mutex> g(mu_);
    events = events_;
    for (const auto& [r, _] : ranks_) ranks.push_back(r);
    other = other_;
  }
  std::stable_sort(events.begin(), events.end(), [](const Event& a, const Event& b) {
    if (a.rank != b.rank) return a.rank < b.rank;
    if (a.stream != b.stream) return a.stream < b.stream;
    return a.start_us < b.start_us;
  });
  json out = json::array();
  // Thread ids are the stream's number; sort indices keep compute above comm.
  for (int r : ranks) {
    out.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", r}, {"tid", 0}, {"args", {{"name", "rank " + std::to_string(r)}}}});
    out.push_back({{"name", "process_sort_index"}, {"ph", "M"}, {"pid", r}, {"tid", 0}, {"args", {{"sort_index", r}}}});
    for (Stream s : {Stream::Compute, Stream::Comm}) {
      int tid = static_cast<int>(s);
      out.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", r}, {"tid", tid},
                     {"args", {{"name", std::string(stream_name(s))}}}});
      out.push_back({{"name", "thread_sort_index"}, {"ph", "M"}, {"pid", r}, {"tid", tid},
                     {"args", {{"sort_index", tid}}}});
    }
  }
  for (const Event& e : events) {
    json ev = {{"name", e.name}, {"ph", "X"}, {"pid", e.rank}, {"tid", static_cast<int>(e.stream)},
               {"ts", e.start_us}, {"dur", e.dur_us}, {"args", e.args}};
    if (!e.category.empty()) ev["cat"] = e.category;
    out.push_back(std::move(ev));
  }
  // The format's time unit is the microsecond; "ns" only changes how the viewer
  // labels the axis, which matters for kernels of a few microseconds.
  json j = {{"traceEvents", std::move(out)}, {"displayTimeUnit", "ns"}};
  if (!other.empty()) j["otherData"] = std::move(other);
  return j;
}

namespace {

bool write_all(int fd, std::string_view s) {
  while (!s.empty()) {
    ssize_t n = ::write(fd, s.data(), s.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    s.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

}  // namespace

Result<void> TraceWriter::write(const std::string& path) const {
  const std::string text = to_json().dump() + "\n";
  static std::atomic<uint64_t> counter{0};
  fs::path target(path);
  fs::path dir = target.parent_path().empty() ? fs::path(".") : target.parent_path();
  auto fail = [&](const std::string& why) { return Diag{path, {}, "cannot write the trace: " + why}; };
  // The rename below replaces whatever `path` names: only a regular file (or a
  // link) may be replaced, never a device such as /dev/null when run as root, a
  // FIFO or a directory.
  struct stat st;
  if (::lstat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode) && !S_ISLNK(st.st_mode))
    return fail("it exists and is not a regular file; refusing to replace it");
  fs::path tmp;
  int fd = -1;
  for (int attempt = 0; attempt < 16 && fd < 0; ++attempt) {
    tmp = dir / (".tmp-trace-" + std::to_string(::getpid()) + "-" +
                 std::to_string(std::hash<std::thread::id>{}(std::this_thread::get_id()) % 1000000) + "-" +
                 std::to_string(counter++));
    fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0 && errno != EEXIST) break;
  }
  if (fd < 0) return fail(std::strerror(errno));
  bool ok = write_all(fd, text);
  int e = errno;
  if (::close(fd) != 0 && ok) {
    ok = false;
    e = errno;
  }
  if (ok && ::rename(tmp.c_str(), target.c_str()) != 0) {
    ok = false;
    e = errno;
  }
  if (!ok) {
    ::unlink(tmp.c_str());
    return fail(std::strerror(e));
  }
  return {};
}

}  // namespace sf
