// The matmul emitter: host kernels (ORC JIT) and the tiled NVPTX kernel built for the
// host and run block by block (one OS thread per GPU thread, a sleeping barrier for
// bar.sync) against the reference evaluator on the same group graph; NVPTX kernels
// through the verifier, compile_to_ptx, substring checks on the PTX and ptxas -v
// (no spills). No GPU is needed.
#include <gtest/gtest.h>

#include "tests/kernels/kernel_test_util.h"
#include "tests/sanitized.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>
#include <llvm/Support/raw_ostream.h>

#include "runtime/core/device_mesh.h"
#include "codegen/dist/propagate.h"
#include "codegen/fusion/pipeline.h"
#include "codegen/ir/builder.h"
#include "codegen/ir/decompose.h"
#include "codegen/ir/parser.h"
#include "codegen/kernels/matmul.h"
#include "codegen/kernels/pointwise.h"
#include "codegen/reference/compare.h"
#include "codegen/reference/evaluate.h"
#include "tests/result_util.h"

namespace sf {
namespace kernels_matmul_test {

using kernel_test::finish;
using kernel_test::jit;
using kernel_test::output_tensors;
using kernel_test::arg_array;
using kernel_test::module_text;
using kernel_test::have_ptxas;
using kernel_test::assemble;
using kernel_test::ptxas_failure;

// ---- graphs and inputs ---------------------------------------------------------------------


// Uniform [-1, 1) floats (a sum of K products stays O(sqrt K), where f32's relative
// tolerance means something), small integers; deterministic per seed.
std::vector<Tensor> make_inputs(const Graph& g, uint64_t seed) {
  std::vector<Tensor> in;
  for (size_t p = 0; p < g.params().size(); ++p) {
    const TensorType& t = g.node(g.params()[p]).type;
    Tensor x(t.dtype, t.shape);
    std::mt19937_64 rng(seed + 7919 * p);
    for (int64_t i = 0; i < x.numel(); ++i) {
      if (is_float(t.dtype)) x.set(i, -1.0 + 2.0 * static_cast<double>(rng() >> 11) * 0x1p-53);
      else x.set_int(i, static_cast<int64_t>(rng() % 17) - 8);
    }
    in.push_back(std::move(x));
  }
  return in;
}

// Group graphs as codegen/fusion/fuse.cpp builds them: params in0.. (the operands,
// then epilogue inputs), views on params feeding the matmul, literals as constants.
struct Mm {
  Mm(int64_t m_, int64_t n_, int64_t k_, DType dt_ = DType::F32, bool transpose_b_ = false)
      : m(m_), n(n_), k(k_), dt(dt_), transpose_b(transpose_b_) {}
  int64_t m, n, k;
  DType dt;
  bool transpose_b;  // B is w [N, K], read as transpose(w, 0, 1)
  Shape a_batch, b_batch;
};

Value operand_a(GraphBuilder& b, const Mm& s) {
  Shape sa = s.a_batch;
  sa.push_back(s.m);
  sa.push_back(s.k);
  return b.param("in0", s.dt, sa);
}

Value operand_b(GraphBuilder& b, const Mm& s) {
  Shape sb = s.b_batch;
  if (s.transpose_b) {
    sb.push_back(s.n);
    sb.push_back(s.k);
    int64_t r = static_cast<int64_t>(sb.size());
    return transpose(b.param("in1", s.dt, sb), r - 2, r - 1);
  }
  sb.push_back(s.k);
  sb.push_back(s.n);
  return b.param("in1", s.dt, sb);
}

Graph plain(const Mm& s) {
  GraphBuilder b("mm");
  Value a = operand_a(b, s), w = operand_b(b, s);
  b.ret(matmul(a, w));
  return finish(b);
}

enum class Epi { None, Bias, BiasRelu, BiasGelu, Scale, Residual, CastBf16, RawAndBiasRelu, ScaleBiasTanhResidual };

// matmul followed by `e`, decomposed (gelu into erf and friends) as fusion sees it.
Graph with_epilogue(const Mm& s, Epi e) {
  GraphBuilder b("mm_epi");
  Value a = operand_a(b, s), w = operand_b(b, s);
  Value h = matmul(a, w);
  auto bias = [&] { return b.param("in2", s.dt, {s.n}); };
  auto residual = [&](const std::string& name) { return b.param(name, s.dt, h.type().shape); };
  switch (e) {
    case Epi::None: b.ret(h); break;
    case Epi::Bias: b.ret(h + bias()); break;
    case Epi::BiasRelu: b.ret(relu(h + bias())); break;
    case Epi::BiasGelu: b.ret(gelu(h + bias())); break;
    case Epi::Scale: b.ret(h * 0.125); break;
    case Epi::Residual: b.ret(h + residual("in2")); break;
    case Epi::CastBf16: b.ret(cast(h, DType::BF16)); break;
    case Epi::RawAndBiasRelu:  // the raw result escapes too (another kernel reads it)
      b.ret(h);
      b.ret(relu(h + bias()));
      break;
    case Epi::ScaleBiasTanhResidual: b.ret(tanh(h * 0.5 + bias()) + residual("in3")); break;
  }
  return decompose(finish(b));
}

KernelSpec spec_of(const Graph& g, std::string entry = "mm") { return KernelSpec{std::move(entry), KernelKind::Matmul, g}; }

// ---- running on the host -----------------------------------------------------------------------




// The host kernel (emitter_for(Matmul), as the pipeline calls it).
Result<std::vector<Tensor>> run_host(const Graph& g, const std::vector<Tensor>& inputs) {
  return kernel_test::run_emitted(emitter_for(KernelKind::Matmul).emit(spec_of(g), {}, llvmb::Target::host()), g, inputs);
}

void sim_barrier(void* ctx) { static_cast<kernel_test::SleepBarrier<>*>(ctx)->arrive_and_wait(); }

// The tiled GPU kernel, run on the host: every block of the launch, each with its
// threads as OS threads sharing a shared-memory buffer and a barrier.
Result<std::vector<Tensor>> run_tiled(const Graph& g, const std::vector<Tensor>& inputs, const KernelConfig& cfg,
                                      bool wide_index = false) {
  Result<EmittedKernel> k = emit_matmul_block_on_host(spec_of(g, "mm_block"), cfg, wide_index);
  if (!k) return k.error();
  LaunchShape launch = k->launch;
  Result<void*> fn = jit().add(std::move(k->module), std::move(k->context), k->entry);
  if (!fn) return fn.error();
  using Entry = void (*)(void**, int32_t, int32_t, int32_t, void*, void (*)(void*), void*, int32_t);
  auto entry = reinterpret_cast<Entry>(*fn);
  std::vector<Tensor> out = output_tensors(g);
  // Poison the outputs: an element the kernel misses shows up as a mismatch. A
  // split-K kernel adds into its output, which the launch zeroes.
  for (Tensor& t : out)
    if (t.nbytes()) std::memset(t.data(), launch.zero_outputs ? 0 : 0x7f, t.nbytes());
  kernel_test::ArgArray args = arg_array(inputs, out);
  // Split-K in a workspace: zeroed, after the outputs; the launch must leave it zero.
  std::vector<uint32_t> workspace(static_cast<size_t>((launch.workspace_bytes + 3) / 4), 0);
  if (launch.workspace_bytes > 0) args.push_back(workspace.data());
  const int threads = launch.block[0];
  std::vector<float> smem(static_cast<size_t>(launch.shared_bytes) / 4 + 4);
  kernel_test::BlockThreads block(threads);
  // One block at a time, those of one (x, y) in a rotated z order: the last of a
  // split-K tile's blocks to arrive is a different z from tile to tile.
  for (int64_t by = 0; by < launch.grid[1]; ++by)
    for (int64_t bx = 0; bx < launch.grid[0]; ++bx)
    for (int64_t zi = 0; zi < launch.grid[2]; ++zi) {
      const int64_t bz = (zi + bx + by) % launch.grid[2];
      // Garbage in shared memory, as on a GPU: the kernel must not read before writing.
      std::fill(smem.begin(), smem.end(), std::nanf(""));
      kernel_test::SleepBarrier<> bar(threads);
      block.run([&](int t) {
        entry(args.data(), static_cast<int32_t>(bx), static_cast<int32_t>(by), t, smem.data(), &sim_barrier, &bar,
              static_cast<int32_t>(bz));
      });
    }
  for (size_t w = 0; w < workspace.size(); ++w)
    if (workspace[w] != 0) return Diag{"", {}, "the launch left word " + std::to_string(w) + " of its workspace nonzero"};
  return out;
}

void expect_close(const std::vector<Tensor>& got, const std::vector<Tensor>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t o = 0; o < want.size(); ++o) {
    Comparison c = compare(got[o], want[o], default_tolerance(want[o].dtype()));
    EXPECT_TRUE(c.ok()) << what << ": output " << o << " " << c.mismatches << " mismatches, first at " << c.first_mismatch
                        << " (got " << got[o].get(std::max<int64_t>(c.first_mismatch, 0)) << ", want "
                        << want[o].get(std::max<int64_t>(c.first_mismatch, 0)) << "), max abs err " << c.max_abs_err;
  }
}

// The host kernel and, for float matmuls, the tiled kernel under `configs` match the
// reference.
void check(const Graph& g, const std::vector<KernelConfig>& configs = {}, uint64_t seed = 1) {
  std::vector<Tensor> in = make_inputs(g, seed);
  Result<std::vector<Tensor>> want = evaluate(g, in);
  ASSERT_TRUE(want.ok()) << want.error().str();
  Result<std::vector<Tensor>> got = run_host(g, in);
  ASSERT_TRUE(got.ok()) << got.error().str();
  expect_close(*got, *want, "host");
  // Under the sanitizer every other config, starting one later on each call, so a
  // test that checks several graphs still runs every config (tests/sanitized.h).
  static size_t calls = 0;
  const size_t first = calls++;
  for (size_t i = 0; i < configs.size(); ++i) {
    if (!test::in_sample(first + i)) continue;
    const KernelConfig& cfg = configs[i];
    Result<std::vector<Tensor>> tiled = run_tiled(g, in, cfg);
    ASSERT_TRUE(tiled.ok()) << tiled.error().str();
    expect_close(*tiled, *want,
                 "tiled " + std::to_string(cfg.block_m) + "x" + std::to_string(cfg.block_n) + "x" +
                     std::to_string(cfg.block_k) + " warps " + std::to_string(cfg.warps) + " stages " +
                     std::to_string(cfg.stages) + " group_m " + std::to_string(cfg.group_m));
  }
}

KernelConfig config(int bm, int bn, int bk, int warps, int stages = 2, int group_m = 8) {
  KernelConfig c;
  c.block_m = bm;
  c.block_n = bn;
  c.block_k = bk;
  c.warps = warps;
  c.stages = stages;
  c.group_m = group_m;
  return c;
}

// The default, a small tile with one warp and 3 stages, a tall one with one stage, a
// tile where a warp has more threads than the B tile has elements per k (the copy
// guard), and GROUP_M 1 / 2.
std::vector<KernelConfig> tiled_configs() {
  return {KernelConfig{}, config(16, 16, 8, 1, 3, 1), config(64, 32, 32, 8, 1, 2), config(16, 32, 4, 4, 2, 2)};
}

// ---- host and tiled kernels against the reference -------------------------------------------------

TEST(MatmulHost, SquareAndRaggedSizes) {
  const int64_t sizes[] = {1, 7, 33, 65, 128};
  for (int64_t s : sizes) {
    SCOPED_TRACE("square " + std::to_string(s));
    check(plain({s, s, s}), {KernelConfig{}});
  }
  // Every size in every role at least once.
  const Mm ragged[] = {{7, 33, 65}, {65, 1, 128}, {1, 128, 7}, {33, 65, 1}, {128, 7, 33}, {1, 1, 65}, {65, 128, 1}};
  for (const Mm& s : ragged) {
    SCOPED_TRACE(std::to_string(s.m) + "x" + std::to_string(s.n) + "x" + std::to_string(s.k));
    check(plain(s), tiled_configs());
  }
}

TEST(MatmulHost, TransposedOperandsAreReadInPlace) {
  for (const Mm& s : {Mm{33, 65, 7, DType::F32, true}, Mm{128, 128, 128, DType::F32, true}, Mm{1, 7, 65, DType::F32, true}}) {
    SCOPED_TRACE(std::to_string(s.m) + "x" + std::to_string(s.n) + "x" + std::to_string(s.k));
    check(with_epilogue(s, Epi::Bias), tiled_configs());
  }
  // A read through a permute ([K, B, M] -> [B, M, K]) and B through a transpose of
  // its batch-less weight: column-major A (m-fast copies) and k-fast B.
  GraphBuilder b("perm");
  Value a = permute(b.param("in0", DType::F32, {33, 3, 17}), {1, 2, 0});
  Value w = transpose(b.param("in1", DType::F32, {9, 33}), 0, 1);
  b.ret(matmul(a, w));
  check(finish(b), tiled_configs());
}

TEST(MatmulHost, BatchedWithBroadcastBatchDims) {
  struct Case {
    Shape a, b;
  };
  const Case cases[] = {
      {{2, 3}, {}},    // B shared by every batch (x @ w)
      {{}, {4}},       // A shared
      {{2, 1}, {3}},   // both broadcast: batch [2, 3]
      {{1, 5}, {1}},   // size-1 batch dims everywhere
  };
  for (const Case& c : cases) {
    Mm s{33, 17, 9};
    s.a_batch = c.a;
    s.b_batch = c.b;
    SCOPED_TRACE("a batch " + shape_str(c.a) + " b batch " + shape_str(c.b));
    check(with_epilogue(s, Epi::Bias), tiled_configs());
    s.transpose_b = true;
    check(with_epilogue(s, Epi::Residual), {KernelConfig{}});
  }
}

TEST(MatmulHost, HalfStorageAccumulatesInF32) {
  for (DType dt : {DType::F16, DType::BF16}) {
    SCOPED_TRACE(std::string(dtype_name(dt)));
    Mm s{65, 33, 128, dt};
    check(with_epilogue(s, Epi::Bias), tiled_configs());
    s.transpose_b = true;
    check(with_epilogue(s, Epi::BiasGelu), {KernelConfig{}});
  }
}

TEST(MatmulHost, Epilogues) {
  const Epi all[] = {Epi::None, Epi::Bias, Epi::BiasRelu, Epi::BiasGelu, Epi::Scale,
                     Epi::Residual, Epi::CastBf16, Epi::RawAndBiasRelu, Epi::ScaleBiasTanhResidual};
  for (Epi e : all) {
    SCOPED_TRACE("epilogue " + std::to_string(static_cast<int>(e)));
    Mm s{65, 33, 40, DType::F32, true};
    check(with_epilogue(s, e), {KernelConfig{}, config(16, 16, 8, 1, 3, 1)});
  }
}

TEST(MatmulHost, ReshapedDenseOperand) {
  // reshape of a C-order param is the identity on its flat index: one stride per dim.
  GraphBuilder b("reshaped");
  Value x = b.param("in0", DType::F32, {2, 20, 24});
  Value w = reshape(b.param("in1", DType::F32, {6, 4, 9}), {24, 9});
  b.ret(matmul(x, w));
  check(finish(b), tiled_configs());
}

TEST(MatmulHost, TiledKernelWithI64Indices) {
  // emit_matmul picks i64 only past 2^30 elements; the same code, forced, on small data.
  Mm s{65, 33, 40, DType::BF16, true};
  s.a_batch = {2, 1};
  s.b_batch = {3};
  Graph g = with_epilogue(s, Epi::ScaleBiasTanhResidual);
  std::vector<Tensor> in = make_inputs(g, 5);
  Result<std::vector<Tensor>> want = evaluate(g, in);
  ASSERT_TRUE(want.ok()) << want.error().str();
  const std::vector<KernelConfig> configs = tiled_configs();
  for (size_t i = 0; i < configs.size(); ++i) {
    if (!test::in_sample(i)) continue;  // the sanitizer build's sample (tests/sanitized.h)
    const KernelConfig& cfg = configs[i];
    Result<std::vector<Tensor>> got = run_tiled(g, in, cfg, /*wide_index=*/true);
    ASSERT_TRUE(got.ok()) << got.error().str();
    expect_close(*got, *want, "i64 tiled " + std::to_string(cfg.block_m) + "x" + std::to_string(cfg.block_n));
  }
}

TEST(MatmulHost, GeluIsDecomposedIntoErf) {
  Graph g = with_epilogue({8, 8, 8}, Epi::BiasGelu);
  bool erf = false;
  for (const Node& n : g.nodes()) {
    EXPECT_NE(n.op, OpKind::Gelu);
    erf = erf || n.op == OpKind::Erf;
  }
  EXPECT_TRUE(erf);
}

TEST(MatmulHost, IntegerMatmulIsExact) {
  for (DType dt : {DType::I32, DType::I64}) {
    SCOPED_TRACE(std::string(dtype_name(dt)));
    check(with_epilogue({33, 65, 17, dt, true}, Epi::Bias));
  }
}

TEST(MatmulHost, EmptyContractionGivesTheEpilogueOfZero) {
  check(with_epilogue({5, 9, 0}, Epi::Bias), tiled_configs());
  check(plain({0, 9, 4}), {KernelConfig{}});
}

// Every "matmul" kernel the fusion pass forms for the shipped examples (rank 0):
// emitted for the host and the tiled kernel, checked against the reference on its
// group, and compiled for sm_90a.
TEST(MatmulHost, FusionGroupsOfTheExamples) {
  int groups = 0;
  for (const char* file : {"tp_mlp.sf", "seq_parallel_mlp.sf", "tp_attention.sf", "transformer_block.sf", "fsdp_tp_2d.sf",
                           "fsdp_mlp.sf"}) {
    Result<Graph> g = parse_file(std::string(SF_SOURCE_DIR) + "/examples/" + file);
    ASSERT_TRUE(g.ok()) << g.error().str();
    DeviceMesh mesh(g->mesh());
    LocalProgram p = ok_value(rank_program(*g, propagate(*g, mesh), mesh, 0));
    for (const LocalKernel& k : p.kernels) {
      if (k.kind != KernelKind::Matmul) continue;
      SCOPED_TRACE(std::string(file) + ": " + k.name);
      ++groups;
      check(k.group, {KernelConfig{}});
      Result<EmittedKernel> e = emit_matmul(spec_of(k.group, k.name), {}, llvmb::Target::nvptx("sm_90a"));
      ASSERT_TRUE(e.ok()) << e.error().str();
      Result<std::string> ptx = llvmb::compile_to_ptx(*e->module, "sm_90a");
      EXPECT_TRUE(ptx.ok()) << ptx.error().str();
    }
  }
  EXPECT_GE(groups, 8);
  std::printf("%d matmul groups from the examples\n", groups);
}

// ---- NVPTX ------------------------------------------------------------------------------------------



struct Resources {
  int registers = -1;
  int64_t spill_bytes = -1;  // stores + loads
};



struct Ptx {
  std::string ir, ptx;
  LaunchShape launch;
  Resources res;
};

// Emits for `arch`: verifier, compile_to_ptx and (when present) ptxas must pass.
Ptx emit_ptx(const Graph& g, const std::string& arch, const KernelConfig& cfg = {}) {
  Result<EmittedKernel> k = emitter_for(KernelKind::Matmul).emit(spec_of(g, "mm_kernel"), cfg, llvmb::Target::nvptx(arch));
  if (!k) {
    ADD_FAILURE() << k.error().str();
    return {};
  }
  Ptx out;
  out.launch = k->launch;
  std::optional<std::string> bad = llvmb::verify(*k->module);
  EXPECT_FALSE(bad) << *bad;
  out.ir = module_text(*k->module);
  Result<std::string> ptx = llvmb::compile_to_ptx(*k->module, arch);
  if (!ptx) {
    ADD_FAILURE() << ptx.error().str();
    return out;
  }
  out.ptx = *ptx;
  if (have_ptxas()) {
    Result<std::vector<KernelResources>> r = assemble(out.ptx, arch);
    EXPECT_TRUE(r.ok()) << r.error().str();
    if (r.ok() && !r->empty()) out.res = {(*r)[0].registers, (*r)[0].spill_store_bytes + (*r)[0].spill_load_bytes};
  }
  return out;
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST(MatmulNvptx, TiledKernelWithEpilogueForSm80AndSm90a) {
  if (!have_ptxas()) std::printf("note: %s not found; ptxas checks skipped\n", SF_PTXAS_PATH);
  for (DType dt : {DType::F32, DType::BF16}) {
    // bias + gelu, then cast to bf16: the epilogue math must sit in the one .entry.
    GraphBuilder b("mm_gelu_bf16");
    Value x = b.param("in0", dt, {200, 96});
    Value w = b.param("in1", dt, {130, 96});
    Value h = matmul(x, transpose(w, 0, 1)) + b.param("in2", dt, {130});
    b.ret(cast(gelu(h), DType::BF16));
    Graph g = decompose(finish(b));
    for (const char* arch : {"sm_80", "sm_90a"}) {
      SCOPED_TRACE(std::string(arch) + " " + std::string(dtype_name(dt)));
      Ptx p = emit_ptx(g, arch);
      EXPECT_EQ(count(p.ptx, ".entry "), 1u);
      EXPECT_NE(p.ptx.find(".target " + std::string(arch)), std::string::npos);
      EXPECT_NE(p.ptx.find(".entry mm_kernel("), std::string::npos);
      EXPECT_NE(p.ptx.find(".maxntid 128, 1, 1"), std::string::npos);
      EXPECT_NE(p.ptx.find(".extern .shared .align 16 .b8 sf_smem[]"), std::string::npos) << p.ptx;
      if (dt == DType::F32) {  // copied by cp.async, no registers on the way
        EXPECT_NE(p.ptx.find("cp.async.ca.shared.global"), std::string::npos) << p.ptx;
        EXPECT_NE(p.ptx.find("cp.async.commit_group"), std::string::npos);
        EXPECT_NE(p.ptx.find("cp.async.wait_group 0"), std::string::npos);
        EXPECT_EQ(p.ptx.find("st.shared"), std::string::npos);
      } else {  // widened to f32 on the way through registers
        EXPECT_NE(p.ptx.find("st.shared.f32"), std::string::npos);
        EXPECT_EQ(p.ptx.find("cp.async"), std::string::npos);
      }
      EXPECT_NE(p.ptx.find("ld.shared.v4.f32"), std::string::npos) << "register tiles read as vectors";
      EXPECT_NE(p.ptx.find("bar.sync"), std::string::npos);
      EXPECT_NE(p.ptx.find("fma.rn.f32"), std::string::npos);
      // The epilogue: its erf reaches the output only through the cast to bf16, so it
      // is erf_for_16bit (one ex2.approx.ftz, no libdevice erff); no calls left; the
      // bf16 rounding.
      EXPECT_EQ(p.ir.find("@__nv_erff"), std::string::npos);
      EXPECT_NE(p.ptx.find("ex2.approx.ftz.f32"), std::string::npos);
      // The whole GELU is gelu_for_16bit: a max(x, 0) for each of its reciprocals.
      EXPECT_NE(p.ptx.find("max.NaN.f32"), std::string::npos) << "GELU is gelu_for_16bit in a matmul epilogue";
      EXPECT_EQ(count(p.ptx, "max.NaN.f32"), count(p.ptx, "rcp.approx.ftz.f32"));
      EXPECT_EQ(p.ptx.find("call"), std::string::npos) << "the PTX still calls a function";
      EXPECT_EQ(p.ptx.find(".func"), std::string::npos);
      EXPECT_NE(p.ptx.find("cvt.rn.bf16.f32"), std::string::npos);
      EXPECT_NE(p.ptx.find("st.global.b16"), std::string::npos) << p.ptx;
      // 200 / 64 = 4 row tiles by 130 / 64 = 3 column tiles; two stages of a 16 x (64+4)
      // A tile (k-fast copies: padded) and a 16 x (64+4) B tile (w read k-fast too).
      EXPECT_EQ(p.launch.grid[0], 12);
      EXPECT_EQ(p.launch.grid[1], 1);
      EXPECT_EQ(p.launch.block[0], 128);
      EXPECT_EQ(p.launch.shared_bytes, 2 * 16 * (68 + 68) * 4);
    }
  }
}

// A 1 + erf that is not GELU's product ((1 + erf(z)) x 0.5 multiplied in that order)
// keeps erf_for_16bit and an add in a matmul epilogue (MatmulEpilogue: erfc's MUFU
// chains there spilled the tensor-core kernels), with the same output type as above.
TEST(MatmulNvptx, ALoneOnePlusErfStaysErfInAnEpilogue) {
  GraphBuilder b("mm_erf_bf16");
  Value x = b.param("in0", DType::BF16, {200, 96});
  Value w = b.param("in1", DType::BF16, {130, 96});
  Value h = cast(matmul(x, transpose(w, 0, 1)) + b.param("in2", DType::BF16, {130}), DType::F32);
  b.ret(cast((1.0 + unary(OpKind::Erf, h * 0.7071067811865476)) * h * 0.5, DType::BF16));
  Ptx p = emit_ptx(finish(b), "sm_90a");
  EXPECT_NE(p.ptx.find("ex2.approx.ftz.f32"), std::string::npos);
  EXPECT_EQ(p.ptx.find("rcp.approx"), std::string::npos) << "1 + erf became erfc in a matmul epilogue";
  EXPECT_EQ(p.ptx.find("max.NaN.f32"), std::string::npos) << "not a GELU product";
}

// The copies of K tile k+1 are issued before the FMAs of tile k: after the first
// barrier, before the first FMA, in the emitted IR (whose blocks are in program
// order; the PTX's may be rotated). stages = 1: copy, barrier, FMAs, with no copy
// between.
TEST(MatmulNvptx, StagesIssueTheNextTileBeforeTheFmas) {
  auto issued_between_sync_and_fma = [](const std::string& ir, const std::string& copy) {
    size_t sync = ir.find("call void @llvm.nvvm.barrier0()"), fma = ir.find("@llvm.fmuladd.f32(");
    EXPECT_NE(sync, std::string::npos);
    EXPECT_NE(fma, std::string::npos);
    return sync < fma && ir.find(copy, sync) < fma;
  };
  for (DType dt : {DType::BF16, DType::F32}) {
    SCOPED_TRACE(std::string(dtype_name(dt)));
    Graph g = with_epilogue({256, 256, 256, dt}, Epi::Bias);
    // bf16: register-staged (global loads, then shared stores after the FMAs); f32:
    // cp.async with stages-1 tiles in flight.
    const std::string copy = dt == DType::F32 ? "@llvm.nvvm.cp.async.ca.shared.global.4.s(" : "load i16, ptr addrspace(1)";
    for (int stages : {2, 3, 4}) {
      SCOPED_TRACE(stages);
      Ptx p = emit_ptx(g, "sm_90a", config(64, 64, 16, 4, stages));
      EXPECT_TRUE(issued_between_sync_and_fma(p.ir, copy)) << p.ir;
      EXPECT_EQ(p.launch.shared_bytes, stages * 16 * (68 + 64) * 4);
      if (dt == DType::F32) {
        EXPECT_NE(p.ptx.find("cp.async.wait_group " + std::to_string(stages - 2)), std::string::npos);
      }
    }
    Ptx p = emit_ptx(g, "sm_90a", config(64, 64, 16, 4, 1));
    EXPECT_FALSE(issued_between_sync_and_fma(p.ir, dt == DType::F32 ? "load float, ptr addrspace(1)" : copy));
    EXPECT_EQ(p.ptx.find("cp.async"), std::string::npos);
    EXPECT_EQ(p.launch.shared_bytes, 16 * (68 + 64) * 4);
  }
  // No cp.async before sm_80.
  Ptx p = emit_ptx(with_epilogue({64, 64, 64}, Epi::Bias), "sm_75");
  EXPECT_EQ(p.ptx.find("cp.async"), std::string::npos);
  EXPECT_NE(p.ptx.find("st.shared.f32"), std::string::npos);
}

TEST(MatmulNvptx, DefaultConfigHasNoSpillsOnSm90a) {
  if (!have_ptxas()) GTEST_SKIP() << SF_PTXAS_PATH << " not found";
  for (DType dt : {DType::F32, DType::F16, DType::BF16}) {
    SCOPED_TRACE(std::string(dtype_name(dt)));
    Graph g = with_epilogue({512, 512, 512, dt, true}, Epi::BiasGelu);
    Ptx p = emit_ptx(g, "sm_90a");
    EXPECT_GT(p.res.registers, 0) << "no register count in ptxas -v output";
    EXPECT_EQ(p.res.spill_bytes, 0) << "spills";
    EXPECT_LE(p.res.registers, 255);
    std::printf("default config, %s bias+gelu on sm_90a: %d registers, %lld spill bytes, %d bytes shared\n",
                std::string(dtype_name(dt)).c_str(), p.res.registers, static_cast<long long>(p.res.spill_bytes), p.launch.shared_bytes);
    RecordProperty(std::string("registers_") + std::string(dtype_name(dt)), p.res.registers);
  }
}

TEST(MatmulNvptx, EveryTestedConfigAssembles) {
  Graph g = with_epilogue({130, 70, 50, DType::F16}, Epi::BiasRelu);
  std::vector<KernelConfig> cfgs = tiled_configs();
  cfgs.push_back(config(128, 128, 32, 8, 3, 8));
  cfgs.push_back(config(128, 64, 64, 4, 4, 4));
  cfgs.push_back(config(32, 32, 16, 2, 1, 1));
  for (const KernelConfig& c : cfgs) {
    SCOPED_TRACE(std::to_string(c.block_m) + "x" + std::to_string(c.block_n) + "x" + std::to_string(c.block_k));
    Ptx p = emit_ptx(g, "sm_90a", c);
    EXPECT_NE(p.ptx.find("bar.sync"), std::string::npos);
    EXPECT_EQ(p.launch.block[0], c.warps * 32);
  }
}

TEST(MatmulNvptx, BatchIsGridYAndIndexWidthFollowsTheSizes) {
  Mm s{64, 64, 64};
  s.a_batch = {6};
  s.b_batch = {6};  // a B per batch: a batched A times a shared B folds into rows
  Ptx p = emit_ptx(with_epilogue(s, Epi::Bias), "sm_90a");
  EXPECT_EQ(p.launch.grid[0], 1);
  EXPECT_EQ(p.launch.grid[1], 6);
  EXPECT_NE(p.ptx.find("%ctaid.y"), std::string::npos);
  EXPECT_NE(p.ir.find("phi i32"), std::string::npos);
  // With a shared B the 6 x 64 rows are one product (fold_batch_into_rows): 6 row
  // tiles on grid x, no batch.
  s.b_batch = {};
  Ptx folded = emit_ptx(with_epilogue(s, Epi::Bias), "sm_90a");
  EXPECT_EQ(folded.launch.grid[0], 6);
  EXPECT_EQ(folded.launch.grid[1], 1);
  // A with 2^32 elements: i64 offsets.
  Ptx big = emit_ptx(plain({int64_t{1} << 16, 64, int64_t{1} << 16}), "sm_90a");
  EXPECT_NE(big.ir.find("phi i64"), std::string::npos);
  EXPECT_EQ(big.ir.find("phi i32"), std::string::npos);
  EXPECT_EQ(big.launch.grid[0], 1024);
}

// ---- errors ---------------------------------------------------------------------------------------

std::string emit_error(const Graph& g, const KernelConfig& cfg = {}, const llvmb::Target& t = llvmb::Target::nvptx("sm_90a"),
                       const std::string& entry = "mm") {
  Result<EmittedKernel> k = emitter_for(KernelKind::Matmul).emit(spec_of(g, entry), cfg, t);
  if (k.ok()) {
    ADD_FAILURE() << "expected a Diag";
    return "";
  }
  EXPECT_EQ(k.error().message.rfind("matmul", 0), 0u) << k.error().message;
  return k.error().message;
}

TEST(MatmulErrors, UnsupportedConfigsAreDiags) {
  Graph g = with_epilogue({64, 64, 64}, Epi::Bias);
  struct Bad {
    KernelConfig cfg;
    const char* says;
  };
  auto with = [](auto f) {
    KernelConfig c;
    f(c);
    return c;
  };
  const Bad bad[] = {
      {with([](KernelConfig& c) { c.block_m = 48; }), "block_m"},
      {with([](KernelConfig& c) { c.block_n = 0; }), "block_n"},
      {with([](KernelConfig& c) { c.block_k = 256; }), "block_k"},
      {with([](KernelConfig& c) { c.warps = 3; }), "warps"},
      {with([](KernelConfig& c) { c.warps = 64; }), "warps"},
      {with([](KernelConfig& c) { c.stages = 0; }), "stages"},
      {with([](KernelConfig& c) { c.group_m = 0; }), "group_m"},
      {with([](KernelConfig& c) { c.split_k = 3; }), "split_k"},
      {config(16, 16, 16, 16), "fewer elements than warps * 32"},
      {config(256, 256, 16, 4), "accumulators"},
      {config(256, 16, 128, 4, 8), "shared memory"},
  };
  for (const Bad& b : bad) {
    std::string msg = emit_error(g, b.cfg);
    EXPECT_NE(msg.find(b.says), std::string::npos) << msg;
    // The same config is rejected for the host-run tiled kernel; the host kernel reads none.
    EXPECT_FALSE(emit_matmul_block_on_host(spec_of(g), b.cfg).ok());
    EXPECT_TRUE(emit_matmul(spec_of(g), b.cfg, llvmb::Target::host()).ok());
  }
  // sm_86 has 99 KiB per block: 64 KiB fit, 128 KiB do not.
  KernelConfig big = config(128, 128, 64, 8, 2);  // 2 * 64 * (132 + 128) * 4 = 133120 bytes
  EXPECT_NE(emit_error(g, big, llvmb::Target::nvptx("sm_86")).find("sm_86"), std::string::npos);
  EXPECT_TRUE(emit_matmul(spec_of(g), big, llvmb::Target::nvptx("sm_90a")).ok());
}

// Split-K: grid z splits the K tiles; each block adds its partial sums into the
// zeroed output atomically. Run block by block on the host against the reference.
TEST(MatmulSplitK, PartialSumsAddUpToTheMatmul) {
  auto split = [](KernelConfig c, int s) {
    c.split_k = s;
    return c;
  };
  // K = 128 is 8 tiles of 16 (or 4 of 32): splits 2, 4 and 8 divide them; M and N ragged.
  for (const Mm& s : {Mm{33, 65, 128}, Mm{7, 130, 128}, Mm{64, 64, 256}}) {
    SCOPED_TRACE(std::to_string(s.m) + "x" + std::to_string(s.n) + "x" + std::to_string(s.k));
    check(plain(s), {split(config(32, 32, 16, 2), 2), split(config(32, 64, 16, 4, 3), 4),
                     split(config(64, 32, 16, 4, 1), 8), split(config(16, 16, 32, 1, 2), 4)});
  }
  // Batched: blockIdx.y is the batch, blockIdx.z the split.
  GraphBuilder b("bmm");
  b.ret(matmul(b.param("in0", DType::F32, {3, 17, 64}), b.param("in1", DType::F32, {64, 9})));
  check(finish(b), {split(config(16, 16, 16, 1), 4)});
}

TEST(MatmulSplitK, LaunchAndPtx) {
  KernelConfig c = config(64, 64, 16, 4);
  c.split_k = 4;
  Ptx p = emit_ptx(plain({128, 96, 512}), "sm_90a", c);
  EXPECT_EQ(p.launch.grid[2], 4);
  EXPECT_EQ(p.launch.grid[0], 2 * 2);
  EXPECT_TRUE(p.launch.zero_outputs);
  // The partial sums go out as f32 atomic adds (red or atom), and nothing else stores.
  EXPECT_TRUE(p.ptx.find("red.global.add.f32") != std::string::npos ||
              p.ptx.find("atom.global.add.f32") != std::string::npos)
      << p.ptx;
  EXPECT_EQ(p.ptx.find("st.global"), std::string::npos);
  EXPECT_NE(p.ptx.find("%ctaid.z"), std::string::npos);
  Ptx one = emit_ptx(plain({128, 96, 512}), "sm_90a", config(64, 64, 16, 4));
  EXPECT_FALSE(one.launch.zero_outputs);
  EXPECT_EQ(one.ptx.find("%ctaid.z"), std::string::npos) << "split_k = 1 is the kernel it was";
}

// Split-K of anything but a bare f32 matmul (an epilogue, bf16 storage, two outputs):
// the partial sums meet in the f32 workspace and the last block of each tile (a
// different z from tile to tile: run_tiled rotates the order) runs the epilogue;
// run_tiled fails a launch that leaves the workspace nonzero.
TEST(MatmulSplitK, AWorkspaceSumsTheSharesOfAnyGroup) {
  auto split = [](KernelConfig c, int s) {
    c.split_k = s;
    return c;
  };
  const Mm s{33, 65, 128};
  check(with_epilogue(s, Epi::BiasGelu), {split(config(32, 32, 16, 2), 2), split(config(16, 16, 32, 1, 2), 4)});
  check(with_epilogue(s, Epi::RawAndBiasRelu), {split(config(32, 64, 16, 4, 3), 8)});
  check(plain({40, 24, 64, DType::BF16}), {split(config(16, 16, 16, 1), 4)});
  Mm batched{17, 9, 64};
  batched.a_batch = {3};
  check(with_epilogue(batched, Epi::Residual), {split(config(16, 16, 16, 1), 4)});
  // The launch: no zeroed outputs, a workspace of the f32 sums and a counter per tile;
  // the PTX adds, fences, counts and reads the sums back.
  KernelConfig c = split(config(64, 64, 16, 4), 4);
  Ptx p = emit_ptx(with_epilogue({128, 96, 512}, Epi::BiasGelu), "sm_90a", c);
  EXPECT_FALSE(p.launch.zero_outputs);
  EXPECT_EQ(p.launch.workspace_bytes, 4 * (128 * 96 + 2 * 2));
  EXPECT_NE(p.ptx.find("membar.gl"), std::string::npos);
  EXPECT_NE(p.ptx.find("atom.global.add.u32"), std::string::npos);
  EXPECT_NE(p.ptx.find("ld.volatile"), std::string::npos);
}

TEST(MatmulSplitK, OnlyWhereItDividesTheKTiles) {
  KernelConfig c;
  c.split_k = 4;  // K = 48 is 3 tiles of 16
  EXPECT_NE(emit_error(plain({64, 64, 48}), c).find("does not divide the 3 K tiles"), std::string::npos);
  c.split_k = 3;
  EXPECT_NE(emit_error(plain({64, 64, 48}), c).find("not a power of two"), std::string::npos);
  // A block_k of 0 from a cache or --matmul-config: refused by the block_k check, not
  // a division by zero in the split's K-tile count (it was: SIGFPE).
  c.split_k = 2;
  c.block_k = 0;
  EXPECT_NE(emit_error(plain({64, 64, 48}), c).find("block_k = 0"), std::string::npos);
}

TEST(MatmulErrors, UnsupportedGroupsAreDiags) {
  {
    GraphBuilder b("none");
    b.ret(relu(b.param("x", DType::F32, {4, 4})));
    EXPECT_NE(emit_error(finish(b)).find("no matmul"), std::string::npos);
  }
  {
    GraphBuilder b("two");
    Value x = b.param("x", DType::F32, {4, 4});
    b.ret(matmul(matmul(x, x), x));
    EXPECT_NE(emit_error(finish(b)).find("more than one matmul"), std::string::npos);
  }
  {
    GraphBuilder b("reduce");
    Value x = b.param("x", DType::F32, {4, 4});
    b.ret(sum(matmul(x, x), {1}));
    EXPECT_NE(emit_error(finish(b)).find("sum"), std::string::npos);
  }
  {
    GraphBuilder b("composite");
    Value x = b.param("x", DType::F32, {4, 4});
    b.ret(gelu(matmul(x, x)));
    EXPECT_NE(emit_error(finish(b)).find("decomposed"), std::string::npos);
  }
  {
    GraphBuilder b("prologue");
    Value x = b.param("x", DType::F32, {4, 4});
    b.ret(matmul(relu(x), x));
    EXPECT_NE(emit_error(finish(b)).find("operand A is computed"), std::string::npos);
  }
  {
    // A reshape of a dense param is read in place (MatmulHost.ReshapedDenseOperand);
    // one of a transposed param has no stride per dim.
    GraphBuilder b("reshape");
    Value x = b.param("x", DType::F32, {4, 4});
    b.ret(matmul(x, reshape(transpose(b.param("w", DType::F32, {8, 2}), 0, 1), {4, 4})));
    EXPECT_NE(emit_error(finish(b)).find("reshape"), std::string::npos);
  }
  {
    // A view escaping with another shape than the matmul's output.
    GraphBuilder b("escape");
    Value x = b.param("x", DType::F32, {4, 8});
    Value t = transpose(b.param("w", DType::F32, {6, 8}), 0, 1);
    b.ret(matmul(x, t));
    b.ret(t);
    EXPECT_NE(emit_error(finish(b)).find("not on the matmul's output space"), std::string::npos);
  }
  {
    // Same element count, other shape: not an epilogue either.
    GraphBuilder b("space");
    Value x = b.param("x", DType::F32, {4, 4});
    Value w = b.param("w", DType::F32, {4, 4});
    b.ret(matmul(x, w));
    b.ret(relu(transpose(b.param("y", DType::F32, {2, 8}), 0, 1)));
    EXPECT_NE(emit_error(finish(b)).find("not on the matmul's output space"), std::string::npos);
  }
  {
    // A view after the matmul: same shape, but another element of the result.
    GraphBuilder b("after");
    Value x = b.param("x", DType::F32, {4, 4});
    b.ret(relu(transpose(matmul(x, x), 0, 1)));
    EXPECT_NE(emit_error(finish(b)).find("a view after the matmul"), std::string::npos);
  }
  Graph ints = with_epilogue({8, 8, 8, DType::I32}, Epi::None);
  EXPECT_NE(emit_error(ints).find("i32 matmul is not supported on NVPTX"), std::string::npos);
  Graph ok = plain({8, 8, 8});
  EXPECT_NE(emit_error(ok, {}, llvmb::Target::nvptx("compute_90")).find("arch"), std::string::npos);
  EXPECT_NE(emit_error(ok, {}, llvmb::Target::host(), "not an identifier").find("C identifier"), std::string::npos);
  Mm many{4, 4, 4};
  many.a_batch = {70000};
  many.b_batch = {70000};  // (a shared B would fold the batch into rows)
  EXPECT_NE(emit_error(plain(many)).find("65535"), std::string::npos);
}

TEST(MatmulRegistry, MatmulKindIsRegistered) {
  Graph g = with_epilogue({8, 8, 8}, Epi::BiasRelu);
  Result<EmittedKernel> k = emitter_for(KernelKind::Matmul).emit(spec_of(g), {}, llvmb::Target::nvptx("sm_90a"));
  ASSERT_TRUE(k.ok()) << k.error().str();
  EXPECT_EQ(k->entry, "mm");
  EXPECT_GT(k->launch.shared_bytes, 0);
}

// ---- timings -------------------------------------------------------------------------------------

TEST(MatmulTiming, BiasGeluEmitAndCompile) {
  Graph g = with_epilogue({1024, 1024, 1024, DType::BF16, true}, Epi::BiasGelu);
  using clock = std::chrono::steady_clock;
  auto ms = [](clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); };
  auto t0 = clock::now();
  Result<EmittedKernel> host = emit_matmul(spec_of(g, "mm_host"), {}, llvmb::Target::host());
  auto t1 = clock::now();
  ASSERT_TRUE(host.ok()) << host.error().str();
  Result<void*> fn = jit().add(std::move(host->module), std::move(host->context), host->entry);
  auto t2 = clock::now();
  ASSERT_TRUE(fn.ok()) << fn.error().str();
  auto t3 = clock::now();
  Result<EmittedKernel> gpu = emit_matmul(spec_of(g, "mm_gpu"), {}, llvmb::Target::nvptx("sm_90a"));
  auto t4 = clock::now();
  ASSERT_TRUE(gpu.ok()) << gpu.error().str();
  Result<std::string> ptx = llvmb::compile_to_ptx(*gpu->module, "sm_90a");
  auto t5 = clock::now();
  ASSERT_TRUE(ptx.ok()) << ptx.error().str();
  double ptxas_ms = 0;
  if (have_ptxas()) {
    auto t6 = clock::now();
    std::string failure = ptxas_failure(*ptx, "sm_90a");
    ptxas_ms = ms(clock::now() - t6);
    EXPECT_EQ(failure, "");
  }
  std::printf("bf16 bias+gelu matmul: host emit %.2f ms, JIT compile %.2f ms; NVPTX emit %.2f ms, "
              "compile_to_ptx %.2f ms, ptxas %.2f ms\n",
              ms(t1 - t0), ms(t2 - t1), ms(t4 - t3), ms(t5 - t4), ptxas_ms);
  RecordProperty("host_emit_ms", std::to_string(ms(t1 - t0)));
  RecordProperty("host_compile_ms", std::to_string(ms(t2 - t1)));
  RecordProperty("ptx_emit_ms", std::to_string(ms(t4 - t3)));
  RecordProperty("ptx_compile_ms", std::to_string(ms(t5 - t4)));
}

}  // namespace kernels_matmul_test
}  // namespace sf
