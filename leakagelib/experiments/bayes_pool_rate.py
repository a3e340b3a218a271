"""The cosine attack's learning rate on the pool record's networks (``bayes/table2-pool-rate``).

A diagnosis of our records, not an experiment of the paper (Balunović et al., ICLR 2022). In
the record of ``bayes/table2-pool`` (:mod:`.bayes_pool`) the smaller share of the pool leaves
every network leakier to the Bayes, ℓ2 and ℓ1 attacks, while the cosine attack's mean falls
on some networks. The cosine's tuned rate (0.6 in both cells of the Table 2 record) sits just
below the rates at which it fails, and a network that moves its landscape a little can push it
past them. This experiment attacks each pool record network again with the cosine alone, at
its tuned setting with the learning rate scaled by each of ``rate_factors``, so that the
smaller pool's paired change can be read at a rate that suits both networks.

Everything else is the pool experiment's: per (defense, network seed) the cell's ``bayes-cnn``
trained on each share of its pool (:func:`.bayes_scenario.scenario`, the cell's 100 victims
kept out of it), the cell's tuned setting (at paper scale the Table 2 record's,
:func:`.bayes_pool.table2_settings`; at ci scale the ci search's on the unit's first share) and
the cell's generators (:func:`.bayes_tables.cell_offsets`). It attacks the first
``rate_victims`` of the victims, every rate as one batched program.

The probe that led to it (2026-12-07, one thread, commit 310c103; the first 20 victims of each
cell, the cell's tuned setting with only the rate changed, rates of 0.25 to 4 times the tuned
one in one program) measured the smaller share's paired change at the tuned rate and at half of
it. Gaussian, seeds 0, 1, 2: −1.12, −2.58, −0.36 dB at the rate; +1.50 (95 % interval 0.77 to
2.23), +1.19 (−0.08 to 2.46), +1.43 (0.71 to 2.15) at half. Laplacian: +0.28, +1.32, +1.09 at
the rate; +2.15 (1.64 to 2.66), +3.27 (2.79 to 3.75), +0.93 (0.53 to 1.33) at half. Half the
rate scores about as well as the rate on the whole pool's networks (within 0.6 dB, but
Laplacian seed 2: 18.85 against 16.24 dB) and better on every smaller-pool network; at twice
the rate every network scores lower, the smaller pool's 9.0 to 12.9 dB (16.9 to 18.6 at the
rate). So the cosine's fall belongs to its tuned rate, near which the smaller pool's networks
stop the attack from converging, not to the pool: at half the rate the cosine, like the other
three attacks, leaks more on the smaller pool (five of the six intervals above zero).

The chapter "Bayes versus heuristics under defenses" runs it beside the pool experiment and
reads its record with :func:`.bayes_pool_claims.pool_rate_text`.
"""

from __future__ import annotations

from dataclasses import asdict, replace

from ..attacks.config import Setting
from .bayes_pool import POOL, check_settings, table2_settings
from .bayes_scenario import make_defense, scenario, table2_attacks, training_pool, tune
from .bayes_tables import TABLE2, cell_offsets
from .bayes_work import pool_rate_work
from .case import build_case
from .config import ScaleConfig
from .registry import Context, experiment

__all__ = ["RATE", "table2_pool_rate"]

RATE = ScaleConfig(
    ci={**POOL.ci, "rate_factors": (0.5, 1.0, 2.0), "rate_victims": POOL.ci["victims"]},
    paper={**POOL.paper, "rate_factors": (0.5, 1.0, 2.0), "rate_victims": 20},
    sources={**POOL.sources, "rate_factors": "ours: the tuned learning rate, half and twice it",
             "rate_victims": "ours: the first 20 of the cell's victims (the cosine groups ten "
             "at a time, so two of its groups); ci: every victim"},
)  # fmt: skip


def _rate_rows(ctx: Context, name: str, seed: int, tuned: Setting | None) -> list[dict]:
    """The unit (``name``, ``seed``) of :func:`table2_pool_rate`: for each share of the pool, the
    cosine at every rate on the first ``rate_victims`` victims of the share's network."""
    cfg, rows = ctx.config, []
    victims_offset, search_offset = cell_offsets(TABLE2.paper, cfg.dataset, cfg.train_step, name)
    for pool in cfg.pools:
        model, victims = scenario(ctx, cfg.dataset, cfg.train_step, cfg.victims, defense=name,
                                  pool=pool, seed=seed)  # fmt: skip
        n, defense = cfg.rate_victims, make_defense(name, seed=ctx.seed)
        case = build_case(model, victims.images[:n], victims.labels[:n], victims.normalizer,
                          defense=defense, device=ctx.device,
                          generator=ctx.generator(victims_offset))  # fmt: skip
        cosine = table2_attacks(defense, ["cosine"], steps=cfg.steps, anneal_steps=cfg.anneal_steps,
                                cosine_group=cfg.cosine_group)["cosine"]  # fmt: skip
        if tuned is None:  # ci: the ci search on the first share's network
            found = tune(ctx, case, {"cosine": cosine}, offset=search_offset, defense=name)
            tuned = found.best["cosine"]
        names = [f"cosine, lr ×{f:g}" for f in cfg.rate_factors]
        settings = [replace(tuned, lr=tuned.lr * f) for f in cfg.rate_factors]
        result = case.attack([cosine] * len(names), settings=settings, names=names,
                             generator=ctx.generator(search_offset + 1),
                             checkpoint=ctx.checkpoint())  # fmt: skip
        images = len(training_pool(ctx, cfg.dataset, victims, pool=pool, seed=seed)[1])
        for factor, label, setting in zip(cfg.rate_factors, names, settings, strict=True):
            psnr = case.score_images(case.reconstructions(result, label), "psnr")
            rows.append({"dataset": cfg.dataset, "defense": name, "seed": seed, "pool": pool,
                         "pool_images": images, "attack": label, "rate_factor": factor,
                         "lr": setting.lr,
                         "psnr": float(psnr.mean()), "psnr_per_image": psnr.tolist(),
                         "tuned": asdict(setting)})  # fmt: skip
    return rows


@experiment(
    "bayes/table2-pool-rate",
    row_keys=("defense", "seed", "pool", "attack", "rate_factor", "psnr"),
    config=RATE,
    reference_source="none: a diagnosis of the pool record (the paper trains on 50,000 images)",
    datasets=("cifar10",),
    work=pool_rate_work,
)
def table2_pool_rate(ctx: Context) -> list[dict]:
    """Bayes paper Table 2's pool record, diagnosed: the cosine at other learning rates.

    One unit per (defense, network seed), as ``bayes/table2-pool``'s: for each share of
    ``pools`` the cell's network trained on that share, and the cosine attack at its tuned
    setting with the rate times each of ``rate_factors`` on the first ``rate_victims``
    victims (module docstring). Rows: ``dataset``, ``defense``, ``seed``, ``pool``,
    ``pool_images``, ``attack`` (``"cosine, lr ×0.5"``, ...), ``rate_factor``, ``lr``,
    ``psnr`` (mean over the victims, dB),
    ``psnr_per_image`` and ``tuned`` (the setting attacked with). Raises ``ValueError``
    before any network is trained for a setting it cannot run.
    """
    cfg = check_settings(ctx.config)  # the pool experiment's settings
    if 1.0 not in cfg.rate_factors or not all(f > 0 for f in cfg.rate_factors):
        raise ValueError(
            f"rate_factors = {cfg.rate_factors}: each must be above 0, and 1.0 (the tuned rate) "
            "among them"
        )
    if not 0 < cfg.rate_victims <= cfg.victims:
        raise ValueError(f"rate_victims = {cfg.rate_victims}: use 1 to victims ({cfg.victims})")
    recorded = {}  # every cell's cosine setting, read before any network is trained
    if cfg.tuned_from == "bayes/table2":
        recorded = {d: table2_settings(cfg.dataset, cfg.train_step, d, ["cosine"])[0]["cosine"]
                    for d in cfg.defenses}  # fmt: skip

    def unit(key: tuple[str, int]) -> list[dict]:
        return _rate_rows(ctx, *key, recorded.get(key[0]))

    keys = [(name, seed) for name in cfg.defenses for seed in cfg.seeds]
    return ctx.units(keys, unit, "table2-pool-rate")
