"""R-GAP: the recursive, closed-form gradient attack (Zhu & Blaschko 2021, Algorithm 1).

For a network with one output logit trained with the logistic loss
ℓ = log(1 + e^{-μ}), μ = y·f(x), the attack runs from the last layer to the first:

1. ``c = ⟨∇w_d, w_d⟩`` (plus ``∇b_d·b_d`` with a bias) equals μ·ℓ'(μ)
   (equation 9); :func:`~leakagelib.rgap.mu.mu_roots` solves it for μ exactly,
   giving the output ``z_d = μ/y`` and ``k_d = ∂ℓ/∂z_d = -y/(1 + e^μ)``.
2. At layer i, with ``k_i = ∂ℓ/∂z_i`` and the pre-activation ``z_i`` known, the
   input ``x_i`` satisfies the weight constraints ``W_i x_i = z_i`` and the
   gradient constraints ``K_i x_i = vec(∇W_i)`` (equations 15–16); the stacked
   sparse system is solved by least squares.
3. ``x_i`` is the previous layer's activation output: inverting the activation
   gives ``z_{i-1}`` and ``σ'``, and ``k_{i-1} = (W_iᵀ k_i) ⊙ σ'`` (equation 13).

Everything runs in float64 on the untrained network. When μ is not unique
(c ∈ (C_MIN, 0)) both roots are followed: one gives the real image, the other
its *twin* (Appendix B), which produces exactly the same update. Chapter
"Closed-form attacks" derives each step; "Twin data" uses the two roots.

**Cross-entropy with a recovered label.** §3.1.1 notes that for multi-class
classification the label can be read off the gradient (Zhao et al. 2020); the
paper derives R-GAP in the binary setting only. For K classes, logits
z = W_d x_d (+ b) and ℓ = −log softmax(z)_y, the last layer's output gradient is
k_d = ∂ℓ/∂z = softmax(z) − e_y, and ∇W_d = k_d x_dᵀ is rank one. Only step 1
changes — finding k_d and z_d — see :func:`ce_last_layer`; steps 2–3 are the
same recursion. The binary logistic loss is the special case K = 2: with
μ = z_y − logsumexp_{j≠y} z_j, cross-entropy is exactly log(1 + e^{−μ}).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch
from scipy.special import expit
from torch import Tensor, nn

from ..gradients import Update, check_update
from .chain import Stage, chain_of, inverse
from .constraints import (
    LayerConstraints,
    gradient_block,
    gradient_rhs,
    layer_constraints,
    weight_matrix,
)
from .mu import mu_roots
from .solve import (
    Solution,
    exact_rank,
    least_squares,
    projected_solve,
    split_gradient,
    weight_only_solve,
)

__all__ = [
    "LOSSES",
    "SOLVERS",
    "LayerReport",
    "RGAPResult",
    "ce_last_layer",
    "rgap",
    "select_candidate",
]


@dataclass
class LayerReport:
    """How one layer's system went: its size, residual and (optionally) rank.

    ``rank`` is the exact rank of the layer's stacked [W; K] whenever the
    solver's route certifies it (per-channel and weight-only: full; projected:
    measured, the same computation as :func:`leakagelib.rgap.rank.exact_ranks`)
    or ``diagnostics`` is on; None after the stacked route.
    """

    name: str
    unknowns: int
    weight_rows: int
    gradient_rows: int
    residual: float
    solver: str
    rank: int | None = None
    condition: float | None = None

    @property
    def full_rank(self) -> bool | None:
        """Whether the stacked constraints determine the layer's input (None if not measured)."""
        return None if self.rank is None else self.rank == self.unknowns


@dataclass
class RGAPResult:
    """R-GAP's reconstruction, with every μ-candidate (real and twin) it followed.

    ``label`` is the label used (±1 for the logistic loss, the class index —
    given or recovered from the gradient — for cross-entropy) and ``loss`` the
    loss the update was taken to come from. For cross-entropy ``mu`` is the
    margin z_y − logsumexp_{j≠y} z_j of the recovered logits (the logistic μ
    when K = 2).
    """

    image: Tensor
    mu: float
    layers: list[LayerReport]
    candidates: list[Tensor] = field(default_factory=list)
    mus: tuple[float, ...] = ()
    seconds: float = 0.0
    label: int | float | None = None
    loss: str = "logistic"


def _signed_label(label: int | float | Tensor) -> float:
    y = float(label.item() if isinstance(label, Tensor) else label)
    if y not in (-1.0, 1.0):
        raise ValueError(f"R-GAP's logistic loss takes a label y in {{-1, +1}}, got {label!r}")
    return y


def _numpy(t: Tensor) -> np.ndarray:
    return t.detach().to("cpu", torch.float64).numpy()


def _bias_map(stage: Stage, model_params: dict[str, Tensor]) -> np.ndarray:
    """The bias broadcast over the layer's output (zeros without a bias)."""
    n_out = int(np.prod(stage.out_shape))
    key = stage.bias_key
    if key is None:
        return np.zeros(n_out)
    b = _numpy(model_params[key])
    per = n_out // b.size
    return np.repeat(b, per)


SOLVERS = ("auto", "stacked", "dense")

#: Largest number of free directions (C_in × dim null(B)) for which the projected
#: dense solve is used; beyond it the sparse stacked solve is cheaper.
PROJECTED_MAX_FREE = 4000


def _solve_layer(system: LayerConstraints, k: np.ndarray, solver: str) -> Solution:
    """Solve one layer's constraints by the fastest exact route (see :mod:`.solve`)."""
    geom = system.geometry
    if solver == "auto":
        block = gradient_block(geom, k)
        hw = geom.height * geom.width
        split = None
        if block.shape[0] >= hw:  # B can have full column rank only if it is tall
            split = split_gradient(block, gradient_rhs(geom, system.grad))
        # B (hence K) of full column rank, or W of full column rank (a
        # non-singular factor), certifies that the layer is full rank
        if split is not None and split.null.shape[1] == 0:
            sol = Solution(split.particular.T.ravel(), "per-channel", rank=geom.n_in)
            return _finish(system, sol)
        x = weight_only_solve(system.weight, system.z)
        if x is not None:
            return _finish(system, Solution(x, "weight-only", rank=geom.n_in))
        if split is None and geom.in_channels * (hw - block.shape[0]) <= PROJECTED_MAX_FREE:
            split = split_gradient(block, gradient_rhs(geom, system.grad))
        if split is not None and geom.in_channels * split.null.shape[1] <= PROJECTED_MAX_FREE:
            x, rank = projected_solve(system.weight, system.z, split, geom.in_channels)
            return _finish(system, Solution(x, "projected", rank=rank))
        sol = least_squares(system.matrix, system.rhs)
    else:
        sol = least_squares(system.matrix, system.rhs, dense=solver == "dense")
    return _finish(system, sol)


def _finish(system: LayerConstraints, sol: Solution) -> Solution:
    """Attach the relative residual of the layer's full stacked system."""
    a, b = system.matrix, system.rhs
    sol.residual = float(np.linalg.norm(a @ sol.x - b) / max(np.linalg.norm(b), 1e-300))
    return sol


def _recurse(
    stages: list[Stage],
    params: dict[str, Tensor],
    update: Update,
    k: np.ndarray,
    z: np.ndarray,
    *,
    solver: str,
    diagnostics: bool,
    fc_weight_constraints: bool,
) -> tuple[np.ndarray, list[LayerReport]]:
    """Run steps 2–3 from the last stage down to the input; return x_1 and reports."""
    reports: list[LayerReport] = []
    known = np.ones(z.shape, dtype=bool)
    x = z
    for idx in range(len(stages) - 1, -1, -1):
        stage = stages[idx]
        geom = stage.geometry
        weight = _numpy(params[stage.weight_key])
        rows = known
        if isinstance(stage.layer, nn.Linear) and not fc_weight_constraints:
            rows = np.zeros_like(known)
        system = layer_constraints(
            geom,
            weight,
            k,
            z - _bias_map(stage, params),
            _numpy(update[stage.weight_key]),
            weight_rows=rows,
        )
        sol = _solve_layer(system, k, solver)
        x = sol.x
        if diagnostics:
            sol.rank, sol.condition = exact_rank(system.matrix)
        reports.append(
            LayerReport(
                name=stage.name,
                unknowns=geom.n_in,
                weight_rows=int(system.weight.shape[0]),
                gradient_rows=int(system.gradient.shape[0]),
                residual=sol.residual,
                solver=sol.solver,
                rank=sol.rank,
                condition=sol.condition,
            )
        )
        if idx == 0:
            break
        prev = stages[idx - 1]
        z, slope, known = inverse(prev.activation, x)
        back = weight_matrix(geom, weight).T @ k
        k = back * slope
    reports.reverse()
    return x, reports


def select_candidate(candidates: list[Tensor]) -> int:
    """Index of the candidate whose dynamic range is closest to [0, 1]'s.

    Twin data are a scaled copy of the real image (Appendix B) and produce the
    same update, so no gradient can tell them apart; a prior must. Images in
    [0, 1] span most of that range, so the candidate with max − min closest to
    1 (on a log scale) is taken as the real one.
    """
    if not candidates:
        raise ValueError("no candidates to choose from")
    spans = [float(c.max() - c.min()) for c in candidates]
    scores = [abs(np.log(s)) if s > 0 else np.inf for s in spans]
    return int(np.argmin(scores))


LOSSES = ("logistic", "ce")


def _margin(z: np.ndarray, label: int) -> float:
    """μ = z_y − logsumexp_{j≠y} z_j: cross-entropy equals log(1 + e^{−μ})."""
    others = np.delete(z, label)
    top = float(others.max())
    return float(z[label] - top - np.log(np.exp(others - top).sum()))


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
        k = np.asarray(grad_bias, dtype=np.float64)
        y = int(np.argmin(k)) if label is None else int(label)
        kk = float(k @ k)
        if kk == 0.0:
            raise ValueError("the bias gradient is zero: the update carries no information")
        x = gw.T @ k / kk
        return y, [(w @ x + np.asarray(bias, dtype=np.float64), k)]
    row = int(np.argmax(np.linalg.norm(gw, axis=1)))
    norm = float(np.linalg.norm(gw[row]))
    if norm == 0.0:
        raise ValueError("the last layer's gradient is zero: the update carries no information")
    u = gw[row] / norm
    g = gw @ u
    v = w @ u
    if n_classes == 2:
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
    signs = np.sign(g)
    if label is None:
        majority = 1.0 if (signs > 0).sum() >= (signs < 0).sum() else -1.0
        odd = np.flatnonzero(signs != majority)
        if odd.size != 1:
            raise ValueError(
                "the last layer's gradient is not that of a single cross-entropy example "
                f"({odd.size} entries of the minority sign; expected exactly one)"
            )
        y = int(odd[0])
    else:
        y = int(label)
    others = np.delete(np.arange(n_classes), y)
    gv, vv = g[others], v[others]
    ok = gv != 0
    if ok.sum() < 2 or np.ptp(vv[ok]) == 0:
        raise ValueError("too few distinct non-label logits to fix the input's scale")
    design = np.stack([vv[ok], np.ones(int(ok.sum()))], axis=1)
    s = float(np.linalg.lstsq(design, np.log(np.abs(gv[ok])), rcond=None)[0][0])
    if s == 0.0:
        raise ValueError("the fitted input scale is zero")
    return y, [(s * v, g / s)]


def rgap(
    model: nn.Module,
    update: Update,
    label: int | float | Tensor | None = None,
    *,
    in_shape: tuple[int, int, int],
    loss: str | None = None,
    mu: float | None = None,
    solver: str = "auto",
    diagnostics: bool = False,
    fc_weight_constraints: bool = True,
) -> RGAPResult:
    """Reconstruct the input of a single-image ``update`` of ``model``.

    ``loss`` is "logistic" (the paper's binary setting, one output logit) or
    "ce" (cross-entropy over K ≥ 2 outputs); by default it is "logistic" for
    one output and "ce" otherwise. For the logistic loss ``label`` is
    y ∈ {-1, +1} (R-GAP assumes it known or read off the gradient's sign,
    §3.1.1). For cross-entropy it is the class index, or None to recover it
    from the last layer's gradient (see :func:`ce_last_layer`, which also
    derives the cross-entropy step 1). ``mu`` (logistic only) skips the
    root-finding (e.g. to follow one root only);
    otherwise every root is followed and ``candidates`` holds one image per
    root, ``image`` the one :func:`select_candidate` picks. ``diagnostics`` adds
    each layer's rank and condition number (a dense n×n Gram matrix: small nets).
    ``fc_weight_constraints=False`` uses only the gradient constraints in fully
    connected layers, as the authors' code does (Appendix F's batch case).
    ``solver``: "auto" (the fastest exact route per layer, see
    :mod:`leakagelib.rgap.solve`), "stacked" (all constraints, sparse least
    squares) or "dense" (``np.linalg.lstsq``, the authors' choice; slow).
    """
    start = time.perf_counter()
    if solver not in SOLVERS:
        raise ValueError(f"unknown solver {solver!r}; use one of {SOLVERS}")
    check_update(model, update)
    stages = chain_of(model, in_shape)
    last = stages[-1]
    if not isinstance(last.layer, nn.Linear):
        raise ValueError("R-GAP needs the network to end in an nn.Linear layer")
    if last.activation is not None and not isinstance(last.activation, nn.Identity):
        raise ValueError("the output logits must not pass through an activation")
    loss = loss or ("logistic" if last.layer.out_features == 1 else "ce")
    if loss not in LOSSES:
        raise ValueError(f"unknown loss {loss!r}; use one of {LOSSES}")
    params = {n: p for n, p in model.named_parameters()}
    weight = _numpy(params[last.weight_key])
    grad_weight = _numpy(update[last.weight_key])
    starts: list[tuple[float, np.ndarray, np.ndarray]] = []  # (μ, z_d, k_d) per candidate
    if loss == "logistic":
        if last.layer.out_features != 1:
            raise ValueError(
                "R-GAP's binary (logistic) setting needs a last nn.Linear layer with one "
                "output; use loss='ce' for several classes"
            )
        if label is None:
            raise ValueError("the logistic loss needs the label y in {-1, +1}")
        y: int | float = _signed_label(label)
        c = float(np.sum(grad_weight * weight))
        if last.bias_key is not None:
            c += float(np.sum(_numpy(update[last.bias_key]) * _numpy(params[last.bias_key])))
        mus = (float(mu),) if mu is not None else mu_roots(c)
        for m in mus:
            starts.append((m, np.array([m * y]), np.array([-y * float(expit(-m))])))
    else:
        if mu is not None:
            raise ValueError("mu applies to the logistic loss only")
        if label is not None:
            label = int(label.item() if isinstance(label, Tensor) else label)
        has_bias = last.bias_key is not None
        y, pairs = ce_last_layer(
            weight,
            grad_weight,
            _numpy(params[last.bias_key]) if has_bias else None,
            _numpy(update[last.bias_key]) if has_bias else None,
            label,
        )
        starts = [(_margin(z, int(y)), z, k) for z, k in pairs]
    candidates: list[Tensor] = []
    reports: list[list[LayerReport]] = []
    for _, out, k in starts:
        x, rep = _recurse(
            stages,
            params,
            update,
            k,
            out,
            solver=solver,
            diagnostics=diagnostics,
            fc_weight_constraints=fc_weight_constraints,
        )
        candidates.append(torch.from_numpy(x.reshape(1, *in_shape)))
        reports.append(rep)
    mus = tuple(m for m, _, _ in starts)
    best = select_candidate(candidates)
    return RGAPResult(
        image=candidates[best],
        mu=mus[best],
        layers=reports[best],
        candidates=candidates,
        mus=mus,
        seconds=time.perf_counter() - start,
        label=y,
        loss=loss,
    )
