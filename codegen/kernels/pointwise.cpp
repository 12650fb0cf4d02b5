#include "codegen/kernels/pointwise.h"

#include <algorithm>
#include <cctype>
#include <functional>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include <llvm/IR/Constants.h>
#include <llvm/IR/Function.h>
#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/IntrinsicsNVPTX.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>

#include "codegen/kernels/element.h"

namespace sf {

namespace {

using kernels::ElementCodegen;
using kernels::is_c_identifier;
using kernels::emit_loop;
using kernels::Elem;
using kernels::IndexMap;
using kernels::ValueIndex;

Diag diag(std::string msg, SourceLoc loc = {}) { return Diag{"", loc, "pointwise: " + std::move(msg)}; }

int64_t tile_elems(const KernelConfig& c) {
  return static_cast<int64_t>(c.block) * c.vector * c.elems_per_thread;
}

// What the group must be and what the config may be; the iteration size n on success.
Result<int64_t> check(const KernelSpec& spec, const KernelConfig& c, const llvmb::Target& t) {
  const Graph& g = spec.group;
  if (!is_c_identifier(spec.entry)) return diag("entry '" + spec.entry + "' is not a C identifier");
  if (t.kind == llvmb::Target::Kind::NVPTX && !kernels::sm_version(t.arch))
    return diag("unknown NVPTX arch '" + t.arch + "' (expected sm_NN or sm_NNa)");
  if (c.block < 1 || c.block > 1024)
    return diag("block = " + std::to_string(c.block) + " threads is outside 1..1024 (the CUDA limit)");
  if (c.vector < 1 || c.vector > 16 || (c.vector & (c.vector - 1)) != 0)
    return diag("vector = " + std::to_string(c.vector) + " is not a power of two in 1..16");
  if (c.elems_per_thread < 1 || c.elems_per_thread > 64)
    return diag("elems_per_thread = " + std::to_string(c.elems_per_thread) + " is outside 1..64");
  if (c.max_blocks < 1) return diag("max_blocks = " + std::to_string(c.max_blocks) + " must be positive");
  if (t.kind == llvmb::Target::Kind::Host)
    if (std::optional<std::string> e = kernels::host_knob_error(c)) return diag(*e);
  if (g.outputs().empty()) return diag("group '" + g.name() + "' has no outputs");
  for (const Node& n : g.nodes()) {
    if (n.op == OpKind::Param || n.op == OpKind::Constant || kernels::is_elementwise(n.op) ||
        kernels::is_view(n.op) || kernels::is_coordinate_op(n.op))
      continue;
    std::string who = std::string(op_name(n.op)) + (n.name.empty() ? "" : " '" + n.name + "'");
    return diag("group '" + g.name() + "' contains " + who +
                    ", which is neither elementwise nor a view (the " +
                    (op_info(n.op).category == OpCategory::Composite ? "graph must be decomposed first"
                                                                     : "fusion pass must give it another kernel kind") +
                    ")",
                n.loc);
  }
  const Node& first = g.node(g.outputs()[0].value);
  int64_t n = numel(first.type.shape);
  for (const Output& o : g.outputs()) {
    const TensorType& ty = g.node(o.value).type;
    if (numel(ty.shape) != n)
      return diag("outputs differ in element count: '" + g.outputs()[0].name + "' is " + first.type.str() +
                      " but '" + o.name + "' is " + ty.str() + " (a pointwise kernel has one index space)",
                  o.loc);
  }
  if (t.kind == llvmb::Target::Kind::NVPTX && !c.grid_stride) {
    int64_t tiles = (n + tile_elems(c) - 1) / tile_elems(c);
    if (tiles > 0x7FFFFFFF)
      return diag(std::to_string(tiles) + " blocks exceed the grid limit 2^31-1; use grid_stride");
  }
  return n;
}

// Every output's element at one flat index, in output order (each output is written
// densely, so it is read at its own dense index), as stored (GroupValues::output_value:
// a final cast to 16 bits is left to the store's rounding).
Result<std::vector<Elem>> outputs_at(const Graph& g, kernels::GroupValues& values, llvm::Value* flat,
                                     kernels::GroupValues::Hook hook = {}) {
  values.at_index(flat, std::move(hook));
  std::vector<Elem> out;
  for (const Output& o : g.outputs()) {
    Result<Elem> e = values.output_value(o.value, kernels::dense_index(g.node(o.value).type.shape));
    if (!e) return e.error();
    out.push_back(*e);
  }
  return out;
}


// ---- NVPTX -------------------------------------------------------------------------------

class NvptxPointwise {
 public:
  // `simulate`: the same kernel as a host function running one thread (see
  // emit_pointwise_thread_on_host); `target` is then the host.
  NvptxPointwise(const KernelSpec& spec, const KernelConfig& cfg, const llvmb::Target& target, int64_t n,
                 llvm::Module& m, bool simulate = false)
      : spec_(spec), g_(spec.group), cfg_(cfg), target_(target), n_(n), m_(m), b_(m.getContext()),
        simulate_(simulate) {}

  Result<void> build() {
    llvm::LLVMContext& c = m_.getContext();
    const size_t np = g_.params().size(), no = g_.outputs().size();
    const int64_t T = tile_elems(cfg_);
    // i32 index arithmetic where every value it forms (at most n + one tile, or an
    // offset into the group's largest value: a slice reads a larger operand) fits:
    // half the registers and cheaper multiplies than i64.
    it_ = std::max(n_, kernels::largest_value(g_)) + T < (int64_t{1} << 31) ? b_.getInt32Ty() : b_.getInt64Ty();
    llvm::Value *bid = nullptr, *nblocks = nullptr;
    if (!simulate_) {
      kernels::KernelEntry ke = kernels::begin_kernel(m_, b_, spec_.entry, np, no, target_, cfg_.block);
      fn_ = ke.fn;
      in_ = ke.in;
      out_ = ke.out;
      auto sreg = [&](llvm::Intrinsic::ID id) { return b_.CreateZExt(b_.CreateIntrinsic(id, {}, {}), it_); };
      tid_ = sreg(llvm::Intrinsic::nvvm_read_ptx_sreg_tid_x);
      bid = sreg(llvm::Intrinsic::nvvm_read_ptx_sreg_ctaid_x);
      nblocks = sreg(llvm::Intrinsic::nvvm_read_ptx_sreg_nctaid_x);
    } else {
      // void entry(ptr args, i32 blockIdx.x, i32 threadIdx.x, i32 gridDim.x)
      llvm::Type* i32 = b_.getInt32Ty();
      kernels::KernelEntry ke = kernels::begin_kernel(m_, b_, spec_.entry, np, no, target_, 0, {i32, i32, i32});
      fn_ = ke.fn;
      in_ = ke.in;
      out_ = ke.out;
      bid = b_.CreateZExt(fn_->getArg(1), it_);
      tid_ = b_.CreateZExt(fn_->getArg(2), it_);
      nblocks = b_.CreateZExt(fn_->getArg(3), it_);
    }
    fn_->setDoesNotThrow();
    cg_.emplace(b_, m_, target_, spec_.precision);
    values_.emplace(g_, *cg_, in_);
    const int64_t ntiles = (n_ + T - 1) / T, nfull = n_ / T;

    // Which params are read in dense runs (vector loads) and need the alignment check.
    for (const Output& o : g_.outputs())
      for (auto& [p, map] : values_->reads(o.value, kernels::dense_index(g_.node(o.value).type.shape)))
        if (kernels::dense_runs(map, cfg_.vector)) {
          vec_params_.insert(p);
          dense_reads_.emplace_back(p, map);
        }
    llvm::Value* aligned = b_.getTrue();
    if (cfg_.vector > 1 && nfull > 0) {
      int64_t mask_bits = 0;
      std::vector<std::pair<llvm::Value*, DType>> ptrs;
      for (int p : vec_params_)
        ptrs.emplace_back(in_[static_cast<size_t>(p)], g_.node(g_.params()[static_cast<size_t>(p)]).type.dtype);
      for (size_t o = 0; o < no; ++o) ptrs.emplace_back(out_[o], g_.node(g_.outputs()[o].value).type.dtype);
      llvm::Value* bits = b_.getInt64(0);
      for (auto& [ptr, dt] : ptrs) {
        // Each piece is aligned to its own size when the base pointer is.
        int64_t need = piece_bytes(dt);
        bits = b_.CreateOr(bits, b_.CreateAnd(b_.CreatePtrToInt(ptr, b_.getInt64Ty()), need - 1));
        mask_bits |= need - 1;
      }
      if (mask_bits) aligned = b_.CreateICmpEQ(bits, b_.getInt64(0), "aligned");
    }

    llvm::BasicBlock* exit = llvm::BasicBlock::Create(c, "exit", fn_);
    auto tile_body = [&](llvm::Value* tile) -> Result<void> {
      llvm::BasicBlock* vec = llvm::BasicBlock::Create(c, "full", fn_);
      llvm::BasicBlock* tail = llvm::BasicBlock::Create(c, "tail", fn_);
      llvm::BasicBlock* next = llvm::BasicBlock::Create(c, "tile.done", fn_);
      llvm::Value* tile_base = b_.CreateMul(tile, k(T), "tile.base", true, true);
      llvm::Value* full = b_.CreateAnd(b_.CreateICmpSLT(tile, k(nfull)), aligned);
      b_.CreateCondBr(full, vec, tail);

      // A full tile: elems_per_thread vectors per thread, a block apart, so that each
      // warp-wide access covers one contiguous span (coalesced), no bounds checks. The
      // vectors go in batches (batch_vectors()), each batch's loads issued before any
      // of its stores, so a thread has that many loads in flight.
      b_.SetInsertPoint(vec);
      const int batch = batch_vectors();
      auto step = [&](llvm::Value* it) -> Result<void> {
        std::vector<llvm::Value*> bases;
        for (int j = 0; j < batch; ++j) {
          llvm::Value* kk = b_.CreateAdd(b_.CreateMul(it, k(batch), "", true, true), k(j), "", true, true);
          llvm::Value* slot = b_.CreateAdd(b_.CreateMul(kk, k(cfg_.block), "", true, true), tid_, "", true, true);
          llvm::Value* off = b_.CreateMul(slot, k(cfg_.vector), "", true, true);
          bases.push_back(b_.CreateAdd(tile_base, off, "base", true, true));
        }
        return vector_batch(bases);
      };
      const int iters = cfg_.elems_per_thread / batch;
      Result<void> r = iters == 1 ? step(k(0)) : emit_loop(b_, k(0), k(iters), k(1), "ept", step);
      if (!r) return r;
      b_.CreateBr(next);

      // The last, partial tile (or any tile when a pointer is misaligned): one element
      // per thread a block apart, bounds-checked, until the index passes n.
      b_.SetInsertPoint(tail);
      llvm::Value* first = b_.CreateAdd(tile_base, tid_, "", true, true);
      llvm::Value* end = b_.CreateAdd(tile_base, k(T), "", true, true);
      llvm::Value* stop = b_.CreateSelect(b_.CreateICmpSLT(end, k(n_)), end, k(n_));
      r = emit_loop(b_, first, stop, k(cfg_.block), "elem", [&](llvm::Value* i) { return scalar_step(i); });
      if (!r) return r;
      b_.CreateBr(next);
      b_.SetInsertPoint(next);
      return {};
    };

    if (cfg_.grid_stride) {
      // for (tile = blockIdx.x; tile < ntiles; tile += gridDim.x)
      Result<void> r = emit_loop(b_, bid, k(ntiles), nblocks, "tile", tile_body);
      if (!r) return r;
      b_.CreateBr(exit);
    } else {
      llvm::BasicBlock* body = llvm::BasicBlock::Create(c, "tile", fn_);
      b_.CreateCondBr(b_.CreateICmpSLT(bid, k(ntiles)), body, exit);
      b_.SetInsertPoint(body);
      Result<void> r = tile_body(bid);
      if (!r) return r;
      b_.CreateBr(exit);
    }
    b_.SetInsertPoint(exit);
    b_.CreateRetVoid();
    return {};
  }

 private:
  llvm::Value* k(int64_t v) { return llvm::ConstantInt::get(it_, static_cast<uint64_t>(v)); }

  // Vector accesses are split into pieces of at most 16 bytes, the widest global
  // access (ld.global.v4.b32 / v2.b64): 4 x f32, 8 x f16/bf16, 2 x i64, 16 x bool.
  int64_t piece_bytes(DType t) const { return ElementCodegen::vector_piece_bytes(t, cfg_.vector); }

  // Vectors per batch of a full tile's elems_per_thread: the largest divisor of it up
  // to kBatch, so the batches divide it evenly.
  static constexpr int kBatch = 4;
  int batch_vectors() const {
    int b = std::min(cfg_.elems_per_thread, kBatch);
    while (cfg_.elems_per_thread % b != 0) --b;
    return b;
  }

  // Vectors of `vector` elements at `bases` (multiples of vector, all in bounds,
  // disjoint): every dense run of every vector loaded first, then each vector's
  // values computed and stored. A load may come before another vector's stores: an
  // output shares a buffer only with an input read at the same index ("The kernel
  // ABI"), and the vectors' indices are disjoint.
  Result<void> vector_batch(const std::vector<llvm::Value*>& bases) {
    const int V = cfg_.vector;
    std::vector<Lanes> lanes(bases.size());
    if (V > 1)
      for (size_t j = 0; j < bases.size(); ++j)
        for (const auto& [p, map] : dense_reads_) load_lanes(lanes[j], bases[j], p, map);
    for (size_t j = 0; j < bases.size(); ++j)
      if (Result<void> r = vector_step(bases[j], lanes[j]); !r) return r;
    return {};
  }

  // (param, map) -> its V elements at a vector's base.
  using Lanes = std::map<std::string, std::vector<Elem>>;
  const std::vector<Elem>& load_lanes(Lanes& lanes, llvm::Value* base, int p, const IndexMap& map) {
    std::string key = std::to_string(p) + "#" + map.str();
    auto it = lanes.find(key);
    if (it != lanes.end()) return it->second;
    DType dt = g_.node(g_.params()[static_cast<size_t>(p)]).type.dtype;
    llvm::Value* at = kernels::emit_index_map(b_, base, map);
    std::vector<Elem> v = cg_->load_vector(dt, in_[static_cast<size_t>(p)], at, cfg_.vector);
    return lanes.emplace(std::move(key), std::move(v)).first->second;
  }

  // One vector of `vector` elements at `base` (a multiple of vector, all in bounds),
  // its dense runs from `lanes` (vector_batch loaded them), or loaded where lane 0
  // first reads them, which dominates every later lane (lanes are emitted in order,
  // as straight-line code).
  Result<void> vector_step(llvm::Value* base, Lanes& lanes) {
    const int V = cfg_.vector;

    std::vector<std::vector<Elem>> results(g_.outputs().size());  // [output][lane]
    for (int l = 0; l < V; ++l) {
      llvm::Value* flat = l == 0 ? base : b_.CreateAdd(base, k(l), "", true, true);
      auto hook = [&](ValueId v, const ValueIndex& at) -> std::optional<Elem> {
        const Node& n = g_.node(v);
        if (V == 1 || n.op != OpKind::Param) return std::nullopt;
        IndexMap map = kernels::offset_map(at, n.type.shape);
        if (!kernels::dense_runs(map, V)) return std::nullopt;  // a scalar load per lane
        return load_lanes(lanes, base, values_->param_slot(v), map)[static_cast<size_t>(l)];
      };
      Result<std::vector<Elem>> r = outputs_at(g_, *values_, flat, hook);
      if (!r) return r.error();
      for (size_t o = 0; o < r->size(); ++o) results[o].push_back((*r)[o]);
    }
    for (size_t o = 0; o < results.size(); ++o) {
      if (V == 1) {
        cg_->store(results[o][0], out_[o], base);
        continue;
      }
      std::vector<llvm::Value*> vals;
      for (const Elem& e : results[o]) vals.push_back(e.value);
      cg_->store_vector(g_.node(g_.outputs()[o].value).type.dtype, out_[o], base, vals);
    }
    return {};
  }

  Result<void> scalar_step(llvm::Value* i) {
    Result<std::vector<Elem>> r = outputs_at(g_, *values_, i);
    if (!r) return r.error();
    for (size_t o = 0; o < r->size(); ++o) cg_->store((*r)[o], out_[o], i);
    return {};
  }

  const KernelSpec& spec_;
  const Graph& g_;
  const KernelConfig& cfg_;
  const llvmb::Target& target_;
  int64_t n_;
  llvm::Module& m_;
  llvm::IRBuilder<> b_;
  bool simulate_ = false;
  llvm::Function* fn_ = nullptr;
  std::vector<llvm::Value*> in_, out_;
  std::optional<ElementCodegen> cg_;
  std::optional<kernels::GroupValues> values_;
  llvm::Type* it_ = nullptr;
  llvm::Value* tid_ = nullptr;
  std::set<int> vec_params_;
  // The (param, map) pairs the outputs read in dense runs of `vector` (vector loads).
  std::vector<std::pair<int, IndexMap>> dense_reads_;
};

// ---- host ---------------------------------------------------------------------------------

// `void entry(ptr args)`: one loop over the n elements, inputs then outputs in args.
// The body is straight-line element code (dense operands indexed by i itself), which
// LLVM's loop vectoriser turns into SIMD code for the host CPU; host_vector and
// host_interleave, when set, are its width and interleave count (element.h LoopHints).
Result<void> build_host(const KernelSpec& spec, const KernelConfig& cfg, const llvmb::Target& target, int64_t n,
                        llvm::Module& m) {
  llvm::LLVMContext& c = m.getContext();
  const Graph& g = spec.group;
  llvm::IRBuilder<> b(c);
  const size_t np = g.params().size(), no = g.outputs().size();
  kernels::KernelEntry ke = kernels::begin_kernel(m, b, spec.entry, np, no, target);
  std::vector<llvm::Value*> in = ke.in, out = ke.out;
  ElementCodegen cg(b, m, target, spec.precision);
  kernels::GroupValues values(g, cg, in);
  Result<void> r = emit_loop(b, b.getInt64(0), b.getInt64(n), b.getInt64(1), "i", [&](llvm::Value* i) -> Result<void> {
    Result<std::vector<Elem>> e = outputs_at(g, values, i);
    if (!e) return e.error();
    for (size_t o = 0; o < no; ++o) cg.store((*e)[o], out[o], i);
    return {};
  }, kernels::host_loop_hints(cfg));
  if (!r) return r;
  b.CreateRetVoid();
  return {};
}

}  // namespace

LaunchShape pointwise_launch(int64_t n, const KernelConfig& c) {
  LaunchShape l;
  int64_t T = tile_elems(c);
  int64_t tiles = T > 0 ? (n + T - 1) / T : 0;
  if (c.grid_stride) tiles = std::min<int64_t>(tiles, c.max_blocks);
  l.grid = {std::max<int64_t>(tiles, 1), 1, 1};
  l.block = {c.block, 1, 1};
  l.persistent = c.grid_stride && int64_t{c.max_blocks} * c.block <= kPersistentGridThreads;
  return l;
}

Result<EmittedKernel> emit_pointwise(const KernelSpec& spec, const KernelConfig& config,
                                     const llvmb::Target& target) {
  Result<int64_t> n = check(spec, config, target);
  if (!n) return n.error();
  EmittedKernel k;
  k.context = std::make_unique<llvm::LLVMContext>();
  k.module = std::make_unique<llvm::Module>(spec.entry, *k.context);
  llvmb::prepare_module(*k.module, target);
  k.entry = spec.entry;
  Result<void> built = target.kind == llvmb::Target::Kind::NVPTX
                           ? NvptxPointwise(spec, config, target, *n, *k.module).build()
                           : build_host(spec, config, target, *n, *k.module);
  if (!built) return built.error();
  if (auto err = llvmb::verify(*k.module))  // an emitter bug, not a user error: say so
    return diag("internal: the emitted module does not verify: " + *err);
  if (target.kind == llvmb::Target::Kind::NVPTX) k.launch = pointwise_launch(*n, config);
  return k;
}

Result<EmittedKernel> emit_pointwise_thread_on_host(const KernelSpec& spec, const KernelConfig& config) {
  const llvmb::Target host = llvmb::Target::host();
  // Checked as for sm_90a: the same limits apply to the kernel being simulated.
  Result<int64_t> n = check(spec, config, llvmb::Target::nvptx("sm_90a"));
  if (!n) return n.error();
  EmittedKernel k;
  k.context = std::make_unique<llvm::LLVMContext>();
  k.module = std::make_unique<llvm::Module>(spec.entry, *k.context);
  llvmb::prepare_module(*k.module, host);
  k.entry = spec.entry;
  Result<void> built = NvptxPointwise(spec, config, host, *n, *k.module, /*simulate=*/true).build();
  if (!built) return built.error();
  if (auto err = llvmb::verify(*k.module)) return diag("internal: the emitted module does not verify: " + *err);
  k.launch = pointwise_launch(*n, config);
  return k;
}

}  // namespace sf
