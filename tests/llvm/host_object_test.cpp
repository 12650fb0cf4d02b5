// Host kernels as a shared object: an IRBuilder-made kernel through
// compile_to_host_object, linked by the system C compiler driver, dlopen()ed and
// called; and the Diags for a broken module, a foreign module, a file that is not
// an object and a missing driver. Expected numbers come from the C library.
#include <dlfcn.h>
#include <elf.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>
#include <llvm/Support/raw_ostream.h>

#include "codegen/llvm/backend.h"
#include "codegen/llvm/llvm_compat.h"

namespace sf::llvmb {
namespace llvm_host_object_test {

namespace fs = std::filesystem;

constexpr int64_t kN = 1000;

std::string print(const llvm::Module& m) {
  std::string s;
  llvm::raw_string_ostream os(s);
  m.print(os, nullptr);
  return s;
}

// A private temporary directory, removed with its contents at the end of the test.
class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base && *base ? base : "/tmp") + "/sf-host-object-XXXXXX";
    if (::mkdtemp(tmpl.data())) path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) fs::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string file(const std::string& name) const { return path_ + "/" + name; }
  bool ok() const { return !path_.empty(); }

 private:
  std::string path_;
};

// Sets (or, with nullopt, unsets) an environment variable until the end of scope.
class EnvVar {
 public:
  EnvVar(const char* name, std::optional<std::string> value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value) ::setenv(name, value->c_str(), 1);
    else ::unsetenv(name);
  }
  ~EnvVar() {
    if (old_) ::setenv(name_, old_->c_str(), 1);
    else ::unsetenv(name_);
  }
  EnvVar(const EnvVar&) = delete;
  EnvVar& operator=(const EnvVar&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

bool write_file(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return static_cast<bool>(f);
}

// void sf_add(void** args): c[i] = sf_private_add(a[i], expf(b[i])) for i < kN with
// args = {a, b, c}. sf_private_add is internal and noinline, so it survives O3 as a
// local symbol that dlsym must not find. No triple or data layout: the clone gets
// the host's.
std::unique_ptr<llvm::Module> add_module(llvm::LLVMContext& ctx) {
  auto m = std::make_unique<llvm::Module>("sf_add", ctx);
  llvm::IRBuilder<> b(ctx);
  llvm::Type* f32 = b.getFloatTy();
  llvm::Type* i64 = b.getInt64Ty();
  llvm::Type* ptr = b.getPtrTy();

  auto* helper = llvm::Function::Create(llvm::FunctionType::get(f32, {f32, f32}, false),
                                        llvm::Function::InternalLinkage, "sf_private_add", *m);
  helper->addFnAttr(llvm::Attribute::NoInline);
  b.SetInsertPoint(llvm::BasicBlock::Create(ctx, "entry", helper));
  b.CreateRet(b.CreateFAdd(helper->getArg(0), helper->getArg(1)));

  auto* f = llvm::Function::Create(llvm::FunctionType::get(b.getVoidTy(), {ptr}, false),
                                   llvm::Function::ExternalLinkage, "sf_add", *m);
  llvm::FunctionCallee exp = m->getOrInsertFunction("expf", llvm::FunctionType::get(f32, {f32}, false));
  auto* pre = llvm::BasicBlock::Create(ctx, "entry", f);
  auto* loop = llvm::BasicBlock::Create(ctx, "loop", f);
  auto* exit = llvm::BasicBlock::Create(ctx, "exit", f);
  b.SetInsertPoint(pre);
  llvm::Value* args = f->getArg(0);
  llvm::Value* a = b.CreateLoad(ptr, args, "a");
  llvm::Value* bp = b.CreateLoad(ptr, b.CreateConstInBoundsGEP1_64(ptr, args, 1), "b");
  llvm::Value* c = b.CreateLoad(ptr, b.CreateConstInBoundsGEP1_64(ptr, args, 2), "c");
  b.CreateBr(loop);
  b.SetInsertPoint(loop);
  llvm::PHINode* i = b.CreatePHI(i64, 2, "i");
  i->addIncoming(b.getInt64(0), pre);
  llvm::Value* av = b.CreateLoad(f32, b.CreateInBoundsGEP(f32, a, i));
  llvm::Value* bv = b.CreateLoad(f32, b.CreateInBoundsGEP(f32, bp, i));
  llvm::Value* sum = b.CreateCall(helper, {av, b.CreateCall(exp, {bv})});
  b.CreateStore(sum, b.CreateInBoundsGEP(f32, c, i));
  llvm::Value* next = b.CreateAdd(i, b.getInt64(1), "next", true, true);
  i->addIncoming(next, loop);
  b.CreateCondBr(b.CreateICmpSLT(next, b.getInt64(kN)), loop, exit);
  b.SetInsertPoint(exit);
  b.CreateRetVoid();
  return m;
}

// The Diag says that no driver was found: the test cannot link here.
bool no_driver(const Diag& d) { return d.message.find("no C compiler driver") != std::string::npos; }

TEST(HostObject, CompilesLinksAndRuns) {
  llvm::LLVMContext ctx;
  auto m = add_module(ctx);
  ASSERT_FALSE(verify(*m).has_value());
  const std::string before = print(*m);

  auto object = compile_to_host_object(*m);
  ASSERT_TRUE(object.ok()) << object.error().str();
  // The module is the caller's, untouched: no triple or layout was set on it either.
  EXPECT_EQ(print(*m), before);
  EXPECT_TRUE(compat::get_triple(*m).empty());
  EXPECT_TRUE(m->getDataLayout().isDefault());

  // A relocatable ELF object for this machine's architecture.
  ASSERT_GE(object->size(), sizeof(Elf64_Ehdr));
  ASSERT_EQ(object->compare(0, 4, "\x7f" "ELF"), 0);
  Elf64_Ehdr header;
  std::memcpy(&header, object->data(), sizeof header);
  EXPECT_EQ(header.e_type, ET_REL);
#if defined(__x86_64__)
  EXPECT_EQ(header.e_machine, EM_X86_64);
#elif defined(__aarch64__)
  EXPECT_EQ(header.e_machine, EM_AARCH64);
#endif

  TempDir dir;
  ASSERT_TRUE(dir.ok());
  const std::string obj_path = dir.file("sf_add.o");
  const std::string so_path = dir.file("kernels.so");
  ASSERT_TRUE(write_file(obj_path, *object));
  if (Result<void> d = link_host_shared_object({obj_path}, so_path); !d.ok()) {
    if (no_driver(d.error())) GTEST_SKIP() << d.error().str();
    FAIL() << d.error().str();
  }

  void* so = ::dlopen(so_path.c_str(), RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(so, nullptr) << ::dlerror();
  auto* fn = reinterpret_cast<void (*)(void**)>(::dlsym(so, "sf_add"));
  EXPECT_NE(fn, nullptr) << ::dlerror();
  // Internal functions are not exported.
  EXPECT_EQ(::dlsym(so, "sf_private_add"), nullptr);
  if (fn) {
    std::vector<float> a(kN), b(kN), c(kN, -1.0f);
    for (int64_t i = 0; i < kN; ++i) {
      a[static_cast<size_t>(i)] = 0.5f * static_cast<float>(i) - 100.0f;
      b[static_cast<size_t>(i)] = static_cast<float>(i % 41) * 0.25f - 5.0f;
    }
    void* args[] = {a.data(), b.data(), c.data()};
    fn(args);
    for (size_t i = 0; i < c.size(); ++i)
      ASSERT_FLOAT_EQ(c[i], a[i] + std::exp(b[i])) << "i = " << i;
  }
  ::dlclose(so);
}

TEST(HostObject, ModuleThatDoesNotVerifyIsADiag) {
  llvm::LLVMContext ctx;
  auto m = std::make_unique<llvm::Module>("broken", ctx);
  prepare_module(*m, Target::host());
  llvm::IRBuilder<> b(ctx);
  auto* f = llvm::Function::Create(llvm::FunctionType::get(b.getVoidTy(), {}, false),
                                   llvm::Function::ExternalLinkage, "broken", *m);
  b.SetInsertPoint(llvm::BasicBlock::Create(ctx, "entry", f));
  b.CreateAdd(b.getInt32(1), b.getInt32(2));  // no terminator
  const std::string before = print(*m);
  auto object = compile_to_host_object(*m);
  ASSERT_FALSE(object.ok());
  EXPECT_NE(object.error().message.find("does not verify"), std::string::npos) << object.error().message;
  EXPECT_EQ(print(*m), before);
}

TEST(HostObject, ModuleForAnotherTargetIsADiag) {
  llvm::LLVMContext ctx;
  auto m = add_module(ctx);
  prepare_module(*m, Target::nvptx("sm_80"));
  auto object = compile_to_host_object(*m);
  ASSERT_FALSE(object.ok());
  EXPECT_NE(object.error().message.find("nvptx64-nvidia-cuda, not the host"), std::string::npos)
      << object.error().message;
}

TEST(HostObject, LinkingSomethingThatIsNotAnObjectQuotesTheLinker) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  const std::string junk = dir.file("junk.o");
  ASSERT_TRUE(write_file(junk, "this is not an object file\n"));
  auto d = link_host_shared_object({junk}, dir.file("out.so"));
  ASSERT_TRUE(!d.ok());
  if (no_driver(d.error())) GTEST_SKIP() << d.error().str();
  const std::string& msg = d.error().message;
  // The command ...
  EXPECT_NE(msg.find("linking " + dir.file("out.so") + " failed: `"), std::string::npos) << msg;
  EXPECT_NE(msg.find(" -shared -o " + dir.file("out.so") + " " + junk + " -lm -Wl,-z,defs` exited with status "),
            std::string::npos)
      << msg;
  // ... then the linker's own words, indented, which name the file it choked on.
  size_t quote = msg.find(":\n  ");
  ASSERT_NE(quote, std::string::npos) << msg;
  EXPECT_NE(msg.find("junk.o", quote), std::string::npos) << msg;
  EXPECT_FALSE(std::filesystem::exists(dir.file("out.so")));
}

TEST(HostObject, MissingDriverIsAClearDiag) {
  {
    EnvVar cc("SHARDFUSE_HOST_CC", "/nonexistent");
    auto d = link_host_shared_object({"x.o"}, "x.so");
    ASSERT_TRUE(!d.ok());
    EXPECT_NE(d.error().message.find("SHARDFUSE_HOST_CC=/nonexistent is not an executable file"), std::string::npos)
        << d.error().message;
  }
  {
    EnvVar cc("SHARDFUSE_HOST_CC", "no-such-cc-anywhere");
    auto d = link_host_shared_object({"x.o"}, "x.so");
    ASSERT_TRUE(!d.ok());
    EXPECT_NE(d.error().message.find("SHARDFUSE_HOST_CC=no-such-cc-anywhere is not on PATH"), std::string::npos)
        << d.error().message;
  }
  {
    // Nothing on PATH and no SHARDFUSE_HOST_CC: the Diag says what to set.
    TempDir empty;
    ASSERT_TRUE(empty.ok());
    EnvVar cc("SHARDFUSE_HOST_CC", std::nullopt);
    EnvVar path("PATH", empty.file("bin"));
    auto d = link_host_shared_object({"x.o"}, "x.so");
    ASSERT_TRUE(!d.ok());
    EXPECT_TRUE(no_driver(d.error())) << d.error().message;
    EXPECT_NE(d.error().message.find("SHARDFUSE_HOST_CC"), std::string::npos) << d.error().message;
  }
}

}  // namespace llvm_host_object_test
}  // namespace sf::llvmb
