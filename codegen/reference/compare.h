// Compares a computed tensor with the reference evaluator's, allclose-style.
#pragma once

#include <string>

#include "codegen/ir/graph.h"
#include "runtime/core/tensor.h"

namespace sf {

struct Tolerance {
  double rtol = 0;
  double atol = 0;
};

// The default tolerance for comparing a result of dtype `t` with the float64
// reference rounded to `t`. Looser than torch.testing's defaults because a lowered
// program rounds every intermediate to the storage dtype while the reference
// rounds once: f32 rtol 1e-4, f16 1e-2, bf16 5e-2; exact for integers and bool.
Tolerance default_tolerance(DType t);

// The tolerance `run --check` and `exec --check` give value `v` of `g`: the default
// tolerance of the least precise float dtype among v and the values it is computed
// from. A kernel may keep f16/bf16 values in f32 (Precision::Fused) where the
// reference rounds them at every op, so an f32 value computed from bf16 ones can
// differ from the reference by bf16's rounding, not f32's. Integer and bool values
// stay exact. `allow_tf32`: an f32 matmul among them may have multiplied in TF32,
// whose inputs keep f16's 10-bit mantissa, so f16's tolerance.
Tolerance check_tolerance(const Graph& g, ValueId v, bool allow_tf32 = false);

struct Comparison {
  double max_abs_err = 0;
  double max_rel_err = 0;  // |a - b| / |b| over elements with b != 0
  // Elements outside atol * scale + rtol * |b|, scale = max(1, the largest finite |b|
  // of `want`) (NaN matches only NaN): a large-K matmul's outputs that cancel to
  // near zero carry rounding errors of the size of its largest outputs.
  int64_t mismatches = 0;
  int64_t first_mismatch = -1;
  bool ok() const { return mismatches == 0; }
};

// `got` and `want` must have the same type (shape and dtype); else every element
// counts as a mismatch.
Comparison compare(const Tensor& got, const Tensor& want, Tolerance tol);

}  // namespace sf
