// The reduction emitter's host kernel: rows one after another, each pass in chunked partial sums.
#include "codegen/kernels/reduction_internal.h"

namespace sf::reduction_detail {

namespace {

// ---- host ---------------------------------------------------------------------------------

// `void entry(ptr args)`: rows one after another. The loops over a row's elements (the
// innermost fold loop of each pass and the X-space output loop) carry host_vector and
// host_interleave as vectoriser hints (element.h LoopHints). Without them LLVM does
// not vectorise a float sum or mean (that would reorder the additions) but does
// vectorise max/min and integer folds; with host_vector > 1 the hint allows the
// reordering, and a float sum becomes per-lane partial sums within each chunk,
// combined at the chunk's end (an error bound no worse than the chunked sum's).
class HostBuilder final : public Builder {
 public:
  using Builder::Builder;

  Result<void> build() {
    it_ = b_.getInt64Ty();
    kernels::KernelEntry ke =
        kernels::begin_kernel(m_, b_, spec_.entry, g_.params().size(), g_.outputs().size(), llvmb::Target::host());
    fn_ = ke.fn;
    start(std::move(ke.in), std::move(ke.out));
    if (p_.rows > 0) {
      Result<void> r = emit_loop(b_, k(0), k(p_.rows), k(1), "row", [&](llvm::Value* row) { return row_body(row); });
      if (!r) return r;
    }
    b_.CreateRetVoid();
    return {};
  }

 private:
  // Partial sums over chunks of about sqrt(n) elements, then over the chunks: the
  // rounding error of an f32 sum grows with the number of additions into one
  // accumulator (n one after another; about 2 sqrt(n) so), without the cost or the
  // Inf/NaN pitfalls of compensated summation. The reference sums in double.
  int64_t chunk() const {
    int64_t c = 16;
    while (c < 4096 && c * c < p_.n) c *= 2;
    return c;
  }

  Result<void> row_body(llvm::Value* row) {
    prog_->set_row(row);
    llvm::Value* base = kernels::emit_index_map(b_, row, p_.row_map);
    auto x_index = [&](llvm::Value* j) {
      return b_.CreateAdd(base, kernels::emit_index_map(b_, j, p_.red_map), "i", true, true);
    };
    for (size_t pi = 0; pi < p_.passes.size(); ++pi) {
      const std::vector<ValueId>& pass = p_.passes[pi];
      std::vector<llvm::AllocaInst*> total, part;
      for (ValueId v : pass) {
        const Fold& f = folds_.at(v);
        total.push_back(entry_alloca(f.type(), "acc"));
        part.push_back(entry_alloca(f.type(), "part"));
        b_.CreateStore(f.identity(), total.back());
      }
      if (p_.n > 0) {
        if (Result<void> r = prog_->prepare(pass_roots(pass)); !r) return r;
        const int64_t C = chunk();
        Result<void> r = emit_loop(b_, k(0), k(p_.n), k(C), "chunk", [&](llvm::Value* c0) -> Result<void> {
          for (size_t q = 0; q < pass.size(); ++q) b_.CreateStore(folds_.at(pass[q]).identity(), part[q]);
          llvm::Value* end = b_.CreateBinaryIntrinsic(llvm::Intrinsic::smin, b_.CreateAdd(c0, k(C), "", true, true), k(p_.n));
          Result<void> inner = emit_loop(b_, c0, end, k(1), "j", [&](llvm::Value* j) { return fold_element(pass, part, x_index(j)); },
                                         kernels::host_loop_hints(cfg_));
          if (!inner) return inner;
          for (size_t q = 0; q < pass.size(); ++q) {
            const Fold& f = folds_.at(pass[q]);
            b_.CreateStore(f.combine(b_.CreateLoad(f.type(), total[q]), b_.CreateLoad(f.type(), part[q])), total[q]);
          }
          return {};
        });
        if (!r) return r;
      }
      for (size_t q = 0; q < pass.size(); ++q) {
        const Fold& f = folds_.at(pass[q]);
        prog_->set_reduced(pass[q], f.finish(b_.CreateLoad(f.type(), total[q]), p_.n));
      }
    }
    Result<std::vector<Elem>> ro = row_outputs();
    if (!ro) return ro.error();
    for (size_t q = 0; q < ro->size(); ++q) cg_->store((*ro)[q], out_[p_.row_outputs[q]], row);
    if (p_.n > 0 && !p_.x_outputs.empty()) {
      if (Result<void> r = prog_->prepare(x_output_roots()); !r) return r;
      return emit_loop(b_, k(0), k(p_.n), k(1), "x", [&](llvm::Value* j) { return store_x_outputs(x_index(j)); },
                       kernels::host_loop_hints(cfg_));
    }
    return {};
  }
};

}  // namespace

Result<void> build_host(const KernelSpec& spec, const KernelConfig& cfg, const Plan& plan, const llvmb::Target& target,
                        llvm::Module& m) {
  return HostBuilder(spec, cfg, plan, target, m).build();
}

}  // namespace sf::reduction_detail
