"""Resumable runs: a run killed halfway and resumed gives the same record as an uninterrupted one."""

from __future__ import annotations

import copy
import json
import signal
import subprocess
import sys
import time

import pytest
import torch

from leakagelib import fl
from leakagelib.cli import main
from leakagelib.experiments import registry
from leakagelib.experiments.kept import kept_run
from leakagelib.experiments.resume import PartialRecord, data_digests, unit_seed
from leakagelib.records import IMPORTED_COMMIT, read_record

UNITS = ("a", "b", "c", "d")


@pytest.fixture
def toy(monkeypatch):
    """A registered toy experiment of four units whose rows use the global RNG."""
    calls: list[str] = []
    stop_at: dict[str, str | None] = {"unit": None}

    def compute(key: str) -> list[dict]:
        if key == stop_at["unit"]:
            raise KeyboardInterrupt
        calls.append(key)
        return [{"unit": key, "value": float(torch.rand(()))}]

    def fn(ctx):
        torch.rand(())  # state consumed before the units must not matter
        return ctx.units(UNITS, compute, "toy")

    monkeypatch.setattr(registry, "_EXPERIMENTS", dict(registry._EXPERIMENTS))
    registry.experiment("test/toy", row_keys=("unit", "value"))(fn)
    return calls, stop_at


def test_a_resumed_run_gives_the_record_of_an_uninterrupted_one(toy, tmp_path, capsys):
    calls, stop_at = toy
    whole, halves = tmp_path / "whole.json", tmp_path / "halves.json"
    assert main(["reproduce", "test/toy", "--quiet", "--out", str(whole)]) == 0
    stop_at["unit"] = "c"
    assert main(["reproduce", "test/toy", "--quiet", "--out", str(halves)]) == 130
    assert "--resume" in capsys.readouterr().err
    partial = json.loads((tmp_path / "halves.json.partial").read_text())
    assert len(partial["units"]) == 2 and not halves.exists()
    # without --resume the partial record is not thrown away
    assert main(["reproduce", "test/toy", "--quiet", "--out", str(halves)]) == 2
    assert "pass --resume" in capsys.readouterr().err
    stop_at["unit"] = None
    calls.clear()
    assert main(["reproduce", "test/toy", "--quiet", "--out", str(halves), "--resume"]) == 0
    assert calls == ["c", "d"], "only the unfinished units ran"
    assert read_record(halves)["rows"] == read_record(whole)["rows"]
    assert not (tmp_path / "halves.json.partial").exists()
    made = read_record(halves)["provenance"]
    assert made["resumed"] and not read_record(whole)["provenance"]["resumed"]
    assert [u["unit"] for u in made["units"]] == list(UNITS)
    assert {(u["commit"], u["device"]) for u in made["units"]} == {(IMPORTED_COMMIT, "cpu")}
    assert made["unit_seconds"] == pytest.approx(sum(u["seconds"] for u in made["units"]))


def test_the_progress_bar_of_a_resumed_run_starts_at_its_finished_units(toy, tmp_path, capsys):
    _, stop_at = toy
    out = tmp_path / "r.json"
    stop_at["unit"] = "c"
    assert main(["reproduce", "test/toy", "--quiet", "--out", str(out)]) == 130
    capsys.readouterr()
    stop_at["unit"] = None
    assert main(["reproduce", "test/toy", "--out", str(out), "--resume"]) == 0
    bar = capsys.readouterr().err
    assert "toy:  50%" in bar and "2/4" in bar and "0/4" not in bar


def test_a_partial_record_of_another_run_is_refused(toy, tmp_path, capsys):
    _, stop_at = toy
    out = tmp_path / "r.json"
    stop_at["unit"] = "b"
    assert main(["reproduce", "test/toy", "--quiet", "--out", str(out)]) == 130
    stop_at["unit"] = None
    args = ["reproduce", "test/toy", "--quiet", "--out", str(out), "--resume", "--seed", "3"]
    assert main(args) == 2
    assert "belongs to another run (seed: 0 there, 3 now)" in capsys.readouterr().err


def test_unit_seeds_differ_by_key_and_seed():
    seeds = {unit_seed(s, k) for s in (0, 1) for k in ("a", ("a", 1), 2)}
    assert len(seeds) == 6 and all(0 <= s < 2**63 for s in seeds)


def test_partial_records_are_written_atomically_with_their_pace(tmp_path):
    part = PartialRecord(tmp_path / "p.json", {"experiment": "x"}, resume=False)
    assert part.estimate() is None, "no pace before the first unit"
    part.add(("cell", 1), [{"psnr": float("inf")}], seconds=2.0, total=5)
    part.add(("cell", 2), [{"psnr": 1.0}], seconds=4.0, total=5)
    again = PartialRecord(tmp_path / "p.json", {"experiment": "x"}, resume=True)
    assert again.get(("cell", 1)) == [{"psnr": "inf"}]
    assert again.estimate() == 3 * 3.0, "three units left at 3 s each"
    assert [p.name for p in tmp_path.iterdir()] == ["p.json"], "no temporary file left"


def test_a_changed_setting_given_as_a_tuple_resumes_from_the_list_json_wrote(tmp_path):
    """``--set steps=(0,4)`` reaches the identity as a tuple and comes back from JSON a list."""
    identity = {"experiment": "x", "changes": {"steps": (0, 4)}}
    PartialRecord(tmp_path / "p.json", identity, resume=False).add("u", [{"v": 1.0}], 1.0, total=2)
    assert PartialRecord(tmp_path / "p.json", identity, resume=True).get("u") == [{"v": 1.0}]
    with pytest.raises(ValueError, match="belongs to another run"):
        PartialRecord(tmp_path / "p.json", {**identity, "changes": {"steps": (0, 5)}}, resume=True)


def test_a_partial_record_resumes_from_a_copy_of_its_data_under_another_path(tmp_path):
    """Data files are compared by content: a GPU machine's copy of the samples names another path."""
    files = {}
    for name, content in (("there", b"samples"), ("here", b"samples"), ("other", b"changed")):
        files[name] = tmp_path / name / "cifar10.npz"
        files[name].parent.mkdir()
        files[name].write_bytes(content)

    def identity(name: str) -> dict:
        data = {"cifar10": str(files[name])}
        return {"experiment": "x", "data": data, "data_sha256": data_digests(data)}

    path = tmp_path / "p.json"
    PartialRecord(path, identity("there"), resume=False).add("u", [{"v": 1.0}], 1.0, total=2)
    assert PartialRecord(path, identity("here"), resume=True).get("u") == [{"v": 1.0}]
    with pytest.raises(ValueError, match=r"data: .* \(files compared by content\)"):
        PartialRecord(path, identity("other"), resume=True)
    # a partial record written before identities carried data_sha256: its path is hashed here
    old = json.loads(path.read_text())
    del old["identity"]["data_sha256"]
    path.write_text(json.dumps(old))
    assert PartialRecord(path, identity("here"), resume=True).get("u") == [{"v": 1.0}]


def test_the_pace_of_units_run_on_another_device_is_not_this_ones(tmp_path):
    part = PartialRecord(tmp_path / "p.json", {"experiment": "x"}, resume=False)
    part.add("a", [{"v": 1.0}], seconds=60.0, total=3, made={"commit": "c", "device": "cuda:0"})
    assert part.devices() == {"cuda"}
    assert part.estimate("cuda") == part.estimate() == 120.0
    assert part.estimate("cpu") is None, "a GPU's pace says nothing about the CPU's"
    part.add("b", [{"v": 2.0}], seconds=600.0, total=3, made={"commit": "c", "device": "cpu"})
    assert part.devices() == {"cuda", "cpu"}
    assert part.estimate("cuda:0") == 60.0, "one unit left at the pace of the GPU's units"
    assert part.estimate("cpu") == 600.0 and part.estimate() == 330.0


def test_units_saved_without_their_maker_are_listed_with_none():
    """A partial record written before units kept their commit and device still resumes."""
    part = PartialRecord("unused.json", {"experiment": "x"}, resume=False)
    part.units, part.seconds = {'"a"': [{"v": 1.0}]}, {'"a"': 2.5}
    assert part.provenance() == {
        "resumed": False,
        "unit_seconds": 2.5,
        "units": [{"unit": "a", "seconds": 2.5, "commit": None, "device": None}],
    }


def test_campaign_plans_first_then_runs_the_unfinished_and_resumes_partial_ones(
    toy, tmp_path, capsys
):
    calls, stop_at = toy
    results = tmp_path / "results"
    args = ["campaign", "--only", "test/toy", "--quiet", "--results", str(results)]
    stop_at["unit"] = "c"
    assert main(args) == 130
    assert "test/toy                     to run" in capsys.readouterr().out
    stop_at["unit"] = None
    calls.clear()
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "partial: 2 of 4 units, about 0 s left at the pace so far" in out.splitlines()[0]
    assert calls == ["c", "d"], "the partial record was resumed"
    assert main(args) == 0
    assert "done (" in capsys.readouterr().out.splitlines()[0]
    assert calls == ["c", "d"], "a finished record is skipped"


def test_the_campaign_plan_estimates_a_gpu_partial_record_at_this_devices_pace(tmp_path):
    """A GPU's partial record resumed on the CPU: the units left at the CPU's estimate, not the GPU's pace."""
    from argparse import Namespace
    from types import SimpleNamespace

    from leakagelib.cli import _plan_line

    out = tmp_path / "x.json"
    part = PartialRecord(tmp_path / "x.json.partial", {"experiment": "x"}, resume=False)
    part.add("a", [{"v": 1.0}], seconds=60.0, total=4, made={"commit": "c", "device": "cuda"})
    estimator = SimpleNamespace(of=lambda *_: SimpleNamespace(seconds=4000.0))
    args = Namespace(device="cpu", scale="paper", data=[])
    status, line, eta = _plan_line("bayes/table2", out, args, estimator)
    assert (status, eta) == ("partial", 3000.0), "three of four units at the CPU's estimate"
    assert "estimate here; they ran on cuda" in line
    status, line, eta = _plan_line(
        "bayes/table2", out, Namespace(**{**vars(args), "device": "cuda"}), estimator
    )
    assert eta == 180.0 and "at the pace so far" in line
    part.add("b", [{"v": 2.0}], seconds=6000.0, total=4, made={"commit": "c", "device": "cpu"})
    status, line, eta = _plan_line(
        "bayes/table2", out, Namespace(**{**vars(args), "device": "cuda"}), estimator
    )
    assert eta == 120.0 and "at the pace of its units on cuda" in line, "not probed here"


SLOW_RUN = """
import sys, time
from leakagelib.cli import main
from leakagelib.experiments import registry

@registry.experiment("test/slow", row_keys=("i",))
def slow(ctx):
    print("started", flush=True)
    time.sleep(60)
    return [{"i": 0}]

sys.exit(main(["reproduce", "test/slow", "--quiet", "--out", sys.argv[1]]))
"""


def test_sigint_during_a_run_keeps_the_earlier_record(tmp_path):
    out = tmp_path / "r.json"
    out.write_text(json.dumps({"experiment": "old", "scale": "ci", "rows": [], "provenance": {}}))
    before = out.read_text()
    proc = subprocess.Popen(
        [sys.executable, "-c", SLOW_RUN, str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert proc.stdout.readline().strip() == b"started"
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and b"no record written" in err
    assert out.read_text() == before


def test_a_run_split_into_shards_gives_the_record_of_an_unsplit_one(toy, tmp_path, capsys):
    """Shard 0 of 2 runs units a and c and stops without a record; shard 1 (here through
    ``campaign``) runs b and d, finds a and c in the shared partial record and writes it."""
    calls, _ = toy
    whole, split = tmp_path / "whole.json", tmp_path / "results" / "test-toy.json"
    assert main(["reproduce", "test/toy", "--quiet", "--out", str(whole)]) == 0
    calls.clear()
    first = ["reproduce", "test/toy", "--quiet", "--out", str(split), "--resume", "--shard", "0/2"]
    assert main(first) == 0
    assert calls == ["a", "c"] and not split.exists()
    assert "shard 0/2 has run its units; 2 of 4 are left to other runs" in capsys.readouterr().out
    calls.clear()
    rest = ["campaign", "--only", "test/toy", "--quiet", "--results", str(split.parent)]
    assert main([*rest, "--shard", "1/2"]) == 0
    assert calls == ["b", "d"], "each unit ran once, in one shard"
    assert read_record(split)["rows"] == read_record(whole)["rows"]
    assert read_record(split)["provenance"]["resumed"], "units from another process"
    assert sorted(p.name for p in split.parent.iterdir()) == ["test-toy.json"]  # no partial, lock
    capsys.readouterr()
    assert main([*first[:-3], "--shard", "0/2"]) == 2  # without --resume
    assert "--shard needs --resume" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:
        main([*first[:-1], "4/2"])
    assert exited.value.code == 2
    assert "is not K/N with 0 <= K < N" in capsys.readouterr().err


def test_a_run_of_some_units_leaves_the_others_to_a_later_run(toy, tmp_path, capsys):
    """``--units b`` runs unit b alone and stops without a record (as the CPU runs Fig. 2's
    Soteria units and leaves the ATS ones to a GPU), and so does a campaign of one experiment;
    ``--units`` matching no key fails before any unit runs; the run that finds every unit
    writes the record of an unsplit run."""
    calls, _ = toy
    whole, split = tmp_path / "whole.json", tmp_path / "test-toy.json"  # the campaign's name
    assert main(["reproduce", "test/toy", "--quiet", "--out", str(whole)]) == 0
    calls.clear()
    run = ["reproduce", "test/toy", "--quiet", "--out", str(split), "--resume"]
    assert main([*run, "--units", "b"]) == 0
    assert calls == ["b"] and not split.exists()
    assert "this run has run its units; 3 of 4 are left to other runs" in capsys.readouterr().out
    assert main([*run, "--units", "z"]) == 2
    assert "--units 'z' is in none of the 4 units' keys" in capsys.readouterr().err
    assert main([*run[:-1], "--units", "b"]) == 2
    assert "--units needs --resume" in capsys.readouterr().err
    assert calls == ["b"], "no unit ran on bad input"
    campaign = ["campaign", "--quiet", "--no-estimate", "--results", str(tmp_path), "--units", "c"]
    assert main(campaign) == 2
    assert "--units names units of one experiment" in capsys.readouterr().err
    assert main([*campaign, "--only", "test/toy"]) == 0
    assert calls == ["b", "c"], "the campaign ran unit c alone"
    assert main(run) == 0
    assert calls == ["b", "c", "a", "d"]
    assert read_record(split)["rows"] == read_record(whole)["rows"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["test-toy.json", "whole.json"]


SHARD_RUN = """
import sys, time
import torch
from leakagelib.cli import main
from leakagelib.experiments import registry

@registry.experiment("test/shards", row_keys=("unit", "value"))
def shards(ctx):
    def unit(key):
        time.sleep(0.2)  # the shards' saves interleave
        return [{"unit": key, "value": float(torch.rand(()))}]
    return ctx.units(list(range(12)), unit, "shards")

sys.exit(main(["reproduce", "test/shards", "--quiet", "--out", sys.argv[1], *sys.argv[2:]]))
"""


def test_shards_side_by_side_lose_no_unit_of_their_shared_partial_record(tmp_path):
    """Three processes at once add to one partial record under its lock: the record holds
    every unit once, as one process alone would have made it."""
    alone, split = tmp_path / "alone.json", tmp_path / "split.json"
    run = [sys.executable, "-c", SHARD_RUN]
    subprocess.run([*run, str(alone)], check=True, capture_output=True, timeout=120)
    procs = [
        subprocess.Popen(
            [*run, str(split), "--resume", "--shard", f"{k}/3"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for k in range(3)
    ]
    outs = [proc.communicate(timeout=120) for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0, 0], outs
    assert read_record(split)["rows"] == read_record(alone)["rows"]
    units = read_record(split)["provenance"]["units"]
    assert sorted(u["unit"] for u in units) == list(range(12))
    assert not (tmp_path / "split.json.partial").exists()


def test_a_training_kept_for_a_run_is_read_back_until_its_last_unit(tmp_path):
    """Fig. 2's ConvBig trains once per run: a resumed process reads the network, its losses and
    snapshots back (no training), another training's file is refused, and the file goes with
    the run's last unit."""
    torch.manual_seed(0)
    start = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3, 2))
    x, y = torch.randn(8, 1, 1, 3), torch.tensor([0, 1] * 4)
    trainings: list[int] = []

    def run():
        trainings.append(1)
        return fl.train(start, x, y, steps=4, batch_size=2, snapshot_steps=(0, 2, 4))

    def kept(partial, parts=(4,)):
        return kept_run(partial.kept("net"), copy.deepcopy(start), run, parts=parts,
                        data={"x": x, **start.state_dict()})  # fmt: skip

    path = tmp_path / "r.json.partial"
    first = kept(PartialRecord(path, {"experiment": "x"}, resume=True))
    again = kept(PartialRecord(path, {"experiment": "x"}, resume=True))
    assert trainings == [1], "the second process read the training back"
    assert again.losses == first.losses and set(again.snapshots) == {0, 2, 4}
    for step, state in first.snapshots.items():
        assert all(torch.equal(state[k], again.snapshots[step][k]) for k in state)
    assert torch.equal(again.model[1].weight, first.model[1].weight)
    with pytest.raises(ValueError, match="checkpoint of another"):
        kept(PartialRecord(path, {"experiment": "x"}, resume=True), parts=(5,))
    partial = PartialRecord(path, {"experiment": "x"}, resume=True)
    partial.add("a", [{"v": 1}], 1.0, 2)
    assert (tmp_path / "r.json.partial.attacks" / "net.pt").exists(), "kept while units are left"
    partial.add("b", [{"v": 2}], 1.0, 2)
    assert not (tmp_path / "r.json.partial.attacks").exists()
