// The TMA tensor map of a Plan's kernels and of the emitters' launches, apart from
// plan.h so that codegen/kernels/emitter.h takes it without the rest of the Plan.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "runtime/core/tensor.h"

namespace sf {

// A TMA tensor map a kernel reads one of its inputs through, or (`output` >= 0) writes
// one of its outputs through (sm_90a's wgmma kernels: PlanKernel::tensor_maps, and the
// emitters' LaunchShape::tensor_maps, which are the same type: codegen/kernels/emitter.h's
// TensorMapSpec): the runtime encodes it over the step's input buffer `input`, or its
// output buffer `output` (cuTensorMapEncodeTiled: 128-byte swizzle, element strides 1,
// no interleave; out-of-bounds elements read as zero and are not written) and passes
// its device address after the outputs.
inline constexpr int kPlanTensorMapRank = 5;  // TMA's limit
struct PlanTensorMap {
  int input = 0;                      // index into the kernel step's inputs (when output < 0)
  DType dtype = DType::BF16;
  int rank = 2;                                // 2 to kPlanTensorMapRank
  std::array<int64_t, 5> dims{1, 1, 1, 1, 1};  // elements, innermost first (unused dims 1)
  std::array<int64_t, 4> strides{};            // bytes of dims 1, 2, ... (unused 0)
  std::array<int, 5> box{1, 1, 1, 1, 1};       // elements per copy, innermost first (unused 1)
  int output = -1;  // index into the step's outputs: a TMA store's map; -1: an input's (last: aggregates keep their order)
  // The entries past the rank do not count (unset, they may be 0 or 1).
  bool operator==(const PlanTensorMap& o) const {
    if (input != o.input || output != o.output || dtype != o.dtype || rank != o.rank) return false;
    for (size_t i = 0; i < static_cast<size_t>(rank) && i < dims.size(); ++i)
      if (dims[i] != o.dims[i] || box[i] != o.box[i] || (i + 1 < static_cast<size_t>(rank) && strides[i] != o.strides[i]))
        return false;
    return true;
  }
};

}  // namespace sf
