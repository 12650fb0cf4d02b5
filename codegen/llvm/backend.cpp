// The LLVM boundary: target machines, the O3 pipeline, libdevice, PTX emission, the
// host JIT and host objects. One file because the JIT's IR transform and the host
// objects run the same pipeline as compile_to_ptx; docs/llvm-backend.md describes
// the stages.
#include "codegen/llvm/backend.h"

#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <set>
#include <string_view>

#include <llvm/Analysis/CGSCCPassManager.h>
#include <llvm/Analysis/LoopAnalysisManager.h>
#include <llvm/Analysis/TargetLibraryInfo.h>
#include <llvm/Bitcode/BitcodeReader.h>
#include <llvm/ExecutionEngine/Orc/ExecutionUtils.h>
#include <llvm/ExecutionEngine/Orc/ExecutorProcessControl.h>
#include <llvm/ExecutionEngine/Orc/TaskDispatch.h>
#include <llvm/ExecutionEngine/Orc/JITTargetMachineBuilder.h>
#include <llvm/ExecutionEngine/Orc/LLJIT.h>
#include <llvm/ExecutionEngine/Orc/ThreadSafeModule.h>
#include <llvm/IR/DiagnosticInfo.h>
#include <llvm/IR/DiagnosticPrinter.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/LegacyPassManager.h>
#include <llvm/IR/Module.h>
#include <llvm/IR/PassManager.h>
#include <llvm/IR/Verifier.h>
#include <llvm/Linker/Linker.h>
#include <llvm/Passes/OptimizationLevel.h>
#include <llvm/Passes/PassBuilder.h>
#include <llvm/Support/DynamicLibrary.h>
#include <llvm/Support/Error.h>
#include <llvm/Support/MemoryBuffer.h>
#include <llvm/Support/TargetSelect.h>
#include <llvm/Support/raw_ostream.h>
#include <llvm/Transforms/IPO/Internalize.h>
#include <llvm/Transforms/Utils/Cloning.h>

#include "runtime/core/run_tool.h"
#include "codegen/llvm/llvm_compat.h"

#ifndef SF_LIBDEVICE_PATH
#define SF_LIBDEVICE_PATH "/usr/local/cuda/nvvm/libdevice/libdevice.10.bc"
#endif

namespace sf::llvmb {
namespace {

constexpr const char* kNvptxTriple = "nvptx64-nvidia-cuda";

Diag error(std::string message) { return Diag{"", {}, std::move(message)}; }

std::string to_string(llvm::Error e) { return llvm::toString(std::move(e)); }

// NVPTX for device code, the native target (X86 here) for the JIT; nothing else, so
// start-up does not pay for the other 18 targets in Debian's libLLVM.
void init_targets() {
  static std::once_flag once;
  std::call_once(once, [] {
    LLVMInitializeNVPTXTargetInfo();
    LLVMInitializeNVPTXTarget();
    LLVMInitializeNVPTXTargetMC();
    LLVMInitializeNVPTXAsmPrinter();
    llvm::InitializeNativeTarget();
    llvm::InitializeNativeTargetAsmPrinter();
  });
}

struct HostInfo {
  std::string triple;
  std::string cpu;
  std::vector<std::string> features;
  std::string features_str;  // comma-joined
};

const HostInfo& host_info() {
  static const HostInfo info = [] {
    HostInfo h;
    h.triple = llvm::sys::getProcessTriple();
    h.cpu = llvm::sys::getHostCPUName().str();
    h.features = compat::host_cpu_features();
    for (const std::string& f : h.features) {
      if (!h.features_str.empty()) h.features_str += ',';
      h.features_str += f;
    }
    return h;
  }();
  return info;
}

// Routes the context's diagnostics into a string for the duration of a call, so a
// link or codegen error becomes a Diag: LLVMContext's default handler calls exit(1)
// on errors. The caller's handler is put back afterwards.
class DiagCapture {
 public:
  explicit DiagCapture(llvm::LLVMContext& ctx) : ctx_(ctx), saved_(ctx.getDiagnosticHandler()) {
    auto h = std::make_unique<llvm::DiagnosticHandler>(this);
    h->DiagHandlerCallback = &DiagCapture::handle;
    ctx_.setDiagnosticHandler(std::move(h));
  }
  ~DiagCapture() { ctx_.setDiagnosticHandler(std::move(saved_)); }
  DiagCapture(const DiagCapture&) = delete;
  DiagCapture& operator=(const DiagCapture&) = delete;

  const std::string& errors() const { return errors_; }

 private:
  static void handle(const llvm::DiagnosticInfo* di, void* self) {
    if (di->getSeverity() != llvm::DS_Error) return;  // remarks and warnings: dropped
    auto* me = static_cast<DiagCapture*>(self);
    if (!me->errors_.empty()) me->errors_ += '\n';
    llvm::raw_string_ostream os(me->errors_);
    llvm::DiagnosticPrinterRawOStream printer(os);
    di->print(printer);
  }

  llvm::LLVMContext& ctx_;
  std::unique_ptr<llvm::DiagnosticHandler> saved_;
  std::string errors_;
};

std::string print_module(const llvm::Module& m) {
  std::string s;
  llvm::raw_string_ostream os(s);
  m.print(os, nullptr);
  return s;
}

// ---- the O3 pipeline --------------------------------------------------------------------

// Clang's -O3: the new pass manager's default per-module pipeline with the target's
// TTI and its PassBuilder callbacks (for NVPTX: NVVMReflect with the arch's
// __CUDA_ARCH, NVVMIntrRange) and both vectorizers on (no-ops on NVPTX, which has
// no vector registers in LLVM's cost model).
void run_o3(llvm::Module& m, llvm::TargetMachine& tm) {
  llvm::LoopAnalysisManager lam;
  llvm::FunctionAnalysisManager fam;
  llvm::CGSCCAnalysisManager cgam;
  llvm::ModuleAnalysisManager mam;
  llvm::PipelineTuningOptions pto;
  pto.LoopUnrolling = true;
  pto.LoopInterleaving = true;
  pto.LoopVectorization = true;
  pto.SLPVectorization = true;
  llvm::PassBuilder pb(&tm, pto);
  pb.registerModuleAnalyses(mam);
  pb.registerCGSCCAnalyses(cgam);
  pb.registerFunctionAnalyses(fam);
  pb.registerLoopAnalyses(lam);
  pb.crossRegisterProxies(lam, fam, cgam, mam);
  llvm::ModulePassManager mpm = pb.buildPerModuleDefaultPipeline(llvm::OptimizationLevel::O3);
  mpm.run(m, mam);
}

// ---- libdevice ------------------------------------------------------------------------

struct Libdevice {
  std::string path;
  std::unique_ptr<llvm::MemoryBuffer> buffer;  // null when it could not be read
  std::string error;
};

// Read once per process; parsed (lazily) into each module's own context per call,
// because a Module cannot be shared between contexts.
const Libdevice& libdevice() {
  static const Libdevice ld = [] {
    Libdevice l;
    const char* env = std::getenv("SHARDFUSE_LIBDEVICE");
    l.path = (env && *env) ? env : SF_LIBDEVICE_PATH;
    auto buf = llvm::MemoryBuffer::getFile(l.path);
    if (buf) {
      l.buffer = std::move(*buf);
    } else {
      l.error = "cannot read libdevice '" + l.path + "': " + buf.getError().message() +
                " (install the CUDA toolkit or set SHARDFUSE_LIBDEVICE)";
    }
    return l;
  }();
  return ld;
}

bool is_libdevice_name(llvm::StringRef name) { return name.starts_with("__nv_"); }

// Links the __nv_* functions `m` declares, and only those (LinkOnlyNeeded), from
// libdevice. The lazy bitcode reader materialises just the bodies the linker pulls in.
Result<void> link_libdevice(llvm::Module& m) {
  std::vector<std::string> wanted;
  for (const llvm::Function& f : m)
    if (f.isDeclaration() && is_libdevice_name(f.getName())) wanted.push_back(f.getName().str());
  if (wanted.empty()) return {};

  const Libdevice& ld = libdevice();
  if (!ld.buffer) return error(ld.error);
  auto lib = llvm::getLazyBitcodeModule(ld.buffer->getMemBufferRef(), m.getContext());
  if (!lib) return error("cannot parse libdevice '" + ld.path + "': " + to_string(lib.takeError()));
  // libdevice says nvptx64-nvidia-gpulibs and an older data layout; adopting the
  // module's avoids the linker's "different target triples" warning on every call.
  compat::set_triple(**lib, compat::get_triple(m));
  (*lib)->setDataLayout(m.getDataLayout());

  DiagCapture capture(m.getContext());
  if (llvm::Linker::linkModules(m, std::move(*lib), llvm::Linker::LinkOnlyNeeded))
    return error("linking libdevice failed: " + capture.errors());

  for (const std::string& name : wanted) {
    const llvm::Function* f = m.getFunction(name);
    if (f && f->isDeclaration())
      return error("libdevice (" + ld.path + ") has no function '" + name + "'");
  }
  return {};
}

// Device code has no libc: anything the kernels still call after linking must be
// one of the few functions the CUDA driver/ptxas provide.
Result<void> check_no_undefined_calls(const llvm::Module& m) {
  static const std::set<std::string_view> provided = {"vprintf", "malloc", "free",
                                                       "__assertfail"};
  for (const llvm::Function& f : m) {
    if (!f.isDeclaration() || f.isIntrinsic() || f.use_empty()) continue;
    if (provided.count(std::string_view(f.getName()))) continue;
    std::string hint = is_libdevice_name(f.getName())
                           ? ""
                           : " (device code has no libc/libm: call libdevice's __nv_* functions)";
    return error("NVPTX module calls undefined function '" + f.getName().str() + "'" + hint);
  }
  return {};
}

// ---- stage dumps ------------------------------------------------------------------------

// $SHARDFUSE_DUMP_LLVM=DIR writes each stage of an NVPTX compile as
// DIR/<name>.<arch>.<stage>, so a bug report can name the stage that broke.
class StageDump {
 public:
  StageDump(std::string name, std::string arch) {
    const char* dir = std::getenv("SHARDFUSE_DUMP_LLVM");
    if (dir && *dir) prefix_ = std::string(dir) + "/" + name + "." + arch + ".";
  }
  void module(const char* stage, const llvm::Module& m) const {
    if (!prefix_.empty()) write(std::string(stage) + ".ll", print_module(m));
  }
  void text(const char* suffix, const std::string& s) const {
    if (!prefix_.empty()) write(suffix, s);
  }

 private:
  void write(const std::string& suffix, const std::string& s) const {
    std::ofstream(prefix_ + suffix, std::ios::binary) << s;
  }
  std::string prefix_;
};

std::string module_name(const llvm::Module& m) {
  for (const llvm::Function& f : m)
    if (!f.isDeclaration() && is_kernel(f)) return f.getName().str();
  std::string id = m.getModuleIdentifier();
  return id.empty() ? "module" : id;
}

struct NvptxModule {
  std::unique_ptr<llvm::TargetMachine> tm;
  std::unique_ptr<llvm::Module> module;  // the optimised clone
};

// Everything compile_to_ptx does before code generation, on a clone of `m`.
Result<NvptxModule> optimize_nvptx(const llvm::Module& m, const std::string& arch,
                                   const StageDump& dump) {
  if (compat::get_triple(m) != kNvptxTriple)
    return error("compile_to_ptx: module '" + m.getModuleIdentifier() + "' has triple '" +
                 compat::get_triple(m) + "', not " + kNvptxTriple +
                 " (call prepare_module with Target::nvptx)");
  auto tm = create_target_machine(Target::nvptx(arch));
  if (!tm) return tm.error();
  if (auto report = verify(m)) return error("module does not verify:\n" + *report);

  NvptxModule out;
  out.tm = std::move(*tm);
  out.module = llvm::CloneModule(m);
  llvm::Module& c = *out.module;
  c.setDataLayout(out.tm->createDataLayout());
  dump.module("0-input", c);

  bool has_kernel = false;
  for (const llvm::Function& f : c) has_kernel |= !f.isDeclaration() && is_kernel(f);
  if (!has_kernel)
    return error("NVPTX module '" + c.getModuleIdentifier() +
                 "' has no kernel (mark the entry with llvmb::mark_kernel)");

  SF_TRY(link_libdevice(c));
  // Kernels are the only entry points: everything else (libdevice included) becomes
  // internal so that O3 can inline it and GlobalDCE can drop what is unused.
  llvm::internalizeModule(c, [](const llvm::GlobalValue& gv) {
    const auto* f = llvm::dyn_cast<llvm::Function>(&gv);
    return f && is_kernel(*f);
  });
  // libdevice asks __nvvm_reflect("__CUDA_FTZ"); 0 keeps denormals (IEEE, as the
  // reference evaluator computes). Fast math is the emitters' per-instruction call.
  c.setModuleFlag(llvm::Module::Override, "nvvm-reflect-ftz", 0u);
  dump.module("1-linked", c);

  run_o3(c, *out.tm);
  dump.module("2-opt", c);
  SF_TRY(check_no_undefined_calls(c));
  return out;
}

// The factory behind create_target_machine and the portable host machine below;
// `what` names the target in the Diag.
Result<std::unique_ptr<llvm::TargetMachine>> make_target_machine(const std::string& triple,
                                                                 const std::string& cpu,
                                                                 const std::string& features,
                                                                 std::optional<llvm::Reloc::Model> rm,
                                                                 const std::string& what) {
  std::string lookup_error;
  const llvm::Target* target = llvm::TargetRegistry::lookupTarget(triple, lookup_error);
  if (!target) return error("no LLVM target for '" + triple + "': " + lookup_error);
  llvm::TargetOptions options;  // no global fast-math (see compile_to_ptx)
  llvm::TargetMachine* tm =
      compat::create_target_machine(*target, triple, cpu, features, options, rm);
  if (!tm) return error("LLVM could not create a target machine for " + what);
  return std::unique_ptr<llvm::TargetMachine>(tm);
}

// Host code that runs on every machine of the host's architecture, not just this one
// (compile_to_host_object): x86-64-v2 (SSE4.2, POPCNT, CX16; what every x86_64 server
// of the last decade has, and the baseline of current distributions) on x86_64, the
// target's generic CPU elsewhere; no extra features; PIC for shared objects.
Result<std::unique_ptr<llvm::TargetMachine>> portable_host_target_machine() {
  init_targets();
  const std::string& triple = host_info().triple;
  const std::string cpu = llvm::Triple(triple).getArch() == llvm::Triple::x86_64 ? "x86-64-v2" : "generic";
  return make_target_machine(triple, cpu, "", llvm::Reloc::PIC_, "the portable host (" + triple + ", " + cpu + ")");
}

}  // namespace

// ---- targets -----------------------------------------------------------------------------

std::string Target::str() const {
  if (kind == Kind::NVPTX) return "nvptx-" + arch;
  llvm::Triple t(host_info().triple);
  return "host-" + t.getArchName().str() + "-" + host_info().cpu;
}

Result<std::unique_ptr<llvm::TargetMachine>> create_target_machine(const Target& t) {
  init_targets();
  std::string triple, cpu, features;
  std::optional<llvm::Reloc::Model> rm;
  if (t.kind == Target::Kind::NVPTX) {
    std::optional<compat::ArchInfo> info = compat::arch_info(t.arch);
    if (!info) {
      std::string known;
      for (const compat::ArchInfo& a : compat::kArchTable) known += " " + std::string(a.arch);
      return error("unknown NVPTX arch '" + t.arch + "' (LLVM " +
                   std::to_string(LLVM_VERSION_MAJOR) + " knows:" + known + ")");
    }
    triple = kNvptxTriple;
    cpu = t.arch;
    features = compat::ptx_feature(info->ptx);
  } else {
    triple = host_info().triple;
    cpu = host_info().cpu;
    features = host_info().features_str;
    rm = llvm::Reloc::PIC_;
  }
  return make_target_machine(triple, cpu, features, rm, t.str());
}

std::optional<int> ptx_isa_version(const std::string& arch) {
  if (auto info = compat::arch_info(arch)) return info->ptx;
  return std::nullopt;
}

std::string triple(const Target& t) {
  return t.kind == Target::Kind::NVPTX ? kNvptxTriple : host_info().triple;
}

std::string data_layout(const Target& t) {
  // Emitters call this per kernel; a target machine per call would be waste. NVPTX's
  // layout does not depend on the arch (only on 64-bit pointers), so an unknown arch
  // still gets it here and its Diag from compile_to_ptx.
  auto layout_of = [](const Target& probe) -> std::string {
    auto tm = create_target_machine(probe);
    return tm ? (*tm)->createDataLayout().getStringRepresentation() : "";
  };
  static const std::string nvptx = layout_of(Target::nvptx("sm_80"));
  static const std::string host = layout_of(Target::host());
  return t.kind == Target::Kind::NVPTX ? nvptx : host;
}

void prepare_module(llvm::Module& m, const Target& t) {
  compat::set_triple(m, triple(t));
  m.setDataLayout(data_layout(t));
}

std::optional<std::string> verify(const llvm::Module& m) {
  std::string report;
  llvm::raw_string_ostream os(report);
  if (!llvm::verifyModule(m, &os)) return std::nullopt;
  os.flush();
  return report.empty() ? std::string("module is broken") : report;
}

void mark_kernel(llvm::Function& f, int max_threads_per_block) {
  compat::mark_kernel(f);
  if (max_threads_per_block > 0) compat::add_nvvm_annotation(f, "maxntidx", max_threads_per_block);
}

void set_min_blocks_per_sm(llvm::Function& f, int n) { compat::add_nvvm_annotation(f, "minctasm", n); }

void set_cluster_dims(llvm::Function& f, int x, int y, int z) {
  compat::add_nvvm_annotation(f, "cluster_dim_x", x);
  compat::add_nvvm_annotation(f, "cluster_dim_y", y);
  compat::add_nvvm_annotation(f, "cluster_dim_z", z);
}

bool is_kernel(const llvm::Function& f) { return compat::is_kernel(f); }

// ---- PTX ---------------------------------------------------------------------------------

Result<std::string> compile_to_ptx(llvm::Module& m, const std::string& arch) {
  StageDump dump(module_name(m), arch);
  DiagCapture capture(m.getContext());
  auto opt = optimize_nvptx(m, arch, dump);
  if (!opt) return opt.error();
  llvm::Module& c = *opt->module;

  llvm::SmallString<0> ptx;
  {
    llvm::raw_svector_ostream os(ptx);
    llvm::legacy::PassManager pm;
    pm.add(new llvm::TargetLibraryInfoWrapperPass(llvm::Triple(compat::get_triple(c))));
    if (opt->tm->addPassesToEmitFile(pm, os, nullptr, llvm::CodeGenFileType::AssemblyFile))
      return error("the NVPTX target cannot emit assembly");
    pm.run(c);
  }
  if (!capture.errors().empty()) return error("NVPTX code generation failed: " + capture.errors());
  std::string text(ptx.str());
  compat::add_cluster_directives(c, text);
  dump.text("ptx", text);
  return text;
}

Result<std::string> optimized_ir(llvm::Module& m, const Target& t) {
  if (t.kind == Target::Kind::NVPTX) {
    DiagCapture capture(m.getContext());
    auto opt = optimize_nvptx(m, t.arch, StageDump(module_name(m), t.arch));
    if (!opt) return opt.error();
    return print_module(*opt->module);
  }
  if (auto report = verify(m)) return error("module does not verify:\n" + *report);
  auto tm = create_target_machine(t);
  if (!tm) return tm.error();
  // Loop hints the vectoriser cannot honour warn through the context (a hinted loop
  // that calls tanhf, say); the code is still right, so they are not printed.
  DiagCapture capture(m.getContext());
  std::unique_ptr<llvm::Module> c = llvm::CloneModule(m);
  if (compat::get_triple(*c).empty()) compat::set_triple(*c, host_info().triple);
  c->setDataLayout((*tm)->createDataLayout());
  run_o3(*c, **tm);
  return print_module(*c);
}

// ---- host JIT ----------------------------------------------------------------------------

namespace {
// ORC reports materialisation failures (a relocation it cannot apply, ...) to the
// session's error reporter, and the lookup then fails only with "failed to
// materialize". Materialisation runs on the thread that looks the symbol up (the
// in-place dispatcher below), so a thread-local buffer pairs each report with its
// add() call.
thread_local std::string t_session_errors;
}  // namespace

struct HostJit::Impl {
  std::unique_ptr<llvm::orc::LLJIT> jit;
  std::atomic<uint64_t> next_dylib{0};
};

HostJit::HostJit() : impl_(std::make_unique<Impl>()) {}
HostJit::~HostJit() = default;

Result<std::unique_ptr<HostJit>> HostJit::create() {
  init_targets();
  const HostInfo& host = host_info();
  llvm::orc::JITTargetMachineBuilder jtmb{llvm::Triple(host.triple)};
  jtmb.setCPU(host.cpu);
  jtmb.addFeatures(host.features);
  jtmb.setCodeGenOptLevel(llvm::CodeGenOptLevel::Aggressive);

  auto dl = jtmb.getDefaultDataLayoutForTarget();
  if (!dl) return error("host JIT: " + to_string(dl.takeError()));
  const char prefix = dl->getGlobalPrefix();

  // In-place dispatch: each add() compiles on its caller's thread (LLVM 19's default
  // with concurrent compilation is a thread pool, which would hide which call an
  // error report belongs to and gains nothing: callers that want parallel compiles
  // call add() from several threads).
  auto epc = llvm::orc::SelfExecutorProcessControl::Create(
      nullptr, std::make_unique<llvm::orc::InPlaceTaskDispatcher>());
  if (!epc) return error("host JIT: " + to_string(epc.takeError()));

  auto jit =
      llvm::orc::LLJITBuilder()
          .setJITTargetMachineBuilder(jtmb)
          .setExecutorProcessControl(std::move(*epc))
          // A fresh TargetMachine per compile (ConcurrentIRCompiler), so add() may run
          // on several threads at once.
          .setSupportConcurrentCompilation(true)
          // Kernels have no static constructors; the generic IR platform's
          // initializer machinery would only cost time per module.
          .setPlatformSetUp(llvm::orc::setUpInactivePlatform)
          .setProcessSymbolsJITDylibSetup(
              [prefix](llvm::orc::LLJIT& j) -> llvm::Expected<llvm::orc::JITDylibSP> {
                auto& jd = j.getExecutionSession().createBareJITDylib("<process>");
                auto gen = llvm::orc::DynamicLibrarySearchGenerator::GetForCurrentProcess(prefix);
                if (!gen) return gen.takeError();
                jd.addGenerator(std::move(*gen));
                return llvm::orc::JITDylibSP(&jd);
              })
          .create();
  if (!jit) return error("host JIT: " + to_string(jit.takeError()));

  (*jit)->getExecutionSession().setErrorReporter([](llvm::Error e) {
    if (!t_session_errors.empty()) t_session_errors += '\n';
    t_session_errors += to_string(std::move(e));
  });
  (*jit)->getIRTransformLayer().setTransform(
      [jtmb](llvm::orc::ThreadSafeModule tsm, llvm::orc::MaterializationResponsibility&)
          -> llvm::Expected<llvm::orc::ThreadSafeModule> {
        llvm::orc::JITTargetMachineBuilder b = jtmb;  // per call: one TM per thread
        auto tm = b.createTargetMachine();
        if (!tm) return tm.takeError();
        tsm.withModuleDo([&](llvm::Module& m) {
          // Warnings and remarks (loop hints the vectoriser could not honour; the code
          // is still right) are dropped; errors join the session's error report.
          m.getContext().setDiagnosticHandlerCallBack([](const llvm::DiagnosticInfo* di, void*) {
            if (di->getSeverity() != llvm::DS_Error) return;
            if (!t_session_errors.empty()) t_session_errors += '\n';
            llvm::raw_string_ostream os(t_session_errors);
            llvm::DiagnosticPrinterRawOStream printer(os);
            di->print(printer);
          });
          run_o3(m, **tm);
        });
        return tsm;
      });

  std::unique_ptr<HostJit> out(new HostJit());
  out->impl_->jit = std::move(*jit);
  return out;
}

Result<void*> HostJit::add(std::unique_ptr<llvm::Module> m, std::unique_ptr<llvm::LLVMContext> ctx,
                           const std::string& symbol) {
  if (!m || !ctx) return error("HostJit::add: null module or context");
  if (&m->getContext() != ctx.get()) {
    std::string id = m->getModuleIdentifier();
    m.reset();  // its own context is the caller's; ours goes when we return
    return error("HostJit::add: module '" + id + "' does not belong to the given context");
  }
  // From here the ThreadSafeModule owns both and destroys the module first (the
  // parameters alone would be destroyed in an unspecified order).
  llvm::orc::ThreadSafeModule tsm(std::move(m), llvm::orc::ThreadSafeContext(std::move(ctx)));
  llvm::Module& mod = *tsm.getModuleUnlocked();
  if (auto report = verify(mod)) return error("module does not verify:\n" + *report);

  llvm::orc::LLJIT& jit = *impl_->jit;
  const llvm::Triple& host = jit.getTargetTriple();
  if (compat::get_triple(mod).empty()) compat::set_triple(mod, host.str());
  llvm::Triple mt(compat::get_triple(mod));
  if (mt.getArch() != host.getArch() || mt.getOS() != host.getOS())
    return error("HostJit::add: module '" + mod.getModuleIdentifier() + "' is for " + mt.str() +
                 ", not the host (" + host.str() + ")");
  if (mod.getDataLayout().isDefault()) mod.setDataLayout(jit.getDataLayout());
  // An unresolvable call would otherwise surface as ORC's "failed to materialize
  // symbols: { k }", which does not say which function is missing.
  for (const llvm::Function& f : mod) {
    if (!f.isDeclaration() || f.isIntrinsic() || f.use_empty()) continue;
    if (!llvm::sys::DynamicLibrary::SearchForAddressOfSymbol(f.getName().str()))
      return error("HostJit::add: module '" + mod.getModuleIdentifier() + "' calls '" +
                   f.getName().str() + "', which is neither defined in it nor in the process");
  }

  t_session_errors.clear();
  auto fail = [&](const std::string& what, llvm::Error e) -> Diag {
    std::string msg = "host JIT: " + what + ": " + to_string(std::move(e));
    if (!t_session_errors.empty()) msg += "\n" + t_session_errors;
    return error(msg);
  };

  // One JITDylib per module: the same entry name may be added many times.
  std::string name = "m" + std::to_string(impl_->next_dylib++) + "." + symbol;
  auto jd = jit.createJITDylib(name);
  if (!jd) return fail("creating " + name, jd.takeError());
  if (llvm::Error e = jit.addIRModule(*jd, std::move(tsm))) return fail("adding the module", std::move(e));
  auto addr = jit.lookup(*jd, symbol);
  if (!addr) return fail("looking up '" + symbol + "'", addr.takeError());
  return addr->toPtr<void*>();
}

// ---- host shared objects ---------------------------------------------------------------

Result<std::string> compile_to_host_object(llvm::Module& m) {
  if (auto report = verify(m)) return error("module does not verify:\n" + *report);
  auto tm = portable_host_target_machine();
  if (!tm) return tm.error();
  const llvm::Triple host((*tm)->getTargetTriple());
  if (!host.isOSBinFormatELF())
    return error("compile_to_host_object: the host (" + host.str() + ") does not use ELF objects");
  const std::string own_triple = compat::get_triple(m);
  if (!own_triple.empty()) {
    llvm::Triple mt(own_triple);
    if (mt.getArch() != host.getArch() || mt.getOS() != host.getOS())
      return error("compile_to_host_object: module '" + m.getModuleIdentifier() + "' is for " + mt.str() +
                   ", not the host (" + host.str() + ")");
  }
  const llvm::DataLayout layout = (*tm)->createDataLayout();
  if (!m.getDataLayout().isDefault() && m.getDataLayout() != layout)
    return error("compile_to_host_object: module '" + m.getModuleIdentifier() + "' has data layout '" +
                 m.getDataLayout().getStringRepresentation() + "', not the host's '" +
                 layout.getStringRepresentation() + "'");

  // As in optimized_ir: warnings (loop hints the vectoriser could not honour) are
  // dropped, errors end up in the Diag.
  DiagCapture capture(m.getContext());
  std::unique_ptr<llvm::Module> c = llvm::CloneModule(m);
  if (own_triple.empty()) compat::set_triple(*c, host.str());
  c->setDataLayout(layout);
  // A function's own CPU or features would override the portable target machine's.
  for (llvm::Function& f : *c) {
    f.removeFnAttr("target-cpu");
    f.removeFnAttr("target-features");
  }
  run_o3(*c, **tm);

  llvm::SmallString<0> object;
  {
    llvm::raw_svector_ostream os(object);
    llvm::legacy::PassManager pm;
    pm.add(new llvm::TargetLibraryInfoWrapperPass(llvm::Triple(compat::get_triple(*c))));
    if ((*tm)->addPassesToEmitFile(pm, os, nullptr, llvm::CodeGenFileType::ObjectFile))
      return error("the host target (" + host.str() + ") cannot emit object files");
    pm.run(*c);
  }
  if (!capture.errors().empty()) return error("host code generation failed: " + capture.errors());
  return std::string(object.str());
}

namespace {

constexpr std::chrono::seconds kLinkTimeout{60};

bool executable_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(path.c_str(), X_OK) == 0;
}

// `name` looked up on $PATH as execvp would (an empty entry is the current directory).
std::optional<std::string> find_on_path(const std::string& name) {
  const char* path = std::getenv("PATH");
  if (!path) return std::nullopt;
  std::string_view rest(path);
  for (;;) {
    size_t colon = rest.find(':');
    std::string_view dir = rest.substr(0, colon);
    std::string candidate = (dir.empty() ? std::string(".") : std::string(dir)) + "/" + name;
    if (executable_file(candidate)) return candidate;
    if (colon == std::string_view::npos) return std::nullopt;
    rest.remove_prefix(colon + 1);
  }
}

// The C compiler driver that links host objects (see link_host_shared_object).
Result<std::string> find_host_cc() {
  if (const char* env = std::getenv("SHARDFUSE_HOST_CC"); env && *env) {
    const std::string cc = env;
    if (cc.find('/') != std::string::npos) {
      if (executable_file(cc)) return cc;
      return error("cannot link host code: SHARDFUSE_HOST_CC=" + cc + " is not an executable file");
    }
    if (auto found = find_on_path(cc)) return *found;
    return error("cannot link host code: SHARDFUSE_HOST_CC=" + cc + " is not on PATH");
  }
  for (const char* name : {"cc", "gcc", "clang"})
    if (auto found = find_on_path(name)) return *found;
  return error(
      "cannot link host code: no C compiler driver (cc, gcc or clang) on PATH; install one or "
      "set SHARDFUSE_HOST_CC to its path");
}

// A command line to paste into a shell: arguments with anything but [A-Za-z0-9_./=+,:@%-]
// in single quotes.
std::string command_line(const std::vector<std::string>& argv) {
  std::string out;
  for (const std::string& a : argv) {
    if (!out.empty()) out += ' ';
    bool plain = !a.empty();
    for (char ch : a)
      plain &= (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
               std::string_view("_./=+,:@%-").find(ch) != std::string_view::npos;
    if (plain) {
      out += a;
      continue;
    }
    out += '\'';
    for (char ch : a) out += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
    out += '\'';
  }
  return out;
}

}  // namespace

Result<void> link_host_shared_object(const std::vector<std::string>& object_paths,
                                            const std::string& out_path) {
  if (out_path.empty()) return error("cannot link host code: no output path");
  if (object_paths.empty()) return error("cannot link " + out_path + ": no objects");
  auto cc = find_host_cc();
  if (!cc) return cc.error();

  // A path that starts with '-' would be read as an option.
  auto as_path = [](const std::string& p) { return p.starts_with('-') ? "./" + p : p; };
  std::vector<std::string> argv = {*cc, "-shared", "-o", as_path(out_path)};
  for (const std::string& p : object_paths) argv.push_back(as_path(p));
  argv.push_back("-lm");  // the kernels call libm (expf, tanhf, ...)
  // A call to a function nothing defines fails here, naming it, rather than at
  // dlopen on the machine that runs the Plan.
  argv.push_back("-Wl,-z,defs");
  auto run = run_tool(argv, kLinkTimeout);
  if (!run) return with_context("cannot link " + out_path + ": ", run.error());
  if (run->ok()) return {};
  std::string msg = "linking " + out_path + " failed: `" + command_line(argv) + "` " + run->status_str();
  std::string quoted = quote_tool_output(run->output);
  msg += quoted.empty() ? " (no output)" : ":\n" + quoted;
  return error(msg);
}

}  // namespace sf::llvmb
