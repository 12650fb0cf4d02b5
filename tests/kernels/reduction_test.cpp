// The reduction emitter: host kernels (ORC JIT) against the reference evaluator on the
// same group graph; the NVPTX kernel's block algorithm run on the host, one OS thread
// per GPU thread (shuffles and barriers through hooks). The NVPTX kernels through the
// verifier, PTX checks and ptxas are reduction_nvptx_test.cpp's. No GPU is needed.
//
// Groups are built as the fusion pass builds them: params, then primitive ops, then
// outputs; composites come from decompose() on a one-op graph, so the kernel sees
// exactly what fusion hands it.
#include "tests/kernels/reduction_test_util.h"

namespace sf {
namespace kernels_reduction_test {

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
      {"a split row: multi-pass, 4-wide steps", split, 64, 2, false, 4, 0},
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
    if (numel(info->x) <= 50000)
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
      // Outer reductions of long rows: ~64 elements per thread, up to 32 neighbouring
      // rows a block (a warp's lanes on neighbouring rows), blocks up to 1024 threads.
      {{5000, 7}, {0}, 128, 8},
      {{16384, 4096}, {0}, 32, 32},
      {{8, 2048, 4096}, {0, 1}, 32, 32},
      {{1024, 4096}, {0}, 16, 32},
      {{600, 40}, {0}, 16, 32},     // rows of 600: over 512, so 32 rows; 40 rows in 2 blocks
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

}  // namespace kernels_reduction_test
}  // namespace sf
