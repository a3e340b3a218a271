"""Tests of ``bayes/table2-pool``: the step-500 network trained on a share of its pool, the
Table 2 settings it reads, and its record beside the Table 2 record's cells."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from leakagelib import experiments, reporting
from leakagelib.experiments import Context, bayes_pool, bayes_scenario
from leakagelib.experiments.bayes_pool_claims import (
    pool_cells,
    pool_cells_text,
    pool_gains,
    pool_repeats_cell,
    pool_text,
)
from leakagelib.experiments.bayes_tables import TABLE2, cell_offsets
from leakagelib.experiments.paired import mean_interval

torch.set_num_threads(1)

POOL_ID = "bayes/table2-pool"


def ci_context(**changes: object) -> Context:
    config = experiments.get(POOL_ID).config
    return Context(
        scale="ci", progress=False, settings=replace(config, ci={**config.ci, **changes})
    )


def test_a_share_of_the_pool_is_the_first_of_the_shuffled_non_victims():
    ctx = ci_context()
    victims = ctx.dataset("cifar10", 8, split="train", shuffle=False)
    whole, labels = bayes_scenario.training_pool(ctx, "cifar10", victims, seed=3)
    half, _ = bayes_scenario.training_pool(ctx, "cifar10", victims, pool=0.5, seed=3)
    assert len(half) == round(len(whole) / 2) and torch.equal(half, whole[: len(half)])
    other, _ = bayes_scenario.training_pool(ctx, "cifar10", victims, seed=4)
    assert not torch.equal(other, whole), "the network seed draws the shuffle"
    flat = whole.flatten(1)
    assert not (flat[:, None] == victims.images.flatten(1)[None]).all(-1).any()
    with pytest.raises(ValueError, match="share of the training images"):
        bayes_scenario.training_pool(ctx, "cifar10", victims, pool=0.0)


def test_the_run_seed_given_as_the_network_seed_trains_the_same_network():
    """``scenario`` with ``seed`` equal to the run's seed and the whole pool trains Table 2's
    network again (so the pool record's whole-pool seed-0 rows repeat the Table 2 cell)."""
    ctx = ci_context()
    default, _ = bayes_scenario.scenario(ctx, "cifar10", 3, 2, defense="gaussian")
    explicit, _ = bayes_scenario.scenario(ctx, "cifar10", 3, 2, defense="gaussian", seed=0)
    other, _ = bayes_scenario.scenario(ctx, "cifar10", 3, 2, defense="gaussian", seed=1)
    weights = [dict(m.state_dict()) for m in (default, explicit, other)]
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
    assert not all(torch.equal(weights[0][k], weights[2][k]) for k in weights[0])


def test_a_small_run_pairs_the_shares_on_one_setting_per_attack():
    rows = experiments.get(POOL_ID).fn(
        ci_context(victims=2, steps=2, attacks=("l2", "cosine"), seeds=(1,))
    )
    assert [(r["pool"], r["attack"]) for r in rows] == [
        (1.0, "l2"), (1.0, "cosine"), (0.5, "l2"), (0.5, "cosine")
    ]  # fmt: skip
    whole, half = rows[0]["pool_images"], rows[2]["pool_images"]
    assert half == round(whole / 2) and whole > 0
    for a in ("l2", "cosine"):
        pair = [r for r in rows if r["attack"] == a]
        assert pair[0]["tuned"] == pair[1]["tuned"], "both shares attacked with one setting"
        assert all(r["tuned_from"] == "search" and len(r["psnr_per_image"]) == 2 for r in pair)
    for share in (1.0, 0.5):
        norms = {tuple(r["update_norm_per_image"]) for r in rows if r["pool"] == share}
        assert len(norms) == 1 and all(n > 0 for n in next(iter(norms))), "one update per victim"


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"tuned_from": "bayes/table5"}, "use 'search' or 'bayes/table2'"),
        ({"pools": (1.0, 0.0)}, "each share must be in"),
        ({"pools": (0.5, 0.25)}, r"the whole pool \(1.0\) among them"),
        ({"defenses": ("dp",)}, "unknown defenses"),
        ({"train_step": 3}, r"\(cifar10, step 3\) is not a cell of Table 2"),
    ],
)
def test_bad_settings_are_refused_before_any_training(changes, message, monkeypatch):
    monkeypatch.setattr(bayes_pool, "scenario", lambda *a, **k: pytest.fail("trained"))
    with pytest.raises(ValueError, match=message):
        experiments.get(POOL_ID).fn(ci_context(**changes))


def test_the_table2_settings_come_from_the_rerun_else_the_record(monkeypatch):
    def record(*tuned: str) -> dict:
        setting = {"lr": 0.1, "decay": 0.9, "beta": 0.5}
        return {"rows": [{"dataset": "cifar10", "step": 500, "defense": "gaussian",
                          "attack": a, "tuned": setting} for a in tuned]}  # fmt: skip

    monkeypatch.setattr(reporting, "rerun_record", lambda i: (record("l2"), ""))
    monkeypatch.setattr(reporting, "results_record", lambda i: (record("l2", "bayes"), ""))
    got, source = bayes_pool.table2_settings("cifar10", 500, "gaussian", ("l2",))
    assert source == "re-run" and got["l2"].beta == 0.5
    _, source = bayes_pool.table2_settings("cifar10", 500, "gaussian", ("l2", "bayes"))
    assert source == "record", "the re-run lacks the Bayes row"
    with pytest.raises(ValueError, match=r"\(cifar10, step 500, laplacian\)"):
        bayes_pool.table2_settings("cifar10", 500, "laplacian", ("l2",))
    with pytest.raises(ValueError, match="re-run under way has not yet run the cell"):
        bayes_pool.table2_settings("cifar10", 500, "gaussian", ("l2", "bayes"), strict=True)
    assert (
        bayes_pool.table2_settings("cifar10", 500, "gaussian", ("l2",), strict=True)[1] == "re-run"
    )
    monkeypatch.setattr(reporting, "rerun_record", lambda i: (None, ""))  # no re-run under way
    _, source = bayes_pool.table2_settings("cifar10", 500, "gaussian", ("l2", "bayes"), strict=True)
    assert source == "record"


def test_a_rerun_row_pairs_with_the_record_once_the_rerun_finished(monkeypatch):
    """``tuned_from == "re-run"`` names the re-run while it is under way and the record it became
    after; ``"record"`` always names the finished record."""
    old, new = (
        [{"attack": "l2", "tuned": {"beta": 1.0}}],
        [{"attack": "l2", "tuned": {"beta": 2.0}}],
    )
    monkeypatch.setattr(reporting, "results_record", lambda i: ({"rows": old}, ""))
    monkeypatch.setattr(reporting, "rerun_record", lambda i: ({"rows": new}, ""))
    assert bayes_pool.table2_sources() == {"re-run": new, "record": old}
    monkeypatch.setattr(reporting, "results_record", lambda i: ({"rows": new}, ""))
    monkeypatch.setattr(reporting, "rerun_record", lambda i: (None, ""))  # the re-run finished
    assert bayes_pool.table2_sources() == {"re-run": new, "record": new}
    monkeypatch.setattr(reporting, "results_record", lambda i: (None, ""))
    assert bayes_pool.table2_sources() == {"re-run": [], "record": []}


def test_the_pool_record_gives_the_table2_cell_back_with_the_whole_pool():
    """The whole pool with the run's seed is the Table 2 cell's training, victims, settings and
    starting images again: every attack's paired difference from the cell's per-image PSNR
    has an interval around zero (the chapter asserts the same)."""
    pool, _ = reporting.results_record(POOL_ID)
    assert pool is not None, "results/bayes-table2-pool.json: the chapter's claim rests on it"
    gaps = pool_repeats_cell(pool["rows"], bayes_pool.table2_sources()["re-run"])
    assert {d for d, _ in gaps} == set(experiments.get(POOL_ID).config.paper["defenses"])
    assert all(g.low < 0 < g.high for g in gaps.values()), gaps


def test_a_pool_row_with_another_setting_than_the_cell_is_refused():
    cell = {"dataset": "cifar10", "step": 500, "defense": "gaussian", "attack": "l2",
            "tuned": {"beta": 1.0}, "psnr_per_image": [1.0, 2.0]}  # fmt: skip
    row = {"defense": "gaussian", "attack": "l2", "pool": 1.0, "seed": 0,
           "tuned": {"beta": 1.0}, "psnr_per_image": [1.5, 1.5]}  # fmt: skip
    assert pool_repeats_cell([row], [cell])["gaussian", "l2"].mean == pytest.approx(0.0)
    with pytest.raises(ValueError, match="with the pool row's setting"):
        pool_repeats_cell([{**row, "tuned": {"beta": 2.0}}], [cell])


def test_the_offsets_follow_the_cells_position_in_the_config():
    assert cell_offsets(TABLE2.paper, "mnist", 0, "gaussian") == (0, 0)
    assert cell_offsets(TABLE2.paper, "cifar10", 500, "laplacian") == (301, 3010)


def _pool_rows(gain: dict[int, float]) -> list[dict]:
    """Rows of two seeds' units: the half pool ``gain[seed]`` dB above the whole on 4 images."""
    rows = []
    for seed, up in gain.items():
        for pool, shift, images in ((1.0, 0.0, 300), (0.5, up, 150)):
            per_image = [18.0 + seed + 0.1 * i + shift + 0.01 * i * i for i in range(4)]
            rows.append({"defense": "gaussian", "seed": seed, "attack": "l2", "pool": pool,
                         "pool_images": images, "psnr": sum(per_image) / 4,
                         "psnr_per_image": per_image, "update_norm": 2.0 + pool + seed})  # fmt: skip
    return rows


def test_the_pool_claim_pairs_the_half_pool_with_the_whole_per_seed():
    gains = pool_gains(_pool_rows({0: 1.0, 1: 0.5}))
    assert set(gains) == {("gaussian", 0, "l2"), ("gaussian", 1, "l2")}
    assert gains["gaussian", 0, "l2"].mean == pytest.approx(1.0)
    both = pool_text(_pool_rows({0: 1.0, 1: 0.5}), "", {("gaussian", "l2"): 0.9})
    assert "150 instead of 300 images" in both and "+0.50 to +1.00 dB" in both
    assert "above zero on 2 of 2; +0.90" in both and "paired mean rises for l2" in both
    assert "differ by 1.00 to 1.00 dB" in both  # the seeds' whole-pool means: 18.x and 19.x
    assert "mean norm of 3.50 on the whole pool's networks and 3.00 on the smaller" in both
    mixed = pool_text(_pool_rows({0: 1.0, 1: -0.5}), "", {})
    assert "To l2 the change differs in sign" in mixed and "rises" not in mixed
    assert "does not explain the excess of l2" in mixed
    less = pool_text(_pool_rows({0: -1.0, 1: -0.5}), "", {})
    assert "paired mean falls for l2" in less and "rises" not in less
    assert "no unit with both shares" in pool_text(_pool_rows({0: 1.0})[:1], " (pending)", {})


def test_the_pool_cells_count_the_networks_spread_beside_the_paper():
    """Two seeds 1 dB apart on the same images: the mean over both networks, an interval wider
    than one network's alone, and the paper's number placed inside or outside it."""
    rows = [{**r, "dataset": "cifar10"} for r in _pool_rows({0: 1.0, 1: 0.5})]
    paper = [{"dataset": "cifar10", "defense": "gaussian", "step": 500, "attack": "l2",
              "psnr": 18.7}]  # fmt: skip
    cells = pool_cells(rows, paper, 500)
    got = cells["gaussian", "l2"]
    whole = [r["psnr_per_image"] for r in rows if r["pool"] == 1.0]
    assert got["seeds"] == (0, 1) and got["paper"] == 18.7
    assert got["psnr"].mean == pytest.approx(sum(map(sum, whole)) / 8)
    one = mean_interval(whole[0])
    assert got["psnr"].high - got["psnr"].low > one.high - one.low
    assert "inside 1 of the 1 cell intervals; 0 lie wholly above" in pool_cells_text(cells)
    far = pool_cells(rows, [{**paper[0], "psnr": 10.0}], 500)
    assert "inside 0 of the 1 cell intervals; 1 lie wholly above" in pool_cells_text(far)
    assert pool_cells([r for r in rows if r["seed"] == 0], paper, 500) == {}, "one network"
    assert pool_cells_text({}) == ""
