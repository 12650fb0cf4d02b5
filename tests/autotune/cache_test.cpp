// The on-disk tuning cache: entry round trips, key invalidation, damaged files,
// and two processes writing one key at once. Everything runs in a fresh temporary
// directory that is removed afterwards.
#include "autotune/cache.h"

#include <gtest/gtest.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <sstream>
#include <thread>

namespace sf {
namespace autotune_cache_test {

namespace fs = std::filesystem;

class CacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::path(::testing::TempDir()) / "sf-cache-XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr) << tmpl << ": " << std::strerror(errno);
    root_ = tmpl;
    auto c = TuneCache::open((root_ / "cache").string());
    ASSERT_TRUE(c.ok()) << c.error().str();
    cache_ = std::move(c).value();
  }
  void TearDown() override {
    std::error_code ec;
    if (!root_.empty()) fs::remove_all(root_, ec);
  }

  // The key's folder, found by the one key.json written for it.
  fs::path key_dir(const TuneKey& k) const {
    return fs::path(cache_->dir()) / "v1" / (k.kind + "-" + k.hash());
  }
  std::vector<std::string> files_in(const TuneKey& k) const {
    std::vector<std::string> names;
    std::error_code ec;
    for (const auto& f : fs::directory_iterator(key_dir(k), ec)) names.push_back(f.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }

  fs::path root_;
  std::unique_ptr<TuneCache> cache_;
};

TuneKey test_key() {
  TuneKey k;
  k.kind = "matmul";
  k.signature = "0123456789abcdef";
  k.shapes = "64x512,512x128->64x128";
  k.target = "sm_90a";
  k.toolchain = "llvm 19.1.7; ptxas 13.0.88";
  return k;
}

// A matmul entry with distinct numbers in every field, so a field dropped or
// swapped by the serialiser shows up as an inequality.
CacheEntry matmul_entry(int block_m, CacheEntry::Status s) {
  CacheEntry e;
  e.cfg.block_m = block_m;
  e.cfg.block_n = 32;
  e.cfg.block_k = 32;
  e.cfg.warps = 8;
  e.cfg.stages = 3;
  e.cfg.group_m = 4;
  e.cfg.split_k = 2;
  e.cfg.grid_stride = false;   // not a matmul field: kept all the same
  e.cfg.host_tile_n = 7;
  e.config = config_str(KernelKind::Matmul, ConfigTarget::Gpu, e.cfg);
  e.status = s;
  e.predicted_us = 12.345678901234567;
  e.code_hash = "c0de" + std::to_string(block_m);
  e.when = "2025-01-02T03:04:05Z";
  switch (s) {
    case CacheEntry::Status::Built: break;
    case CacheEntry::Status::Measured:
      e.measurement = {10.5, 10.25, 11.0, 9.875, 14.0, 10.6, 100, 3};
      break;
    case CacheEntry::Status::Invalid: e.reason = "compile timed out after 60 s"; break;
    case CacheEntry::Status::Pruned: e.reason = "spills 168 bytes"; break;
  }
  if (s != CacheEntry::Status::Invalid) {
    KernelResources r;
    r.name = "k0_matmul";
    r.arch = "sm_90a";
    r.registers = 128;
    r.barriers = 1;
    r.shared_bytes = 49152;
    r.constant_bytes = 380;
    r.stack_frame_bytes = 232;
    r.spill_store_bytes = s == CacheEntry::Status::Pruned ? 168 : 0;
    r.spill_load_bytes = s == CacheEntry::Status::Pruned ? 164 : 0;
    r.cumulative_stack_bytes = 240;
    if (s == CacheEntry::Status::Pruned) r.notes = {"(C7508) Potential Performance Loss: 'setmaxnreg' ignored"};
    e.resources = r;
  }
  return e;
}

std::string read_text(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write_text(const fs::path& p, const std::string& s) {
  std::ofstream out(p, std::ios::trunc);
  out << s;
}

TEST_F(CacheTest, StatusNames) {
  EXPECT_EQ(status_name(CacheEntry::Status::Built), "built");
  EXPECT_EQ(status_name(CacheEntry::Status::Measured), "measured");
  EXPECT_EQ(status_name(CacheEntry::Status::Invalid), "invalid");
  EXPECT_EQ(status_name(CacheEntry::Status::Pruned), "pruned");
}

TEST_F(CacheTest, EntryJsonRoundTripsEveryStatus) {
  for (auto s : {CacheEntry::Status::Built, CacheEntry::Status::Measured, CacheEntry::Status::Invalid,
                 CacheEntry::Status::Pruned}) {
    CacheEntry e = matmul_entry(128, s);
    nlohmann::json j = entry_to_json(e);
    EXPECT_EQ(j["status"], status_name(s));
    // Through text, as the file goes.
    Result<CacheEntry> back = entry_from_json(nlohmann::json::parse(j.dump()));
    ASSERT_TRUE(back.ok()) << back.error().str();
    EXPECT_EQ(*back, e) << j.dump(2);
  }
}

TEST_F(CacheTest, EntryJsonKeepsNonFiniteNumbers) {
  CacheEntry e = matmul_entry(64, CacheEntry::Status::Pruned);
  e.predicted_us = INFINITY;
  Result<CacheEntry> back = entry_from_json(nlohmann::json::parse(entry_to_json(e).dump()));
  ASSERT_TRUE(back.ok()) << back.error().str();
  EXPECT_EQ(back->predicted_us, INFINITY);
}

TEST_F(CacheTest, EntryFromJsonReportsErrorsWithoutThrowing) {
  nlohmann::json good = entry_to_json(matmul_entry(64, CacheEntry::Status::Measured));
  struct Case {
    const char* what;
    std::function<void(nlohmann::json&)> damage;
    const char* expect;
  };
  std::vector<Case> cases = {
      {"not an object", [](nlohmann::json& j) { j = nlohmann::json::array(); }, "must be a JSON object"},
      {"no config", [](nlohmann::json& j) { j.erase("config"); }, "'config' is missing"},
      {"config a number", [](nlohmann::json& j) { j["config"] = 3; }, "'config' must be a string"},
      {"no cfg", [](nlohmann::json& j) { j.erase("cfg"); }, "'cfg' is missing"},
      {"unknown cfg field", [](nlohmann::json& j) { j["cfg"]["blok"] = 1; }, "unknown config field 'blok'"},
      {"bad status", [](nlohmann::json& j) { j["status"] = "done"; }, "unknown status 'done'"},
      {"resources an array", [](nlohmann::json& j) { j["resources"] = nlohmann::json::array(); },
       "'resources' must be an object"},
      {"registers a string", [](nlohmann::json& j) { j["resources"]["registers"] = "many"; },
       "'registers' must be an integer"},
      {"notes a string", [](nlohmann::json& j) { j["resources"]["notes"] = "(C1) x"; },
       "'notes' must be an array of strings"},
      {"a note a number", [](nlohmann::json& j) { j["resources"]["notes"] = nlohmann::json::array({1}); },
       "'notes' must be an array of strings"},
      {"reps too big", [](nlohmann::json& j) { j["measurement"]["reps"] = int64_t{1} << 40; }, "out of range"},
      {"median a bool", [](nlohmann::json& j) { j["measurement"]["median_us"] = true; },
       "'median_us' must be a number"},
      {"code_hash a number", [](nlohmann::json& j) { j["code_hash"] = 5; }, "'code_hash' must be a string"},
      {"predicted a word", [](nlohmann::json& j) { j["predicted_us"] = "fast"; }, "'predicted_us' must be a number"},
  };
  for (const Case& c : cases) {
    nlohmann::json j = good;
    c.damage(j);
    Result<CacheEntry> r = entry_from_json(j);
    ASSERT_FALSE(r.ok()) << c.what;
    EXPECT_NE(r.error().message.find(c.expect), std::string::npos) << c.what << ": " << r.error().message;
  }
}

// A library GEMM measured as an extern candidate (autotune/config.h): its entry
// round-trips, says it is one twice (config text and "extern"), and never parses as
// a KernelConfig; entries written before extern candidates existed (no "extern")
// read as generated kernels' entries.
CacheEntry extern_entry() {
  CacheEntry e;
  e.config = extern_config_str("cublaslt");
  e.extern_library = "cublaslt";
  e.extern_version = "cublasLt 130100 (libcublasLt.so.13)";
  e.status = CacheEntry::Status::Measured;
  e.measurement = {7.5, 7.25, 8.0, 7.0, 9.0, 7.6, 50, 1};
  e.when = "2026-01-02T03:04:05Z";
  return e;
}

TEST_F(CacheTest, ExternEntriesRoundTripAndAreNoConfig) {
  const CacheEntry e = extern_entry();
  EXPECT_TRUE(e.is_extern());
  EXPECT_EQ(e.config, "extern=cublaslt");
  EXPECT_EQ(extern_library_of(e.config), "cublaslt");
  EXPECT_FALSE(parse_config_str(e.config)) << "a library call must never read as a KernelConfig";
  const CacheEntry generated = matmul_entry(64, CacheEntry::Status::Measured);
  EXPECT_FALSE(extern_library_of(generated.config));
  EXPECT_FALSE(generated.is_extern());
  Result<CacheEntry> back = entry_from_json(nlohmann::json::parse(entry_to_json(e).dump()));
  ASSERT_TRUE(back) << back.error().str();
  EXPECT_EQ(*back, e);
  EXPECT_FALSE(entry_to_json(generated).contains("extern")) << "generated entries are written as before";
  ASSERT_TRUE(cache_->store(test_key(), e).ok());
  ASSERT_TRUE(cache_->store(test_key(), generated).ok());
  std::map<std::string, CacheEntry> loaded = cache_->load(test_key());
  ASSERT_EQ(loaded.size(), 2u);
  EXPECT_EQ(loaded.at("extern=cublaslt"), e);
  EXPECT_EQ(loaded.at(generated.config), generated);
  EXPECT_TRUE(cache_->take_warnings().empty());
}

TEST_F(CacheTest, AnEntryWrittenBeforeExternCandidatesReadsAsAConfig) {
  // The file of an earlier shardfuse: no "extern" object anywhere.
  const TuneKey k = test_key();
  const CacheEntry e = matmul_entry(32, CacheEntry::Status::Measured);
  nlohmann::json entry = entry_to_json(e);
  ASSERT_FALSE(entry.contains("extern"));
  fs::create_directories(key_dir(k));
  nlohmann::json file = {{"format", "shardfuse-tune-cache"}, {"version", 1}, {"key", k.text()}, {"entry", entry}};
  write_text(key_dir(k) / (fnv1a_hex(e.config) + ".json"), file.dump(2));
  std::map<std::string, CacheEntry> loaded = cache_->load(k);
  ASSERT_EQ(loaded.size(), 1u);
  EXPECT_EQ(loaded.begin()->second, e);
  EXPECT_FALSE(loaded.begin()->second.is_extern());
  EXPECT_TRUE(cache_->take_warnings().empty());
}

TEST_F(CacheTest, AnExternEntryWhoseTwoNamesDisagreeIsRefused) {
  const nlohmann::json good = entry_to_json(extern_entry());
  struct Case {
    const char* what;
    std::function<void(nlohmann::json&)> damage;
    const char* expect;
  };
  const std::vector<Case> cases = {
      {"no extern object", [](nlohmann::json& j) { j.erase("extern"); }, "names a library but the entry has no 'extern'"},
      {"another library", [](nlohmann::json& j) { j["extern"]["library"] = "cublas"; },
       "does not match its extern library 'cublas'"},
      {"a config under an extern object", [](nlohmann::json& j) { j["config"] = "block_m=64"; },
       "does not match its extern library"},
      {"extern not an object", [](nlohmann::json& j) { j["extern"] = "cublaslt"; }, "'extern' must be an object"},
      {"no library", [](nlohmann::json& j) { j["extern"].erase("library"); }, "'library' is missing"},
  };
  for (const Case& c : cases) {
    nlohmann::json j = good;
    c.damage(j);
    Result<CacheEntry> r = entry_from_json(j);
    ASSERT_FALSE(r.ok()) << c.what;
    EXPECT_NE(r.error().message.find(c.expect), std::string::npos) << c.what << ": " << r.error().message;
  }
}

TEST_F(CacheTest, StoreThenLoadRoundTripsEveryStatus) {
  TuneKey k = test_key();
  std::map<std::string, CacheEntry> want;
  int bm = 16;
  for (auto s : {CacheEntry::Status::Built, CacheEntry::Status::Measured, CacheEntry::Status::Invalid,
                 CacheEntry::Status::Pruned}) {
    CacheEntry e = matmul_entry(bm *= 2, s);
    ASSERT_TRUE(cache_->store(k, e).ok()) << e.config;
    want[e.config] = e;
  }
  EXPECT_EQ(cache_->load(k), want);
  EXPECT_TRUE(cache_->take_warnings().empty());

  // The layout the header promises: key.json, one <fnv1a(config)>.json per entry,
  // each a versioned envelope around the key text and the entry.
  std::vector<std::string> expect_files = {"key.json"};
  for (const auto& [config, e] : want) expect_files.push_back(fnv1a_hex(config) + ".json");
  std::sort(expect_files.begin(), expect_files.end());
  EXPECT_EQ(files_in(k), expect_files);
  nlohmann::json kj = nlohmann::json::parse(read_text(key_dir(k) / "key.json"));
  EXPECT_EQ(kj["format"], "shardfuse-tune-cache");
  EXPECT_EQ(kj["version"], 1);
  EXPECT_EQ(kj["key"], k.text());
  EXPECT_EQ(kj["target"], "sm_90a");
  EXPECT_EQ(kj["toolchain"], k.toolchain);
  const CacheEntry& first = want.begin()->second;
  nlohmann::json ej = nlohmann::json::parse(read_text(key_dir(k) / (fnv1a_hex(first.config) + ".json")));
  EXPECT_EQ(ej["format"], "shardfuse-tune-cache");
  EXPECT_EQ(ej["version"], 1);
  EXPECT_EQ(ej["key"], k.text());
  EXPECT_EQ(ej["entry"], entry_to_json(first));
}

TEST_F(CacheTest, StoreStampsTheTimeWhenMissing) {
  TuneKey k = test_key();
  CacheEntry e = matmul_entry(64, CacheEntry::Status::Built);
  e.when.clear();
  ASSERT_TRUE(cache_->store(k, e).ok());
  auto got = cache_->load(k);
  ASSERT_EQ(got.count(e.config), 1u);
  const std::string& when = got[e.config].when;
  // "2025-01-02T03:04:05Z"
  ASSERT_EQ(when.size(), 20u) << when;
  EXPECT_EQ(when[10], 'T');
  EXPECT_EQ(when.back(), 'Z');
}

TEST_F(CacheTest, MissingKeyLoadsNothing) {
  EXPECT_TRUE(cache_->load(test_key()).empty());
  EXPECT_TRUE(cache_->take_warnings().empty());
  // Loading creates nothing.
  EXPECT_FALSE(fs::exists(fs::path(cache_->dir()) / "v1"));
}

// Any field of the key that differs (target, toolchain, shapes, signature) gives a
// different folder: a new ptxas or a new GPU never sees the old results.
TEST_F(CacheTest, AnotherKeySeesNoneOfTheEntries) {
  TuneKey k = test_key();
  CacheEntry e = matmul_entry(64, CacheEntry::Status::Measured);
  ASSERT_TRUE(cache_->store(k, e).ok());
  ASSERT_EQ(cache_->load(k).size(), 1u);

  std::vector<std::pair<const char*, TuneKey>> others;
  TuneKey t = k;
  t.target = "sm_80";
  others.push_back({"target", t});
  t = k;
  t.toolchain = "llvm 19.1.7; ptxas 12.8.93";
  others.push_back({"toolchain", t});
  t = k;
  t.toolchain += "; driver 13000";
  others.push_back({"driver", t});
  t = k;
  t.shapes = "64x512,512x256->64x256";
  others.push_back({"shapes", t});
  t = k;
  t.signature = "fedcba9876543210";
  others.push_back({"signature", t});
  for (const auto& [what, other] : others) {
    EXPECT_TRUE(cache_->load(other).empty()) << what;
    EXPECT_NE(other.hash(), k.hash()) << what;
  }
  // And the original still hits, untouched by the misses.
  EXPECT_EQ(cache_->load(k).at(e.config), e);
  EXPECT_TRUE(cache_->take_warnings().empty());
}

TEST_F(CacheTest, AddingAConfigKeepsTheOthers) {
  TuneKey k = test_key();
  CacheEntry a = matmul_entry(32, CacheEntry::Status::Measured);
  CacheEntry b = matmul_entry(64, CacheEntry::Status::Pruned);
  ASSERT_TRUE(cache_->store(k, a).ok());
  ASSERT_TRUE(cache_->store(k, b).ok());
  std::string a_file = read_text(key_dir(k) / (fnv1a_hex(a.config) + ".json"));

  CacheEntry c = matmul_entry(128, CacheEntry::Status::Built);
  ASSERT_TRUE(cache_->store(k, c).ok());
  auto got = cache_->load(k);
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got.at(a.config), a);
  EXPECT_EQ(got.at(b.config), b);
  EXPECT_EQ(got.at(c.config), c);
  // A's file was not rewritten.
  EXPECT_EQ(read_text(key_dir(k) / (fnv1a_hex(a.config) + ".json")), a_file);

  // Storing a config again replaces just that one entry.
  CacheEntry c2 = c;
  c2.status = CacheEntry::Status::Measured;
  c2.measurement.median_us = 5;
  ASSERT_TRUE(cache_->store(k, c2).ok());
  got = cache_->load(k);
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got.at(c.config), c2);
  EXPECT_EQ(got.at(a.config), a);
}

// Every kind of damage: each file is reported once, removed, and the good entries
// still load; a second load is quiet.
TEST_F(CacheTest, DamagedFilesAreReportedOnceAndRemoved) {
  TuneKey k = test_key();
  CacheEntry good = matmul_entry(32, CacheEntry::Status::Measured);
  ASSERT_TRUE(cache_->store(k, good).ok());
  const fs::path d = key_dir(k);
  const std::string good_text = read_text(d / (fnv1a_hex(good.config) + ".json"));

  // Each damaged file stands where a real config's entry would be.
  std::vector<CacheEntry> victims;
  for (int bm : {64, 128, 256, 512, 1024, 2048, 4096}) victims.push_back(matmul_entry(bm, CacheEntry::Status::Built));
  auto path_of = [&](const CacheEntry& e) { return d / (fnv1a_hex(e.config) + ".json"); };

  struct Damage {
    std::string why;   // expected in the warning
    std::string text;  // the file's content
  };
  nlohmann::json wrong_version = nlohmann::json::parse(good_text);
  wrong_version["version"] = 2;
  nlohmann::json wrong_format = nlohmann::json::parse(good_text);
  wrong_format["format"] = "something-else";
  TuneKey other = k;
  other.target = "sm_80";
  nlohmann::json foreign = nlohmann::json::parse(good_text);
  foreign["key"] = other.text();
  nlohmann::json bad_entry = nlohmann::json::parse(good_text);
  bad_entry["entry"]["status"] = "finished";
  std::vector<Damage> damage = {
      {"not valid JSON", good_text.substr(0, good_text.size() / 2)},  // truncated
      {"not valid JSON", "\x7f" "ELF\x01\x02 garbage"},
      {"format version 2, expected 1", wrong_version.dump()},
      {"not a shardfuse-tune-cache file", wrong_format.dump()},
      {"written for another key", foreign.dump()},
      {"file name does not match its config", good_text},  // renamed to another config's hash
      {"bad entry: unknown status 'finished'", bad_entry.dump()},
  };
  ASSERT_EQ(damage.size(), victims.size());
  for (size_t i = 0; i < damage.size(); ++i) write_text(path_of(victims[i]), damage[i].text);
  // Not entries: in-flight temporaries, the lock, stray files of other names.
  write_text(d / ".tmp-123-abc-0", "{half");
  write_text(d / ".lock", "");
  write_text(d / "README", "hello");

  auto got = cache_->load(k);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got.at(good.config), good);
  std::vector<std::string> warnings = cache_->take_warnings();
  ASSERT_EQ(warnings.size(), damage.size());
  for (size_t i = 0; i < damage.size(); ++i) {
    std::string p = path_of(victims[i]).string();
    // Exactly one warning names this file, with its reason.
    int n = 0;
    for (const std::string& w : warnings) {
      if (w.find(p) == std::string::npos) continue;
      ++n;
      EXPECT_EQ(w.rfind("tuning cache: " + p + ": ", 0), 0u) << w;
      EXPECT_NE(w.find(damage[i].why), std::string::npos) << w;
      EXPECT_NE(w.find("; removed, the config will be tuned again"), std::string::npos) << w;
    }
    EXPECT_EQ(n, 1) << p;
    EXPECT_FALSE(fs::exists(p)) << p;
  }
  EXPECT_TRUE(cache_->take_warnings().empty());  // taken means cleared

  // The others are left alone, and the next load is quiet and the same.
  EXPECT_TRUE(fs::exists(d / ".tmp-123-abc-0"));
  EXPECT_TRUE(fs::exists(d / "README"));
  EXPECT_TRUE(fs::exists(d / "key.json"));
  EXPECT_EQ(cache_->load(k), got);
  EXPECT_TRUE(cache_->take_warnings().empty());

  // And a removed config can be stored and loaded again.
  ASSERT_TRUE(cache_->store(k, victims[0]).ok());
  EXPECT_EQ(cache_->load(k).size(), 2u);
}

TEST_F(CacheTest, OpenReportsAFileInTheWay) {
  fs::path blocker = root_ / "blocker";
  write_text(blocker, "x");
  auto c = TuneCache::open(blocker.string());
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.error().message.find(blocker.string()), std::string::npos) << c.error().message;
  auto c2 = TuneCache::open((blocker / "sub").string());
  ASSERT_FALSE(c2.ok());
  EXPECT_NE(c2.error().message.find((blocker / "sub").string()), std::string::npos) << c2.error().message;
  EXPECT_NE(c2.error().message.find("cannot create"), std::string::npos) << c2.error().message;
}

// A reader never sees a half-written entry: stores replace the file by rename, so
// a load racing them finds the old version or the new one, never a damaged file
// it would remove.
TEST_F(CacheTest, LoadDuringStoresSeesWholeFiles) {
  TuneKey k = test_key();
  CacheEntry e = matmul_entry(64, CacheEntry::Status::Measured);
  ASSERT_TRUE(cache_->store(k, e).ok());
  std::atomic<bool> done{false};
  std::atomic<int> store_errors{0};
  std::thread writer([&] {
    CacheEntry w = e;
    for (int i = 0; i < 400; ++i) {  // a store takes ~0.4 ms on ext4 (the rename), so ~1 s
      w.measurement.reps = i;
      w.reason = std::string(static_cast<size_t>(i % 97) * 40, 'r');  // sizes vary, so a torn file shows
      if (!cache_->store(k, w).ok()) ++store_errors;
    }
    done = true;
  });
  int loads = 0, misses = 0;
  while (!done) {
    ++loads;
    if (cache_->load(k).count(e.config) != 1) ++misses;
  }
  writer.join();
  EXPECT_EQ(store_errors, 0);
  EXPECT_EQ(misses, 0) << "of " << loads << " loads";
  EXPECT_EQ(cache_->take_warnings(), std::vector<std::string>{});
}

// A directory where the entry's file should go makes the final rename fail (as
// root too, unlike a read-only folder): the Diag names the file and the reason,
// and the temporary file is gone.
TEST_F(CacheTest, StoreReportsAFailedWriteAndLeavesNothingBehind) {
  TuneKey k = test_key();
  CacheEntry a = matmul_entry(32, CacheEntry::Status::Built);
  CacheEntry b = matmul_entry(64, CacheEntry::Status::Built);
  ASSERT_TRUE(cache_->store(k, a).ok());
  const fs::path b_path = key_dir(k) / (fnv1a_hex(b.config) + ".json");
  fs::create_directories(b_path / "x");
  Result<void> d = cache_->store(k, b);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.error().message.rfind("tuning cache: cannot write " + b_path.string() + ": ", 0), 0u) << d.error().message;
  std::vector<std::string> want = {fnv1a_hex(a.config) + ".json", fnv1a_hex(b.config) + ".json", "key.json"};
  std::sort(want.begin(), want.end());  // files_in sorts
  EXPECT_EQ(files_in(k), want);
  // The directory is not an entry: skipped quietly, not removed.
  EXPECT_EQ(cache_->load(k).size(), 1u);
  EXPECT_TRUE(cache_->take_warnings().empty());
  EXPECT_TRUE(fs::is_directory(b_path));

  // A key folder that cannot be created.
  TuneKey other = k;
  other.target = "sm_80";
  fs::create_directories(key_dir(other).parent_path());
  write_text(key_dir(other), "in the way");
  d = cache_->store(other, a);
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.error().message.find("cannot create " + key_dir(other).string()), std::string::npos) << d.error().message;
}

TEST_F(CacheTest, LockTimesOutWhileAnotherThreadHoldsIt) {
  TuneKey k = test_key();
  std::atomic<bool> held{false}, holder_ok{false}, release{false};
  std::thread holder([&] {
    auto l = cache_->lock(k, 5);
    holder_ok = l.ok();
    held = true;
    while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  });
  while (!held) std::this_thread::sleep_for(std::chrono::milliseconds(1));

  // A second open file description in the same process is excluded too.
  auto t0 = std::chrono::steady_clock::now();
  std::optional<Result<TuneCache::Lock>> l;
  if (holder_ok) l.emplace(cache_->lock(k, 0.2));
  double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  release = true;
  holder.join();  // before any ASSERT can return

  ASSERT_TRUE(holder_ok) << "the first thread could not take the lock";
  ASSERT_FALSE(l->ok()) << "took a lock another thread holds";
  EXPECT_EQ(l->error().message,
            "tuning cache: timed out after 0.2 s waiting for the lock on " + (key_dir(k) / ".lock").string());
  EXPECT_GE(waited, 0.2);
  EXPECT_LT(waited, 2.0);

  // Released on destruction: now it is free at once.
  auto l2 = cache_->lock(k, 0);
  EXPECT_TRUE(l2.ok()) << l2.error().str();
}

TEST_F(CacheTest, SecondLockerWaitsUntilTheFirstReleases) {
  TuneKey k = test_key();
  auto first = cache_->lock(k, 1);
  ASSERT_TRUE(first.ok()) << first.error().str();
  std::atomic<bool> got{false};
  std::atomic<bool> released{false};
  bool got_before_release = false;
  std::thread waiter([&] {
    auto l = cache_->lock(k, 10);
    got_before_release = !released;
    got = l.ok();
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_FALSE(got);
  // Moving the lock keeps it held; destroying the moved-to one releases it.
  TuneCache::Lock moved = std::move(first).value();
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(got);
  released = true;
  { TuneCache::Lock gone = std::move(moved); }
  waiter.join();
  EXPECT_TRUE(got);
  EXPECT_FALSE(got_before_release);
}

TEST_F(CacheTest, LockExcludesAnotherProcess) {
  TuneKey k = test_key();
  int to_child[2], to_parent[2];
  ASSERT_EQ(::pipe(to_child), 0);
  ASSERT_EQ(::pipe(to_parent), 0);
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // Child: only the cache API and _exit, no gtest.
    auto l = cache_->lock(k, 5);
    char c = l.ok() ? 'y' : 'n';
    if (::write(to_parent[1], &c, 1) != 1) ::_exit(2);
    if (::read(to_child[0], &c, 1) != 1) ::_exit(3);
    ::_exit(l.ok() ? 0 : 1);
  }
  char c = 0;
  ASSERT_EQ(::read(to_parent[0], &c, 1), 1);
  ASSERT_EQ(c, 'y');
  auto l = cache_->lock(k, 0.1);
  EXPECT_FALSE(l.ok());
  if (!l.ok()) {
    EXPECT_NE(l.error().message.find("timed out after 0.1 s"), std::string::npos) << l.error().message;
  }
  ASSERT_EQ(::write(to_child[1], "x", 1), 1);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  for (int fd : {to_child[0], to_child[1], to_parent[0], to_parent[1]}) ::close(fd);
  // The child's exit released it.
  EXPECT_TRUE(cache_->lock(k, 1).ok());
}

// One writer process of ConcurrentWritersInTwoProcesses. Under the key's lock it
// stores its own configs and bumps a counter file with a deliberately racy
// read-sleep-write, which only stays exact if the lock excludes the other process;
// without the lock it stores one shared config each round, so renames onto the
// same name race. Returns the exit code.
int stress_writer(const std::string& dir, const TuneKey& k, int writer, int rounds, const fs::path& counter,
                  int start_fd) {
  char go;
  if (::read(start_fd, &go, 1) < 0) return 10;  // EOF when the parent closes it: both start together
  auto cache = TuneCache::open(dir);
  if (!cache.ok()) return 11;
  for (int i = 0; i < rounds; ++i) {
    {
      auto l = (*cache)->lock(k, 30);
      if (!l.ok()) {
        std::fprintf(stderr, "writer %d: %s\n", writer, l.error().str().c_str());
        return 12;
      }
      CacheEntry e = matmul_entry(1000 * (writer + 1) + i, CacheEntry::Status::Measured);
      e.measurement.reps = writer;
      if (Result<void> d = (*cache)->store(k, e); !d.ok()) {
        std::fprintf(stderr, "writer %d: %s\n", writer, d.error().str().c_str());
        return 13;
      }
      int fd = ::open(counter.c_str(), O_RDWR | O_CREAT, 0644);
      if (fd < 0) return 14;
      char buf[32] = {};
      ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
      if (n < 0) return 15;
      int value = std::atoi(buf);
      std::this_thread::sleep_for(std::chrono::microseconds(200));
      std::string s = std::to_string(value + 1) + "\n";
      if (::pwrite(fd, s.data(), s.size(), 0) != static_cast<ssize_t>(s.size())) return 16;
      ::close(fd);
    }
    CacheEntry shared = matmul_entry(7, CacheEntry::Status::Measured);
    shared.measurement.reps = writer;
    shared.measurement.outliers = i;
    if (Result<void> d = (*cache)->store(k, shared); !d.ok()) {
      std::fprintf(stderr, "writer %d: %s\n", writer, d.error().str().c_str());
      return 17;
    }
  }
  return 0;
}

TEST_F(CacheTest, ConcurrentWritersInTwoProcesses) {
  constexpr int kRounds = 50;
  TuneKey k = test_key();
  const fs::path counter = root_ / "counter";
  int start[2];
  ASSERT_EQ(::pipe(start), 0);
  std::vector<pid_t> pids;
  for (int w = 0; w < 2; ++w) {
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      // Child: only the cache API and _exit, no gtest.
      ::close(start[1]);
      ::_exit(stress_writer(cache_->dir(), k, w, kRounds, counter, start[0]));
    }
    pids.push_back(pid);
  }
  ::close(start[0]);
  ::close(start[1]);  // go
  for (pid_t pid : pids) {
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "writer exit status " << status;
  }

  // Every round of both writers held the lock alone.
  EXPECT_EQ(std::atoi(read_text(counter).c_str()), 2 * kRounds);
  auto got = cache_->load(k);
  EXPECT_TRUE(cache_->take_warnings().empty());
  ASSERT_EQ(got.size(), 2u * kRounds + 1);
  for (int w = 0; w < 2; ++w) {
    for (int i = 0; i < kRounds; ++i) {
      CacheEntry e = matmul_entry(1000 * (w + 1) + i, CacheEntry::Status::Measured);
      e.measurement.reps = w;
      ASSERT_EQ(got.count(e.config), 1u) << e.config;
      EXPECT_EQ(got.at(e.config), e);
    }
  }
  // The shared config is one writer's last version, whole.
  const CacheEntry& shared = got.at(matmul_entry(7, CacheEntry::Status::Measured).config);
  EXPECT_TRUE(shared.measurement.reps == 0 || shared.measurement.reps == 1);
  EXPECT_EQ(shared.measurement.outliers, kRounds - 1);
  // No temporaries left: key.json, the lock and the entries.
  std::vector<std::string> files = files_in(k);
  EXPECT_EQ(files.size(), 2u * kRounds + 1 + 2);
  for (const std::string& f : files) EXPECT_FALSE(f.starts_with(".tmp-")) << f;
}

// Restores an environment variable on scope exit.
class EnvGuard {
 public:
  explicit EnvGuard(const char* name) : name_(name) {
    if (const char* v = std::getenv(name)) old_ = v;
  }
  ~EnvGuard() {
    if (old_)
      ::setenv(name_, old_->c_str(), 1);
    else
      ::unsetenv(name_);
  }
  void set(const char* v) { ::setenv(name_, v, 1); }
  void unset() { ::unsetenv(name_); }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

TEST_F(CacheTest, DefaultDirHonoursTheEnvironment) {
  EnvGuard cache_dir("SHARDFUSE_CACHE_DIR"), xdg("XDG_CACHE_HOME"), home("HOME");
  cache_dir.set("/opt/sfcache");
  xdg.set("/xdg");
  home.set("/home/u");
  EXPECT_EQ(TuneCache::default_dir(), "/opt/sfcache");
  cache_dir.set("");  // empty counts as unset
  EXPECT_EQ(TuneCache::default_dir(), "/xdg/shardfuse");
  cache_dir.unset();
  EXPECT_EQ(TuneCache::default_dir(), "/xdg/shardfuse");
  xdg.set("relative/xdg");  // the XDG spec: ignore relative paths
  EXPECT_EQ(TuneCache::default_dir(), "/home/u/.cache/shardfuse");
  xdg.unset();
  EXPECT_EQ(TuneCache::default_dir(), "/home/u/.cache/shardfuse");
  home.unset();
  EXPECT_EQ(TuneCache::default_dir(), "/tmp/shardfuse-cache");
}

}  // namespace autotune_cache_test
}  // namespace sf
