// Where TMA finds k's and v's heads (attention.h: kv_tma_layout): the index map of the
// operand's views, composed step by step into one linear form of (head, row, col),
// every claim about it checked exactly, then the heads' offsets split into at most
// three strided dims of a tensor map (TMA's rank 5, less the row and the column).
#include <algorithm>
#include <string>
#include <vector>

#include "codegen/kernels/attention.h"
#include "codegen/kernels/element.h"

namespace sf {

namespace {

std::string num(int64_t v) { return std::to_string(v); }

// One strided step's digits [lo, hi) (C order over step.shape) applied to x, a flat
// index below the product of those digits' sizes: sum of digit * stride.
int64_t apply_digits(const kernels::StridedStep& s, size_t lo, size_t hi, int64_t x) {
  int64_t off = 0;
  for (size_t d = hi; d-- > lo;) {
    const int64_t size = s.shape[d];
    off += (x % size) * s.strides[d];
    x /= size;
  }
  return off;
}

}  // namespace

Result<KvTmaLayout> kv_tma_layout(const kernels::IndexMap& map, int64_t heads, int64_t rows, int64_t cols,
                                  int64_t param_numel, int64_t elem_bytes) {
  auto fail = [](const std::string& why) -> Result<KvTmaLayout> { return Diag{"", {}, why}; };
  if (heads < 1 || rows < 1 || cols < 1 || elem_bytes < 1) return fail("an empty operand");
  if (map.base != kernels::kIterationIndex) return fail("it is read through a computed index (a concat or gather)");
  // The operand's element (h, j, e) lies at head[h] + j * sj + e * se of the flat index
  // the next step reads: first its own dense index, then each step's output.
  std::vector<int64_t> head(static_cast<size_t>(heads));
  for (int64_t h = 0; h < heads; ++h) head[static_cast<size_t>(h)] = h * rows * cols;
  int64_t sj = cols, se = 1;
  for (const kernels::StridedStep& s : map.steps) {
    const size_t k = s.shape.size();
    if (k == 0) return fail("an empty view step");
    // The row and column part stays below P, the product of the step's last digits
    // from r on, the smallest such product; every head starts on a multiple of P. Then
    // the digits from r on come from (row, col) alone and the ones before r from the
    // head alone, with no carry between them.
    const int64_t reach = (rows - 1) * sj + (cols - 1) * se;
    size_t r = k;
    int64_t p = 1;
    while (r > 0 && p <= reach) p *= s.shape[--r];
    if (p <= reach) return fail("a head's rows reach past its view");
    for (int64_t& h : head) {
      if (h % p != 0)
        return fail("a head starts " + num(h) + " elements into a view whose rows and columns span " + num(p) +
                    ": the heads lie inside the rows (a projection sliced along its last dim before the reshape "
                    "into heads)");
      h = apply_digits(s, 0, r, h / p) + s.offset;
    }
    // The row and column digits: linear in each of j and e, and additive. Additive
    // where they are one linear run (every digit's stride the next one's times its
    // size), or where the columns stay below Q, a product of the last digits, and a
    // row step is a multiple of Q (the two then use different digits).
    bool run = true;
    for (size_t d = r; d + 1 < k; ++d) run = run && s.strides[d] == s.strides[d + 1] * s.shape[d + 1];
    if (!run && rows > 1) {
      size_t q = k;
      int64_t qp = 1;
      while (q > r && qp <= (cols - 1) * se) qp *= s.shape[--q];
      if (qp <= (cols - 1) * se || sj % qp != 0)
        return fail("a row's columns and its next row share the digits of a view (a reshape across them)");
    }
    const int64_t se2 = apply_digits(s, r, k, se), sj2 = apply_digits(s, r, k, sj);
    for (int64_t e = 0; e < cols; ++e)
      if (apply_digits(s, r, k, e * se) != e * se2) return fail("a row's columns are not evenly spaced in the input");
    for (int64_t j = 0; rows > 1 && j < rows; ++j)
      if (apply_digits(s, r, k, j * sj) != j * sj2) return fail("the rows are not evenly spaced in the input");
    se = se2;
    sj = sj2;
  }
  if (se != 1) return fail("a row's columns are " + num(se) + " elements apart in the input, not adjacent");
  // A slice of heads (q, k and v of one fused projection): the offsets from the first
  // head's, which becomes a starting coordinate in the head dims below.
  const int64_t first = head[0];
  if (first < 0) return fail("a head starts before the input");
  for (int64_t& h : head) h -= first;
  if (rows > 1 && (sj <= 0 || (sj * elem_bytes) % 16 != 0))
    return fail("the rows are " + num(sj * elem_bytes) + " bytes apart, not a positive multiple of 16");

  // The heads' offsets as digits of the head index, innermost first: digit i has
  // radix n_i over the heads' count below it, and a stride; a stride-0 digit (GQA's
  // repeated heads) takes no dim of the map.
  KvTmaLayout out;
  out.dims[0] = cols;
  out.dims[1] = rows;
  out.strides[0] = rows > 1 ? sj * elem_bytes : 16;
  struct Digit {
    int64_t div, radix, stride;
  };
  std::vector<Digit> digits;
  for (int64_t below = 1; below < heads;) {
    const int64_t t = head[static_cast<size_t>(below)];
    int64_t run = 1;
    while (below * (run + 1) <= heads && head[static_cast<size_t>(below * run)] == run * t) ++run;
    int64_t radix = run;
    while (radix > 1 && (heads / below) % radix != 0) --radix;
    if (radix < 2 || heads % (below * radix) != 0) return fail("the heads are not evenly spaced in the input");
    digits.push_back({below, radix, t});
    below *= radix;
  }
  for (int64_t h = 0; h < heads; ++h) {
    int64_t at = 0;
    for (const Digit& d : digits) at += (h / d.div) % d.radix * d.stride;
    if (at != head[static_cast<size_t>(h)]) return fail("the heads are not evenly spaced in the input");
  }
  int rank = 2;
  int64_t last = first + (cols - 1) + (rows - 1) * sj;  // the map's furthest element
  for (const Digit& d : digits) {
    if (d.stride == 0) continue;
    if (rank == kMaxTensorMapRank)
      return fail("the heads need more than " + num(kMaxTensorMapRank - 2) + " dims of a tensor map");
    if (d.stride < 0 || (d.stride * elem_bytes) % 16 != 0)
      return fail("heads " + num(d.stride * elem_bytes) + " bytes apart, not a positive multiple of 16");
    out.strides[static_cast<size_t>(rank - 1)] = d.stride * elem_bytes;
    out.head_dims.push_back({d.div, d.radix, 0});
    last += (d.radix - 1) * d.stride;
    ++rank;
  }
  if (rank == 2) {  // one head (or only repeats of one): a dim of 1 keeps the head coordinate
    out.strides[1] = out.strides[0] * rows;
    out.head_dims.push_back({1, 1, 0});
    rank = 3;
  }
  // The first head's offset as starting coordinates, the widest head dims first: the
  // map starts at the param's first element, and the keys' dim keeps its extent (keys
  // past S must read as zeros).
  int64_t left = first;
  std::vector<size_t> order(out.head_dims.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return out.strides[a + 1] > out.strides[b + 1]; });
  for (size_t i : order) {
    const int64_t stride = out.strides[i + 1] / elem_bytes;
    out.head_dims[i].start = left / stride;
    left %= stride;
  }
  if (left != 0)
    return fail("the first head starts " + num(first) + " elements into the input, not a whole number of heads (a "
                "slice of rows or columns)");
  for (size_t i = 0; i < out.head_dims.size(); ++i)
    out.dims[i + 2] = out.head_dims[i].start + out.head_dims[i].radix;
  if (last >= param_numel) return fail("the map would reach element " + num(last) + " of an input of " + num(param_numel));
  out.rank = rank;
  return out;
}

}  // namespace sf
