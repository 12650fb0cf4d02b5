// The pointwise emitter: host kernels (ORC JIT) against the reference evaluator on
// the same group graph, and NVPTX kernels through the verifier, compile_to_ptx,
// FileCheck-style PTX checks and ptxas. No GPU is needed.
#include <gtest/gtest.h>

#include "tests/kernels/kernel_test_util.h"
#include "tests/kernels/pointwise_util.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <fstream>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>
#include <llvm/Support/raw_ostream.h>

#include "codegen/ir/builder.h"
#include "codegen/ir/decompose.h"
#include "codegen/kernels/element.h"
#include "codegen/kernels/pointwise.h"
#include "codegen/reference/compare.h"
#include "codegen/reference/evaluate.h"

namespace sf {
namespace kernels_pointwise_test {

using kernel_test::finish;
using kernel_test::jit;
using kernel_test::module_text;
using kernel_test::have_ptxas;
using kernel_test::ptxas_failure;
using pointwise_util::bf16_rne;
using pointwise_util::emit_ptx;
using pointwise_util::Fill;
using pointwise_util::make_inputs;
using pointwise_util::make_tensor;
using pointwise_util::Ptx;
using pointwise_util::run_host;
using pointwise_util::spec_of;

// ---- running a group on the host --------------------------------------------------------



Value gt(Value a, Value b) { return binary(OpKind::Gt, a, b); }
Value maximum(Value a, Value b) { return binary(OpKind::Maximum, a, b); }
Value maximum(Value a, int b) { return binary(OpKind::Maximum, a, b); }

// The host kernel's outputs equal the reference's within default_tolerance (exactly
// for integers and bools; NaN only matches NaN).
void expect_matches_reference(const Graph& g, const std::vector<Tensor>& inputs, const KernelConfig& cfg = {}) {
  Result<std::vector<Tensor>> want = evaluate(g, inputs);
  ASSERT_TRUE(want.ok()) << want.error().str();
  Result<std::vector<Tensor>> got = run_host(g, inputs, cfg);
  ASSERT_TRUE(got.ok()) << got.error().str();
  ASSERT_EQ(got->size(), want->size());
  for (size_t o = 0; o < want->size(); ++o) {
    const Tensor& w = (*want)[o];
    const Tensor& r = (*got)[o];
    Comparison c = compare(r, w, default_tolerance(w.dtype()));
    if (c.ok()) continue;
    int64_t i = c.first_mismatch;
    std::string operands;
    for (size_t p = 0; p < inputs.size(); ++p)
      if (inputs[p].numel() == w.numel())
        operands += " " + g.node(g.params()[p]).name + "=" + std::to_string(inputs[p].get(i));
    ADD_FAILURE() << "output '" << g.outputs()[o].name << "' (" << w.type().str() << "): " << c.mismatches
                  << " mismatch(es); first at " << i << ": got " << r.get(i) << ", want " << w.get(i)
                  << " (operands at that index:" << operands << ")";
  }
}

// ---- the op table: every elementwise op has a row ------------------------------------------

const std::vector<DType> kFloats = {DType::F32, DType::F16, DType::BF16};
const std::vector<DType> kNumeric = {DType::F32, DType::F16, DType::BF16, DType::I32, DType::I64};
const std::vector<DType> kAll = {DType::F32, DType::F16, DType::BF16, DType::I32, DType::I64, DType::Bool};

struct OpRow {
  OpKind op;
  std::vector<DType> dtypes;  // the operand dtypes the op allows
};

const std::vector<OpRow>& op_rows() {
  static const std::vector<OpRow> rows = {
      {OpKind::Neg, kNumeric},      {OpKind::Abs, kNumeric},     {OpKind::Relu, kNumeric},
      {OpKind::Exp, kFloats},       {OpKind::Log, kFloats},      {OpKind::Sqrt, kFloats},
      {OpKind::Rsqrt, kFloats},     {OpKind::Tanh, kFloats},     {OpKind::Sigmoid, kFloats},
      {OpKind::Silu, kFloats},      {OpKind::Sin, kFloats},      {OpKind::Cos, kFloats},
      {OpKind::Reciprocal, kFloats}, {OpKind::Erf, kFloats},     {OpKind::Cast, kAll},
      {OpKind::Add, kNumeric},      {OpKind::Sub, kNumeric},     {OpKind::Mul, kNumeric},
      {OpKind::Div, kNumeric},      {OpKind::Maximum, kNumeric}, {OpKind::Minimum, kNumeric},
      {OpKind::Pow, kNumeric},      {OpKind::Eq, kAll},          {OpKind::Ne, kAll},
      {OpKind::Lt, kAll},           {OpKind::Le, kAll},          {OpKind::Gt, kAll},
      {OpKind::Ge, kAll},           {OpKind::Where, kAll},
  };
  return rows;
}

const Shape kOpShape = {37, 7};  // 259 elements: no multiple of any vector width

// One graph per (op, dtype) with several outputs covering the op's forms.
void check_op(OpKind op, DType dt, uint64_t seed) {
  SCOPED_TRACE(std::string(op_name(op)) + " " + std::string(dtype_name(dt)));
  GraphBuilder b("op");
  std::vector<Fill> fills;
  switch (op_info(op).category) {
    case OpCategory::Unary: {
      Value x = b.param("x", dt, kOpShape);
      if (op == OpKind::Cast) {
        for (DType to : kAll) b.ret(cast(x, to));  // every pair, from dt to each
      } else {
        b.ret(unary(op, x));
      }
      break;
    }
    case OpCategory::Binary: {
      Value x = b.param("x", dt, kOpShape);
      Value y = b.param("y", dt, kOpShape);
      Value row = b.param("row", dt, {kOpShape[1]});
      const bool int_pow = op == OpKind::Pow && !is_float(dt);
      fills = {int_pow ? Fill::Small : Fill::Mixed, int_pow ? Fill::Exponent : Fill::Mixed,
               int_pow ? Fill::Exponent : Fill::Small};
      b.ret(binary(op, x, y));
      b.ret(binary(op, x, row));               // broadcasting
      b.ret(binary(op, x, int_pow ? 3 : 2));   // a weak integer literal
      if (!int_pow) b.ret(binary(op, x, 0.1));  // a weak float literal (not rounded to dt first)
      b.ret(binary(op, row, y));
      break;
    }
    case OpCategory::Compare: {
      Value x = b.param("x", dt, kOpShape);
      Value y = b.param("y", dt, kOpShape);
      b.ret(binary(op, x, y));
      b.ret(binary(op, x, 0.5));
      b.ret(binary(op, x, 1));
      // Mixed integer / float operands compare exactly (as the reference does, in double).
      if (!is_float(dt)) b.ret(binary(op, x, cast(y, DType::F32)));
      if (is_float(dt)) b.ret(binary(op, x, cast(y, DType::I64)));
      break;
    }
    case OpCategory::Where: {
      Value c = b.param("c", DType::Bool, kOpShape);
      Value x = b.param("x", dt, kOpShape);
      Value y = b.param("y", dt, {kOpShape[1]});
      b.ret(where(c, x, y));
      b.ret(where(c, x, b.constant(0.1)));              // a weak literal rounded to dt
      b.ret(where(c, b.constant(-3.0, DType::I64), y));
      b.ret(where(c, x, cast(y, DType::F16)));          // promotes
      break;
    }
    default: FAIL() << "not an elementwise category";
  }
  Graph g = finish(b);
  std::vector<Tensor> in = make_inputs(g, seed, fills);
  // Comparisons: make a third of the elements equal so eq/le/ge see ties.
  if (op_info(op).category == OpCategory::Compare)
    for (int64_t i = 0; i < in[0].numel(); i += 3) {
      if (dt == DType::I64) in[1].set_int(i, in[0].get_int(i));
      else in[1].set(i, in[0].get(i));
    }
  expect_matches_reference(g, in);
}

TEST(PointwiseHost, EveryElementwiseOpMatchesTheReferenceInEveryDtype) {
  int checked = 0;
  for (const OpInfo& info : all_ops()) {
    if (!kernels::is_elementwise(info.kind)) continue;
    const OpRow* row = nullptr;
    for (const OpRow& r : op_rows())
      if (r.op == info.kind) row = &r;
    if (!row) {
      ADD_FAILURE() << "elementwise op '" << info.name << "' has no row in op_rows(): add one";
      continue;
    }
    for (DType dt : row->dtypes) check_op(info.kind, dt, 1000 + static_cast<uint64_t>(checked++));
  }
  EXPECT_GE(checked, 100);
}

// ---- element rules one at a time ---------------------------------------------------------

TEST(PointwiseHost, CastRoundsOnceToNearestEvenAndSaturates) {
  GraphBuilder b("cast");
  Value i = b.param("i", DType::I64, {8});
  Value f = b.param("f", DType::F32, {8});
  b.ret(cast(i, DType::BF16));  // 2^24 + 2^16 + 1 via f32 would round twice
  b.ret(cast(i, DType::F16));
  b.ret(cast(i, DType::I32));   // wraps
  b.ret(cast(f, DType::I32));   // truncates toward zero, saturates, NaN -> 0
  b.ret(cast(f, DType::Bool));  // NaN is true
  b.ret(cast(f, DType::BF16));
  Graph g = finish(b);
  Tensor it(DType::I64, {8}), ft(DType::F32, {8});
  const int64_t ivals[] = {16842753, -16842753, (int64_t{1} << 40) + (int64_t{1} << 32) + 1, 65519, 65520,
                           std::numeric_limits<int64_t>::max(), std::numeric_limits<int64_t>::min(), 3};
  const double fvals[] = {std::nan(""), 1e10, -1e10, -2.9, 2.9, -0.0, 3.3961e38, 1.00390625};
  for (int k = 0; k < 8; ++k) {
    it.set_int(k, ivals[k]);
    ft.set(k, fvals[k]);
  }
  expect_matches_reference(g, {it, ft});
  Result<std::vector<Tensor>> got = run_host(g, {it, ft});
  ASSERT_TRUE(got.ok());
  EXPECT_EQ((*got)[0].get(0), 16908288.0);  // 2^24 + 2^17: one correct rounding
  EXPECT_EQ((*got)[3].get_int(0), 0);       // NaN -> 0
  EXPECT_EQ((*got)[3].get_int(1), 2147483647);
  EXPECT_EQ((*got)[4].get_int(0), 1);       // NaN != 0
}

TEST(PointwiseHost, HalfIntermediatesRoundAtEveryNode) {
  // Precision::Eager: (x + y) - x in f16 loses y's low bits at the add, as eager
  // PyTorch and the reference do; Precision::Fused computes the chain in f32 and
  // gives y back.
  GraphBuilder b("f16");
  Value x = b.param("x", DType::F16, {4});
  Value y = b.param("y", DType::F16, {4});
  b.ret((x + y) - x);
  Graph g = finish(b);
  Tensor xt(DType::F16, {4}), yt(DType::F16, {4});
  for (int k = 0; k < 4; ++k) {
    xt.set(k, 1024.0);
    yt.set(k, 0.25 * (k + 1));
  }
  Result<std::vector<Tensor>> got = run_host(g, {xt, yt}, {}, Precision::Eager);
  ASSERT_TRUE(got.ok()) << got.error().str();
  Result<std::vector<Tensor>> want = evaluate(g, {xt, yt});
  ASSERT_TRUE(want.ok());
  for (int k = 0; k < 4; ++k) EXPECT_EQ((*got)[0].get(k), (*want)[0].get(k)) << k;
  EXPECT_NE((*got)[0].get(0), 0.25) << "1024 + 0.25 is 1024 in f16";
  Result<std::vector<Tensor>> fused = run_host(g, {xt, yt}, {}, Precision::Fused);
  ASSERT_TRUE(fused.ok()) << fused.error().str();
  for (int k = 0; k < 4; ++k) EXPECT_EQ((*fused)[0].get(k), 0.25 * (k + 1)) << k;
}

TEST(PointwiseHost, HalfArithmeticIsCorrectlyRoundedBitForBit) {
  // f32 has 24 >= 2 * 11 + 2 bits, so +, -, *, / and sqrt computed in f32 and rounded
  // to f16 or bf16 are correctly rounded (the double rounding is innocuous): equal
  // to the reference's one rounding from double, bit for bit, on every input.
  for (DType dt : {DType::F16, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dt));
    GraphBuilder b("half");
    Value x = b.param("x", dt, {4099});
    Value y = b.param("y", dt, {4099});
    b.ret(x + y);
    b.ret(x - y);
    b.ret(x * y);
    b.ret(x / y);
    b.ret(unary(OpKind::Sqrt, x));
    b.ret(cast(cast(x, DType::F32) * 0.1, dt));
    Graph g = finish(b);
    std::vector<Tensor> in = make_inputs(g, 31);
    Result<std::vector<Tensor>> want = evaluate(g, in);
    ASSERT_TRUE(want.ok());
    Result<std::vector<Tensor>> got = run_host(g, in);
    ASSERT_TRUE(got.ok()) << got.error().str();
    for (size_t o = 0; o < want->size(); ++o) {
      Comparison c = compare((*got)[o], (*want)[o], Tolerance{0, 0});
      EXPECT_TRUE(c.ok()) << "output " << o << ": first mismatch at " << c.first_mismatch;
    }
  }
}

// ---- broadcasting, chains, views -----------------------------------------------------------

TEST(PointwiseHost, BroadcastsAcrossRanksAndScalars) {
  GraphBuilder b("bcast");
  Value x = b.param("x", DType::F32, {4, 1, 5});
  Value y = b.param("y", DType::BF16, {3, 1});
  Value z = b.param("z", DType::F32, {});
  Value w = b.param("w", DType::I32, {1, 3, 5});
  b.ret(x * y + z);
  b.ret(where(gt(x, y), cast(w, DType::F16), z));
  b.ret(maximum(w, 3) - x);
  Graph g = finish(b);
  expect_matches_reference(g, make_inputs(g, 11));
}

TEST(PointwiseHost, ChainWithSeveralOutputsOfOneElementCount) {
  GraphBuilder b("chain");
  Value x = b.param("x", DType::F16, {64, 33});
  Value y = b.param("y", DType::F32, {33});
  Value a = exp(x) * y;  // f32
  b.ret(a);
  b.ret(cast(a, DType::BF16));
  b.ret(binary(OpKind::Gt, a, 1.0));
  b.ret(relu(a - y));
  b.ret(transpose(sigmoid(x), 0, 1));   // [33, 64]: another shape, same count
  b.ret(reshape(a, {2112}));
  b.ret(a);                             // the same value twice
  Graph g = finish(b);
  expect_matches_reference(g, make_inputs(g, 12, {Fill::Small, Fill::Small}));
}

TEST(PointwiseHost, ViewsFoldIntoIndexArithmetic) {
  auto check = [](const char* what, const std::function<void(GraphBuilder&, Value, Value)>& body) {
    SCOPED_TRACE(what);
    GraphBuilder b("views");
    Value x = b.param("x", DType::F32, {6, 4, 5});
    Value y = b.param("y", DType::F16, {4, 1});
    body(b, x, y);
    Graph g = finish(b);
    expect_matches_reference(g, make_inputs(g, 13));
  };
  check("transpose", [](GraphBuilder& b, Value x, Value) { b.ret(exp(transpose(x, 0, 2))); });
  check("permute", [](GraphBuilder& b, Value x, Value) { b.ret(permute(x, {1, 2, 0}) * 2.0); });
  check("reshape", [](GraphBuilder& b, Value x, Value) { b.ret(reshape(x, {24, 5}) + 1.0); });
  check("reshape of a transpose", [](GraphBuilder& b, Value x, Value) {
    b.ret(reshape(transpose(x, 0, 1), {24, 5}));  // not a strided view: a second index step
  });
  check("view chain", [](GraphBuilder& b, Value x, Value) {
    b.ret(reshape(permute(reshape(transpose(x, 1, 2), {30, 4}), {1, 0}), {4, 5, 6}) - 1.0);
  });
  check("expand", [](GraphBuilder& b, Value x, Value y) { b.ret(x * expand(y, {6, 4, 5})); });
  check("expand of a transpose", [](GraphBuilder& b, Value x, Value y) {
    b.ret(x + permute(expand(transpose(expand(y, {4, 5}), 0, 1), {6, 5, 4}), {0, 2, 1}));
  });
  check("views on both sides", [](GraphBuilder& b, Value x, Value y) {
    Value t = transpose(x, 0, 1);  // [4, 6, 5]
    b.ret(transpose(t * reshape(y, {4, 1, 1}), 0, 1) + x);
    b.ret(reshape(t, {120}));
  });
}

TEST(PointwiseIndex, DenseReadsAreContiguousAndBroadcastsCoalesce) {
  GraphBuilder b("idx");
  b.ret(reshape(b.param("x", DType::F32, {6, 4, 5}), {24, 5}));
  Graph g = finish(b);
  const Node& rn = g.node(g.outputs()[0].value);
  kernels::ValueIndex at = kernels::dense_index(rn.type.shape);
  auto xi = kernels::operand_index(rn, at, {6, 4, 5});
  ASSERT_TRUE(xi);
  EXPECT_TRUE(kernels::offset_map(*xi, {6, 4, 5}).contiguous());
  // y [4, 5] read from [6, 4, 5]: one dim of 20 with stride 1 after a broadcast of 6.
  kernels::ValueIndex out = kernels::dense_index({6, 4, 5});
  kernels::ValueIndex yi{out.prefix, out.space, {1, 2}};
  EXPECT_EQ(kernels::offset_map(yi, {4, 5}).str(), "[6, 20]:[0, 1]");
  // x read transposed: [4, 6, 5] over x's strides [20, 5, 1].
  kernels::ValueIndex ti{out.prefix, {4, 6, 5}, {1, 0, 2}};
  EXPECT_EQ(kernels::offset_map(ti, {6, 4, 5}).str(), "[4, 6, 5]:[5, 20, 1]");
}

TEST(PointwiseIndex, DenseRunsAreWhatAVectorAccessMayRead) {
  using kernels::IndexMap;
  auto map = [](Shape shape, std::vector<int64_t> strides) { return IndexMap{{{std::move(shape), std::move(strides)}}}; };
  EXPECT_TRUE(kernels::dense_runs(IndexMap{}, 4));                 // dense
  EXPECT_TRUE(kernels::dense_runs(map({64, 1000}, {0, 1}), 4));     // a bias row
  EXPECT_TRUE(kernels::dense_runs(map({4, 6, 8}, {8, 32, 1}), 8));  // a permute keeping the inner dim
  EXPECT_FALSE(kernels::dense_runs(map({64, 1002}, {0, 1}), 4));    // runs would straddle rows
  EXPECT_FALSE(kernels::dense_runs(map({8, 4}, {6, 1}), 4));        // rows not 4-aligned
  EXPECT_FALSE(kernels::dense_runs(map({4, 6}, {1, 4}), 2));        // a transpose
  EXPECT_FALSE(kernels::dense_runs(map({1000}, {0}), 4));           // a scalar: one load suffices
  EXPECT_TRUE(kernels::dense_runs(map({4, 6}, {1, 4}), 1));         // any map, one lane
}

// ---- sizes ---------------------------------------------------------------------------------

TEST(PointwiseHost, EmptyOneAndOddSizes) {
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{2}, int64_t{1000003}}) {
    SCOPED_TRACE("n = " + std::to_string(n));
    GraphBuilder b("sizes");
    Value x = b.param("x", DType::F32, {n});
    Value y = b.param("y", DType::BF16, {n});
    Value s = b.param("s", DType::F32, {});
    b.ret(exp(x) * y + s);
    b.ret(cast(x, DType::F16));
    Graph g = finish(b);
    expect_matches_reference(g, make_inputs(g, 14));
  }
  GraphBuilder b("empty2d");  // an empty dim in the middle of a broadcast
  Value x = b.param("x", DType::F32, {3, 0, 5});
  Value y = b.param("y", DType::F32, {5});
  b.ret(x + y);
  Graph g = finish(b);
  expect_matches_reference(g, make_inputs(g, 15));
}

TEST(PointwiseHost, SixteenMillionElements) {
  const int64_t n = (int64_t{1} << 24) + 7;
  GraphBuilder b("big");
  Value x = b.param("x", DType::F32, {n});
  Value y = b.param("y", DType::F16, {n});
  b.ret(x * 2.0 + cast(y, DType::F32));
  Graph g = finish(b);
  expect_matches_reference(g, make_inputs(g, 16, {Fill::Small, Fill::Small}));
}

// ---- the NVPTX kernel's structure, run thread by thread on the host ------------------------
//
// emit_pointwise_thread_on_host builds the GPU kernel's tiles, grid-stride loop, vector
// steps and tails for the host; running every thread of the launch checks that logic
// against the reference without a GPU.

// Runs every (block, thread) of the launch in order, or of `grid` blocks where it is
// set (what a runtime launches when it shrinks a persistent grid). With `misalign`,
// every buffer starts one element past a 16-byte boundary, so the vector path must
// be skipped.
Result<std::vector<Tensor>> run_grid(const Graph& g, const std::vector<Tensor>& inputs, const KernelConfig& cfg,
                                     bool misalign = false, int32_t grid_override = 0) {
  Result<EmittedKernel> k = emit_pointwise_thread_on_host(spec_of(g, "grid"), cfg);
  if (!k) return k.error();
  LaunchShape launch = k->launch;
  Result<void*> fn = jit().add(std::move(k->module), std::move(k->context), k->entry);
  if (!fn) return fn.error();
  std::vector<Tensor> out;
  for (const Output& o : g.outputs()) out.emplace_back(g.node(o.value).type.dtype, g.node(o.value).type.shape);
  // 64-byte aligned copies, shifted by one element when misaligned.
  std::vector<std::vector<std::byte>> store;
  std::vector<void*> args;
  // Every byte around a tensor holds a canary, checked afterwards: no thread may write
  // outside its output.
  constexpr auto kCanary = std::byte{0xA5};
  auto place = [&](const Tensor& t) {
    size_t shift = misalign ? static_cast<size_t>(dtype_size(t.dtype())) : 0;
    store.emplace_back(t.nbytes() + 256, kCanary);
    auto base = reinterpret_cast<uintptr_t>(store.back().data());
    auto* p = reinterpret_cast<std::byte*>((base + 63) / 64 * 64 + 64 + shift);
    if (t.nbytes()) std::memcpy(p, t.data(), t.nbytes());
    args.push_back(p);
  };
  for (const Tensor& t : inputs) place(t);
  for (const Tensor& t : out) place(t);
  auto run = reinterpret_cast<void (*)(void**, int32_t, int32_t, int32_t)>(*fn);
  auto grid = grid_override > 0 ? grid_override : static_cast<int32_t>(launch.grid[0]);
  for (int32_t b = 0; b < grid; ++b)
    for (int32_t t = 0; t < launch.block[0]; ++t) run(args.data(), b, t, grid);
  for (size_t o = 0; o < out.size(); ++o) {
    auto* p = static_cast<std::byte*>(args[inputs.size() + o]);
    if (out[o].nbytes()) std::memcpy(out[o].data(), p, out[o].nbytes());
    const std::vector<std::byte>& buf = store[inputs.size() + o];
    for (size_t i = 0; i < buf.size(); ++i) {
      const std::byte* at = buf.data() + i;
      if ((at < p || at >= p + out[o].nbytes()) && *at != kCanary)
        return Diag{"", {}, "output " + std::to_string(o) + ": a write outside the tensor, at byte " +
                                std::to_string(at - p)};
    }
  }
  return out;
}

void expect_grid_matches_reference(const Graph& g, const std::vector<Tensor>& inputs, const KernelConfig& cfg,
                                   bool misalign = false) {
  Result<std::vector<Tensor>> want = evaluate(g, inputs);
  ASSERT_TRUE(want.ok()) << want.error().str();
  Result<std::vector<Tensor>> got = run_grid(g, inputs, cfg, misalign);
  ASSERT_TRUE(got.ok()) << got.error().str();
  for (size_t o = 0; o < want->size(); ++o) {
    Comparison c = compare((*got)[o], (*want)[o], default_tolerance((*want)[o].dtype()));
    EXPECT_TRUE(c.ok()) << "output '" << g.outputs()[o].name << "': " << c.mismatches << " mismatch(es), first at "
                        << c.first_mismatch << ": got " << (*got)[o].get(std::max<int64_t>(c.first_mismatch, 0))
                        << ", want " << (*want)[o].get(std::max<int64_t>(c.first_mismatch, 0));
  }
}

std::vector<KernelConfig> grid_configs() {
  std::vector<KernelConfig> v;
  auto add = [&](int block, int vector, int ept, bool stride, int max_blocks) {
    KernelConfig c;
    c.block = block;
    c.vector = vector;
    c.elems_per_thread = ept;
    c.grid_stride = stride;
    c.max_blocks = max_blocks;
    v.push_back(c);
  };
  add(256, 4, 1, true, 4096);  // the defaults
  add(128, 8, 2, true, 3);     // few blocks: many trips round the grid-stride loop
  add(64, 1, 4, false, 4096);  // scalar, one shot
  add(32, 16, 1, true, 5);     // wider than 16 bytes for f32: several pieces per vector
  add(96, 2, 3, false, 1);     // block not a power of two; one shot ignores max_blocks
  return v;
}

std::string config_str(const KernelConfig& c) {
  return "block " + std::to_string(c.block) + " vector " + std::to_string(c.vector) + " ept " +
         std::to_string(c.elems_per_thread) + (c.grid_stride ? " grid-stride max " + std::to_string(c.max_blocks) : " one-shot");
}

Graph bias_group(int64_t rows, int64_t cols) {
  GraphBuilder b("bias");
  Value x = b.param("x", DType::F32, {rows, cols});
  Value bias = b.param("bias", DType::BF16, {cols});           // a dense row: vector loads
  Value t = b.param("t", DType::F16, {cols, rows});            // transposed: scalar loads
  Value k = b.param("k", DType::I64, {rows, 1});
  b.ret(relu(x + bias));
  b.ret(cast(x * transpose(t, 0, 1), DType::F16));
  b.ret(gt(x, bias));                                          // bool output
  b.ret(k * 3 + cast(bias, DType::I64));                       // i64, pieces of 2
  return finish(b);
}

TEST(PointwiseGrid, KernelStructureMatchesTheReferenceForEveryConfig) {
  for (const KernelConfig& cfg : grid_configs()) {
    SCOPED_TRACE(config_str(cfg));
    for (auto [rows, cols] : {std::pair<int64_t, int64_t>{64, 1000}, {3, 5}, {1, 1}, {0, 8}, {7, 1024}}) {
      SCOPED_TRACE(std::to_string(rows) + " x " + std::to_string(cols));
      Graph g = bias_group(rows, cols);
      expect_grid_matches_reference(g, make_inputs(g, 21), cfg);
    }
  }
}

// A persistent grid (LaunchShape::persistent) strides by the launch's width, so a
// runtime that launches fewer blocks than the Plan says still computes every element
// once: 8 tiles of 4096 on a grid of 6, launched as 1, 2 and 5 blocks.
TEST(PointwiseGrid, APersistentGridComputesEveryElementOnFewerBlocks) {
  KernelConfig cfg;
  cfg.block = 128;
  cfg.vector = 8;
  cfg.elems_per_thread = 4;
  cfg.max_blocks = 6;
  const int64_t cols = 1000;
  Graph g = bias_group(30, cols);
  LaunchShape l = pointwise_launch(30 * cols, cfg);
  ASSERT_EQ(l.grid[0], 6);
  ASSERT_TRUE(l.persistent);
  std::vector<Tensor> in = make_inputs(g, 24);
  Result<std::vector<Tensor>> want = evaluate(g, in);
  ASSERT_TRUE(want.ok()) << want.error().str();
  for (int32_t grid : {1, 2, 5}) {
    Result<std::vector<Tensor>> got = run_grid(g, in, cfg, false, grid);
    ASSERT_TRUE(got.ok()) << got.error().str();
    for (size_t o = 0; o < want->size(); ++o)
      EXPECT_TRUE(compare((*got)[o], (*want)[o], default_tolerance((*want)[o].dtype())).ok())
          << "output " << o << " on " << grid << " block(s)";
  }
}

TEST(PointwiseGrid, MisalignedBuffersFallBackToScalarAccesses) {
  Graph g = bias_group(64, 1000);
  for (const KernelConfig& cfg : grid_configs()) {
    SCOPED_TRACE(config_str(cfg));
    expect_grid_matches_reference(g, make_inputs(g, 22), cfg, /*misalign=*/true);
  }
}

TEST(PointwiseGrid, OddSizeWithMathAndIntegers) {
  const int64_t n = 1000003;
  GraphBuilder b("odd");
  Value x = b.param("x", DType::F32, {n});
  Value y = b.param("y", DType::I64, {n});
  b.ret(where(binary(OpKind::Gt, y, 3), exp(x), cast(y, DType::F32)));
  b.ret(y * 3);
  Graph g = finish(b);
  std::vector<Tensor> in = make_inputs(g, 23, {Fill::Small, Fill::Small});
  for (const KernelConfig& cfg : grid_configs()) {
    SCOPED_TRACE(config_str(cfg));
    expect_grid_matches_reference(g, in, cfg);
  }
}

// ---- NVPTX ---------------------------------------------------------------------------------




Graph mixed_group() {
  GraphBuilder b("mixed");
  Value x = b.param("x", DType::F32, {128, 130});
  Value h = b.param("h", DType::F16, {128, 130});
  Value c = b.param("c", DType::BF16, {130});
  Value t = b.param("t", DType::F32, {130, 128});
  Value e = exp(x) * cast(h, DType::F32) + c;
  b.ret(e);
  b.ret(cast(tanh(e), DType::BF16));
  b.ret(where(binary(OpKind::Gt, h, 0.0), h, cast(c, DType::F16)));
  b.ret(transpose(t, 0, 1) - unary(OpKind::Erf, x));
  b.ret(binary(OpKind::Pow, cast(x, DType::I32), 3));
  return finish(b);
}

TEST(PointwiseNvptx, VerifiesCompilesAndAssemblesForSm80AndSm90a) {
  if (!have_ptxas()) std::printf("note: %s not found; ptxas checks skipped\n", SF_PTXAS_PATH);
  Graph g = mixed_group();
  for (const char* arch : {"sm_80", "sm_90a"}) {
    SCOPED_TRACE(arch);
    for (bool grid_stride : {true, false}) {
      KernelConfig cfg;
      cfg.grid_stride = grid_stride;
      Ptx p = emit_ptx(g, arch, cfg);
      EXPECT_NE(p.ptx.find(".entry pw_kernel("), std::string::npos);
      EXPECT_NE(p.ptx.find(".maxntid 256, 1, 1"), std::string::npos);
      EXPECT_EQ(p.ptx.find("__nv_"), std::string::npos) << "libdevice calls left in the PTX";
      EXPECT_EQ(p.ptx.find("call"), std::string::npos) << "the PTX still calls a function";
    }
  }
}

TEST(PointwiseNvptx, VectorisedF32UsesV4LoadsAndStores) {
  GraphBuilder b("vec");
  Value x = b.param("x", DType::F32, {1000003});
  Value y = b.param("y", DType::F32, {1000003});
  Value r = b.param("r", DType::F32, {1});  // broadcast: read by scalar loads
  b.ret(x * y + r);
  Graph g = finish(b);
  KernelConfig cfg;
  cfg.vector = 4;
  Ptx p = emit_ptx(g, "sm_90a", cfg);
  EXPECT_NE(p.ptx.find("ld.global.v4.f32"), std::string::npos) << p.ptx;
  EXPECT_NE(p.ptx.find("st.global.v4.f32"), std::string::npos) << p.ptx;
  // The tail (and misaligned pointers) fall back to scalar accesses.
  EXPECT_NE(p.ptx.find("ld.global.f32"), std::string::npos);
  // 1000003 / (256 * 4) tiles, rounded up.
  EXPECT_EQ(p.launch.grid[0], 977);
  EXPECT_EQ(p.launch.block[0], 256);

  cfg.vector = 1;
  p = emit_ptx(g, "sm_90a", cfg);
  EXPECT_EQ(p.ptx.find("ld.global.v4.f32"), std::string::npos);
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST(PointwiseNvptx, BroadcastRowsAreVectorLoadsTooTransposesAreNot) {
  GraphBuilder b("rows");
  Value x = b.param("x", DType::F32, {64, 1000});
  Value bias = b.param("bias", DType::F32, {1000});
  Value t = b.param("t", DType::F32, {1000, 64});
  b.ret(x + bias);
  b.ret(x * transpose(t, 0, 1));
  Graph g = finish(b);
  Ptx p = emit_ptx(g, "sm_90a");
  EXPECT_EQ(count(p.ptx, "ld.global.v4.f32"), 2u) << p.ptx;  // x and the bias row
  EXPECT_EQ(count(p.ptx, "st.global.v4.f32"), 2u);
  // A row of 1002 is not a multiple of 4: its runs may straddle rows, so scalar loads.
  GraphBuilder b2("rows2");
  Value x2 = b2.param("x", DType::F32, {64, 1002});
  b2.ret(x2 + b2.param("bias", DType::F32, {1002}));
  p = emit_ptx(finish(b2), "sm_90a");
  EXPECT_EQ(count(p.ptx, "ld.global.v4.f32"), 1u) << p.ptx;
}

// elems_per_thread vectors go in batches of up to 4 (the largest divisor): every
// load of the batch (x's 16 bytes a vector, and the bias row's) comes before its
// first store, so a thread has them all in flight; bf16 bias + GELU, the bench
// kernel's group. 6 vectors a thread: two batches of 3, in a loop. (Vectors a block
// apart may share bias columns, which LLVM then loads once, in pieces.)
TEST(PointwiseNvptx, VectorsGoInBatchesLoadsFirst) {
  GraphBuilder b("bias_gelu");
  Value x = b.param("x", DType::BF16, {64, 4096});
  Value bias = b.param("bias", DType::BF16, {4096});
  b.ret(gelu(x + bias));
  Graph g = decompose(finish(b));
  for (int ept : {1, 2, 4, 6}) {
    SCOPED_TRACE(ept);
    KernelConfig cfg;
    cfg.vector = 8;
    cfg.elems_per_thread = ept;
    Ptx p = emit_ptx(g, "sm_90a", cfg);
    const size_t first_store = p.ptx.find("st.global.v4");
    ASSERT_NE(first_store, std::string::npos) << p.ptx;
    const size_t batch = ept == 6 ? 3 : static_cast<size_t>(ept);
    const size_t last_store = p.ptx.rfind("st.global.v4");
    EXPECT_GE(count(p.ptx.substr(0, first_store), "ld.global.v4"), batch + 1) << "x for every vector, and the bias";
    EXPECT_EQ(count(p.ptx.substr(first_store, last_store - first_store), "ld.global"), 0u)
        << "a load between the batch's stores";
    EXPECT_EQ(count(p.ptx, "st.global.v4"), batch) << "one store a vector, in straight-line code";
  }
}

TEST(PointwiseNvptx, HalfVectorsAre128Bits) {
  GraphBuilder b("half");
  Value x = b.param("x", DType::F16, {4096});
  Value y = b.param("y", DType::BF16, {4096});
  b.ret(cast(cast(x, DType::F32) + cast(y, DType::F32), DType::F16));
  Graph g = finish(b);
  KernelConfig cfg;
  cfg.vector = 8;
  cfg.elems_per_thread = 2;
  Ptx p = emit_ptx(g, "sm_80", cfg);
  EXPECT_NE(p.ptx.find("ld.global.v4.b32"), std::string::npos) << p.ptx;
  EXPECT_NE(p.ptx.find("st.global.v4.b32"), std::string::npos) << p.ptx;
  EXPECT_NE(p.ptx.find("cvt.rn.f16.f32"), std::string::npos);
  // bf16 y comes as 32-bit words, each pair widened by a shift and a mask, with no
  // 16-bit lane extracted first.
  EXPECT_NE(p.ptx.find("ld.global.v4.u32"), std::string::npos) << p.ptx;
  EXPECT_EQ(p.ptx.find("cvt.u32.u16"), std::string::npos) << p.ptx;
  EXPECT_EQ(p.launch.grid[0], 1);  // 4096 / (256 * 8 * 2)
}

TEST(PointwiseNvptx, ExpIsInlinedFromLibdevice) {
  GraphBuilder b("exp");
  Value x = b.param("x", DType::F32, {1024});
  b.ret(exp(x));
  Graph g = finish(b);
  Ptx p = emit_ptx(g, "sm_90a");
  EXPECT_NE(p.ir.find("@__nv_expf"), std::string::npos);  // the emitter calls libdevice
  EXPECT_EQ(p.ptx.find("__nv_"), std::string::npos);     // which compile_to_ptx inlines
  EXPECT_NE(p.ptx.find("ex2.approx"), std::string::npos) << p.ptx;
}

TEST(PointwiseNvptx, IndexWidthFollowsTheElementCount) {
  auto make = [](int64_t n) {
    GraphBuilder b("w");
    Value x = b.param("x", DType::Bool, {n});
    b.ret(cast(x, DType::F16));
    return finish(b);
  };
  KernelConfig cfg;
  Result<EmittedKernel> small = emitter_for(KernelKind::Pointwise).emit(spec_of(make(1000)), cfg, llvmb::Target::nvptx("sm_90a"));
  ASSERT_TRUE(small.ok()) << small.error().str();
  EXPECT_NE(module_text(*small->module).find("phi i32"), std::string::npos);
  Ptx big = emit_ptx(make((int64_t{1} << 31) + 3), "sm_90a", cfg);
  EXPECT_NE(big.ir.find("phi i64"), std::string::npos);
  EXPECT_EQ(big.ir.find("phi i32"), std::string::npos);
  EXPECT_EQ(big.launch.grid[0], cfg.max_blocks);  // capped: the grid strides
}

// ---- errors --------------------------------------------------------------------------------

std::string emit_error(const Graph& g, const KernelConfig& cfg = {}, const llvmb::Target& t = llvmb::Target::host(),
                       const std::string& entry = "pw") {
  Result<EmittedKernel> k = emitter_for(KernelKind::Pointwise).emit(spec_of(g, entry), cfg, t);
  if (k.ok()) {
    ADD_FAILURE() << "expected a Diag";
    return "";
  }
  return k.error().message;
}

TEST(PointwiseErrors, UnsupportedGroupsAndConfigsAreDiags) {
  {
    GraphBuilder b("mm");
    Value a = b.param("a", DType::F32, {4, 8});
    Value w = b.param("w", DType::F32, {8, 4});
    b.ret(relu(matmul(a, w)));
    EXPECT_NE(emit_error(finish(b)).find("matmul"), std::string::npos);
  }
  {
    GraphBuilder b("composite");
    Value x = b.param("x", DType::F32, {4});
    b.ret(gelu(x));
    EXPECT_NE(emit_error(finish(b)).find("decomposed"), std::string::npos);
  }
  {
    GraphBuilder b("reduce");
    Value x = b.param("x", DType::F32, {4, 4});
    b.ret(sum(x, {1}));
    EXPECT_NE(emit_error(finish(b)).find("sum"), std::string::npos);
  }
  GraphBuilder b("counts");
  Value x = b.param("x", DType::F32, {4, 4});
  b.ret(x + 1.0);
  b.ret(b.param("y", DType::F32, {5}) * 2.0);
  EXPECT_NE(emit_error(finish(b)).find("element count"), std::string::npos);

  GraphBuilder ok("ok");
  ok.ret(ok.param("x", DType::F32, {16}) + 1.0);
  Graph g = finish(ok);
  KernelConfig cfg;
  cfg.vector = 3;
  EXPECT_NE(emit_error(g, cfg).find("vector"), std::string::npos);
  cfg = {};
  cfg.block = 2048;
  EXPECT_NE(emit_error(g, cfg).find("block"), std::string::npos);
  cfg = {};
  cfg.elems_per_thread = 0;
  EXPECT_NE(emit_error(g, cfg).find("elems_per_thread"), std::string::npos);
  EXPECT_NE(emit_error(g, {}, llvmb::Target::nvptx("compute_90")).find("arch"), std::string::npos);
  EXPECT_NE(emit_error(g, {}, llvmb::Target::host(), "not an identifier").find("C identifier"), std::string::npos);
}

TEST(EmitterRegistry, EveryKindHasANameAndItsOwnEmitter) {
  EXPECT_EQ(kernel_kind_name(KernelKind::Pointwise), "pointwise");
  EXPECT_EQ(kernel_kind_name(KernelKind::Reduction), "reduction");
  EXPECT_EQ(kernel_kind_name(KernelKind::Matmul), "matmul");
  const Emitter* p = &emitter_for(KernelKind::Pointwise);
  EXPECT_NE(p, &emitter_for(KernelKind::Reduction));
  EXPECT_NE(p, &emitter_for(KernelKind::Matmul));
  EXPECT_NE(&emitter_for(KernelKind::Reduction), &emitter_for(KernelKind::Matmul));
  EXPECT_EQ(p, &emitter_for(KernelKind::Pointwise));  // one instance per kind
}

// ---- timings -------------------------------------------------------------------------------

TEST(PointwiseTiming, TenOpChainEmitAndCompile) {
  GraphBuilder b("chain10");
  Value x = b.param("x", DType::F32, {1 << 20});
  Value y = b.param("y", DType::BF16, {1 << 20});
  Value v = exp(x) * y;                   // exp, mul
  v = sigmoid(tanh(v) + 1.0) * x;         // tanh, add, sigmoid, mul
  v = relu(maximum(v, y)) / unary(OpKind::Abs, x);  // maximum, relu, abs, div: 10 ops
  b.ret(v);
  Graph g = finish(b);
  using clock = std::chrono::steady_clock;
  auto ms = [](clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); };

  auto t0 = clock::now();
  Result<EmittedKernel> host = emit_pointwise(spec_of(g, "chain_host"), {}, llvmb::Target::host());
  auto t1 = clock::now();
  ASSERT_TRUE(host.ok()) << host.error().str();
  Result<void*> fn = jit().add(std::move(host->module), std::move(host->context), host->entry);
  auto t2 = clock::now();
  ASSERT_TRUE(fn.ok()) << fn.error().str();

  auto t3 = clock::now();
  Result<EmittedKernel> gpu = emit_pointwise(spec_of(g, "chain_gpu"), {}, llvmb::Target::nvptx("sm_90a"));
  auto t4 = clock::now();
  ASSERT_TRUE(gpu.ok()) << gpu.error().str();
  Result<std::string> ptx = llvmb::compile_to_ptx(*gpu->module, "sm_90a");
  auto t5 = clock::now();
  ASSERT_TRUE(ptx.ok()) << ptx.error().str();
  std::printf("10-op chain: host emit %.2f ms, JIT compile %.2f ms; NVPTX emit %.2f ms, compile_to_ptx %.2f ms\n",
              ms(t1 - t0), ms(t2 - t1), ms(t4 - t3), ms(t5 - t4));
  RecordProperty("host_emit_ms", std::to_string(ms(t1 - t0)));
  RecordProperty("host_compile_ms", std::to_string(ms(t2 - t1)));
  RecordProperty("ptx_emit_ms", std::to_string(ms(t4 - t3)));
  RecordProperty("ptx_compile_ms", std::to_string(ms(t5 - t4)));
  expect_matches_reference(g, make_inputs(g, 17, {Fill::Small, Fill::Small}));
}

}  // namespace kernels_pointwise_test
}  // namespace sf
