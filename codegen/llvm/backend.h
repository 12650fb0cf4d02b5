// The LLVM boundary (STYLE.md #4): the only code that creates target machines,
// runs pass pipelines, links libdevice, emits PTX, JIT-compiles host code and emits
// host objects.
// Emitters build llvm::Modules with IRBuilder and hand them here; they never touch
// pass managers or target options. Every LLVM-version difference lives in
// codegen/llvm/llvm_compat.h.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "runtime/core/diag.h"

namespace llvm {
class Function;
class LLVMContext;
class Module;
class TargetMachine;
}  // namespace llvm

namespace sf::llvmb {

// Where a module will run. NVPTX: `arch` is "sm_80", "sm_90a", ...; Host: the
// machine this process runs on (its CPU and features, so vector widths fit).
struct Target {
  enum class Kind { Host, NVPTX };
  Kind kind = Kind::Host;
  std::string arch;  // NVPTX only

  static Target host() { return {Kind::Host, ""}; }
  static Target nvptx(std::string arch) { return {Kind::NVPTX, std::move(arch)}; }
  std::string str() const;  // "host-x86_64-<cpu>" or "nvptx-sm_90a"
};

// The triple and data layout a module for `t` must carry; emitters set both before
// building IR so that types and alignments are the target's.
std::string triple(const Target& t);
std::string data_layout(const Target& t);
// Sets the module's triple and data layout for `t`.
void prepare_module(llvm::Module& m, const Target& t);

// LLVM's verifier; nullopt when the module is well formed, else its report.
std::optional<std::string> verify(const llvm::Module& m);

// ---- kernels (NVPTX) ------------------------------------------------------------------
//
// How an NVPTX module names its kernels. The entry is an ordinary function with
// external linkage, `void` result, the C identifier from KernelSpec::entry as its
// name (no mangling, so the PTX `.entry` and cuModuleGetFunction use the same
// string), and it is marked as a kernel by calling mark_kernel(), which on LLVM 19
// appends
//     !nvvm.annotations = !{..., !{ptr @entry, !"kernel", i32 1}}
// (LLVM 20+ would set the ptx_kernel calling convention instead; mark_kernel hides
// which). Do not write the metadata by hand: one node per key, or LLVM 19 crashes.
// `max_threads_per_block` > 0 also adds `!"maxntidx"` (PTX `.maxntid N, 1, 1`), which
// lets ptxas budget registers for exactly that block size; launching with more
// threads than that then fails, so pass LaunchShape's block size or nothing.
// Everything in the module that is not a kernel is internalised by compile_to_ptx
// and disappears unless a kernel uses it.
void mark_kernel(llvm::Function& f, int max_threads_per_block = 0);
// Adds `!"minctasm"` (PTX `.minnctapersm n`) to a kernel marked with a block size:
// with both, ptxas knows the registers a thread has at entry (65536 / (n x block),
// in whole 8s) and gives the kernel exactly that many, which setmaxnreg needs
// (without it ptxas ignores setmaxnreg: "unable to determine register count at
// entry", C7508).
void set_min_blocks_per_sm(llvm::Function& f, int n);
// Adds `!"cluster_dim_x"` .. `z` (PTX `.reqnctapercluster x, y, z`): the kernel runs
// in thread-block clusters of that shape (sm_90 and later), which a plain launch then
// forms. compile_to_ptx writes the directive itself where LLVM's printer does not
// (LLVM 19 has no cluster annotations).
void set_cluster_dims(llvm::Function& f, int x, int y = 1, int z = 1);
// True for functions marked by mark_kernel (or by the ptx_kernel calling convention).
bool is_kernel(const llvm::Function& f);

// The PTX ISA version compile_to_ptx emits for `arch` (80 == PTX ISA 8.0), or
// nullopt when LLVM 19's NVPTX backend does not know the arch (sm_100 and later).
std::optional<int> ptx_isa_version(const std::string& arch);

// The one target-machine factory (O3 code generation). NVPTX: triple
// nvptx64-nvidia-cuda, CPU = arch, features = +ptxNN from the arch table. Host: the
// process triple, the host CPU and its features. For tests and tools; emitters never
// need a TargetMachine.
Result<std::unique_ptr<llvm::TargetMachine>> create_target_machine(const Target& t);

// NVPTX: links the libdevice functions the module calls (only those), internalises
// them, runs the O3 pipeline and emits PTX text for `arch` (PTX ISA version from
// the arch table in llvm_compat.h). The module must carry the NVPTX triple.
// A Diag when the module does not verify, libdevice cannot be read, or emission fails.
//
// Math: call libdevice by its names (`__nv_expf`, `__nv_tanhf`, ...; declare them
// with the signature libdevice has); they are linked from $SHARDFUSE_LIBDEVICE or
// the toolkit's nvvm/libdevice/libdevice.10.bc. `__CUDA_FTZ` is 0 (denormals kept).
// No global fast-math: put fast-math flags on the instructions that may use them.
// Calls to other undefined functions (libm's `expf`, ...) give a Diag.
//
// The module itself is left unchanged (the work is done on a clone in the same
// context), so one module can be compiled for several archs. As with all LLVM
// objects, one thread at a time per LLVMContext; different contexts may compile
// concurrently. With $SHARDFUSE_DUMP_LLVM=DIR every stage is also written to
// DIR/<entry>.<arch>.{0-input,1-linked,2-opt}.ll and .ptx.
Result<std::string> compile_to_ptx(llvm::Module& m, const std::string& arch);

// The module's LLVM IR text after the same optimisation compile_to_ptx / the host
// JIT would run (for --dump-after=emit and FileCheck tests). Leaves `m` unchanged.
Result<std::string> optimized_ir(llvm::Module& m, const Target& t);

// A host JIT (ORC LLJIT) that owns compiled modules for its whole lifetime.
class HostJit {
 public:
  static Result<std::unique_ptr<HostJit>> create();
  ~HostJit();
  // Optimises (O3 for the host CPU) and compiles the module; returns the address of
  // `symbol` in it. Module and context are moved in. Thread-safe.
  //
  // Every module gets its own JITDylib, so modules may define the same names (the
  // autotuner compiles one entry per config). Undefined functions resolve against
  // the process (libm's expf, ...). The module's triple and data layout are set to
  // the host's when empty; a module for another target gives a Diag, as does one
  // that does not verify or lacks `symbol`. Code lives until the HostJit dies.
  Result<void*> add(std::unique_ptr<llvm::Module> m, std::unique_ptr<llvm::LLVMContext> ctx,
                    const std::string& symbol);

 private:
  HostJit();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// ---- host shared objects ----------------------------------------------------------------
//
// A Plan carries its CPU kernels as one ELF shared object, which a machine without
// LLVM dlopen()s: compile each module to an object, then link the objects.

// Optimises a clone of the module with the host JIT's O3 pipeline and emits a
// relocatable ELF object (the bytes) for the host triple, position-independent
// (Reloc::PIC_), for a portable CPU rather than this machine's: "x86-64-v2" with no
// extra features on x86_64 (SSE4.2, POPCNT; no AVX), "generic" elsewhere, so the
// object runs on any machine of the architecture (functions' own "target-cpu" and
// "target-features" attributes are dropped from the clone). The clone's triple and
// data layout are set to the host's when empty; a module for another target (or
// another data layout), or one that does not verify, gives a Diag, as does an error
// LLVM reports while generating code.
//
// What the object exports: nothing is internalised, so every external function
// definition keeps its name, linkage and visibility (external with default
// visibility is what dlsym finds; make helpers internal to keep them out);
// declarations (libm's `expf`, ...) stay undefined symbols for the linker and the
// dynamic loader. The module itself is left unchanged (the work is done on a clone
// in the same context), as in compile_to_ptx.
Result<std::string> compile_to_host_object(llvm::Module& m);

// Links objects from compile_to_host_object into the shared object `out_path` with
// the system C compiler driver: `<cc> -shared -o OUT OBJS... -lm`, where <cc> is
// $SHARDFUSE_HOST_CC when set (a path, or a name looked up on PATH), else the first
// of cc, gcc, clang on PATH. Argv only, no shell; stdin is /dev/null, the output is
// captured, and a link that runs over 60 s is killed. nullopt when it linked, else a
// Diag: no driver found (it names SHARDFUSE_HOST_CC), the driver cannot be run, or
// it failed (the Diag names the command and quotes the first lines of its output).
// Needs no LLVM.
Result<void> link_host_shared_object(const std::vector<std::string>& object_paths,
                                            const std::string& out_path);

}  // namespace sf::llvmb
