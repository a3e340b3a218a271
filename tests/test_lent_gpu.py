"""``tools/lent_gpu.sh``, the one-command paper-scale run on a lent GPU, smoke-tested on the CPU.

The script's own environment switches (``SCALE``, ``DEVICE``, ``RESULTS``,
``PYTHON``, ``OUT``) run it here at ci scale: it must pass the offline sample
of only the datasets the experiments use, copy each finished record into
``$OUT`` and end with ``timeout``'s status when its time runs out, so that a
device call that was cut short says so.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
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


def _run(root: Path, seconds: int, *ids: str) -> tuple[subprocess.CompletedProcess, Path, Path]:
    """The script at ci scale on the CPU from ``root``, with results and ``$OUT`` of its own."""
    out, results = root / f"out-{seconds}", root / f"results-{seconds}"
    out.mkdir()
    env = {
        **os.environ,
        "SCALE": "ci",
        "DEVICE": "cpu",
        "RESULTS": str(results),
        "PYTHON": sys.executable,
        "OUT": str(out),
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
    done, out, _ = _run(tmp_path, 1, "intro/bias-attack")  # a second: not even torch's import
    assert done.returncode == 124, done.stdout + done.stderr
    assert not list(out.iterdir())
