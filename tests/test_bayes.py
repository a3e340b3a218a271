"""Tests of the noise defenses, the Monte-Carlo risk and the Bayes-paper experiments' plumbing."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from leakagelib import data, experiments, models
from leakagelib.attacks import Gaussian, Pruned
from leakagelib.attacks.search import Grid, log_beta_grid
from leakagelib.bayes_risk import SyntheticGaussian, adversarial_risk, defended
from leakagelib.defenses import GaussianNoise, LaplaceNoise, PruneNoise
from leakagelib.experiments import Context, ScaleConfig, bayes_scenario, build_case

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


def shrunk(experiment_id: str, scale: str, **changes: object) -> ScaleConfig:
    """The experiment's config with some values of ``scale`` changed (to run it small here)."""
    config = experiments.get(experiment_id).config
    values = {**(config.ci if scale == "ci" else config.paper), **changes}
    return replace(config, **{scale: values})


def test_fig4_matched_attack_ends_closest():
    """Claim (§6, Fig. 4): Gaussian prior + Laplace conditional ends closest to the input."""
    rec = experiments.run("bayes/fig4-synthetic", "ci", progress=False)
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


def test_table2_paper_branch_runs_on_full_resolution_data(tmp_path):
    """The paper-scale code path of Table 2 (real resolutions from .npz files, β refinement,
    the stage-3 grid, training before the attack), with its sizes shrunk so that it runs here."""
    paths = {}
    for logical, spec in (("mnist", "digits28"), ("cifar10", "patches")):
        # 10 images: a train part of 8 (the other 2 are the file's test part)
        images, labels, _ = data.load(spec, n=10, split="train", shuffle=False)
        paths[logical] = str(tmp_path / f"{logical}.npz")
        np.savez(paths[logical], images=(images * 255).round().byte().numpy(), labels=labels)
    small = shrunk(
        "bayes/table2", "paper", victims=2, steps=2, betas=tuple(log_beta_grid()[:2]), refine=2,
        grid=Grid(lr_factors=(1.0, 0.8), decays=(0.97,), beta_factors=(1.0,)),
        train_steps=(0, 3), defenses=("prune+lap",), attacks=("bayes", "cosine"),
    )  # fmt: skip
    ctx = Context(scale="paper", progress=False, data=paths, download=False, settings=small)
    out = experiments.get("bayes/table2").fn(ctx)
    rows = out["rows"]
    assert {(r["dataset"], r["step"], r["attack"]) for r in rows} == {
        (d, s, a) for d in ("mnist", "cifar10") for s in (0, 3) for a in ("bayes", "cosine")
    }
    assert all(len(r["psnr_per_image"]) == 2 and np.isfinite(r["psnr"]) for r in rows)
    assert out["data"] == {}  # the real resolutions: nothing was resized


def test_ci_stand_ins_and_resolution_come_from_the_config(tmp_path):
    """At ci scale the scenario loads the config's stand-in (8×8 digits for MNIST) through the
    context and average-pools larger images — a --data override too — to the configured size."""
    config = experiments.get("bayes/table2").config
    ctx = Context(scale="ci", progress=False, settings=config)
    assert ctx.resolve("mnist", "digits") == "digits" and ctx.resolve("mnist") == "digits28"
    assert Context(scale="paper").resolve("mnist", "digits") == "mnist"
    model, victims = bayes_scenario.scenario(ctx, "cifar10", 0, 3)
    patches = data.load("patches", n=3, split="train", shuffle=False, constants_of="cifar10")
    assert torch.equal(victims.images, torch.nn.functional.avg_pool2d(patches.images, 4))
    assert victims.normalizer == patches.normalizer
    assert model(victims.normalizer.normalize(victims.images)).shape == (3, 10)
    digits = bayes_scenario.scenario(ctx, "mnist", 0, 2)[1]
    assert digits.name == "digits" and tuple(digits.images.shape) == (2, 1, 8, 8)
    notes = bayes_scenario.data_notes(ctx, ("mnist", "cifar10"))
    assert notes["mnist"].startswith("digits at 8×8") and notes["cifar10"].startswith("patches")
    images, labels, _ = data.load("digits28", n=10, split="train", shuffle=False)
    path = str(tmp_path / "mnist.npz")
    np.savez(path, images=(images * 255).round().byte().numpy(), labels=labels)
    override = Context(scale="ci", progress=False, settings=config, data={"mnist": path})
    assert tuple(bayes_scenario.scenario(override, "mnist", 0, 2)[1].images.shape) == (2, 1, 8, 8)
    with pytest.raises(KeyError, match="unknown defense"):
        bayes_scenario.make_defense("dropout")


def test_tuned_attacks_run_as_one_program_on_a_case():
    """The plumbing of Tables 2 and 5: the attacks of one defense, tuned on the first victim
    (Case.first), then run together on every victim with the tuned settings (Case.attack with a
    list); the rows name attacks by preset id."""
    config = shrunk("bayes/table2", "ci", steps=3, betas=(1e-2, 1.0))
    ctx = Context(scale="ci", progress=False, settings=config)
    images, labels, norm = data.load(
        "digits", n=3, split="train", shuffle=False, constants_of="mnist"
    )
    torch.manual_seed(0)
    model = models.build("bayes-cnn", (1, 8, 8), 10)
    defense = bayes_scenario.make_defense("prune+gauss", seed=0)
    case = build_case(model, images, labels, norm, defense=defense, generator=ctx.generator(1))
    head = case.first(1)
    assert len(head.labels) == 1 and all(v.shape[0] == 1 for v in head.updates.values())
    with pytest.raises(ValueError, match="victims"):
        case.first(4)
    attacks = bayes_scenario.table2_attacks(defense, ("bayes", "l2"), steps=3)
    assert attacks["bayes"].likelihood is not attacks["l2"].likelihood
    assert attacks["bayes"].prior is attacks["l2"].prior  # one prior object: evaluated once
    found = bayes_scenario.tune(ctx, case, attacks, offset=0)
    assert set(found.best) == {"bayes", "l2"}
    assert all(setting.beta in (1e-2, 1.0) for setting in found.best.values())
    psnr = bayes_scenario.attack_tuned(ctx, case, attacks, found, offset=0)
    assert set(psnr) == {"bayes", "l2"} and all(v.shape == (3,) for v in psnr.values())
    alone = case.attack(
        attacks["l2"], settings=[found.best["l2"]], generator=ctx.generator(1)
    )  # the same program with one attack: the same starting points, the same result
    assert torch.allclose(case.score(alone, "psnr"), psnr["l2"], atol=1e-4)
    with pytest.raises(KeyError, match="unknown attacks"):
        bayes_scenario.table2_attacks(defense, ("dlg",), steps=3)


def test_reference_rows_carry_the_row_keys_and_the_papers_numbers():
    """The paper's numbers live with the registrations, keyed like the experiments' rows."""
    table2 = experiments.get("bayes/table2")
    assert len(table2.reference) == 2 * 2 * 4 * 4
    assert all(set(table2.row_keys) <= set(r) for r in table2.reference)
    cell = {r["attack"]: r["psnr"] for r in table2.reference
            if (r["dataset"], r["defense"], r["step"]) == ("cifar10", "prune+lap", 500)}  # fmt: skip
    assert cell == {"bayes": 18.51, "l2": 15.32, "l1": 15.24, "cosine": 15.51}
    assert {r["attack"] for r in table2.reference} == set(table2.config.ci["attacks"])
    table5 = experiments.get("bayes/table5-priors")
    laplacian = next(r for r in table5.reference if r["defense"] == "laplacian")
    assert (laplacian["psnr_tv"], laplacian["psnr_tv_range"], laplacian["step"]) == (
        15.47,
        15.76,
        500,
    )
    for exp_id in ("bayes/table2", "bayes/table5-priors", "bayes/fig7-mc-samples"):
        config = experiments.get(exp_id).config
        assert set(config.ci) == set(config.sources), exp_id  # every setting says its source


def test_the_network_is_never_trained_on_its_victims(monkeypatch):
    """Step-500 rows: the victims are the first images of the train split and training uses the
    rest of it — no victim image is among the training images."""
    seen = {}

    def fake_train(model, images, labels, **options):
        seen["images"] = images
        return type("Trained", (), {"model": model})()

    monkeypatch.setattr(bayes_scenario.fl, "train", fake_train)
    ctx = Context(scale="ci", progress=False, settings=experiments.get("bayes/table2").config)
    _, victims = bayes_scenario.scenario(ctx, "mnist", 500, 6)
    trained_on = seen["images"].flatten(1)
    attacked = victims.normalizer.normalize(victims.images).flatten(1)
    assert trained_on.shape[0] > 0
    assert not (trained_on[:, None, :] == attacked[None]).all(-1).any(), "a victim was trained on"
    pool = data.load("digits", split="train", constants_of="mnist")
    assert trained_on.shape[0] == len(pool.labels) - 6
