#include "codegen/reference/compare.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace sf {

Tolerance default_tolerance(DType t) {
  switch (t) {
    case DType::F32: return {1e-4, 1e-5};
    case DType::F16: return {1e-2, 1e-3};
    case DType::BF16: return {5e-2, 1e-2};
    case DType::I32:
    case DType::I64:
    case DType::Bool: return {0, 0};
  }
  return {0, 0};
}

Tolerance check_tolerance(const Graph& g, ValueId v, bool allow_tf32) {
  const DType own = g.node(v).type.dtype;
  if (!is_float(own)) return default_tolerance(own);
  Tolerance t = default_tolerance(own);
  std::vector<bool> seen(g.nodes().size(), false);
  std::vector<ValueId> stack{v};
  while (!stack.empty()) {
    ValueId u = stack.back();
    stack.pop_back();
    if (seen[static_cast<size_t>(u)]) continue;
    seen[static_cast<size_t>(u)] = true;
    const DType d = g.node(u).type.dtype;
    if (is_float(d)) {
      const bool tf32 = allow_tf32 && d == DType::F32 && g.node(u).op == OpKind::Matmul;
      Tolerance du = default_tolerance(tf32 ? DType::F16 : d);
      t.rtol = std::max(t.rtol, du.rtol);
      t.atol = std::max(t.atol, du.atol);
    }
    for (ValueId w : g.node(u).inputs) stack.push_back(w);
  }
  return t;
}

Comparison compare(const Tensor& got, const Tensor& want, Tolerance tol) {
  Comparison c;
  if (!(got.type() == want.type())) {
    c.mismatches = std::max<int64_t>(1, want.numel());
    c.first_mismatch = 0;
    c.max_abs_err = INFINITY;
    return c;
  }
  bool integral = !is_float(want.dtype());
  // atol counts in units of the tensor's own scale (its largest finite magnitude,
  // at least 1): an element that cancels to near zero in a long sum of large
  // terms carries the rounding error of those terms, not of its own size.
  double scale = 1;
  if (!integral)
    for (int64_t i = 0; i < want.numel(); ++i)
      if (double b = std::fabs(want.get(i)); std::isfinite(b)) scale = std::max(scale, b);
  const double atol = tol.atol * scale;
  for (int64_t i = 0; i < want.numel(); ++i) {
    bool bad;
    double err;
    double b = want.get(i);
    if (integral) {
      int64_t ga = got.get_int(i), wb = want.get_int(i);
      bad = ga != wb;
      err = bad ? std::fabs(static_cast<double>(ga) - static_cast<double>(wb)) : 0.0;
    } else {
      double a = got.get(i);
      if (std::isnan(a) || std::isnan(b)) {
        bad = std::isnan(a) != std::isnan(b);
        err = bad ? INFINITY : 0.0;
      } else if (std::isinf(a) || std::isinf(b)) {
        bad = a != b;
        err = bad ? INFINITY : 0.0;
      } else {
        err = std::fabs(a - b);
        bad = err > atol + tol.rtol * std::fabs(b);
      }
    }
    c.max_abs_err = std::max(c.max_abs_err, err);
    if (b != 0 && std::isfinite(err)) c.max_rel_err = std::max(c.max_rel_err, err / std::fabs(b));
    if (bad) {
      if (c.first_mismatch < 0) c.first_mismatch = i;
      ++c.mismatches;
    }
  }
  return c;
}

}  // namespace sf
