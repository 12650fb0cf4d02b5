#!/usr/bin/env python3
"""Tests of bench/compare and bench/peers/peers.py (no GPU needed).

Run from anywhere:  python3 tests/bench/compare_test.py
The fixtures in tests/bench/fixtures/ are hand-written Google Benchmark JSON; the
expected ratios below are worked out by hand from the numbers in them.
"""

import importlib.util
import json
import os
import py_compile
import subprocess
import sys
import tempfile
import unittest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COMPARE = os.path.join(REPO, "bench", "compare")
PEERS = os.path.join(REPO, "bench", "peers", "peers.py")
FIXTURES = os.path.join(REPO, "tests", "bench", "fixtures")


def fixture(name):
    return os.path.join(FIXTURES, name)


def run(*args, timeout=60):
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout, cwd=REPO)


class CompareTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        out = os.path.join(cls.tmp.name, "ratios.json")
        cls.proc = run(COMPARE, fixture("kernels-h100.json"), fixture("peers-h100.json"), "--json", out)
        with open(out) as f:
            cls.summary = json.load(f)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def block(self, block, peer):
        rows = [r for r in self.summary["blocks"] if r["block"] == block and r["peer"] == peer]
        self.assertEqual(len(rows), 1, f"{block}/{peer}: {self.summary['blocks']}")
        return rows[0]

    def test_block_ratios_are_peer_time_over_ours(self):
        self.assertEqual(self.proc.returncode, 0, self.proc.stderr)
        # ours: mlp 2 ms, attention 4 ms, transformer_block 10 ms.
        expected = {("mlp", "torch_eager"): 3.0 / 2.0,                  # 1.50
                    ("mlp", "torch_compile"): 2.5 / 2.0,                # 1.25
                    ("attention", "torch_eager"): 10.0 / 4.0,           # 2.50
                    ("attention", "torch_compile"): 3.0 / 4.0,          # 0.75
                    ("transformer_block", "torch_eager"): 15.0 / 10.0,  # 1.50
                    ("transformer_block", "torch_compile"): 8.0 / 10.0}  # 0.80
        for (block, peer), want in expected.items():
            self.assertAlmostEqual(self.block(block, peer)["peer_over_ours"], want, places=9, msg=(block, peer))
        self.assertEqual(len(self.summary["blocks"]), len(expected))
        # The printed table rounds to two places.
        self.assertRegex(self.proc.stdout, r"mlp\s+2\.000\s+torch_eager\s+3\.000\s+1\.50")
        self.assertRegex(self.proc.stdout, r"attention\s+4\.000\s+torch_eager\s+10\.000\s+2\.50")

    def test_time_units_are_converted_to_ms(self):
        self.assertAlmostEqual(self.block("mlp", "torch_eager")["ours_ms"], 2.0)        # 2000 us
        self.assertAlmostEqual(self.block("attention", "torch_eager")["ours_ms"], 4.0)  # 4e6 ns

    def test_median_aggregate_is_preferred(self):
        # mlp has iteration entries of 2.5 and 2.7 ms and a mean of 9 ms: the median (2 ms) wins.
        self.assertAlmostEqual(self.block("mlp", "torch_compile")["ours_ms"], 2.0)
        # transformer_block's median is named the old way (X/real_time_median, no run_name).
        self.assertAlmostEqual(self.block("transformer_block", "torch_eager")["ours_ms"], 10.0)

    def test_repetitions_without_aggregates_take_the_median(self):
        k = {r["name"]: r for r in self.summary["kernels"]}
        red = k["BM_Reduction/sum/1024x4096"]       # entries of 1 and 3 ms, ratio 0.5 and 0.7
        self.assertAlmostEqual(red["time_ms"], 2.0)
        self.assertAlmostEqual(red["ratio"], 0.6)

    def test_kernel_table(self):
        k = {r["name"]: r for r in self.summary["kernels"]}
        self.assertEqual(sorted(k), ["BM_D2DCopy/268435456", "BM_Matmul/f32/4096x4096x4096",
                                     "BM_Pointwise/gelu/16777216", "BM_Reduction/sum/1024x4096"])
        self.assertAlmostEqual(k["BM_D2DCopy/268435456"]["gb_per_s"], 2850.0)  # 2.85e12 B/s
        self.assertAlmostEqual(k["BM_D2DCopy/268435456"]["ratio"], 0.95)
        self.assertAlmostEqual(k["BM_Matmul/f32/4096x4096x4096"]["tflops"], 40.0)
        # The errored benchmark is listed apart, not in the table.
        self.assertNotIn("BM_Reduction/max/1024x4096", k)
        self.assertTrue(any("BM_Reduction/max/1024x4096" in e for e in self.summary["errors"]))

    def test_matmul_ratios(self):
        m = {(r["dtype"], r["shape"]): r for r in self.summary["matmuls"]}
        f32 = m[("f32", "4096x4096x4096")]   # TFLOPs counters: ours 40, cuBLAS 50, cuBLAS + epilogue 32
        self.assertAlmostEqual(f32["ours_over_cublas"], 40.0 / 50.0)            # 0.80
        self.assertAlmostEqual(f32["ours_over_cublas_epilogue"], 40.0 / 32.0)   # 1.25
        bf16 = m[("bf16", "8192x8192x8192")]  # no counters: times 2.0, 1.5 and 3.0 ms
        self.assertAlmostEqual(bf16["ours_tflops"], 2 * 8192 ** 3 / 2.0e-3 / 1e12)
        self.assertAlmostEqual(bf16["ours_over_cublas"], 1.5 / 2.0)             # 0.75
        self.assertAlmostEqual(bf16["ours_over_cublas_epilogue"], 3.0 / 2.0)    # 1.50

    def test_matmul_against_triton(self):
        # peers.py's BM_MatmulPeer/<dtype>/<shape>/triton beside ours: f32 TFLOPs
        # counters 40 (ours) and 45 (Triton); bf16 times 2.0 ms (ours) and 2.5 ms.
        m = {(r["dtype"], r["shape"]): r for r in self.summary["matmuls"]}
        self.assertAlmostEqual(m[("f32", "4096x4096x4096")]["triton_tflops"], 45.0)
        self.assertAlmostEqual(m[("f32", "4096x4096x4096")]["ours_over_triton"], 40.0 / 45.0)
        self.assertAlmostEqual(m[("bf16", "8192x8192x8192")]["ours_over_triton"], 2.5 / 2.0)
        # A shape only Triton ran: its row, without ours.
        alone = m[("bf16", "1024x1024x1024")]
        self.assertIsNone(alone["ours_tflops"])
        self.assertAlmostEqual(alone["triton_tflops"], 2 * 1024 ** 3 / 0.01e-3 / 1e12)
        self.assertIsNone(alone["ours_over_triton"])
        header = [l for l in self.proc.stdout.splitlines() if l.startswith("dtype/MxNxK")]
        self.assertEqual(len(header), 1, self.proc.stdout)
        self.assertIn("ours/triton", header[0])

    def test_headers_and_same_device_spelled_two_ways(self):
        for field in ("device:  cuda:NVIDIA_H100_80GB_HBM3", "driver:  CUDA 13.0, driver 580.159.04",
                      "commit:  abc1234", "command: scripts/bench bench_kernels", "date:    2026-11-21T12:30:00Z"):
            self.assertIn(field, self.proc.stdout)
        # 'cuda:NVIDIA_H100_80GB_HBM3' and 'NVIDIA H100 80GB HBM3' are one device: no warning.
        self.assertNotIn("different devices", self.proc.stderr)
        self.assertEqual(self.summary["warnings"], [])

    def test_mismatched_devices_warn(self):
        p = run(COMPARE, fixture("kernels-h100.json"), fixture("peers-h200.json"))
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("warning: the files come from different devices", p.stderr)
        self.assertIn("NVIDIA H200", p.stderr)
        self.assertRegex(p.stdout, r"mlp\s+2\.000\s+torch_eager\s+1\.000\s+0\.50")  # 1 ms / 2 ms

    def test_malformed_file_is_an_error_naming_it(self):
        for name, what in (("truncated.json", "not valid JSON"),
                           ("not-benchmark.json", "not Google Benchmark JSON"),
                           ("missing.json", "cannot open file")):
            p = run(COMPARE, fixture("peers-h100.json"), fixture(name))
            self.assertEqual(p.returncode, 1, name)
            self.assertIn(f"{fixture(name)}: error: {what}", p.stderr)
            self.assertEqual(p.stdout, "", f"{name}: nothing is printed before the files are read")


class SdpaCompareTest(unittest.TestCase):
    """BM_Block/sdpa: the fused attention Plan (bench/graphs/bf16/sdpa.sf, gpu-pack's
    blocks-bf16/sdpa) from bench_kernels beside peers.py's F.scaled_dot_product_attention."""

    def test_sdpa_row_shows_ours_and_each_peer(self):
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "ratios.json")
            p = run(COMPARE, fixture("kernels-sdpa-h100.json"), fixture("peers-sdpa-h100.json"), "--json", out)
            self.assertEqual(p.returncode, 0, p.stderr)
            with open(out) as f:
                summary = json.load(f)
        rows = {r["peer"]: r for r in summary["blocks"] if r["block"] == "sdpa"}
        self.assertEqual(sorted(rows), ["cuda_graph", "torch_compile", "torch_eager"])
        for r in rows.values():
            self.assertAlmostEqual(r["ours_ms"], 0.8)   # the median aggregate, not the 0.9 mean
        self.assertAlmostEqual(rows["torch_eager"]["peer_ms"], 0.4)
        self.assertAlmostEqual(rows["torch_eager"]["peer_over_ours"], 0.4 / 0.8)    # 0.50
        self.assertAlmostEqual(rows["torch_compile"]["peer_over_ours"], 1.0 / 0.8)  # 1.25
        self.assertAlmostEqual(rows["cuda_graph"]["peer_ms"], 0.79)                 # 790 us
        self.assertRegex(p.stdout, r"sdpa\s+0\.800\s+torch_eager\s+0\.400\s+0\.50")
        self.assertRegex(p.stdout, r"sdpa\s+0\.800\s+torch_compile\s+1\.000\s+1\.25")
        self.assertEqual(summary["warnings"], [])  # one device, spelled alike

    def test_the_shipped_graph_matches_the_peer(self):
        # bench/graphs/bf16/sdpa.sf and peers.py's make_sdpa at FULL: the same shapes
        # and flags (read from the sources, so a change to one side fails here).
        with open(os.path.join(REPO, "bench", "graphs", "bf16", "sdpa.sf")) as f:
            sf = f.read()
        self.assertIn("q: bf16[8, 32, 2048, 128], k: bf16[8, 8, 2048, 128], v: bf16[8, 8, 2048, 128]", sf)
        self.assertIn("scaled_dot_product_attention(q, k, v, is_causal=true, enable_gqa=true)", sf)
        with open(PEERS) as f:
            peers = f.read()
        self.assertIn("FULL = Shapes(batch=8, seq=2048, hidden=4096, heads=32, head_dim=128, ffn=16384)", peers)
        self.assertIn("GQA_GROUP = 4", peers)
        self.assertIn("F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)", peers)


class LlamaBlockPeerTest(unittest.TestCase):
    """BM_Block/llama_block: bench/graphs/bf16/llama_block.sf (gpu-pack's
    blocks-bf16/llama_block) beside peers.py's make_llama_block: the same shapes and
    constants, read from the sources, so a change to one side fails here."""

    def test_the_shipped_graph_matches_the_peer(self):
        with open(os.path.join(REPO, "bench", "graphs", "bf16", "llama_block.sf")) as f:
            sf = f.read()
        code = "\n".join(l for l in sf.splitlines() if not l.lstrip().startswith("#"))
        for text in ("x: bf16[8, 2048, 4096]", "wq: bf16[4096, 4096], wk: bf16[1024, 4096]", "wv: bf16[1024, 4096]",
                     "w1: bf16[14336, 4096], w3: bf16[14336, 4096]", "w2: bf16[4096, 14336]", "eps=1e-5",
                     "pow(10000.0, div(arange(128, step=2, dtype=f32), -128.0))",
                     "scaled_dot_product_attention(q_rot, k_rot, v, is_causal=true, enable_gqa=true)",
                     "silu(matmul(n2, transpose(w1, 0, 1)))"):
            self.assertIn(text, code)
        # One rank: no mesh, no placements, no redistributes.
        for text in ("mesh ", "{tp:", "redistribute"):
            self.assertNotIn(text, code)
        with open(PEERS) as f:
            peers = f.read()
        self.assertIn("FULL = Shapes(batch=8, seq=2048, hidden=4096, heads=32, head_dim=128, ffn=16384)", peers)
        self.assertIn("return s.hidden * 7 // 2", peers)
        self.assertEqual(4096 * 7 // 2, 14336)
        for text in ("F.rms_norm(x, (H,), attn_norm_w, eps=1e-5)", "torch.pow(10000.0,",
                     "F.scaled_dot_product_attention(rope(q), rope(k), v, is_causal=True, enable_gqa=True)",
                     "F.silu(torch.matmul(n2, w1.transpose(0, 1)))", '"llama_block": make_llama_block'):
            self.assertIn(text, peers)

    def test_the_block_is_a_choice_of_blocks(self):
        # Without PyTorch the script stops at the import, not at an unknown block.
        with tempfile.TemporaryDirectory() as d:
            p = run(PEERS, "--blocks", "llama_block", "--out", os.path.join(d, "x.json"))
        self.assertNotIn("unknown block", p.stderr)


class PeersScriptTest(unittest.TestCase):
    def test_compiles(self):
        with tempfile.TemporaryDirectory() as d:
            for path in (PEERS, COMPARE):
                py_compile.compile(path, cfile=os.path.join(d, os.path.basename(path) + ".pyc"), doraise=True)

    def test_help_runs_without_torch(self):
        p = run(PEERS, "--help")
        self.assertEqual(p.returncode, 0, p.stderr)
        for opt in ("--out", "--blocks", "--scale", "--dtype", "--mode", "--cpu-smoke"):
            self.assertIn(opt, p.stdout)

    def test_unknown_block_is_rejected(self):
        p = run(PEERS, "--blocks", "mlp,conv")
        self.assertEqual(p.returncode, 2)
        self.assertIn("unknown block(s) conv", p.stderr)

    def test_unknown_kernel_and_nothing_to_run_are_rejected(self):
        p = run(PEERS, "--kernels", "bias_gelu,conv")
        self.assertEqual(p.returncode, 2)
        self.assertIn("unknown kernel(s) conv", p.stderr)
        self.assertIn("matmul_bias_gelu", p.stderr, "the list of kernels names the matmul peer")
        p = run(PEERS, "--blocks", "")
        self.assertEqual(p.returncode, 2)
        self.assertIn("nothing to run", p.stderr)

    def test_compare_lists_a_kernel_peer_with_its_ratio(self):
        # A file peers.py --kernels wrote on an H200: the compiled kernel's ratio to
        # its same-run copy, in compare's kernel table beside ours.
        res = os.path.join(REPO, "bench", "results", "peers-kernels-h200-bf16-run6.json")
        c = run(COMPARE, res)
        self.assertEqual(c.returncode, 0, c.stderr)
        line = [l for l in c.stdout.splitlines() if l.startswith("BM_Pointwise/bias_gelu_bf16_16384x4096/torch_compile")]
        self.assertEqual(len(line), 1, c.stdout)
        self.assertEqual(line[0].split()[-1], "0.631")

    @unittest.skipIf(importlib.util.find_spec("torch") is None,
                     "torch is not installed for this python3 (it is on the GPU machine)")
    def test_cpu_smoke_writes_benchmark_json(self):
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "peers.json")
            p = run(PEERS, "--cpu-smoke", "--out", out, timeout=120)
            self.assertEqual(p.returncode, 0, p.stderr)
            with open(out) as f:
                doc = json.load(f)
            ctx = doc["context"]
            self.assertEqual(ctx["device"], "cpu-smoke")
            for key in ("driver", "date", "commit", "command", "torch", "triton"):
                self.assertIsInstance(ctx[key], str, key)
            names = [b["name"] for b in doc["benchmarks"]]
            self.assertEqual(names, [f"BM_Block/{b}/torch_eager" for b in ("mlp", "attention", "transformer_block", "sdpa")])
            for b in doc["benchmarks"]:
                self.assertEqual(b["run_type"], "iteration")
                self.assertEqual(b["time_unit"], "ms")
                self.assertGreater(b["real_time"], 0)
                self.assertLessEqual(b["p20_ms"], b["real_time"])
                self.assertLessEqual(b["real_time"], b["p80_ms"])
                self.assertGreaterEqual(b["reps"], 1)
                self.assertGreater(b["flops"], 0)
                self.assertGreater(b["TFLOPs"], 0)
            # bench/compare reads it (a peer file alone: blocks without ours).
            c = run(COMPARE, out)
            self.assertEqual(c.returncode, 0, c.stderr)
            self.assertIn("torch_eager", c.stdout)


if __name__ == "__main__":
    unittest.main()
