"""The three margin losses of R-GAP's Figure 1: logistic, exponential and hinge.

R-GAP (Zhu & Blaschko 2021, §3.1) writes the binary loss as a function of the
margin μ = y·f(x). For a bias-free (Leaky)ReLU network every layer then shares
c = ⟨∇W_i, W_i⟩ = μ·ℓ'(μ) (equations 9–10: the network is positively homogeneous
in each layer's weights, whatever ℓ is), and step 1 of the recursion needs μ
back from c. Figure 1 draws μ·ℓ'(μ) for three losses; their closed forms:

* logistic, ℓ = log(1 + e^{-μ}): μ·ℓ'(μ) = −μ/(1 + e^μ), minimum ≈ −0.2785 at
  μ ≈ 1.2785 (:mod:`.mu`), then back towards 0⁻;
* exponential, ℓ = e^{-μ}: μ·ℓ'(μ) = −μ·e^{−μ}, minimum −1/e at μ = 1, then
  towards 0⁻; its roots are Lambert-W values, μ = −W(c) on the branches W₀ and
  W₋₁;
* hinge, ℓ = max(0, 1 − μ): μ·ℓ'(μ) = −μ for μ < 1 and 0 for μ ≥ 1 (the
  caption's "equals to 0 after decreasing to μ = 1"; PyTorch's subgradient at
  the kink is 0).

For c > 0 (μ < 0) each has one root. For c < 0 the logistic and exponential
losses have two, the real margin and its twin (Appendix B), while the hinge
loss has one, μ = −c ∈ (0, 1): beyond the margin (μ ≥ 1) its gradient is zero
and the update carries nothing. Once μ is known, the recursion needs only
k_d = y·ℓ'(μ) and z_d = μ/y (:func:`margin_starts`), so it applies unchanged
to all three. Used by :func:`leakagelib.rgap.recursive.rgap` (``loss=``),
experiment ``rgap/fig1-losses`` and the chapter "R-GAP in practice".
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy.special import expit, lambertw

from ..losses import MARGIN_LOSSES
from .mu import C_MIN, MU_STAR, mu_roots

__all__ = ["MARGIN_LOSSES", "MarginLoss", "margin_loss", "margin_starts"]


@dataclass(frozen=True)
class MarginLoss:
    """A loss ℓ(μ) of the margin μ = y·f(x), with what step 1 of R-GAP needs of it.

    ``derivative`` is ℓ'(μ); ``mu_star`` and ``c_min`` are where μ·ℓ'(μ) has
    its infimum on μ > 0 and its value there (for the hinge loss the infimum
    −1 is approached as μ → 1⁻ and not attained); ``roots(c)`` are all μ with
    μ·ℓ'(μ) = c and a non-zero gradient, ascending.
    """

    name: str
    formula: str
    value: Callable[[float], float]
    derivative: Callable[[float], float]
    mu_star: float
    c_min: float
    roots: Callable[[float], tuple[float, ...]]

    def mu_dl_dmu(self, mu: float) -> float:
        """μ·ℓ'(μ), the quantity every layer's ⟨∇W_i, W_i⟩ equals (equation 10)."""
        return float(mu) * self.derivative(float(mu))


def _finite(c: float) -> float:
    c = float(c)
    if not math.isfinite(c):
        raise ValueError(f"<∇w, w> must be finite, got {c}")
    return c


def _no_root(c: float, loss: str, c_min: float) -> ValueError:
    return ValueError(
        f"<∇w, w> = {c:.6g} is not above {c_min:.6g}, the infimum of μ·ℓ'(μ) for the {loss} "
        "loss: no μ fits; the update is not an exact gradient of this loss"
    )


def _exponential_roots(c: float, *, tol: float = 1e-12) -> tuple[float, ...]:
    """μ with −μ·e^{−μ} = c: μ = −W₀(c), and −W₋₁(c) as well for c ∈ (−1/e, 0)."""
    c = _finite(c)
    if c >= 0:
        return (float(-lambertw(c, 0).real),)
    if c < -math.exp(-1) - tol:
        raise _no_root(c, "exponential", -math.exp(-1))
    if c <= -math.exp(-1) + tol:
        return (1.0,)
    return (float(-lambertw(c, 0).real), float(-lambertw(c, -1).real))


def _hinge_roots(c: float) -> tuple[float, ...]:
    """μ = −c: one root for c > −1 (μ ≥ 1 leaves a zero gradient, nothing to attack)."""
    c = _finite(c)
    if c <= -1:
        raise _no_root(c, "hinge", -1.0)
    return (0.0 - c,)


_LOSSES = {
    "logistic": MarginLoss(
        "logistic",
        "log(1 + exp(-mu))",
        lambda m: float(np.logaddexp(0.0, -m)),
        lambda m: -float(expit(-m)),
        MU_STAR,
        C_MIN,
        mu_roots,
    ),
    "exponential": MarginLoss(
        "exponential",
        "exp(-mu)",
        lambda m: math.exp(-m),
        lambda m: -math.exp(-m),
        1.0,
        -math.exp(-1),
        _exponential_roots,
    ),
    "hinge": MarginLoss(
        "hinge",
        "max(0, 1 - mu)",
        lambda m: max(0.0, 1.0 - m),
        lambda m: -1.0 if m < 1 else 0.0,
        1.0,
        -1.0,
        _hinge_roots,
    ),
}


def margin_loss(name: str) -> MarginLoss:
    """The margin loss ``name`` ("logistic", "exponential" or "hinge")."""
    if name not in _LOSSES:
        raise ValueError(f"unknown margin loss {name!r}; use one of {MARGIN_LOSSES}")
    return _LOSSES[name]


def margin_starts(
    loss: str, c: float, y: float, mu: float | None = None
) -> list[tuple[float, np.ndarray, np.ndarray]]:
    """(μ, z_d, k_d) for every μ with μ·ℓ'(μ) = ``c`` (or for the given ``mu`` alone).

    z_d = μ·y (y = ±1) and k_d = ∂ℓ/∂z_d = y·ℓ'(μ), one logit. Raises
    ``ValueError`` when k_d is zero (a hinge margin μ ≥ 1: the update is zero).
    """
    spec = margin_loss(loss)
    mus = (float(mu),) if mu is not None else spec.roots(c)
    starts = [(m, np.array([m * y]), np.array([y * spec.derivative(m)])) for m in mus]
    if all(k[0] == 0.0 for _, _, k in starts):
        raise ValueError(f"the {loss} loss has zero gradient at μ = {mus}: nothing to recover")
    return starts
