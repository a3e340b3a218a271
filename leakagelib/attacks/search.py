"""The hyper-parameter search of the Bayes paper's Appendix A.3, batched.

"The success of the different attacks is very sensitive to the choice of
their parameters" (§6), so each attack is tuned before attacks are compared:

1. **β on a log scale.** With the other parameters at their initial values,
   try prior weights β from 10⁷ down to 5·10⁻⁶, halving each time (the
   authors' code, eth-sri/bayes-framework-leakage, tune_attacks_dp.py), and
   keep β* with the highest PSNR (the mean of ties).
2. **β linearly.** Twenty values spread over [0.5 β*, 2 β*].
3. **A grid** over learning-rate factors (1, 0.8, 1.2), decay factors
   (0.97, 0.95, 0.96, 0.98, 0.94), β factors (1, 0.5, 1.5, 2) and — for the
   heuristic attacks — layer weighting (uniform, exponential): 480
   combinations (values from the same script).

Each stage runs *every* attack and every candidate as settings of one
batched program (:func:`leakagelib.attacks.loop.run_attack` with one
likelihood per setting). Scores are mean PSNR of de-normalised
reconstructions against the tuning images, with data range 1 and no
clipping, as the authors' ``compute_matching`` computes it. Used by the
experiment ``bayes/table2`` and the chapter "Bayes versus heuristics under
defenses".
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor, nn

from .. import metrics
from .likelihoods import Likelihood
from .loop import AttackConfig, AttackResult, Setting, run_attack
from .priors import Prior

Update = dict[str, Tensor]

__all__ = ["Grid", "SearchResult", "log_beta_grid", "score", "search"]


def log_beta_grid(high: float = 1e7, low: float = 5e-6, factor: float = 2.0) -> list[float]:
    """β values from ``high`` down to ``low`` (inclusive), divided by ``factor`` each time."""
    if not high > low > 0 or not factor > 1:
        raise ValueError("need high > low > 0 and factor > 1")
    out, b = [], float(high)
    while b >= low * (1 - 1e-9):
        out.append(b)
        b /= factor
    return out


@dataclass(frozen=True)
class Grid:
    """Stage 3's grid: multipliers of lr and β, decay factors and layer weightings."""

    lr_factors: tuple[float, ...] = (1.0, 0.8, 1.2)
    decays: tuple[float, ...] = (0.97, 0.95, 0.96, 0.98, 0.94)
    beta_factors: tuple[float, ...] = (1.0, 0.5, 1.5, 2.0)
    weightings: tuple[str, ...] = ("uniform", "exponential")


@dataclass
class SearchResult:
    """Best setting and PSNR per attack, and every tried (attack, setting, psnr) row."""

    best: dict[str, Setting]
    best_psnr: dict[str, float]
    rows: list[dict[str, object]] = field(default_factory=list)


def score(result: AttackResult, truth: Tensor, denormalize: Callable[[Tensor], Tensor]) -> Tensor:
    """Mean PSNR over updates and images for each setting (shape ``H``), in float64.

    ``truth`` is ``N × n × ...`` in [0, 1]; reconstructions are de-normalised
    with ``denormalize`` and compared without clipping (data range 1).
    """
    H, N, n = result.images.shape[:3]
    if tuple(truth.shape[:2]) != (N, n):
        raise ValueError(f"truth must be {N} × {n} × ..., got {tuple(truth.shape)}")
    rec = denormalize(result.images.reshape(H * N * n, *result.images.shape[3:]).cpu())
    ref = truth.reshape(N * n, *truth.shape[2:]).cpu().repeat(H, *([1] * (truth.dim() - 2)))
    return metrics.psnr(rec, ref).reshape(H, N * n).mean(1)


def _run(
    model,
    updates,
    labels,
    truth,
    denormalize,
    attacks,
    prior,
    config,
    cands,
    input_shape,
    gen,
    device,
    bounds,
) -> Tensor:
    """One batched program over ``cands`` = [(attack name, Setting)]; PSNR per candidate."""
    result = run_attack(
        model,
        updates,
        labels=labels,
        num_images=labels.shape[1],
        input_shape=input_shape,
        likelihood=[attacks[a] for a, _ in cands],
        prior=[prior[a] if isinstance(prior, Mapping) else prior for a, _ in cands],
        config=config,
        settings=[s for _, s in cands],
        bounds=bounds,
        generator=gen,
        device=device,
    )
    return score(result, truth, denormalize)


def search(
    model: nn.Module,
    updates: Update,
    *,
    labels: Tensor,
    truth: Tensor,
    denormalize: Callable[[Tensor], Tensor],
    attacks: Mapping[str, Likelihood],
    prior: Prior | Mapping[str, Prior],
    config: AttackConfig,
    input_shape: tuple[int, ...],
    betas: Sequence[float] | None = None,
    refine: int = 20,
    grid: Grid | None = None,
    weightings: Mapping[str, Sequence[str]] | None = None,
    generator: torch.Generator | None = None,
    device: str | torch.device | None = None,
    bounds: tuple[Tensor, Tensor] | None = None,
) -> SearchResult:
    """Tune every attack in ``attacks`` (name → likelihood) on the stacked ``updates``.

    ``prior`` is one prior for all attacks or a prior per attack name (so that
    priors, e.g. A.4's TV + pixel range for several φ, are searched too).

    ``labels`` is ``N × n``, ``truth`` the tuning inputs ``N × n × ...`` in
    [0, 1]. ``betas`` defaults to :func:`log_beta_grid`; ``refine`` is the
    number of linear β values of stage 2 (0 skips it); ``grid`` is stage 3
    (``None`` skips it). ``weightings`` restricts the layer weightings per
    attack (the paper tunes the weighting only for the heuristic attacks).
    """
    if not attacks:
        raise ValueError("search needs at least one attack")
    gen = generator if generator is not None else torch.Generator().manual_seed(0)
    betas = list(betas) if betas is not None else log_beta_grid()
    args = (model, updates, labels, truth, denormalize, attacks, prior, config)
    tail = (input_shape, gen, device, bounds)
    rows: list[dict[str, object]] = []

    def run_stage(stage: str, cands: list[tuple[str, Setting]]) -> np.ndarray:
        psnr = _run(*args, cands, *tail).numpy()
        for (a, s), p in zip(cands, psnr, strict=True):
            rows.append(
                {
                    "stage": stage,
                    "attack": a,
                    "lr": s.lr,
                    "decay": s.decay,
                    "beta": s.beta,
                    "weighting": s.weighting or "default",
                    "psnr": float(p),
                }
            )
        return psnr

    base = config.setting()
    names = list(attacks)
    cands = [(a, Setting(base.lr, base.decay, b, base.weighting)) for a in names for b in betas]
    psnr = run_stage("log-beta", cands)
    best_beta: dict[str, float] = {}
    best_psnr: dict[str, float] = {}
    for a in names:
        ps = np.array([p for (name, _), p in zip(cands, psnr, strict=True) if name == a])
        ps = np.nan_to_num(ps, nan=-np.inf)
        best_psnr[a] = float(ps.max())
        # the authors average tied β values before refining them linearly
        ties = np.abs(ps - ps.max()) < 1e-3
        best_beta[a] = (
            float(np.mean(np.array(betas)[ties])) if refine > 0 else betas[int(ps.argmax())]
        )
    if refine > 0:
        ts = np.arange(refine) / refine
        cands = [
            (
                a,
                Setting(
                    base.lr,
                    base.decay,
                    float(best_beta[a] * (2 * t + 0.5 * (1 - t))),
                    base.weighting,
                ),
            )
            for a in names
            for t in ts
        ]
        psnr = np.nan_to_num(run_stage("linear-beta", cands), nan=-np.inf)
        for a in names:
            idx = [i for i, (name, _) in enumerate(cands) if name == a]
            i_best = idx[int(np.argmax(psnr[idx]))]
            best_beta[a], best_psnr[a] = cands[i_best][1].beta, float(psnr[i_best])
    best = {a: Setting(base.lr, base.decay, best_beta[a], base.weighting) for a in names}
    if grid is not None:
        cands = []
        for a in names:
            ws = tuple(weightings[a]) if weightings and a in weightings else grid.weightings
            for lf, dec, bf, w in itertools.product(
                grid.lr_factors, grid.decays, grid.beta_factors, ws
            ):
                cands.append((a, Setting(base.lr * lf, dec, best_beta[a] * bf, w)))
        psnr = np.nan_to_num(run_stage("grid", cands), nan=-np.inf)
        for a in names:
            idx = [i for i, (name, _) in enumerate(cands) if name == a]
            i_best = idx[int(np.argmax(psnr[idx]))]
            best[a], best_psnr[a] = cands[i_best][1], float(psnr[i_best])
    return SearchResult(best=best, best_psnr=best_psnr, rows=rows)
