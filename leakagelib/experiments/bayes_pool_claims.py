"""What ``bayes/table2-pool`` (:mod:`.bayes_pool`) says about Table 2's record, read off its rows.

:func:`pool_gains` pairs each network's smaller share of the pool with its whole pool on the
same victims, and :func:`pool_text` reads those gains in words beside the Table 2 record's
excess over the paper; :func:`pool_repeats_cell` checks that the whole pool with the run's
seed repeats the Table 2 cell; :func:`pool_cells` and :func:`pool_cells_text` set the whole
pool's networks, all seeds together, beside the paper's cells, with an interval that counts
the networks' spread as well as the images' (:func:`.paired.crossed_interval`);
:func:`pool_rate_text` reads ``bayes/table2-pool-rate``, the cosine at other rates; and
:func:`placed` counts where the paper's numbers lie against such intervals (which
:mod:`.bayes_network_claims` shares). The chapter
"Bayes versus heuristics under defenses" glues them under its Table 2 record, and
``tests/test_bayes_pool.py`` checks them.
"""

from __future__ import annotations

from collections.abc import Sequence

from .paired import PairedGap, crossed_interval, paired_interval

__all__ = [
    "placed",
    "pool_cells",
    "pool_cells_text",
    "pool_gains",
    "pool_rate_text",
    "pool_repeats_cell",
    "pool_text",
]


def pool_gains(rows: Sequence[dict]) -> dict[tuple[str, int, str], PairedGap]:
    """``bayes/table2-pool`` (:mod:`.bayes_pool`): per (defense, network seed, attack) the
    smallest share of the pool against the whole, on the same victims (a positive gap: the
    network trained on fewer distinct images leaks more)."""
    smallest = min(r["pool"] for r in rows)
    by = {(r["defense"], r["seed"], r["attack"], r["pool"]): r for r in rows}
    return {
        (d, s, a): paired_interval(by[d, s, a, smallest]["psnr_per_image"], r["psnr_per_image"])
        for (d, s, a, share), r in by.items()
        if share == 1.0 and (d, s, a, smallest) in by and smallest < 1.0
    }


def pool_rate_text(rows: Sequence[dict], note: str) -> str:
    """The chapter's paragraph on ``bayes/table2-pool-rate`` (:mod:`.bayes_pool_rate`): per
    rate and defense, the smaller share's paired change in the cosine's mean over the network
    seeds (:func:`pool_gains`); at which rate each network scores highest; and at which rates
    the smaller share's mean rises on every network, which says whether the cosine's fall at
    its tuned rate in the pool record belongs to the rate. Numbers read, never typed."""
    gains = pool_gains(rows)
    if not gains:
        return f"The rate record{note} has no unit with both shares of the pool yet."
    factor = {r["attack"]: r["rate_factor"] for r in rows}
    labels = sorted(dict.fromkeys(k[2] for k in gains), key=factor.__getitem__)
    parts = []
    for label in labels:
        per = []
        for d in dict.fromkeys(k[0] for k in gains):
            mine = [g for k, g in gains.items() if (k[0], k[2]) == (d, label)]
            low, high = min(g.mean for g in mine), max(g.mean for g in mine)
            change = f"{low:+.2f}" if len(mine) == 1 else f"{low:+.2f} to {high:+.2f}"
            per.append(f"{d} {change} dB (above zero on {sum(g.low > 0 for g in mine)} of "
                       f"{len(mine)})")  # fmt: skip
        parts.append(f"at {factor[label]:g}× its tuned rate " + ", ".join(per))
    text = (
        f"In the rate record{note}, on the first {next(iter(gains.values())).n} victims of "
        "each network, the smaller share of the pool changes the cosine attack's mean PSNR by "
        "(paired, over the network seeds): " + "; ".join(parts) + "."
    )
    best: dict[tuple[str, int, float], dict] = {}
    for r in rows:
        key = (r["defense"], r["seed"], r["pool"])
        best[key] = r if key not in best or r["psnr"] > best[key]["psnr"] else best[key]
    smallest = min(r["pool"] for r in rows)
    for share, whose in ((1.0, "the whole pool's"), (smallest, "the smaller pool's")):
        tops = [r["rate_factor"] for k, r in best.items() if k[2] == share]
        counted = ", ".join(f"{f:g}× on {tops.count(f)}" for f in sorted(set(tops)))
        text += f" Best rate of {whose} {len(tops)} network{'s' * (len(tops) > 1)}: {counted}."
    rising = [factor[b] for b in labels if all(g.mean > 0 for k, g in gains.items() if k[2] == b)]
    if not rising:
        return text + " At no rate does the smaller share's mean rise on every network."
    text += (
        f" At {', '.join(f'{f:g}×' for f in rising)} the tuned rate the smaller share's mean "
        "rises on every network"
    )
    if 1.0 in rising:
        return text + "."
    return text + ": where the cosine falls at its tuned rate, the fall belongs to the rate."


def pool_repeats_cell(
    pool: Sequence[dict], table2: Sequence[dict]
) -> dict[tuple[str, str], PairedGap]:
    """Per (defense, attack), the whole pool's rows with the run's seed (0) of a
    ``bayes/table2-pool`` record against the Table 2 record's cell on the same victims: the
    same training, settings and starting images again, so each paired interval should hold
    zero (image by image the two differ by float rounding that the attack amplifies;
    :mod:`.bayes_pool`). Raises ``ValueError`` where a cell is missing or took another setting."""
    cells = {(r["defense"], r["attack"]): r for r in table2
             if (r["dataset"], r["step"]) == ("cifar10", 500)}  # fmt: skip
    gaps = {}
    for row in (r for r in pool if r["pool"] == 1.0 and r["seed"] == 0):
        key = (row["defense"], row["attack"])
        if key not in cells or cells[key]["tuned"] != row["tuned"]:
            raise ValueError(f"the Table 2 record has no cell {key} with the pool row's setting")
        gaps[key] = paired_interval(row["psnr_per_image"], cells[key]["psnr_per_image"])
    return gaps


def pool_text(rows: Sequence[dict], note: str, excess: dict[tuple[str, str], float]) -> str:
    """The chapter's paragraph on the pool record: per defense and attack, the paired change
    that the smallest share of the pool makes over the network seeds, beside ``excess``
    ((defense, attack) → the Table 2 record's mean minus the paper's in the same cell), and
    the spread of the whole pool's networks over the seeds. Numbers read, never typed."""
    gains = pool_gains(rows)
    if not gains:
        return f"The pool record{note} has no unit with both shares of the pool yet."
    smallest = min(r["pool"] for r in rows)
    images = {share: sorted({r["pool_images"] for r in rows if r["pool"] == share})
              for share in (smallest, 1.0)}  # fmt: skip
    seeds = sorted({k[1] for k in gains})
    per_defense: dict[str, list[str]] = {}
    for d, a in dict.fromkeys((k[0], k[2]) for k in gains):
        mine = [g for k, g in gains.items() if (k[0], k[2]) == (d, a)]
        low, high = min(g.mean for g in mine), max(g.mean for g in mine)
        change = f"{low:+.2f}" if len(mine) == 1 else f"{low:+.2f} to {high:+.2f}"
        beside = f"; {excess[d, a]:+.2f}" if (d, a) in excess else ""
        per_defense.setdefault(d, []).append(
            f"{a} {change} dB (above zero on {sum(g.low > 0 for g in mine)} of {len(mine)}{beside})"
        )
    text = (
        f"In the pool record{note}, trained on {', '.join(map(str, images[smallest]))} instead "
        f"of {', '.join(map(str, images[1.0]))} images, the step-500 network changes each "
        f"attack's mean PSNR on the same {next(iter(gains.values())).n} victims by (paired; over "
        f"network seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))}: on how many "
        "the interval lies above zero, then the Table 2 record's mean minus the paper's): "
        + "; ".join(f"{d}: " + ", ".join(parts) for d, parts in per_defense.items())
        + "."
    )
    means: dict[tuple[str, str], list[float]] = {}
    for r in rows:
        if r["pool"] == 1.0:
            means.setdefault((r["defense"], r["attack"]), []).append(r["psnr"])
    if len(seeds) > 1:
        spreads = [max(v) - min(v) for v in means.values()]
        text += (
            f" With the whole pool the seeds' means differ by {min(spreads):.2f} to "
            f"{max(spreads):.2f} dB (per defense and attack), a spread that the Table 2 "
            "record's intervals, over the images of one network per cell, leave out."
        )
    text += _norms_text(rows, smallest)
    return text + _pool_verdict(gains)


def _pool_verdict(gains: dict[tuple[str, int, str], PairedGap]) -> str:
    """For which attacks every seed's smaller-pool network has the higher paired mean, for
    which the lower, and for which the sign differs: the sentences that end :func:`pool_text`."""
    attacks = list(dict.fromkeys(k[2] for k in gains))
    signs = {a: {g.mean > 0 for k, g in gains.items() if k[2] == a} for a in attacks}
    more = [a for a in attacks if signs[a] == {True}]
    less = [a for a in attacks if signs[a] == {False}]
    mixed = [a for a in attacks if len(signs[a]) == 2]
    parts = []
    if more:
        parts.append(
            f" On the smaller pool every network's paired mean rises for {', '.join(more)}: "
            "fewer distinct training images leave these attacks stronger, the direction of the "
            "record's excess over a paper whose networks draw from CIFAR-10's 50,000 training "
            "images."
        )
    if less:
        parts.append(f" Every network's paired mean falls for {', '.join(less)}.")
    if mixed:
        parts.append(f" To {', '.join(mixed)} the change differs in sign between the networks.")
    if less or mixed:
        parts.append(
            " So, with the cells' tuned settings, the pool's size does not explain the excess "
            f"of {', '.join(less + mixed)}."
        )
    return "".join(parts)


def _norms_text(rows: Sequence[dict], smallest: float) -> str:
    """How large the victims' updates are before the noise, per defense, on the whole pool's
    networks and the smallest share's (means over the seeds; a larger update stands further
    out of the same noise). Empty for rows without ``update_norm``."""
    norms: dict[tuple[str, float], dict[int, float]] = {}
    for r in rows:
        if "update_norm" in r and r["pool"] in (1.0, smallest):
            norms.setdefault((r["defense"], r["pool"]), {})[r["seed"]] = r["update_norm"]
    defenses = [d for d in dict.fromkeys(k[0] for k in norms) if (d, smallest) in norms]
    if not defenses:
        return ""

    def mean(d: str, share: float) -> float:
        return sum(norms[d, share].values()) / len(norms[d, share])

    return (
        " The victims' updates before the noise have a mean norm of "
        + "; ".join(
            f"{mean(d, 1.0):.2f} on the whole pool's networks and {mean(d, smallest):.2f} "
            f"on the smaller pool's ({d})"
            for d in defenses
        )  # fmt: skip
        + "."
    )


def pool_cells(
    rows: Sequence[dict], reference: Sequence[dict], step: int
) -> dict[tuple[str, str], dict]:
    """Per (defense, attack), the whole pool's networks of a ``bayes/table2-pool`` record
    beside the paper's Table 2 cell (``reference``: the paper's rows; ``step``: the record's
    ``train_step``): ``"psnr"``, the mean over the network seeds and the victims with
    :func:`~.paired.crossed_interval` (each seed's network is another draw of the cell's
    training), ``"paper"`` and ``"seeds"``. Cells with fewer than two seeds are left out,
    as one network has no spread to count."""
    paper = {(r["dataset"], r["defense"], r["step"], r["attack"]): r["psnr"] for r in reference}
    per: dict[tuple[str, str, str], dict[int, list[float]]] = {}
    for r in rows:
        if r["pool"] == 1.0:
            per.setdefault((r["dataset"], r["defense"], r["attack"]), {})[r["seed"]] = r[
                "psnr_per_image"
            ]
    return {
        (d, a): {
            "psnr": crossed_interval([seeds[s] for s in sorted(seeds)]),
            "paper": paper[(dataset, d, step, a)],
            "seeds": tuple(sorted(seeds)),
        }
        for (dataset, d, a), seeds in per.items()
        if len(seeds) > 1
    }


def pool_cells_text(cells: dict[tuple[str, str], dict]) -> str:
    """The chapter's sentences on :func:`pool_cells`: each cell's mean over the networks with
    its interval and the paper's number, and in how many cells the paper's number lies inside
    (strictly: the paper's own sampling error is not counted). Empty without cells."""
    if not cells:
        return ""
    seeds = sorted({s for c in cells.values() for s in c["seeds"]})
    first = next(iter(cells.values()))["psnr"]
    per_defense: dict[str, list[str]] = {}
    for (d, a), c in cells.items():
        got = c["psnr"]
        per_defense.setdefault(d, []).append(
            f"{a} {got.mean:.2f} ({got.low:.2f} to {got.high:.2f}; paper {c['paper']:.2f})"
        )
    return (
        f" Taken together, the whole pool's networks (seeds {', '.join(map(str, seeds))}) give "
        f"each cell a mean whose {first.confidence:.0%} interval counts the networks' spread "
        f"as well as that of the {first.n} victims (`crossed_interval`): "
        + "; ".join(f"{d}: " + ", ".join(parts) for d, parts in per_defense.items())
        + ". "
        + placed([(c["psnr"], c["paper"]) for c in cells.values()], "cell")
    )


def placed(pairs: Sequence[tuple[PairedGap, float]], what: str) -> str:
    """Where the paper's numbers lie against the intervals of ``pairs`` (interval, paper's
    number), one per ``what``: inside, or below or above an interval (the sentence that ends
    :func:`pool_cells_text` and :func:`.bayes_network_claims.network_text`)."""
    inside = sum(got.low <= p <= got.high for got, p in pairs)
    higher = sum(got.low > p for got, p in pairs)
    return (
        f"The paper's number lies inside {inside} of the {len(pairs)} {what} intervals; "
        f"{higher} lie wholly above it (these networks leak more than the paper's) and "
        f"{len(pairs) - inside - higher} wholly below it."
    )
