// cross_entropy on generated kernels: the vocabulary-parallel programs (logits sharded
// on the class dim, each rank's masked gather of the target logit at its offset) run on
// generated host kernels against the reference, and every kernel of a rank's program
// emitted for NVPTX and assembled by ptxas.
#include <gtest/gtest.h>

#include "tests/kernels/kernel_test_util.h"

#include <string>

#include "codegen/ir/parser.h"
#include "tests/kernels/host_program_check.h"

namespace sf {
namespace kernels_cross_entropy_test {

Graph parsed(const std::string& text) {
  Result<Graph> g = parse_graph(text, "ce.sf");
  EXPECT_TRUE(g.ok()) << g.error().str();
  return std::move(g).value();
}

// 10 classes on 3 ranks (4, 4, 2), ignore_index 3 among the random targets in [0, 10);
// [N, C, d] logits in bf16 with 9 classes on 4 ranks (3, 3, 3, 0: the max is then not a
// Partial and the logits are gathered, the fallback); batch-sharded logits.
const char* const kGraphs[] = {
    "mesh tp=3\ngraph g(x: f32[8, 10] {tp: S(1)}, t: i64[8]) {\n"
    "  l = cross_entropy(x, t, ignore_index=3)\n  s = cross_entropy(x, t, reduction=sum)\n"
    "  return l {tp: R}, s {tp: R}\n}\n",
    "mesh tp=4\ngraph g(x: bf16[2, 9, 3] {tp: S(1)}, t: i32[2, 3]) {\n"
    "  l = cross_entropy(x, t, reduction=none, ignore_index=0)\n  return l\n}\n",
    "mesh tp=2\ngraph g(x: f32[5, 6] {tp: S(0)}, t: i64[5] {tp: S(0)}) {\n"
    "  l = cross_entropy(x, t)\n  return l {tp: R}\n}\n",
};

TEST(CrossEntropyPrograms, VocabParallelOnGeneratedHostKernels) {
  uint64_t seed = 11;
  for (const char* text : kGraphs) kernel_test::check_on_host_kernels(parsed(text), seed++, text);
}

TEST(CrossEntropyNvptx, EveryKernelOfTheVocabParallelProgramAssembles) {
  std::vector<LocalProgram> ps = kernel_test::check_on_host_kernels(parsed(kGraphs[0]), 3, "nvptx source");
  ASSERT_EQ(ps.size(), 3u);
  const LocalProgram& p = ps[1];  // classes [4, 8): the gather's offset is 4
  ASSERT_FALSE(p.kernels.empty());
  for (const char* arch : {"sm_80", "sm_90a"})
    for (const LocalKernel& k : p.kernels) {
      SCOPED_TRACE(std::string(arch) + " " + k.name);
      Result<EmittedKernel> e = emitter_for(k.kind).emit(KernelSpec{k.name, k.kind, k.group}, {}, llvmb::Target::nvptx(arch));
      ASSERT_TRUE(e.ok()) << e.error().str();
      Result<std::string> ptx = llvmb::compile_to_ptx(*e->module, arch);
      ASSERT_TRUE(ptx.ok()) << ptx.error().str();
      if (kernel_test::have_ptxas()) {
        EXPECT_EQ(kernel_test::ptxas_failure(*ptx, arch), "");
      }
    }
}

}  // namespace kernels_cross_entropy_test
}  // namespace sf
