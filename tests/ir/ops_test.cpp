// Shape and dtype inference, table-driven over every op in ops.def. A row per
// op (several for the interesting ones); a final test fails if an op has no row.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <set>

#include "codegen/ir/ops.h"

namespace sf {
namespace ir_ops_test {

struct InferCase {
  const char* op;
  std::vector<Operand> in;
  std::vector<std::pair<std::string, AttrValue>> attrs;
  TensorType want;
};

Operand T(DType d, Shape s) { return {TensorType{d, std::move(s)}, false}; }
Operand W(DType d) { return {TensorType{d, {}}, true}; }  // a number literal
constexpr DType f32 = DType::F32, f16 = DType::F16, bf16 = DType::BF16, i32 = DType::I32,
                i64 = DType::I64, b1 = DType::Bool;
using V = std::vector<int64_t>;
AttrValue I(int64_t v) { return AttrValue(v); }
constexpr int64_t kMax = std::numeric_limits<int64_t>::max(), kMin = std::numeric_limits<int64_t>::min();

const Mesh kMesh{{{"dp", 2}, {"tp", 4}}};

std::vector<InferCase> cases() {
  std::vector<InferCase> c;
  for (const char* u : {"neg", "abs", "exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "relu", "silu",
                        "sin", "cos", "reciprocal", "erf", "gelu", "gelu_tanh"})
    c.push_back({u, {T(bf16, {3, 5})}, {}, {bf16, {3, 5}}});
  c.push_back({"relu", {T(i32, {2})}, {}, {i32, {2}}});
  c.push_back({"cast", {T(f32, {2, 2})}, {{"dtype", AttrValue(bf16)}}, {bf16, {2, 2}}});
  for (const char* b : {"add", "sub", "mul", "maximum", "minimum", "pow"})
    c.push_back({b, {T(f32, {4, 1, 3}), T(f32, {5, 1})}, {}, {f32, {4, 5, 3}}});
  c.push_back({"add", {T(f16, {2}), T(bf16, {2})}, {}, {f32, {2}}});
  c.push_back({"add", {T(i32, {2}), T(i64, {})}, {}, {i64, {2}}});
  c.push_back({"mul", {T(f16, {2}), W(f32)}, {}, {f16, {2}}});   // weak scalar keeps f16
  c.push_back({"mul", {W(f32), T(i32, {2})}, {}, {f32, {2}}});   // float literal lifts ints
  c.push_back({"add", {T(i32, {2}), W(i64)}, {}, {i32, {2}}});   // int literal keeps i32
  c.push_back({"div", {T(i32, {2}), T(i32, {2})}, {}, {f32, {2}}});  // true division
  c.push_back({"div", {T(bf16, {0, 3}), T(bf16, {1, 3})}, {}, {bf16, {0, 3}}});
  for (const char* cmp : {"eq", "ne", "lt", "le", "gt", "ge"})
    c.push_back({cmp, {T(f32, {3, 1}), T(i32, {4})}, {}, {b1, {3, 4}}});
  c.push_back({"where", {T(b1, {3, 1}), T(f32, {1, 4}), W(f32)}, {}, {f32, {3, 4}}});
  for (const char* r : {"sum", "max", "min", "mean"}) {
    c.push_back({r, {T(f32, {2, 3, 4})}, {{"dims", AttrValue(V{1})}}, {f32, {2, 4}}});
    c.push_back({r, {T(f32, {2, 3, 4})}, {{"dims", AttrValue(V{-1, 0})}, {"keepdim", AttrValue(true)}},
                 {f32, {1, 3, 1}}});
    c.push_back({r, {T(f32, {2, 3, 4})}, {}, {f32, {}}});
  }
  c.push_back({"sum", {T(i32, {5})}, {}, {i64, {}}});  // integer sums widen, as torch
  c.push_back({"sum", {T(b1, {5})}, {}, {i64, {}}});
  c.push_back({"matmul", {T(f32, {20, 10}), T(f32, {10, 16})}, {}, {f32, {20, 16}}});
  c.push_back({"matmul", {T(bf16, {2, 1, 8, 4}), T(bf16, {3, 4, 5})}, {}, {bf16, {2, 3, 8, 5}}});
  c.push_back({"transpose", {T(f32, {2, 3, 4})}, {{"dim0", AttrValue(int64_t{0})}, {"dim1", AttrValue(int64_t{-1})}},
               {f32, {4, 3, 2}}});
  c.push_back({"permute", {T(i64, {2, 3, 4})}, {{"dims", AttrValue(V{1, 2, 0})}}, {i64, {3, 4, 2}}});
  c.push_back({"reshape", {T(f32, {2, 3, 4})}, {{"shape", AttrValue(V{4, -1})}}, {f32, {4, 6}}});
  c.push_back({"reshape", {T(f32, {2, 3, 4})}, {{"shape", AttrValue(V{24})}}, {f32, {24}}});
  c.push_back({"reshape", {T(f32, {0, 3})}, {{"shape", AttrValue(V{3, 0})}}, {f32, {3, 0}}});
  c.push_back({"expand", {T(f32, {3, 1})}, {{"shape", AttrValue(V{2, -1, 4})}}, {f32, {2, 3, 4}}});
  c.push_back({"slice", {T(f32, {4, 10})}, {{"dim", AttrValue(int64_t{-1})}, {"start", AttrValue(int64_t{2})},
                                            {"end", AttrValue(int64_t{9})}, {"step", AttrValue(int64_t{3})}},
               {f32, {4, 3}}});
  c.push_back({"concat", {T(bf16, {2, 3}), T(bf16, {2, 5}), T(bf16, {2, 0})}, {{"dim", AttrValue(int64_t{1})}},
               {bf16, {2, 8}}});
  c.push_back({"embedding", {T(i64, {2, 7}), T(bf16, {100, 16})}, {}, {bf16, {2, 7, 16}}});
  // torch.gather: out has the index's shape; the index may be smaller than x off dim and larger on it.
  c.push_back({"gather", {T(f32, {4, 5}), T(i64, {2, 9})}, {{"dim", AttrValue(int64_t{-1})}}, {f32, {2, 9}}});
  c.push_back({"index_select", {T(bf16, {4, 5, 6}), T(i32, {7})}, {{"dim", AttrValue(int64_t{1})}}, {bf16, {4, 7, 6}}});
  c.push_back({"scatter_add", {T(i32, {4, 5}), T(i64, {3, 2}), T(i32, {3, 4})}, {{"dim", AttrValue(int64_t{0})}},
               {i32, {4, 5}}});
  c.push_back({"softmax", {T(f32, {2, 8})}, {{"dim", AttrValue(int64_t{0})}}, {f32, {2, 8}}});
  // F.cross_entropy: classes on dim 1 (dim 0 unbatched); 0-d unless reduction=none.
  c.push_back({"cross_entropy", {T(bf16, {4, 10}), T(i64, {4})}, {}, {bf16, {}}});
  c.push_back({"cross_entropy", {T(f32, {2, 10, 3, 5}), T(i32, {2, 3, 5})}, {{"reduction", AttrValue(std::string("none"))}},
               {f32, {2, 3, 5}}});
  c.push_back({"cross_entropy", {T(f16, {7}), T(i64, {})}, {{"reduction", AttrValue(std::string("sum"))}}, {f16, {}}});
  c.push_back({"cross_entropy", {T(f32, {0, 3}), T(i64, {0})}, {{"reduction", AttrValue(std::string("none"))}},
               {f32, {0}}});
  c.push_back({"layer_norm", {T(f32, {2, 8, 16}), T(f32, {16}), T(f32, {16})}, {}, {f32, {2, 8, 16}}});
  c.push_back({"layer_norm", {T(f32, {2, 8, 16}), T(f32, {8, 16}), T(f32, {8, 16})}, {}, {f32, {2, 8, 16}}});
  c.push_back({"rms_norm", {T(bf16, {4, 16}), T(bf16, {16})}, {}, {bf16, {4, 16}}});
  c.push_back({"all_gather", {T(f32, {5, 3})}, {{"mesh_dim", AttrValue(std::string("tp"))}}, {f32, {20, 3}}});
  c.push_back({"all_gather", {T(f32, {5, 3})},
               {{"mesh_dim", AttrValue(std::string("dp"))}, {"dim", AttrValue(int64_t{-1})}}, {f32, {5, 6}}});
  c.push_back({"reduce_scatter", {T(f32, {8, 3})}, {{"mesh_dim", AttrValue(std::string("tp"))}}, {f32, {2, 3}}});
  c.push_back({"all_reduce", {T(f32, {8, 3})},
               {{"mesh_dim", AttrValue(std::string("tp")), }, {"op", AttrValue(std::string("max"))}}, {f32, {8, 3}}});
  c.push_back({"all_to_all", {T(f32, {8, 3})},
               {{"mesh_dim", AttrValue(std::string("tp"))}, {"split_dim", AttrValue(int64_t{0})},
                {"concat_dim", AttrValue(int64_t{1})}},
               {f32, {2, 12}}});
  c.push_back({"log_softmax", {T(bf16, {2, 8})}, {}, {bf16, {2, 8}}});
  c.push_back({"arange", {}, {{"end", I(5)}}, {i64, {5}}});
  // 3, 0, -3, -6: a negative step, ceil(10 / 3) values.
  c.push_back({"arange", {}, {{"end", I(-7)}, {"start", I(3)}, {"step", I(-3)}, {"dtype", AttrValue(f32)}}, {f32, {4}}});
  c.push_back({"arange", {}, {{"end", I(3)}, {"start", I(3)}}, {i64, {0}}});  // empty, as torch
  // Bounds at the ends of int64: the span and the count are exact.
  c.push_back({"arange", {}, {{"end", I(kMax)}, {"start", I(kMax - 10)}, {"step", I(7)}}, {i64, {2}}});
  c.push_back({"arange", {}, {{"end", I(kMax)}, {"start", I(kMin)}, {"step", I(kMax)}}, {i64, {3}}});
  c.push_back({"arange", {}, {{"end", I(kMin)}, {"start", I(0)}, {"step", I(kMin)}}, {i64, {1}}});
  c.push_back({"full", {}, {{"shape", AttrValue(V{2, 3})}, {"value", AttrValue(1.5)}}, {f32, {2, 3}}});
  c.push_back({"full", {}, {{"shape", AttrValue(V{})}, {"value", I(-2)}, {"dtype", AttrValue(i32)}}, {i32, {}}});
  c.push_back({"full", {}, {{"shape", AttrValue(V{4, 0})}, {"value", AttrValue(7.0)}, {"dtype", AttrValue(b1)}}, {b1, {4, 0}}});
  c.push_back({"tril", {T(f32, {3, 4})}, {}, {f32, {3, 4}}});
  c.push_back({"triu", {T(b1, {2, 0, 5})}, {{"diagonal", I(-3)}}, {b1, {2, 0, 5}}});
  // torch.cumsum keeps the shape and sums integers and bools into i64; argmax/argmin
  // give i64 indices with dim removed (or kept as 1).
  c.push_back({"cumsum", {T(f32, {3, 4})}, {{"dim", I(1)}}, {f32, {3, 4}}});
  c.push_back({"cumsum", {T(i32, {3, 0})}, {{"dim", I(-2)}}, {i64, {3, 0}}});
  c.push_back({"cumsum", {T(b1, {5})}, {{"dim", I(0)}}, {i64, {5}}});
  c.push_back({"argmax", {T(bf16, {2, 3, 4})}, {{"dim", I(1)}}, {i64, {2, 4}}});
  c.push_back({"argmin", {T(i32, {2, 3})}, {{"dim", I(-1)}, {"keepdim", AttrValue(true)}}, {i64, {2, 1}}});
  c.push_back({"argmax", {T(f32, {0, 3})}, {{"dim", I(1)}}, {i64, {0}}});  // no rows: nothing to pick from
  c.push_back({"mean", {T(f32, {4, 6})}, {{"dims", AttrValue(V{0})}, {"count", I(12)}}, {f32, {6}}});
  c.push_back({"dropout", {T(bf16, {3, 5})}, {{"p", AttrValue(0.1)}, {"seed", I(7)}}, {bf16, {3, 5}}});
  c.push_back({"dropout", {T(f32, {4})}, {{"p", I(1)}, {"seed", I(kMax)}}, {f32, {4}}});  // p = 1: zeros
  // A block of a larger tensor (what local_node writes for a rank's shard).
  c.push_back({"dropout", {T(f32, {2, 3})}, {{"seed", I(0)}, {"origin", AttrValue(V{3, 0})}, {"global_shape", AttrValue(V{5, 3})}}, {f32, {2, 3}}});
  // q [B, Hq, L, E], k [B, Hkv, S, E], v [B, Hkv, S, Ev] -> [B, Hq, L, Ev].
  const char* sdpa = "scaled_dot_product_attention";
  c.push_back({sdpa, {T(f32, {2, 3, 5, 4}), T(f32, {2, 3, 7, 4}), T(f32, {2, 3, 7, 6})}, {}, {f32, {2, 3, 5, 6}}});
  c.push_back({sdpa, {T(bf16, {6, 5, 4}), T(bf16, {2, 7, 4}), T(bf16, {2, 7, 4})},
               {{"enable_gqa", AttrValue(true)}, {"is_causal", AttrValue(true)}}, {bf16, {6, 5, 4}}});
  c.push_back({sdpa, {T(f32, {3, 5, 4}), T(f32, {3, 7, 4}), T(f32, {3, 7, 2}), T(b1, {5, 1})}, {}, {f32, {3, 5, 2}}});
  c.push_back({sdpa, {T(f16, {1, 2, 5, 4}), T(f16, {1, 2, 7, 4}), T(f16, {1, 2, 7, 4}), T(f16, {2, 5, 7})},
               {{"scale", AttrValue(0.25)}}, {f16, {1, 2, 5, 4}}});
  c.push_back({sdpa, {T(f32, {0, 5, 4}), T(f32, {2, 7, 4}), T(f32, {2, 7, 4})}, {{"enable_gqa", AttrValue(true)}},
               {f32, {0, 5, 4}}});
  // A rank's block under GQA: 2 query heads from global head 3 of groups of 3 read kv
  // heads 1 and 1 (of 2).
  c.push_back({sdpa, {T(f32, {2, 5, 4}), T(f32, {2, 7, 4}), T(f32, {2, 7, 4})},
               {{"head_offset", I(3)}, {"gqa_group", I(3)}}, {f32, {2, 5, 4}}});
  PlacementSpec spec{{Placement::shard(0), Placement::partial()}};
  c.push_back({"redistribute", {T(f32, {8, 3})}, {{"placements", AttrValue(spec)}}, {f32, {8, 3}}});
  return c;
}

TEST(InferType, EveryRowGivesItsType) {
  for (const InferCase& c : cases()) {
    auto k = find_op(c.op);
    ASSERT_TRUE(k) << c.op;
    try {
      Attrs a = normalize_attrs(*k, {}, c.attrs);
      EXPECT_EQ(infer_type(*k, c.in, a, kMesh), c.want) << c.op << " wanted " << c.want.str();
    } catch (const OpError& e) {
      ADD_FAILURE() << c.op << ": " << e.message;
    }
  }
}

TEST(InferType, EveryOpHasARow) {
  std::set<std::string> covered;
  for (const InferCase& c : cases()) covered.insert(c.op);
  for (const OpInfo& info : all_ops()) {
    if (info.category == OpCategory::Leaf) continue;
    EXPECT_TRUE(covered.count(std::string(info.name))) << info.name << " has no shape-inference row";
  }
}

struct RejectCase {
  const char* op;
  std::vector<Operand> in;
  std::vector<std::pair<std::string, AttrValue>> attrs;
  const char* words;
};

TEST(InferType, RejectsWithAReason) {
  const RejectCase rejects[] = {
      {"exp", {T(i32, {2})}, {}, "expects a floating-point operand, got i32[2]"},
      {"add", {T(b1, {2}), T(b1, {2})}, {}, "does not take bool operands"},
      {"matmul", {T(f32, {3}), T(f32, {3, 2})}, {}, "rank >= 2"},
      {"matmul", {T(f32, {2, 2, 3}), T(f32, {3, 3, 2})}, {}, "batch dims [2] and [3] do not broadcast"},
      {"permute", {T(f32, {2, 3})}, {{"dims", AttrValue(V{0, 0})}}, "appears twice"},
      {"reshape", {T(f32, {2, 3})}, {{"shape", AttrValue(V{-1, -1})}}, "only one dimension may be -1"},
      {"reshape", {T(f32, {2, 3})}, {{"shape", AttrValue(V{4, -1})}}, "cannot infer -1"},
      {"expand", {T(f32, {3, 2})}, {{"shape", AttrValue(V{3, 4})}}, "only size-1 dims expand"},
      {"embedding", {T(f32, {2}), T(f32, {4, 4})}, {}, "integer indices"},
      {"gather", {T(f32, {4, 5}), T(f32, {4, 5})}, {{"dim", I(0)}}, "gather expects integer indices (i32 or i64)"},
      {"gather", {T(f32, {4, 5}), T(i64, {4})}, {{"dim", I(0)}}, "index i64[4] has rank 1 but x f32[4, 5] has rank 2"},
      {"gather", {T(f32, {4, 5}), T(i64, {5, 5})}, {{"dim", I(1)}},
       "index i64[5, 5] is larger than x f32[4, 5] in dim 0 (5 > 4); only dim 1, the indexed dim, may be larger"},
      {"gather", {T(f32, {4, 5}), T(i64, {4, 5})}, {{"dim", I(2)}}, "gather: dim 2 is out of range for a rank-2 operand"},
      {"gather", {T(f32, {}), T(i64, {})}, {{"dim", I(0)}}, "a scalar has no dim to index"},
      {"index_select", {T(f32, {4, 5}), T(i64, {2, 2})}, {{"dim", I(0)}}, "index_select expects a 1-D index, got i64[2, 2]"},
      {"index_select", {T(f32, {4, 5}), T(i64, {2})}, {{"dim", I(0)}, {"offset", I(kMax)}}, "outside -2^62..2^62"},
      {"scatter_add", {T(f32, {4, 5}), T(i64, {2, 5}), T(f16, {2, 5})}, {{"dim", I(0)}}, "differ in dtype"},
      {"scatter_add", {T(f32, {4, 5}), T(i64, {2, 5}), T(f32, {2, 4})}, {{"dim", I(0)}},
       "index i64[2, 5] is larger than src f32[2, 4] in dim 1 (5 > 4)"},
      {"scatter_add", {T(b1, {4}), T(i64, {2}), T(b1, {2})}, {{"dim", I(0)}}, "does not take bool operands"},
      {"scatter_add", {T(f32, {1 << 20}), T(i64, {1 << 21}), T(f32, {1 << 21})}, {{"dim", I(0)}}, "above the limit of 2^40"},
      {"embedding", {T(i64, {2}), T(f32, {4, 4})}, {{"offset", I(kMin)}}, "embedding: offset -9223372036854775808 is outside"},
      {"layer_norm", {T(f32, {2, 8}), T(f32, {4}), T(f32, {4})}, {}, "does not match the trailing dims [8]"},
      {"softmax", {T(f32, {2, 8})}, {{"dim", AttrValue(int64_t{2})}}, "out of range"},
      {"cross_entropy", {T(f32, {4, 10}), T(i64, {4})}, {{"reduction", AttrValue(std::string("avg"))}},
       "cross_entropy: reduction 'avg' is not one of mean, sum, none"},
      {"cross_entropy", {T(f32, {4, 10}), T(f32, {4, 10})}, {},
       "cross_entropy expects integer class indices (i32 or i64) as its target, got f32[4, 10] (class probabilities"},
      {"cross_entropy", {T(f32, {4, 10}), T(i64, {4, 1})}, {},
       "target i64[4, 1] does not match logits f32[4, 10] (expected target shape [4]"},
      {"cross_entropy", {T(f32, {10}), T(i64, {1})}, {}, "expected target shape []"},
      {"cross_entropy", {T(i64, {4, 10}), T(i64, {4})}, {}, "cross_entropy expects floating-point logits, got i64[4, 10]"},
      {"cross_entropy", {T(f32, {}), T(i64, {})}, {}, "logits of rank >= 1"},
      {"cross_entropy", {T(f32, {4, 0}), T(i64, {4})}, {}, "logits f32[4, 0] have no classes"},
      {"cross_entropy", {T(f32, {4, 3}), T(b1, {4})}, {}, "integer class indices (i32 or i64) as its target, got bool[4]"},
      {"cross_entropy", {T(f32, {4, 3}), T(i64, {4})}, {{"ignore_index", I(kMin)}}, "is outside -2^53..2^53"},
      {"reduce_scatter", {T(f32, {6, 3})}, {{"mesh_dim", AttrValue(std::string("tp"))}}, "not divisible by the 4 ranks"},
      {"all_reduce", {T(f32, {6})}, {{"mesh_dim", AttrValue(std::string("tp"))}, {"op", AttrValue(std::string("prod"))}},
       "op 'prod' is not one of"},
      {"sum", {T(f32, {2, 3})}, {{"dims", AttrValue(V{1, -1})}}, "listed twice"},
      {"mean", {T(i32, {2, 3})}, {}, "floating-point"},
      {"layer_norm", {T(f32, {2, 8}), T(f32, {8}), T(f32, {2, 8})}, {}, "must have the same type"},
      {"redistribute", {T(f32, {2})}, {{"placements", AttrValue(PlacementSpec{{Placement::shard(0)}})}},
       "1 placements for a mesh of 2 dims"},
      {"arange", {}, {{"end", I(8)}, {"step", I(0)}}, "step must be nonzero (start=0, end=8, step=0)"},
      {"arange", {}, {{"end", I(0)}, {"start", I(5)}}, "inconsistent with the step's sign (start=5, end=0, step=1)"},
      {"arange", {}, {{"end", I(5)}, {"step", I(-1)}}, "inconsistent with the step's sign"},
      {"arange", {}, {{"end", I(int64_t{1} << 62)}}, "gives 4611686018427387904 elements, above the limit of 2^40"},
      {"arange", {}, {{"end", I(kMax)}, {"start", I(kMin)}}, "gives 18446744073709551615 elements"},
      {"arange", {}, {{"end", I((int64_t{1} << 40) + 1)}}, "above the limit"},
      {"arange", {}, {{"end", I(3000000004)}, {"start", I(3000000000)}, {"dtype", AttrValue(i32)}},
       "value 3000000000 of start=3000000000, end=3000000004, step=1 does not fit in i32"},
      {"arange", {}, {{"end", I(-3000000001)}, {"step", I(-1000000000)}, {"dtype", AttrValue(i32)}},
       "value -3000000000 of"},  // the last value, 0 - 3 * 10^9
      {"arange", {}, {{"end", I(4)}, {"dtype", AttrValue(b1)}}, "dtype bool is not supported"},
      {"full", {}, {{"shape", AttrValue(V{2, -3})}, {"value", AttrValue(1.0)}}, "dimension -3 is negative in shape [2, -3]"},
      {"full", {}, {{"shape", AttrValue(V{2})}, {"value", AttrValue(1.5)}, {"dtype", AttrValue(i32)}},
       "value 1.5 is not an integer in the range of i32"},
      {"full", {}, {{"shape", AttrValue(V{2})}, {"value", AttrValue(2147483648.0)}, {"dtype", AttrValue(i32)}},
       "range of i32"},
      {"full", {}, {{"shape", AttrValue(V{2})}, {"value", AttrValue(0x1p63)}, {"dtype", AttrValue(i64)}}, "range of i64"},
      {"full", {}, {{"shape", AttrValue(V{2})}, {"value", AttrValue(std::nan(""))}, {"dtype", AttrValue(i64)}},
       "is not an integer"},
      {"tril", {T(f32, {4})}, {}, "tril expects an operand of rank >= 2 (it masks the last two dims), got f32[4]"},
      {"triu", {W(f32)}, {}, "rank >= 2"},
      {"log_softmax", {T(i32, {2, 3})}, {}, "floating-point"},
      {"cumsum", {T(f32, {2, 3})}, {{"dim", I(2)}}, "cumsum: dim 2 is out of range for a rank-2 operand (expected -2..1)"},
      {"cumsum", {W(f32)}, {{"dim", I(0)}}, "cumsum expects an operand of rank >= 1, got f32[]"},
      {"argmax", {T(f32, {2, 0})}, {{"dim", I(1)}}, "argmax: dim 1 of f32[2, 0] is empty (no element to pick"},
      {"argmin", {T(b1, {4})}, {{"dim", I(0)}}, "argmin does not take bool operands"},
      {"argmax", {T(f32, {4})}, {{"dim", I(-2)}}, "out of range"},
      {"mean", {T(f32, {4})}, {{"count", I(-1)}}, "mean: count -1 is negative"},
      {"log_softmax", {T(f32, {2, 3})}, {{"dim", I(2)}}, "out of range"},
      {"dropout", {T(i64, {2})}, {{"seed", I(1)}}, "dropout expects a floating-point operand, got i64[2]"},
      {"dropout", {T(f32, {2})}, {{"p", AttrValue(1.5)}, {"seed", I(1)}}, "dropout: p must be in [0, 1] (the probability of zeroing an element), got 1.5"},
      {"dropout", {T(f32, {2})}, {{"p", AttrValue(-0.25)}, {"seed", I(1)}}, "got -0.25"},
      {"dropout", {T(f32, {2})}, {{"p", AttrValue(std::nan(""))}, {"seed", I(1)}}, "p must be in [0, 1]"},
      {"dropout", {T(f32, {2})}, {{"seed", I(-1)}}, "dropout: seed must be a non-negative integer (a Philox key), got -1"},
      {"dropout", {T(f32, {2})}, {{"seed", I(1)}, {"origin", AttrValue(V{1})}}, "must both have 1 entries"},
      {"dropout", {T(f32, {2, 3})}, {{"seed", I(1)}, {"origin", AttrValue(V{4, 0})}, {"global_shape", AttrValue(V{5, 3})}},
       "the block of f32[2, 3] at origin [4, 0] does not lie inside global_shape [5, 3] (dim 0)"},
      {"dropout", {T(f32, {2, 3})}, {{"seed", I(1)}, {"origin", AttrValue(V{0, -1})}, {"global_shape", AttrValue(V{5, 3})}},
       "(dim 1)"},
      {"dropout", {T(f32, {2, 3})}, {{"seed", I(1)}, {"origin", AttrValue(V{0, 0})}, {"global_shape", AttrValue(V{kMax, 3})}},
       "global_shape: "},
      {"dropout", {T(f32, {0, 3})}, {{"seed", I(1)}, {"origin", AttrValue(V{0, 0})}, {"global_shape", AttrValue(V{0, int64_t{1} << 50})}},
       "global_shape: "},
      {"scaled_dot_product_attention", {T(f32, {5, 4}), T(f32, {5, 4}), T(f32, {5, 4})}, {},
       "of one rank >= 3, got q f32[5, 4]"},
      {"scaled_dot_product_attention", {T(f32, {2, 5, 4}), T(f32, {1, 2, 7, 4}), T(f32, {1, 2, 7, 4})}, {},
       "of one rank >= 3"},
      {"scaled_dot_product_attention", {T(f32, {2, 5, 4}), T(f32, {2, 7, 3}), T(f32, {2, 7, 4})}, {},
       "q's last dim E=4 differs from k's 3"},
      {"scaled_dot_product_attention", {T(f32, {2, 5, 4}), T(f32, {2, 7, 4}), T(f32, {2, 6, 4})}, {},
       "must agree on Hkv and S"},
      {"scaled_dot_product_attention", {T(f32, {2, 2, 5, 4}), T(f32, {3, 2, 7, 4}), T(f32, {3, 2, 7, 4})}, {},
       "batch dim 0 differs"},
      {"scaled_dot_product_attention", {T(f32, {6, 5, 4}), T(f32, {2, 7, 4}), T(f32, {2, 7, 4})}, {},
       "q has 6 heads and k, v have 2"},
      {"scaled_dot_product_attention", {T(f32, {6, 5, 4}), T(f32, {4, 7, 4}), T(f32, {4, 7, 4})},
       {{"enable_gqa", AttrValue(true)}}, "q's 6 heads must be a multiple of k's and v's 4"},
      {"scaled_dot_product_attention", {T(f32, {2, 5, 4}), T(f32, {2, 7, 4}), T(f32, {2, 7, 4}), T(f32, {5, 6})}, {},
       "attn_mask f32[5, 6] does not broadcast to the scores' shape [2, 5, 7]"},
      {"scaled_dot_product_attention", {T(f32, {2, 5, 4}), T(f32, {2, 7, 4}), T(f32, {2, 7, 4}), T(f32, {3, 5, 7})},
       {}, "does not broadcast"},
      {"scaled_dot_product_attention", {T(f32, {2, 5, 4}), T(f32, {2, 7, 4}), T(f32, {2, 7, 4}), T(i32, {5, 7})}, {},
       "attn_mask must be bool"},
      {"scaled_dot_product_attention", {T(f32, {2, 5, 4}), T(f32, {2, 7, 4}), T(f32, {2, 7, 4}), T(b1, {5, 7})},
       {{"is_causal", AttrValue(true)}}, "is_causal=true together with an attn_mask is an error"},
      {"scaled_dot_product_attention", {T(i32, {2, 5, 4}), T(i32, {2, 7, 4}), T(i32, {2, 7, 4})}, {},
       "one floating-point dtype"},
      {"scaled_dot_product_attention", {T(f32, {2, 5, 4}), T(bf16, {2, 7, 4}), T(f32, {2, 7, 4})}, {},
       "one floating-point dtype"},
      {"scaled_dot_product_attention", {T(f32, {3, 5, 4}), T(f32, {2, 7, 4}), T(f32, {2, 7, 4})},
       {{"head_offset", I(4)}, {"gqa_group", I(3)}}, "query head 2 reads kv head 2"},
      {"scaled_dot_product_attention", {T(f32, {2, 5, 4}), T(f32, {2, 7, 4}), T(f32, {2, 7, 4})},
       {{"head_offset", I(-1)}}, "head_offset -1 is outside"},
      // The scores [2^21, 2^20] are above 2^40 elements though q, k and v are not.
      {"scaled_dot_product_attention",
       {T(f32, {1, int64_t{1} << 21, 1}), T(f32, {1, int64_t{1} << 20, 1}), T(f32, {1, int64_t{1} << 20, 1})}, {},
       "its scores"},
  };
  for (const RejectCase& r : rejects) {
    auto k = find_op(r.op);
    ASSERT_TRUE(k) << r.op;
    try {
      Attrs a = normalize_attrs(*k, {}, r.attrs);
      TensorType t = infer_type(*k, r.in, a, kMesh);
      ADD_FAILURE() << r.op << " accepted, gave " << t.str();
    } catch (const OpError& e) {
      EXPECT_NE(e.message.find(r.words), std::string::npos) << r.op << ": " << e.message;
    }
  }
}

TEST(NormalizeAttrs, FillsDefaultsAndChecksSchema) {
  Attrs a = normalize_attrs(OpKind::Sum, {}, {{"keepdim", AttrValue(true)}});
  EXPECT_EQ(a.get_ints("dims"), V{});
  EXPECT_TRUE(a.get_bool("keepdim"));
  Attrs t = normalize_attrs(OpKind::Transpose, {AttrValue(int64_t{1}), AttrValue(int64_t{0})}, {});
  EXPECT_EQ(t.get_int("dim0"), 1);
  EXPECT_EQ(t.get_int("dim1"), 0);
  Attrs ln = normalize_attrs(OpKind::LayerNorm, {AttrValue(int64_t{1})}, {});
  EXPECT_EQ(ln.get_float("eps"), 1.0);  // an int literal where a float is expected
  EXPECT_THROW(normalize_attrs(OpKind::Sum, {}, {{"dims", AttrValue(true)}}), OpError);
  EXPECT_THROW(normalize_attrs(OpKind::Cast, {}, {}), OpError);
  EXPECT_THROW(normalize_attrs(OpKind::Cast, {AttrValue(std::string("f64"))}, {}), OpError);
}

TEST(OpTable, NamesAreUniqueAndFindable) {
  std::set<std::string_view> names;
  for (const OpInfo& info : all_ops()) {
    EXPECT_TRUE(names.insert(info.name).second) << info.name;
    EXPECT_EQ(&op_info(info.kind), &info);
    if (info.category != OpCategory::Leaf) {
      EXPECT_EQ(find_op(info.name), info.kind);
    }
  }
  EXPECT_EQ(find_op("param"), std::nullopt);  // leaves are not callable
}

}  // namespace ir_ops_test
}  // namespace sf
