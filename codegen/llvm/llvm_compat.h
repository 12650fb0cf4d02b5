// Every LLVM-version difference the backend meets, in one place (STYLE.md #4).
// Only codegen/llvm/*.cpp and tests/llvm include this; emitters go through
// backend.h. Tested against LLVM 19.1 (Debian's llvm-19-dev); the #if branches for
// later versions follow LLVM's release notes and are untested.
#pragma once

#include <array>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <llvm/ADT/StringMap.h>
#include <llvm/Config/llvm-config.h>
#include <llvm/IR/CallingConv.h>
#include <llvm/IR/Constants.h>
#include <llvm/IR/Function.h>
#include <llvm/IR/Metadata.h>
#include <llvm/IR/Module.h>
#include <llvm/MC/TargetRegistry.h>
#include <llvm/Support/CodeGen.h>
#include <llvm/Target/TargetMachine.h>
#include <llvm/Target/TargetOptions.h>
#include <llvm/TargetParser/Host.h>

#if LLVM_VERSION_MAJOR < 19
#error "shardfuse needs LLVM 19 or later (CodeGenOptLevel, getHostCPUFeatures returning a map)"
#endif

namespace sf::llvmb::compat {

// ---- NVPTX architectures and PTX ISA versions ---------------------------------------
//
// `min_ptx` is the oldest PTX ISA that has `.target <arch>` (PTX ISA manual, "Release
// Notes" table; it is also what LLVM 19 picks when no +ptxNN feature is given).
// `ptx` is what we emit: max(min_ptx, kBaselinePtx). PTX 8.0 (CUDA 12.0) is the
// baseline because every driver that can run a CUDA 12 or 13 toolkit accepts it,
// and emitting one ISA version for all sm_70+ archs keeps the instruction
// selection (which LLVM gates on the PTX version) the same across archs. Going to
// LLVM 19's newest, 8.5, would buy nothing our emitters use and would need a
// CUDA 12.5 driver (r555+).
//
// sm_100 and later are missing on purpose: LLVM 19's NVPTX backend does not know
// them. ptxas 13 dropped sm_50..sm_72; those rows stay so that PTX can still be
// produced for an older toolkit on the GPU machine.
inline constexpr int kBaselinePtx = 80;  // PTX ISA 8.0
inline constexpr int kMaxPtx = 85;       // newest +ptxNN feature LLVM 19 has

struct ArchInfo {
  std::string_view arch;  // LLVM CPU name == ptxas -arch
  int min_ptx;            // 80 means PTX ISA 8.0
  int ptx;                // the version compile_to_ptx emits
};

inline constexpr std::array<ArchInfo, 12> kArchTable{{
    {"sm_60", 50, 80},  {"sm_61", 50, 80}, {"sm_62", 50, 80}, {"sm_70", 60, 80},
    {"sm_72", 61, 80},  {"sm_75", 63, 80}, {"sm_80", 70, 80}, {"sm_86", 71, 80},
    {"sm_87", 74, 80},  {"sm_89", 78, 80}, {"sm_90", 78, 80}, {"sm_90a", 80, 80},
}};

inline std::optional<ArchInfo> arch_info(std::string_view arch) {
  for (const ArchInfo& a : kArchTable)
    if (a.arch == arch) return a;
  return std::nullopt;
}

// 80 -> "+ptx80" (the NVPTX subtarget feature).
inline std::string ptx_feature(int ptx) { return "+ptx" + std::to_string(ptx); }

// 80 -> "8.0" (what the PTX's `.version` line says).
inline std::string ptx_version_string(int ptx) {
  return std::to_string(ptx / 10) + "." + std::to_string(ptx % 10);
}

// ---- target machines ------------------------------------------------------------------

// LLVM 21 takes a Triple where 19 and 20 take the triple's string.
inline llvm::TargetMachine* create_target_machine(const llvm::Target& target,
                                                  const std::string& triple,
                                                  const std::string& cpu,
                                                  const std::string& features,
                                                  const llvm::TargetOptions& options,
                                                  std::optional<llvm::Reloc::Model> rm) {
#if LLVM_VERSION_MAJOR >= 21
  return target.createTargetMachine(llvm::Triple(triple), cpu, features, options, rm,
                                    std::nullopt, llvm::CodeGenOptLevel::Aggressive);
#else
  return target.createTargetMachine(triple, cpu, features, options, rm, std::nullopt,
                                    llvm::CodeGenOptLevel::Aggressive);
#endif
}

inline void set_triple(llvm::Module& m, const std::string& triple) {
#if LLVM_VERSION_MAJOR >= 21
  m.setTargetTriple(llvm::Triple(triple));
#else
  m.setTargetTriple(triple);
#endif
}

inline std::string get_triple(const llvm::Module& m) {
#if LLVM_VERSION_MAJOR >= 21
  return m.getTargetTriple().str();
#else
  return m.getTargetTriple();
#endif
}

// The host CPU's features as "+avx2,+fma,-avx512f,...". LLVM 19 returns a map
// (before 19 it filled an out-parameter and returned bool).
inline std::vector<std::string> host_cpu_features() {
  std::vector<std::string> out;
  for (const auto& f : llvm::sys::getHostCPUFeatures())
    out.push_back((f.getValue() ? "+" : "-") + f.getKey().str());
  return out;
}

// ---- kernel marking --------------------------------------------------------------------
//
// LLVM 19 recognises a kernel by either `!nvvm.annotations !{ptr @f, !"kernel", i32 1}`
// or the ptx_kernel calling convention; LLVM 20 auto-upgrades the annotation to the
// calling convention and later versions drop the annotation. We write the annotation
// on 19 (what libdevice-era tools, nvcc's NVVM and XLA write) and read both.

inline void add_nvvm_annotation(llvm::Function& f, llvm::StringRef key, int value) {
  llvm::Module& m = *f.getParent();
  llvm::LLVMContext& ctx = m.getContext();
  // One node per key: {ptr @f, !"key", i32 v}. LLVM 19 reads the operands after the
  // function as (MDString, value) pairs, and a second `ptr @f` in the same node
  // crashes its annotation cache (seen with llc 19.1.7).
  llvm::Metadata* ops[] = {
      llvm::ValueAsMetadata::get(&f), llvm::MDString::get(ctx, key),
      llvm::ConstantAsMetadata::get(
          llvm::ConstantInt::get(llvm::Type::getInt32Ty(ctx), value))};
  m.getOrInsertNamedMetadata("nvvm.annotations")->addOperand(llvm::MDNode::get(ctx, ops));
}

inline std::optional<int> find_nvvm_annotation(const llvm::Function& f, llvm::StringRef key) {
  const llvm::NamedMDNode* md = f.getParent()->getNamedMetadata("nvvm.annotations");
  if (!md) return std::nullopt;
  for (const llvm::MDNode* node : md->operands()) {
    if (node->getNumOperands() < 3) continue;
    auto* fn = llvm::dyn_cast_or_null<llvm::ValueAsMetadata>(node->getOperand(0).get());
    if (!fn || fn->getValue() != &f) continue;
    for (unsigned i = 1; i + 1 < node->getNumOperands(); i += 2) {
      auto* name = llvm::dyn_cast_or_null<llvm::MDString>(node->getOperand(i).get());
      auto* val = llvm::dyn_cast_or_null<llvm::ConstantAsMetadata>(node->getOperand(i + 1).get());
      if (!name || !val || name->getString() != key) continue;
      if (auto* ci = llvm::dyn_cast<llvm::ConstantInt>(val->getValue()))
        return static_cast<int>(ci->getSExtValue());
    }
  }
  return std::nullopt;
}

// `.reqnctapercluster x, y, z` in the header of every kernel of `m` carrying the
// cluster_dim_{x,y,z} annotations (backend.h, set_cluster_dims), where the printer
// left it out: LLVM 19's NVPTX printer knows no cluster annotations (later ones print
// the directive themselves, and then nothing is added). The directive goes after the
// entry's parameter list and performance directives, before its body's "{".
inline void add_cluster_directives(const llvm::Module& m, std::string& ptx) {
  for (const llvm::Function& f : m) {
    if (f.isDeclaration()) continue;
    const std::optional<int> x = find_nvvm_annotation(f, "cluster_dim_x");
    if (!x) continue;
    const int y = find_nvvm_annotation(f, "cluster_dim_y").value_or(1), z = find_nvvm_annotation(f, "cluster_dim_z").value_or(1);
    const std::string entry = ".entry " + f.getName().str() + "(";
    const size_t at = ptx.find(entry);
    if (at == std::string::npos) continue;
    const size_t body = ptx.find("\n{", at);
    if (body == std::string::npos) continue;
    if (ptx.substr(at, body - at).find(".reqnctapercluster") != std::string::npos) continue;
    ptx.insert(body + 1, ".reqnctapercluster " + std::to_string(*x) + ", " + std::to_string(y) + ", " + std::to_string(z) + "\n");
  }
}

inline void mark_kernel(llvm::Function& f) {
#if LLVM_VERSION_MAJOR >= 20
  f.setCallingConv(llvm::CallingConv::PTX_Kernel);
#else
  add_nvvm_annotation(f, "kernel", 1);
#endif
}

inline bool is_kernel(const llvm::Function& f) {
  if (f.getCallingConv() == llvm::CallingConv::PTX_Kernel) return true;
  std::optional<int> k = find_nvvm_annotation(f, "kernel");
  return k && *k == 1;
}

}  // namespace sf::llvmb::compat
