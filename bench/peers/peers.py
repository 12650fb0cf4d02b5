#!/usr/bin/env python3
"""Times PyTorch eager and torch.compile on the blocks of bench/graphs/*.sf.

The three blocks (mlp, attention, transformer_block) are written here with the
same ops, in the same order, on the same shapes and dtype as the .sf files, so
that `bench/compare` can set their times beside shardfuse's BM_Block/<block>
times from bench_kernels. Weights are nn.Linear-shaped [out, in] and used as
x @ w.T, as the graphs' matmul(x, transpose(w, 0, 1)) do.

A fourth block, sdpa, is the attention alone, the peer of shardfuse's fused
attention kernel (KernelKind::Attention): F.scaled_dot_product_attention(q, k, v,
is_causal=True, enable_gqa=True) at bench/graphs/llama_block.sf's attention shape
(batch 8, 32 query heads, 8 kv heads, seq 2048, head_dim 128; bf16 there, so run it
with --dtype bf16 to match), which PyTorch runs as one FlashAttention kernel. Ours
is bench/graphs/bf16/sdpa.sf (BM_Block/sdpa, scripts/gpu-pack's blocks-bf16); keep
the two in step.

Timing follows triton.testing.do_bench, reimplemented with CUDA events so that the
script does not depend on Triton's internals: a first call (which compiles), a
5-call estimate, warm-up calls for --warmup-ms, then --rep-ms worth of timed calls,
each after zeroing a 256 MiB buffer so that no call finds its inputs in L2. The
JSON reports the median and the 20th/80th percentiles of the per-call times.

The output is Google Benchmark JSON ({"context": ..., "benchmarks": [...]}), one
iteration entry per (block, peer) named BM_Block/<block>/<peer>.

--kernels bias_gelu,softmax,layer_norm,column_sum times single kernels too, as
bench_kernels' BM_Pointwise and BM_Reduction do: F.gelu(h + b), a row softmax, a layer
norm and a column sum (x.sum(dim=0)) on [16384, 4096], eager and compiled (Inductor's Triton kernels), each against a
device-to-device copy of the same bytes timed just before it, as
BM_Pointwise/bias_gelu_<dtype>_16384x4096/<peer>, BM_Reduction/softmax/<peer>,
BM_Reduction/layer_norm/<peer> and BM_Reduction/column_sum/<peer> with a `ratio` counter (copy time over the kernel's)
that bench/compare lists beside ours. --kernels matmul_bias_gelu times
F.gelu(x @ w.T + b) at bench_kernels' BM_Matmul shapes (4096^3,
16384x4096x4096 and, 16-bit only, 128x4096x4096) eagerly and as Triton's tuned kernel (torch.compile max-autotune,
Inductor's GEMM backends limited to Triton: one template kernel with the epilogue
fused), as BM_MatmulPeer/<dtype>/<M>x<N>x<K>/<peer>; bench/compare puts Triton's
TFLOP/s beside ours.

Run on the GPU machine (it has PyTorch and Triton); --cpu-smoke runs tiny shapes
eagerly on the CPU so the script can be exercised anywhere torch imports.
"""

import argparse
import datetime
import json
import math
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BLOCKS = ("mlp", "attention", "transformer_block", "sdpa", "llama_block")
# Single kernels, as bench_kernels' BM_Pointwise/<name>: --kernels.
KERNELS = ("bias_gelu", "softmax", "layer_norm", "column_sum", "matmul_bias_gelu")
# --kernels matmul_bias_gelu: the shapes of bench/graphs/kernels/matmul_<dtype>_<M>x<N>x<K>.sf.
MATMUL_SHAPES = ((4096, 4096, 4096), (16384, 4096, 4096))
# bf16 only: a decode step's Linear (matmul_bf16_128x4096x4096.sf, split-K's case).
MATMUL_SHAPES_16BIT = ((128, 4096, 4096),)
MATMUL_SMOKE_SHAPES = ((64, 48, 32),)
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")

# Bound at run time by import_torch(), so that --help and py_compile work without torch.
torch = None
F = None


@dataclass(frozen=True)
class Shapes:
    batch: int
    seq: int
    hidden: int
    heads: int
    head_dim: int
    ffn: int  # feed-forward inner size

    @property
    def tokens(self):
        return self.batch * self.seq


# The sizes of bench/graphs/*.sf: 8 x 2048 tokens, hidden 4096 = 32 heads x 128,
# feed-forward 4096 -> 16384 -> 4096.
FULL = Shapes(batch=8, seq=2048, hidden=4096, heads=32, head_dim=128, ffn=16384)
# --cpu-smoke: small enough that all three blocks run in well under a second.
SMOKE = Shapes(batch=2, seq=16, hidden=64, heads=4, head_dim=16, ffn=256)


def scaled(shapes, factor):
    """Divides the token count by `factor`: whole sequences while at least one
    remains (attention cost depends on the sequence length), then the sequence."""
    tokens = int(round(shapes.tokens / factor))
    if tokens < 1:
        raise ValueError(f"--scale {factor} leaves no tokens (of {shapes.tokens})")
    if tokens % shapes.seq == 0:
        return Shapes(tokens // shapes.seq, shapes.seq, shapes.hidden, shapes.heads,
                      shapes.head_dim, shapes.ffn)
    return Shapes(1, tokens, shapes.hidden, shapes.heads, shapes.head_dim, shapes.ffn)


# --- the blocks ------------------------------------------------------------------
# Each make_* returns (fn, param_shapes, flops). fn takes the parameters in the .sf
# file's order. flops counts the matmuls only (2*M*N*K each), the convention of
# BM_Block and of Triton's and Inductor's benchmarks.

def make_mlp(s):
    # bench/graphs/mlp.sf (examples/tp_mlp.sf): 2-D [tokens, hidden], ReLU.
    def mlp(x, w1, b1, w2, b2):
        h = torch.matmul(x, w1.transpose(0, 1))
        a = torch.relu(h + b1)
        return torch.matmul(a, w2.transpose(0, 1)) + b2

    T, H, Fn = s.tokens, s.hidden, s.ffn
    params = [("x", (T, H), "act"), ("w1", (Fn, H), "w"), ("b1", (Fn,), "b"),
              ("w2", (H, Fn), "w"), ("b2", (H,), "b")]
    return mlp, params, 2 * 2 * T * H * Fn


def _attention_core(s, x, wq, wk, wv):
    """q/k/v projections, heads, scaled softmax(q k^T) v, heads back: [B, S, H]."""
    B, S = s.batch, s.seq
    q = torch.matmul(x, wq.transpose(0, 1)).reshape(B, S, s.heads, s.head_dim).permute(0, 2, 1, 3)
    k = torch.matmul(x, wk.transpose(0, 1)).reshape(B, S, s.heads, s.head_dim).permute(0, 2, 1, 3)
    v = torch.matmul(x, wv.transpose(0, 1)).reshape(B, S, s.heads, s.head_dim).permute(0, 2, 1, 3)
    # The .sf files write the scale as a literal; it is 1/sqrt(head_dim) in both.
    scores = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(s.head_dim))
    p = torch.softmax(scores, dim=-1)
    ctx = torch.matmul(p, v)
    return ctx.permute(0, 2, 1, 3).reshape(B, S, -1)


def _attention_flops(s):
    projections = 4 * 2 * s.tokens * s.hidden * s.hidden
    scores_and_pv = 2 * 2 * s.batch * s.heads * s.seq * s.seq * s.head_dim
    return projections + scores_and_pv


def make_attention(s):
    # bench/graphs/attention.sf (examples/tp_attention.sf without its redistribute).
    def attention(x, wq, wk, wv, wo):
        o = _attention_core(s, x, wq, wk, wv)
        return torch.matmul(o, wo.transpose(0, 1))

    H = s.hidden
    params = [("x", (s.batch, s.seq, H), "act")] + [(n, (H, H), "w") for n in ("wq", "wk", "wv", "wo")]
    return attention, params, _attention_flops(s)


def make_transformer_block(s):
    # bench/graphs/transformer_block.sf (examples/transformer_block.sf): pre-norm,
    # exact GELU (nn.GELU()), layer-norm eps 1e-5.
    def transformer_block(x, ln1_w, ln1_b, wq, wk, wv, wo, ln2_w, ln2_b, ff_w1, ff_b1, ff_w2, ff_b2):
        n1 = F.layer_norm(x, (s.hidden,), ln1_w, ln1_b, eps=1e-5)
        ctx = _attention_core(s, n1, wq, wk, wv)
        h = x + torch.matmul(ctx, wo.transpose(0, 1))
        n2 = F.layer_norm(h, (s.hidden,), ln2_w, ln2_b, eps=1e-5)
        f = F.gelu(torch.matmul(n2, ff_w1.transpose(0, 1)) + ff_b1)
        return h + (torch.matmul(f, ff_w2.transpose(0, 1)) + ff_b2)

    H, Fn = s.hidden, s.ffn
    params = ([("x", (s.batch, s.seq, H), "act"), ("ln1_w", (H,), "ln_w"), ("ln1_b", (H,), "b")]
              + [(n, (H, H), "w") for n in ("wq", "wk", "wv", "wo")]
              + [("ln2_w", (H,), "ln_w"), ("ln2_b", (H,), "b"),
                 ("ff_w1", (Fn, H), "w"), ("ff_b1", (Fn,), "b"),
                 ("ff_w2", (H, Fn), "w"), ("ff_b2", (H,), "b")])
    flops = _attention_flops(s) + 2 * 2 * s.tokens * H * Fn
    return transformer_block, params, flops


# Query heads per kv head in the sdpa block: Llama 3 8B's 32 query heads over 8 kv
# heads (bench/graphs/llama_block.sf's wq [4096, 4096], wk and wv [1024, 4096]).
GQA_GROUP = 4


def sdpa_kv_heads(s):
    return max(1, s.heads // GQA_GROUP)


def make_sdpa(s):
    # The attention of bench/graphs/llama_block.sf alone, unsharded: q [B, 32, S, 128],
    # k and v [B, 8, S, 128] (after RoPE there; plain random tensors here), causal,
    # GQA, the default scale 1/sqrt(head_dim). One fused kernel in PyTorch (eager
    # picks FlashAttention for bf16 on sm_80+; torch.compile keeps the call).
    def sdpa(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    B, S, D, hq, hkv = s.batch, s.seq, s.head_dim, s.heads, sdpa_kv_heads(s)
    params = [("q", (B, hq, S, D), "act"), ("k", (B, hkv, S, D), "act"), ("v", (B, hkv, S, D), "act")]
    # q k^T and p v over the visible half of the scores, FlashAttention's benchmark
    # convention for causal attention (4 B H S^2 D / 2).
    return sdpa, params, 4 * B * hq * S * S * D // 2


def llama_ffn(s):
    # Llama 3 8B's SwiGLU inner size, 14336 = 3.5 x hidden 4096.
    return s.hidden * 7 // 2


def make_llama_block(s):
    # bench/graphs/bf16/llama_block.sf: bench/graphs/llama_block.sf on one rank (Llama
    # 3 8B's layer): rms_norm, q/k/v projections (32 query heads, 8 kv heads of 128),
    # RoPE (base 10000, tables computed in f32 and cast to the activations' dtype,
    # rotate-half), causal GQA attention through SDPA, the output projection and a
    # residual, rms_norm, SwiGLU (silu(x w1^T) * x w3^T) w2^T, a residual.
    def llama_block(x, attn_norm_w, wq, wk, wv, wo, ffn_norm_w, w1, w3, w2):
        B, S, H, D = s.batch, s.seq, s.hidden, s.head_dim
        hq, hkv = s.heads, sdpa_kv_heads(s)
        n1 = F.rms_norm(x, (H,), attn_norm_w, eps=1e-5)
        q = torch.matmul(n1, wq.transpose(0, 1)).reshape(B, S, hq, D).permute(0, 2, 1, 3)
        k = torch.matmul(n1, wk.transpose(0, 1)).reshape(B, S, hkv, D).permute(0, 2, 1, 3)
        v = torch.matmul(n1, wv.transpose(0, 1)).reshape(B, S, hkv, D).permute(0, 2, 1, 3)
        pos = torch.arange(S, dtype=torch.float32, device=x.device).reshape(S, 1)
        inv_freq = torch.pow(10000.0, torch.arange(0, D, 2, dtype=torch.float32, device=x.device) / -D)
        emb = torch.cat((pos * inv_freq, pos * inv_freq), dim=-1)
        cos_t, sin_t = torch.cos(emb).to(x.dtype), torch.sin(emb).to(x.dtype)

        def rope(t):
            return t * cos_t + torch.cat((-t[..., D // 2:], t[..., :D // 2]), dim=-1) * sin_t

        attn = F.scaled_dot_product_attention(rope(q), rope(k), v, is_causal=True, enable_gqa=True)
        h = x + torch.matmul(attn.permute(0, 2, 1, 3).reshape(B, S, H), wo.transpose(0, 1))
        n2 = F.rms_norm(h, (H,), ffn_norm_w, eps=1e-5)
        gate = F.silu(torch.matmul(n2, w1.transpose(0, 1)))
        up = torch.matmul(n2, w3.transpose(0, 1))
        return h + torch.matmul(gate * up, w2.transpose(0, 1))

    H, Fn, kv = s.hidden, llama_ffn(s), sdpa_kv_heads(s) * s.head_dim
    params = [("x", (s.batch, s.seq, H), "act"), ("attn_norm_w", (H,), "ln_w"), ("wq", (H, H), "w"),
              ("wk", (kv, H), "w"), ("wv", (kv, H), "w"), ("wo", (H, H), "w"), ("ffn_norm_w", (H,), "ln_w"),
              ("w1", (Fn, H), "w"), ("w3", (Fn, H), "w"), ("w2", (H, Fn), "w")]
    T = s.tokens
    # The projections, the attention over the visible (causal) half of the scores
    # (FlashAttention's convention, as the sdpa block), the SwiGLU MLP.
    flops = (2 * T * H * (2 * H + 2 * kv) + 4 * s.batch * s.heads * s.seq * s.seq * s.head_dim // 2
             + 3 * 2 * T * H * Fn)
    return llama_block, params, flops


MAKERS = {"mlp": make_mlp, "attention": make_attention, "transformer_block": make_transformer_block,
          "sdpa": make_sdpa, "llama_block": make_llama_block}


def make_inputs(params, dtype, device, seed):
    """Random inputs with nn.Linear-like scales, so activations stay O(1) through
    both matmuls and the softmax does not saturate."""
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    out = []
    for _name, shape, kind in params:
        t = torch.randn(shape, generator=g, device=device, dtype=torch.float32)
        if kind == "w":
            t *= 1.0 / math.sqrt(shape[-1])  # 1/sqrt(in_features)
        elif kind == "b":
            t *= 0.1
        elif kind == "ln_w":
            t = 1.0 + 0.1 * t
        out.append(t.to(dtype))
    return out


# --- timing ----------------------------------------------------------------------

def quantile(sorted_xs, q):
    """Linear interpolation between closest ranks (numpy's and torch.quantile's default)."""
    pos = q * (len(sorted_xs) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_xs) - 1)
    return sorted_xs[lo] + (sorted_xs[hi] - sorted_xs[lo]) * (pos - lo)


def rep_counts(estimate_ms, args):
    n_warmup = max(1, int(args.warmup_ms / max(estimate_ms, 1e-6)))
    n_rep = int(args.rep_ms / max(estimate_ms, 1e-6))
    return n_warmup, max(args.min_reps, min(args.max_reps, n_rep))


def time_cuda(fn, inputs, args):
    """Per-call times in ms, do_bench style: CUDA events around each call, L2
    flushed before each by zeroing a buffer larger than any L2 (50-60 MB on
    H100/H200)."""
    flush = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
    fn(*inputs)
    torch.cuda.synchronize()

    begin = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    begin.record()
    for _ in range(5):
        flush.zero_()
        fn(*inputs)
    end.record()
    torch.cuda.synchronize()
    n_warmup, n_rep = rep_counts(begin.elapsed_time(end) / 5, args)

    begins = [torch.cuda.Event(enable_timing=True) for _ in range(n_rep)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n_rep)]
    for _ in range(n_warmup):
        fn(*inputs)
    for i in range(n_rep):
        flush.zero_()
        begins[i].record()
        fn(*inputs)
        ends[i].record()
    torch.cuda.synchronize()
    del flush
    return [b.elapsed_time(e) for b, e in zip(begins, ends)]


def time_cpu(fn, inputs, args):
    """--cpu-smoke: the same loop with time.perf_counter and no cache flush."""
    fn(*inputs)
    t0 = time.perf_counter()
    for _ in range(5):
        fn(*inputs)
    n_warmup, n_rep = rep_counts((time.perf_counter() - t0) * 1e3 / 5, args)
    for _ in range(n_warmup):
        fn(*inputs)
    times = []
    for _ in range(n_rep):
        t0 = time.perf_counter()
        fn(*inputs)
        times.append((time.perf_counter() - t0) * 1e3)
    return times


# --- context ---------------------------------------------------------------------

def run_text(cmd):
    try:
        r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    out = r.stdout.strip()
    return out if r.returncode == 0 and out else None


def driver_text(smoke):
    if smoke:
        return "none (cpu-smoke)"
    drv = run_text(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
    drv = drv.splitlines()[0].strip() if drv else "unknown"
    return f"CUDA {torch.version.cuda or 'unknown'}, driver {drv}"


def device_slug(name):
    """'NVIDIA H100 80GB HBM3' -> 'h100-80gb-hbm3' (the default --out file name)."""
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    return re.sub(r"^nvidia-", "", slug) or "unknown"


def make_context(args, device):
    try:
        import triton
        triton_version = triton.__version__
    except Exception:  # a missing or broken Triton only matters to torch.compile
        triton_version = "not installed"
    ctx = {
        "device": device,
        "driver": driver_text(args.cpu_smoke),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "commit": run_text(["git", "rev-parse", "--short", "HEAD"]) or "unknown",
        "command": " ".join(shlex.quote(a) for a in [os.path.relpath(sys.argv[0], REPO)] + sys.argv[1:]),
        "torch": torch.__version__,
        "triton": triton_version,
        "executable": "bench/peers/peers.py",
        "dtype": args.dtype,
        "scale": args.scale,
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
    }
    for kv in args.context:  # like Google Benchmark's --benchmark_context
        key, _, value = kv.partition("=")
        ctx[key] = value
    return ctx


# --- one block -------------------------------------------------------------------

def entry(name, times, flops, label, extra):
    times = sorted(times)
    median = quantile(times, 0.5)
    e = {
        "name": name,
        "run_name": name,
        "run_type": "iteration",
        "repetitions": 1,
        "repetition_index": 0,
        "threads": 1,
        "iterations": len(times),
        "real_time": median,
        # Google Benchmark readers expect cpu_time; host time means nothing for
        # asynchronous GPU work, so it repeats the median.
        "cpu_time": median,
        "time_unit": "ms",
        "p20_ms": quantile(times, 0.2),
        "p80_ms": quantile(times, 0.8),
        "reps": len(times),
        "flops": flops,
        "TFLOPs": flops / (median * 1e-3) / 1e12 if median > 0 else 0.0,
        "label": label,
    }
    e.update(extra)
    return e


def error_entry(name, message):
    return {"name": name, "run_name": name, "run_type": "iteration", "error_occurred": True,
            "error_message": message, "iterations": 0, "real_time": 0.0, "cpu_time": 0.0,
            "time_unit": "ms"}


def tolerance(args):
    # f32 differs between eager and compiled code by the order of the sums (K up
    # to 16384) and by Inductor's attention rewrite; bf16 also by where
    # intermediates are rounded (Inductor keeps fused pointwise chains in f32).
    if args.dtype == "bf16":
        return 5e-2
    return 1e-2 if args.tf32 else 1e-3


def run_block(block, shapes, args, device, dtype):
    fn, params, flops = MAKERS[block](shapes)
    if block == "sdpa":
        kv = sdpa_kv_heads(shapes)
        label = (f"{args.dtype} batch={shapes.batch} seq={shapes.seq} heads={shapes.heads} kv_heads={kv} "
                 f"head_dim={shapes.head_dim} causal gqa")
        shape_info = {"dtype": args.dtype, "batch": shapes.batch, "seq": shapes.seq, "heads": shapes.heads,
                      "kv_heads": kv, "head_dim": shapes.head_dim, "is_causal": True, "enable_gqa": True}
    elif block == "llama_block":
        kv = sdpa_kv_heads(shapes)
        label = (f"{args.dtype} batch={shapes.batch} seq={shapes.seq} hidden={shapes.hidden} "
                 f"heads={shapes.heads}x{shapes.head_dim} kv_heads={kv} ffn={llama_ffn(shapes)} rope causal gqa swiglu")
        shape_info = {"dtype": args.dtype, "batch": shapes.batch, "seq": shapes.seq, "hidden": shapes.hidden,
                      "heads": shapes.heads, "kv_heads": kv, "ffn": llama_ffn(shapes)}
    else:
        label = (f"{args.dtype} batch={shapes.batch} seq={shapes.seq} hidden={shapes.hidden} "
                 f"heads={shapes.heads}x{shapes.head_dim} ffn={shapes.ffn}")
        shape_info = {"dtype": args.dtype, "batch": shapes.batch, "seq": shapes.seq, "hidden": shapes.hidden}
    timer = time_cpu if args.cpu_smoke else time_cuda
    results, failed = [], False
    inputs = make_inputs(params, dtype, device, args.seed)

    with torch.no_grad():
        name = f"BM_Block/{block}/torch_eager"
        print(f"{name}: ...", file=sys.stderr, flush=True)
        reference = fn(*inputs).float()
        times = timer(fn, inputs, args)
        results.append(entry(name, times, flops, label, dict(shape_info, mode="eager")))
        report(results[-1])

        if not args.cpu_smoke:
            suffix = "" if args.mode == "default" else "_" + args.mode.replace("-", "_")
            name = f"BM_Block/{block}/torch_compile{suffix}"
            print(f"{name}: compiling ...", file=sys.stderr, flush=True)
            try:
                compiled = torch.compile(fn, mode=None if args.mode == "default" else args.mode)
                out = compiled(*inputs).float()  # the first call compiles
                diff = (out - reference).abs().max().item()
                tol = tolerance(args)
                ok = bool(torch.allclose(out, reference, rtol=tol, atol=tol))
                del out
                times = timer(compiled, inputs, args)
                results.append(entry(name, times, flops, label,
                                     dict(shape_info, mode=args.mode, max_abs_diff=diff,
                                          allclose=ok, tolerance=tol)))
                report(results[-1])
                if not ok:
                    failed = True
                    print(f"{name}: warning: compiled output differs from eager: max abs diff "
                          f"{diff:.3g} (rtol = atol = {tol:g})", file=sys.stderr)
            except Exception as exc:  # noqa: BLE001 - record it, go on to the next block
                failed = True
                msg = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                print(f"{name}: error: {msg}", file=sys.stderr)
                results.append(error_entry(name, msg))
    return results, failed


def make_kernel(kernel, T, H, dtype, device, seed):
    """(fn, inputs, name) of a single kernel of bench/graphs/kernels/ at [T, H]: the
    bias + GELU epilogue (pointwise_bias_gelu_<dtype>_<T>x<H>.sf), a row softmax
    (reduction_softmax.sf), a layer norm (reduction_layer_norm.sf) and a column sum
    (reduction_column_sum.sf)."""
    if kernel == "bias_gelu":
        inputs = make_inputs([("h", (T, H), "act"), ("b", (H,), "b")], dtype, device, seed)
        return (lambda h, b: F.gelu(h + b)), inputs, f"bias_gelu_{'bf16' if dtype == torch.bfloat16 else 'f32'}_{T}x{H}"
    if kernel == "column_sum":
        # x.sum(dim=0): an outer reduction (reduction_column_sum.sf), as a bias's gradient is.
        inputs = make_inputs([("x", (T, H), "act")], dtype, device, seed)
        return (lambda x: x.sum(dim=0)), inputs, "column_sum" + ("_bf16" if dtype == torch.bfloat16 else "")
    if kernel == "softmax":
        inputs = make_inputs([("x", (T, H), "act")], dtype, device, seed)
        return (lambda x: torch.softmax(x, dim=-1)), inputs, "softmax" + ("_bf16" if dtype == torch.bfloat16 else "")
    inputs = make_inputs([("x", (T, H), "act"), ("w", (H,), "ln_w"), ("b", (H,), "b")], dtype, device, seed)
    return ((lambda x, w, b: F.layer_norm(x, (H,), w, b, 1e-5)), inputs,
            "layer_norm" + ("_bf16" if dtype == torch.bfloat16 else ""))


def run_kernel(kernel, shapes, args, device, dtype):
    """A single kernel of bench/graphs/kernels/, eager and compiled, each against a
    device-to-device copy of the same bytes timed in the same way just before it:
    BM_Pointwise/<name>/<peer> or BM_Reduction/<name>/<peer>, as bench_kernels names
    ours, with a `ratio` counter (copy time over the kernel's, bench_kernels'
    convention for memory-bound kernels)."""
    T, H = shapes.tokens, shapes.hidden
    fn, inputs, name = make_kernel(kernel, T, H, dtype, device, args.seed)
    x = inputs[0]
    # Bytes moved: the [T, H] input read and the output written (vectors are noise);
    # a column sum writes only [H]. The copy moves the same bytes: half read, half written.
    out_elems = H if kernel == "column_sum" else x.numel()
    moved = (x.numel() + out_elems) * x.element_size()
    half = x.reshape(-1)[: (x.numel() + out_elems) // 2]
    dst = torch.empty_like(half)

    def copy(_src):
        dst.copy_(half)

    timer = time_cpu if args.cpu_smoke else time_cuda
    family = "BM_Pointwise" if kernel == "bias_gelu" else "BM_Reduction"
    results = []
    peers = [("torch_eager", fn)]
    if not args.cpu_smoke:
        peers.append(("torch_compile", torch.compile(fn)))
    with torch.no_grad():
        for peer, f in peers:
            entry_name = f"{family}/{name}/{peer}"
            print(f"{entry_name}: ...", file=sys.stderr, flush=True)
            copy_ms = quantile(sorted(timer(copy, [x], args)), 0.5)
            times = timer(f, inputs, args)
            e = entry(entry_name, times, 0, f"{args.dtype} [{T}, {H}]", {"dtype": args.dtype, "copy_ms": copy_ms})
            e["bytes_per_second"] = moved / (e["real_time"] * 1e-3) if e["real_time"] > 0 else 0.0
            e["GBps"] = e["bytes_per_second"] / 1e9
            e["ratio"] = copy_ms / e["real_time"] if e["real_time"] > 0 else 0.0
            results.append(e)
            print(f"{entry_name}: median {e['real_time']:.4f} ms, {e['GBps']:.0f} GB/s, "
                  f"{e['ratio']:.3f} of a copy ({copy_ms:.4f} ms)", file=sys.stderr, flush=True)
    return results


def run_matmul(args, device, dtype):
    """gelu(x @ w.T + b) at the shapes of bench/graphs/kernels/matmul_<dtype>_*.sf:
    BM_MatmulPeer/<dtype>/<M>x<N>x<K>/<peer>, beside bench_kernels' BM_Matmul. Peers:
    torch_eager (cuBLAS, then the epilogue's kernels), and triton: torch.compile in
    max-autotune with Inductor's GEMM backends limited to Triton, so the product and
    its bias + GELU epilogue are one Triton template kernel, its config autotuned by
    Inductor on this GPU (Triton's tuned kernel for the issue's comparison)."""
    results = []
    timer = time_cpu if args.cpu_smoke else time_cuda
    dt = args.dtype
    sizes = MATMUL_SMOKE_SHAPES if args.cpu_smoke else MATMUL_SHAPES + (MATMUL_SHAPES_16BIT if dt != "f32" else ())

    def fn(x, w, b):
        return F.gelu(x @ w.T + b)

    for (M, N, K) in sizes:
        inputs = make_inputs([("x", (M, K), "act"), ("w", (N, K), "w"), ("b", (N,), "b")], dtype, device, args.seed)
        flops = 2 * M * N * K
        peers = [("torch_eager", fn, None)]
        if not args.cpu_smoke:
            import torch._inductor.config as inductor_config
            patch = inductor_config.patch({"max_autotune": True, "max_autotune_gemm_backends": "TRITON"})
            peers.append(("triton", torch.compile(fn, mode="max-autotune-no-cudagraphs"), patch))
        for peer, f, patch in peers:
            name = f"BM_MatmulPeer/{dt}/{M}x{N}x{K}/{peer}"
            print(f"{name}: ...", file=sys.stderr, flush=True)
            try:
                with torch.no_grad():
                    if patch is not None:
                        with patch:  # compiling (and autotuning) happens at the first call
                            times = timer(f, inputs, args)
                    else:
                        times = timer(f, inputs, args)
            except Exception as exc:  # noqa: BLE001 - e.g. no Triton config compiles
                msg = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                print(f"{name}: error: {msg}", file=sys.stderr)
                results.append(error_entry(name, msg))
                continue
            label = f"{dt} gelu(x @ w.T + b), x [{M}, {K}], w [{N}, {K}]"
            if peer == "triton":
                label += "; Inductor max-autotune, GEMM backends: TRITON"
            e = entry(name, times, flops, label, {"dtype": dt})
            results.append(e)
            print(f"{name}: median {e['real_time']:.4f} ms, {e['TFLOPs']:.1f} TFLOP/s", file=sys.stderr, flush=True)
        if not args.cpu_smoke:
            torch._dynamo.reset()
            torch.cuda.empty_cache()
    return results


def report(e):
    extra = f", max abs diff vs eager {e['max_abs_diff']:.3g}" if "max_abs_diff" in e else ""
    print(f"{e['name']}: median {e['real_time']:.3f} ms (p20 {e['p20_ms']:.3f}, p80 {e['p80_ms']:.3f}, "
          f"{e['reps']} reps), {e['TFLOPs']:.1f} TFLOP/s{extra}", file=sys.stderr, flush=True)


# --- main ------------------------------------------------------------------------

def parse_args(argv):
    p = argparse.ArgumentParser(
        description="Time PyTorch eager and torch.compile on the blocks of bench/graphs/*.sf "
                    "and write Google Benchmark JSON for bench/compare.",
        epilog="Example (GPU machine): bench/peers/peers.py && "
               "bench/compare bench/results/bench_kernels-<gpu>.json bench/results/peers-<gpu>.json")
    p.add_argument("--out", help="output JSON (default: bench/results/peers-<device slug>.json); "
                                 "written to a temporary file, then renamed")
    p.add_argument("--blocks", default=",".join(BLOCKS),
                   help="comma-separated blocks to run (default: %(default)s)")
    p.add_argument("--kernels", default="",
                   help="comma-separated single kernels to run too, each against a same-run copy "
                        f"(some of {', '.join(KERNELS)}; default: none)")
    p.add_argument("--scale", type=float, default=1.0,
                   help="divide the token count (8 x 2048) by this for a quick run; "
                        "such results are not comparable with BM_Block (default: 1)")
    p.add_argument("--dtype", choices=("f32", "bf16"), default="f32", help="default: %(default)s")
    p.add_argument("--mode", choices=COMPILE_MODES, default="default",
                   help="torch.compile mode; a mode other than 'default' names the entry "
                        "torch_compile_<mode> (default: %(default)s)")
    p.add_argument("--tf32", action="store_true",
                   help="let f32 matmuls use TF32 (torch.set_float32_matmul_precision('high')); "
                        "off by default, as shardfuse's f32 matmuls are full f32")
    p.add_argument("--warmup-ms", type=float, default=200.0, help="warm-up budget (default: %(default)s)")
    p.add_argument("--rep-ms", type=float, default=2000.0, help="timed budget (default: %(default)s)")
    p.add_argument("--min-reps", type=int, default=10, help="default: %(default)s")
    p.add_argument("--max-reps", type=int, default=1000, help="default: %(default)s")
    p.add_argument("--seed", type=int, default=0, help="input seed (default: %(default)s)")
    p.add_argument("--context", action="append", default=[], metavar="KEY=VALUE",
                   help="add or override a context field (repeatable)")
    p.add_argument("--cpu-smoke", action="store_true",
                   help="tiny shapes, eager only, on the CPU with time.perf_counter: exercises the "
                        "script without a GPU; the context's device is 'cpu-smoke' and --scale is ignored")
    args = p.parse_args(argv)

    blocks = [b.strip() for b in args.blocks.split(",") if b.strip()]
    unknown = [b for b in blocks if b not in BLOCKS]
    if unknown:
        p.error(f"--blocks: unknown block(s) {', '.join(unknown)}; expected some of {', '.join(BLOCKS)}")
    kernels = [k.strip() for k in args.kernels.split(",") if k.strip()]
    unknown = [k for k in kernels if k not in KERNELS]
    if unknown:
        p.error(f"--kernels: unknown kernel(s) {', '.join(unknown)}; expected some of {', '.join(KERNELS)}")
    if not blocks and not kernels:
        p.error("nothing to run: give --blocks or --kernels")
    args.blocks, args.kernels = blocks, kernels
    if not args.scale > 0:
        p.error("--scale must be > 0")
    if args.min_reps < 1 or args.max_reps < args.min_reps:
        p.error("need 1 <= --min-reps <= --max-reps")
    if args.cpu_smoke:  # keep the smoke run to a fraction of a second
        args.warmup_ms, args.rep_ms = min(args.warmup_ms, 5.0), min(args.rep_ms, 20.0)
        args.min_reps, args.max_reps = min(args.min_reps, 3), min(args.max_reps, 20)
    return args


def import_torch():
    global torch, F
    try:
        import torch as torch_module
        import torch.nn.functional as functional
    except ImportError as exc:
        sys.exit(f"peers.py: error: cannot import torch ({exc}); run this on the GPU machine, "
                 "whose python3 has PyTorch and Triton")
    torch, F = torch_module, functional


def write_json(path, doc):
    path = os.path.abspath(path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".peers-", suffix=".json.tmp", dir=os.path.dirname(path))
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f, indent=2)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    import_torch()
    if args.cpu_smoke:
        device, device_name, shapes = "cpu", "cpu-smoke", SMOKE
    else:
        if not torch.cuda.is_available():
            sys.exit("peers.py: error: no CUDA device visible to PyTorch "
                     f"(torch {torch.__version__}, built for CUDA {torch.version.cuda}); "
                     "use --cpu-smoke to exercise the script without a GPU")
        device, device_name, shapes = "cuda", torch.cuda.get_device_name(), scaled(FULL, args.scale)
    torch.set_float32_matmul_precision("high" if args.tf32 else "highest")
    dtype = {"f32": torch.float32, "bf16": torch.bfloat16}[args.dtype]

    out = args.out or os.path.join(REPO, "bench", "results", f"peers-{device_slug(device_name)}.json")
    doc = {"context": make_context(args, device_name), "benchmarks": []}
    any_failed = False
    for block in args.blocks:
        try:
            results, failed = run_block(block, shapes, args, device, dtype)
        except Exception as exc:  # noqa: BLE001 - e.g. out of memory in eager
            msg = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            print(f"BM_Block/{block}: error: {msg}", file=sys.stderr)
            results, failed = [error_entry(f"BM_Block/{block}/torch_eager", msg)], True
        doc["benchmarks"].extend(results)
        any_failed |= failed
        # Free this block's tensors and compiled code before the next one.
        if not args.cpu_smoke:
            torch._dynamo.reset()
            torch.cuda.empty_cache()
    for kernel in args.kernels:
        try:
            if kernel == "matmul_bias_gelu":
                doc["benchmarks"].extend(run_matmul(args, device, dtype))
            else:
                doc["benchmarks"].extend(run_kernel(kernel, shapes, args, device, dtype))
        except Exception as exc:  # noqa: BLE001
            msg = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            print(f"{kernel}: error: {msg}", file=sys.stderr)
            doc["benchmarks"].append(error_entry(f"BM_Kernel/{kernel}/torch_eager", msg))
            any_failed = True
    write_json(out, doc)
    print(f"wrote {out}", file=sys.stderr)
    return 1 if any_failed else 0


if __name__ == "__main__":
    sys.exit(main())
