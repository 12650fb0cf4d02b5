// The fused attention's tensor-core kernel built for the host and run block by block
// on the simulated hardware of mma_sim.h: each GPU thread an OS thread, its
// mma.sync, wgmma, ldmatrix, cp.async, shuffles and barriers calls to the simulation
// written from the PTX ISA (independently of the emitter's mma_layout.h). Shared by
// flash_attention_test.cpp (mma.sync) and flash_attention_wgmma_test.cpp (wgmma).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "codegen/kernels/attention.h"
#include "tests/kernels/kernel_test_util.h"
#include "tests/kernels/mma_sim.h"

namespace sf::attention_sim {

// What a run did besides its outputs.
struct SimRun {
  std::string hw_error;  // the first thing the simulated hardware refused ("" if none)
  int wavefronts = 0;    // the most any ldmatrix phase took (1: no bank conflict; 0: none ran)
  int64_t copies = 0;    // 16-byte cp.async copies issued
  int64_t mma = 0;       // mma.sync instructions (per warp)
  int64_t wgmma = 0;     // wgmma instructions (per warpgroup)
  int64_t tma = 0;       // TMA boxes copied
  size_t tensor_maps = 0;  // the launch's
  int64_t named_barriers = 0;  // named-barrier instances completed (ping-pong's turns)
  std::map<int, int64_t> regs_inc, regs_dec;  // setmaxnreg.inc / .dec executions by count
};

inline std::atomic<int64_t> cp_async_calls{0}, mma_calls{0};
inline void counted_cp_async(void* ctx, int32_t thread, void* dst, const void* src, int32_t bytes) {
  ++cp_async_calls;
  mma_sim::sim_cp_async(ctx, thread, dst, src, bytes);
}
inline void counted_mma(void* ctx, int32_t thread, int32_t kind, const uint32_t* a, const uint32_t* b, float* cd) {
  if (thread % mma_sim::kLanes == 0) ++mma_calls;
  mma_sim::sim_mma(ctx, thread, kind, a, b, cd);
}

// Every block of the grid of `group`'s kernel under `c`, on `in`. `ignore_trans`:
// hardware whose ldmatrix and wgmma ignore .trans (the tests' proof that they would
// notice); `tma`: the kernel may bring k and v by TMA (KernelSpec::tma); `lag_last`:
// the block's last warpgroup held back at each wgmma (mma_sim::Block::lag_group);
// `after_block`: called with each block's index and the outputs once it ran (the
// blocks run in the order of their index, as a GPU starts them).
inline Result<std::vector<Tensor>> run_simulated(
    const Graph& group, const std::vector<Tensor>& in, const KernelConfig& c, SimRun* run, bool ignore_trans = false,
    bool tma = false, bool lag_last = false,
    const std::function<void(int64_t, const std::vector<Tensor>&)>& after_block = nullptr) {
  KernelSpec spec{"sf_flash_sim", KernelKind::Attention, group};
  spec.tma = tma;
  Result<EmittedKernel> k = emit_attention_block_on_host(spec, c);
  if (!k) return k.error();
  const LaunchShape launch = k->launch;
  Result<void*> fn = kernel_test::jit().add(std::move(k->module), std::move(k->context), k->entry);
  if (!fn) return fn.error();
  using Entry = void (*)(void**, int32_t, int32_t, int32_t, void*, const MmaSimHooks*, int32_t);
  auto entry = reinterpret_cast<Entry>(*fn);
  std::vector<Tensor> out = kernel_test::output_tensors(group);
  for (Tensor& t : out)
    if (t.nbytes()) std::memset(t.data(), 0x7f, t.nbytes());
  kernel_test::ArgArray args = kernel_test::arg_array(in, out);
  // The tensor maps after the outputs, as the matmul's simulation passes them.
  std::vector<SimTensorMap> maps;
  for (const TensorMapSpec& t : launch.tensor_maps) maps.push_back({t, args[static_cast<size_t>(t.input)]});
  for (SimTensorMap& m : maps) args.push_back(&m);
  run->tensor_maps = maps.size();
  kernel_test::BlockThreads block(launch.block[0]);
  cp_async_calls = 0;
  mma_calls = 0;
  for (int64_t bx = 0; bx < launch.grid[0]; ++bx) {
    mma_sim::Block blk(launch.block[0], static_cast<size_t>(launch.shared_bytes));
    blk.ignore_trans = ignore_trans;
    blk.ignore_wgmma_trans = ignore_trans;
    if (lag_last && launch.block[0] >= 2 * 4 * mma_sim::kLanes) {
      blk.lag_group = launch.block[0] / (4 * mma_sim::kLanes) - 1;
      blk.lag = std::chrono::microseconds(2000);
    }
    std::memset(blk.smem, 0xFF, blk.smem_bytes);  // NaN until written
    MmaSimHooks hooks;
    hooks.ctx = &blk;
    hooks.barrier = &mma_sim::sim_barrier;
    hooks.mma = &counted_mma;
    hooks.shfl_bfly = &mma_sim::sim_shfl_bfly;
    hooks.ldmatrix_x4 = &mma_sim::sim_ldmatrix;
    hooks.cp_async = &counted_cp_async;
    hooks.cp_commit = &mma_sim::sim_cp_commit;
    hooks.cp_wait = &mma_sim::sim_cp_wait;
    hooks.wgmma = &mma_sim::sim_wgmma;
    hooks.wgmma_ra = &mma_sim::sim_wgmma_ra;
    hooks.wgmma_commit = &mma_sim::sim_wgmma_commit;
    hooks.wgmma_wait = &mma_sim::sim_wgmma_wait;
    hooks.tma_load = &mma_sim::sim_tma_load;
    hooks.mbar_init = &mma_sim::sim_mbar_init;
    hooks.mbar_expect_tx = &mma_sim::sim_mbar_expect_tx;
    hooks.mbar_try_wait = &mma_sim::sim_mbar_try_wait;
    hooks.mbar_arrive = &mma_sim::sim_mbar_arrive;
    hooks.named_barrier = &mma_sim::sim_named_barrier;
    hooks.setmaxnreg = &mma_sim::sim_setmaxnreg;
    block.run([&](int t) { entry(args.data(), static_cast<int32_t>(bx), 0, t, blk.smem, &hooks, 0); });
    // A named barrier left with arrivals at the block's exit: turns that do not pair.
    for (const auto& [id, n] : blk.named)
      if (n.arrived != 0 && blk.error.empty())
        blk.error = "named barrier " + std::to_string(id) + " left with " + std::to_string(n.arrived) + " arrival(s) at exit";
    for (const auto& [id, n] : blk.named) run->named_barriers += n.done;
    for (const auto& [thread, calls] : blk.setmaxnreg)
      for (const auto& [count, inc] : calls) (inc ? run->regs_inc : run->regs_dec)[count] += 1;
    if (!blk.error.empty() && run->hw_error.empty()) run->hw_error = blk.error;
    run->wavefronts = std::max(run->wavefronts, blk.wavefronts);
    for (const auto& wg : blk.groups) run->wgmma += wg->calls;
    run->tma += blk.tma_copies;
    if (after_block) after_block(bx, out);
  }
  run->copies = cp_async_calls;
  run->mma = mma_calls;
  return out;
}

}  // namespace sf::attention_sim
