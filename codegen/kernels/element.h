// Element-level code generation shared by every emitter (pointwise, reduction,
// matmul epilogues): how one element of a dtype is loaded, computed on and stored,
// and how a flat iteration index becomes the element offset of an operand seen
// through broadcasting and views. Emitters decide the loop structure; this file
// decides what one element means, so every kernel kind agrees with the reference
// evaluator (codegen/reference/evaluate.cpp) on the same rules.
//
// Dtype rules (docs/kernels.md, "Dtypes"):
//   storage  f32: float   f16: half   bf16: i16 (the bit pattern)   i32   i64   bool: i8
//   compute  f32, f16, bf16: float    i32: i32    i64: i64          bool: i1
// Rounding of f16/bf16 results (Precision, autotune/config.h): with Precision::Fused
// (the default) results stay in f32 and are rounded where they are stored and at
// explicit casts; with Precision::Eager a compute value of a node always holds a
// value representable in the node's dtype (rounded to nearest even at every node, as
// eager PyTorch and the reference do, so a fused kernel gives what the unfused graph
// gives).
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <llvm/IR/IRBuilder.h>

#include "autotune/config.h"
#include "codegen/ir/graph.h"
#include "codegen/kernels/emitter.h"
#include "codegen/llvm/backend.h"

namespace sf::kernels {

// Whether `s` can be a kernel's entry symbol: a C identifier.
bool is_c_identifier(const std::string& s);

// ---- types ------------------------------------------------------------------------

llvm::Type* storage_type(llvm::LLVMContext& c, DType t);
llvm::Type* compute_type(llvm::LLVMContext& c, DType t);

// ---- index maps (plain C++, no LLVM) -----------------------------------------------
//
// A flat index is turned into an element offset by a chain of strided steps. One step
// reads its input flat index as a C-order coordinate in `shape` and returns
// offset + sum(coord[d] * strides[d]). Broadcasting, expand, transpose, permute and
// slice are one step (a slice scales its dim's stride by its step and adds its start
// to the offset); a reshape of something that is not read densely starts a new step,
// because the reshaped value's flat index is itself a strided function of the
// coordinates above it. Views are never materialised.

struct StridedStep {
  Shape shape;
  std::vector<int64_t> strides;
  int64_t offset = 0;  // >= 0: where a slice starts
  bool operator==(const StridedStep&) const = default;
};

// Which flat index an IndexMap's steps start from.
inline constexpr int kIterationIndex = 0;  // the emitter's own (pointwise i, a reduction's X index)
inline constexpr int kComputedIndex = -1;  // one computed inside the element code: a concat operand's
                                           // (GroupValues numbers them 1, 2, ... as it emits them)

// Steps applied in order to a flat index, the iteration index unless `base` says
// otherwise. Normalised: size-1 dims dropped, mergeable neighbour dims merged, identity
// steps removed, so an empty map of the iteration index means the operand is read at
// the iteration index itself (dense, vectorisable). A map from a computed index is
// never dense: the index is a clamped select, known only inside the element code.
struct IndexMap {
  std::vector<StridedStep> steps;
  int base = kIterationIndex;
  bool contiguous() const { return steps.empty() && base == kIterationIndex; }
  bool operator==(const IndexMap&) const = default;
  std::string str() const;  // "[4, 6]:[0, 1] -> [24]:[1]+8", "contiguous", "@1 [24]:[2]"
};

// True when every run of `v` consecutive indices starting at a multiple of v maps to
// `v` consecutive offsets starting at a multiple of v: the run can be one vector
// access. Dense maps qualify, and so does a broadcast row or any one-step map whose
// innermost dim is dense with a size divisible by v (a bias add's [N] operand).
bool dense_runs(const IndexMap& m, int64_t v);

// Appends a step to a map, normalising it (the step's input flat index must be below
// numel(step.shape), which every map built here guarantees).
void append_step(IndexMap& m, StridedStep step);

// How a value's coordinates are found from the flat iteration index i: `prefix` maps
// i to a flat C-order index over `space`; the value's coordinate d is
// shift[d] + scale[d] * (the space's coordinate src[d]), or shift[d] where src[d] < 0
// (a broadcast or size-1 dim). Slices make the shift and scale: empty vectors mean
// scale 1 and shift 0 everywhere (no slice on the way), the only form operand_index
// gives when there is none.
struct ValueIndex {
  IndexMap prefix;
  Shape space;
  std::vector<int> src;
  std::vector<int64_t> scale = {}, shift = {};
  bool operator==(const ValueIndex&) const = default;
  std::string key() const;  // a string equal for equal indices (memoisation key)
  int64_t scale_of(size_t d) const { return scale.empty() ? 1 : scale[d]; }
  int64_t shift_of(size_t d) const { return shift.empty() ? 0 : shift[d]; }
  bool unshifted() const { return scale.empty() && shift.empty(); }
};

// The value of `shape` read at its own flat index (an output, written densely).
ValueIndex dense_index(const Shape& shape);

// The index of an operand of node `n` when `n` is read at `at`: NumPy broadcasting
// for elementwise ops and expand, the inverse permutation for transpose/permute, a
// shifted and scaled coordinate for slice, a new step for reshape. A concat's operands
// are read at a computed index (GroupValues makes it): the result is the operand's
// dense index from kComputedIndex, which tells a walker that no emitter may read it
// in dense runs. nullopt for nodes that are neither elementwise nor views.
std::optional<ValueIndex> operand_index(const Node& n, const ValueIndex& at, const Shape& operand);

// The largest element count of any value of a kernel's group: every flat index and
// offset element code forms is below it (a slice's operand can be larger than the
// iteration space), so emitters choose their index width with it.
int64_t largest_value(const Graph& g);

// The map from the iteration index to the element offset into a dense C-order tensor
// of `shape` holding the value read at `at`.
IndexMap offset_map(const ValueIndex& at, const Shape& shape);

// Emits the map's steps on `flat` (an i32 or i64; the result has its type), which the
// caller picks by m.base. Division and remainder are unsigned, by constants
// (strength-reduced by LLVM).
llvm::Value* emit_index_map(llvm::IRBuilderBase& b, llvm::Value* flat, const IndexMap& m);

// Coordinate d of a value read at `at`, from the flat index `flat` that at.prefix
// starts from (the iteration index, or a concat's computed index): the index map of
// a one-dim step, shift[d] + scale[d] * the space's coordinate (shift[d] where the
// value is broadcast along d).
llvm::Value* emit_coordinate(llvm::IRBuilderBase& b, llvm::Value* flat, const ValueIndex& at, int d);

// ---- index ops ---------------------------------------------------------------------------

// The row that an index (an i64) names in a dim of `rows` rows starting at `offset`:
// `row` is index - offset where `in_range` (index >= offset and index - offset < rows,
// compared without overflow for any int64s), 0 elsewhere, so a load at it stays in the
// dim whenever rows > 0; the caller zeroes the value where !in_range (the reference's
// rule, codegen/reference/evaluate_index.h). The embedding kernel and GroupValues's
// gather and index_select share it.
struct MaskedRow {
  llvm::Value* row = nullptr;       // i64
  llvm::Value* in_range = nullptr;  // i1
};
MaskedRow masked_row(llvm::IRBuilderBase& b, llvm::Value* index, int64_t offset, int64_t rows);

// ---- the kernel ABI (emitter.h) --------------------------------------------------------

// A kernel function as emitter.h's ABI has it, with the builder at its entry block:
//   NVPTX: `void entry(ptr addrspace(1) in0, ..., out0, ...)`, inputs readonly,
//          marked a kernel of at most `max_threads` threads per block;
//   host:  `void entry(ptr args, <host_extra>...)`, the pointers loaded from args
//          (host_extra: the extra parameters of an emitter's host simulation of its
//          GPU kernel, read with fn->getArg(1 + i)).
// `num_extra` pointers follow the outputs (the TMA tensor maps of a wgmma matmul:
// NVPTX parameters `tmap0`, ..., readonly; on the host more slots of args), in
// `extra`. Every emitter makes its entry here, the matmuls' host simulations too.
struct KernelEntry {
  llvm::Function* fn = nullptr;
  std::vector<llvm::Value*> in, out, extra;
};
KernelEntry begin_kernel(llvm::Module& m, llvm::IRBuilderBase& b, const std::string& entry, size_t num_in,
                         size_t num_out, const llvmb::Target& target, int max_threads = 0,
                         const std::vector<llvm::Type*>& host_extra = {}, size_t num_extra = 0);
// The two halves of begin_kernel, for emitters that know their target.
KernelEntry begin_nvptx_kernel(llvm::Module& m, llvm::IRBuilderBase& b, const std::string& entry, size_t num_in,
                               size_t num_out, int max_threads, size_t num_extra = 0);
KernelEntry begin_host_kernel(llvm::Module& m, llvm::IRBuilderBase& b, const std::string& entry, size_t num_in,
                              size_t num_out, const std::vector<llvm::Type*>& host_extra = {}, size_t num_extra = 0);

// ---- loops ------------------------------------------------------------------------

// What LLVM's loop vectoriser is asked to do with one loop, as `!llvm.loop` metadata
// on the loop's latch branch (LangRef, "llvm.loop"); honoured by the O3 pipeline of
// the host JIT (backend.cpp run_o3: LoopVectorize with interleaving on). All zero:
// no metadata at all, the loop is left to LLVM's cost model.
//   vector_width > 1: llvm.loop.vectorize.enable true + llvm.loop.vectorize.width N.
//     "enable" (like clang's `#pragma clang loop vectorize(enable)`) also lets the
//     vectoriser reorder a float reduction into per-lane partial sums, which it
//     refuses without a hint or `reassoc` flags (LoopVectorizeHints::allowReordering).
//   vector_width == 1: llvm.loop.vectorize.width 1, the loop stays scalar; with
//     interleave > 1 also vectorize.enable true, so that a scalar float reduction
//     may be interleaved into `interleave` partial sums.
//   interleave > 0: llvm.loop.interleave.count M (1: no interleaving).
//   any: llvm.loop.unroll.disable, so that the unroller neither dissolves a loop with
//     a small constant trip count before the vectoriser sees it nor unrolls the
//     vector loop after it: a hinted loop's body is vector_width x interleave
//     elements (the interleave count is the unroll knob).
// Forcing is a request, not a guarantee: a loop that is not legal to vectorise (a
// call with no vector form, a dependence) stays as it is, and stays correct.
struct LoopHints {
  int vector_width = 0;  // 0: LLVM's choice
  int interleave = 0;    // 0: LLVM's choice
  bool any() const { return vector_width != 0 || interleave != 0; }
  bool operator==(const LoopHints&) const = default;
};

// The hints of a host kernel's innermost loops: KernelConfig::host_vector and
// host_interleave.
LoopHints host_loop_hints(const KernelConfig& c);

// The host knobs' ranges, checked by every emitter for the host target (the GPU
// knobs are not read there, and the host knobs are not read on NVPTX):
//   host_vector in {0, 1, 2, 4, ..., 64}, host_interleave in {0, 1, 2, 4, 8, 16}
//   (LLVM ignores widths and counts that are not powers of two up to those limits),
//   host_tile_n in {0} or 1..1024 (read by the matmul emitter only).
// nullopt when they are in range, else a message naming the field and its value.
std::optional<std::string> host_knob_error(const KernelConfig& c);

// A counted loop `for (i = begin; i < end; i += step) body(i)` at the builder's
// insertion point (signed compare; the index type must leave room for end + step,
// so the increment is marked nuw/nsw). A Diag from the body stops emission and is
// returned; on success the builder is left in the exit block. `hints` (when any())
// become the loop's `!llvm.loop` metadata; hint only loops whose body is
// straight-line (the innermost), since the latch is the body's last block.
Result<void> emit_loop(llvm::IRBuilderBase& b, llvm::Value* begin, llvm::Value* end, llvm::Value* step,
                       const std::string& name, const std::function<Result<void>(llvm::Value*)>& body,
                       const LoopHints& hints = {});

// The `!llvm.loop` node for `hints` (a distinct node whose first operand is itself),
// or nullptr when !hints.any(). emit_loop attaches it; exposed for tests.
llvm::MDNode* loop_metadata(llvm::LLVMContext& c, const LoopHints& hints);

// ---- elementwise categories --------------------------------------------------------

bool is_elementwise(OpKind k);  // unary, binary, compare, where (after decomposition)
bool is_view(OpKind k);         // transpose, permute, reshape, expand, slice, concat, gather, index_select
// Ops GroupValues computes from the element's coordinates (emit_coordinate) rather
// than with ElementCodegen::elementwise: generators (arange, full: no operand, no
// memory read) and positional ops (tril, triu: their operand's same element, kept or
// zeroed by its row and column; dropout: kept or zeroed by its global index).
bool is_coordinate_op(OpKind k);

// ---- element code ------------------------------------------------------------------

// A computed element: its compute-type LLVM value and the dtype it stands for.
struct Elem {
  llvm::Value* value = nullptr;
  DType dtype = DType::F32;
};

// The math functions a target provides: libdevice on NVPTX, libm on the host.
enum class MathFn { Exp, Log, Tanh, Erf, Sin, Cos, Rsqrt, Pow };

// Builds element code at the builder's insertion point for one target. Stateless
// apart from the declarations it adds to the module; cheap to construct.
class ElementCodegen {
 public:
  ElementCodegen(llvm::IRBuilderBase& b, llvm::Module& m, const llvmb::Target& target,
                 Precision precision = Precision::Fused);

  // Memory. `index` counts elements of dtype t from `ptr` (any address space).
  Elem load(DType t, llvm::Value* ptr, llvm::Value* index);
  void store(Elem v, llvm::Value* ptr, llvm::Value* index);
  // Storage <-> compute for a value already loaded or about to be stored (vector
  // lanes use these around their own wide loads and stores).
  llvm::Value* widen(DType t, llvm::Value* stored);
  llvm::Value* narrow(DType t, llvm::Value* compute);
  // `lanes` (compute values of dtype t) as a vector of t's storage type, ready for one
  // wide store: NVPTX sm_80+ converts f16/bf16 two at a time (cvt.rn.bf16x2.f32 /
  // cvt.rn.f16x2.f32, one instruction per pair); elsewhere narrow() per lane.
  llvm::Value* narrow_vector(DType t, const std::vector<llvm::Value*>& lanes);
  // `n` (a power of two) consecutive elements of dtype t at ptr[index], as compute
  // values, in accesses of at most 16 bytes (the widest global access: ld.global.v4),
  // each aligned to its own size: the caller checks the pointer's alignment.
  std::vector<Elem> load_vector(DType t, llvm::Value* ptr, llvm::Value* index, int n);
  // The same for a store of lanes.size() elements (narrow_vector per piece).
  void store_vector(DType t, llvm::Value* ptr, llvm::Value* index, const std::vector<llvm::Value*>& lanes);
  // The bytes of one piece of an n-element vector access of dtype t.
  static int64_t vector_piece_bytes(DType t, int n) { return std::min<int64_t>(16, int64_t{n} * dtype_size(t)); }

  // A number literal of dtype t as an immediate (rounded to t as the reference does).
  Elem constant(double v, DType t);
  // `v` rounded to t and kept in t's compute type: a no-op but for f16/bf16.
  llvm::Value* round_to(DType t, llvm::Value* v);
  // A computed node result of dtype t (an op's, a reduction's, a matmul's): rounded
  // to t under Precision::Eager, kept as it is (f32) under Precision::Fused.
  llvm::Value* node_result(DType t, llvm::Value* v) { return precision_ == Precision::Eager ? round_to(t, v) : v; }
  Precision precision() const { return precision_; }
  // torch's .to(dtype): floats to integers truncate toward zero and saturate (NaN ->
  // 0), integers to floats round once to nearest even, i64 -> i32 wraps, anything ->
  // bool is != 0 (NaN is true).
  Elem convert(Elem v, DType to);

  // One elementwise op (is_elementwise(k)) on operands of any dtypes, producing a
  // value of dtype `result` (the node's type). A Diag for any other op.
  // `rounded_to_16bit`: the value reaches the kernel's outputs only through a rounding
  // to f16/bf16 (rounded_to_16bit below), so f32 math may take its cheaper 16-bit
  // forms (erf_for_16bit) under Precision::Fused.
  Result<Elem> elementwise(OpKind k, std::span<const Elem> args, DType result, bool rounded_to_16bit = false);

  // f32 math: libdevice (__nv_expf ...) on NVPTX, libm (expf ...) on the host.
  // Accuracy first: no fast-math flags.
  llvm::Value* math(MathFn f, llvm::Value* x, llvm::Value* y = nullptr);
  // erf for a value that is rounded to f16/bf16 before anyone sees it (a 16-bit node
  // under Precision::Fused): two short polynomials and one exp2 instead of libdevice's
  // erff, within 2e-7 of erf (absolute, and relative for normal results) (docs/kernels.md, "erf for 16-bit results").
  llvm::Value* erf_for_16bit(llvm::Value* x);
  // 1 + erf(z) for a result rounded to f16/bf16 (GELU's factor; GroupValues spots the
  // add): erfc(-z), with erfc(t) = s * 2^(-t^2 log2(e) + p(s)), s = 1 / (1 + t/2), p
  // a degree-9 polynomial (scripts/fit-erfc.py), 2 - erfc(z) for z >= 0. Within
  // 1e-5 relative of the float64 value for every f32 z, about 19 instructions where
  // erf_for_16bit and the add take 30, and no cancellation where erf(z) nears -1
  // (docs/kernels.md, "erf for 16-bit results").
  Elem one_plus_erf_for_16bit(Elem z, DType result);
  // GELU(x) = x/2 (1 + erf(x / sqrt 2)) for a result rounded to f16/bf16 (GroupValues
  // spots the decomposed GELU's product): max(x, 0) - |x| erfc(|x| / sqrt 2) / 2, the
  // erfc of one_plus_erf_for_16bit with the halving folded in. No select; about 18
  // instructions where one_plus_erf_for_16bit and the multiplies around it take 22.
  // Within 1e-5 relative of the float64 GELU (docs/kernels.md, "erf for 16-bit results").
  Elem gelu_for_16bit(Elem x, DType result);

  llvm::IRBuilderBase& builder() { return b_; }
  const llvmb::Target& target() const { return target_; }

 private:
  llvm::Value* to_compute(Elem v, DType result);  // operand -> result's compute type, unrounded
  // erfc(a * t_per_a) / inv_scale for a >= 0 (inv_scale a power of two), the erfc of
  // one_plus_erf_for_16bit and gelu_for_16bit (element_erf.cpp).
  llvm::Value* scaled_erfc(llvm::Value* a, double t_per_a, float inv_scale);
  llvm::Value* bf16_round_bits(llvm::Value* f32);   // float -> i16 bits, RNE, quiet NaN
  llvm::Value* int_to_bf16(llvm::Value* i);  // i32/i64 -> bf16 value in f32, one rounding
  llvm::Value* int_pow(llvm::Value* a, llvm::Value* e, llvm::Type* result);
  Result<Elem> compare(OpKind k, Elem a, Elem b);

  llvm::IRBuilderBase& b_;
  llvm::Module& m_;
  llvmb::Target target_;
  Precision precision_ = Precision::Fused;
  int sm_ = 0;  // NVPTX compute capability (80 for sm_80, sm_90a -> 90); 0 on the host
};

// The values of a group graph at one iteration index, as element code: params are
// loaded through their offset maps, constants are immediates, elementwise ops are
// computed, views only change the index, generators and tril/triu are computed from
// the element's coordinates (STYLE.md #2: every op is handled from the op table's
// categories). Values are memoised per (value, index) until the next
// at_index(), so a value shared by several outputs or uses is computed once.
// Emitters drive it: the pointwise emitter asks for each output at a flat index; a
// reduction emitter asks for its input at (row, k) and hooks its accumulators in.
// Per node of `g` (a kernel's group graph): whether its value reaches the group's
// outputs only through a rounding to f16/bf16 under Precision::Fused: every path from
// it to an output runs through elementwise arithmetic and views and ends at a cast to
// f16/bf16 or at an f16/bf16 output (stored rounded). A comparison, a where, a cast to
// an integer, a reduction or an f32 output on the way exposes the f32 value: false.
// The decomposed GELU of a bf16 tensor (f32 inside, cast back at the end) is the case
// that matters.
std::vector<bool> rounded_to_16bit(const Graph& g);

class GroupValues {
 public:
  // Called for every value before the default handling; a value it returns is used
  // instead (a lane of a vector load, a reduction's result). nullopt: the default.
  using Hook = std::function<std::optional<Elem>(ValueId v, const ValueIndex& at)>;

  // `inputs`: one pointer per g.params(), in order (any address space).
  GroupValues(const Graph& g, ElementCodegen& cg, std::vector<llvm::Value*> inputs);

  // Starts a new iteration index: the flat index param maps are applied to.
  void at_index(llvm::Value* flat, Hook hook = {});
  // The coordinates of the current index in `space` (integer values), when the
  // emitter has them (a matmul epilogue over its output): arange and tril/triu read
  // them instead of dividing the flat index. Until the next at_index().
  void known_coordinates(Shape space, std::vector<llvm::Value*> coords) {
    coord_space_ = std::move(space);
    coords_ = std::move(coords);
  }
  // Value `v` read at `at`. A Diag (at the node) for nodes that are neither leaves,
  // elementwise nor views, unless the hook supplies them.
  Result<Elem> value(ValueId v, const ValueIndex& at);

  // Value `v` as an output stores it: value(v, at), except that a cast of a float to
  // f16/bf16 gives its operand unrounded with the cast's dtype (the store rounds it,
  // and rounding twice to the same dtype is rounding once). Only for a value handed
  // straight to ElementCodegen::store / store_vector / narrow_vector.
  Result<Elem> output_value(ValueId v, const ValueIndex& at);

  // The (param, offset map) pairs that value(v, at) reads, without emitting code.
  std::vector<std::pair<int, IndexMap>> reads(ValueId v, const ValueIndex& at) const;
  // The position of param `v` among g.params(), or -1.
  int param_slot(ValueId v) const { return param_slot_[static_cast<size_t>(v)]; }
  // Whether add(erf(z), 1) under a 16-bit rounding becomes
  // ElementCodegen::one_plus_erf_for_16bit (default: yes).
  void fold_one_plus_erf(bool on) { fold_erfc_ = on; }
  // Whether GELU's product under a 16-bit rounding becomes
  // ElementCodegen::gelu_for_16bit (default: yes).
  void fold_gelu(bool on) { fold_gelu_ = on; }

 private:
  // arange, full, tril, triu, dropout at `at` (is_coordinate_op).
  Result<Elem> coordinate_value(ValueId v, const ValueIndex& at);
  // `v` is add(erf(z), 1) (either order, a scalar constant 1) whose erf takes its
  // 16-bit form: that erf node, which value() then skips for
  // ElementCodegen::one_plus_erf_for_16bit; nullopt otherwise.
  std::optional<ValueId> one_plus_erf_operand(ValueId v) const;
  // `v` is GELU's product mul(mul(x, 0.5), add(erf(mul(x, 1/sqrt 2)), 1)) (each
  // product and sum in either order, f32 of one shape, scalar literals), rounded to 16
  // bits under Precision::Fused: x, which value() hands to
  // ElementCodegen::gelu_for_16bit; nullopt otherwise. Off with fold_gelu(false).
  std::optional<ValueId> gelu_operand(ValueId v) const;

  const Graph& g_;
  ElementCodegen& cg_;
  std::vector<llvm::Value*> inputs_;
  std::vector<int> param_slot_;
  std::vector<bool> rounded16_;  // rounded_to_16bit(g_)
  bool fold_erfc_ = true;        // fold_one_plus_erf
  bool fold_gelu_ = true;        // fold_gelu
  // A concat: each operand read at its own clamped index, then a select by the
  // coordinate along the dim.
  Result<Elem> concat_value(ValueId v, const ValueIndex& at);
  // gather, index_select: the index read at its element, x at the (masked) row it names.
  Result<Elem> lookup_value(ValueId v, const ValueIndex& at);
  // The flat index an IndexMap with this base starts from; nullptr for none.
  llvm::Value* index_value(int base) const;

  static constexpr int kMaxValuesPerElement = 1 << 14;
  int evaluated_ = 0;  // values computed since at_index()
  llvm::Value* flat_ = nullptr;
  std::vector<llvm::Value*> computed_;  // the computed indices (IndexMap::base 1, 2, ...)
  Hook hook_;
  Shape coord_space_;                  // known_coordinates()
  std::vector<llvm::Value*> coords_;
  std::unordered_map<std::string, Elem> memo_;
};

// ---- dropout (element_dropout.cpp) ----------------------------------------------------

// dropout's random word for the element at global row-major index `index` (an i64
// value): codegen/ir/dropout.h's dropout_word as 32-bit integer IR (Philox4x32-10;
// the key is the seed, a constant; each round's high products mul.hi.u32 on NVPTX).
// An i32.
llvm::Value* emit_dropout_word(llvm::IRBuilderBase& b, const llvmb::Target& target, uint64_t seed, llvm::Value* index);
// Dropout node `n` of its operand's element `x` at global index `index`:
// x * (word >= ceil(p * 2^32) ? 1/(1-p) : 0) in the node's dtype.
Result<Elem> emit_dropout(ElementCodegen& cg, const Node& n, Elem x, llvm::Value* index, bool rounded_to_16bit);

// The SM number of an NVPTX arch ("sm_90a" -> 90); nullopt when it is not one.
std::optional<int> sm_version(const std::string& arch);

}  // namespace sf::kernels
