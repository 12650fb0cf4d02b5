#include "codegen/kernels/extern_gemm.h"

#include <memory>
#include <optional>

#include "codegen/ir/builder.h"
#include "codegen/ir/decompose.h"
#include "codegen/kernels/host_runner.h"
#include "codegen/kernels/matmul_group.h"
#include "runtime/cublas.h"
#include "runtime/cuda_runner.h"

namespace sf {

namespace {

Diag cannot(const std::string& why) { return Diag{"", {}, "cuBLASLt cannot express it: " + why}; }

// A matrix of `rows` x `cols` read at element strides (sr, sc), as a stored
// row-major matrix: itself (trans = false, rows `ld` apart) when its rows are
// contiguous, or its transpose (trans = true) when its columns are. A dim of extent
// 1 has no stride to speak of, and takes the other dim's extent as its leading dim.
struct Stored {
  bool trans = false;
  int64_t ld = 0;
};
std::optional<Stored> stored(int64_t rows, int64_t cols, int64_t sr, int64_t sc) {
  if (sc == 1 || cols == 1) {
    const int64_t ld = rows == 1 ? cols : sr;
    if (ld >= cols) return Stored{false, ld};
  }
  if (sr == 1 || rows == 1) {
    const int64_t ld = cols == 1 ? rows : sc;
    if (ld >= rows) return Stored{true, ld};
  }
  return std::nullopt;
}

// One batch stride S with offset(z) = z * S for the flat batch index z over
// `batch` (C order), given each batch dim's stride (0: broadcast); nullopt when the
// dims do not collapse so (one dim broadcast and another not, or a gap).
std::optional<int64_t> batch_stride(const Shape& batch, const std::vector<int64_t>& strides) {
  std::optional<int64_t> s;
  int64_t inner = 1;
  for (size_t e = batch.size(); e-- > 0;) {
    if (batch[e] == 1) continue;  // its coordinate is always 0
    if (!s) s = strides[e];       // the innermost dim that counts: inner is 1 here
    int64_t want = 0;
    if (__builtin_mul_overflow(*s, inner, &want) || strides[e] != want) return std::nullopt;
    inner *= batch[e];
  }
  return s.value_or(0);
}

// Whether the group computes `gv` as the decomposition (codegen/ir/decompose.h) of
// `act` applied to one value, and if so that value. The reference is built by the
// decomposition itself, so the match follows it if it changes.
bool same_dag(const Graph& r, ValueId rv, ValueId rparam, const Graph& g, ValueId gv, std::optional<ValueId>& bound) {
  if (rv == rparam) {
    if (bound && *bound != gv) return false;
    bound = gv;
    return true;
  }
  const Node& a = r.node(rv);
  const Node& b = g.node(gv);
  if (a.op != b.op || a.op == OpKind::Param || !(a.attrs == b.attrs) || !(a.type == b.type) ||
      a.inputs.size() != b.inputs.size())
    return false;
  for (size_t i = 0; i < a.inputs.size(); ++i)
    if (!same_dag(r, a.inputs[i], rparam, g, b.inputs[i], bound)) return false;
  return true;
}

std::optional<ValueId> decomposed_input(const Graph& g, ValueId v, OpKind act) {
  const TensorType& t = g.node(v).type;
  try {
    GraphBuilder b("activation");
    Value x = b.param("x", t.dtype, t.shape);
    b.ret(b.op(act, {x}));
    Result<Graph> ref = b.finish();
    if (!ref) return std::nullopt;
    const Graph d = decompose(*ref);
    std::optional<ValueId> bound;
    if (same_dag(d, d.outputs()[0].value, d.params()[0], g, v, bound)) return bound;
  } catch (const DiagError&) {
  }
  return std::nullopt;
}

std::string ops_text(const LocalKernel& k) {
  std::string s;
  for (const std::string& o : k.ops) s += (s.empty() ? "" : " ") + o;
  return s;
}

}  // namespace

Result<ExternGemm> extern_gemm(const LocalKernel& k) {
  if (kernel_kind_of(k) != KernelKind::Matmul) return cannot("not a matmul kernel");
  Result<matmul_detail::MatmulGroup> analysed = matmul_detail::analyse_matmul(KernelSpec{"sf_extern", KernelKind::Matmul, k.group});
  if (!analysed) return cannot(analysed.error().message);
  const matmul_detail::MatmulGroup& p = *analysed;
  const Graph& g = k.group;
  if (p.dtype != DType::F32 && p.dtype != DType::F16 && p.dtype != DType::BF16)
    return cannot("the matmul is " + std::string(dtype_name(p.dtype)) + " (f32, f16 or bf16 only)");
  if (p.a.dtype != p.dtype || p.b.dtype != p.dtype) return cannot("the operands' dtypes differ from the result's");
  if (p.M < 1 || p.N < 1 || p.K < 1 || p.nbatch < 1)
    return cannot("the matmul is empty here (" + shape_str(p.out) + ", K " + std::to_string(p.K) + ")");

  ExternGemm x;
  GemmDesc& d = x.desc;
  d.library = GemmLibrary::CublasLt;
  d.dtype = p.dtype;
  d.m = p.M;
  d.n = p.N;
  d.k = p.K;
  d.batch = p.nbatch;
  std::optional<Stored> a = stored(p.M, p.K, p.sam, p.sak), b = stored(p.K, p.N, p.sbk, p.sbn);
  if (!a)
    return cannot("A [M, K] is read at strides (" + std::to_string(p.sam) + ", " + std::to_string(p.sak) +
                  "): neither dim is contiguous");
  if (!b)
    return cannot("B [K, N] is read at strides (" + std::to_string(p.sbk) + ", " + std::to_string(p.sbn) +
                  "): neither dim is contiguous");
  d.trans_a = a->trans;
  d.lda = a->ld;
  d.trans_b = b->trans;
  d.ldb = b->ld;
  std::optional<int64_t> sa = batch_stride(p.batch, p.a_bstride), sb = batch_stride(p.batch, p.b_bstride);
  if (!sa || !sb)
    return cannot(std::string(!sa ? "A" : "B") + "'s batch dims over " + shape_str(p.batch) +
                  " do not collapse to one batch stride (one broadcast, another not)");
  d.stride_a = *sa;
  d.stride_b = *sb;
  d.ldc = p.N;
  d.stride_c = p.M * p.N;
  x.a = p.a.param;
  x.b = p.b.param;

  // The epilogue, from the one output down to the matmul.
  if (g.outputs().size() != 1)
    return cannot("the kernel writes " + std::to_string(g.outputs().size()) + " outputs (a library GEMM writes one)");
  ValueId v = g.outputs()[0].value;
  if (g.node(v).type.dtype != p.dtype)
    return cannot("the output is " + std::string(dtype_name(g.node(v).type.dtype)) + ", the matmul " +
                  std::string(dtype_name(p.dtype)) + " (a cast in the epilogue)");
  enum class Act { None, Relu, GeluTanh } act = Act::None;
  if (g.node(v).op == OpKind::Relu) {
    act = Act::Relu;
    v = g.node(v).inputs[0];
  } else if (std::optional<ValueId> u = decomposed_input(g, v, OpKind::GeluTanh)) {
    act = Act::GeluTanh;
    v = *u;
  } else if (decomposed_input(g, v, OpKind::Gelu)) {
    return cannot("the epilogue's gelu is the erf form, and cuBLASLt's GELU epilogue is the tanh approximation "
                  "(write gelu_tanh to let the library compute it)");
  }
  bool bias = false;
  if (v != p.mm) {
    const Node& add = g.node(v);
    const ValueId other = add.op != OpKind::Add || add.inputs.size() != 2 ? -1
                          : add.inputs[0] == p.mm                         ? add.inputs[1]
                          : add.inputs[1] == p.mm                         ? add.inputs[0]
                                                                          : -1;
    const Node* bn = other >= 0 ? &g.node(other) : nullptr;
    const bool vector = bn && bn->op == OpKind::Param && bn->type.dtype == p.dtype && !bn->type.shape.empty() &&
                        bn->type.shape.back() == p.N && numel(bn->type.shape) == p.N &&
                        bn->type.shape.size() <= p.out.size() && add.type == g.node(p.mm).type;
    if (!vector)
      return cannot("the epilogue is not one of bias, relu, gelu_tanh, bias + relu, bias + gelu_tanh (ops: " +
                    ops_text(k) + "; a bias is a param of the matmul's dtype with N elements along the last dim)");
    bias = true;
    for (size_t i = 0; i < g.params().size(); ++i)
      if (g.params()[i] == other) x.bias = static_cast<int>(i);
  }
  switch (act) {
    case Act::None: d.epilogue = bias ? GemmEpilogue::Bias : GemmEpilogue::None; break;
    case Act::Relu: d.epilogue = bias ? GemmEpilogue::BiasRelu : GemmEpilogue::Relu; break;
    case Act::GeluTanh: d.epilogue = bias ? GemmEpilogue::BiasGeluTanh : GemmEpilogue::GeluTanh; break;
  }
  x.libraries = {GemmLibrary::CublasLt};
  if (d.epilogue == GemmEpilogue::None) x.libraries.push_back(GemmLibrary::Cublas);
  return x;
}

std::vector<ExternCandidate> extern_candidates(const LocalKernel& k, bool allow_tf32, std::string* note) {
  Result<ExternGemm> x = extern_gemm(k);
  if (!x) {
    *note = "no library GEMM: " + x.error().message;
    return {};
  }
  x->desc.tf32 = allow_tf32 && x->desc.dtype == DType::F32;
  Result<const cublas::Api*> api = cublas::api();
  if (!api) {
    *note = "no library GEMM measured: " + api.error().message;
    return {};
  }
  std::vector<ExternCandidate> out;
  std::string offered, missing;
  for (GemmLibrary lib : x->libraries) {
    if (lib == GemmLibrary::CublasLt && !(*api)->lt_error.empty()) {
      missing += "; " + (*api)->lt_error;
      continue;
    }
    auto art = std::make_shared<GemmArtifact>();
    art->desc = x->desc;
    art->desc.library = lib;
    art->a = x->a;
    art->b = x->b;
    art->bias = x->bias;
    art->c = x->c;
    const std::string name(gemm_library_name(lib));
    offered += (offered.empty() ? "" : ", ") + name;
    out.push_back(ExternCandidate{name, lib == GemmLibrary::CublasLt ? (*api)->lt_version() : (*api)->version(), art,
                                  gemm_str(art->desc)});
  }
  *note = offered.empty() ? "no library GEMM measured" + missing
                          : "library GEMM(s) measured: " + offered + " (" + gemm_str(x->desc) + ")" + missing;
  return out;
}

}  // namespace sf
