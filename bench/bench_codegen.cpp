// How long code generation takes: PTX for one kernel of each kind, and the whole
// transformer-block example compiled for 2 ranks (propagate, lower, fuse, emit and
// compile every distinct kernel to PTX; ptxas not included). Target: the whole
// block under 0.2 s on the 2-core development machine.
#include <benchmark/benchmark.h>

#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>

#include "codegen/ir/builder.h"
#include "codegen/ir/decompose.h"
#include "codegen/ir/parser.h"
#include "codegen/kernels/compile_plan.h"

namespace sf {
namespace {

Graph must(Result<Graph> g) {
  if (!g.ok()) throw std::runtime_error(g.error().str());
  return std::move(g).value();
}

KernelSpec pointwise_spec() {
  GraphBuilder b("pw");
  Value x = b.param("x", DType::F32, {4096, 1024});
  Value bias = b.param("b", DType::F32, {1024});
  b.ret(sigmoid(relu(x * 2.0 + bias) - 0.5));
  return {"sf_pw", KernelKind::Pointwise, must(b.finish())};
}

KernelSpec reduction_spec() {
  GraphBuilder b("softmax");
  Value x = b.param("x", DType::F32, {4096, 1024});
  b.ret(softmax(x, -1));
  return {"sf_softmax", KernelKind::Reduction, decompose(must(b.finish()))};
}

KernelSpec matmul_spec() {
  GraphBuilder b("mm");
  Value x = b.param("x", DType::F32, {2048, 4096});
  Value w = b.param("w", DType::F32, {4096, 4096});
  Value bias = b.param("b", DType::F32, {4096});
  b.ret(relu(matmul(x, transpose(w, 0, 1)) + bias));
  return {"sf_mm", KernelKind::Matmul, must(b.finish())};
}

void emit_to_ptx(benchmark::State& state, const KernelSpec& spec) {
  for (auto _ : state) {
    Result<EmittedKernel> e = emitter_for(spec.kind).emit(spec, {}, llvmb::Target::nvptx("sm_90a"));
    if (!e.ok()) {
      state.SkipWithError(e.error().message.c_str());
      return;
    }
    Result<std::string> ptx = llvmb::compile_to_ptx(*e->module, "sm_90a");
    if (!ptx.ok()) {
      state.SkipWithError(ptx.error().message.c_str());
      return;
    }
    benchmark::DoNotOptimize(ptx->size());
  }
}

void BM_PtxPointwise(benchmark::State& s) { emit_to_ptx(s, pointwise_spec()); }
void BM_PtxReductionSoftmax(benchmark::State& s) { emit_to_ptx(s, reduction_spec()); }
void BM_PtxMatmulBiasRelu(benchmark::State& s) { emit_to_ptx(s, matmul_spec()); }

void BM_CompileTransformerBlock(benchmark::State& state) {
  Graph g = must(parse_file(std::string(SF_SOURCE_DIR) + "/examples/transformer_block.sf"));
  Mesh m = g.mesh();
  m.dims[0].size = 2;
  Graph g2 = must(remesh(g, m));
  CompileOptions o;
  o.run_ptxas = false;
  size_t kernels = 0;
  for (auto _ : state) {
    Result<CompiledPlan> p = compile_plan(g2, o);
    if (!p.ok()) {
      state.SkipWithError(p.error().message.c_str());
      return;
    }
    kernels = p->ptx.size();
  }
  state.counters["kernels"] = static_cast<double>(kernels);
}

BENCHMARK(BM_PtxPointwise)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_PtxReductionSoftmax)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_PtxMatmulBiasRelu)->Unit(benchmark::kMillisecond);
// Wall time: distinct kernels compile in parallel, one per core.
BENCHMARK(BM_CompileTransformerBlock)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace sf

BENCHMARK_MAIN();
