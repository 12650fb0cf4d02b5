// The reduction emitter tests' helpers (reduction_test.cpp, reduction_nvptx_test.cpp):
// groups built as fusion builds them, host and simulated runs against the reference.
#pragma once

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



inline KernelSpec spec_of(const Graph& g, std::string entry = "red") {
  return KernelSpec{std::move(entry), KernelKind::Reduction, g};
}

// A one-op graph through decompose(): what fusion sees of softmax, layer_norm, rms_norm.
enum class Composite { Softmax, LayerNorm, RmsNorm };
inline Graph composite_group(Composite c, DType dt, const Shape& x_shape, int64_t dim_or_norm_rank = -1) {
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
inline Tensor random_rows(DType t, const Shape& s, uint64_t seed, double lo = -1, double hi = 1, bool wide = false) {
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

inline std::vector<Tensor> random_inputs_for(const Graph& g, uint64_t seed, double lo = -1, double hi = 1, bool wide = false) {
  std::vector<Tensor> in;
  for (size_t i = 0; i < g.params().size(); ++i) {
    const TensorType& t = g.node(g.params()[i]).type;
    in.push_back(random_rows(t.dtype, t.shape, seed + 7919 * i, lo, hi, wide));
  }
  return in;
}

// ---- running kernels ----------------------------------------------------------------------




// Emits `g` for the host, JIT-compiles it and runs it on `inputs`.
inline Result<std::vector<Tensor>> run_host(const Graph& g, const std::vector<Tensor>& inputs, const KernelConfig& cfg = {}) {
  return kernel_test::run_emitted(reduction_emitter().emit(spec_of(g), cfg, llvmb::Target::host()), g, inputs);
}

// One simulated block: a barrier for __syncthreads and a slot per thread for
// shuffles (write, barrier, read the partner's, barrier).
struct SimBlock {
  explicit SimBlock(int threads) : bar(threads), slots(static_cast<size_t>(threads)) {}
  kernel_test::SleepBarrier<> bar;
  std::vector<int32_t> slots;
  std::vector<std::vector<int64_t>>* trace = nullptr;  // per thread: the X indices it folded, in order
};

inline void sim_barrier(void* ctx) { static_cast<SimBlock*>(ctx)->bar.arrive_and_wait(); }

// Each thread appends to its own list only, so the threads need no lock.
inline void sim_trace(void* ctx, int32_t tid, int64_t x_index) {
  (*static_cast<SimBlock*>(ctx)->trace)[static_cast<size_t>(tid)].push_back(x_index);
}

// What a simulated launch read: for each block (grid y major, then x), for each of
// its threads, the X index of every element it folded (the first of each vector), in
// the thread's order.
struct SimTrace {
  std::vector<std::vector<std::vector<int64_t>>> blocks;
};

inline int32_t sim_shfl(void* ctx, int32_t tid, int32_t value, int32_t lane_mask) {
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
// A split reduction's workspace is zeroed before the launch, and a launch that leaves
// any byte of it nonzero is an error (the next launch would find stale partials or
// counts). `shares_reversed`: grid y runs from its last block to its first, so that a
// row's last share to arrive is share 0.
inline Result<std::vector<Tensor>> run_simulated(const Graph& g, const std::vector<Tensor>& inputs, const KernelConfig& cfg,
                                          bool misaligned = false, SimTrace* trace = nullptr,
                                          bool shares_reversed = false) {
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
  std::vector<uint64_t> workspace(static_cast<size_t>((launch.workspace_bytes + 7) / 8), 0);
  if (launch.workspace_bytes > 0) args.push_back(workspace.data());
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
  // Every output starts as all ones (NaN for floats, -1 for integers): an element the
  // kernel does not store fails the comparison.
  for (Tensor& t : out)
    if (t.nbytes() > 0) std::memset(t.data(), 0xFF, static_cast<size_t>(t.nbytes()));
  kernel_test::BlockThreads block(threads);
  for (int64_t y = 0; y < launch.grid[1]; ++y)
  for (int64_t blk = 0; blk < launch.grid[0]; ++blk) {
    const int64_t by = shares_reversed ? launch.grid[1] - 1 - y : y;
    SimBlock sb(threads);
    ReductionSimHooks hooks{&sb, sim_barrier, sim_shfl, shared.data()};
    if (trace) {
      trace->blocks.emplace_back(static_cast<size_t>(threads));
      sb.trace = &trace->blocks.back();
      hooks.trace = sim_trace;
    }
    block.run([&](int t) {
      entry(args.data(), static_cast<int32_t>(blk), t, static_cast<int32_t>(launch.grid[0]), &hooks,
            static_cast<int32_t>(by));
    });
  }
  for (size_t w = 0; w < workspace.size(); ++w)
    if (workspace[w] != 0)
      return Diag{"", {}, "the launch left workspace word " + std::to_string(w) + " (of " +
                              std::to_string(workspace.size()) + " 8-byte words) nonzero"};
  return out;
}

enum class Runner { Host, Simulated };

// The kernel's outputs equal the reference's within default_tolerance (exactly for
// integers; NaN only matches NaN).
inline void expect_matches_reference(const Graph& g, const std::vector<Tensor>& inputs, const KernelConfig& cfg = {},
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

inline std::string config_str(const KernelConfig& c) {
  return "threads_per_row=" + std::to_string(c.threads_per_row) + " rows_per_block=" + std::to_string(c.rows_per_block) +
         " grid_stride=" + std::to_string(c.grid_stride) + " max_blocks=" + std::to_string(c.max_blocks);
}

// ---- every reduction op, every placement of the reduced dims --------------------------------

// x: one shape, reduced over `dims` by sum, max, min and mean (one kernel, one pass).
inline Graph four_reductions(DType dt, const Shape& x_shape, const std::vector<int64_t>& dims, bool keepdim) {
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
inline const std::vector<DimsCase>& dims_cases() {
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

// A reduction config of these knobs (the rest at KernelConfig's defaults).
inline KernelConfig rows_config(int tpr, int rpb, bool grid_stride = false, int max_blocks = 4096, int split = 1) {
  KernelConfig c;
  c.threads_per_row = tpr;
  c.rows_per_block = rpb;
  c.grid_stride = grid_stride;
  c.max_blocks = max_blocks;
  c.split_reduction = split;
  return c;
}

// The configs the simulated kernels run in (the default and the corner cases).
inline std::vector<KernelConfig> sim_configs() {
  std::vector<KernelConfig> v;
  auto add = [&](int tpr, int rpb, bool grid_stride, int max_blocks) { v.push_back(rows_config(tpr, rpb, grid_stride, max_blocks)); };
  add(256, 1, true, 4096);  // the default: 8 warps per row, shared memory across warps
  add(128, 2, true, 2);     // two rows per block, grid-stride over row groups
  add(32, 4, false, 1);     // a warp per row: shuffles only
  add(8, 4, true, 3);       // part-warps: 4 rows in one warp
  add(4, 1, true, 4096);    // a block smaller than a warp
  add(1, 64, true, 4096);   // a thread per row: no communication
  return v;
}

}  // namespace kernels_reduction_test
}  // namespace sf
