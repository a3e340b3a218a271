"""The Bayes paper's Table 2 claims at ci scale (slow: about a minute on one free core)."""

from __future__ import annotations

import pytest
import torch

from leakagelib.experiments import bayes as bx
from leakagelib.experiments.registry import Context

torch.set_num_threads(1)


@pytest.mark.slow
def test_table2_claims_on_mnist_stand_in():
    """Claims (Table 2) at ci scale: Bayes wins under prune+noise; equals ℓ2 under Gaussian noise;
    and the Bayes attack recovers better at step 0 than at step 500."""
    ctx = Context(scale="ci", progress=False)
    rows = bx.table2_rows(
        ctx, datasets=("mnist",), steps=(0,), defenses=("gaussian", "prune+gauss")
    )
    cell = bx.summarise_table2(rows)
    prune = cell[("mnist", "prune+gauss", 0)]
    assert all(prune["bayes"] > prune[a] + 0.5 for a in ("l2", "l1", "cosine")), prune
    mean, se = bx.paired_gap(rows, ("mnist", "gaussian", 0), "bayes", "l2")
    assert abs(mean) <= max(2 * se, 0.05), (mean, se)
    later = bx.table2_rows(
        ctx, datasets=("mnist",), steps=(500,), defenses=("prune+gauss",), attacks=("bayes",)
    )
    assert prune["bayes"] > later[0]["psnr"], (prune, later)
