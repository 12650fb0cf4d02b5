// The LLVM boundary without a GPU: IRBuilder-made kernels through verify, libdevice
// linking, O3 and PTX emission (text checks + ptxas), and the host JIT against
// std::exp. Expected numbers come from the C library, never from the code under test.
#include "codegen/llvm/backend.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <regex>
#include <thread>
#include <vector>

#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/IntrinsicsNVPTX.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>
#include <llvm/Support/raw_ostream.h>
#include <llvm/Target/TargetMachine.h>

#include "autotune/ptxas.h"
#include "codegen/llvm/llvm_compat.h"

namespace sf::llvmb {
namespace llvm_backend_test {

bool have_libdevice() {
  const char* env = std::getenv("SHARDFUSE_LIBDEVICE");
  return std::filesystem::exists((env && *env) ? env : SF_LIBDEVICE_PATH);
}

#define SKIP_WITHOUT_LIBDEVICE() \
  if (!have_libdevice()) GTEST_SKIP() << "libdevice not found at " SF_LIBDEVICE_PATH

size_t count(const std::string& s, const std::string& needle) {
  size_t n = 0;
  for (size_t p = s.find(needle); p != std::string::npos; p = s.find(needle, p + 1)) ++n;
  return n;
}

std::string print(const llvm::Module& m) {
  std::string s;
  llvm::raw_string_ostream os(s);
  m.print(os, nullptr);
  return s;
}

// y[i] = expf(x[i]) * scale for i < n, one element per thread:
//   void @entry(ptr addrspace(1) x, ptr addrspace(1) y, i32 n)
// `math` is the function called for exp (libdevice's __nv_expf normally).
std::unique_ptr<llvm::Module> nvptx_exp_kernel(llvm::LLVMContext& ctx, const std::string& entry,
                                               float scale = 2.0f,
                                               const std::string& math = "__nv_expf",
                                               int max_threads = 0) {
  auto m = std::make_unique<llvm::Module>(entry, ctx);
  prepare_module(*m, Target::nvptx("sm_80"));
  llvm::IRBuilder<> b(ctx);
  llvm::Type* f32 = b.getFloatTy();
  llvm::Type* i32 = b.getInt32Ty();
  llvm::Type* gptr = llvm::PointerType::get(ctx, 1);
  auto* fty = llvm::FunctionType::get(b.getVoidTy(), {gptr, gptr, i32}, false);
  auto* f = llvm::Function::Create(fty, llvm::Function::ExternalLinkage, entry, *m);
  mark_kernel(*f, max_threads);
  llvm::FunctionCallee exp = m->getOrInsertFunction(math, llvm::FunctionType::get(f32, {f32}, false));

  auto* body = llvm::BasicBlock::Create(ctx, "entry", f);
  auto* work = llvm::BasicBlock::Create(ctx, "work", f);
  auto* done = llvm::BasicBlock::Create(ctx, "done", f);
  b.SetInsertPoint(body);
  llvm::Value* tid = b.CreateIntrinsic(llvm::Intrinsic::nvvm_read_ptx_sreg_tid_x, {}, {});
  llvm::Value* bid = b.CreateIntrinsic(llvm::Intrinsic::nvvm_read_ptx_sreg_ctaid_x, {}, {});
  llvm::Value* bdim = b.CreateIntrinsic(llvm::Intrinsic::nvvm_read_ptx_sreg_ntid_x, {}, {});
  llvm::Value* i = b.CreateAdd(b.CreateMul(bid, bdim, "", /*HasNUW=*/true, /*HasNSW=*/true), tid, "i",
                               true, true);
  b.CreateCondBr(b.CreateICmpSLT(i, f->getArg(2)), work, done);
  b.SetInsertPoint(work);
  llvm::Value* idx = b.CreateSExt(i, b.getInt64Ty());
  llvm::Value* xv = b.CreateLoad(f32, b.CreateInBoundsGEP(f32, f->getArg(0), idx), "x");
  llvm::Value* e = b.CreateCall(exp, {xv});
  llvm::Value* y = b.CreateFMul(e, llvm::ConstantFP::get(f32, scale));
  b.CreateStore(y, b.CreateInBoundsGEP(f32, f->getArg(1), idx));
  b.CreateBr(done);
  b.SetInsertPoint(done);
  b.CreateRetVoid();
  return m;
}

// The host ABI of codegen/kernels/emitter.h: void @entry(ptr args), args = {x, y};
// the whole index space [0, n) runs as a loop, n baked in.
std::unique_ptr<llvm::Module> host_exp_kernel(llvm::LLVMContext& ctx, const std::string& entry,
                                              int64_t n, float scale = 2.0f,
                                              const std::string& math = "expf") {
  auto m = std::make_unique<llvm::Module>(entry, ctx);
  prepare_module(*m, Target::host());
  llvm::IRBuilder<> b(ctx);
  llvm::Type* f32 = b.getFloatTy();
  llvm::Type* i64 = b.getInt64Ty();
  llvm::Type* ptr = b.getPtrTy();
  auto* f = llvm::Function::Create(llvm::FunctionType::get(b.getVoidTy(), {ptr}, false),
                                   llvm::Function::ExternalLinkage, entry, *m);
  llvm::FunctionCallee exp = m->getOrInsertFunction(math, llvm::FunctionType::get(f32, {f32}, false));
  auto* pre = llvm::BasicBlock::Create(ctx, "entry", f);
  auto* loop = llvm::BasicBlock::Create(ctx, "loop", f);
  auto* exit = llvm::BasicBlock::Create(ctx, "exit", f);
  b.SetInsertPoint(pre);
  llvm::Value* args = f->getArg(0);
  llvm::Value* x = b.CreateLoad(ptr, args, "x");
  llvm::Value* y = b.CreateLoad(ptr, b.CreateConstInBoundsGEP1_64(ptr, args, 1), "y");
  b.CreateBr(loop);
  b.SetInsertPoint(loop);
  llvm::PHINode* i = b.CreatePHI(i64, 2, "i");
  i->addIncoming(b.getInt64(0), pre);
  llvm::Value* xv = b.CreateLoad(f32, b.CreateInBoundsGEP(f32, x, i));
  llvm::Value* r = b.CreateFMul(b.CreateCall(exp, {xv}), llvm::ConstantFP::get(f32, scale));
  b.CreateStore(r, b.CreateInBoundsGEP(f32, y, i));
  llvm::Value* next = b.CreateAdd(i, b.getInt64(1), "next", true, true);
  i->addIncoming(next, loop);
  b.CreateCondBr(b.CreateICmpSLT(next, b.getInt64(n)), loop, exit);
  b.SetInsertPoint(exit);
  b.CreateRetVoid();
  return m;
}

// A function whose only block has no terminator.
std::unique_ptr<llvm::Module> broken_module(llvm::LLVMContext& ctx, const Target& t) {
  auto m = std::make_unique<llvm::Module>("broken", ctx);
  prepare_module(*m, t);
  llvm::IRBuilder<> b(ctx);
  auto* f = llvm::Function::Create(llvm::FunctionType::get(b.getVoidTy(), {}, false),
                                   llvm::Function::ExternalLinkage, "broken", *m);
  if (t.kind == Target::Kind::NVPTX) mark_kernel(*f);
  b.SetInsertPoint(llvm::BasicBlock::Create(ctx, "entry", f));
  b.CreateAdd(b.getInt32(1), b.getInt32(2));
  return m;
}

// ---- arch table -----------------------------------------------------------------------

struct ArchRow {
  const char* arch;
  int min_ptx;  // from the PTX ISA release notes
  int ptx;      // what we emit
};

void PrintTo(const ArchRow& r, std::ostream* os) { *os << r.arch; }

class ArchTable : public ::testing::TestWithParam<ArchRow> {};

TEST_P(ArchTable, EmitsTheTabledVersion) {
  const ArchRow& row = GetParam();
  auto info = compat::arch_info(row.arch);
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->min_ptx, row.min_ptx);
  EXPECT_EQ(info->ptx, row.ptx);
  EXPECT_EQ(ptx_isa_version(row.arch), row.ptx);
  EXPECT_GE(info->ptx, info->min_ptx);
  EXPECT_LE(info->ptx, compat::kMaxPtx);
  EXPECT_EQ(compat::ptx_feature(row.ptx), "+ptx" + std::to_string(row.ptx));

  // LLVM takes the arch and feature, and the PTX says so (no libdevice needed).
  llvm::LLVMContext ctx;
  auto m = std::make_unique<llvm::Module>("empty", ctx);
  prepare_module(*m, Target::nvptx(row.arch));
  auto* f = llvm::Function::Create(llvm::FunctionType::get(llvm::Type::getVoidTy(ctx), {}, false),
                                   llvm::Function::ExternalLinkage, "empty_kernel", *m);
  mark_kernel(*f);
  llvm::IRBuilder<> b(llvm::BasicBlock::Create(ctx, "entry", f));
  b.CreateRetVoid();
  auto ptx = compile_to_ptx(*m, row.arch);
  ASSERT_TRUE(ptx.ok()) << ptx.error().str();
  EXPECT_NE(ptx->find(".version " + compat::ptx_version_string(row.ptx) + "\n"), std::string::npos) << *ptx;
  EXPECT_NE(ptx->find(".target " + std::string(row.arch) + "\n"), std::string::npos) << *ptx;
  EXPECT_NE(ptx->find(".entry empty_kernel"), std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(Llvm19, ArchTable,
                         ::testing::Values(ArchRow{"sm_60", 50, 80}, ArchRow{"sm_61", 50, 80},
                                           ArchRow{"sm_62", 50, 80}, ArchRow{"sm_70", 60, 80},
                                           ArchRow{"sm_72", 61, 80}, ArchRow{"sm_75", 63, 80},
                                           ArchRow{"sm_80", 70, 80}, ArchRow{"sm_86", 71, 80},
                                           ArchRow{"sm_87", 74, 80}, ArchRow{"sm_89", 78, 80},
                                           ArchRow{"sm_90", 78, 80}, ArchRow{"sm_90a", 80, 80}),
                         [](const ::testing::TestParamInfo<ArchRow>& i) { return std::string(i.param.arch); });

TEST(ArchTable, EveryRowIsTested) { EXPECT_EQ(compat::kArchTable.size(), 12u); }

TEST(ArchTable, UnknownArchIsADiag) {
  for (const char* arch : {"sm_100", "sm_100a", "sm_120", "compute_90", "", "sm_90b"}) {
    EXPECT_FALSE(ptx_isa_version(arch).has_value()) << arch;
    auto tm = create_target_machine(Target::nvptx(arch));
    ASSERT_FALSE(tm.ok()) << arch;
    EXPECT_NE(tm.error().message.find("unknown NVPTX arch"), std::string::npos) << tm.error().message;
  }
  llvm::LLVMContext ctx;
  auto m = nvptx_exp_kernel(ctx, "k");
  auto ptx = compile_to_ptx(*m, "sm_100a");
  ASSERT_FALSE(ptx.ok());
  EXPECT_NE(ptx.error().message.find("sm_100a"), std::string::npos);
}

// ---- targets -------------------------------------------------------------------------------

TEST(Targets, TripleLayoutAndName) {
  EXPECT_EQ(triple(Target::nvptx("sm_90a")), "nvptx64-nvidia-cuda");
  EXPECT_EQ(Target::nvptx("sm_90a").str(), "nvptx-sm_90a");
  EXPECT_EQ(data_layout(Target::nvptx("sm_80")), data_layout(Target::nvptx("sm_90a")));
  EXPECT_EQ(data_layout(Target::nvptx("sm_80")).rfind("e-", 0), 0u);  // little endian
  EXPECT_EQ(triple(Target::host()), llvm::sys::getProcessTriple());
  EXPECT_FALSE(data_layout(Target::host()).empty());
  EXPECT_EQ(Target::host().str().rfind("host-", 0), 0u);
  EXPECT_NE(Target::host().str().find(llvm::sys::getHostCPUName().str()), std::string::npos);

  auto tm = create_target_machine(Target::nvptx("sm_90a"));
  ASSERT_TRUE(tm.ok()) << tm.error().str();
  EXPECT_EQ((*tm)->getTargetCPU(), "sm_90a");
  EXPECT_NE((*tm)->getTargetFeatureString().find("+ptx80"), std::string::npos);
  auto host = create_target_machine(Target::host());
  ASSERT_TRUE(host.ok()) << host.error().str();
  EXPECT_EQ((*host)->getTargetCPU(), llvm::sys::getHostCPUName());
}

TEST(Kernels, MarkAndRecognise) {
  llvm::LLVMContext ctx;
  auto m = nvptx_exp_kernel(ctx, "k", 2.0f, "__nv_expf", 256);
  EXPECT_TRUE(is_kernel(*m->getFunction("k")));
  EXPECT_FALSE(is_kernel(*m->getFunction("__nv_expf")));
  std::string ir = print(*m);
  EXPECT_NE(ir.find("!\"kernel\", i32 1}"), std::string::npos) << ir;
  EXPECT_NE(ir.find("!\"maxntidx\", i32 256}"), std::string::npos) << ir;
}

// ---- verification ---------------------------------------------------------------------------

TEST(Verify, WellFormedAndBroken) {
  llvm::LLVMContext ctx;
  EXPECT_FALSE(verify(*nvptx_exp_kernel(ctx, "k")).has_value());
  EXPECT_FALSE(verify(*host_exp_kernel(ctx, "h", 4)).has_value());
  auto report = verify(*broken_module(ctx, Target::nvptx("sm_80")));
  ASSERT_TRUE(report.has_value());
  EXPECT_NE(report->find("terminator"), std::string::npos) << *report;
}

TEST(Verify, BrokenModuleIsADiagNotACrash) {
  llvm::LLVMContext ctx;
  auto m = broken_module(ctx, Target::nvptx("sm_80"));
  auto ptx = compile_to_ptx(*m, "sm_80");
  ASSERT_FALSE(ptx.ok());
  EXPECT_NE(ptx.error().message.find("does not verify"), std::string::npos) << ptx.error().message;
  EXPECT_NE(ptx.error().message.find("terminator"), std::string::npos);
  auto ir = optimized_ir(*m, Target::nvptx("sm_80"));
  EXPECT_FALSE(ir.ok());
  auto host_ir = optimized_ir(*broken_module(ctx, Target::host()), Target::host());
  EXPECT_FALSE(host_ir.ok());

  auto jit = HostJit::create();
  ASSERT_TRUE(jit.ok()) << jit.error().str();
  auto hctx = std::make_unique<llvm::LLVMContext>();
  auto hm = broken_module(*hctx, Target::host());
  auto addr = (*jit)->add(std::move(hm), std::move(hctx), "broken");
  ASSERT_FALSE(addr.ok());
  EXPECT_NE(addr.error().message.find("does not verify"), std::string::npos) << addr.error().message;
}

// ---- PTX ----------------------------------------------------------------------------------

TEST(Ptx, ExpKernelLinksLibdevice) {
  SKIP_WITHOUT_LIBDEVICE();
  llvm::LLVMContext ctx;
  auto m = nvptx_exp_kernel(ctx, "sf_exp2x");
  const std::string before = print(*m);
  for (const char* arch : {"sm_80", "sm_90a"}) {
    SCOPED_TRACE(arch);
    auto t0 = std::chrono::steady_clock::now();
    auto ptx = compile_to_ptx(*m, arch);
    auto ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    ASSERT_TRUE(ptx.ok()) << ptx.error().str();
    std::printf("[ timing ] compile_to_ptx(sf_exp2x, %s): %.1f ms, %zu bytes of PTX\n", arch, ms,
                ptx->size());
    const std::string& s = *ptx;
    EXPECT_NE(s.find(".version 8.0\n"), std::string::npos);
    EXPECT_NE(s.find(std::string(".target ") + arch + "\n"), std::string::npos);
    EXPECT_NE(s.find(".address_size 64"), std::string::npos);
    EXPECT_EQ(count(s, ".entry "), 1u) << s;
    EXPECT_NE(s.find(".visible .entry sf_exp2x("), std::string::npos) << s;
    // libdevice's expf was linked and inlined: no call, no extern declaration, and
    // its ex2.approx core is there.
    EXPECT_EQ(s.find("__nv_expf"), std::string::npos) << s;
    EXPECT_EQ(s.find(".extern"), std::string::npos) << s;
    EXPECT_EQ(s.find("call"), std::string::npos) << s;
    EXPECT_EQ(s.find("__nvvm_reflect"), std::string::npos) << s;
    EXPECT_NE(s.find("ex2.approx"), std::string::npos) << s;
    // The special registers became PTX's.
    EXPECT_NE(s.find("%tid.x"), std::string::npos);
    EXPECT_NE(s.find("%ctaid.x"), std::string::npos);
    EXPECT_NE(s.find("%ntid.x"), std::string::npos);
  }
  // The caller's module is untouched, so one module compiles for several archs.
  EXPECT_EQ(print(*m), before);
}

TEST(Ptx, PassesPtxas) {
  SKIP_WITHOUT_LIBDEVICE();
  auto ptxas = find_ptxas();
  if (!ptxas) GTEST_SKIP() << ptxas.error().message;
  llvm::LLVMContext ctx;
  auto m = nvptx_exp_kernel(ctx, "sf_exp2x");
  for (const char* arch : {"sm_80", "sm_90a"}) {
    SCOPED_TRACE(arch);
    auto ptx = compile_to_ptx(*m, arch);
    ASSERT_TRUE(ptx.ok()) << ptx.error().str();
    auto res = run_ptxas(*ptx, arch);
    ASSERT_TRUE(res.ok()) << res.error().str() << "\n" << *ptx;
    ASSERT_EQ(res->size(), 1u);
    EXPECT_EQ((*res)[0].name, "sf_exp2x");
    EXPECT_EQ((*res)[0].arch, arch);
    EXPECT_GT((*res)[0].registers, 0);
    EXPECT_FALSE((*res)[0].spills());
    EXPECT_EQ((*res)[0].shared_bytes, 0);
  }
}

TEST(Ptx, MaxThreadsBecomesMaxntid) {
  SKIP_WITHOUT_LIBDEVICE();
  llvm::LLVMContext ctx;
  auto m = nvptx_exp_kernel(ctx, "k256", 2.0f, "__nv_expf", 256);
  auto ptx = compile_to_ptx(*m, "sm_90a");
  ASSERT_TRUE(ptx.ok()) << ptx.error().str();
  EXPECT_NE(ptx->find(".maxntid 256, 1, 1"), std::string::npos) << *ptx;
}

TEST(Ptx, OptimizedIrIsLinkedAndReflected) {
  SKIP_WITHOUT_LIBDEVICE();
  llvm::LLVMContext ctx;
  auto m = nvptx_exp_kernel(ctx, "sf_exp2x");
  auto ir = optimized_ir(*m, Target::nvptx("sm_90a"));
  ASSERT_TRUE(ir.ok()) << ir.error().str();
  EXPECT_NE(ir->find("define void @sf_exp2x("), std::string::npos) << *ir;  // still external
  EXPECT_EQ(ir->find("declare float @__nv_expf"), std::string::npos) << *ir;
  EXPECT_EQ(ir->find("@__nvvm_reflect"), std::string::npos) << *ir;
  EXPECT_NE(ir->find("!\"nvvm-reflect-ftz\", i32 0}"), std::string::npos) << *ir;
  // Nothing of libdevice is left but what the kernel inlined.
  EXPECT_EQ(count(*ir, "define "), 1u) << *ir;
}

TEST(Ptx, NonKernelsAreInternalisedAway) {
  SKIP_WITHOUT_LIBDEVICE();
  llvm::LLVMContext ctx;
  auto m = nvptx_exp_kernel(ctx, "k");
  llvm::IRBuilder<> b(ctx);
  auto* helper = llvm::Function::Create(llvm::FunctionType::get(b.getVoidTy(), {}, false),
                                        llvm::Function::ExternalLinkage, "unused_helper", *m);
  b.SetInsertPoint(llvm::BasicBlock::Create(ctx, "entry", helper));
  b.CreateRetVoid();
  auto ptx = compile_to_ptx(*m, "sm_80");
  ASSERT_TRUE(ptx.ok()) << ptx.error().str();
  EXPECT_EQ(ptx->find("unused_helper"), std::string::npos) << *ptx;
}

TEST(Ptx, LibmCallIsADiag) {
  llvm::LLVMContext ctx;
  auto m = nvptx_exp_kernel(ctx, "k", 2.0f, "expf");
  auto ptx = compile_to_ptx(*m, "sm_80");
  ASSERT_FALSE(ptx.ok());
  EXPECT_NE(ptx.error().message.find("undefined function 'expf'"), std::string::npos)
      << ptx.error().message;
  EXPECT_NE(ptx.error().message.find("__nv_"), std::string::npos);
}

TEST(Ptx, UnknownLibdeviceFunctionIsADiag) {
  SKIP_WITHOUT_LIBDEVICE();
  llvm::LLVMContext ctx;
  auto m = nvptx_exp_kernel(ctx, "k", 2.0f, "__nv_no_such_mathf");
  auto ptx = compile_to_ptx(*m, "sm_80");
  ASSERT_FALSE(ptx.ok());
  EXPECT_NE(ptx.error().message.find("has no function '__nv_no_such_mathf'"), std::string::npos)
      << ptx.error().message;
}

TEST(Ptx, WrongTripleOrNoKernelIsADiag) {
  llvm::LLVMContext ctx;
  auto host = host_exp_kernel(ctx, "h", 4);
  auto ptx = compile_to_ptx(*host, "sm_80");
  ASSERT_FALSE(ptx.ok());
  EXPECT_NE(ptx.error().message.find("not nvptx64-nvidia-cuda"), std::string::npos) << ptx.error().message;

  auto m = std::make_unique<llvm::Module>("nokernel", ctx);
  prepare_module(*m, Target::nvptx("sm_80"));
  auto* f = llvm::Function::Create(llvm::FunctionType::get(llvm::Type::getVoidTy(ctx), {}, false),
                                   llvm::Function::ExternalLinkage, "f", *m);
  llvm::IRBuilder<> b(llvm::BasicBlock::Create(ctx, "entry", f));
  b.CreateRetVoid();
  ptx = compile_to_ptx(*m, "sm_80");
  ASSERT_FALSE(ptx.ok());
  EXPECT_NE(ptx.error().message.find("has no kernel"), std::string::npos) << ptx.error().message;
}

// The autotuner compiles configs on several threads, one context each.
TEST(Ptx, ConcurrentCompilesInSeparateContexts) {
  SKIP_WITHOUT_LIBDEVICE();
  constexpr int kThreads = 4;
  std::vector<std::string> results(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&results, t] {
      llvm::LLVMContext ctx;
      auto m = nvptx_exp_kernel(ctx, "k" + std::to_string(t), static_cast<float>(t + 3));
      auto ptx = compile_to_ptx(*m, t % 2 ? "sm_90a" : "sm_80");
      results[static_cast<size_t>(t)] = ptx.ok() ? *ptx : "ERROR " + ptx.error().str();
    });
  }
  for (std::thread& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) {
    const std::string& s = results[static_cast<size_t>(t)];
    EXPECT_NE(s.find(".visible .entry k" + std::to_string(t) + "("), std::string::npos) << s;
    EXPECT_NE(s.find(t % 2 ? ".target sm_90a" : ".target sm_80"), std::string::npos) << s;
  }
}

TEST(Ptx, StageDumps) {
  SKIP_WITHOUT_LIBDEVICE();
  std::string dir = testing::TempDir() + "sf-dump-XXXXXX";
  ASSERT_NE(::mkdtemp(dir.data()), nullptr);
  ::setenv("SHARDFUSE_DUMP_LLVM", dir.c_str(), 1);
  llvm::LLVMContext ctx;
  auto m = nvptx_exp_kernel(ctx, "dumped");
  auto ptx = compile_to_ptx(*m, "sm_90a");
  ::unsetenv("SHARDFUSE_DUMP_LLVM");
  ASSERT_TRUE(ptx.ok()) << ptx.error().str();
  for (const char* stage : {"0-input.ll", "1-linked.ll", "2-opt.ll", "ptx"}) {
    std::string path = dir + "/dumped.sm_90a." + stage;
    EXPECT_TRUE(std::filesystem::exists(path)) << path;
  }
  std::ifstream in(dir + "/dumped.sm_90a.ptx");
  std::string dumped((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(dumped, *ptx);
  std::filesystem::remove_all(dir);
}

// ---- host JIT --------------------------------------------------------------------------

using HostFn = void (*)(void**);

std::vector<float> inputs(int n) {
  std::vector<float> x(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) x[static_cast<size_t>(i)] = -8.0f + 16.0f * static_cast<float>(i) / static_cast<float>(n);
  return x;
}

void check_exp(HostFn fn, int n, float scale) {
  std::vector<float> x = inputs(n), y(static_cast<size_t>(n), -1.0f);
  void* args[] = {x.data(), y.data()};
  fn(args);
  for (size_t i = 0; i < x.size(); ++i) {
    float want = std::exp(x[i]) * scale;
    ASSERT_FLOAT_EQ(y[i], want) << "x=" << x[i];
  }
}

TEST(HostJit, ExpMatchesLibm) {
  auto jit = HostJit::create();
  ASSERT_TRUE(jit.ok()) << jit.error().str();
  auto ctx = std::make_unique<llvm::LLVMContext>();
  const int n = 1000;  // not a multiple of any vector width
  auto m = host_exp_kernel(*ctx, "sf_exp2x_host", n);
  auto t0 = std::chrono::steady_clock::now();
  auto addr = (*jit)->add(std::move(m), std::move(ctx), "sf_exp2x_host");
  auto ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(addr.ok()) << addr.error().str();
  std::printf("[ timing ] HostJit::add(sf_exp2x_host): %.1f ms\n", ms);
  check_exp(reinterpret_cast<HostFn>(*addr), n, 2.0f);
}

TEST(HostJit, SameSymbolInTwoModules) {
  auto jit = HostJit::create();
  ASSERT_TRUE(jit.ok()) << jit.error().str();
  std::vector<void*> fns;
  for (float scale : {2.0f, 3.0f}) {
    auto ctx = std::make_unique<llvm::LLVMContext>();
    auto m = host_exp_kernel(*ctx, "fused_0", 64, scale);
    auto addr = (*jit)->add(std::move(m), std::move(ctx), "fused_0");
    ASSERT_TRUE(addr.ok()) << addr.error().str();
    fns.push_back(*addr);
  }
  ASSERT_NE(fns[0], fns[1]);
  check_exp(reinterpret_cast<HostFn>(fns[0]), 64, 2.0f);
  check_exp(reinterpret_cast<HostFn>(fns[1]), 64, 3.0f);
}

TEST(HostJit, ConcurrentAdds) {
  auto jit = HostJit::create();
  ASSERT_TRUE(jit.ok()) << jit.error().str();
  HostJit& j = **jit;
  constexpr int kThreads = 4, kPerThread = 3;
  std::vector<std::string> errors(kThreads);
  std::vector<std::vector<std::pair<HostFn, float>>> fns(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int k = 0; k < kPerThread; ++k) {
        float scale = static_cast<float>(1 + t * kPerThread + k);
        auto ctx = std::make_unique<llvm::LLVMContext>();
        auto m = host_exp_kernel(*ctx, "kernel", 257, scale);
        auto addr = j.add(std::move(m), std::move(ctx), "kernel");
        if (!addr) {
          errors[static_cast<size_t>(t)] = addr.error().str();
          return;
        }
        fns[static_cast<size_t>(t)].emplace_back(reinterpret_cast<HostFn>(*addr), scale);
      }
    });
  }
  for (std::thread& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) {
    ASSERT_EQ(errors[static_cast<size_t>(t)], "") << "thread " << t;
    ASSERT_EQ(fns[static_cast<size_t>(t)].size(), static_cast<size_t>(kPerThread));
    for (auto [fn, scale] : fns[static_cast<size_t>(t)]) check_exp(fn, 257, scale);
  }
}

TEST(HostJit, UnresolvedSymbolIsADiag) {
  auto jit = HostJit::create();
  ASSERT_TRUE(jit.ok()) << jit.error().str();
  auto ctx = std::make_unique<llvm::LLVMContext>();
  auto m = host_exp_kernel(*ctx, "k", 8, 2.0f, "sf_no_such_function");
  auto addr = (*jit)->add(std::move(m), std::move(ctx), "k");
  ASSERT_FALSE(addr.ok());
  EXPECT_NE(addr.error().message.find("sf_no_such_function"), std::string::npos) << addr.error().message;

  ctx = std::make_unique<llvm::LLVMContext>();
  m = host_exp_kernel(*ctx, "k", 8);
  addr = (*jit)->add(std::move(m), std::move(ctx), "not_there");
  ASSERT_FALSE(addr.ok());
  EXPECT_NE(addr.error().message.find("not_there"), std::string::npos) << addr.error().message;
}

TEST(HostJit, RejectsForeignModules) {
  auto jit = HostJit::create();
  ASSERT_TRUE(jit.ok()) << jit.error().str();
  auto ctx = std::make_unique<llvm::LLVMContext>();
  auto m = nvptx_exp_kernel(*ctx, "k");
  auto addr = (*jit)->add(std::move(m), std::move(ctx), "k");
  ASSERT_FALSE(addr.ok());
  EXPECT_NE(addr.error().message.find("not the host"), std::string::npos) << addr.error().message;

  auto ctx1 = std::make_unique<llvm::LLVMContext>();
  auto ctx2 = std::make_unique<llvm::LLVMContext>();
  auto m1 = host_exp_kernel(*ctx1, "k", 8);
  addr = (*jit)->add(std::move(m1), std::move(ctx2), "k");
  ASSERT_FALSE(addr.ok());
  EXPECT_NE(addr.error().message.find("does not belong"), std::string::npos);
}

TEST(HostJit, OptimizedIrForHost) {
  llvm::LLVMContext ctx;
  auto m = host_exp_kernel(ctx, "h", 1000);
  const std::string before = print(*m);
  auto ir = optimized_ir(*m, Target::host());
  ASSERT_TRUE(ir.ok()) << ir.error().str();
  EXPECT_NE(ir->find("define void @h(ptr"), std::string::npos) << *ir;
  EXPECT_NE(ir->find("expf"), std::string::npos) << *ir;
  EXPECT_EQ(print(*m), before);
}

}  // namespace llvm_backend_test
}  // namespace sf::llvmb
