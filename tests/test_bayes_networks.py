"""Tests of ``bayes/table2-networks``: Table 2's cells on the networks of other seeds, the
settings it refuses, and its networks read together with the Table 2 record's cell."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from leakagelib import experiments, reporting
from leakagelib.experiments import Context, bayes_claims, bayes_pool
from leakagelib.experiments.bayes_network_claims import (
    network_cells,
    network_misses_text,
    network_text,
)
from leakagelib.experiments.paired import CLAIM_SEEDS, crossed_interval

torch.set_num_threads(1)

NETWORKS_ID = "bayes/table2-networks"


def context(scale: str = "ci", seed: int = 0, **changes: object) -> Context:
    config = experiments.get(NETWORKS_ID).config
    at = {**getattr(config, scale), **changes}
    settings = replace(config, **{scale: at})
    return Context(scale=scale, seed=seed, progress=False, settings=settings)


def test_a_small_run_gives_each_network_of_a_cell_its_rows():
    rows = experiments.get(NETWORKS_ID).fn(context(victims=2, steps=2, attacks=("l2", "cosine")))
    assert [(r["step"], r["seed"], r["attack"]) for r in rows] == [
        (0, 1, "l2"), (0, 1, "cosine"), (0, 2, "l2"), (0, 2, "cosine")
    ]  # fmt: skip
    assert {r["tuned_from"] for r in rows} == {"search"}
    assert rows[0]["psnr_per_image"] != rows[2]["psnr_per_image"], "another network, other PSNRs"
    assert rows[0]["update_norm_per_image"] != rows[2]["update_norm_per_image"]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"cells": (("mnist", 100, "gaussian"),)}, "are not Table 2's"),
        ({"cells": (("mnist", 0, "dp"),)}, "are not Table 2's"),
        ({"tuned_from": "table5"}, "use 'search' or 'bayes/table2'"),
        ({"tuned_from": "bayes/table2", "seeds": (0, 1)}, "seed 0 is the Table 2 record's"),
    ],
)
def test_bad_settings_are_refused_before_any_network(changes: dict, message: str):
    with pytest.raises(ValueError, match=message):
        experiments.get(NETWORKS_ID).fn(context(**changes))


def test_a_unit_waits_for_the_table2_rerun_to_reach_its_cell(monkeypatch):
    """A cell the re-run under way has not reached would be attacked with the settings the
    re-run replaces: its unit stops the run, after the units before it, naming the cell."""
    from leakagelib.experiments import bayes_networks

    def record(*defenses: str) -> dict:
        return {"rows": [{"dataset": "mnist", "step": 0, "defense": d, "attack": "l2",
                          "tuned": {"lr": 0.1, "decay": 0.9, "beta": 1.0}} for d in defenses]}  # fmt: skip

    monkeypatch.setattr(reporting, "rerun_record", lambda i: (record("prune+gauss"), ""))
    monkeypatch.setattr(
        reporting, "results_record", lambda i: (record("prune+gauss", "prune+lap"), "")
    )
    attacked = []

    def rows(ctx, cell, seed, recorded):  # a stand-in for the cell's attacks
        attacked.append((cell, seed, recorded[1]))
        return [], None

    monkeypatch.setattr(bayes_networks, "cell_rows", rows)
    cells = (("mnist", 0, "prune+gauss"), ("mnist", 0, "prune+lap"))
    ctx = context(tuned_from="bayes/table2", cells=cells, attacks=("l2",))
    with pytest.raises(ValueError, match=r"has not yet run the cell \(mnist, step 0, prune\+lap\)"):
        experiments.get(NETWORKS_ID).fn(ctx)
    assert attacked == [(cells[0], 1, "re-run"), (cells[0], 2, "re-run")]
    monkeypatch.setattr(reporting, "rerun_record", lambda i: (None, ""))  # the re-run finished
    attacked.clear()
    experiments.get(NETWORKS_ID).fn(ctx)
    assert [a[2] for a in attacked] == ["record"] * 4


def _cell_rows(seed: int, shift: float, source: str) -> list[dict]:
    """One cell's rows for network ``seed``: Bayes 2 dB above ℓ2 on 5 images, all ``shift`` up."""
    base = [14.0 + 0.3 * i + 0.05 * i * i for i in range(5)]
    return [{"dataset": "mnist", "step": 0, "defense": "prune+gauss", "seed": seed,
             "attack": a, "psnr_per_image": [x + up + shift for x in base],
             "tuned": {"beta": 1.0}, "tuned_from": source}
            for a, up in (("bayes", 2.0), ("l2", 0.0))]  # fmt: skip


REFERENCE = [{"dataset": "mnist", "defense": "prune+gauss", "step": 0, "attack": a, "psnr": p}
             for a, p in (("bayes", 18.40), ("l2", 14.44))]  # fmt: skip


def test_the_networks_of_a_cell_read_together_with_the_table2_cell_as_seed_0():
    rows = _cell_rows(1, 0.5, "re-run") + _cell_rows(2, -0.2, "re-run")
    table2 = {"re-run": _cell_rows(0, 0.0, "search"), "record": []}
    [(key, cell)] = network_cells(rows, table2, REFERENCE).items()
    assert key == ("mnist", 0, "prune+gauss") and cell["seeds"] == (0, 1, 2)
    assert cell["gaps"]["l2"].mean == pytest.approx(2.0)
    per_seed = [r["psnr_per_image"] for r in table2["re-run"] + rows if r["attack"] == "l2"]
    assert cell["psnr"]["l2"] == crossed_interval(np.array(per_seed))
    assert cell["paper_gaps"]["l2"] == pytest.approx(18.40 - 14.44)
    text = network_text({key: cell}, 16, "")
    assert "seeds 0, 1, 2 (seed 0 the Table 2 record's) in 1 of the 16 cells" in text
    assert "above zero in 1 of 1 (cell, heuristic) pairs" in text


def test_a_cell_without_its_table2_row_or_with_another_setting_is_refused():
    rows = _cell_rows(1, 0.0, "record")
    with pytest.raises(ValueError, match="the Table 2 record has no cell"):
        network_cells(rows, {"record": []}, REFERENCE)
    other = [{**r, "tuned": {"beta": 2.0}} for r in _cell_rows(0, 0.0, "search")]
    with pytest.raises(ValueError, match="took other settings"):
        network_cells(rows, {"record": other}, REFERENCE)


def test_a_miss_inside_the_networks_interval_is_told_apart_from_one_outside():
    """Over three networks whose means lie 0.5 dB apart, a paper number within that spread of
    the cell's mean (Bayes) lies inside the networks' interval and one 2.4 dB below it (ℓ2)
    outside; a CIFAR-10 miss after training goes with the pool, a cell not yet read is
    counted."""
    rows = _cell_rows(1, -0.5, "re-run") + _cell_rows(2, -1.0, "re-run")
    reference = [{**r, "psnr": p} for r, p in zip(REFERENCE, (16.6, 12.0), strict=True)]
    cells = network_cells(rows, {"re-run": _cell_rows(0, 0.0, "search")}, reference)
    bayes, l2 = cells["mnist", 0, "prune+gauss"]["psnr"].values()
    assert bayes.low <= 16.6 <= bayes.high and l2.low > 12.0, (bayes, l2)
    key = ("mnist", "prune+gauss", 0)
    misses = {"bayes": {"below": [], "above": [key]}, "l2": {"below": [], "above": [key]}}
    text = network_misses_text(misses, cells)
    assert "Of the 2 (cell, attack) pairs" in text and "1 lies inside" in text
    assert f"bayes in mnist step 0 prune+gauss ({bayes.mean:.2f} dB" in text.split("account for")[0]
    assert "1 lies outside them elsewhere" in text and "l2 in mnist" in text.split("unexplained")[1]
    cifar = {("cifar10", 500, "prune+gauss"): cells["mnist", 0, "prune+gauss"]}
    later = {"l2": {"below": [], "above": [("cifar10", "prune+gauss", 500)]}}
    said = network_misses_text(later, cifar)
    assert "1 lies outside them too, in CIFAR-10 after training" in said
    assert "2 have no cell in the networks record yet" in network_misses_text(misses, {})
    assert network_misses_text({"l2": {"below": [], "above": []}}, cells) == ""


def test_one_network_is_no_spread_to_count():
    assert network_cells(_cell_rows(1, 0.0, "search"), {}, REFERENCE) == {}
    assert "no cell with two networks yet" in network_text({}, 16, " (pending)")


@pytest.mark.slow
@pytest.mark.parametrize("seed", CLAIM_SEEDS)
def test_the_bayes_attack_leads_under_pruning_over_the_ci_networks(seed: int):
    """The chapter's ci claim for its seed 0, on the other seeds: over the ci networks (with an
    interval over networks and victims) the Bayes attack beats ℓ2, ℓ1 and cosine."""
    rows = experiments.run(NETWORKS_ID, scale="ci", seed=seed, progress=False)["rows"]
    reference = experiments.get("bayes/table2").reference
    [cell] = network_cells(rows, {}, reference).values()
    assert all(g.low > 0 for g in cell["gaps"].values()), cell["gaps"]


def test_the_networks_record_keeps_the_bayes_lead_in_the_pruning_cells():
    """Table 2's claim where the paper makes it, on the committed record (the chapter asserts
    the same): in each pruning cell with two networks or more, the Bayes attack's gain over
    each heuristic the paper's Bayes beats lies above zero over networks and victims; the
    MNIST pruning cells, where the issue asks for it, are among them."""
    record, _ = reporting.results_record(NETWORKS_ID)
    assert record is not None, "results/bayes-table2-networks.json: the chapter reads it"
    tables2 = bayes_pool.table2_sources()
    reference = experiments.get("bayes/table2").reference
    cells = network_cells(record["rows"], tables2, reference)
    pruned = {k: c for k, c in cells.items() if k[2].startswith("prune")}
    assert {k for k in pruned if k[0] == "mnist"}, "no MNIST pruning cell has two networks"
    for key, cell in pruned.items():
        assert set(cell["gaps"]) == {"l2", "l1", "cosine"}
        ahead = {a: g for a, g in cell["gaps"].items() if cell["paper_gaps"][a] > 0}
        assert ahead and all(g.low > 0 for g in ahead.values()), (key, cell["gaps"])


def test_the_networks_hold_the_records_mnist_step_0_bayes_misses():
    """The committed records (the chapter reads them so): the Table 2 record's Bayes attack
    lies above the paper in MNIST's step-0 cells even with the paper's sampling error counted,
    and over the three networks the paper's number lies inside every one of those intervals,
    so the draw of one network accounts for these gaps."""
    record, _ = reporting.results_record("bayes/table2")
    networks, _ = reporting.results_record(NETWORKS_ID)
    assert record is not None and networks is not None
    reference = experiments.get("bayes/table2").reference
    against = bayes_claims.table2_against_paper(record["rows"], reference)
    misses = bayes_claims.table2_misses(against, paper_spread=True)
    above = [k for k in misses["bayes"]["above"] if k[0] == "mnist" and k[2] == 0]
    assert len(above) == 4, misses["bayes"]
    cells = network_cells(networks["rows"], bayes_pool.table2_sources(), reference)
    for dataset, defense, step in above:
        got = cells[dataset, step, defense]["psnr"]["bayes"]
        assert got.low <= cells[dataset, step, defense]["paper"]["bayes"] <= got.high, got
    text = network_misses_text(misses, cells)
    held = text.split("can account for it")[0]
    assert all(f"bayes in mnist step 0 {d} (" in held for _, d, _ in above), text
