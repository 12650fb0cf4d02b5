// A library GEMM followed by a generated epilogue kernel (issue 15, item 5): for a
// matmul group whose matmul cuBLASLt/cuBLAS computes but whose epilogue it cannot
// express, the tuner measures the library's bare product plus a pointwise kernel for
// the rest of the group as one more extern candidate ("extern=cublaslt+epilogue"), and
// `compile --cache` turns that winner into a gemm step, a product buffer and a kernel
// step (codegen/kernels/extern_gemm.h, docs/autotuning.md "Extern candidates").
//
// What the fakes cannot show: the fake driver runs no kernel code, so the epilogue
// kernel's numbers are checked on the host here (the same group through the host
// pointwise emitter, fed the reference product), and its PTX through ptxas; the fakes
// check the plumbing (the call, then the launch, on the right buffers and clock).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "codegen/kernels/extern_gemm.h"
#include "codegen/reference/compare.h"
#include "codegen/reference/evaluate.h"
#include "runtime/gpu/cublas.h"
#include "runtime/plan/plan_verify.h"
#include "tests/kernels/extern_test_util.h"
#include "tests/kernels/kernel_test_util.h"

namespace sf {
namespace kernels_extern_epilogue_test {

using namespace kernels_extern_test_util;
using kernel_test::have_ptxas;
using kernel_test::ptxas_failure;

struct Split {
  std::string what, params, body;
  std::string product;                  // the matmul alone, for the host check
  int c;                                // ExternGemmEpilogue::gemm.c
  std::vector<std::string> epilogue_in;  // the group's params the epilogue reads ("" = the product)
  std::vector<int> epilogue_out;
};

const std::string kLin = "matmul(x, transpose(w, 0, 1))";
const std::string kXW = "x: f32[64, 32], w: f32[48, 32]";

std::vector<Split> splits() {
  return {
      {"a residual add", kXW + ", r: f32[64, 48]", "add(" + kLin + ", r)", kLin, kGemmProduct, {"", "r"}, {0}},
      {"bias, then the erf gelu", kXW + ", b: f32[48]", "gelu(add(" + kLin + ", b))", kLin, kGemmProduct, {"", "b"}, {0}},
      {"a scale", kXW, "mul(" + kLin + ", 0.5)", kLin, kGemmProduct, {""}, {0}},
      {"a cast to f16", kXW, "cast(" + kLin + ", dtype=f16)", kLin, kGemmProduct, {""}, {0}},
      {"bf16 residual", "x: bf16[64, 32], w: bf16[48, 32], r: bf16[64, 48]", "add(" + kLin + ", r)", kLin,
       kGemmProduct, {"", "r"}, {0}},
      {"batched, a bias along M", "x: f32[2, 16, 8], w: f32[2, 8, 12], c: f32[2, 16, 1]", "add(matmul(x, w), c)",
       "matmul(x, w)", kGemmProduct, {"", "c"}, {0}},
  };
}

// The same graph with two outputs: the matmul's own result, which the library then
// writes in place of a product buffer, and its relu.
const std::string kTwoOutputs =
    "graph g(x: f32[64, 32], w: f32[48, 32]) {\n  h = " + kLin + "\n  y = relu(h)\n  return h, y\n}\n";

TEST(ExternGemmEpilogue, OffersTheSplitWhereOnlyTheEpilogueStopsTheLibrary) {
  std::vector<Split> cases = splits();
  for (const Split& c : cases) {
    const Matmul mm = matmul_of(graph(c.params, c.body));
    Result<ExternGemmEpilogue> x = extern_gemm_epilogue(mm.k);
    ASSERT_TRUE(x) << c.what << ": " << x.error().message;
    EXPECT_EQ(x->gemm.desc.epilogue, GemmEpilogue::None) << c.what;
    EXPECT_EQ(x->gemm.libraries, (std::vector<GemmLibrary>{GemmLibrary::CublasLt, GemmLibrary::Cublas})) << c.what;
    EXPECT_EQ(x->gemm.c, c.c) << c.what;
    EXPECT_EQ(mm.reads.at(static_cast<size_t>(x->gemm.a)), "x") << c.what;
    EXPECT_EQ(mm.reads.at(static_cast<size_t>(x->gemm.b)), "w") << c.what;
    std::vector<std::string> in;
    for (int i : x->epilogue_in) in.push_back(i == kGemmProduct ? "" : mm.reads.at(static_cast<size_t>(i)));
    EXPECT_EQ(in, c.epilogue_in) << c.what;
    EXPECT_EQ(x->epilogue_out, c.epilogue_out) << c.what;
    EXPECT_EQ(x->epilogue.kind, KernelKind::Pointwise) << c.what;
    EXPECT_EQ(x->epilogue.name, mm.k.name + "_epilogue") << c.what;
    EXPECT_EQ(x->epilogue.group.params().size(), x->epilogue_in.size()) << c.what;
    for (const std::string& op : x->epilogue.ops) EXPECT_NE(op, "matmul") << c.what;
  }
  Result<ExternGemmEpilogue> two = extern_gemm_epilogue(matmul_kernel(kTwoOutputs));
  ASSERT_TRUE(two) << two.error().message;
  EXPECT_EQ(two->gemm.c, 0) << "h is the product: the library writes it";
  EXPECT_EQ(two->epilogue_out, std::vector<int>{1});
  EXPECT_EQ(two->epilogue_in, std::vector<int>{kGemmProduct});
}

TEST(ExternGemmEpilogue, SaysWhyAGroupIsNotSplit) {
  struct Case {
    std::string what, params, body, says;
  };
  const std::vector<Case> cases = {
      {"the library computes it whole", kXW + ", b: f32[48]", "relu(add(" + kLin + ", b))",
       "the library computes the whole group (bias_relu epilogue)"},
      {"a bare matmul", kXW, kLin, "the library computes the whole group (none epilogue)"},
      {"an integer matmul", "x: i32[64, 32], w: i32[48, 32], r: i32[64, 48]", "add(" + kLin + ", r)",
       "cuBLASLt cannot express it: the matmul is i32"},
      {"batch dims broadcast unevenly", "x: f32[2, 3, 8, 16], w: f32[3, 16, 8], r: f32[8, 8]",
       "add(matmul(x, w), r)", "do not collapse to one batch stride"},
  };
  for (const Case& c : cases) {
    Result<ExternGemmEpilogue> x = extern_gemm_epilogue(matmul_kernel(graph(c.params, c.body)));
    ASSERT_FALSE(x) << c.what;
    EXPECT_EQ(x.error().message.rfind("no library GEMM + epilogue kernel: ", 0), 0u) << c.what << ": " << x.error().message;
    EXPECT_NE(x.error().message.find(c.says), std::string::npos) << c.what << ": " << x.error().message;
  }
}

// The numbers the pair gives: the reference product (what the library computes) fed
// to the epilogue kernel, compiled for the host by the same pointwise emitter, must
// give the group's outputs.
TEST(ExternGemmEpilogue, TheEpilogueKernelOnTheProductGivesTheGroupsOutputs) {
  Result<std::unique_ptr<HostKernelRunner>> host = HostKernelRunner::create();
  ASSERT_TRUE(host) << host.error().message;
  std::vector<Split> cases = splits();
  cases.push_back({"two outputs", "", "", "", 0, {}, {}});
  for (const Split& c : cases) {
    const std::string text = c.params.empty() ? kTwoOutputs : graph(c.params, c.body);
    const Graph g = std::move(parse_graph(text)).value();
    const Matmul mm = matmul_of(text);
    Result<ExternGemmEpilogue> x = extern_gemm_epilogue(mm.k);
    ASSERT_TRUE(x) << c.what << ": " << x.error().message;
    const std::vector<Tensor> inputs = random_inputs(g, 7);
    auto input = [&](const std::string& name) -> const Tensor& {
      for (size_t i = 0; i < g.params().size(); ++i)
        if (g.node(g.params()[i]).name == name) return inputs[i];
      throw std::runtime_error("no param " + name);
    };
    Result<std::vector<Tensor>> want = evaluate(g, inputs);
    ASSERT_TRUE(want) << c.what;
    // The library's product, rounded to the matmul's dtype as cuBLAS writes it.
    Tensor product;
    if (x->gemm.c == kGemmProduct) {
      const Graph pg = std::move(parse_graph(graph(c.params, c.product))).value();
      Result<std::vector<Tensor>> p = evaluate(pg, inputs);
      ASSERT_TRUE(p) << c.what;
      product = (*p)[0];
    } else {
      product = (*want)[static_cast<size_t>(x->gemm.c)];
    }
    std::vector<const Tensor*> args;
    for (int i : x->epilogue_in)
      args.push_back(i == kGemmProduct ? &product : &input(mm.reads.at(static_cast<size_t>(i))));
    Result<std::vector<Tensor>> got = (*host)->run(x->epilogue, args);
    ASSERT_TRUE(got) << c.what << ": " << got.error().message;
    ASSERT_EQ(got->size(), x->epilogue_out.size()) << c.what;
    for (size_t j = 0; j < got->size(); ++j) {
      const size_t o = static_cast<size_t>(x->epilogue_out[j]);
      Comparison cmp = compare((*got)[j], (*want)[o], check_tolerance(g, g.outputs()[o].value));
      EXPECT_TRUE(cmp.ok()) << c.what << ", output " << o << ": max_abs_err " << cmp.max_abs_err;
    }
  }
  EXPECT_EQ((*host)->stats().fallbacks, 0) << "every epilogue ran as generated code";
}

// What tune_programs hands the tuner for such a group: one GemmArtifact per library,
// each with the epilogue kernel's PTX and where its arguments come from.
TEST(ExternGemmEpilogue, CandidatesPairTheLibraryWithTheEpilogueKernel) {
  const Matmul mm = matmul_of(graph(kXW + ", r: f32[64, 48]", "add(" + kLin + ", r)"));
  std::string note;
  std::vector<ExternCandidate> c = extern_candidates(mm.k, false, &note, "sm_90a");
  EXPECT_EQ(note.rfind("no library GEMM: cuBLASLt cannot express it: the epilogue is not one of", 0), 0u) << note;
  Result<const cublas::Api*> api = cublas::api();
  if (!api) {
    EXPECT_TRUE(c.empty());
    EXPECT_NE(note.find("; no library GEMM + epilogue kernel measured: " + api.error().message), std::string::npos)
        << note;
    return;
  }
  ASSERT_FALSE(c.empty()) << note;
  EXPECT_EQ(c.back().library, "cublas+epilogue");
  EXPECT_NE(note.find("+epilogue (cublaslt f32 [64x48x32] A [M,K] lda 32, B^T [N,K] ldb 32, epilogue none, then a "
                      "pointwise kernel: add)"),
            std::string::npos)
      << note;
  for (const ExternCandidate& x : c) {
    const auto* g = dynamic_cast<const GemmArtifact*>(x.artifact.get());
    ASSERT_NE(g, nullptr);
    EXPECT_EQ(g->desc.epilogue, GemmEpilogue::None);
    EXPECT_EQ(g->c, kGemmProduct);
    ASSERT_TRUE(g->epilogue);
    EXPECT_NE(g->epilogue->ptx.find(".entry " + g->epilogue->entry), std::string::npos);
    EXPECT_EQ(g->epilogue->inputs, (std::vector<KernelArgSpec>{{DType::F32, 64 * 48}, {DType::F32, 64 * 48}}));
    EXPECT_EQ(g->epilogue_in.size(), 2u);
    EXPECT_EQ(g->epilogue_in[0], kGemmProduct);
    EXPECT_EQ(mm.reads.at(static_cast<size_t>(g->epilogue_in[1])), "r");
    EXPECT_EQ(g->epilogue_out, std::vector<int>{0});
    EXPECT_NE(x.what.find(", then " + mm.k.name + "_epilogue"), std::string::npos) << x.what;
  }
}

TEST(ExternGemmEpilogue, ChoiceNamesReadBackAndOldOnesStayTheSame) {
  EXPECT_EQ(extern_choice_name({GemmLibrary::CublasLt, true}), "cublaslt+epilogue");
  EXPECT_EQ(extern_choice_name({GemmLibrary::Cublas, false}), "cublas");
  struct Case {
    std::string text;
    bool ok;
    GemmLibrary lib;
    bool epilogue;
  };
  for (const Case& c : std::vector<Case>{{"cublaslt", true, GemmLibrary::CublasLt, false},
                                         {"cublas", true, GemmLibrary::Cublas, false},
                                         {"cublaslt+epilogue", true, GemmLibrary::CublasLt, true},
                                         {"cublas+epilogue", true, GemmLibrary::Cublas, true},
                                         {"+epilogue", false, {}, false},
                                         {"cutlass+epilogue", false, {}, false},
                                         {"cublaslt+epilogue+epilogue", false, {}, false},
                                         {"cublaslt+", false, {}, false}}) {
    std::optional<ExternChoice> x = parse_extern_choice(c.text);
    ASSERT_EQ(x.has_value(), c.ok) << c.text;
    if (!x) continue;
    EXPECT_EQ(x->library, c.lib) << c.text;
    EXPECT_EQ(x->epilogue_kernel, c.epilogue) << c.text;
  }
  // The rank-0 table and a cache entry carry it like any library.
  std::map<std::string, KernelChoice> t;
  t["00aa"] = KernelChoice{KernelConfig{}, ConfigSource::Tuned, "extern=cublaslt+epilogue", "cublaslt+epilogue"};
  Result<std::map<std::string, KernelChoice>> back = choices_from_text(choices_to_text(t));
  ASSERT_TRUE(back) << back.error().message;
  EXPECT_EQ(back->at("00aa").library, "cublaslt+epilogue");
  CacheEntry e;
  e.config = extern_config_str("cublaslt+epilogue");
  e.extern_library = "cublaslt+epilogue";
  e.extern_version = "cublasLt 130100 (fake)";
  e.status = CacheEntry::Status::Measured;
  e.measurement.median_us = 4;
  Result<CacheEntry> read = entry_from_json(entry_to_json(e));
  ASSERT_TRUE(read) << read.error().message;
  EXPECT_EQ(*read, e);
}

// --- compile: the cache's split winner becomes gemm step + product buffer + kernel step ---

const std::string kResidual = graph(kXW + ", r: f32[64, 48]", "add(" + kLin + ", r)");

TEST(ExternGemmEpilogueCompile, ACachedPairBecomesAGemmStepAProductBufferAndAKernelStep) {
  TempCache c;
  c.store(kResidual, 10, "cublaslt+epilogue", 4);
  // ptxas runs on every kernel compile emits (here: only the epilogue kernel).
  Result<CompiledPlan> p = c.compile(kResidual, /*run_ptxas=*/true);
  ASSERT_TRUE(p) << p.error().message;
  const PlanRank& r = p->plan.ranks[0];
  ASSERT_EQ(r.steps.size(), 2u);
  const PlanStep& gs = r.steps[0];
  const PlanStep& ks = r.steps[1];
  auto name = [&](int b) { return r.buffers[static_cast<size_t>(b)].name; };
  EXPECT_EQ(gs.op, "gemm");
  EXPECT_EQ(gemm_str(gs.gemm.desc), "cublaslt f32 [64x48x32] A [M,K] lda 32, B^T [N,K] ldb 32, epilogue none");
  ASSERT_EQ(gs.in.size(), 2u);
  EXPECT_EQ(name(gs.in[0]), "x");
  EXPECT_EQ(name(gs.in[1]), "w");
  ASSERT_EQ(gs.out.size(), 1u);
  const PlanBuffer& product = r.buffers[static_cast<size_t>(gs.out[0])];
  EXPECT_EQ(product.name, "k0_matmul_add.product");
  EXPECT_EQ(product.dtype, DType::F32);
  EXPECT_EQ(product.shape, (Shape{64, 48}));
  EXPECT_EQ(ks.op, "kernel");
  EXPECT_EQ(ks.stream, "compute");
  EXPECT_EQ(ks.in, (std::vector<int>{gs.out[0], r.inputs[2]})) << "the product, then r";
  EXPECT_EQ(ks.out, std::vector<int>{r.outputs[0]});
  ASSERT_EQ(p->plan.kernels.size(), 1u);
  const PlanKernel& pk = p->plan.kernels[0];
  EXPECT_EQ(pk.id, ks.kernel);
  EXPECT_EQ(pk.id, "k0_matmul_add_epilogue");
  EXPECT_EQ(pk.kind, KernelKind::Pointwise);
  EXPECT_EQ(pk.ops, std::vector<std::string>{"add"});
  const std::string& ptx = p->ptx.at(pk.ptx_file);
  EXPECT_EQ(ptx.find("fma.rn"), std::string::npos) << "no matmul left in the epilogue";
  if (have_ptxas()) {
    EXPECT_GE(pk.registers, 0) << "compile ran ptxas on it";
    EXPECT_EQ(ptxas_failure(ptx, "sm_90a"), "");
  }
  EXPECT_NE(p->report.find("k0_matmul_add: cublaslt f32 [64x48x32] A [M,K] lda 32, B^T [N,K] ldb 32, epilogue none, "
                           "then kernel k0_matmul_add_epilogue (cache)"),
            std::string::npos)
      << p->report;
  // plan.json round trip through the verifier.
  Result<Plan> back = plan_from_json(plan_to_json(p->plan), "plan.json");
  ASSERT_TRUE(back) << back.error().str();
  EXPECT_EQ(back->ranks[0].buffers.size(), r.buffers.size());
}

TEST(ExternGemmEpilogueCompile, TheLibraryWritesAnOutputThatIsTheProduct) {
  TempCache c;
  c.store(kTwoOutputs, 10, "cublas+epilogue", 4);
  Result<CompiledPlan> p = c.compile(kTwoOutputs);
  ASSERT_TRUE(p) << p.error().message;
  const PlanRank& r = p->plan.ranks[0];
  ASSERT_EQ(r.steps.size(), 2u);
  EXPECT_EQ(r.steps[0].gemm.desc.library, GemmLibrary::Cublas);
  EXPECT_EQ(r.steps[0].out, std::vector<int>{r.outputs[0]}) << "h, no buffer of its own";
  EXPECT_EQ(r.steps[1].in, std::vector<int>{r.outputs[0]});
  EXPECT_EQ(r.steps[1].out, std::vector<int>{r.outputs[1]});
  for (const PlanBuffer& b : r.buffers) EXPECT_EQ(b.name.find(".product"), std::string::npos) << b.name;
}

TEST(ExternGemmEpilogueCompile, ASplitChoiceForAGroupTheLibraryComputesWholeKeepsTheKernel) {
  const std::string linear = graph(kXW + ", b: f32[48]", "relu(add(" + kLin + ", b))");
  TempCache c;
  c.store(linear, 10, "cublaslt+epilogue", 4);  // hand-made: the tuner offers cublaslt whole here
  Result<CompiledPlan> p = c.compile(linear);
  ASSERT_TRUE(p) << p.error().message;
  ASSERT_EQ(p->plan.ranks[0].steps.size(), 1u);
  EXPECT_EQ(p->plan.ranks[0].steps[0].op, "kernel");
  EXPECT_EQ(p->plan.kernels[0].config_source, "default");
  EXPECT_NE(p->report.find("the cache chose extern=cublaslt+epilogue, but no library GEMM + epilogue kernel: the "
                           "library computes the whole group"),
            std::string::npos)
      << p->report;
}

// plan.json is hostile input: the new buffer and the two steps are checked like any.
TEST(ExternGemmEpilogueCompile, TheVerifierRefusesABrokenPair) {
  TempCache c;
  c.store(kResidual, 10, "cublaslt+epilogue", 4);
  Result<CompiledPlan> p = c.compile(kResidual);
  ASSERT_TRUE(p) << p.error().message;
  const nlohmann::json good = nlohmann::json::parse(plan_to_json(p->plan));
  const int product = p->plan.ranks[0].steps[0].out[0];
  struct Case {
    std::string what;
    std::function<void(nlohmann::json&)> mutate;
    std::string says;
  };
  const std::vector<Case> cases = {
      {"the kernel before the gemm",
       [](nlohmann::json& j) { std::swap(j["ranks"][0]["steps"][0], j["ranks"][0]["steps"][1]); },
       "ranks[0].steps[0].in[0]: reads buffer " + std::to_string(product) +
           " (k0_matmul_add.product) before any step writes it"},
      {"a product buffer too small",
       [&](nlohmann::json& j) { j["ranks"][0]["buffers"][product]["shape"] = {64, 47}; },
       "ranks[0].steps[0].out[0]: C is f32[64, 47], not batch x m x n"},
      {"the product of another dtype",
       [&](nlohmann::json& j) { j["ranks"][0]["buffers"][product]["dtype"] = "f16"; }, "ranks[0].steps[0].out[0]: C is f16"},
      {"the gemm writing into its own operand",
       [](nlohmann::json& j) { j["ranks"][0]["steps"][0]["out"] = {j["ranks"][0]["steps"][0]["in"][0]}; },
       "ranks[0].steps[0]."},
      {"the pair's library unknown", [](nlohmann::json& j) { j["ranks"][0]["steps"][0]["library"] = "cublaslt+epilogue"; },
       "ranks[0].steps[0].library: unknown library \"cublaslt+epilogue\""},
  };
  for (const Case& k : cases) {
    nlohmann::json j = good;
    k.mutate(j);
    Result<Plan> r = plan_from_json(j.dump(), "plan.json");
    ASSERT_FALSE(r) << k.what;
    EXPECT_NE(r.error().str().find(k.says), std::string::npos) << k.what << ": " << r.error().str();
  }
}

// The host path: a cached pair under the host's key keeps the generated kernel.
TEST(ExternGemmEpilogueCli, OnTheCpuACachedPairKeepsTheGeneratedKernel) {
  TempCache c;
  ConfigChooser chooser(TuneSetup{"cpu", "", ShapeBuckets::Exact}, &c.cache());
  const LocalKernel k = matmul_kernel(kResidual);
  std::optional<TuneKey> key = chooser.key_of(k);
  ASSERT_TRUE(key);
  CacheEntry x;
  x.config = extern_config_str("cublaslt+epilogue");
  x.extern_library = "cublaslt+epilogue";
  x.status = CacheEntry::Status::Measured;
  x.measurement.median_us = 1;
  ASSERT_TRUE(c.cache().store(*key, x).ok());
  KernelChoice ch = chooser.choose(k);
  EXPECT_EQ(ch.library, "cublaslt+epilogue");
  EXPECT_EQ(ch.config, default_kernel_config(k, ConfigTarget::Host)) << "what the host runner runs";
  const std::string g = c.dir() + "/g.sf";
  write_file(g, kResidual);
  CliResult r = shardfuse("run " + g + " --device cpu --check --cache " + c.dir() + "/cache");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("kernels: 1 launch(es) of generated host code"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("check: ok"), std::string::npos) << r.out;
}

TEST(ExternGemmEpilogueCli, ExplainSaysTheSplitIsOfferedAndShowsACachedPair) {
  TempCache c;
  const std::string res = c.dir() + "/res.sf";
  write_file(res, kResidual);
  CliResult r = c.explain_cuda(res);
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("    library GEMM + epilogue kernel: offered to the tuner: cublaslt f32 [64x48x32] A [M,K] lda "
                       "32, B^T [N,K] ldb 32, epilogue none, then k0_matmul_add_epilogue\n"),
            std::string::npos)
      << r.out;
  c.store(kResidual, 10, "cublaslt+epilogue", 4);
  CliResult w = c.explain_cuda(res);
  EXPECT_NE(w.out.find("k0_matmul_add: extern=cublaslt+epilogue  [cache]"), std::string::npos) << w.out;
}

// --- the fake driver and the fake cuBLAS ----------------------------------------------------

#if defined(SF_FAKE_CUDA) && defined(SF_FAKE_CUBLAS)

TEST(ExternGemmEpilogueFake, TuneMeasuresTheCallAndTheLaunchAsOneCandidate) {
  // 16 x 16: few configs survive the rules, so the tuning stays around a second.
  const std::string text = graph("x: f32[16, 16], w: f32[16, 16], r: f32[16, 16]", "add(" + kLin + ", r)");
  TempCache c;
  const std::string g = c.dir() + "/g.sf", log = c.dir() + "/log";
  write_file(g, text);
  CliResult r = shardfuse_env(fakes(log) + " FAKE_CUBLAS_NS=30000",
                              "tune " + g + " --device cuda --cache " + c.dir() + "/cache --top-k 1 --warmup-ms 1 "
                              "--rep-ms 2 --max-reps 5");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("library GEMM + epilogue kernel measured: cublaslt+epilogue, cublas+epilogue (cublaslt f32 "
                       "[16x16x16]"),
            std::string::npos)
      << r.out;
  // The call (30 us on the fake) and the epilogue's launch (10 us), timed together.
  EXPECT_NE(r.out.find("  extern cublaslt+epilogue: 40.0 us median\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("  extern cublas+epilogue: 40.0 us median\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("  best: block_m="), std::string::npos) << "the generated kernel is faster here\n" << r.out;
  // Every library call is followed by the epilogue kernel's launch on the same stream:
  // 3 arguments (the product, r, y), where the generated matmul takes 4.
  std::istringstream in(read_text(log));
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  int pairs = 0;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (lines[i].rfind("cublasLtMatmul ", 0) != 0 && lines[i].rfind("cublasGemmEx ", 0) != 0) continue;
    ASSERT_LT(i + 1, lines.size());
    EXPECT_EQ(lines[i + 1].rfind("launch sf_tune ", 0), 0u) << lines[i + 1];
    EXPECT_NE(lines[i + 1].find(" args=3 "), std::string::npos) << lines[i + 1];
    ++pairs;
  }
  EXPECT_GE(pairs, 2 * 5) << "the probe, the estimate and the timed runs of both libraries";
  // Measured and cached under the new config texts: a second run measures nothing.
  CliResult again = shardfuse_env(fakes(log), "tune " + g + " --device cuda --cache " + c.dir() + "/cache --top-k 1");
  EXPECT_NE(again.out.find("  extern cublaslt+epilogue: 40.0 us median (cached)"), std::string::npos) << again.out;
}

TEST(ExternGemmEpilogueFake, ExecCallsTheLibraryThenLaunchesTheEpilogueOnItsProduct) {
  TempCache c;
  c.store(kResidual, 10, "cublaslt+epilogue", 4);
  const std::string g = c.dir() + "/g.sf", plan = c.dir() + "/plan", log = c.dir() + "/log";
  write_file(g, kResidual);
  CliResult comp = shardfuse("compile " + g + " --no-ptxas --cache " + c.dir() + "/cache -o " + plan);
  ASSERT_EQ(comp.code, 0) << comp.out;
  EXPECT_NE(comp.out.find("1 library GEMM step(s)"), std::string::npos) << comp.out;
  // The fake driver runs no kernel code, so the outputs are not checked here (the
  // host test above checks the epilogue's numbers); the plumbing is.
  CliResult r = shardfuse_env(fakes(log), "exec " + plan + " --device cuda");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("kernels: 1 launch(es) of 1 distinct kernel(s) from 1 PTX module(s); library GEMMs: 1 call(s)"),
            std::string::npos)
      << r.out;
  const std::string calls = read_text(log);
  const size_t gemm = calls.find("cublasLtMatmul m=48 n=64 k=32 batch=1 transa=T transb=N lda=32 ldb=32 ldc=48 ");
  const size_t launch = calls.find("launch sf_k0_matmul_add_epilogue ");
  ASSERT_NE(gemm, std::string::npos) << calls;
  ASSERT_NE(launch, std::string::npos) << calls;
  EXPECT_LT(gemm, launch) << calls;
  EXPECT_NE(calls.find("epilogue=none", gemm), std::string::npos) << calls;
  EXPECT_NE(calls.find(" args=3 ", launch), std::string::npos) << calls;
}

#endif

}  // namespace kernels_extern_epilogue_test
}  // namespace sf
