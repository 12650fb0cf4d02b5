// Targets and tuning problems with figures fixed by hand, for the autotune tests
// (space_test.cpp, config_test.cpp), and attention tiles (also for tests/kernels).
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "autotune/config.h"
#include "autotune/problem.h"
#include "autotune/target.h"

namespace sf::autotune_test {

constexpr KernelKind kKinds[] = {KernelKind::Pointwise, KernelKind::Reduction, KernelKind::Matmul,
                                 KernelKind::Gather};

inline TargetInfo gpu(const std::string& arch) {
  Result<TargetInfo> t = gpu_target_info(arch);
  EXPECT_TRUE(t.ok()) << arch << ": " << (t.ok() ? "" : t.error().message);
  return t.ok() ? *t : TargetInfo{};
}

// A fused attention tile: block_m rows x block_n keys on `warps` warps, multiplying by
// wgmma (1, 2 pipelined; sm_90a) or not (0).
inline KernelConfig attention_tile(int bm, int bn, int warps, int wgmma = 0) {
  KernelConfig c;
  c.block_m = bm;
  c.block_n = bn;
  c.warps = warps;
  c.wgmma = wgmma;
  return c;
}

// A host target with fixed figures (host_target_info() depends on the machine).
// A matmul tile config (the rest at KernelConfig's defaults).
inline KernelConfig mm_cfg(int bm, int bn, int bk, int warps, int group_m) {
  KernelConfig c;
  c.block_m = bm;
  c.block_n = bn;
  c.block_k = bk;
  c.warps = warps;
  c.group_m = group_m;
  return c;
}

// A one-shot GPU reduction config (the rest at KernelConfig's defaults).
inline KernelConfig red_cfg(int threads_per_row, int rows_per_block) {
  KernelConfig c;
  c.threads_per_row = threads_per_row;
  c.rows_per_block = rows_per_block;
  c.grid_stride = false;
  return c;
}

inline TargetInfo host(int simd_bytes = 32) {
  TargetInfo t;
  t.name = "host";
  t.model = "test CPU";
  t.kind = ConfigTarget::Host;
  t.sms = 1;
  t.simd_bytes = simd_bytes;
  t.dram_gbps = 10;
  t.fp32_gflops = 2.0 * 2 * (simd_bytes / 4) * 2.5;
  t.launch_us = 0.05;
  return t;
}

inline TuneProblem pointwise(int64_t n, int elem_bytes = 4) {
  TuneProblem p;
  p.kind = KernelKind::Pointwise;
  p.name = "pw";
  p.n = n;
  p.elem_bytes = elem_bytes;
  p.num_inputs = 1;
  p.shapes = {{n}, {n}};
  p.bytes = 2 * n * elem_bytes;
  p.flops = n;
  return p;
}

inline TuneProblem reduction(int64_t rows, int64_t cols) {
  TuneProblem p;
  p.kind = KernelKind::Reduction;
  p.name = "red";
  p.rows = rows;
  p.cols = cols;
  p.num_inputs = 1;
  p.shapes = {{rows, cols}, {rows}};
  p.bytes = rows * cols * 4 + rows * 4;
  p.flops = rows * cols;
  return p;
}

inline TuneProblem matmul(int64_t m, int64_t n, int64_t k) {
  TuneProblem p;
  p.kind = KernelKind::Matmul;
  p.name = "mm";
  p.m = m;
  p.n = n;
  p.k = k;
  p.num_inputs = 2;
  p.shapes = {{m, k}, {k, n}, {m, n}};
  p.bytes = (m * k + k * n + m * n) * 4;
  p.flops = 2 * m * n * k;
  return p;
}

inline TuneProblem gather(int64_t n) {
  TuneProblem p = pointwise(n);
  p.kind = KernelKind::Gather;
  return p;
}

// Attention over `batch` heads: l query rows, s keys, head dim e (q, k and v), f32.
inline TuneProblem attention(int64_t batch, int64_t l, int64_t s, int64_t e) {
  TuneProblem p;
  p.kind = KernelKind::Attention;
  p.name = "attention";
  p.num_inputs = 3;
  p.shapes = {{batch, l, e}, {batch, s, e}, {batch, s, e}, {batch, l, e}};
  p.batch = batch;
  p.m = l;
  p.n = s;
  p.k = e;
  p.cols = e;
  p.bytes = batch * (2 * l * e + 2 * s * e) * 4;
  p.flops = 4 * batch * l * s * e;
  return p;
}

inline TuneProblem problem_of(KernelKind k) {
  switch (k) {
    case KernelKind::Pointwise: return pointwise(1 << 20);
    case KernelKind::Reduction: return reduction(4096, 1024);
    case KernelKind::Matmul: return matmul(1024, 1024, 1024);
    case KernelKind::Gather: return gather(1 << 20);
    case KernelKind::Attention: return attention(32, 1024, 1024, 128);
  }
  return {};
}

}  // namespace sf::autotune_test
