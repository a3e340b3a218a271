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

Each stage runs *every* attack (a preset of :mod:`.presets`; they share the
loop and differ in likelihood and prior) and every candidate as settings of
one batched program (:func:`leakagelib.attacks.attack.run_together`). Scores are mean PSNR of
reconstructions against the tuning images, with data range 1 and no
clipping, as the authors' ``compute_matching`` computes it. Used by the
experiment ``bayes/table2`` and the chapter "Bayes versus heuristics under
defenses".
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from .. import metrics
from .attack import Attack, run_together
from .config import Setting
from .result import AttackResult

Update = dict[str, Tensor]
Candidates = list[tuple[str, Setting]]

__all__ = ["Grid", "SearchResult", "log_beta_grid", "score", "search", "stage_sizes"]


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
    H, (N, n) = result.num_settings, result.per_update().shape[:2]
    if tuple(truth.shape[:2]) != (N, n):
        raise ValueError(f"truth must be {N} × {n} × ..., got {tuple(truth.shape)}")
    rec = denormalize(torch.cat([result.inputs(h) for h in range(H)]).cpu())
    ref = truth.reshape(N * n, *truth.shape[2:]).cpu().repeat(H, *([1] * (truth.dim() - 2)))
    return metrics.psnr(rec, ref).reshape(H, N * n).mean(1)


def _best(cands: Candidates, psnr: np.ndarray, name: str) -> tuple[Setting, float]:
    """``name``'s candidate with the highest PSNR (NaN counts as −∞) and that PSNR."""
    idx = [i for i, (a, _) in enumerate(cands) if a == name]
    i_best = idx[int(np.argmax(np.nan_to_num(psnr[idx], nan=-np.inf)))]
    return cands[i_best][1], float(np.nan_to_num(psnr[i_best], nan=-np.inf))


def _log_beta(cands: Candidates, psnr: np.ndarray, name: str, refine: bool) -> tuple[float, float]:
    """Stage 1's β for ``name`` and its PSNR; the authors average tied β before refining them."""
    betas = np.array([s.beta for a, s in cands if a == name])
    ps = np.nan_to_num(
        np.array([p for (a, _), p in zip(cands, psnr, strict=True) if a == name]), nan=-np.inf
    )
    ties = np.abs(ps - ps.max()) < 1e-3
    beta = float(np.mean(betas[ties])) if refine else float(betas[int(ps.argmax())])
    return beta, float(ps.max())


def _weightings_of(
    name: str, grid: Grid, weightings: Mapping[str, Sequence[str]] | None
) -> tuple[str, ...]:
    """The layer weightings stage 3 tries for attack ``name``: its own if given, else the grid's."""
    return tuple(weightings[name]) if weightings and name in weightings else grid.weightings


def _grid(
    attacks: Mapping[str, Attack],
    best_beta: Mapping[str, float],
    grid: Grid,
    weightings: Mapping[str, Sequence[str]] | None,
) -> Candidates:
    """Stage 3's candidates: the grid around each attack's β, its own lr and the grid's decays."""
    cands = []
    for a, attack in attacks.items():
        base = attack.config.setting()
        for lf, dec, bf, w in itertools.product(
            grid.lr_factors, grid.decays, grid.beta_factors, _weightings_of(a, grid, weightings)
        ):
            cands.append((a, Setting(base.lr * lf, dec, best_beta[a] * bf, w)))
    return cands


def _run_stage(
    stage: str,
    cands: Candidates,
    *,
    attacks: Mapping[str, Attack],
    truth: Tensor,
    denormalize: Callable[[Tensor], Tensor],
    rows: list[dict[str, object]],
    **options: Any,
) -> np.ndarray:
    """One stage's candidates as one batched program: PSNR per candidate, a row each in ``rows``.

    ``options`` go to :func:`~leakagelib.attacks.attack.run_together`.
    """
    result = run_together(
        attacks=[attacks[a] for a, _ in cands], settings=[s for _, s in cands], **options
    )
    psnr = score(result, truth, denormalize).numpy()
    rows.extend(
        {
            "stage": stage,
            "attack": a,
            "lr": s.lr,
            "decay": s.decay,
            "beta": s.beta,
            "weighting": s.weighting or "default",
            "psnr": float(p),
        }
        for (a, s), p in zip(cands, psnr, strict=True)
    )
    return psnr


def search(
    model: nn.Module,
    updates: Update,
    *,
    labels: Tensor,
    truth: Tensor,
    denormalize: Callable[[Tensor], Tensor],
    attacks: Mapping[str, Attack],
    input_shape: tuple[int, ...],
    betas: Sequence[float] | None = None,
    refine: int = 20,
    grid: Grid | None = None,
    weightings: Mapping[str, Sequence[str]] | None = None,
    generator: torch.Generator | None = None,
    device: str | torch.device | None = None,
    bounds: tuple[Tensor, Tensor] | None = None,
) -> SearchResult:
    """Tune every attack in ``attacks`` (name → preset) on the stacked ``updates``.

    The attacks share their loop and may differ in likelihood and prior (so
    that priors, e.g. A.4's TV + pixel range for several φ, are searched too);
    each starts from its own lr, decay and layer weighting. ``labels`` is
    ``N × n``, ``truth`` the tuning inputs ``N × n × ...`` in [0, 1].
    ``betas`` defaults to :func:`log_beta_grid`; ``refine`` is the number of
    linear β values of stage 2 (0 skips it); ``grid`` is stage 3 (``None``
    skips it). ``weightings`` restricts the layer weightings per attack (the
    paper tunes the weighting only for the heuristic attacks).
    """
    if not attacks:
        raise ValueError("search needs at least one attack")
    rows: list[dict[str, object]] = []
    gen = generator if generator is not None else torch.Generator().manual_seed(0)
    run = partial(
        _run_stage, attacks=attacks, truth=truth, denormalize=denormalize, rows=rows, model=model,
        updates=updates, labels=labels, input_shape=input_shape, bounds=bounds, generator=gen,
        device=device,
    )  # fmt: skip

    def at(beta: float, a: str) -> Setting:
        return replace(attacks[a].config.setting(), beta=float(beta))

    betas = log_beta_grid() if betas is None else betas
    cands = [(a, at(b, a)) for a in attacks for b in betas]
    psnr = run("log-beta", cands)
    found = {a: _log_beta(cands, psnr, a, refine > 0) for a in attacks}
    best = {a: at(beta, a) for a, (beta, _) in found.items()}
    best_psnr = {a: p for a, (_, p) in found.items()}
    if refine > 0:
        ts = np.arange(refine) / refine
        cands = [(a, at(best[a].beta * (2 * t + 0.5 * (1 - t)), a)) for a in attacks for t in ts]
        psnr = run("linear-beta", cands)
        for a in attacks:
            best[a], best_psnr[a] = _best(cands, psnr, a)
    if grid is not None:
        cands = _grid(attacks, {a: s.beta for a, s in best.items()}, grid, weightings)
        psnr = run("grid", cands)
        for a in attacks:
            best[a], best_psnr[a] = _best(cands, psnr, a)
    return SearchResult(best=best, best_psnr=best_psnr, rows=rows)


def stage_sizes(
    attacks: Sequence[str],
    *,
    betas: Sequence[float] | None = None,
    refine: int = 20,
    grid: Grid | None = None,
    weightings: Mapping[str, Sequence[str]] | None = None,
) -> dict[str, int]:
    """Candidates per stage that :func:`search` runs for the attacks named ``attacks``.

    The arguments are :func:`search`'s; stages it skips are left out, so the
    values are the settings of its batched programs, in order
    (``"log-beta"``, ``"linear-beta"``, ``"grid"``). With the defaults and
    :class:`Grid` that is 41 + 20 + 120 per heuristic attack and 41 + 20 + 60
    for one restricted to uniform weighting. Counted before a run for
    ``campaign``'s estimates (:mod:`leakagelib.experiments.bayes_work`).
    """
    sizes = {"log-beta": len(attacks) * len(log_beta_grid() if betas is None else betas)}
    if refine > 0:
        sizes["linear-beta"] = len(attacks) * refine
    if grid is not None:
        per = len(grid.lr_factors) * len(grid.decays) * len(grid.beta_factors)
        sizes["grid"] = sum(per * len(_weightings_of(a, grid, weightings)) for a in attacks)
    return sizes
