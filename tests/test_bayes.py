"""Tests of the noise defenses, the Monte-Carlo risk and the Bayes-paper experiments' plumbing."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from leakagelib import data, experiments, models
from leakagelib.attacks import Gaussian, Pruned
from leakagelib.bayes_risk import SyntheticGaussian, adversarial_risk, defended
from leakagelib.defenses import GaussianNoise, LaplaceNoise, PruneNoise
from leakagelib.experiments import Context, ScaleConfig, bayes_scenario, build_case, paired
from leakagelib.experiments.resume import PartialRecord
from leakagelib.records import jsonable

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
    """Claim (§6, Fig. 4): Gaussian prior + Laplace conditional ends closest to the input, on
    seed 1 (the chapter "The Bayes-optimal adversary" asserts it on seed 0)."""
    rec = experiments.run("bayes/fig4-synthetic", "ci", seed=1, progress=False)
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
    """The paper-scale code path of Table 2 (real resolutions from .npz files, the authors'
    tuners' stage-1 factors and refinement, training before the attack), with its sizes shrunk
    so that it runs here (the grids run in test_estimate.py's search test)."""
    paths = {}
    for logical, spec in (("mnist", "digits28"), ("cifar10", "patches")):
        # 10 images: a train part of 8 (the other 2 are the file's test part)
        images, labels, _ = data.load(spec, n=10, split="train", shuffle=False)
        paths[logical] = str(tmp_path / f"{logical}.npz")
        np.savez(paths[logical], images=(images * 255).round().byte().numpy(), labels=labels)
    small = shrunk(
        "bayes/table2", "paper", victims=2, tune_victims=2, cosine_group=2, steps=2,
        anneal_steps=1, refine=2, grid=False, train_steps=(0, 3), defenses=("prune+lap",),
        attacks=("bayes", "cosine"),
    )  # fmt: skip
    ctx = Context(scale="paper", progress=False, data=paths, download=False, settings=small)
    rows = experiments.get("bayes/table2").fn(ctx)
    assert {(r["dataset"], r["step"], r["attack"]) for r in rows} == {
        (d, s, a) for d in ("mnist", "cifar10") for s in (0, 3) for a in ("bayes", "cosine")
    }
    assert all(len(r["psnr_per_image"]) == 2 and np.isfinite(r["psnr"]) for r in rows)
    # what the search chose, so that a cell that misses the paper can be traced to its tuning
    assert all(r["tuned"]["beta"] >= 0 and r["tuned"]["lr"] > 0 for r in rows)
    assert all(np.isfinite(r["tuning_psnr"]) for r in rows)
    assert all((r["tune_victims"], r["cosine_group"]) == (2, 2) for r in rows)
    for r in rows:  # the first victims and their reconstructions, for the chapter's figure
        side = 28 if r["dataset"] == "mnist" else 32
        assert np.asarray(r["original"]).shape[1:] == np.asarray(r["reconstruction"]).shape[1:]
        assert np.asarray(r["reconstruction"]).shape[0] == 2 and len(r["original"][0][0]) == side
    assert json.loads(json.dumps(jsonable(rows))) == jsonable(rows), "rows must be JSON"


def test_ci_attacks_the_stand_ins_and_overrides_at_their_own_resolution(tmp_path):
    """At ci scale the scenario attacks MNIST-sized digits28 and CIFAR-sized patches as they are
    (no resizing), and a --data override keeps its resolution too."""
    config = experiments.get("bayes/table2").config
    ctx = Context(scale="ci", progress=False, settings=config)
    model, victims = bayes_scenario.scenario(ctx, "cifar10", 0, 3)
    patches = data.load("patches", n=3, split="train", shuffle=False, constants_of="cifar10")
    assert torch.equal(victims.images, patches.images)
    assert victims.normalizer == patches.normalizer and victims.images.shape[1:] == (3, 32, 32)
    assert model(victims.normalizer.normalize(victims.images)).shape == (3, 10)
    digits = bayes_scenario.scenario(ctx, "mnist", 0, 2)[1]
    assert digits.name == "digits28" and tuple(digits.images.shape) == (2, 1, 28, 28)
    images, labels, _ = data.load("digits28", n=10, split="train", shuffle=False)
    images = images.flip(-1)  # not the stand-in's images
    path = str(tmp_path / "mnist.npz")
    np.savez(path, images=(images * 255).round().byte().numpy(), labels=labels)
    override = Context(scale="ci", progress=False, settings=config, data={"mnist": path})
    loaded = bayes_scenario.scenario(override, "mnist", 0, 2)[1].images
    assert tuple(loaded.shape) == (2, 1, 28, 28)
    assert torch.allclose(
        loaded,
        images[override.dataset("mnist", 2, split="train", shuffle=False).indices],
        atol=1 / 255,
    )
    with pytest.raises(KeyError, match="unknown defense"):
        bayes_scenario.make_defense("dropout")


@pytest.mark.parametrize(
    ("defense", "heuristic", "factor"),
    [(GaussianNoise(0.1), "l2", 100.0), (LaplaceNoise(0.1), "l1", 10.0)],
)
def test_bayes_is_the_matching_heuristic_up_to_a_constant_under_plain_noise(
    defense, heuristic, factor
):
    """Table 2's Gaussian and Laplacian cells: the Bayes attack's objective is ℓ2's (1/σ² = 100)
    or ℓ1's (1/b = 10) times a constant, so with β divided by it — a power of ten, on the
    search's grid — the two attacks take identical steps: those cells compare the heuristics,
    not Bayes with them (why the ci scale skips them)."""
    images, labels, norm = data.load(
        "digits", n=2, split="train", shuffle=False, constants_of="mnist"
    )
    torch.manual_seed(0)
    model = models.build("bayes-cnn", (1, 8, 8), 10)
    case = build_case(model, images, labels, norm, defense=defense,
                      generator=torch.Generator().manual_seed(1))  # fmt: skip
    attacks = bayes_scenario.table2_attacks(defense, ("bayes", heuristic), steps=5)
    results = [
        case.attack(
            attacks[name],
            settings=[replace(attacks[name].config.setting(), beta=beta)],
            generator=torch.Generator().manual_seed(2),
        )  # fmt: skip
        for name, beta in (("bayes", 1.0), (heuristic, 1.0 / factor))
    ]
    assert torch.allclose(results[0].inputs(), results[1].inputs(), atol=1e-5)


def test_table5_against_paper_sets_intervals_over_images_beside_the_papers_numbers():
    from leakagelib.experiments.bayes_claims import table5_against_paper

    rows = [{"defense": "gaussian", "psnr_per_image_tv": [14.0, 16.0, 18.0],
             "psnr_per_image_tv_range": [15.0, 16.5, 19.5]}]  # fmt: skip
    reference = experiments.get("bayes/table5-priors").reference
    [(defense, found)] = table5_against_paper(rows, reference).items()
    assert defense == "gaussian" and (found["paper_tv"], found["paper_tv_range"]) == (16.18, 16.3)
    assert found["tv"] == paired.mean_interval([14.0, 16.0, 18.0])
    assert (found["tv"].mean, found["tv"].n) == (16.0, 3)  # sd 2, t(0.975, 2) = 4.303
    assert math.isclose(found["tv"].high - 16.0, 4.302653 * 2 / math.sqrt(3), rel_tol=1e-5)
    assert found["gain"] == paired.paired_interval([15.0, 16.5, 19.5], [14.0, 16.0, 18.0])
    assert math.isclose(found["paper_gain"], 16.3 - 16.18)
    with pytest.raises(ValueError, match="at least two values"):
        paired.mean_interval([1.0])


def test_table2_against_paper_pairs_bayes_with_each_heuristic_on_the_same_images():
    from leakagelib.experiments.bayes_claims import table2_against_paper

    per_image = {"bayes": [18.0, 19.0, 20.0], "l2": [14.0, 16.0, 15.0], "cosine": [17.0, 17.5, 18]}
    rows = [{"dataset": "mnist", "defense": "prune+gauss", "step": 0, "attack": a,
             "psnr": sum(v) / 3, "psnr_per_image": v} for a, v in per_image.items()]  # fmt: skip
    reference = experiments.get("bayes/table2").reference
    [(key, cell)] = table2_against_paper(rows, reference).items()
    assert key == ("mnist", "prune+gauss", 0) and set(cell["gaps"]) == {"l2", "cosine"}
    assert cell["paper"] == {"bayes": 18.40, "l2": 14.44, "cosine": 16.72}  # the paper's Table 2
    assert math.isclose(cell["paper_gaps"]["l2"], 18.40 - 14.44)
    assert cell["gaps"]["l2"] == paired.paired_interval(per_image["bayes"], per_image["l2"])
    assert cell["psnr"]["cosine"] == paired.mean_interval(per_image["cosine"])


def test_paired_interval_is_students_t_and_refuses_unpaired_input():
    gap = paired.paired_interval([3.0, 5.0, 7.0], [1.0, 2.0, 3.0])
    assert (gap.mean, gap.n) == (3.0, 3)  # differences 2, 3, 4: sd 1, t(0.975, 2) = 4.303
    assert math.isclose(gap.high - gap.mean, 4.302653 / math.sqrt(3), rel_tol=1e-5)
    assert math.isclose(gap.mean - gap.low, gap.high - gap.mean)
    assert f"{paired.PairedGap(0.77, 0.47, 1.07, 3, 0.95):+.2f}" == "+0.77 (+0.47 to +1.07)"
    assert f"{gap}" == repr(gap)
    rows = [
        {"dataset": "mnist", "defense": "prune+lap", "step": 0, "attack": a, "psnr_per_image": v}
        for a, v in (("bayes", [3.0, 5.0, 7.0]), ("l2", [1.0, 2.0, 3.0]))
    ]
    assert bayes_scenario.paired_gap(rows, ("mnist", "prune+lap", 0), "bayes", "l2") == gap
    with pytest.raises(ValueError, match="one per image"):
        paired.paired_interval([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="confidence"):
        paired.paired_interval([1.0, 2.0], [0.0, 0.0], confidence=95)


def test_crossed_interval_counts_networks_and_images_and_covers_the_mean():
    """One network repeated is :func:`mean_interval` of its images; networks that differ widen
    the interval; over simulated networks × images (random effects) it covers the true mean
    about 95 % of the time, where one network's image interval does not."""
    x = np.random.default_rng(0).normal(size=30)
    same, one = paired.crossed_interval([x, x, x]), paired.mean_interval(x)
    assert (same.low, same.mean, same.high, same.n) == pytest.approx(
        (one.low, one.mean, one.high, 30)
    )
    shifted = paired.crossed_interval([x, x + 1.0, x + 2.0])
    assert math.isclose(shifted.mean, float(x.mean()) + 1.0)
    assert shifted.high - shifted.low > 4.0  # t(2) · 1 / √3 · 2: the seeds' spread dominates
    rng = np.random.default_rng(1)
    crossed = alone = 0
    for _ in range(400):
        y = rng.normal(0, 1, (3, 1)) + rng.normal(0, 2, (1, 40)) + rng.normal(0, 1, (3, 40))
        crossed += (g := paired.crossed_interval(y)).low < 0 < g.high
        alone += (g := paired.mean_interval(y[0])).low < 0 < g.high
    assert 0.92 <= crossed / 400 <= 0.98 and alone / 400 < 0.85
    with pytest.raises(ValueError, match="one row per network"):
        paired.crossed_interval([[1.0, 2.0]])


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
    found = bayes_scenario.tune(ctx, case, attacks, offset=0, defense="prune+gauss")
    assert set(found.best) == {"bayes", "l2"}
    assert all(setting.beta in (1e-2, 1.0) for setting in found.best.values())
    psnr, images = bayes_scenario.attack_tuned(ctx, case, attacks, found, offset=0)
    assert set(psnr) == {"bayes", "l2"} and all(v.shape == (3,) for v in psnr.values())
    assert all(torch.equal(case.score_images(images[a]), psnr[a]) for a in psnr)
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
        seen["images"], seen["defense"] = images, options["defense"]
        return type("Trained", (), {"model": model})()

    monkeypatch.setattr(bayes_scenario.fl, "train", fake_train)
    ctx = Context(scale="ci", progress=False, settings=experiments.get("bayes/table2").config)
    with pytest.raises(ValueError, match="name the defense"):
        bayes_scenario.scenario(ctx, "mnist", 500, 6)
    _, victims = bayes_scenario.scenario(ctx, "mnist", 500, 6, defense="laplacian")
    assert isinstance(seen["defense"], LaplaceNoise), "trained under the cell's defense"
    trained_on = seen["images"].flatten(1)
    attacked = victims.normalizer.normalize(victims.images).flatten(1)
    assert trained_on.shape[0] > 0
    assert not (trained_on[:, None, :] == attacked[None]).all(-1).any(), "a victim was trained on"
    pool = data.load("digits28", split="train", constants_of="mnist")
    assert trained_on.shape[0] == len(pool.labels) - 6


def test_fig7_rows_carry_each_images_curve_summary():
    """Fig. 7's rows: one per k, with per-image final and mean PSNR (for paired comparisons) and
    the victims' mean PSNR per step; δ = 9 on the 28×28 ci digits (A.6)."""
    config = shrunk("bayes/fig7-mc-samples", "ci", victims=2, steps=3, mc_samples=(1, 2))
    rows = experiments.get("bayes/fig7-mc-samples").fn(
        Context(scale="ci", progress=False, settings=config)
    )
    assert [r["k"] for r in rows] == [1, 2] and all(r["delta"] == 9.0 for r in rows)
    for r in rows:
        assert len(r["psnr_per_image"]) == len(r["psnr_mean_per_image"]) == 2
        assert len(r["curve"]) == 3 and math.isclose(r["psnr"], r["curve"][-1], rel_tol=1e-6)
        assert math.isclose(r["psnr_mean"], sum(r["curve"]) / 3, rel_tol=1e-6)


FAST_SOTERIA = {"hidden": (64, 32), "attack_steps": 2}


@pytest.mark.parametrize(
    ("exp_id", "changes"),
    [
        ("bayes/fig7-mc-samples", {"victims": 2, "steps": 2, "mc_samples": (1, 2)}),
        ("bayes/fig5-soteria-layers", {"victims": 1, **FAST_SOTERIA}),
        ("bayes/fig2-training", {"train_steps": (0, 2), "fig3_step": 2, "ats_attack_steps": 2,
                                 "ats_victims": 1, "soteria_victims": 1, **FAST_SOTERIA}),
    ],
)  # fmt: skip
def test_a_resumed_run_skips_finished_units_and_gives_the_same_record(exp_id, changes, tmp_path):
    """Fig. 7 (a unit per k), Fig. 5 (per defended layer) and Fig. 2 (per defense and training
    step) keep each finished unit in the partial record; a run that lost its last unit
    recomputes only that one (each network trained once, when a unit needs it) and ends with
    the record of the uninterrupted run."""
    config = shrunk(exp_id, "ci", **changes)
    path = tmp_path / "partial.json"

    def run(resume: bool) -> object:
        partial = PartialRecord(path, {"experiment": exp_id}, resume=resume)
        ctx = Context(scale="ci", progress=False, settings=config, partial=partial)
        return jsonable(experiments.get(exp_id).fn(ctx))

    whole = run(resume=False)
    saved = json.loads(path.read_text())
    assert len(saved["units"]) > 1
    lost = list(saved["units"])[-1]
    del saved["units"][lost], saved["seconds"][lost]
    path.write_text(json.dumps(saved))
    assert run(resume=True) == whole
    assert list(json.loads(path.read_text())["units"]) == list(saved["units"]) + [lost]


def test_table2_misses_lists_the_cells_whose_paper_number_lies_outside_the_interval():
    from leakagelib.experiments.bayes_claims import table2_against_paper, table2_misses

    per_image = {
        "bayes": [18.3, 18.4, 18.5],
        "l2": [14.4, 14.5, 14.6],
        "cosine": [15.4, 15.5, 15.6],
    }
    rows = [{"dataset": "mnist", "defense": "prune+gauss", "step": 0, "attack": a,
             "psnr": sum(v) / 3, "psnr_per_image": v} for a, v in per_image.items()]  # fmt: skip
    # the paper: bayes 18.40 (inside), l2 14.44 (inside), cosine 16.72 (above the interval)
    misses = table2_misses(table2_against_paper(rows, experiments.get("bayes/table2").reference))
    assert misses["cosine"] == {"below": [("mnist", "prune+gauss", 0)], "above": []}
    assert misses["bayes"] == misses["l2"] == {"below": [], "above": []}
    rows[1]["psnr_per_image"] = [14.0, 14.1, 14.2]  # now the paper's 14.44 lies above ℓ2's interval
    against = table2_against_paper(rows, experiments.get("bayes/table2").reference)
    assert table2_misses(against)["l2"]["below"] == [("mnist", "prune+gauss", 0)]
    # with the paper's own sampling error counted (√2 wider), ℓ2's miss is within reach, and a
    # miss by more than √2 times the interval stays
    assert table2_misses(against, paper_spread=True)["l2"] == {"below": [], "above": []}
    assert table2_misses(against, paper_spread=True)["cosine"]["below"] == [
        ("mnist", "prune+gauss", 0)
    ]


def test_table2_pruning_lead_names_the_cells_where_bayes_is_not_ahead_as_the_paper_is():
    from leakagelib.experiments.bayes_claims import table2_against_paper, table2_pruning_lead

    per_image = {
        "bayes": [18.3, 18.4, 18.9],
        "l2": [14.4, 14.5, 14.6],
        "cosine": [18.2, 18.6, 18.7],
    }
    rows = [{"dataset": "mnist", "defense": defense, "step": 0, "attack": a,
             "psnr": sum(v) / 3, "psnr_per_image": v}
            for defense in ("prune+gauss", "gaussian") for a, v in per_image.items()]  # fmt: skip
    lead = table2_pruning_lead(
        table2_against_paper(rows, experiments.get("bayes/table2").reference)
    )
    # the plain Gaussian cell is not a pruning cell; in the pruning cell the paper's Bayes beats
    # both heuristics, and this run's beats ℓ2 but ties the cosine attack (interval across zero)
    assert lead["cells"] == [("mnist", "prune+gauss", 0)]
    assert (lead["compared"], lead["ahead"], lead["paper_ahead"]) == (2, 1, 2)
    assert [(k, a) for k, a, _ in lead["behind"]] == [(("mnist", "prune+gauss", 0), "cosine")]


def test_the_table2_record_puts_bayes_ahead_in_the_pruning_cells_as_the_paper_does():
    """The issue's test of Table 2 at paper scale, on the committed record (the chapter asserts
    the same): in each of the eight pruning cells the Bayes attack's paired gain over each
    heuristic has its interval above zero, over the record's 100 images, as the paper's Bayes
    is ahead of each."""
    from leakagelib.experiments.bayes_claims import table2_against_paper, table2_pruning_lead
    from leakagelib.records import paper_record

    record = paper_record("bayes/table2")
    assert record is not None, "results/bayes-table2.json: the chapter reads it"
    against = table2_against_paper(record["rows"], experiments.get("bayes/table2").reference)
    lead = table2_pruning_lead(against)
    pruned = lead["cells"]
    assert {(d, s) for d, _, s in pruned} == {
        (d, s) for d in ("mnist", "cifar10") for s in (0, 500)
    }
    assert len(pruned) == 8 and all(against[k]["psnr"]["bayes"].n == 100 for k in pruned)
    assert lead["compared"] == lead["paper_ahead"] == lead["ahead"] == 8 * 3, lead
    assert not lead["behind"]


@pytest.mark.parametrize("count", [2.5, 10.0, 0])
def test_the_synthetic_task_needs_a_whole_number_of_classes(count):
    with pytest.raises((TypeError, ValueError), match="num_classes must be an integer >= 1"):
        SyntheticGaussian(num_classes=count)
