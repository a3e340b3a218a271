"""The scenario and search plumbing shared by the Bayes paper's image experiments (:mod:`.bayes_tables`).

* :data:`DEFENSES` — Table 2's four noise defenses, and :data:`ATTACKS`, its
  four attacks by preset id;
* :data:`SCENARIO` — the settings of the attacked scenario every experiment
  of :mod:`.bayes_tables` shares (data stand-ins and resolution at ci scale,
  training of the "step 500" networks), merged into each experiment's config;
* :func:`scenario` — the network at a training step and the victims;
* :func:`tune` and :func:`attack_tuned` — A.3's search on the first victims,
  then every victim attacked with the tuned settings in one batched program.

Used by Tables 2 and 5 and Fig. 7 of the Bayes paper (Balunović et al., ICLR
2022) and the chapter "Bayes versus heuristics under defenses".
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np
import torch
import torch.nn.functional as F
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
    "attack_tuned",
    "data_notes",
    "gray_baseline",
    "make_defense",
    "paired_gap",
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

#: MNIST and CIFAR-10 (and their stand-ins) have ten classes.
NUM_CLASSES = 10

#: The scenario's settings, shared by the experiments of :mod:`.bayes_tables`: at ci scale the
#: 8×8 ``digits`` stand for MNIST and every image is average-pooled to 8×8 when larger (the
#: module docstring of :mod:`.bayes_tables` says why); training for the "step 500" rows.
SCENARIO = ScaleConfig(
    ci={"stand_ins": {"mnist": "digits"}, "resolution": 8, "train_lr": 1e-3, "train_batch": 1},
    paper={"stand_ins": {}, "resolution": None, "train_lr": 1e-3, "train_batch": 1},
    sources={
        "stand_ins": "the paper's MNIST and CIFAR-10 (torchvision) at paper scale",
        "resolution": "the data's own: MNIST 1×28×28, CIFAR-10 3×32×32",
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
    once for every attack; ``bayes`` gets ``defense.likelihood()``.
    """
    unknown = [a for a in names if a not in ATTACKS]
    if unknown:
        raise KeyError(f"unknown attacks {unknown}; use {list(ATTACKS)}")
    prior = TotalVariation(power=2)
    matched = {"bayes": {"likelihood": defense.likelihood()}} if "bayes" in names else {}
    return {a: preset(a, steps=steps, prior=prior, **matched.get(a, {})) for a in names}


def _load(ctx: Context, logical: str, n: int | None, *, shuffle: bool) -> Dataset:
    """``n`` images of ``logical``'s training split, at the config's ``resolution`` (see :data:`SCENARIO`)."""
    cfg = ctx.config
    stand_in = cfg.stand_ins.get(logical)
    ds = ctx.dataset(logical, n, split="train", shuffle=shuffle, stand_in=stand_in)
    if cfg.resolution is None or max(ds.images.shape[-2:]) <= cfg.resolution:
        return ds
    return replace(ds, images=F.adaptive_avg_pool2d(ds.images, cfg.resolution))


def scenario(ctx: Context, logical: str, train_step: int, n: int) -> tuple[nn.Module, Dataset]:
    """``bayes-cnn`` (seeded LeCun-normal init) trained for ``train_step`` steps, and ``n`` victims.

    The victims are the first ``n`` images of the training split (§6: "the
    first 100 images of the training set"); training uses the rest of that
    split, shuffled (the victims excluded by their indices, so the network
    never trains on an image it is attacked on), with the config's
    ``train_lr`` and ``train_batch``.
    """
    cfg = ctx.config
    victims = _load(ctx, logical, n, shuffle=False)
    torch.manual_seed(ctx.seed)
    model = build("bayes-cnn", tuple(victims.images.shape[1:]), NUM_CLASSES)
    if train_step > 0:
        pool = _load(ctx, logical, None, shuffle=True)
        keep = ~torch.isin(pool.indices, victims.indices)
        images, labels = pool.images[keep], pool.labels[keep]
        model = fl.train(model, victims.normalizer.normalize(images), labels, steps=train_step,
                         batch_size=cfg.train_batch, lr=cfg.train_lr, seed=ctx.seed).model  # fmt: skip
    return model.to(ctx.device).eval(), victims


def data_notes(ctx: Context, datasets: Sequence[str]) -> dict[str, str]:
    """What the record's ``data`` field says of ``datasets`` when ``resolution`` resizes them."""
    cfg, size = ctx.config, ctx.config.resolution
    if size is None:
        return {}
    return {
        logical: f"{ctx.resolve(logical, cfg.stand_ins.get(logical))} at {size}×{size} "
        f"(average-pooled where larger), with {logical}'s normalisation; victims: the first "
        "images of the train split, training: the rest of it"
        for logical in datasets
    }


def tune(ctx: Context, case: Case, attacks: dict[str, Attack], *, offset: int) -> SearchResult:
    """A.3's search (:func:`~leakagelib.attacks.search.search`) for every attack on ``case``.

    It runs on the first ``tune_victims`` victims with the config's ``betas``,
    ``refine`` and ``grid``; the Bayes attack keeps uniform layer weights (§6
    tunes the weighting only for the heuristic attacks). ``found.best_psnr``
    is each attack's *tuning* score, which chooses between variants (Table
    5's φ) without looking at the scored images.
    """
    cfg, head = ctx.config, case.first(ctx.config.tune_victims)
    return search(
        head.model, head.updates, labels=head.labels.unsqueeze(1), truth=head.images.unsqueeze(1),
        denormalize=head.normalizer.denormalize, attacks=attacks, input_shape=head.input_shape,
        betas=cfg.betas, refine=cfg.refine, grid=cfg.grid, weightings={"bayes": ("uniform",)},
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
    sit near this line (the chapter "Bayes versus heuristics under defenses").
    """
    return metrics.psnr(torch.full_like(images, float(images.mean())), images)


def summarise_table2(rows: Sequence[dict]) -> dict:
    """``{(dataset, defense, step): {attack: psnr}}`` from Table 2 rows (for chapters and tests)."""
    out: dict = {}
    for r in rows:
        out.setdefault((r["dataset"], r["defense"], r["step"]), {})[r["attack"]] = r["psnr"]
    return out


def paired_gap(rows: Sequence[dict], key: tuple, a: str, b: str) -> tuple[float, float]:
    """Mean and standard error of the per-image PSNR difference ``a − b`` for one Table 2 cell."""
    per = {
        r["attack"]: np.array(r["psnr_per_image"])
        for r in rows
        if (r["dataset"], r["defense"], r["step"]) == key
    }
    diff = per[a] - per[b]
    return float(diff.mean()), float(diff.std(ddof=1) / math.sqrt(len(diff)))
