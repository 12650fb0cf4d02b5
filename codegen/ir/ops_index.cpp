#include "codegen/ir/ops_index.h"

#include <string>

#include "codegen/ir/limits.h"

namespace sf {

namespace {

[[noreturn]] void fail(std::string msg) { throw OpError{std::move(msg)}; }

std::string name(OpKind k) { return std::string(op_name(k)); }

void need_indices(OpKind k, const Operand& idx, const char* what) {
  if (!is_integer(idx.type.dtype))
    fail(name(k) + " expects integer indices (i32 or i64) as its " + what + ", got " + idx.type.str());
}

int dim_of(OpKind k, const Attrs& a, const TensorType& x) {
  const int64_t d = a.get_int("dim");
  if (x.rank() == 0) fail(name(k) + " expects an operand x of rank >= 1, got " + x.str() + " (a scalar has no dim to index)");
  auto n = normalize_dim(d, x.rank());
  if (!n)
    fail(name(k) + ": dim " + std::to_string(d) + " is out of range for a rank-" + std::to_string(x.rank()) +
         " operand (expected " + std::to_string(-x.rank()) + ".." + std::to_string(x.rank() - 1) + ")");
  return *n;
}

// torch.gather's and scatter_add's rule: the index has the rank of x (and of src) and
// is no larger than `other` on every dim but `dim` (on every dim when dim < 0).
void need_within(OpKind k, const TensorType& index, const TensorType& other, const char* other_name, int dim) {
  if (index.rank() != other.rank())
    fail(name(k) + ": index " + index.str() + " has rank " + std::to_string(index.rank()) + " but " + other_name + " " +
         other.str() + " has rank " + std::to_string(other.rank()) + " (they need the same rank, as in torch)");
  for (int d = 0; d < index.rank(); ++d) {
    const auto i = static_cast<size_t>(d);
    if (d != dim && index.shape[i] > other.shape[i])
      fail(name(k) + ": index " + index.str() + " is larger than " + other_name + " " + other.str() + " in dim " +
           std::to_string(d) + " (" + std::to_string(index.shape[i]) + " > " + std::to_string(other.shape[i]) + ")" +
           (dim >= 0 ? "; only dim " + std::to_string(dim) + ", the indexed dim, may be larger" : ""));
  }
}

// The lookup's first row: kept within +-2^62 so that adding a rank's row offset (below
// 2^40) in local_node, and idx - offset in the kernels' unsigned form, never overflow.
void need_offset(OpKind k, const Attrs& a) {
  const int64_t off = a.get_int("offset");
  constexpr int64_t kBound = int64_t{1} << 62;
  if (off < -kBound || off > kBound)
    fail(name(k) + ": offset " + std::to_string(off) + " is outside -2^62..2^62");
}

}  // namespace

TensorType infer_index_op(OpKind k, const std::vector<Operand>& in, const Attrs& a) {
  switch (k) {
    case OpKind::Gather: {
      const TensorType& x = in[0].type;
      need_indices(k, in[1], "second operand");
      const int dim = dim_of(k, a, x);
      need_within(k, in[1].type, x, "x", dim);
      need_offset(k, a);
      return {x.dtype, in[1].type.shape};
    }
    case OpKind::IndexSelect: {
      const TensorType& x = in[0].type;
      const TensorType& idx = in[1].type;
      need_indices(k, in[1], "second operand");
      const int dim = dim_of(k, a, x);
      if (idx.rank() != 1) fail("index_select expects a 1-D index, got " + idx.str());
      need_offset(k, a);
      Shape s = x.shape;
      s[static_cast<size_t>(dim)] = idx.shape[0];
      return {x.dtype, s};
    }
    case OpKind::ScatterAdd: {
      const TensorType& x = in[0].type;
      const TensorType& src = in[2].type;
      need_indices(k, in[1], "second operand");
      if (x.dtype == DType::Bool) fail("scatter_add does not take bool operands, got " + x.str());
      if (in[0].weak || in[2].weak)
        fail("scatter_add: x and src must be tensors, not number literals");
      if (src.dtype != x.dtype)
        fail("scatter_add: src " + src.str() + " and x " + x.str() + " differ in dtype (as torch, it takes one dtype; cast first)");
      const int dim = dim_of(k, a, x);
      need_within(k, in[1].type, x, "x", dim);
      need_within(k, in[1].type, src, "src", -1);
      // The formulation without atomics (decompose.cpp) compares every index with every
      // position along dim: that mask must be a tensor within the limits.
      std::optional<int64_t> mask = checked_mul(numel(in[1].type.shape), x.shape[static_cast<size_t>(dim)]);
      if (!mask || *mask > kMaxElements)
        fail("scatter_add: index " + in[1].type.str() + " against the " + std::to_string(x.shape[static_cast<size_t>(dim)]) +
             " positions of dim " + std::to_string(dim) + " is a mask above the limit of 2^40 elements");
      return x;
    }
    case OpKind::Embedding: {
      const TensorType& idx = in[0].type;
      const TensorType& w = in[1].type;
      if (!is_integer(idx.dtype)) fail("embedding expects integer indices as its first operand, got " + idx.str());
      if (w.rank() != 2) fail("embedding expects a rank-2 weight [num, dim], got " + w.str());
      need_offset(k, a);
      Shape s = idx.shape;
      s.push_back(w.shape[1]);
      return {w.dtype, s};
    }
    default: fail("internal: " + name(k) + " is not an index op");
  }
}

}  // namespace sf
