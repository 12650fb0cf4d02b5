#include "runtime/core/tensor.h"

#include <algorithm>
#include <cstring>
#include <random>

namespace sf {

std::optional<int> normalize_dim(int64_t d, int rank) {
  if (d < -rank || d >= rank) return std::nullopt;
  return static_cast<int>(d < 0 ? d + rank : d);
}

int64_t numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

std::vector<int64_t> contiguous_strides(const Shape& s) {
  std::vector<int64_t> st(s.size(), 1);
  for (int i = static_cast<int>(s.size()) - 2; i >= 0; --i) st[i] = st[i + 1] * s[i + 1];
  return st;
}

std::string shape_str(const Shape& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i) r += ", ";
    r += std::to_string(s[i]);
  }
  return r + "]";
}

std::string TensorType::str() const { return std::string(dtype_name(dtype)) + shape_str(shape); }

Tensor::Tensor(DType dtype, Shape shape)
    : type_{dtype, std::move(shape)},
      numel_(sf::numel(type_.shape)),
      data_(static_cast<size_t>(numel_) * dtype_size(dtype)) {}

template <class T>
static T load(const std::byte* p, int64_t i) {
  T v;
  std::memcpy(&v, p + i * static_cast<int64_t>(sizeof(T)), sizeof(T));
  return v;
}

template <class T>
static void store(std::byte* p, int64_t i, T v) {
  std::memcpy(p + i * static_cast<int64_t>(sizeof(T)), &v, sizeof(T));
}

double Tensor::get(int64_t i) const {
  const std::byte* p = data_.data();
  switch (type_.dtype) {
    case DType::F32: return load<float>(p, i);
    case DType::F16: return f16_bits_to_f32(load<uint16_t>(p, i));
    case DType::BF16: return bf16_bits_to_f32(load<uint16_t>(p, i));
    case DType::I32: return load<int32_t>(p, i);
    case DType::I64: return static_cast<double>(load<int64_t>(p, i));
    case DType::Bool: return load<uint8_t>(p, i) ? 1.0 : 0.0;
  }
  return 0;
}

void Tensor::set(int64_t i, double v) {
  std::byte* p = data_.data();
  double r = round_to_dtype(v, type_.dtype);
  switch (type_.dtype) {
    case DType::F32: store<float>(p, i, static_cast<float>(r)); return;
    case DType::F16: store<uint16_t>(p, i, f32_to_f16_bits(static_cast<float>(r))); return;
    case DType::BF16: store<uint16_t>(p, i, f32_to_bf16_bits(static_cast<float>(r))); return;
    case DType::I32: store<int32_t>(p, i, static_cast<int32_t>(r)); return;
    case DType::I64: store<int64_t>(p, i, saturating_i64(r)); return;
    case DType::Bool: store<uint8_t>(p, i, r != 0.0 ? 1 : 0); return;
  }
}

int64_t Tensor::get_int(int64_t i) const {
  if (type_.dtype == DType::I64) return load<int64_t>(data_.data(), i);
  return saturating_i64(get(i));
}

void Tensor::set_int(int64_t i, int64_t v) {
  std::byte* p = data_.data();
  switch (type_.dtype) {
    case DType::I64: store<int64_t>(p, i, v); return;
    case DType::I32: store<int32_t>(p, i, static_cast<int32_t>(v)); return;  // wraps like a C cast
    case DType::Bool: store<uint8_t>(p, i, v != 0 ? 1 : 0); return;
    default: set(i, i64_to_double_round_odd(v)); return;
  }
}

std::vector<Tensor> random_tensors(const std::vector<TensorType>& types, const std::vector<int64_t>& int_bounds,
                                   uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<Tensor> out;
  for (size_t k = 0; k < types.size(); ++k) {
    Tensor t(types[k].dtype, types[k].shape);
    // The modulo bias (< 2^-50 for these bounds) does not matter for test data.
    const auto bound = static_cast<uint64_t>(std::max<int64_t>(k < int_bounds.size() ? int_bounds[k] : 8, 1));
    for (int64_t i = 0; i < t.numel(); ++i) {
      const uint64_t r = rng();
      if (is_float(t.dtype())) {
        const double u = static_cast<double>(r >> 11) * 0x1p-53;  // uniform in [0, 1), 53 bits
        t.set(i, -1.0 + 2.0 * u);
      } else if (t.dtype() == DType::Bool) {
        t.set_int(i, static_cast<int64_t>(r >> 63));
      } else {
        t.set_int(i, static_cast<int64_t>(r % bound));
      }
    }
    out.push_back(std::move(t));
  }
  return out;
}

}  // namespace sf
