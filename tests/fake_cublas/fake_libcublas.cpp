// A stand-in for libcublas.so.13 and libcublasLt.so.13 in one library, over the fake
// CUDA driver's host memory (tests/fake_cublas/README.md).
//
// runtime/gpu/cublas.cpp dlopen()s $SHARDFUSE_LIBCUBLAS and $SHARDFUSE_LIBCUBLASLT and
// dlsym()s the entry points it calls; this library defines them with <cublas_v2.h>
// and <cublasLt.h> included, so a definition whose type differs from the header's
// does not compile. Device pointers of tests/fake_cuda are host addresses, so a GEMM
// here really computes: in double, from cuBLAS's documented column-major semantics
//   D = epilogue(alpha op(A) op(B) + beta C + bias),  op(X) = X or X^T,
//   X column-major: element (i, j) at X[i + j * ld], matrix b at X + b * stride,
// each result rounded once to D's type. It checks what a real cuBLAS would refuse
// (a leading dim below the rows, layouts that do not chain, mixed types, a bias
// epilogue without a bias) and, through the fake driver's "range:" hook, that every
// byte a call reads or writes lies in a live allocation. Each call is logged to
// $FAKE_CUDA_LOG with all its arguments and advances the fake driver's clock by
// $FAKE_CUBLAS_NS (default 10000), as a kernel launch does.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <dlfcn.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <numbers>
#include <string>

#include "tests/fake_cuda/fake_float.h"
#include "tests/fake_cuda/fake_log.h"

#define FAKE_EXPORT extern "C" __attribute__((visibility("default")))

namespace fake {
namespace {

constexpr size_t kVersion = 130100;  // what cublasLtGetVersion answers
constexpr uint64_t kAlgoMagic = 0xfa4eb1a5;

struct MatmulDesc {
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  cudaDataType_t scale = CUDA_R_32F;
  cublasOperation_t transa = CUBLAS_OP_N, transb = CUBLAS_OP_N;
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;
  int32_t bias_type = -1;  // -1: D's type
};

struct Layout {
  cudaDataType type = CUDA_R_32F;
  uint64_t rows = 0, cols = 0;
  int64_t ld = 0;
  int32_t batch = 1;
  int64_t stride = 0;
};

struct State {
  std::mutex mu;
  uint64_t next_id = 0xB1A50000;
  std::map<uint64_t, cudaStream_t> blas;  // cuBLAS handles and their streams
  std::map<uint64_t, bool> lt;            // cuBLASLt handles
  std::map<uint64_t, MatmulDesc> descs;
  std::map<uint64_t, Layout> layouts;
  std::map<uint64_t, uint64_t> prefs;     // max workspace bytes
};

State& state() {
  static State* s = new State();  // never destroyed: calls from static destructors stay safe
  return *s;
}

// The fake driver's test hooks (tests/fake_cuda/README.md), when it is the driver.
struct Driver {
  long long (*stat)(const char*) = nullptr;
  int (*set)(const char*, long long) = nullptr;
};
const Driver& driver() {
  static const Driver d = [] {
    Driver r;
    const char* path = std::getenv("SHARDFUSE_LIBCUDA");
    if (!path || !*path) return r;
    if (void* h = dlopen(path, RTLD_NOW | RTLD_NOLOAD)) {
      r.stat = reinterpret_cast<long long (*)(const char*)>(dlsym(h, "fake_cuda_stat"));
      r.set = reinterpret_cast<int (*)(const char*, long long)>(dlsym(h, "fake_cuda_set"));
    }
    return r;
  }();
  return d;
}

cublasStatus_t fail(cublasStatus_t st, const std::string& call, const std::string& why) {
  log_line("error " + call + " " + std::to_string(static_cast<int>(st)) + " (" + why + ")");
  return st;
}

int type_bytes(cudaDataType t) {
  switch (t) {
    case CUDA_R_32F: return 4;
    case CUDA_R_16F:
    case CUDA_R_16BF: return 2;
    default: return 0;
  }
}

const char* type_name(cudaDataType t) {
  switch (t) {
    case CUDA_R_32F: return "f32";
    case CUDA_R_16F: return "f16";
    case CUDA_R_16BF: return "bf16";
    default: return "?";
  }
}

double load(const void* base, int64_t i, cudaDataType t) {
  const auto* p = static_cast<const std::byte*>(base) + i * type_bytes(t);
  if (t == CUDA_R_32F) {
    float f;
    std::memcpy(&f, p, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, p, 2);
  return t == CUDA_R_16F ? decode(h, 5, 10) : decode(h, 8, 7);
}

void store(void* base, int64_t i, cudaDataType t, double v) {
  auto* p = static_cast<std::byte*>(base) + i * type_bytes(t);
  if (t == CUDA_R_32F) {
    const float f = static_cast<float>(v);
    std::memcpy(p, &f, 4);
    return;
  }
  const uint16_t h = static_cast<uint16_t>(t == CUDA_R_16F ? encode(v, 5, 10) : encode(v, 8, 7));
  std::memcpy(p, &h, 2);
}

// One column-major operand of a call: rows x cols with leading dim ld, `batch`
// matrices `stride` elements apart.
struct Operand {
  const char* name;
  const void* ptr;
  cudaDataType type;
  int64_t rows, cols, ld, stride;
};

// Whether every element of `o` lies in one live allocation of the fake driver
// (without the fake driver, nothing to ask: assumed so).
bool in_memory(const Operand& o, int64_t batch) {
  const Driver& d = driver();
  if (!d.stat || !o.ptr) return o.ptr != nullptr;
  const int64_t last = (batch - 1) * o.stride + (o.cols - 1) * o.ld + (o.rows - 1);
  const std::string q = "range:" + std::to_string(reinterpret_cast<uintptr_t>(o.ptr)) + ":" +
                        std::to_string((last + 1) * type_bytes(o.type));
  return d.stat(q.c_str()) == 1;
}

struct Gemm {
  cublasOperation_t transa = CUBLAS_OP_N, transb = CUBLAS_OP_N;
  int64_t m = 0, n = 0, k = 0, batch = 1;
  Operand a{}, b{}, c{}, d{};
  const void* bias = nullptr;
  cudaDataType bias_type = CUDA_R_32F;
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  double alpha = 1, beta = 0;
};

// Checks `g` as cuBLAS would, computes it, logs it; the status.
cublasStatus_t run(const std::string& call, const Gemm& g, const std::string& extra) {
  if (g.m < 1 || g.n < 1 || g.k < 1 || g.batch < 1) return fail(CUBLAS_STATUS_INVALID_VALUE, call, "an empty GEMM");
  // op(A) is m x k, op(B) k x n; each stored column-major with ld >= its rows.
  const int64_t ar = g.transa == CUBLAS_OP_N ? g.m : g.k, ac = g.transa == CUBLAS_OP_N ? g.k : g.m;
  const int64_t br = g.transb == CUBLAS_OP_N ? g.k : g.n, bc = g.transb == CUBLAS_OP_N ? g.n : g.k;
  if (g.a.rows != ar || g.a.cols != ac || g.b.rows != br || g.b.cols != bc || g.c.rows != g.m || g.c.cols != g.n ||
      g.d.rows != g.m || g.d.cols != g.n)
    return fail(CUBLAS_STATUS_INVALID_VALUE, call, "the operands' shapes do not chain into m x k x n");
  for (const Operand* o : {&g.a, &g.b, &g.c, &g.d}) {
    if (o->ld < std::max<int64_t>(1, o->rows))
      return fail(CUBLAS_STATUS_INVALID_VALUE, call, std::string(o->name) + "'s leading dim is below its rows");
    if (!type_bytes(o->type) || o->type != g.d.type)
      return fail(CUBLAS_STATUS_NOT_SUPPORTED, call, "mixed or unsupported types");
    if ((o != &g.c || g.beta != 0) && !in_memory(*o, g.batch))
      return fail(CUBLAS_STATUS_EXECUTION_FAILED, call, std::string(o->name) + " reaches outside every allocation");
  }
  const bool has_bias = g.epilogue == CUBLASLT_EPILOGUE_BIAS || g.epilogue == CUBLASLT_EPILOGUE_RELU_BIAS ||
                        g.epilogue == CUBLASLT_EPILOGUE_GELU_BIAS;
  if (has_bias && (!g.bias || !in_memory(Operand{"bias", g.bias, g.bias_type, g.m, 1, g.m, 0}, 1)))
    return fail(CUBLAS_STATUS_INVALID_VALUE, call, "a bias epilogue without a bias of m elements");
  for (int64_t z = 0; z < g.batch; ++z)
    for (int64_t j = 0; j < g.n; ++j)
      for (int64_t i = 0; i < g.m; ++i) {
        double acc = 0;
        for (int64_t p = 0; p < g.k; ++p) {
          const int64_t ai = z * g.a.stride + (g.transa == CUBLAS_OP_N ? i + p * g.a.ld : p + i * g.a.ld);
          const int64_t bi = z * g.b.stride + (g.transb == CUBLAS_OP_N ? p + j * g.b.ld : j + p * g.b.ld);
          acc += load(g.a.ptr, ai, g.a.type) * load(g.b.ptr, bi, g.b.type);
        }
        double v = g.alpha * acc;
        if (g.beta != 0) v += g.beta * load(g.c.ptr, z * g.c.stride + i + j * g.c.ld, g.c.type);
        if (has_bias) v += load(g.bias, i, g.bias_type);
        if (g.epilogue == CUBLASLT_EPILOGUE_RELU || g.epilogue == CUBLASLT_EPILOGUE_RELU_BIAS) v = v > 0 ? v : 0;
        if (g.epilogue == CUBLASLT_EPILOGUE_GELU || g.epilogue == CUBLASLT_EPILOGUE_GELU_BIAS)
          v = 0.5 * v * (1 + std::tanh(std::sqrt(2 / std::numbers::pi) * (v + 0.044715 * v * v * v)));
        store(const_cast<void*>(g.d.ptr), z * g.d.stride + i + j * g.d.ld, g.d.type, v);
      }
  const char* ns = std::getenv("FAKE_CUBLAS_NS");
  if (driver().set) driver().set("advance_clock_ns", ns && *ns ? std::atoll(ns) : 10000);
  auto op = [](cublasOperation_t t) { return t == CUBLAS_OP_N ? "N" : "T"; };
  auto s = [](int64_t v) { return std::to_string(v); };
  log_line(call + " m=" + s(g.m) + " n=" + s(g.n) + " k=" + s(g.k) + " batch=" + s(g.batch) + " transa=" +
           op(g.transa) + " transb=" + op(g.transb) + " lda=" + s(g.a.ld) + " ldb=" + s(g.b.ld) + " ldc=" +
           s(g.d.ld) + " stride_a=" + s(g.a.stride) + " stride_b=" + s(g.b.stride) + " stride_c=" + s(g.d.stride) +
           " type=" + type_name(g.d.type) + " a=" + hex(reinterpret_cast<uintptr_t>(g.a.ptr)) +
           " b=" + hex(reinterpret_cast<uintptr_t>(g.b.ptr)) + " d=" + hex(reinterpret_cast<uintptr_t>(g.d.ptr)) +
           (has_bias ? " bias=" + hex(reinterpret_cast<uintptr_t>(g.bias)) : std::string()) + extra);
  return CUBLAS_STATUS_SUCCESS;
}

const char* epilogue_name(cublasLtEpilogue_t e) {
  switch (e) {
    case CUBLASLT_EPILOGUE_DEFAULT: return "none";
    case CUBLASLT_EPILOGUE_BIAS: return "bias";
    case CUBLASLT_EPILOGUE_RELU: return "relu";
    case CUBLASLT_EPILOGUE_RELU_BIAS: return "bias_relu";
    case CUBLASLT_EPILOGUE_GELU: return "gelu";
    case CUBLASLT_EPILOGUE_GELU_BIAS: return "bias_gelu";
    default: return nullptr;
  }
}

const char* compute_name(cublasComputeType_t c) {
  switch (c) {
    case CUBLAS_COMPUTE_32F: return "32F";
    case CUBLAS_COMPUTE_32F_FAST_TF32: return "32F_FAST_TF32";
    default: return nullptr;
  }
}

template <class T>
bool set_value(const void* buf, size_t size, T* out) {
  if (!buf || size != sizeof(T)) return false;
  std::memcpy(out, buf, sizeof(T));
  return true;
}

}  // namespace
}  // namespace fake

using fake::id_of;
using fake::state;

// --- cuBLAS ------------------------------------------------------------------------------

FAKE_EXPORT cublasStatus_t cublasCreate_v2(cublasHandle_t* h) {
  if (!h) return CUBLAS_STATUS_INVALID_VALUE;
  std::lock_guard<std::mutex> lock(state().mu);
  const uint64_t id = state().next_id++;
  state().blas[id] = nullptr;
  *h = fake::handle<cublasHandle_t>(id);
  return CUBLAS_STATUS_SUCCESS;
}

FAKE_EXPORT cublasStatus_t cublasDestroy_v2(cublasHandle_t h) {
  std::lock_guard<std::mutex> lock(state().mu);
  return state().blas.erase(id_of(h)) ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_INITIALIZED;
}

FAKE_EXPORT cublasStatus_t cublasSetStream_v2(cublasHandle_t h, cudaStream_t s) {
  std::lock_guard<std::mutex> lock(state().mu);
  auto it = state().blas.find(id_of(h));
  if (it == state().blas.end()) return CUBLAS_STATUS_NOT_INITIALIZED;
  it->second = s;
  return CUBLAS_STATUS_SUCCESS;
}

FAKE_EXPORT const char* cublasGetStatusString(cublasStatus_t s) {
  return s == CUBLAS_STATUS_SUCCESS ? "success (fake cuBLAS)" : "failed (fake cuBLAS; the log says why)";
}

FAKE_EXPORT cublasStatus_t cublasGetProperty(libraryPropertyType type, int* value) {
  if (!value) return CUBLAS_STATUS_INVALID_VALUE;
  *value = type == MAJOR_VERSION ? 13 : type == MINOR_VERSION ? 1 : 0;
  return CUBLAS_STATUS_SUCCESS;
}

namespace {

cublasStatus_t blas_gemm(const char* call, cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                         int k, const void* alpha, const void* A, cudaDataType at, int lda, long long sa,
                         const void* B, cudaDataType bt, int ldb, long long sb, const void* beta, void* C,
                         cudaDataType ct, int ldc, long long sc, int batch, cublasComputeType_t compute) {
  std::lock_guard<std::mutex> lock(state().mu);
  auto it = state().blas.find(id_of(h));
  if (it == state().blas.end()) return fake::fail(CUBLAS_STATUS_NOT_INITIALIZED, call, "unknown handle");
  const char* cn = fake::compute_name(compute);
  if (!cn) return fake::fail(CUBLAS_STATUS_NOT_SUPPORTED, call, "compute type");
  fake::Gemm g;
  g.transa = ta;
  g.transb = tb;
  g.m = m;
  g.n = n;
  g.k = k;
  g.batch = batch;
  g.a = {"A", A, at, ta == CUBLAS_OP_N ? m : k, ta == CUBLAS_OP_N ? k : m, lda, sa};
  g.b = {"B", B, bt, tb == CUBLAS_OP_N ? k : n, tb == CUBLAS_OP_N ? n : k, ldb, sb};
  g.c = {"C", C, ct, m, n, ldc, sc};
  g.d = g.c;
  g.alpha = *static_cast<const float*>(alpha);
  g.beta = *static_cast<const float*>(beta);
  return fake::run(call, g,
                   std::string(" compute=") + cn + " stream=" + fake::hex(id_of(it->second)));
}

}  // namespace

FAKE_EXPORT cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                                        int k, const void* alpha, const void* A, cudaDataType at, int lda,
                                        const void* B, cudaDataType bt, int ldb, const void* beta, void* C,
                                        cudaDataType ct, int ldc, cublasComputeType_t compute, cublasGemmAlgo_t) {
  return blas_gemm("cublasGemmEx", h, ta, tb, m, n, k, alpha, A, at, lda, 0, B, bt, ldb, 0, beta, C, ct, ldc, 0, 1,
                   compute);
}

FAKE_EXPORT cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb,
                                                      int m, int n, int k, const void* alpha, const void* A,
                                                      cudaDataType at, int lda, long long int sa, const void* B,
                                                      cudaDataType bt, int ldb, long long int sb, const void* beta,
                                                      void* C, cudaDataType ct, int ldc, long long int sc, int batch,
                                                      cublasComputeType_t compute, cublasGemmAlgo_t) {
  return blas_gemm("cublasGemmStridedBatchedEx", h, ta, tb, m, n, k, alpha, A, at, lda, sa, B, bt, ldb, sb, beta, C,
                   ct, ldc, sc, batch, compute);
}

// --- cuBLASLt ----------------------------------------------------------------------------

FAKE_EXPORT size_t cublasLtGetVersion() { return fake::kVersion; }

FAKE_EXPORT cublasStatus_t cublasLtCreate(cublasLtHandle_t* h) {
  if (!h) return CUBLAS_STATUS_INVALID_VALUE;
  std::lock_guard<std::mutex> lock(state().mu);
  const uint64_t id = state().next_id++;
  state().lt[id] = true;
  *h = fake::handle<cublasLtHandle_t>(id);
  return CUBLAS_STATUS_SUCCESS;
}

FAKE_EXPORT cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) {
  std::lock_guard<std::mutex> lock(state().mu);
  return state().lt.erase(id_of(h)) ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_INITIALIZED;
}

FAKE_EXPORT cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* d, cublasComputeType_t compute,
                                                    cudaDataType_t scale) {
  if (!d) return CUBLAS_STATUS_INVALID_VALUE;
  std::lock_guard<std::mutex> lock(state().mu);
  const uint64_t id = state().next_id++;
  state().descs[id] = fake::MatmulDesc{compute, scale};
  *d = fake::handle<cublasLtMatmulDesc_t>(id);
  return CUBLAS_STATUS_SUCCESS;
}

FAKE_EXPORT cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) {
  std::lock_guard<std::mutex> lock(state().mu);
  return state().descs.erase(id_of(d)) ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
}

FAKE_EXPORT cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr,
                                                          const void* buf, size_t size) {
  std::lock_guard<std::mutex> lock(state().mu);
  auto it = state().descs.find(id_of(d));
  if (it == state().descs.end()) return fake::fail(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmulDescSetAttribute", "unknown descriptor");
  fake::MatmulDesc& m = it->second;
  bool ok = false;
  switch (attr) {
    case CUBLASLT_MATMUL_DESC_TRANSA: ok = fake::set_value(buf, size, &m.transa); break;
    case CUBLASLT_MATMUL_DESC_TRANSB: ok = fake::set_value(buf, size, &m.transb); break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE: ok = fake::set_value(buf, size, &m.epilogue) && fake::epilogue_name(m.epilogue); break;
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER: ok = fake::set_value(buf, size, &m.bias); break;
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: ok = fake::set_value(buf, size, &m.bias_type); break;
    default: break;
  }
  return ok ? CUBLAS_STATUS_SUCCESS
            : fake::fail(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmulDescSetAttribute",
                         "attribute " + std::to_string(static_cast<int>(attr)) + " (unknown to the fake, or a bad value)");
}

FAKE_EXPORT cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* l, cudaDataType type, uint64_t rows,
                                                      uint64_t cols, int64_t ld) {
  if (!l) return CUBLAS_STATUS_INVALID_VALUE;
  std::lock_guard<std::mutex> lock(state().mu);
  const uint64_t id = state().next_id++;
  state().layouts[id] = fake::Layout{type, rows, cols, ld};
  *l = fake::handle<cublasLtMatrixLayout_t>(id);
  return CUBLAS_STATUS_SUCCESS;
}

FAKE_EXPORT cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) {
  std::lock_guard<std::mutex> lock(state().mu);
  return state().layouts.erase(id_of(l)) ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
}

FAKE_EXPORT cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t l,
                                                            cublasLtMatrixLayoutAttribute_t attr, const void* buf,
                                                            size_t size) {
  std::lock_guard<std::mutex> lock(state().mu);
  auto it = state().layouts.find(id_of(l));
  if (it == state().layouts.end()) return CUBLAS_STATUS_INVALID_VALUE;
  bool ok = false;
  if (attr == CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT) ok = fake::set_value(buf, size, &it->second.batch) && it->second.batch >= 1;
  if (attr == CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET) ok = fake::set_value(buf, size, &it->second.stride);
  return ok ? CUBLAS_STATUS_SUCCESS
            : fake::fail(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatrixLayoutSetAttribute",
                         "attribute " + std::to_string(static_cast<int>(attr)));
}

FAKE_EXPORT cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* p) {
  if (!p) return CUBLAS_STATUS_INVALID_VALUE;
  std::lock_guard<std::mutex> lock(state().mu);
  const uint64_t id = state().next_id++;
  state().prefs[id] = 0;
  *p = fake::handle<cublasLtMatmulPreference_t>(id);
  return CUBLAS_STATUS_SUCCESS;
}

FAKE_EXPORT cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) {
  std::lock_guard<std::mutex> lock(state().mu);
  return state().prefs.erase(id_of(p)) ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
}

FAKE_EXPORT cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p,
                                                                cublasLtMatmulPreferenceAttributes_t attr,
                                                                const void* buf, size_t size) {
  std::lock_guard<std::mutex> lock(state().mu);
  auto it = state().prefs.find(id_of(p));
  if (it == state().prefs.end() || attr != CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES ||
      !fake::set_value(buf, size, &it->second))
    return CUBLAS_STATUS_INVALID_VALUE;
  return CUBLAS_STATUS_SUCCESS;
}

// One algorithm for any GEMM whose descriptors exist; none when $FAKE_CUBLASLT_NO_ALGO
// is 1 (a real cuBLASLt finds none for what it cannot do).
FAKE_EXPORT cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t h, cublasLtMatmulDesc_t d,
                                                          cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                                          cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t dl,
                                                          cublasLtMatmulPreference_t p, int requested,
                                                          cublasLtMatmulHeuristicResult_t results[], int* found) {
  std::lock_guard<std::mutex> lock(state().mu);
  fake::State& s = state();
  if (!s.lt.count(id_of(h)) || !s.descs.count(id_of(d)) || !s.layouts.count(id_of(a)) || !s.layouts.count(id_of(b)) ||
      !s.layouts.count(id_of(c)) || !s.layouts.count(id_of(dl)) || !s.prefs.count(id_of(p)) || requested < 1 ||
      !results || !found)
    return fake::fail(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmulAlgoGetHeuristic", "unknown handle or descriptor");
  const char* none = std::getenv("FAKE_CUBLASLT_NO_ALGO");
  *found = none && std::string(none) == "1" ? 0 : 1;
  if (*found) {
    results[0] = cublasLtMatmulHeuristicResult_t{};
    results[0].algo.data[0] = fake::kAlgoMagic;
    results[0].state = CUBLAS_STATUS_SUCCESS;
  }
  return *found ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_SUPPORTED;
}

FAKE_EXPORT cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t desc, const void* alpha,
                                          const void* A, cublasLtMatrixLayout_t al, const void* B,
                                          cublasLtMatrixLayout_t bl, const void* beta, const void* C,
                                          cublasLtMatrixLayout_t cl, void* D, cublasLtMatrixLayout_t dl,
                                          const cublasLtMatmulAlgo_t* algo, void* workspace, size_t workspace_bytes,
                                          cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(state().mu);
  fake::State& s = state();
  const char* call = "cublasLtMatmul";
  auto layout = [&](cublasLtMatrixLayout_t l) { return s.layouts.count(id_of(l)) ? &s.layouts.at(id_of(l)) : nullptr; };
  const fake::Layout *la = layout(al), *lb = layout(bl), *lc = layout(cl), *ld = layout(dl);
  if (!s.lt.count(id_of(h)) || !s.descs.count(id_of(desc)) || !la || !lb || !lc || !ld)
    return fake::fail(CUBLAS_STATUS_INVALID_VALUE, call, "unknown handle or descriptor");
  if (!algo || algo->data[0] != fake::kAlgoMagic)
    return fake::fail(CUBLAS_STATUS_INVALID_VALUE, call, "no algorithm from cublasLtMatmulAlgoGetHeuristic");
  if (workspace_bytes > 0 && !workspace) return fake::fail(CUBLAS_STATUS_INVALID_VALUE, call, "no workspace");
  const fake::MatmulDesc& m = s.descs.at(id_of(desc));
  const char* cn = fake::compute_name(m.compute);
  if (!cn || m.scale != CUDA_R_32F) return fake::fail(CUBLAS_STATUS_NOT_SUPPORTED, call, "compute or scale type");
  if (la->batch != ld->batch || lb->batch != ld->batch || lc->batch != ld->batch)
    return fake::fail(CUBLAS_STATUS_INVALID_VALUE, call, "the layouts' batch counts differ");
  fake::Gemm g;
  g.transa = m.transa;
  g.transb = m.transb;
  g.m = static_cast<int64_t>(ld->rows);
  g.n = static_cast<int64_t>(ld->cols);
  g.k = static_cast<int64_t>(m.transa == CUBLAS_OP_N ? la->cols : la->rows);
  g.batch = ld->batch;
  auto op = [](const char* name, const void* p, const fake::Layout& l) {
    return fake::Operand{name, p, l.type, static_cast<int64_t>(l.rows), static_cast<int64_t>(l.cols), l.ld, l.stride};
  };
  g.a = op("A", A, *la);
  g.b = op("B", B, *lb);
  g.c = op("C", C, *lc);
  g.d = op("D", D, *ld);
  g.bias = m.bias;
  g.bias_type = m.bias_type < 0 ? ld->type : static_cast<cudaDataType>(m.bias_type);
  g.epilogue = m.epilogue;
  g.alpha = *static_cast<const float*>(alpha);
  g.beta = *static_cast<const float*>(beta);
  return fake::run(call, g,
                   std::string(" epilogue=") + fake::epilogue_name(m.epilogue) + " compute=" + cn +
                       " workspace=" + std::to_string(workspace_bytes) + " stream=" + fake::hex(id_of(stream)));
}
