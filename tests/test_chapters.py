"""Every chapter in _toc.yml: conventions checked statically, then its executed outputs.

The chapters are executed once, by the book build (``make test`` runs
``jupyter-book build`` before these tests; ``execute_notebooks: cache`` keeps
the executed notebooks in ``_build/.jupyter_cache``, and a cell that runs
longer than ``execute.timeout`` fails the build naming the chapter and cell).
These tests read the executed notebooks: no error outputs, and cells marked
``# NBVAL_CHECK_OUTPUT`` print what their stored output says.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / "_build" / ".jupyter_cache"
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
    assert "## Exercises" in text and "{solution-start}" in text, (
        "exercises with gated solutions (tests/test_book_pages.py checks them)"
    )
    for c in code:
        src = "".join(c["source"])
        assert not src.rstrip().endswith(";"), "end plot cells with plt.show(), not ';'"
        if NBVAL_MARK not in src:
            assert not c.get("outputs"), "notebooks are stored without outputs"
    if any("interact" in "".join(c["source"]) for c in code):
        assert any("plt.show()" in "".join(c["source"]) for c in code)
    runs = [src for c in code for src in ["".join(c["source"])] if "experiments.run(" in src]
    assert all("progress=False" in src for src in runs), (
        "experiments.run(..., progress=False) in chapters: in a notebook tqdm's bar is a widget "
        "(comm traffic from its monitor thread, a stored widget state that the site cannot show)"
    )


def executed(path: Path) -> dict:
    """The chapter as the book build executed it (from the build's jupyter-cache).

    ``make test`` builds the book first, executing every chapter once at
    ``SCALE="ci"`` (``execute_notebooks: cache`` in ``_config.yml``); the
    tests below read those executed notebooks instead of running the chapters
    a second time, so the site shows exactly what was tested.
    """
    if not CACHE.is_dir():
        pytest.fail(f"no executed chapters in {CACHE}: run `make book` (or `make test`) first")
    import nbformat
    from jupyter_cache import get_cache

    try:
        _, nb = get_cache(str(CACHE)).merge_match_into_file(str(path))
    except KeyError:
        pytest.fail(
            f"{path.name} has not been executed since its code last changed: run `make book` first"
        )
    return nbformat.from_dict(nb)


@pytest.mark.parametrize("path", CHAPTERS, ids=IDS)
def test_chapter_executed_at_ci_scale_without_error(path: Path):
    nb = executed(path)
    errors = [
        (i, o.get("ename"), o.get("evalue"))
        for i, c in enumerate(nb["cells"])
        for o in c.get("outputs", [])
        if o.get("output_type") == "error"
    ]
    assert not errors, f"{path.name}: cells with errors {errors}"
    ran = [c for c in nb["cells"] if c["cell_type"] == "code" and c.get("execution_count")]
    assert ran, f"{path.name}: no code cell was executed"


def _text(outputs: list) -> str:
    """The text of a cell's outputs as nbval compares them (streams and text/plain)."""
    parts = []
    for o in outputs:
        if o.get("output_type") == "stream":
            parts.append("".join(o["text"]))
        elif "data" in o and "text/plain" in o["data"]:
            parts.append("".join(o["data"]["text/plain"]))
    return "".join(parts)


NBVAL_CHAPTERS = [p for p in CHAPTERS if NBVAL_MARK in p.read_text()]


@pytest.mark.parametrize("path", NBVAL_CHAPTERS, ids=[p.stem for p in NBVAL_CHAPTERS])
def test_marked_outputs_still_match(path: Path):
    stored = json.loads(path.read_text())["cells"]
    ran = executed(path)["cells"]
    for cell, new in zip(stored, ran, strict=True):
        if cell["cell_type"] == "code" and NBVAL_MARK in "".join(cell["source"]):
            assert _text(new.get("outputs", [])) == _text(cell["outputs"]), "".join(cell["source"])


#: A figure's limits, in pixels of its PNG: the page shows about 800 px of width, so a wider
#: figure is scaled down — a panel strip wider than MAX_ASPECT times its height shrinks its
#: text below legibility (the "all 8 images" scatter once came out 1884 × 299).
MIN_SIDE, MAX_WIDTH, MAX_ASPECT = 100, 2400, 5.0


def _png_size(data: str) -> tuple[int, int]:
    """Width and height from a base64 PNG's IHDR chunk."""
    import base64
    import struct

    head = base64.b64decode(data[:64])
    return struct.unpack(">II", head[16:24])


@pytest.mark.parametrize("path", CHAPTERS, ids=IDS)
def test_every_figure_is_of_a_size_the_page_can_show(path: Path):
    nb = executed(path)
    sizes = [
        (i, *_png_size(o["data"]["image/png"]))
        for i, c in enumerate(nb["cells"])
        for o in c.get("outputs", [])
        if "image/png" in o.get("data", {})
    ]
    bad = [
        (cell, w, h)
        for cell, w, h in sizes
        if min(w, h) < MIN_SIDE or w > MAX_WIDTH or w / h > MAX_ASPECT
    ]
    assert not bad, f"{path.name}: figures (cell, width, height) outside the page's limits: {bad}"
