#include "runtime/io/npy.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "tests/result_util.h"

namespace sf {
namespace runtime_npy_test {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::AnyOf;
using ::testing::HasSubstr;
using ::testing::StartsWith;

// NumPy from Debian's python3-numpy (scripts/setup); the `python3` first on PATH may be
// another interpreter without it.
constexpr const char* kPython = "/usr/bin/python3";

bool numpy_available() {
  static const bool ok =
      std::system((std::string(kPython) + " -c 'import numpy' >/dev/null 2>&1").c_str()) == 0;
  return ok;
}

std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const fs::path& p, std::string_view bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << p;
}

// A .npy file put together by hand: magic, version, little-endian header length
// (2 bytes for 1.x, 4 otherwise), the header exactly as given, then `data`.
std::string npy_bytes(std::string_view header, std::string_view data, int major = 1, int minor = 0) {
  std::string s("\x93NUMPY", 6);
  s += static_cast<char>(major);
  s += static_cast<char>(minor);
  size_t n = header.size();
  int len_bytes = major == 1 ? 2 : 4;
  for (int k = 0; k < len_bytes; ++k) s += static_cast<char>((n >> (8 * k)) & 0xFF);
  s += header;
  s += data;
  return s;
}

std::string dict(std::string_view descr, std::string_view shape, std::string_view fortran = "False") {
  return "{'descr': '" + std::string(descr) + "', 'fortran_order': " + std::string(fortran) +
         ", 'shape': " + std::string(shape) + ", }\n";
}

template <class T>
std::string raw(std::initializer_list<T> values) {
  std::string s;
  for (T v : values) s.append(reinterpret_cast<const char*>(&v), sizeof v);  // the host is little-endian
  return s;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.type() == b.type() && (a.nbytes() == 0 || std::memcmp(a.data(), b.data(), a.nbytes()) == 0);
}

// Values that exercise each dtype: extremes, rounding, signed zero, Inf and NaN.
Tensor sample(DType t, Shape shape) {
  Tensor x(t, std::move(shape));
  const double floats[] = {0.1, -2.5, 1e-5, std::numeric_limits<double>::infinity(), -0.0,
                           std::nan(""), 65504.0, 1.0 / 3.0, -1e30};
  const int64_t ints[] = {0, -1, 7, std::numeric_limits<int64_t>::min(), (int64_t{1} << 62) + 1,
                          std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max()};
  for (int64_t i = 0; i < x.numel(); ++i) {
    if (is_float(t)) {
      x.set(i, floats[i % std::size(floats)]);
    } else if (t == DType::Bool) {
      x.set_int(i, i % 3 == 1);
    } else {
      int64_t v = ints[i % std::size(ints)];
      if (t == DType::I32) v = static_cast<int32_t>(v % (int64_t{1} << 31));
      x.set_int(i, v);
    }
  }
  return x;
}

class NpyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::path(::testing::TempDir()) / "npy_test_XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr) << tmpl;
    dir_ = tmpl;
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  std::string path(std::string_view name) const { return (dir_ / name).string(); }

  std::string file(std::string_view name, std::string_view bytes) const {
    std::string p = path(name);
    write_bytes(p, bytes);
    return p;
  }

  std::set<std::string> listing() const {
    std::set<std::string> names;
    for (const auto& e : fs::directory_iterator(dir_)) names.insert(e.path().filename().string());
    return names;
  }

  // Reads `p` expecting an error; returns its full text (`file: error: message`).
  static std::string read_error(const std::string& p, const TensorType& expected, std::string_view what = "x") {
    Result<Tensor> r = read_npy(p, expected, what);
    EXPECT_FALSE(r.ok()) << p;
    if (r.ok()) return "";
    EXPECT_EQ(r.error().file, p);
    std::string s = r.error().str();
    EXPECT_THAT(s, StartsWith(p + ": error: "));
    return s;
  }

  // Runs a Python script with NumPy; returns its stdout and stderr.
  std::string run_python(const std::string& script) const {
    std::string sp = path("script.py");
    write_bytes(sp, script);
    std::string cmd = std::string(kPython) + " '" + sp + "' '" + dir_.string() + "' 2>&1";
    std::FILE* p = ::popen(cmd.c_str(), "r");
    EXPECT_NE(p, nullptr);
    if (!p) return "";
    std::string out;
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
    int status = ::pclose(p);
    EXPECT_EQ(status, 0) << cmd << "\n" << out;
    return out;
  }

  fs::path dir_;
};

const TensorType kF32x23{DType::F32, {2, 3}};

// ---- round trips --------------------------------------------------------------------

class NpyRoundTrip : public NpyTest, public ::testing::WithParamInterface<DType> {};

TEST_P(NpyRoundTrip, WriteThenReadIsBitExact) {
  for (const Shape& shape : {Shape{2, 3}, Shape{7}, Shape{}, Shape{0, 3}, Shape{3, 0, 2}, Shape{2, 1, 2, 3}}) {
    Tensor t = sample(GetParam(), shape);
    std::string p = path("t.npy");
    ASSERT_TRUE(succeeded(write_npy(p, t)));
    Result<Tensor> r = read_npy(p, t.type());
    ASSERT_TRUE(r.ok()) << r.error().str();
    EXPECT_TRUE(same_bytes(*r, t)) << t.type().str();
  }
  EXPECT_EQ(listing(), std::set<std::string>{"t.npy"});  // no temporaries left
}

TEST_P(NpyRoundTrip, HeaderIsTheOneNumPyWrites) {
  DType t = GetParam();
  std::string p = path("t.npy");
  ASSERT_TRUE(succeeded(write_npy(p, Tensor(t, {20, 10}))));
  std::string bytes = read_bytes(p);
  ASSERT_GE(bytes.size(), 10u);
  EXPECT_EQ(bytes.substr(0, 8), std::string("\x93NUMPY\x01\x00", 8));
  size_t hlen = static_cast<unsigned char>(bytes[8]) | static_cast<unsigned char>(bytes[9]) << 8;
  EXPECT_EQ((10 + hlen) % 64, 0u) << "data must start on a 64-byte boundary";
  std::string header = bytes.substr(10, hlen);
  const char* descr = t == DType::F32 || t == DType::BF16 ? "<f4"
                      : t == DType::F16                   ? "<f2"
                      : t == DType::I32                   ? "<i4"
                      : t == DType::I64                   ? "<i8"
                                                          : "|b1";
  EXPECT_THAT(header, StartsWith("{'descr': '" + std::string(descr) +
                                 "', 'fortran_order': False, 'shape': (20, 10), }"));
  EXPECT_EQ(header.back(), '\n');
  int file_size = t == DType::BF16 ? 4 : dtype_size(t);
  EXPECT_EQ(bytes.size(), 10 + hlen + 200u * file_size);
}

INSTANTIATE_TEST_SUITE_P(EveryDType, NpyRoundTrip, ::testing::ValuesIn(kAllDTypes),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST_F(NpyTest, ScalarRoundTripsWithEmptyShapeTuple) {
  Tensor t(DType::F32, {});
  t.set(0, 3.5);
  std::string p = path("s.npy");
  ASSERT_TRUE(succeeded(write_npy(p, t)));
  EXPECT_THAT(read_bytes(p), HasSubstr("'shape': (), }"));
  Result<Tensor> r = read_npy(p, {DType::F32, {}});
  ASSERT_TRUE(r.ok()) << r.error().str();
  EXPECT_EQ(r->get(0), 3.5);
}

TEST_F(NpyTest, OneDimensionalShapeHasTrailingComma) {
  std::string p = path("v.npy");
  ASSERT_TRUE(succeeded(write_npy(p, Tensor(DType::I32, {5}))));
  EXPECT_THAT(read_bytes(p), HasSubstr("'shape': (5,), }"));
}

TEST_F(NpyTest, EmptyTensorHasNoDataBytes) {
  std::string p = path("e.npy");
  ASSERT_TRUE(succeeded(write_npy(p, Tensor(DType::F32, {4, 0}))));
  EXPECT_EQ(read_bytes(p).size() % 64, 0u);  // header only
  Result<Tensor> r = read_npy(p, {DType::F32, {4, 0}});
  ASSERT_TRUE(r.ok()) << r.error().str();
  EXPECT_EQ(r->numel(), 0);
}

TEST_F(NpyTest, Bf16IsWrittenAsF4AndReadBackExactly) {
  Tensor t(DType::BF16, {3});
  t.set(0, 1.0078125);  // bf16 neighbours of 1 are 2^-7 apart
  t.set(1, -3.0e38);
  t.set(2, 1e-40);  // subnormal in bf16 and f32
  std::string p = path("b.npy");
  ASSERT_TRUE(succeeded(write_npy(p, t)));
  Result<Tensor> as_f32 = read_npy(p, {DType::F32, {3}});
  ASSERT_TRUE(as_f32.ok()) << as_f32.error().str();
  for (int i = 0; i < 3; ++i) EXPECT_EQ(as_f32->get(i), t.get(i));
  Result<Tensor> as_bf16 = read_npy(p, {DType::BF16, {3}});
  ASSERT_TRUE(as_bf16.ok()) << as_bf16.error().str();
  EXPECT_TRUE(same_bytes(*as_bf16, t));
}

TEST_F(NpyTest, OverwriteReplacesTheFileAndLeavesNoTemporaries) {
  std::string p = path("o.npy");
  Tensor a(DType::I64, {2});
  a.set_int(0, 1);
  Tensor b(DType::I64, {3});
  b.set_int(2, 42);
  ASSERT_TRUE(succeeded(write_npy(p, a)));
  ASSERT_TRUE(succeeded(write_npy(p, b)));
  Result<Tensor> r = read_npy(p, b.type());
  ASSERT_TRUE(r.ok()) << r.error().str();
  EXPECT_EQ(r->get_int(2), 42);
  EXPECT_EQ(listing(), std::set<std::string>{"o.npy"});
}

TEST_F(NpyTest, WriteIntoMissingDirectoryFailsAndCreatesNothing) {
  std::string p = path("no/such/dir/x.npy");
  Result<void> d = write_npy(p, Tensor(DType::F32, {2}));
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.error().file, p);
  EXPECT_THAT(d.error().str(), AllOf(HasSubstr(p), HasSubstr("cannot write"), HasSubstr("No such file or directory")));
  EXPECT_TRUE(listing().empty());
}

TEST_F(NpyTest, WriteOverADirectoryFailsAndLeavesNothingBehind) {
  std::string p = path("d.npy");
  fs::create_directory(p);
  write_bytes(fs::path(p) / "keep", "x");
  Result<void> d = write_npy(p, Tensor(DType::F32, {2}));
  ASSERT_FALSE(d.ok());
  // Refused before anything is staged: a rename over a directory is never tried.
  EXPECT_THAT(d.error().str(), AllOf(HasSubstr(p), HasSubstr("exists and is not a regular file"),
                                     HasSubstr("refusing to replace it")));
  EXPECT_EQ(listing(), std::set<std::string>{"d.npy"});  // the temporary is gone
  EXPECT_EQ(read_bytes(fs::path(p) / "keep"), "x");
}

TEST_F(NpyTest, WriteIntoReadOnlyDirectoryFails) {
  if (::geteuid() == 0) GTEST_SKIP() << "root ignores directory permissions";
  fs::path ro = dir_ / "ro";
  fs::create_directory(ro);
  fs::permissions(ro, fs::perms::owner_read | fs::perms::owner_exec);
  std::string p = (ro / "x.npy").string();
  Result<void> d = write_npy(p, Tensor(DType::F32, {2}));
  fs::permissions(ro, fs::perms::owner_all);
  ASSERT_FALSE(d.ok());
  EXPECT_THAT(d.error().str(), AllOf(HasSubstr(p), HasSubstr("Permission denied")));
  EXPECT_TRUE(fs::is_empty(ro));
}

// ---- conversions to the parameter's type -------------------------------------------------

TEST_F(NpyTest, F8FileFeedsF32F16AndBf16RoundingOnce) {
  const double v[] = {0.1, 1.0 / 3.0, 1e300, -0.0, 1.00048828125 /* f16 tie -> even */};
  std::string p = file("d.npy", npy_bytes(dict("<f8", "(5,)"), raw<double>({v[0], v[1], v[2], v[3], v[4]})));
  for (DType t : {DType::F32, DType::F16, DType::BF16}) {
    Result<Tensor> r = read_npy(p, {t, {5}});
    ASSERT_TRUE(r.ok()) << r.error().str();
    for (int i = 0; i < 5; ++i) EXPECT_EQ(r->get(i), round_to_dtype(v[i], t)) << dtype_name(t) << " " << i;
  }
  Result<Tensor> r = read_npy(p, {DType::F32, {5}});
  EXPECT_TRUE(std::isinf(r->get(2)));  // 1e300 overflows f32, as astype(np.float32) does
  EXPECT_TRUE(std::signbit(r->get(3)));
}

TEST_F(NpyTest, F4FileIntoBf16RoundsToNearestEven) {
  // 1 + 2^-8 and 1 + 3*2^-8 are ties between bf16 neighbours; even mantissas win.
  std::string p = file("f.npy", npy_bytes(dict("<f4", "(3,)"), raw<float>({1.00390625f, 1.01171875f, 1.005f})));
  Result<Tensor> r = read_npy(p, {DType::BF16, {3}});
  ASSERT_TRUE(r.ok()) << r.error().str();
  EXPECT_EQ(r->get(0), 1.0);
  EXPECT_EQ(r->get(1), 1.015625);
  EXPECT_EQ(r->get(2), 1.0078125);
}

TEST_F(NpyTest, F2FileFeedsF32Exactly) {
  std::string p = file("h.npy", npy_bytes(dict("<f2", "(2,)"), raw<uint16_t>({0x3555, 0x0001})));
  Result<Tensor> r = read_npy(p, {DType::F32, {2}});
  ASSERT_TRUE(r.ok()) << r.error().str();
  EXPECT_EQ(r->get(0), f16_bits_to_f32(0x3555));
  EXPECT_EQ(r->get(1), std::ldexp(1.0, -24));
}

TEST_F(NpyTest, IntegerFilesFeedI32AndI64) {
  std::string p4 = file("i4.npy", npy_bytes(dict("<i4", "(2,)"), raw<int32_t>({-2147483647 - 1, 5})));
  Result<Tensor> r = read_npy(p4, {DType::I64, {2}});
  ASSERT_TRUE(r.ok()) << r.error().str();
  EXPECT_EQ(r->get_int(0), -2147483648);
  std::string p8 = file("i8.npy", npy_bytes(dict("<i8", "(2,)"), raw<int64_t>({-2147483647 - 1, 2147483647})));
  r = read_npy(p8, {DType::I32, {2}});
  ASSERT_TRUE(r.ok()) << r.error().str();
  EXPECT_EQ(r->get_int(0), -2147483648);
  EXPECT_EQ(r->get_int(1), 2147483647);
}

TEST_F(NpyTest, I8ValueOutOfI32RangeIsAnErrorNamingIt) {
  std::string p = file("big.npy", npy_bytes(dict("<i8", "(2, 2)"), raw<int64_t>({0, 1, 3000000000, 4})));
  EXPECT_THAT(read_error(p, {DType::I32, {2, 2}}),
              AllOf(HasSubstr("value 3000000000 at index [1, 0]"), HasSubstr("out of range for parameter x: i32[2, 2]")));
}

TEST_F(NpyTest, AnyNonZeroBoolByteIsTrue) {
  std::string p = file("b.npy", npy_bytes(dict("|b1", "(3,)"), std::string("\x00\x01\x02", 3)));
  Result<Tensor> r = read_npy(p, {DType::Bool, {3}});
  ASSERT_TRUE(r.ok()) << r.error().str();
  EXPECT_EQ(std::to_integer<int>(r->data()[2]), 1);
  EXPECT_EQ(r->get(0), 0.0);
}

// ---- headers that NumPy (Python's literal syntax) accepts ---------------------------------

class NpyHeaderAccepted : public NpyTest, public ::testing::WithParamInterface<const char*> {};

TEST_P(NpyHeaderAccepted, Reads) {
  std::string p = file("h.npy", npy_bytes(GetParam(), raw<float>({1, 2, 3, 4, 5, 6})));
  Result<Tensor> r = read_npy(p, kF32x23);
  ASSERT_TRUE(r.ok()) << r.error().str();
  EXPECT_EQ(r->get(5), 6.0);
}

INSTANTIATE_TEST_SUITE_P(
    Whitespace, NpyHeaderAccepted,
    ::testing::Values("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }                 \n",
                      "{'descr':'<f4','fortran_order':False,'shape':(2,3)}",
                      "  {\n 'shape' : ( 2 ,\t3 ,) ,\r\n 'fortran_order' : False , \"descr\" : \"<f4\" }  \n",
                      "{'descr': '<f4', 'fortran_order': False, 'shape': (2L, 3L), }\n",  // Python 2's np.save
                      "{'descr': '<f4', 'fortran_order': False, 'shape': ((2), 3)}"));

// ---- every error, with the file name and what was expected and found ----------------------

TEST_F(NpyTest, MissingFile) {
  EXPECT_THAT(read_error(path("nope.npy"), kF32x23),
              AllOf(HasSubstr("cannot open file: No such file or directory"),
                    HasSubstr("expected a .npy file for parameter x: f32[2, 3]")));
}

TEST_F(NpyTest, DirectoryIsUnreadable) {
  fs::create_directory(path("d.npy"));
  EXPECT_THAT(read_error(path("d.npy"), kF32x23),
              AllOf(HasSubstr("is a directory, not a regular file"), HasSubstr("parameter x: f32[2, 3]")));
}

TEST_F(NpyTest, EmptyFile) {
  EXPECT_THAT(read_error(file("e.npy", ""), kF32x23), HasSubstr("file is empty"));
}

TEST_F(NpyTest, BadMagic) {
  EXPECT_THAT(read_error(file("m.npy", "hello world, not numpy"), kF32x23),
              AllOf(HasSubstr("not a .npy file: expected the magic string \\x93NUMPY, found \"hello \"")));
  EXPECT_THAT(read_error(file("m2.npy", "\x93NUMPX\x01\x00"), kF32x23), HasSubstr("found \"\\x93NUMPX\""));
  EXPECT_THAT(read_error(file("m3.npy", "\x01"), kF32x23), HasSubstr("found \"\\x01\""));
}

TEST_F(NpyTest, NpzArchiveIsNamed) {
  EXPECT_THAT(read_error(file("a.npz", std::string("PK\x03\x04\x14\x00\x00\x00", 8)), kF32x23),
              AllOf(HasSubstr("not a .npy file"), HasSubstr("np.savez")));
}

TEST_F(NpyTest, UnsupportedVersion) {
  std::string body = dict("<f4", "(2, 3)");
  EXPECT_THAT(read_error(file("v4.npy", npy_bytes(body, "", 4, 0)), kF32x23),
              HasSubstr("unsupported .npy format version 4.0 (expected 1.0, 2.0 or 3.0)"));
  EXPECT_THAT(read_error(file("v11.npy", npy_bytes(body, "", 1, 1)), kF32x23), HasSubstr("version 1.1"));
  EXPECT_THAT(read_error(file("v0.npy", npy_bytes(body, "", 0, 0)), kF32x23), HasSubstr("version 0.0"));
}

TEST_F(NpyTest, TruncatedPreambleAndHeaderLength) {
  EXPECT_THAT(read_error(file("t1.npy", "\x93NUM"), kF32x23),
              HasSubstr("truncated header: expected the 8-byte magic string and version, found 4 bytes"));
  EXPECT_THAT(read_error(file("t2.npy", std::string("\x93NUMPY\x02\x00\x10\x00", 10)), kF32x23),
              HasSubstr("truncated header: expected a 4-byte header length, found 2 bytes"));
}

TEST_F(NpyTest, TruncatedHeader) {
  std::string full = npy_bytes(dict("<f4", "(2, 3)"), "");
  std::string p = file("t.npy", full.substr(0, 30));
  EXPECT_THAT(read_error(p, kF32x23),
              HasSubstr("truncated header: expected " + std::to_string(full.size() - 10) + " header bytes, found 20"));
}

TEST_F(NpyTest, HeaderLongerThanNumPysLimit) {
  // Version 2.0 announces 70000 header bytes; nothing is allocated for them.
  EXPECT_THAT(read_error(file("l.npy", std::string("\x93NUMPY\x02\x00\x70\x11\x01\x00", 12)), kF32x23),
              HasSubstr("header length 70000 exceeds the 10000-byte limit"));
  std::string padded = dict("<f4", "(2, 3)");
  padded.insert(padded.size() - 1, 10001 - padded.size(), ' ');
  EXPECT_THAT(read_error(file("l2.npy", npy_bytes(padded, raw<float>({1, 2, 3, 4, 5, 6}))), kF32x23),
              HasSubstr("header length 10001 exceeds"));
  std::string at_limit = dict("<f4", "(2, 3)");
  at_limit.insert(at_limit.size() - 1, 10000 - at_limit.size(), ' ');
  EXPECT_TRUE(read_npy(file("l3.npy", npy_bytes(at_limit, raw<float>({1, 2, 3, 4, 5, 6}))), kF32x23).ok());
}

struct BadHeader {
  const char* header;
  const char* message;
  friend void PrintTo(const BadHeader& b, std::ostream* os) { *os << ::testing::PrintToString(b.header); }
};

class NpyHeaderRejected : public NpyTest, public ::testing::WithParamInterface<BadHeader> {};

TEST_P(NpyHeaderRejected, SaysWhatWasExpected) {
  std::string p = file("h.npy", npy_bytes(GetParam().header, raw<float>({1, 2, 3, 4, 5, 6})));
  EXPECT_THAT(read_error(p, kF32x23),
              AllOf(HasSubstr("header is not a valid .npy header dict: "), HasSubstr(GetParam().message)));
}

INSTANTIATE_TEST_SUITE_P(
    NotADict, NpyHeaderRejected,
    ::testing::Values(
        BadHeader{"", "expected a value, found the end of the header at header byte 0"},
        BadHeader{"   \n", "expected a value, found the end of the header"},
        BadHeader{"[1, 2]", "expected a dict, found [1, 2]"},
        BadHeader{"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), ",
                  "expected a value, found the end of the header"},
        BadHeader{"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3)",
                  "expected ',' or '}', found the end of the header"},
        BadHeader{"{'descr': '<f4' 'fortran_order': False}", "expected ',' or '}', found \"'fortran_ord...\""},
        BadHeader{"{'descr' '<f4'}", "expected ':' after a dict key"},
        BadHeader{"{'descr': '<f4\n', 'fortran_order': False, 'shape': (2, 3)}", "unterminated string"},
        BadHeader{"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3)} junk",
                  "expected the end of the header after the dict, found \"junk\""},
        BadHeader{"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), 'extra': 1}",
                  "expected only the keys 'descr', 'fortran_order' and 'shape', found key 'extra'"},
        BadHeader{"{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (2, 3)}",
                  "found key 'descr' twice"},
        BadHeader{"{'descr': '<f4', 'fortran_order': False}", "expected a 'shape' key, found none"},
        BadHeader{"{'fortran_order': False, 'shape': (2, 3)}", "expected a 'descr' key, found none"},
        BadHeader{"{'descr': 5, 'fortran_order': False, 'shape': (2, 3)}",
                  "expected 'descr' to be a dtype string like '<f4', found 5"},
        BadHeader{"{'descr': '<f4', 'fortran_order': 0, 'shape': (2, 3)}",
                  "expected 'fortran_order' to be True or False, found 0"},
        BadHeader{"{'descr': '<f4', 'fortran_order': Maybe, 'shape': (2, 3)}",
                  "expected a value (a string, int, tuple, True, False or None), found \"Maybe"},
        BadHeader{"{'descr': '<f4', 'fortran_order': False, 'shape': [2, 3]}",
                  "expected 'shape' to be a tuple of non-negative ints like (20, 10), found [2, 3]"},
        BadHeader{"{'descr': '<f4', 'fortran_order': False, 'shape': (6)}", "found (6)"},  // (6) is 6
        BadHeader{"{'descr': '<f4', 'fortran_order': False, 'shape': (-2, -3)}", "found (-2, -3)"},
        BadHeader{"{'descr': '<f4', 'fortran_order': False, 'shape': (2, None)}", "found (2, None)"},
        BadHeader{"{'descr': '<f4', 'fortran_order': False, 'shape': (2.5, 3)}", "expected ',' or ')', found \".5"},
        BadHeader{"{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999, 3)}",
                  "integer 99999999999999999999 does not fit in 64 bits"},
        BadHeader{"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3),, }", "expected a value, found \", }"},
        BadHeader{"{'descr': '<f4', 'fortran_order': False, 'shape': (2 3)}", "expected ',' or ')', found \"3)}"},
        BadHeader{"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3)\x01}", "found \"\\x01}"},
        BadHeader{"((((((((((((((((((((((((((((((((((((((((((((((((((", "values nest more than 32 deep"}));

TEST_F(NpyTest, ShapeWhoseByteCountOverflows) {
  std::string p = file("o.npy", npy_bytes(dict("<f4", "(4611686018427387904, 4)"), ""));
  EXPECT_THAT(read_error(p, kF32x23),
              HasSubstr("shape [4611686018427387904, 4] is too large: its byte count does not fit in 64 bits"));
  p = file("o2.npy", npy_bytes(dict("<f8", "(2305843009213693952,)"), ""));
  EXPECT_THAT(read_error(p, kF32x23), HasSubstr("is too large"));
}

TEST_F(NpyTest, FortranOrder) {
  std::string p = file("f.npy", npy_bytes(dict("<f4", "(2, 3)", "True"), raw<float>({1, 2, 3, 4, 5, 6})));
  EXPECT_THAT(read_error(p, kF32x23),
              HasSubstr("Fortran order is not supported; save with np.ascontiguousarray (expected C order for "
                        "parameter x: f32[2, 3])"));
}

TEST_F(NpyTest, BigEndian) {
  std::string p = file("be.npy", npy_bytes(dict(">f4", "(2, 3)"), std::string(24, '\0')));
  EXPECT_THAT(read_error(p, kF32x23),
              HasSubstr("big-endian dtype '>f4' is not supported; save with arr.astype('<f4')"));
}

TEST_F(NpyTest, UnsupportedDTypesAreNamed) {
  for (const char* descr : {"|u1", "|i1", "<u4", "<c8", "|O", "<U3", "=f4", "<f16"}) {
    std::string p = file("u.npy", npy_bytes(dict(descr, "(2, 3)"), std::string(24, '\0')));
    EXPECT_THAT(read_error(p, kF32x23),
                HasSubstr("unsupported dtype '" + std::string(descr) +
                          "' (expected one of <f4 <f2 <f8 <i4 <i8 |b1, for parameter x: f32[2, 3])"));
  }
  std::string p = file("s.npy", npy_bytes("{'descr': [('a', '<f4'), ('b', '<i4')], 'fortran_order': False, "
                                          "'shape': (3,), }",
                                          std::string(24, '\0')));
  EXPECT_THAT(read_error(p, kF32x23),
              HasSubstr("unsupported dtype [('a', '<f4'), ('b', '<i4')]: structured arrays are not supported"));
}

TEST_F(NpyTest, ShapeMismatchMessage) {
  std::string p = path("x.npy");
  ASSERT_TRUE(succeeded(write_npy(p, Tensor(DType::F32, {3, 4}))));
  Result<Tensor> r = read_npy(p, {DType::F32, {20, 10}}, "x");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().str(), p + ": error: shape [3, 4] does not match parameter x: f32[20, 10]");
  r = read_npy(p, {DType::F32, {20, 10}});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().message, "shape [3, 4] does not match expected f32[20, 10]");
  // A scalar is not a one-element vector.
  ASSERT_TRUE(succeeded(write_npy(p, Tensor(DType::F32, {1}))));
  EXPECT_THAT(read_error(p, {DType::F32, {}}), HasSubstr("shape [1] does not match parameter x: f32[]"));
}

TEST_F(NpyTest, DTypeMismatchMessages) {
  std::string p = path("x.npy");
  ASSERT_TRUE(succeeded(write_npy(p, Tensor(DType::I32, {2, 3}))));
  EXPECT_THAT(read_error(p, kF32x23), HasSubstr("dtype '<i4' (int32) does not match parameter x: f32[2, 3]; "
                                                "save with arr.astype(np.float32)"));
  ASSERT_TRUE(succeeded(write_npy(p, Tensor(DType::F32, {2, 3}))));
  EXPECT_THAT(read_error(p, {DType::I64, {2, 3}}),
              HasSubstr("dtype '<f4' (float32) does not match parameter x: i64[2, 3]; save with arr.astype(np.int64)"));
  EXPECT_THAT(read_error(p, {DType::Bool, {2, 3}}), HasSubstr("does not match parameter x: bool[2, 3]"));
  ASSERT_TRUE(succeeded(write_npy(p, Tensor(DType::Bool, {2, 3}))));
  EXPECT_THAT(read_error(p, {DType::BF16, {2, 3}}),
              HasSubstr("dtype '|b1' (bool) does not match parameter x: bf16[2, 3]; save with arr.astype(np.float32)"));
}

TEST_F(NpyTest, TruncatedData) {
  std::string p = file("t.npy", npy_bytes(dict("<f4", "(2, 3)"), raw<float>({1, 2, 3, 4, 5})));
  EXPECT_THAT(read_error(p, kF32x23), HasSubstr("truncated data: expected 24 bytes of data for '<f4' [2, 3], found 20"));
  p = file("t8.npy", npy_bytes(dict("<f8", "(2, 3)"), raw<double>({1, 2, 3})));
  EXPECT_THAT(read_error(p, kF32x23), HasSubstr("expected 48 bytes of data for '<f8' [2, 3], found 24"));
}

TEST_F(NpyTest, TrailingData) {
  std::string p = file("t.npy", npy_bytes(dict("<f4", "(2, 3)"), raw<float>({1, 2, 3, 4, 5, 6, 7})));
  EXPECT_THAT(read_error(p, kF32x23),
              HasSubstr("data is longer than the array: expected 24 bytes of data for '<f4' [2, 3], found 28 "
                        "(trailing bytes after the array)"));
  // Two arrays appended to one file (np.save twice on one handle) are caught too.
  std::string one = npy_bytes(dict("<f4", "(2, 3)"), raw<float>({1, 2, 3, 4, 5, 6}));
  EXPECT_THAT(read_error(file("twice.npy", one + one), kF32x23), HasSubstr("trailing bytes"));
}

// Every proper prefix of a valid file is an error, whatever byte it stops at.
TEST_F(NpyTest, EveryPrefixOfAValidFileIsAnError) {
  std::vector<std::pair<std::string, TensorType>> files;
  for (const TensorType& tt : {TensorType{DType::F32, {2, 3}}, TensorType{DType::I64, {}},
                               TensorType{DType::Bool, {0, 2}}}) {
    ASSERT_TRUE(succeeded(write_npy(path("full.npy"), sample(tt.dtype, tt.shape))));
    files.emplace_back(read_bytes(path("full.npy")), tt);
  }
  files.emplace_back(npy_bytes(dict("<f8", "(2,)"), raw<double>({1, 2}), 2, 0), TensorType{DType::F32, {2}});
  files.emplace_back(npy_bytes(dict("<i4", "(1,)"), raw<int32_t>({1}), 3, 0), TensorType{DType::I32, {1}});
  for (const auto& [bytes, tt] : files) {
    ASSERT_TRUE(read_npy(file("p.npy", bytes), tt).ok());
    for (size_t n = 0; n < bytes.size(); ++n) {
      std::string p = file("p.npy", bytes.substr(0, n));
      Result<Tensor> r = read_npy(p, tt);
      ASSERT_FALSE(r.ok()) << "prefix of " << n << " bytes of " << tt.str() << " was accepted";
      EXPECT_THAT(r.error().str(), AllOf(StartsWith(p + ": error: "), AnyOf(HasSubstr("truncated"),
                                                                            HasSubstr("file is empty"))))
          << n;
    }
  }
}

// Garbage never crashes: every byte of a valid file replaced by values that steer the
// parser somewhere else. Whatever comes back is a value or a located error.
TEST_F(NpyTest, CorruptedBytesNeverCrash) {
  std::string good = npy_bytes(dict("<f4", "(2, 3)"), raw<float>({1, 2, 3, 4, 5, 6}));
  int errors = 0;
  for (size_t i = 0; i < good.size(); ++i) {
    for (char c : {'\0', '\xff', '\x80', '(', ')', '\'', '"', '\\', '9', '-', ' ', '{', '}', ',', 'L', '\n'}) {
      std::string bad = good;
      bad[i] = c;
      std::string p = file("c.npy", bad);
      Result<Tensor> r = read_npy(p, kF32x23);
      if (!r.ok()) {
        ++errors;
        EXPECT_EQ(r.error().file, p);
        EXPECT_FALSE(r.error().message.empty());
      }
    }
  }
  EXPECT_GT(errors, 0);
}

// ---- interoperability with NumPy itself ---------------------------------------------------

TEST_F(NpyTest, ReadsWhatNumPySaves) {
  if (!numpy_available()) GTEST_SKIP() << kPython << " cannot import numpy (Debian package python3-numpy)";
  std::string out = run_python(R"py(
import sys, numpy as np
d = sys.argv[1] + '/'
np.save(d + 'f4.npy', np.arange(6, dtype=np.float32).reshape(2, 3) / np.float32(7))
np.save(d + 'f2.npy', np.array([0.1, -2.5, 65504, 1e-5, 1.00048828125], dtype=np.float16))
np.save(d + 'f8.npy', np.array([0.1, 1/3, 1e300, -0.0, 1.00048828125]))
np.save(d + 'i4.npy', np.array([[-2**31, 2**31 - 1], [0, -1]], dtype=np.int32))
np.save(d + 'i8.npy', np.array([2**62 + 1, -2**63, 7], dtype=np.int64))
np.save(d + 'b1.npy', np.array([True, False, True]))
np.save(d + 'scalar.npy', np.float32(3.5))
np.save(d + 'empty.npy', np.zeros((0, 3), dtype=np.float32))
np.save(d + 'rank29.npy', np.full((1,) * 28 + (2,), 9, dtype=np.float32))  # header length 182 > 127
for v in (2, 3):
    with open(d + 'v%d.npy' % v, 'wb') as f:
        np.lib.format.write_array(f, np.arange(4, dtype=np.int64), version=(v, 0))
print('saved')
)py");
  ASSERT_THAT(out, HasSubstr("saved"));

  Result<Tensor> f4 = read_npy(path("f4.npy"), kF32x23);
  ASSERT_TRUE(f4.ok()) << f4.error().str();
  for (int i = 0; i < 6; ++i) EXPECT_EQ(f4->get(i), static_cast<double>(static_cast<float>(i) / 7.0f)) << i;

  const double d[] = {0.1, 1.0 / 3.0, 1e300, -0.0, 1.00048828125};
  const double h[] = {0.1, -2.5, 65504, 1e-5, 1.00048828125};
  Result<Tensor> f2 = read_npy(path("f2.npy"), {DType::F16, {5}});
  ASSERT_TRUE(f2.ok()) << f2.error().str();
  for (int i = 0; i < 5; ++i) EXPECT_EQ(f2->get(i), round_to_dtype(h[i], DType::F16)) << "numpy's f16 rounding, " << i;
  for (DType t : {DType::F32, DType::F16, DType::BF16}) {
    Result<Tensor> f8 = read_npy(path("f8.npy"), {t, {5}});
    ASSERT_TRUE(f8.ok()) << f8.error().str();
    for (int i = 0; i < 5; ++i) EXPECT_EQ(f8->get(i), round_to_dtype(d[i], t)) << dtype_name(t) << " " << i;
  }

  Result<Tensor> i4 = read_npy(path("i4.npy"), {DType::I32, {2, 2}});
  ASSERT_TRUE(i4.ok()) << i4.error().str();
  EXPECT_EQ(i4->get_int(0), -2147483648);
  EXPECT_EQ(i4->get_int(1), 2147483647);
  EXPECT_EQ(i4->get_int(3), -1);
  Result<Tensor> i8 = read_npy(path("i8.npy"), {DType::I64, {3}});
  ASSERT_TRUE(i8.ok()) << i8.error().str();
  EXPECT_EQ(i8->get_int(0), (int64_t{1} << 62) + 1);
  EXPECT_EQ(i8->get_int(1), std::numeric_limits<int64_t>::min());
  EXPECT_THAT(read_error(path("i8.npy"), {DType::I32, {3}}), HasSubstr("value 4611686018427387905 at index [0]"));

  Result<Tensor> b1 = read_npy(path("b1.npy"), {DType::Bool, {3}});
  ASSERT_TRUE(b1.ok()) << b1.error().str();
  EXPECT_EQ(b1->get(0) + 2 * b1->get(1) + 4 * b1->get(2), 5.0);

  Result<Tensor> s = read_npy(path("scalar.npy"), {DType::F32, {}});
  ASSERT_TRUE(s.ok()) << s.error().str();
  EXPECT_EQ(s->get(0), 3.5);
  Result<Tensor> e = read_npy(path("empty.npy"), {DType::F32, {0, 3}});
  ASSERT_TRUE(e.ok()) << e.error().str();
  EXPECT_EQ(static_cast<unsigned char>(read_bytes(path("rank29.npy"))[8]), 182);
  Shape rank29(28, 1);
  rank29.push_back(2);
  Result<Tensor> r29 = read_npy(path("rank29.npy"), {DType::F32, rank29});
  ASSERT_TRUE(r29.ok()) << r29.error().str();
  EXPECT_EQ(r29->get(1), 9.0);
  for (const char* v : {"v2.npy", "v3.npy"}) {
    EXPECT_EQ(read_bytes(path(v))[6], v[1] - '0');
    Result<Tensor> r = read_npy(path(v), {DType::I64, {4}});
    ASSERT_TRUE(r.ok()) << r.error().str();
    EXPECT_EQ(r->get_int(3), 3) << v;
  }
}

TEST_F(NpyTest, NumPyLoadsWhatWeWrite) {
  if (!numpy_available()) GTEST_SKIP() << kPython << " cannot import numpy (Debian package python3-numpy)";
  struct Case {
    const char* name;
    DType dtype;
    Shape shape;
    std::vector<double> values;
    const char* numpy;  // what np.load must return: values, dtype
  };
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<Case> cases = {
      {"f32", DType::F32, {2, 2}, {0.5, -1.25, 3e38, -inf}, "[[0.5, -1.25], [3e38, -np.inf]], np.float32"},
      {"bf16", DType::BF16, {3}, {1.5, -0.0078125, std::ldexp(1.0, 100)}, "[1.5, -0.0078125, 2.0**100], np.float32"},
      {"f16", DType::F16, {4}, {65504, 0.1, std::ldexp(1.0, -24), -inf}, "[65504, 0.1, 2.0**-24, -np.inf], np.float16"},
      {"i32", DType::I32, {2}, {-2147483648.0, 2147483647.0}, "[-2**31, 2**31 - 1], np.int32"},
      {"i64", DType::I64, {2}, {}, "[2**62 + 1, -2**63], np.int64"},
      {"bool", DType::Bool, {2, 1}, {1, 0}, "[[True], [False]], np.bool_"},
      {"scalar", DType::F32, {}, {-7.25}, "-7.25, np.float32"},
      {"empty", DType::I32, {0, 5}, {}, "np.zeros((0, 5)), np.int32"},
  };
  std::string script = "import sys, numpy as np\nd = sys.argv[1] + '/'\n";
  for (const Case& c : cases) {
    Tensor t(c.dtype, c.shape);
    for (size_t i = 0; i < c.values.size(); ++i) t.set(static_cast<int64_t>(i), c.values[i]);
    if (c.dtype == DType::I64) {
      t.set_int(0, (int64_t{1} << 62) + 1);
      t.set_int(1, std::numeric_limits<int64_t>::min());
    }
    ASSERT_TRUE(succeeded(write_npy(path(std::string(c.name) + ".npy"), t)));
    script += "a = np.load(d + '" + std::string(c.name) + ".npy')\ne = np.array(" + c.numpy + ")\n" +
              "print('" + c.name + "', a.dtype == e.dtype and a.shape == e.shape and np.array_equal(a, e), " +
              "a.dtype, a.shape)\n";
  }
  std::string out = run_python(script);
  for (const Case& c : cases) EXPECT_THAT(out, HasSubstr(std::string(c.name) + " True ")) << out;
}

TEST_F(NpyTest, NumPyFilesWeRejectSayWhy) {
  if (!numpy_available()) GTEST_SKIP() << kPython << " cannot import numpy (Debian package python3-numpy)";
  run_python(R"py(
import sys, numpy as np
d = sys.argv[1] + '/'
a = np.arange(6, dtype=np.float32).reshape(2, 3)
np.save(d + 'fortran.npy', np.asfortranarray(a))
np.save(d + 'big.npy', a.astype('>f4'))
np.save(d + 'u1.npy', a.astype(np.uint8))
np.savez(d + 'arrays.npz', a=a)
)py");
  EXPECT_THAT(read_error(path("fortran.npy"), kF32x23), HasSubstr("Fortran order is not supported"));
  EXPECT_THAT(read_error(path("big.npy"), kF32x23), HasSubstr("big-endian dtype '>f4'"));
  EXPECT_THAT(read_error(path("u1.npy"), kF32x23), HasSubstr("unsupported dtype '|u1'"));
  EXPECT_THAT(read_error(path("arrays.npz"), kF32x23), HasSubstr("np.savez"));
}

}  // namespace runtime_npy_test
}  // namespace sf
