// Helpers of the library GEMM tests (extern_gemm_test.cpp: the whole group in one
// call; extern_epilogue_test.cpp: a library GEMM then a generated epilogue kernel):
// the matmul kernel of a small graph, a tuning cache with hand-made entries, and the
// environment that puts `shardfuse` on the fake driver and the fake cuBLAS.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "codegen/dist/propagate.h"
#include "codegen/fusion/pipeline.h"
#include "codegen/ir/parser.h"
#include "codegen/kernels/compile_plan.h"
#include "codegen/kernels/host_runner.h"
#include "tests/tools/cli_util.h"
#include "tests/result_util.h"

namespace sf {
namespace kernels_extern_test_util {

// The graph's one matmul kernel, and the names of the rank's values it reads (its
// group's params are in0, in1, ...: the kernel step's `in` says which value each is).
struct Matmul {
  LocalKernel k;
  std::vector<std::string> reads;
};
inline Matmul matmul_of(const std::string& text) {
  Result<Graph> g = parse_graph(text);
  if (!g) throw std::runtime_error(g.error().str());
  DeviceMesh mesh(g->mesh());
  const LocalProgram p = ok_value(rank_programs(*g, propagate(*g, mesh), mesh))[0];
  for (const LocalStep& s : p.steps) {
    if (s.kind != LocalStep::Kind::Kernel) continue;
    const LocalKernel& k = p.kernels[static_cast<size_t>(s.kernel)];
    if (k.kind != KernelKind::Matmul) continue;
    Matmul m{k, {}};
    for (int v : s.in) m.reads.push_back(p.names[static_cast<size_t>(v)]);
    return m;
  }
  throw std::runtime_error("no matmul kernel in\n" + text);
}
inline LocalKernel matmul_kernel(const std::string& text) { return matmul_of(text).k; }

inline std::string graph(const std::string& params, const std::string& body) {
  return "graph g(" + params + ") {\n  y = " + body + "\n  return y\n}\n";
}

class TempCache {
 public:
  TempCache() {
    std::string t = (fs::temp_directory_path() / "sf-extern-XXXXXX").string();
    dir_ = mkdtemp(t.data());
    cache_ = std::move(TuneCache::open(dir_ + "/cache")).value();
  }
  ~TempCache() { fs::remove_all(dir_); }
  TuneCache& cache() { return *cache_; }
  const std::string& dir() const { return dir_; }

  // Measured entries under the key `compile` looks `text`'s matmul kernel up with:
  // a generated config at `config_us`, and library `lib` at `lib_us`.
  void store(const std::string& text, double config_us, const std::string& lib, double lib_us) {
    ConfigChooser chooser(TuneSetup{"cuda", "sm_90a", ShapeBuckets::Exact}, cache_.get());
    std::optional<TuneKey> key = chooser.key_of(matmul_kernel(text));
    ASSERT_TRUE(key);
    CacheEntry gen;
    gen.cfg.block_m = 32;
    gen.config = config_str(KernelKind::Matmul, ConfigTarget::Gpu, gen.cfg);
    gen.status = CacheEntry::Status::Measured;
    gen.measurement.median_us = config_us;
    ASSERT_TRUE(cache_->store(*key, gen).ok());
    CacheEntry x;
    x.config = extern_config_str(lib);
    x.extern_library = lib;
    x.extern_version = "cublasLt 130100 (fake)";
    x.status = CacheEntry::Status::Measured;
    x.measurement.median_us = lib_us;
    ASSERT_TRUE(cache_->store(*key, x).ok());
  }

  // `shardfuse explain FILE --device cuda` against this cache.
  CliResult explain_cuda(const std::string& file) const {
    return shardfuse("explain " + file + " --device cuda --cache " + dir_ + "/cache");
  }

  Result<CompiledPlan> compile(const std::string& text, bool run_ptxas = false) {
    CompileOptions co;
    co.run_ptxas = run_ptxas;
    auto ch = std::make_shared<ConfigChooser>(TuneSetup{"cuda", "sm_90a", ShapeBuckets::Exact}, cache_.get());
    co.choose = [ch](const LocalKernel& k) { return ch->choose(k); };
    return compile_plan(std::move(parse_graph(text)).value(), co);
  }

 private:
  std::string dir_;
  std::unique_ptr<TuneCache> cache_;
};

#if defined(SF_FAKE_CUDA) && defined(SF_FAKE_CUBLAS)
inline std::string fakes(const std::string& log, bool cublas = true) {
  std::string env = std::string("SHARDFUSE_LIBCUDA=") + SF_FAKE_CUDA + " FAKE_CUDA_LOG=" + log;
  if (cublas) env += std::string(" SHARDFUSE_LIBCUBLAS=") + SF_FAKE_CUBLAS + " SHARDFUSE_LIBCUBLASLT=" + SF_FAKE_CUBLAS;
  return env;
}

#endif

}  // namespace kernels_extern_test_util
}  // namespace sf
