#include "codegen/ir/ops_loss.h"

#include <string>

namespace sf {

namespace {

[[noreturn]] void fail(std::string msg) { throw OpError{std::move(msg)}; }

}  // namespace

std::optional<LossReduction> parse_loss_reduction(std::string_view s) {
  if (s == "mean") return LossReduction::Mean;
  if (s == "sum") return LossReduction::Sum;
  if (s == "none") return LossReduction::None;
  return std::nullopt;
}

TensorType infer_cross_entropy(const std::vector<Operand>& in, const Attrs& a) {
  const TensorType& x = in[0].type;
  const TensorType& t = in[1].type;
  const std::string& red = a.get_ident("reduction");
  const std::optional<LossReduction> reduction = parse_loss_reduction(red);
  if (!reduction) fail("cross_entropy: reduction '" + red + "' is not one of mean, sum, none");
  if (in[0].weak) fail("cross_entropy: logits must be a tensor, not a number literal");
  if (!is_float(x.dtype)) fail("cross_entropy expects floating-point logits, got " + x.str() + " (cast them first)");
  if (x.rank() == 0) fail("cross_entropy expects logits of rank >= 1 ([C] or [N, C, ...]), got " + x.str());
  if (!is_integer(t.dtype))
    fail("cross_entropy expects integer class indices (i32 or i64) as its target, got " + t.str() +
         (is_float(t.dtype) ? " (class probabilities as a target are not supported)" : ""));
  const int cd = class_dim(x.rank());
  Shape want = x.shape;
  want.erase(want.begin() + cd);
  if (t.shape != want)
    fail("cross_entropy: target " + t.str() + " does not match logits " + x.str() + " (expected target shape " +
         shape_str(want) + ": logits' shape without the class dim " + std::to_string(cd) + ")");
  if (x.shape[static_cast<size_t>(cd)] == 0)
    fail("cross_entropy: logits " + x.str() + " have no classes (dim " + std::to_string(cd) + " is empty)");
  // The decomposition compares the target with ignore_index as a literal, which holds
  // a double: within 2^53 every integer is exact (and class indices are below 2^40).
  const int64_t ignore = a.get_int("ignore_index");
  constexpr int64_t kExact = int64_t{1} << 53;
  if (ignore < -kExact || ignore > kExact)
    fail("cross_entropy: ignore_index " + std::to_string(ignore) + " is outside -2^53..2^53");
  if (*reduction == LossReduction::None) return {x.dtype, t.shape};
  return {x.dtype, {}};
}

}  // namespace sf
