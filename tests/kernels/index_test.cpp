// gather and index_select read inside the kernels that use them (a pointwise kernel,
// a reduction's prologue), scatter_add's decomposition as one reduction kernel, and
// embedding's offset, against the reference evaluator on the host (out-of-range
// indices included: they read 0 and load nothing outside the operand); the same kernels
// for NVPTX through ptxas; and whole sharded programs on generated host kernels,
// vocabulary-parallel lookups over uneven and empty row chunks among them.
#include <gtest/gtest.h>

#include "tests/kernels/kernel_test_util.h"

#include <limits>
#include <random>
#include <string>
#include <vector>

#include "codegen/ir/builder.h"
#include "codegen/ir/decompose.h"
#include "codegen/ir/parser.h"
#include "codegen/reference/compare.h"
#include "codegen/reference/evaluate.h"
#include "tests/kernels/host_program_check.h"

namespace sf {
namespace kernels_index_test {

using kernel_test::finish;

constexpr int64_t kMin = std::numeric_limits<int64_t>::min();

// Floats in [-1, 1); integers (indices) in [-2, bound + 2): some out of range on both sides.
std::vector<Tensor> inputs_of(const Graph& g, uint64_t seed, int64_t bound) {
  std::vector<Tensor> in;
  std::mt19937_64 rng(seed);
  for (ValueId p : g.params()) {
    const TensorType& t = g.node(p).type;
    Tensor x(t.dtype, t.shape);
    for (int64_t i = 0; i < x.numel(); ++i) {
      const uint64_t r = rng();
      if (is_float(t.dtype)) x.set(i, -1.0 + 2.0 * static_cast<double>(r >> 11) * 0x1p-53);
      else x.set_int(i, static_cast<int64_t>(r % static_cast<uint64_t>(bound + 4)) - 2);
    }
    if (!is_float(t.dtype) && x.numel() > 0) x.set_int(0, kMin);
    in.push_back(std::move(x));
  }
  return in;
}

void expect_matches(KernelKind kind, const Graph& g, const std::vector<Tensor>& in, const Graph* want_of = nullptr) {
  Result<std::vector<Tensor>> want = evaluate(want_of ? *want_of : g, in);
  ASSERT_TRUE(want.ok()) << want.error().str();
  Result<std::vector<Tensor>> got =
      kernel_test::run_emitted(emitter_for(kind).emit(KernelSpec{"idx", kind, g}, {}, llvmb::Target::host()), g, in);
  ASSERT_TRUE(got.ok()) << got.error().str();
  ASSERT_EQ(got->size(), want->size());
  for (size_t o = 0; o < want->size(); ++o) {
    Comparison c = compare((*got)[o], (*want)[o], default_tolerance((*want)[o].dtype()));
    EXPECT_TRUE(c.ok()) << g.name() << " output " << o << ": " << c.mismatches << " mismatch(es), first at "
                        << c.first_mismatch << ": got " << (*got)[o].get(c.first_mismatch) << ", want "
                        << (*want)[o].get(c.first_mismatch);
  }
}

// Four outputs of 42 elements each (one index space).
Graph pointwise_lookups(DType dt, DType it) {
  GraphBuilder b("lookups");
  Value x = b.param("x", dt, {6, 7});
  Value i = b.param("i", it, {6, 7});
  Value j = b.param("j", it, {6});
  Value k = b.param("k", it, {7});
  b.ret(gather(exp(x), i, 1) * b.constant(2.0));            // x computed at the row the index names
  b.ret(index_select(x, j, 0));                              // whole rows
  b.ret(index_select(transpose(x, 0, 1), j, -1));            // through a view
  b.ret(b.op(OpKind::IndexSelect, {x, k}, {AttrValue(int64_t{1})}, {{"offset", AttrValue(int64_t{3})}}));
  return finish(b);
}

TEST(IndexPointwise, GatherAndIndexSelectInOneKernelWithOutOfRangeIndices) {
  for (DType dt : {DType::F32, DType::BF16, DType::I64})
    for (DType it : {DType::I32, DType::I64}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " " + std::string(dtype_name(it)));
      if (dt == DType::I64) {
        GraphBuilder b("int_lookups");
        b.ret(gather(b.param("x", dt, {5, 7}), b.param("i", it, {2, 7}), 0));
        Graph g = finish(b);
        expect_matches(KernelKind::Pointwise, g, inputs_of(g, 3, 5));
        continue;
      }
      Graph g = pointwise_lookups(dt, it);
      expect_matches(KernelKind::Pointwise, g, inputs_of(g, 7, 7));
    }
}

TEST(IndexPointwise, AnEmptyIndexedDimReadsNothing) {
  GraphBuilder b("empty_dim");
  b.ret(index_select(b.param("x", DType::F32, {0, 3}), b.param("i", DType::I64, {4}), 0));
  Graph g = finish(b);
  expect_matches(KernelKind::Pointwise, g, inputs_of(g, 1, 2));
}

TEST(IndexReduction, LookupInThePrologueAndScatterAddAsOneReduction) {
  GraphBuilder b("rowsum");
  b.ret(sum(index_select(b.param("x", DType::F32, {6, 9}), b.param("i", DType::I64, {5}), 0), {1}));
  Graph g = finish(b);
  expect_matches(KernelKind::Reduction, g, inputs_of(g, 11, 6));
  for (DType dt : {DType::F32, DType::BF16, DType::I32}) {
    SCOPED_TRACE(std::string(dtype_name(dt)));
    GraphBuilder s("scatter");
    s.ret(scatter_add(s.param("x", dt, {5, 4}), s.param("i", DType::I64, {7, 4}), s.param("s", dt, {7, 4}), 0));
    Graph composite = finish(s);
    Graph d = decompose(composite);
    expect_matches(KernelKind::Reduction, d, inputs_of(d, 13, 5), &composite);
  }
}

TEST(IndexEmbedding, OffsetAndAnEmptyTableChunk) {
  for (int64_t rows : {3, 0}) {
    SCOPED_TRACE("rows " + std::to_string(rows));
    GraphBuilder b("emb");
    b.ret(b.op(OpKind::Embedding, {b.param("i", DType::I64, {2, 5}), b.param("w", DType::F32, {rows, 4})}, {},
               {{"offset", AttrValue(int64_t{2})}}));
    Graph g = finish(b);
    expect_matches(KernelKind::Gather, g, inputs_of(g, 17, 5));
  }
}

TEST(IndexNvptx, KernelsAssemble) {
  Graph pw = pointwise_lookups(DType::BF16, DType::I32);
  GraphBuilder s("scatter");
  s.ret(scatter_add(s.param("x", DType::F32, {5, 4}), s.param("i", DType::I64, {7, 4}), s.param("s", DType::F32, {7, 4}), -2));
  Graph red = decompose(finish(s));
  GraphBuilder e("emb");
  e.ret(e.op(OpKind::Embedding, {e.param("i", DType::I32, {2, 5}), e.param("w", DType::BF16, {3, 4})}, {},
             {{"offset", AttrValue(int64_t{2})}}));
  Graph emb = finish(e);
  const std::pair<KernelKind, const Graph*> kernels[] = {
      {KernelKind::Pointwise, &pw}, {KernelKind::Reduction, &red}, {KernelKind::Gather, &emb}};
  for (const char* arch : {"sm_80", "sm_90a"})
    for (const auto& [kind, g] : kernels) {
      SCOPED_TRACE(std::string(arch) + " " + g->name());
      Result<std::string> ptx = kernel_test::ptx_of(kind, *g, arch);
      ASSERT_TRUE(ptx.ok()) << ptx.error().str();
      EXPECT_EQ(ptx->find("atom"), std::string::npos) << "scatter_add is deterministic: no atomics";
      if (kernel_test::have_ptxas()) {
        EXPECT_EQ(kernel_test::ptxas_failure(*ptx, arch), "");
      }
    }
}

// ---- whole programs -------------------------------------------------------------------------

TEST(IndexPrograms, ShardedLookupsAndVocabularyParallelTables) {
  const char* texts[] = {
      // The vocabulary-parallel embedding: 11 rows on 4 ranks (3, 3, 3, 2), and on
      // 4 x 1 ranks of 3 rows (1, 1, 1, 0: an empty chunk).
      "mesh tp=4\ngraph g(i: i64[3, 2], w: f32[11, 6] {tp: S(0)}) {\n  y = embedding(i, w)\n  return y\n}\n",
      "mesh tp=4\ngraph g(i: i32[5], w: f32[3, 6] {tp: S(0)}) {\n  y = index_select(w, i, dim=0)\n  return y\n}\n",
      // gather fused with its producer and consumer on row shards; scatter_add on column shards.
      "mesh tp=3\ngraph g(x: f32[7, 5] {tp: S(0)}, i: i64[7, 4] {tp: S(0)}) {\n"
      "  y = mul(gather(exp(x), i, dim=1), 2.0)\n  return y\n}\n",
      "mesh dp=2 tp=2\ngraph g(x: f32[5, 6] {tp: S(1)}, i: i64[3, 6] {tp: S(1)}, s: f32[3, 6] {tp: S(1)}) {\n"
      "  y = scatter_add(x, i, s, dim=0)\n  return y\n}\n",
  };
  uint64_t seed = 90;
  for (const char* text : texts) {
    Result<Graph> g = parse_graph(text, "g.sf");
    ASSERT_TRUE(g.ok()) << g.error().str();
    kernel_test::check_on_host_kernels(*g, seed++, text);
  }
}

}  // namespace kernels_index_test
}  // namespace sf
