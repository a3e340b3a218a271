"""A campaign end to end on real experiments at a tiny scale: plan, skip, interrupt, resume."""

from __future__ import annotations

from dataclasses import replace

import pytest

from leakagelib import experiments
from leakagelib.cli import main
from leakagelib.experiments import cvb_precode, estimate, registry
from leakagelib.records import read_record, record_filename

IDS = ("intro/bias-attack", "cvb/table2-placement")


@pytest.fixture
def tiny(monkeypatch):
    """cvb/table2-placement at a tiny ci scale (two positions, one victim, two IG steps, one
    round); an armed FedAvg raises KeyboardInterrupt in the second unit; probes are faked."""
    exp = experiments.get("cvb/table2-placement")
    small = {"victims": 1, "ig_steps": 2, "rounds": 1, "n_train": 32, "positions": (0, 3)}
    config = replace(exp.config, ci={**exp.config.ci, **small})
    monkeypatch.setitem(registry._EXPERIMENTS, exp.id, replace(exp, config=config))
    monkeypatch.setattr(
        estimate, "step_seconds", lambda net, kind, images, device, objective=None: 1e-3
    )
    trained: list[int] = []
    armed = {"stop": False}
    train = cvb_precode.fedavg_accuracy

    def fedavg(*args, **kwargs) -> float:
        if armed["stop"] and trained:
            raise KeyboardInterrupt
        trained.append(1)
        return train(*args, **kwargs)

    monkeypatch.setattr(cvb_precode, "fedavg_accuracy", fedavg)
    return trained, armed


def campaign(results) -> int:
    return main(["campaign", "--only", *IDS, "--quiet", "--results", str(results)])


def test_a_campaign_skips_finished_records_and_resumes_partial_ones(tiny, tmp_path, capsys):
    trained, armed = tiny
    assert campaign(tmp_path / "whole") == 0
    plan = capsys.readouterr().out.splitlines()
    assert all("to run, about" in line for line in plan[:2]), "an estimate for each"
    whole = read_record(tmp_path / "whole" / record_filename(IDS[1]))

    trained.clear()
    armed["stop"] = True
    results = tmp_path / "halves"
    assert campaign(results) == 130
    assert (results / record_filename(IDS[0])).exists(), "the first experiment finished"
    assert not (results / record_filename(IDS[1])).exists()
    capsys.readouterr()

    armed["stop"] = False
    trained.clear()
    assert campaign(results) == 0
    plan = capsys.readouterr().out.splitlines()
    assert "done (" in plan[0] and "partial: 1 of 2 units" in plan[1]
    assert "a unit resumes from its checkpoint" in plan[1], "its attack ended before the stop"
    assert len(trained) == 1, "only the unfinished unit ran"
    assert read_record(results / record_filename(IDS[1]))["rows"] == whole["rows"]

    trained.clear()
    assert campaign(results) == 0
    plan = capsys.readouterr().out.splitlines()
    assert "done (" in plan[0] and "done (" in plan[1] and not trained
    assert plan[2] == "total left: about 0 s"


def test_a_partial_record_beside_a_finished_one_is_a_rerun_that_replaces_it(tiny, tmp_path, capsys):
    trained, armed = tiny
    assert campaign(tmp_path / "old") == 0
    old = tmp_path / "old" / record_filename(IDS[1])
    armed["stop"] = True
    trained.clear()
    results = tmp_path / "rerun"
    assert campaign(results) == 130
    partial = results / (record_filename(IDS[1]) + ".partial")
    assert partial.exists()
    (results / old.name).write_bytes(old.read_bytes())  # the record the re-run will replace
    capsys.readouterr()

    armed["stop"] = False
    trained.clear()
    assert campaign(results) == 0
    plan = capsys.readouterr().out.splitlines()
    assert "done (" in plan[0] and "re-run partial: 1 of 2 units" in plan[1], plan
    assert len(trained) == 1, "the re-run's unfinished unit ran, not the whole experiment"
    assert not partial.exists()
    assert read_record(results / old.name)["provenance"]["resumed"] is True


def test_a_campaign_resumes_a_partial_record_as_the_run_that_made_it(tiny, tmp_path, capsys):
    """A partial record made with ``reproduce --set`` (Table III's victims_at on the CIFAR-10
    sample) resumes in a campaign with the same changes, not refused as another run's."""
    trained, armed = tiny
    armed["stop"] = True
    out = tmp_path / record_filename(IDS[1])
    argv = ["reproduce", IDS[1], "--quiet", "--set", "victims=1", "--out", str(out)]
    assert main(argv) == 130
    armed["stop"] = False
    trained.clear()
    capsys.readouterr()
    assert main(["campaign", "--only", IDS[1], "--quiet", "--results", str(tmp_path)]) == 0
    assert "partial: 1 of 2 units, victims=1, " in capsys.readouterr().out
    assert len(trained) == 1, "only the unfinished unit ran"
    assert read_record(out)["settings_changed"]["victims"]["used"] == 1


def test_a_campaign_hands_each_experiment_the_settings_it_has(tiny, tmp_path, capsys):
    """``campaign --set`` changes each experiment that has the setting; a name none has fails
    before any work, as a --data name none uses does."""
    trained, _ = tiny
    results = tmp_path / "set"
    argv = ["campaign", "--only", *IDS, "--quiet", "--results", str(results)]
    assert main([*argv, "--set", "victim=1"]) == 2
    assert "--set victim: no experiment of this campaign has it" in capsys.readouterr().err
    assert not trained and not results.exists()
    assert main([*argv, "--set", "positions=(3,)"]) == 0  # only Table II has positions
    placement = read_record(results / record_filename(IDS[1]))
    assert placement["settings_changed"]["positions"]["used"] == [3]
    assert "settings_changed" not in read_record(results / record_filename(IDS[0]))


def test_a_campaign_without_estimates_probes_nothing(tiny, tmp_path, capsys, monkeypatch):
    """``--no-estimate`` (a lent GPU's short call): the plan names what will run without
    probing a step, and the runs are as with estimates."""

    def no_probe(*_args, **_kwargs):
        raise AssertionError("probed despite --no-estimate")

    monkeypatch.setattr(estimate, "step_seconds", no_probe)
    args = ["campaign", "--only", *IDS, "--quiet", "--results", str(tmp_path), "--no-estimate"]
    assert main(args) == 0
    plan = capsys.readouterr().out.splitlines()
    assert all("to run (not estimated: --no-estimate)" in line for line in plan[:2]), plan
    assert plan[2] == "total left: about 0 s and 2 without an estimate"
    assert (tmp_path / record_filename(IDS[1])).exists()
