// Per-op sharding strategies, checked the way PyTorch's DTensorConverter checks
// DTensor ops: for every op, several shapes and three meshes ([4], [3], [2, 2]), and
// EVERY strategy op_strategies returns, shard seeded-random global inputs per the
// strategy's input specs, run the local node on each rank's shards, gather the
// results per the output spec and compare with the op on the global inputs. Then a
// few strategies worked out by hand must be present (or absent).
#include <gtest/gtest.h>

#include <chrono>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <string>

#include "runtime/core/device_mesh.h"
#include "runtime/core/shard.h"
#include "codegen/dist/strategy.h"
#include "codegen/reference/compare.h"
#include "codegen/reference/evaluate.h"

namespace sf {
namespace dist_strategy_test {

DeviceMesh mesh_1d(int64_t n) { return DeviceMesh(Mesh{{{"tp", n}}}); }
DeviceMesh mesh_2x2() { return DeviceMesh(Mesh{{{"dp", 2}, {"tp", 2}}}); }
std::vector<DeviceMesh> test_meshes() { return {mesh_1d(4), mesh_1d(3), mesh_2x2()}; }

Placement R() { return Placement::replicate(); }
Placement S(int64_t d) { return Placement::shard(d); }
Placement P(ReduceOp op = ReduceOp::Sum) { return Placement::partial(op); }
PlacementSpec sp(std::initializer_list<Placement> p) { return PlacementSpec{std::vector<Placement>(p)}; }

using Named = std::vector<std::pair<std::string, AttrValue>>;

Operand T(DType t, Shape s) { return {{t, std::move(s)}, false}; }
Operand F(Shape s) { return T(DType::F32, std::move(s)); }
Operand I(Shape s) { return T(DType::I32, std::move(s)); }
Operand L(DType t = DType::F32) { return {{t, {}}, true}; }  // a number literal

// One row of the table: an op, its operands and attributes. A redistribute row gets
// its placements per mesh (the attribute names one placement per mesh dim).
struct Case {
  OpKind op;
  std::vector<Operand> in;
  Named attrs = {};
};

std::string case_str(const Case& c) {
  std::string s(op_name(c.op));
  s += "(";
  for (size_t i = 0; i < c.in.size(); ++i) s += std::string(i ? ", " : "") + (c.in[i].weak ? "literal " : "") + c.in[i].type.str();
  for (const auto& [n, v] : c.attrs) s += ", " + n + "=" + attr_value_str(v, Mesh{});
  return s + ")";
}

std::vector<Case> cases() {
  std::vector<Case> v;
  const OpKind float_unary[] = {OpKind::Exp,  OpKind::Log,  OpKind::Sqrt,       OpKind::Rsqrt, OpKind::Tanh,
                                OpKind::Sigmoid, OpKind::Silu, OpKind::Sin,     OpKind::Cos,   OpKind::Reciprocal,
                                OpKind::Erf,  OpKind::Gelu, OpKind::GeluTanh};
  for (OpKind k : float_unary)
    for (const Shape& s : {Shape{5, 3}, Shape{4, 1, 7}, Shape{0, 3}, Shape{}}) v.push_back({k, {F(s)}});
  for (OpKind k : {OpKind::Neg, OpKind::Abs, OpKind::Relu}) {
    for (const Shape& s : {Shape{5, 3}, Shape{1, 7}, Shape{0, 3}, Shape{}}) v.push_back({k, {F(s)}});
    v.push_back({k, {I({7, 2})}});
    v.push_back({k, {T(DType::I64, {2, 6})}});
    v.push_back({k, {T(DType::F16, {5, 3})}});
  }
  v.push_back({OpKind::Cast, {F({5, 3})}, {{"dtype", DType::I32}}});
  v.push_back({OpKind::Cast, {T(DType::I64, {7})}, {{"dtype", DType::F32}}});
  v.push_back({OpKind::Cast, {F({1, 6})}, {{"dtype", DType::BF16}}});
  v.push_back({OpKind::Cast, {F({0, 2})}, {{"dtype", DType::F16}}});

  const OpKind binary[] = {OpKind::Add, OpKind::Sub, OpKind::Mul, OpKind::Div, OpKind::Maximum, OpKind::Minimum,
                           OpKind::Pow, OpKind::Eq,  OpKind::Ne,  OpKind::Lt,  OpKind::Le,      OpKind::Gt,
                           OpKind::Ge};
  for (OpKind k : binary) {
    v.push_back({k, {F({5, 3}), F({5, 3})}});
    v.push_back({k, {F({4, 1}), F({1, 7})}});   // both broadcast
    v.push_back({k, {F({7}), F({2, 7})}});      // a missing leading dim
    v.push_back({k, {F({2, 5, 3}), F({5, 1})}});
    v.push_back({k, {F({5, 3}), L()}});
    v.push_back({k, {L(), F({6})}});
    v.push_back({k, {F({0, 3}), F({1, 3})}});
    v.push_back({k, {F({}), F({})}});
    v.push_back({k, {I({6, 5}), I({5})}});
    v.push_back({k, {I({3, 5}), T(DType::I64, {3, 5})}});  // i32 widens to i64: no Partial
    v.push_back({k, {I({5}), L(DType::I64)}});
  }
  v.push_back({OpKind::Add, {T(DType::F16, {5, 3}), T(DType::F16, {3})}});
  v.push_back({OpKind::Mul, {T(DType::BF16, {7}), L()}});
  v.push_back({OpKind::Where, {T(DType::Bool, {5, 1}), F({5, 3}), F({3})}});
  v.push_back({OpKind::Where, {T(DType::Bool, {4, 7}), F({4, 7}), L()}});
  v.push_back({OpKind::Where, {T(DType::Bool, {}), I({2, 5}), I({5})}});
  v.push_back({OpKind::Where, {T(DType::Bool, {0, 2}), F({1, 2}), F({0, 1})}});

  using V = std::vector<int64_t>;
  for (OpKind k : {OpKind::Sum, OpKind::Max, OpKind::Min, OpKind::Mean}) {
    v.push_back({k, {F({5, 3})}, {{"dims", V{0}}}});
    v.push_back({k, {F({5, 3})}, {}});
    v.push_back({k, {F({2, 5, 3})}, {{"dims", V{0, 2}}, {"keepdim", true}}});
    v.push_back({k, {F({2, 5, 3})}, {{"dims", V{-2}}}});
    v.push_back({k, {F({8, 1})}, {{"dims", V{1}}, {"keepdim", true}}});
    v.push_back({k, {F({3, 6})}, {{"dims", V{0}}}});  // 3 on 4 ranks: an empty chunk
    v.push_back({k, {F({0, 4})}, {{"dims", V{1}}}});
    if (k != OpKind::Mean) {
      v.push_back({k, {I({7, 4})}, {{"dims", V{1}}}});
      v.push_back({k, {T(DType::I64, {6, 2})}, {{"dims", V{0}}}});
    }
  }
  v.push_back({OpKind::Sum, {F({0, 4})}, {{"dims", V{0}}}});  // sum over an empty dim is 0
  v.push_back({OpKind::Sum, {T(DType::Bool, {5, 3})}, {{"dims", V{0}}}});

  v.push_back({OpKind::Matmul, {F({5, 4}), F({4, 7})}});
  v.push_back({OpKind::Matmul, {F({2, 5, 3}), F({3, 6})}});
  v.push_back({OpKind::Matmul, {F({3, 4}), F({2, 4, 5})}});
  v.push_back({OpKind::Matmul, {F({2, 1, 3, 4}), F({3, 4, 2})}});  // broadcast batch dims
  v.push_back({OpKind::Matmul, {F({5, 0}), F({0, 3})}});           // k = 0: zeros
  v.push_back({OpKind::Matmul, {T(DType::I64, {3, 5}), T(DType::I64, {5, 2})}});

  v.push_back({OpKind::Transpose, {F({5, 3})}, {{"dim0", int64_t{0}}, {"dim1", int64_t{1}}}});
  v.push_back({OpKind::Transpose, {F({2, 5, 3})}, {{"dim0", int64_t{-1}}, {"dim1", int64_t{0}}}});
  v.push_back({OpKind::Transpose, {I({0, 4})}, {{"dim0", int64_t{0}}, {"dim1", int64_t{1}}}});
  v.push_back({OpKind::Permute, {F({2, 5, 3})}, {{"dims", V{2, 0, 1}}}});
  v.push_back({OpKind::Permute, {I({4, 1, 3})}, {{"dims", V{1, 2, 0}}}});

  const std::pair<Shape, V> reshapes[] = {
      {{8, 4}, {32}},     {{6, 4}, {24}},        {{32}, {8, 4}},    {{6, 4}, {3, 8}},  {{4, 6}, {4, 2, 3}},
      {{5, 1, 6}, {5, 6}}, {{5, 6}, {5, 1, 6}},  {{2, 3, 4}, {6, -1}}, {{0, 4}, {4, 0}}, {{7, 3}, {7, 3}},
      {{12}, {2, 2, 3}},  {{4, 6}, {24}},        {{5, 4}, {20}},    {{12, 2}, {3, 4, 2}}, {{}, {1, 1}},
      {{1, 1}, {1}}};
  for (const auto& [s, to] : reshapes) v.push_back({OpKind::Reshape, {F(s)}, {{"shape", to}}});
  v.push_back({OpKind::Reshape, {T(DType::I64, {4, 3})}, {{"shape", V{12}}}});

  const std::pair<Shape, V> expands[] = {{{5, 1}, {5, 4}},    {{3}, {2, 4, 3}}, {{1, 7}, {3, 2, 7}},
                                         {{0, 1}, {0, 3}},    {{5, 1}, {-1, 6}}, {{}, {3}}};
  for (const auto& [s, to] : expands) v.push_back({OpKind::Expand, {F(s)}, {{"shape", to}}});
  v.push_back({OpKind::Expand, {I({1, 5})}, {{"shape", V{6, 5}}}});

  // slice: uneven shards (5 and 7 rows on 4 ranks), negative and out-of-range bounds,
  // step 2, an empty slice, a slice of an empty tensor.
  auto sl = [](int64_t dim, int64_t start, int64_t end, int64_t step = 1) {
    return Named{{"dim", dim}, {"start", start}, {"end", end}, {"step", step}};
  };
  v.push_back({OpKind::Slice, {F({5, 6})}, sl(1, 1, 5)});
  v.push_back({OpKind::Slice, {F({7, 6})}, sl(-1, -4, -1)});
  v.push_back({OpKind::Slice, {F({5, 8})}, sl(1, 1, 8, 2)});
  v.push_back({OpKind::Slice, {F({6, 5})}, sl(0, 1, 6, 2)});
  v.push_back({OpKind::Slice, {F({5, 4})}, sl(1, 3, 1)});
  v.push_back({OpKind::Slice, {F({2, 5, 3})}, sl(1, -100, 100)});
  v.push_back({OpKind::Slice, {I({5, 3})}, sl(0, 2, 4)});
  v.push_back({OpKind::Slice, {T(DType::BF16, {3, 6})}, sl(1, 0, 3)});
  v.push_back({OpKind::Slice, {F({0, 4})}, sl(1, 1, 3)});
  // concat: three operands, uneven rows, a zero-size operand, the default dim 0.
  v.push_back({OpKind::Concat, {F({5, 2}), F({5, 3})}, {{"dim", int64_t{1}}}});
  v.push_back({OpKind::Concat, {F({7, 2}), F({7, 1}), F({7, 3})}, {{"dim", int64_t{-1}}}});
  v.push_back({OpKind::Concat, {F({2, 3}), F({4, 3})}});
  v.push_back({OpKind::Concat, {F({2, 5, 3}), F({2, 0, 3})}, {{"dim", int64_t{1}}}});
  v.push_back({OpKind::Concat, {I({5, 2}), I({5, 2})}, {{"dim", int64_t{1}}}});
  v.push_back({OpKind::Concat, {T(DType::F16, {3, 4}), T(DType::F16, {3, 4})}, {{"dim", int64_t{0}}}});

  v.push_back({OpKind::Embedding, {T(DType::I64, {5}), F({10, 6})}});
  v.push_back({OpKind::Embedding, {I({2, 3}), F({7, 5})}});
  v.push_back({OpKind::Embedding, {T(DType::I64, {0}), F({4, 3})}});
  v.push_back({OpKind::Embedding, {T(DType::I64, {}), F({4, 7})}});
  v.push_back({OpKind::Embedding, {T(DType::I32, {6}), F({3, 2})}});  // row chunks 1, 1, 1, 0 on 4 ranks
  // Index ops: x and index sharded alike, the index sharded, the vocabulary-parallel
  // lookup over uneven and empty row chunks, Partials through them.
  v.push_back({OpKind::Gather, {F({5, 6}), T(DType::I64, {5, 3})}, {{"dim", int64_t{1}}}});
  v.push_back({OpKind::Gather, {T(DType::F16, {7, 4}), I({7, 4})}, {{"dim", int64_t{0}}}});
  v.push_back({OpKind::Gather, {I({4, 5}), T(DType::I64, {2, 7})}, {{"dim", int64_t{-1}}}});
  v.push_back({OpKind::IndexSelect, {F({5, 6}), T(DType::I64, {7})}, {{"dim", int64_t{0}}}});
  v.push_back({OpKind::IndexSelect, {I({4, 7}), I({3})}, {{"dim", int64_t{-1}}}});
  v.push_back({OpKind::IndexSelect, {F({3, 2}), I({5})}, {{"dim", int64_t{0}}, {"offset", int64_t{-1}}}});
  v.push_back({OpKind::ScatterAdd, {F({5, 6}), T(DType::I64, {3, 6}), F({3, 6})}, {{"dim", int64_t{0}}}});
  v.push_back({OpKind::ScatterAdd, {I({4, 5}), T(DType::I64, {4, 2}), I({4, 3})}, {{"dim", int64_t{1}}}});

  v.push_back({OpKind::Softmax, {F({5, 3})}});
  v.push_back({OpKind::Softmax, {F({2, 5, 3})}, {{"dim", int64_t{1}}}});
  v.push_back({OpKind::Softmax, {F({0, 4})}, {{"dim", int64_t{0}}}});
  v.push_back({OpKind::LayerNorm, {F({5, 6}), F({6}), F({6})}});
  v.push_back({OpKind::LayerNorm, {F({2, 5, 3}), F({5, 3}), F({5, 3})}});
  v.push_back({OpKind::LayerNorm, {F({0, 4}), F({4}), F({4})}});
  v.push_back({OpKind::RmsNorm, {F({5, 6}), F({6})}});
  v.push_back({OpKind::RmsNorm, {F({2, 3, 7}), F({7})}});

  v.push_back({OpKind::AllGather, {F({5, 3})}, {{"mesh_dim", std::string("tp")}}});
  v.push_back({OpKind::ReduceScatter, {F({12, 3})}, {{"mesh_dim", std::string("tp")}}});
  v.push_back({OpKind::AllReduce, {F({5, 3})}, {{"mesh_dim", std::string("tp")}, {"op", std::string("max")}}});
  v.push_back({OpKind::AllToAll, {F({12, 3})}, {{"mesh_dim", std::string("tp")}, {"concat_dim", int64_t{1}}}});
  v.push_back({OpKind::Redistribute, {F({5, 3})}});
  v.push_back({OpKind::Redistribute, {F({6, 4})}});

  // Generators: no operands; each S(d) strategy has every rank build its own chunk.
  const int64_t kMax = std::numeric_limits<int64_t>::max(), kMin = std::numeric_limits<int64_t>::min();
  v.push_back({OpKind::Arange, {}, {{"end", int64_t{7}}}});
  v.push_back({OpKind::Arange, {}, {{"end", int64_t{-9}}, {"start", int64_t{5}}, {"step", int64_t{-3}}, {"dtype", DType::F32}}});
  v.push_back({OpKind::Arange, {}, {{"end", int64_t{3}}, {"start", int64_t{3}}}});  // empty
  // Four values just below INT64_MAX: the empty chunks' bounds must not overflow.
  v.push_back({OpKind::Arange, {}, {{"end", kMax}, {"start", kMax - 10}, {"step", int64_t{3}}}});
  v.push_back({OpKind::Full, {}, {{"shape", V{5, 3}}, {"value", 1.5}}});
  v.push_back({OpKind::Full, {}, {{"shape", V{0, 7}}, {"value", -2.0}, {"dtype", DType::I32}}});
  v.push_back({OpKind::Full, {}, {{"shape", V{}}, {"value", 3.0}, {"dtype", DType::BF16}}});
  // tril/triu with the matrix dims sharded unevenly (5 and 7 rows or columns on 4 and
  // 3 ranks, empty chunks included) and diagonals on both sides, beyond the matrix
  // and at the ends of int64.
  for (OpKind k : {OpKind::Tril, OpKind::Triu}) {
    for (int64_t d : {int64_t{0}, int64_t{2}, int64_t{-3}, int64_t{9}, kMax, kMin})
      v.push_back({k, {F({5, 7})}, {{"diagonal", d}}});
    v.push_back({k, {F({2, 7, 5})}, {{"diagonal", int64_t{1}}}});
    v.push_back({k, {I({3, 6, 5})}, {{"diagonal", int64_t{-1}}}});
    v.push_back({k, {T(DType::Bool, {4, 0})}});
    v.push_back({k, {T(DType::F16, {6, 6})}, {{"diagonal", int64_t{-4}}}});
  }
  // dropout: every dim sharded unevenly (a rank's mask is its block of the global
  // mask, drawn at its origin), Partials through (linear and monotone for a fixed mask).
  v.push_back({OpKind::Dropout, {F({5, 7})}, {{"p", 0.5}, {"seed", int64_t{3}}}});
  v.push_back({OpKind::Dropout, {F({2, 7, 5})}, {{"p", 0.25}, {"seed", int64_t{11}}}});
  v.push_back({OpKind::Dropout, {T(DType::BF16, {6, 6})}, {{"p", 0.75}, {"seed", int64_t{0}}}});
  v.push_back({OpKind::Dropout, {F({4, 0})}, {{"seed", int64_t{1}}}});
  v.push_back({OpKind::LogSoftmax, {F({5, 3})}});
  v.push_back({OpKind::LogSoftmax, {F({2, 5, 3})}, {{"dim", int64_t{1}}}});
  v.push_back({OpKind::LogSoftmax, {F({0, 4})}, {{"dim", int64_t{0}}}});
  // cumsum (its carry strategies run through the lowering in pipeline_test, not here),
  // argmax/argmin with 5 and 7 on 4 and 3 ranks; mean over uneven and empty chunks.
  v.push_back({OpKind::Cumsum, {F({5, 7})}, {{"dim", int64_t{1}}}});
  v.push_back({OpKind::Cumsum, {I({7, 3})}, {{"dim", int64_t{0}}}});
  v.push_back({OpKind::Argmax, {F({5, 7})}, {{"dim", int64_t{0}}}});
  v.push_back({OpKind::Argmin, {I({2, 7, 5})}, {{"dim", int64_t{-1}}, {"keepdim", true}}});
  v.push_back({OpKind::Mean, {F({7, 3})}, {{"dims", V{0}}}});
  v.push_back({OpKind::Mean, {F({3, 5})}, {{"dims", V{0, 1}}, {"keepdim", true}}});
  // cross_entropy as one op: rows (and a spatial dim) sharded with the target for none
  // and sum; targets in [0, C] (C is out of range) and an ignore_index among them.
  v.push_back({OpKind::CrossEntropy, {F({5, 4}), T(DType::I64, {5})}, {{"reduction", std::string("none")}}});
  v.push_back({OpKind::CrossEntropy, {F({5, 4, 3}), I({5, 3})}, {{"reduction", std::string("sum")}, {"ignore_index", int64_t{1}}}});
  v.push_back({OpKind::CrossEntropy, {F({6, 3}), T(DType::I64, {6})}, {{"ignore_index", int64_t{0}}}});  // mean
  v.push_back({OpKind::CrossEntropy, {F({4}), T(DType::I64, {})}});
  // scaled_dot_product_attention: heads 6 over 2 kv heads (4 ranks: 2, 2, 2, 0 query
  // heads against 1, 1, 0, 0 kv heads, which do not line up, so only q is cut there),
  // heads that line up on 3 ranks (4 over 2), causal query rows cut unevenly (5 rows),
  // a batch dim, bool and additive masks that broadcast over some dims.
  const Named gqa{{"enable_gqa", true}, {"is_causal", true}};
  v.push_back({OpKind::ScaledDotProductAttention, {F({6, 5, 4}), F({2, 7, 4}), F({2, 7, 3})}, gqa});
  v.push_back({OpKind::ScaledDotProductAttention, {F({4, 3, 2}), F({2, 4, 2}), F({2, 4, 2})}, gqa});
  v.push_back({OpKind::ScaledDotProductAttention, {F({2, 3, 5, 2}), F({2, 3, 4, 2}), F({2, 3, 4, 3})},
               {{"scale", 0.7}}});
  v.push_back({OpKind::ScaledDotProductAttention,
               {F({2, 3, 5, 2}), F({2, 3, 4, 2}), F({2, 3, 4, 2}), T(DType::Bool, {5, 1})}});
  v.push_back({OpKind::ScaledDotProductAttention, {F({3, 5, 2}), F({3, 4, 2}), F({3, 4, 2}), F({3, 1, 4})}});
  return v;
}

// The redistribute row's placements on `mesh`: S(-1) on the last mesh dim, P on a
// first one if there are two (the strategy normalises S(-1)).
Named redistribute_attrs(const DeviceMesh& mesh) {
  PlacementSpec spec;
  for (int i = 0; i < mesh.ndim(); ++i) spec.per_dim.push_back(i + 1 == mesh.ndim() ? S(-1) : P());
  return {{"placements", spec}};
}

// ---- inputs and their distribution -----------------------------------------------------

Tensor random_tensor(const TensorType& t, std::mt19937_64& rng, int64_t int_bound) {
  Tensor x(t.dtype, t.shape);
  for (int64_t i = 0; i < x.numel(); ++i) {
    uint64_t r = rng();
    if (is_float(t.dtype)) x.set(i, -1.0 + 2.0 * static_cast<double>(r >> 11) * 0x1p-53);
    else if (t.dtype == DType::Bool) x.set_int(i, static_cast<int64_t>(r >> 63));
    else x.set_int(i, static_cast<int64_t>(r % static_cast<uint64_t>(int_bound)));
  }
  return x;
}

// Splits `v` into n full-shape parts that reduce to it with `op` (the innermost-first
// order unshard_tensor uses does not matter for one mesh dim). Unlike shard_tensor's
// split (the value on one rank, zeros or copies elsewhere), every part differs, so
// an op offered as linear when it is not (relu, abs, maximum of sums) shows.
std::vector<Tensor> split_partial(const Tensor& v, int64_t n, ReduceOp op, std::mt19937_64& rng) {
  std::vector<Tensor> parts(static_cast<size_t>(n), v);
  bool fl = is_float(v.dtype()), boolean = v.dtype() == DType::Bool;
  // Noise in eighths in [-1, 1]: exact in every float dtype the test partial-splits.
  auto noise = [&] { return static_cast<int64_t>(rng() % 17) - 8; };
  auto nudge = [&] { return static_cast<int64_t>(rng() % 4) + 1; };
  size_t holder = static_cast<size_t>(rng() % static_cast<uint64_t>(n));
  for (int64_t e = 0; e < v.numel(); ++e) {
    switch (op) {
      case ReduceOp::Sum:
      case ReduceOp::Avg: {
        if (boolean) {
          for (size_t c = 1; c < parts.size(); ++c) parts[c].set_int(e, 0);
          break;
        }
        int64_t total = 0;
        for (size_t c = 1; c < parts.size(); ++c) {
          int64_t k = noise();
          total += k;
          if (op == ReduceOp::Sum) fl ? parts[c].set(e, k / 8.0) : parts[c].set_int(e, k);
          else parts[c].set(e, v.get(e) + k / 8.0);
        }
        if (op == ReduceOp::Sum)
          fl ? parts[0].set(e, v.get(e) - total / 8.0) : parts[0].set_int(e, v.get_int(e) - total);
        else parts[0].set(e, v.get(e) - total / 8.0);
        break;
      }
      case ReduceOp::Max:
      case ReduceOp::Min: {
        int64_t sign = op == ReduceOp::Max ? -1 : 1;  // the others lie below a max, above a min
        for (size_t c = 0; c < parts.size(); ++c) {
          if (c == holder) continue;
          if (boolean) parts[c].set_int(e, op == ReduceOp::Max ? 0 : 1);
          else if (fl) parts[c].set(e, v.get(e) + sign * nudge() / 8.0);
          else parts[c].set_int(e, v.get_int(e) + sign * nudge());
        }
        break;
      }
    }
  }
  return parts;
}

// Every rank's local of `global` placed as `spec`, the Partial dims split with
// split_partial from the outermost mesh dim in (so that unshard_tensor, which reduces
// the innermost first, gets the value back), then each rank's block cut out.
std::vector<Tensor> distribute_random(const Tensor& global, const PlacementSpec& spec, const DeviceMesh& mesh,
                                      std::mt19937_64& rng) {
  size_t nd = static_cast<size_t>(mesh.ndim());
  std::map<std::vector<int64_t>, Tensor> parts{{std::vector<int64_t>(nd, 0), global}};
  for (size_t i = 0; i < nd; ++i) {
    const Placement& p = spec.per_dim[i];
    if (!p.is_partial()) continue;
    std::map<std::vector<int64_t>, Tensor> next;
    for (const auto& [key, val] : parts) {
      std::vector<Tensor> split = split_partial(val, mesh.size(static_cast<int>(i)), p.op, rng);
      for (size_t c = 0; c < split.size(); ++c) {
        std::vector<int64_t> k = key;
        k[i] = static_cast<int64_t>(c);
        next[k] = std::move(split[c]);
      }
    }
    parts = std::move(next);
  }
  std::vector<Tensor> locals;
  for (int r = 0; r < mesh.world(); ++r) {
    std::vector<int64_t> key = mesh.coord(r);
    for (size_t i = 0; i < nd; ++i)
      if (!spec.per_dim[i].is_partial()) key[i] = 0;
    LocalShard ls = local_shard(global.shape(), spec, mesh, r);
    locals.push_back(slice_block(parts.at(key), ls.offset, ls.shape));
  }
  return locals;
}

bool has_partial(const std::vector<PlacementSpec>& specs) {
  for (const PlacementSpec& s : specs)
    for (const Placement& p : s.per_dim)
      if (p.is_partial()) return true;
  return false;
}

std::string strategy_str(const OpStrategy& s, const Mesh& mesh) {
  std::string t = "(";
  for (size_t i = 0; i < s.inputs.size(); ++i) t += (i ? ", " : "") + s.inputs[i].str(mesh);
  return t + ") -> " + s.output.str(mesh);
}

// ---- the converter ---------------------------------------------------------------------

struct Totals {
  int64_t cases = 0, strategies = 0, runs = 0;
};

bool is_per_rank_collective(OpKind k) {
  return k == OpKind::AllGather || k == OpKind::ReduceScatter || k == OpKind::AllReduce || k == OpKind::AllToAll;
}

void check_strategy_invariants(const std::vector<OpStrategy>& all, const Case& c, const TensorType& out,
                               const DeviceMesh& mesh, const std::string& where) {
  PlacementSpec rep = replicated(mesh);
  bool has_all_r = false;
  std::set<std::string> seen;
  for (const OpStrategy& s : all) {
    ASSERT_EQ(s.inputs.size(), c.in.size()) << where;
    ASSERT_EQ(s.output.per_dim.size(), static_cast<size_t>(mesh.ndim())) << where;
    bool all_r = s.output == rep;
    for (size_t a = 0; a < c.in.size(); ++a) {
      ASSERT_EQ(s.inputs[a].per_dim.size(), static_cast<size_t>(mesh.ndim())) << where;
      all_r = all_r && s.inputs[a] == rep;
      if (c.in[a].weak) {
        EXPECT_TRUE(s.inputs[a] == rep) << where << ": a literal must be R, got " << s.inputs[a].str(mesh.mesh());
      }
      for (const Placement& p : s.inputs[a].per_dim) {
        EXPECT_TRUE(!p.is_shard() || (p.dim >= 0 && p.dim < c.in[a].type.rank())) << where << ": not normalised";
      }
    }
    for (const Placement& p : s.output.per_dim) {
      EXPECT_TRUE(!p.is_shard() || (p.dim >= 0 && p.dim < out.rank())) << where << ": output not normalised";
    }
    has_all_r = has_all_r || all_r;
    EXPECT_TRUE(seen.insert(strategy_str(s, mesh.mesh())).second) << where << ": duplicate " << strategy_str(s, mesh.mesh());
  }
  if (c.op != OpKind::Redistribute) {
    EXPECT_TRUE(has_all_r) << where << ": no all-Replicate strategy";
  }
  if (is_per_rank_collective(c.op) || c.op == OpKind::Redistribute) {
    EXPECT_EQ(all.size(), 1u) << where;
  }
}

// Runs `c` on `mesh` under every strategy and compares with the global result.
void convert(const Case& c, const DeviceMesh& mesh, uint64_t seed, Totals& totals) {
  Named named = c.op == OpKind::Redistribute ? redistribute_attrs(mesh) : c.attrs;
  std::string where = case_str(c) + " on mesh " + mesh.mesh().str();
  Attrs attrs;
  TensorType out;
  try {
    attrs = normalize_attrs(c.op, {}, named);
    out = infer_type(c.op, c.in, attrs, mesh.mesh());
  } catch (const OpError& e) {
    FAIL() << where << ": bad test row: " << e.message;
  }
  std::vector<OpStrategy> all = op_strategies(c.op, c.in, attrs, out, mesh);
  check_strategy_invariants(all, c, out, mesh, where);
  ++totals.cases;
  totals.strategies += static_cast<int64_t>(all.size());
  if (is_per_rank_collective(c.op)) return;  // no global meaning to compare with

  Node node;
  node.op = c.op;
  node.attrs = attrs;
  node.type = out;
  std::mt19937_64 rng(seed);
  // Embedding indices must be rows of the weight.
  // gather, index_select, scatter_add: the indexed dim plus one, so that some indices
  // are out of range (0 in every strategy).
  int64_t bound = c.op == OpKind::Embedding ? c.in[1].type.shape[0] : 8;
  if (c.op == OpKind::Gather || c.op == OpKind::IndexSelect || c.op == OpKind::ScatterAdd)
    bound = c.in[0].type.shape[static_cast<size_t>(*normalize_dim(attrs.get_int("dim"), c.in[0].type.rank()))] + 1;
  if (c.op == OpKind::CrossEntropy) bound = c.in[0].type.shape[c.in[0].type.rank() == 1 ? 0 : 1] + 1;  // classes + 1
  std::vector<Tensor> globals;
  for (size_t a = 0; a < c.in.size(); ++a) {
    node.inputs.push_back(static_cast<ValueId>(a));
    if (c.in[a].weak) {
      Tensor lit(c.in[a].type.dtype, {});
      lit.set(0, is_float(c.in[a].type.dtype) ? 0.75 : 2.0);
      globals.push_back(lit);
    } else {
      globals.push_back(random_tensor(c.in[a].type, rng, bound));
    }
  }
  std::vector<const Tensor*> gptr;
  for (const Tensor& g : globals) gptr.push_back(&g);
  Result<Tensor> want = evaluate_node(node, gptr);
  ASSERT_TRUE(want.ok()) << where << ": " << want.error().str();
  Tolerance tol = default_tolerance(out.dtype);

  for (const OpStrategy& s : all) {
    // A cumsum's carry needs the totals of the other ranks (a collective the lowering
    // adds): Converter.EveryOpUnderEveryInputPlacement runs it through the pipeline.
    if (!s.carry.empty()) continue;
    std::string sw = where + ", strategy " + strategy_str(s, mesh.mesh());
    // shard_tensor's documented split, and for Partial inputs also a random one (f32
    // and integers only: eighths of noise are not exact enough in f16 / bf16).
    std::vector<bool> random_splits{false};
    bool noisy_ok = true;
    for (const Operand& o : c.in) noisy_ok = noisy_ok && (o.type.dtype == DType::F32 || !is_float(o.type.dtype));
    if (has_partial(s.inputs) && noisy_ok) random_splits.push_back(true);
    for (bool random_split : random_splits) {
      std::vector<std::vector<Tensor>> locals(c.in.size());  // [operand][rank]
      for (size_t a = 0; a < c.in.size(); ++a) {
        if (random_split) {
          locals[a] = distribute_random(globals[a], s.inputs[a], mesh, rng);
          // The split itself must gather back to the value.
          Result<Tensor> back = unshard_tensor(locals[a], globals[a].type(), s.inputs[a], mesh);
          ASSERT_TRUE(back.ok()) << sw << ": " << back.error().str();
          ASSERT_TRUE(compare(*back, globals[a], default_tolerance(globals[a].dtype())).ok()) << sw << ": bad split";
        } else {
          for (int r = 0; r < mesh.world(); ++r) locals[a].push_back(shard_tensor(globals[a], s.inputs[a], mesh, r));
        }
      }
      std::vector<Tensor> results;
      std::vector<Shape> in_shapes;
      for (const Operand& o : c.in) in_shapes.push_back(o.type.shape);
      for (int r = 0; r < mesh.world(); ++r) {
        Node ln = local_node(node, rank_shards(out.shape, s.output, in_shapes, s.inputs, mesh, r));
        std::vector<Operand> local_in;
        std::vector<const Tensor*> ptr;
        for (size_t a = 0; a < c.in.size(); ++a) {
          const Tensor& t = locals[a][static_cast<size_t>(r)];
          local_in.push_back({t.type(), c.in[a].weak});
          ptr.push_back(&t);
        }
        // The local node must itself be a well-typed node on the local operands.
        try {
          TensorType lt = infer_type(c.op, local_in, ln.attrs, mesh.mesh());
          ASSERT_EQ(lt, ln.type) << sw << ", rank " << r << ": local node's type " << ln.type.str()
                                 << " differs from its shape rule's " << lt.str();
        } catch (const OpError& e) {
          FAIL() << sw << ", rank " << r << ": local node rejected: " << e.message;
        }
        Result<Tensor> got = evaluate_node(ln, ptr);
        ASSERT_TRUE(got.ok()) << sw << ", rank " << r << ": " << got.error().str();
        results.push_back(std::move(*got));
        ++totals.runs;
      }
      Result<Tensor> gathered = unshard_tensor(results, out, s.output, mesh);
      ASSERT_TRUE(gathered.ok()) << sw << ": " << gathered.error().str();
      Comparison cmp = compare(*gathered, *want, tol);
      ASSERT_TRUE(cmp.ok()) << sw << (random_split ? " (random partial split)" : "") << ": " << cmp.mismatches
                            << " mismatches, first at " << cmp.first_mismatch << " (got "
                            << gathered->get(cmp.first_mismatch) << ", want " << want->get(cmp.first_mismatch)
                            << "), max abs err " << cmp.max_abs_err;
    }
  }
}

TEST(OpStrategies, EveryOpHasATestRow) {
  std::set<OpKind> covered;
  for (const Case& c : cases()) covered.insert(c.op);
  for (const OpInfo& info : all_ops()) {
    if (info.kind == OpKind::Param || info.kind == OpKind::Constant) continue;
    EXPECT_TRUE(covered.count(info.kind)) << "no strategy test row for " << info.name;
  }
}

// The DTensorConverter sweep: every row, every mesh, every strategy.
TEST(OpStrategies, EveryStrategyMatchesTheGlobalOp) {
  auto t0 = std::chrono::steady_clock::now();
  Totals totals;
  uint64_t seed = 1;
  for (const Case& c : cases())
    for (const DeviceMesh& mesh : test_meshes()) {
      convert(c, mesh, seed++, totals);
      if (::testing::Test::HasFatalFailure()) return;
    }
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  RecordProperty("strategies", static_cast<int>(totals.strategies));
  std::printf("[ strategies ] %lld rows x meshes, %lld strategies, %lld local runs in %.2f s\n",
              static_cast<long long>(totals.cases), static_cast<long long>(totals.strategies),
              static_cast<long long>(totals.runs), secs);
  EXPECT_GT(totals.strategies, 0);
}

// ---- strategies worked out by hand -------------------------------------------------------

std::vector<OpStrategy> strategies(OpKind k, std::vector<Operand> in, const Named& named, const DeviceMesh& mesh) {
  Attrs attrs = normalize_attrs(k, {}, named);
  TensorType out = infer_type(k, in, attrs, mesh.mesh());
  return op_strategies(k, in, attrs, out, mesh);
}

bool has(const std::vector<OpStrategy>& all, std::vector<PlacementSpec> in, PlacementSpec out) {
  return std::find(all.begin(), all.end(), OpStrategy{std::move(in), std::move(out)}) != all.end();
}

std::string str(const OpStrategy& s, const DeviceMesh& mesh = mesh_1d(4)) { return strategy_str(s, mesh.mesh()); }

bool any_partial_input(const std::vector<OpStrategy>& all) {
  for (const OpStrategy& s : all)
    if (has_partial(s.inputs)) return true;
  return false;
}

TEST(OpStrategies, MatmulOnOneMeshDim) {
  auto all = strategies(OpKind::Matmul, {F({8, 16}), F({16, 4})}, {}, mesh_1d(4));
  EXPECT_TRUE(has(all, {sp({S(1)}), sp({S(0)})}, sp({P()})));   // contraction: partial sums
  EXPECT_TRUE(has(all, {sp({S(0)}), sp({R()})}, sp({S(0)})));   // rows of A (ColwiseParallel on x)
  EXPECT_TRUE(has(all, {sp({R()}), sp({S(1)})}, sp({S(1)})));   // columns of B
  EXPECT_TRUE(has(all, {sp({P()}), sp({R()})}, sp({P()})));
  EXPECT_TRUE(has(all, {sp({R()}), sp({P()})}, sp({P()})));
  EXPECT_TRUE(has(all, {sp({R()}), sp({R()})}, sp({R()})));
  EXPECT_FALSE(has(all, {sp({P()}), sp({P()})}, sp({P()})));    // (a1 + a2)(b1 + b2) has cross terms
  EXPECT_EQ(str(all.front()), "({tp: R}, {tp: R}) -> {tp: R}");

  // Batched, B broadcast along the batch: the batch dim shards A only.
  auto b = strategies(OpKind::Matmul, {F({3, 8, 16}), F({16, 4})}, {}, mesh_1d(4));
  EXPECT_TRUE(has(b, {sp({S(0)}), sp({R()})}, sp({S(0)})));
  EXPECT_TRUE(has(b, {sp({S(2)}), sp({S(0)})}, sp({P()})));
}

TEST(OpStrategies, ReductionsOverAShardedDim) {
  auto sum = strategies(OpKind::Sum, {F({8, 4})}, {{"dims", std::vector<int64_t>{0}}}, mesh_1d(4));
  EXPECT_TRUE(has(sum, {sp({S(0)})}, sp({P(ReduceOp::Sum)})));
  EXPECT_TRUE(has(sum, {sp({S(1)})}, sp({S(0)})));  // the kept dim moves to position 0
  EXPECT_TRUE(has(sum, {sp({P()})}, sp({P()})));
  auto keep = strategies(OpKind::Sum, {F({8, 4})}, {{"dims", std::vector<int64_t>{0}}, {"keepdim", true}}, mesh_1d(4));
  EXPECT_TRUE(has(keep, {sp({S(1)})}, sp({S(1)})));

  auto mx = strategies(OpKind::Max, {F({8, 4})}, {{"dims", std::vector<int64_t>{0}}}, mesh_1d(4));
  EXPECT_TRUE(has(mx, {sp({S(0)})}, sp({P(ReduceOp::Max)})));
  EXPECT_TRUE(has(mx, {sp({P(ReduceOp::Max)})}, sp({P(ReduceOp::Max)})));
  EXPECT_FALSE(has(mx, {sp({P()})}, sp({P()})));

  // Mean over a sharded dim: each rank divides its chunk's sum by the global count (7),
  // so the parts of 2, 2, 2 and 1 rows add up: Partial(sum), never Partial(avg).
  auto mean = strategies(OpKind::Mean, {F({7, 4})}, {{"dims", std::vector<int64_t>{0}}}, mesh_1d(4));
  EXPECT_TRUE(has(mean, {sp({S(0)})}, sp({P(ReduceOp::Sum)})));
  EXPECT_FALSE(has(mean, {sp({S(0)})}, sp({P(ReduceOp::Avg)})));
  EXPECT_TRUE(has(mean, {sp({S(1)})}, sp({S(0)})));

  // 3 rows on 4 ranks leave rank 3 an empty chunk, and max of nothing is an error.
  auto empty = strategies(OpKind::Max, {F({3, 4})}, {{"dims", std::vector<int64_t>{0}}}, mesh_1d(4));
  EXPECT_FALSE(has(empty, {sp({S(0)})}, sp({P(ReduceOp::Max)})));
  auto on3 = strategies(OpKind::Max, {F({3, 4})}, {{"dims", std::vector<int64_t>{0}}}, mesh_1d(3));
  EXPECT_TRUE(has(on3, {sp({S(0)})}, sp({P(ReduceOp::Max)})));
}

TEST(OpStrategies, NonLinearOpsTakeNoPartial) {
  for (const DeviceMesh& m : test_meshes()) {
    for (OpKind k : {OpKind::Relu, OpKind::Exp, OpKind::Abs, OpKind::Gelu, OpKind::Softmax})
      EXPECT_FALSE(any_partial_input(strategies(k, {F({8, 4})}, {}, m))) << op_name(k);
    EXPECT_FALSE(any_partial_input(strategies(OpKind::Cast, {F({8, 4})}, {{"dtype", DType::F16}}, m)));
    EXPECT_FALSE(any_partial_input(strategies(OpKind::Pow, {F({8, 4}), F({8, 4})}, {}, m)));
    EXPECT_FALSE(any_partial_input(strategies(OpKind::Lt, {F({8, 4}), F({8, 4})}, {}, m)));
  }
  auto mul = strategies(OpKind::Mul, {F({8, 4}), L()}, {}, mesh_1d(4));
  EXPECT_TRUE(has(mul, {sp({P()}), sp({R()})}, sp({P()})));
  EXPECT_FALSE(has(mul, {sp({P()}), sp({P()})}, sp({P()})));
  auto add = strategies(OpKind::Add, {F({8, 4}), F({4})}, {}, mesh_1d(4));
  EXPECT_TRUE(has(add, {sp({P()}), sp({P()})}, sp({P()})));
  EXPECT_FALSE(has(add, {sp({P()}), sp({R()})}, sp({P()})));  // the R term would be added 4 times
  EXPECT_TRUE(has(add, {sp({S(1)}), sp({S(0)})}, sp({S(1)})));
  EXPECT_TRUE(has(add, {sp({S(0)}), sp({R()})}, sp({S(0)})));  // bias broadcasts along rows
  auto div = strategies(OpKind::Div, {F({8, 4}), F({8, 4})}, {}, mesh_1d(4));
  EXPECT_TRUE(has(div, {sp({P()}), sp({R()})}, sp({P()})));
  EXPECT_FALSE(has(div, {sp({R()}), sp({P()})}, sp({P()})));
  auto mx = strategies(OpKind::Maximum, {F({8, 4}), F({8, 4})}, {}, mesh_1d(4));
  EXPECT_TRUE(has(mx, {sp({P(ReduceOp::Max)}), sp({P(ReduceOp::Max)})}, sp({P(ReduceOp::Max)})));
  EXPECT_FALSE(has(mx, {sp({P()}), sp({P()})}, sp({P()})));
  // i32 + i64 widens the partial rank by rank: not offered.
  auto widen = strategies(OpKind::Add, {I({8}), T(DType::I64, {8})}, {}, mesh_1d(4));
  EXPECT_FALSE(any_partial_input(widen));
}

TEST(OpStrategies, ReshapeKeepsAShardOnlyWhenItSplitsEvenly) {
  Named to32{{"shape", std::vector<int64_t>{32}}};
  EXPECT_TRUE(has(strategies(OpKind::Reshape, {F({8, 4})}, to32, mesh_1d(4)), {sp({S(0)})}, sp({S(0)})));
  EXPECT_FALSE(has(strategies(OpKind::Reshape, {F({8, 4})}, to32, mesh_1d(4)), {sp({S(1)})}, sp({S(0)})));
  Named to24{{"shape", std::vector<int64_t>{24}}};
  EXPECT_FALSE(has(strategies(OpKind::Reshape, {F({6, 4})}, to24, mesh_1d(4)), {sp({S(0)})}, sp({S(0)})));
  EXPECT_TRUE(has(strategies(OpKind::Reshape, {F({6, 4})}, to24, mesh_1d(3)), {sp({S(0)})}, sp({S(0)})));
  Named to84{{"shape", std::vector<int64_t>{8, 4}}};
  EXPECT_TRUE(has(strategies(OpKind::Reshape, {F({32})}, to84, mesh_1d(4)), {sp({S(0)})}, sp({S(0)})));
  // Nested: 8 rows over dp=2 x tp=2 is 2 rows a rank; 6 rows are not.
  auto nested = strategies(OpKind::Reshape, {F({8, 4})}, to32, mesh_2x2());
  EXPECT_TRUE(has(nested, {sp({S(0), S(0)})}, sp({S(0), S(0)})));
  auto six = strategies(OpKind::Reshape, {F({6, 4})}, to24, mesh_2x2());
  EXPECT_FALSE(has(six, {sp({S(0), S(0)})}, sp({S(0), S(0)})));
  EXPECT_TRUE(has(six, {sp({S(0), R()})}, sp({S(0), R()})));  // 6 % 2 == 0
  // An untouched dim keeps even an uneven shard: [7, 3] -> [7, 1, 3].
  Named to713{{"shape", std::vector<int64_t>{7, 1, 3}}};
  auto untouched = strategies(OpKind::Reshape, {F({7, 3})}, to713, mesh_1d(4));
  EXPECT_TRUE(has(untouched, {sp({S(0)})}, sp({S(0)})));
  EXPECT_TRUE(has(untouched, {sp({S(1)})}, sp({S(2)})));
  // [6, 4] -> [3, 8]: merge then split; 6 and 3 must both divide.
  Named to38{{"shape", std::vector<int64_t>{3, 8}}};
  EXPECT_TRUE(has(strategies(OpKind::Reshape, {F({6, 4})}, to38, mesh_1d(3)), {sp({S(0)})}, sp({S(0)})));
  EXPECT_FALSE(has(strategies(OpKind::Reshape, {F({6, 4})}, to38, mesh_1d(2)), {sp({S(0)})}, sp({S(0)})));
}

TEST(OpStrategies, NestedShardingOnTwoMeshDims) {
  DeviceMesh m = mesh_2x2();
  auto add = strategies(OpKind::Add, {F({10, 4}), F({4})}, {}, m);
  EXPECT_TRUE(has(add, {sp({S(0), S(0)}), sp({R(), R()})}, sp({S(0), S(0)})));
  EXPECT_TRUE(has(add, {sp({P(), S(1)}), sp({P(), S(0)})}, sp({P(), S(1)})));
  auto sum = strategies(OpKind::Sum, {F({10, 4})}, {{"dims", std::vector<int64_t>{0}}}, m);
  EXPECT_TRUE(has(sum, {sp({S(0), S(0)})}, sp({P(), P()})));
  EXPECT_TRUE(has(sum, {sp({S(0), S(1)})}, sp({P(), S(0)})));
  auto tr = strategies(OpKind::Transpose, {F({10, 4})}, {{"dim0", int64_t{0}}, {"dim1", int64_t{1}}}, m);
  EXPECT_TRUE(has(tr, {sp({S(0), S(0)})}, sp({S(1), S(1)})));
  auto mm = strategies(OpKind::Matmul, {F({8, 6}), F({6, 4})}, {}, m);
  EXPECT_TRUE(has(mm, {sp({S(0), S(1)}), sp({R(), S(0)})}, sp({S(0), P()})));
  // The cartesian product: every pair of the single-dim strategies.
  auto relu1 = strategies(OpKind::Relu, {F({10, 4})}, {}, mesh_1d(4));
  auto relu2 = strategies(OpKind::Relu, {F({10, 4})}, {}, m);
  EXPECT_EQ(relu1.size(), 3u);  // R, S(0), S(1)
  EXPECT_EQ(relu2.size(), 9u);
}

TEST(OpStrategies, EmbeddingShardsIndicesColumnsOrRowsMasked) {
  auto all = strategies(OpKind::Embedding, {T(DType::I64, {4, 5}), F({10, 6})}, {}, mesh_1d(4));
  EXPECT_TRUE(has(all, {sp({S(0)}), sp({R()})}, sp({S(0)})));
  EXPECT_TRUE(has(all, {sp({S(1)}), sp({R()})}, sp({S(1)})));
  EXPECT_TRUE(has(all, {sp({R()}), sp({S(1)})}, sp({S(2)})));
  // Vocabulary parallel: rows sharded, indices whole, a Partial sum of masked lookups.
  EXPECT_TRUE(has(all, {sp({R()}), sp({S(0)})}, sp({P()})));
  for (const OpStrategy& s : all)
    if (s.inputs[1] == sp({S(0)})) EXPECT_TRUE(s.inputs[0] == sp({R()}) && s.output == sp({P()})) << str(s);
  for (const OpStrategy& s : all) EXPECT_FALSE(s.inputs[0].per_dim[0].is_partial());
  // A bool table has no sum: its rows are not sharded.
  for (const OpStrategy& s : strategies(OpKind::Embedding, {T(DType::I64, {4}), T(DType::Bool, {10, 6})}, {}, mesh_1d(4)))
    EXPECT_FALSE(s.inputs[1] == sp({S(0)})) << str(s);
}

TEST(OpStrategies, NormsAndSoftmaxKeepTheirNormalisedDimsWhole) {
  auto sm = strategies(OpKind::Softmax, {F({4, 6})}, {{"dim", int64_t{-1}}}, mesh_1d(4));
  EXPECT_TRUE(has(sm, {sp({S(0)})}, sp({S(0)})));
  EXPECT_FALSE(has(sm, {sp({S(1)})}, sp({S(1)})));
  auto ln = strategies(OpKind::LayerNorm, {F({2, 4, 6}), F({4, 6}), F({4, 6})}, {}, mesh_1d(4));
  EXPECT_EQ(ln.size(), 2u);  // R and S(0): dims 1 and 2 are normalised
  EXPECT_TRUE(has(ln, {sp({S(0)}), sp({R()}), sp({R()})}, sp({S(0)})));
}

TEST(OpStrategies, MovementOpsMoveShardsAndKeepPartials) {
  auto pm = strategies(OpKind::Permute, {F({2, 5, 3})}, {{"dims", std::vector<int64_t>{2, 0, 1}}}, mesh_1d(4));
  EXPECT_TRUE(has(pm, {sp({S(2)})}, sp({S(0)})));
  EXPECT_TRUE(has(pm, {sp({S(0)})}, sp({S(1)})));
  EXPECT_TRUE(has(pm, {sp({P(ReduceOp::Max)})}, sp({P(ReduceOp::Max)})));
  auto ex = strategies(OpKind::Expand, {F({5, 1})}, {{"shape", std::vector<int64_t>{3, 5, 4}}}, mesh_1d(4));
  EXPECT_TRUE(has(ex, {sp({S(0)})}, sp({S(1)})));
  EXPECT_FALSE(has(ex, {sp({S(1)})}, sp({S(2)})));  // the broadcast dim is not the input's
  EXPECT_TRUE(has(ex, {sp({R()})}, sp({S(2)})));    // but each rank may build its chunk of it
  EXPECT_TRUE(has(ex, {sp({R()})}, sp({S(0)})));
  EXPECT_TRUE(has(ex, {sp({P()})}, sp({P()})));
}

TEST(OpStrategies, SliceAndConcatShardOtherDimsNeverTheirOwn) {
  Named cols{{"dim", int64_t{1}}, {"start", int64_t{1}}, {"end", int64_t{5}}};
  auto sl = strategies(OpKind::Slice, {F({8, 6})}, cols, mesh_1d(4));
  EXPECT_TRUE(has(sl, {sp({S(0)})}, sp({S(0)})));  // rows stay sharded
  EXPECT_TRUE(has(sl, {sp({P()})}, sp({P()})));
  EXPECT_TRUE(has(sl, {sp({P(ReduceOp::Max)})}, sp({P(ReduceOp::Max)})));
  EXPECT_EQ(sl.size(), 6u);  // R, S(0), and P of sum, avg, max, min
  for (const OpStrategy& s : sl) {
    EXPECT_FALSE(s.inputs[0] == sp({S(1)})) << "the sliced dim sharded: " << str(s);
    EXPECT_FALSE(s.output == sp({S(1)})) << str(s);
  }
  // An uneven shard (7 rows on 4 ranks) goes through too.
  EXPECT_TRUE(has(strategies(OpKind::Slice, {F({7, 6})}, cols, mesh_1d(4)), {sp({S(0)})}, sp({S(0)})));

  auto cat = strategies(OpKind::Concat, {F({8, 2}), F({8, 3}), F({8, 1})}, {{"dim", int64_t{-1}}}, mesh_1d(4));
  EXPECT_TRUE(has(cat, {sp({S(0)}), sp({S(0)}), sp({S(0)})}, sp({S(0)})));
  EXPECT_TRUE(has(cat, {sp({P()}), sp({P()}), sp({P()})}, sp({P()})));
  EXPECT_FALSE(has(cat, {sp({P()}), sp({R()}), sp({R()})}, sp({P()})));  // R parts would be summed 4 times
  EXPECT_FALSE(has(cat, {sp({S(0)}), sp({R()}), sp({S(0)})}, sp({S(0)})));
  for (const OpStrategy& s : cat) {
    for (const PlacementSpec& in : s.inputs) EXPECT_FALSE(in == sp({S(1)})) << "the concat dim sharded: " << str(s);
    EXPECT_FALSE(s.output == sp({S(1)})) << str(s);
  }
  // Nested on dp=2 tp=2: the rows by both, or a partial over one.
  auto cat2 = strategies(OpKind::Concat, {F({8, 2}), F({8, 3})}, {{"dim", int64_t{1}}}, mesh_2x2());
  EXPECT_TRUE(has(cat2, {sp({S(0), S(0)}), sp({S(0), S(0)})}, sp({S(0), S(0)})));
  EXPECT_TRUE(has(cat2, {sp({P(), S(0)}), sp({P(), S(0)})}, sp({P(), S(0)})));
  // Integers keep sum, max and min partials (no avg).
  auto ints = strategies(OpKind::Concat, {I({4, 2}), I({4, 2})}, {{"dim", int64_t{0}}}, mesh_1d(4));
  EXPECT_TRUE(has(ints, {sp({P(ReduceOp::Min)}), sp({P(ReduceOp::Min)})}, sp({P(ReduceOp::Min)})));
  EXPECT_FALSE(has(ints, {sp({P(ReduceOp::Avg)}), sp({P(ReduceOp::Avg)})}, sp({P(ReduceOp::Avg)})));
  EXPECT_TRUE(has(ints, {sp({S(1)}), sp({S(1)})}, sp({S(1)})));
}

TEST(OpStrategies, CollectivesAndRedistribute) {
  DeviceMesh m = mesh_2x2();
  for (OpKind k : {OpKind::AllGather, OpKind::AllReduce}) {
    auto all = strategies(k, {F({4, 4})}, {{"mesh_dim", std::string("tp")}}, m);
    ASSERT_EQ(all.size(), 1u);
    EXPECT_EQ(str(all[0], m), "({dp: R, tp: R}) -> {dp: R, tp: R}");
  }
  auto red = strategies(OpKind::Redistribute, {F({4, 4})}, {{"placements", sp({P(), S(-1)})}}, m);
  ASSERT_EQ(red.size(), 1u);
  EXPECT_EQ(str(red[0], m), "({dp: P, tp: S(1)}) -> {dp: P, tp: S(1)}");  // S(-1) normalised
}

TEST(OpStrategies, LeavesAndOneRankMeshes) {
  auto one = strategies(OpKind::Add, {F({4}), F({4})}, {}, DeviceMesh(Mesh{}));
  ASSERT_EQ(one.size(), 1u);  // no mesh dims: the single empty product
  EXPECT_TRUE(one[0].output.per_dim.empty());
}

TEST(OpStrategies, GeneratorsBuildTheirChunkOfAnyDim) {
  auto ar = strategies(OpKind::Arange, {}, {{"end", int64_t{10}}}, mesh_1d(4));
  ASSERT_EQ(ar.size(), 2u);
  EXPECT_EQ(str(ar[0]), "() -> {tp: R}");  // the first, what propagation starts from
  EXPECT_TRUE(has(ar, {}, sp({S(0)})));
  auto fu = strategies(OpKind::Full, {}, {{"shape", std::vector<int64_t>{4, 6}}, {"value", 1.0}}, mesh_2x2());
  EXPECT_EQ(fu.size(), 9u);  // R, S(0), S(1) on each mesh dim
  EXPECT_TRUE(has(fu, {}, sp({S(1), S(0)})));
  EXPECT_TRUE(has(fu, {}, sp({S(0), S(0)})));
  for (const OpStrategy& s : fu)
    for (const Placement& p : s.output.per_dim) EXPECT_FALSE(p.is_partial()) << str(s, mesh_2x2());
}

TEST(OpStrategies, TrilShardsEveryDimAndPassesPartials) {
  auto t = strategies(OpKind::Tril, {F({2, 5, 7})}, {{"diagonal", int64_t{1}}}, mesh_1d(4));
  for (int d = 0; d < 3; ++d) EXPECT_TRUE(has(t, {sp({S(d)})}, sp({S(d)}))) << d;
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min})
    EXPECT_TRUE(has(t, {sp({P(op)})}, sp({P(op)}))) << reduce_op_name(op);
  EXPECT_FALSE(has(t, {sp({S(1)})}, sp({S(2)})));
  auto u = strategies(OpKind::Triu, {F({5, 7})}, {}, mesh_2x2());
  EXPECT_TRUE(has(u, {sp({S(0), S(1)})}, sp({S(0), S(1)})));  // a block of rows and columns
  EXPECT_TRUE(has(u, {sp({S(0), S(0)})}, sp({S(0), S(0)})));  // rows chunked twice
  // An i32 operand keeps its Partial (no dtype change), like a movement op.
  EXPECT_TRUE(has(strategies(OpKind::Tril, {I({4, 4})}, {}, mesh_1d(4)), {sp({P()})}, sp({P()})));
}

TEST(OpStrategies, CumsumCarriesOverItsShardedDim) {
  auto c = strategies(OpKind::Cumsum, {F({7, 4})}, {{"dim", int64_t{0}}}, mesh_1d(4));
  EXPECT_TRUE(has(c, {sp({S(1)})}, sp({S(1)})));
  EXPECT_TRUE(has(c, {sp({P()})}, sp({P()})));                  // linear
  EXPECT_TRUE(has(c, {sp({P(ReduceOp::Avg)})}, sp({P(ReduceOp::Avg)})));
  EXPECT_FALSE(has(c, {sp({P(ReduceOp::Max)})}, sp({P(ReduceOp::Max)})));
  EXPECT_FALSE(has(c, {sp({S(0)})}, sp({S(0)})));               // not without a carry
  EXPECT_NE(std::find(c.begin(), c.end(), OpStrategy{{sp({S(0)})}, sp({S(0)}), {0}}), c.end());
  // On dp=2 tp=2 the dim chunked by both carries over both, mesh dim 0 first.
  auto m2 = strategies(OpKind::Cumsum, {F({7, 4})}, {{"dim", int64_t{0}}}, mesh_2x2());
  EXPECT_NE(std::find(m2.begin(), m2.end(), OpStrategy{{sp({S(0), S(0)})}, sp({S(0), S(0)}), {0, 1}}), m2.end());
  EXPECT_NE(std::find(m2.begin(), m2.end(), OpStrategy{{sp({P(), S(0)})}, sp({P(), S(0)}), {1}}), m2.end());
  // An i32 cumsum is i64: a Partial of i32 parts is not offered (they would wrap apart).
  EXPECT_FALSE(any_partial_input(strategies(OpKind::Cumsum, {I({7, 4})}, {{"dim", int64_t{0}}}, mesh_1d(4))));
}

TEST(OpStrategies, ArgmaxKeepsOtherShardsAndGathersItsDim) {
  auto a = strategies(OpKind::Argmax, {F({3, 7, 5})}, {{"dim", int64_t{1}}}, mesh_1d(4));
  EXPECT_TRUE(has(a, {sp({S(0)})}, sp({S(0)})));
  EXPECT_TRUE(has(a, {sp({S(2)})}, sp({S(1)})));  // dim 1 removed: 2 moves to 1
  auto k = strategies(OpKind::Argmin, {F({3, 7, 5})}, {{"dim", int64_t{1}}, {"keepdim", true}}, mesh_1d(4));
  EXPECT_TRUE(has(k, {sp({S(2)})}, sp({S(2)})));
  for (const auto& all : {a, k}) {
    EXPECT_FALSE(any_partial_input(all));  // the index of the max of a sum is not in the parts
    for (const OpStrategy& s : all) {
      EXPECT_FALSE(s.inputs[0] == sp({S(1)})) << str(s);
      EXPECT_TRUE(s.carry.empty());
    }
  }
}

TEST(OpStrategies, LogSoftmaxKeepsItsDimWholeAndTakesNoPartial) {
  auto ls = strategies(OpKind::LogSoftmax, {F({4, 6})}, {{"dim", int64_t{-1}}}, mesh_1d(4));
  EXPECT_TRUE(has(ls, {sp({S(0)})}, sp({S(0)})));
  EXPECT_FALSE(has(ls, {sp({S(1)})}, sp({S(1)})));
  EXPECT_FALSE(any_partial_input(ls));
  EXPECT_EQ(ls.size(), 2u);
}

}  // namespace dist_strategy_test
}  // namespace sf
