"""The command line: list, reproduce, and its errors."""

import json
import subprocess
import sys

import pytest

from leakagelib.cli import build_parser, main
from leakagelib.records import read_record
from leakagelib.reporting import format_table


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "leakagelib", *args], capture_output=True, text=True, timeout=300
    )


def test_list_names_models_datasets_and_experiments():
    done = run_cli("list")
    assert done.returncode == 0, done.stderr
    assert "bayes-cnn" in done.stdout and "digits28" in done.stdout
    assert "intro/bias-attack" in done.stdout


def test_reproduce_bias_attack_writes_a_record_and_recovers_the_images(tmp_path, capsys):
    out = tmp_path / "bias.json"
    assert (
        main(["reproduce", "intro/bias-attack", "--scale", "ci", "--out", str(out), "--quiet"]) == 0
    )
    printed = capsys.readouterr().out
    assert "psnr" in printed and "record written" in printed
    record = read_record(out)
    assert record["experiment"] == "intro/bias-attack" and record["scale"] == "ci"
    assert len(record["rows"]) == 8
    assert all(r["psnr"] == "inf" or r["psnr"] > 100 for r in record["rows"])
    prov = record["provenance"]
    assert {"commit", "torch", "device", "seed", "wall_seconds"} <= set(prov)
    assert record["data"]["mnist"] == "digits28"


def test_reproduce_honours_a_data_override(tmp_path, capsys):
    np = pytest.importorskip("numpy")
    rng = np.random.default_rng(0)
    path = tmp_path / "tiny.npz"
    np.savez(
        path,
        images=rng.integers(0, 256, (40, 1, 28, 28), dtype=np.uint8),  # its test part: 8
        labels=np.arange(40, dtype=np.int64) % 10,
    )
    out = tmp_path / "r.json"
    args = [
        "reproduce",
        "intro/bias-attack",
        "--data",
        f"mnist={path}",
        "--out",
        str(out),
        "--quiet",
    ]
    assert main(args) == 0
    used = json.loads(out.read_text())["data"]["mnist"]
    assert used["spec"] == str(path) and used["test"]["count"] == 8


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["reproduce", "no/such"], "unknown experiment 'no/such'"),
        (["reproduce", "intro/bias-attack", "--data", "mnist"], "LOGICAL=SPEC"),
        (["reproduce", "intro/bias-attack", "--data", "mnist=nothing.npz"], "nothing.npz"),
    ],
)
def test_bad_input_exits_2_with_a_message(args, message, capsys, tmp_path):
    assert main([*args, "--out", str(tmp_path / "x.json"), "--quiet"]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()


def test_format_table_aligns_columns():
    text = format_table([{"a": 1, "psnr": 12.3456}, {"a": 10, "psnr": float("inf")}])
    lines = text.splitlines()
    assert lines[0].split() == ["a", "psnr"]
    assert lines[2].split() == ["1", "12.35"] and lines[3].split() == ["10", "inf"]


def test_datasets_are_downloaded_only_at_paper_scale_unless_told(monkeypatch):
    from leakagelib.experiments.registry import Context

    seen: list[bool] = []

    def fake_load(spec, n=None, **options):
        seen.append(options["download"])
        raise FileNotFoundError("not here")

    monkeypatch.setattr("leakagelib.data.load", fake_load)
    for ctx in (
        Context("ci"),
        Context("paper", data={}),
        Context("ci", download=True),
        Context("paper", download=False),
    ):
        with pytest.raises(FileNotFoundError):
            ctx.dataset("cifar10", n=1)
    assert seen == [False, True, True, False]


def test_download_flag_parses_three_ways():
    parse = build_parser().parse_args
    assert parse(["reproduce", "intro/bias-attack"]).download is None
    assert parse(["reproduce", "intro/bias-attack", "--download"]).download is True
    assert parse(["reproduce", "intro/bias-attack", "--no-download"]).download is False


def _no_run(monkeypatch) -> list:
    """Make ``experiments.run`` record that it was called (the checks must come first)."""
    calls: list = []
    monkeypatch.setattr("leakagelib.experiments.run", lambda *a, **k: calls.append(a))
    return calls


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--seed", "-1"], "--seed must be between 0 and"),
        (["--seed", str(2**40)], "--seed must be between 0 and"),
        (["--device", "gpu"], "is not one of cpu, cuda, cuda:N"),
        (["--data", "mnsit=x.npz"], "'mnsit', which intro/bias-attack does not use; it uses mnist"),
    ],
)
def test_the_command_line_checks_arguments_before_the_run(
    extra, message, capsys, monkeypatch, tmp_path
):
    calls = _no_run(monkeypatch)
    args = ["reproduce", "intro/bias-attack", "--quiet", "--out", str(tmp_path / "r.json"), *extra]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert err.count("\n") == 1, "one line"
    assert calls == [], "nothing ran"


def test_an_out_path_that_is_a_directory_is_refused_before_the_run(capsys, monkeypatch, tmp_path):
    calls = _no_run(monkeypatch)
    assert main(["reproduce", "intro/bias-attack", "--quiet", "--out", str(tmp_path)]) == 2
    assert "is a directory" in capsys.readouterr().err and calls == []


def test_an_out_path_below_a_file_is_refused_before_the_run(capsys, monkeypatch, tmp_path):
    calls = _no_run(monkeypatch)
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert (
        main(["reproduce", "intro/bias-attack", "--quiet", "--out", str(blocker / "r.json")]) == 2
    )
    assert "is a file, so the folder cannot be made" in capsys.readouterr().err and calls == []


def test_an_empty_out_path_is_refused_before_the_run(capsys, monkeypatch):
    calls = _no_run(monkeypatch)
    assert main(["reproduce", "intro/bias-attack", "--quiet", "--out", ""]) == 2
    assert "--out is empty" in capsys.readouterr().err and calls == []


def test_a_folder_that_refuses_new_files_is_found_before_the_run(capsys, monkeypatch, tmp_path):
    """Permission bits can say yes where the folder says no (/proc, /sys, a read-only mount, an
    immutable folder under root): the check tries to create a file there."""
    import tempfile

    def refuse(*args, **kwargs):
        raise PermissionError(1, "Operation not permitted")

    calls = _no_run(monkeypatch)
    monkeypatch.setattr(tempfile, "NamedTemporaryFile", refuse)
    out = str(tmp_path / "sub" / "r.json")
    assert main(["reproduce", "intro/bias-attack", "--quiet", "--out", out]) == 2
    err = capsys.readouterr().err
    assert f"the folder {tmp_path} is not writable" in err and calls == []
    assert err.count("\n") == 1, "one line"


def test_a_bad_file_for_a_dataset_loaded_late_is_refused_before_the_run(
    capsys, monkeypatch, tmp_path
):
    """bayes/table2 loads cifar10 after its MNIST cells: a greyscale file given for cifar10 is
    refused before the first cell, not after it (the file's format is read from its header)."""
    np = pytest.importorskip("numpy")
    grey = tmp_path / "grey.npz"
    np.savez(grey, images=np.zeros((4, 1, 28, 28), np.uint8), labels=np.zeros(4, np.int64))
    calls = _no_run(monkeypatch)
    args = ["reproduce", "bayes/table2", "--quiet", "--out", str(tmp_path / "r.json"),
            "--data", f"cifar10={grey}"]  # fmt: skip
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "--data cifar10:" in err and "whose images have 3 channel(s)" in err and calls == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["reproduce", "intro/bias-attack", "--seed", "1.5"], "argument --seed: invalid int"),
        (["reproduce"], "the following arguments are required: id"),
        (["frob"], "invalid choice: 'frob'"),
    ],
)
def test_argparse_errors_are_one_line_too(args, message, capsys):
    with pytest.raises(SystemExit) as stop:
        main(args)
    err = capsys.readouterr().err
    assert stop.value.code == 2 and message in err and err.count("\n") == 1, err


def test_a_typo_in_the_data_environment_variable_is_refused(capsys, monkeypatch, tmp_path):
    calls = _no_run(monkeypatch)
    monkeypatch.setenv("LEAKAGELIB_DATA", "cifar=x.npz")
    assert (
        main(["reproduce", "intro/bias-attack", "--quiet", "--out", str(tmp_path / "r.json")]) == 2
    )
    err = capsys.readouterr().err
    assert "LEAKAGELIB_DATA names dataset 'cifar', which no experiment uses" in err
    assert "mnist" in err and calls == []


def test_a_record_whose_write_fails_goes_to_a_fallback_file(capsys, monkeypatch, tmp_path):
    import leakagelib.cli as cli

    real_write = cli.write_record
    target = tmp_path / "r.json"

    def failing(record, path):
        if path == target:
            raise OSError("disk full")
        return real_write(record, path)

    monkeypatch.setattr(cli, "write_record", failing)
    monkeypatch.setattr(cli.tempfile, "gettempdir", lambda: str(tmp_path / "fallback"))
    with pytest.raises(SystemExit) as stop:
        main(["reproduce", "intro/bias-attack", "--quiet", "--out", str(target)])
    assert stop.value.code == 1
    err = capsys.readouterr().err
    fallback = tmp_path / "fallback" / "leakagelib-r.json"
    assert "disk full" in err and str(fallback) in err
    assert read_record(fallback)["experiment"] == "intro/bias-attack"


def test_a_campaign_hands_each_experiment_the_data_it_uses(capsys, monkeypatch, tmp_path):
    """One ``--data`` list serves a campaign of experiments that use different datasets; a name
    none of them uses fails before any work, naming the ones they use."""
    import leakagelib.cli as cli

    np = pytest.importorskip("numpy")
    mnist, cifar = tmp_path / "m.npz", tmp_path / "c.npz"
    for path, shape in ((mnist, (4, 1, 28, 28)), (cifar, (4, 3, 32, 32))):
        np.savez(path, images=np.zeros(shape, np.uint8), labels=np.zeros(4, np.int64))
    shares = cli.campaign_data(
        ["intro/bias-attack", "rgap/table3-rank"], [f"mnist={mnist}", f"cifar10={cifar}"]
    )
    assert shares == {
        "intro/bias-attack": [f"mnist={mnist}"],
        "rgap/table3-rank": [f"cifar10={cifar}"],
    }

    seen: list = []
    monkeypatch.setattr(cli, "run_to_record", lambda args, out: seen.append(args.data))
    base = ["campaign", "--quiet", "--results", str(tmp_path / "results")]
    ids = ["--only", "intro/bias-attack", "rgap/table3-rank"]
    assert main([*base, *ids, "--data", f"mnsit={mnist}"]) == 2
    err = capsys.readouterr().err
    assert "'mnsit', which none of this campaign's experiments uses; they use cifar10, mnist" in err
    assert seen == [], "nothing ran"

    from leakagelib.experiments import estimate

    monkeypatch.setattr(
        estimate, "step_seconds", lambda net, kind, images, device, objective=None: 1e-3
    )
    assert main([*base, *ids, "--data", f"mnist={mnist}", "--data", f"cifar10={cifar}"]) == 0
    assert seen == [[f"mnist={mnist}"], [f"cifar10={cifar}"]]


def test_reproduce_set_changes_a_setting_and_the_record_says_so(tmp_path, capsys):
    out = tmp_path / "bias.json"
    args = ["reproduce", "intro/bias-attack", "--out", str(out), "--quiet", "--set", "victims=3"]
    assert main(args) == 0
    record = read_record(out)
    assert len(record["rows"]) == 3, "the run used the changed setting"
    assert record["settings_changed"] == {"victims": {"registered": 8, "used": 3}}
    plain = tmp_path / "plain.json"
    assert main(["reproduce", "intro/bias-attack", "--out", str(plain), "--quiet"]) == 0
    assert "settings_changed" not in read_record(plain)


@pytest.mark.parametrize(
    ("item", "words"),
    [
        ("victim=3", "has no setting 'victim'; it has ['victims']"),
        ("victims=3.5", "setting 'victims' is 8 (int); 3.5 is not one"),
        ("victims=many", "VALUE must be a Python literal (a number, True or False"),
        ("victims", "expected NAME=VALUE"),
    ],
)
def test_reproduce_set_refuses_bad_changes_before_any_work(tmp_path, capsys, item, words):
    out = tmp_path / "r.json"
    assert main(["reproduce", "intro/bias-attack", "--out", str(out), "--set", item]) == 2
    assert words in capsys.readouterr().err
    assert not out.exists() and not (tmp_path / "r.json.partial").exists()


def test_scale_config_changes_keep_kinds():
    from leakagelib import experiments

    config = experiments.get("rgap/appG-noise").config
    changed = config.changed("paper", {"noise_levels": [0.0, 0.1], "victims": 5})
    assert changed.paper["noise_levels"] == (0.0, 0.1) and changed.paper["victims"] == 5
    assert changed.ci == config.ci and changed.sources == config.sources
    with pytest.raises(ValueError, match="'noise_levels' is"):
        config.changed("ci", {"noise_levels": 0.1})
