// Static shapes, tensor types and a plain host tensor (C order, native element
// layout: f16/bf16 stored as their 16-bit patterns, bool as one byte).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "runtime/core/dtype.h"

namespace sf {

using Shape = std::vector<int64_t>;

// Normalises a possibly negative dim against `rank`; nullopt if out of range.
std::optional<int> normalize_dim(int64_t d, int rank);

int64_t numel(const Shape& s);
// C-order strides in elements.
std::vector<int64_t> contiguous_strides(const Shape& s);
std::string shape_str(const Shape& s);  // "[20, 10]"

struct TensorType {
  DType dtype = DType::F32;
  Shape shape;

  int rank() const { return static_cast<int>(shape.size()); }
  bool operator==(const TensorType&) const = default;
  std::string str() const;  // "f32[20, 10]"
};

class Tensor {
 public:
  Tensor() = default;
  Tensor(DType dtype, Shape shape);  // zero-filled

  DType dtype() const { return type_.dtype; }
  const Shape& shape() const { return type_.shape; }
  const TensorType& type() const { return type_; }
  int64_t numel() const { return numel_; }
  size_t nbytes() const { return data_.size(); }
  std::byte* data() { return data_.data(); }
  const std::byte* data() const { return data_.data(); }

  // Element at flat (C-order) index as a double; exact for every dtype but i64
  // beyond 2^53 (use get_int for those).
  double get(int64_t i) const;
  // Stores v rounded to the dtype (round_to_dtype; integers saturate).
  void set(int64_t i, double v);
  // Element as an int64: exact for integer and bool tensors; floats truncate toward
  // zero and saturate (NaN -> 0).
  int64_t get_int(int64_t i) const;
  // Stores an int64: wraps into i32 like a C cast, exact into i64, correctly rounded
  // (once) into the float dtypes.
  void set_int(int64_t i, int64_t v);

 private:
  TensorType type_;
  int64_t numel_ = 0;
  std::vector<std::byte> data_;
};

// Seeded random values for tensors of these types, deterministic per seed on every
// platform (std::mt19937_64 read directly, one generator across the tensors in
// order; no std:: distributions, whose algorithms differ between standard
// libraries): floats uniform in [-1, 1) rounded to the dtype, bools fair coin flips,
// integers uniform in [0, int_bounds[i]) (a bound below 1 counts as 1). What the
// reference's random_inputs, the tuner and the split tuner's measuring half feed.
std::vector<Tensor> random_tensors(const std::vector<TensorType>& types, const std::vector<int64_t>& int_bounds,
                                   uint64_t seed);

}  // namespace sf
