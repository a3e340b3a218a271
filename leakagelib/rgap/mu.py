"""Recovering R-GAP's scalar μ = y·f(x) from ⟨∇w, w⟩, exactly.

For the logistic loss ℓ(μ) = log(1 + e^{-μ}) the quantity every layer of a
bias-free (Leaky)ReLU network shares (equations 9–11 of Zhu & Blaschko 2021) is

    c = ⟨∂ℓ/∂W_i, W_i⟩ = μ · ℓ'(μ) = -μ / (1 + e^μ).

This function of μ is positive and strictly decreasing on μ < 0, zero at 0,
and on μ > 0 falls to a minimum ``C_MIN`` ≈ -0.2785 at ``MU_STAR`` ≈ 1.2785
before rising back towards 0 (Figure 1). Hence c > 0 has one root (μ < 0),
c ∈ (C_MIN, 0) has two — the real datum and its *twin* (Appendix B) — and
c < C_MIN has none (the update is not an exact logistic-loss gradient).

The authors' code fits μ with 30,000 Adam steps (JunyiZhu-AI/R-GAP,
``recursive_attack.py``, ``inverse_udldu``); here a bracketing root-finder
(Brent's method) solves it to machine precision in microseconds. Used by
:func:`leakagelib.rgap.recursive.rgap` and the chapter "Twin data".
:func:`mu_adam` reproduces the authors' fit (the "reference" mode of
experiments ``rgap/table1`` and ``rgap/table2-lenet``).
"""

from __future__ import annotations

import math

import numpy as np
from scipy.optimize import brentq
from scipy.special import expit

__all__ = ["ADAM_LR", "ADAM_STEPS", "C_MIN", "MU_STAR", "mu_adam", "mu_dl_dmu", "mu_roots"]


def mu_dl_dmu(mu: float) -> float:
    """μ·ℓ'(μ) = -μ/(1 + e^μ) for the logistic loss, computed without overflow."""
    return -mu * float(expit(-mu))


def _dmu_dl_dmu(mu: float) -> float:
    s = float(expit(-mu))
    return -s + mu * s * (1.0 - s)


_RTOL = 8.9e-16  # just above brentq's smallest allowed relative tolerance, 4·machine epsilon

#: The minimiser of μ·ℓ'(μ): the root of 1 + e^μ − μ e^μ = 0.
MU_STAR: float = brentq(_dmu_dl_dmu, 0.5, 3.0, xtol=1e-300, rtol=_RTOL, maxiter=500)
#: The smallest value μ·ℓ'(μ) takes, about -0.2785.
C_MIN: float = mu_dl_dmu(MU_STAR)


def mu_roots(c: float, *, tol: float = 1e-12) -> tuple[float, ...]:
    """All μ with -μ/(1 + e^μ) = ``c``, ascending: one root, or two (real and twin).

    ``tol`` absorbs rounding of c near the minimum ``C_MIN`` (the double root
    ``MU_STAR``). Raises ``ValueError`` when c is below the minimum: no μ
    reproduces it, so the update is noisy or not a logistic-loss gradient.
    """
    c = float(c)
    if not math.isfinite(c):
        raise ValueError(f"<∇w, w> must be finite, got {c}")
    if c > 0:
        # -μ/(1+e^μ) lies between |μ|/2 and |μ| for μ < 0, so the root is in [-2c, -c].
        return (brentq(lambda m: mu_dl_dmu(m) - c, -2 * c, -c, xtol=1e-300, rtol=_RTOL),)
    if c == 0:
        return (0.0,)
    if c < C_MIN - tol:
        raise ValueError(
            f"<∇w, w> = {c:.6g} is below {C_MIN:.6g}, the minimum of -μ/(1+e^μ): no μ fits; "
            "the update is not an exact logistic-loss gradient of this model"
        )
    if c <= C_MIN + tol:
        return (MU_STAR,)
    low = brentq(lambda m: mu_dl_dmu(m) - c, 0.0, MU_STAR, xtol=1e-300, rtol=_RTOL)
    hi = 2 * MU_STAR
    while mu_dl_dmu(hi) <= c:
        hi *= 2
    high = brentq(lambda m: mu_dl_dmu(m) - c, MU_STAR, hi, xtol=1e-300, rtol=_RTOL)
    return (low, high)


#: The authors' fit of μ (JunyiZhu-AI/R-GAP, ``recursive_attack.py``, ``inverse_udldu``):
#: ``torch.optim.Adam`` with lr 0.01 (other settings default) for 30,000 steps on
#: the squared error (``nn.MSELoss``) of -μ/(1 + e^μ) against c, μ starting at 0, float32.
ADAM_LR = 0.01
ADAM_STEPS = 30_000


def mu_adam(c: float, *, steps: int = ADAM_STEPS, lr: float = ADAM_LR) -> float:
    """μ fitted to μ·ℓ'(μ) = ``c`` as the authors' code does: Adam in float32 from μ = 0.

    ``torch.optim.Adam``'s update (β = (0.9, 0.999), ε = 1e-8, bias-corrected)
    and the gradient of (-μ/(1 + e^μ) − c)² written out in float32 scalars:
    the same arithmetic as the authors' loop, about 100× faster than stepping
    a one-element tensor. It stops where Adam's last step leaves it — about
    1e-5 from the root for ``|μ|`` of a few units — so R-GAP started from it is
    the authors' R-GAP, not the exact one. For c < 0 it finds the root its
    descent from 0 reaches (the one nearer 0 when the twin exists).
    """
    f32 = np.float32
    if not math.isfinite(c):
        raise ValueError(f"<∇w, w> must be finite, got {c}")
    one, target, rate = f32(1), f32(c), f32(lr)
    beta2, eps = f32(0.999), f32(1e-8)
    mu, m, v = f32(0), f32(0), f32(0)
    with np.errstate(over="ignore"):
        for t in range(1, steps + 1):
            e = np.exp(mu)
            d = one + e
            g = f32(2) * (-mu / d - target)  # d(loss)/d(output)
            grad = -g / d + g * mu * e / (d * d)
            m = m + f32(1 - 0.9) * (grad - m)
            v = beta2 * v + f32(1 - 0.999) * grad * grad
            step = f32(rate / (1 - 0.9**t))
            denom = np.sqrt(v) / f32(math.sqrt(1 - 0.999**t)) + eps
            mu = mu - step * m / denom
    return float(mu)
