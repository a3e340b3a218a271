"""Table 2's cells with other networks: how much of a cell's mean is the one network it drew.

A diagnosis of our records, not an experiment of the paper (Balunović et al., ICLR 2022). Each
Table 2 cell attacks the updates of one ``bayes-cnn``, drawn with the run's seed and, at step
500, trained with it (:func:`~.bayes_scenario.scenario`); its interval covers the victims, not
the network. In the pool record (:mod:`.bayes_pool`) the means of three networks of one
CIFAR-10 cell spread as far apart as some cells miss the paper by.

``bayes/table2-networks`` repeats each cell with other network seeds. A seed draws the
initialisation and, after training, the training order and the training noise; the victims,
their updates' noise and the attacks' starting images stay the cell's
(:func:`.bayes_tables.cell_offsets`), and at paper scale every attack keeps the setting A.3's
search chose for the cell in the Table 2 record (:func:`.bayes_pool.table2_settings`), so no
search runs. The Table 2 record's cell is seed 0: with seeds 1 and 2 each cell has three
networks, and :func:`.bayes_network_claims.network_cells` reads each attack's mean over them and
the Bayes attack's paired gain over each heuristic with an interval over networks and victims
(:func:`.paired.crossed_interval`). At ci scale the ci search tunes each unit on its network.

The chapter "Bayes versus heuristics under defenses" runs it beside the pool experiment and
reads its record under Table 2's.
"""

from __future__ import annotations

from .bayes_pool import cell_rows, table2_settings
from .bayes_scenario import DEFENSES
from .bayes_tables import TABLE2
from .bayes_work import networks_work
from .config import ScaleConfig
from .registry import Context, experiment

__all__ = ["NETWORKS", "table2_networks"]

#: Table 2's keys that name its cells, which this experiment lists as ``cells`` instead.
_CELLS = ("datasets", "train_steps", "defenses")

#: Table 2's cells, the pruning cells first (where the paper's claim is), the CIFAR-10 pruning
#: cells after training last (the Table 2 re-run finishes those last; a unit reads its cell's
#: settings when it starts, and stops the run while the re-run has yet to reach the cell).
_PAPER_CELLS = (
    *((d, s, f) for d in ("mnist", "cifar10") for s in (0, 500) for f in ("prune+gauss", "prune+lap")
      if (d, s) != ("cifar10", 500)),
    *((d, s, f) for d in ("mnist", "cifar10") for s in (0, 500) for f in ("gaussian", "laplacian")),
    ("cifar10", 500, "prune+gauss"), ("cifar10", 500, "prune+lap"),
)  # fmt: skip

NETWORKS = ScaleConfig(
    ci={**{k: v for k, v in TABLE2.ci.items() if k not in _CELLS},
        "cells": (("mnist", 0, "prune+gauss"),), "seeds": (1, 2), "tuned_from": "search"},
    paper={**{k: v for k, v in TABLE2.paper.items() if k not in _CELLS},
           "cells": _PAPER_CELLS, "seeds": (1, 2), "tuned_from": "bayes/table2"},
    sources={**{k: v for k, v in TABLE2.sources.items() if k not in _CELLS},
             "cells": "Table 2's sixteen cells (dataset, train step, defense); ci: the MNIST "
             "stand-in's pruning cell of the ci Table 2", "seeds": "ours: two network seeds "
             "besides the Table 2 record's (seed 0), so that each cell has three networks",
             "tuned_from": "ours: the Table 2 record's tuned settings, so that only the network "
             "changes; ci: the ci search on each unit's network"},
)  # fmt: skip


@experiment(
    "bayes/table2-networks",
    row_keys=("dataset", "step", "defense", "seed", "attack", "psnr"),
    config=NETWORKS,
    reference_source="none: a diagnosis of Table 2's records (the paper reports one network per "
    "cell)",
    datasets=("mnist", "cifar10"),
    work=networks_work,
)
def table2_networks(ctx: Context) -> list[dict]:
    """Bayes paper Table 2's record, per network: each cell on the networks of other seeds.

    One unit per (dataset, step, defense, network seed): the cell's network drawn (and at
    step 500 trained) with that seed, and every attack of the config on the cell's victims
    with the cell's settings (module docstring). Rows: ``dataset``, ``step``, ``defense``,
    ``seed``, ``attack``, ``psnr`` (mean over the victims, dB), ``psnr_per_image``,
    ``tuned``, ``tuned_from`` (``"search"``, ``"re-run"`` or ``"record"``: which Table 2
    record gave the setting) and ``update_norm`` (with ``update_norm_per_image``: each
    victim's update before the noise). Raises ``ValueError`` before any network is drawn
    for a cell that is not Table 2's, a seed 0 (the Table 2 record's own network), or a
    Table 2 record without a cell's settings; and, when a unit starts, for a cell whose
    settings the Table 2 re-run under way has yet to replace (the finished units are kept).
    """
    cfg = ctx.config
    if cfg.tuned_from not in ("search", "bayes/table2"):
        raise ValueError(f"tuned_from = {cfg.tuned_from!r}: use 'search' or 'bayes/table2'")
    steps, datasets = tuple(TABLE2.paper["train_steps"]), tuple(TABLE2.paper["datasets"])
    wrong = [
        c for c in cfg.cells if c[0] not in datasets or c[1] not in steps or c[2] not in DEFENSES
    ]
    if wrong:
        raise ValueError(
            f"cells {wrong} are not Table 2's: use (dataset, step, defense) with a dataset of "
            f"{datasets}, a step of {steps} and a defense of {', '.join(DEFENSES)}"
        )
    if cfg.tuned_from == "bayes/table2" and 0 in cfg.seeds:
        raise ValueError("seed 0 is the Table 2 record's own network: list other seeds")
    recorded = {}  # every cell's settings, read before any network is drawn
    if cfg.tuned_from == "bayes/table2":
        recorded = {c: table2_settings(*c, cfg.attacks) for c in cfg.cells}

    def unit(key: tuple[str, int, str, int]) -> list[dict]:
        cell, seed = key[:3], key[3]
        if cell in recorded:  # read again: the Table 2 re-run may have reached the cell since
            recorded[cell] = table2_settings(*cell, cfg.attacks, strict=True)
        rows, _ = cell_rows(ctx, cell, seed, recorded.get(cell))
        return [{"dataset": r["dataset"], "step": cell[1], **r} for r in rows]  # step 2nd

    keys = [(*cell, seed) for cell in cfg.cells for seed in cfg.seeds]
    return ctx.units(keys, unit, "table2-networks")
