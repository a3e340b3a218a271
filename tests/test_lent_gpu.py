"""``tools/lent_gpu.sh``, the one-command paper-scale run on a lent GPU, smoke-tested on the CPU.

The script's own environment switches (``SCALE``, ``DEVICE``, ``RESULTS``,
``PYTHON``, ``OUT``) run it here at ci scale: it must pass the offline sample
of only the datasets the experiments use, copy each finished record into
``$OUT`` and end with ``timeout``'s status when its time runs out, so that a
device call that was cut short says so, and end within its seconds even when
the stop signal is not heeded, so that the device's own limit never cuts the
copying (``GRACE`` shortens the script's lead times for these tests).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

SCRIPT = Path(__file__).resolve().parents[1] / "tools" / "lent_gpu.sh"


def _mnist_sample(root: Path) -> Path:
    """A stand-in for the offline MNIST sample, in its format (random pixels: nothing is learnt)."""
    folder = root / ".shared-data"
    folder.mkdir()
    rng = np.random.default_rng(0)
    path = folder / "mnist_test_0_4999.npz"
    images = rng.integers(0, 256, (300, 1, 28, 28), dtype=np.uint8)
    np.savez(path, images=images, labels=np.arange(300) % 10, classes=np.array(list("0123456789")))
    return path


def _run(
    root: Path,
    seconds: int,
    *ids: str,
    grace: int = 60,
    python: str = sys.executable,
    workers: int = 1,
    units: str = "",
) -> tuple[subprocess.CompletedProcess, Path, Path]:
    """The script at ci scale on the CPU from ``root``, with results and ``$OUT`` of its own."""
    out, results = root / f"out-{seconds}", root / f"results-{seconds}"
    out.mkdir()
    env = {
        **os.environ,
        "SCALE": "ci",
        "DEVICE": "cpu",
        "RESULTS": str(results),
        "PYTHON": python,
        "OUT": str(out),
        "GRACE": str(grace),
        "WORKERS": str(workers),
        "UNITS": units,
    }
    done = subprocess.run(
        ["bash", str(SCRIPT), str(seconds), *ids],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return done, out, results


def test_a_finished_record_comes_back_with_the_sample_it_read(tmp_path: Path) -> None:
    _mnist_sample(tmp_path)  # no CIFAR-10 sample: naming it for this experiment would fail
    done, out, results = _run(tmp_path, 240, "intro/bias-attack")
    assert done.returncode == 0, done.stdout + done.stderr
    record = json.loads((out / "intro-bias-attack.json").read_text(encoding="utf-8"))
    assert record["scale"] == "ci" and record["provenance"]["device"] == "cpu"
    assert record["data"]["mnist"]["spec"] == ".shared-data/mnist_test_0_4999.npz"
    assert record["data"]["cifar10"] == "patches"  # its stand-in: no sample was passed
    copied = (out / "intro-bias-attack.json").read_bytes()
    assert copied == (results / "intro-bias-attack.json").read_bytes()


def test_a_run_cut_short_ends_with_timeouts_status(tmp_path: Path) -> None:
    _mnist_sample(tmp_path)
    # the stop signal after a second: not even torch's import
    done, out, _ = _run(tmp_path, 2, "intro/bias-attack", grace=1)
    assert done.returncode == 124, done.stdout + done.stderr
    assert not list(out.iterdir())


def test_a_run_that_ignores_the_stop_signal_is_killed_within_its_seconds(tmp_path: Path) -> None:
    """A campaign that does not stop at SIGTERM (a GPU program runs to its end first) is killed a
    quarter of GRACE before SECONDS, and what it left is still copied."""
    stubborn = tmp_path / "python"
    stubborn.write_text(
        "#!/usr/bin/env bash\n"
        'if [ "$1" = -c ]; then exit 0; fi  # the datasets query: none\n'
        "trap '' TERM\n"
        'mkdir -p "$RESULTS" && echo "{}" > "$RESULTS/intro-bias-attack.json.partial"\n'
        "sleep 60\n",
        encoding="utf-8",
    )
    stubborn.chmod(0o755)
    start = time.monotonic()
    done, out, _ = _run(tmp_path, 8, "intro/bias-attack", grace=4, python=str(stubborn))
    assert time.monotonic() - start < 8
    assert done.returncode == 137, done.stdout + done.stderr  # timeout's status after SIGKILL
    assert (out / "intro-bias-attack.json.partial").read_text(encoding="utf-8") == "{}\n"


def test_seconds_within_the_grace_are_refused_before_anything_runs(tmp_path: Path) -> None:
    done, out, _ = _run(tmp_path, 60, "intro/bias-attack", python="/nonexistent")
    assert done.returncode == 2 and "must exceed GRACE = 60" in done.stderr
    assert not list(out.iterdir())


def test_workers_run_the_units_as_shards_and_the_last_writes_the_record(tmp_path: Path) -> None:
    """WORKERS=2: two campaigns side by side split Fig. 7's three units; one stops when its
    share is done, the other writes the record of all three (taking in the first's units: it
    says it resumed), which comes back."""
    _mnist_sample(tmp_path)
    done, out, _ = _run(tmp_path, 240, "bayes/fig7-mc-samples", workers=2)
    assert done.returncode == 0, done.stdout + done.stderr
    # one shard stops early, unless both finish at once (then both write the same rows)
    assert done.stdout.count("has run its units") <= 1, done.stdout
    record = json.loads((out / "bayes-fig7-mc-samples.json").read_text(encoding="utf-8"))
    assert len(record["provenance"]["units"]) == 3 and record["provenance"]["resumed"]
    assert sorted(p.name for p in out.iterdir()) == ["bayes-fig7-mc-samples.json"]


def test_units_run_only_the_units_named_and_their_partial_record_comes_back(tmp_path: Path) -> None:
    """UNITS=4: Fig. 7's unit of four Monte-Carlo samples alone (its key holds "4", its others
    "1" and "16"); no record yet, the partial record with that unit comes back."""
    _mnist_sample(tmp_path)
    done, out, _ = _run(tmp_path, 240, "bayes/fig7-mc-samples", units="4")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 of 3 are left to other runs" in done.stdout, done.stdout
    assert sorted(p.name for p in out.iterdir()) == ["bayes-fig7-mc-samples.json.partial"]
    partial = json.loads((out / "bayes-fig7-mc-samples.json.partial").read_text(encoding="utf-8"))
    assert list(partial["units"]) == ["4"]
