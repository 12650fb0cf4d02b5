// ptxas -v parsing against output captured from real runs (CUDA 13.0, ptxas
// V13.0.88), and the ptxas runner itself where the toolkit is installed.
#include "autotune/ptxas.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <optional>
#include <string>

namespace sf {
namespace autotune_ptxas_test {

// `ptxas -v -O3 -arch=sm_90a k.ptx` on two LLVM-generated kernels: kern stages 256
// floats through shared memory around a bar.sync, kern2 stores one constant.
constexpr const char* kTwoKernelsSm90a = R"(ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'kern2' for 'sm_90a'
ptxas info    : Function properties for kern2
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 8 registers, used 0 barriers
ptxas info    : Compile time = 16.408 ms
ptxas info    : Compiling entry function 'kern' for 'sm_90a'
ptxas info    : Function properties for kern
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 14 registers, used 1 barriers, 1024 bytes smem
ptxas info    : Compile time = 1.440 ms
)";

// The same PTX for sm_80: ptxas 13 also prints the constant bank there.
constexpr const char* kTwoKernelsSm80 = R"(ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'kern2' for 'sm_80'
ptxas info    : Function properties for kern2
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 8 registers, used 0 barriers, 360 bytes cmem[0]
ptxas info    : Compile time = 9.263 ms
ptxas info    : Compiling entry function 'kern' for 'sm_80'
ptxas info    : Function properties for kern
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 12 registers, used 1 barriers, 1024 bytes smem, 372 bytes cmem[0]
ptxas info    : Compile time = 0.890 ms
)";

// `ptxas -v -O3 -arch=sm_80 --maxrregcount=16`: 64 live floats squeezed into the
// 24-register floor, plus a dynamically indexed local array (the stack frame).
constexpr const char* kSpill = R"(ptxas warning : For profile sm_80 adjusting per thread register count of 16 to lower bound of 24
ptxas info    : Overriding maximum register limit 256 for 'spilly' with  24 of maxrregcount option
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'spilly' for 'sm_80'
ptxas info    : Function properties for spilly
    232 bytes stack frame, 168 bytes spill stores, 168 bytes spill loads
ptxas info    : Used 24 registers, used 0 barriers, 232 bytes cumulative stack size, 372 bytes cmem[0]
ptxas info    : Compile time = 6.896 ms
)";

// A kernel calling a noinline .func: the callee's properties come after the entry's
// and must not overwrite them.
constexpr const char* kWithDeviceFunction = R"(ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'caller' for 'sm_90a'
ptxas info    : Function properties for caller
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 8 registers, used 0 barriers
ptxas info    : Compile time = 4.573 ms
ptxas info    : Function properties for helper
    16 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads
)";

// `ptxas -v -O3 -arch=sm_90a bad.ptx` after `ld.global.f32` was edited into
// `ld.global.xf32` on line 29 (exit status 255).
constexpr const char* kSyntaxError =
    R"(ptxas /tmp/sf-ptxas-Ab12Cd/kernel.ptx, line 29; error   : Unknown modifier '.xf32'
ptxas /tmp/sf-ptxas-Ab12Cd/kernel.ptx, line 29; error   : Unexpected instruction types specified for 'ld'
ptxas fatal   : Ptx assembly aborted due to errors
)";

// 64 KiB of static shared memory on sm_80 (48 KiB max): a resource error, no line.
constexpr const char* kTooMuchShared =
    R"(ptxas error   : Entry function 'kern' uses too much shared data (0x10000 bytes, 0xc000 max)
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'kern2' for 'sm_80'
)";

KernelResources expect(std::string name, std::string arch, int regs, int bars, int64_t smem,
                       int64_t cmem, int64_t stack = 0, int64_t st = 0, int64_t ld = 0,
                       int64_t cumulative = 0) {
  KernelResources k;
  k.name = std::move(name);
  k.arch = std::move(arch);
  k.registers = regs;
  k.barriers = bars;
  k.shared_bytes = smem;
  k.constant_bytes = cmem;
  k.stack_frame_bytes = stack;
  k.spill_store_bytes = st;
  k.spill_load_bytes = ld;
  k.cumulative_stack_bytes = cumulative;
  return k;
}

struct ParseCase {
  const char* label;
  const char* log;
  std::vector<KernelResources> want;
};

void PrintTo(const ParseCase& c, std::ostream* os) { *os << c.label; }

class ParsePtxasInfo : public ::testing::TestWithParam<ParseCase> {};

TEST_P(ParsePtxasInfo, Matches) {
  const ParseCase& c = GetParam();
  std::vector<KernelResources> got = parse_ptxas_info(c.log);
  ASSERT_EQ(got.size(), c.want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    SCOPED_TRACE(c.want[i].name);
    EXPECT_EQ(got[i].name, c.want[i].name);
    EXPECT_EQ(got[i].arch, c.want[i].arch);
    EXPECT_EQ(got[i].registers, c.want[i].registers);
    EXPECT_EQ(got[i].barriers, c.want[i].barriers);
    EXPECT_EQ(got[i].shared_bytes, c.want[i].shared_bytes);
    EXPECT_EQ(got[i].constant_bytes, c.want[i].constant_bytes);
    EXPECT_EQ(got[i].stack_frame_bytes, c.want[i].stack_frame_bytes);
    EXPECT_EQ(got[i].spill_store_bytes, c.want[i].spill_store_bytes);
    EXPECT_EQ(got[i].spill_load_bytes, c.want[i].spill_load_bytes);
    EXPECT_EQ(got[i].cumulative_stack_bytes, c.want[i].cumulative_stack_bytes);
    EXPECT_EQ(got[i], c.want[i]);
  }
}

INSTANTIATE_TEST_SUITE_P(
    CapturedLogs, ParsePtxasInfo,
    ::testing::Values(
        ParseCase{"two_kernels_sm90a", kTwoKernelsSm90a,
                  {expect("kern2", "sm_90a", 8, 0, 0, 0), expect("kern", "sm_90a", 14, 1, 1024, 0)}},
        ParseCase{"two_kernels_sm80", kTwoKernelsSm80,
                  {expect("kern2", "sm_80", 8, 0, 0, 360), expect("kern", "sm_80", 12, 1, 1024, 372)}},
        ParseCase{"spill", kSpill, {expect("spilly", "sm_80", 24, 0, 0, 372, 232, 168, 168, 232)}},
        ParseCase{"device_function", kWithDeviceFunction, {expect("caller", "sm_90a", 8, 0, 0, 0)}},
        ParseCase{"empty", "", {}},
        ParseCase{"garbage", "no ptxas here\n\n:::\nptxas info : Used\n", {}}),
    [](const ::testing::TestParamInfo<ParseCase>& i) { return std::string(i.param.label); });

TEST(ParsePtxasInfo, SpillFlag) {
  std::vector<KernelResources> k = parse_ptxas_info(kSpill);
  ASSERT_EQ(k.size(), 1u);
  EXPECT_TRUE(k[0].spills());
  EXPECT_FALSE(parse_ptxas_info(kTwoKernelsSm90a)[1].spills());
}

// Not captured: the fields of ptxas 11/12's "Used" line in another order, with an
// unknown one, and properties before the entry line, to pin down the tolerance.
TEST(ParsePtxasInfo, ToleratesOrderAndUnknownFields) {
  std::vector<KernelResources> k = parse_ptxas_info(
      "ptxas info    : Function properties for _Z3fooPf\n"
      "    8 bytes stack frame, 0 bytes spill stores, 4 bytes spill loads\n"
      "ptxas info    : Compiling entry function '_Z3fooPf' for 'sm_86'\n"
      "ptxas info    : Used 40 registers, 384 bytes smem, 12 bytes frobs, 380 bytes cmem[0], 8 bytes cmem[2]\n");
  ASSERT_EQ(k.size(), 1u);
  EXPECT_EQ(k[0], expect("_Z3fooPf", "sm_86", 40, 0, 384, 380, 8, 0, 4));
}

// A numbered note before the first entry's line (ptxas 13 prints them there, naming
// no kernel) goes to every entry; one after an entry's line to that entry alone.
TEST(ParsePtxasInfo, NotesGoWithTheirEntry) {
  std::vector<KernelResources> k = parse_ptxas_info(
      "ptxas info    : (C7508) Potential Performance Loss: 'setmaxnreg' ignored; unable to determine register count at "
      "entry.\n"
      "ptxas info    : 0 bytes gmem\n"
      "ptxas info    : Compiling entry function 'a' for 'sm_90a'\n"
      "ptxas info    : Used 8 registers, used 0 barriers\n"
      "ptxas info    : (C9999) another note\n"
      "ptxas info    : Compiling entry function 'b' for 'sm_90a'\n"
      "ptxas info    : Used 9 registers, used 0 barriers\n");
  ASSERT_EQ(k.size(), 2u);
  ASSERT_EQ(k[0].notes.size(), 2u);
  EXPECT_EQ(k[0].notes[0].rfind("(C7508) Potential Performance Loss: 'setmaxnreg' ignored", 0), 0u) << k[0].notes[0];
  EXPECT_EQ(k[0].notes[1], "(C9999) another note");
  ASSERT_EQ(k[1].notes.size(), 1u);
  EXPECT_EQ(k[1].notes[0], k[0].notes[0]);
  EXPECT_EQ(k[1].registers, 9);
}

TEST(PtxasErrorDiag, SyntaxErrorNamesLineAndText) {
  Diag d = ptxas_error_diag(kSyntaxError, "fused_0.ptx");
  EXPECT_EQ(d.file, "fused_0.ptx");
  EXPECT_EQ(d.loc.line, 29);
  EXPECT_NE(d.message.find("Unknown modifier '.xf32'"), std::string::npos) << d.message;
  EXPECT_NE(d.message.find("Unexpected instruction types specified for 'ld'"), std::string::npos);
  EXPECT_NE(d.message.find("aborted due to errors"), std::string::npos);
  EXPECT_EQ(d.str().rfind("fused_0.ptx:29:", 0), 0u) << d.str();
}

TEST(PtxasErrorDiag, ResourceErrorWithoutLine) {
  Diag d = ptxas_error_diag(kTooMuchShared, "kernel.ptx");
  EXPECT_EQ(d.loc.line, 0);
  EXPECT_NE(d.message.find("uses too much shared data (0x10000 bytes, 0xc000 max)"), std::string::npos)
      << d.message;
}

TEST(PtxasErrorDiag, UnknownFormatKeepsTheText) {
  Diag d = ptxas_error_diag("Segmentation fault\n", "kernel.ptx");
  EXPECT_NE(d.message.find("Segmentation fault"), std::string::npos);
}

// ---- running ptxas ------------------------------------------------------------------

// LLVM 19's PTX for the two kernels above (comments dropped).
constexpr const char* kPtx = R"(.version 8.0
.target sm_80
.address_size 64

.visible .entry kern(
	.param .u64 kern_param_0,
	.param .u64 kern_param_1,
	.param .u32 kern_param_2
)
{
	.reg .b32 	%r<3>;
	.reg .f32 	%f<3>;
	.reg .b64 	%rd<10>;
	.shared .align 4 .b8 sm[1024];
	ld.param.u64 	%rd1, [kern_param_0];
	ld.param.u64 	%rd2, [kern_param_1];
	mov.u32 	%r1, %tid.x;
	mul.wide.s32 	%rd3, %r1, 4;
	add.s64 	%rd4, %rd1, %rd3;
	ld.global.f32 	%f1, [%rd4];
	mov.u64 	%rd5, sm;
	add.s64 	%rd6, %rd5, %rd3;
	st.shared.f32 	[%rd6], %f1;
	bar.sync 	0;
	xor.b32  	%r2, %r1, 1;
	mul.wide.s32 	%rd7, %r2, 4;
	add.s64 	%rd8, %rd5, %rd7;
	ld.shared.f32 	%f2, [%rd8];
	add.s64 	%rd9, %rd2, %rd3;
	st.global.f32 	[%rd9], %f2;
	ret;
}
.visible .entry kern2(
	.param .u64 kern2_param_0
)
{
	.reg .b32 	%r<2>;
	.reg .b64 	%rd<2>;
	ld.param.u64 	%rd1, [kern2_param_0];
	mov.b32 	%r1, 1065353216;
	st.global.u32 	[%rd1], %r1;
	ret;
}
)";

#define SKIP_WITHOUT_PTXAS()                                             \
  do {                                                                   \
    auto p = find_ptxas();                                               \
    if (!p) GTEST_SKIP() << p.error().message;                           \
  } while (0)

// Sets an environment variable for one test and restores it.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    if (const char* old = ::getenv(name)) old_ = old;
    ::setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (old_) ::setenv(name_, old_->c_str(), 1);
    else ::unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

TEST(RunPtxas, ReportsEveryEntry) {
  SKIP_WITHOUT_PTXAS();
  auto r = run_ptxas(kPtx, "sm_80");
  ASSERT_TRUE(r.ok()) << r.error().str();
  ASSERT_EQ(r->size(), 2u);
  // ptxas orders entries its own way; find by name.
  for (const KernelResources& k : *r) {
    EXPECT_EQ(k.arch, "sm_80");
    EXPECT_GT(k.registers, 0);
    EXPECT_FALSE(k.spills());
    if (k.name == "kern") {
      EXPECT_EQ(k.shared_bytes, 1024);
      EXPECT_EQ(k.barriers, 1);
    } else {
      EXPECT_EQ(k.name, "kern2");
      EXPECT_EQ(k.shared_bytes, 0);
    }
  }
}

TEST(RunPtxas, NewerArchAssemblesOlderTarget) {
  SKIP_WITHOUT_PTXAS();
  auto r = run_ptxas(kPtx, "sm_90a");
  ASSERT_TRUE(r.ok()) << r.error().str();
  EXPECT_EQ(r->size(), 2u);
}

TEST(RunPtxas, OlderArchThanTargetIsADiag) {
  SKIP_WITHOUT_PTXAS();
  std::string ptx = kPtx;
  ptx.replace(ptx.find(".target sm_80"), 13, ".target sm_90a");
  auto r = run_ptxas(ptx, "sm_80");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("SM version specified by .target is higher"), std::string::npos)
      << r.error().message;
}

TEST(RunPtxas, RejectedPtxGivesErrorLine) {
  SKIP_WITHOUT_PTXAS();
  std::string ptx = kPtx;
  size_t at = ptx.find("ld.global.f32");
  ptx.replace(at, 13, "ld.global.xf32");
  int line = 1 + static_cast<int>(std::count(ptx.begin(), ptx.begin() + static_cast<long>(at), '\n'));
  PtxasOptions o;
  o.arch = "sm_90a";
  o.ptx_name = "fused_3.ptx";
  auto r = run_ptxas(ptx, o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().file, "fused_3.ptx");
  EXPECT_EQ(r.error().loc.line, line);
  EXPECT_NE(r.error().message.find("Unknown modifier '.xf32'"), std::string::npos) << r.error().str();
  EXPECT_EQ(r.error().message.find("/tmp"), std::string::npos) << "temporary path leaked";
}

TEST(RunPtxas, MaxRegistersForcesSpills) {
  SKIP_WITHOUT_PTXAS();
  // 48 volatile loads (ptxas may not reorder them) are all live before the reduction
  // that consumes them in reverse order starts.
  std::string body;
  const int n = 48;
  for (int i = 0; i < n; ++i)
    body += "\tld.volatile.global.f32 %f" + std::to_string(i) + ", [%rd1+" + std::to_string(4 * i) + "];\n";
  for (int i = n - 1; i > 0; --i)
    body += "\tfma.rn.f32 %f" + std::to_string(i - 1) + ", %f" + std::to_string(i - 1) + ", %f" +
            std::to_string(n - 1) + ", %f" + std::to_string(i) + ";\n";
  std::string ptx = ".version 8.0\n.target sm_80\n.address_size 64\n"
                    ".visible .entry many(.param .u64 p)\n{\n\t.reg .f32 %f<" + std::to_string(n) +
                    ">;\n\t.reg .b64 %rd<2>;\n\tld.param.u64 %rd1, [p];\n" + body +
                    "\tst.global.f32 [%rd1], %f0;\n\tret;\n}\n";
  PtxasOptions o;
  o.arch = "sm_80";
  auto free_run = run_ptxas(ptx, o);
  ASSERT_TRUE(free_run.ok()) << free_run.error().str();
  ASSERT_EQ(free_run->size(), 1u);
  o.max_registers = 24;
  auto tight = run_ptxas(ptx, o);
  ASSERT_TRUE(tight.ok()) << tight.error().str();
  ASSERT_EQ(tight->size(), 1u);
  EXPECT_LE((*tight)[0].registers, 24);
  EXPECT_FALSE((*free_run)[0].spills());
  EXPECT_GT((*free_run)[0].registers, 24);  // 55 with ptxas 13.0
  EXPECT_TRUE((*tight)[0].spills());        // 148 bytes each way with ptxas 13.0
  EXPECT_GT((*tight)[0].stack_frame_bytes, 0);
}

// setmaxnreg needs the registers a thread has at entry, which ptxas knows from
// .maxntid with .minnctapersm: without the latter it drops the instructions and says
// so in a numbered note (C7508, ptxas 13.0), which the parser keeps with the entry;
// with both, the kernel gets exactly 65536 / 384 = 168 registers a thread, however
// few its code needs, the pool the warpgroups then share out.
TEST(RunPtxas, NotesSaySetmaxnregWasIgnored) {
  SKIP_WITHOUT_PTXAS();
  auto kernel = [](const char* bounds) {
    return std::string(".version 8.0\n.target sm_90a\n.address_size 64\n.visible .entry k(.param .u64 p)\n") + bounds +
           "{\n\t.reg .b32 %r<2>;\n\t.reg .pred %q;\n\t.reg .b64 %rd<2>;\n\tmov.u32 %r1, %tid.x;\n"
           "\tsetp.gt.u32 %q, %r1, 255;\n\t@%q bra PROD;\n\tsetmaxnreg.inc.sync.aligned.u32 232;\n"
           "\tld.param.u64 %rd1, [p];\n\tst.global.u32 [%rd1], %r1;\n\tret;\nPROD:\n"
           "\tsetmaxnreg.dec.sync.aligned.u32 40;\n\tret;\n}\n";
  };
  auto ignored = run_ptxas(kernel(".maxntid 384, 1, 1\n"), "sm_90a");
  ASSERT_TRUE(ignored.ok()) << ignored.error().str();
  ASSERT_EQ(ignored->size(), 1u);
  ASSERT_EQ((*ignored)[0].notes.size(), 1u);
  EXPECT_NE((*ignored)[0].notes[0].find("'setmaxnreg' ignored"), std::string::npos) << (*ignored)[0].notes[0];
  EXPECT_LT((*ignored)[0].registers, 168);
  auto honoured = run_ptxas(kernel(".maxntid 384, 1, 1\n.minnctapersm 1\n"), "sm_90a");
  ASSERT_TRUE(honoured.ok()) << honoured.error().str();
  ASSERT_EQ(honoured->size(), 1u);
  EXPECT_TRUE((*honoured)[0].notes.empty()) << (*honoured)[0].notes[0];
  EXPECT_EQ((*honoured)[0].registers, 168);
}

TEST(RunPtxas, BadArchIsRejectedBeforeRunning) {
  for (const char* arch : {"sm_90a; rm -rf /", "compute_90", "sm_", "sm_9", "-o/x", ""}) {
    auto r = run_ptxas(kPtx, arch);
    ASSERT_FALSE(r.ok()) << arch;
    EXPECT_NE(r.error().message.find("is not an arch"), std::string::npos) << r.error().message;
  }
}

TEST(RunPtxas, MissingPtxasIsAClearDiag) {
  ScopedEnv env("SHARDFUSE_PTXAS", "/nonexistent/bin/ptxas");
  auto p = find_ptxas();
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.error().message.rfind("ptxas not found", 0), 0u) << p.error().message;
  auto r = run_ptxas(kPtx, "sm_80");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().message.rfind("ptxas not found", 0), 0u) << r.error().message;
}

TEST(RunPtxas, LeavesNothingBehind) {
  SKIP_WITHOUT_PTXAS();
  std::string tmpl = testing::TempDir() + "sf-ptxas-test-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
  {
    ScopedEnv env("TMPDIR", tmpl);
    EXPECT_TRUE(run_ptxas(kPtx, "sm_80").ok());
    std::string bad = kPtx;
    bad.replace(bad.find("ret;"), 4, "retx;");
    EXPECT_FALSE(run_ptxas(bad, "sm_80").ok());
  }
  EXPECT_TRUE(std::filesystem::is_empty(tmpl));
  std::filesystem::remove_all(tmpl);
}

}  // namespace autotune_ptxas_test
}  // namespace sf
