"""The scenario and search plumbing shared by the Bayes paper's image experiments (:mod:`.bayes_tables`).

* :data:`DEFENSES` — Table 2's four noise defenses, and :data:`ATTACKS`, its
  four attacks by preset id;
* :data:`SCENARIO` — the settings of the attacked scenario every experiment
  of :mod:`.bayes_tables` shares (training of the "step 500" networks),
  merged into each experiment's config;
* :func:`scenario` — the network at a training step and the victims;
* :func:`tune` and :func:`attack_tuned` — A.3's search on the first victims,
  then every victim attacked with the tuned settings in one batched program;
* :func:`paired_interval` — the paired comparison over images with which the
  chapters assert the paper's claims.

Used by Tables 2 and 5 and Fig. 7 of the Bayes paper (Balunović et al., ICLR
2022) and the chapters "Bayes versus heuristics under defenses" and
"Breaking heuristic defenses".
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from scipy import stats
from torch import Tensor, nn

from .. import fl, metrics
from ..attacks import Attack, TotalVariation, preset
from ..attacks.search import SearchResult, search
from ..data import Dataset
from ..defenses import GaussianNoise, GradientDefense, LaplaceNoise, PruneNoise
from ..models import build
from .case import Case
from .config import ScaleConfig
from .registry import Context

__all__ = [
    "ATTACKS",
    "DEFENSES",
    "SCENARIO",
    "TUNED_WEIGHTINGS",
    "PairedGap",
    "attack_tuned",
    "gray_baseline",
    "make_defense",
    "paired_gap",
    "paired_interval",
    "scenario",
    "summarise_table2",
    "table2_attacks",
    "tune",
]

#: Table 2's defenses: name → constructor taking the seed of the pruning mask (σ = b = 0.1,
#: keep probability 0.5, §6).
DEFENSES: dict[str, Callable[[int], GradientDefense]] = {
    "gaussian": lambda seed: GaussianNoise(0.1),
    "laplacian": lambda seed: LaplaceNoise(0.1),
    "prune+gauss": lambda seed: PruneNoise("gaussian", 0.1, keep=0.5, mask_seed=seed),
    "prune+lap": lambda seed: PruneNoise("laplace", 0.1, keep=0.5, mask_seed=seed),
}

#: Table 2's attacks by preset id (:data:`leakagelib.attacks.PRESETS`), as its rows name them:
#: the Bayes attack with the defense's likelihood and the heuristic ℓ2, ℓ1 and cosine distances.
ATTACKS = ("bayes", "l2", "l1", "cosine")

#: The layer weightings A.3's grid tries per attack where it does not try the grid's both: the
#: Bayes attack keeps uniform weights (§6 tunes the weighting for the ℓ2, ℓ1 and cosine attacks).
TUNED_WEIGHTINGS: dict[str, tuple[str, ...]] = {"bayes": ("uniform",)}

#: MNIST and CIFAR-10 (and their stand-ins) have ten classes.
NUM_CLASSES = 10

#: The scenario's settings, shared by the experiments of :mod:`.bayes_tables`: training for the
#: "step 500" rows. The data are the run's (:meth:`Context.dataset`): MNIST and CIFAR-10 at paper
#: scale, their embedded stand-ins ``digits28`` (1×28×28) and ``patches`` (3×32×32) at ci scale,
#: each at its own resolution.
SCENARIO = ScaleConfig(
    ci={"train_lr": 1e-3, "train_batch": 1},
    paper={"train_lr": 1e-3, "train_batch": 1},
    sources={
        "train_lr": "the authors' scripts/run_mnist_tune.sh: -lr 0.001 (Adam)",
        "train_batch": "the authors' scripts/run_mnist_tune.sh: --batch_size 1",
    },
)


def make_defense(name: str, seed: int = 0) -> GradientDefense:
    """A fresh Table 2 defense by name (a key of :data:`DEFENSES`); ``seed`` draws pruning masks."""
    if name not in DEFENSES:
        raise KeyError(f"unknown defense {name!r}; use one of {', '.join(DEFENSES)}")
    return DEFENSES[name](seed)


def table2_attacks(
    defense: GradientDefense, names: Sequence[str], *, steps: int
) -> dict[str, Attack]:
    """The presets ``names`` (ids of :data:`ATTACKS`) against ``defense``, ``steps`` steps each.

    All share one TV prior object, so that the batched program evaluates it
    once for every attack; ``bayes`` gets ``defense.likelihood()``. The prior
    is the Bayes authors' TV in their convention (squared differences summed
    over each image, ``utils/measures.py``), so the β grids searched over it
    (A.3) are the paper's numbers as written.
    """
    unknown = [a for a in names if a not in ATTACKS]
    if unknown:
        raise KeyError(f"unknown attacks {unknown}; use {list(ATTACKS)}")
    prior = TotalVariation(power=2, reduction="sum")
    matched = {"bayes": {"likelihood": defense.likelihood()}} if "bayes" in names else {}
    return {a: preset(a, steps=steps, prior=prior, **matched.get(a, {})) for a in names}


def scenario(ctx: Context, logical: str, train_step: int, n: int) -> tuple[nn.Module, Dataset]:
    """``bayes-cnn`` (seeded LeCun-normal init) trained for ``train_step`` steps, and ``n`` victims.

    The victims are the first ``n`` images of the training split (§6: "the
    first 100 images of the training set"); training uses the rest of that
    split, shuffled (the victims excluded by their indices, so the network
    never trains on an image it is attacked on), with the config's
    ``train_lr`` and ``train_batch``.
    """
    cfg = ctx.config
    victims = ctx.dataset(logical, n, split="train", shuffle=False)
    torch.manual_seed(ctx.seed)
    model = build("bayes-cnn", tuple(victims.images.shape[1:]), NUM_CLASSES)
    if train_step > 0:
        pool = ctx.dataset(logical, split="train", shuffle=True)
        keep = ~torch.isin(pool.indices, victims.indices)
        images, labels = pool.images[keep], pool.labels[keep]
        model = fl.train(model, victims.normalizer.normalize(images), labels, steps=train_step,
                         batch_size=cfg.train_batch, lr=cfg.train_lr, seed=ctx.seed).model  # fmt: skip
    return model.to(ctx.device).eval(), victims


def tune(ctx: Context, case: Case, attacks: dict[str, Attack], *, offset: int) -> SearchResult:
    """A.3's search (:func:`~leakagelib.attacks.search.search`) for every attack on ``case``.

    It runs on the first ``tune_victims`` victims with the config's ``betas``,
    ``refine`` and ``grid``; the Bayes attack keeps uniform layer weights
    (:data:`TUNED_WEIGHTINGS`). ``found.best_psnr``
    is each attack's *tuning* score, which chooses between variants (Table
    5's φ) without looking at the scored images.
    """
    cfg, head = ctx.config, case.first(ctx.config.tune_victims)
    return search(
        head.model, head.updates, labels=head.labels.unsqueeze(1), truth=head.images.unsqueeze(1),
        denormalize=head.normalizer.denormalize, attacks=attacks, input_shape=head.input_shape,
        betas=cfg.betas, refine=cfg.refine, grid=cfg.grid, weightings=TUNED_WEIGHTINGS,
        generator=ctx.generator(offset), device=ctx.device, bounds=head.bounds,
    )  # fmt: skip


def attack_tuned(
    ctx: Context, case: Case, attacks: dict[str, Attack], found: SearchResult, *, offset: int
) -> dict[str, Tensor]:
    """Every attack with its tuned setting on all victims of ``case``, as one batched program.

    Returns attack name → per-victim PSNR (de-normalised, data range 1, no clipping).
    """
    names = list(attacks)
    result = case.attack([attacks[a] for a in names], settings=[found.best[a] for a in names],
                         names=names, generator=ctx.generator(offset + 1))  # fmt: skip
    return {a: case.score(result, "psnr", a) for a in names}


def gray_baseline(images: Tensor) -> Tensor:
    """Per-image PSNR of one constant image at the images' mean value: what learning nothing scores.

    An attack's PSNR means little without it; at ci scale the step-500 attacks
    of Table 5 sit near this line (the chapter "Bayes versus heuristics under
    defenses").
    """
    return metrics.psnr(torch.full_like(images, float(images.mean())), images)


def summarise_table2(rows: Sequence[dict]) -> dict:
    """``{(dataset, defense, step): {attack: psnr}}`` from Table 2 rows (for chapters and tests)."""
    out: dict = {}
    for r in rows:
        out.setdefault((r["dataset"], r["defense"], r["step"]), {})[r["attack"]] = r["psnr"]
    return out


@dataclass(frozen=True)
class PairedGap:
    """The mean of per-image differences ``a − b`` and its two-sided Student-t interval."""

    mean: float
    low: float
    high: float
    n: int


def paired_interval(a: Sequence[float], b: Sequence[float], confidence: float = 0.95) -> PairedGap:
    """The mean per-image difference ``a − b`` with its ``confidence`` interval (Student's t).

    ``a`` and ``b`` are one value per image (PSNRs of two attacks, or of one
    attack in two settings, on the same images), so the interval is that of
    a paired comparison. The chapters on the Bayes paper assert their claims
    as ``paired_interval(...).low > 0``.
    """
    diff = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    if diff.ndim != 1 or len(a) != len(b) or len(diff) < 2:
        raise ValueError(
            "a and b must be equally long lists of at least two values (one per image), "
            f"got lengths {len(a)} and {len(b)}"
        )
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), e.g. 0.95, got {confidence}")
    n, mean = len(diff), float(diff.mean())
    half = float(stats.t.ppf(0.5 + confidence / 2, n - 1) * diff.std(ddof=1) / math.sqrt(n))
    return PairedGap(mean, mean - half, mean + half, n)


def paired_gap(rows: Sequence[dict], key: tuple, a: str, b: str) -> PairedGap:
    """:func:`paired_interval` of attacks ``a`` and ``b`` in the Table 2 cell ``key``
    (``(dataset, defense, step)``)."""
    per = {
        r["attack"]: r["psnr_per_image"]
        for r in rows
        if (r["dataset"], r["defense"], r["step"]) == key
    }
    return paired_interval(per[a], per[b])
