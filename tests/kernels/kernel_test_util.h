// What every emitter test needs: one host JIT for the binary, groups from a builder,
// output buffers and
// the ABI's argument array for a group, a module's IR text, and ptxas through
// autotune/ptxas.h (the project's one ptxas runner and -v parser).
#pragma once

#include <gtest/gtest.h>

#include <sys/mman.h>
#include <unistd.h>

#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <llvm/IR/Module.h>
#include <llvm/Support/raw_ostream.h>

#include "autotune/ptxas.h"
#include "codegen/ir/builder.h"
#include "codegen/ir/graph.h"
#include "codegen/kernels/emitter.h"
#include "codegen/llvm/backend.h"

namespace sf::kernel_test {

// The builder's graph; an empty graph and a test failure when it does not verify.
inline Graph finish(GraphBuilder& b) {
  Result<Graph> r = b.finish();
  if (!r) {
    ADD_FAILURE() << r.error().str();
    return Graph{};
  }
  return std::move(r).value();
}

// How many times `what` occurs in `text` (non-overlapping): instructions in a PTX.
inline size_t count_of(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + what.size())) ++n;
  return n;
}

// A reduction op (sum, mean, max, ...) over `dims`.
inline Value reduce(OpKind k, Value x, std::vector<int64_t> dims, bool keepdim) {
  return x.builder->op(k, {x}, {AttrValue(std::move(dims)), AttrValue(keepdim)});
}

inline llvmb::HostJit& jit() {
  static std::unique_ptr<llvmb::HostJit> j = [] {
    Result<std::unique_ptr<llvmb::HostJit>> r = llvmb::HostJit::create();
    if (!r) {
      ADD_FAILURE() << r.error().str();
      std::abort();
    }
    return std::move(r).value();
  }();
  return *j;
}

// One zeroed tensor per output of the group.
inline std::vector<Tensor> output_tensors(const Graph& g) {
  std::vector<Tensor> out;
  for (const Output& o : g.outputs()) out.emplace_back(g.node(o.value).type.dtype, g.node(o.value).type.shape);
  return out;
}

// A copy of a tensor that ends exactly where a PROT_NONE page begins: a kernel that
// reads one element past it faults (the JIT-compiled kernels are not instrumented by
// the sanitizers, so this is how a test sees a read out of bounds).
class Guarded {
 public:
  explicit Guarded(const Tensor& t) {
    const auto page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    span_ = (t.nbytes() + page - 1) / page * page + page;
    void* m = mmap(nullptr, span_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) throw std::runtime_error("mmap failed");
    base_ = static_cast<std::byte*>(m);
    if (mprotect(base_ + span_ - page, page, PROT_NONE) != 0) throw std::runtime_error("mprotect failed");
    data_ = base_ + span_ - page - t.nbytes();
    if (t.nbytes()) std::memcpy(data_, t.data(), t.nbytes());
  }
  Guarded(const Guarded&) = delete;
  Guarded& operator=(const Guarded&) = delete;
  ~Guarded() { munmap(base_, span_); }
  void* data() const { return data_; }

 private:
  std::byte* base_ = nullptr;
  std::byte* data_ = nullptr;
  size_t span_ = 0;
};

// The host ABI's argument array (emitter.h): inputs, then outputs, each input a
// Guarded copy that lives as long as the array, so a kernel that reads past an input
// faults. More slots may be appended (tensor maps, a workspace).
class ArgArray {
 public:
  ArgArray(const std::vector<Tensor>& inputs, std::vector<Tensor>& out) {
    for (const Tensor& t : inputs) {
      guarded_.push_back(std::make_unique<Guarded>(t));
      ptrs_.push_back(guarded_.back()->data());
    }
    for (Tensor& t : out) ptrs_.push_back(t.data());
  }
  void** data() { return ptrs_.data(); }
  void push_back(void* p) { ptrs_.push_back(p); }
  void*& operator[](size_t i) { return ptrs_[i]; }
  size_t size() const { return ptrs_.size(); }

 private:
  std::vector<std::unique_ptr<Guarded>> guarded_;
  std::vector<void*> ptrs_;
};
inline ArgArray arg_array(const std::vector<Tensor>& inputs, std::vector<Tensor>& out) { return {inputs, out}; }

// JIT-compiles an emitted host kernel and runs it once on `inputs`: its outputs.
inline Result<std::vector<Tensor>> run_emitted(Result<EmittedKernel> k, const Graph& g,
                                               const std::vector<Tensor>& inputs) {
  if (!k) return k.error();
  Result<void*> fn = jit().add(std::move(k->module), std::move(k->context), k->entry);
  if (!fn) return fn.error();
  std::vector<Tensor> out = output_tensors(g);
  ArgArray args = arg_array(inputs, out);
  reinterpret_cast<void (*)(void**)>(*fn)(args.data());
  return out;
}

inline std::string module_text(const llvm::Module& m) {
  std::string s;
  llvm::raw_string_ostream os(s);
  m.print(os, nullptr);
  return s;
}

// The PTX of `g` as one kernel of `kind` for `arch`, default config, named after `g`.
inline Result<std::string> ptx_of(KernelKind kind, const Graph& g, const std::string& arch) {
  Result<EmittedKernel> k = emitter_for(kind).emit(KernelSpec{g.name(), kind, g}, {}, llvmb::Target::nvptx(arch));
  if (!k) return k.error();
  return llvmb::compile_to_ptx(*k->module, arch);
}

inline bool have_ptxas() { return find_ptxas().ok(); }

// ptxas -v on the PTX: every entry's resources, or the Diag with ptxas's errors.
inline Result<std::vector<KernelResources>> assemble(const std::string& ptx, const std::string& arch) {
  return run_ptxas(ptx, arch);
}

// "" when ptxas accepts the PTX, else its error text.
inline std::string ptxas_failure(const std::string& ptx, const std::string& arch) {
  Result<std::vector<KernelResources>> r = assemble(ptx, arch);
  return r.ok() ? "" : r.error().str();
}

// A barrier whose waiters sleep at once (a mutex and a condition variable), for the
// simulations' hundreds of OS threads on a few cores: std::barrier spins and yields
// before it sleeps, and with a block's threads many times the cores those spins and
// yields took a fifth of the simulations' time, in the kernel's scheduler. `Completion`
// runs once per phase, by the last thread to arrive, before any waiter leaves.
struct NoCompletion {
  void operator()() noexcept {}
};
template <class Completion = NoCompletion>
class SleepBarrier {
 public:
  explicit SleepBarrier(std::ptrdiff_t n, Completion done = {}) : n_(n), done_(std::move(done)) {}
  void arrive_and_wait() {
    std::unique_lock<std::mutex> l(mu_);
    const uint64_t phase = phase_;
    if (++arrived_ == n_) {
      done_();
      arrived_ = 0;
      ++phase_;
      l.unlock();
      cv_.notify_all();
      return;
    }
    cv_.wait(l, [&] { return phase_ != phase; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  const std::ptrdiff_t n_;
  std::ptrdiff_t arrived_ = 0;
  uint64_t phase_ = 0;
  Completion done_;
};

// The threads of one simulated thread block, kept for every block of a launch: the
// simulations run a GPU kernel's threads as OS threads (they meet at barriers), and
// starting blocks x threads of them cost more than the kernels themselves, most of all
// under AddressSanitizer, which maps and unmaps each thread's stack and shadow.
class BlockThreads {
 public:
  explicit BlockThreads(int n) : start_(n + 1), done_(n + 1) {
    threads_.reserve(static_cast<size_t>(n));
    for (int t = 0; t < n; ++t)
      threads_.emplace_back([this, t] {
        for (;;) {
          start_.arrive_and_wait();
          if (stop_) return;
          (*fn_)(t);
          done_.arrive_and_wait();
        }
      });
  }
  BlockThreads(const BlockThreads&) = delete;
  BlockThreads& operator=(const BlockThreads&) = delete;
  ~BlockThreads() {
    stop_ = true;
    start_.arrive_and_wait();
    for (std::thread& t : threads_) t.join();
  }
  // Runs fn(t) on every thread t of the block at once and returns when all have.
  void run(const std::function<void(int)>& fn) {
    fn_ = &fn;
    start_.arrive_and_wait();
    done_.arrive_and_wait();
  }

 private:
  SleepBarrier<> start_, done_;
  const std::function<void(int)>* fn_ = nullptr;
  bool stop_ = false;  // written before `start_`, whose completion orders it for the readers
  std::vector<std::thread> threads_;
};

}  // namespace sf::kernel_test
