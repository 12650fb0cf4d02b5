// What every emitter test needs: one host JIT for the binary, groups from a builder,
// output buffers and
// the ABI's argument array for a group, a module's IR text, and ptxas through
// autotune/ptxas.h (the project's one ptxas runner and -v parser).
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
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

// The host ABI's argument array (emitter.h): inputs, then outputs.
inline std::vector<void*> arg_array(const std::vector<Tensor>& inputs, std::vector<Tensor>& out) {
  std::vector<void*> args;
  for (const Tensor& t : inputs) args.push_back(const_cast<std::byte*>(t.data()));
  for (Tensor& t : out) args.push_back(t.data());
  return args;
}

// JIT-compiles an emitted host kernel and runs it once on `inputs`: its outputs.
inline Result<std::vector<Tensor>> run_emitted(Result<EmittedKernel> k, const Graph& g,
                                               const std::vector<Tensor>& inputs) {
  if (!k) return k.error();
  Result<void*> fn = jit().add(std::move(k->module), std::move(k->context), k->entry);
  if (!fn) return fn.error();
  std::vector<Tensor> out = output_tensors(g);
  std::vector<void*> args = arg_array(inputs, out);
  reinterpret_cast<void (*)(void**)>(*fn)(args.data());
  return out;
}

inline std::string module_text(const llvm::Module& m) {
  std::string s;
  llvm::raw_string_ostream os(s);
  m.print(os, nullptr);
  return s;
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

}  // namespace sf::kernel_test
