"""Estimates of an experiment's time before it starts: declared work × probed step times."""

from __future__ import annotations

from dataclasses import replace

import pytest

from leakagelib import experiments, models
from leakagelib.cli import main
from leakagelib.experiments import estimate, registry
from leakagelib.experiments.config import ScaleConfig
from leakagelib.experiments.registry import Context
from leakagelib.experiments.rgap_common import solve_net
from leakagelib.experiments.work import KINDS, Load, Net

TINY = Net("tiny-mlp", lambda: models.build("mlp", (1, 8, 8), 10, widths=(16,)), (1, 8, 8))

#: Seconds per image of a step of each kind that the fake probe answers.
FAKE = {"attack": 0.01, "train": 0.005, "forward": 0.001, "solve": 2.0}


@pytest.fixture
def fake_probe(monkeypatch):
    """Step times without timing anything: FAKE[kind] per image; the probes asked are listed."""
    asked: list[tuple[str, str, int]] = []

    def fake(net: Net, kind: str, images: int, device: str) -> float:
        asked.append((net.key, kind, images))
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
def test_the_cvb_rgap_and_intro_experiments_declare_their_work(scale):
    declared = [i for i in experiments.available() if experiments.get(i).work is not None]
    assert {i for i in experiments.available() if not i.startswith("bayes/")} <= set(declared)
    for exp_id in declared:
        exp = experiments.get(exp_id)
        units = exp.work(Context(scale=scale, progress=False, settings=exp.config))
        assert units and all(isinstance(load, Load) for unit in units for load in unit), exp_id


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


@pytest.mark.parametrize("kind", KINDS)
def test_the_probes_time_real_steps(kind, monkeypatch):
    monkeypatch.setattr(estimate, "PROBE_SECONDS", 0.01)
    net = solve_net((1, 8, 8), "logreg", ()) if kind == "solve" else TINY
    assert estimate.step_seconds(net, kind, 2, "cpu") > 0


def test_durations_are_written_in_a_unit_a_reader_plans_with():
    assert [estimate.format_duration(s) for s in (42, 600, 7200, 3 * 86400)] == [
        "42 s",
        "10 min",
        "2.0 h",
        "3.0 days",
    ]
