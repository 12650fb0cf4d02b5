#include "codegen/reference/evaluate.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <numbers>
#include <random>
#include <string>

#include "codegen/ir/dropout.h"
#include "codegen/ir/ops.h"
#include "codegen/ir/ops_loss.h"
#include "codegen/reference/evaluate_along.h"
#include "codegen/reference/evaluate_index.h"
#include "codegen/reference/evaluate_loss.h"
#include "codegen/reference/evaluate_attention.h"

namespace sf {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

[[noreturn]] void fail(const Node& n, const std::string& msg) {
  std::string who(op_name(n.op));
  if (!n.name.empty()) who += " '" + n.name + "'";
  throw DiagError{Diag{"", n.loc, who + ": " + msg}};
}

// ---- element access ------------------------------------------------------------------

void store(Tensor& t, int64_t i, double v) { t.set(i, v); }

// dst[j] = src[i] converted to dst's dtype, as torch's .to(dtype) does: integer to
// integer exactly (i64 -> i32 wraps), to bool as != 0, float to integer truncating and
// saturating, everything to float with one rounding.
void convert(const Tensor& src, int64_t i, Tensor& dst, int64_t j) {
  if (!is_float(src.dtype()) && !is_float(dst.dtype())) {
    dst.set_int(j, src.get_int(i));
  } else if (src.dtype() == DType::I64) {
    dst.set_int(j, src.get_int(i));  // one correct rounding (Tensor::set_int)
  } else {
    store(dst, j, src.get(i));
  }
}

// dst[j] = src[i], bit for bit (same dtype).
void copy_elem(const Tensor& src, int64_t i, Tensor& dst, int64_t j) {
  int64_t size = dtype_size(src.dtype());
  std::memcpy(dst.data() + j * size, src.data() + i * size, static_cast<size_t>(size));
}

Tensor copy_of(const Tensor& x) { return x; }

// ---- indexing --------------------------------------------------------------------------

// Strides (in elements) of a C-order tensor of shape `in`, seen from an index into
// `out` under NumPy broadcasting: 0 for a dim `in` lacks or has as 1.
std::vector<int64_t> broadcast_strides(const Shape& in, const Shape& out) {
  std::vector<int64_t> st(out.size(), 0);
  std::vector<int64_t> cs = contiguous_strides(in);
  size_t lead = out.size() - in.size();
  for (size_t d = lead; d < out.size(); ++d)
    if (in[d - lead] != 1) st[d] = cs[d - lead];
  return st;
}

// The element offset, under `strides`, of the C-order flat index `flat` into `shape`.
int64_t offset_of(int64_t flat, const Shape& shape, const std::vector<int64_t>& strides) {
  int64_t off = 0;
  for (size_t d = shape.size(); d-- > 0;) {
    off += flat % shape[d] * strides[d];
    flat /= shape[d];
  }
  return off;
}

// ---- integer arithmetic: two's complement wrap, never signed overflow -------------------

int64_t wrap(uint64_t u) { return static_cast<int64_t>(u); }  // modular since C++20
int64_t add_i(int64_t a, int64_t b) { return wrap(static_cast<uint64_t>(a) + static_cast<uint64_t>(b)); }
int64_t sub_i(int64_t a, int64_t b) { return wrap(static_cast<uint64_t>(a) - static_cast<uint64_t>(b)); }
int64_t mul_i(int64_t a, int64_t b) { return wrap(static_cast<uint64_t>(a) * static_cast<uint64_t>(b)); }
int64_t neg_i(int64_t a) { return wrap(0 - static_cast<uint64_t>(a)); }

double max_f(double a, double b) { return std::isnan(a) || std::isnan(b) ? kNaN : std::max(a, b); }
double min_f(double a, double b) { return std::isnan(a) || std::isnan(b) ? kNaN : std::min(a, b); }

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// ---- the evaluator -----------------------------------------------------------------------

class Evaluator {
 public:
  explicit Evaluator(const Graph& g) : g_(&g), vals_(g.nodes().size()) {}
  Evaluator() = default;  // for one node at a time (evaluate_node)

  Tensor one(const Node& n, const std::vector<const Tensor*>& args) {
    args_ = args;
    return eval(n);
  }

  std::vector<Tensor> run(const std::vector<Tensor>& inputs) {
    const Graph& g = *g_;
    const auto& params = g.params();
    if (inputs.size() != params.size())
      throw DiagError{Diag{"", {},
                           "graph '" + g.name() + "' has " + std::to_string(params.size()) +
                               " parameter(s) but " + std::to_string(inputs.size()) +
                               " input tensor(s) were given"}};
    for (size_t i = 0; i < params.size(); ++i) {
      const Node& p = g.node(params[i]);
      if (!(inputs[i].type() == p.type))
        throw DiagError{Diag{"", p.loc,
                             "input " + std::to_string(i) + " for parameter '" + p.name +
                                 "': expected " + p.type.str() + ", found " +
                                 inputs[i].type().str()}};
      vals_[static_cast<size_t>(params[i])] = inputs[i];
    }
    for (size_t i = 0; i < g.nodes().size(); ++i) {
      const Node& n = g.nodes()[i];
      if (n.op == OpKind::Param) continue;
      args_.clear();
      for (ValueId v : n.inputs) args_.push_back(&vals_[static_cast<size_t>(v)]);
      vals_[i] = eval(n);
    }
    std::vector<Tensor> out;
    for (const Output& o : g.outputs()) out.push_back(vals_[static_cast<size_t>(o.value)]);
    return out;
  }

 private:
  const Tensor& in(const Node&, size_t k) const { return *args_[k]; }

  Tensor eval(const Node& n) {
    switch (n.op) {
      case OpKind::Param: fail(n, "internal: params are bound before evaluation");
      case OpKind::Constant: {
        Tensor t(n.type.dtype, n.type.shape);
        store(t, 0, n.attrs.get_float("value"));
        return t;
      }

      case OpKind::Neg: return unary(n, [](double x) { return -x; }, neg_i);
      case OpKind::Abs:
        return unary(n, [](double x) { return std::fabs(x); },
                     [](int64_t x) { return x < 0 ? neg_i(x) : x; });  // abs(INT64_MIN) wraps, as torch
      case OpKind::Relu:
        return unary(n, [](double x) { return x > 0 || std::isnan(x) ? x : 0.0; },
                     [](int64_t x) { return x > 0 ? x : int64_t{0}; });
      case OpKind::Exp: return unary_float(n, [](double x) { return std::exp(x); });
      case OpKind::Log: return unary_float(n, [](double x) { return std::log(x); });
      case OpKind::Sqrt: return unary_float(n, [](double x) { return std::sqrt(x); });
      case OpKind::Rsqrt: return unary_float(n, [](double x) { return 1.0 / std::sqrt(x); });
      case OpKind::Tanh: return unary_float(n, [](double x) { return std::tanh(x); });
      case OpKind::Sigmoid: return unary_float(n, sigmoid);
      case OpKind::Silu: return unary_float(n, [](double x) { return x * sigmoid(x); });
      case OpKind::Sin: return unary_float(n, [](double x) { return std::sin(x); });
      case OpKind::Cos: return unary_float(n, [](double x) { return std::cos(x); });
      case OpKind::Reciprocal: return unary_float(n, [](double x) { return 1.0 / x; });
      case OpKind::Erf: return unary_float(n, [](double x) { return std::erf(x); });
      case OpKind::Cast: {
        const Tensor& x = in(n, 0);
        Tensor out(n.type.dtype, n.type.shape);
        for (int64_t i = 0; i < out.numel(); ++i) convert(x, i, out, i);
        return out;
      }

      case OpKind::Add: return binary(n, std::plus<double>(), add_i);
      case OpKind::Sub: return binary(n, std::minus<double>(), sub_i);
      case OpKind::Mul: return binary(n, std::multiplies<double>(), mul_i);
      // True division: the result dtype is always a float (ops.cpp), so no int path.
      case OpKind::Div:
        return binary(n, std::divides<double>(), [&n](int64_t, int64_t) -> int64_t {
          fail(n, "internal: integer division result");
        });
      case OpKind::Maximum:
        return binary(n, max_f, [](int64_t a, int64_t b) { return std::max(a, b); });
      case OpKind::Minimum:
        return binary(n, min_f, [](int64_t a, int64_t b) { return std::min(a, b); });
      case OpKind::Pow:
        return binary(n, [](double a, double b) { return std::pow(a, b); },
                      [&n](int64_t a, int64_t b) {
                        if (b < 0)
                          fail(n, "integers to negative integer powers are not allowed (got " +
                                      std::to_string(a) + " ** " + std::to_string(b) +
                                      "; cast to a float first), as in torch");
                        uint64_t r = 1, base = static_cast<uint64_t>(a);
                        for (; b; b >>= 1, base *= base)
                          if (b & 1) r *= base;
                        return wrap(r);
                      });

      case OpKind::Eq: return compare(n, [](auto a, auto b) { return a == b; });
      case OpKind::Ne: return compare(n, [](auto a, auto b) { return a != b; });
      case OpKind::Lt: return compare(n, [](auto a, auto b) { return a < b; });
      case OpKind::Le: return compare(n, [](auto a, auto b) { return a <= b; });
      case OpKind::Gt: return compare(n, [](auto a, auto b) { return a > b; });
      case OpKind::Ge: return compare(n, [](auto a, auto b) { return a >= b; });
      case OpKind::Where: return where(n);

      case OpKind::Sum:
      case OpKind::Max:
      case OpKind::Min:
      case OpKind::Mean: return reduce(n);

      case OpKind::Matmul: return matmul(n);

      case OpKind::Transpose: {
        int rank = in(n, 0).type().rank();
        std::vector<int64_t> perm(static_cast<size_t>(rank));
        for (int d = 0; d < rank; ++d) perm[static_cast<size_t>(d)] = d;
        std::swap(perm[static_cast<size_t>(*normalize_dim(n.attrs.get_int("dim0"), rank))],
                  perm[static_cast<size_t>(*normalize_dim(n.attrs.get_int("dim1"), rank))]);
        return permute(n, perm);
      }
      case OpKind::Permute: {
        int rank = in(n, 0).type().rank();
        std::vector<int64_t> perm;
        for (int64_t d : n.attrs.get_ints("dims")) perm.push_back(*normalize_dim(d, rank));
        return permute(n, perm);
      }
      case OpKind::Reshape: {
        // C order: the flat element sequence is unchanged; the shape comes from the
        // node's type, where the shape rule has already resolved any -1.
        const Tensor& x = in(n, 0);
        Tensor out(n.type.dtype, n.type.shape);
        if (out.nbytes()) std::memcpy(out.data(), x.data(), out.nbytes());
        return out;
      }
      case OpKind::Expand: {
        const Tensor& x = in(n, 0);
        Tensor out(n.type.dtype, n.type.shape);
        std::vector<int64_t> st = broadcast_strides(x.shape(), out.shape());
        for (int64_t i = 0; i < out.numel(); ++i) copy_elem(x, offset_of(i, out.shape(), st), out, i);
        return out;
      }
      case OpKind::Slice: return slice(n);
      case OpKind::Concat: return concat(n);
      case OpKind::Embedding: return eval_embedding(n, in(n, 0), in(n, 1));
      case OpKind::Gather: return eval_gather(n, in(n, 0), in(n, 1));
      case OpKind::IndexSelect: return eval_index_select(n, in(n, 0), in(n, 1));
      case OpKind::ScatterAdd: return eval_scatter_add(n, in(n, 0), in(n, 1), in(n, 2));
      case OpKind::CrossEntropy: return eval_cross_entropy(n, in(n, 0), in(n, 1));

      case OpKind::Gelu:
        return unary_float(n, [](double x) { return 0.5 * x * (1.0 + std::erf(x / std::numbers::sqrt2)); });
      case OpKind::GeluTanh:
        return unary_float(n, [](double x) {
          const double k = std::sqrt(2.0 / std::numbers::pi);
          return 0.5 * x * (1.0 + std::tanh(k * (x + 0.044715 * x * x * x)));
        });
      case OpKind::Softmax: return softmax(n, /*log=*/false);
      case OpKind::LogSoftmax: return softmax(n, /*log=*/true);
      case OpKind::ScaledDotProductAttention: return evaluate_attention(n, args_);
      case OpKind::LayerNorm: return norm(n, /*layer=*/true);
      case OpKind::RmsNorm: return norm(n, /*layer=*/false);

      case OpKind::AllGather:
      case OpKind::ReduceScatter:
      case OpKind::AllReduce:
      case OpKind::AllToAll: {
        const std::string& name = n.attrs.get_ident("mesh_dim");
        if (!g_) fail(n, "a collective is not a local op (the per-rank executor runs it)");
        auto md = g_->mesh().find(name);
        int64_t size = md ? g_->mesh().dims[static_cast<size_t>(*md)].size : 0;
        // Over one rank every one of these is the identity (an avg over one value too).
        if (size == 1) return copy_of(in(n, 0));
        fail(n, std::string(op_name(n.op)) + " over mesh dim '" + name + "' (size " +
                    std::to_string(size) +
                    ") is a per-rank collective that the global reference evaluator cannot run");
      }
      // In the global view a redistribute changes only how the value is laid out.
      case OpKind::Redistribute: return copy_of(in(n, 0));

      // start + i * step is a value between start and end: exact in int64, then one
      // rounding to the dtype (set_int), as a cast of the int64 values.
      case OpKind::Arange: {
        Tensor out(n.type.dtype, n.type.shape);
        const int64_t start = n.attrs.get_int("start"), step = n.attrs.get_int("step");
        for (int64_t i = 0; i < out.numel(); ++i) out.set_int(i, add_i(start, mul_i(i, step)));
        return out;
      }
      case OpKind::Full: {
        Tensor out(n.type.dtype, n.type.shape);
        for (int64_t i = 0; i < out.numel(); ++i) store(out, i, n.attrs.get_float("value"));
        return out;
      }
      case OpKind::Tril: return triangle(n, /*lower=*/true);
      case OpKind::Triu: return triangle(n, /*lower=*/false);
      case OpKind::Cumsum:
      case OpKind::Argmax:
      case OpKind::Argmin: return reference_detail::evaluate_along(n, in(n, 0));
      case OpKind::Dropout: return dropout(n);
    }
    fail(n, "internal: unknown op");
  }

  // Neg, Abs, Relu: the only unary ops that take integers; those stay exact in int64.
  template <class F, class I>
  Tensor unary(const Node& n, F f, I fi) {
    if (is_float(n.type.dtype)) return unary_float(n, f);
    const Tensor& x = in(n, 0);
    Tensor out(n.type.dtype, n.type.shape);
    for (int64_t i = 0; i < out.numel(); ++i) out.set_int(i, fi(x.get_int(i)));
    return out;
  }

  template <class F>
  Tensor unary_float(const Node& n, F f) {
    const Tensor& x = in(n, 0);
    Tensor out(n.type.dtype, n.type.shape);
    for (int64_t i = 0; i < out.numel(); ++i) store(out, i, f(x.get(i)));
    return out;
  }

  // Elementwise with broadcasting; integer results in int64, float results in double.
  template <class F, class I>
  Tensor binary(const Node& n, F f, I fi) {
    const Tensor& a = in(n, 0);
    const Tensor& b = in(n, 1);
    Tensor out(n.type.dtype, n.type.shape);
    std::vector<int64_t> sa = broadcast_strides(a.shape(), out.shape());
    std::vector<int64_t> sb = broadcast_strides(b.shape(), out.shape());
    bool int_math = !is_float(out.dtype());
    for (int64_t i = 0; i < out.numel(); ++i) {
      int64_t ia = offset_of(i, out.shape(), sa), ib = offset_of(i, out.shape(), sb);
      if (int_math) out.set_int(i, fi(a.get_int(ia), b.get_int(ib)));
      else store(out, i, f(a.get(ia), b.get(ib)));
    }
    return out;
  }

  // Compares values: in int64 when neither operand is a float (exact for i64), else in
  // double (exact for every float dtype).
  template <class F>
  Tensor compare(const Node& n, F f) {
    const Tensor& a = in(n, 0);
    const Tensor& b = in(n, 1);
    Tensor out(n.type.dtype, n.type.shape);
    std::vector<int64_t> sa = broadcast_strides(a.shape(), out.shape());
    std::vector<int64_t> sb = broadcast_strides(b.shape(), out.shape());
    bool int_cmp = !is_float(a.dtype()) && !is_float(b.dtype());
    for (int64_t i = 0; i < out.numel(); ++i) {
      int64_t ia = offset_of(i, out.shape(), sa), ib = offset_of(i, out.shape(), sb);
      bool r = int_cmp ? f(a.get_int(ia), b.get_int(ib)) : f(a.get(ia), b.get(ib));
      out.set_int(i, r ? 1 : 0);
    }
    return out;
  }

  Tensor where(const Node& n) {
    const Tensor& c = in(n, 0);
    const Tensor& a = in(n, 1);
    const Tensor& b = in(n, 2);
    Tensor out(n.type.dtype, n.type.shape);
    std::vector<int64_t> sc = broadcast_strides(c.shape(), out.shape());
    std::vector<int64_t> sa = broadcast_strides(a.shape(), out.shape());
    std::vector<int64_t> sb = broadcast_strides(b.shape(), out.shape());
    for (int64_t i = 0; i < out.numel(); ++i) {
      if (c.get_int(offset_of(i, out.shape(), sc)) != 0) convert(a, offset_of(i, out.shape(), sa), out, i);
      else convert(b, offset_of(i, out.shape(), sb), out, i);
    }
    return out;
  }

  Tensor reduce(const Node& n) {
    const Tensor& x = in(n, 0);
    int rank = x.type().rank();
    const auto& dims = n.attrs.get_ints("dims");
    std::vector<bool> reduced(static_cast<size_t>(rank), dims.empty());
    for (int64_t d : dims) reduced[static_cast<size_t>(*normalize_dim(d, rank))] = true;
    // The output indexed by the input's coordinates: the keepdim shape (reduced dims
    // size 1) has the same C order as the shape without them.
    Shape kept = x.shape();
    int64_t count = 1;  // elements folded into each output element
    for (int d = 0; d < rank; ++d)
      if (reduced[static_cast<size_t>(d)]) {
        count *= kept[static_cast<size_t>(d)];
        kept[static_cast<size_t>(d)] = 1;
      }
    std::vector<int64_t> ost = broadcast_strides(kept, x.shape());

    Tensor out(n.type.dtype, n.type.shape);
    if ((n.op == OpKind::Max || n.op == OpKind::Min) && count == 0 && out.numel() > 0)
      fail(n, "reducing over empty dims of " + x.type().str() + " (dims " + shape_str(dims) +
                  "): " + std::string(op_name(n.op)) + " has no identity, as torch also says");
    // A mean's `count` (set on a rank's chunk of a sharded dim) replaces the local count.
    const int64_t divisor = n.op == OpKind::Mean && n.attrs.get_int("count") > 0 ? n.attrs.get_int("count") : count;
    bool int_acc = !is_float(out.dtype());  // sum of ints/bools (into i64), max/min of ints
    std::vector<double> acc(static_cast<size_t>(out.numel()));
    std::vector<int64_t> iacc(static_cast<size_t>(out.numel()));
    std::vector<bool> seen(static_cast<size_t>(out.numel()), false);
    for (int64_t i = 0; i < x.numel(); ++i) {
      auto o = static_cast<size_t>(offset_of(i, x.shape(), ost));
      if (int_acc) {
        int64_t v = x.get_int(i);
        if (n.op == OpKind::Max) iacc[o] = seen[o] ? std::max(iacc[o], v) : v;
        else if (n.op == OpKind::Min) iacc[o] = seen[o] ? std::min(iacc[o], v) : v;
        else iacc[o] = add_i(iacc[o], v);  // Sum (mean is float-only)
      } else {
        double v = x.get(i);
        if (n.op == OpKind::Max) acc[o] = seen[o] ? max_f(acc[o], v) : v;
        else if (n.op == OpKind::Min) acc[o] = seen[o] ? min_f(acc[o], v) : v;
        else acc[o] += v;  // Sum, Mean
      }
      seen[o] = true;
    }
    for (int64_t o = 0; o < out.numel(); ++o) {
      auto u = static_cast<size_t>(o);
      if (int_acc) out.set_int(o, iacc[u]);
      else if (n.op == OpKind::Mean) store(out, o, divisor ? acc[u] / static_cast<double>(divisor) : kNaN);
      else store(out, o, acc[u]);
    }
    return out;
  }

  Tensor matmul(const Node& n) {
    const Tensor& a = in(n, 0);
    const Tensor& b = in(n, 1);
    Tensor out(n.type.dtype, n.type.shape);
    size_t r = out.shape().size();
    int64_t m = out.shape()[r - 2], nn = out.shape()[r - 1];
    int64_t k = a.shape()[a.shape().size() - 1];
    Shape batch(out.shape().begin(), out.shape().end() - 2);
    Shape ab(a.shape().begin(), a.shape().end() - 2), bb(b.shape().begin(), b.shape().end() - 2);
    std::vector<int64_t> sa = broadcast_strides(ab, batch), sb = broadcast_strides(bb, batch);
    // Integer matmul stays exact in int64, as torch's; floats accumulate in double.
    bool int_math = !is_float(out.dtype());
    for (int64_t bi = 0; bi < numel(batch); ++bi) {
      int64_t aoff = offset_of(bi, batch, sa) * m * k, boff = offset_of(bi, batch, sb) * k * nn;
      int64_t ooff = bi * m * nn;
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < nn; ++j) {
          double acc = 0;
          int64_t iacc = 0;
          for (int64_t p = 0; p < k; ++p) {
            int64_t ia = aoff + i * k + p, ib = boff + p * nn + j;
            if (int_math) iacc = add_i(iacc, mul_i(a.get_int(ia), b.get_int(ib)));
            else acc += a.get(ia) * b.get(ib);
          }
          if (int_math) out.set_int(ooff + i * nn + j, iacc);
          else store(out, ooff + i * nn + j, acc);
        }
    }
    return out;
  }

  // out dim d is input dim perm[d].
  Tensor permute(const Node& n, const std::vector<int64_t>& perm) {
    const Tensor& x = in(n, 0);
    Tensor out(n.type.dtype, n.type.shape);
    std::vector<int64_t> cs = contiguous_strides(x.shape()), st;
    for (int64_t p : perm) st.push_back(cs[static_cast<size_t>(p)]);
    for (int64_t i = 0; i < out.numel(); ++i) copy_elem(x, offset_of(i, out.shape(), st), out, i);
    return out;
  }

  // Element k along the dim is the operand's start + k * step: a strided view.
  Tensor slice(const Node& n) {
    const Tensor& x = in(n, 0);
    auto [d, r] = slice_of(n.attrs, x.shape());
    Tensor out(n.type.dtype, n.type.shape);
    std::vector<int64_t> st = contiguous_strides(x.shape());
    const int64_t base = r.start * st[static_cast<size_t>(d)];
    if (r.length > 1) st[static_cast<size_t>(d)] *= r.step;  // else only element 0: a huge step must not overflow
    for (int64_t i = 0; i < out.numel(); ++i) copy_elem(x, base + offset_of(i, out.shape(), st), out, i);
    return out;
  }

  // The operands' blocks in turn along the dim: per index of the dims before it, each
  // operand contributes one contiguous run of size[dim] x (the dims after it).
  Tensor concat(const Node& n) {
    Tensor out(n.type.dtype, n.type.shape);
    const Shape& s = n.type.shape;
    const auto d = static_cast<size_t>(*normalize_dim(n.attrs.get_int("dim"), n.type.rank()));
    int64_t outer = 1, inner = 1;
    for (size_t e = 0; e < d; ++e) outer *= s[e];
    for (size_t e = d + 1; e < s.size(); ++e) inner *= s[e];
    const auto esize = static_cast<size_t>(dtype_size(n.type.dtype));
    int64_t at = 0;  // where along the dim the current operand starts
    for (size_t j = 0; j < args_.size(); ++j) {
      const Tensor& x = in(n, j);
      const int64_t run = x.shape()[d] * inner;
      if (run > 0)
        for (int64_t o = 0; o < outer; ++o)
          std::memcpy(out.data() + static_cast<size_t>((o * s[d] + at) * inner) * esize,
                      x.data() + static_cast<size_t>(o * run) * esize, static_cast<size_t>(run) * esize);
      at += x.shape()[d];
    }
    return out;
  }

  // tril keeps x[..., i, j] where j - i <= diagonal, triu where j - i >= diagonal;
  // the rest is 0 (a new tensor is zeros).
  Tensor triangle(const Node& n, bool lower) {
    const Tensor& x = in(n, 0);
    Tensor out(n.type.dtype, n.type.shape);
    const size_t r = n.type.shape.size();
    const int64_t rows = n.type.shape[r - 2], cols = n.type.shape[r - 1];
    const int64_t diagonal = n.attrs.get_int("diagonal");
    for (int64_t e = 0; e < out.numel(); ++e) {
      const int64_t j = e % cols, i = e / cols % rows;  // |j - i| < 2^40: no overflow
      if (lower ? j - i <= diagonal : j - i >= diagonal) copy_elem(x, e, out, e);
    }
    return out;
  }

  // F.dropout in training mode with the counter-based mask of codegen/ir/dropout.h:
  // the element at global index g is x * 1/(1-p) where u(g) >= p, else x * 0 (torch
  // multiplies by its mask too, so a dropped inf or NaN gives NaN, and a dropped -x -0).
  Tensor dropout(const Node& n) {
    const Tensor& x = in(n, 0);
    Tensor out(n.type.dtype, n.type.shape);
    const double p = n.attrs.get_float("p"), scale = dropout_scale(p);
    const auto seed = static_cast<uint64_t>(n.attrs.get_int("seed"));
    const DropoutIndex at = dropout_index(n.type.shape, n.attrs);
    for (int64_t e = 0; e < out.numel(); ++e) {
      const auto g = static_cast<uint64_t>(at.base + offset_of(e, n.type.shape, at.strides));
      const bool keep = dropout_uniform(dropout_word(seed, g)) >= p;
      store(out, e, x.get(e) * (keep ? scale : 0.0));
    }
    return out;
  }

  // softmax: exp(x - max) / sum(exp(x - max)); log_softmax: (x - max) - log(sum(...)).
  Tensor softmax(const Node& n, bool log) {
    const Tensor& x = in(n, 0);
    Tensor out(n.type.dtype, n.type.shape);
    const Shape& s = x.shape();
    auto d = static_cast<size_t>(*normalize_dim(n.attrs.get_int("dim"), x.type().rank()));
    int64_t len = s[d];
    int64_t inner = numel(Shape(s.begin() + static_cast<std::ptrdiff_t>(d) + 1, s.end()));
    int64_t outer = numel(Shape(s.begin(), s.begin() + static_cast<std::ptrdiff_t>(d)));
    std::vector<double> e(static_cast<size_t>(len));
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t j = 0; j < inner; ++j) {
        auto at = [&](int64_t l) { return (o * len + l) * inner + j; };
        // Subtracting the max keeps exp in range; it does not change the result.
        double m = -std::numeric_limits<double>::infinity();
        for (int64_t l = 0; l < len; ++l) m = max_f(m, x.get(at(l)));
        double sum = 0;
        for (int64_t l = 0; l < len; ++l) sum += e[static_cast<size_t>(l)] = std::exp(x.get(at(l)) - m);
        for (int64_t l = 0; l < len; ++l)
          store(out, at(l), log ? x.get(at(l)) - m - std::log(sum) : e[static_cast<size_t>(l)] / sum);
      }
    return out;
  }

  // layer_norm(x, w, b, eps) = (x - mean) / sqrt(biased var + eps) * w + b,
  // rms_norm(x, w, eps) = x / sqrt(mean(x^2) + eps) * w, over the trailing w.rank() dims.
  Tensor norm(const Node& n, bool layer) {
    const Tensor& x = in(n, 0);
    const Tensor& w = in(n, 1);
    double eps = n.attrs.get_float("eps");
    Tensor out(n.type.dtype, n.type.shape);
    int64_t len = w.numel();  // the trailing dims are contiguous in C order
    if (len == 0) return out;  // then x has no elements either
    for (int64_t r = 0; r < x.numel() / len; ++r) {
      int64_t base = r * len;
      double mean = 0, sq = 0;
      if (layer) {
        for (int64_t j = 0; j < len; ++j) mean += x.get(base + j);
        mean /= static_cast<double>(len);
      }
      for (int64_t j = 0; j < len; ++j) {
        double c = x.get(base + j) - mean;
        sq += c * c;
      }
      double scale = 1.0 / std::sqrt(sq / static_cast<double>(len) + eps);
      for (int64_t j = 0; j < len; ++j) {
        double y = (x.get(base + j) - mean) * scale * w.get(j);
        if (layer) y += in(n, 2).get(j);
        store(out, base + j, y);
      }
    }
    return out;
  }

  const Graph* g_ = nullptr;
  std::vector<Tensor> vals_;
  std::vector<const Tensor*> args_;  // the current node's operands
};

// The smallest row count of the embedding weights (or indexed dim of gather, index_select
// and scatter_add) whose indices come from value `v`,
// looking through ops that move or relabel indices without changing their values.
std::optional<int64_t> embedding_rows(const Graph& g, ValueId param) {
  // Whether the values of `v` come (in part: a concat has several operands) from `param`.
  auto from_param = [&](ValueId v0) {
    std::vector<ValueId> work{v0};
    std::vector<bool> seen(g.nodes().size());  // a DAG of concats can reach a value many ways
    while (!work.empty()) {
      ValueId v = work.back();
      work.pop_back();
      if (v == param) return true;
      if (seen[static_cast<size_t>(v)]) continue;
      seen[static_cast<size_t>(v)] = true;
      const Node& n = g.node(v);
      OpCategory c = op_info(n.op).category;
      bool passes = c == OpCategory::Movement || n.op == OpKind::Redistribute ||
                    (n.op == OpKind::Cast && is_integer(n.type.dtype));
      const bool indexed = n.op == OpKind::Gather || n.op == OpKind::IndexSelect;  // values from x only
      if (passes) work.insert(work.end(), n.inputs.begin(), indexed ? n.inputs.begin() + 1 : n.inputs.end());
    }
    return false;
  };
  std::optional<int64_t> rows;
  for (const Node& n : g.nodes()) {
    std::optional<int64_t> r;
    if (n.op == OpKind::Embedding && from_param(n.inputs[0])) r = g.node(n.inputs[1]).type.shape[0];
    if (n.op == OpKind::CrossEntropy && from_param(n.inputs[1])) {  // the classes of the logits
      const TensorType& x = g.node(n.inputs[0]).type;
      r = x.shape[static_cast<size_t>(class_dim(x.rank()))];
    }
    // gather, index_select, scatter_add: the indexed dim of x.
    const bool indexes = n.op == OpKind::Gather || n.op == OpKind::IndexSelect || n.op == OpKind::ScatterAdd;
    if (indexes && from_param(n.inputs[1])) {
      const TensorType& x = g.node(n.inputs[0]).type;
      r = x.shape[static_cast<size_t>(*normalize_dim(n.attrs.get_int("dim"), x.rank()))];
    }
    if (r) rows = rows ? std::min(*rows, *r) : *r;
  }
  return rows;
}

}  // namespace

Result<std::vector<Tensor>> evaluate(const Graph& g, const std::vector<Tensor>& inputs) {
  try {
    return Evaluator(g).run(inputs);
  } catch (const DiagError& e) {
    return e.diag;
  } catch (const OpError& e) {  // an attribute getter on a graph that skipped the verifier
    return Diag{"", {}, e.message};
  }
}

Result<Tensor> evaluate_node(const Node& n, const std::vector<const Tensor*>& inputs) {
  if (inputs.size() != n.inputs.size() || n.op == OpKind::Param)
    return Diag{"", n.loc, std::string(op_name(n.op)) + ": evaluate_node got " + std::to_string(inputs.size()) +
                               " operand(s) for " + std::to_string(n.inputs.size())};
  try {
    return Evaluator().one(n, inputs);
  } catch (const DiagError& e) {
    return e.diag;
  } catch (const OpError& e) {
    return Diag{"", n.loc, e.message};
  }
}

std::vector<int64_t> random_input_bounds(const Graph& g) {
  std::vector<int64_t> bounds;
  for (ValueId p : g.params()) bounds.push_back(std::max<int64_t>(embedding_rows(g, p).value_or(8), 1));
  return bounds;
}

std::vector<Tensor> random_inputs(const Graph& g, uint64_t seed) {
  std::vector<TensorType> types;
  for (ValueId p : g.params()) types.push_back(g.node(p).type);
  return random_tensors(types, random_input_bounds(g), seed);
}

}  // namespace sf
