// The reduction emitter: host kernels (ORC JIT) against the reference evaluator on the
// same group graph; the NVPTX kernel's block algorithm run on the host, one OS thread
// per GPU thread (shuffles and barriers through hooks); NVPTX kernels through the
// verifier, compile_to_ptx, PTX text checks and ptxas. No GPU is needed.
//
// Groups are built as the fusion pass builds them: params, then primitive ops, then
// outputs; composites come from decompose() on a one-op graph, so the kernel sees
// exactly what fusion hands it.
#include <gtest/gtest.h>

#include "tests/kernels/kernel_test_util.h"
#include "tests/sanitized.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>

#include "codegen/ir/builder.h"
#include "codegen/ir/decompose.h"
#include "codegen/kernels/pointwise.h"  // emitter_for
#include "codegen/kernels/reduction.h"
#include "codegen/reference/compare.h"
#include "codegen/reference/evaluate.h"

namespace sf {
namespace kernels_reduction_test {

using kernel_test::finish;
using kernel_test::reduce;
using kernel_test::jit;
using kernel_test::output_tensors;
using kernel_test::arg_array;
using kernel_test::have_ptxas;
using kernel_test::ptxas_failure;

// ---- graphs ------------------------------------------------------------------------------



KernelSpec spec_of(const Graph& g, std::string entry = "red") {
  return KernelSpec{std::move(entry), KernelKind::Reduction, g};
}

// A one-op graph through decompose(): what fusion sees of softmax, layer_norm, rms_norm.
enum class Composite { Softmax, LayerNorm, RmsNorm };
Graph composite_group(Composite c, DType dt, const Shape& x_shape, int64_t dim_or_norm_rank = -1) {
  GraphBuilder b("composite");
  Value x = b.param("x", dt, x_shape);
  Shape w_shape(x_shape.end() - (c == Composite::Softmax ? 0 : dim_or_norm_rank), x_shape.end());
  switch (c) {
    case Composite::Softmax: b.ret(softmax(x, dim_or_norm_rank)); break;
    case Composite::LayerNorm:
      b.ret(layer_norm(x, b.param("w", dt, w_shape), b.param("b", dt, w_shape), 1e-5));
      break;
    case Composite::RmsNorm: b.ret(rms_norm(x, b.param("w", dt, w_shape), 1e-6)); break;
  }
  return decompose(finish(b));
}

// ---- inputs ------------------------------------------------------------------------------

// Floats uniform in [lo, hi) rounded to the dtype; integers uniform over the whole
// range of the dtype when `wide` (sums wrap like the reference), else in [-1000, 1000).
Tensor random_rows(DType t, const Shape& s, uint64_t seed, double lo = -1, double hi = 1, bool wide = false) {
  Tensor x(t, s);
  std::mt19937_64 rng(seed);
  for (int64_t i = 0; i < x.numel(); ++i) {
    if (t == DType::Bool) x.set_int(i, static_cast<int64_t>(rng() >> 63));
    else if (is_float(t)) x.set(i, lo + (hi - lo) * static_cast<double>(rng() >> 11) * 0x1p-53);
    else if (wide) x.set_int(i, static_cast<int64_t>(rng()));  // i32 wraps
    else x.set_int(i, static_cast<int64_t>(rng() % 2000) - 1000);
  }
  return x;
}

std::vector<Tensor> random_inputs_for(const Graph& g, uint64_t seed, double lo = -1, double hi = 1, bool wide = false) {
  std::vector<Tensor> in;
  for (size_t i = 0; i < g.params().size(); ++i) {
    const TensorType& t = g.node(g.params()[i]).type;
    in.push_back(random_rows(t.dtype, t.shape, seed + 7919 * i, lo, hi, wide));
  }
  return in;
}

// ---- running kernels ----------------------------------------------------------------------




// Emits `g` for the host, JIT-compiles it and runs it on `inputs`.
Result<std::vector<Tensor>> run_host(const Graph& g, const std::vector<Tensor>& inputs, const KernelConfig& cfg = {}) {
  return kernel_test::run_emitted(reduction_emitter().emit(spec_of(g), cfg, llvmb::Target::host()), g, inputs);
}

// One simulated block: a barrier for __syncthreads and a slot per thread for
// shuffles (write, barrier, read the partner's, barrier).
struct SimBlock {
  explicit SimBlock(int threads) : bar(threads), slots(static_cast<size_t>(threads)) {}
  kernel_test::SleepBarrier<> bar;
  std::vector<int32_t> slots;
};

void sim_barrier(void* ctx) { static_cast<SimBlock*>(ctx)->bar.arrive_and_wait(); }

int32_t sim_shfl(void* ctx, int32_t tid, int32_t value, int32_t lane_mask) {
  auto* s = static_cast<SimBlock*>(ctx);
  s->slots[static_cast<size_t>(tid)] = value;
  s->bar.arrive_and_wait();
  int32_t r = s->slots[static_cast<size_t>(tid ^ lane_mask)];
  s->bar.arrive_and_wait();
  return r;
}

// Runs the NVPTX kernel's algorithm on the host: every block of the launch, one after
// another, each with all its threads running concurrently.
// `misaligned`: every input is passed one element past a 16-byte boundary, as a view
// at an odd offset would be (the kernel must take its scalar path).
Result<std::vector<Tensor>> run_simulated(const Graph& g, const std::vector<Tensor>& inputs, const KernelConfig& cfg,
                                          bool misaligned = false) {
  Result<ReductionInfo> info = reduction_info(spec_of(g), cfg);
  if (!info) return info.error();
  Result<EmittedKernel> k = emit_reduction_block_on_host(spec_of(g, "red_sim"), cfg);
  if (!k) return k.error();
  LaunchShape launch = k->launch;
  Result<void*> fn = jit().add(std::move(k->module), std::move(k->context), k->entry);
  if (!fn) return fn.error();
  using Entry = void (*)(void**, int32_t, int32_t, int32_t, ReductionSimHooks*, int32_t);
  auto entry = reinterpret_cast<Entry>(*fn);
  std::vector<Tensor> out = output_tensors(g);
  kernel_test::ArgArray args = arg_array(inputs, out);
  std::vector<std::vector<char>> shifted;
  if (misaligned)
    for (size_t i = 0; i < inputs.size(); ++i) {
      const size_t esz = static_cast<size_t>(dtype_size(inputs[i].dtype()));
      shifted.emplace_back(static_cast<size_t>(inputs[i].nbytes()) + 32);
      // 16-aligned start + one element: aligned for scalar loads, never for 16 bytes.
      auto addr = reinterpret_cast<uintptr_t>(shifted.back().data());
      char* at = shifted.back().data() + ((16 - addr % 16) % 16) + esz;
      std::memcpy(at, inputs[i].data(), static_cast<size_t>(inputs[i].nbytes()));
      args[i] = at;
    }
  const int threads = launch.block[0];
  std::vector<uint64_t> shared(static_cast<size_t>(info->static_shared_bytes / 8 + 1), 0xDEADBEEFDEADBEEFull);
  // A split reduction adds into its outputs, which the launch zeroes.
  if (launch.zero_outputs)
    for (Tensor& t : out) std::memset(t.data(), 0, t.nbytes());
  kernel_test::BlockThreads block(threads);
  for (int64_t by = 0; by < launch.grid[1]; ++by)
  for (int64_t blk = 0; blk < launch.grid[0]; ++blk) {
    SimBlock sb(threads);
    ReductionSimHooks hooks{&sb, sim_barrier, sim_shfl, shared.data()};
    block.run([&](int t) {
      entry(args.data(), static_cast<int32_t>(blk), t, static_cast<int32_t>(launch.grid[0]), &hooks,
            static_cast<int32_t>(by));
    });
  }
  return out;
}

enum class Runner { Host, Simulated };

// The kernel's outputs equal the reference's within default_tolerance (exactly for
// integers; NaN only matches NaN).
void expect_matches_reference(const Graph& g, const std::vector<Tensor>& inputs, const KernelConfig& cfg = {},
                              Runner runner = Runner::Host) {
  Result<std::vector<Tensor>> want = evaluate(g, inputs);
  ASSERT_TRUE(want.ok()) << want.error().str();
  Result<std::vector<Tensor>> got = runner == Runner::Host ? run_host(g, inputs, cfg) : run_simulated(g, inputs, cfg);
  ASSERT_TRUE(got.ok()) << got.error().str();
  ASSERT_EQ(got->size(), want->size());
  for (size_t o = 0; o < want->size(); ++o) {
    const Tensor& w = (*want)[o];
    const Tensor& r = (*got)[o];
    Comparison c = compare(r, w, default_tolerance(w.dtype()));
    EXPECT_TRUE(c.ok()) << "output " << o << " '" << g.outputs()[o].name << "' (" << w.type().str()
                        << "): " << c.mismatches << " mismatch(es); first at " << c.first_mismatch << ": got "
                        << (c.first_mismatch >= 0 ? r.get(c.first_mismatch) : 0.0) << ", want "
                        << (c.first_mismatch >= 0 ? w.get(c.first_mismatch) : 0.0) << "; max abs err "
                        << c.max_abs_err;
  }
}

std::string config_str(const KernelConfig& c) {
  return "threads_per_row=" + std::to_string(c.threads_per_row) + " rows_per_block=" + std::to_string(c.rows_per_block) +
         " grid_stride=" + std::to_string(c.grid_stride) + " max_blocks=" + std::to_string(c.max_blocks);
}

// ---- every reduction op, every placement of the reduced dims --------------------------------

// x: one shape, reduced over `dims` by sum, max, min and mean (one kernel, one pass).
Graph four_reductions(DType dt, const Shape& x_shape, const std::vector<int64_t>& dims, bool keepdim) {
  GraphBuilder b("four");
  Value x = b.param("x", dt, x_shape);
  b.ret(reduce(OpKind::Sum, x, dims, keepdim));
  b.ret(reduce(OpKind::Max, x, dims, keepdim));
  b.ret(reduce(OpKind::Min, x, dims, keepdim));
  b.ret(reduce(OpKind::Mean, x, dims, keepdim));
  return finish(b);
}

struct DimsCase {
  const char* what;
  Shape shape;
  std::vector<int64_t> dims;
};

// Rows of 1, 7 and 1000, each of 3 or 5000 elements, reduced where X's dims allow.
const std::vector<DimsCase>& dims_cases() {
  static const std::vector<DimsCase> cases = {
      {"last dim, 1 row of 3", {1, 3}, {-1}},
      {"last dim, 1 row of 5000", {1, 5000}, {1}},
      {"last dim, 7 rows of 3", {7, 3}, {1}},
      {"last dim, 7 rows of 5000", {7, 5000}, {-1}},
      {"last dim, 1000 rows of 3", {1000, 3}, {1}},
      {"last dim, 1000 rows of 5000", {1000, 5000}, {1}},
      {"first dim, 7 rows of 5000", {5000, 7}, {0}},
      {"first dim, 1000 rows of 3", {3, 1000}, {0}},
      {"middle dim, 7x1000 rows of 3", {7, 3, 1000}, {1}},
      {"several dims, 7 rows of 3x1000", {3, 7, 1000}, {0, 2}},
      {"several dims, 5x4 rows of 2x3x5", {2, 5, 3, 4, 5}, {0, 2, 4}},
      {"all dims (empty list), 1 row of 5000", {50, 100}, {}},
      {"all dims (listed), 1 row of 3", {3}, {0}},
      {"size-1 reduced dim, 7 rows of 1", {7, 1}, {1}},
  };
  return cases;
}

TEST(ReductionHost, SumMaxMinMeanOverEveryDimsPlacementAndKeepdim) {
  int kernels = 0;
  uint64_t seed = 1;
  size_t i = 0;
  for (const DimsCase& dc : dims_cases())
    for (bool keepdim : {false, true}) {
      // The sanitizer build's sample: every dims case, keepdim alternating (tests/sanitized.h).
      if (!test::in_sample(i++)) continue;
      SCOPED_TRACE(std::string(dc.what) + (keepdim ? ", keepdim" : ""));
      Graph g = four_reductions(DType::F32, dc.shape, dc.dims, keepdim);
      expect_matches_reference(g, random_inputs_for(g, seed++));
      ++kernels;
    }
  EXPECT_EQ(kernels, test::kSanitized ? 14 : 28);
}

TEST(ReductionHost, HalfTypesAccumulateInF32AndRoundOnce) {
  size_t i = 0;
  for (DType dt : {DType::F16, DType::BF16})
    for (const DimsCase& dc : dims_cases()) {
      // The sanitizer build's sample: each dims case in one of the two dtypes, alternating.
      if (!test::in_sample(i++ + (dt == DType::BF16 ? 1 : 0))) continue;
      SCOPED_TRACE(std::string(dtype_name(dt)) + " " + dc.what);
      Graph g = four_reductions(dt, dc.shape, dc.dims, true);
      expect_matches_reference(g, random_inputs_for(g, 100));
    }
}

TEST(ReductionHost, SingleReductionGroups) {
  // One reduction per kernel (the common case from fusion), as separate kernels.
  for (OpKind op : {OpKind::Sum, OpKind::Max, OpKind::Min, OpKind::Mean})
    for (const Shape& s : {Shape{7, 5000}, Shape{1000, 3}}) {
      SCOPED_TRACE(std::string(op_name(op)) + " " + shape_str(s));
      GraphBuilder b("one");
      b.ret(reduce(op, b.param("x", DType::F32, s), {-1}, false));
      Graph g = finish(b);
      expect_matches_reference(g, random_inputs_for(g, 5, -3, 3));
    }
}

TEST(ReductionHost, IntegerSumsAreExactInI64AndMaxMinKeepTheDtype) {
  for (DType dt : {DType::I32, DType::I64, DType::Bool}) {
    SCOPED_TRACE(dtype_name(dt));
    GraphBuilder b("ints");
    Value x = b.param("x", dt, {7, 5000});
    b.ret(reduce(OpKind::Sum, x, {1}, false));   // i64, wrapping like torch
    b.ret(reduce(OpKind::Sum, x, {0}, true));
    if (dt != DType::Bool) {
      b.ret(reduce(OpKind::Max, x, {1}, false));
      b.ret(reduce(OpKind::Min, x, {1}, true));
    }
    Graph g = finish(b);
    // Two groups would come from fusion (different dims); run each separately.
    for (bool wide : {false, true}) {
      GraphBuilder b1("ints_rows");
      Value x1 = b1.param("x", dt, {7, 5000});
      b1.ret(reduce(OpKind::Sum, x1, {1}, false));
      if (dt != DType::Bool) {
        b1.ret(reduce(OpKind::Max, x1, {1}, false));
        b1.ret(reduce(OpKind::Min, x1, {1}, true));
      }
      Graph g1 = finish(b1);
      expect_matches_reference(g1, random_inputs_for(g1, 9, -1, 1, wide));
      GraphBuilder b2("ints_cols");
      b2.ret(reduce(OpKind::Sum, b2.param("x", dt, {7, 5000}), {0}, true));
      Graph g2 = finish(b2);
      expect_matches_reference(g2, random_inputs_for(g2, 10, -1, 1, wide));
    }
    // One group may not mix reduced dims.
    Result<EmittedKernel> k = reduction_emitter().emit(spec_of(g), {}, llvmb::Target::host());
    ASSERT_FALSE(k.ok());
    EXPECT_NE(k.error().message.find("one set of dims"), std::string::npos) << k.error().message;
  }
}

TEST(ReductionHost, MaxAndMinPropagateNaNAndSeeInfinities) {
  GraphBuilder b("nan");
  Value x = b.param("x", DType::F32, {6, 37});
  b.ret(reduce(OpKind::Max, x, {1}, false));
  b.ret(reduce(OpKind::Min, x, {1}, false));
  b.ret(reduce(OpKind::Sum, x, {1}, false));
  Graph g = finish(b);
  Tensor t = random_rows(DType::F32, {6, 37}, 3);
  const double inf = std::numeric_limits<double>::infinity();
  t.set(0 * 37 + 5, std::nan(""));   // row 0: NaN in the middle
  t.set(1 * 37 + 0, std::nan(""));   // row 1: NaN first
  t.set(2 * 37 + 36, std::nan(""));  // row 2: NaN last
  t.set(3 * 37 + 4, inf);            // row 3: +inf and -inf
  t.set(3 * 37 + 9, -inf);
  t.set(4 * 37 + 1, -0.0);           // row 4: signed zeros only
  for (int64_t j = 0; j < 37; ++j) t.set(4 * 37 + j, j % 2 ? 0.0 : -0.0);
  expect_matches_reference(g, {t});
  Result<std::vector<Tensor>> got = run_host(g, {t});
  ASSERT_TRUE(got.ok()) << got.error().str();
  for (int r : {0, 1, 2}) {
    EXPECT_TRUE(std::isnan((*got)[0].get(r))) << r;
    EXPECT_TRUE(std::isnan((*got)[1].get(r))) << r;
  }
  EXPECT_EQ((*got)[0].get(3), inf);
  EXPECT_EQ((*got)[1].get(3), -inf);
}

// ---- prologues and epilogues ---------------------------------------------------------------

TEST(ReductionHost, SoftmaxAsDecomposed) {
  struct Case {
    DType dt;
    Shape shape;
    int64_t dim;
  };
  const std::vector<Case> cases = {
      {DType::F32, {7, 5000}, -1}, {DType::F32, {1000, 3}, -1}, {DType::F32, {1, 3}, 1},
      {DType::F32, {5000, 7}, 0},  {DType::F32, {4, 3, 25}, 1}, {DType::F16, {7, 5000}, -1},
      {DType::BF16, {1000, 3}, -1}, {DType::BF16, {7, 5000}, 1}, {DType::F16, {3, 1000}, 0},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(dtype_name(c.dt)) + shape_str(c.shape) + " dim " + std::to_string(c.dim));
    Graph g = composite_group(Composite::Softmax, c.dt, c.shape, c.dim);
    Result<ReductionInfo> info = reduction_info(spec_of(g), {});
    ASSERT_TRUE(info.ok()) << info.error().str();
    EXPECT_EQ(info->passes, 2);  // max, then sum(exp(x - max))
    EXPECT_EQ(info->x_outputs, 1);
    expect_matches_reference(g, random_inputs_for(g, 11, -3, 3));
  }
}

TEST(ReductionHost, LayerNormAndRmsNormAsDecomposed) {
  struct Case {
    Composite c;
    DType dt;
    Shape shape;
    int64_t norm_rank;
  };
  const std::vector<Case> cases = {
      {Composite::LayerNorm, DType::F32, {7, 5000}, 1},  {Composite::LayerNorm, DType::F32, {1000, 3}, 1},
      {Composite::LayerNorm, DType::F32, {1, 5000}, 1},  {Composite::LayerNorm, DType::F16, {7, 5000}, 1},
      {Composite::LayerNorm, DType::BF16, {1000, 3}, 1}, {Composite::LayerNorm, DType::F32, {5, 4, 250}, 2},
      {Composite::RmsNorm, DType::F32, {7, 5000}, 1},    {Composite::RmsNorm, DType::F32, {1000, 3}, 1},
      {Composite::RmsNorm, DType::BF16, {7, 5000}, 1},   {Composite::RmsNorm, DType::F16, {2, 3, 7, 5}, 3},
  };
  for (const Case& c : cases) {
    const bool ln = c.c == Composite::LayerNorm;
    SCOPED_TRACE(std::string(ln ? "layer_norm " : "rms_norm ") + std::string(dtype_name(c.dt)) + shape_str(c.shape));
    Graph g = composite_group(c.c, c.dt, c.shape, c.norm_rank);
    Result<ReductionInfo> info = reduction_info(spec_of(g), {});
    ASSERT_TRUE(info.ok()) << info.error().str();
    EXPECT_EQ(info->passes, ln ? 2 : 1);  // mean, then mean((x - mean)^2); rms: mean(x * x)
    expect_matches_reference(g, random_inputs_for(g, 12, -2, 2));
  }
}

TEST(ReductionHost, ReducedSpaceEpilogueAndOutputsInBothSpaces) {
  // A hand-written layer norm that also returns the mean and rstd (reduced space, as
  // torch's native_layer_norm does) and the centred value (X space), over dim 0.
  GraphBuilder b("ln_stats");
  Value x = b.param("x", DType::F32, {5000, 7});
  Value w = b.param("w", DType::F32, {7});
  Value m = reduce(OpKind::Sum, x, {0}, false) * (1.0 / 5000);  // [7]
  Value xc = x - m;
  Value var = reduce(OpKind::Mean, xc * xc, {0}, true);           // [1, 7]
  Value rstd = unary(OpKind::Rsqrt, var + 1e-5);
  b.ret(m);
  b.ret(rstd);
  b.ret(xc * rstd * w);
  b.ret(xc);
  Graph g = finish(b);
  Result<ReductionInfo> info = reduction_info(spec_of(g), {});
  ASSERT_TRUE(info.ok()) << info.error().str();
  EXPECT_EQ(info->rows, 7);
  EXPECT_EQ(info->row_elems, 5000);
  EXPECT_EQ(info->row_outputs, 2);
  EXPECT_EQ(info->x_outputs, 2);
  expect_matches_reference(g, random_inputs_for(g, 13));
}

TEST(ReductionHost, PrologueWithViewsBroadcastsAndCasts) {
  // sum(exp(transpose(a) * bias), dim 1) with a half input: the prologue reads a
  // through a transpose, a broadcast row and a cast; the later pass reads a reshaped
  // reduced value.
  GraphBuilder b("prologue");
  Value a = b.param("a", DType::F16, {300, 7});
  Value bias = b.param("bias", DType::F32, {300});
  Value scale = b.param("scale", DType::F32, {7, 1});
  Value p = exp(cast(transpose(a, 0, 1), DType::F32) * bias);  // [7, 300]
  Value s = reduce(OpKind::Sum, p, {1}, false);                  // [7]
  Value mx = reduce(OpKind::Max, p - reshape(s, {7, 1}) * scale, {1}, true);
  b.ret(s);
  b.ret(cast(p / reshape(s, {7, 1}) + mx, DType::BF16));
  b.ret(binary(OpKind::Gt, mx, 0.0));
  Graph g = finish(b);
  Result<ReductionInfo> info = reduction_info(spec_of(g), {});
  ASSERT_TRUE(info.ok()) << info.error().str();
  EXPECT_EQ(info->passes, 2);
  expect_matches_reference(g, random_inputs_for(g, 14));
}

TEST(ReductionHost, IndependentReductionsShareOnePass) {
  // sum(x) and sum(x * x) do not depend on each other: one sweep computes both.
  GraphBuilder b("moments");
  Value x = b.param("x", DType::F32, {7, 5000});
  Value s1 = reduce(OpKind::Sum, x, {1}, true);
  Value s2 = reduce(OpKind::Sum, x * x, {1}, true);
  b.ret(s2 * (1.0 / 5000) - (s1 * (1.0 / 5000)) * (s1 * (1.0 / 5000)));
  Graph g = finish(b);
  Result<ReductionInfo> info = reduction_info(spec_of(g), {});
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->passes, 1);
  expect_matches_reference(g, random_inputs_for(g, 15));
}

TEST(ReductionHost, LongRowsStayAccurateInF32) {
  // 2^20 elements of one sign in one row: a single f32 accumulator loses about 2^20
  // ulps; the blocked sum stays within the f32 tolerance of the double reference.
  GraphBuilder b("long");
  b.ret(reduce(OpKind::Sum, b.param("x", DType::F32, {1 << 20}), {}, false));
  b.ret(reduce(OpKind::Mean, b.param("y", DType::F32, {1 << 20}), {}, false));
  Graph g = finish(b);
  expect_matches_reference(g, random_inputs_for(g, 16, 0, 1));
}

// ---- empty rows and empty tensors ------------------------------------------------------------

TEST(ReductionHost, EmptyRowsSumToZeroAndMeanToNaN) {
  GraphBuilder b("empty_rows");
  Value x = b.param("x", DType::F32, {4, 0});
  Value i = b.param("i", DType::I32, {4, 0});
  b.ret(reduce(OpKind::Sum, x, {1}, false));
  b.ret(reduce(OpKind::Mean, x, {1}, true));
  b.ret(reduce(OpKind::Sum, i, {1}, false));
  b.ret(x * 2.0);  // an X-space output with no elements
  Graph g = finish(b);
  expect_matches_reference(g, random_inputs_for(g, 17));
  Tensor xt(DType::F32, {4, 0}), it(DType::I32, {4, 0});
  Result<std::vector<Tensor>> got = run_host(g, {xt, it});
  ASSERT_TRUE(got.ok()) << got.error().str();
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ((*got)[0].get(r), 0.0);
    EXPECT_TRUE(std::isnan((*got)[1].get(r)));
    EXPECT_EQ((*got)[2].get_int(r), 0);
  }
  KernelConfig cfg;
  cfg.threads_per_row = 64;
  expect_matches_reference(g, {xt, it}, cfg, Runner::Simulated);
}

TEST(ReductionHost, MaxOfAnEmptyRowIsADiagLikeTheReference) {
  GraphBuilder b("empty_max");
  b.ret(reduce(OpKind::Max, b.param("x", DType::F32, {4, 0}), {1}, false));
  Graph g = finish(b);
  Result<std::vector<Tensor>> ref = evaluate(g, {Tensor(DType::F32, {4, 0})});
  EXPECT_FALSE(ref.ok());
  for (const llvmb::Target& t : {llvmb::Target::host(), llvmb::Target::nvptx("sm_90a")}) {
    Result<EmittedKernel> k = reduction_emitter().emit(spec_of(g), {}, t);
    ASSERT_FALSE(k.ok());
    EXPECT_NE(k.error().message.find("no identity"), std::string::npos) << k.error().message;
  }
}

TEST(ReductionHost, EmptyTensorIsANoOpKernel) {
  for (const Shape& s : {Shape{0, 5}, Shape{0, 0}}) {
    GraphBuilder b("empty");
    Value x = b.param("x", DType::F32, s);
    b.ret(reduce(OpKind::Max, x, {1}, false));  // no rows: nothing to reduce, no Diag
    b.ret(exp(x - reduce(OpKind::Max, x, {1}, true)));
    Graph g = finish(b);
    Result<ReductionInfo> info = reduction_info(spec_of(g), {});
    ASSERT_TRUE(info.ok()) << info.error().str();
    EXPECT_EQ(info->rows, 0);
    expect_matches_reference(g, {Tensor(DType::F32, s)});
    Result<EmittedKernel> k = reduction_emitter().emit(spec_of(g), {}, llvmb::Target::nvptx("sm_90a"));
    ASSERT_TRUE(k.ok()) << k.error().str();
    EXPECT_EQ(k->launch.grid[0], 1);  // an empty kernel still launches
    EXPECT_TRUE(llvmb::compile_to_ptx(*k->module, "sm_90a").ok());
  }
}

// ---- the NVPTX algorithm, simulated on the host ---------------------------------------------

std::vector<KernelConfig> sim_configs() {
  std::vector<KernelConfig> v;
  auto add = [&](int tpr, int rpb, bool grid_stride, int max_blocks) {
    KernelConfig c;
    c.threads_per_row = tpr;
    c.rows_per_block = rpb;
    c.grid_stride = grid_stride;
    c.max_blocks = max_blocks;
    v.push_back(c);
  };
  add(256, 1, true, 4096);  // the default: 8 warps per row, shared memory across warps
  add(128, 2, true, 2);     // two rows per block, grid-stride over row groups
  add(32, 4, false, 1);     // a warp per row: shuffles only
  add(8, 4, true, 3);       // part-warps: 4 rows in one warp
  add(4, 1, true, 4096);    // a block smaller than a warp
  add(1, 64, true, 4096);   // a thread per row: no communication
  return v;
}

TEST(ReductionSimulated, SoftmaxAndLayerNormMatchTheReferenceInEveryConfig) {
  Graph sm = composite_group(Composite::Softmax, DType::F32, {9, 1000}, -1);
  Graph ln = composite_group(Composite::LayerNorm, DType::BF16, {5, 300}, 1);
  Graph rms = composite_group(Composite::RmsNorm, DType::F16, {6, 3}, 1);
  for (const KernelConfig& cfg : sim_configs()) {
    SCOPED_TRACE(config_str(cfg));
    expect_matches_reference(sm, random_inputs_for(sm, 21, -3, 3), cfg, Runner::Simulated);
    expect_matches_reference(ln, random_inputs_for(ln, 22), cfg, Runner::Simulated);
    expect_matches_reference(rms, random_inputs_for(rms, 23), cfg, Runner::Simulated);
  }
}

TEST(ReductionSimulated, IntegersNaNsAndNonTrailingDims) {
  GraphBuilder b1("ints");
  Value i = b1.param("i", DType::I64, {7, 300});
  b1.ret(reduce(OpKind::Sum, i, {1}, false));  // i64 through shuffles as two halves
  b1.ret(reduce(OpKind::Max, i, {1}, false));
  b1.ret(reduce(OpKind::Min, cast(i, DType::I32), {1}, false));
  Graph gi = finish(b1);

  GraphBuilder b2("cols");
  Value x = b2.param("x", DType::F32, {3, 100, 5});
  b2.ret(reduce(OpKind::Max, x, {0, 1}, false));
  b2.ret(reduce(OpKind::Mean, x, {0, 1}, true));
  b2.ret(x - reduce(OpKind::Min, x, {0, 1}, true));
  Graph gc = finish(b2);
  std::vector<Tensor> cin = random_inputs_for(gc, 25);
  cin[0].set(17 * 5 + 2, std::nan(""));  // column 2: NaN
  cin[0].set(250 * 5 + 3, -std::numeric_limits<double>::infinity());

  for (const KernelConfig& cfg : sim_configs()) {
    SCOPED_TRACE(config_str(cfg));
    expect_matches_reference(gi, random_inputs_for(gi, 24, -1, 1, /*wide=*/true), cfg, Runner::Simulated);
    expect_matches_reference(gc, cin, cfg, Runner::Simulated);
  }
}

// Slices and concats in the prologue: a slice whose start keeps 4-wide runs aligned
// (vector steps), one whose start does not (scalar), and a concat's clamped reads.
TEST(ReductionSimulated, SliceAndConcatProloguesMatchTheReference) {
  GraphBuilder b1("sliced");
  Value x = b1.param("x", DType::F32, {3, 266});
  Value s = slice(x, 1, 8, 264) + slice(x, 1, 1, 257);  // from element 8 and from element 1
  Value e = exp(s - reduce(OpKind::Max, s, {1}, true));
  b1.ret(e / reduce(OpKind::Sum, e, {1}, true));
  Graph gs = finish(b1);
  GraphBuilder b2("joined");
  Value x2 = b2.param("x", DType::F32, {3, 266});
  Value y2 = b2.param("y", DType::F32, {3, 150});
  Value c = concat({slice(x2, 1, 3, 131), slice(y2, 1, 0, 128)}, 1);
  b2.ret(reduce(OpKind::Sum, c * c, {1}, false));
  b2.ret(reduce(OpKind::Max, c, {1}, false));
  Graph gc = finish(b2);
  for (const KernelConfig& cfg : sim_configs()) {
    SCOPED_TRACE(config_str(cfg));
    expect_matches_reference(gs, random_inputs_for(gs, 26), cfg, Runner::Simulated);
    expect_matches_reference(gc, random_inputs_for(gc, 27), cfg, Runner::Simulated);
  }
  expect_matches_reference(gs, random_inputs_for(gs, 28));
  expect_matches_reference(gc, random_inputs_for(gc, 29));
}

// Which form each row shape gets: rows whose share per thread fits in registers are
// held there, longer rows and split rows are read per pass; both step by a vector of
// adjacent elements where the reduced dims are innermost and the vector divides the
// row (not split rows).
TEST(ReductionPersistent, RowsThatFitAreHeldInRegisters) {
  struct Case {
    const char* what;
    Graph g;
    int tpr;
    int split;
    bool persistent;
    int vector;
    int64_t elems;
  };
  KernelConfig c;
  GraphBuilder cb("cols");
  cb.ret(reduce(OpKind::Sum, cb.param("x", DType::F32, {16, 64}), {0}, false));
  Graph cols = finish(cb);
  GraphBuilder sb("split");
  sb.ret(reduce(OpKind::Sum, sb.param("x", DType::F32, {6, 1000}), {1}, false));
  Graph split = finish(sb);
  const std::vector<Case> cases = {
      {"softmax f32 1000 / 256 threads", composite_group(Composite::Softmax, DType::F32, {9, 1000}, -1), 256, 1, true, 4, 4},
      {"softmax f32 1000 / 32 threads", composite_group(Composite::Softmax, DType::F32, {9, 1000}, -1), 32, 1, true, 4, 32},
      {"softmax f32 1000 / 16 threads: multi-pass, 4-wide steps", composite_group(Composite::Softmax, DType::F32, {9, 1000}, -1), 16, 1, false, 4, 0},
      {"layer_norm bf16 4096 / 512 threads", composite_group(Composite::LayerNorm, DType::BF16, {4, 4096}, 1), 512, 1, true, 8, 8},
      {"layer_norm bf16 300: 8 does not divide it", composite_group(Composite::LayerNorm, DType::BF16, {5, 300}, 1), 64, 1, true, 4, 8},
      {"rms_norm f16 3: odd rows", composite_group(Composite::RmsNorm, DType::F16, {6, 3}, 1), 4, 1, true, 1, 1},
      {"a column reduction", cols, 1, 1, true, 1, 16},
      {"a split row", split, 64, 2, false, 1, 0},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.what);
    c.threads_per_row = k.tpr;
    c.rows_per_block = 1;
    c.split_reduction = k.split;
    Result<ReductionInfo> info = reduction_info(spec_of(k.g), c);
    ASSERT_TRUE(info.ok()) << info.error().str();
    EXPECT_EQ(info->persistent, k.persistent);
    EXPECT_EQ(info->vector, k.vector);
    EXPECT_EQ(info->elems_per_thread, k.elems);
    if (numel(info->x) <= 50000 && k.split == 1)
      expect_matches_reference(k.g, random_inputs_for(k.g, 41), c, Runner::Simulated);
  }
}

// A tensor that does not start on a 16-byte boundary takes the scalar path (of the
// persistent and of the multi-pass form): the same result, one element per access.
TEST(ReductionPersistent, MisalignedOperandsTakeTheScalarPath) {
  for (const Graph& g : {composite_group(Composite::Softmax, DType::F32, {9, 1000}, -1),
                         composite_group(Composite::LayerNorm, DType::BF16, {5, 320}, 1)})
  for (int tpr : {32, 1}) {
    KernelConfig c;
    c.threads_per_row = tpr;
    c.rows_per_block = tpr == 1 ? 32 : 2;
    Result<ReductionInfo> info = reduction_info(spec_of(g), c);
    ASSERT_TRUE(info.ok()) << info.error().str();
    ASSERT_EQ(info->persistent, tpr == 32);
    ASSERT_GT(info->vector, 1);
    std::vector<Tensor> in = random_inputs_for(g, 42, -3, 3);
    Result<std::vector<Tensor>> want = evaluate(g, in);
    ASSERT_TRUE(want.ok()) << want.error().str();
    for (bool misaligned : {false, true}) {
      SCOPED_TRACE(misaligned ? "misaligned" : "aligned");
      Result<std::vector<Tensor>> got = run_simulated(g, in, c, misaligned);
      ASSERT_TRUE(got.ok()) << got.error().str();
      Comparison cmp = compare((*got)[0], (*want)[0], default_tolerance((*want)[0].dtype()));
      EXPECT_TRUE(cmp.ok()) << cmp.mismatches << " mismatches, first at " << cmp.first_mismatch;
    }
  }
}

TEST(ReductionSimulated, SuggestedConfigsFitTheRowShape) {
  struct Case {
    Shape shape;
    std::vector<int64_t> dims;
    int tpr, rpb;
  };
  const std::vector<Case> cases = {
      {{1000, 5000}, {1}, 256, 1},  // long rows: 8 warps per row
      {{64, 300}, {1}, 64, 4},      // ~8 elements per thread, 4 rows per block
      {{1000, 16}, {1}, 16, 16},    // short rows: a thread per element, 2 rows per warp
      {{1000, 3}, {1}, 4, 64},
      {{7, 3}, {1}, 4, 8},          // no more rows per block than rows
      {{5000, 7}, {0}, 128, 2},     // a column reduction: ~64 elements per thread
      {{16, 64}, {0}, 1, 64},       // neighbouring threads read neighbouring columns
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(shape_str(c.shape));
    GraphBuilder b("s");
    Value x = b.param("x", DType::F32, c.shape);
    b.ret(x / reduce(OpKind::Sum, exp(x), c.dims, true));
    Graph g = finish(b);
    Result<KernelConfig> cfg = suggest_reduction_config(spec_of(g));
    ASSERT_TRUE(cfg.ok()) << cfg.error().str();
    EXPECT_EQ(cfg->threads_per_row, c.tpr);
    EXPECT_EQ(cfg->rows_per_block, c.rpb);
    if (numel(c.shape) <= 50000) expect_matches_reference(g, random_inputs_for(g, 26), *cfg, Runner::Simulated);
  }
  GraphBuilder b("pw");
  b.ret(b.param("x", DType::F32, {4}) * 2.0);
  EXPECT_FALSE(suggest_reduction_config(spec_of(finish(b))).ok());
}

// ---- NVPTX -------------------------------------------------------------------------------------



struct Ptx {
  std::string ptx;
  LaunchShape launch;
};

// Emits for `arch`; checks the verifier, compile_to_ptx and (where it exists) ptxas.
Ptx emit_ptx(const Graph& g, const std::string& arch, const KernelConfig& cfg = {}) {
  Result<EmittedKernel> k = reduction_emitter().emit(spec_of(g, "red_kernel"), cfg, llvmb::Target::nvptx(arch));
  if (!k) {
    ADD_FAILURE() << k.error().str();
    return {};
  }
  Ptx out;
  out.launch = k->launch;
  std::optional<std::string> bad = llvmb::verify(*k->module);
  EXPECT_FALSE(bad) << *bad;
  Result<std::string> ptx = llvmb::compile_to_ptx(*k->module, arch);
  if (!ptx) {
    ADD_FAILURE() << ptx.error().str();
    return out;
  }
  out.ptx = *ptx;
  if (have_ptxas()) {
    EXPECT_EQ(ptxas_failure(out.ptx, arch), "") << out.ptx;
  }
  return out;
}

TEST(ReductionNvptx, VerifiesCompilesAndAssemblesForSm80AndSm90a) {
  if (!have_ptxas()) std::printf("note: %s not found; ptxas checks skipped\n", SF_PTXAS_PATH);
  std::vector<std::pair<std::string, Graph>> groups;
  groups.emplace_back("softmax", composite_group(Composite::Softmax, DType::F32, {1000, 5000}, -1));
  groups.emplace_back("softmax_bf16", composite_group(Composite::Softmax, DType::BF16, {7, 3}, -1));
  groups.emplace_back("layer_norm_f16", composite_group(Composite::LayerNorm, DType::F16, {1000, 5000}, 1));
  groups.emplace_back("rms_norm", composite_group(Composite::RmsNorm, DType::F32, {7, 5000}, 1));
  groups.emplace_back("four_dim0", four_reductions(DType::F32, {5000, 7}, {0}, false));
  GraphBuilder b("ints");
  Value i = b.param("i", DType::I64, {7, 5000});
  b.ret(reduce(OpKind::Sum, i, {1}, false));
  b.ret(reduce(OpKind::Max, cast(i, DType::I32), {1}, false));
  groups.emplace_back("ints", finish(b));
  for (const char* arch : {"sm_80", "sm_90a"})
    for (const auto& [name, g] : groups)
      for (const KernelConfig& cfg : sim_configs()) {
        SCOPED_TRACE(std::string(arch) + " " + name + " " + config_str(cfg));
        Ptx p = emit_ptx(g, arch, cfg);
        EXPECT_NE(p.ptx.find(".entry red_kernel("), std::string::npos);
        EXPECT_EQ(p.ptx.find("__nv_"), std::string::npos) << "libdevice calls left in the PTX";
        EXPECT_EQ(p.ptx.find("call"), std::string::npos) << "the PTX still calls a function";
        if (cfg.threads_per_row > 1) {
          EXPECT_NE(p.ptx.find("shfl.sync.bfly"), std::string::npos);
        }
        if (cfg.threads_per_row > 32) {
          EXPECT_NE(p.ptx.find("bar.sync"), std::string::npos);
          EXPECT_NE(p.ptx.find(".shared"), std::string::npos);
        } else {
          EXPECT_EQ(p.ptx.find("bar.sync"), std::string::npos) << "no barrier is needed within a warp";
        }
        std::string maxntid = ".maxntid " + std::to_string(cfg.threads_per_row * cfg.rows_per_block) + ", 1, 1";
        EXPECT_NE(p.ptx.find(maxntid), std::string::npos);
      }
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// The persistent form in PTX: 16-byte loads and stores, and softmax's exp once per
// element (once per register element in each of the vector and the scalar bodies),
// where the multi-pass form reads the row again (16 bytes at a time) in every pass
// and for the output.
TEST(ReductionNvptx, PersistentRowsLoadOnceWith128BitAccesses) {
  Graph sm = composite_group(Composite::Softmax, DType::F32, {256, 1024}, -1);
  Result<KernelConfig> cfg = suggest_reduction_config(spec_of(sm));
  ASSERT_TRUE(cfg.ok()) << cfg.error().str();
  Result<ReductionInfo> info = reduction_info(spec_of(sm), *cfg);
  ASSERT_TRUE(info.ok());
  ASSERT_TRUE(info->persistent);
  ASSERT_EQ(info->vector, 4);
  Ptx p = emit_ptx(sm, "sm_90a", *cfg);
  EXPECT_GE(count(p.ptx, ".v4.f32"), 2u) << "no 128-bit access";
  EXPECT_NE(p.ptx.find("st.global.v4.f32"), std::string::npos);
  EXPECT_EQ(count(p.ptx, "ex2.approx"), 2 * static_cast<size_t>(info->elems_per_thread)) << p.ptx;

  // Rows too long for registers (one thread per row of 1024): read per pass.
  KernelConfig looped = *cfg;
  looped.threads_per_row = 1;
  looped.rows_per_block = 64;
  Result<ReductionInfo> li = reduction_info(spec_of(sm), looped);
  ASSERT_TRUE(li.ok());
  EXPECT_FALSE(li->persistent);
  Ptx lp = emit_ptx(sm, "sm_90a", looped);
  EXPECT_EQ(li->vector, 4);
  EXPECT_GE(count(lp.ptx, "ld.global.v4.f32") + count(lp.ptx, "ld.global.nc.v4.f32"), 3u)
      << "one 128-bit read of x per pass and one for the output";
  EXPECT_GE(count(lp.ptx, "ex2.approx"), 2u) << "exp in the sum's pass and again for the output";

  // bf16 layer_norm: 8 elements (16 bytes) per access.
  Graph ln = composite_group(Composite::LayerNorm, DType::BF16, {64, 4096}, 1);
  Result<KernelConfig> lc = suggest_reduction_config(spec_of(ln));
  ASSERT_TRUE(lc.ok());
  Result<ReductionInfo> lni = reduction_info(spec_of(ln), *lc);
  ASSERT_TRUE(lni.ok());
  EXPECT_TRUE(lni->persistent);
  EXPECT_EQ(lni->vector, 8);
  Ptx lnp = emit_ptx(ln, "sm_90a", *lc);
  // (bf16 pairs come as 32-bit words, unpacked by a shift or a mask: .u32.)
  EXPECT_GE(count(lnp.ptx, "ld.global.v4.u32") + count(lnp.ptx, "ld.global.nc.v4.u32"), 1u) << "no 16-byte bf16 load";
  EXPECT_GE(count(lnp.ptx, "st.global.v4.b32"), 1u) << "no 16-byte bf16 store";
}

TEST(ReductionNvptx, PtxasAssemblesSoftmaxAndLayerNormForSm90a) {
  if (!have_ptxas()) GTEST_SKIP() << SF_PTXAS_PATH << " not found (no CUDA toolkit): PTX is not assembled";
  for (const Graph& g : {composite_group(Composite::Softmax, DType::F16, {64, 4096}, -1),
                         composite_group(Composite::LayerNorm, DType::F32, {64, 4096}, 1)}) {
    Result<EmittedKernel> k = reduction_emitter().emit(spec_of(g, "red_kernel"), {}, llvmb::Target::nvptx("sm_90a"));
    ASSERT_TRUE(k.ok()) << k.error().str();
    Result<std::string> ptx = llvmb::compile_to_ptx(*k->module, "sm_90a");
    ASSERT_TRUE(ptx.ok()) << ptx.error().str();
    EXPECT_EQ(ptxas_failure(*ptx, "sm_90a"), "");
  }
}

TEST(ReductionNvptx, MaxPropagatesNaNWithTheNaNVariantsOnSm80) {
  GraphBuilder b("mx");
  b.ret(reduce(OpKind::Max, b.param("x", DType::F32, {64, 1024}), {1}, false));
  Ptx p = emit_ptx(finish(b), "sm_80");
  EXPECT_NE(p.ptx.find("max.NaN.f32"), std::string::npos) << p.ptx;
  EXPECT_NE(p.ptx.find("shfl.sync.bfly.b32"), std::string::npos);
}

TEST(ReductionNvptx, LaunchShapes) {
  Graph g = composite_group(Composite::Softmax, DType::F32, {1000, 3}, -1);
  KernelConfig cfg;
  EXPECT_EQ(emit_ptx(g, "sm_90a", cfg).launch.grid[0], 1000);  // one row per block
  EXPECT_EQ(emit_ptx(g, "sm_90a", cfg).launch.block[0], 256);
  cfg.threads_per_row = 32;
  cfg.rows_per_block = 8;
  Ptx p = emit_ptx(g, "sm_90a", cfg);
  EXPECT_EQ(p.launch.grid[0], 125);
  EXPECT_EQ(p.launch.block[0], 256);
  cfg.max_blocks = 16;
  EXPECT_EQ(emit_ptx(g, "sm_90a", cfg).launch.grid[0], 16);  // capped: the blocks loop
  cfg.grid_stride = false;
  EXPECT_EQ(emit_ptx(g, "sm_90a", cfg).launch.grid[0], 125);
  Result<ReductionInfo> info = reduction_info(spec_of(g), KernelConfig{});
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->static_shared_bytes, 2 * 8 * 4);  // two reductions, 8 warps, f32
  EXPECT_EQ(info->launch.shared_bytes, 0);
}

// ---- errors --------------------------------------------------------------------------------

std::string emit_error(const Graph& g, const KernelConfig& cfg = {}, const llvmb::Target& t = llvmb::Target::host(),
                       const std::string& entry = "red", KernelKind kind = KernelKind::Reduction) {
  Result<EmittedKernel> k = reduction_emitter().emit(KernelSpec{entry, kind, g}, cfg, t);
  if (k.ok()) {
    ADD_FAILURE() << "expected a Diag";
    return "";
  }
  return k.error().message;
}

TEST(ReductionErrors, UnsupportedGroupsAndConfigsAreDiags) {
  {
    GraphBuilder b("pw");
    b.ret(b.param("x", DType::F32, {4}) + 1.0);
    EXPECT_NE(emit_error(finish(b)).find("no reduction"), std::string::npos);
  }
  {
    GraphBuilder b("mm");
    Value a = b.param("a", DType::F32, {4, 8});
    b.ret(sum(matmul(a, b.param("w", DType::F32, {8, 4})), {1}));
    EXPECT_NE(emit_error(finish(b)).find("matmul"), std::string::npos);
  }
  {
    GraphBuilder b("composite");
    b.ret(softmax(b.param("x", DType::F32, {4, 4})));
    EXPECT_NE(emit_error(finish(b)).find("decomposed"), std::string::npos);
  }
  {
    GraphBuilder b("shapes");
    Value x = b.param("x", DType::F32, {4, 6});
    b.ret(sum(x, {1}));
    b.ret(sum(reshape(x, {6, 4}), {1}));
    EXPECT_NE(emit_error(finish(b)).find("one shape"), std::string::npos);
  }
  {
    // The reduced value moved to another row by a transpose: not this kernel's.
    GraphBuilder b("other_row");
    Value x = b.param("x", DType::F32, {4, 4, 8});
    Value m = max(x, {2}, true);  // [4, 4, 1]
    b.ret(exp(x - transpose(m, 0, 1)));
    EXPECT_NE(emit_error(finish(b)).find("another row"), std::string::npos);
  }
  {
    GraphBuilder b("outputs");
    Value x = b.param("x", DType::F32, {4, 6});
    b.ret(sum(x, {1}));
    b.ret(b.param("y", DType::F32, {5}) * 2.0);
    EXPECT_NE(emit_error(finish(b)).find("neither one value per row"), std::string::npos);
  }
  GraphBuilder ok("ok");
  ok.ret(sum(ok.param("x", DType::F32, {16, 16}), {1}));
  Graph g = finish(ok);
  KernelConfig cfg;
  cfg.threads_per_row = 48;
  EXPECT_NE(emit_error(g, cfg).find("threads_per_row"), std::string::npos);
  cfg.threads_per_row = 12;
  EXPECT_NE(emit_error(g, cfg).find("threads_per_row"), std::string::npos);
  cfg.threads_per_row = 2048;
  EXPECT_NE(emit_error(g, cfg).find("threads_per_row"), std::string::npos);
  cfg = {};
  cfg.rows_per_block = 8;  // 8 * 256 threads
  EXPECT_NE(emit_error(g, cfg).find("rows_per_block"), std::string::npos);
  cfg = {};
  cfg.threads_per_row = 16;
  cfg.rows_per_block = 3;  // 48 threads: a part-warp after a whole one
  EXPECT_NE(emit_error(g, cfg).find("multiple of 32"), std::string::npos);
  EXPECT_NE(emit_error(g, {}, llvmb::Target::nvptx("compute_90")).find("arch"), std::string::npos);
  EXPECT_NE(emit_error(g, {}, llvmb::Target::host(), "not an identifier").find("C identifier"), std::string::npos);
  EXPECT_NE(emit_error(g, {}, llvmb::Target::host(), "red", KernelKind::Pointwise).find("not a reduction"),
            std::string::npos);
}

// Split reduction: grid y splits each row's elements; every block adds its share
// into the zeroed output atomically. Simulated block by block against the reference.
TEST(ReductionSplit, SumAndMeanOfSplitRowsMatchTheReference) {
  for (OpKind op : {OpKind::Sum, OpKind::Mean}) {
    GraphBuilder b("split");
    b.ret(reduce(op, b.param("in0", DType::F32, {6, 1000}), {1}, false));
    Graph rows = finish(b);
    GraphBuilder b2("split_cols");
    b2.ret(reduce(op, b2.param("in0", DType::F32, {333, 5}), {0}, true));
    Graph cols = finish(b2);
    for (int split : {2, 3, 7}) {  // 7 does not divide 1000: the last share is shorter
      for (int tpr : {64, 8}) {
        KernelConfig c;
        c.split_reduction = split;
        c.threads_per_row = tpr;
        c.rows_per_block = tpr == 8 ? 4 : 1;
        SCOPED_TRACE(std::string(op_name(op)) + " split " + std::to_string(split) + " tpr " + std::to_string(tpr));
        expect_matches_reference(rows, random_inputs_for(rows, 31), c, Runner::Simulated);
        expect_matches_reference(cols, random_inputs_for(cols, 32), c, Runner::Simulated);
      }
    }
  }
}

TEST(ReductionSplit, LaunchPtxAndWhatItRefuses) {
  GraphBuilder b("split");
  b.ret(reduce(OpKind::Sum, b.param("in0", DType::F32, {4, 100000}), {1}, false));
  Graph g = finish(b);
  KernelConfig c;
  c.split_reduction = 8;
  Result<EmittedKernel> k = reduction_emitter().emit(spec_of(g), c, llvmb::Target::nvptx("sm_90a"));
  ASSERT_TRUE(k.ok()) << k.error().str();
  EXPECT_EQ(k->launch.grid[1], 8);
  EXPECT_TRUE(k->launch.zero_outputs);
  Result<std::string> ptx = llvmb::compile_to_ptx(*k->module, "sm_90a");
  ASSERT_TRUE(ptx.ok()) << ptx.error().str();
  EXPECT_TRUE(ptx->find("red.global.add.f32") != std::string::npos || ptx->find("atom.global.add.f32") != std::string::npos)
      << *ptx;
  EXPECT_NE(ptx->find("%ctaid.y"), std::string::npos);
  if (have_ptxas()) {
    EXPECT_EQ(ptxas_failure(*ptx, "sm_90a"), "");
  }
  Result<EmittedKernel> plain = reduction_emitter().emit(spec_of(g), {}, llvmb::Target::nvptx("sm_90a"));
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE(plain->launch.zero_outputs);

  auto refused = [&](const Graph& h) {
    Result<EmittedKernel> r = reduction_emitter().emit(spec_of(h), c, llvmb::Target::nvptx("sm_90a"));
    return r.ok() ? std::string() : r.error().message;
  };
  Graph sm = composite_group(Composite::Softmax, DType::F32, {9, 1000}, -1);
  EXPECT_NE(refused(sm).find("only output is one reduction's result"), std::string::npos) << refused(sm);
  GraphBuilder bm("max");
  bm.ret(reduce(OpKind::Max, bm.param("in0", DType::F32, {4, 100}), {1}, false));
  EXPECT_NE(refused(finish(bm)).find("needs an f32 sum or mean"), std::string::npos);
  GraphBuilder bh("half");
  bh.ret(reduce(OpKind::Sum, bh.param("in0", DType::BF16, {4, 100}), {1}, false));
  EXPECT_NE(refused(finish(bh)).find("needs an f32 sum or mean"), std::string::npos);
  c.split_reduction = 0;
  EXPECT_NE(refused(g).find("split_reduction = 0"), std::string::npos);
}

TEST(ReductionRegistry, EmitterForReductionIsThisEmitter) {
  GraphBuilder b("r");
  b.ret(sum(b.param("x", DType::F32, {4, 4}), {1}));
  Graph g = finish(b);
  Result<EmittedKernel> k = emitter_for(KernelKind::Reduction).emit(spec_of(g), {}, llvmb::Target::host());
  ASSERT_TRUE(k.ok()) << k.error().str();
}

// ---- timings -------------------------------------------------------------------------------

void time_group(const char* what, const Graph& g) {
  using clock = std::chrono::steady_clock;
  auto ms = [](clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); };
  auto t0 = clock::now();
  Result<EmittedKernel> host = reduction_emitter().emit(spec_of(g, "timed_host"), {}, llvmb::Target::host());
  auto t1 = clock::now();
  ASSERT_TRUE(host.ok()) << host.error().str();
  Result<void*> fn = jit().add(std::move(host->module), std::move(host->context), host->entry);
  auto t2 = clock::now();
  ASSERT_TRUE(fn.ok()) << fn.error().str();
  auto t3 = clock::now();
  Result<EmittedKernel> gpu = reduction_emitter().emit(spec_of(g, "timed_gpu"), {}, llvmb::Target::nvptx("sm_90a"));
  auto t4 = clock::now();
  ASSERT_TRUE(gpu.ok()) << gpu.error().str();
  Result<std::string> ptx = llvmb::compile_to_ptx(*gpu->module, "sm_90a");
  auto t5 = clock::now();
  ASSERT_TRUE(ptx.ok()) << ptx.error().str();
  std::printf("%s: host emit %.2f ms, JIT compile %.2f ms; NVPTX emit %.2f ms, compile_to_ptx %.2f ms\n", what,
              ms(t1 - t0), ms(t2 - t1), ms(t4 - t3), ms(t5 - t4));
  testing::Test::RecordProperty("host_emit_ms", std::to_string(ms(t1 - t0)));
  testing::Test::RecordProperty("host_compile_ms", std::to_string(ms(t2 - t1)));
  testing::Test::RecordProperty("ptx_emit_ms", std::to_string(ms(t4 - t3)));
  testing::Test::RecordProperty("ptx_compile_ms", std::to_string(ms(t5 - t4)));
}

TEST(ReductionTiming, SoftmaxEmitAndCompile) {
  time_group("softmax f32[1000, 5000]", composite_group(Composite::Softmax, DType::F32, {1000, 5000}, -1));
}

TEST(ReductionTiming, LayerNormEmitAndCompile) {
  time_group("layer_norm bf16[1000, 5000]", composite_group(Composite::LayerNorm, DType::BF16, {1000, 5000}, 1));
}

}  // namespace kernels_reduction_test
}  // namespace sf
