"""The Bayes paper's Table 2 claims at ci scale (slow: about a minute on one free core)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from leakagelib import experiments
from leakagelib.experiments import Context
from leakagelib.experiments.bayes_scenario import paired_gap, summarise_table2

torch.set_num_threads(1)


def table2_rows(**ci_changes: object) -> list[dict]:
    """``bayes/table2`` at ci scale with some of its ci settings changed (a subset of the table)."""
    exp = experiments.get("bayes/table2")
    config = replace(exp.config, ci={**exp.config.ci, **ci_changes})
    return exp.fn(Context(scale="ci", progress=False, settings=config))["rows"]


@pytest.mark.slow
def test_table2_claims_on_mnist_stand_in():
    """Claims (Table 2) at ci scale: Bayes wins under prune+noise; equals ℓ2 under Gaussian noise;
    and the Bayes attack recovers better at step 0 than at step 500."""
    rows = table2_rows(datasets=("mnist",), train_steps=(0,), defenses=("gaussian", "prune+gauss"))
    cell = summarise_table2(rows)
    prune = cell[("mnist", "prune+gauss", 0)]
    assert all(prune["bayes"] > prune[a] + 0.5 for a in ("l2", "l1", "cosine")), prune
    mean, se = paired_gap(rows, ("mnist", "gaussian", 0), "bayes", "l2")
    assert abs(mean) <= max(2 * se, 0.05), (mean, se)
    later = table2_rows(
        datasets=("mnist",), train_steps=(500,), defenses=("prune+gauss",), attacks=("bayes",)
    )
    assert prune["bayes"] > later[0]["psnr"], (prune, later)
