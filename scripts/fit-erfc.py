#!/usr/bin/env python3
# Derives the coefficients of ElementCodegen::one_plus_erf_for_16bit
# (codegen/kernels/element_erf.cpp): with t = |z| and s = 1 / (1 + t / 2) in (0, 1],
#   erfc(t) = s * 2^(-t^2 log2(e) + p(s)),
# p of degree DEGREE in s, fitted to log2(erfc(t) / s) + t^2 log2(e), which is smooth
# on all of (0, 1] (it tends to -log2(2 sqrt(pi)) as t grows). The fit interpolates at
# Chebyshev nodes of s (close to the minimax fit), then turns the Chebyshev series into
# monomial coefficients in s, rounded to f32, the constant term then set so that
# p(1) is exactly 0 in f32. It prints the coefficients and the worst
# relative error of the f32 evaluation (every step rounded to f32, the exp2 exact)
# against Python's double erfc, over t in [0, 9] (beyond 9.2, erfc is below f32's
# normal range and the kernel's flushing ex2 returns 0).
# Pure Python (math, struct): runs anywhere python3 does. The test
# ElementCodegen.OnePlusErfFor16BitIsWithin1e6OfErfc checks the emitted code itself.
import math
import struct

DEGREE = 9
NODES = 80
LOG2E = 1.0 / math.log(2.0)


def f32(x):
    return struct.unpack("f", struct.pack("f", x))[0]


def log_erfc(t):
    if t < 20:
        return math.log(math.erfc(t))
    # The asymptotic series: erfc(t) = e^-t^2 / (t sqrt(pi)) (1 - 1/(2t^2) + 3/(4t^4) - ...).
    x = 1.0 / (2 * t * t)
    return -t * t - math.log(t * math.sqrt(math.pi)) + math.log(1 - x + 3 * x * x - 15 * x**3)


def target(s):
    # s in (0, 1]; at s = 0 (t = infinity) the limit.
    if s <= 0:
        return -math.log(2 * math.sqrt(math.pi)) * LOG2E
    t = 2 / s - 2
    return (log_erfc(t) - math.log(s)) * LOG2E + t * t * LOG2E


# Chebyshev interpolation on s in [0, 1] (u = 2s - 1), truncated to DEGREE.
us = [math.cos(math.pi * (j + 0.5) / NODES) for j in range(NODES)]
ys = [target((u + 1) / 2) for u in us]
cheb = []
for k in range(DEGREE + 1):
    c = sum(y * math.cos(k * math.pi * (j + 0.5) / NODES) for j, y in enumerate(ys)) * 2 / NODES
    cheb.append(c / 2 if k == 0 else c)

# Chebyshev series in u -> monomials in u -> monomials in s (u = 2s - 1).
def cheb_to_mono(c):
    t_prev, t_cur = [1.0], [0.0, 1.0]
    mono = [0.0] * len(c)
    for k, ck in enumerate(c):
        tk = [1.0] if k == 0 else t_cur if k == 1 else None
        if k >= 2:
            nxt = [0.0] * (k + 1)
            for i, v in enumerate(t_cur):
                nxt[i + 1] += 2 * v
            for i, v in enumerate(t_prev):
                nxt[i] -= v
            t_prev, t_cur = t_cur, nxt
            tk = t_cur
        for i, v in enumerate(tk):
            mono[i] += ck * v
    return mono


mono_u = cheb_to_mono(cheb)
mono_s = [0.0] * len(mono_u)
for i, a in enumerate(mono_u):  # a * (2s - 1)^i
    for j in range(i + 1):
        mono_s[j] += a * math.comb(i, j) * (2.0**j) * ((-1.0) ** (i - j))
coef = [f32(c) for c in mono_s]
# erfc(0) = 1 exactly: the constant term takes up what the f32 Horner sum at s = 1
# (t = 0) leaves over 0, so that 1 + erf(0) is exactly 1 and GELU of a tiny x is x / 2
# rounded once.
at_one = coef[-1]
for c in coef[-2::-1]:
    at_one = f32(at_one + c)
coef[0] = f32(coef[0] - at_one)
print("kErfc =", ", ".join("%.9ef" % c for c in coef))


def model(t):
    t = f32(t)
    s = f32(1.0 / f32(f32(0.5 * t) + 1.0))  # rcp of fma(t, 0.5, 1)
    p = coef[-1]
    for c in coef[-2::-1]:
        p = f32(p * s + c)
    a = f32(f32(-t * LOG2E) * t + p)  # fma(-t log2e, t, p): one rounding at the end
    return f32(s * f32(2.0**a))


worst = 0.0
worst_at = 0.0
t = 0.0
while t <= 9.0:
    want = math.erfc(f32(t))
    got = model(t)
    rel = abs(got - want) / want
    if rel > worst:
        worst, worst_at = rel, t
    t += 1e-4
print("worst relative error of erfc on [0, 9]: %.2e at t = %.4f" % (worst, worst_at))
