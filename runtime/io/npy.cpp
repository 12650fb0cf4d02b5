#include "runtime/io/npy.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <system_error>
#include <utility>
#include <vector>

#include "runtime/core/file_io.h"

namespace sf {
namespace {

// The layout, from NumPy's NEP 1 / numpy/lib/format.py:
//   "\x93NUMPY" major minor  header_len (u16 LE for 1.0, u32 LE for 2.0 and 3.0)
//   header: a Python dict literal (latin-1 for 1.0/2.0, UTF-8 for 3.0) padded with
//           spaces and a final '\n' so the data starts on a 64-byte boundary
//   data:   prod(shape) * itemsize bytes
constexpr std::string_view kMagic{"\x93NUMPY", 6};
constexpr size_t kPreambleLen = kMagic.size() + 2;  // magic + version bytes
// numpy/lib/format.py's _MAX_HEADER_SIZE: np.load refuses longer headers (since
// NumPy 1.24) because evaluating them is not safe; a real header is ~128 bytes.
constexpr size_t kMaxHeaderLen = 10000;
// ARRAY_ALIGN in format.py: data aligned for mmap and for any SIMD load.
constexpr size_t kAlign = 64;
// Deepest nesting the header parser follows before calling the header garbage; a
// real header nests 2 deep (dict, shape tuple), structured dtypes a few more.
constexpr int kMaxDepth = 32;

// ---- small helpers ----------------------------------------------------------------

std::string errno_message(int e) { return std::error_code(e, std::generic_category()).message(); }

Diag error_at(const std::string& path, std::string message) {
  return Diag{path, SourceLoc{}, std::move(message)};
}

// Bytes from a file, made safe to put in a one-line message: non-printable bytes as
// \xNN, cut after `max` bytes.
std::string printable(std::string_view s, size_t max = 60) {
  std::string r;
  for (size_t i = 0; i < s.size() && i < max; ++i) {
    auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      r += static_cast<char>(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      r += buf;
    }
  }
  if (s.size() > max) r += "...";
  return r;
}

template <class U>
U load_le(const std::byte* p) {
  U v = 0;
  for (size_t k = 0; k < sizeof(U); ++k) v |= static_cast<U>(std::to_integer<uint8_t>(p[k])) << (8 * k);
  return v;
}

template <class U>
void store_le(std::byte* p, U v) {
  for (size_t k = 0; k < sizeof(U); ++k) p[k] = static_cast<std::byte>((v >> (8 * k)) & 0xFFu);
}

std::string index_str(int64_t flat, const Shape& shape) {
  Shape idx(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    idx[d] = flat % shape[d];
    flat /= shape[d];
  }
  return shape_str(idx);
}

// ---- the dtypes a file may hold -----------------------------------------------------

enum class FileDType { F2, F4, F8, I4, I8, B1 };

struct FileDTypeInfo {
  FileDType t;
  std::string_view descr;
  int size;
  std::string_view numpy_name;
};

// '<b1' is accepted too: NumPy never writes it (np.dtype('<b1').str is '|b1'), but it
// means the same bytes, and other writers emit it.
constexpr FileDTypeInfo kFileDTypes[] = {
    {FileDType::F4, "<f4", 4, "float32"}, {FileDType::F2, "<f2", 2, "float16"},
    {FileDType::F8, "<f8", 8, "float64"}, {FileDType::I4, "<i4", 4, "int32"},
    {FileDType::I8, "<i8", 8, "int64"},   {FileDType::B1, "|b1", 1, "bool"},
    {FileDType::B1, "<b1", 1, "bool"},
};

bool file_dtype_feeds(FileDType f, DType t) {
  switch (f) {
    case FileDType::F2:
    case FileDType::F4:
    case FileDType::F8: return is_float(t);
    case FileDType::I4:
    case FileDType::I8: return is_integer(t);
    case FileDType::B1: return t == DType::Bool;
  }
  return false;
}

// The NumPy dtype to save with so that a file feeds a parameter of type `t`.
std::string_view numpy_name_for(DType t) {
  switch (t) {
    case DType::F32: return "float32";
    case DType::F16: return "float16";
    case DType::BF16: return "float32";  // NumPy has no bfloat16; float32 rounds on read
    case DType::I32: return "int32";
    case DType::I64: return "int64";
    case DType::Bool: return "bool_";
  }
  return "?";
}

// ---- the header: a Python literal, parsed by hand -------------------------------------

struct PyValue {
  enum class Kind { Str, Int, Bool, None, Tuple, List, Dict };
  Kind kind = Kind::None;
  std::string str;             // Str: the contents (escapes kept as written)
  int64_t num = 0;             // Int, Bool
  std::vector<PyValue> items;  // Tuple, List; Dict: key, value, key, value, ...
  std::string_view text;       // the source text, for messages
};

struct HeaderError {
  size_t offset;
  std::string message;
};

// Python's literal grammar, as far as np.save's header needs: dicts, tuples, lists,
// quoted strings, ints (with Python 2's `L` suffix, which format.py's _filter_header
// also strips), True, False, None, and any whitespace between tokens. `(x)` is x, not
// a tuple, as in Python.
class LiteralParser {
 public:
  explicit LiteralParser(std::string_view s) : s_(s) {}

  PyValue parse() {
    PyValue v = value(0);
    skip_ws();
    if (pos_ != s_.size()) fail("the end of the header after the dict");
    return v;
  }

 private:
  static bool is_space(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
  }
  static bool is_digit(char c) { return c >= '0' && c <= '9'; }
  static bool is_alpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }

  bool at_end() const { return pos_ >= s_.size(); }
  char peek() const { return s_[pos_]; }
  void skip_ws() {
    while (!at_end() && is_space(peek())) ++pos_;
  }

  std::string found() const {
    if (at_end()) return "the end of the header";
    return "\"" + printable(s_.substr(pos_), 12) + "\"";
  }

  [[noreturn]] void fail(std::string_view expected) const {
    throw HeaderError{pos_, "expected " + std::string(expected) + ", found " + found()};
  }

  PyValue value(int depth) {
    if (depth > kMaxDepth) throw HeaderError{pos_, "values nest more than 32 deep"};
    skip_ws();
    if (at_end()) fail("a value");
    size_t start = pos_;
    PyValue v;
    char c = peek();
    if (c == '{') {
      v = dict(depth);
    } else if (c == '(') {
      v = parenthesised(depth);
    } else if (c == '[') {
      v = list(depth);
    } else if (c == '\'' || c == '"') {
      v = string();
    } else if (is_digit(c) || c == '-' || c == '+') {
      v = integer();
    } else if (is_alpha(c)) {
      v = name();
    } else {
      fail("a value");
    }
    if (v.text.empty()) v.text = s_.substr(start, pos_ - start);
    return v;
  }

  // Parses `item (, item)* ,? close` after the opening bracket, into v.items.
  void sequence(PyValue& v, char close, int depth) {
    const std::string expected = std::string("',' or '") + close + "'";
    for (;;) {
      skip_ws();
      if (!at_end() && peek() == close) {
        ++pos_;
        return;
      }
      v.items.push_back(value(depth + 1));
      skip_ws();
      if (at_end()) fail(expected);
      if (peek() == ',') {
        ++pos_;
      } else if (peek() == close) {
        ++pos_;
        return;
      } else {
        fail(expected);
      }
    }
  }

  PyValue dict(int depth) {
    PyValue v;
    v.kind = PyValue::Kind::Dict;
    ++pos_;  // '{'
    for (;;) {
      skip_ws();
      if (!at_end() && peek() == '}') {
        ++pos_;
        return v;
      }
      PyValue key = value(depth + 1);
      skip_ws();
      if (at_end() || peek() != ':') fail("':' after a dict key");
      ++pos_;
      PyValue val = value(depth + 1);
      v.items.push_back(std::move(key));
      v.items.push_back(std::move(val));
      skip_ws();
      if (at_end()) fail("',' or '}'");
      if (peek() == ',') {
        ++pos_;
      } else if (peek() == '}') {
        ++pos_;
        return v;
      } else {
        fail("',' or '}'");
      }
    }
  }

  PyValue parenthesised(int depth) {
    size_t start = pos_;
    ++pos_;  // '('
    skip_ws();
    PyValue v;
    v.kind = PyValue::Kind::Tuple;
    if (!at_end() && peek() == ')') {
      ++pos_;
      return v;
    }
    PyValue first = value(depth + 1);
    skip_ws();
    if (!at_end() && peek() == ')') {  // (x) is x
      ++pos_;
      first.text = s_.substr(start, pos_ - start);
      return first;
    }
    if (at_end() || peek() != ',') fail("',' or ')'");
    ++pos_;
    v.items.push_back(std::move(first));
    sequence(v, ')', depth);
    return v;
  }

  PyValue list(int depth) {
    PyValue v;
    v.kind = PyValue::Kind::List;
    ++pos_;  // '['
    sequence(v, ']', depth);
    return v;
  }

  PyValue string() {
    char quote = peek();
    ++pos_;
    PyValue v;
    v.kind = PyValue::Kind::Str;
    for (;;) {
      if (at_end() || peek() == '\n') throw HeaderError{pos_, "unterminated string"};
      char c = peek();
      ++pos_;
      if (c == quote) return v;
      v.str += c;
      if (c == '\\') {
        if (at_end()) throw HeaderError{pos_, "unterminated string"};
        v.str += peek();
        ++pos_;
      }
    }
  }

  PyValue integer() {
    size_t start = pos_;
    bool negative = false;
    if (peek() == '-' || peek() == '+') {
      negative = peek() == '-';
      ++pos_;
      skip_ws();  // Python allows `- 3`
    }
    if (at_end() || !is_digit(peek())) fail("digits");
    size_t digits = pos_;
    while (!at_end() && is_digit(peek())) ++pos_;
    auto too_large = [&] {
      return HeaderError{start, "integer " + printable(s_.substr(start, pos_ - start)) + " does not fit in 64 bits"};
    };
    // Accumulated as a negative number so that INT64_MIN fits.
    int64_t n = 0;
    for (size_t i = digits; i < pos_; ++i) {
      int digit = s_[i] - '0';
      if (n < (std::numeric_limits<int64_t>::min() + digit) / 10) throw too_large();
      n = n * 10 - digit;
    }
    if (!negative) {
      if (n == std::numeric_limits<int64_t>::min()) throw too_large();
      n = -n;
    }
    if (!at_end() && (peek() == 'L' || peek() == 'l')) ++pos_;  // Python 2 long
    PyValue v;
    v.kind = PyValue::Kind::Int;
    v.num = n;
    return v;
  }

  PyValue name() {
    size_t start = pos_;
    while (!at_end() && (is_alpha(peek()) || is_digit(peek()))) ++pos_;
    std::string_view word = s_.substr(start, pos_ - start);
    PyValue v;
    if (word == "True" || word == "False") {
      v.kind = PyValue::Kind::Bool;
      v.num = word == "True";
    } else if (word == "None") {
      v.kind = PyValue::Kind::None;
    } else {
      pos_ = start;
      fail("a value (a string, int, tuple, True, False or None)");
    }
    return v;
  }

  std::string_view s_;
  size_t pos_ = 0;
};

struct Header {
  std::string descr;
  bool fortran_order = false;
  Shape shape;
};

// Checks the parsed dict the way numpy/lib/format.py's _read_array_header does:
// exactly the three keys, shape a tuple of ints, fortran_order a bool, descr a
// dtype. A duplicated key is an error here (Python would keep the last one), since
// no writer produces one and guessing which was meant is worse than saying so.
Header interpret(const PyValue& d, std::string_view header) {
  auto offset = [&](const PyValue& v) { return static_cast<size_t>(v.text.data() - header.data()); };
  if (d.kind != PyValue::Kind::Dict)
    throw HeaderError{offset(d), "expected a dict, found " + printable(d.text)};
  const PyValue* descr = nullptr;
  const PyValue* fortran = nullptr;
  const PyValue* shape = nullptr;
  for (size_t i = 0; i + 1 < d.items.size(); i += 2) {
    const PyValue& k = d.items[i];
    const PyValue* slot_value = &d.items[i + 1];
    const PyValue** slot = nullptr;
    if (k.kind == PyValue::Kind::Str && k.str == "descr") slot = &descr;
    if (k.kind == PyValue::Kind::Str && k.str == "fortran_order") slot = &fortran;
    if (k.kind == PyValue::Kind::Str && k.str == "shape") slot = &shape;
    if (!slot)
      throw HeaderError{offset(k), "expected only the keys 'descr', 'fortran_order' and 'shape', found key " +
                                       printable(k.text)};
    if (*slot) throw HeaderError{offset(k), "found key " + printable(k.text) + " twice"};
    *slot = slot_value;
  }
  const std::pair<const PyValue*, const char*> required[] = {
      {descr, "descr"}, {fortran, "fortran_order"}, {shape, "shape"}};
  for (auto [v, key] : required)
    if (!v) throw HeaderError{offset(d), std::string("expected a '") + key + "' key, found none"};

  Header h;
  if (descr->kind == PyValue::Kind::List)
    throw HeaderError{offset(*descr), "unsupported dtype " + printable(descr->text) +
                                          ": structured arrays are not supported"};
  if (descr->kind != PyValue::Kind::Str)
    throw HeaderError{offset(*descr), "expected 'descr' to be a dtype string like '<f4', found " +
                                          printable(descr->text)};
  h.descr = descr->str;
  if (fortran->kind != PyValue::Kind::Bool)
    throw HeaderError{offset(*fortran),
                      "expected 'fortran_order' to be True or False, found " + printable(fortran->text)};
  h.fortran_order = fortran->num != 0;
  bool shape_ok = shape->kind == PyValue::Kind::Tuple;
  for (const PyValue& dim : shape->items) shape_ok = shape_ok && dim.kind == PyValue::Kind::Int && dim.num >= 0;
  if (!shape_ok)
    throw HeaderError{offset(*shape), "expected 'shape' to be a tuple of non-negative ints like (20, 10), found " +
                                          printable(shape->text)};
  for (const PyValue& dim : shape->items) h.shape.push_back(dim.num);
  return h;
}

// ---- reading ----------------------------------------------------------------------------

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};
using File = std::unique_ptr<std::FILE, FileCloser>;

size_t read_up_to(std::FILE* f, void* buf, size_t n) { return n ? std::fread(buf, 1, n, f) : 0; }

class NpyReader {
 public:
  NpyReader(const std::string& path, const TensorType& expected, std::string_view what)
      : path_(path), expected_(expected) {
    dest_ = what.empty() ? "expected " + expected.str()
                         : "parameter " + std::string(what) + ": " + expected.str();
  }

  Result<Tensor> read() {
    // Only a regular file (a FIFO would block the open, a device never end). No size
    // cap is needed: the reader takes at most the header's limit and the expected
    // array's bytes, and refuses anything after them.
    Result<int> fd = open_regular_file(path_, std::numeric_limits<uint64_t>::max(), "");
    if (!fd) return fail(fd.error().message + " (expected a .npy file for " + dest_ + ")");
    errno = 0;
    file_.reset(::fdopen(*fd, "rb"));
    if (!file_) {
      int e = errno;
      ::close(*fd);
      return fail("cannot open file: " + errno_message(e) + " (expected a .npy file for " + dest_ + ")");
    }

    // Magic and version.
    char pre[kPreambleLen];
    size_t got = read_up_to(file_.get(), pre, sizeof pre);
    if (std::ferror(file_.get())) return read_error();
    std::string_view pre_sv(pre, got);
    std::string_view magic_part = pre_sv.substr(0, std::min(got, kMagic.size()));
    if (got == 0) return fail("file is empty (expected a .npy file for " + dest_ + ")");
    if (magic_part != kMagic.substr(0, magic_part.size())) {
      std::string m = "not a .npy file: expected the magic string \\x93NUMPY, found \"" +
                      printable(magic_part) + "\"";
      if (pre_sv.starts_with(std::string_view("PK\x03\x04", 4)))
        m += " (a zip archive: .npz files from np.savez are not read; save each array with np.save)";
      return fail(m);
    }
    if (got < kPreambleLen)
      return fail("truncated header: expected the " + std::to_string(kPreambleLen) +
                  "-byte magic string and version, found " + std::to_string(got) + " bytes");
    int major = static_cast<unsigned char>(pre[6]);
    int minor = static_cast<unsigned char>(pre[7]);
    if (major < 1 || major > 3 || minor != 0)
      return fail("unsupported .npy format version " + std::to_string(major) + "." + std::to_string(minor) +
                  " (expected 1.0, 2.0 or 3.0)");

    // Header length: u16 in 1.0; u32 in 2.0 and 3.0 (3.0 only changes the encoding
    // to UTF-8, which the parser passes through).
    size_t len_bytes = major == 1 ? 2 : 4;
    std::byte len_buf[4];
    got = read_up_to(file_.get(), len_buf, len_bytes);
    if (std::ferror(file_.get())) return read_error();
    if (got < len_bytes)
      return fail("truncated header: expected a " + std::to_string(len_bytes) + "-byte header length, found " +
                  std::to_string(got) + " bytes");
    size_t header_len = major == 1 ? load_le<uint16_t>(len_buf) : load_le<uint32_t>(len_buf);
    if (header_len > kMaxHeaderLen)
      return fail("header length " + std::to_string(header_len) + " exceeds the " +
                  std::to_string(kMaxHeaderLen) + "-byte limit (np.load refuses such headers too)");
    data_offset_ = kPreambleLen + len_bytes + header_len;

    std::string header(header_len, '\0');
    got = read_up_to(file_.get(), header.data(), header_len);
    if (std::ferror(file_.get())) return read_error();
    if (got < header_len)
      return fail("truncated header: expected " + std::to_string(header_len) + " header bytes, found " +
                  std::to_string(got));

    Header h;
    try {
      h = interpret(LiteralParser(header).parse(), header);
    } catch (const HeaderError& e) {
      return fail("header is not a valid .npy header dict: " + e.message + " at header byte " +
                  std::to_string(e.offset) + " (header: \"" + printable(header, 100) + "\")");
    }
    return read_data(h);
  }

 private:
  Result<Tensor> read_data(const Header& h) {
    if (h.fortran_order)
      return fail("Fortran order is not supported; save with np.ascontiguousarray (expected C order for " +
                  dest_ + ")");
    const FileDTypeInfo* info = nullptr;
    for (const FileDTypeInfo& i : kFileDTypes)
      if (i.descr == h.descr) info = &i;
    if (!info) {
      std::string d = printable(h.descr);
      if (h.descr.starts_with('>'))
        return fail("big-endian dtype '" + d + "' is not supported; save with arr.astype('<" +
                    printable(h.descr.substr(1)) + "')");
      return fail("unsupported dtype '" + d + "' (expected one of <f4 <f2 <f8 <i4 <i8 |b1, for " + dest_ +
                  ")");
    }

    // Size the data before comparing shapes so that an absurd header says so, and
    // before allocating anything.
    int64_t count = 1;
    int64_t nbytes = 0;
    bool overflow = false;
    for (int64_t dim : h.shape) overflow = overflow || __builtin_mul_overflow(count, dim, &count);
    overflow = overflow || __builtin_mul_overflow(count, static_cast<int64_t>(info->size), &nbytes);
    if (overflow)
      return fail("shape " + shape_str(h.shape) + " is too large: its byte count does not fit in 64 bits");

    if (h.shape != expected_.shape)
      return fail("shape " + shape_str(h.shape) + " does not match " + dest_);
    if (!file_dtype_feeds(info->t, expected_.dtype))
      return fail("dtype '" + std::string(info->descr) + "' (" + std::string(info->numpy_name) +
                  ") does not match " + dest_ + "; save with arr.astype(np." +
                  std::string(numpy_name_for(expected_.dtype)) + ")");

    Tensor t(expected_.dtype, expected_.shape);
    const auto need = static_cast<size_t>(nbytes);
    // Same bytes in the file as in memory: read straight into the tensor.
    const bool direct = std::endian::native == std::endian::little &&
                        ((info->t == FileDType::F4 && t.dtype() == DType::F32) ||
                         (info->t == FileDType::F2 && t.dtype() == DType::F16) ||
                         (info->t == FileDType::I4 && t.dtype() == DType::I32) ||
                         (info->t == FileDType::I8 && t.dtype() == DType::I64) ||
                         (info->t == FileDType::B1 && t.dtype() == DType::Bool));
    std::vector<std::byte> staging;
    std::byte* dst = t.data();
    if (!direct) {
      staging.resize(need);
      dst = staging.data();
    }
    size_t got = read_up_to(file_.get(), dst, need);
    if (std::ferror(file_.get())) return read_error();
    std::string what_data = std::to_string(need) + " bytes of data for '" + std::string(info->descr) + "' " +
                            shape_str(h.shape);
    if (got < need) return fail("truncated data: expected " + what_data + ", found " + std::to_string(got));
    if (std::fgetc(file_.get()) != EOF) {
      std::string found = "more";
      struct stat st;
      if (fstat(fileno(file_.get()), &st) == 0 && S_ISREG(st.st_mode) &&
          static_cast<uint64_t>(st.st_size) > data_offset_ + need)
        found = std::to_string(static_cast<uint64_t>(st.st_size) - data_offset_);
      return fail("data is longer than the array: expected " + what_data + ", found " + found +
                  " (trailing bytes after the array)");
    }
    if (std::ferror(file_.get())) return read_error();

    if (direct) {
      if (t.dtype() == DType::Bool)  // NumPy reads any non-zero byte as True
        for (int64_t i = 0; i < t.numel(); ++i) t.data()[i] = std::byte{t.data()[i] != std::byte{0}};
      return t;
    }
    const std::byte* p = staging.data();
    for (int64_t i = 0; i < t.numel(); ++i, p += info->size) {
      switch (info->t) {
        case FileDType::F2: t.set(i, f16_bits_to_f32(load_le<uint16_t>(p))); break;
        case FileDType::F4: t.set(i, std::bit_cast<float>(load_le<uint32_t>(p))); break;
        case FileDType::F8: t.set(i, std::bit_cast<double>(load_le<uint64_t>(p))); break;
        case FileDType::I4: t.set_int(i, static_cast<int32_t>(load_le<uint32_t>(p))); break;
        case FileDType::I8: {
          auto v = static_cast<int64_t>(load_le<uint64_t>(p));
          if (t.dtype() == DType::I32 &&
              (v < std::numeric_limits<int32_t>::min() || v > std::numeric_limits<int32_t>::max()))
            return fail("value " + std::to_string(v) + " at index " + index_str(i, h.shape) +
                        " of the int64 data is out of range for " + dest_);
          t.set_int(i, v);
          break;
        }
        case FileDType::B1: t.set_int(i, *p != std::byte{0}); break;
      }
    }
    return t;
  }

  Diag fail(std::string message) const { return error_at(path_, std::move(message)); }
  Diag read_error() const { return fail("cannot read file: " + errno_message(errno)); }

  const std::string& path_;
  const TensorType& expected_;
  std::string dest_;
  File file_;
  size_t data_offset_ = 0;
};

// ---- writing ----------------------------------------------------------------------------

std::string_view descr_for(DType t) {
  switch (t) {
    case DType::F32:
    case DType::BF16: return "<f4";
    case DType::F16: return "<f2";
    case DType::I32: return "<i4";
    case DType::I64: return "<i8";
    case DType::Bool: return "|b1";
  }
  return "?";
}

// The header np.save writes (keys sorted, repr of the shape tuple), padded with
// spaces and a '\n' so that magic + length + header is a multiple of 64 bytes.
std::string make_header(DType t, const Shape& shape) {
  std::string h = "{'descr': '" + std::string(descr_for(t)) + "', 'fortran_order': False, 'shape': (";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) h += ", ";
    h += std::to_string(shape[i]);
  }
  if (shape.size() == 1) h += ',';
  h += "), }";
  size_t used = kPreambleLen + 2 + h.size() + 1;
  h.append((kAlign - used % kAlign) % kAlign, ' ');
  h += '\n';
  return h;
}

bool write_all(int fd, const void* buf, size_t n) {
  const auto* p = static_cast<const char*>(buf);
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

// Writes the array's bytes in the file's layout, converting through a bounded
// buffer where memory and file differ (bf16 -> f4, bool normalised, big-endian hosts).
bool write_data(int fd, const Tensor& t) {
  const bool same_bytes = std::endian::native == std::endian::little && t.dtype() != DType::BF16 &&
                          t.dtype() != DType::Bool;
  if (same_bytes) return write_all(fd, t.data(), t.nbytes());
  const int out_size = t.dtype() == DType::BF16 ? 4 : dtype_size(t.dtype());
  constexpr int64_t kChunk = 1 << 16;  // elements per write: 256 KiB of f4
  std::vector<std::byte> buf(static_cast<size_t>(std::min(t.numel(), kChunk) * out_size));
  for (int64_t start = 0; start < t.numel(); start += kChunk) {
    int64_t end = std::min(t.numel(), start + kChunk);
    std::byte* p = buf.data();
    for (int64_t i = start; i < end; ++i, p += out_size) {
      switch (t.dtype()) {
        case DType::F32:
        case DType::BF16: store_le(p, std::bit_cast<uint32_t>(static_cast<float>(t.get(i)))); break;
        case DType::F16: {
          uint16_t bits;
          std::memcpy(&bits, t.data() + i * 2, 2);
          store_le(p, bits);
          break;
        }
        case DType::I32: store_le(p, static_cast<uint32_t>(t.get_int(i))); break;
        case DType::I64: store_le(p, static_cast<uint64_t>(t.get_int(i))); break;
        case DType::Bool: *p = std::byte{t.data()[i] != std::byte{0}}; break;
      }
    }
    if (!write_all(fd, buf.data(), static_cast<size_t>(p - buf.data()))) return false;
  }
  return true;
}

}  // namespace

Result<Tensor> read_npy(const std::string& path, const TensorType& expected, std::string_view what) {
  return NpyReader(path, expected, what).read();
}

namespace {

// Writes `t` to a fresh temporary file next to `path`, flushed and closed, and
// returns its name; the caller renames it into place or unlinks it.
Result<std::string> stage_npy(const std::string& path, const Tensor& t) {
  // The rename replaces whatever `path` names: a regular file (or a link) may be
  // replaced, a directory, device or FIFO may not.
  struct stat st;
  if (::lstat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode) && !S_ISLNK(st.st_mode))
    return error_at(path, "cannot write: it exists and is not a regular file; refusing to replace it");
  std::string header = make_header(t.dtype(), t.shape());
  if (header.size() > kMaxHeaderLen)
    return error_at(path, "cannot write: the header for shape " + shape_str(t.shape()) + " would be " +
                              std::to_string(header.size()) + " bytes, over the " +
                              std::to_string(kMaxHeaderLen) + " bytes np.load accepts");

  // The temporary lives next to `path` so the rename stays within one file system;
  // O_EXCL with a per-process counter keeps concurrent writers (ranks as threads or
  // processes) from sharing one. Mode 0666 lets the umask decide, as np.save does.
  static std::atomic<uint64_t> counter{0};
  std::string tmp;
  int fd = -1;
  for (int attempt = 0; attempt < 100 && fd < 0; ++attempt) {
    tmp = path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
    fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0 && errno != EEXIST) break;
  }
  if (fd < 0)
    return error_at(path, "cannot write: cannot create the temporary file " + tmp + ": " + errno_message(errno));

  auto abandon = [&](std::string step) {
    int e = errno;
    if (fd >= 0) ::close(fd);
    ::unlink(tmp.c_str());
    return error_at(path, "cannot write: " + step + " " + tmp + ": " + errno_message(e));
  };
  std::byte pre[kPreambleLen + 2];
  std::memcpy(pre, kMagic.data(), kMagic.size());
  pre[6] = std::byte{1};  // format 1.0: every header we write fits its u16 length
  pre[7] = std::byte{0};
  store_le(pre + kPreambleLen, static_cast<uint16_t>(header.size()));
  if (!write_all(fd, pre, sizeof pre) || !write_all(fd, header.data(), header.size()) || !write_data(fd, t))
    return abandon("writing");
  // Flushed before the rename: otherwise a crash can persist the rename but not the
  // data, leaving an empty file where the old one was.
  if (::fsync(fd) != 0) return abandon("syncing");
  int rc = ::close(fd);
  fd = -1;
  if (rc != 0) return abandon("closing");
  return tmp;
}

}  // namespace

Result<void> write_npy(const std::string& path, const Tensor& t) {
  Result<std::string> tmp = stage_npy(path, t);
  if (!tmp) return tmp.error();
  if (::rename(tmp->c_str(), path.c_str()) != 0) {
    int e = errno;
    ::unlink(tmp->c_str());
    return error_at(path, "cannot write: renaming " + *tmp + " into place: " + errno_message(e));
  }
  return {};
}

Result<void> write_npy_all(const std::vector<std::pair<std::string, const Tensor*>>& files) {
  std::vector<std::string> staged;
  auto unlink_all = [](const std::vector<std::string>& paths, size_t from) {
    for (size_t i = from; i < paths.size(); ++i) ::unlink(paths[i].c_str());
  };
  for (const auto& [path, t] : files) {
    Result<std::string> tmp = stage_npy(path, *t);
    if (!tmp) {
      unlink_all(staged, 0);
      return tmp.error();
    }
    staged.push_back(std::move(tmp).value());
  }
  // Every file is complete on disk; the renames (within each file's directory)
  // fail only if a path changed under us. Then the files already renamed are
  // removed again, so that no partial set of outputs is left.
  for (size_t i = 0; i < files.size(); ++i) {
    if (::rename(staged[i].c_str(), files[i].first.c_str()) != 0) {
      int e = errno;
      unlink_all(staged, i);
      for (size_t j = 0; j < i; ++j) ::unlink(files[j].first.c_str());
      return error_at(files[i].first, "cannot write: renaming " + staged[i] + " into place: " + errno_message(e) +
                                          " (no output was saved)");
    }
  }
  return {};
}

}  // namespace sf
