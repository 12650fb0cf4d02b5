// What the matmul emitters share (codegen/kernels/matmul.cpp: the SIMT tiled kernel
// and the host loops; matmul_mma.cpp: the tensor-core kernel): the analysis of a
// matmul group, the epilogue on its output space, batch indexing and the per-arch
// shared-memory limit. Internal to codegen/kernels.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/Intrinsics.h>

#include "codegen/kernels/element.h"
#include "codegen/kernels/emitter.h"

namespace sf::matmul_detail {

using kernels::Elem;
using kernels::ElementCodegen;
using kernels::ValueIndex;

inline Diag diag(std::string msg, SourceLoc loc = {}) { return Diag{"", loc, "matmul: " + std::move(msg)}; }
inline bool pow2(int64_t v) { return v > 0 && (v & (v - 1)) == 0; }
inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// A matmul operand read in place: the param it is a view of, and for each of the
// operand's logical dims ([..., M, K] for A, [..., K, N] for B) the element stride into
// that param (0 where a dim is broadcast by an expand).
struct MatmulOperand {
  int param = -1;  // index among the group's params
  DType dtype = DType::F32;
  Shape shape;
  std::vector<int64_t> strides;
};

// What emission needs to know about a group, found once from the graph.
struct MatmulGroup {
  ValueId mm = -1;
  DType dtype = DType::F32;  // the matmul's (and both operands')
  Shape out;                 // the matmul's output shape O = [batch..., M, N]
  Shape batch;
  int64_t nbatch = 1, M = 0, N = 0, K = 0;
  MatmulOperand a, b;
  // Per batch dim of O: the element stride of A and B (0 where broadcast).
  std::vector<int64_t> a_bstride, b_bstride;
  int64_t sam = 0, sak = 0, sbk = 0, sbn = 0;  // strides of A's M, K and B's K, N dims
  std::vector<ValueIndex> out_at;             // each output's index over O
  bool bare = false;  // the kernel's one output is the matmul's own result (no epilogue)
  bool allow_tf32 = false;  // KernelSpec::allow_tf32
  bool tma = false;         // KernelSpec::tma
};

// The group's matmul, operands and outputs, or a Diag saying why `spec` is not a
// matmul kernel (matmul.h lists what a group may hold).
Result<MatmulGroup> analyse_matmul(const KernelSpec& spec);

// The group with the matmul's batch dims folded into its rows, as torch.matmul folds
// a batched [b..., M, K] times a shared [K, N] into one [b x M, K] x [K, N] product,
// where that computes the same elements at the same flat indices: A is a param over
// the whole [b..., M, K] (dense across the batch), B has no batch dims and nothing
// else reads what B is computed from, and every other node is a param, a literal or
// an elementwise op over either all of O's [b..., M] rows (it becomes [b x M, last])
// or none of them (size 1 there: a bias). nullopt otherwise, or without a batch dim
// above 1. The kernel's arguments keep their order and element counts, so the
// folded kernel is launched as the batched one would be; it gets M tiles across the
// batch and a 2-D TMA map of A (batched, A's map would step the batch and B's not:
// MmaTiling::map_batch). matmul_fold.cpp.
std::optional<Graph> fold_batch_into_rows(const Graph& g);
// `spec` with its group folded where fold_batch_into_rows can; unchanged otherwise.
// Every matmul entry point (emit, path, suggested config) works on this.
KernelSpec fold_batch_into_rows(const KernelSpec& spec);

// The group's outputs at one element of O, given the matmul's value there: element.h's
// GroupValues with two hooks. The matmul node is the accumulator at hand, and a param
// read over O itself (not through a reshape) is loaded at sum(coord * stride) of O's
// coordinates, which the kernel has as values: no divisions, where the flat index
// would need one per dim.
class MatmulEpilogue {
 public:
  MatmulEpilogue(const Graph& g, const MatmulGroup& p, ElementCodegen& cg, std::vector<llvm::Value*> inputs)
      : g_(g), p_(p), cg_(cg), inputs_(inputs), values_(g, cg, std::move(inputs)) {
    // A lone 1 + erf stays erf_for_16bit and an add here: the tensor-core kernels hold
    // up to 128 accumulators a thread, and erfc's two MUFU chains an element (rcp,
    // then ex2) led ptxas to keep more elements in flight: 255 registers and spills
    // for the bf16 128 x 128 x 32, 4-warp kernel on sm_80 and sm_90a, where the erf
    // form takes 220 and 217 and none. The whole GELU (gelu_for_16bit, the same two
    // MUFU chains but no select and fewer values live) does not: 220 and 217 there,
    // 157 against 154 for the 128 x 256 x 64 wgmma kernel, none spilled, and the
    // warp-specialised kernel's PTX 27% shorter (6092 -> 4427 instructions).
    values_.fold_one_plus_erf(false);
  }

  // `coords`: O's coordinates (index-typed values), `flat`: O's flat index there,
  // `mm`: the matmul's element (rounded to its dtype under Precision::Eager).
  Result<std::vector<Elem>> outputs(const std::vector<llvm::Value*>& coords, llvm::Value* flat, Elem mm) {
    values_.at_index(flat, [&](ValueId v, const ValueIndex& at) -> std::optional<Elem> {
      if (v == p_.mm) return mm;  // analyse_matmul() checked every read of it is at O's own index
      const Node& n = g_.node(v);
      if (n.op != OpKind::Param || !at.prefix.contiguous() || at.space != p_.out || !at.unshifted()) return std::nullopt;
      return cg_.load(n.type.dtype, inputs_[static_cast<size_t>(values_.param_slot(v))], offset(n, at, coords));
    });
    values_.known_coordinates(p_.out, coords);
    std::vector<Elem> out;
    for (size_t o = 0; o < g_.outputs().size(); ++o) {
      Result<Elem> e = values_.output_value(g_.outputs()[o].value, p_.out_at[o]);  // as stored
      if (!e) return Diag{"", e.error().loc, "matmul epilogue: " + e.error().message};
      out.push_back(*e);
    }
    return out;
  }

  // The NVPTX kernels' store of one accumulator: under `in_bounds` (a branch in
  // `fn`), the f32 `acc` as the matmul's result (node_result), the outputs at O's element
  // (`coords`, `flat`) stored to `out`. Leaves the builder after the branch.
  Result<void> store_element(llvm::Function* fn, llvm::Value* in_bounds, const std::vector<llvm::Value*>& coords,
                             llvm::Value* flat, llvm::Value* acc, const std::vector<llvm::Value*>& out) {
    llvm::IRBuilderBase& b = cg_.builder();
    llvm::BasicBlock* st = llvm::BasicBlock::Create(b.getContext(), "epi", fn);
    llvm::BasicBlock* next = llvm::BasicBlock::Create(b.getContext(), "epi.next", fn);
    b.CreateCondBr(in_bounds, st, next);
    b.SetInsertPoint(st);
    Result<std::vector<Elem>> outs = outputs(coords, flat, Elem{cg_.node_result(p_.dtype, acc), p_.dtype});
    if (!outs) return outs.error();
    for (size_t o = 0; o < outs->size(); ++o) cg_.store((*outs)[o], out[o], flat);
    b.CreateBr(next);
    b.SetInsertPoint(next);
    return {};
  }

  // Two horizontally adjacent accumulators (columns c and c + 1 of one row, c even, N
  // even) through the epilogue, in two steps, so that an epilogue can compute a batch
  // of pairs before it stores any of them: the batch's loads (a bias, a residual) then
  // issue ahead of the previous batch's stores, which they may alias and so could not
  // pass, and a value two pairs load at one address is loaded once.
  //
  // pair_values: each output's two values at (row, c) and (row, c + 1), `coords`
  // ending with (row, c) and `flat` O's flat index of column c. No bounds test: the
  // caller passes coordinates inside O (clamped where the pair is outside it, whose
  // values it then does not store).
  struct PairValue {
    Elem first, second;
  };
  Result<std::vector<PairValue>> pair_values(std::vector<llvm::Value*> coords, llvm::Value* flat, llvm::Value* acc0,
                                             llvm::Value* acc1) {
    llvm::IRBuilderBase& b = cg_.builder();
    llvm::Type* it = flat->getType();
    Result<std::vector<Elem>> o0 = outputs(coords, flat, Elem{cg_.node_result(p_.dtype, acc0), p_.dtype});
    if (!o0) return o0.error();
    std::vector<Elem> first = *o0;  // values, computed before the next call resets the memo
    coords.back() = b.CreateAdd(coords.back(), llvm::ConstantInt::get(it, 1), "", true, true);
    llvm::Value* flat1 = b.CreateAdd(flat, llvm::ConstantInt::get(it, 1), "", true, true);
    Result<std::vector<Elem>> o1 = outputs(coords, flat1, Elem{cg_.node_result(p_.dtype, acc1), p_.dtype});
    if (!o1) return o1.error();
    std::vector<PairValue> v;
    for (size_t o = 0; o < first.size(); ++o) v.push_back({first[o], (*o1)[o]});
    return v;
  }
  // store_pair_values: `v` (pair_values' result) stored at O's flat index `flat`
  // under `in_bounds` (a branch in `fn`), as one 2-element access per output where `aligned`
  // (every output pointer aligned to two elements: the tensor cores' C fragment holds
  // such pairs), else one element at a time. Leaves the builder after the branch.
  void store_pair_values(llvm::Function* fn, llvm::Value* in_bounds, llvm::Value* flat,
                         const std::vector<PairValue>& v, const std::vector<llvm::Value*>& out, llvm::Value* aligned) {
    llvm::IRBuilderBase& b = cg_.builder();
    llvm::LLVMContext& c = b.getContext();
    llvm::BasicBlock* st = llvm::BasicBlock::Create(c, "epi.store", fn);
    llvm::BasicBlock* next = llvm::BasicBlock::Create(c, "epi.stored", fn);
    b.CreateCondBr(in_bounds, st, next);
    b.SetInsertPoint(st);
    llvm::BasicBlock* wide = llvm::BasicBlock::Create(c, "epi.pair", fn);
    llvm::BasicBlock* narrow = llvm::BasicBlock::Create(c, "epi.single", fn);
    b.CreateCondBr(aligned, wide, narrow);
    b.SetInsertPoint(wide);
    for (size_t o = 0; o < v.size(); ++o) {
      DType dt = v[o].first.dtype;
      llvm::Value* ptr = b.CreateInBoundsGEP(kernels::storage_type(c, dt), out[o], flat);
      b.CreateAlignedStore(cg_.narrow_vector(dt, {v[o].first.value, v[o].second.value}), ptr,
                           llvm::Align(static_cast<uint64_t>(2 * dtype_size(dt))));
    }
    b.CreateBr(next);
    b.SetInsertPoint(narrow);
    llvm::Value* flat1 = b.CreateAdd(flat, llvm::ConstantInt::get(flat->getType(), 1), "", true, true);
    for (size_t o = 0; o < v.size(); ++o) {
      cg_.store(v[o].first, out[o], flat);
      cg_.store(v[o].second, out[o], flat1);
    }
    b.CreateBr(next);
    b.SetInsertPoint(next);
  }

  // Whether every output pointer is aligned to two of its elements (store_pair_values).
  llvm::Value* pairs_aligned(const std::vector<llvm::Value*>& out) {
    llvm::IRBuilderBase& b = cg_.builder();
    llvm::Value* bits = b.getInt64(0);
    for (size_t o = 0; o < out.size(); ++o) {
      const int64_t bytes = 2 * dtype_size(g_.node(g_.outputs()[o].value).type.dtype);
      bits = b.CreateOr(bits, b.CreateAnd(b.CreatePtrToInt(out[o], b.getInt64Ty()), bytes - 1));
    }
    return b.CreateICmpEQ(bits, b.getInt64(0), "pairs.aligned");
  }

 private:
  llvm::Value* offset(const Node& n, const ValueIndex& at, const std::vector<llvm::Value*>& coords) {
    llvm::IRBuilderBase& b = cg_.builder();
    llvm::Type* it = coords.back()->getType();
    std::vector<int64_t> cs = contiguous_strides(n.type.shape), per_space(at.space.size(), 0);
    for (size_t d = 0; d < at.src.size(); ++d)
      if (at.src[d] >= 0 && n.type.shape[d] != 1) per_space[static_cast<size_t>(at.src[d])] += cs[d];
    llvm::Value* off = nullptr;
    for (size_t s = 0; s < per_space.size(); ++s) {
      if (per_space[s] == 0) continue;
      llvm::Value* c = coords[s];
      if (per_space[s] != 1) c = b.CreateMul(c, llvm::ConstantInt::get(it, static_cast<uint64_t>(per_space[s])), "", true, true);
      off = off ? b.CreateAdd(off, c, "", true, true) : c;
    }
    return off ? off : llvm::ConstantInt::get(it, 0);
  }

  const Graph& g_;
  const MatmulGroup& p_;
  ElementCodegen& cg_;
  std::vector<llvm::Value*> inputs_;
  kernels::GroupValues values_;
};

// O's batch coordinates of batch index z (index-typed), and the element offsets of
// A's and B's matrices for it.
struct BatchIndex {
  std::vector<llvm::Value*> coords;
  llvm::Value* a_off = nullptr;
  llvm::Value* b_off = nullptr;
};

BatchIndex batch_index(llvm::IRBuilderBase& b, const MatmulGroup& p, llvm::Value* z);


// Maximum shared memory one block may use (opt-in dynamic shared memory), per the
// CUDA C++ Programming Guide's "Technical Specifications per Compute Capability":
// 227 KiB on sm_90, 163 KiB on sm_80/87, 99 KiB on sm_86/89, 96 KiB on sm_70/72,
// 64 KiB on sm_75, 48 KiB before Volta.
int64_t max_shared_bytes(int sm);

// ---- what both NVPTX kernels emit the same way ----

// The kernel function `spec.entry(in0.., out0..)` over global pointers with
// .maxntid `threads`, its entry block current in `b`, and its dynamic shared memory:
// one `.extern .shared` array `sf_smem` aligned to `smem_align` bytes, sized by the
// launch (static shared memory stops at 48 KiB, and Triton's configs go beyond it).
// `extra` more global pointers follow the outputs (TMA tensor maps).
struct NvptxEntry {
  llvm::Function* fn = nullptr;
  std::vector<llvm::Value*> in, out, extra;
  llvm::Value* smem = nullptr;
};
NvptxEntry begin_nvptx_matmul(llvm::Module& m, llvm::IRBuilderBase& b, const KernelSpec& spec, int threads,
                              uint64_t smem_align, int extra = 0);

// A special register (%tid.x, %ctaid.x, ...) widened to `index_type`.
llvm::Value* nvptx_sreg(llvm::IRBuilderBase& b, llvm::Intrinsic::ID id, llvm::Type* index_type);

// The first row and column of the output tile block `bx` computes, by the GROUP_M
// swizzle (Triton's matmul tutorial): consecutive blocks walk down group_m rows of
// tiles before moving right, so a wave of blocks shares A's rows and B's columns in L2.
struct TileOrigin {
  llvm::Value* m0 = nullptr;
  llvm::Value* n0 = nullptr;
};
TileOrigin group_m_tile(llvm::IRBuilderBase& b, const MatmulGroup& p, llvm::Value* bx, int bm, int bn, int group_m);

// (ceil(M/bm) * ceil(N/bn), batch, split) blocks of `threads` threads with
// `shared_bytes` of dynamic shared memory; a Diag when the grid is over CUDA's limits.
LaunchShape matmul_launch_shape(const MatmulGroup& p, int bm, int bn, int threads, int64_t shared_bytes, int split);
Result<void> check_matmul_grid(const MatmulGroup& p, int bm, int bn);

// Why `c.split_k` does not fit `p` on either NVPTX kernel, nullopt when it does: a
// power of two in 1..64 dividing the K tiles (a block_k below 1 is left to the
// caller's block_k check). Any group splits: a bare f32 matmul adds its partial sums
// into its zeroed output, any other sums them in a workspace (split_k_uses_workspace).
std::optional<std::string> split_k_unfit(const MatmulGroup& p, const KernelConfig& c);

// Whether split-K on `p` sums in a workspace (matmul_split_k.h): every group but a
// bare f32 matmul, which adds into its own zeroed output.
bool split_k_uses_workspace(const MatmulGroup& p);

// A fresh context and module for `spec`'s kernel, prepared for `target`.
EmittedKernel new_matmul_kernel(const KernelSpec& spec, const llvmb::Target& target);

// ---- the tensor-core kernel (matmul_mma.cpp) ----

// `wgmma_arch`: the target has warpgroup MMA (sm_90a only: wgmma is an
// arch-specific feature, so sm_90 and Blackwell's sm_100a lack it).
inline bool has_wgmma(const std::string& arch) { return arch == "sm_90a"; }

// Which tensor-core kernel computes `p` under config `c` on sm_`sm`.
struct MmaChoice {
  std::optional<std::string> unsupported;  // why none can (the dtype, the arch, an operand layout, the config)
  bool wgmma = false;                      // wgmma.mma_async, else mma.sync
  std::string not_wgmma;                   // wgmma_arch and mma.sync: what in the config rules wgmma out
  bool tma = false;                        // wgmma's operands by TMA (KernelSpec::tma), else cp.async
  std::string not_tma;                     // KernelSpec::tma, wgmma and cp.async: why
};
MmaChoice mma_choice(const MatmulGroup& p, const KernelConfig& c, int sm, bool wgmma_arch);
std::optional<std::string> mma_unsupported(const MatmulGroup& p, const KernelConfig& c, int sm, bool wgmma_arch);

// Builds the tensor-core kernel into `m`: for NVPTX, or (`sim`) as the host function
// emit_matmul_mma_block_on_host describes. Returns its launch shape.
Result<LaunchShape> build_mma_kernel(const KernelSpec& spec, const MatmulGroup& p, const KernelConfig& c, int sm,
                                     bool wgmma_arch, const llvmb::Target& target, llvm::Module& m, bool sim);

}  // namespace sf::matmul_detail
