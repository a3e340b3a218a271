"""Step 1 of R-GAP: the last layer's output z_d and its gradient k_d = ∂ℓ/∂z_d.

Everything below the last layer (:mod:`.recursive`) needs only z_d and k_d;
this module finds every pair that fits the update.

* **Logistic loss** (the paper's binary setting, one output logit):
  c = ⟨∇w_d, w_d⟩ (+ ∇b_d·b_d) equals μ·ℓ'(μ) (equation 9), and
  :func:`~leakagelib.rgap.mu.mu_roots` solves it for μ exactly, giving
  z_d = μ/y and k_d = −y/(1 + e^μ) per root (:func:`logistic_starts`).
* **Cross-entropy with a recovered label**: §3.1.1 notes that for multi-class
  classification the label can be read off the gradient (Zhao et al. 2020);
  :func:`ce_last_layer` derives the K-class step 1. The binary logistic loss is
  the special case K = 2: with μ = z_y − logsumexp_{j≠y} z_j (:func:`margin`),
  cross-entropy is exactly log(1 + e^{−μ}).

Used by :func:`leakagelib.rgap.recursive.rgap`; chapter "Closed-form attacks"
derives both cases.
"""

from __future__ import annotations

import numpy as np
from scipy.special import expit
from torch import Tensor

from .losses import MARGIN_LOSSES
from .mu import mu_roots

__all__ = ["LOSSES", "Start", "ce_last_layer", "logistic_starts", "margin", "signed_label"]

#: The losses R-GAP's step 1 knows: the margin losses of Figure 1
#: (:mod:`leakagelib.rgap.losses`) and cross-entropy.
LOSSES = (*MARGIN_LOSSES, "ce")

#: One way the recursion can start: (μ, z_d, k_d).
Start = tuple[float, np.ndarray, np.ndarray]


def signed_label(label: int | float | Tensor, loss: str = "logistic") -> float:
    """A margin loss's label as a float, checked to be −1 or +1."""
    y = float(label.item() if isinstance(label, Tensor) else label)
    if y not in (-1.0, 1.0):
        raise ValueError(f"R-GAP's {loss} loss takes a label y in {{-1, +1}}, got {label!r}")
    return y


def logistic_starts(c: float, y: float, mu: float | None = None) -> list[Start]:
    """(μ, z_d, k_d) for every μ with μ·ℓ'(μ) = ``c`` (or for the given ``mu`` alone).

    One root for c ≥ 0, two — the real datum and its twin (Appendix B) — for
    c ∈ (C_MIN, 0); see :func:`~leakagelib.rgap.mu.mu_roots`.
    """
    mus = (float(mu),) if mu is not None else mu_roots(c)
    return [(m, np.array([m * y]), np.array([-y * float(expit(-m))])) for m in mus]


def margin(z: np.ndarray, label: int) -> float:
    """μ = z_y − logsumexp_{j≠y} z_j: cross-entropy equals log(1 + e^{−μ})."""
    others = np.delete(z, label)
    top = float(others.max())
    return float(z[label] - top - np.log(np.exp(others - top).sum()))


def _from_bias(
    w: np.ndarray, gw: np.ndarray, bias: np.ndarray, k: np.ndarray, label: int | None
) -> tuple[int, list[tuple[np.ndarray, np.ndarray]]]:
    """With a bias k = ∇b is observed: y its only negative entry, x = ∇Wᵀk / ‖k‖²."""
    y = int(np.argmin(k)) if label is None else int(label)
    kk = float(k @ k)
    if kk == 0.0:
        raise ValueError("the bias gradient is zero: the update carries no information")
    x = gw.T @ k / kk
    return y, [(w @ x + bias, k)]


def _direction(w: np.ndarray, gw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """g = ∇W u and v = W u for u the unit vector along the largest row of ∇W."""
    row = int(np.argmax(np.linalg.norm(gw, axis=1)))
    norm = float(np.linalg.norm(gw[row]))
    if norm == 0.0:
        raise ValueError("the last layer's gradient is zero: the update carries no information")
    u = gw[row] / norm
    return gw @ u, w @ u


def _binary(
    w: np.ndarray, gw: np.ndarray, g: np.ndarray, v: np.ndarray, label: int | None
) -> tuple[int, list[tuple[np.ndarray, np.ndarray]]]:
    """K = 2: μ from c = ⟨∇W, W⟩ (one or two roots), s = μ / (v_y − v_j)."""
    y = int(np.argmin(gw.sum(axis=1))) if label is None else int(label)
    j = 1 - y
    c = float(np.sum(gw * w))
    if v[y] == v[j]:
        raise ValueError("both logits are equal along the input direction; μ is undetermined")
    pairs = []
    for m in mu_roots(c):
        s = m / (v[y] - v[j])
        if s == 0.0:
            continue
        pairs.append((s * v, g / s))
    if not pairs:
        raise ValueError("μ = 0: the input's scale cannot be determined from the update")
    return y, pairs


def _label_from_signs(g: np.ndarray) -> int:
    """The one entry of g whose sign differs from all others (k_y < 0 < k_j)."""
    signs = np.sign(g)
    majority = 1.0 if (signs > 0).sum() >= (signs < 0).sum() else -1.0
    odd = np.flatnonzero(signs != majority)
    if odd.size != 1:
        raise ValueError(
            "the last layer's gradient is not that of a single cross-entropy example "
            f"({odd.size} entries of the minority sign; expected exactly one)"
        )
    return int(odd[0])


def _scale_fit(g: np.ndarray, v: np.ndarray, y: int) -> tuple[np.ndarray, np.ndarray]:
    """K ≥ 3: s is the slope of the line log|g_j| = s·v_j + const over j ≠ y."""
    others = np.delete(np.arange(g.shape[0]), y)
    gv, vv = g[others], v[others]
    ok = gv != 0
    if ok.sum() < 2 or np.ptp(vv[ok]) == 0:
        raise ValueError("too few distinct non-label logits to fix the input's scale")
    design = np.stack([vv[ok], np.ones(int(ok.sum()))], axis=1)
    s = float(np.linalg.lstsq(design, np.log(np.abs(gv[ok])), rcond=None)[0][0])
    if s == 0.0:
        raise ValueError("the fitted input scale is zero")
    return s * v, g / s


def ce_last_layer(
    weight: np.ndarray,
    grad_weight: np.ndarray,
    bias: np.ndarray | None = None,
    grad_bias: np.ndarray | None = None,
    label: int | None = None,
) -> tuple[int, list[tuple[np.ndarray, np.ndarray]]]:
    """Step 1 of R-GAP under cross-entropy: the label and every (z_d, k_d) that fits.

    The last layer is linear, z = W x + b with K outputs, and k = ∂ℓ/∂z =
    p − e_y with p = softmax(z). Its gradients are ∇b = k and ∇W = k xᵀ (rank
    one: every row is a multiple of the layer input x, Phong et al.'s
    observation, equation 3 of the paper).

    * **With a bias** k = ∇b is observed directly; y is its only negative entry
      (iDLG, :func:`leakagelib.gradients.recover_label_idlg`), x = ∇Wᵀk / ‖k‖²
      and z = W x + b. One candidate.
    * **Without a bias** only the direction of x is observed. Take the unit
      vector u along the largest row of ∇W (exact, ∇W being rank one) and write
      x = s·u with an unknown scale s. Then g := ∇W u = s·k and v := W u give
      z = s·v and k = g / s, so everything hangs on s:

      - the label is the entry of g whose sign differs from all others
        (k_y = p_y − 1 < 0 < k_j = p_j for j ≠ y), no assumption on the sign
        of the features needed (K ≥ 3);
      - for j ≠ y, g_j = s·p_j = s·e^{s v_j} / Σ e^{z}, so
        log|g_j| = s·v_j + const: a straight line in v_j whose slope is s.
        With K ≥ 3 there are at least two points and s follows exactly from
        a least-squares line fit — a unique solution, no twin;
      - for K = 2 there is one point only. This is the paper's binary setting:
        c = ⟨∇W, W⟩ = kᵀz = μ·ℓ'(μ) with μ = z_y − z_j (equations 9–11), so
        :func:`~leakagelib.rgap.mu.mu_roots` gives μ (one or two roots: the
        twin of Appendix B), s = μ / (v_y − v_j), and the label, if not given,
        is read with iDLG's weight rule (non-negative features assumed).

    Returns the label and a list of ``(z, k)`` pairs (float64 vectors of length K).
    """
    w = np.asarray(weight, dtype=np.float64)
    gw = np.asarray(grad_weight, dtype=np.float64)
    n_classes = w.shape[0]
    if n_classes < 2:
        raise ValueError("cross-entropy needs at least two classes")
    if label is not None and not 0 <= int(label) < n_classes:
        raise ValueError(f"label must be a class index in 0..{n_classes - 1}, got {label!r}")
    if grad_bias is not None and bias is not None:
        b, k = np.asarray(bias, dtype=np.float64), np.asarray(grad_bias, dtype=np.float64)
        return _from_bias(w, gw, b, k, label)
    g, v = _direction(w, gw)
    if n_classes == 2:
        return _binary(w, gw, g, v, label)
    y = _label_from_signs(g) if label is None else int(label)
    return y, [_scale_fit(g, v, y)]
