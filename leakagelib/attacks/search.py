"""The hyper-parameter search of the Bayes paper's Appendix A.3, batched, as the authors ran it.

"The success of the different attacks is very sensitive to the choice of
their parameters" (§6), so each attack is tuned before attacks are compared.
The authors' two tuners (eth-sri/bayes-framework-leakage,
``tune_attacks_dp.py`` for the ℓ2, ℓ1 and cosine attacks and
``tune_attacks_theory.py`` for the Bayes attack, both run by
``scripts/run_mnist_tune.sh``) search a factor ``f`` in three stages; a
:class:`Tuner` says how ``f`` and the grid make an attack's
:class:`~leakagelib.attacks.config.Setting`:

1. **f on a log scale** (A.3: "values of β ... tested on logarithmic scale"),
   the other parameters at the tuners' first grid values; the mean of the
   values tied within 10⁻³ dB of the best (the tuners' sequential rule).
2. **f linearly**: twenty values over [0.5 f̄, 2 f̄] (A.3's [0.5β*, 2β*]).
3. **A grid** around the best f: :class:`HeuristicGrid` (4 · 4 · 3 · 5 · 2 =
   480 combinations) or :class:`BayesGrid` (6 · 3 · 5 · 6 = 540), the counts
   of §6.

*Heuristic tuner.* ``f`` scales the distance: the objective is
``f · D(g, ĝ) + c · TV(x)`` with ``c = 1`` (``--attack_total_variation
1.0``), so the prior weight is β = c·s/f, ``s`` being our ``-log p(g|x)``
over the authors' ``D`` (½ for the ℓ2 preset's Gaussian, 1 otherwise). Stage
1 tries f = 10⁷/2ᵏ while f > 5·10⁻⁶ (41 values): β from 10⁻⁷ to 1.1·10⁵,
A.3's range [10⁻⁷, 10⁵] (whose upper end the code passes by one halving;
we follow the code). The grid anneals β (:func:`~.optimizers.annealed`) from
c·s/(f·m_start) to c·s/(f·m_end).

*Bayes tuner.* ``f`` sets where the annealing starts: the likelihood's factor
runs from ``min(f · n², 1)`` to 1, ``n`` being the defense's first parameter
(``compute_noise_l2``: σ or b for the noise defenses, the pruning rate for
the pruned ones), with TV weight ``c`` (0.1 in stages 1–2); stage 1 tries
f = 1000/2ᵏ while f > 10⁻⁴ (24 values). So β = c throughout and
``beta_start = c / min(f n², 1)``.

Each stage runs *every* attack and every candidate as settings of one
batched program (:func:`leakagelib.attacks.attack.run_together`), on a CPU
in pieces that fit its memory, and kept as they finish so that a search
killed halfway resumes (:mod:`.programs`). Scores are
mean PSNR against the tuning images, data range 1, no clipping, as the
authors' ``compute_matching``. Used by the experiments ``bayes/table2`` and
``bayes/table5-priors`` and the chapter "Bayes versus heuristics under
defenses".
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from .. import metrics
from .attack import Attack, run_together
from .checkpoint import LoopCheckpoint, fingerprint
from .config import Setting
from .programs import Programs, piece_size
from .result import AttackResult

Update = dict[str, Tensor]
Candidates = list[tuple[str, Setting]]

__all__ = [
    "BAYES_FACTORS",
    "HEURISTIC_FACTORS",
    "BayesGrid",
    "HeuristicGrid",
    "SearchResult",
    "Tuner",
    "halvings",
    "score",
    "search",
    "stage_sizes",
]


def halvings(high: float, low: float) -> tuple[float, ...]:
    """``high``, ``high/2``, ... while above ``low``: the tuners' ``while factor > low`` loops."""
    if not high > low > 0:
        raise ValueError(f"need high > low > 0, got high={high!r}, low={low!r}")
    out, f = [], float(high)
    while f > low:
        out.append(f)
        f /= 2
    return tuple(out)


#: Stage 1 of the heuristic tuner (tune_attacks_dp.py lines 188–210): 41 factors.
HEURISTIC_FACTORS = halvings(1e7, 5e-6)
#: Stage 1 of the Bayes tuner (tune_attacks_theory.py lines 181–202): 24 factors.
BAYES_FACTORS = halvings(1e3, 1e-4)


@dataclass(frozen=True)
class HeuristicGrid:
    """tune_attacks_dp.py lines 162–169 (without Table 5's prior pairs): 480 combinations.

    ``end_factors`` (``att_total_var``) and ``start_factors`` (``att_fac_start``)
    multiply the best f at the end and the start of the annealing; the
    learning rate is the initial one times ``lr_factors``; ``weightings`` are
    ``att_exp_layers`` False and True.
    """

    end_factors: tuple[float, ...] = (1.0, 0.5, 1.5, 2.0)
    start_factors: tuple[float, ...] = (1.0, 0.5, 1.5, 2.0)
    lr_factors: tuple[float, ...] = (1.0, 0.8, 1.2)
    decays: tuple[float, ...] = (0.97, 0.95, 0.96, 0.98, 0.94)
    weightings: tuple[str, ...] = ("uniform", "exponential")

    def axes(self) -> tuple[tuple, ...]:
        """The grid's axes, in the order the tuner's ``itertools.product`` runs them."""
        return self.end_factors, self.start_factors, self.lr_factors, self.decays, self.weightings

    @property
    def size(self) -> int:
        """The number of combinations (480 with the defaults; chapter "Bayes vs heuristics")."""
        return math.prod(len(axis) for axis in self.axes())


@dataclass(frozen=True)
class BayesGrid:
    """tune_attacks_theory.py lines 162–167: 540 combinations.

    ``start_factors`` (``att_fac_start``) multiply the best f, ``prior_weights``
    are the TV weight c (``attack_total_variation``), the learning rate is the
    initial one times ``lr_factors``; ``decays`` include 1 (no decay).
    """

    start_factors: tuple[float, ...] = (1.0, 0.25, 0.5, 1.5, 2.0, 3.0)
    prior_weights: tuple[float, ...] = (0.1, 1.0, 10.0)
    lr_factors: tuple[float, ...] = (1.0, 0.5, 0.8, 1.2, 1.5)
    decays: tuple[float, ...] = (0.98, 1.0, 0.95, 0.96, 0.97, 0.94)

    def axes(self) -> tuple[tuple, ...]:
        """The grid's axes, in the order the tuner's ``itertools.product`` runs them."""
        return self.start_factors, self.prior_weights, self.lr_factors, self.decays

    @property
    def size(self) -> int:
        """The number of combinations (540 with the defaults; chapter "Bayes vs heuristics")."""
        return math.prod(len(axis) for axis in self.axes())


@dataclass(frozen=True)
class Tuner:
    """How the search varies one attack: the authors' heuristic or Bayes tuner (module docstring).

    ``factors`` are stage 1's (default: :data:`HEURISTIC_FACTORS` or
    :data:`BAYES_FACTORS`), ``refine`` stage 2's count (0 skips it), ``grid``
    stage 3 (``None`` skips it). ``lr``, ``decay``, ``prior_weight`` (c) and
    ``weighting`` are the values of stages 1–2 (the tuners' first grid
    values; defaults: 0.97 and c = 1 for the heuristic tuner, 0.98 and
    c = 0.1 for the Bayes tuner, lr 0.5 from ``--att_lr 0.5``). ``scale`` is
    ``s`` of the heuristic tuner, ``noise`` the Bayes tuner's ``n``.
    """

    kind: str = "heuristic"
    factors: tuple[float, ...] | None = None
    refine: int = 20
    grid: HeuristicGrid | BayesGrid | None = None
    lr: float = 0.5
    decay: float | None = None
    prior_weight: float | None = None
    weighting: str | None = "uniform"
    scale: float = 1.0
    noise: float = 1.0

    def __post_init__(self) -> None:
        if self.kind not in ("heuristic", "bayes"):
            raise ValueError(f"unknown tuner kind {self.kind!r}; use 'heuristic' or 'bayes'")
        want = HeuristicGrid if self.kind == "heuristic" else BayesGrid
        if self.grid is not None and not isinstance(self.grid, want):
            raise TypeError(f"the {self.kind} tuner's grid must be a {want.__name__}")
        if not self.stage1() or not all(f > 0 for f in self.stage1()):
            raise ValueError(f"factors must be positive numbers, got {self.factors!r}")
        if self.refine < 0 or not self.scale > 0 or not self.noise > 0:
            raise ValueError("refine must be >= 0, scale and noise positive")
        self.at(self.stage1()[0])  # validates lr, decay, prior weight and weighting

    def stage1(self) -> tuple[float, ...]:
        """Stage 1's factors."""
        if self.factors is not None:
            return tuple(self.factors)
        return HEURISTIC_FACTORS if self.kind == "heuristic" else BAYES_FACTORS

    def _c(self) -> float:
        default = 1.0 if self.kind == "heuristic" else 0.1
        return default if self.prior_weight is None else self.prior_weight

    def _setting(self, lr: float, decay: float, c: float, f_end: float, f_start: float,
                 weighting: str | None) -> Setting:  # fmt: skip
        """The setting whose likelihood factor anneals from ``f_start`` to ``f_end``, TV weight c."""
        if self.kind == "bayes":  # f_end is 1 and the factor starts at min(f n², 1)
            return Setting(lr, decay, c, weighting, beta_start=c / min(f_start * self.noise**2, 1))
        beta, start = c * self.scale / f_end, c * self.scale / f_start
        return Setting(lr, decay, beta, weighting, beta_start=None if start == beta else start)

    def at(self, f: float) -> Setting:
        """The setting of stages 1 and 2 at factor ``f``."""
        decay = (
            self.decay if self.decay is not None else (0.97 if self.kind == "heuristic" else 0.98)
        )
        return self._setting(self.lr, decay, self._c(), f, f, self.weighting)

    def around(self, f: float) -> list[Setting]:
        """Stage 3's settings around the best factor ``f`` (none without a grid)."""
        if self.grid is None:
            return []
        if isinstance(self.grid, BayesGrid):
            return [self._setting(self.lr * lf, d, c, 1.0, f * m, self.weighting)
                    for m, c, lf, d in itertools.product(*self.grid.axes())]  # fmt: skip
        return [self._setting(self.lr * lf, d, self._c(), f * me, f * ms, w)
                for me, ms, lf, d, w in itertools.product(*self.grid.axes())]  # fmt: skip

    def sizes(self) -> dict[str, int]:
        """Candidates per stage, stages that run only."""
        out = {"log-beta": len(self.stage1())}
        if self.refine:
            out["linear-beta"] = self.refine
        if self.grid is not None:
            out["grid"] = len(self.around(1.0))
        return out


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


def _tied_mean(factors: Sequence[float], psnr: Sequence[float]) -> tuple[float, float]:
    """Stage 1's factor: the mean of those tied with the best, by the tuners' sequential rule.

    Walking the factors in order, a PSNR within 10⁻³ of the best so far joins
    the ties and a higher one starts them anew (tune_attacks_dp.py lines
    203–208 for the heuristic attacks, tune_attacks_theory.py lines 195–200
    for the Bayes attack); NaN does neither. Returns the mean factor and the
    best PSNR.
    """
    best, tied = -np.inf, []
    for f, p in zip(factors, psnr, strict=True):
        if abs(p - best) < 1e-3:
            tied.append(f)
        elif p > best:
            best, tied = float(p), [f]
    return (float(np.mean(tied)) if tied else float(factors[0])), best


def _scores(
    cands: Candidates,
    *,
    attacks: Mapping[str, Attack],
    truth: Tensor,
    denormalize: Callable[[Tensor], Tensor],
    **options: Any,
) -> np.ndarray:
    """Candidates as one batched program: their PSNRs.

    ``options`` go to :func:`~leakagelib.attacks.attack.run_together`.
    """
    result = run_together(
        attacks=[attacks[a] for a, _ in cands], settings=[s for _, s in cands], **options
    )
    return score(result, truth, denormalize).numpy()


def _stage(
    programs: Programs,
    name: str,
    per: dict[str, list[tuple[float, Setting]]],
    *,
    rows: list[dict[str, object]],
    factor: dict[str, float],
    best: dict[str, Setting],
    best_psnr: dict[str, float],
) -> dict[str, np.ndarray]:
    """Run stage ``name`` for the attacks in ``per`` (factor, setting), a row per candidate in
    ``rows``; keep each attack's best factor, setting and PSNR; return its PSNRs per attack."""
    cands = [(a, s) for a, items in per.items() for _, s in items]
    psnr = programs.stage(cands)
    rows.extend({"stage": name, "attack": a, "lr": s.lr, "decay": s.decay, "beta": s.beta,
                 "beta_start": s.beta_start, "weighting": s.weighting or "default",
                 "psnr": float(p)} for (a, s), p in zip(cands, psnr, strict=True))  # fmt: skip
    out, lo = {}, 0
    for a, items in per.items():
        out[a], lo = psnr[lo : lo + len(items)], lo + len(items)
        i = int(np.argmax(np.nan_to_num(out[a], nan=-np.inf)))  # the first best, as the tuners
        factor[a], best[a] = items[i]
        best_psnr[a] = float(np.nan_to_num(out[a][i], nan=-np.inf))
    return out


def search(
    model: nn.Module,
    updates: Update,
    *,
    labels: Tensor,
    truth: Tensor,
    denormalize: Callable[[Tensor], Tensor],
    attacks: Mapping[str, Attack],
    tuners: Mapping[str, Tuner],
    input_shape: tuple[int, ...],
    generator: torch.Generator | None = None,
    device: str | torch.device | None = None,
    bounds: tuple[Tensor, Tensor] | None = None,
    program_attacks: int | None = None,
    checkpoint: LoopCheckpoint | None = None,
) -> SearchResult:
    """Tune every attack in ``attacks`` (name → preset) with its :class:`Tuner` on ``updates``.

    The attacks share their loop and may differ in likelihood and prior (A.4's
    priors are searched so); a grid that anneals β needs ``anneal_steps`` in
    their config. ``labels`` is ``N × n``, ``truth`` the tuning inputs ``N × n
    × ...`` in [0, 1]. The best setting is the last stage's. A stage runs as programs of
    at most ``program_attacks`` attacks (default: a stage at once on a GPU,
    :data:`~.programs.CPU_PROGRAM_ATTACKS` on a CPU; :mod:`.programs`), which
    ``checkpoint`` keeps as they finish, so that a search killed halfway resumes.
    """
    if not attacks or any(a not in tuners for a in attacks):
        raise KeyError(
            f"need attacks, each with a tuner; no tuner for {set(attacks) - set(tuners)}"
        )
    rows: list[dict[str, object]] = []  # a row per candidate tried
    gen = generator if generator is not None else torch.Generator().manual_seed(0)
    device = torch.device(device) if device is not None else next(model.parameters()).device
    size = piece_size(device, next(iter(updates.values())).shape[0], program_attacks)
    if checkpoint is not None:
        parts = [sorted(tuners.items()), sorted(attacks.items()), input_shape, size, bounds]
        checkpoint.bind(fingerprint(parts, {**updates, "truth": truth, "labels": labels}), [])
    run = partial(_scores, attacks=attacks, truth=truth, denormalize=denormalize, model=model,
                  updates=updates, labels=labels, input_shape=input_shape, bounds=bounds,
                  generator=gen, device=device)  # fmt: skip
    programs = Programs(run, gen, size, checkpoint)
    best, best_psnr, factor = {}, {}, {}  # per attack: its setting, PSNR and factor so far
    stage = partial(_stage, programs, rows=rows, factor=factor, best=best, best_psnr=best_psnr)

    with programs.guard():
        per = {a: [(f, tuners[a].at(f)) for f in tuners[a].stage1()] for a in attacks}
        first = stage("log-beta", per)
        refined = [a for a in attacks if tuners[a].refine]
        for a in refined:  # the tuners refine around the mean of the tied factors
            factor[a] = _tied_mean([f for f, _ in per[a]], first[a].tolist())[0]
        if refined:
            ts = {a: np.arange(tuners[a].refine) / tuners[a].refine for a in refined}
            stage("linear-beta", {a: [(f, tuners[a].at(f)) for f in factor[a] * (2 * ts[a] + 0.5 * (1 - ts[a]))]
                                  for a in refined})  # fmt: skip
        grids = {a: [(factor[a], s) for s in tuners[a].around(factor[a])] for a in attacks}
        if any(grids.values()):
            stage("grid", {a: items for a, items in grids.items() if items})
        programs.finish()
    return SearchResult(best=best, best_psnr=best_psnr, rows=rows)


def stage_sizes(tuners: Sequence[Tuner]) -> dict[str, int]:
    """Candidates per stage that :func:`search` runs for attacks with ``tuners``.

    The values are the settings of its batched programs, in order
    (``"log-beta"``, ``"linear-beta"``, ``"grid"``), stages no tuner runs left
    out: with the authors' tuners 41 + 20 + 480 for a heuristic attack and
    24 + 20 + 540 for the Bayes attack. Counted before a run for
    ``campaign``'s estimates (:mod:`leakagelib.experiments.bayes_work`).
    """
    sizes: dict[str, int] = {}
    for t in tuners:
        for stage, n in t.sizes().items():
            sizes[stage] = sizes.get(stage, 0) + n
    return sizes
