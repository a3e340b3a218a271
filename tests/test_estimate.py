"""Estimates of an experiment's time before it starts: declared work × probed step times."""

from __future__ import annotations

import inspect
import sys
from collections import Counter
from dataclasses import replace

import pytest
import torch

from leakagelib import experiments, models
from leakagelib.attacks import Gaussian, preset
from leakagelib.attacks.search import BayesGrid, HeuristicGrid, Tuner, search, stage_sizes
from leakagelib.cli import main
from leakagelib.data import Normalizer
from leakagelib.experiments import build_case, estimate, registry
from leakagelib.experiments.bayes_scenario import make_defense, table2_attacks
from leakagelib.experiments.config import ScaleConfig
from leakagelib.experiments.registry import Context
from leakagelib.experiments.rgap_common import solve_net
from leakagelib.experiments.work import KINDS, Load, Net, Objective

TINY = Net("tiny-mlp", lambda: models.build("mlp", (1, 8, 8), 10, widths=(16,)), (1, 8, 8))

#: Seconds per image of a step of each kind that the fake probe answers.
FAKE = {"attack": 0.01, "train": 0.005, "forward": 0.001, "solve": 2.0, "diagnose": 7.0}


@pytest.fixture
def fake_probe(monkeypatch):
    """Step times without timing anything: FAKE[kind] per image; the probes asked are listed."""
    asked: list[tuple[str, ...]] = []

    def fake(net: Net, kind: str, images: int, device: str, objective=None) -> float:
        asked.append((net.key, kind, images, *([objective.key] if objective else [])))
        return FAKE[kind] * images

    monkeypatch.setattr(estimate, "step_seconds", fake)
    return asked


@pytest.fixture
def toy(monkeypatch):
    """``test/work``: ``units`` units (3 at ci, 6 at paper) of 100 attack steps on 8 images."""
    monkeypatch.setattr(registry, "_EXPERIMENTS", dict(registry._EXPERIMENTS))

    def fn(ctx: Context) -> list[dict]:
        return ctx.units(range(ctx.config.units), lambda k: [{"unit": k}], "toy")

    registry.experiment(
        "test/work",
        row_keys=("unit",),
        config=ScaleConfig(ci={"units": 3}, paper={"units": 6}),
        work=lambda ctx: [[Load(TINY, "attack", 8, 100)] for _ in range(ctx.config.units)],
    )(fn)
    return experiments.get("test/work")


def test_the_plan_prints_an_estimate_for_an_experiment_not_started(
    toy, fake_probe, tmp_path, capsys
):
    args = ["campaign", "--only", "test/work", "--quiet", "--results", str(tmp_path)]
    assert main(args) == 0
    plan = capsys.readouterr().out.splitlines()
    # 3 units × 100 steps × 8 images × 10 ms
    assert plan[0] == (
        "test/work                    to run, about 24 s (estimate: 3 units; "
        "tiny-mlp: 300 attack steps of 8 images at 80 ms each)"
    )
    assert plan[1] == "total left: about 24 s"
    assert plan[2].startswith("(estimates: each experiment's declared work × step times probed")
    assert fake_probe == [("tiny-mlp", "attack", 8)], "one probe per (model, kind, batch)"


def test_the_estimate_scales_with_the_work(toy, fake_probe):
    timer = estimate.Estimator()
    assert timer.of(toy, "paper").seconds == pytest.approx(2 * timer.of(toy, "ci").seconds)
    # a real experiment: twice its positions, twice its time
    exp = experiments.get("cvb/table2-placement")
    ci = dict(exp.config.ci)
    doubled = replace(exp, config=replace(exp.config, ci={**ci, "positions": ci["positions"] * 2}))
    once, twice = timer.of(exp, "ci"), timer.of(doubled, "ci")
    assert twice.units == 2 * once.units and twice.seconds == pytest.approx(2 * once.seconds)


def test_an_experiment_without_declared_work_has_no_estimate(monkeypatch):
    monkeypatch.setattr(registry, "_EXPERIMENTS", dict(registry._EXPERIMENTS))
    registry.experiment("test/unknown", row_keys=("x",))(lambda ctx: [{"x": 0}])
    assert estimate.Estimator().of(experiments.get("test/unknown"), "ci") is None


@pytest.mark.parametrize("scale", ["ci", "paper"])
def test_every_experiment_declares_its_work(scale):
    for exp_id in experiments.available():
        exp = experiments.get(exp_id)
        assert exp.work is not None, f"{exp_id} declares no work"
        units = exp.work(Context(scale=scale, progress=False, settings=exp.config))
        assert units and all(isinstance(load, Load) for unit in units for load in unit), exp_id


class _Units(Exception):
    """Raised by :func:`_run_units` at a run's first ``ctx.units`` call, with its unit count."""

    def __init__(self, count: int) -> None:
        self.count = count


def _run_units(exp: registry.Experiment, ctx: Context, monkeypatch) -> int:
    """The number of units ``exp``'s run in ``ctx`` computes: its keys at its ``ctx.units`` call
    (the run stops there), or one unit for a run that never splits into units."""
    if ".units(" not in inspect.getsource(exp.fn):
        return 1

    def stop(self, keys, compute, desc):
        raise _Units(len(list(keys)))

    monkeypatch.setattr(Context, "units", stop)
    module = sys.modules[exp.fn.__module__]
    if hasattr(module, "scenario"):  # the network at step 0: no unit count needs it trained
        scenario = module.scenario
        monkeypatch.setattr(
            module, "scenario", lambda c, name, step, n, **kw: scenario(c, name, 0, n)
        )
    with pytest.raises(_Units) as found:
        exp.fn(ctx)
    return found.value.count


BAYES = sorted(i for i in experiments.available() if i.startswith("bayes/"))


@pytest.mark.parametrize("scale", ["ci", "paper"])
@pytest.mark.parametrize("exp_id", BAYES)
def test_a_bayes_experiment_declares_one_entry_per_unit_of_its_run(exp_id, scale, monkeypatch):
    """At paper scale on the embedded data (the runs stop at their units before any attack)."""
    exp = experiments.get(exp_id)
    data = {"mnist": "digits28", "cifar10": "patches"} if scale == "paper" else {}
    ctx = Context(scale=scale, progress=False, settings=exp.config, data=data, download=False)
    declared = len(exp.work(ctx))
    assert declared == _run_units(exp, ctx, monkeypatch), exp_id


def test_table2_counts_the_search_the_final_attacks_and_the_training_at_paper_scale():
    exp = experiments.get("bayes/table2")
    units = exp.work(Context(scale="paper", progress=False, settings=exp.config))
    assert len(units) == 16, "(MNIST, CIFAR-10) × training steps (0, 500) × four defenses"
    for unit, step in zip(units, [0] * 4 + [500] * 4 + [0] * 4 + [500] * 4, strict=True):
        train = [load for load in unit if load.kind == "train"]
        # at step 500 a network per defense, trained under it with batch 1 (SCENARIO)
        assert [(t.images, t.steps) for t in train] == ([(1, 500)] if step else [])
        attacks = [load for load in unit if load.kind == "attack"]
        assert {load.steps for load in attacks} == {200}
        # on ten tuning victims (the authors' one loader batch): the heuristic tuner's 41 log
        # values, 20 linear ones and 480-setting grid for ℓ2, ℓ1 and cosine, the Bayes tuner's
        # 24, 20 and 540 (§6's counts); then every attack on the 100 victims
        per_defense = 10 * (3 * (41 + 20 + 480) + (24 + 20 + 540)) + 4 * 100
        assert sum(load.images for load in attacks) == per_defense
    # each attack's steps are probed with its own likelihood against the unit's defense
    for unit, defense in zip(units, exp.config.paper["defenses"] * 4, strict=True):
        keys = {load.objective.key for load in unit if load.kind == "attack"}
        assert keys == {f"{a} on {defense}" for a in ("bayes", "l2", "l1", "cosine")}


def test_an_attack_probe_runs_the_objective_on_its_defense_s_updates(monkeypatch):
    monkeypatch.setattr(estimate, "PROBE_SECONDS", 0.01)
    seen = []

    def attack(defense):  # the pruned likelihood needs the mask the defense drew on share()
        seen.append(defense)
        return table2_attacks(defense, ["bayes"], steps=1)["bayes"]

    objective = Objective("bayes on prune+gauss", attack, lambda: make_defense("prune+gauss"))
    assert estimate.step_seconds(TINY, "attack", 2, "cpu", objective) > 0
    assert len(seen) == 1 and isinstance(seen[0], type(make_defense("prune+gauss")))
    with pytest.raises(ValueError, match="only an attack load"):
        Load(TINY, "train", 2, 1, objective)


def test_search_runs_as_many_candidates_per_stage_as_counted():
    model = models.build("mlp", (1, 4, 4), 3, widths=(6,))
    images, labels = torch.rand(1, 1, 4, 4), torch.tensor([1])
    case = build_case(model, images, labels, Normalizer.identity())
    attacks = {a: preset(a, steps=2).with_config(anneal_steps=1) for a in ("l2", "cosine")}
    attacks["bayes"] = preset("bayes", likelihood=Gaussian(sigma=1.0), steps=2).with_config(
        anneal_steps=1
    )
    small = HeuristicGrid(end_factors=(1.0, 2.0), start_factors=(1.0,), lr_factors=(1.0,),
                          decays=(0.9, 0.95))  # fmt: skip  # 2 × 2 × 2 weightings = 8
    tuners = {a: Tuner(factors=(1.0, 0.1, 0.01), refine=2, grid=small) for a in ("l2", "cosine")}
    tuners["bayes"] = Tuner("bayes", factors=(10.0, 1.0), refine=2, noise=0.1,
                            grid=BayesGrid(start_factors=(1.0, 3.0), prior_weights=(0.1,),
                                           lr_factors=(1.0,), decays=(0.98, 1.0)))  # fmt: skip
    found = search(case.model, case.updates, labels=case.labels.unsqueeze(1),
                   truth=case.images.unsqueeze(1), denormalize=lambda x: x, attacks=attacks,
                   tuners=tuners, input_shape=case.input_shape)  # fmt: skip
    ran = Counter(row["stage"] for row in found.rows)
    counted = stage_sizes(list(tuners.values()))
    assert counted == dict(ran) == {"log-beta": 8, "linear-beta": 6, "grid": 8 + 8 + 4}
    assert stage_sizes([Tuner(refine=0)]) == {"log-beta": 41}


def test_paper_scale_work_is_counted_from_the_config():
    exp = experiments.get("cvb/table3-attacks")
    units = exp.work(Context(scale="paper", progress=False, settings=exp.config))
    assert len(units) == 12, "2 datasets × 2 defenses × 3 attacks"
    steps = {load.steps for unit in units for load in unit}
    assert steps == {20_000, 2_000 * 20}, "IG iterations; L-BFGS steps at 20 evaluations"
    assert {load.images for unit in units for load in unit} == {128}
    fig4 = experiments.get("rgap/fig4-resnet-skip")
    loads = fig4.work(Context(scale="paper", progress=False, settings=fig4.config))[0]
    assert loads[0].kind == "train" and loads[0].steps == (50_000 - 5_000) // 128 * 200


def test_wide_batches_are_extrapolated_linearly_from_two_images_and_the_cap(monkeypatch):
    monkeypatch.setitem(estimate._PROBES, "attack", lambda net, batch, device: 0.1 + 0.01 * batch)
    assert estimate.step_seconds(TINY, "attack", 100, "cpu") == pytest.approx(0.1 + 0.01 * 100)


@pytest.mark.parametrize(("per_image", "probed"), [(0.001, [2, 8, 128]), (0.1, [2, 8])])
def test_an_attack_is_probed_at_a_program_where_that_step_is_short(per_image, probed, monkeypatch):
    asked = []

    def step(net, batch, device):  # slower per image in small batches, as a real step is
        asked.append(batch)
        return per_image * batch + (0.01 if batch < 100 else 0.0)

    monkeypatch.setitem(estimate._PROBES, "attack", step)
    seconds = estimate.step_seconds(TINY, "attack", 5_400, "cpu")
    assert asked == probed
    (a, ta), (b, tb) = [(n, per_image * n + (0.01 if n < 100 else 0.0)) for n in probed[-2:]]
    assert seconds == pytest.approx(tb + (5_400 - b) * (tb - ta) / (b - a))


@pytest.mark.parametrize("kind", KINDS)
def test_the_probes_time_real_steps(kind, monkeypatch):
    monkeypatch.setattr(estimate, "PROBE_SECONDS", 0.01)
    net = solve_net((1, 8, 8), "logreg", ()) if kind in ("solve", "diagnose") else TINY
    assert estimate.step_seconds(net, kind, 2, "cpu") > 0


def test_durations_are_written_in_a_unit_a_reader_plans_with():
    assert [estimate.format_duration(s) for s in (42, 600, 7200, 3 * 86400)] == [
        "42 s",
        "10 min",
        "2.0 h",
        "3.0 days",
    ]
