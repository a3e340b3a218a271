"""Tests of ``bayes/table2-pool-rate``: the pool record's networks attacked again by the cosine at
other learning rates, its checks before any work, and the chapter's paragraph on its record."""

from __future__ import annotations

import pytest
import torch

from leakagelib import experiments
from leakagelib.experiments import Context
from leakagelib.experiments.bayes_pool_claims import pool_rate_text

torch.set_num_threads(1)

RATE_ID = "bayes/table2-pool-rate"


def ci_context(**changes: object) -> Context:
    """A ci run of the experiment with ``changes`` to its ci settings (as ``--set`` makes them)."""
    settings = experiments.get(RATE_ID).config.changed("ci", changes)
    return Context(scale="ci", progress=False, settings=settings)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"tuned_from": "table2"}, "tuned_from"),
        ({"rate_factors": (0.5, 2.0)}, "1.0 \\(the tuned rate\\)"),
        ({"rate_factors": (0.0, 1.0)}, "each must be above 0"),
        ({"rate_victims": 0}, "rate_victims = 0"),
        ({"rate_victims": 9}, "use 1 to victims \\(8\\)"),
        ({"defenses": ("gauss",)}, "unknown defenses \\['gauss'\\]"),
        ({"pools": (0.5,)}, "the whole pool \\(1.0\\) among them"),
        ({"train_step": 250}, "is not a cell of Table 2"),
    ],
)
def test_settings_it_cannot_run_are_refused_before_any_training(change, message):
    ctx = ci_context(**change)
    with pytest.raises(ValueError, match=message):
        experiments.get(RATE_ID).fn(ctx)


def test_each_network_is_attacked_at_every_rate_of_one_tuned_setting():
    """Per share of the pool: one row per rate, the tuned setting's rate times the factor and
    nothing else changed, the same setting on both shares, each row on the same victims."""
    ctx = ci_context(seeds=(0,), rate_victims=2, steps=4)
    rows = experiments.get(RATE_ID).fn(ctx)
    cfg = ctx.config
    assert len(rows) == len(cfg.pools) * len(cfg.rate_factors)
    base = next(r["tuned"] for r in rows if r["rate_factor"] == 1.0)
    for r in rows:
        assert r["tuned"] == {**base, "lr": pytest.approx(base["lr"] * r["rate_factor"])}
        assert r["lr"] == pytest.approx(r["tuned"]["lr"]) and len(r["psnr_per_image"]) == 2
        assert r["attack"] == f"cosine, lr ×{r['rate_factor']:g}"
    images = {r["pool"]: r["pool_images"] for r in rows}
    assert images[0.5] == round(images[1.0] / 2)


def _rows(changes: dict[tuple[str, int, float], float]) -> list[dict]:
    """Rate rows of two victims: the whole pool at 18 dB, the smaller share at 18 + change."""
    rows = []
    for (defense, seed, factor), change in changes.items():
        for pool, psnr in ((1.0, 18.0), (0.5, 18.0 + change)):
            rows.append({"defense": defense, "seed": seed, "pool": pool, "rate_factor": factor,
                         "attack": f"cosine, lr ×{factor:g}", "psnr": psnr,
                         "psnr_per_image": [psnr - 0.5, psnr + 0.5]})  # fmt: skip
    return rows


def test_the_rate_paragraph_says_where_the_smaller_share_rises_on_every_network():
    half_rises = _rows({("gaussian", 0, 0.5): 1.5, ("gaussian", 1, 0.5): 1.0,
                        ("gaussian", 0, 1.0): -1.0, ("gaussian", 1, 1.0): 0.5})  # fmt: skip
    said = pool_rate_text(half_rises, " (2 of 2)")
    assert said.startswith("In the rate record (2 of 2), on the first 2 victims of each network")
    assert "at 0.5× its tuned rate gaussian +1.00 to +1.50 dB (above zero on 2 of 2)" in said
    assert "at 1× its tuned rate gaussian -1.00 to +0.50 dB (above zero on 1 of 2)" in said
    assert "Best rate of the smaller pool's 2 networks: 0.5× on 2." in said
    assert said.endswith(
        "At 0.5× the tuned rate the smaller share's mean rises on every network: where the "
        "cosine falls at its tuned rate, the fall belongs to the rate."
    )
    both = pool_rate_text(_rows({("gaussian", 0, 0.5): 1.0, ("gaussian", 0, 1.0): 1.0}), "")
    assert both.endswith(
        "At 0.5×, 1× the tuned rate the smaller share's mean rises on every network."
    )
    assert "at 0.5× its tuned rate gaussian +1.00 dB (above zero on 1 of 1)" in both
    assert "Best rate of the whole pool's 1 network: " in both
    none = pool_rate_text(_rows({("gaussian", 0, 1.0): -1.0, ("gaussian", 1, 1.0): 1.0}), "")
    assert none.endswith("At no rate does the smaller share's mean rise on every network.")
    assert "no unit with both shares" in pool_rate_text(half_rises[:1], "")
