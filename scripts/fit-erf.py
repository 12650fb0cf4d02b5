#!/usr/bin/env python3
# Derives the coefficients of ElementCodegen::erf_for_16bit (codegen/kernels/element_erf.cpp):
#   t < 1:  erf(t) = t * q(s), s = t^2, q of degree 5 in u = 2s - 1;
#   t >= 1: erf(t) = 1 - 2^p(t), p of degree 7 in u = (t - 2.46) / 1.46, fitted to
#           log2(erfc(t)) on [1, 3.92] (beyond 3.92 erf rounds to 1 in f32).
# Each is a least-squares fit in the Chebyshev basis on 400 Chebyshev nodes (close to
# the minimax fit), turned into monomial coefficients in u and rounded to f32. It then
# prints the worst absolute and relative error of the f32 evaluation (Horner, each
# step rounded to f32) against mpmath's erf on a grid over [0, 5].
# Not part of the build: it needs numpy and mpmath (pip install numpy mpmath). The
# test ElementCodegen.ErfFor16BitIsWithin2e7OfErf checks the emitted code itself.
import mpmath as mp
import numpy as np

mp.mp.dps = 40
SPLIT, TOP = 1.0, 3.92


def fit(f, a, b, degree, nodes=400):
    u = np.cos(np.pi * (np.arange(nodes) + 0.5) / nodes)
    x = (a + b) / 2 + (b - a) / 2 * u
    y = np.array([float(f(mp.mpf(float(v)))) for v in x])
    return np.polynomial.chebyshev.cheb2poly(np.polynomial.chebyshev.chebfit(u, y, degree)).astype(np.float32)


def horner(coef, u):
    r = np.float32(coef[-1])
    for c in coef[-2::-1]:
        r = np.float32(np.float64(r) * np.float64(u) + np.float64(c))
    return r


low = fit(lambda s: mp.erf(mp.sqrt(s)) / mp.sqrt(s) if s > 0 else 2 / mp.sqrt(mp.pi), 0, SPLIT**2, 5)
high = fit(lambda t: mp.log(mp.erfc(t), 2), SPLIT, TOP, 7)
print("kLow  =", ", ".join("%.9ef" % c for c in low))
print("kHigh =", ", ".join("%.9ef" % c for c in high))
worst_abs = worst_rel = 0.0
for x in np.linspace(0, 5, 50001)[1:]:
    t = np.float32(x)
    if t < SPLIT:
        r = np.float32(t * horner(low, np.float32(2 * t * t - 1)))
    else:
        u = np.float32((min(t, np.float32(TOP)) - (SPLIT + TOP) / 2) / ((TOP - SPLIT) / 2))
        r = np.float32(1 - np.float32(2.0 ** np.float64(horner(high, u))))
    want = float(mp.erf(mp.mpf(float(t))))
    worst_abs = max(worst_abs, abs(float(r) - want))
    worst_rel = max(worst_rel, abs(float(r) - want) / want)
print("worst error on [0, 5]: %.2e absolute, %.2e relative" % (worst_abs, worst_rel))
