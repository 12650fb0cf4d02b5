// Where TMA finds k's and v's heads (attention.h: kv_tma_layout): the index map of the
// operand's views, composed step by step into one linear form of the head, row and
// column digits, every claim about it checked exactly, then the heads' digits made
// dims of a tensor map (at most three: TMA's rank 5, less the row and the column).
//
// The form: the flat index a step reads is base + sum of c_v * w_v over variables v,
// each a digit of the head index, the row or the column (c_v in [0, n_v): the index's
// (x / div_v) % n_v). A strided step reads its input as C-order digits D_p (weights
// W_p, the product of the digits after p) and returns sum digit_p * stride_p +
// offset. The step keeps the form linear when no carry passes between digits:
//   - a variable whose values stay inside one digit p (w_v a multiple of W_p, and
//     (n_v - 1) * w_v / W_p below D_p) may share it with others and with the base,
//     their largest values summed staying below D_p; its new weight is
//     (w_v / W_p) * stride_p;
//   - a variable spanning several digits is first split at a digit boundary where
//     its radix allows (n_v = n_lo * n_hi with n_lo * w_v the boundary's weight), and
//     where it cannot be split it must have those digits to itself (and zero base
//     digits there); its new weight is checked over all its n_v values.
// A variable of weight 0 (GQA's repeat) stays 0.
#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "codegen/kernels/attention.h"
#include "codegen/kernels/element.h"

namespace sf {

namespace {

std::string num(int64_t v) { return std::to_string(v); }

enum class Role { Col, Row, Head };

struct Var {
  Role role;
  int64_t n;    // radix: the digit's values are 0 .. n - 1
  int64_t div;  // the digit of the role's index: (index / div) % n
  int64_t w;    // weight in the flat index the next step reads (the param's offset at the end)
};

// Step `s` on the form (vars, base); the reason where it cannot stay linear.
std::optional<std::string> apply_step(const kernels::StridedStep& s, std::vector<Var>& vars, int64_t& base) {
  const size_t k = s.shape.size();
  if (k == 0) return "an empty view step";
  // Little-endian digits: size[p], weight[p] (weight[k] the whole extent).
  std::vector<int64_t> size(k), stride(k), weight(k + 1, 1);
  for (size_t p = 0; p < k; ++p) {
    size[p] = s.shape[k - 1 - p];
    stride[p] = s.strides[k - 1 - p];
    weight[p + 1] = weight[p] * size[p];
  }
  auto digit_of = [&](int64_t x, size_t p) { return x / weight[p] % size[p]; };
  // The lowest digit a weight starts in, and the digits past its largest value.
  auto first_digit = [&](int64_t w) {
    size_t a = 0;
    while (a + 1 < k && w % weight[a + 1] == 0) ++a;
    return a;
  };
  auto end_digit = [&](int64_t top) {
    size_t b = 0;
    while (b < k && top >= weight[b]) ++b;
    return b;
  };
  if (base < 0 || base >= weight[k]) return "a view starts past its input";
  // Split the variables at digit boundaries where their radix allows.
  std::vector<Var> split;
  for (size_t i = 0; i < vars.size(); ++i) {
    Var v = vars[i];
    if (v.w == 0 || v.n == 1) {
      split.push_back(v);
      continue;
    }
    for (;;) {
      const size_t a = first_digit(v.w);
      const int64_t m = v.w / weight[a];
      if ((v.n - 1) * m < size[a] || size[a] % m != 0 || v.n % (size[a] / m) != 0 || size[a] / m == 1) {
        split.push_back(v);
        break;
      }
      const int64_t lo = size[a] / m;
      split.push_back({v.role, lo, v.div, v.w});
      v = {v.role, v.n / lo, v.div * lo, v.w * lo};
    }
  }
  vars = std::move(split);
  // Who holds each digit: confined variables' largest values summed, with the base's.
  std::vector<int64_t> load(k, 0);
  std::vector<int> spanned(k, 0), confined(k, 0);
  for (size_t p = 0; p < k; ++p) load[p] = digit_of(base, p);
  for (const Var& v : vars) {
    if (v.w == 0 || v.n == 1) continue;
    const int64_t top = (v.n - 1) * v.w;
    if (top >= weight[k]) return "a view's digits reach past its extent";
    const size_t a = first_digit(v.w), b = end_digit(top);
    if (b <= a + 1) {
      load[a] += (v.n - 1) * (v.w / weight[a]);
      ++confined[a];
    } else {
      for (size_t p = a; p < b; ++p) ++spanned[p];
    }
  }
  for (size_t p = 0; p < k; ++p) {
    if (load[p] >= size[p]) return "a view adds heads, rows or columns into one of its dims past its size";
    if (spanned[p] > 1 || (spanned[p] == 1 && (confined[p] > 0 || digit_of(base, p) != 0)))
      return "a view mixes the digits of heads, rows or columns (a reshape across them)";
  }
  // The new weights; a spanning variable's checked over every value.
  auto out = [&](int64_t x) {
    int64_t o = 0;
    for (size_t p = 0; p < k; ++p) o += digit_of(x, p) * stride[p];
    return o;
  };
  for (Var& v : vars) {
    if (v.w == 0 || v.n == 1) continue;
    const size_t a = first_digit(v.w), b = end_digit((v.n - 1) * v.w);
    if (b <= a + 1) {
      v.w = v.w / weight[a] * stride[a];
      continue;
    }
    const int64_t w = out(v.w);
    for (int64_t c = 2; c < v.n; ++c)
      if (out(c * v.w) != c * w) return "a view's dims do not step evenly through a head, row or column";
    v.w = w;
  }
  base = out(base) + s.offset;
  return std::nullopt;
}

}  // namespace

Result<KvTmaLayout> kv_tma_layout(const kernels::IndexMap& map, int64_t heads, int64_t rows, int64_t cols,
                                  int64_t param_numel, int64_t elem_bytes) {
  auto fail = [](const std::string& why) -> Result<KvTmaLayout> { return Diag{"", {}, why}; };
  if (heads < 1 || rows < 1 || cols < 1 || elem_bytes < 1) return fail("an empty operand");
  if (map.base != kernels::kIterationIndex) return fail("it is read through a computed index (a concat or gather)");
  // The operand's own dense index, then each step's output.
  std::vector<Var> vars = {{Role::Head, heads, 1, rows * cols}, {Role::Row, rows, 1, cols}, {Role::Col, cols, 1, 1}};
  int64_t base = 0;
  for (const kernels::StridedStep& s : map.steps)
    if (std::optional<std::string> why = apply_step(s, vars, base)) return fail(*why);

  // The columns adjacent (each digit's weight its place in the column index), the rows
  // one stride apart.
  int64_t sj = 0;
  for (const Var& v : vars)
    if (v.role == Role::Row && v.div == 1) sj = v.w;
  for (const Var& v : vars) {
    if (v.n == 1) continue;
    if (v.role == Role::Col && v.w != v.div)
      return fail("a row's columns are " + num(v.w / std::max<int64_t>(v.div, 1)) + " elements apart in the input, not adjacent");
    if (v.role == Role::Row && v.w != sj * v.div) return fail("the rows are not evenly spaced in the input");
  }
  if (rows > 1 && (sj <= 0 || (sj * elem_bytes) % 16 != 0))
    return fail("the rows are " + num(sj * elem_bytes) + " bytes apart, not a positive multiple of 16");

  // The heads' digits, innermost first, neighbours that step evenly merged; a digit of
  // weight 0 (GQA's repeat) takes no dim.
  std::vector<Var> hd;
  for (const Var& v : vars)
    if (v.role == Role::Head && v.n > 1 && v.w != 0) hd.push_back(v);
  std::sort(hd.begin(), hd.end(), [](const Var& a, const Var& b) { return a.div < b.div; });
  std::vector<Var> merged;
  for (const Var& v : hd) {
    if (!merged.empty() && merged.back().div * merged.back().n == v.div && merged.back().w * merged.back().n == v.w)
      merged.back().n *= v.n;
    else
      merged.push_back(v);
  }
  if (merged.size() > static_cast<size_t>(kMaxTensorMapRank - 2))
    return fail("the heads need more than " + num(kMaxTensorMapRank - 2) + " dims of a tensor map");
  KvTmaLayout out;
  out.dims[0] = cols;
  out.dims[1] = rows;
  out.strides[0] = rows > 1 ? sj * elem_bytes : 16;
  int64_t last = base + (cols - 1) + (rows - 1) * sj;  // the map's furthest element
  for (const Var& v : merged) {
    if (v.w < 0 || (v.w * elem_bytes) % 16 != 0)
      return fail("heads " + num(v.w * elem_bytes) + " bytes apart, not a positive multiple of 16");
    out.strides[out.head_dims.size() + 1] = v.w * elem_bytes;
    out.head_dims.push_back({v.div, v.n, 0});
    last += (v.n - 1) * v.w;
  }
  if (out.head_dims.empty()) {  // one head (or only repeats of one): a dim of 1 keeps the head coordinate
    out.strides[1] = out.strides[0] * rows;
    out.head_dims.push_back({1, 1, 0});
  }
  out.rank = 2 + static_cast<int>(out.head_dims.size());
  // The first head's offset (a slice of heads: q, k and v of one fused projection) as
  // starting coordinates, the widest head dims first: the map starts at the param's
  // first element, and the keys' dim keeps its extent (keys past S must read as zeros).
  if (base < 0) return fail("a head starts before the input");
  int64_t left = base;
  std::vector<size_t> order(out.head_dims.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return out.strides[a + 1] > out.strides[b + 1]; });
  for (size_t i : order) {
    const int64_t stride = out.strides[i + 1] / elem_bytes;
    out.head_dims[i].start = left / stride;
    left %= stride;
  }
  if (left != 0)
    return fail("the first head starts " + num(base) + " elements into the input, not a whole number of heads (a "
                "slice of rows or columns)");
  for (size_t i = 0; i < out.head_dims.size(); ++i) out.dims[i + 2] = out.head_dims[i].start + out.head_dims[i].radix;
  if (last >= param_numel) return fail("the map would reach element " + num(last) + " of an input of " + num(param_numel));
  return out;
}

}  // namespace sf
