"""benchmarks/residuals_speed.py runs, and its three ways compute one sum (not timed)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "residuals_speed.py"


def _bench():
    sys.path.insert(0, str(SCRIPT.parent))  # the script imports its neighbour machine.py
    try:
        spec = importlib.util.spec_from_file_location("residuals_speed", SCRIPT)
        bench = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(bench)
    finally:
        sys.path.remove(str(SCRIPT.parent))
    return bench


def test_the_cpu_plan_the_gpu_plan_and_the_materialised_sums_agree(monkeypatch, capsys):
    bench = _bench()
    monkeypatch.setattr(sys, "argv", ["residuals_speed.py", "--attacks", "20", "--repeats", "1"])
    bench.main()  # it asserts that the three ways' sums agree
    rows = capsys.readouterr().out.splitlines()[1:]
    assert len(rows) == 3 and all(row.count(" ms") == 3 for row in rows), rows


def test_the_plans_sums_are_compared_so_a_wrong_one_fails(monkeypatch):
    bench = _bench()
    right = bench._materialised
    monkeypatch.setattr(bench, "_materialised", lambda *args: right(*args) * 1.01)
    monkeypatch.setattr(sys, "argv", ["residuals_speed.py", "--attacks", "20", "--repeats", "1"])
    with pytest.raises(AssertionError):
        bench.main()


def test_attacks_not_in_whole_blocks_of_victims_are_refused(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["residuals_speed.py", "--attacks", "25"])
    with pytest.raises(SystemExit):
        _bench().main()
