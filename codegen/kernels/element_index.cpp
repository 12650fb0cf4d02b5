// Index maps (element.h): how a value's element is found from the flat iteration
// index through views (broadcast, transpose, permute, reshape, slice) and a concat's
// computed index, and the LLVM arithmetic that follows a map.
#include "codegen/kernels/element.h"

#include <algorithm>
#include <numeric>

#include <llvm/IR/Constants.h>
#include <llvm/IR/Intrinsics.h>

namespace sf::kernels {

// ---- index maps -----------------------------------------------------------------------

namespace {

std::string ints_str(const std::vector<int64_t>& v) { return shape_str(v); }

// Drops size-1 dims and merges dim d into d-1 where the pair is one strided run
// (stride[d-1] == stride[d] * size[d]; broadcast runs of stride 0 merge too).
StridedStep normalise(const StridedStep& s) {
  StridedStep out;
  if (numel(s.shape) == 0) return out;  // never executed: no index at all
  out.offset = s.offset;
  for (size_t d = 0; d < s.shape.size(); ++d) {
    if (s.shape[d] == 1) continue;
    if (!out.shape.empty() && out.strides.back() == s.strides[d] * s.shape[d]) {
      out.shape.back() *= s.shape[d];
      out.strides.back() = s.strides[d];
    } else {
      out.shape.push_back(s.shape[d]);
      out.strides.push_back(s.strides[d]);
    }
  }
  return out;
}

// A normalised step returns its input: one dense dim, or no dim at all (then the
// space has one element, and the only flat index, 0, maps to offset 0), and no offset.
bool is_identity(const StridedStep& s) {
  return s.offset == 0 && (s.shape.empty() || (s.shape.size() == 1 && s.strides[0] == 1));
}

// The step from `at`'s space to the flat index of a dense C-order tensor of `shape`
// holding the value read at `at`.
StridedStep step_to(const ValueIndex& at, const Shape& shape) {
  std::vector<int64_t> cs = contiguous_strides(shape);
  StridedStep s{at.space, std::vector<int64_t>(at.space.size(), 0)};
  for (size_t d = 0; d < at.src.size(); ++d) {
    s.offset += at.shift_of(d) * cs[d];
    if (at.src[d] >= 0) s.strides[static_cast<size_t>(at.src[d])] += at.scale_of(d) * cs[d];
  }
  return s;
}

std::vector<int> iota(size_t n) {
  std::vector<int> v(n);
  std::iota(v.begin(), v.end(), 0);
  return v;
}

}  // namespace

std::string IndexMap::str() const {
  if (contiguous()) return "contiguous";
  std::string r = base == kIterationIndex ? "" : "@" + std::to_string(base);
  for (size_t i = 0; i < steps.size(); ++i) {
    if (!r.empty()) r += i == 0 ? " " : " -> ";
    r += shape_str(steps[i].shape) + ":" + ints_str(steps[i].strides);
    if (steps[i].offset) r += "+" + std::to_string(steps[i].offset);
  }
  return r;
}

bool dense_runs(const IndexMap& m, int64_t v) {
  if (m.base != kIterationIndex) return false;  // a computed index: one element at a time
  if (m.contiguous() || v == 1) return true;
  if (m.steps.size() != 1) return false;
  const StridedStep& s = m.steps[0];
  // An aligned run of v stays inside one innermost row (size % v == 0) and moves
  // only that dense coordinate; the row starts at a multiple of v when every other
  // stride and the offset are.
  if (s.shape.empty() || s.strides.back() != 1 || s.shape.back() % v != 0 || s.offset % v != 0) return false;
  for (size_t d = 0; d + 1 < s.shape.size(); ++d)
    if (s.strides[d] % v != 0) return false;
  return true;
}

void append_step(IndexMap& m, StridedStep step) {
  StridedStep n = normalise(step);
  if (!is_identity(n)) m.steps.push_back(std::move(n));
}

std::string ValueIndex::key() const {
  std::string k = prefix.str() + "|" + shape_str(space) + "|";
  for (int s : src) k += std::to_string(s) + ",";
  if (!unshifted()) k += "|" + ints_str(scale) + ints_str(shift);
  return k;
}

ValueIndex dense_index(const Shape& shape) { return {IndexMap{}, shape, iota(shape.size())}; }

std::optional<ValueIndex> operand_index(const Node& n, const ValueIndex& at, const Shape& operand) {
  const int rank = n.type.rank();
  const int urank = static_cast<int>(operand.size());
  // Operand dim d reads the result's dim map[d] (-1: coordinate 0), with its shift and scale.
  auto remap = [&](const std::vector<int>& map) {
    ValueIndex r{at.prefix, at.space, std::vector<int>(operand.size(), -1)};
    bool shifted = !at.unshifted();
    if (shifted) r.scale.assign(operand.size(), 1), r.shift.assign(operand.size(), 0);
    for (size_t d = 0; d < map.size(); ++d) {
      if (map[d] < 0) continue;
      auto o = static_cast<size_t>(map[d]);
      r.src[d] = at.src[o];
      if (shifted) r.scale[d] = at.scale_of(o), r.shift[d] = at.shift_of(o);
    }
    return r;
  };
  auto broadcast = [&]() {
    std::vector<int> map(operand.size(), -1);
    int lead = rank - urank;
    for (int d = 0; d < urank; ++d)
      if (operand[static_cast<size_t>(d)] != 1) map[static_cast<size_t>(d)] = d + lead;
    return remap(map);
  };
  auto permuted = [&](const std::vector<int>& perm) {  // out dim d is operand dim perm[d]
    std::vector<int> map(operand.size(), -1);
    for (size_t d = 0; d < perm.size(); ++d) map[static_cast<size_t>(perm[d])] = static_cast<int>(d);
    return remap(map);
  };
  // tril/triu read their operand's own element (the same shape).
  if (is_elementwise(n.op) || n.op == OpKind::Expand || op_info(n.op).category == OpCategory::Positional)
    return broadcast();
  switch (n.op) {
    case OpKind::Transpose: {
      std::vector<int> perm = iota(operand.size());
      int d0 = *normalize_dim(n.attrs.get_int("dim0"), urank);
      int d1 = *normalize_dim(n.attrs.get_int("dim1"), urank);
      std::swap(perm[static_cast<size_t>(d0)], perm[static_cast<size_t>(d1)]);
      return permuted(perm);
    }
    case OpKind::Permute: {
      std::vector<int> perm;
      for (int64_t d : n.attrs.get_ints("dims")) perm.push_back(*normalize_dim(d, urank));
      return permuted(perm);
    }
    case OpKind::Slice: {
      // Coordinate c along the dim reads the operand's start + c * step: the result's
      // shift + scale * s becomes (start + step * shift) + (step * scale) * s.
      ValueIndex r = remap(iota(operand.size()));
      auto [d, range] = slice_of(n.attrs, operand);
      auto sd = static_cast<size_t>(d);
      if (r.unshifted()) r.scale.assign(operand.size(), 1), r.shift.assign(operand.size(), 0);
      // A dim of at most one element is only read at its start (an outer shift there
      // belongs to an empty read), so a huge step never multiplies anything.
      if (range.length > 1) {
        r.shift[sd] = range.start + range.step * r.shift[sd];
        r.scale[sd] *= range.step;
      } else {
        r.shift[sd] = range.start;
      }
      if (std::all_of(r.scale.begin(), r.scale.end(), [](int64_t x) { return x == 1; }) &&
          std::all_of(r.shift.begin(), r.shift.end(), [](int64_t x) { return x == 0; }))
        r.scale.clear(), r.shift.clear();
      return r;
    }
    case OpKind::Gather:
    case OpKind::IndexSelect:  // both operands at indices GroupValues computes (lookup_value)
    case OpKind::Concat: {
      ValueIndex r = dense_index(operand);
      r.prefix.base = kComputedIndex;
      return r;
    }
    case OpKind::Reshape: {
      // C order: the operand's flat index is the reshaped value's flat index, which
      // is a strided function of `at`'s space (the identity when read densely).
      ValueIndex r{at.prefix, operand, iota(operand.size())};
      append_step(r.prefix, step_to(at, n.type.shape));
      return r;
    }
    default: return std::nullopt;
  }
}

int64_t largest_value(const Graph& g) {
  int64_t m = 0;
  for (const Node& n : g.nodes()) m = std::max(m, numel(n.type.shape));
  return m;
}

IndexMap offset_map(const ValueIndex& at, const Shape& shape) {
  IndexMap m = at.prefix;
  append_step(m, step_to(at, shape));
  return m;
}

llvm::Value* emit_index_map(llvm::IRBuilderBase& b, llvm::Value* flat, const IndexMap& m) {
  llvm::Type* ty = flat->getType();
  for (const StridedStep& s : m.steps) {
    // inner[d] = product of the sizes after d: the divisor that isolates coordinate d.
    std::vector<int64_t> inner(s.shape.size(), 1);
    for (size_t d = s.shape.size(); d-- > 1;) inner[d - 1] = inner[d] * s.shape[d];
    llvm::Value* off = nullptr;
    for (size_t d = 0; d < s.shape.size(); ++d) {
      if (s.strides[d] == 0) continue;  // a broadcast dim: no division at all
      llvm::Value* c = flat;
      if (inner[d] > 1) c = b.CreateUDiv(c, llvm::ConstantInt::get(ty, static_cast<uint64_t>(inner[d])));
      // The outermost coordinate needs no remainder: flat < numel(shape).
      if (d > 0) c = b.CreateURem(c, llvm::ConstantInt::get(ty, static_cast<uint64_t>(s.shape[d])));
      if (s.strides[d] != 1)
        c = b.CreateMul(c, llvm::ConstantInt::get(ty, static_cast<uint64_t>(s.strides[d])), "", true, true);
      off = off ? b.CreateAdd(off, c, "", true, true) : c;
    }
    llvm::Value* start = llvm::ConstantInt::get(ty, static_cast<uint64_t>(s.offset));
    flat = off ? (s.offset ? b.CreateAdd(off, start, "", true, true) : off) : start;
  }
  return flat;
}

llvm::Value* emit_coordinate(llvm::IRBuilderBase& b, llvm::Value* flat, const ValueIndex& at, int d) {
  const int src = at.src[static_cast<size_t>(d)];
  const int64_t shift = at.shift_of(static_cast<size_t>(d));
  if (src < 0) return llvm::ConstantInt::get(flat->getType(), static_cast<uint64_t>(shift));
  IndexMap m = at.prefix;
  StridedStep s{at.space, std::vector<int64_t>(at.space.size(), 0)};
  s.strides[static_cast<size_t>(src)] = at.scale_of(static_cast<size_t>(d));  // a slice's step
  s.offset = shift;                                                           // and start
  append_step(m, std::move(s));
  return emit_index_map(b, flat, m);
}

}  // namespace sf::kernels
