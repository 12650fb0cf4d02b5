// Internal to the reduction emitter (reduction.h): its plan, and the codegen both targets share.
//
// reduction_plan.cpp decides the Plan (what the group is, without LLVM);
// reduction_host.cpp and reduction_nvptx.cpp build the kernel for each target on
// the Fold, Program and Builder below; reduction.cpp holds the entry points. Only
// these files include it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <llvm/IR/Constants.h>
#include <llvm/IR/Function.h>
#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>

#include "codegen/kernels/element.h"
#include "codegen/kernels/reduction.h"

namespace sf::reduction_detail {

using kernels::ElementCodegen;
using kernels::is_c_identifier;
using kernels::emit_loop;
using kernels::Elem;
using kernels::IndexMap;
using kernels::StridedStep;
using kernels::ValueIndex;

// Shared helpers (defined in reduction_plan.cpp).
Diag diag(std::string msg, SourceLoc loc = {});

bool is_reduce(OpKind k);

std::string who(const Node& n);

// ---- the plan: what the group is, decided once, without LLVM ------------------------------

struct Plan {
  Shape x;
  std::vector<int> rdims;
  int64_t rows = 0, n = 0;
  IndexMap row_map;  // row (flat over the kept dims) -> the X offset of its first element
  IndexMap red_map;  // j (flat over the reduced dims) -> X offset within the row
  IndexMap x_to_row; // X flat index -> its row: how a value read "at its own row" maps
  std::vector<std::vector<ValueId>> passes;  // reductions by dependence level
  std::vector<size_t> row_outputs, x_outputs;
  int warps_per_row = 1;
  // Outer reductions (X's innermost dim is kept, so neighbouring rows are neighbours
  // in memory and a row's elements lie a row length or more apart; Inductor's
  // ReductionHint.OUTER): with several rows and several threads per row a block, the
  // block's threads take rows fastest, tid = thread_in_row * rows_per_block +
  // row_in_block, so a warp's lanes read neighbouring rows at one element index
  // (coalesced) rather than one row's elements far apart. A row's partials then meet
  // through shuffles between the lanes of a warp that hold it (`outer_lanes` of them,
  // rows_per_block apart: rows_per_block a power of two below 32) and through shared
  // memory across the rest (`row_slots` partials per row, slot-major: slot s of row r
  // at s * rows_per_block + r).
  bool inner_kept = false;  // X's innermost dim is not reduced (rows are neighbours in memory)
  bool outer = false;       // inner_kept, with several rows and several threads a row a block
  int outer_lanes = 1;
  int row_slots = 1;
  int smem_bytes = 0;
  std::vector<int> smem_offset;  // per reduction, in pass order, flattened (bytes)
  // NVPTX persistent rows (decide_persistent): each thread loads its share of a row
  // once, into registers, and every pass and the X-space outputs read them there.
  bool persistent = false;
  int vector = 1;      // elements per register slot: one 16-byte-or-smaller access per operand
  int64_t slots = 0;   // register slots per thread (slots * vector elements)
  // Split rows (KernelConfig::split_reduction > 1; Inductor's split reductions, in one
  // kernel): block y of a row group folds the y-th share of each of its rows and
  // stores the share's partials in the workspace (LaunchShape::workspace_bytes), then
  // counts itself in on the group's counter; the group's last block to count takes
  // every share's partials back in share order (zeroing them behind it: the next
  // launch finds the workspace zero) and runs the epilogue. The combine's order is
  // fixed, so the result does not depend on which block finishes last. One pass and
  // row-space outputs only: a value computed from the row's result at every element
  // would need the whole row in one block.
  int split = 1;
  int64_t share = 0;        // elements of a row a share folds (the last share may be shorter), a multiple of `vector`
  int64_t ws_partials = 0;  // bytes of partials before the counters: 8 a (reduction, share, row)
  int64_t ws_bytes = 0;     // the partials, then a u32 counter per row group
  int flag_offset = -1;     // shared memory: the word that says "this block is the group's last"
};

// Defined in reduction_plan.cpp.
int64_t block_threads(const KernelConfig& c);

Result<Plan> make_plan(const KernelSpec& spec, const KernelConfig& c, const llvmb::Target& t);

LaunchShape launch_of(const Plan& p, const KernelConfig& c);

// ---- accumulation -------------------------------------------------------------------------

// How one reduction folds elements: the accumulator type (f32 for floats, i64 for
// integer sums, the element's type for integer max/min), its identity and combine.
class Fold {
 public:
  Fold(const Node& n, ElementCodegen& cg)
      : op_(n.op), dt_(n.type.dtype), count_(n.op == OpKind::Mean ? n.attrs.get_int("count") : 0), cg_(cg) {}

  llvm::Type* type() const {
    llvm::LLVMContext& c = cg_.builder().getContext();
    if (is_float(dt_)) return llvm::Type::getFloatTy(c);
    return kernels::compute_type(c, dt_);  // sums are i64 already (the shape rule)
  }
  llvm::Value* identity() const {
    llvm::Type* t = type();
    const bool fl = is_float(dt_);
    switch (op_) {
      case OpKind::Max:
        return fl ? llvm::ConstantFP::getInfinity(t, /*Negative=*/true)
                  : llvm::ConstantInt::get(t, llvm::APInt::getSignedMinValue(t->getIntegerBitWidth()));
      case OpKind::Min:
        return fl ? llvm::ConstantFP::getInfinity(t, false)
                  : llvm::ConstantInt::get(t, llvm::APInt::getSignedMaxValue(t->getIntegerBitWidth()));
      default: return fl ? llvm::ConstantFP::get(t, 0.0) : llvm::ConstantInt::get(t, 0);
    }
  }
  // An element of the operand in the accumulator's type (integer sums widen to i64).
  llvm::Value* element(Elem e) const {
    if (op_ == OpKind::Sum && !is_float(dt_)) return cg_.convert(e, DType::I64).value;
    return e.value;
  }
  llvm::Value* combine(llvm::Value* a, llvm::Value* b) const {
    llvm::IRBuilderBase& bb = cg_.builder();
    const bool fl = is_float(dt_);
    switch (op_) {
      // llvm.maximum/minimum propagate NaN (max.NaN.f32 on sm_80+), as the
      // reference's max_f/min_f and torch.max do.
      case OpKind::Max:
        return bb.CreateBinaryIntrinsic(fl ? llvm::Intrinsic::maximum : llvm::Intrinsic::smax, a, b);
      case OpKind::Min:
        return bb.CreateBinaryIntrinsic(fl ? llvm::Intrinsic::minimum : llvm::Intrinsic::smin, a, b);
      default: return fl ? bb.CreateFAdd(a, b) : bb.CreateAdd(a, b);  // integer sums wrap, as torch's
    }
  }
  // The reduced value, as the node's dtype: sums rounded to it, means divided by n
  // (0 / 0 is NaN for an empty row, as the reference says), or by the mean's `count`
  // when set (a rank's chunk of a sharded dim: the global count).
  Elem finish(llvm::Value* acc, int64_t n) const {
    llvm::IRBuilderBase& bb = cg_.builder();
    if (op_ == OpKind::Mean)
      acc = bb.CreateFDiv(acc, llvm::ConstantFP::get(acc->getType(), static_cast<double>(count_ > 0 ? count_ : n)));
    if (is_float(dt_)) acc = cg_.node_result(dt_, acc);
    return {acc, dt_};
  }

 private:
  OpKind op_;
  DType dt_;
  int64_t count_;  // mean's `count` (0: n)
  ElementCodegen& cg_;
};

// ---- the element program over two index spaces ----------------------------------------------
//
// X space: the flat index i of an element of X (and of any X-space value, read at its
// own C-order flat index). Row space: the flat index r of a row. Reduced values live
// in row space. An X-space value that reads a row-space value at its own row (its
// index map from i is x_to_row) takes the value computed once for the row, before
// the loop over the row's elements: prepare() emits those. Element code is
// element.h's GroupValues, one per space, with hooks that supply reduced and
// prepared values.
class Program {
 public:
  Program(const Graph& g, const Plan& p, ElementCodegen& cg, const std::vector<llvm::Value*>& inputs)
      : g_(g), p_(p), cg_(cg), inputs_(inputs), row_(g, cg, inputs), x_(g, cg, inputs) {}

  // A new row (its code dominates everything emitted for the row after it).
  void set_row(llvm::Value* r) {
    reduced_.clear();
    prepared_.clear();
    row_.at_index(r, [this](ValueId v, const ValueIndex& at) { return row_hook(v, at); });
  }
  // A new element of X (inside a loop body; forgotten at the next one).
  void set_x(llvm::Value* i) {
    x_.at_index(i, [this](ValueId v, const ValueIndex& at) { return x_hook(v, at); });
    cur_ = &x_;
  }
  // Persistent rows: register slot `k` of the thread holds the element at X index
  // `i` for the whole row, its values kept across passes (each is computed, and each
  // operand loaded, once). `lane` may supply a param's value first (a lane of a
  // vector load). Then use_slot(k) makes x_value() read slot k.
  void set_slot(size_t k, llvm::Value* i, kernels::GroupValues::Hook lane) {
    while (slots_.size() <= k) slots_.emplace_back(g_, cg_, inputs_);
    slots_[k].at_index(i, [this, lane = std::move(lane)](ValueId v, const ValueIndex& at) -> std::optional<Elem> {
      if (std::optional<Elem> e = x_hook(v, at)) return e;
      return lane ? lane(v, at) : std::nullopt;
    });
  }
  void use_slot(size_t k) { cur_ = &slots_[k]; }
  // The (param, offset map from X's flat index) pairs X-space code at `roots` reads.
  int param_slot(ValueId v) const { return x_.param_slot(v); }
  std::vector<std::pair<int, IndexMap>> x_reads(const std::vector<std::pair<ValueId, ValueIndex>>& roots) const {
    std::vector<std::pair<int, IndexMap>> r;
    for (const auto& [v, at] : roots)
      for (auto& read : x_.reads(v, at)) r.push_back(std::move(read));
    return r;
  }
  void set_reduced(ValueId v, Elem e) { reduced_[v] = e; }

  Result<Elem> row_value(ValueId v, const ValueIndex& at) { return checked(row_.value(v, at)); }
  Result<Elem> x_value(ValueId v, const ValueIndex& at) { return checked(cur_->value(v, at)); }
  // An output's value as stored (GroupValues::output_value: a final cast to 16 bits is
  // left to the store's rounding).
  Result<Elem> row_output(ValueId v, const ValueIndex& at) { return checked(row_.output_value(v, at)); }
  Result<Elem> x_output(ValueId v, const ValueIndex& at) { return checked(cur_->output_value(v, at)); }

  // Emits, at the builder's position, the row-space values that X-space code at the
  // given roots reads, so that the loop body finds them computed.
  Result<void> prepare(const std::vector<std::pair<ValueId, ValueIndex>>& roots) {
    std::vector<ValueId> need;
    std::set<std::string> seen;
    std::function<Result<void>(ValueId, const ValueIndex&)> walk = [&](ValueId v, const ValueIndex& at) -> Result<void> {
      if (!seen.insert(std::to_string(v) + "#" + at.key()).second) return {};
      const Node& n = g_.node(v);
      if (n.op == OpKind::Param || n.op == OpKind::Constant) return {};
      if (row_read(v, at)) {
        if (!is_reduce(n.op) && std::find(need.begin(), need.end(), v) == need.end()) need.push_back(v);
        return {};
      }
      if (is_reduce(n.op)) return other_row(n);
      for (ValueId u : n.inputs) {
        std::optional<ValueIndex> ui = kernels::operand_index(n, at, g_.node(u).type.shape);
        if (!ui) return diag(who(n) + " is neither elementwise nor a view", n.loc);
        if (Result<void> r = walk(u, *ui); !r) return r;
      }
      return {};
    };
    for (const auto& [v, at] : roots)
      if (Result<void> r = walk(v, at); !r) return r;
    std::sort(need.begin(), need.end());  // node order: a stable IR
    for (ValueId v : need) {
      if (prepared_.count(v)) continue;
      Result<Elem> e = row_value(v, kernels::dense_index(g_.node(v).type.shape));
      if (!e) return e.error();
      prepared_.emplace(v, *e);
    }
    return {};
  }

 private:
  // Whether X-space code reading v at `at` reads it at its own row.
  bool row_read(ValueId v, const ValueIndex& at) const {
    const Shape& s = g_.node(v).type.shape;
    return numel(s) == p_.rows && kernels::offset_map(at, s) == p_.x_to_row;
  }

  Diag other_row(const Node& n) const {
    return diag("the reduced value of " + who(n) +
                    " is read at another row's position (a view moves reduced values between rows); "
                    "the fusion pass must split the group there",
                n.loc);
  }

  // Hooks cannot return a Diag: the first one is kept and reported by checked(), and
  // the hook returns poison meanwhile (the module is dropped).
  Elem fail(Diag d, const Node& n) {
    if (error_.ok()) error_ = std::move(d);
    return {llvm::PoisonValue::get(kernels::compute_type(cg_.builder().getContext(), n.type.dtype)), n.type.dtype};
  }
  Result<Elem> checked(Result<Elem> r) {
    if (error_.ok()) return r;
    Diag d = error_.error();
    error_ = {};
    return d;
  }

  std::optional<Elem> reduced(const Node& n, ValueId v) {
    auto it = reduced_.find(v);
    if (it == reduced_.end()) return fail(diag("internal: " + who(n) + " is read before its pass", n.loc), n);
    return it->second;
  }

  std::optional<Elem> row_hook(ValueId v, const ValueIndex& at) {
    const Node& n = g_.node(v);
    if (!is_reduce(n.op)) return std::nullopt;
    if (!kernels::offset_map(at, n.type.shape).contiguous()) return fail(other_row(n), n);
    return reduced(n, v);
  }

  std::optional<Elem> x_hook(ValueId v, const ValueIndex& at) {
    const Node& n = g_.node(v);
    if (n.op == OpKind::Param || n.op == OpKind::Constant) return std::nullopt;
    if (row_read(v, at)) {
      if (is_reduce(n.op)) return reduced(n, v);
      auto it = prepared_.find(v);
      if (it == prepared_.end()) return fail(diag("internal: row value " + who(n) + " was not prepared", n.loc), n);
      return it->second;
    }
    if (is_reduce(n.op)) return fail(other_row(n), n);
    return std::nullopt;
  }

  const Graph& g_;
  const Plan& p_;
  ElementCodegen& cg_;
  std::vector<llvm::Value*> inputs_;
  kernels::GroupValues row_, x_;
  std::deque<kernels::GroupValues> slots_;  // persistent rows' register slots
  kernels::GroupValues* cur_ = &x_;
  std::map<ValueId, Elem> reduced_, prepared_;
  Result<void> error_;  // the first hook failure, until checked() reports it
};


// The parts of a kernel both targets share: the args, the element program, the
// accumulators (entry-block allocas, promoted to registers by SROA) and the per-row
// sequence of passes. The target decides the loops and how partials combine.
class Builder {
 public:
  Builder(const KernelSpec& spec, const KernelConfig& cfg, const Plan& plan, const llvmb::Target& target,
          llvm::Module& m)
      : spec_(spec), g_(spec.group), cfg_(cfg), p_(plan), target_(target), m_(m), b_(m.getContext()) {}

  virtual ~Builder() = default;

 protected:
  llvm::Value* k(int64_t v) const { return llvm::ConstantInt::get(it_, static_cast<uint64_t>(v)); }

  void start(std::vector<llvm::Value*> in, std::vector<llvm::Value*> out) {
    in_ = std::move(in);
    out_ = std::move(out);
    cg_.emplace(b_, m_, target_, spec_.precision);
    prog_.emplace(g_, p_, *cg_, in_);
    for (const auto& pass : p_.passes)
      for (ValueId v : pass) folds_.emplace(v, Fold(g_.node(v), *cg_));
  }

  llvm::AllocaInst* entry_alloca(llvm::Type* t, const std::string& name) {
    llvm::IRBuilder<> e(&fn_->getEntryBlock(), fn_->getEntryBlock().begin());
    return e.CreateAlloca(t, nullptr, name);
  }

  std::vector<std::pair<ValueId, ValueIndex>> pass_roots(const std::vector<ValueId>& pass) const {
    std::vector<std::pair<ValueId, ValueIndex>> r;
    for (ValueId v : pass) r.emplace_back(g_.node(v).inputs[0], kernels::dense_index(p_.x));
    return r;
  }
  std::vector<std::pair<ValueId, ValueIndex>> x_output_roots() const {
    std::vector<std::pair<ValueId, ValueIndex>> r;
    for (size_t o : p_.x_outputs) {
      ValueId v = g_.outputs()[o].value;
      r.emplace_back(v, kernels::dense_index(g_.node(v).type.shape));
    }
    return r;
  }

  // Folds the element at X index `i` of every reduction of `pass` into `accs`.
  Result<void> fold_element(const std::vector<ValueId>& pass, const std::vector<llvm::AllocaInst*>& accs,
                            llvm::Value* i) {
    prog_->set_x(i);
    for (size_t r = 0; r < pass.size(); ++r) {
      const Fold& f = folds_.at(pass[r]);
      Result<Elem> e = prog_->x_value(g_.node(pass[r]).inputs[0], kernels::dense_index(p_.x));
      if (!e) return e.error();
      llvm::Value* acc = b_.CreateLoad(f.type(), accs[r]);
      b_.CreateStore(f.combine(acc, f.element(*e)), accs[r]);
    }
    return {};
  }

  // Every row-space output's value for the current row (computed by every thread,
  // so that the values dominate what follows even where only one thread stores).
  Result<std::vector<Elem>> row_outputs() {
    std::vector<Elem> r;
    for (size_t o : p_.row_outputs) {
      ValueId v = g_.outputs()[o].value;
      Result<Elem> e = prog_->row_output(v, kernels::dense_index(g_.node(v).type.shape));
      if (!e) return e.error();
      r.push_back(*e);
    }
    return r;
  }

  Result<void> store_x_outputs(llvm::Value* i) {
    prog_->set_x(i);
    for (size_t o : p_.x_outputs) {
      ValueId v = g_.outputs()[o].value;
      Result<Elem> e = prog_->x_output(v, kernels::dense_index(g_.node(v).type.shape));
      if (!e) return e.error();
      cg_->store(*e, out_[o], i);
    }
    return {};
  }

  const KernelSpec& spec_;
  const Graph& g_;
  const KernelConfig& cfg_;
  const Plan& p_;
  const llvmb::Target& target_;
  llvm::Module& m_;
  llvm::IRBuilder<> b_;
  llvm::Function* fn_ = nullptr;
  llvm::Type* it_ = nullptr;
  std::vector<llvm::Value*> in_, out_;
  std::optional<ElementCodegen> cg_;
  std::optional<Program> prog_;
  std::map<ValueId, Fold> folds_;
};

// ---- the targets ----------------------------------------------------------------------------

// Builds the kernel's function into `m`: the host's (reduction_host.cpp), or the
// NVPTX one, `simulate` for its host-built form (reduction_nvptx.cpp).
Result<void> build_host(const KernelSpec& spec, const KernelConfig& cfg, const Plan& plan, const llvmb::Target& target,
                        llvm::Module& m);
Result<void> build_nvptx(const KernelSpec& spec, const KernelConfig& cfg, const Plan& plan, const llvmb::Target& target,
                         llvm::Module& m, bool simulate);

}  // namespace sf::reduction_detail
