// What the autotuner knows of one kernel without looking at its IR: its kind, the
// sizes that decide which configs fit, and the bytes and flops its cost model
// needs. codegen/kernels/tune_adapter.cpp derives one from a fused group.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "autotune/config.h"

namespace sf {

struct TuneProblem {
  KernelKind kind = KernelKind::Pointwise;
  std::string name;          // the kernel's name, for messages
  std::string signature;     // hash of the group's text: ops, dtypes, layouts
  std::vector<std::vector<int64_t>> shapes;  // every param's then every output's local shape
  size_t num_inputs = 0;     // how many of `shapes` are params
  int elem_bytes = 4;        // the widest storage dtype's size
  // pointwise: n elements; reduction: rows x cols (cols reduced); matmul: batch x m x n x k;
  // attention: batch x m query rows x n keys, head dims k (q, k) and cols (v)
  int64_t n = 0;
  int64_t rows = 0, cols = 0;
  int64_t batch = 1, m = 0, k = 0;  // matmul uses n as its N
  int64_t bytes = 0;         // bytes read and written at least once
  int64_t flops = 0;         // arithmetic, FMA = 2
  // matmul: the one output is the f32 matmul itself: split-K adds partial results
  // into it atomically (any other group sums them in a workspace).
  bool bare = false;
  // reduction: one pass over each row and outputs per row only, so that rows can be
  // split over blocks (split_reduction; their shares meet in a workspace).
  bool splittable = false;
  // reduction: X's innermost dim is kept (an outer reduction): neighbouring rows are
  // neighbours in memory and a row's elements lie a row or more apart, so a warp's
  // lanes read whole sectors only when they take neighbouring rows.
  bool outer = false;
  // matmul: its operands' dtype size (2: tensor cores from sm_80 on), and whether an
  // f32 matmul may take TF32 tensor cores (--allow-tf32).
  int operand_bytes = 4;
  bool tf32 = false;
};

// How shapes enter the cache key: exactly, or each extent rounded up to a power
// of two (--shape-buckets pow2), so nearby shapes share one tuning result.
enum class ShapeBuckets : uint8_t { Exact, Pow2 };

// The cache key of a kernel's tuning results. Every field must match for a cached
// result to be used; one entry per (key, config) lives under it (autotune/cache.h).
struct TuneKey {
  std::string kind;       // "matmul"
  std::string signature;  // TuneProblem::signature
  std::string shapes;     // "64x512,512x128->64x128" (bucketed when asked)
  std::string target;     // "sm_90a" or "host:<cpu model>"
  std::string toolchain;  // "llvm 19.1.7; ptxas 13.0.88" and, where measured on a GPU, "; driver 13000"

  std::string text() const;   // all fields, one "name: value" per line
  std::string hash() const;   // 16 hex digits of a 64-bit FNV-1a over text()
  bool operator==(const TuneKey&) const = default;
};

TuneKey make_tune_key(const TuneProblem& p, ShapeBuckets buckets, const std::string& target,
                      const std::string& toolchain);

// "64x512,512x128->64x128"; outputs after "->". Pow2 rounds each extent up.
std::string shapes_key(const std::vector<std::vector<int64_t>>& shapes, size_t num_inputs, ShapeBuckets b);

// 64-bit FNV-1a of `s` as 16 lowercase hex digits (stable across runs and hosts).
std::string fnv1a_hex(std::string_view s);

}  // namespace sf
