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
        p = run(os.path.join(FIXTURES, "kernels-h100.json"), "--system", SYSTEM)
        self.assertEqual(p.returncode, 1)
        self.assertIn("no BM_OverlapGpu", p.stderr)


if __name__ == "__main__":
    unittest.main()
