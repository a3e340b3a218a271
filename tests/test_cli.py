"""The command line: list, reproduce, and its errors."""

import json
import subprocess
import sys

import pytest

from leakagelib.cli import build_parser, format_table, main
from leakagelib.records import read_record


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
        images=rng.integers(0, 256, (8, 1, 28, 28), dtype=np.uint8),
        labels=np.arange(8, dtype=np.int64),
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
    assert json.loads(out.read_text())["data"]["mnist"] == str(path)


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
