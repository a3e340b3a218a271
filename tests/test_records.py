"""Experiment records: atomic writing, validated reading, the experiment registry."""

import json
import math

import pytest

from leakagelib import records
from leakagelib.experiments import registry
from leakagelib.records import read_record, write_record


def record(**extra):
    return {"experiment": "x/y", "scale": "ci", "rows": [{"a": 1.0}], "provenance": {}, **extra}


def test_write_then_read_roundtrip_with_non_finite_values(tmp_path):
    path = write_record(record(rows=[{"psnr": math.inf, "v": float("nan")}]), tmp_path / "r.json")
    back = read_record(path)
    assert back["rows"] == [{"psnr": "inf", "v": None}]
    assert not list(tmp_path.glob(".*tmp"))


def test_failed_write_keeps_the_old_record(tmp_path):
    path = write_record(record(), tmp_path / "r.json")
    with pytest.raises(TypeError):
        write_record(record(rows=[{"bad": object()}]), path)
    assert read_record(path)["rows"] == [{"a": 1.0}]
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]


def test_malformed_records_are_rejected(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="not a valid JSON record"):
        read_record(bad)
    bad.write_text(json.dumps({"experiment": "x", "rows": []}))
    with pytest.raises(ValueError, match="lacks the keys"):
        read_record(bad)
    bad.write_text(json.dumps(record(rows=[1, 2])))
    with pytest.raises(ValueError, match="list of objects"):
        read_record(bad)
    with pytest.raises(ValueError, match="lacks the keys"):
        write_record({"rows": []}, tmp_path / "x.json")


def test_registry_checks_ids_rows_and_scales():
    @registry.experiment("test/rows", row_keys=("a", "b"))
    def _bad(ctx):
        """Returns a row without b."""
        return [{"a": 1}]

    try:
        with pytest.raises(RuntimeError, match="lacks the keys \\['b'\\]"):
            registry.run("test/rows")
        with pytest.raises(ValueError, match="registered twice"):
            registry.experiment("test/rows", row_keys=())(_bad)
        with pytest.raises(ValueError, match="unknown scale"):
            registry.run("test/rows", scale="huge")
    finally:
        registry._EXPERIMENTS.pop("test/rows")
    with pytest.raises(KeyError, match="unknown experiment 'no/such'"):
        registry.get("no/such")


def test_paper_rows_need_the_columns_that_name_them_and_distinct_names():
    paper = [{"position": 0, "ssim": 0.9}, {"position": 0, "ssim": 0.1}]
    with pytest.raises(ValueError, match="must tell the paper's rows apart"):
        registry.experiment("test/paper", row_keys=("position",), reference=paper)(len)
    with pytest.raises(ValueError, match="must tell the paper's rows apart"):
        registry.experiment(
            "test/paper", row_keys=("position",), reference=paper, on=("position",)
        )(len)
    assert "test/paper" not in registry.available()


def test_data_overrides_parse_and_resolve(monkeypatch):
    assert registry.parse_data_overrides(["mnist=a.npz", " cifar10 = b.npz "]) == {
        "mnist": "a.npz",
        "cifar10": "b.npz",
    }
    with pytest.raises(ValueError, match="LOGICAL=SPEC"):
        registry.parse_data_overrides(["mnist"])
    monkeypatch.setenv(registry.DATA_ENV, "mnist=/tmp/m.npz")
    assert registry.env_data_overrides() == {"mnist": "/tmp/m.npz"}
    ctx = registry.Context(scale="ci", data={"cifar10": "c.npz"})
    assert ctx.resolve("cifar10") == "c.npz"
    assert ctx.resolve("mnist") == "digits28"
    assert registry.Context(scale="paper").resolve("mnist") == "mnist"


def test_paper_record_reads_results_or_returns_none(tmp_path):
    from leakagelib.records import paper_record, record_filename

    assert record_filename("bayes/table2") == "bayes-table2.json"
    assert paper_record("bayes/table2", tmp_path) is None
    write_record(record(experiment="bayes/table2"), tmp_path / "bayes-table2.json")
    assert paper_record("bayes/table2", tmp_path)["experiment"] == "bayes/table2"
    (tmp_path / "bayes-table2.json").write_text("[]")
    with pytest.raises(ValueError, match="not a record"):
        paper_record("bayes/table2", tmp_path)


def test_an_experiment_can_refine_the_data_account():
    @registry.experiment("test/notes", row_keys=("a",))
    def _noted(ctx):
        """Says what it made of mnist."""
        return {"rows": [{"a": 1}], "data": {"mnist": "digits (8×8)"}, "curves": [1, 2]}

    try:
        record = registry.run("test/notes")
    finally:
        registry._EXPERIMENTS.pop("test/notes")
    assert record["data"]["mnist"] == "digits (8×8)"
    assert record["data"]["cifar10"] == "patches"
    assert record["curves"] == [1, 2]


def test_a_record_gets_the_permissions_of_an_ordinary_new_file(tmp_path):
    import os

    from leakagelib.records import write_json_atomically

    umask = os.umask(0o022)
    try:
        path = write_json_atomically({"rows": []}, tmp_path / "r.json")
    finally:
        os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o644


def test_run_takes_its_device_from_the_environment_when_none_is_named(monkeypatch):
    """Chapters call ``experiments.run`` without a device; ``$LEAKAGELIB_DEVICE`` moves them."""
    monkeypatch.setattr(registry.torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv(registry.DEVICE_ENV, "cuda")
    with pytest.raises(RuntimeError, match="device 'cuda' asked for"):
        registry.run("intro/bias-attack", "ci", progress=False)
    monkeypatch.setenv(registry.DEVICE_ENV, "")
    made = registry.run("intro/bias-attack", "ci", progress=False)
    assert made["provenance"]["device"] == "cpu"


def test_provenance_names_the_commit_the_library_was_imported_at(monkeypatch):
    """A long run's record names the code that ran, not a commit checked out while it ran."""
    monkeypatch.setattr(records, "IMPORTED_COMMIT", "a" * 40)
    monkeypatch.setattr(records, "_git_commit", lambda: "b" * 40)
    assert records.provenance(seed=0, device="cpu", wall_seconds=1.0)["commit"] == "a" * 40


def test_the_commit_is_marked_dirty_when_the_code_differs_from_it(tmp_path):
    """A run from uncommitted changes does not claim the commit's code as its own."""
    import subprocess

    def git(*args: str) -> None:
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "code.py").write_text("x = 1\n")
    git("add", "code.py")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "one")
    clean = records._git_commit(tmp_path)
    assert clean is not None and len(clean) == 40
    (tmp_path / "code.py").write_text("x = 2\n")
    assert records._git_commit(tmp_path) == clean + "+dirty"
    (tmp_path / "notes.txt").write_text("untracked files do not count\n")
    (tmp_path / "code.py").write_text("x = 1\n")
    assert records._git_commit(tmp_path) == clean


def test_a_resumed_records_run_time_counts_every_unit_and_names_their_commits():
    once = {"wall_seconds": 7.0, "commit": "c" * 40}
    assert records.run_seconds(once) == 7.0
    assert records.made_by(once) == ["c" * 40]
    resumed = {
        "wall_seconds": 3.0,
        "commit": "c" * 40,
        "resumed": True,
        "unit_seconds": 10.5,
        "units": [
            {"unit": "a", "seconds": 7.5, "commit": "b" * 40, "device": "cuda"},
            {"unit": "b", "seconds": 3.0, "commit": "c" * 40, "device": "cpu"},
        ],
    }
    assert records.run_seconds(resumed) == 10.5, "not the last process's 3 s"
    assert records.made_by(resumed) == ["b" * 40, "c" * 40]
    assert math.isnan(records.run_seconds({}))
    assert records.made_by({}) == []


def test_a_record_without_client_update_in_its_provenance_predates_the_kl_update():
    from leakagelib.records import predates_kl_update, provenance

    now = {"rows": [], "provenance": provenance(seed=0, device="cpu", wall_seconds=1.0)}
    assert not predates_kl_update(now)
    old = {"rows": [], "provenance": {k: v for k, v in now["provenance"].items()
                                      if k != "client_update"}}  # fmt: skip
    assert predates_kl_update(old)
    assert not predates_kl_update(None) and not predates_kl_update({"rows": []})  # pending
