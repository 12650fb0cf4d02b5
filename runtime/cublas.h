// cuBLAS and cuBLASLt opened at run time, as baselines for the kernel benchmarks
// (bench/bench_kernels.cpp): dlopen("libcublas.so.13") and dlsym of the few entry
// points we call, with the toolkit's headers used for types only. No link-time
// dependency, so the runtime builds and runs on a machine without cuBLAS and says
// why when it is asked for it.
//
// Libraries tried, first that opens wins: $SHARDFUSE_LIBCUBLAS (a path), then
// libcublas.so.13, libcublas.so, then $CUDA_HOME/lib64 and /usr/local/cuda/lib64.
// cuBLASLt likewise ($SHARDFUSE_LIBCUBLASLT, libcublasLt.so.13, ...); it is
// optional: without it only the Lt epilogue is missing.
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

#include "codegen/ir/diag.h"
#include "codegen/ir/dtype.h"
#include "runtime/cuda.h"

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
  const char* (*GetStatusString)(cublasStatus_t) = nullptr;  // optional
  std::string library;  // the file opened

  // cuBLASLt: all null when it could not be opened (lt_error says why).
  cublasStatus_t (*LtCreate)(cublasLtHandle_t*) = nullptr;
  cublasStatus_t (*LtDestroy)(cublasLtHandle_t) = nullptr;
  cublasStatus_t (*LtMatmulDescCreate)(cublasLtMatmulDesc_t*, cublasComputeType_t, cudaDataType_t) = nullptr;
  cublasStatus_t (*LtMatmulDescDestroy)(cublasLtMatmulDesc_t) = nullptr;
  cublasStatus_t (*LtMatmulDescSetAttribute)(cublasLtMatmulDesc_t, cublasLtMatmulDescAttributes_t, const void*,
                                             size_t) = nullptr;
  cublasStatus_t (*LtMatrixLayoutCreate)(cublasLtMatrixLayout_t*, cudaDataType, uint64_t, uint64_t, int64_t) = nullptr;
  cublasStatus_t (*LtMatrixLayoutDestroy)(cublasLtMatrixLayout_t) = nullptr;
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
  std::string lt_library;
  std::string lt_error;  // "" when cuBLASLt is there

  // "CUBLAS_STATUS_NOT_SUPPORTED (the functionality requested is not supported)".
  std::string error(cublasStatus_t s) const;
};

// The libraries, opened once per process. A Diag "cuBLAS not available: <reason>"
// (the files tried, an entry point missing) when libcublas cannot be used.
Result<const Api*> api();

// Row-major GEMMs in nn.Linear's layout, as the benchmark graphs write them:
//   C[M, N] = A[M, K] x B[N, K]^T   (matmul(x, transpose(w, 0, 1)))
// In cuBLAS's column-major terms that is C^T = op_T(B) x A: the "TN" GEMM, with
// every leading dimension the row length. f32 storage is computed in f32 (no
// TF32: CUBLAS_COMPUTE_32F under the default math mode); bf16 and f16 storage in
// f32 with tensor cores, as torch.matmul does by default.
class Handle {
 public:
  // A cuBLAS handle on ctx's device (the primary context, made current first).
  static Result<Handle> create(const cuda::Context& ctx);
  Handle() = default;
  ~Handle();
  Handle(Handle&& o) noexcept;
  Handle& operator=(Handle&& o) noexcept;

  // C = A x B^T on stream s (cublasGemmEx). f32, bf16 or f16; all three the same dtype.
  std::optional<Diag> gemm(const cuda::Stream& s, DType dtype, int64_t m, int64_t n, int64_t k, CUdeviceptr a,
                           CUdeviceptr b, CUdeviceptr c);

  // C = gelu(A x B^T + bias) in one cuBLASLt matmul (CUBLASLT_EPILOGUE_GELU_BIAS),
  // bias[N] of the same dtype: its descriptors and algorithm (cuBLASLt's heuristic,
  // within `workspace_bytes` of scratch; 32 MiB is plenty) are chosen once here, so
  // that enqueue() does no host work a benchmark would time. A Diag when cuBLASLt
  // is missing or has no algorithm for it. cuBLASLt's GELU need not be the exact
  // erf form our graphs use: this is a timing baseline, not a reference for values.
  class BiasGelu {
   public:
    BiasGelu() = default;
    ~BiasGelu();
    BiasGelu(BiasGelu&& o) noexcept;
    BiasGelu& operator=(BiasGelu&& o) noexcept;
    std::optional<Diag> enqueue(const cuda::Stream& s, CUdeviceptr a, CUdeviceptr b, CUdeviceptr c,
                                CUdeviceptr workspace) const;

   private:
    friend class Handle;
    void release();
    const Api* api_ = nullptr;
    cublasLtHandle_t lt_ = nullptr;
    cublasLtMatmulDesc_t desc_ = nullptr;
    cublasLtMatrixLayout_t weight_ = nullptr, input_ = nullptr, out_ = nullptr;
    cublasLtMatmulAlgo_t algo_{};
    size_t workspace_bytes_ = 0;
  };
  Result<BiasGelu> bias_gelu(DType dtype, int64_t m, int64_t n, int64_t k, CUdeviceptr bias, size_t workspace_bytes);

 private:
  const Api* api_ = nullptr;
  const cuda::Context* ctx_ = nullptr;
  uint64_t generation_ = 0;
  cublasHandle_t h_ = nullptr;
  cublasLtHandle_t lt_ = nullptr;
};

}  // namespace sf::cublas
