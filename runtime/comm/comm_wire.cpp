// The Gloo backend's wire: a buffer cut into chunks along a dim and put back
// together (DimView, pack_split, unpack_concat), and the reductions, which run in
// the wire types (floats as double, integers and bool as int64): widening to them
// (to_wire), reducing (reducer) and rounding back (from_wire). Declared, with what
// each does, in runtime/comm/comm_internal.h.
#include "runtime/comm/comm_internal.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace sf::comm_detail {

// ---------------------------------------------------------------------------------
// Layout helpers: chunks of a C-order buffer along one dim.
// ---------------------------------------------------------------------------------

DimView view_at(const Shape& s, int dim, int64_t esize) {
  DimView v;
  for (int i = 0; i < dim; ++i) v.outer *= s[static_cast<size_t>(i)];
  v.extent = s[static_cast<size_t>(dim)];
  v.inner_bytes = esize;
  for (size_t i = static_cast<size_t>(dim) + 1; i < s.size(); ++i) v.inner_bytes *= s[i];
  return v;
}

std::vector<std::byte> pack_split(const std::byte* src, const Shape& s, int64_t esize, int dim,
                                  const std::vector<int64_t>& extents) {
  DimView v = view_at(s, dim, esize);
  std::vector<std::byte> out(static_cast<size_t>(numel(s) * esize));
  std::byte* dst = out.data();
  int64_t off = 0;
  for (int64_t e : extents) {
    const int64_t row = e * v.inner_bytes;
    for (int64_t o = 0; o < v.outer && row > 0; ++o) {
      std::memcpy(dst, src + (o * v.extent + off) * v.inner_bytes, static_cast<size_t>(row));
      dst += row;
    }
    off += e;
  }
  return out;
}

void unpack_concat(const std::byte* src, const std::vector<int64_t>& extents, std::byte* dst, const Shape& s,
                   int64_t esize, int dim) {
  DimView v = view_at(s, dim, esize);
  int64_t off = 0;
  for (int64_t e : extents) {
    const int64_t row = e * v.inner_bytes;
    for (int64_t o = 0; o < v.outer && row > 0; ++o) {
      std::memcpy(dst + (o * v.extent + off) * v.inner_bytes, src, static_cast<size_t>(row));
      src += row;
    }
    off += e;
  }
}

// ---------------------------------------------------------------------------------
// Reductions on the wire types
// ---------------------------------------------------------------------------------

namespace {

template <class T, class F>
Reducer elementwise(F f) {
  return [f](std::byte* acc, const std::byte* x, size_t n) {
    for (size_t i = 0; i < n; ++i) {
      T a, b;
      std::memcpy(&a, acc + i * sizeof(T), sizeof(T));
      std::memcpy(&b, x + i * sizeof(T), sizeof(T));
      a = f(a, b);
      std::memcpy(acc + i * sizeof(T), &a, sizeof(T));
    }
  };
}

// `n` elements at `src` widened to the wire type, for to_wire: typed loops, not
// Tensor::get: a million-element all_reduce spent most of its time in its
// per-element switch.
template <class From, class To, class F>
void widen_with(const std::byte* src, std::byte* dst, int64_t n, F f) {
  for (int64_t i = 0; i < n; ++i) {
    From v;
    std::memcpy(&v, src + i * static_cast<int64_t>(sizeof(From)), sizeof(From));
    To w = f(v);
    std::memcpy(dst + i * 8, &w, 8);
  }
}

}  // namespace

Reducer reducer(ReduceOp op, bool floats) {
  if (floats) {
    switch (op) {
      case ReduceOp::Sum:
      case ReduceOp::Avg: return elementwise<double>([](double a, double b) { return a + b; });
      // NaN wins, as in torch.maximum / torch.minimum.
      case ReduceOp::Max: return elementwise<double>([](double a, double b) { return std::isnan(a) || a >= b ? a : b; });
      case ReduceOp::Min: return elementwise<double>([](double a, double b) { return std::isnan(a) || a <= b ? a : b; });
    }
  }
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg:
      // Two's-complement wrap-around, without signed-overflow UB.
      return elementwise<int64_t>([](int64_t a, int64_t b) {
        return static_cast<int64_t>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
      });
    case ReduceOp::Max: return elementwise<int64_t>([](int64_t a, int64_t b) { return std::max(a, b); });
    case ReduceOp::Min: return elementwise<int64_t>([](int64_t a, int64_t b) { return std::min(a, b); });
  }
  return nullptr;
}

void to_wire(const std::byte* src, DType t, int64_t n, std::byte* dst) {
  switch (t) {
    case DType::F32: widen_with<float, double>(src, dst, n, [](float v) { return static_cast<double>(v); }); return;
    case DType::F16: widen_with<uint16_t, double>(src, dst, n, [](uint16_t v) { return double(f16_bits_to_f32(v)); }); return;
    case DType::BF16: widen_with<uint16_t, double>(src, dst, n, [](uint16_t v) { return double(bf16_bits_to_f32(v)); }); return;
    case DType::I32: widen_with<int32_t, int64_t>(src, dst, n, [](int32_t v) { return int64_t{v}; }); return;
    case DType::I64: if (n) std::memcpy(dst, src, static_cast<size_t>(n) * 8); return;
    case DType::Bool: widen_with<uint8_t, int64_t>(src, dst, n, [](uint8_t v) { return int64_t{v != 0}; }); return;
  }
}

Tensor from_wire(const std::byte* w, DType t, const Shape& s, ReduceOp op, int64_t members) {
  Tensor out(t, s);
  const int64_t n = out.numel();
  const bool avg = op == ReduceOp::Avg;
  std::byte* dst = out.data();
  for (int64_t i = 0; i < n; ++i) {
    if (is_float(t)) {
      double v;
      std::memcpy(&v, w + i * 8, 8);
      if (avg) v /= static_cast<double>(members);
      if (t == DType::F32) {
        float f = static_cast<float>(v);  // round to nearest even, once
        std::memcpy(dst + i * 4, &f, 4);
      } else {
        out.set(i, v);  // rounds the double straight to f16 / bf16
      }
      continue;
    }
    int64_t v;
    std::memcpy(&v, w + i * 8, 8);
    if (avg) v /= members;
    switch (t) {
      case DType::I64: std::memcpy(dst + i * 8, &v, 8); break;
      case DType::I32: {
        int32_t x = static_cast<int32_t>(v);  // wraps like a C cast (Tensor::set_int)
        std::memcpy(dst + i * 4, &x, 4);
        break;
      }
      default: {
        uint8_t b = v != 0;
        std::memcpy(dst + i, &b, 1);
        break;
      }
    }
  }
  return out;
}

}  // namespace sf::comm_detail
