// The CUDA Runner and the cuBLAS baselines on a real GPU (the lent GPU machine);
// every test that needs one skips itself with the reason when there is none. The
// same plumbing is tested without a GPU on the fake driver
// (tests/runtime_fake/cuda_runner_fake_test.cpp); what only a GPU shows is here:
// real event times, the graph mode's effect on a tiny kernel, a real fault and
// its recovery, a real JIT error log, and cuBLAS's results in our layout.
#include "autotune/cuda_runner.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "runtime/gpu/cublas.h"
#include "tests/result_util.h"

namespace sf {
namespace autotune_cuda_runner_test {

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// The device's context, or a skip naming why there is none.
#define REQUIRE_GPU(ctx)                                                    \
  Result<std::shared_ptr<cuda::Context>> ctx##_r = cuda::Context::primary(); \
  if (!ctx##_r) GTEST_SKIP() << ctx##_r.error().message;                    \
  [[maybe_unused]] cuda::Context& ctx = **ctx##_r

// out[i] = in[i] for i < COUNT, one thread per element (written by hand; ptxas
// accepts it for sm_80 and sm_90a).
std::string copy_ptx(int64_t count) {
  return R"(.version 8.0
.target sm_80
.address_size 64

.visible .entry sf_copy(
	.param .u64 in0,
	.param .u64 out0
)
{
	.reg .pred %p<2>;
	.reg .b32 %r<6>;
	.reg .f32 %f<2>;
	.reg .b64 %rd<8>;

	ld.param.u64 %rd1, [in0];
	ld.param.u64 %rd2, [out0];
	mov.u32 %r1, %ctaid.x;
	mov.u32 %r2, %ntid.x;
	mov.u32 %r3, %tid.x;
	mad.lo.s32 %r4, %r1, %r2, %r3;
	setp.ge.s32 %p1, %r4, )" +
         std::to_string(count) + R"(;
	@%p1 bra DONE;
	cvta.to.global.u64 %rd3, %rd1;
	mul.wide.s32 %rd4, %r4, 4;
	add.s64 %rd5, %rd3, %rd4;
	ld.global.f32 %f1, [%rd5];
	cvta.to.global.u64 %rd6, %rd2;
	add.s64 %rd7, %rd6, %rd4;
	st.global.f32 [%rd7], %f1;
DONE:
	ret;
}
)";
}

// Stores to address 0: an illegal address on every GPU.
constexpr const char* kFaultPtx = R"(.version 8.0
.target sm_80
.address_size 64

.visible .entry sf_fault(
	.param .u64 in0,
	.param .u64 out0
)
{
	.reg .b32 %r<2>;
	.reg .b64 %rd<2>;

	mov.u32 %r1, %tid.x;
	mov.u64 %rd1, 0;
	st.global.u32 [%rd1], %r1;
	ret;
}
)";

PtxArtifact copy_artifact(int64_t n) {
  PtxArtifact a;
  a.ptx = copy_ptx(n);
  a.entry = "sf_copy";
  a.launch.grid = {(n + 255) / 256, 1, 1};
  a.launch.block = {256, 1, 1};
  a.inputs = {{DType::F32, n}};
  a.outputs = {{DType::F32, n}};
  return a;
}

BenchOptions quick() {
  BenchOptions b;
  b.warmup_ms = 5;
  b.rep_ms = 20;
  b.max_reps = 50;
  return b;
}

std::unique_ptr<CudaRunner> copy_runner(int64_t n) {
  Result<std::unique_ptr<CudaRunner>> r = CudaRunner::create({random_tensor(DType::F32, {n}, 7)}, {{DType::F32, n}});
  if (!r) throw std::runtime_error(r.error().message);
  return std::move(r).value();
}

TEST(RandomTensor, IsSeededAndInRange) {
  Tensor a = random_tensor(DType::F32, {1000}, 3), b = random_tensor(DType::F32, {1000}, 3);
  Tensor c = random_tensor(DType::F32, {1000}, 4);
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.nbytes()), 0);
  EXPECT_NE(std::memcmp(a.data(), c.data(), a.nbytes()), 0);
  double lo = 1, hi = -1;
  for (int64_t i = 0; i < a.numel(); ++i) {
    lo = std::min(lo, a.get(i));
    hi = std::max(hi, a.get(i));
  }
  EXPECT_GE(lo, -1.0);
  EXPECT_LT(hi, 1.0);
  EXPECT_LT(lo, -0.9);
  EXPECT_GT(hi, 0.9);
  Tensor ints = random_tensor(DType::I32, {100}, 1);
  for (int64_t i = 0; i < ints.numel(); ++i) {
    EXPECT_GE(ints.get_int(i), 0);
    EXPECT_LT(ints.get_int(i), 8);
  }
}

TEST(CudaRunner, WithoutADeviceCreatingOneSaysWhy) {
  Result<std::unique_ptr<CudaRunner>> r = CudaRunner::create({}, {});
  if (r) GTEST_SKIP() << "a CUDA device is present: " << (*r)->device().name;
  EXPECT_EQ(r.error().message.rfind("no CUDA device: ", 0), 0u) << r.error().message;
}

TEST(CudaRunner, TimesALargeCopyWithEventsOneLaunchAtATime) {
  REQUIRE_GPU(ctx);
  // 64 Mi floats: 512 MiB moved, hundreds of microseconds on any GPU we target.
  const int64_t n = int64_t{64} << 20;
  auto r = copy_runner(n);
  Result<Measurement> m = r->run(copy_artifact(n), quick());
  ASSERT_TRUE(m) << m.error().message;
  EXPECT_FALSE(r->last_run().graph_mode);
  EXPECT_GE(m->reps, 5);
  EXPECT_GT(m->median_us, 20.0);
  EXPECT_LE(m->p20_us, m->median_us);
  EXPECT_LE(m->median_us, m->p80_us);
  EXPECT_EQ(r->last_run().flushes, m->reps);
  // Not faster than the device's memory allows: 512 MiB at under 10 TB/s.
  const double gbps = 2.0 * static_cast<double>(n) * 4 / (m->median_us * 1e3);
  EXPECT_LT(gbps, 10000) << m->median_us << " us";
  RecordProperty("copy_gbps", std::to_string(gbps));
}

TEST(CudaRunner, TimesATinyKernelInACudaGraph) {
  REQUIRE_GPU(ctx);
  auto r = copy_runner(256);
  Result<Measurement> m = r->run(copy_artifact(256), quick());
  ASSERT_TRUE(m) << m.error().message;
  EXPECT_TRUE(r->last_run().graph_mode) << "estimate " << r->last_run().estimate_us << " us";
  EXPECT_GE(r->last_run().launches_per_timing, 2);
  EXPECT_GT(m->median_us, 0.0);
  // Back-to-back launches in a graph take a few microseconds each at most.
  EXPECT_LT(m->median_us, 10.0);
}

// A real fault, in a child process of its own: where the driver keeps the fault
// through a context reset (driver 580 on an H200 did,
// bench/results/gpu-check-h200-2026-11-26-run1.log), CUDA is gone for the rest of the
// process, and the tests after this one need it.
TEST(CudaRunner, AFaultingCandidateIsInvalidAndTheRunnerRecoversOrSaysCudaIsLost) {
  if (Result<cuda::DeviceInfo> d = cuda::device_info(0); !d) GTEST_SKIP() << d.error().message;
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // the child starts afresh: no CUDA state forked
  EXPECT_EXIT(
      {
        bool ok = true;
        auto expect = [&](bool c, const std::string& what) {
          if (!c) std::fprintf(stderr, "child: expected %s\n", what.c_str());
          ok = ok && c;
        };
        auto r = copy_runner(4096);
        PtxArtifact bad = copy_artifact(4096);
        bad.ptx = kFaultPtx;
        bad.entry = "sf_fault";
        Result<Measurement> m = r->run(bad, quick());
        expect(!m, "the faulting candidate to fail");
        const std::string msg = m ? "" : m.error().message;
        std::fprintf(stderr, "child: %s\n", msg.c_str());
        expect(has(msg, "CUDA_ERROR_"), "the driver's error in the message");
        Result<Measurement> good = r->run(copy_artifact(4096), quick());
        if (r->lost()) {
          expect(has(msg, "CUDA cannot be used again in this process"), "the message to say CUDA is lost");
          expect(!good && has(good.error().message, "left CUDA unusable"), "the next candidate to fail at once");
        } else {
          expect(has(msg, "the context was reset") && r->recoveries() == 1, "a reset");
          expect(good && good->median_us > 0, "the next candidate to measure");
        }
        std::fflush(stderr);
        std::_Exit(ok ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "child: .*CUDA_ERROR_");
}

TEST(CudaRunner, AJitErrorCarriesTheJitLog) {
  REQUIRE_GPU(ctx);
  auto r = copy_runner(256);
  PtxArtifact bad = copy_artifact(256);
  bad.ptx.replace(bad.ptx.find("ld.global.f32"), 13, "ld.global.f99");
  Result<Measurement> m = r->run(bad, quick());
  ASSERT_FALSE(m);
  EXPECT_TRUE(has(m.error().message, "JIT")) << m.error().message;
  EXPECT_TRUE(has(m.error().message, "ptxas")) << "the JIT's own log: " << m.error().message;
  EXPECT_EQ(r->recoveries(), 0);
}

TEST(Cublas, EitherAvailableOrSaysWhy) {
  Result<const cublas::Api*> a = cublas::api();
  if (!a) {
    EXPECT_EQ(a.error().message.rfind("cuBLAS not available: ", 0), 0u) << a.error().message;
    GTEST_SKIP() << a.error().message;
  }
  EXPECT_NE((*a)->GemmEx, nullptr);
  EXPECT_FALSE((*a)->library.empty());
  EXPECT_EQ((*a)->error(CUBLAS_STATUS_NOT_SUPPORTED).rfind("CUBLAS_STATUS_NOT_SUPPORTED", 0), 0u);
}

// C = A x B^T (+ bias, gelu) on the device against doubles on the host.
void check_gemm(cuda::Context& ctx, DType dt, bool epilogue) {
  const int64_t m = 96, n = 80, k = 64;
  Tensor a = random_tensor(dt, {m, k}, 1), b = random_tensor(dt, {n, k}, 2), bias = random_tensor(dt, {n}, 3);
  Result<cublas::Handle> h = cublas::Handle::create(ctx);
  if (!h) GTEST_SKIP() << h.error().message;
  Result<cuda::Stream> s = cuda::Stream::create(ctx);
  ASSERT_TRUE(s) << s.error().message;
  auto upload = [&](const Tensor& t) {
    cuda::Buffer buf = std::move(cuda::Buffer::allocate(ctx, t.nbytes())).value();
    EXPECT_EQ(ctx.drv().MemcpyHtoD(buf.ptr(), t.data(), t.nbytes()), CUDA_SUCCESS);
    return buf;
  };
  cuda::Buffer da = upload(a), db = upload(b), dbias = upload(bias);
  Tensor c(dt, {m, n});
  cuda::Buffer dc = std::move(cuda::Buffer::allocate(ctx, c.nbytes())).value();
  cuda::Buffer ws = std::move(cuda::Buffer::allocate(ctx, size_t{32} << 20)).value();
  if (epilogue) {
    Result<cublas::GemmCall> g =
        h->prepare(cublas::linear_gemm(GemmLibrary::CublasLt, dt, m, n, k, GemmEpilogue::BiasGeluTanh), ws.bytes());
    if (!g) GTEST_SKIP() << g.error().message;
    ASSERT_TRUE(succeeded(g->enqueue(*s, da.ptr(), db.ptr(), dbias.ptr(), dc.ptr(), ws.ptr())));
  } else {
    ASSERT_TRUE(succeeded(h->gemm(*s, dt, m, n, k, da.ptr(), db.ptr(), dc.ptr())));
  }
  ASSERT_TRUE(succeeded(s->synchronize()));
  ASSERT_EQ(ctx.drv().MemcpyDtoH(c.data(), dc.ptr(), c.nbytes()), CUDA_SUCCESS);
  // bf16 results are rounded to 8 bits of mantissa; cuBLASLt's GELU is the tanh
  // approximation (within 1e-3 of erf's, which the host computes here).
  const double tol = dt == DType::F32 ? 2e-3 : 3e-2;
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double acc = 0;
      for (int64_t p = 0; p < k; ++p) acc += a.get(i * k + p) * b.get(j * k + p);
      if (epilogue) {
        acc += bias.get(j);
        acc = 0.5 * acc * (1 + std::erf(acc / std::sqrt(2.0)));
      }
      ASSERT_NEAR(c.get(i * n + j), acc, tol * (1 + std::abs(acc))) << dtype_name(dt) << " at " << i << "," << j;
    }
}

TEST(Cublas, GemmInNnLinearLayoutMatchesTheHost) {
  REQUIRE_GPU(ctx);
  check_gemm(ctx, DType::F32, false);
  check_gemm(ctx, DType::BF16, false);
}

TEST(Cublas, LtBiasGeluEpilogueMatchesTheHost) {
  REQUIRE_GPU(ctx);
  check_gemm(ctx, DType::F32, true);
  check_gemm(ctx, DType::BF16, true);
}

// Library GEMMs as the tuner and a Plan's gemm steps describe them (runtime/gpu/gemm.h):
// a transposed A, a batch with B broadcast, each epilogue, against doubles on the host.
TEST(Cublas, GemmStepLayoutsMatchTheHost) {
  REQUIRE_GPU(ctx);
  Result<cublas::Handle> h = cublas::Handle::create(ctx);
  if (!h) GTEST_SKIP() << h.error().message;
  Result<cuda::Stream> s = cuda::Stream::create(ctx);
  ASSERT_TRUE(s) << s.error().message;
  cuda::Buffer ws = std::move(cuda::Buffer::allocate(ctx, kGemmWorkspaceBytes)).value();
  const int64_t batch = 3, m = 40, n = 24, k = 56;
  auto desc = [&](GemmLibrary lib, DType t, GemmEpilogue e) {
    GemmDesc d;
    d.library = lib;
    d.dtype = t;
    d.m = m, d.n = n, d.k = k, d.batch = batch;
    d.trans_a = true;  // A stored [K, M] per batch entry
    d.lda = m;
    d.stride_a = k * m;
    d.ldb = n;  // B stored [K, N], one matrix for the whole batch
    d.stride_b = 0;
    d.ldc = n;
    d.stride_c = m * n;
    d.epilogue = e;
    return d;
  };
  for (const GemmDesc& d : {desc(GemmLibrary::Cublas, DType::F32, GemmEpilogue::None),
                            desc(GemmLibrary::CublasLt, DType::BF16, GemmEpilogue::BiasRelu),
                            desc(GemmLibrary::CublasLt, DType::F16, GemmEpilogue::BiasGeluTanh)}) {
    Tensor a = random_tensor(d.dtype, {batch, k, m}, 1), b = random_tensor(d.dtype, {k, n}, 2),
           bias = random_tensor(d.dtype, {n}, 3);
    auto upload = [&](const Tensor& t) {
      cuda::Buffer buf = std::move(cuda::Buffer::allocate(ctx, t.nbytes())).value();
      EXPECT_EQ(ctx.drv().MemcpyHtoD(buf.ptr(), t.data(), t.nbytes()), CUDA_SUCCESS);
      return buf;
    };
    cuda::Buffer da = upload(a), db = upload(b), dbias = upload(bias);
    Tensor c(d.dtype, {batch, m, n});
    cuda::Buffer dc = std::move(cuda::Buffer::allocate(ctx, c.nbytes())).value();
    Result<cublas::GemmCall> call = h->prepare(d);
    if (!call) GTEST_SKIP() << gemm_str(d) << ": " << call.error().message;
    ASSERT_TRUE(succeeded(call->enqueue(*s, da.ptr(), db.ptr(), dbias.ptr(), dc.ptr(), ws.ptr())));
    ASSERT_TRUE(succeeded(s->synchronize()));
    ASSERT_EQ(ctx.drv().MemcpyDtoH(c.data(), dc.ptr(), c.nbytes()), CUDA_SUCCESS);
    const double tol = d.dtype == DType::F32 ? 2e-3 : 3e-2;
    for (int64_t z = 0; z < batch; ++z)
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {
          double acc = 0;
          for (int64_t p = 0; p < k; ++p) acc += a.get(z * k * m + p * m + i) * b.get(p * n + j);
          if (gemm_epilogue_has_bias(d.epilogue)) acc += bias.get(j);
          if (d.epilogue == GemmEpilogue::BiasRelu) acc = std::max(acc, 0.0);
          if (d.epilogue == GemmEpilogue::BiasGeluTanh)
            acc = 0.5 * acc * (1 + std::tanh(0.7978845608028654 * (acc + 0.044715 * acc * acc * acc)));
          ASSERT_NEAR(c.get((z * m + i) * n + j), acc, tol * (1 + std::abs(acc))) << gemm_str(d) << " at " << z
                                                                                   << "," << i << "," << j;
        }
  }
}

}  // namespace autotune_cuda_runner_test
}  // namespace sf
