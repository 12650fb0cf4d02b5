// The host knobs of KernelConfig (host_vector, host_interleave, host_tile_n): every
// host emitter honours them, every value in range gives a correct kernel (JIT-run
// against the reference evaluator, ragged sizes included), they reach the IR as
// `!llvm.loop` metadata that the host JIT's O3 pipeline acts on, and values out of
// range are Diags that name the field. No GPU is needed.
#include <gtest/gtest.h>

#include "tests/kernels/kernel_test_util.h"
#include "tests/sanitized.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <regex>
#include <string>
#include <vector>

#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>

#include "codegen/ir/builder.h"
#include "codegen/ir/decompose.h"
#include "codegen/kernels/element.h"
#include "codegen/kernels/emitter.h"
#include "codegen/reference/compare.h"
#include "codegen/reference/evaluate.h"

namespace sf {
namespace kernels_host_config_test {

using kernel_test::finish;
using kernel_test::reduce;
using kernel_test::jit;
using kernel_test::module_text;
using kernel_test::output_tensors;

// ---- groups ---------------------------------------------------------------------------------



// A pointwise chain over [rows, n] with a broadcast bias row, a literal, a libm call
// and two outputs of different dtypes (f32 and a bf16 cast).
Graph pointwise_chain(int64_t rows, int64_t n) {
  GraphBuilder b("chain");
  Value x = b.param("x", DType::F32, {rows, n});
  Value y = b.param("y", DType::F32, {rows, n});
  Value bias = b.param("bias", DType::F32, {n});
  Value h = relu(x * y + bias) * 0.5 - y;
  b.ret(h);
  b.ret(cast(tanh(h) + x, DType::BF16));
  return finish(b);
}

// One pass: sum, max, min and mean over `dims` of x (f32 or an integer dtype).
Graph reductions(DType dt, const Shape& x_shape, std::vector<int64_t> dims) {
  GraphBuilder b("red");
  Value x = b.param("x", dt, x_shape);
  b.ret(reduce(OpKind::Sum, x, dims, false));
  b.ret(reduce(OpKind::Max, x, dims, false));
  b.ret(reduce(OpKind::Min, x, dims, false));
  if (is_float(dt)) b.ret(reduce(OpKind::Mean, x, dims, false));
  return finish(b);
}

// softmax over the last dim as decompose() gives it: two passes and an X-space epilogue.
Graph softmax_group(DType dt, const Shape& x_shape) {
  GraphBuilder b("softmax");
  Value x = b.param("x", dt, x_shape);
  b.ret(softmax(x, -1));
  return decompose(finish(b));
}

// (x @ w + bias) -> relu, w read in place either [K, N] or transposed from [N, K].
Graph matmul_bias_relu(int64_t m, int64_t n, int64_t k, DType dt, bool transpose_w) {
  GraphBuilder b("mm");
  Value x = b.param("in0", dt, {m, k});
  Value w = transpose_w ? transpose(b.param("in1", dt, {n, k}), 0, 1) : b.param("in1", dt, {k, n});
  Value bias = b.param("in2", dt, {n});
  b.ret(relu(matmul(x, w) + bias));
  return decompose(finish(b));
}

Graph embedding_group(DType w, const Shape& ishape, int64_t rows, int64_t cols) {
  GraphBuilder b("emb");
  Value i = b.param("in0", DType::I64, ishape);
  Value wt = b.param("in1", w, {rows, cols});
  b.ret(embedding(i, wt));
  return finish(b);
}

// ---- configs --------------------------------------------------------------------------------

KernelConfig host_config(int vector, int interleave, int tile_n = 0) {
  KernelConfig c;
  c.host_vector = vector;
  c.host_interleave = interleave;
  c.host_tile_n = tile_n;
  return c;
}

std::string str(const KernelConfig& c) {
  return "host_vector=" + std::to_string(c.host_vector) + " host_interleave=" + std::to_string(c.host_interleave) +
         " host_tile_n=" + std::to_string(c.host_tile_n);
}

// host_vector in {0, 1, 4, 8} x host_interleave in {0, 1, 4}, tile_n fixed.
std::vector<KernelConfig> vector_grid(int tile_n = 0) {
  std::vector<KernelConfig> r;
  for (int v : {0, 1, 4, 8})
    for (int il : {0, 1, 4}) r.push_back(host_config(v, il, tile_n));
  return r;
}

// ---- running ----------------------------------------------------------------------------------

Result<EmittedKernel> emit_host(KernelKind kind, const Graph& g, const KernelConfig& cfg, const std::string& entry = "k") {
  return emitter_for(kind).emit(KernelSpec{entry, kind, g}, cfg, llvmb::Target::host());
}

Result<std::vector<Tensor>> run_host(KernelKind kind, const Graph& g, const std::vector<Tensor>& inputs,
                                     const KernelConfig& cfg) {
  return kernel_test::run_emitted(emit_host(kind, g, cfg), g, inputs);
}

// The host kernel under every config in `configs` matches the reference within
// default_tolerance (exactly for integers; NaN only matches NaN).
void expect_matches_reference(KernelKind kind, const Graph& g, const std::vector<KernelConfig>& configs,
                              uint64_t seed = 1) {
  std::vector<Tensor> in = random_inputs(g, seed);
  Result<std::vector<Tensor>> want = evaluate(g, in);
  ASSERT_TRUE(want.ok()) << want.error().str();
  // Under the sanitizer every other config, starting one later on each call, so a
  // test that checks several graphs still runs every config (tests/sanitized.h).
  static size_t calls = 0;
  const size_t first = calls++;
  for (size_t i = 0; i < configs.size(); ++i) {
    if (!test::in_sample(first + i)) continue;
    const KernelConfig& cfg = configs[i];
    SCOPED_TRACE(str(cfg));
    Result<std::vector<Tensor>> got = run_host(kind, g, in, cfg);
    ASSERT_TRUE(got.ok()) << got.error().str();
    ASSERT_EQ(got->size(), want->size());
    for (size_t o = 0; o < want->size(); ++o) {
      const Tensor& w = (*want)[o];
      const Tensor& r = (*got)[o];
      Comparison c = compare(r, w, default_tolerance(w.dtype()));
      EXPECT_TRUE(c.ok()) << "output " << o << " (" << w.type().str() << "): " << c.mismatches
                          << " mismatch(es); first at " << c.first_mismatch << ": got "
                          << (c.first_mismatch >= 0 ? r.get(c.first_mismatch) : 0.0) << ", want "
                          << (c.first_mismatch >= 0 ? w.get(c.first_mismatch) : 0.0) << "; max abs err "
                          << c.max_abs_err;
    }
  }
}

// The emitted (unoptimised) module's text, or "" with a failure.
std::string emitted_ir(KernelKind kind, const Graph& g, const KernelConfig& cfg) {
  Result<EmittedKernel> k = emit_host(kind, g, cfg);
  if (!k) {
    ADD_FAILURE() << k.error().str();
    return "";
  }
  return module_text(*k->module);
}

// The module after the host JIT's O3 pipeline (what HostJit::add compiles).
std::string optimized_ir(KernelKind kind, const Graph& g, const KernelConfig& cfg) {
  Result<EmittedKernel> k = emit_host(kind, g, cfg);
  if (!k) {
    ADD_FAILURE() << k.error().str();
    return "";
  }
  Result<std::string> ir = llvmb::optimized_ir(*k->module, llvmb::Target::host());
  if (!ir) {
    ADD_FAILURE() << ir.error().str();
    return "";
  }
  return *ir;
}

bool has(const std::string& text, const std::string& what) { return text.find(what) != std::string::npos; }

// ---- every config gives a correct kernel ------------------------------------------------------

TEST(HostConfig, PointwiseChainIsCorrectForEveryVectorAndInterleave) {
  // 1, 7 and 1003 elements per row: below, between and past whole vectors (1003 is
  // not a multiple of any width x interleave), so the remainder loop runs too.
  for (int64_t n : {1, 7, 1003}) {
    SCOPED_TRACE("n " + std::to_string(n));
    expect_matches_reference(KernelKind::Pointwise, pointwise_chain(3, n), vector_grid());
  }
  // Vectors of 16..64 lanes and the largest interleave (legal, if wide).
  expect_matches_reference(KernelKind::Pointwise, pointwise_chain(2, 333),
                           {host_config(16, 2), host_config(32, 16), host_config(64, 1), host_config(2, 16)});
}

TEST(HostConfig, ReductionsAreCorrectForEveryVectorAndInterleave) {
  // Rows of 4099 elements (chunks of 128, the last one ragged), of 7 and of 1.
  for (const Shape& s : {Shape{5, 4099}, Shape{9, 7}, Shape{4, 1}}) {
    SCOPED_TRACE("f32 " + shape_str(s));
    expect_matches_reference(KernelKind::Reduction, reductions(DType::F32, s, {-1}), vector_grid());
  }
  // A column reduction: the fold loop reads with a stride (gathers when vectorised).
  expect_matches_reference(KernelKind::Reduction, reductions(DType::F32, {1000, 5}, {0}), vector_grid());
  // Integers are exact whatever the order.
  expect_matches_reference(KernelKind::Reduction, reductions(DType::I32, {3, 1001}, {-1}), vector_grid());
  // Half storage.
  expect_matches_reference(KernelKind::Reduction, reductions(DType::BF16, {3, 1001}, {-1}),
                           {host_config(8, 4), host_config(4, 0)});
}

TEST(HostConfig, VectorisedMaxAndMinPropagateNaNAndSeeInfinities) {
  Graph g = reductions(DType::F32, {4, 1001}, {-1});
  std::vector<Tensor> in = random_inputs(g, 7);
  in[0].set(1001 + 500, std::nan(""));                                // row 1: NaN mid-row
  in[0].set(2 * 1001 + 1000, std::numeric_limits<double>::infinity());  // row 2: +inf in the tail
  in[0].set(3 * 1001 + 3, -std::numeric_limits<double>::infinity());  // row 3: -inf
  Result<std::vector<Tensor>> want = evaluate(g, in);
  ASSERT_TRUE(want.ok()) << want.error().str();
  for (const KernelConfig& cfg : vector_grid()) {
    SCOPED_TRACE(str(cfg));
    Result<std::vector<Tensor>> got = run_host(KernelKind::Reduction, g, in, cfg);
    ASSERT_TRUE(got.ok()) << got.error().str();
    for (size_t o = 0; o < want->size(); ++o) {
      Comparison c = compare((*got)[o], (*want)[o], default_tolerance(DType::F32));
      EXPECT_TRUE(c.ok()) << "output " << o << ": first mismatch at row " << c.first_mismatch;
    }
    EXPECT_TRUE(std::isnan((*got)[1].get(1)));   // max of row 1
    EXPECT_TRUE(std::isnan((*got)[2].get(1)));   // min of row 1
    EXPECT_EQ((*got)[1].get(2), std::numeric_limits<double>::infinity());
    EXPECT_EQ((*got)[2].get(3), -std::numeric_limits<double>::infinity());
  }
}

TEST(HostConfig, SoftmaxIsCorrectForEveryVectorAndInterleave) {
  for (const Shape& s : {Shape{4, 1003}, Shape{6, 17}}) {
    SCOPED_TRACE(shape_str(s));
    expect_matches_reference(KernelKind::Reduction, softmax_group(DType::F32, s), vector_grid());
  }
  expect_matches_reference(KernelKind::Reduction, softmax_group(DType::F16, {3, 1001}),
                           {host_config(8, 4), host_config(16, 1)});
}

TEST(HostConfig, LongRowSumStaysWithinTolerance) {
  // 2^20 + 3 elements in one row: the per-lane partial sums that host_vector allows
  // keep the error of the chunked sum (see reduction_host.cpp HostBuilder).
  GraphBuilder b("long");
  Value x = b.param("x", DType::F32, {1, (int64_t{1} << 20) + 3});
  b.ret(reduce(OpKind::Sum, x, {-1}, false));
  b.ret(reduce(OpKind::Mean, x, {-1}, false));
  expect_matches_reference(KernelKind::Reduction, finish(b),
                           {host_config(0, 0), host_config(8, 4), host_config(64, 16), host_config(1, 8)});
}

TEST(HostConfig, MatmulIsCorrectForEveryTileVectorAndInterleave) {
  // N = 100: tiles of 16 and 48 leave a ragged last tile (100 = 6 * 16 + 4 =
  // 2 * 48 + 4), 128 is wider than N, 64 (the default) leaves 36.
  std::vector<KernelConfig> configs;
  for (int tn : {0, 16, 48, 128})
    for (const KernelConfig& c : vector_grid(tn)) configs.push_back(c);
  configs.push_back(host_config(4, 1, 1));     // one column per pass over K
  configs.push_back(host_config(64, 16, 1024));  // the widest of everything
  expect_matches_reference(KernelKind::Matmul, matmul_bias_relu(7, 100, 33, DType::F32, false), configs);
  expect_matches_reference(KernelKind::Matmul, matmul_bias_relu(5, 100, 17, DType::F32, true), configs);
  // Half storage and integers (i64 accumulators, exact).
  const std::vector<KernelConfig> few = {host_config(8, 4, 16), host_config(0, 0, 48), host_config(4, 1, 128)};
  expect_matches_reference(KernelKind::Matmul, matmul_bias_relu(9, 37, 65, DType::BF16, true), few);
  expect_matches_reference(KernelKind::Matmul, matmul_bias_relu(9, 37, 65, DType::I32, false), few);
}

TEST(HostConfig, GatherIsCorrectForEveryVectorAndInterleave) {
  for (DType w : {DType::F32, DType::BF16, DType::I64}) {
    SCOPED_TRACE(std::string(dtype_name(w)));
    Graph g = embedding_group(w, {5, 3}, 11, 37);  // 555 output elements
    std::vector<Tensor> in = random_inputs(g, 3);  // indices in [0, 11)
    Result<std::vector<Tensor>> want = evaluate(g, in);
    ASSERT_TRUE(want.ok()) << want.error().str();
    for (const KernelConfig& cfg : vector_grid()) {
      SCOPED_TRACE(str(cfg));
      Result<std::vector<Tensor>> got = run_host(KernelKind::Gather, g, in, cfg);
      ASSERT_TRUE(got.ok()) << got.error().str();
      EXPECT_EQ(std::memcmp((*got)[0].data(), (*want)[0].data(), (*want)[0].nbytes()), 0);
    }
  }
}

// ---- the knobs reach the IR ---------------------------------------------------------------------

TEST(HostConfigIr, LoopMetadataSaysWhatTheHintsSay) {
  llvm::LLVMContext c;
  EXPECT_EQ(kernels::loop_metadata(c, {}), nullptr);
  auto text = [&](kernels::LoopHints h) {
    llvm::MDNode* md = kernels::loop_metadata(c, h);
    if (!md) return std::string("null");
    EXPECT_EQ(md->getOperand(0).get(), md) << "a loop ID refers to itself first";
    EXPECT_TRUE(md->isDistinct());
    std::string s;
    for (unsigned i = 1; i < md->getNumOperands(); ++i) {
      auto* op = llvm::cast<llvm::MDNode>(md->getOperand(i).get());
      s += llvm::cast<llvm::MDString>(op->getOperand(0).get())->getString().str();
      if (op->getNumOperands() > 1) {
        auto* v = llvm::cast<llvm::ConstantAsMetadata>(op->getOperand(1).get());
        s += "=" + std::to_string(llvm::cast<llvm::ConstantInt>(v->getValue())->getZExtValue());
      }
      s += " ";
    }
    return s;
  };
  const std::string nounroll = "llvm.loop.unroll.disable ";
  EXPECT_EQ(text({8, 0}), "llvm.loop.vectorize.enable=1 llvm.loop.vectorize.width=8 " + nounroll);
  EXPECT_EQ(text({4, 2}),
            "llvm.loop.vectorize.enable=1 llvm.loop.vectorize.width=4 llvm.loop.interleave.count=2 " + nounroll);
  EXPECT_EQ(text({1, 0}), "llvm.loop.vectorize.width=1 " + nounroll);
  EXPECT_EQ(text({1, 1}), "llvm.loop.vectorize.width=1 llvm.loop.interleave.count=1 " + nounroll);
  EXPECT_EQ(text({1, 4}),
            "llvm.loop.vectorize.enable=1 llvm.loop.vectorize.width=1 llvm.loop.interleave.count=4 " + nounroll);
  EXPECT_EQ(text({0, 4}), "llvm.loop.interleave.count=4 " + nounroll);
}

TEST(HostConfigIr, EveryKindCarriesTheHintsOnlyWhenAsked) {
  struct Case {
    KernelKind kind;
    Graph g;
  };
  const Case cases[] = {{KernelKind::Pointwise, pointwise_chain(4, 100)},
                        {KernelKind::Reduction, softmax_group(DType::F32, {4, 100})},
                        {KernelKind::Matmul, matmul_bias_relu(8, 100, 16, DType::F32, false)},
                        {KernelKind::Gather, embedding_group(DType::F32, {4}, 9, 100)}};
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(kernel_kind_name(c.kind)));
    // The default config: no loop metadata at all (the code is what it was).
    EXPECT_FALSE(has(emitted_ir(c.kind, c.g, {}), "llvm.loop")) << emitted_ir(c.kind, c.g, {});
    std::string ir = emitted_ir(c.kind, c.g, host_config(8, 2));
    EXPECT_TRUE(has(ir, "!{!\"llvm.loop.vectorize.width\", i32 8}")) << ir;
    EXPECT_TRUE(has(ir, "!{!\"llvm.loop.interleave.count\", i32 2}")) << ir;
    EXPECT_TRUE(has(ir, "!{!\"llvm.loop.vectorize.enable\", i1 true}")) << ir;
    EXPECT_TRUE(std::regex_search(ir, std::regex("br label %[a-z0-9.]+, !llvm.loop !"))) << ir;
    ir = emitted_ir(c.kind, c.g, host_config(16, 0));
    EXPECT_TRUE(has(ir, "!{!\"llvm.loop.vectorize.width\", i32 16}")) << ir;
    EXPECT_FALSE(has(ir, "llvm.loop.interleave.count")) << ir;
  }
  // softmax: both folds (max, then sum of exp) and the X-space loop carry the hints.
  std::string ir = emitted_ir(KernelKind::Reduction, softmax_group(DType::F32, {4, 100}), host_config(4, 0));
  size_t latches = 0;
  for (size_t at = 0; (at = ir.find(", !llvm.loop !", at)) != std::string::npos; ++at) ++latches;
  EXPECT_EQ(latches, 3u) << ir;
}

// The widest vector type of `elem` ("float", "i64") in the text: 0 when none.
int widest_vector(const std::string& ir, const std::string& elem) {
  int best = 0;
  std::regex re("<([0-9]+) x " + elem + ">");
  for (auto it = std::sregex_iterator(ir.begin(), ir.end(), re); it != std::sregex_iterator(); ++it)
    best = std::max(best, std::stoi((*it)[1].str()));
  return best;
}

// How many elements one iteration of the vectorised loop covers: the step of its
// induction variable (`%index.next = add ... %index, 16`); 0 when there is none.
int vector_step(const std::string& ir) {
  std::smatch m;
  if (!std::regex_search(ir, m, std::regex("%index\\.next = add nuw (nsw )?i64 %index, ([0-9]+)"))) return 0;
  return std::stoi(m[2].str());
}

TEST(HostConfigIr, TheJitPipelineVectorisesAtTheRequestedWidth) {
  // A dense f32 chain without libm calls, so every op has a vector form.
  GraphBuilder b("axpy");
  Value x = b.param("x", DType::F32, {1000});
  Value y = b.param("y", DType::F32, {1000});
  b.ret(relu(x * 2.0 + y));
  Graph g = finish(b);
  for (int v : {2, 4, 8, 16}) {
    SCOPED_TRACE("host_vector " + std::to_string(v));
    std::string ir = optimized_ir(KernelKind::Pointwise, g, host_config(v, 1));
    EXPECT_EQ(widest_vector(ir, "float"), v) << ir;
    EXPECT_TRUE(has(ir, "llvm.loop.isvectorized")) << ir;
  }
  // Width 1: scalar code, no vector of floats anywhere.
  std::string scalar = optimized_ir(KernelKind::Pointwise, g, host_config(1, 1));
  EXPECT_EQ(widest_vector(scalar, "float"), 0) << scalar;
  // The vector loop steps by width x interleave elements (and is not unrolled further).
  for (auto [v, il] : {std::pair{4, 1}, std::pair{4, 2}, std::pair{4, 4}, std::pair{8, 4}, std::pair{2, 8}}) {
    SCOPED_TRACE("host_vector " + std::to_string(v) + " host_interleave " + std::to_string(il));
    std::string ir = optimized_ir(KernelKind::Pointwise, g, host_config(v, il));
    EXPECT_EQ(vector_step(ir), v * il) << ir;
    EXPECT_EQ(widest_vector(ir, "float"), v) << ir;
  }
}

TEST(HostConfigIr, MatmulTileWidthSizesTheAccumulatorRow) {
  Graph g = matmul_bias_relu(8, 100, 16, DType::F32, false);
  std::string def = emitted_ir(KernelKind::Matmul, g, {});
  EXPECT_TRUE(has(def, "alloca [64 x float]")) << def;
  // 0 means the emitter's default, 64: the same module text.
  EXPECT_EQ(emitted_ir(KernelKind::Matmul, g, host_config(0, 0, 64)), def);
  for (int tn : {16, 48, 128}) {
    std::string ir = emitted_ir(KernelKind::Matmul, g, host_config(0, 0, tn));
    EXPECT_NE(ir, def);
    EXPECT_TRUE(has(ir, "alloca [" + std::to_string(tn) + " x float]")) << ir;
    EXPECT_TRUE(has(ir, "i64 " + std::to_string(tn))) << "the j0 step and the tile's clamp";
  }
  // Integer matmuls accumulate in i64.
  std::string ir = emitted_ir(KernelKind::Matmul, matmul_bias_relu(8, 100, 16, DType::I32, false), host_config(0, 0, 48));
  EXPECT_TRUE(has(ir, "alloca [48 x i64]")) << ir;
  // The j loop's FMAs vectorise at the requested width (the epilogue loop is left
  // to LLVM, so only the fmuladd width is checked).
  for (int v : {4, 8, 16}) {
    std::string opt = optimized_ir(KernelKind::Matmul, g, host_config(v, 1, 48));
    EXPECT_TRUE(has(opt, "llvm.fmuladd.v" + std::to_string(v) + "f32")) << opt;
    for (int other : {2, 4, 8, 16, 32})
      if (other != v) {
        EXPECT_FALSE(has(opt, "llvm.fmuladd.v" + std::to_string(other) + "f32")) << v << " " << other;
      }
  }
}

TEST(HostConfigIr, FloatReductionVectorisesOnlyWithAWidth) {
  GraphBuilder b("sum");
  Value x = b.param("x", DType::F32, {16, 4096});
  b.ret(reduce(OpKind::Sum, x, {-1}, false));
  Graph g = finish(b);
  // Without hints LLVM keeps the f32 sum in order (reordering needs permission): the
  // chunk loop of 64 is unrolled into a chain of scalar fadds.
  std::string def = optimized_ir(KernelKind::Reduction, g, {});
  EXPECT_EQ(widest_vector(def, "float"), 0) << def;
  // host_vector 8 (x interleave 2): per-lane partial sums in <8 x float>, reduced
  // at the end of each chunk.
  std::string v8 = optimized_ir(KernelKind::Reduction, g, host_config(8, 2));
  EXPECT_TRUE(has(v8, "fadd <8 x float>")) << v8;
  EXPECT_TRUE(has(v8, "llvm.vector.reduce.fadd.v8f32")) << v8;
  EXPECT_EQ(vector_step(v8), 16) << v8;
  // Width 1 with interleave 4: four scalar partial sums per iteration (which the SLP
  // vectoriser may then pack into one <4 x float>).
  std::string il4 = optimized_ir(KernelKind::Reduction, g, host_config(1, 4));
  EXPECT_EQ(vector_step(il4), 4) << il4;
  // Interleave alone (width left to LLVM) does not give permission to reorder: the
  // f32 sum stays one scalar chain, now a loop.
  std::string il_only = optimized_ir(KernelKind::Reduction, g, host_config(0, 4));
  EXPECT_EQ(widest_vector(il_only, "float"), 0) << il_only;
  EXPECT_EQ(vector_step(il_only), 0) << il_only;
}

TEST(HostConfigIr, MaxAndIntegerSumVectoriseAtTheRequestedWidth) {
  for (DType dt : {DType::F32, DType::I32}) {
    SCOPED_TRACE(std::string(dtype_name(dt)));
    GraphBuilder b("red");
    Value x = b.param("x", dt, {16, 4096});
    b.ret(reduce(is_float(dt) ? OpKind::Max : OpKind::Sum, x, {-1}, false));
    Graph g = finish(b);
    std::string ir = optimized_ir(KernelKind::Reduction, g, host_config(4, 2));
    EXPECT_EQ(vector_step(ir), 8) << ir;
    EXPECT_EQ(widest_vector(ir, is_float(dt) ? "float" : "i64"), 4) << ir;
  }
}

// ---- bad values are Diags, on the host only ---------------------------------------------------

TEST(HostConfigErrors, OutOfRangeKnobsAreDiagsNamingFieldAndValue) {
  struct Bad {
    KernelConfig cfg;
    std::string text;
  };
  std::vector<Bad> bad = {
      {host_config(3, 0), "host_vector = 3"},        {host_config(128, 0), "host_vector = 128"},
      {host_config(-1, 0), "host_vector = -1"},      {host_config(0, 17), "host_interleave = 17"},
      {host_config(0, -2), "host_interleave = -2"},  {host_config(0, 3), "host_interleave = 3"},
      {host_config(0, 32), "host_interleave = 32"},  {host_config(0, 0, 1025), "host_tile_n = 1025"},
      {host_config(0, 0, -64), "host_tile_n = -64"},
  };
  struct Case {
    KernelKind kind;
    Graph g;
  };
  const Case cases[] = {{KernelKind::Pointwise, pointwise_chain(2, 8)},
                        {KernelKind::Reduction, softmax_group(DType::F32, {2, 8})},
                        {KernelKind::Matmul, matmul_bias_relu(4, 8, 4, DType::F32, false)},
                        {KernelKind::Gather, embedding_group(DType::F32, {4}, 9, 8)}};
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(kernel_kind_name(c.kind)));
    for (const Bad& b : bad) {
      Result<EmittedKernel> k = emit_host(c.kind, c.g, b.cfg);
      ASSERT_FALSE(k.ok()) << b.text;
      EXPECT_TRUE(has(k.error().message, b.text)) << k.error().message;
      // The GPU kernel reads no host knob.
      Result<EmittedKernel> gpu = emitter_for(c.kind).emit(KernelSpec{"k", c.kind, c.g}, b.cfg, llvmb::Target::nvptx("sm_90a"));
      EXPECT_TRUE(gpu.ok()) << b.text << ": " << gpu.error().message;
    }
    // The edges of the ranges are fine.
    for (const KernelConfig& ok : {host_config(64, 16, 1024), host_config(1, 0, 1), host_config(2, 1, 0)}) {
      Result<EmittedKernel> k = emit_host(c.kind, c.g, ok);
      EXPECT_TRUE(k.ok()) << str(ok) << ": " << k.error().message;
    }
  }
}

}  // namespace kernels_host_config_test
}  // namespace sf
