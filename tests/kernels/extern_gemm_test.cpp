// Library GEMMs in place of generated matmul kernels (codegen/kernels/extern_gemm.h):
// which fused groups cuBLASLt can express and the exact call derived for each, a
// cached library winner compiled into a Plan gemm step, and that step run by `exec`
// on the fake driver and the fake cuBLAS (tests/fake_cublas: its GEMMs compute, from
// cuBLAS's column-major definition, so `--check` judges our layout mapping).
#include "codegen/kernels/extern_gemm.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "codegen/dist/propagate.h"
#include "codegen/fusion/pipeline.h"
#include "codegen/ir/parser.h"
#include "codegen/kernels/compile_plan.h"
#include "codegen/kernels/host_runner.h"
#include "runtime/gpu/cublas.h"
#include "autotune/cuda_runner.h"
#include "tests/kernels/extern_test_util.h"
#include "tests/tools/cli_util.h"

namespace sf {
namespace kernels_extern_gemm_test {

using namespace kernels_extern_test_util;

struct Want {
  std::string what, params, body;
  // The call, in our row-major terms (runtime/gpu/gemm.h), and the params it reads.
  int64_t m, n, k, batch;
  bool trans_a;
  int64_t lda;
  bool trans_b;
  int64_t ldb, stride_a, stride_b;
  GemmEpilogue epilogue;
  std::string a, b, bias;
};

TEST(ExternGemm, DerivesTheCallForEachLayout) {
  using E = GemmEpilogue;
  const std::vector<Want> cases = {
      {"x @ w", "x: f32[64, 32], w: f32[32, 48]", "matmul(x, w)", 64, 48, 32, 1, false, 32, false, 48, 0, 0, E::None,
       "x", "w", ""},
      {"x @ w^T (nn.Linear)", "x: f32[64, 32], w: f32[48, 32]", "matmul(x, transpose(w, 0, 1))", 64, 48, 32, 1, false,
       32, true, 32, 0, 0, E::None, "x", "w", ""},
      {"a^T @ w", "a: f32[32, 64], w: f32[32, 48]", "matmul(transpose(a, 0, 1), w)", 64, 48, 32, 1, true, 64, false,
       48, 0, 0, E::None, "a", "w", ""},
      {"batched", "x: f32[4, 64, 32], w: f32[4, 32, 48]", "matmul(x, w)", 64, 48, 32, 4, false, 32, false, 48,
       64 * 32, 32 * 48, E::None, "x", "w", ""},
      {"batched, B broadcast", "x: bf16[4, 64, 32], w: bf16[32, 48]", "matmul(x, w)", 64, 48, 32, 4, false, 32, false,
       48, 64 * 32, 0, E::None, "x", "w", ""},
      {"batched, B transposed", "x: f32[4, 64, 32], w: f32[4, 48, 32]", "matmul(x, transpose(w, 1, 2))", 64, 48, 32, 4,
       false, 32, true, 32, 64 * 32, 48 * 32, E::None, "x", "w", ""},
      {"two batch dims", "x: f32[2, 3, 8, 16], w: f32[2, 3, 16, 8]", "matmul(x, w)", 8, 8, 16, 6, false, 16, false, 8,
       128, 128, E::None, "x", "w", ""},
      {"A a permuted view (heads first)", "q: f32[64, 4, 32], w: f32[4, 32, 48]", "matmul(permute(q, [1, 0, 2]), w)",
       64, 48, 32, 4, false, 128, false, 48, 32, 32 * 48, E::None, "q", "w", ""},
      {"bias", "x: f32[64, 32], w: f32[48, 32], b: f32[48]", "add(matmul(x, transpose(w, 0, 1)), b)", 64, 48, 32, 1,
       false, 32, true, 32, 0, 0, E::Bias, "x", "w", "b"},
      {"bias first", "x: f32[64, 32], w: f32[48, 32], b: f32[1, 48]", "add(b, matmul(x, transpose(w, 0, 1)))", 64, 48,
       32, 1, false, 32, true, 32, 0, 0, E::Bias, "x", "w", "b"},
      {"relu", "x: f32[64, 32], w: f32[32, 48]", "relu(matmul(x, w))", 64, 48, 32, 1, false, 32, false, 48, 0, 0,
       E::Relu, "x", "w", ""},
      {"bias + relu", "x: f32[64, 32], w: f32[48, 32], b: f32[48]", "relu(add(matmul(x, transpose(w, 0, 1)), b))", 64,
       48, 32, 1, false, 32, true, 32, 0, 0, E::BiasRelu, "x", "w", "b"},
      {"gelu_tanh", "x: f32[64, 32], w: f32[32, 48]", "gelu_tanh(matmul(x, w))", 64, 48, 32, 1, false, 32, false, 48,
       0, 0, E::GeluTanh, "x", "w", ""},
      {"bias + gelu_tanh, f32", "x: f32[64, 32], w: f32[48, 32], b: f32[48]",
       "gelu_tanh(add(matmul(x, transpose(w, 0, 1)), b))", 64, 48, 32, 1, false, 32, true, 32, 0, 0, E::BiasGeluTanh,
       "x", "w", "b"},
      {"bias + gelu_tanh, bf16 (casts to f32 and back)", "x: bf16[64, 32], w: bf16[48, 32], b: bf16[48]",
       "gelu_tanh(add(matmul(x, transpose(w, 0, 1)), b))", 64, 48, 32, 1, false, 32, true, 32, 0, 0, E::BiasGeluTanh,
       "x", "w", "b"},
  };
  for (const Want& w : cases) {
    const Matmul mm = matmul_of(graph(w.params, w.body));
    const LocalKernel& k = mm.k;
    auto param_name = [&](int i) { return i < 0 ? std::string() : mm.reads.at(static_cast<size_t>(i)); };
    Result<ExternGemm> x = extern_gemm(k);
    ASSERT_TRUE(x) << w.what << ": " << x.error().message;
    const GemmDesc& d = x->desc;
    EXPECT_EQ(d.library, GemmLibrary::CublasLt) << w.what;
    EXPECT_EQ(d.m, w.m) << w.what;
    EXPECT_EQ(d.n, w.n) << w.what;
    EXPECT_EQ(d.k, w.k) << w.what;
    EXPECT_EQ(d.batch, w.batch) << w.what;
    EXPECT_EQ(d.trans_a, w.trans_a) << w.what;
    EXPECT_EQ(d.lda, w.lda) << w.what;
    EXPECT_EQ(d.trans_b, w.trans_b) << w.what;
    EXPECT_EQ(d.ldb, w.ldb) << w.what;
    EXPECT_EQ(d.ldc, w.n) << w.what;
    if (w.batch > 1) {
      EXPECT_EQ(d.stride_a, w.stride_a) << w.what;
      EXPECT_EQ(d.stride_b, w.stride_b) << w.what;
    }
    EXPECT_EQ(d.stride_c, w.m * w.n) << w.what;
    EXPECT_EQ(d.epilogue, w.epilogue) << w.what << ": " << gemm_epilogue_name(d.epilogue);
    EXPECT_EQ(param_name(x->a), w.a) << w.what;
    EXPECT_EQ(param_name(x->b), w.b) << w.what;
    EXPECT_EQ(param_name(x->bias), w.bias) << w.what;
    EXPECT_EQ(x->c, 0);
    const bool bare = w.epilogue == E::None;
    EXPECT_EQ(x->libraries.size(), bare ? 2u : 1u) << w.what << ": cuBLAS's GemmEx only without an epilogue";
    // The call fits the kernel's own arguments.
    std::vector<TensorType> in = {k.group.node(k.group.params()[static_cast<size_t>(x->a)]).type,
                                  k.group.node(k.group.params()[static_cast<size_t>(x->b)]).type};
    if (x->bias >= 0) in.push_back(k.group.node(k.group.params()[static_cast<size_t>(x->bias)]).type);
    std::optional<GemmIssue> why = gemm_check(d, in, k.group.node(k.group.outputs()[0].value).type);
    EXPECT_FALSE(why) << w.what << ": " << why->field << ": " << why->message;
  }
}

TEST(ExternGemm, SaysWhyALibraryCannotExpressAGroup) {
  struct Case {
    std::string what, params, body, says;
  };
  const std::vector<Case> cases = {
      {"the erf gelu", "x: f32[64, 32], w: f32[48, 32], b: f32[48]", "gelu(add(matmul(x, transpose(w, 0, 1)), b))",
       "erf form"},
      {"a residual add", "x: f32[64, 32], w: f32[32, 48], r: f32[64, 48]", "add(matmul(x, w), r)",
       "the epilogue is not one of"},
      {"a bias along M", "x: f32[64, 32], w: f32[32, 48], c: f32[64, 1]", "add(matmul(x, w), c)",
       "the epilogue is not one of"},
      {"relu before the bias", "x: f32[64, 32], w: f32[32, 48], b: f32[48]", "add(relu(matmul(x, w)), b)",
       "the epilogue is not one of"},
      {"a scale", "x: f32[64, 32], w: f32[32, 48]", "mul(matmul(x, w), 0.5)", "the epilogue is not one of"},
      {"a cast to f16", "x: f32[64, 32], w: f32[32, 48]", "cast(matmul(x, w), dtype=f16)", "the output is f16"},
      {"an integer matmul", "x: i32[64, 32], w: i32[32, 48]", "matmul(x, w)", "i32"},
      {"batch dims broadcast unevenly", "x: f32[2, 3, 8, 16], w: f32[3, 16, 8]", "matmul(x, w)",
       "do not collapse to one batch stride"},
  };
  for (const Case& c : cases) {
    Result<ExternGemm> x = extern_gemm(matmul_kernel(graph(c.params, c.body)));
    ASSERT_FALSE(x) << c.what;
    EXPECT_EQ(x.error().message.rfind("cuBLASLt cannot express it: ", 0), 0u) << c.what << ": " << x.error().message;
    EXPECT_NE(x.error().message.find(c.says), std::string::npos) << c.what << ": " << x.error().message;
  }
  // Two outputs: the matmul's own result and its relu.
  Result<ExternGemm> two = extern_gemm(matmul_kernel(
      "graph g(x: f32[64, 32], w: f32[32, 48]) {\n  h = matmul(x, w)\n  y = relu(h)\n  return h, y\n}\n"));
  ASSERT_FALSE(two);
  EXPECT_NE(two.error().message.find("writes 2 outputs"), std::string::npos) << two.error().message;
}

// What tune_programs hands the tuner: one GemmArtifact per library that can compute
// the kernel and opens here, or a note saying why none.
TEST(ExternGemm, CandidatesAreOnePerLibraryThatCanComputeTheKernel) {
  std::string note;
  const LocalKernel bare = matmul_kernel(graph("x: f32[64, 32], w: f32[32, 48]", "matmul(x, w)"));
  std::vector<ExternCandidate> c = extern_candidates(bare, /*allow_tf32=*/true, &note);
  Result<const cublas::Api*> api = cublas::api();
  if (!api) {
    EXPECT_TRUE(c.empty());
    EXPECT_EQ(note, "no library GEMM measured: " + api.error().message);
  } else {
    const bool lt = (*api)->lt_error.empty();
    ASSERT_EQ(c.size(), lt ? 2u : 1u) << note;
    EXPECT_EQ(c.back().library, "cublas");
    EXPECT_EQ(c.back().version, (*api)->version());
    const auto* g = dynamic_cast<const GemmArtifact*>(c.back().artifact.get());
    ASSERT_NE(g, nullptr);
    EXPECT_EQ(g->desc.library, GemmLibrary::Cublas);
    EXPECT_TRUE(g->desc.tf32) << "an f32 GEMM under --allow-tf32 multiplies in TF32, as the kernels then do";
    EXPECT_EQ(g->a, 0);
    EXPECT_EQ(g->b, 1);
    EXPECT_EQ(g->bias, -1);
    if (lt) {
      EXPECT_EQ(c.front().library, "cublaslt");
    }
    EXPECT_EQ(note.rfind(lt ? "library GEMM(s) measured: cublaslt, cublas (" : "library GEMM(s) measured: cublas (", 0),
              0u)
        << note;
  }
  // A group no library can compute whole: no whole-group candidate, and the reason
  // (the library GEMM + epilogue kernel pairs it may get instead: extern_epilogue_test.cpp).
  c = extern_candidates(matmul_kernel(graph("x: f32[64, 32], w: f32[32, 48]", "mul(matmul(x, w), 0.5)")), false, &note);
  for (const ExternCandidate& x : c) EXPECT_NE(x.library.find("+epilogue"), std::string::npos) << x.library;
  EXPECT_EQ(note.rfind("no library GEMM: cuBLASLt cannot express it: the epilogue is not one of", 0), 0u) << note;
}

// The split tuner's libraries are the GPU machine's: the candidates carry the
// versions it recorded, cuBLASLt is left out where it had none (saying why), and a
// machine without cuBLAS gets no candidate, whatever this machine has.
TEST(ExternGemm, CandidatesCarryTheGivenLibrariesVersions) {
  std::string note;
  const LocalKernel bare = matmul_kernel(graph("x: f32[64, 32], w: f32[32, 48]", "matmul(x, w)"));
  const GemmLibraries there{"", "cuBLAS 130100 (there)", "cublasLt 130100 (there)", ""};
  std::vector<ExternCandidate> c = extern_candidates(bare, false, &note, "sm_90a", &there);
  ASSERT_EQ(c.size(), 2u) << note;
  EXPECT_EQ(c[0].library, "cublaslt");
  EXPECT_EQ(c[0].version, "cublasLt 130100 (there)");
  EXPECT_EQ(c[1].version, "cuBLAS 130100 (there)");
  const GemmLibraries no_lt{"", "cuBLAS 130100 (there)", "", "cannot open libcublasLt.so.13 there"};
  c = extern_candidates(bare, false, &note, "sm_90a", &no_lt);
  ASSERT_EQ(c.size(), 1u) << note;
  EXPECT_EQ(c[0].library, "cublas");
  EXPECT_NE(note.find("cannot open libcublasLt.so.13 there"), std::string::npos) << note;
  const GemmLibraries none{"no cuBLAS on that machine", "", "", ""};
  EXPECT_TRUE(extern_candidates(bare, false, &note, "sm_90a", &none).empty());
  EXPECT_EQ(note, "no library GEMM measured: no cuBLAS on that machine");
}

TEST(ExternGemm, ChoicesCarryTheLibraryAcrossRanks) {
  std::map<std::string, KernelChoice> t;
  t["00aa"] = KernelChoice{KernelConfig{}, ConfigSource::Tuned, extern_config_str("cublaslt"), "cublaslt"};
  t["00bb"] = KernelChoice{KernelConfig{}, ConfigSource::Cache, "block_m=32", ""};
  Result<std::map<std::string, KernelChoice>> back = choices_from_text(choices_to_text(t));
  ASSERT_TRUE(back) << back.error().message;
  EXPECT_EQ(back->at("00aa").library, "cublaslt");
  EXPECT_EQ(back->at("00aa").text, "extern=cublaslt");
  EXPECT_EQ(back->at("00bb").library, "");
  EXPECT_EQ(back->at("00bb").config.block_m, 32);
}

// --- compile: the cache's library winner becomes a gemm step -----------------------------

const std::string kLinear = graph("x: f32[64, 32], w: f32[48, 32], b: f32[48]",
                                  "relu(add(matmul(x, transpose(w, 0, 1)), b))");

TEST(ExternGemmCompile, ACachedLibraryWinnerBecomesAGemmStepWithoutPtx) {
  TempCache c;
  c.store(kLinear, 10, "cublaslt", 4);
  Result<CompiledPlan> p = c.compile(kLinear);
  ASSERT_TRUE(p) << p.error().message;
  EXPECT_TRUE(p->plan.kernels.empty()) << "no PTX kernel for a library GEMM";
  EXPECT_TRUE(p->ptx.empty());
  const PlanRank& r = p->plan.ranks[0];
  ASSERT_EQ(r.steps.size(), 1u);
  const PlanStep& s = r.steps[0];
  EXPECT_EQ(s.op, "gemm");
  EXPECT_EQ(s.stream, "compute");
  EXPECT_EQ(s.gemm.name, "k0_matmul_add_relu");
  auto name = [&](int b) { return r.buffers[static_cast<size_t>(b)].name; };
  ASSERT_EQ(s.in.size(), 3u);
  EXPECT_EQ(name(s.in[0]), "x");
  EXPECT_EQ(name(s.in[1]), "w");
  EXPECT_EQ(name(s.in[2]), "b");
  ASSERT_EQ(s.out.size(), 1u);
  EXPECT_EQ(s.out[0], r.outputs[0]);
  EXPECT_EQ(gemm_str(s.gemm.desc), "cublaslt f32 [64x48x32] A [M,K] lda 32, B^T [N,K] ldb 32, epilogue bias_relu");
  EXPECT_NE(p->report.find("library GEMMs"), std::string::npos) << p->report;
  EXPECT_NE(p->report.find("k0_matmul_add_relu: cublaslt f32 [64x48x32]"), std::string::npos) << p->report;
  Result<Plan> back = plan_from_json(plan_to_json(p->plan), "plan.json");
  ASSERT_TRUE(back) << back.error().str();
  EXPECT_EQ(back->ranks[0].steps[0].gemm.desc, s.gemm.desc);
}

TEST(ExternGemmCompile, TheKernelStaysWhenAConfigIsFasterOrTheLibraryCannotComputeIt) {
  {
    TempCache c;
    c.store(kLinear, 3, "cublaslt", 4);
    Result<CompiledPlan> p = c.compile(kLinear);
    ASSERT_TRUE(p) << p.error().message;
    ASSERT_EQ(p->plan.kernels.size(), 1u);
    EXPECT_EQ(p->plan.ranks[0].steps[0].op, "kernel");
    EXPECT_EQ(p->plan.kernels[0].config_source, "cache");
    EXPECT_EQ(p->plan.kernels[0].config.rfind("block_m=32 ", 0), 0u);
  }
  {
    // A cache that says cuBLAS won a group with an epilogue (hand-made: GemmEx has none).
    TempCache c;
    c.store(kLinear, 10, "cublas", 4);
    Result<CompiledPlan> p = c.compile(kLinear);
    ASSERT_TRUE(p) << p.error().message;
    ASSERT_EQ(p->plan.kernels.size(), 1u);
    EXPECT_EQ(p->plan.ranks[0].steps[0].op, "kernel");
    EXPECT_EQ(p->plan.kernels[0].config_source, "default");
    EXPECT_NE(p->report.find("cublas cannot compute its epilogue bias_relu; compiled as a generated kernel"),
              std::string::npos)
        << p->report;
  }
}

TEST(ExternGemmCli, ExplainSaysWhetherAMatmulIsOfferedToTheLibraryAndWhyNot) {
  TempCache c;
  const std::string lin = c.dir() + "/lin.sf", erf = c.dir() + "/erf.sf";
  write_file(lin, kLinear);
  write_file(erf, graph("x: bf16[64, 32], w: bf16[48, 32], b: bf16[48]", "gelu(add(matmul(x, transpose(w, 0, 1)), b))"));
  CliResult r = c.explain_cuda(lin);
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("    library GEMM: offered to the tuner: cublaslt f32 [64x48x32] A [M,K] lda 32, B^T [N,K] ldb 32, "
                       "epilogue bias_relu\n"),
            std::string::npos)
      << r.out;
  CliResult e = c.explain_cuda(erf);
  EXPECT_EQ(e.code, 0) << e.out;
  EXPECT_NE(e.out.find("    library GEMM: cuBLASLt cannot express it: the epilogue's gelu is the erf form"), std::string::npos)
      << e.out;
  // With a cached library winner, the kernel's choice is the library.
  c.store(kLinear, 10, "cublaslt", 4);
  CliResult w = c.explain_cuda(lin);
  EXPECT_NE(w.out.find("k0_matmul_add_relu: extern=cublaslt  [cache]"), std::string::npos) << w.out;
}

// --- exec on the fake driver and the fake cuBLAS -------------------------------------------

#if defined(SF_FAKE_CUDA) && defined(SF_FAKE_CUBLAS)

// `text` written to a file and compiled by the CLI against a cache where the
// library beat the generated config: the Plan directory (its one gemm step checked).
std::string compiled_with_library_winner(TempCache& c, const std::string& text) {
  c.store(text, 10, "cublaslt", 4);
  const std::string g = c.dir() + "/g.sf", plan = c.dir() + "/plan";
  write_file(g, text);
  CliResult r = shardfuse("compile " + g + " --no-ptxas --cache " + c.dir() + "/cache -o " + plan);
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("1 library GEMM step(s)"), std::string::npos) << r.out;
  return plan;
}

TEST(ExternGemmExec, CompileFromTheCacheThenExecCallsTheLibraryAndChecks) {
  TempCache c;
  const std::string plan = compiled_with_library_winner(c, kLinear), log = c.dir() + "/log";
  CliResult r = shardfuse_env(fakes(log), "exec " + plan + " --device cuda --check");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("library GEMMs: 1 call(s)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("check: ok"), std::string::npos) << "the fake cuBLAS computed y from x, w and b:\n" << r.out;
  // cuBLAS sees C^T = op(w stored [N, K]) x x^T: m = N, n = M, w transposed, ld K.
  const std::string calls = read_text(log);
  EXPECT_NE(calls.find("cublasLtMatmul m=48 n=64 k=32 batch=1 transa=T transb=N lda=32 ldb=32 ldc=48 "),
            std::string::npos)
      << calls;
  EXPECT_NE(calls.find("epilogue=bias_relu compute=32F workspace=33554432"), std::string::npos) << calls;

  // The check has teeth: B read as [K, N] (still inside its buffer) multiplies the
  // wrong elements, and the outputs no longer match.
  std::string j = read_text(plan + "/plan.json");
  const size_t at = j.find("\"trans_b\": true");
  ASSERT_NE(at, std::string::npos);
  j.replace(at, 15, "\"trans_b\": false");
  j.replace(j.find("\"ldb\": 32"), 9, "\"ldb\": 48");
  write_file(plan + "/plan.json", j);
  CliResult wrong = shardfuse_env(fakes(log), "exec " + plan + " --device cuda --check");
  EXPECT_EQ(wrong.code, 1) << wrong.out;
  EXPECT_NE(wrong.out.find("check: MISMATCH"), std::string::npos) << wrong.out;
}

TEST(ExecGemm, AMissingLibraryIsAnErrorNamingTheStep) {
  TempCache c;
  const std::string plan = compiled_with_library_winner(c, kLinear), log = c.dir() + "/log";
  const std::string step = "rank 0, step 0 (gemm k0_matmul_add_relu via cublaslt): cuBLAS not available: ";
  CliResult none = shardfuse_env(fakes(log, false) + " SHARDFUSE_LIBCUBLAS=/nonexistent/libcublas.so.13",
                                 "exec " + plan + " --device cuda");
  EXPECT_EQ(none.code, 1) << none.out;
  EXPECT_NE(none.out.find(step + "cannot open libcublas"), std::string::npos) << none.out;
  // The fake driver with the system's cuBLAS: refused, since that cuBLAS would use
  // libcuda.so.1's contexts and pointers.
  CliResult foreign = shardfuse_env(fakes(log, false), "exec " + plan + " --device cuda");
  EXPECT_EQ(foreign.code, 1) << foreign.out;
  EXPECT_NE(foreign.out.find(step + "$SHARDFUSE_LIBCUDA="), std::string::npos) << foreign.out;
  EXPECT_NE(foreign.out.find("is not libcuda.so.1"), std::string::npos) << foreign.out;
}

TEST(ExecGemm, CudaGraphsEndBeforeAGemmStepWhichRunsBetweenThem) {
  // A pointwise kernel, the matmul (a gemm step) and a reduction: two captured
  // segments with the library call between their replays.
  const std::string text =
      "graph g(x: f32[64, 32], w: f32[48, 32], b: f32[48]) {\n  x2 = mul(x, 2.0)\n"
      "  h = relu(add(matmul(x2, transpose(w, 0, 1)), b))\n  y = sum(h, dims=[1])\n  return y\n}\n";
  TempCache c;
  const std::string plan = compiled_with_library_winner(c, text), log = c.dir() + "/log";
  CliResult r = shardfuse_env(fakes(log), "exec " + plan + " --device cuda --cuda-graph");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("replayed from 2 CUDA graph launch(es)"), std::string::npos) << r.out;
  // In the log: the first graph's replay, then the library call, then the second.
  const std::string calls = read_text(log);
  const size_t first = calls.find("graph launch");
  const size_t gemm = calls.find("cublasLtMatmul");
  const size_t second = calls.find("graph launch", first + 1);
  ASSERT_NE(first, std::string::npos) << calls;
  ASSERT_NE(gemm, std::string::npos) << calls;
  ASSERT_NE(second, std::string::npos) << calls;
  EXPECT_LT(first, gemm) << calls;
  EXPECT_LT(gemm, second) << calls;
  EXPECT_EQ(calls.find("cublasLtMatmul", gemm + 1), std::string::npos) << "one run, one call\n" << calls;
  const size_t capture_end = calls.rfind("capture end", gemm);
  const size_t capture_begin = calls.rfind("capture begin", gemm);
  EXPECT_TRUE(capture_begin == std::string::npos || capture_end > capture_begin)
      << "the call is not inside a capture\n" << calls;
}

#endif

}  // namespace kernels_extern_gemm_test
}  // namespace sf
