// What the Plan executor's step files share (runtime/plan/plan_exec.cpp,
// runtime/plan_step_*.cpp); not an interface of its own.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "runtime/plan/plan.h"

namespace sf::plan_steps {

// Whether a step always runs on the device's compute stream (kernel, partialize).
bool is_device_step(const PlanStep& s);
// The product of v[from..to).
int64_t prod(const std::vector<int64_t>& v, size_t from, size_t to);

// A slice of a row-major tensor as one strided copy: the input's rows around the
// one dim where the slice differs from its input (or one row for a full copy);
// nullopt when it cuts several dims or does not fit.
struct Block2D {
  size_t src_offset = 0, src_pitch = 0, dst_pitch = 0, width = 0, height = 0;  // bytes, except height
};
std::optional<Block2D> slice_block_2d(const std::vector<int64_t>& in, const std::vector<int64_t>& out,
                                      const std::vector<int64_t>& offset, size_t elem);

}  // namespace sf::plan_steps
