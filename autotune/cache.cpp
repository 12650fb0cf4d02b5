#include "autotune/cache.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <functional>
#include <limits>
#include <thread>
#include <utility>

#include "runtime/core/file_io.h"

namespace sf {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kFormat = "shardfuse-tune-cache";
constexpr int kVersion = 1;             // bump with the "v1" folder when the entry layout changes
constexpr const char* kVersionDir = "v1";
constexpr const char* kKeyFile = "key.json";
constexpr const char* kLockFile = ".lock";
constexpr const char* kTempPrefix = ".tmp-";
// A writer holds its temporary file for the milliseconds between creating and
// renaming it; one this old was left by a process that died in between.
constexpr auto kStaleTemp = std::chrono::hours(1);

Diag error(std::string message) { return Diag{"", {}, std::move(message)}; }

std::string errno_text(int e) { return std::strerror(e); }

// ---- JSON helpers: a Diag instead of nlohmann's exceptions ---------------------------

// JSON has no inf or nan (nlohmann writes them as null), and the cost model may
// predict inf for a config it cannot place; such values travel as strings.
json num_to_json(double v) {
  if (std::isfinite(v)) return v;
  if (std::isnan(v)) return "nan";
  return v > 0 ? "inf" : "-inf";
}

Result<void> read_double(const json& obj, const char* name, double* out) {
  auto it = obj.find(name);
  if (it == obj.end()) return {};  // optional: keeps the default
  if (it->is_number()) {
    *out = it->get<double>();
    return {};
  }
  if (it->is_string()) {
    const std::string& s = it->get_ref<const std::string&>();
    if (s == "inf") { *out = INFINITY; return {}; }
    if (s == "-inf") { *out = -INFINITY; return {}; }
    if (s == "nan") { *out = NAN; return {}; }
  }
  return error(std::string("'") + name + "' must be a number, not " + it->dump());
}

template <class Int>
Result<void> read_int(const json& obj, const char* name, Int* out) {
  auto it = obj.find(name);
  if (it == obj.end()) return {};
  if (!it->is_number_integer()) return error(std::string("'") + name + "' must be an integer, not " + it->dump());
  int64_t v = it->get<int64_t>();
  if (v < static_cast<int64_t>(std::numeric_limits<Int>::min()) ||
      v > static_cast<int64_t>(std::numeric_limits<Int>::max()))
    return error(std::string("'") + name + "' is out of range: " + it->dump());
  *out = static_cast<Int>(v);
  return {};
}

Result<void> read_string(const json& obj, const char* name, std::string* out, bool required = false) {
  auto it = obj.find(name);
  if (it == obj.end()) {
    if (required) return error(std::string("'") + name + "' is missing");
    return {};
  }
  if (!it->is_string()) return error(std::string("'") + name + "' must be a string, not " + it->dump());
  *out = it->get<std::string>();
  return {};
}

// Every KernelConfig field, not only those config_str() keeps for the entry's kind
// and target: the entry then reproduces the KernelConfig exactly. The union over all
// (kind, target) of config_to_json() is every field an emitter reads, and keeps the
// field names in config.cpp's one table.
json full_config_json(const KernelConfig& c) {
  json j = json::object();
  for (KernelKind k : kAllKernelKinds)
    for (ConfigTarget t : {ConfigTarget::Host, ConfigTarget::Gpu}) j.update(config_to_json(k, t, c));
  return j;
}

json resources_to_json(const KernelResources& r) {
  json j{{"name", r.name},
         {"arch", r.arch},
         {"registers", r.registers},
         {"barriers", r.barriers},
         {"shared_bytes", r.shared_bytes},
         {"constant_bytes", r.constant_bytes},
         {"stack_frame_bytes", r.stack_frame_bytes},
         {"spill_store_bytes", r.spill_store_bytes},
         {"spill_load_bytes", r.spill_load_bytes},
         {"cumulative_stack_bytes", r.cumulative_stack_bytes}};
  if (!r.notes.empty()) j["notes"] = r.notes;  // written only when there are any
  return j;
}

Result<KernelResources> resources_from_json(const json& j) {
  if (!j.is_object()) return error("'resources' must be an object, not " + j.dump());
  KernelResources r;
  for (auto d : {read_string(j, "name", &r.name), read_string(j, "arch", &r.arch),
                 read_int(j, "registers", &r.registers), read_int(j, "barriers", &r.barriers),
                 read_int(j, "shared_bytes", &r.shared_bytes), read_int(j, "constant_bytes", &r.constant_bytes),
                 read_int(j, "stack_frame_bytes", &r.stack_frame_bytes),
                 read_int(j, "spill_store_bytes", &r.spill_store_bytes),
                 read_int(j, "spill_load_bytes", &r.spill_load_bytes),
                 read_int(j, "cumulative_stack_bytes", &r.cumulative_stack_bytes)})
    if (!d.ok()) return error("resources: " + d.error().message);
  if (auto it = j.find("notes"); it != j.end()) {
    if (!it->is_array()) return error("resources: 'notes' must be an array of strings, not " + it->dump());
    for (const json& n : *it) {
      if (!n.is_string()) return error("resources: 'notes' must be an array of strings, not " + it->dump());
      r.notes.push_back(n.get<std::string>());
    }
  }
  return r;
}

json measurement_to_json(const Measurement& m) {
  return json{{"median_us", num_to_json(m.median_us)}, {"p20_us", num_to_json(m.p20_us)},
              {"p80_us", num_to_json(m.p80_us)},       {"min_us", num_to_json(m.min_us)},
              {"max_us", num_to_json(m.max_us)},       {"mean_us", num_to_json(m.mean_us)},
              {"reps", m.reps},                        {"outliers", m.outliers}};
}

Result<Measurement> measurement_from_json(const json& j) {
  if (!j.is_object()) return error("'measurement' must be an object, not " + j.dump());
  Measurement m;
  for (auto d : {read_double(j, "median_us", &m.median_us), read_double(j, "p20_us", &m.p20_us),
                 read_double(j, "p80_us", &m.p80_us), read_double(j, "min_us", &m.min_us),
                 read_double(j, "max_us", &m.max_us), read_double(j, "mean_us", &m.mean_us),
                 read_int(j, "reps", &m.reps), read_int(j, "outliers", &m.outliers)})
    if (!d.ok()) return error("measurement: " + d.error().message);
  return m;
}

std::optional<CacheEntry::Status> parse_status(std::string_view name) {
  for (auto s : {CacheEntry::Status::Built, CacheEntry::Status::Measured, CacheEntry::Status::Invalid,
                 CacheEntry::Status::Pruned})
    if (status_name(s) == name) return s;
  return std::nullopt;
}

std::string utc_now_iso8601() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

// ---- files -----------------------------------------------------------------------

// Unique in the directory: pid for other processes, thread id for other threads
// of this one, a counter for successive writes of one thread. O_EXCL still guards
// against a stale file from a dead process whose pid was reused.
std::string temp_name() {
  static std::atomic<uint64_t> counter{0};
  char buf[96];
  std::snprintf(buf, sizeof buf, "%s%ld-%zx-%llu", kTempPrefix, static_cast<long>(::getpid()),
                std::hash<std::thread::id>{}(std::this_thread::get_id()),
                static_cast<unsigned long long>(counter.fetch_add(1)));
  return buf;
}

bool write_all(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

// Writes `text` to `path` through a temporary file in the same directory and
// rename(2), so readers see the old file or the new one, never a mix, and of two
// concurrent writers one wins whole. No fsync: after a crash the worst case is an
// empty or truncated entry, which load() detects and removes, costing one re-tune;
// an fsync per entry would cost milliseconds on every Built/Pruned store.
Result<void> write_atomically(const fs::path& path, std::string_view text) {
  fs::path tmp;
  int fd = -1;
  for (int attempt = 0; attempt < 16 && fd < 0; ++attempt) {
    tmp = path.parent_path() / temp_name();
    fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0 && errno != EEXIST) break;
  }
  if (fd < 0)
    return error("tuning cache: cannot write " + path.string() + ": cannot create a temporary file: " +
                 errno_text(errno));
  bool ok = write_all(fd, text);
  int e = errno;
  if (::close(fd) != 0 && ok) {
    ok = false;
    e = errno;
  }
  if (ok && ::rename(tmp.c_str(), path.c_str()) != 0) {
    ok = false;
    e = errno;
  }
  if (!ok) {
    ::unlink(tmp.c_str());
    return error("tuning cache: cannot write " + path.string() + ": " + errno_text(e));
  }
  return {};
}

// The whole file, or nullopt with errno set: EINVAL for what is not a regular file
// (O_NONBLOCK keeps a FIFO swapped in after the listing from blocking the open),
// EFBIG for one over kMaxJsonFileBytes (runtime/core/file_io.h).
std::optional<std::string> read_file(const fs::path& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return std::nullopt;
  struct stat st;
  int refused = 0;
  if (::fstat(fd, &st) != 0)
    refused = errno;
  else if (!S_ISREG(st.st_mode))
    refused = EINVAL;
  else if (static_cast<uint64_t>(st.st_size) > kMaxJsonFileBytes)
    refused = EFBIG;
  if (refused) {
    ::close(fd);
    errno = refused;
    return std::nullopt;
  }
  std::string s;
  char buf[8192];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      int e = errno;
      ::close(fd);
      errno = e;
      return std::nullopt;
    }
    if (n == 0) break;
    if (s.size() + static_cast<size_t>(n) > kMaxJsonFileBytes) {  // grew while read
      ::close(fd);
      errno = EFBIG;
      return std::nullopt;
    }
    s.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return s;
}

// Why an entry file cannot be used under `key` (nullopt: it can, into *out).
std::optional<std::string> check_entry_file(const std::string& text, const TuneKey& key, const std::string& key_text,
                                            const std::string& stem, CacheEntry* out) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return text.empty() ? "empty file" : "not valid JSON";
  if (!j.is_object()) return "not a JSON object";
  auto format = j.find("format");
  if (format == j.end() || *format != kFormat) return std::string("not a ") + kFormat + " file";
  auto version = j.find("version");
  if (version == j.end() || !version->is_number_integer() || *version != kVersion)
    return "format version " + (version == j.end() ? std::string("missing") : version->dump()) + ", expected " +
           std::to_string(kVersion);
  auto k = j.find("key");
  if (k == j.end() || !k->is_string()) return "no key";
  if (k->get_ref<const std::string&>() != key_text) return "written for another key (not " + key.hash() + ")";
  auto entry = j.find("entry");
  if (entry == j.end()) return "no entry";
  Result<CacheEntry> e = entry_from_json(*entry);
  if (!e) return "bad entry: " + e.error().message;
  // The file name is the config's hash: another name means a hash collision or a
  // copied file, and load() would otherwise return the entry under the wrong name.
  if (fnv1a_hex(e->config) != stem) return "file name does not match its config '" + e->config + "'";
  *out = std::move(e).value();
  return std::nullopt;
}

// Key kinds are kernel_kind_name()s; anything else is made safe for a folder name.
std::string safe_component(std::string_view s) {
  std::string out;
  for (char c : s) out += (std::isalnum(static_cast<unsigned char>(c)) || c == '_') ? c : '_';
  return out.empty() ? "_" : out;
}

}  // namespace

std::string_view status_name(CacheEntry::Status s) {
  switch (s) {
    case CacheEntry::Status::Built: return "built";
    case CacheEntry::Status::Measured: return "measured";
    case CacheEntry::Status::Invalid: return "invalid";
    case CacheEntry::Status::Pruned: return "pruned";
  }
  return "?";
}

// Every CacheEntry field; a field added to the struct must be added here and in
// entry_from_json (the round-trip tests set every one).
nlohmann::json entry_to_json(const CacheEntry& e) {
  json j = json::object();
  j["config"] = e.config;
  j["cfg"] = full_config_json(e.cfg);
  j["status"] = status_name(e.status);
  j["reason"] = e.reason;
  if (e.resources) j["resources"] = resources_to_json(*e.resources);
  j["predicted_us"] = num_to_json(e.predicted_us);
  j["code_hash"] = e.code_hash;
  j["measurement"] = measurement_to_json(e.measurement);
  j["when"] = e.when;
  if (e.is_extern()) j["extern"] = json{{"library", e.extern_library}, {"version", e.extern_version}};
  return j;
}

Result<CacheEntry> entry_from_json(const nlohmann::json& j) {
  // The reads below check every type first; the catch is for anything they miss,
  // since a damaged file must become a Diag, never an exception.
  try {
    if (!j.is_object()) return error("an entry must be a JSON object, not " + j.dump());
    CacheEntry e;
    SF_TRY(read_string(j, "config", &e.config, /*required=*/true));
    auto cfg = j.find("cfg");
    if (cfg == j.end()) return error("'cfg' is missing");
    Result<KernelConfig> c = config_from_json(*cfg);
    if (!c) return error("cfg: " + c.error().message);
    e.cfg = *c;
    std::string status;
    SF_TRY(read_string(j, "status", &status, /*required=*/true));
    std::optional<CacheEntry::Status> s = parse_status(status);
    if (!s) return error("unknown status '" + status + "'");
    e.status = *s;
    SF_TRY(read_string(j, "reason", &e.reason));
    if (auto r = j.find("resources"); r != j.end() && !r->is_null()) {
      Result<KernelResources> res = resources_from_json(*r);
      if (!res) return res.error();
      e.resources = *res;
    }
    SF_TRY(read_double(j, "predicted_us", &e.predicted_us));
    SF_TRY(read_string(j, "code_hash", &e.code_hash));
    if (auto m = j.find("measurement"); m != j.end()) {
      Result<Measurement> meas = measurement_from_json(*m);
      if (!meas) return meas.error();
      e.measurement = *meas;
    }
    SF_TRY(read_string(j, "when", &e.when));
    // An extern entry says so twice, in its config text and its "extern" object, and
    // the two must agree: a KernelConfig never reads as a library call or back.
    if (auto x = j.find("extern"); x != j.end()) {
      if (!x->is_object()) return error("'extern' must be an object, not " + x->dump());
      if (Result<void> d = read_string(*x, "library", &e.extern_library, /*required=*/true); !d.ok())
        return error("extern: " + d.error().message);
      if (Result<void> d = read_string(*x, "version", &e.extern_version); !d.ok())
        return error("extern: " + d.error().message);
      if (e.extern_library.empty() || e.config != extern_config_str(e.extern_library))
        return error("config '" + e.config + "' does not match its extern library '" + e.extern_library +
                     "' (expected '" + extern_config_str(e.extern_library) + "')");
    } else if (extern_library_of(e.config)) {
      return error("config '" + e.config + "' names a library but the entry has no 'extern' object");
    }
    return e;
  } catch (const json::exception& ex) {
    return error(std::string("malformed entry: ") + ex.what());
  }
}

std::string TuneCache::default_dir() {
  auto env = [](const char* name) -> std::string {
    const char* v = std::getenv(name);
    return v ? v : "";
  };
  if (std::string d = env("SHARDFUSE_CACHE_DIR"); !d.empty()) return d;
  // The XDG base-directory spec says a relative XDG_CACHE_HOME is invalid and to
  // be ignored.
  if (std::string d = env("XDG_CACHE_HOME"); !d.empty() && d[0] == '/') return d + "/shardfuse";
  if (std::string d = env("HOME"); !d.empty()) return d + "/.cache/shardfuse";
  return "/tmp/shardfuse-cache";
}

Result<std::unique_ptr<TuneCache>> TuneCache::open(const std::string& dir) {
  if (dir.empty()) return error("tuning cache: empty directory name");
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return error("tuning cache: cannot create " + dir + ": " + ec.message());
  // create_directories() succeeds on an existing path without saying what it is.
  if (!fs::is_directory(dir, ec)) return error("tuning cache: " + dir + " exists and is not a directory");
  return std::unique_ptr<TuneCache>(new TuneCache(dir));
}

std::string TuneCache::key_dir(const TuneKey& key) const {
  return (fs::path(dir_) / kVersionDir / (safe_component(key.kind) + "-" + key.hash())).string();
}

std::map<std::string, CacheEntry> TuneCache::load(const TuneKey& key) {
  std::map<std::string, CacheEntry> out;
  const fs::path kdir = key_dir(key);
  std::error_code ec;
  fs::directory_iterator it(kdir, ec);
  if (ec) return out;  // never stored under this key (or unreadable: tune afresh)

  const std::string key_text = key.text();
  std::vector<std::string> warnings;
  for (; it != fs::directory_iterator(); it.increment(ec)) {
    if (ec) break;
    const fs::path path = it->path();
    const std::string name = path.filename().string();
    if (name.starts_with(kTempPrefix)) {
      // Another writer's file in flight, or one a dead process left behind.
      std::error_code tec;
      auto mtime = fs::last_write_time(path, tec);
      if (!tec && fs::file_time_type::clock::now() - mtime > kStaleTemp) fs::remove(path, tec);
      continue;
    }
    if (name == kKeyFile || name.starts_with(".") || path.extension() != ".json") continue;
    std::error_code tec;
    if (!it->is_regular_file(tec)) continue;  // not ours to judge or remove

    std::optional<std::string> text = read_file(path);
    const int read_errno = errno;
    std::optional<std::string> why;
    CacheEntry e;
    if (!text) {
      if (read_errno == ENOENT) continue;  // removed by a concurrent load() since listing
      why = read_errno == EFBIG ? "over the " + bytes_str(kMaxJsonFileBytes) + " limit of an entry"
                                : "cannot read: " + errno_text(read_errno);
    } else {
      why = check_entry_file(*text, key, key_text, path.stem().string(), &e);
    }
    if (!why) {
      out.emplace(e.config, std::move(e));
      continue;
    }
    // Removing without the key's lock can race a writer renaming a good entry into
    // this name between our read and unlink; the cost is one config tuned again.
    std::string msg = "tuning cache: " + path.string() + ": " + *why;
    if (::unlink(path.c_str()) == 0 || errno == ENOENT)
      msg += "; removed, the config will be tuned again";
    else
      msg += "; cannot remove it (" + errno_text(errno) + "), the config will be tuned again";
    warnings.push_back(std::move(msg));
  }
  if (!warnings.empty()) {
    std::lock_guard<std::mutex> g(mu_);
    warnings_.insert(warnings_.end(), std::make_move_iterator(warnings.begin()),
                     std::make_move_iterator(warnings.end()));
  }
  return out;
}

Result<void> TuneCache::store(const TuneKey& key, const CacheEntry& e) {
  const fs::path kdir = key_dir(key);
  std::error_code ec;
  fs::create_directories(kdir, ec);
  if (ec) return error("tuning cache: cannot create " + kdir.string() + ": " + ec.message());

  const std::string key_text = key.text();
  const fs::path key_file = kdir / kKeyFile;
  if (!fs::exists(key_file, ec)) {
    json k = {{"format", kFormat},       {"version", kVersion},         {"key", key_text},
              {"kind", key.kind},        {"signature", key.signature},  {"shapes", key.shapes},
              {"target", key.target},    {"toolchain", key.toolchain}};
    SF_TRY(write_atomically(key_file, k.dump(2) + "\n"));
  }

  CacheEntry stamped = e;
  if (stamped.when.empty()) stamped.when = utc_now_iso8601();
  json file = {{"format", kFormat}, {"version", kVersion}, {"key", key_text}, {"entry", entry_to_json(stamped)}};
  return write_atomically(kdir / (fnv1a_hex(e.config) + ".json"), file.dump(2) + "\n");
}

TuneCache::Lock::Lock(Lock&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}

TuneCache::Lock& TuneCache::Lock::operator=(Lock&& o) noexcept {
  if (this != &o) {
    Lock old(std::move(*this));  // releases ours on scope exit
    fd_ = std::exchange(o.fd_, -1);
  }
  return *this;
}

TuneCache::Lock::~Lock() {
  if (fd_ >= 0) {
    ::flock(fd_, LOCK_UN);
    ::close(fd_);
  }
}

Result<TuneCache::Lock> TuneCache::lock(const TuneKey& key, double timeout_s) {
  const fs::path kdir = key_dir(key);
  std::error_code ec;
  fs::create_directories(kdir, ec);
  if (ec) return error("tuning cache: cannot create " + kdir.string() + ": " + ec.message());
  const fs::path path = kdir / kLockFile;
  // The lock file is never removed: unlinking it while another process waits on
  // the old inode would let a third lock a new file at the same path.
  Lock l;
  l.fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (l.fd_ < 0) return error("tuning cache: cannot open " + path.string() + ": " + errno_text(errno));

  // flock(2) locks belong to the open file description, so another thread of this
  // process (with its own open()) is excluded just like another process. A
  // non-blocking try with short sleeps gives the timeout that LOCK_EX lacks; the
  // sleeps grow from 1 ms to 50 ms, so a lock freed soon is taken soon and a long
  // wait costs ~20 wakeups a second.
  using clock = std::chrono::steady_clock;
  // Clamped to a year so that the conversion to clock ticks cannot overflow.
  const double wait_s = std::clamp(std::isnan(timeout_s) ? 0.0 : timeout_s, 0.0, 365 * 86400.0);
  const auto deadline =
      clock::now() + std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(wait_s));
  auto pause = std::chrono::milliseconds(1);
  for (;;) {
    if (::flock(l.fd_, LOCK_EX | LOCK_NB) == 0) return l;
    if (errno == EINTR) continue;
    if (errno != EWOULDBLOCK)
      return error("tuning cache: cannot lock " + path.string() + ": " + errno_text(errno));
    auto now = clock::now();
    if (now >= deadline) {
      char secs[32];
      std::snprintf(secs, sizeof secs, "%g", timeout_s);
      return error(std::string("tuning cache: timed out after ") + secs + " s waiting for the lock on " +
                   path.string());
    }
    std::this_thread::sleep_for(std::min<clock::duration>(pause, deadline - now));
    pause = std::min(pause * 2, std::chrono::milliseconds(50));
  }
}

std::vector<std::string> TuneCache::take_warnings() {
  std::lock_guard<std::mutex> g(mu_);
  return std::exchange(warnings_, {});
}

}  // namespace sf
