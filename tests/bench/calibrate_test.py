#!/usr/bin/env python3
"""Tests of bench/calibrate (no GPU needed).

The measured file (fixtures/overlap-gpu.json) and the stand-in simulator
(fixtures/fake_simulate) are hand-written; the expected errors below are worked
out by hand from their numbers. With $SF_SHARDFUSE set (CTest sets it to the full
build's binary), the real `shardfuse simulate` runs too, so a change to its
summary lines that calibrate reads fails here.
"""

import json
import os
import subprocess
import sys
import tempfile
import unittest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CALIBRATE = os.path.join(REPO, "bench", "calibrate")
FIXTURES = os.path.join(REPO, "tests", "bench", "fixtures")
SYSTEM = os.path.join(REPO, "examples", "systems", "h100x8_nvlink.json")


def run(*args):
    return subprocess.run([sys.executable, CALIBRATE, *args], capture_output=True, text=True, timeout=300, cwd=REPO)


class CalibrateTest(unittest.TestCase):
    def calibrate(self, shardfuse):
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "cal.json")
            p = run(os.path.join(FIXTURES, "overlap-gpu.json"), "--system", SYSTEM, "--shardfuse", shardfuse,
                    "--json", out)
            self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
            with open(out) as f:
                return p, {(r["graph"], r["tp"], r["what"]): r for r in json.load(f)["rows"]}

    def test_errors_against_hand_worked_numbers(self):
        p, rows = self.calibrate(os.path.join(FIXTURES, "fake_simulate"))
        # Only the one complete, error-free overlap entry: tp_attention's failed, the
        # matmul is another benchmark.
        self.assertEqual({(g, n) for g, n, _ in rows}, {("seq_parallel_mlp", 2)})
        r = lambda what: rows[("seq_parallel_mlp", 2, what)]
        # Simulated plain: serial 10 ms, overlapped 9 ms, T_compute 8 ms; ring: 8.5 ms.
        # Measured: serial 12, overlapped 10, decomposed 11, T_compute 8.
        self.assertAlmostEqual(r("serial_ms")["error"], 10 / 12 - 1)
        self.assertAlmostEqual(r("overlapped_ms")["error"], 9 / 10 - 1)
        self.assertAlmostEqual(r("decomposed_ms")["error"], 8.5 / 11 - 1)
        self.assertAlmostEqual(r("t_compute_ms")["error"], 0.0)
        # E_overlap: simulated 1 - (9-8)/(10-8) = 0.5, measured 1 - (10-8)/(12-8) = 0.5;
        # decomposed against the plain serial and T_compute: simulated
        # 1 - (8.5-8)/2 = 0.75, measured 1 - (11-8)/4 = 0.25; errors are differences.
        self.assertAlmostEqual(r("e_overlap_overlapped")["simulated"], 0.5)
        self.assertAlmostEqual(r("e_overlap_overlapped")["error"], 0.0)
        self.assertAlmostEqual(r("e_overlap_decomposed")["simulated"], 0.75)
        self.assertAlmostEqual(r("e_overlap_decomposed")["measured"], 0.25)
        self.assertAlmostEqual(r("e_overlap_decomposed")["error"], 0.5)
        self.assertIn("-16.7%", p.stdout)

    def test_the_real_simulator_is_read(self):
        shardfuse = os.environ.get("SF_SHARDFUSE")
        if not shardfuse:
            self.skipTest("SF_SHARDFUSE is not set (CTest sets it in the full build)")
        _, rows = self.calibrate(shardfuse)
        direct = subprocess.run(
            [shardfuse, "simulate", os.path.join(REPO, "bench/graphs/overlap/full/seq_parallel_mlp.sf"), "--world", "2",
             "--system", SYSTEM, "--no-decompose"], capture_output=True, text=True, timeout=300)
        self.assertEqual(direct.returncode, 0, direct.stderr)
        line = [l for l in direct.stdout.splitlines() if l.startswith("serial time:")][0]
        self.assertAlmostEqual(rows[("seq_parallel_mlp", 2, "serial_ms")]["simulated"],
                               float(line.split()[2]) / 1e3, places=6)

    def test_bad_input_is_a_clear_error(self):
        p = run(os.path.join(FIXTURES, "not-benchmark.json"), "--system", SYSTEM)
        self.assertEqual(p.returncode, 1)
        self.assertIn("not-benchmark.json", p.stderr)
        with tempfile.TemporaryDirectory() as d:
            copies = os.path.join(d, "copies.json")
            with open(copies, "w") as f:
                json.dump({"benchmarks": [{"name": "BM_D2DCopy/1024/manual_time", "real_time": 1.0,
                                           "time_unit": "ms"}]}, f)
            p = run(copies, "--system", SYSTEM)
        self.assertEqual(p.returncode, 1)
        self.assertIn("no BM_OverlapGpu", p.stderr)
        self.assertIn("no BM_Matmul", p.stderr)


class CalibrateKernelsTest(unittest.TestCase):
    """bench_kernels results against the simulator's T_compute of each graph."""

    def calibrate(self, shardfuse, *extra):
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "cal.json")
            p = run(os.path.join(FIXTURES, "kernels-h100.json"), "--system", SYSTEM, "--shardfuse", shardfuse,
                    "--json", out, *extra)
            self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
            with open(out) as f:
                return p, {r["benchmark"]: r for r in json.load(f)["rows"]}

    def test_errors_against_hand_worked_numbers(self):
        p, rows = self.calibrate(os.path.join(FIXTURES, "fake_simulate"))
        # Benchmarks with a graph in bench/graphs only: the blocks, the f32
        # 4096^3 matmul and the bf16 4096^3 product alone (its _gemm graph); the failed
        # max reduction and graphs that do not exist (bf16 8192^3, gelu/16777216,
        # sum/1024x4096) are left out, and named.
        self.assertEqual(set(rows), {"BM_Block/mlp", "BM_Block/attention", "BM_Block/transformer_block",
                                     "BM_Matmul/f32/4096x4096x4096", "BM_MatmulGemm/bf16/4096x4096x4096"})
        self.assertEqual(rows["BM_MatmulGemm/bf16/4096x4096x4096"]["graph"],
                         "bench/graphs/kernels/matmul_bf16_4096x4096x4096_gemm.sf")
        self.assertAlmostEqual(rows["BM_MatmulGemm/bf16/4096x4096x4096"]["error"], 8 / 4.0 - 1)
        self.assertIn("no graph in bench/graphs for: ", p.stdout)
        self.assertIn("BM_Matmul/bf16/8192x8192x8192", p.stdout)
        # The stand-in simulator's T_compute is 8 ms for every graph. Measured: mlp's
        # median 2000 us (not its runs' mean), attention 4e6 ns, transformer_block's
        # median 10 ms, the matmul 3.436 ms.
        self.assertAlmostEqual(rows["BM_Block/mlp"]["measured"], 2.0)
        self.assertAlmostEqual(rows["BM_Block/mlp"]["error"], 8 / 2 - 1)
        self.assertAlmostEqual(rows["BM_Block/attention"]["error"], 8 / 4 - 1)
        self.assertAlmostEqual(rows["BM_Block/transformer_block"]["error"], 8 / 10 - 1)
        self.assertAlmostEqual(rows["BM_Matmul/f32/4096x4096x4096"]["error"], 8 / 3.436 - 1)
        self.assertEqual(rows["BM_Matmul/f32/4096x4096x4096"]["graph"], "bench/graphs/kernels/matmul_f32_4096x4096x4096.sf")
        self.assertIn("+300.0%", p.stdout)

    def test_without_cache_the_roofline_is_asked_for(self):
        # No --cache: an empty cache directory, so no measured time sneaks in.
        _, rows = self.calibrate(os.path.join(FIXTURES, "fake_simulate"))
        cmd = rows["BM_Block/mlp"]["command"]
        self.assertRegex(cmd, r"^simulate \S+/bench/graphs/mlp.sf --world 1 --system \S+ --cache /\S+$")
        self.assertFalse(os.path.exists(cmd.split()[-1]), "the empty cache is a temporary directory")
        _, rows = self.calibrate(os.path.join(FIXTURES, "fake_simulate"), "--cache", "/some/cache")
        self.assertTrue(rows["BM_Block/mlp"]["command"].endswith("--cache /some/cache"))

    def test_the_real_simulator_is_read(self):
        shardfuse = os.environ.get("SF_SHARDFUSE")
        if not shardfuse:
            self.skipTest("SF_SHARDFUSE is not set (CTest sets it in the full build)")
        _, rows = self.calibrate(shardfuse)
        direct = subprocess.run(
            [shardfuse, "simulate", os.path.join(REPO, "bench/graphs/kernels/matmul_f32_4096x4096x4096.sf"), "--world",
             "1", "--system", SYSTEM], capture_output=True, text=True, timeout=300)
        self.assertEqual(direct.returncode, 0, direct.stderr)
        line = [l for l in direct.stdout.splitlines() if l.startswith("T_compute:")][0]
        self.assertAlmostEqual(rows["BM_Matmul/f32/4096x4096x4096"]["simulated"], float(line.split()[1]) / 1e3,
                               places=6)


if __name__ == "__main__":
    unittest.main()
