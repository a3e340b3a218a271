"""Tests of the noise defenses, the Monte-Carlo risk and the Bayes-paper experiments' claims."""

from __future__ import annotations

import math

import pytest
import torch

from leakagelib.attacks import Gaussian, Pruned
from leakagelib.bayes_risk import SyntheticGaussian, adversarial_risk, defended
from leakagelib.defenses import GaussianNoise, LaplaceNoise, PruneNoise
from leakagelib.experiments import bayes as bx
from leakagelib.experiments.registry import Context, get

torch.set_num_threads(1)


def big_update() -> dict[str, torch.Tensor]:
    return {"l.weight": torch.ones(200, 100), "l.bias": torch.ones(200)}


def test_gaussian_and_laplace_noise_statistics_and_likelihoods():
    g = torch.Generator().manual_seed(0)
    out = GaussianNoise(0.1).perturb(big_update(), g)
    noise = out["l.weight"] - 1
    assert abs(float(noise.std()) - 0.1) < 0.003 and abs(float(noise.mean())) < 0.003
    out = LaplaceNoise(0.2).perturb(big_update(), g)
    noise = out["l.weight"] - 1
    assert abs(float(noise.abs().mean()) - 0.2) < 0.005  # E|Lap(0, b)| = b
    assert isinstance(GaussianNoise(0.1).likelihood(), Gaussian)
    assert LaplaceNoise(0.2).likelihood().b == 0.2
    with pytest.raises(ValueError, match="positive"):
        GaussianNoise(-1)


def test_prune_noise_mask_is_fixed_per_layer_and_known_to_its_likelihood():
    d = PruneNoise("laplace", 0.1, keep=0.5, mask_seed=3)
    with pytest.raises(ValueError, match="share"):
        d.likelihood()
    g = torch.Generator().manual_seed(0)
    a = d.perturb(big_update(), g)
    b = d.perturb(big_update(), g)
    mask = d.masks["l.weight"]
    assert abs(float(mask.mean()) - 0.5) < 0.02
    # pruned entries carry only noise (mean 0), kept ones the gradient (mean 1)
    assert abs(float(a["l.weight"][mask == 0].mean())) < 0.01
    assert abs(float(b["l.weight"][mask == 1].mean()) - 1) < 0.01
    lik = d.likelihood()
    assert isinstance(lik, Pruned) and lik.masks is not None and lik.noise == "laplace"
    unknown = PruneNoise("laplace", 0.1, keep=0.5, attacker_knows_mask=False)
    assert unknown.likelihood().masks is None  # the mixture over masks, before any share
    stacked = {k: v.unsqueeze(0).repeat(3, *([1] * v.dim())) for k, v in big_update().items()}
    s = d.perturb(stacked, g, stacked=True)
    assert not torch.equal(s["l.weight"][0], s["l.weight"][1])  # fresh noise per slice
    assert abs(float(s["l.weight"][:, mask == 0].mean())) < 0.01  # one mask for all slices
    with pytest.raises(ValueError, match="other shapes"):
        d.perturb({"l.weight": torch.ones(3, 3)})
    assert d.describe()["defense"] == "prune+lap"


def test_risk_of_perfect_and_blind_adversaries_with_wilson_interval():
    task = SyntheticGaussian(seed=0)
    g = torch.Generator().manual_seed(0)
    x, y = task.sample(200, g)
    shared = defended(task, LaplaceNoise(0.1), x, y, g)
    perfect = adversarial_risk(lambda s, l: x.clone(), x=x, shared=shared, labels=y, delta=0.1)
    assert perfect.risk == 0.0 and perfect.low == 0.0 and 0 < perfect.high < 0.03
    blind = adversarial_risk(
        lambda s, l: torch.zeros_like(x), x=x, shared=shared, labels=y, delta=1.0
    )
    assert blind.risk == 1.0 and blind.low > 0.97  # ‖x‖ ≈ √20 ≫ 1
    half = adversarial_risk(
        lambda s, l: torch.zeros_like(x), x=x, shared=shared, labels=y, delta=math.sqrt(19.33)
    )  # median of χ²₂₀ ≈ 19.34
    assert half.low < 0.5 < half.high
    with pytest.raises(ValueError, match="delta"):
        adversarial_risk(lambda s, l: x, x=x, shared=shared, labels=y, delta=0)


def test_fig4_matched_attack_ends_closest():
    """Claim (§6, Fig. 4): Gaussian prior + Laplace conditional ends closest to the input."""
    rec = get("bayes/fig4-synthetic").fn(Context(scale="ci", progress=False))
    dist = {(r["prior"], r["conditional"]): r["final_distance"] for r in rec["rows"]}
    matched = dist[("gaussian", "laplace")]
    assert all(matched < v for k, v in dist.items() if k != ("gaussian", "laplace")), dist
    assert set(rec["curves"]) == {
        "gaussian/gaussian",
        "gaussian/laplace",
        "laplace/gaussian",
        "laplace/laplace",
    }
    assert len(rec["curves"]["gaussian/laplace"]) == 200


def test_table2_paper_branch_runs_on_full_resolution_data(tmp_path, monkeypatch):
    """The paper-scale code path of Table 2 (real resolutions from .npz files, β refinement,
    the stage-3 grid, training before the attack), with its sizes shrunk so that it runs here."""
    import numpy as np

    from leakagelib import data
    from leakagelib.attacks.search import Grid, log_beta_grid

    paths = {}
    for logical, spec in (("mnist", "digits28"), ("cifar10", "patches")):
        # 10 images: a train part of 8 (the other 2 are the file's test part)
        images, labels, _ = data.load(spec, n=10, split="train", shuffle=False)
        paths[logical] = str(tmp_path / f"{logical}.npz")
        np.savez(paths[logical], images=(images * 255).round().byte().numpy(), labels=labels)
    small = dict(
        n_images=2,
        n_tune=1,
        steps=2,
        betas=log_beta_grid()[:2],
        refine=2,
        grid=Grid(lr_factors=(1.0, 0.8), decays=(0.97,), beta_factors=(1.0,)),
        train_images=8,
    )
    monkeypatch.setattr(bx, "_scale", lambda ctx: small)
    ctx = Context(scale="paper", progress=False, data=paths, download=False)
    rows = bx.table2_rows(ctx, steps=(0, 3), defenses=("prune+lap",), attacks=("bayes", "cosine"))
    assert {(r["dataset"], r["step"], r["attack"]) for r in rows} == {
        (d, s, a) for d in ("mnist", "cifar10") for s in (0, 3) for a in ("bayes", "cosine")
    }
    assert all(len(r["psnr_per_image"]) == 2 and np.isfinite(r["psnr"]) for r in rows)
