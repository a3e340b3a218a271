"""The paper-scale records ship with the library: a non-editable install finds them.

``results/*.json`` and the partial records ``results/*.json.partial`` are installed as the
package data ``leakagelib.results``
(``pyproject.toml``), and :func:`leakagelib.records.default_results_dir`
finds it there, so a chapter opened on Colab (``pip install git+...``, not
editable) shows the records beside the paper as the checkout does.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RECORDS = sorted(p.name for p in (ROOT / "results").glob("*.json"))
PARTIAL = sorted(p.name for p in (ROOT / "results").glob("*.json.partial"))


def test_the_checkout_reads_its_own_results_folder():
    from leakagelib.records import default_results_dir

    assert default_results_dir() == ROOT / "results"


#: A campaign under way in the copy the wheel is built from: 1 of 2 units of this experiment.
PENDING = "intro/bias-attack"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """A wheel built from a copy of the source (the checkout itself stays untouched), with a
    partial record of :data:`PENDING` added to the copy's ``results/``."""
    from leakagelib.experiments.resume import PartialRecord
    from leakagelib.records import record_filename

    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, src / name)
    for folder in ("leakagelib", "results"):
        shutil.copytree(ROOT / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__"))
    partial = src / "results" / (record_filename(PENDING) + ".partial")
    PartialRecord(partial, {"scale": "paper", "seed": 0}, resume=False).add("u", [{}], 1.0, 2)
    out = tmp_path_factory.mktemp("wheel")
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
    subprocess.run([*cmd, "-w", str(out), str(src)], check=True, capture_output=True)
    [built] = out.glob("leakagelib-*.whl")
    return built


def test_the_wheel_holds_every_module_every_record_and_the_licence(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    modules = {p.relative_to(ROOT).as_posix() for p in (ROOT / "leakagelib").rglob("*.py")}
    assert not modules - names, "pyproject.toml's package list misses a package"
    assert RECORDS, "no records in results/"
    assert {f"leakagelib/results/{r}" for r in RECORDS + PARTIAL} <= names
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)


def run_installed(wheel: Path, tmp_path: Path, code: str, exp_id: str) -> str:
    """What ``code`` prints, run with ``exp_id`` as its argument against the unpacked wheel
    alone (not the checkout)."""
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    check = (
        "import leakagelib.records as r;"
        f"assert r.default_results_dir().is_relative_to({str(site)!r});"
    )
    env = {**os.environ, "PYTHONPATH": str(site)}
    out = subprocess.run(
        [sys.executable, "-c", check + code, exp_id],
        cwd=tmp_path, env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_an_installed_wheel_finds_the_records(wheel, tmp_path):
    from leakagelib import experiments
    from leakagelib.records import record_filename

    exp_id = next(i for i in experiments.available() if record_filename(i) == RECORDS[0])
    code = "import sys; print(r.paper_record(sys.argv[1])['experiment'])"
    assert run_installed(wheel, tmp_path, code, exp_id) == exp_id


def test_an_installed_wheel_finds_the_partial_records(wheel, tmp_path):
    """A campaign under way shows on Colab too ("record pending: k of n units")."""
    code = (
        "import sys; from leakagelib.experiments.resume import pending_record;"
        "p = pending_record(sys.argv[1]); print(len(p.units), p.total)"
    )
    assert run_installed(wheel, tmp_path, code, PENDING) == "1 2"
