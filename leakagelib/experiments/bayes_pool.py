"""Why Table 2's step-500 CIFAR-10 cells sit above the paper: the step-500 network's training pool.

A diagnosis of our records, not an experiment of the paper (Balunović et al., ICLR 2022).
The paper trains its "step 500" networks on the training set, 50,000 images; the
records in ``results/`` were made offline on a sample of the test set, so the CIFAR-10
network trains on the images of the sample's training split that are not victims (300
of CIFAR-10's test images 0–499), cycled in 500 steps of one image
(:func:`~.bayes_scenario.scenario`). The record's Gaussian and Laplacian step-500 cells on
CIFAR-10 sit above the paper's (the chapter reads by how much). This experiment asks whether fewer distinct training images leave the network leakier:
for each network seed it trains the cell's network on the whole pool and on a share of
it, and attacks the same victims with the same settings from the same starting images,
so that the pool's size is the only difference (a paired comparison over the victims).

* **Settings.** At paper scale every attack keeps the setting A.3's search chose for the
  cell in the Table 2 record (``tuned_from = "bayes/table2"``: the re-run under way, else
  the finished record; :func:`table2_settings`), so no search runs and the attacks are the
  cell's own. At ci scale (the stand-in ``patches``, which has no Table 2 record at step
  500) the ci search of :mod:`.bayes_tables` tunes them on the unit's first pool.
* **Seeds.** A network seed draws the initialisation, the shuffle that picks the share,
  the training order and the training noise. The victims, their updates' noise and the
  attacks' starting images use the generators of the Table 2 cell at paper scale
  (:func:`.bayes_tables.cell_offsets`), so that the whole pool with the run's seed is the
  cell's training and attack again. The record's cell was made at an earlier commit
  (2ddb0ec), before changes that keep each result up to float rounding (PyTorch's fused
  Adam kernel in training, 08436a9; the cosine's sums as an einsum, 06f7acd), so the runs
  differ in their last bits, which 200 attack steps amplify image by image; the means agree
  within their paired intervals (``tests/test_bayes_pool.py`` checks the two records).

*The cosine's learning rate.* In the record the cosine attack is the one whose mean falls on
some smaller-pool networks; its tuned rate sits just below the rates at which it fails, and
``bayes/table2-pool-rate`` (:mod:`.bayes_pool_rate`) attacks these networks again at half,
once and twice that rate (its docstring has the probe that led to it).

The chapter "Bayes versus heuristics under defenses" runs it and shows its record where
Table 2's CIFAR-10 cells miss the paper, read by :mod:`.bayes_pool_claims`: what the smaller
share changes, and the whole pool's networks together beside the paper's cells.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict

from .. import gradients
from ..attacks.config import Setting
from .bayes_scenario import (
    DEFENSES,
    make_defense,
    scenario,
    table2_attacks,
    training_pool,
    tune,
)
from .bayes_tables import TABLE2, cell_offsets
from .bayes_work import pool_work
from .case import build_case
from .config import ScaleConfig, Settings
from .registry import Context, experiment

__all__ = [
    "DATASETS",
    "POOL",
    "cell_rows",
    "check_settings",
    "table2_pool",
    "table2_settings",
    "table2_sources",
]

#: Table 2's keys that name its cells, which this experiment sets itself.
_CELLS = ("datasets", "train_steps", "defenses")

#: Table 2's datasets, whose cells this experiment may take.
DATASETS = tuple(TABLE2.paper["datasets"])


def _table2(values: dict) -> dict:
    """Table 2's settings (search, attacks, scenario) without the keys that list its cells."""
    return {k: v for k, v in values.items() if k not in _CELLS}


POOL = ScaleConfig(
    ci={**_table2(TABLE2.ci), "dataset": "cifar10", "train_step": 500, "defenses": ("gaussian",),
        "pools": (1.0, 0.5), "seeds": (0, 1), "tuned_from": "search"},
    paper={**_table2(TABLE2.paper), "dataset": "cifar10", "train_step": 500,
           "defenses": ("gaussian", "laplacian"), "pools": (1.0, 0.5), "seeds": (0, 1, 2),
           "tuned_from": "bayes/table2"},
    sources={**_table2(TABLE2.sources), "dataset": "the Table 2 cells above the paper "
             "(module docstring)", "train_step": "Table 2's 'Train step 500'",
             "defenses": "the CIFAR-10 step-500 cells of the Table 2 record that sit above the "
             "paper (Gaussian, Laplacian); ci: Gaussian", "pools": "ours: the whole pool and "
             "half of it", "seeds": "ours: three network seeds; ci: two",
             "tuned_from": "ours: the Table 2 record's tuned settings, so that only the network "
             "changes; ci: the ci search (no ci record of a step-500 cell)"},
)  # fmt: skip


def table2_settings(
    dataset: str, step: int, defense: str, attacks: Sequence[str], *, strict: bool = False
) -> tuple[dict[str, Setting], str]:
    """Each attack's tuned setting in the Table 2 record's cell, and which record gave it.

    The re-run under way (``results/bayes-table2.json.partial``) comes first, as it
    follows the experiment as it is now; else the finished record. Raises ``ValueError``
    naming the cell when neither has it, before anything is trained. ``strict`` refuses the
    finished record's settings while a re-run is under way that has not reached the cell:
    the re-run will replace them, and a network attacked with them would not pair with the
    cell's own (``bayes/table2-networks`` reads each unit's settings so, when it starts).
    """
    from ..reporting import rerun_record, results_record

    for read, name in ((rerun_record, "re-run"), (results_record, "record")):
        record, _ = read("bayes/table2")
        if strict and name == "record" and rerun_record("bayes/table2")[0] is not None:
            raise ValueError(
                f"the Table 2 re-run under way has not yet run the cell ({dataset}, step {step}, "
                f"{defense}), and its settings will replace the finished record's: resume "
                "`bayes/table2` at paper scale until it has, then resume this run"
            )
        rows = [r for r in (record or {}).get("rows", [])
                if (r["dataset"], r["step"], r["defense"]) == (dataset, step, defense)
                and r["attack"] in attacks and "tuned" in r]  # fmt: skip
        if {r["attack"] for r in rows} == set(attacks):
            return {r["attack"]: Setting(**r["tuned"]) for r in rows}, name
    raise ValueError(
        f"the Table 2 record has no tuned settings for {list(attacks)} in the cell "
        f"({dataset}, step {step}, {defense}): run `bayes/table2` at paper scale first, or set "
        "tuned_from to 'search'"
    )


def table2_sources() -> dict[str, list[dict]]:
    """The Table 2 rows each ``tuned_from`` of a row names (:func:`table2_settings`'s second
    value), for :func:`.bayes_network_claims.network_cells` to pair a network's rows with their
    cell: ``"re-run"``, the re-run under way, or, once it finished, the record it became;
    ``"record"``, the finished record (whose settings a row tuned from an earlier record no
    longer matches, which ``network_cells`` refuses). The chapter "Bayes versus heuristics
    under defenses" and ``tests/test_bayes_networks.py`` read them so."""
    from ..reporting import rerun_record, results_record

    record = (results_record("bayes/table2")[0] or {}).get("rows", [])
    rerun, _ = rerun_record("bayes/table2")
    return {"re-run": record if rerun is None else rerun["rows"], "record": record}


def check_settings(cfg: Settings) -> Settings:
    """``cfg`` of :func:`table2_pool` (or of :mod:`.bayes_pool_rate`, which shares its settings),
    checked before any network is trained: ``tuned_from``, the shares of ``pools`` (the whole
    pool among them, as the cell's own network), a Table 2 cell, known defenses. Raises
    ``ValueError`` naming the setting."""
    if cfg.tuned_from not in ("search", "bayes/table2"):
        raise ValueError(f"tuned_from = {cfg.tuned_from!r}: use 'search' or 'bayes/table2'")
    if 1.0 not in cfg.pools or not all(0.0 < p <= 1.0 for p in cfg.pools):
        raise ValueError(
            f"pools = {cfg.pools}: each share must be in (0, 1], and the whole pool (1.0) among "
            "them, as the cell's own network"
        )
    steps = tuple(TABLE2.paper["train_steps"])
    if cfg.train_step not in steps or cfg.dataset not in DATASETS:
        raise ValueError(
            f"({cfg.dataset}, step {cfg.train_step}) is not a cell of Table 2: use a dataset "
            f"of {DATASETS} and a step of {steps}"
        )
    unknown = [d for d in cfg.defenses if d not in DEFENSES]
    if unknown:
        raise ValueError(f"unknown defenses {unknown}; use some of {', '.join(DEFENSES)}")
    return cfg


def cell_rows(
    ctx: Context,
    cell: tuple[str, int, str],
    seed: int,
    tuned: tuple[dict[str, Setting], str] | None,
    *,
    pool: float = 1.0,
) -> tuple[list[dict], tuple[dict[str, Setting], str]]:
    """Table 2's ``cell`` (dataset, step, defense) again with the network of ``seed`` trained on
    the share ``pool`` of its pool: one row per attack of the config, and the settings the
    attacks took, ``tuned`` (setting per attack, its source) or at ``None`` the ci search's on
    this network. The victims, their noise and the attacks' starting images are the cell's
    (:func:`.bayes_tables.cell_offsets`). Rows: ``dataset``, ``defense``, ``seed``, ``attack``,
    ``psnr``, ``psnr_per_image``, ``tuned``, ``tuned_from``, ``update_norm`` and
    ``update_norm_per_image``; :func:`table2_pool` and :mod:`.bayes_networks` add their keys."""
    cfg, (dataset, step, name) = ctx.config, cell
    victims_offset, search_offset = cell_offsets(TABLE2.paper, dataset, step, name)
    model, victims = scenario(ctx, dataset, step, cfg.victims, defense=name, pool=pool, seed=seed)
    defense = make_defense(name, seed=ctx.seed)
    case = build_case(model, *victims, defense=defense, device=ctx.device,
                      generator=ctx.generator(victims_offset))  # fmt: skip
    attacks = table2_attacks(defense, cfg.attacks, steps=cfg.steps, anneal_steps=cfg.anneal_steps,
                             cosine_group=cfg.cosine_group)  # fmt: skip
    if tuned is None:
        tuned = (tune(ctx, case, attacks, offset=search_offset, defense=name).best, "search")
    names, (settings, source) = list(cfg.attacks), tuned
    result = case.attack([attacks[a] for a in names], settings=[settings[a] for a in names],
                         names=names, generator=ctx.generator(search_offset + 1),
                         checkpoint=ctx.checkpoint())  # fmt: skip
    inputs = victims.normalizer.normalize(victims.images).to(ctx.device)
    updates = gradients.per_sample_updates(model, inputs, victims.labels.to(ctx.device))
    norms = gradients.per_sample_norms(updates).cpu()
    rows = []
    for a in names:
        psnr = case.score_images(case.reconstructions(result, a), "psnr")
        rows.append({"dataset": dataset, "defense": name, "seed": seed, "attack": a,
                     "psnr": float(psnr.mean()), "psnr_per_image": psnr.tolist(),
                     "tuned": asdict(settings[a]), "tuned_from": source,
                     "update_norm": float(norms.mean()), "update_norm_per_image": norms.tolist()})  # fmt: skip
    return rows, tuned


def _pool_rows(
    ctx: Context, name: str, seed: int, pool: float, tuned: tuple[dict[str, Setting], str] | None
) -> tuple[list[dict], tuple[dict[str, Setting], str]]:
    """The rows of one share ``pool`` in the unit (``name``, ``seed``) of :func:`table2_pool`
    (:func:`cell_rows` with the share and how many distinct images it holds)."""
    cfg = ctx.config
    rows, tuned = cell_rows(ctx, (cfg.dataset, cfg.train_step, name), seed, tuned, pool=pool)
    victims = ctx.dataset(cfg.dataset, cfg.victims, split="train", shuffle=False)
    images = len(training_pool(ctx, cfg.dataset, victims, pool=pool, seed=seed)[1])
    keys = ("dataset", "defense", "seed")
    return [{**{k: r[k] for k in keys}, "pool": pool, "pool_images": images,
             **{k: v for k, v in r.items() if k not in keys}} for r in rows], tuned  # fmt: skip


@experiment(
    "bayes/table2-pool",
    row_keys=("defense", "seed", "pool", "attack", "psnr"),
    config=POOL,
    reference_source="none: a diagnosis of Table 2's records (the paper trains on 50,000 images)",
    datasets=("cifar10",),
    work=pool_work,
)
def table2_pool(ctx: Context) -> list[dict]:
    """Bayes paper Table 2's record, diagnosed: the step-500 network trained on a share of its pool.

    One unit per (defense, network seed): for each share of ``pools`` the
    network of the cell trained on that share of its pool under the defense,
    and every attack of the config on the same victims with the same settings
    (module docstring; at ci tuned on the unit's first share). Rows:
    ``dataset``, ``defense``, ``seed`` (the network's), ``pool`` (the share),
    ``pool_images`` (how many distinct images it trained on), ``attack``,
    ``psnr`` (mean over the victims, dB), ``psnr_per_image``, ``tuned`` (the
    setting), ``tuned_from`` (``"search"``, or which Table 2 record gave
    it: ``"re-run"`` or ``"record"``), and ``update_norm`` (with
    ``update_norm_per_image``): the norm of each victim's update before the
    defense's noise, which sets how much of it the noise hides.
    """
    cfg = check_settings(ctx.config)
    recorded = {}  # every cell's settings, read before any network is trained
    if cfg.tuned_from == "bayes/table2":
        recorded = {d: table2_settings(cfg.dataset, cfg.train_step, d, cfg.attacks)
                    for d in cfg.defenses}  # fmt: skip

    def unit(key: tuple[str, int]) -> list[dict]:
        rows, tuned = [], recorded.get(key[0])
        for pool in cfg.pools:
            found, tuned = _pool_rows(ctx, *key, pool, tuned)
            rows += found
        return rows

    keys = [(name, seed) for name in cfg.defenses for seed in cfg.seeds]
    return ctx.units(keys, unit, "table2-pool")
