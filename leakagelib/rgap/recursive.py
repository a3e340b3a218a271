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
``mu_fit="adam"`` replaces the exact root by the authors' Adam fit in float32
(:func:`~leakagelib.rgap.mu.mu_adam`), the "reference" mode of Tables 1–2.

**Cross-entropy with a recovered label.** For K classes only step 1 changes —
finding k_d and z_d, the label read off the gradient —, see
:func:`~leakagelib.rgap.last_layer.ce_last_layer`; steps 2–3 are the same recursion.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from ..attacks.result import AttackResult
from ..gradients import Update, check_update
from .chain import Stage, chain_of, inverse
from .constraints import (
    layer_constraints,
    weight_matrix,
)
from .last_layer import LOSSES, Start, ce_last_layer, margin, signed_label
from .losses import MARGIN_LOSSES, margin_starts
from .mu import mu_adam
from .solve import SOLVERS, exact_rank, solve_layer

#: How step 1 finds μ: exactly (root-finding, float64) or as the authors' code (Adam, float32).
MU_FITS = ("exact", "adam")

__all__ = ["MU_FITS", "SOLVERS", "LayerReport", "RGAPDetails", "rgap", "select_candidate"]


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
class RGAPDetails:
    """What R-GAP found for one update: its image, and every μ-candidate (real and twin) it followed.

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
        sol = solve_layer(system, k, solver)
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


def _chain(
    model: nn.Module, in_shape: tuple[int, int, int], loss: str | None
) -> tuple[list[Stage], str]:
    """The model's stages, checked to end in a linear layer R-GAP can start from; and the loss."""
    stages = chain_of(model, in_shape)
    last = stages[-1]
    if not isinstance(last.layer, nn.Linear):
        raise ValueError("R-GAP needs the network to end in an nn.Linear layer")
    if last.activation is not None and not isinstance(last.activation, nn.Identity):
        raise ValueError("the output logits must not pass through an activation")
    loss = loss or ("logistic" if last.layer.out_features == 1 else "ce")
    if loss not in LOSSES:
        raise ValueError(f"unknown loss {loss!r}; use one of {LOSSES}")
    if loss in MARGIN_LOSSES and last.layer.out_features != 1:
        raise ValueError(
            f"R-GAP's binary ({loss}) setting needs a last nn.Linear layer with one "
            "output; use loss='ce' for several classes"
        )
    return stages, loss


def _starts(
    last: Stage,
    params: dict[str, Tensor],
    update: Update,
    label: int | float | Tensor | None,
    loss: str,
    mu: float | None,
    mu_fit: str = "exact",
) -> tuple[int | float, list[Start]]:
    """Step 1 (:mod:`.last_layer`): the label used and every (μ, z_d, k_d) that fits.

    ``mu_fit="adam"`` (logistic loss) takes the one μ the authors' Adam fit reaches.
    """
    weight = _numpy(params[last.weight_key])
    grad_weight = _numpy(update[last.weight_key])
    if loss in MARGIN_LOSSES:
        if label is None:
            raise ValueError(f"the {loss} loss needs the label y in {{-1, +1}}")
        y = signed_label(label, loss)
        c = float(np.sum(grad_weight * weight))
        if last.bias_key is not None:
            c += float(np.sum(_numpy(update[last.bias_key]) * _numpy(params[last.bias_key])))
        if mu_fit == "adam" and loss != "logistic":
            raise ValueError("mu_fit='adam' (the authors' fit) applies to the logistic loss only")
        if mu is None and mu_fit == "adam":
            mu = mu_adam(c)
        return y, margin_starts(loss, c, y, mu)
    if mu is not None or mu_fit != "exact":
        raise ValueError("mu and mu_fit apply to the margin losses only")
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
    return y, [(margin(z, int(y)), z, k) for z, k in pairs]


def _attack_one(
    stages: list[Stage],
    params: dict[str, Tensor],
    update: Update,
    label: int | float | Tensor | None,
    *,
    in_shape: tuple[int, int, int],
    loss: str,
    mu: float | None,
    mu_fit: str,
    **recursion: Any,
) -> RGAPDetails:
    """R-GAP on one single-image update: step 1, then the recursion from every start.

    ``recursion`` holds :func:`_recurse`'s ``solver``, ``diagnostics`` and
    ``fc_weight_constraints``.
    """
    start = time.perf_counter()
    y, starts = _starts(stages[-1], params, update, label, loss, mu, mu_fit)
    candidates: list[Tensor] = []
    reports: list[list[LayerReport]] = []
    for _, out, k in starts:
        x, rep = _recurse(stages, params, update, k, out, **recursion)
        candidates.append(torch.from_numpy(x.reshape(1, *in_shape)))
        reports.append(rep)
    mus = tuple(m for m, _, _ in starts)
    best = select_candidate(candidates)
    return RGAPDetails(
        image=candidates[best],
        mu=mus[best],
        layers=reports[best],
        candidates=candidates,
        mus=mus,
        seconds=time.perf_counter() - start,
        label=y,
        loss=loss,
    )


def _label_list(labels: Tensor | Sequence[int | float] | None, n: int) -> list:
    """One label (or None) per update, checked against the number of updates."""
    if labels is None:
        return [None] * n
    if isinstance(labels, (int, float)) or (isinstance(labels, Tensor) and labels.dim() == 0):
        raise ValueError(
            f"labels must hold one label per update, got the single value {labels!r}; "
            "for one update pass a list or tensor of one label, e.g. [1]"
        )
    if isinstance(labels, Tensor):
        labels = labels.reshape(-1)
    if len(labels) != n:
        raise ValueError(
            f"labels must hold one label per update ({n}), got {len(labels)}; "
            "pass labels=None to recover cross-entropy labels from the updates"
        )
    return list(labels)


def _check_choices(solver: str, mu_fit: str) -> None:
    """Raise ``ValueError`` naming an unknown ``solver`` or ``mu_fit``."""
    if solver not in SOLVERS:
        raise ValueError(f"unknown solver {solver!r}; use one of {SOLVERS}")
    if mu_fit not in MU_FITS:
        raise ValueError(f"unknown mu_fit {mu_fit!r}; use one of {MU_FITS}")


def rgap(
    model: nn.Module,
    updates: Update,
    labels: Tensor | Sequence[int | float] | None = None,
    *,
    input_shape: tuple[int, int, int],
    loss: str | None = None,
    mu: float | None = None,
    mu_fit: str = "exact",
    solver: str = "auto",
    diagnostics: bool = False,
    fc_weight_constraints: bool = True,
) -> AttackResult:
    """R-GAP on every single-image update of the stacked ``updates`` (leading dimension N).

    ``loss`` is "logistic" (the paper's binary setting, one logit; "exponential",
    "hinge": Figure 1's, :mod:`leakagelib.rgap.losses`) or "ce" (K ≥ 2 outputs);
    by default it is "logistic" for one output and "ce" otherwise. ``labels`` holds one label per update: for
    the logistic loss y ∈ {-1, +1} (R-GAP assumes it known or read off the
    gradient's sign, §3.1.1); for cross-entropy the class index, or
    ``labels=None`` to recover each from its update's last layer (see
    :func:`~leakagelib.rgap.last_layer.ce_last_layer`). ``mu`` (logistic
    only) skips the root-finding for every update (e.g. to follow one root
    only). ``mu_fit``: "exact" (every root, to machine precision) or "adam" (the
    authors' float32 Adam fit, :func:`~leakagelib.rgap.mu.mu_adam`). ``diagnostics`` adds each layer's rank and condition number (a
    dense n×n Gram matrix: small nets). ``fc_weight_constraints=False`` uses
    only the gradient constraints in fully connected layers, as the authors'
    code does (Appendix F's batch case). ``solver``: "auto" (the fastest exact
    route per layer, see :mod:`leakagelib.rgap.solve`), "stacked" (all
    constraints, sparse least squares) or "dense" (``np.linalg.lstsq``, the
    authors' choice; slow).

    The updates' systems differ, so they are solved one after the other. The
    :class:`~leakagelib.attacks.AttackResult` has one setting, restart and input
    per update: ``inputs()`` the N×C×H×W float64 reconstructions, ``objective``
    the largest relative residual of a layer's system, ``labels`` (1×N×1) the
    label each update used, ``details`` one :class:`RGAPDetails` per update
    (per-layer reports and rank certificates, every μ-root's candidate, seconds).
    """
    _check_choices(solver, mu_fit)
    n = check_update(model, updates, stacked=True)
    per_update = _label_list(labels, n)
    stages, loss = _chain(model, input_shape, loss)
    params = {name: p for name, p in model.named_parameters()}
    step1 = {"in_shape": input_shape, "loss": loss, "mu": mu, "mu_fit": mu_fit}
    recursion = dict(solver=solver, diagnostics=diagnostics)
    recursion["fc_weight_constraints"] = fc_weight_constraints
    details = [
        _attack_one(
            stages, params, {k: v[i] for k, v in updates.items()}, label, **step1, **recursion
        )
        for i, label in enumerate(per_update)
    ]
    residual = [max(layer.residual for layer in found.layers) for found in details]
    return AttackResult.one_per_update(
        torch.cat([found.image for found in details]).reshape(n, *input_shape),
        torch.tensor(residual, dtype=torch.float64),
        labels=torch.tensor([int(found.label) for found in details]),
        details=details,
    )
