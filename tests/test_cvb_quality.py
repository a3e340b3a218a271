"""The CVB experiments' quality columns (the supplementary Tables VIII–XII) and Fig. 9's runs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from leakagelib import experiments
from leakagelib.experiments import cvb_defenses, cvb_hyperparams
from leakagelib.experiments.cvb_quality import quality_row


class _Scored:
    """A stand-in case whose per-image scores are given: what ``quality_row`` reads of a case."""

    def __init__(self, scores: dict[str, list[float]]) -> None:
        self.scores = scores
        self.asked: list[str] = []

    def score(self, result: object, metric: str) -> torch.Tensor:
        self.asked.append(metric)
        return torch.tensor(self.scores[metric], dtype=torch.float64)


SCORES = {
    "ssim_minmax": [0.2, 0.6, 0.7],
    "psnr_minmax": [9.0, 12.0, 18.0],
    "mse_minmax": [0.12, 0.06, 0.03],
    "lpips_minmax": [0.6, 0.4, 0.2],
}


def test_quality_row_reports_each_metric_as_mean_and_std_with_the_asr() -> None:
    """SSIM, PSNR and MSE (min–max, as the authors') as mean and std; ASR the share ≥ 0.5."""
    case = _Scored(SCORES)
    row = quality_row(case, None, dataset="cifar10")
    assert row["dataset"] == "cifar10"
    assert row["asr"] == pytest.approx(2 / 3)
    for name in ("ssim", "psnr", "mse"):
        values = torch.tensor(SCORES[f"{name}_minmax"], dtype=torch.float64)
        assert row[name] == pytest.approx(float(values.mean()))
        assert row[f"{name}_std"] == pytest.approx(float(values.std()))
    assert "lpips" not in row and "lpips_minmax" not in case.asked  # Tables I–II: no column
    off = quality_row(_Scored(SCORES), None, lpips=False)
    assert off["lpips"] is None and off["lpips_std"] is None  # the column, not measured
    on = quality_row(_Scored(SCORES), None, lpips=True)
    assert on["lpips"] == pytest.approx(0.4) and on["lpips_std"] == pytest.approx(0.2)


def test_lpips_without_its_weights_stops_the_run_before_any_attack(
    tmp_path: Path, monkeypatch
) -> None:
    """``--set lpips=True`` offline, with no VGG-16 weights cached: a clear error, no attack run."""
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))

    def no_attack(*args: object, **kwargs: object) -> None:
        raise AssertionError("an attack ran before the LPIPS check")

    monkeypatch.setattr(cvb_defenses, "run_attack", no_attack)
    with pytest.raises(RuntimeError, match=r"--set lpips=True: LPIPS \(vgg\) needs") as error:
        experiments.run("cvb/table3-attacks", "ci", progress=False, changes={"lpips": True})
    assert "vgg16" in str(error.value) and "Or run without it" in str(error.value)


def test_experiments_with_a_supplementary_table_carry_its_columns() -> None:
    """Tables III–VI and Fig. 9: PSNR, MSE and LPIPS in the rows and in the paper's rows."""
    for exp_id in ("cvb/table3-attacks", "cvb/table4-defenses", "cvb/table5-architectures",
                   "cvb/table6-medical", "cvb/fig9-hyperparams"):  # fmt: skip
        exp = experiments.get(exp_id)
        assert {"psnr", "mse", "lpips"} <= set(exp.row_keys), exp_id
        assert exp.reference and all({"psnr", "mse", "lpips"} <= set(r) for r in exp.reference)
        assert exp.config.at("paper").lpips is False and "lpips" in exp.config.sources


def test_fig9_runs_each_network_once_and_the_position_study_uses_kernel_1() -> None:
    """Studies building one network share a run, as Table VIII's identical rows show."""
    exp = experiments.get("cvb/fig9-hyperparams")
    paper = exp.config.at("paper")
    studies = cvb_hyperparams.fig9_studies(paper)
    runs = cvb_hyperparams.fig9_runs(paper)
    assert sorted(i for run in runs for i in run) == list(range(len(studies))) == list(range(22))
    shared = [[studies[i][:2] for i in run] for run in runs if len(run) > 1]
    assert shared == [
        [("position", "1"), ("kernel", 1)],
        [("kernel", 5), ("scale", 0.5), ("beta", 0.1)],
    ]
    paper_rows = {(r["study"], r["value"]): r for r in exp.reference}
    assert paper_rows[("position", "1")] == {**paper_rows[("kernel", 1)], "study": "position",
                                             "value": "1"}  # fmt: skip


def test_fig9_at_ci_gives_shared_runs_identical_rows(monkeypatch) -> None:
    """The ci run: every study's row in order, and one run's numbers in each of its rows."""
    attack = cvb_hyperparams.cvb_attack
    monkeypatch.setattr(
        cvb_hyperparams, "cvb_attack", lambda *a, **kw: attack(*a, **kw).with_config(steps=2)
    )
    record = experiments.run("cvb/fig9-hyperparams", "ci", progress=False)
    ci = experiments.get("cvb/fig9-hyperparams").config.at("ci")
    rows = record["rows"]
    assert [(r["study"], r["value"]) for r in rows] == [
        s[:2] for s in cvb_hyperparams.fig9_studies(ci)
    ]
    by = {(r["study"], r["value"]): r for r in rows}
    numbers = ("ssim", "psnr", "mse", "accuracy", "added")
    assert all(by[("position", "1")][k] == by[("kernel", 1)][k] for k in numbers)
    assert all(by[("kernel", 5)][k] == by[("beta", 0.1)][k] for k in numbers)
    assert by[("kernel", 5)]["ssim"] != by[("kernel", 1)]["ssim"]  # different runs differ
    assert all(r["lpips"] is None for r in rows)
