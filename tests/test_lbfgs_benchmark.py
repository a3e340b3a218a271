"""benchmarks/lbfgs_per_attack.py runs, and both of its routes take the same path (not timed)."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "lbfgs_per_attack.py"


def test_the_batched_per_attack_lbfgs_and_torchs_image_loop_reach_the_same_error(
    monkeypatch, capsys
):
    spec = importlib.util.spec_from_file_location("lbfgs_per_attack", SCRIPT)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    monkeypatch.setattr(sys, "argv", ["lbfgs_per_attack.py", "--images", "2", "--steps", "1"])
    bench.main()
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ours")
            or line.startswith("| torch")]  # fmt: skip
    assert len(rows) == 2, rows
    mse = [float(re.findall(r"\| ([0-9.e+-]+) \|$", row)[0]) for row in rows]
    assert mse[0] == mse[1] and mse[0] > 0, rows
