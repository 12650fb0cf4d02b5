// The shape rule of cross_entropy (ops.cpp's infer_type calls it), and the reading of
// its `reduction` attribute that the decomposition and the reference share.
#pragma once

#include <optional>
#include <string_view>
#include <vector>

#include "codegen/ir/ops.h"

namespace sf {

// F.cross_entropy's reduction: the mean over the targets that are not ignore_index,
// their sum, or one loss per target.
enum class LossReduction : uint8_t { Mean, Sum, None };
std::optional<LossReduction> parse_loss_reduction(std::string_view s);

// The class dim of a logits tensor of rank `rank` >= 1: 1, or 0 for an unbatched [C].
inline int class_dim(int rank) { return rank == 1 ? 0 : 1; }

// F.cross_entropy(logits, target) with class indices: logits a float tensor [N, C, d1,
// ...] (or [C]), target an integer tensor [N, d1, ...] (or a 0-d one); the result has
// logits' dtype and target's shape (reduction none) or is 0-d (mean, sum). Throws
// OpError naming what it expected.
TensorType infer_cross_entropy(const std::vector<Operand>& in, const Attrs& a);

}  // namespace sf
