// cuBLAS and cuBLASLt opened at run time: the tuner's extern GEMM candidates
// (autotune/cuda_runner.h), a Plan's gemm steps (runtime/plan/plan_exec.h) and the kernel
// benchmarks' baselines (bench/bench_kernels.cpp). dlopen("libcublas.so.13") and
// dlsym of the few entry points we call, with the toolkit's headers used for types
// only. No link-time dependency, so the runtime builds and runs on a machine without
// cuBLAS and says why when it is asked for it.
//
// Libraries tried: $SHARDFUSE_LIBCUBLAS (a path) alone when it is set; else, first
// that opens wins, libcublas.so.13, libcublas.so, then $CUDA_HOME/lib64 and
// /usr/local/cuda/lib64.
// cuBLASLt likewise ($SHARDFUSE_LIBCUBLASLT, libcublasLt.so.13, ...); it is
// optional: without it only cublaslt GEMMs are missing. With $SHARDFUSE_LIBCUDA
// naming another driver than libcuda.so.1 (the fake one of tests/fake_cuda), the
// system's cuBLAS is not opened unless $SHARDFUSE_LIBCUBLAS is set: it would talk to
// libcuda.so.1, whose contexts and pointers are not the ones the runtime uses.
//
// cuBLAS runs on the CUDA runtime's current context, which is the device's primary
// context: the one cuda::Context::primary() makes current, so both share memory
// and streams.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>

#include <memory>
#include <optional>
#include <string>

#include "runtime/core/diag.h"
#include "runtime/core/dtype.h"
#include "runtime/gpu/cuda.h"
#include "runtime/gpu/gemm.h"

namespace sf::cublas {

// Function pointer types spelled out: cublas_api.h overloads some names in C++
// (cublasGemmEx has an inline wrapper), so decltype(&::name) would be ambiguous.
struct Api {
  cublasStatus_t (*Create)(cublasHandle_t*) = nullptr;                  // cublasCreate_v2
  cublasStatus_t (*Destroy)(cublasHandle_t) = nullptr;                  // cublasDestroy_v2
  cublasStatus_t (*SetStream)(cublasHandle_t, cudaStream_t) = nullptr;  // cublasSetStream_v2
  cublasStatus_t (*GemmEx)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*,
                           const void*, cudaDataType, int, const void*, cudaDataType, int, const void*, void*,
                           cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t) = nullptr;
  cublasStatus_t (*GemmStridedBatchedEx)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                                         const void*, const void*, cudaDataType, int, long long int, const void*,
                                         cudaDataType, int, long long int, const void*, void*, cudaDataType, int,
                                         long long int, int, cublasComputeType_t, cublasGemmAlgo_t) = nullptr;
  const char* (*GetStatusString)(cublasStatus_t) = nullptr;  // optional
  cublasStatus_t (*GetProperty)(libraryPropertyType, int*) = nullptr;  // optional
  std::string library;  // the file opened
  // "cuBLAS 13.0.2 (libcublas.so.13)".
  std::string version() const;

  // cuBLASLt: all null when it could not be opened (lt_error says why).
  cublasStatus_t (*LtCreate)(cublasLtHandle_t*) = nullptr;
  cublasStatus_t (*LtDestroy)(cublasLtHandle_t) = nullptr;
  cublasStatus_t (*LtMatmulDescCreate)(cublasLtMatmulDesc_t*, cublasComputeType_t, cudaDataType_t) = nullptr;
  cublasStatus_t (*LtMatmulDescDestroy)(cublasLtMatmulDesc_t) = nullptr;
  cublasStatus_t (*LtMatmulDescSetAttribute)(cublasLtMatmulDesc_t, cublasLtMatmulDescAttributes_t, const void*,
                                             size_t) = nullptr;
  cublasStatus_t (*LtMatrixLayoutCreate)(cublasLtMatrixLayout_t*, cudaDataType, uint64_t, uint64_t, int64_t) = nullptr;
  cublasStatus_t (*LtMatrixLayoutDestroy)(cublasLtMatrixLayout_t) = nullptr;
  cublasStatus_t (*LtMatrixLayoutSetAttribute)(cublasLtMatrixLayout_t, cublasLtMatrixLayoutAttribute_t, const void*,
                                               size_t) = nullptr;
  cublasStatus_t (*LtMatmulPreferenceCreate)(cublasLtMatmulPreference_t*) = nullptr;
  cublasStatus_t (*LtMatmulPreferenceDestroy)(cublasLtMatmulPreference_t) = nullptr;
  cublasStatus_t (*LtMatmulPreferenceSetAttribute)(cublasLtMatmulPreference_t, cublasLtMatmulPreferenceAttributes_t,
                                                   const void*, size_t) = nullptr;
  cublasStatus_t (*LtMatmulAlgoGetHeuristic)(cublasLtHandle_t, cublasLtMatmulDesc_t, cublasLtMatrixLayout_t,
                                             cublasLtMatrixLayout_t, cublasLtMatrixLayout_t, cublasLtMatrixLayout_t,
                                             cublasLtMatmulPreference_t, int, cublasLtMatmulHeuristicResult_t[],
                                             int*) = nullptr;
  cublasStatus_t (*LtMatmul)(cublasLtHandle_t, cublasLtMatmulDesc_t, const void*, const void*, cublasLtMatrixLayout_t,
                             const void*, cublasLtMatrixLayout_t, const void*, const void*, cublasLtMatrixLayout_t,
                             void*, cublasLtMatrixLayout_t, const cublasLtMatmulAlgo_t*, void*, size_t,
                             cudaStream_t) = nullptr;
  size_t (*LtGetVersion)() = nullptr;  // optional
  std::string lt_library;
  std::string lt_error;  // "" when cuBLASLt is there

  // "cublasLt 130001 (libcublasLt.so.13)": what measured an extern candidate (the
  // tuning cache re-measures one measured with another version).
  std::string lt_version() const;

  // "CUBLAS_STATUS_NOT_SUPPORTED (the functionality requested is not supported)".
  std::string error(cublasStatus_t s) const;
};

// The libraries, opened once per process. A Diag "cuBLAS not available: <reason>"
// (the files tried, an entry point missing) when libcublas cannot be used.
Result<const Api*> api();

// A library GEMM (runtime/gpu/gemm.h) ready to run: cuBLASLt's matmul descriptor and
// matrix layouts made, and its algorithm chosen by cublasLtMatmulAlgoGetHeuristic
// within the workspace, once; enqueue() only calls the library. GemmDesc is
// row-major; cuBLAS is column-major, so the call computes C^T = op(B)^T op(A)^T:
// C [M, N] row-major is the column-major N x M matrix with leading dim ldc; B stored
// [K, N] (ldb) is column-major N x K, used as is (or [N, K]: K x N, transposed by
// the op), and A likewise becomes the second operand. The bias runs along the
// column-major result's rows, our N. f32 is computed in f32 without TF32
// (CUBLAS_COMPUTE_32F, the default math mode), f16 and bf16 in f32 on tensor cores,
// as torch.matmul does by default.
class GemmCall {
 public:
  GemmCall() = default;
  ~GemmCall();
  GemmCall(GemmCall&& o) noexcept;
  GemmCall& operator=(GemmCall&& o) noexcept;

  // On stream s: A, B, the bias (0 when the epilogue has none), C, and the workspace
  // (at least the bytes prepare() was given; 0 when that was 0).
  Result<void> enqueue(const cuda::Stream& s, CUdeviceptr a, CUdeviceptr b, CUdeviceptr bias, CUdeviceptr c,
                       CUdeviceptr workspace) const;
  const GemmDesc& desc() const { return desc_; }

 private:
  friend class Handle;
  void release();
  const Api* api_ = nullptr;
  GemmDesc desc_;
  cublasHandle_t h_ = nullptr;  // cuBLAS
  cublasLtHandle_t lt_ = nullptr;  // cuBLASLt: the rest
  cublasLtMatmulDesc_t op_ = nullptr;
  cublasLtMatrixLayout_t a_ = nullptr, b_ = nullptr, c_ = nullptr;
  cublasLtMatmulAlgo_t algo_{};
  size_t workspace_bytes_ = 0;
};

class Handle {
 public:
  // A cuBLAS handle on ctx's device (the primary context, made current first), and
  // a cuBLASLt one when cuBLASLt is there.
  static Result<Handle> create(const cuda::Context& ctx);
  Handle() = default;
  ~Handle();
  Handle(Handle&& o) noexcept;
  Handle& operator=(Handle&& o) noexcept;

  // `d` prepared for this handle's device: a Diag naming what the library refused,
  // "cuBLASLt not available: ..." for a cublaslt GEMM without cuBLASLt, or "cuBLASLt
  // has no algorithm for ..." when its heuristic finds none within workspace_bytes.
  Result<GemmCall> prepare(const GemmDesc& d, size_t workspace_bytes = kGemmWorkspaceBytes);

  // C = A x B^T on stream s (cublasGemmEx, nn.Linear's layout: linear_gemm()). f32,
  // bf16 or f16; all three the same dtype.
  Result<void> gemm(const cuda::Stream& s, DType dtype, int64_t m, int64_t n, int64_t k, CUdeviceptr a,
                    CUdeviceptr b, CUdeviceptr c);

 private:
  const Api* api_ = nullptr;
  const cuda::Context* ctx_ = nullptr;
  uint64_t generation_ = 0;
  cublasHandle_t h_ = nullptr;
  cublasLtHandle_t lt_ = nullptr;
};

// nn.Linear's GEMM, the benchmark graphs' layout: C[M, N] = epilogue(A[M, K] x
// B[N, K]^T (+ bias)), every matrix contiguous (trans_b, lda = ldb = K).
GemmDesc linear_gemm(GemmLibrary lib, DType dtype, int64_t m, int64_t n, int64_t k,
                     GemmEpilogue epilogue = GemmEpilogue::None);

}  // namespace sf::cublas
