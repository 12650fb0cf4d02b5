// The tensor-core matmul's epilogue (internal to codegen/kernels; docs/kernels.md,
// "Outputs"): the accumulator fragments through the group's elementwise ops to its
// outputs. matmul_mma.cpp builds the K loop and hands the accumulators here.
//
// Three ways out, decided per kernel (and, for the second, per launch):
//   - split-K of a bare TF32 matmul: each accumulator added into the zeroed f32
//     output by an atomic; of any other group, each added into the f32 workspace,
//     and the tile's last block to arrive reads the sums back into its accumulators
//     and takes one of the two ways below;
//   - staged: every output's values of a warp's tile written to shared memory (the
//     pipeline's, free once the K loop is done) in 16-byte chunks XOR-swizzled by
//     row, then read back a chunk per lane and stored 128 bits at a time, a warp's
//     lanes on consecutive chunks of a row: when each output is 2 or 4 bytes wide, N
//     fills whole 16-byte chunks, the tiles fit in the pipeline's shared memory, and
//     (checked at run time, one uniform branch) every output pointer is 16-byte
//     aligned;
//   - staged in chunks (the persistent warp-specialised kernel, whose producer is
//     refilling the pipeline's shared memory during the epilogue): the same, through
//     an area of its own per consumer warp that holds `chunk_cols` columns of the
//     warp's fragment rows (mma_chunk_area), one chunk of columns after another, the
//     warp's lanes meeting at a warp barrier between writing and reading it; with
//     TMA stores (MmaTiling::tma_store) the area is TMA's swizzled boxes, and the
//     warp's first lane stores each chunk with one cp.async.bulk.tensor a box, the
//     warp writing the next chunk into its other area meanwhile;
//   - direct: each fragment row's two adjacent columns stored as one 2-element access
//     where the pointers allow, else one element at a time.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <llvm/IR/IRBuilder.h>

#include "codegen/kernels/element.h"
#include "codegen/kernels/matmul_mma_tiling.h"

namespace sf::matmul_detail {

// What the epilogue needs of the kernel being built.
struct MmaEpilogueFrame {
  llvm::IRBuilder<>* b = nullptr;
  llvm::Function* fn = nullptr;
  const Graph* g = nullptr;
  const MatmulGroup* p = nullptr;
  const MmaTiling* t = nullptr;
  ElementCodegen* cg = nullptr;
  std::vector<llvm::Value*> in, out;
  llvm::Type* it = nullptr;                 // the index type
  llvm::Value* smem = nullptr;              // the dynamic shared memory (i8)
  llvm::Value *m0 = nullptr, *n0 = nullptr;    // the block tile's origin
  llvm::Value *wm0 = nullptr, *wn0 = nullptr;  // the warp's place in it
  llvm::Value *lane = nullptr, *warp = nullptr, *zbase = nullptr;
  std::vector<llvm::Value*> batch_coords;   // O's batch coordinates
  // Whether this thread holds accumulators (warp specialisation: not the producer
  // warpgroup, which still meets the staged path's barriers); nullptr: every thread.
  llvm::Value* active = nullptr;
  std::function<void()> barrier;            // bar.sync 0 (or the simulation's)
  std::function<void()> warp_barrier;       // the warp's lanes alone (staged in chunks)
  llvm::BasicBlock* exit = nullptr;         // where the epilogue ends (nullptr: the kernel returns)
  // Split-K in a workspace (MmaTiling::split_ws): the workspace, the item's counter
  // index, threadIdx.x, the shared flag word, and a barrier of every thread that runs
  // the epilogue; `host`: the host build (the tests' simulation).
  llvm::Value *ws = nullptr, *item = nullptr, *tid = nullptr, *flag = nullptr;
  std::function<void()> split_barrier;
  bool host = false;
  // TMA stores (MmaTiling::tma_store): each output's tensor map, O's batch index (the
  // maps' third coordinate), and the instructions (MmaIsa's tma_store, bulk_commit,
  // bulk_wait and the proxy fence).
  std::vector<llvm::Value*> out_maps;
  llvm::Value* batch = nullptr;
  std::function<void(llvm::Value* map, llvm::Value* src_off, const std::vector<llvm::Value*>& coords)> tma_store;
  std::function<void()> bulk_commit, store_fence;
  std::function<void(int pending, bool read)> bulk_wait;
};

// Why the staged path does not apply to the kernel (nullopt: it does, subject to the
// run-time alignment check).
std::optional<std::string> mma_staging_unfit(const Graph& g, const MatmulGroup& p, const MmaTiling& t);

// The persistent warp-specialised kernel's staging areas: places them in `t` (chunk_off,
// chunk_cols, shared_bytes) when its outputs can be staged and the areas fit in
// `max_shared` bytes with the rest, and returns ""; otherwise leaves `t` alone (direct
// stores) and says why.
std::string mma_chunk_area(const Graph& g, const MatmulGroup& p, MmaTiling& t, int64_t max_shared);

// How the epilogue of `g`'s kernel under `c` stores its outputs, for explain (matmul_path):
// ", epilogue ..." naming the path above and, for the direct one, why. Empty where
// the config has no tensor-core kernel.
std::string mma_epilogue_path(const Graph& g, const MatmulGroup& p, const KernelConfig& c, int sm, bool wgmma_arch);

// Emits the epilogue at the builder's insertion point, ending in the kernel's return
// or a branch to `f.exit`.
Result<void> emit_mma_epilogue(MmaEpilogueFrame& f, const std::vector<llvm::Value*>& acc);

}  // namespace sf::matmul_detail
