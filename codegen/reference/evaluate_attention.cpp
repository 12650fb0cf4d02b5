#include "codegen/reference/evaluate_attention.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>

#include "codegen/ir/attention.h"

namespace sf {

Tensor evaluate_attention(const Node& n, const std::vector<const Tensor*>& args) {
  const Tensor& q = *args[0];
  const Tensor& k = *args[1];
  const Tensor& v = *args[2];
  const Tensor* mask = args.size() == 4 ? args[3] : nullptr;
  const Shape& qs = q.shape();
  const size_t r = qs.size();
  const int64_t hq = qs[r - 3], l = qs[r - 2], e = qs[r - 1];
  const int64_t hkv = k.shape()[r - 3], s = k.shape()[r - 2], ev = v.shape()[r - 1];
  int64_t batch = 1;
  for (size_t d = 0; d + 3 < r; ++d) batch *= qs[d];
  const AttentionHeads heads = attention_heads(n.attrs, hq, hkv);
  const double scale = attention_scale(n.attrs, e);
  const bool causal = n.attrs.get_bool("is_causal");
  const int64_t qoff = n.attrs.get_int("query_offset");
  constexpr double kInf = std::numeric_limits<double>::infinity();

  // The mask's element for scores index (b, h, i, j) of [batch..., Hq, L, S]: its
  // C-order strides, 0 where it broadcasts (a dim it lacks or has as 1).
  Shape scores(qs.begin(), qs.end() - 3);
  scores.insert(scores.end(), {hq, l, s});
  std::vector<int64_t> mstride(scores.size(), 0);
  if (mask) {
    const Shape& ms = mask->shape();
    int64_t st = 1;
    for (size_t d = ms.size(); d-- > 0;) {
      if (ms[d] != 1) mstride[d + scores.size() - ms.size()] = st;
      st *= ms[d];
    }
  }
  auto mask_at = [&](int64_t flat) {  // flat C-order index into `scores`
    int64_t off = 0;
    for (size_t d = scores.size(); d-- > 0;) {
      off += flat % scores[d] * mstride[d];
      flat /= scores[d];
    }
    return off;
  };

  Tensor out(n.type.dtype, n.type.shape);
  std::vector<double> w(static_cast<size_t>(s));
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < hq; ++h) {
      const int64_t kh = heads.kv_head(h);
      const int64_t qbase = (b * hq + h) * l * e, kbase = (b * hkv + kh) * s * e, vbase = (b * hkv + kh) * s * ev;
      for (int64_t i = 0; i < l; ++i) {
        double m = -kInf;
        for (int64_t j = 0; j < s; ++j) {
          double dot = 0;
          for (int64_t c = 0; c < e; ++c) dot += q.get(qbase + i * e + c) * k.get(kbase + j * e + c);
          double x = dot * scale;
          const int64_t flat = ((b * hq + h) * l + i) * s + j;
          if (mask && mask->dtype() == DType::Bool) x = mask->get_int(mask_at(flat)) ? x : -kInf;
          else if (mask) x += mask->get(mask_at(flat));
          if (causal && j > i + qoff) x = -kInf;
          w[static_cast<size_t>(j)] = x;
          m = std::isnan(x) || std::isnan(m) ? std::numeric_limits<double>::quiet_NaN() : std::max(m, x);
        }
        // Every key masked: m = -inf and x - m is NaN, so the row is NaN (as the
        // decomposition's softmax gives; docs/graph-format.md).
        double sum = 0;
        for (double& x : w) sum += x = std::exp(x - m);
        for (int64_t c = 0; c < ev; ++c) {
          double acc = 0;
          for (int64_t j = 0; j < s; ++j) acc += w[static_cast<size_t>(j)] * v.get(vbase + j * ev + c);
          // No keys (S = 0): torch's softmax of an empty row is empty and the product
          // with an empty v is 0.
          out.set(((b * hq + h) * l + i) * ev + c, s == 0 ? 0.0 : acc / sum);
        }
      }
    }
  return out;
}

}  // namespace sf
