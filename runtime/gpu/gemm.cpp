#include "runtime/gpu/gemm.h"

#include <array>
#include <cstdint>

namespace sf {

namespace {

constexpr std::array<std::pair<GemmLibrary, std::string_view>, 2> kLibraries = {{
    {GemmLibrary::CublasLt, "cublaslt"},
    {GemmLibrary::Cublas, "cublas"},
}};

constexpr std::array<std::pair<GemmEpilogue, std::string_view>, 6> kEpilogues = {{
    {GemmEpilogue::None, "none"},
    {GemmEpilogue::Bias, "bias"},
    {GemmEpilogue::Relu, "relu"},
    {GemmEpilogue::BiasRelu, "bias_relu"},
    {GemmEpilogue::GeluTanh, "gelu_tanh"},
    {GemmEpilogue::BiasGeluTanh, "bias_gelu_tanh"},
}};

// a * b + c, or nullopt when it leaves int64 (every operand is non-negative).
std::optional<int64_t> mul_add(int64_t a, int64_t b, int64_t c) {
  int64_t p = 0, s = 0;
  if (__builtin_mul_overflow(a, b, &p) || __builtin_add_overflow(p, c, &s)) return std::nullopt;
  return s;
}

}  // namespace

std::string_view gemm_library_name(GemmLibrary l) {
  for (const auto& [v, name] : kLibraries)
    if (v == l) return name;
  return "?";
}

std::optional<GemmLibrary> parse_gemm_library(std::string_view name) {
  for (const auto& [v, n] : kLibraries)
    if (n == name) return v;
  return std::nullopt;
}

std::string_view gemm_epilogue_name(GemmEpilogue e) {
  for (const auto& [v, name] : kEpilogues)
    if (v == e) return name;
  return "?";
}

std::optional<GemmEpilogue> parse_gemm_epilogue(std::string_view name) {
  for (const auto& [v, n] : kEpilogues)
    if (n == name) return v;
  return std::nullopt;
}

bool gemm_epilogue_has_bias(GemmEpilogue e) {
  return e == GemmEpilogue::Bias || e == GemmEpilogue::BiasRelu || e == GemmEpilogue::BiasGeluTanh;
}

std::optional<GemmIssue> gemm_check(const GemmDesc& d, const std::vector<TensorType>& in, const TensorType& out) {
  auto issue = [](std::string field, std::string message) { return GemmIssue{std::move(field), std::move(message)}; };
  auto in_range = [](int64_t v, int64_t lo, int64_t hi) { return v >= lo && v <= hi; };
  for (auto [name, v] : {std::pair<const char*, int64_t>{"m", d.m}, {"n", d.n}, {"k", d.k}, {"batch", d.batch}})
    if (!in_range(v, 1, kMaxGemmDim))
      return issue(name, std::to_string(v) + " is out of range [1, " + std::to_string(kMaxGemmDim) + "]");
  if (d.dtype != DType::F32 && d.dtype != DType::F16 && d.dtype != DType::BF16)
    return issue("dtype", std::string(dtype_name(d.dtype)) + ": a library GEMM is f32, f16 or bf16");
  if (d.tf32 && d.dtype != DType::F32)
    return issue("tf32", "TF32 multiplies f32 operands, not " + std::string(dtype_name(d.dtype)));
  if (d.library == GemmLibrary::Cublas && d.epilogue != GemmEpilogue::None)
    return issue("epilogue", std::string(gemm_epilogue_name(d.epilogue)) +
                                 ": cuBLAS's GemmEx has no epilogue (library \"cublaslt\" has)");
  const size_t want_in = gemm_epilogue_has_bias(d.epilogue) ? 3 : 2;
  if (in.size() != want_in)
    return issue("in", std::to_string(in.size()) + " buffer(s); epilogue " + std::string(gemm_epilogue_name(d.epilogue)) +
                           " reads " + std::to_string(want_in) + " (A, B" + (want_in == 3 ? ", bias)" : ")"));
  const char* names[] = {"A", "B", "the bias"};
  for (size_t i = 0; i < in.size(); ++i)
    if (in[i].dtype != d.dtype)
      return issue("in[" + std::to_string(i) + "]", std::string(names[i]) + " is " + in[i].str() + ", not " +
                                                         std::string(dtype_name(d.dtype)));
  if (out.dtype != d.dtype) return issue("out[0]", "C is " + out.str() + ", not " + std::string(dtype_name(d.dtype)));

  // An operand stored rows x cols with row stride ld and batch stride `stride`: its
  // rows must not overlap (ld >= cols, as cuBLAS requires of a leading dimension),
  // and its last element must lie inside the buffer.
  struct Stored {
    const char* ld_field;
    const char* stride_field;
    const char* name;
    int64_t rows, cols, ld, stride;
    const TensorType* buffer;
    const char* in_field;
  };
  const Stored ops[] = {
      {"lda", "stride_a", "A", d.trans_a ? d.k : d.m, d.trans_a ? d.m : d.k, d.lda, d.stride_a, &in[0], "in[0]"},
      {"ldb", "stride_b", "B", d.trans_b ? d.n : d.k, d.trans_b ? d.k : d.n, d.ldb, d.stride_b, &in[1], "in[1]"},
  };
  for (const Stored& s : ops) {
    if (s.ld < s.cols)
      return issue(s.ld_field, std::to_string(s.ld) + " is less than the " + std::to_string(s.cols) + " elements of a stored row of " +
                                   s.name + " (" + std::to_string(s.rows) + " x " + std::to_string(s.cols) + ")");
    if (s.stride < 0) return issue(s.stride_field, std::to_string(s.stride) + " is negative");
    std::optional<int64_t> last = mul_add(s.rows - 1, s.ld, s.cols - 1);
    if (last) last = mul_add(d.batch - 1, s.stride, *last);
    const int64_t have = numel(s.buffer->shape);
    if (!last || *last >= have)
      return issue(s.in_field, std::string(s.name) + " (" + std::to_string(d.batch) + " x " + std::to_string(s.rows) +
                                   " x " + std::to_string(s.cols) + ", " + s.ld_field + " " + std::to_string(s.ld) + ", " +
                                   s.stride_field + " " + std::to_string(s.stride) + ") reads past the end of " +
                                   s.buffer->str());
  }
  if (gemm_epilogue_has_bias(d.epilogue) && numel(in[2].shape) != d.n)
    return issue("in[2]", "the bias is " + in[2].str() + ", not a vector of n = " + std::to_string(d.n));
  if (d.ldc != d.n) return issue("ldc", std::to_string(d.ldc) + ": C is written contiguous, ldc = n = " + std::to_string(d.n));
  std::optional<int64_t> mn = mul_add(d.m, d.n, 0);
  if (!mn || d.stride_c != *mn)
    return issue("stride_c", std::to_string(d.stride_c) + ": C is written contiguous, stride_c = m x n");
  std::optional<int64_t> total = mul_add(*mn, d.batch, 0);
  if (!total || numel(out.shape) != *total)
    return issue("out[0]", "C is " + out.str() + ", not batch x m x n = " + std::to_string(d.batch) + " x " +
                               std::to_string(d.m) + " x " + std::to_string(d.n) + " elements");
  return std::nullopt;
}

std::string gemm_str(const GemmDesc& d) {
  auto s = [](int64_t v) { return std::to_string(v); };
  std::string t = std::string(gemm_library_name(d.library)) + " " + std::string(dtype_name(d.dtype)) + " [";
  if (d.batch > 1) t += s(d.batch) + " x ";
  t += s(d.m) + "x" + s(d.n) + "x" + s(d.k) + "] ";
  t += d.trans_a ? "A^T [K,M] lda " : "A [M,K] lda ";
  t += s(d.lda) + ", ";
  t += d.trans_b ? "B^T [N,K] ldb " : "B [K,N] ldb ";
  t += s(d.ldb);
  if (d.batch > 1) t += ", batch strides " + s(d.stride_a) + "/" + s(d.stride_b) + "/" + s(d.stride_c);
  return t + ", epilogue " + std::string(gemm_epilogue_name(d.epilogue)) + (d.tf32 ? ", tf32" : "");
}

int64_t gemm_flops(const GemmDesc& d) {
  // In double and clamped: a Plan's sizes are checked against its buffers, but the
  // product of four of them can still pass int64.
  const double f = 2.0 * static_cast<double>(d.batch) * static_cast<double>(d.m) * static_cast<double>(d.n) *
                   static_cast<double>(d.k);
  return f >= 9.2e18 ? INT64_MAX : static_cast<int64_t>(f);
}

}  // namespace sf
