"""Every chapter in _toc.yml: conventions checked statically, then executed at SCALE="ci".

Execution goes through papermill (kernel ``python3``, one process per
notebook with a wall-clock limit); cells marked ``# NBVAL_CHECK_OUTPUT`` are
compared with their stored output by nbval in lax mode.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK_TIMEOUT_S = 600
NBVAL_MARK = "# NBVAL_CHECK_OUTPUT"


def _toc_files(node) -> list[str]:
    if isinstance(node, dict):
        found = [node["file"]] if "file" in node else []
        if "root" in node:
            found.append(node["root"])
        for value in node.values():
            if isinstance(value, (list, dict)):
                found += _toc_files(value)
        return found
    if isinstance(node, list):
        return [f for item in node for f in _toc_files(item)]
    return []


def chapters() -> list[Path]:
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    paths = [ROOT / f"{f}.ipynb" for f in _toc_files(toc)]
    return [p for p in paths if p.exists()]


CHAPTERS = chapters()
IDS = [p.stem for p in CHAPTERS]


def test_the_toc_lists_chapters_and_every_toc_entry_exists():
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    for entry in _toc_files(toc):
        assert any((ROOT / f"{entry}{ext}").exists() for ext in (".ipynb", ".md")), entry
    assert CHAPTERS, "no notebook chapters in _toc.yml"


@pytest.mark.parametrize("path", CHAPTERS, ids=IDS)
def test_chapter_follows_the_book_conventions(path: Path):
    nb = json.loads(path.read_text())
    cells = nb["cells"]
    assert nb["metadata"]["kernelspec"]["name"] == "python3"
    assert cells[0]["cell_type"] == "markdown"
    first = "".join(cells[0]["source"])
    assert first.startswith("# "), "a chapter opens with its title"
    assert "objectives" in first.lower(), "a chapter states its learning objectives up front"
    code = [c for c in cells if c["cell_type"] == "code"]
    assert "parameters" in code[0]["metadata"].get("tags", []), (
        "first code cell is tagged parameters"
    )
    assert 'SCALE = "ci"' in "".join(code[0]["source"])
    assert any("remove-cell" in c["metadata"].get("tags", []) for c in code), "claims are asserted"
    text = "".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    assert "## Exercises" in text and ":class: dropdown" in text, (
        "exercises with dropdown solutions"
    )
    for c in code:
        src = "".join(c["source"])
        assert not src.rstrip().endswith(";"), "end plot cells with plt.show(), not ';'"
        if NBVAL_MARK not in src:
            assert not c.get("outputs"), "notebooks are stored without outputs"
    if any("interact" in "".join(c["source"]) for c in code):
        assert any("plt.show()" in "".join(c["source"]) for c in code)


@pytest.mark.parametrize("path", CHAPTERS, ids=IDS)
def test_chapter_executes_at_ci_scale(path: Path, tmp_path: Path):
    out = tmp_path / path.name
    cmd = [sys.executable, "-m", "papermill", str(path), str(out), "-p", "SCALE", "ci"]
    cmd += ["-k", "python3", "--cwd", str(path.parent), "--no-progress-bar"]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=NOTEBOOK_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{path.name} did not finish within {NOTEBOOK_TIMEOUT_S} s")
    assert done.returncode == 0, done.stderr[-4000:]
    executed = json.loads(out.read_text())
    errors = [
        o
        for c in executed["cells"]
        for o in c.get("outputs", [])
        if o.get("output_type") == "error"
    ]
    assert not errors


NBVAL_CHAPTERS = [p for p in CHAPTERS if NBVAL_MARK in p.read_text()]


@pytest.mark.parametrize("path", NBVAL_CHAPTERS, ids=[p.stem for p in NBVAL_CHAPTERS])
def test_marked_outputs_still_match(path: Path):
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--nbval-lax"]
    cmd += [str(path), "-o", "addopts=", "--rootdir", str(path.parent)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=NOTEBOOK_TIMEOUT_S, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-4000:]
