// The tensor-core matmul kernels built for the host and run on the simulated thread
// block of mma_sim.h: the graphs and configs the matmul tests share, every block of a
// launch run against the float64 reference (matmul_mma_test.cpp: mma.sync, NVPTX,
// paths; matmul_wgmma_test.cpp: wgmma; matmul_fold_test.cpp: the batch folded).
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "codegen/ir/builder.h"
#include "codegen/ir/decompose.h"
#include "codegen/kernels/matmul.h"
#include "codegen/reference/compare.h"
#include "codegen/reference/evaluate.h"
#include "tests/kernels/kernel_test_util.h"
#include "tests/kernels/mma_sim.h"
#include "tests/kernels/mma_sim_cluster.h"

namespace sf::mma_sim {

using kernel_test::finish;
using kernel_test::jit;
using kernel_test::output_tensors;

// ---- graphs and running ------------------------------------------------------------------

// Uniform [-1, 1), deterministic per seed.
inline std::vector<Tensor> make_inputs(const Graph& g, uint64_t seed) {
  std::vector<Tensor> in;
  for (size_t p = 0; p < g.params().size(); ++p) {
    const TensorType& t = g.node(g.params()[p]).type;
    Tensor x(t.dtype, t.shape);
    std::mt19937_64 rng(seed + 7919 * p);
    for (int64_t i = 0; i < x.numel(); ++i) x.set(i, -1.0 + 2.0 * static_cast<double>(rng() >> 11) * 0x1p-53);
    in.push_back(std::move(x));
  }
  return in;
}

struct Shape3 {
  int64_t m, n, k;
  bool a_t = false;  // A is transpose(a) with a [K, M]: m contiguous
  bool b_t = false;  // B is transpose(w) with w [N, K]: k contiguous
  Shape batch;       // batch dims of both operands
};

enum class Epi { None, BiasGelu, Residual, RawAndBiasRelu };

inline Graph mm_graph(const Shape3& s, DType dt, Epi e) {
  GraphBuilder b("mm");
  Shape sa = s.batch, sb = s.batch;
  const int64_t r = static_cast<int64_t>(s.batch.size()) + 2;
  Value a, w;
  if (s.a_t) {
    sa.insert(sa.end(), {s.k, s.m});
    a = transpose(b.param("in0", dt, sa), r - 2, r - 1);
  } else {
    sa.insert(sa.end(), {s.m, s.k});
    a = b.param("in0", dt, sa);
  }
  if (s.b_t) {
    sb.insert(sb.end(), {s.n, s.k});
    w = transpose(b.param("in1", dt, sb), r - 2, r - 1);
  } else {
    sb.insert(sb.end(), {s.k, s.n});
    w = b.param("in1", dt, sb);
  }
  Value h = matmul(a, w);
  switch (e) {
    case Epi::None: b.ret(h); break;
    case Epi::BiasGelu: b.ret(gelu(h + b.param("in2", dt, {s.n}))); break;
    case Epi::Residual: b.ret(h + b.param("in2", dt, h.type().shape)); break;
    case Epi::RawAndBiasRelu:
      b.ret(h);
      b.ret(relu(h + b.param("in2", dt, {s.n})));
      break;
  }
  return decompose(finish(b));
}

inline KernelSpec spec_of(const Graph& g, std::string entry = "mm_tc") { return KernelSpec{std::move(entry), KernelKind::Matmul, g}; }

// --allow-tf32's spec: an f32 matmul may take the tensor cores in TF32.
inline KernelSpec tf32_spec(const Graph& g) {
  KernelSpec s = spec_of(g);
  s.allow_tf32 = true;
  return s;
}

inline KernelConfig tc_config(int bm, int bn, int bk, int warps, int stages, int group_m = 8, int ws = 0) {
  KernelConfig c;
  c.block_m = bm;
  c.block_n = bn;
  c.block_k = bk;
  c.warps = warps;
  c.stages = stages;
  c.group_m = group_m;
  c.warp_specialize = ws;
  return c;
}

// Every block of the launch, its threads as OS threads sharing NaN-filled shared
// memory, a barrier and the simulated warps.
inline Result<std::vector<Tensor>> run_tc(const Graph& g, const std::vector<Tensor>& inputs, const KernelConfig& cfg,
                                   std::string* hw_error, bool ignore_trans = false, int* wavefronts = nullptr,
                                   bool wgmma = false, int* wgmma_calls = nullptr, bool tma = false,
                                   int* tma_copies = nullptr, bool tma_no_swizzle = false, size_t out_shift = 0,
                                   int* setmaxnreg_calls = nullptr, int64_t grid_x = 0, int* tma_stores = nullptr,
                                   int* multicasts = nullptr, int lag_rank = -1) {
  KernelSpec spec = tf32_spec(g);
  spec.tma = tma;
  Result<EmittedKernel> k = emit_matmul_mma_block_on_host(spec, cfg, wgmma);
  if (!k) return k.error();
  LaunchShape launch = k->launch;
  if (grid_x > 0) launch.grid[0] = grid_x;  // `grid_x`: another launch width (a persistent kernel's)
  Result<void*> fn = jit().add(std::move(k->module), std::move(k->context), k->entry);
  if (!fn) return fn.error();
  using Entry = void (*)(void**, int32_t, int32_t, int32_t, void*, const MmaSimHooks*, int32_t, int32_t);
  auto entry = reinterpret_cast<Entry>(*fn);
  std::vector<Tensor> out = output_tensors(g);
  // Outputs start as garbage, or zeroed where the launch says so (split-K).
  for (Tensor& t : out)
    if (t.nbytes()) std::memset(t.data(), launch.zero_outputs ? 0 : 0x7f, t.nbytes());
  // Every input ends at a PROT_NONE page (ArgArray): a kernel that reads past one (an
  // operand tile past K, an epilogue's bias past N) faults.
  kernel_test::ArgArray args = kernel_test::arg_array(inputs, out);
  // `out_shift`: each output `out_shift` bytes past a 64-byte boundary instead (a
  // view's misaligned start), copied back after the launch.
  std::vector<std::vector<std::byte>> shifted(out.size());
  if (out_shift)
    for (size_t o = 0; o < out.size(); ++o) {
      shifted[o].resize(out[o].nbytes() + 64 + out_shift);
      std::byte* base = shifted[o].data();
      base += (64 - reinterpret_cast<uintptr_t>(base) % 64) % 64 + out_shift;
      if (out[o].nbytes()) std::memcpy(base, out[o].data(), out[o].nbytes());
      args[inputs.size() + o] = base;
    }
  std::vector<SimTensorMap> maps;
  // An input's map over the input; a TMA store's over its output, which it must not
  // write past.
  for (const TensorMapSpec& t : launch.tensor_maps)
    maps.push_back(t.output >= 0 ? SimTensorMap{t, args[inputs.size() + static_cast<size_t>(t.output)],
                                                out[static_cast<size_t>(t.output)].nbytes()}
                                 : SimTensorMap{t, args[static_cast<size_t>(t.input)]});
  for (SimTensorMap& m : maps) args.push_back(&m);
  // Split-K in a workspace: zeroed, after the tensor maps; the launch must leave it zero.
  std::vector<uint32_t> workspace(static_cast<size_t>((launch.workspace_bytes + 3) / 4), 0);
  if (launch.workspace_bytes > 0) args.push_back(workspace.data());
  const int threads = launch.block[0];
  // Thread-block clusters (launch.cluster blocks, consecutive in x): run together, each
  // block's threads beside the others'.
  const int per = std::max(launch.cluster, 1);
  if (launch.grid[0] % per != 0) {
    *hw_error = "a grid of " + std::to_string(launch.grid[0]) + " blocks is not whole clusters of " + std::to_string(per);
    return out;
  }
  kernel_test::BlockThreads block(threads * per);
  // Blocks (clusters) run one at a time, those of one (x, y) in a rotated z order: the
  // last of a split-K tile's blocks to arrive is a different z from tile to tile.
  for (int64_t by = 0; by < launch.grid[1]; ++by)
    for (int64_t bx0 = 0; bx0 < launch.grid[0]; bx0 += per)
    for (int64_t zi = 0; zi < launch.grid[2]; ++zi) {
      const int64_t bz = (zi + bx0 + by) % launch.grid[2];
      std::vector<std::unique_ptr<Block>> blks;
      std::vector<MmaSimHooks> hooks(static_cast<size_t>(per));
      for (int r = 0; r < per; ++r) {
        blks.push_back(std::make_unique<Block>(threads, static_cast<size_t>(launch.shared_bytes)));
        Block& blk = *blks.back();
        blk.ignore_trans = ignore_trans;
        blk.ignore_wgmma_trans = ignore_trans;
        blk.tma_ignores_swizzle = tma_no_swizzle;
        blk.rank = r;
        // `lag_rank`: that block's first warpgroup held back at each wgmma, so that
        // the cluster's other blocks run ahead of it as far as the kernel lets them.
        if (r == lag_rank) {
          blk.lag_group = 0;
          blk.lag = std::chrono::microseconds(300);
        }
        std::memset(blk.smem, 0xFF, blk.smem_bytes);  // NaN in both bf16 and f16
        MmaSimHooks& h = hooks[static_cast<size_t>(r)];
        h.ctx = &blk;
        h.barrier = &sim_barrier;
        h.ldmatrix_x4 = &sim_ldmatrix;
        h.mma = &sim_mma;
        h.wgmma = &sim_wgmma;
        h.cp_async = &sim_cp_async;
        h.cp_commit = &sim_cp_commit;
        h.cp_wait = &sim_cp_wait;
        h.wgmma_commit = &sim_wgmma_commit;
        h.wgmma_wait = &sim_wgmma_wait;
        h.tma_load = &sim_tma_load;
        h.mbar_init = &sim_mbar_init;
        h.mbar_expect_tx = &sim_mbar_expect_tx;
        h.mbar_try_wait = &sim_mbar_try_wait;
        h.mbar_arrive = &sim_mbar_arrive;
        h.named_barrier = &sim_named_barrier;
        h.shfl_bfly = &sim_shfl_bfly;
        h.setmaxnreg = &sim_setmaxnreg;
        h.tma_store = &sim_tma_store;
        h.bulk_commit = &sim_bulk_commit;
        h.bulk_wait = &sim_bulk_wait;
        h.proxy_fence = &sim_proxy_fence;
        h.tma_load_multicast = &sim_tma_load_multicast;
        h.mbar_arrive_cluster = &sim_mbar_arrive_cluster;
        h.cluster_barrier = &sim_cluster_barrier;
      }
      std::unique_ptr<Cluster> cl;
      if (per > 1) {
        std::vector<Block*> members;
        for (auto& b : blks) members.push_back(b.get());
        cl = std::make_unique<Cluster>(members, threads);
        for (auto& b : blks) b->cluster = cl.get();
      }
      block.run([&](int u) {
        const int r = u / threads, t = u % threads;
        entry(args.data(), static_cast<int32_t>(bx0 + r), static_cast<int32_t>(by), t, blks[static_cast<size_t>(r)]->smem,
              &hooks[static_cast<size_t>(r)], static_cast<int32_t>(bz), static_cast<int32_t>(launch.grid[0]));
        if (cl) cl->thread_returned(r);
      });
      if (cl && multicasts) *multicasts += cl->multicasts;
      for (auto& bp : blks) {
        Block& blk = *bp;
        blk.check_registers();
        blk.check_bulk();
        if (tma_stores) *tma_stores += blk.tma_stores;
        if (setmaxnreg_calls)
          for (const auto& [thread, calls] : blk.setmaxnreg) *setmaxnreg_calls += static_cast<int>(calls.size());
        if (!blk.error.empty() && hw_error->empty()) *hw_error = blk.error;
        if (wavefronts) *wavefronts = std::max(*wavefronts, blk.wavefronts);
        if (wgmma_calls)
          for (const auto& wg : blk.groups) *wgmma_calls += wg->calls;
        if (tma_copies) *tma_copies += blk.tma_copies;
      }
    }
  if (out_shift)
    for (size_t o = 0; o < out.size(); ++o)
      if (out[o].nbytes()) std::memcpy(out[o].data(), args[inputs.size() + o], out[o].nbytes());
  for (size_t w = 0; w < workspace.size(); ++w)
    if (workspace[w] != 0 && hw_error->empty())
      *hw_error = "the launch left word " + std::to_string(w) + " of its workspace nonzero";
  return out;
}

// `loads`: the kernel reads shared memory at all (K > 0).
// For an f32 graph (TF32 kernels) the reference gets the inputs as the tensor cores
// read them, cut to TF32, so the kernel must match it to f32's tolerance: a kernel
// that skipped TF32 or cut wrongly fails.
inline void check(const Graph& g, const KernelConfig& cfg, const std::string& what, bool loads = true, uint64_t seed = 1,
           bool wgmma = false, bool tma = false, size_t out_shift = 0, int lag_rank = -1) {
  std::vector<Tensor> in = make_inputs(g, seed);
  std::vector<Tensor> ref_in = in;
  for (Tensor& t : ref_in)
    if (t.dtype() == DType::F32)
      for (int64_t i = 0; i < t.numel(); ++i) t.set(i, from_tf32(std::bit_cast<uint32_t>(static_cast<float>(t.get(i)))));
  Result<std::vector<Tensor>> want = evaluate(g, ref_in);
  ASSERT_TRUE(want.ok()) << what << ": " << want.error().str();
  std::string hw_error;
  int wavefronts = 0, wgmma_calls = 0, tma_copies = 0, setmaxnreg_calls = 0, tma_stores = 0, multicasts = 0;
  Result<std::vector<Tensor>> got = run_tc(g, in, cfg, &hw_error, false, &wavefronts, wgmma, &wgmma_calls, tma, &tma_copies,
                                            false, out_shift, &setmaxnreg_calls, 0, &tma_stores, &multicasts, lag_rank);
  ASSERT_TRUE(got.ok()) << what << ": " << got.error().str();
  EXPECT_EQ(hw_error, "") << what;
  EXPECT_EQ(setmaxnreg_calls > 0, cfg.setmaxnreg > 0) << what << ": " << setmaxnreg_calls << " setmaxnreg";
  EXPECT_EQ(tma_stores > 0, cfg.tma_store == 1) << what << ": " << tma_stores << " TMA stores";
  EXPECT_EQ(tma_copies > 0, tma && loads) << what << ": " << tma_copies << " TMA copies";
  EXPECT_EQ(multicasts > 0, loads && cfg.cluster_m * cfg.cluster_n > 1) << what << ": " << multicasts << " multicast copies";
  if (wgmma) {
    EXPECT_EQ(wavefronts, 0) << what << ": the wgmma kernel used ldmatrix";
    EXPECT_EQ(wgmma_calls > 0, loads) << what << ": " << wgmma_calls << " wgmma instructions";
  } else if (g.node(g.params()[0]).type.dtype == DType::F32) {
    // TF32 with both operands m-/n-contiguous loads no fragment by ldmatrix.
    EXPECT_LE(wavefronts, 1) << what << ": an ldmatrix phase hit a bank more than once";
    EXPECT_EQ(wgmma_calls, 0) << what;
  } else {
    // The swizzle as emitted: every ldmatrix phase of the kernel is one wavefront.
    EXPECT_EQ(wavefronts, loads ? 1 : 0) << what << ": an ldmatrix phase hit a bank more than once";
    EXPECT_EQ(wgmma_calls, 0) << what;
  }
  ASSERT_EQ(got->size(), want->size()) << what;
  for (size_t o = 0; o < want->size(); ++o) {
    Comparison c = compare((*got)[o], (*want)[o], default_tolerance((*want)[o].dtype()));
    EXPECT_TRUE(c.ok()) << what << ": output " << o << ": " << c.mismatches << " mismatches, first at flat index "
                        << c.first_mismatch << " (got " << (*got)[o].get(std::max<int64_t>(c.first_mismatch, 0)) << ", want "
                        << (*want)[o].get(std::max<int64_t>(c.first_mismatch, 0)) << "), max abs err " << c.max_abs_err;
  }
}

inline std::string name(const Shape3& s, DType dt, const KernelConfig& c) {
  return std::string(dtype_name(dt)) + " M" + std::to_string(s.m) + " N" + std::to_string(s.n) + " K" + std::to_string(s.k) +
         (s.a_t ? " A^T" : "") + (s.b_t ? " B^T" : "") + " tile " + std::to_string(c.block_m) + "x" +
         std::to_string(c.block_n) + "x" + std::to_string(c.block_k) + " warps " + std::to_string(c.warps) + " stages " +
         std::to_string(c.stages);
}

}  // namespace sf::mma_sim
