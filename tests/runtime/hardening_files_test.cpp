// The pieces under the CLI's file handling (issue 14, classes 7 and 8): the one
// reader of user files (regular files only, capped), the tuning cache's entries
// held to that cap, outputs written all or none, and number literals that
// underflow.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "autotune/cache.h"
#include "runtime/core/file_io.h"
#include "codegen/ir/parser.h"
#include "runtime/io/npy.h"
#include "tests/result_util.h"

namespace sf {
namespace runtime_hardening_files_test {

namespace fs = std::filesystem;

class HardeningFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::path(::testing::TempDir()) / "sf-hardening-XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  void write(const std::string& name, const std::string& text) const {
    std::ofstream(dir_ / name, std::ios::binary) << text;
  }
  fs::path dir_;
};

TEST_F(HardeningFiles, ReadsARegularFileWhole) {
  write("a.txt", "hello\n");
  Result<std::string> r = read_regular_file(path("a.txt"), 100, "text");
  ASSERT_TRUE(r.ok()) << r.error().str();
  EXPECT_EQ(*r, "hello\n");
  fs::create_symlink(path("a.txt"), path("link"));  // a link to a regular file is one
  EXPECT_TRUE(read_regular_file(path("link"), 100, "text").ok());
}

TEST_F(HardeningFiles, RefusesWhatIsNotARegularFile) {
  ASSERT_EQ(::mkfifo(path("fifo").c_str(), 0644), 0);
  // Without O_NONBLOCK this open would wait for a writer forever.
  Result<std::string> fifo = read_regular_file(path("fifo"), 100, "graph file");
  ASSERT_FALSE(fifo.ok());
  EXPECT_EQ(fifo.error().file, path("fifo"));
  EXPECT_EQ(fifo.error().message, "is a FIFO (named pipe), not a regular file (expected a graph file)");
  Result<std::string> dir = read_regular_file(dir_.string(), 100, "");
  ASSERT_FALSE(dir.ok());
  EXPECT_EQ(dir.error().message, "is a directory, not a regular file");
  Result<std::string> zero = read_regular_file("/dev/zero", 100, "");
  ASSERT_FALSE(zero.ok());
  EXPECT_EQ(zero.error().message, "is a character device, not a regular file");
  Result<std::string> missing = read_regular_file(path("nope"), 100, "");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().message, "cannot open file: No such file or directory");
}

TEST_F(HardeningFiles, RefusesAFileOverTheCapWithoutReadingIt) {
  write("big", "x");
  fs::resize_file(path("big"), uint64_t{3} << 30);  // sparse: no disk space, no read
  Result<std::string> r = read_regular_file(path("big"), kMaxGraphFileBytes, "");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().message, "file is 3 GiB, over the 16 MiB limit");
  write("eleven", "12345678901");
  EXPECT_FALSE(read_regular_file(path("eleven"), 10, "").ok());
  EXPECT_TRUE(read_regular_file(path("eleven"), 11, "").ok());
}

TEST_F(HardeningFiles, ByteCountsForMessages) {
  EXPECT_EQ(bytes_str(0), "0 bytes");
  EXPECT_EQ(bytes_str(1023), "1023 bytes");
  EXPECT_EQ(bytes_str(16u << 20), "16 MiB");
  EXPECT_EQ(bytes_str(uint64_t{3} << 29), "1.5 GiB");
}

TEST_F(HardeningFiles, ATuningCacheEntryOverTheCapIsRefusedUnread) {
  Result<std::unique_ptr<TuneCache>> c = TuneCache::open(path("cache"));
  ASSERT_TRUE(c.ok()) << c.error().str();
  TuneKey key;
  key.kind = "pointwise";
  key.signature = "sig";
  key.shapes = "4x4";
  key.target = "cpu";
  key.toolchain = "t";
  CacheEntry e;
  e.config = "block=4";
  e.status = CacheEntry::Status::Built;
  ASSERT_TRUE((*c)->store(key, e).ok());
  fs::path entry;
  for (const auto& f : fs::recursive_directory_iterator(path("cache")))
    if (f.path().extension() == ".json" && f.path().filename() != "key.json") entry = f.path();
  ASSERT_FALSE(entry.empty());
  fs::resize_file(entry, kMaxJsonFileBytes + 1);  // sparse zeros after the JSON
  std::map<std::string, CacheEntry> loaded = (*c)->load(key);
  EXPECT_TRUE(loaded.empty());
  std::vector<std::string> w = (*c)->take_warnings();
  ASSERT_EQ(w.size(), 1u);
  EXPECT_NE(w[0].find("over the 16 MiB limit"), std::string::npos) << w[0];
}

TEST_F(HardeningFiles, OutputsAreWrittenAllOrNone) {
  Tensor a(DType::F32, {2}), b(DType::F32, {3});
  fs::create_directory(path("b.npy"));  // b's name is taken by a directory
  Result<void> d = write_npy_all({{path("a.npy"), &a}, {path("b.npy"), &b}});
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.error().file, path("b.npy"));
  EXPECT_FALSE(fs::exists(path("a.npy")));
  EXPECT_TRUE(fs::is_directory(path("b.npy")));
  for (const auto& f : fs::directory_iterator(dir_))
    EXPECT_EQ(f.path().filename(), "b.npy") << "left behind: " << f.path();
  fs::remove(path("b.npy"));
  EXPECT_TRUE(succeeded(write_npy_all({{path("a.npy"), &a}, {path("b.npy"), &b}})));
  EXPECT_TRUE(fs::is_regular_file(path("a.npy")));
  EXPECT_TRUE(fs::is_regular_file(path("b.npy")));
}

TEST_F(HardeningFiles, AnNpyInputThatIsAFifoIsRefused) {
  ASSERT_EQ(::mkfifo(path("x.npy").c_str(), 0644), 0);
  Result<Tensor> t = read_npy(path("x.npy"), TensorType{DType::F32, {2}}, "x");
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.error().message.find("is a FIFO"), std::string::npos) << t.error().str();
}

TEST_F(HardeningFiles, NumbersThatUnderflowRoundToZeroAndOverflowIsRefused) {
  for (const char* lit : {"1e-400", "-1e-400", "2.5e-330", "0.000001e-320"}) {
    Result<Graph> g = parse_graph(std::string("graph g(x: f32[2]) {\n  y = add(x, ") + lit + ")\n  return y\n}\n",
                                  "t.sf");
    EXPECT_TRUE(g.ok()) << lit << ": " << g.error().str();
  }
  for (const char* lit : {"1e400", "-1e400", "1.8e308"}) {
    Result<Graph> g = parse_graph(std::string("graph g(x: f32[2]) {\n  y = add(x, ") + lit + ")\n  return y\n}\n",
                                  "t.sf");
    ASSERT_FALSE(g.ok()) << lit;
    EXPECT_EQ(g.error().str(), std::string("t.sf:2:14: error: number ") + lit +
                                   " is out of the range of a 64-bit float");
  }
}

}  // namespace runtime_hardening_files_test
}  // namespace sf
