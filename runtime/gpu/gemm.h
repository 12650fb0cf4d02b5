// A library GEMM: the one description of a matmul that cuBLASLt (or cuBLAS) computes
// in place of a generated kernel. The tuner measures it as an extern candidate
// (autotune/cuda_runner.h, GemmArtifact), the Plan records it as a "gemm" step
// (runtime/plan/plan.h, docs/plan.md) and `exec` calls the library with it
// (runtime/gpu/cublas.h). No LLVM here; codegen/kernels/extern_gemm.h derives one from a
// fused matmul group.
//
// Everything is in our terms, row-major, as the graph sees it:
//   C[b] = epilogue(op(A)[b] x op(B)[b] (+ bias)),  b < batch
// with C [M, N] contiguous (ldc = N, stride_c = M * N), A [M, K] and B [K, N] read
// in place from their buffers: A is stored [M, K] with row stride lda, or, when
// trans_a, [K, M] (A is a transposed view of it); B likewise [K, N] or, when
// trans_b, [N, K] (nn.Linear's weight: x @ w^T). Matrix b of an operand starts b *
// stride elements into its buffer (0: the same matrix for every b, a broadcast).
// The bias is a vector of N, the same for every row and batch. runtime/gpu/cublas.cpp
// maps this onto cuBLAS's column-major convention.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>
#include <string>
#include <string_view>

#include "runtime/core/tensor.h"

namespace sf {

enum class GemmLibrary : uint8_t { CublasLt, Cublas };
// "cublaslt", "cublas": the spelling in plan.json, the tuning cache and messages.
std::string_view gemm_library_name(GemmLibrary l);
std::optional<GemmLibrary> parse_gemm_library(std::string_view name);

// What follows the product, each a cuBLASLt epilogue (cublasLtEpilogue_t). GELU is the
// tanh approximation: cuBLASLt's GELU epilogue computes that form (PyTorch's
// _addmm_activation documents its cuBLASLt path as tanh-approximated), so only a
// graph's gelu_tanh maps to it; the erf form `gelu` keeps the generated kernel.
enum class GemmEpilogue : uint8_t { None, Bias, Relu, BiasRelu, GeluTanh, BiasGeluTanh };
// "none", "bias", "relu", "bias_relu", "gelu_tanh", "bias_gelu_tanh".
std::string_view gemm_epilogue_name(GemmEpilogue e);
std::optional<GemmEpilogue> parse_gemm_epilogue(std::string_view name);
bool gemm_epilogue_has_bias(GemmEpilogue e);

struct GemmDesc {
  GemmLibrary library = GemmLibrary::CublasLt;
  DType dtype = DType::F32;  // of A, B, the bias and C: f32, f16 or bf16; accumulated in f32
  int64_t m = 0, n = 0, k = 0, batch = 1;
  bool trans_a = false, trans_b = false;
  int64_t lda = 0, ldb = 0, ldc = 0;               // row strides of the stored matrices, in elements
  int64_t stride_a = 0, stride_b = 0, stride_c = 0;  // batch strides, in elements
  GemmEpilogue epilogue = GemmEpilogue::None;
  // f32 only: multiply in TF32 on the tensor cores (CUBLAS_COMPUTE_32F_FAST_TF32), as
  // --allow-tf32 lets the generated kernels do; otherwise f32 is exact IEEE FMA.
  bool tf32 = false;
  bool operator==(const GemmDesc&) const = default;
};

// The name of a split extern candidate's library ("cublas" + this): the library
// computes the bare product, a generated kernel the rest (codegen/kernels/extern_gemm.h).
inline constexpr std::string_view kGemmEpilogueSuffix = "+epilogue";

// The split extern candidate (a library GEMM of a group's bare matmul, then a
// generated epilogue kernel; codegen/kernels/extern_gemm.h): where an index says "the
// GEMM's product", in a buffer of its own when no output of the group is the product.
inline constexpr int kGemmProduct = -1;

// Limits of a GemmDesc (cuBLAS takes m, n, k and the batch count as 32-bit ints).
inline constexpr int64_t kMaxGemmDim = 2147483647;

// The scratch cuBLASLt may use per call: 32 MiB, NVIDIA's recommendation for Hopper
// (the cuBLAS documentation's cublasLtMatmul workspace notes); smaller GPUs need less.
inline constexpr size_t kGemmWorkspaceBytes = size_t{32} << 20;

// A defect of a GemmDesc against the buffers it is called on: the field it is in
// ("lda", "in[1]", "epilogue") and what is wrong.
struct GemmIssue {
  std::string field;
  std::string message;
};

// Whether `d` is a call its library can make on these buffers, which hold A, B and
// (when the epilogue has one) the bias, in that order, and C: sizes within
// [1, kMaxGemmDim]; the library can express the epilogue (cuBLAS's GemmEx has none);
// every buffer of `d.dtype` (f32, f16, bf16); leading dims at least the stored rows'
// length; every element the call reads inside its buffer (counted without overflow);
// the bias exactly N elements; C exactly batch x M x N, contiguous. nullopt if so.
std::optional<GemmIssue> gemm_check(const GemmDesc& d, const std::vector<TensorType>& in, const TensorType& out);

// One line for people: "cublaslt bf16 [4096x4096x4096] A [M,K] lda 4096, B^T [N,K]
// ldb 4096, epilogue bias_gelu_tanh".
std::string gemm_str(const GemmDesc& d);

// 2 x batch x M x N x K.
int64_t gemm_flops(const GemmDesc& d);

}  // namespace sf
