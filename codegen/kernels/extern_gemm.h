// Which fused matmul kernels a library GEMM can compute, and the call that does
// (runtime/gpu/gemm.h): the tuner's extern candidates (docs/autotuning.md, "Extern
// candidates") and the Plan's gemm steps (docs/plan.md) both start here.
//
// cuBLASLt computes epilogue(op(A) x op(B) + bias) over whole matrices read in place.
// So a group qualifies when:
//   - its matmul is f32, f16 or bf16 (operands and result of one dtype), 2-D or
//     batched, every extent at least 1 (an empty shard keeps its kernel);
//   - each operand is a param read with one contiguous dim among its last two
//     (row-major, or column-major: a transpose of a param), its rows apart by the
//     other dim's stride, and its batch dims collapsing to one stride (0 where it is
//     broadcast over the batch; expanding some batch dims and not others does not);
//   - it writes one output, of the matmul's dtype, computed from the matmul's result
//     by one of: nothing; add a bias (a param of N elements along the last dim, of
//     the matmul's dtype); then, optionally, relu or gelu_tanh (as the decomposition
//     of gelu_tanh writes it). The erf `gelu` does not qualify: cuBLASLt's GELU
//     epilogue is the tanh approximation (runtime/gpu/gemm.h). Nor does anything else:
//     a residual add, a scale, a cast to another dtype, a second output.
// cuBLAS's GemmEx computes the same without an epilogue, so it is offered only for
// a bare matmul. No GPU is needed to decide any of this.
//
// A group whose matmul qualifies but whose epilogue does not (a residual add, the erf
// gelu, a scale, a cast, a second output) is offered split instead (issue 15):
// the library writes the bare product, and a generated pointwise kernel reads it and
// computes the rest of the group (extern_gemm_epilogue). The tuner measures the pair
// as one candidate, "extern=cublaslt+epilogue" (or cublas+epilogue), against the
// generated configs.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "autotune/tuner.h"
#include "codegen/dist/local_program.h"
#include "runtime/gpu/gemm.h"

namespace sf {

struct ExternGemm {
  GemmDesc desc;  // library CublasLt
  // The kernel's arguments the call reads and writes: indices among its params
  // (the group's params, in order) for A, B and the bias (-1: none), among its
  // outputs for C.
  int a = -1, b = -1, bias = -1, c = 0;
  std::vector<GemmLibrary> libraries;  // which can compute it: cuBLASLt, and cuBLAS when there is no epilogue
};

// The library GEMM that computes `k`, or a Diag saying why none can
// ("cuBLASLt cannot express it: ...").
Result<ExternGemm> extern_gemm(const LocalKernel& k);

// A library GEMM of the group's bare matmul followed by a generated epilogue kernel.
struct ExternGemmEpilogue {
  // The call: epilogue none, cuBLASLt and cuBLAS both able. `gemm.c` is the group's
  // output the product is written to when the matmul's own result is one of them,
  // else kGemmProduct (runtime/gpu/gemm.h): a buffer of its own.
  ExternGemm gemm;
  // A pointwise kernel: its first param is the product, then the group's params it
  // reads (in group order); its outputs are the group's other outputs, in order.
  LocalKernel epilogue;
  std::vector<int> epilogue_in;   // per epilogue param: kGemmProduct, or an index among the group's params
  std::vector<int> epilogue_out;  // per epilogue output: an index among the group's outputs
};

// The split form of `k`, or a Diag saying why it is not offered: the library cannot
// compute the matmul itself (extern_gemm's reasons), or it computes the whole group
// already (then extern_gemm is the candidate), or an output passes a param through.
// Whether the pointwise emitter takes the epilogue is for the caller to find out.
Result<ExternGemmEpilogue> extern_gemm_epilogue(const LocalKernel& k);

// The extern library text of a choice: "cublaslt", "cublas" (the whole group in one
// call) or "cublaslt+epilogue", "cublas+epilogue" (the split form). It is what the
// cache stores after "extern=" and what KernelChoice::library holds.
struct ExternChoice {
  GemmLibrary library = GemmLibrary::CublasLt;
  bool epilogue_kernel = false;
};
std::string extern_choice_name(const ExternChoice& c);
std::optional<ExternChoice> parse_extern_choice(std::string_view library);

// The tuner's extern candidates for `k`: one GemmArtifact (autotune/cuda_runner.h) per
// library that can compute it and can be opened; under `allow_tf32` an f32 GEMM
// multiplies in TF32 (GemmDesc::tf32), as the generated kernels then do. `note` gets
// one line for the report: the libraries offered and the call, or why none was.
// A group the library cannot compute whole gets the split candidates instead (one
// per library, "cublaslt+epilogue", "cublas+epilogue"), their epilogue kernel
// emitted as PTX for `arch` with its default config, or the note says why not.
// `libraries`: the libraries (and versions) the candidates will run on; null: this
// machine's (local_gemm_libraries). The split tuner passes the GPU machine's.
std::vector<ExternCandidate> extern_candidates(const LocalKernel& k, bool allow_tf32, std::string* note,
                                               const std::string& arch = "sm_90a", const GemmLibraries* libraries = nullptr);

}  // namespace sf
