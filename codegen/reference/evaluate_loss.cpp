#include "codegen/reference/evaluate_loss.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "codegen/ir/ops_loss.h"

namespace sf {

Tensor eval_cross_entropy(const Node& n, const Tensor& logits, const Tensor& target) {
  const Shape& xs = logits.shape();
  const auto cd = static_cast<size_t>(class_dim(static_cast<int>(xs.size())));
  // logits as [rows, C, inner]: rows = N (1 unbatched), inner = the product of d1, ...
  const int64_t classes = xs[cd];
  int64_t rows = 1, inner = 1;
  for (size_t d = 0; d < xs.size(); ++d) {
    if (d < cd) rows *= xs[d];
    if (d > cd) inner *= xs[d];
  }
  const int64_t ignore = n.attrs.get_int("ignore_index");
  std::vector<double> loss(static_cast<size_t>(rows * inner), 0.0);
  int64_t counted = 0;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t s = 0; s < inner; ++s) {
      const int64_t t = target.get_int(r * inner + s);
      if (t == ignore) continue;
      auto at = [&](int64_t c) { return logits.get((r * classes + c) * inner + s); };
      double top = -std::numeric_limits<double>::infinity();
      for (int64_t c = 0; c < classes; ++c) top = std::max(top, at(c));
      double sum = 0;
      for (int64_t c = 0; c < classes; ++c) sum += std::exp(at(c) - top);
      // The target's logit less the row max; 0 for a target naming no class.
      const double picked = t >= 0 && t < classes ? at(t) - top : 0.0;
      loss[static_cast<size_t>(r * inner + s)] = std::log(sum) - picked;
      ++counted;
    }
  Tensor out(n.type.dtype, n.type.shape);
  switch (*parse_loss_reduction(n.attrs.get_ident("reduction"))) {
    case LossReduction::None:
      for (size_t i = 0; i < loss.size(); ++i) out.set(static_cast<int64_t>(i), loss[i]);
      break;
    case LossReduction::Sum:
    case LossReduction::Mean: {
      double total = 0;
      for (double l : loss) total += l;
      const bool mean = n.attrs.get_ident("reduction") == "mean";
      // Every target ignored (or none at all): torch's mean is 0 / 0, NaN.
      if (mean) total = counted ? total / static_cast<double>(counted) : std::numeric_limits<double>::quiet_NaN();
      out.set(0, total);
      break;
    }
  }
  return out;
}

}  // namespace sf
