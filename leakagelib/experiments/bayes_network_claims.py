"""What ``bayes/table2-networks`` (:mod:`.bayes_networks`) says about Table 2's record.

:func:`network_cells` reads each Table 2 cell over the networks of several seeds (the Table 2
record's as seed 0), with an interval that counts the networks' spread as well as the images'
(:func:`.paired.crossed_interval`); :func:`network_text` reads them in words beside the
paper's, and :func:`network_misses_text` says which of the record's misses of the paper
(:func:`.bayes_claims.table2_misses`) the draw of one network accounts for. The chapter "Bayes
versus heuristics under defenses" glues them under its Table 2 record, and
``tests/test_bayes_networks.py`` checks them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from .bayes_pool_claims import placed
from .paired import crossed_interval

__all__ = ["network_cells", "network_misses_text", "network_text"]


def network_cells(
    rows: Sequence[dict], table2: Mapping[str, Sequence[dict]], reference: Sequence[dict]
) -> dict[tuple[str, int, str], dict]:
    """Per Table 2 cell of a ``bayes/table2-networks`` record (:mod:`.bayes_networks`), its
    networks together: each attack's mean PSNR and the Bayes attack's paired gain over each
    heuristic, with :func:`~.paired.crossed_interval` over networks and victims, beside the
    paper's (``reference``). ``table2`` maps a row's ``tuned_from`` (``"re-run"``,
    ``"record"``) to that Table 2 record's rows (:func:`.bayes_pool.table2_sources`), whose
    cell is network seed 0; rows tuned by the ci search (``"search"``) stand alone. Keys:
    ``"psnr"``, ``"gaps"``, ``"paper"``, ``"paper_gaps"``, ``"seeds"``. A cell is left out
    until every attack has at least two networks; raises ``ValueError`` where the Table 2
    record lacks the cell or took another setting than the rows."""
    paper = {(r["dataset"], r["defense"], r["step"], r["attack"]): r["psnr"] for r in reference}
    by: dict[tuple[str, int, str], dict[str, dict[int, dict]]] = {}
    for r in rows:
        cell = by.setdefault((r["dataset"], r["step"], r["defense"]), {})
        cell.setdefault(r["attack"], {})[r["seed"]] = r
    out = {}
    for (dataset, step, defense), per in by.items():
        for attack, seeds in per.items():
            mine = list(seeds.values())
            if {r["tuned_from"] for r in mine} == {"search"}:
                continue  # the ci search tuned each network: no Table 2 cell to join
            cell = _table2_cell(table2, mine[0]["tuned_from"], (dataset, step, defense, attack))
            if any(r["tuned"] != cell["tuned"] or r["tuned_from"] != mine[0]["tuned_from"]
                   for r in mine):  # fmt: skip
                raise ValueError(
                    f"the networks of ({dataset}, {step}, {defense}) {attack} took other "
                    "settings than the Table 2 record's cell"
                )
            seeds[0] = cell
        order = sorted(set.intersection(*(set(s) for s in per.values())))
        if len(order) < 2 or "bayes" not in per:
            continue
        psnr = {a: np.array([s[k]["psnr_per_image"] for k in order]) for a, s in per.items()}
        heuristics = [a for a in psnr if a != "bayes"]
        bayes = paper[dataset, defense, step, "bayes"]
        out[dataset, step, defense] = {
            "psnr": {a: crossed_interval(v) for a, v in psnr.items()},
            "gaps": {a: crossed_interval(psnr["bayes"] - psnr[a]) for a in heuristics},
            "paper": {a: paper[dataset, defense, step, a] for a in psnr},
            "paper_gaps": {a: bayes - paper[dataset, defense, step, a] for a in heuristics},
            "seeds": tuple(order),
        }
    return out


def _table2_cell(
    table2: Mapping[str, Sequence[dict]], source: str, key: tuple[str, int, str, str]
) -> dict:
    """The row of (dataset, step, defense, attack) ``key`` in the Table 2 record ``source``
    names (a key of :func:`network_cells`'s ``table2``); ``ValueError`` where it has none."""
    for r in table2.get(source, []):
        if (r["dataset"], r["step"], r["defense"], r["attack"]) == key:
            return r
    raise ValueError(f"the Table 2 {source} has no cell {key}")


def network_text(cells: dict[tuple[str, int, str], dict], total: int, note: str) -> str:
    """The chapter's sentences on :func:`network_cells` (of ``total`` cells in the config;
    ``note``: the record's pending note): under pruning, in how many (cell, heuristic) pairs the
    Bayes attack's gain over networks and victims lies above zero, beside the paper's; and in
    how many cells the paper's PSNR lies inside the intervals."""
    if not cells:
        return f" The networks record{note} has no cell with two networks yet."
    seeds = sorted({s for c in cells.values() for s in c["seeds"]})
    pruned = {k: c for k, c in cells.items() if k[2].startswith("prune")}
    gaps = [g for c in pruned.values() for g in c["gaps"].values()]
    text = (
        f" Over the networks of seeds {', '.join(map(str, seeds))}"
        + (" (seed 0 the Table 2 record's)" if 0 in seeds else "")
        + f" in {len(cells)} of the {total} cells of the networks record{note}, with intervals "
        "over networks and victims (`crossed_interval`):"
    )
    if gaps:
        paper = sum(p > 0 for c in pruned.values() for p in c["paper_gaps"].values())
        text += (
            f" under pruning the Bayes attack's gain over a heuristic lies above zero in "
            f"{sum(g.low > 0 for g in gaps)} of {len(gaps)} (cell, heuristic) pairs, "
            f"{min(g.mean for g in gaps):+.2f} to {max(g.mean for g in gaps):+.2f} dB (the "
            f"paper's Bayes is ahead in {paper} of them)."
        )
    psnr = [(got, c["paper"][a]) for c in cells.values() for a, got in c["psnr"].items()]
    return text + " " + placed(psnr, "(cell, attack)")


def network_misses_text(
    misses: Mapping[str, Mapping[str, Sequence[tuple]]], cells: dict[tuple[str, int, str], dict]
) -> str:
    """Which of the Table 2 record's misses the networks account for: of the (cell, attack)
    pairs of ``misses`` (:func:`.bayes_claims.table2_misses`, keys (dataset, defense, step)),
    those whose paper number lies inside the interval over networks and victims of ``cells``
    (:func:`network_cells`), where the networks' spread covers the gap, and those outside it
    too: in CIFAR-10 after training, where the networks' training pool deviates from the
    paper's (the chapter's deviation; :mod:`.bayes_pool` measures it), and elsewhere, where we
    know no cause. Numbers read, never typed."""
    held, pool, left, unread = [], [], [], 0
    for attack, sides in misses.items():
        for dataset, defense, step in (*sides["below"], *sides["above"]):
            cell = cells.get((dataset, step, defense))
            if cell is None:
                unread += 1
                continue
            got, paper = cell["psnr"][attack], cell["paper"][attack]
            item = (f"{attack} in {dataset} step {step} {defense} ({got.mean:.2f} dB, "
                    f"{got.low:.2f} to {got.high:.2f}; paper {paper:.2f})")  # fmt: skip
            outside = pool if dataset == "cifar10" and step > 0 else left
            (held if got.low <= paper <= got.high else outside).append(item)
    total = len(held) + len(pool) + len(left) + unread
    if not total:
        return ""
    text = (f" Of the {total} (cell, attack) pairs where the paper's number lies outside the "
            "Table 2 record's interval with the paper's sampling error counted (above), "
            f"{_count(held)} inside these intervals over networks")  # fmt: skip
    if held:
        text += (": " + "; ".join(held) + ". There the networks' spread covers the gap, so the "
                 "draw of the record's one network can account for it")  # fmt: skip
    text += "."
    if pool:
        text += (f" {_count(pool)} outside them too, in CIFAR-10 after training, where the "
                 "networks' training pool deviates from the paper's (above): "
                 + "; ".join(pool) + ".")  # fmt: skip
    if left:
        text += (f" {_count(left)} outside them elsewhere, where we know no cause "
                 "(unexplained): " + "; ".join(left) + ".")  # fmt: skip
    if unread:
        text += f" {unread} {'has' if unread == 1 else 'have'} no cell in the networks record yet."
    return text


def _count(items: Sequence) -> str:
    """``"1 lies"`` or ``"n lie"``: how many ``items``, with the verb agreeing."""
    return f"{len(items)} {'lies' if len(items) == 1 else 'lie'}"
