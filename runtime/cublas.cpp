#include "runtime/cublas.h"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>
#include <utility>
#include <vector>

namespace sf::cublas {

namespace {

// The files to try for a library: the environment's path first, then the
// versioned and plain sonames (the loader's search path), then the toolkit's lib64.
std::vector<std::string> candidates(const char* env, const std::string& stem) {
  std::vector<std::string> v;
  if (const char* p = std::getenv(env); p && *p) v.push_back(p);
  v.push_back(stem + ".so.13");
  v.push_back(stem + ".so");
  if (const char* home = std::getenv("CUDA_HOME"); home && *home) v.push_back(std::string(home) + "/lib64/" + stem + ".so.13");
  v.push_back("/usr/local/cuda/lib64/" + stem + ".so.13");
  return v;
}

// dlopen of the first candidate that opens; the handle, or "" and every failure.
void* open_first(const std::vector<std::string>& files, std::string* opened, std::string* why) {
  for (const std::string& f : files) {
    if (void* h = dlopen(f.c_str(), RTLD_NOW | RTLD_LOCAL)) {
      *opened = f;
      return h;
    }
    const char* e = dlerror();
    *why += (why->empty() ? "" : "; ") + (e ? std::string(e) : f + ": cannot open");
  }
  return nullptr;
}

template <class F>
bool resolve(void* lib, const char* name, F& f, std::string* missing) {
  f = reinterpret_cast<F>(dlsym(lib, name));
  if (!f) *missing += (missing->empty() ? "" : ", ") + std::string(name);
  return f != nullptr;
}

Result<Api> load() {
  Api a;
  std::string why;
  void* lib = open_first(candidates("SHARDFUSE_LIBCUBLAS", "libcublas"), &a.library, &why);
  if (!lib) return Diag{"", {}, "cuBLAS not available: cannot open libcublas (" + why + ")"};
  std::string missing;
  resolve(lib, "cublasCreate_v2", a.Create, &missing);
  resolve(lib, "cublasDestroy_v2", a.Destroy, &missing);
  resolve(lib, "cublasSetStream_v2", a.SetStream, &missing);
  resolve(lib, "cublasGemmEx", a.GemmEx, &missing);
  if (!missing.empty())
    return Diag{"", {}, "cuBLAS not available: " + a.library + " lacks " + missing};
  std::string ignored;
  resolve(lib, "cublasGetStatusString", a.GetStatusString, &ignored);

  std::string lt_why;
  void* lt = open_first(candidates("SHARDFUSE_LIBCUBLASLT", "libcublasLt"), &a.lt_library, &lt_why);
  if (!lt) {
    a.lt_error = "cuBLASLt not available: cannot open libcublasLt (" + lt_why + ")";
    return a;
  }
  std::string lt_missing;
  resolve(lt, "cublasLtCreate", a.LtCreate, &lt_missing);
  resolve(lt, "cublasLtDestroy", a.LtDestroy, &lt_missing);
  resolve(lt, "cublasLtMatmulDescCreate", a.LtMatmulDescCreate, &lt_missing);
  resolve(lt, "cublasLtMatmulDescDestroy", a.LtMatmulDescDestroy, &lt_missing);
  resolve(lt, "cublasLtMatmulDescSetAttribute", a.LtMatmulDescSetAttribute, &lt_missing);
  resolve(lt, "cublasLtMatrixLayoutCreate", a.LtMatrixLayoutCreate, &lt_missing);
  resolve(lt, "cublasLtMatrixLayoutDestroy", a.LtMatrixLayoutDestroy, &lt_missing);
  resolve(lt, "cublasLtMatmulPreferenceCreate", a.LtMatmulPreferenceCreate, &lt_missing);
  resolve(lt, "cublasLtMatmulPreferenceDestroy", a.LtMatmulPreferenceDestroy, &lt_missing);
  resolve(lt, "cublasLtMatmulPreferenceSetAttribute", a.LtMatmulPreferenceSetAttribute, &lt_missing);
  resolve(lt, "cublasLtMatmulAlgoGetHeuristic", a.LtMatmulAlgoGetHeuristic, &lt_missing);
  resolve(lt, "cublasLtMatmul", a.LtMatmul, &lt_missing);
  if (!lt_missing.empty()) {
    a.lt_error = "cuBLASLt not available: " + a.lt_library + " lacks " + lt_missing;
    a.LtCreate = nullptr;
  }
  return a;
}

Result<cudaDataType> data_type(DType t) {
  switch (t) {
    case DType::F32: return CUDA_R_32F;
    case DType::BF16: return CUDA_R_16BF;
    case DType::F16: return CUDA_R_16F;
    default: return Diag{"", {}, "cuBLAS GEMM: no " + std::string(dtype_name(t)) + " GEMM (f32, bf16 or f16)"};
  }
}

Diag status_error(const Api& a, cublasStatus_t s, const std::string& what) {
  return Diag{"", {}, what + ": " + a.error(s)};
}

}  // namespace

std::string Api::error(cublasStatus_t s) const {
  std::string name;
  switch (s) {
    case CUBLAS_STATUS_SUCCESS: name = "CUBLAS_STATUS_SUCCESS"; break;
    case CUBLAS_STATUS_NOT_INITIALIZED: name = "CUBLAS_STATUS_NOT_INITIALIZED"; break;
    case CUBLAS_STATUS_ALLOC_FAILED: name = "CUBLAS_STATUS_ALLOC_FAILED"; break;
    case CUBLAS_STATUS_INVALID_VALUE: name = "CUBLAS_STATUS_INVALID_VALUE"; break;
    case CUBLAS_STATUS_ARCH_MISMATCH: name = "CUBLAS_STATUS_ARCH_MISMATCH"; break;
    case CUBLAS_STATUS_MAPPING_ERROR: name = "CUBLAS_STATUS_MAPPING_ERROR"; break;
    case CUBLAS_STATUS_EXECUTION_FAILED: name = "CUBLAS_STATUS_EXECUTION_FAILED"; break;
    case CUBLAS_STATUS_INTERNAL_ERROR: name = "CUBLAS_STATUS_INTERNAL_ERROR"; break;
    case CUBLAS_STATUS_NOT_SUPPORTED: name = "CUBLAS_STATUS_NOT_SUPPORTED"; break;
    case CUBLAS_STATUS_LICENSE_ERROR: name = "CUBLAS_STATUS_LICENSE_ERROR"; break;
    default: name = "cublasStatus_t " + std::to_string(static_cast<int>(s)); break;
  }
  if (GetStatusString)
    if (const char* t = GetStatusString(s)) return name + " (" + t + ")";
  return name;
}

Result<const Api*> api() {
  static std::once_flag once;
  static std::optional<Result<Api>> loaded;
  std::call_once(once, [] { loaded.emplace(load()); });
  if (!*loaded) return loaded->error();
  return &loaded->value();
}

Result<Handle> Handle::create(const cuda::Context& ctx) {
  Result<const Api*> a = api();
  if (!a) return a.error();
  if (auto e = ctx.make_current()) return *e;
  Handle h;
  h.api_ = *a;
  h.ctx_ = &ctx;
  h.generation_ = ctx.generation();
  if (cublasStatus_t s = h.api_->Create(&h.h_); s != CUBLAS_STATUS_SUCCESS)
    return status_error(**a, s, "cublasCreate");
  if (h.api_->LtCreate)
    if (h.api_->LtCreate(&h.lt_) != CUBLAS_STATUS_SUCCESS) h.lt_ = nullptr;
  return h;
}

Handle::~Handle() {
  // After a context reset the handles died with it.
  if (!api_ || !ctx_ || ctx_->generation() != generation_) return;
  if (lt_) api_->LtDestroy(lt_);
  if (h_) api_->Destroy(h_);
}

Handle::Handle(Handle&& o) noexcept
    : api_(std::exchange(o.api_, nullptr)), ctx_(std::exchange(o.ctx_, nullptr)), generation_(o.generation_),
      h_(std::exchange(o.h_, nullptr)), lt_(std::exchange(o.lt_, nullptr)) {}

Handle& Handle::operator=(Handle&& o) noexcept {
  if (this != &o) {
    Handle old(std::move(*this));
    api_ = std::exchange(o.api_, nullptr);
    ctx_ = std::exchange(o.ctx_, nullptr);
    generation_ = o.generation_;
    h_ = std::exchange(o.h_, nullptr);
    lt_ = std::exchange(o.lt_, nullptr);
  }
  return *this;
}

std::optional<Diag> Handle::gemm(const cuda::Stream& s, DType dtype, int64_t m, int64_t n, int64_t k, CUdeviceptr a,
                                 CUdeviceptr b, CUdeviceptr c) {
  Result<cudaDataType> t = data_type(dtype);
  if (!t) return t.error();
  if (m > INT32_MAX || n > INT32_MAX || k > INT32_MAX) return Diag{"", {}, "cuBLAS GEMM: a dimension over 2^31"};
  if (cublasStatus_t st = api_->SetStream(h_, reinterpret_cast<cudaStream_t>(s.get())); st != CUBLAS_STATUS_SUCCESS)
    return status_error(*api_, st, "cublasSetStream");
  const float alpha = 1, beta = 0;
  const int M = static_cast<int>(m), N = static_cast<int>(n), K = static_cast<int>(k);
  // Column-major C^T[N, M] = op_T(B stored as K x N, ld K) x A^T (A stored as K x M, ld K).
  cublasStatus_t st = api_->GemmEx(h_, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &alpha, reinterpret_cast<const void*>(b), *t,
                                   K, reinterpret_cast<const void*>(a), *t, K, &beta, reinterpret_cast<void*>(c), *t, N,
                                   CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  if (st != CUBLAS_STATUS_SUCCESS) return status_error(*api_, st, "cublasGemmEx");
  return std::nullopt;
}

Handle::BiasGelu::~BiasGelu() { release(); }

void Handle::BiasGelu::release() {
  if (!api_) return;
  for (cublasLtMatrixLayout_t l : {weight_, input_, out_})
    if (l) api_->LtMatrixLayoutDestroy(l);
  if (desc_) api_->LtMatmulDescDestroy(desc_);
  weight_ = input_ = out_ = nullptr;
  desc_ = nullptr;
  api_ = nullptr;
}

Handle::BiasGelu::BiasGelu(BiasGelu&& o) noexcept { *this = std::move(o); }

Handle::BiasGelu& Handle::BiasGelu::operator=(BiasGelu&& o) noexcept {
  if (this != &o) {
    release();
    api_ = std::exchange(o.api_, nullptr);
    lt_ = std::exchange(o.lt_, nullptr);
    desc_ = std::exchange(o.desc_, nullptr);
    weight_ = std::exchange(o.weight_, nullptr);
    input_ = std::exchange(o.input_, nullptr);
    out_ = std::exchange(o.out_, nullptr);
    algo_ = o.algo_;
    workspace_bytes_ = o.workspace_bytes_;
  }
  return *this;
}

Result<Handle::BiasGelu> Handle::bias_gelu(DType dtype, int64_t m, int64_t n, int64_t k, CUdeviceptr bias,
                                           size_t workspace_bytes) {
  if (!lt_) return Diag{"", {}, api_->lt_error.empty() ? "cuBLASLt not available: cublasLtCreate failed" : api_->lt_error};
  Result<cudaDataType> t = data_type(dtype);
  if (!t) return t.error();
  const Api& A = *api_;
  BiasGelu g;  // owns each descriptor as soon as it exists: released on every error path
  g.api_ = api_;
  g.lt_ = lt_;
  g.workspace_bytes_ = workspace_bytes;
  auto ok = [&](cublasStatus_t st, const char* what) -> std::optional<Diag> {
    if (st == CUBLAS_STATUS_SUCCESS) return std::nullopt;
    return status_error(A, st, what);
  };
  if (auto e = ok(A.LtMatmulDescCreate(&g.desc_, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate")) return *e;
  const cublasOperation_t op_t = CUBLAS_OP_T, op_n = CUBLAS_OP_N;
  const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_GELU_BIAS;
  const void* bias_ptr = reinterpret_cast<const void*>(bias);
  const int32_t bias_type = static_cast<int32_t>(*t);
  struct Attr {
    cublasLtMatmulDescAttributes_t attr;
    const void* value;
    size_t size;
    const char* name;
  };
  for (const Attr& a : {Attr{CUBLASLT_MATMUL_DESC_TRANSA, &op_t, sizeof op_t, "TRANSA"},
                        Attr{CUBLASLT_MATMUL_DESC_TRANSB, &op_n, sizeof op_n, "TRANSB"},
                        Attr{CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi, "EPILOGUE"},
                        Attr{CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias_ptr, sizeof bias_ptr, "BIAS_POINTER"},
                        Attr{CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof bias_type, "BIAS_DATA_TYPE"}})
    if (auto e = ok(A.LtMatmulDescSetAttribute(g.desc_, a.attr, a.value, a.size), a.name)) return *e;
  // As gemm(): column-major, the weight stored K x N (transposed by the op), the
  // input stored K x M, D = C^T stored N x M; the bias runs along D's rows, our N.
  const auto K = static_cast<uint64_t>(k), M = static_cast<uint64_t>(m), N = static_cast<uint64_t>(n);
  if (auto e = ok(A.LtMatrixLayoutCreate(&g.weight_, *t, K, N, static_cast<int64_t>(K)), "layout of B")) return *e;
  if (auto e = ok(A.LtMatrixLayoutCreate(&g.input_, *t, K, M, static_cast<int64_t>(K)), "layout of A")) return *e;
  if (auto e = ok(A.LtMatrixLayoutCreate(&g.out_, *t, N, M, static_cast<int64_t>(N)), "layout of C")) return *e;
  cublasLtMatmulPreference_t pref = nullptr;
  if (auto e = ok(A.LtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate")) return *e;
  const uint64_t ws = workspace_bytes;
  cublasLtMatmulHeuristicResult_t best{};
  int found = 0;
  cublasStatus_t st = A.LtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
  if (st == CUBLAS_STATUS_SUCCESS)
    st = A.LtMatmulAlgoGetHeuristic(lt_, g.desc_, g.weight_, g.input_, g.out_, g.out_, pref, 1, &best, &found);
  A.LtMatmulPreferenceDestroy(pref);
  if (auto e = ok(st, "cublasLtMatmulAlgoGetHeuristic")) return *e;
  if (found == 0) return Diag{"", {}, "cuBLASLt has no algorithm for this GEMM with a bias+GELU epilogue"};
  g.algo_ = best.algo;
  return g;
}

std::optional<Diag> Handle::BiasGelu::enqueue(const cuda::Stream& s, CUdeviceptr a, CUdeviceptr b, CUdeviceptr c,
                                              CUdeviceptr workspace) const {
  const float alpha = 1, beta = 0;
  cublasStatus_t st = api_->LtMatmul(lt_, desc_, &alpha, reinterpret_cast<const void*>(b), weight_,
                                     reinterpret_cast<const void*>(a), input_, &beta, reinterpret_cast<const void*>(c),
                                     out_, reinterpret_cast<void*>(c), out_, &algo_, reinterpret_cast<void*>(workspace),
                                     workspace_bytes_, reinterpret_cast<cudaStream_t>(s.get()));
  if (st != CUBLAS_STATUS_SUCCESS) return status_error(*api_, st, "cublasLtMatmul");
  return std::nullopt;
}

}  // namespace sf::cublas
