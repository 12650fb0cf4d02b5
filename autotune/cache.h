// The on-disk tuning cache. One file per (key, config), so adding a config to a
// space keeps every result already measured (unlike caching a whole config list),
// and two tuners only ever replace whole files:
//
//   <dir>/v1/<kind>-<key hash>/key.json          the key's text, for people and checks
//   <dir>/v1/<kind>-<key hash>/<config hash>.json one CacheEntry
//   <dir>/v1/<kind>-<key hash>/.lock             flock(2) while a tuner works on the key
//
// Writes go to a temporary file in the same directory and are renamed into place.
// A file that does not parse, is of another format version, or belongs to another
// key or config (a hash collision) is reported once (warnings()) and removed, so
// the tuner measures that config again.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "autotune/config.h"
#include "autotune/problem.h"
#include "autotune/ptxas.h"

namespace sf {

// do_bench's summary of one config's repetitions, in microseconds.
struct Measurement {
  double median_us = 0, p20_us = 0, p80_us = 0, min_us = 0, max_us = 0, mean_us = 0;
  int reps = 0;       // timed repetitions
  int outliers = 0;   // repetitions outside [q1 - 1.5 IQR, q3 + 1.5 IQR]
  bool operator==(const Measurement&) const = default;
};

struct CacheEntry {
  enum class Status : uint8_t {
    Built,     // compiled and statically checked; predicted_us set; not measured yet
    Measured,  // measurement set
    Invalid,   // failed to compile or to run, or timed out; reason says which
    Pruned,    // statically unfit (spills badly, does not fit an SM); reason says why
  };
  std::string config;     // config_str(...)
  KernelConfig cfg;
  Status status = Status::Built;
  std::string reason;     // Invalid / Pruned
  std::optional<KernelResources> resources;  // NVPTX: ptxas's numbers
  double predicted_us = 0;                   // the cost model's estimate
  std::string code_hash;                     // BuildResult::code_hash: equal hashes, equal kernels
  Measurement measurement;                   // Measured
  std::string when;       // UTC time of writing, ISO 8601
  // An extern candidate's entry (config "extern=<library>", autotune/config.h): the
  // library, and its version when measured; the tuner measures again under another
  // version. Empty for a generated kernel's entry (and in files written before
  // extern candidates existed, which read as such).
  std::string extern_library;
  std::string extern_version;
  bool is_extern() const { return !extern_library.empty(); }
  bool operator==(const CacheEntry&) const = default;
};

std::string_view status_name(CacheEntry::Status s);

class TuneCache {
 public:
  // $SHARDFUSE_CACHE_DIR, else $XDG_CACHE_HOME/shardfuse, else $HOME/.cache/shardfuse.
  static std::string default_dir();
  // Creates `dir` (and parents) when missing; a Diag when it cannot.
  static Result<std::unique_ptr<TuneCache>> open(const std::string& dir);

  const std::string& dir() const { return dir_; }

  // Every entry stored under `key`, by config text. Damaged files are removed and
  // reported through warnings().
  std::map<std::string, CacheEntry> load(const TuneKey& key);

  // Writes one entry atomically (temporary file + rename) and key.json if missing.
  Result<void> store(const TuneKey& key, const CacheEntry& e);

  // An exclusive flock(2) on the key's .lock, held until the Lock is destroyed.
  // Blocks while another process or thread holds it, up to `timeout_s`.
  class Lock {
   public:
    Lock() = default;
    Lock(Lock&& o) noexcept;
    Lock& operator=(Lock&& o) noexcept;
    ~Lock();
   private:
    friend class TuneCache;
    int fd_ = -1;
  };
  Result<Lock> lock(const TuneKey& key, double timeout_s = 600);

  // Messages about damaged files, each once, then cleared.
  std::vector<std::string> take_warnings();

 private:
  explicit TuneCache(std::string dir) : dir_(std::move(dir)) {}
  std::string key_dir(const TuneKey& key) const;
  std::string dir_;
  std::mutex mu_;
  std::vector<std::string> warnings_;
};

// Serialisation of an entry (the file's "entry" object), for tests and tools.
nlohmann::json entry_to_json(const CacheEntry& e);
Result<CacheEntry> entry_from_json(const nlohmann::json& j);

}  // namespace sf
