// Generated host kernels against a memory-copy baseline measured in the same run:
// a fused pointwise chain (5 cheap ops, so memory bound) reads one f32 tensor and
// writes one, the same bytes as a memcpy of it, so their bytes/s ratio says how
// close the kernel is to the machine's copy bandwidth (target >= 0.6). The same
// chain run as one kernel per op (unfused) shows what fusion saves. BM_Bf16BiasGelu
// times a bf16 GELU computed whole against its erfc form (below).
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>

#include "codegen/ir/builder.h"
#include "codegen/kernels/emitter.h"

namespace sf {
namespace {

constexpr int64_t kN = int64_t{1} << 23;  // 8M floats: 32 MiB in, 32 MiB out (beyond the LLC)

using Entry = void (*)(void**);

struct Jit {
  std::unique_ptr<llvmb::HostJit> jit;
  Jit() {
    auto j = llvmb::HostJit::create();
    if (!j.ok()) throw std::runtime_error(j.error().message);
    jit = std::move(j).value();
  }
  Entry add(const Graph& g, const std::string& name) {
    KernelSpec spec{name, KernelKind::Pointwise, g};
    auto e = emitter_for(KernelKind::Pointwise).emit(spec, {}, llvmb::Target::host());
    if (!e.ok()) throw std::runtime_error(e.error().message);
    auto fn = jit->add(std::move(e->module), std::move(e->context), e->entry);
    if (!fn.ok()) throw std::runtime_error(fn.error().message);
    return reinterpret_cast<Entry>(*fn);
  }
};

Jit& jit() {
  static Jit j;
  return j;
}

Graph must(Result<Graph> g) {
  if (!g.ok()) throw std::runtime_error(g.error().str());
  return std::move(g).value();
}

// y = maximum((x * 2 + 1) - x * 0.5, 0): five ops.
Graph chain() {
  GraphBuilder b("chain");
  Value x = b.param("x", DType::F32, {kN});
  Value y = binary(OpKind::Maximum, (x * 2.0 + 1.0) - x * 0.5, 0.0);
  b.ret(y);
  return must(b.finish());
}

Graph one_op(OpKind k, double c) {
  GraphBuilder b("op");
  Value x = b.param("x", DType::F32, {kN});
  b.ret(binary(k, x, c));
  return must(b.finish());
}

Graph two_op(OpKind k) {
  GraphBuilder b("op2");
  Value x = b.param("x", DType::F32, {kN});
  Value z = b.param("z", DType::F32, {kN});
  b.ret(binary(k, x, z));
  return must(b.finish());
}

void BM_Memcpy(benchmark::State& state) {
  std::vector<float> in(kN, 1.0f), out(kN);
  for (auto _ : state) {
    std::memcpy(out.data(), in.data(), kN * sizeof(float));
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * 2 * kN * static_cast<int64_t>(sizeof(float)));
}

void BM_FusedChain(benchmark::State& state) {
  Entry fn = jit().add(chain(), "sf_fused_chain");
  std::vector<float> in(kN, 1.0f), out(kN);
  void* args[] = {in.data(), out.data()};
  for (auto _ : state) {
    fn(args);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * 2 * kN * static_cast<int64_t>(sizeof(float)));
}

// The same five ops as five kernels, each writing its intermediate to memory.
void BM_UnfusedChain(benchmark::State& state) {
  Entry mul2 = jit().add(one_op(OpKind::Mul, 2.0), "sf_u_mul2");
  Entry add1 = jit().add(one_op(OpKind::Add, 1.0), "sf_u_add1");
  Entry mulh = jit().add(one_op(OpKind::Mul, 0.5), "sf_u_mulh");
  Entry sub = jit().add(two_op(OpKind::Sub), "sf_u_sub");
  Entry relu = jit().add(one_op(OpKind::Maximum, 0.0), "sf_u_max");
  std::vector<float> x(kN, 1.0f), t1(kN), t2(kN), t3(kN), t4(kN), y(kN);
  for (auto _ : state) {
    void* a1[] = {x.data(), t1.data()};
    mul2(a1);
    void* a2[] = {t1.data(), t2.data()};
    add1(a2);
    void* a3[] = {x.data(), t3.data()};
    mulh(a3);
    void* a4[] = {t2.data(), t3.data(), t4.data()};
    sub(a4);
    void* a5[] = {t4.data(), y.data()};
    relu(a5);
    benchmark::ClobberMemory();
  }
  // Useful bytes, as for the fused chain: one tensor in, one out.
  state.SetBytesProcessed(state.iterations() * 2 * kN * static_cast<int64_t>(sizeof(float)));
}

// GELU of a bf16 bias add, rounded to bf16 under Fused precision: the product
// x/2 (1 + erf(x / sqrt 2)) as written by the gelu op's decomposition, which the
// emitter computes whole (gelu_for_16bit: max(x, 0) - |x| erfc / 2), against the same
// GELU written (1 + erf) * x * 0.5, which only the 1 + erf rewrite matches (erfc, a
// select and the multiplies). Arg 0: whole, 1: erfc form. Both read a bf16 tensor and
// a bias row and write a bf16 tensor; on the host both call libm's exp2f, so the
// ratio measures the arithmetic the whole form saves, not the GPU kernel.
Graph bf16_gelu(bool whole) {
  GraphBuilder b("bf16_gelu");
  Value h = b.param("h", DType::BF16, {kN / 4096, 4096});
  Value x = cast(h + b.param("bias", DType::BF16, {4096}), DType::F32);
  Value e = 1.0 + unary(OpKind::Erf, x * 0.7071067811865476);
  b.ret(cast(whole ? x * 0.5 * e : e * x * 0.5, DType::BF16));
  return must(b.finish());
}

void BM_Bf16BiasGelu(benchmark::State& state) {
  const bool whole = state.range(0) == 0;
  Entry fn = jit().add(bf16_gelu(whole), whole ? "sf_gelu_whole" : "sf_gelu_erfc");
  std::vector<uint16_t> h(kN, 0x3F80), bias(4096, 0xBF00), out(kN);  // 1.0 and -0.5
  for (int64_t i = 0; i < kN; ++i) h[static_cast<size_t>(i)] = static_cast<uint16_t>(0x3F80 + (i % 512) - 256);
  void* args[] = {h.data(), bias.data(), out.data()};
  for (auto _ : state) {
    fn(args);
    benchmark::ClobberMemory();
  }
  state.SetLabel(whole ? "whole" : "erfc");
  state.SetBytesProcessed(state.iterations() * 2 * kN * static_cast<int64_t>(sizeof(uint16_t)));
}

BENCHMARK(BM_Memcpy)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_Bf16BiasGelu)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_FusedChain)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_UnfusedChain)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace sf

BENCHMARK_MAIN();
