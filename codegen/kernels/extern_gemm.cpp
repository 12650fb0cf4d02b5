#include "codegen/kernels/extern_gemm.h"

#include <map>
#include <memory>
#include <optional>

#include "codegen/ir/builder.h"
#include "codegen/ir/decompose.h"
#include "codegen/kernels/host_runner.h"
#include "codegen/kernels/matmul_group.h"
#include "runtime/gpu/cublas.h"
#include "autotune/cuda_runner.h"
#include "codegen/kernels/tune.h"

namespace sf {

namespace {

// The extern library text of the split candidate: "cublaslt+epilogue".
constexpr std::string_view kEpilogueSuffix = kGemmEpilogueSuffix;

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

// The call for the group's matmul alone (epilogue none, C its product), and the
// analysis it came from; extern_gemm's reasons when the library cannot compute it.
Result<std::pair<ExternGemm, matmul_detail::MatmulGroup>> matmul_call(const LocalKernel& k) {
  if (k.kind != KernelKind::Matmul) return cannot("not a matmul kernel");
  Result<matmul_detail::MatmulGroup> analysed = matmul_detail::analyse_matmul(KernelSpec{"sf_extern", KernelKind::Matmul, k.group});
  if (!analysed) return cannot(analysed.error().message);
  const matmul_detail::MatmulGroup& p = *analysed;
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

  x.libraries = {GemmLibrary::CublasLt, GemmLibrary::Cublas};
  return std::make_pair(x, p);
}

}  // namespace

Result<ExternGemm> extern_gemm(const LocalKernel& k) {
  Result<std::pair<ExternGemm, matmul_detail::MatmulGroup>> call = matmul_call(k);
  if (!call) return call.error();
  ExternGemm x = call->first;
  const matmul_detail::MatmulGroup& p = call->second;
  const Graph& g = k.group;
  GemmDesc& d = x.desc;
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

Result<ExternGemmEpilogue> extern_gemm_epilogue(const LocalKernel& k) {
  auto no = [](const std::string& why) { return Diag{"", {}, "no library GEMM + epilogue kernel: " + why}; };
  Result<std::pair<ExternGemm, matmul_detail::MatmulGroup>> call = matmul_call(k);
  if (!call) return no(call.error().message);
  if (Result<ExternGemm> whole = extern_gemm(k))
    return no("the library computes the whole group (" + std::string(gemm_epilogue_name(whole->desc.epilogue)) +
              " epilogue)");
  const Graph& g = k.group;
  const ValueId mm = call->second.mm;
  ExternGemmEpilogue x;
  x.gemm = call->first;
  x.gemm.c = kGemmProduct;

  // The nodes the epilogue computes: everything the outputs need, the product standing
  // in for the matmul (its operands' views are the library's, not the kernel's).
  std::vector<bool> need(g.nodes().size(), false);
  std::vector<ValueId> stack;
  for (size_t o = 0; o < g.outputs().size(); ++o) {
    const ValueId v = g.outputs()[o].value;
    if (v == mm && x.gemm.c == kGemmProduct) {
      x.gemm.c = static_cast<int>(o);  // the library writes this output itself
      continue;
    }
    if (g.node(v).op == OpKind::Param || g.node(v).op == OpKind::Constant)
      return no("output " + std::to_string(o) + " passes a " + std::string(op_name(g.node(v).op)) + " through");
    x.epilogue_out.push_back(static_cast<int>(o));
    stack.push_back(v);
  }
  if (x.epilogue_out.empty()) return no("nothing is left for an epilogue kernel");
  while (!stack.empty()) {
    const ValueId v = stack.back();
    stack.pop_back();
    if (need[static_cast<size_t>(v)]) continue;
    need[static_cast<size_t>(v)] = true;
    if (v == mm) continue;
    for (ValueId u : g.node(v).inputs) stack.push_back(u);
  }

  // The epilogue group: the product, then the group's params it reads, in order.
  GraphBuilder b(k.name + "_epilogue");
  std::map<ValueId, Value> val;
  const TensorType& pt = g.node(mm).type;
  val.emplace(mm, b.param("in0", pt.dtype, pt.shape));
  x.epilogue_in.push_back(kGemmProduct);
  LocalKernel& e = x.epilogue;
  e.bytes_read = numel(pt.shape) * dtype_size(pt.dtype);
  for (size_t i = 0; i < g.params().size(); ++i) {
    const ValueId v = g.params()[i];
    if (!need[static_cast<size_t>(v)]) continue;
    const TensorType& t = g.node(v).type;
    val.emplace(v, b.param("in" + std::to_string(x.epilogue_in.size()), t.dtype, t.shape));
    x.epilogue_in.push_back(static_cast<int>(i));
    e.bytes_read += numel(t.shape) * dtype_size(t.dtype);
  }
  try {
    for (ValueId v = 0; v < static_cast<ValueId>(g.nodes().size()); ++v) {
      const Node& n = g.node(v);
      if (!need[static_cast<size_t>(v)] || val.count(v)) continue;
      if (n.op == OpKind::Constant) {
        val.emplace(v, b.constant(n.attrs.get_float("value"), n.attrs.get_dtype("dtype")));
        continue;
      }
      std::vector<Value> in;
      for (ValueId u : n.inputs) in.push_back(val.at(u));
      val.emplace(v, b.op(n.op, in, {}, n.attrs.items, n.loc));
      e.ops.push_back(std::string(op_name(n.op)));
      if (op_info(n.op).category != OpCategory::Movement) e.flops += numel(n.type.shape);
    }
    for (int o : x.epilogue_out) {
      const ValueId v = g.outputs()[static_cast<size_t>(o)].value;
      b.ret(val.at(v));
      e.bytes_written += numel(g.node(v).type.shape) * dtype_size(g.node(v).type.dtype);
    }
  } catch (const DiagError& err) {
    return no(err.diag.message);
  }
  Result<Graph> eg = b.finish();
  if (!eg) return no(eg.error().message);
  e.name = k.name + "_epilogue";
  e.kind = KernelKind::Pointwise;
  e.group = std::move(eg).value();
  return x;
}

std::string extern_choice_name(const ExternChoice& c) {
  return std::string(gemm_library_name(c.library)) + (c.epilogue_kernel ? std::string(kEpilogueSuffix) : "");
}

std::optional<ExternChoice> parse_extern_choice(std::string_view library) {
  ExternChoice c;
  if (library.ends_with(kEpilogueSuffix)) {
    c.epilogue_kernel = true;
    library.remove_suffix(kEpilogueSuffix.size());
  }
  std::optional<GemmLibrary> lib = parse_gemm_library(library);
  if (!lib) return std::nullopt;
  c.library = *lib;
  return c;
}

namespace {

// The split candidates of a group the library cannot compute whole (`whole` says why).
std::vector<ExternCandidate> epilogue_candidates(const LocalKernel& k, bool allow_tf32, const std::string& arch,
                                                 const GemmLibraries& libs, const std::string& whole,
                                                 std::string* note) {
  Result<ExternGemmEpilogue> x = extern_gemm_epilogue(k);
  if (!x) {
    *note = whole + "; " + x.error().message;
    return {};
  }
  x->gemm.desc.tf32 = allow_tf32 && x->gemm.desc.dtype == DType::F32;
  if (!libs.error.empty()) {
    *note = whole + "; no library GEMM + epilogue kernel measured: " + libs.error;
    return {};
  }
  // The epilogue kernel with its default config: the pair is one candidate, not a
  // space (tuning the epilogue's config too would multiply the library's runs).
  const KernelConfig cfg = default_kernel_config(x->epilogue, ConfigTarget::Gpu, arch);
  BuildResult built = make_ptx_builder(x->epilogue, arch)->build(cfg);
  auto ptx = std::dynamic_pointer_cast<PtxArtifact>(built.artifact);
  if (!ptx) {
    *note = whole + "; no library GEMM + epilogue kernel: the epilogue kernel does not build: " + built.error;
    return {};
  }
  std::vector<ExternCandidate> out;
  std::string offered, missing;
  for (GemmLibrary lib : x->gemm.libraries) {
    if (lib == GemmLibrary::CublasLt && !libs.cublaslt_error.empty()) {
      missing += "; " + libs.cublaslt_error;
      continue;
    }
    auto art = std::make_shared<GemmArtifact>();
    art->desc = x->gemm.desc;
    art->desc.library = lib;
    art->a = x->gemm.a;
    art->b = x->gemm.b;
    art->c = x->gemm.c;
    art->epilogue = ptx;
    art->epilogue_in = x->epilogue_in;
    art->epilogue_out = x->epilogue_out;
    const std::string name = extern_choice_name({lib, true});
    offered += (offered.empty() ? "" : ", ") + name;
    out.push_back(ExternCandidate{name, lib == GemmLibrary::CublasLt ? libs.cublaslt_version : libs.cublas_version, art,
                                  gemm_str(art->desc) + ", then " + x->epilogue.name});
  }
  std::string ops;
  for (const std::string& o : x->epilogue.ops) ops += (ops.empty() ? "" : " ") + o;
  *note = whole + (offered.empty() ? "; no library GEMM + epilogue kernel measured" + missing
                                   : "; library GEMM + epilogue kernel measured: " + offered + " (" +
                                         gemm_str(x->gemm.desc) + ", then a pointwise kernel: " + ops + ")" + missing);
  return out;
}

}  // namespace

std::vector<ExternCandidate> extern_candidates(const LocalKernel& k, bool allow_tf32, std::string* note,
                                               const std::string& arch, const GemmLibraries* libraries) {
  const GemmLibraries libs = libraries ? *libraries : local_gemm_libraries();
  Result<ExternGemm> x = extern_gemm(k);
  if (!x) return epilogue_candidates(k, allow_tf32, arch, libs, "no library GEMM: " + x.error().message, note);
  x->desc.tf32 = allow_tf32 && x->desc.dtype == DType::F32;
  if (!libs.error.empty()) {
    *note = "no library GEMM measured: " + libs.error;
    return {};
  }
  std::vector<ExternCandidate> out;
  std::string offered, missing;
  for (GemmLibrary lib : x->libraries) {
    if (lib == GemmLibrary::CublasLt && !libs.cublaslt_error.empty()) {
      missing += "; " + libs.cublaslt_error;
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
    out.push_back(ExternCandidate{name, lib == GemmLibrary::CublasLt ? libs.cublaslt_version : libs.cublas_version, art,
                                  gemm_str(art->desc)});
  }
  *note = offered.empty() ? "no library GEMM measured" + missing
                          : "library GEMM(s) measured: " + offered + " (" + gemm_str(x->desc) + ")" + missing;
  return out;
}

}  // namespace sf
