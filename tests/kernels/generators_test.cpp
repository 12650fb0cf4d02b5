// arange, full, tril and triu computed inside kernels from the element's coordinates
// (pointwise kernels, reduction prologues and epilogues, matmul epilogues) against
// the reference evaluator on the host; log_softmax's reduction kernel; the same
// kernels for NVPTX through ptxas; and whole programs on generated host kernels in
// which the causal mask is never written to memory.
#include <gtest/gtest.h>

#include "tests/kernels/kernel_test_util.h"

#include <limits>
#include <random>
#include <string>
#include <vector>

#include "codegen/ir/builder.h"
#include "codegen/ir/decompose.h"
#include "codegen/ir/parser.h"
#include "codegen/reference/compare.h"
#include "codegen/reference/evaluate.h"
#include "tests/kernels/host_program_check.h"

namespace sf {
namespace kernels_generators_test {

using kernel_test::finish;

constexpr int64_t kMax = std::numeric_limits<int64_t>::max(), kMin = std::numeric_limits<int64_t>::min();

Tensor random_tensor(const TensorType& t, uint64_t seed, double scale = 1.0) {
  Tensor x(t.dtype, t.shape);
  std::mt19937_64 rng(seed);
  for (int64_t i = 0; i < x.numel(); ++i) {
    const uint64_t r = rng();
    if (t.dtype == DType::Bool) x.set_int(i, static_cast<int64_t>(r >> 63));
    else if (is_float(t.dtype)) x.set(i, scale * (-1.0 + 2.0 * static_cast<double>(r >> 11) * 0x1p-53));
    else x.set_int(i, static_cast<int64_t>(r % 2001) - 1000);
  }
  return x;
}

std::vector<Tensor> inputs_of(const Graph& g, uint64_t seed, double scale = 1.0) {
  std::vector<Tensor> in;
  for (size_t i = 0; i < g.params().size(); ++i) in.push_back(random_tensor(g.node(g.params()[i]).type, seed + i, scale));
  return in;
}

Result<std::vector<Tensor>> run_host(KernelKind kind, const Graph& g, const std::vector<Tensor>& in,
                                     const KernelConfig& cfg = {}) {
  return kernel_test::run_emitted(emitter_for(kind).emit(KernelSpec{"gen", kind, g}, cfg, llvmb::Target::host()), g, in);
}

// The host kernel of `kind` for `g` gives the reference's values for `want_of`
// (`g` itself by default; a composite graph whose decomposition `g` is).
void expect_matches(KernelKind kind, const Graph& g, const std::vector<Tensor>& in, const KernelConfig& cfg = {},
                    const Graph* want_of = nullptr) {
  Result<std::vector<Tensor>> want = evaluate(want_of ? *want_of : g, in);
  ASSERT_TRUE(want.ok()) << want.error().str();
  Result<std::vector<Tensor>> got = run_host(kind, g, in, cfg);
  ASSERT_TRUE(got.ok()) << got.error().str();
  ASSERT_EQ(got->size(), want->size());
  for (size_t o = 0; o < want->size(); ++o) {
    const Tensor& w = (*want)[o];
    Comparison c = compare((*got)[o], w, default_tolerance(w.dtype()));
    EXPECT_TRUE(c.ok()) << g.name() << " output " << o << " (" << w.type().str() << "): " << c.mismatches
                        << " mismatch(es), first at " << c.first_mismatch << ": got "
                        << (*got)[o].get(c.first_mismatch) << ", want " << w.get(c.first_mismatch);
  }
}

Value ge(Value a, Value b) { return binary(OpKind::Ge, a, b); }

// The causal mask of `s` positions, torch's arange(s)[:, None] >= arange(s)[None, :].
Value causal(GraphBuilder& b, int64_t s) { return ge(reshape(arange(b, s), {s, 1}), arange(b, s)); }

// ---- pointwise ----------------------------------------------------------------------------

TEST(GeneratorsPointwise, ArangeInEveryDtypeWithNegativeStepsAndLargeValues) {
  for (DType dt : {DType::F32, DType::F16, DType::BF16, DType::I32, DType::I64}) {
    SCOPED_TRACE(std::string(dtype_name(dt)));
    GraphBuilder b("arange");
    b.ret(arange(b, 40, -3, 1, dt));   // 43 values
    b.ret(arange(b, -250, 51, -7, dt));  // 43 values, stepping down
    b.ret(cast(full(b, {43}, -3.0, dt), DType::F32));
    Graph g = finish(b);
    expect_matches(KernelKind::Pointwise, g, {});
  }
  // Values an f32 or bf16 cannot hold exactly round once, as a cast of the int64 does
  // (bf16 through round-to-odd, not twice through f32).
  for (DType dt : {DType::F32, DType::BF16, DType::F16, DType::I64}) {
    GraphBuilder b("big");
    const int64_t start = dt == DType::F16 ? 60000 : (int64_t{1} << 40) + 16842753;
    b.ret(arange(b, start + 2 * 37, start, 2, dt));
    b.ret(arange(b, kMax, kMax - 370, 10, dt == DType::F16 ? DType::F32 : dt));  // up to INT64_MAX - 10
    Graph g = finish(b);
    expect_matches(KernelKind::Pointwise, g, {});
  }
}

TEST(GeneratorsPointwise, FullInEveryDtypeAndFoldedIntoItsUser) {
  for (DType dt : {DType::F32, DType::F16, DType::BF16, DType::I32, DType::I64, DType::Bool}) {
    GraphBuilder b("full");
    Value x = b.param("x", DType::F32, {5, 37});
    b.ret(full(b, {5, 37}, is_float(dt) ? 0.1 : -3.0, dt));  // 0.1 rounded to dt once
    b.ret(x + cast(full(b, {37}, 2.0, dt), DType::F32));
    Graph g = finish(b);
    expect_matches(KernelKind::Pointwise, g, inputs_of(g, 1));
  }
}

TEST(GeneratorsPointwise, TrilAndTriuOverTheLastTwoDimsAndThroughViews) {
  for (DType dt : {DType::F32, DType::BF16, DType::I64, DType::Bool}) {
    SCOPED_TRACE(std::string(dtype_name(dt)));
    GraphBuilder b("tri");
    Value x = b.param("x", dt, {3, 37, 7});
    for (int64_t d : {int64_t{0}, int64_t{1}, int64_t{-2}, int64_t{6}, int64_t{-36}, int64_t{40}, int64_t{-40}, kMax, kMin}) {
      b.ret(tril(x, d));
      b.ret(triu(x, d));
    }
    b.ret(tril(transpose(x, -1, -2), 2));   // the mask follows the transposed coordinates
    b.ret(transpose(triu(x, -1), 0, 2));    // and a view of a masked value
    b.ret(triu(expand(b.param("row", dt, {1, 7}), {3, 37, 7}), -5));  // of a broadcast
    b.ret(tril(reshape(x, {7, 37, 3}), 1));
    Graph g = finish(b);
    expect_matches(KernelKind::Pointwise, g, inputs_of(g, 2));
  }
}

TEST(GeneratorsPointwise, CausalMasksFromArangeOrTriuFull) {
  GraphBuilder b("mask");
  Value x = b.param("x", DType::F32, {2, 3, 9, 9});
  b.ret(where(causal(b, 9), x, b.constant(-1e9)));
  b.ret(x + triu(full(b, {9, 9}, -1e9), 1));
  b.ret(where(binary(OpKind::Eq, tril(full(b, {9, 9}, 1.0)), b.constant(0.0)), b.constant(-1e9), x));
  Graph g = finish(b);
  std::vector<Tensor> in = inputs_of(g, 3);
  expect_matches(KernelKind::Pointwise, g, in);
  // The three forms are the same mask.
  Result<std::vector<Tensor>> out = run_host(KernelKind::Pointwise, g, in);
  ASSERT_TRUE(out.ok());
  for (int64_t i = 0; i < (*out)[0].numel(); ++i) {
    EXPECT_EQ((*out)[0].get(i), (*out)[1].get(i) < -1e8 ? -1e9 : (*out)[0].get(i)) << i;
    EXPECT_EQ((*out)[0].get(i), (*out)[2].get(i)) << i;
  }
  // Vectorised and interleaved host loops compute the same coordinates.
  for (auto [v, il] : {std::pair{4, 1}, std::pair{8, 2}, std::pair{1, 4}}) {
    KernelConfig cfg;
    cfg.host_vector = v;
    cfg.host_interleave = il;
    expect_matches(KernelKind::Pointwise, g, in, cfg);
  }
}

// ---- reduction and matmul kernels -------------------------------------------------------------

TEST(GeneratorsReduction, SoftmaxOfMaskedScoresAndLogSoftmaxInOneKernelEach) {
  for (DType dt : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(std::string(dtype_name(dt)));
    GraphBuilder b("masked_softmax");
    Value x = b.param("x", dt, {2, 3, 9, 9});
    b.ret(softmax(where(causal(b, 9), x, b.constant(-1e9)), -1));
    Graph composite = finish(b);
    Graph g = decompose(composite);
    expect_matches(KernelKind::Reduction, g, inputs_of(g, 4, 3.0), {}, &composite);

    // log_softmax of masked scores along the query dim: the masked positions (about
    // -1e9, where softmax underflows to 0) stay finite.
    GraphBuilder c("log_softmax");
    c.ret(log_softmax(where(causal(c, 33), c.param("s", dt, {33, 33}), c.constant(-1e9)), 0));
    Graph lcomposite = finish(c);
    Graph lg = decompose(lcomposite);
    expect_matches(KernelKind::Reduction, lg, inputs_of(lg, 5, 1000.0), {}, &lcomposite);
  }
}

TEST(GeneratorsReduction, LogSoftmaxIsStableAndComputesExpOncePerElement) {
  GraphBuilder b("log_softmax");
  Value y = b.param("y", DType::F32, {6, 33});
  b.ret(log_softmax(y, -1));
  Graph composite = finish(b);
  Graph g = decompose(composite);
  int exps = 0;
  for (const Node& n : g.nodes()) exps += n.op == OpKind::Exp;
  EXPECT_EQ(exps, 1);
  std::vector<Tensor> in = inputs_of(g, 6, 1000.0);
  expect_matches(KernelKind::Reduction, g, in, {}, &composite);
  Result<std::vector<Tensor>> got = run_host(KernelKind::Reduction, g, in);
  ASSERT_TRUE(got.ok());
  for (int64_t i = 0; i < (*got)[0].numel(); ++i) ASSERT_TRUE(std::isfinite((*got)[0].get(i))) << i;
  // One exp a row element, in the sum's pass: the output pass needs x - max and the
  // row's log, not exp again (softmax's output pass divides exp(x - max) by the sum,
  // and the host kernel computes that exp a second time there).
  Result<EmittedKernel> k = emitter_for(KernelKind::Reduction).emit(KernelSpec{"ls", KernelKind::Reduction, g}, {},
                                                                    llvmb::Target::host());
  ASSERT_TRUE(k.ok()) << k.error().str();
  std::string ir = kernel_test::module_text(*k->module);
  auto count = [&](const std::string& what) {
    int n = 0;
    for (size_t at = ir.find(what); at != std::string::npos; at = ir.find(what, at + 1)) ++n;
    return n;
  };
  const int calls = count("call float @expf("), logs = count("call float @logf(");
  EXPECT_EQ(calls, 1) << ir;
  EXPECT_EQ(logs, 1) << ir;
}

TEST(GeneratorsMatmul, CausalMaskInTheEpilogue) {
  GraphBuilder b("mm_mask");
  Value q = b.param("q", DType::F32, {2, 9, 5});
  Value k = b.param("k", DType::F32, {2, 5, 9});
  Value s = matmul(q, k) * 0.5;
  b.ret(where(causal(b, 9), s, b.constant(-1e9)));
  b.ret(s + triu(full(b, {9, 9}, -1e9), 1));
  b.ret(tril(s + cast(arange(b, 9), DType::F32), -1));
  Graph g = finish(b);
  expect_matches(KernelKind::Matmul, g, inputs_of(g, 7));
}

// ---- NVPTX -----------------------------------------------------------------------------------

TEST(GeneratorsNvptx, KernelsOfEveryKindAssembleAndAGeneratorReadsNoMemory) {
  GraphBuilder b("gen_only");
  b.ret(where(causal(b, 37), triu(full(b, {37, 37}, 1.5), -2), b.constant(-1e9)));
  Graph only = finish(b);
  GraphBuilder r("masked_softmax");
  Value x = r.param("x", DType::BF16, {2, 9, 9});
  r.ret(softmax(where(causal(r, 9), x, r.constant(-1e9)), -1));
  r.ret(log_softmax(x, -1));
  Graph red = decompose(finish(r));
  GraphBuilder m("mm_mask");
  Value s = matmul(m.param("q", DType::F32, {2, 9, 5}), m.param("k", DType::F32, {2, 5, 9}));
  m.ret(tril(s, 0) + cast(arange(m, 9, 0, 1, DType::I32), DType::F32));
  Graph mm = finish(m);
  // bf16 takes the tensor cores (mma.sync on sm_80, wgmma on sm_90a): the same epilogue.
  GraphBuilder t("mma_mask");
  Value st = matmul(t.param("q", DType::BF16, {2, 32, 16}), t.param("k", DType::BF16, {2, 16, 32}));
  t.ret(where(causal(t, 32), st, t.constant(-1e9)));
  Graph mma = finish(t);
  const std::pair<KernelKind, const Graph*> kernels[] = {
      {KernelKind::Pointwise, &only}, {KernelKind::Reduction, &red}, {KernelKind::Matmul, &mm}, {KernelKind::Matmul, &mma}};
  for (const char* arch : {"sm_80", "sm_90a"})
    for (const auto& [kind, g] : kernels) {
      SCOPED_TRACE(std::string(arch) + " " + g->name());
      Result<std::string> ptx = kernel_test::ptx_of(kind, *g, arch);
      ASSERT_TRUE(ptx.ok()) << ptx.error().str();
      EXPECT_EQ(ptx->find("call"), std::string::npos) << "a call is left in the PTX";
      if (kind == KernelKind::Pointwise) {
        EXPECT_EQ(ptx->find("ld.global"), std::string::npos) << "a generated value was read from memory";
        EXPECT_NE(ptx->find("st.global"), std::string::npos);
      }
      if (g == &mma) {
        EXPECT_NE(ptx->find("mma"), std::string::npos) << "no tensor-core instruction";
      }
      if (kernel_test::have_ptxas()) {
        EXPECT_EQ(kernel_test::ptxas_failure(*ptx, arch), "");
      }
    }
}

// ---- whole programs -------------------------------------------------------------------------

// Runs g on generated host kernels on every rank against the reference; rank 0's program.
LocalProgram run_and_check(const Graph& g, uint64_t seed, const std::string& what) {
  return kernel_test::check_on_host_kernels(g, seed, what)[0];
}

// Every kernel reads memory (a param): none only writes a generated value.
void expect_no_materialised_generator(const LocalProgram& p, const std::string& what) {
  for (const LocalKernel& k : p.kernels) {
    bool generates = false;
    for (const Node& n : k.group.nodes()) generates = generates || op_info(n.op).category == OpCategory::Generator;
    if (generates) {
      EXPECT_FALSE(k.group.params().empty()) << what << ": kernel " << k.name << " only writes a generated value";
    }
  }
}

// On 3 ranks the 4 heads split 2, 2, 0 (2, 3 and 4 ranks run through the CLI in
// tests/tools/generators_cli_test.cpp).
TEST(GeneratorsPrograms, CausalAttentionOnGeneratedKernelsWithUnevenHeads) {
  Result<Graph> g = parse_file(std::string(SF_SOURCE_DIR) + "/examples/causal_attention.sf");
  ASSERT_TRUE(g.ok()) << g.error().str();
  Result<Graph> w = remesh(*g, Mesh{{{"tp", 3}}});
  ASSERT_TRUE(w.ok()) << w.error().str();
  expect_no_materialised_generator(run_and_check(*w, 43, "causal_attention on 3 ranks"), "3 ranks");
}

TEST(GeneratorsPrograms, ShardedGeneratorsTrilOfShardedMatricesAndSequenceParallelMasks) {
  const char* texts[] = {
      // Rows and columns of the masked matrix sharded: each rank shifts the diagonal.
      "mesh dp=2 tp=2\ngraph g(x: f32[7, 9] {dp: S(0), tp: S(1)}) {\n"
      "  y = add(tril(x, diagonal=2), triu(x, diagonal=-3))\n  return y\n}\n",
      // Scores sharded along the query rows (sequence parallel): each rank builds its
      // rows of the mask.
      "mesh tp=3\ngraph g(s: f32[2, 10, 10] {tp: S(1)}) {\n"
      "  m = where(ge(reshape(arange(10), shape=[10, 1]), arange(10)), s, -1e9)\n"
      "  p = softmax(m, dim=-1)\n  return p {tp: S(1)}\n}\n",
      // A generated operand of a sharded add, built per rank.
      "mesh tp=4\ngraph g(x: i64[6, 5] {tp: S(1)}) {\n  y = add(x, arange(5, start=-5, step=2))\n  return y\n}\n",
  };
  uint64_t seed = 60;
  for (const char* text : texts) {
    Result<Graph> g = parse_graph(text, "g.sf");
    ASSERT_TRUE(g.ok()) << g.error().str();
    expect_no_materialised_generator(run_and_check(*g, seed++, text), text);
  }
}

}  // namespace kernels_generators_test
}  // namespace sf
