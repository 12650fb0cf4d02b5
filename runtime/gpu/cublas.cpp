#include "runtime/gpu/cublas.h"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>
#include <utility>
#include <vector>

namespace sf::cublas {

namespace {

// The files to try for a library: the environment's path alone when it is set (a
// library named by the user is that library or an error, as $SHARDFUSE_LIBCUDA and
// $SHARDFUSE_LIBNCCL are), else the versioned and plain sonames (the loader's search
// path), then the toolkit's lib64.
std::vector<std::string> candidates(const char* env, const std::string& stem) {
  std::vector<std::string> v;
  if (const char* p = std::getenv(env); p && *p) return {p};
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

// Why the system's cuBLAS must not be opened: $SHARDFUSE_LIBCUDA names a driver
// other than libcuda.so.1 (the fake one of tests/fake_cuda), and cuBLAS would talk
// to libcuda.so.1 instead, with other contexts and pointers. Opening the named
// driver first (the runtime opens it anyway) lets dlopen tell whether it is the
// library whose soname is libcuda.so.1.
std::optional<std::string> foreign_driver() {
  const char* drv = std::getenv("SHARDFUSE_LIBCUDA");
  if (!drv || !*drv) return std::nullopt;
  if (const char* own = std::getenv("SHARDFUSE_LIBCUBLAS"); own && *own) return std::nullopt;
  void* mine = dlopen(drv, RTLD_NOW | RTLD_LOCAL);
  void* sys = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
  const bool same = mine && mine == sys;
  if (sys) dlclose(sys);
  if (mine) dlclose(mine);
  if (same) return std::nullopt;
  return std::string("$SHARDFUSE_LIBCUDA=") + drv +
         " is not libcuda.so.1, the driver cuBLAS uses; set $SHARDFUSE_LIBCUBLAS (and $SHARDFUSE_LIBCUBLASLT) to a "
         "cuBLAS for that driver";
}

Result<Api> load() {
  Api a;
  if (std::optional<std::string> why = foreign_driver()) return Diag{"", {}, "cuBLAS not available: " + *why};
  std::string why;
  void* lib = open_first(candidates("SHARDFUSE_LIBCUBLAS", "libcublas"), &a.library, &why);
  if (!lib) return Diag{"", {}, "cuBLAS not available: cannot open libcublas (" + why + ")"};
  std::string missing;
  resolve(lib, "cublasCreate_v2", a.Create, &missing);
  resolve(lib, "cublasDestroy_v2", a.Destroy, &missing);
  resolve(lib, "cublasSetStream_v2", a.SetStream, &missing);
  resolve(lib, "cublasGemmEx", a.GemmEx, &missing);
  resolve(lib, "cublasGemmStridedBatchedEx", a.GemmStridedBatchedEx, &missing);
  if (!missing.empty())
    return Diag{"", {}, "cuBLAS not available: " + a.library + " lacks " + missing};
  std::string ignored;
  resolve(lib, "cublasGetStatusString", a.GetStatusString, &ignored);
  resolve(lib, "cublasGetProperty", a.GetProperty, &ignored);

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
  resolve(lt, "cublasLtMatrixLayoutSetAttribute", a.LtMatrixLayoutSetAttribute, &lt_missing);
  resolve(lt, "cublasLtMatmulPreferenceCreate", a.LtMatmulPreferenceCreate, &lt_missing);
  resolve(lt, "cublasLtMatmulPreferenceDestroy", a.LtMatmulPreferenceDestroy, &lt_missing);
  resolve(lt, "cublasLtMatmulPreferenceSetAttribute", a.LtMatmulPreferenceSetAttribute, &lt_missing);
  resolve(lt, "cublasLtMatmulAlgoGetHeuristic", a.LtMatmulAlgoGetHeuristic, &lt_missing);
  resolve(lt, "cublasLtMatmul", a.LtMatmul, &lt_missing);
  if (!lt_missing.empty()) {
    a.lt_error = "cuBLASLt not available: " + a.lt_library + " lacks " + lt_missing;
    a.LtCreate = nullptr;
  }
  resolve(lt, "cublasLtGetVersion", a.LtGetVersion, &ignored);
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

std::string Api::version() const {
  int v[3] = {-1, -1, -1};
  const libraryPropertyType parts[3] = {MAJOR_VERSION, MINOR_VERSION, PATCH_LEVEL};
  for (int i = 0; i < 3 && GetProperty; ++i)
    if (GetProperty(parts[i], &v[i]) != CUBLAS_STATUS_SUCCESS) v[i] = -1;
  const std::string number = v[0] < 0 ? "(version unknown)"
                                      : std::to_string(v[0]) + "." + std::to_string(v[1]) + "." + std::to_string(v[2]);
  return "cuBLAS " + number + " (" + library + ")";
}

std::string Api::lt_version() const {
  if (!LtCreate) return "";
  return "cublasLt " + (LtGetVersion ? std::to_string(LtGetVersion()) : std::string("(version unknown)")) + " (" +
         lt_library + ")";
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
  SF_TRY(ctx.make_current());
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

Result<void> Handle::gemm(const cuda::Stream& s, DType dtype, int64_t m, int64_t n, int64_t k, CUdeviceptr a,
                          CUdeviceptr b, CUdeviceptr c) {
  Result<GemmCall> call = prepare(linear_gemm(GemmLibrary::Cublas, dtype, m, n, k), 0);
  if (!call) return call.error();
  return call->enqueue(s, a, b, 0, c, 0);
}

GemmDesc linear_gemm(GemmLibrary lib, DType dtype, int64_t m, int64_t n, int64_t k, GemmEpilogue epilogue) {
  GemmDesc d;
  d.library = lib;
  d.dtype = dtype;
  d.m = m;
  d.n = n;
  d.k = k;
  d.trans_b = true;
  d.lda = k;
  d.ldb = k;
  d.ldc = n;
  d.stride_a = m * k;
  d.stride_b = n * k;
  d.stride_c = m * n;
  d.epilogue = epilogue;
  return d;
}

// --- GemmCall ------------------------------------------------------------------------------

namespace {

// f32 accumulation always; TF32 multiplies only where the GEMM allows it.
cublasComputeType_t compute_type(const GemmDesc& d) {
  return d.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
}

cublasLtEpilogue_t lt_epilogue(GemmEpilogue e) {
  switch (e) {
    case GemmEpilogue::None: return CUBLASLT_EPILOGUE_DEFAULT;
    case GemmEpilogue::Bias: return CUBLASLT_EPILOGUE_BIAS;
    case GemmEpilogue::Relu: return CUBLASLT_EPILOGUE_RELU;
    case GemmEpilogue::BiasRelu: return CUBLASLT_EPILOGUE_RELU_BIAS;
    case GemmEpilogue::GeluTanh: return CUBLASLT_EPILOGUE_GELU;
    case GemmEpilogue::BiasGeluTanh: return CUBLASLT_EPILOGUE_GELU_BIAS;
  }
  return CUBLASLT_EPILOGUE_DEFAULT;
}

// The column-major view of a row-major matrix stored rows x cols with row stride ld:
// cols x rows with leading dim ld.
struct ColMajor {
  uint64_t rows, cols;
  int64_t ld;
};

// cuBLAS's operands: its A is our B, its B our A (module comment in cublas.h).
struct ColMajorCall {
  cublasOperation_t op_a, op_b;
  int m, n, k;
  ColMajor a, b, c;
  int64_t stride_a, stride_b, stride_c;
};

ColMajorCall col_major(const GemmDesc& d) {
  ColMajorCall c{};
  c.m = static_cast<int>(d.n);
  c.n = static_cast<int>(d.m);
  c.k = static_cast<int>(d.k);
  const auto N = static_cast<uint64_t>(d.n), M = static_cast<uint64_t>(d.m), K = static_cast<uint64_t>(d.k);
  // Our B stored [K, N] is column-major N x K: op(A) = B^T as it is. Stored [N, K]
  // (trans_b) it is K x N, transposed by the op.
  c.op_a = d.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  c.a = d.trans_b ? ColMajor{K, N, d.ldb} : ColMajor{N, K, d.ldb};
  // Our A stored [M, K] is column-major K x M: op(B) = A^T as it is; stored [K, M]
  // (trans_a) it is M x K, transposed.
  c.op_b = d.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  c.b = d.trans_a ? ColMajor{M, K, d.lda} : ColMajor{K, M, d.lda};
  c.c = ColMajor{N, M, d.ldc};
  c.stride_a = d.stride_b;
  c.stride_b = d.stride_a;
  c.stride_c = d.stride_c;
  return c;
}

}  // namespace

GemmCall::~GemmCall() { release(); }

void GemmCall::release() {
  if (!api_) return;
  if (lt_) {
    for (cublasLtMatrixLayout_t l : {a_, b_, c_})
      if (l) api_->LtMatrixLayoutDestroy(l);
    if (op_) api_->LtMatmulDescDestroy(op_);
  }
  a_ = b_ = c_ = nullptr;
  op_ = nullptr;
  api_ = nullptr;
}

GemmCall::GemmCall(GemmCall&& o) noexcept { *this = std::move(o); }

GemmCall& GemmCall::operator=(GemmCall&& o) noexcept {
  if (this != &o) {
    release();
    api_ = std::exchange(o.api_, nullptr);
    desc_ = o.desc_;
    h_ = std::exchange(o.h_, nullptr);
    lt_ = std::exchange(o.lt_, nullptr);
    op_ = std::exchange(o.op_, nullptr);
    a_ = std::exchange(o.a_, nullptr);
    b_ = std::exchange(o.b_, nullptr);
    c_ = std::exchange(o.c_, nullptr);
    algo_ = o.algo_;
    workspace_bytes_ = o.workspace_bytes_;
  }
  return *this;
}

Result<GemmCall> Handle::prepare(const GemmDesc& d, size_t workspace_bytes) {
  if (!api_) return Diag{"", {}, "cuBLAS: the handle was not created"};
  Result<cudaDataType> t = data_type(d.dtype);
  if (!t) return t.error();
  for (int64_t v : {d.m, d.n, d.k, d.batch})
    if (v < 1 || v > kMaxGemmDim) return Diag{"", {}, "cuBLAS GEMM: a size outside [1, 2^31): " + gemm_str(d)};
  const Api& A = *api_;
  GemmCall g;  // owns each descriptor as soon as it exists: released on every error path
  g.api_ = api_;
  g.desc_ = d;
  g.workspace_bytes_ = workspace_bytes;
  if (d.library == GemmLibrary::Cublas) {
    if (d.epilogue != GemmEpilogue::None)
      return Diag{"", {}, "cuBLAS GEMM: GemmEx has no " + std::string(gemm_epilogue_name(d.epilogue)) + " epilogue"};
    g.h_ = h_;
    return g;
  }
  if (!lt_) return Diag{"", {}, A.lt_error.empty() ? "cuBLASLt not available: cublasLtCreate failed" : A.lt_error};
  g.lt_ = lt_;
  auto ok = [&](cublasStatus_t st, const std::string& what) -> Result<void> {
    if (st == CUBLAS_STATUS_SUCCESS) return {};
    return status_error(A, st, what);
  };
  const ColMajorCall c = col_major(d);
  SF_TRY(ok(A.LtMatmulDescCreate(&g.op_, compute_type(d), CUDA_R_32F), "cublasLtMatmulDescCreate"));
  const cublasLtEpilogue_t epi = lt_epilogue(d.epilogue);
  const int32_t bias_type = static_cast<int32_t>(*t);
  struct Attr {
    cublasLtMatmulDescAttributes_t attr;
    const void* value;
    size_t size;
    const char* name;
  };
  std::vector<Attr> attrs = {Attr{CUBLASLT_MATMUL_DESC_TRANSA, &c.op_a, sizeof c.op_a, "TRANSA"},
                             Attr{CUBLASLT_MATMUL_DESC_TRANSB, &c.op_b, sizeof c.op_b, "TRANSB"},
                             Attr{CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi, "EPILOGUE"}};
  if (gemm_epilogue_has_bias(d.epilogue))
    attrs.push_back(Attr{CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof bias_type, "BIAS_DATA_TYPE"});
  for (const Attr& a : attrs)
    SF_TRY(ok(A.LtMatmulDescSetAttribute(g.op_, a.attr, a.value, a.size), a.name));
  auto layout = [&](cublasLtMatrixLayout_t* l, const ColMajor& m, int64_t stride, const char* what) -> Result<void> {
    SF_TRY(ok(A.LtMatrixLayoutCreate(l, *t, m.rows, m.cols, m.ld), std::string("layout of ") + what));
    if (d.batch == 1) return {};
    const int32_t count = static_cast<int32_t>(d.batch);
    SF_TRY(ok(A.LtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count),
              std::string("batch count of ") + what));
    return ok(A.LtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride),
              std::string("batch stride of ") + what);
  };
  SF_TRY(layout(&g.a_, c.a, c.stride_a, "B"));
  SF_TRY(layout(&g.b_, c.b, c.stride_b, "A"));
  SF_TRY(layout(&g.c_, c.c, c.stride_c, "C"));
  cublasLtMatmulPreference_t pref = nullptr;
  SF_TRY(ok(A.LtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate"));
  const uint64_t ws = workspace_bytes;
  cublasLtMatmulHeuristicResult_t best{};
  int found = 0;
  cublasStatus_t st = A.LtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
  if (st == CUBLAS_STATUS_SUCCESS)
    st = A.LtMatmulAlgoGetHeuristic(lt_, g.op_, g.a_, g.b_, g.c_, g.c_, pref, 1, &best, &found);
  A.LtMatmulPreferenceDestroy(pref);
  // No algorithm is either answer: NOT_SUPPORTED, or success with none found.
  if (st == CUBLAS_STATUS_NOT_SUPPORTED || (st == CUBLAS_STATUS_SUCCESS && found == 0))
    return Diag{"", {}, "cuBLASLt has no algorithm for " + gemm_str(d) + " within " +
                            std::to_string(workspace_bytes >> 20) + " MiB of workspace"};
  SF_TRY(ok(st, "cublasLtMatmulAlgoGetHeuristic"));
  g.algo_ = best.algo;
  return g;
}

Result<void> GemmCall::enqueue(const cuda::Stream& s, CUdeviceptr a, CUdeviceptr b, CUdeviceptr bias,
                               CUdeviceptr c, CUdeviceptr workspace) const {
  if (!api_) return Diag{"", {}, "cuBLAS GEMM: not prepared"};
  const float alpha = 1, beta = 0;
  const auto stream = reinterpret_cast<cudaStream_t>(s.get());
  const auto ptr = [](CUdeviceptr p) { return reinterpret_cast<const void*>(p); };
  const GemmDesc& d = desc_;
  if (!lt_) {
    Result<cudaDataType> t = data_type(d.dtype);
    if (!t) return t.error();
    if (cublasStatus_t st = api_->SetStream(h_, stream); st != CUBLAS_STATUS_SUCCESS)
      return status_error(*api_, st, "cublasSetStream");
    const ColMajorCall m = col_major(d);
    cublasStatus_t st;
    if (d.batch == 1)
      st = api_->GemmEx(h_, m.op_a, m.op_b, m.m, m.n, m.k, &alpha, ptr(b), *t, static_cast<int>(m.a.ld), ptr(a), *t,
                        static_cast<int>(m.b.ld), &beta, reinterpret_cast<void*>(c), *t, static_cast<int>(m.c.ld),
                        compute_type(d), CUBLAS_GEMM_DEFAULT);
    else
      st = api_->GemmStridedBatchedEx(h_, m.op_a, m.op_b, m.m, m.n, m.k, &alpha, ptr(b), *t, static_cast<int>(m.a.ld),
                                      m.stride_a, ptr(a), *t, static_cast<int>(m.b.ld), m.stride_b, &beta,
                                      reinterpret_cast<void*>(c), *t, static_cast<int>(m.c.ld), m.stride_c,
                                      static_cast<int>(d.batch), compute_type(d), CUBLAS_GEMM_DEFAULT);
    if (st != CUBLAS_STATUS_SUCCESS)
      return status_error(*api_, st, d.batch == 1 ? "cublasGemmEx" : "cublasGemmStridedBatchedEx");
    return {};
  }
  if (gemm_epilogue_has_bias(d.epilogue)) {
    // The bias is an attribute of the descriptor, not an argument: set per call, so
    // a prepared call serves any buffers (a host-side store, no device work).
    const void* bp = ptr(bias);
    if (cublasStatus_t st = api_->LtMatmulDescSetAttribute(op_, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bp, sizeof bp);
        st != CUBLAS_STATUS_SUCCESS)
      return status_error(*api_, st, "BIAS_POINTER");
  }
  cublasStatus_t st = api_->LtMatmul(lt_, op_, &alpha, ptr(b), a_, ptr(a), b_, &beta, ptr(c), c_,
                                     reinterpret_cast<void*>(c), c_, &algo_, reinterpret_cast<void*>(workspace),
                                     workspace_bytes_, stream);
  if (st != CUBLAS_STATUS_SUCCESS) return status_error(*api_, st, "cublasLtMatmul");
  return {};
}

}  // namespace sf::cublas
