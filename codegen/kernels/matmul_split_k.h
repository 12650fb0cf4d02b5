// Split-K through a workspace (internal to codegen/kernels; docs/kernels.md,
// "Split-K on the tensor cores"): the protocol both NVPTX matmul kernels follow when
// a group is split over K but is not a bare f32 matmul. The workspace holds f32 sums
// of every output element (batch x M x N), then a u32 counter per work item (output
// tile and batch). Each block adds its partial sums, fences them, and counts itself
// in; the block that counts split - 1 before it is the item's last, resets the
// counter, takes the sums back (zeroing them behind it) and runs the epilogue. A
// launch finds the workspace zero and leaves it so.
#pragma once

#include <cstdint>
#include <functional>
#include <utility>

#include <llvm/IR/IRBuilder.h>

namespace sf::matmul_detail {

// dst[flat] += v where `ok`, a relaxed f32 atomic (only the sum matters): a split-K
// partial sum, into a workspace or a bare f32 matmul's zeroed output.
void add_f32_atomic(llvm::IRBuilderBase& b, llvm::Function* fn, llvm::Value* ok, llvm::Value* dst, llvm::Value* flat,
                    llvm::Value* v);

struct SplitKWorkspace {
  llvm::IRBuilderBase* b = nullptr;
  llvm::Function* fn = nullptr;
  llvm::Value* ws = nullptr;    // the workspace (the kernel's last argument)
  int64_t sums = 0;             // f32 elements before the counters: batch x M x N
  llvm::Value* item = nullptr;  // the counter's index: batch x tiles + tile
  llvm::Value* tid = nullptr;   // threadIdx.x (thread 0 counts)
  llvm::Value* flag = nullptr;  // a shared 32-bit word: "this block is the last"
  int split = 1;
  bool host = false;              // the host build (tests' simulation): a C++ fence for membar.gl
  std::function<void()> barrier;  // every thread that runs the epilogue meets here
  std::function<void()> leave;    // ends a block that is not the last (a return, a branch)

  // Adds `v` into sum `flat` where `ok` (a relaxed f32 atomic: only the sum matters).
  void add(llvm::Value* ok, llvm::Value* flat, llvm::Value* v) const;
  // Adds `v0` and `v1` into sums `flat` (even) and `flat` + 1 where `ok`, under one
  // branch.
  void add_pair(llvm::Value* ok, llvm::Value* flat, llvm::Value* v0, llvm::Value* v1) const;
  // After every add of the block: the fence, a barrier, thread 0's count and a fence
  // after it (and, in the last block, the counter's reset), a barrier. The builder
  // goes on in the last block only, past a fence in every thread; every other block
  // runs `leave`.
  void arrive() const;
  // membar.gl (__threadfence): this thread's earlier global writes are seen by the
  // whole GPU before its later ones.
  void fence() const;
  // Sum `flat` where `ok`, else 0 (a volatile load: from L2, never a stale L1 line),
  // and zero stored behind it for the next launch.
  llvm::Value* take(llvm::Value* ok, llvm::Value* flat) const;
  // Sums `flat` (even) and `flat` + 1 where `ok`, as one 8-byte access each way.
  std::pair<llvm::Value*, llvm::Value*> take_pair(llvm::Value* ok, llvm::Value* flat) const;

 private:
  // take and take_pair: a volatile load of `t` (f32 or <2 x f32>, aligned to its size)
  // where `ok`, zero stored behind it; zero elsewhere.
  llvm::Value* take_as(llvm::Type* t, llvm::Value* ok, llvm::Value* flat) const;
};

}  // namespace sf::matmul_detail
