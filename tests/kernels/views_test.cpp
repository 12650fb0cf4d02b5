// slice and concat as views folded into the element code: index maps with offsets,
// concat's select between clamped reads, host kernels against the reference with
// every input ending at a PROT_NONE page (a read past an operand faults), the NVPTX
// pointwise kernel run thread by thread on the host, PTX through ptxas, and RoPE
// fused into one pointwise kernel.
#include <gtest/gtest.h>

#include "tests/result_util.h"
#include "tests/kernels/kernel_test_util.h"
#include "tests/kernels/host_program_check.h"

#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "codegen/dist/propagate.h"
#include "codegen/fusion/pipeline.h"
#include "codegen/ir/builder.h"
#include "codegen/ir/parser.h"
#include "codegen/kernels/element.h"
#include "codegen/kernels/pointwise.h"
#include "codegen/reference/compare.h"
#include "codegen/reference/evaluate.h"

namespace sf {
namespace kernels_views_test {

using kernel_test::finish;
using kernel_test::jit;

// Runs an emitted kernel on guarded copies of `inputs` (ArgArray): `call(fn, args)`
// calls it (once for a host kernel, per thread for a simulated GPU kernel).
Result<std::vector<Tensor>> run_guarded(Result<EmittedKernel> k, const Graph& g, const std::vector<Tensor>& inputs,
                                        const std::function<void(void*, void**)>& call) {
  if (!k) return k.error();
  Result<void*> fn = jit().add(std::move(k->module), std::move(k->context), k->entry);
  if (!fn) return fn.error();
  std::vector<Tensor> out = kernel_test::output_tensors(g);
  kernel_test::ArgArray args = kernel_test::arg_array(inputs, out);
  call(*fn, args.data());
  return out;
}

KernelSpec spec_of(const Graph& g, KernelKind kind = KernelKind::Pointwise) { return KernelSpec{"views", kind, g}; }

Result<std::vector<Tensor>> run_host(const Graph& g, const std::vector<Tensor>& in, KernelKind kind) {
  return run_guarded(emitter_for(kind).emit(spec_of(g, kind), KernelConfig{}, llvmb::Target::host()), g, in,
                     [](void* fn, void** args) { reinterpret_cast<void (*)(void**)>(fn)(args); });
}

// Every thread of the NVPTX pointwise kernel's launch, built for the host.
Result<std::vector<Tensor>> run_grid(const Graph& g, const std::vector<Tensor>& in, const KernelConfig& cfg) {
  const LaunchShape launch = pointwise_launch(numel(g.node(g.outputs()[0].value).type.shape), cfg);
  return run_guarded(emit_pointwise_thread_on_host(spec_of(g), cfg), g, in, [&](void* fn, void** args) {
    auto run = reinterpret_cast<void (*)(void**, int32_t, int32_t, int32_t)>(fn);
    auto grid = static_cast<int32_t>(launch.grid[0]);
    for (int32_t b = 0; b < grid; ++b)
      for (int32_t t = 0; t < launch.block[0]; ++t) run(args, b, t, grid);
  });
}

void expect_same(const Graph& g, const std::vector<Tensor>& in, const Result<std::vector<Tensor>>& got) {
  Result<std::vector<Tensor>> want = evaluate(g, in);
  ASSERT_TRUE(want.ok()) << want.error().str();
  ASSERT_TRUE(got.ok()) << got.error().str();
  ASSERT_EQ(got->size(), want->size());
  for (size_t o = 0; o < want->size(); ++o) {
    Comparison c = compare(got.value()[o], (*want)[o], default_tolerance((*want)[o].dtype()));
    EXPECT_TRUE(c.ok()) << "output " << o << " " << (*want)[o].type().str() << ": " << c.mismatches
                        << " mismatch(es), first at " << c.first_mismatch;
  }
}

void expect_host_matches(const Graph& g, uint64_t seed, KernelKind kind = KernelKind::Pointwise) {
  std::vector<Tensor> in = random_inputs(g, seed);
  expect_same(g, in, run_host(g, in, kind));
}

// One group per case: params x: f32[6, 10], y: f32[1, 10], z: i64[6, 4], e: f32[6, 0].
void check(const char* what, const std::function<void(GraphBuilder&, Value, Value, Value, Value)>& body) {
  SCOPED_TRACE(what);
  GraphBuilder b("views");
  Value x = b.param("x", DType::F32, {6, 10});
  Value y = b.param("y", DType::F32, {1, 10});
  Value z = b.param("z", DType::I64, {6, 4});
  Value e = b.param("e", DType::F32, {6, 0});
  try {
    body(b, x, y, z, e);
  } catch (const DiagError& d) {
    FAIL() << "bad test graph: " << d.diag.str();
  }
  expect_host_matches(finish(b), 7);
}

constexpr int64_t kEnd = std::numeric_limits<int64_t>::max();

// ---- index maps -------------------------------------------------------------------------

TEST(ViewIndex, ASliceIsOneStridedStepWithAnOffset) {
  GraphBuilder b("idx");
  Value x = b.param("x", DType::F32, {4, 10});
  Value s = slice(x, 1, 2, 9, 3);  // columns 2, 5, 8
  Value t = transpose(s, 0, 1);    // [3, 4]
  Value r = slice(x, 0, 1);        // rows 1..3: one dense run from element 10
  b.ret(t);
  b.ret(r);
  Graph g = finish(b);
  const Node& tn = g.node(g.outputs()[0].value);
  const Node& sn = g.node(tn.inputs[0]);
  auto via_t = kernels::operand_index(tn, kernels::dense_index(tn.type.shape), sn.type.shape);
  ASSERT_TRUE(via_t);
  auto via_s = kernels::operand_index(sn, *via_t, {4, 10});
  ASSERT_TRUE(via_s);
  // The transpose of the slice: one step over [3, 4], strides (3, 10), from element 2.
  EXPECT_EQ(kernels::offset_map(*via_s, {4, 10}).str(), "[3, 4]:[3, 10]+2");
  const Node& rn = g.node(g.outputs()[1].value);
  auto rows = kernels::operand_index(rn, kernels::dense_index(rn.type.shape), {4, 10});
  ASSERT_TRUE(rows);
  kernels::IndexMap m = kernels::offset_map(*rows, {4, 10});
  EXPECT_EQ(m.str(), "[30]:[1]+10");
  EXPECT_FALSE(m.contiguous());
  EXPECT_TRUE(kernels::dense_runs(m, 2));   // runs of 2 start at even offsets
  EXPECT_FALSE(kernels::dense_runs(m, 4));  // 10 is not a multiple of 4
  EXPECT_EQ(kernels::largest_value(g), 40);
}

TEST(ViewIndex, AConcatsOperandsAreReadAtAComputedIndexNeverInDenseRuns) {
  GraphBuilder b("idx");
  Value x = b.param("x", DType::F32, {4, 8});
  b.ret(concat({x, x}, 1));
  Graph g = finish(b);
  const Node& c = g.node(g.outputs()[0].value);
  auto xi = kernels::operand_index(c, kernels::dense_index(c.type.shape), {4, 8});
  ASSERT_TRUE(xi);
  kernels::IndexMap m = kernels::offset_map(*xi, {4, 8});
  EXPECT_EQ(m.base, kernels::kComputedIndex);
  EXPECT_FALSE(m.contiguous());
  EXPECT_FALSE(kernels::dense_runs(m, 1));
  EXPECT_EQ(m.str(), "@-1");
}

// ---- host kernels -------------------------------------------------------------------------

TEST(ViewsHost, SlicesReadTheirOperandAtAnOffset) {
  check("slice with a step", [](GraphBuilder& b, Value x, Value, Value, Value) { b.ret(exp(slice(x, 1, 2, 9, 3))); });
  check("negative bounds", [](GraphBuilder& b, Value x, Value, Value, Value) { b.ret(slice(x, -1, -4, -1) * 2.0); });
  check("rows", [](GraphBuilder& b, Value x, Value, Value, Value) { b.ret(slice(x, 0, 4) + 1.0); });
  check("of a transpose", [](GraphBuilder& b, Value x, Value, Value, Value) {
    b.ret(slice(transpose(x, 0, 1), 0, 1, -1, 2));
  });
  check("transposed", [](GraphBuilder& b, Value x, Value, Value, Value) { b.ret(transpose(slice(x, 1, 3, 8), 0, 1)); });
  check("reshaped (a second step)", [](GraphBuilder& b, Value x, Value, Value, Value) {
    b.ret(reshape(slice(x, 1, 1, 9), {4, 12}));
  });
  check("of a reshape", [](GraphBuilder& b, Value x, Value, Value, Value) { b.ret(slice(reshape(x, {60}), 0, 7, 50, 4)); });
  check("of a slice", [](GraphBuilder& b, Value x, Value, Value, Value) {
    b.ret(slice(slice(x, 1, 1, kEnd, 2), 1, 1, 4, 2));  // columns 3 and 7
  });
  check("of a broadcast", [](GraphBuilder& b, Value x, Value y, Value, Value) { b.ret(slice(x + y, 1, 5)); });
  check("of an expand", [](GraphBuilder& b, Value, Value y, Value, Value) {
    b.ret(slice(expand(y, {6, 10}), 0, 2, 5) * 3.0);
  });
  check("beside a dense read", [](GraphBuilder& b, Value x, Value, Value, Value) {
    b.ret(slice(x, 1, 0, 5) - slice(x, 1, 5));  // the two halves of each row
  });
  check("integers", [](GraphBuilder& b, Value, Value, Value z, Value) { b.ret(slice(z, 1, 1, 3) * 3); });
  check("empty", [](GraphBuilder& b, Value x, Value, Value, Value) { b.ret(exp(slice(x, 1, 7, 3))); });
  check("whole", [](GraphBuilder& b, Value x, Value, Value, Value) { b.ret(slice(x, 0, -100, 100)); });
  check("huge steps", [](GraphBuilder& b, Value x, Value, Value, Value) {
    b.ret(slice(slice(x, 1, 1, kEnd, kEnd), 1, 0, kEnd, 3) + slice(slice(x, 0, 1, kEnd, 2), 0, 1, kEnd, kEnd));
  });
  check("an empty slice of a huge step's", [](GraphBuilder& b, Value x, Value, Value, Value) {
    b.ret(exp(slice(slice(x, 1, 0, kEnd, kEnd), 1, 1)));  // shifted past the one column: no read
  });
}

TEST(ViewsHost, ConcatSelectsItsOperandsWithoutReadingPastAny) {
  check("two operands", [](GraphBuilder& b, Value x, Value, Value, Value) {
    b.ret(concat({exp(x), slice(x, 1, 0, 3)}, 1));
  });
  check("three along the rows", [](GraphBuilder& b, Value x, Value y, Value, Value) {
    b.ret(concat({slice(x, 0, 0, 2), y, -x}, 0) + 1.0);
  });
  check("an empty operand", [](GraphBuilder& b, Value x, Value, Value, Value e) { b.ret(concat({x, e, -x}, -1)); });
  check("only empty operands", [](GraphBuilder& b, Value, Value, Value, Value e) { b.ret(concat({e, e}, 1)); });
  check("of concats", [](GraphBuilder& b, Value x, Value y, Value, Value) {
    Value row = slice(x, 0, 1, 2);
    b.ret(concat({concat({y, y}, 1), concat({row, -row}, 1), concat({slice(x, 1, 0, 10), slice(x, 1, 0, 10)}, 1)}, 0));
  });
  check("sliced", [](GraphBuilder& b, Value x, Value, Value, Value) { b.ret(slice(concat({x, -x}, 1), 1, 7, 15, 2)); });
  check("transposed operands", [](GraphBuilder& b, Value x, Value, Value, Value) {
    b.ret(concat({transpose(x, 0, 1), transpose(slice(x, 0, 0, 6), 0, 1)}, 0));
  });
  check("broadcast into a sum", [](GraphBuilder& b, Value x, Value y, Value, Value) {
    b.ret(concat({x, x}, 1) + concat({y, y}, 1));
  });
  check("integers and bools", [](GraphBuilder& b, Value x, Value, Value z, Value) {
    b.ret(concat({z, z * 2}, 1));
    b.ret(concat({binary(OpKind::Gt, slice(x, 1, 0, 4), 0.0), binary(OpKind::Lt, slice(x, 1, 4, 8), 0.0)}, 1));
  });
  check("half", [](GraphBuilder& b, Value x, Value, Value, Value) {
    Value h = cast(x, DType::F16);
    b.ret(concat({slice(h, 1, 5), exp(slice(h, 1, 0, 5))}, 1));
  });
}

// RoPE's rotate_half in the form the issue gives it: cat(-x2, x1) * cos + x * sin.
Graph rope_group(const Shape& x_shape, DType dt = DType::F32) {
  GraphBuilder b("rope");
  const int64_t d = x_shape.back(), h = d / 2;
  Value x = b.param("x", dt, x_shape);
  Value cos = b.param("cos", dt, {x_shape[x_shape.size() - 2], d});
  Value sin = b.param("sin", dt, {x_shape[x_shape.size() - 2], d});
  b.ret(concat({-slice(x, -1, h, 2 * h), slice(x, -1, 0, h)}, -1) * cos + x * sin);
  return finish(b);
}

TEST(ViewsHost, RotateHalf) {
  expect_host_matches(rope_group({2, 3, 5, 8}), 11);
  expect_host_matches(rope_group({3, 7, 6}, DType::BF16), 12);
}

TEST(ViewsHost, ReductionProloguesSliceAndConcat) {
  GraphBuilder b("red");
  Value x = b.param("x", DType::F32, {5, 12});
  Value y = b.param("y", DType::F32, {5, 3});
  Value c = concat({exp(slice(x, 1, 1, 12, 2)), y}, 1);  // [5, 9]
  Value m = kernel_test::reduce(OpKind::Max, c, {1}, true);
  b.ret(kernel_test::reduce(OpKind::Sum, c - m, {1}, false));
  b.ret(c - m);
  expect_host_matches(finish(b), 13, KernelKind::Reduction);
}

// ---- the NVPTX kernel, thread by thread on the host -----------------------------------------

TEST(ViewsGrid, TheGpuKernelsThreadsMatchTheReference) {
  std::vector<Graph> groups;
  groups.push_back(rope_group({4, 9, 16}));  // dense x and cos/sin rows: vector loads beside the concat
  {
    GraphBuilder b("cat");
    Value x = b.param("x", DType::F32, {37, 12});
    Value y = b.param("y", DType::I64, {37, 5});
    b.ret(concat({slice(x, 1, 4), cast(y, DType::F32), slice(x, 1, 0, 4)}, 1));
    groups.push_back(finish(b));
  }
  {
    GraphBuilder b("aligned");  // from element 8 of rows of 16: 4-wide vector loads at an offset
    Value x = b.param("x", DType::F32, {37, 16});
    b.ret(slice(x, 1, 8) * 2.0 + slice(x, 1, 4, 12));
    groups.push_back(finish(b));
  }
  {
    GraphBuilder b("strided");
    Value x = b.param("x", DType::F32, {37, 12});
    b.ret(slice(x, 1, 0, 12, 2) + slice(x, 1, 1, 12, 2) + slice(x, 1, 6));
    groups.push_back(finish(b));
  }
  for (const Graph& g : groups) {
    std::vector<Tensor> in = random_inputs(g, 17);
    for (auto [block, vector, ept, stride] : {std::tuple{64, 4, 2, true}, {32, 1, 1, false}, {96, 2, 3, true}}) {
      KernelConfig cfg;
      cfg.block = block;
      cfg.vector = vector;
      cfg.elems_per_thread = ept;
      cfg.grid_stride = stride;
      cfg.max_blocks = 3;
      SCOPED_TRACE(g.name() + " block " + std::to_string(block) + " vector " + std::to_string(vector));
      expect_same(g, in, run_grid(g, in, cfg));
    }
  }
}

// ---- PTX ---------------------------------------------------------------------------------

std::string ptx_of(const Graph& g, const std::string& arch, KernelKind kind = KernelKind::Pointwise) {
  Result<EmittedKernel> k = emitter_for(kind).emit(spec_of(g, kind), KernelConfig{}, llvmb::Target::nvptx(arch));
  if (!k) {
    ADD_FAILURE() << k.error().str();
    return "";
  }
  std::optional<std::string> bad = llvmb::verify(*k->module);
  EXPECT_FALSE(bad) << *bad;
  Result<std::string> ptx = llvmb::compile_to_ptx(*k->module, arch);
  if (!ptx) {
    ADD_FAILURE() << ptx.error().str();
    return "";
  }
  if (kernel_test::have_ptxas()) {
    EXPECT_EQ(kernel_test::ptxas_failure(*ptx, arch), "") << *ptx;
  }
  return *ptx;
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST(ViewsNvptx, SliceAndConcatKernelsAssemble) {
  if (!kernel_test::have_ptxas()) std::printf("note: ptxas not found; ptxas checks skipped\n");
  Graph rope = rope_group({8, 32, 64});
  GraphBuilder b("red");
  Value x = b.param("x", DType::BF16, {64, 96});
  Value c = cast(concat({slice(x, 1, 32), slice(x, 1, 0, 32)}, 1), DType::F32);
  b.ret(kernel_test::reduce(OpKind::Sum, c * c, {1}, false));
  Graph red = finish(b);
  for (const char* arch : {"sm_80", "sm_90a"}) {
    SCOPED_TRACE(arch);
    std::string p = ptx_of(rope, arch);
    // x and cos/sin are dense: 128-bit loads; the concat's reads are clamped scalar ones.
    EXPECT_GE(count(p, "ld.global.v4.f32"), 3u) << p;
    EXPECT_NE(p.find("min.u32"), std::string::npos) << p;
    EXPECT_EQ(p.find("call"), std::string::npos);
    ptx_of(red, arch, KernelKind::Reduction);
  }
  // A slice whose rows and start are multiples of the vector is still read in vectors.
  GraphBuilder s("rows");
  Value y = s.param("y", DType::F32, {64, 1000});
  s.ret(slice(y, 1, 4) + 1.0);  // [64, 996] from element 4
  std::string p = ptx_of(finish(s), "sm_90a");
  EXPECT_EQ(count(p, "ld.global.v4.f32"), 1u) << p;
  // From element 2 the runs of 4 are not 16-byte aligned: scalar loads.
  GraphBuilder m("misaligned");
  Value z = m.param("z", DType::F32, {64, 1000});
  m.ret(slice(z, 1, 2, 998) + 1.0);
  p = ptx_of(finish(m), "sm_90a");
  EXPECT_EQ(count(p, "ld.global.v4.f32"), 0u) << p;
  EXPECT_NE(p.find("st.global.v4.f32"), std::string::npos);  // the output is still written in vectors
}

TEST(ViewsNvptx, TheIndexWidthCountsASlicesLargerOperand) {
  // 2^31 + 8 elements read through a slice that keeps 8 of them: the offsets need i64.
  GraphBuilder b("wide");
  Value x = b.param("x", DType::Bool, {(int64_t{1} << 31) + 8});
  b.ret(cast(slice(x, 0, -8), DType::F16));
  Graph g = finish(b);
  Result<EmittedKernel> k = emitter_for(KernelKind::Pointwise).emit(spec_of(g), KernelConfig{}, llvmb::Target::nvptx("sm_90a"));
  ASSERT_TRUE(k.ok()) << k.error().str();
  std::string ir = kernel_test::module_text(*k->module);
  EXPECT_NE(ir.find("phi i64"), std::string::npos);
  EXPECT_EQ(ir.find("phi i32"), std::string::npos);
}

// ---- RoPE through fusion --------------------------------------------------------------------

TEST(ViewsFusion, RopeIsOnePointwiseKernelThatMatchesTheReference) {
  const char* text = R"(graph rope(x: f32[2, 4, 6, 8], cos: f32[6, 8], sin: f32[6, 8]) {
  x1 = slice(x, dim=-1, start=0, end=4)
  x2 = slice(x, dim=-1, start=4, end=8)
  y = add(mul(concat(neg(x2), x1, dim=-1), cos), mul(x, sin))
  return y
}
)";
  Result<Graph> g = parse_graph(text, "rope.sf");
  ASSERT_TRUE(g.ok()) << g.error().str();
  DeviceMesh mesh(g->mesh());
  std::vector<LocalProgram> ps = ok_value(rank_programs(*g, propagate(*g, mesh), mesh));
  ASSERT_EQ(ps[0].kernels.size(), 1u);
  const LocalKernel& k = ps[0].kernels[0];
  EXPECT_EQ(k.kind, KernelKind::Pointwise);
  EXPECT_EQ(k.ops, (std::vector<std::string>{"slice", "slice", "neg", "concat", "mul", "mul", "add"}));
  EXPECT_EQ(k.bytes_read, (2 * 4 * 6 * 8 + 2 * 6 * 8) * 4);  // x once, cos and sin: no copy in between
  std::vector<Tensor> in = random_inputs(*g, 19);
  Result<std::vector<Tensor>> want = evaluate(*g, in);
  ASSERT_TRUE(want.ok()) << want.error().str();
  Result<std::vector<Tensor>> got = run_host(k.group, in, KernelKind::Pointwise);
  ASSERT_TRUE(got.ok()) << got.error().str();
  Comparison c = compare((*got)[0], (*want)[0], default_tolerance(DType::F32));
  EXPECT_TRUE(c.ok()) << c.mismatches << " mismatch(es)";
}

// A transposed weight shard all-gathered (RowwiseParallel's weight gathered instead
// of the product reduce-scattered, or FSDP's transposed shard): the gather takes the
// untransposed shard along the dim that becomes the gathered one, and the transpose
// stays a view the matmul reads in place, not a copy kernel before the collective.
// Uneven shards (10 rows over 3 ranks) and the whole program against the reference.
TEST(ViewsFusion, ATransposeBeforeAnAllGatherMovesAfterIt) {
  Result<Graph> g = parse_graph(R"(mesh tp=3
graph g(x: f32[4, 10], w: f32[6, 10] {tp: S(1)}) {
  wt = redistribute(transpose(w, 0, 1), {tp: R})
  y = matmul(x, wt)
  return y
}
)",
                                "gather.sf");
  ASSERT_TRUE(g.ok()) << g.error().str();
  std::vector<LocalProgram> ps = kernel_test::check_on_host_kernels(*g, 23, "transpose before all_gather");
  ASSERT_EQ(ps.size(), 3u);
  for (const LocalProgram& p : ps) {
    int gathers = 0;
    for (const LocalStep& s : p.steps)
      if (s.kind == LocalStep::Kind::Start && s.collective == CollectiveKind::AllGather) {
        ++gathers;
        EXPECT_EQ(s.dim, 1) << "w's own dim 1, the transpose's dim 0";
        EXPECT_EQ(p.names[static_cast<size_t>(s.in[0])], "w");
      }
    EXPECT_EQ(gathers, 1);
    ASSERT_EQ(p.kernels.size(), 1u) << "no copy kernel before the gather";
    EXPECT_EQ(p.kernels[0].kind, KernelKind::Matmul);
    EXPECT_EQ(p.kernels[0].ops, (std::vector<std::string>{"transpose", "matmul"}));
  }
}

}  // namespace kernels_views_test
}  // namespace sf
