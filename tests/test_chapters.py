"""Every chapter in _toc.yml: conventions checked statically, then its executed outputs.

The chapters are executed once, by the book build (``make test`` runs
``jupyter-book build`` before these tests; ``execute_notebooks: cache`` keeps
the executed notebooks in ``_build/.jupyter_cache``, and a cell that runs
longer than ``execute.timeout`` fails the build naming the chapter and cell).
These tests read the executed notebooks: no error outputs, and cells marked
``# NBVAL_CHECK_OUTPUT`` print what their stored output says.
"""

from __future__ import annotations

import ast
import json
import re
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
#: A chapter a reader can finish in one sitting (issue 15: "no chapter is over ~45 cells").
MAX_CELLS = 45
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
    assert len(cells) <= MAX_CELLS, f"{len(cells)} cells: split the chapter or merge cells"
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


#: Calls that create a matplotlib figure (module alias, function), as the chapters write them.
FIGURE_MAKERS = {
    ("plt", "figure"),
    ("plt", "subplots"),
    ("plt", "subplot_mosaic"),
    ("viz", "show_grid"),
    ("viz", "show_rows"),
    ("viz", "show_pictures"),
}
#: A widget cell: its figures are drawn by a callback, and a static twin shows them in the book.
WIDGET = re.compile(r"\bwidgets\.interactive\(|\binteract\(|\.observe\(")
GLUE_FIGURE = re.compile(r"^(`{3,})\{glue:figure\}[ \t]+(\S+)[ \t]*\n(.*?)^\1[ \t]*$", re.S | re.M)
OPTION = re.compile(r"^:(\w+):[ \t]*(.*?)[ \t]*$")


def _calls(node: ast.AST) -> list[ast.Call]:
    """The calls in ``node``, not counting those inside function or class definitions."""
    found, stack = [], [node]
    while stack:
        n = stack.pop()
        if isinstance(n, ast.Call):
            found.append(n)
        for child in ast.iter_child_nodes(n):
            if not isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                stack.append(child)
    return found


def _makes_figure(call: ast.Call, drawing: set[str]) -> bool:
    f = call.func
    if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name):
        return (f.value.id, f.attr) in FIGURE_MAKERS
    return isinstance(f, ast.Name) and f.id in drawing


def _code_trees(path: Path) -> list[tuple[int, dict, ast.Module]]:
    """(index, cell, syntax tree) of every code cell (IPython syntax such as ``%pip`` translated)."""
    from IPython.core.inputtransformer2 import TransformerManager

    python = TransformerManager().transform_cell
    cells = json.loads(path.read_text())["cells"]
    return [
        (i, c, ast.parse(python("".join(c["source"]))))
        for i, c in enumerate(cells)
        if c["cell_type"] == "code"
    ]


def figure_cells(path: Path) -> list[tuple[int, dict, ast.Module]]:
    """The code cells that create a matplotlib figure when they run, widget cells and hidden cells
    (``remove-cell``: a check that calls a widget's drawing callback never reaches the page)
    excepted: a call of ``FIGURE_MAKERS`` outside a definition, or of a function of the chapter
    that makes one."""
    trees = _code_trees(path)
    defs = {
        d.name: d
        for _, _, tree in trees
        for d in ast.walk(tree)
        if isinstance(d, ast.FunctionDef | ast.AsyncFunctionDef)
    }
    drawing: set[str] = set()
    while True:  # functions that call a maker, or a function that does
        more = {
            name
            for name, d in defs.items()
            if any(_makes_figure(c, drawing) for s in d.body for c in _calls(s))
        }
        if more <= drawing:
            break
        drawing |= more
    return [
        (i, c, tree)
        for i, c, tree in trees
        if not WIDGET.search("".join(c["source"]))
        and "remove-cell" not in c["metadata"].get("tags", [])
        and any(_makes_figure(call, drawing) for call in _calls(tree))
    ]


def glued_keys(tree: ast.Module) -> list[str]:
    """The literal keys a cell passes to ``glue``."""
    return [
        call.args[0].value
        for call in _calls(tree)
        if isinstance(call.func, ast.Name)
        and call.func.id == "glue"
        and call.args
        and isinstance(call.args[0], ast.Constant)
    ]


def glue_figures(path: Path) -> dict[str, tuple[int, dict[str, str], str]]:
    """Key → (markdown cell index, options, caption) of every ``glue:figure`` directive."""
    found: dict[str, tuple[int, dict[str, str], str]] = {}
    for i, c in enumerate(json.loads(path.read_text())["cells"]):
        if c["cell_type"] != "markdown":
            continue
        for m in GLUE_FIGURE.finditer("".join(c["source"])):
            lines = m[3].splitlines()
            options = dict(OPTION.match(ln).groups() for ln in lines if OPTION.match(ln))
            caption = "\n".join(ln for ln in lines if not OPTION.match(ln)).strip()
            assert m[2] not in found, f"{path.name}: two glue:figure directives for {m[2]}"
            found[m[2]] = (i, options, caption)
    return found


def uncaptioned(path: Path) -> list[str]:
    """What keeps the chapter's figures from being numbered and captioned: every figure cell
    glues its figure (``glue(KEY, fig, display=False)``) and closes it, so that the page shows
    it once, through the ``glue:figure`` directive in the first markdown cell after the cell,
    which names it (``:name:``, for ``{numref}``), describes it (``:alt:``) and captions it."""
    cells = json.loads(path.read_text())["cells"]
    directives = glue_figures(path)
    problems, used = [], set()
    for i, cell, tree in figure_cells(path):
        source = "".join(cell["source"])
        keys = [k for k in glued_keys(tree) if k in directives]
        if not keys:
            problems.append(f"cell {i} makes a figure that no glue:figure directive shows")
            continue
        used |= set(keys)
        if "plt.close(" not in source or re.search(r"^plt\.show\(\)", source, re.M):
            problems.append(f"cell {i} shows its glued figure (close it instead of plt.show())")
        after = next(j for j in range(i + 1, len(cells)) if cells[j]["cell_type"] == "markdown")
        for key in keys:
            at, options, caption = directives[key]
            if at != after:
                problems.append(f"{key} is captioned in cell {at}, not right after cell {i}")
            if not options.get("name") or not options.get("alt"):
                problems.append(f"{key}: the directive needs a :name: and an :alt: text")
            if not caption:
                problems.append(f"{key}: the directive has no caption")
    problems += [f"{k}: a glue:figure of no figure cell" for k in sorted(set(directives) - used)]
    return problems


@pytest.mark.parametrize("path", CHAPTERS, ids=IDS)
def test_every_figure_is_glued_numbered_and_captioned(path: Path):
    assert not uncaptioned(path), f"{path.name}: {uncaptioned(path)}"


def test_figure_keys_and_names_are_unique_across_the_book():
    keys = [k for p in CHAPTERS for k in glue_figures(p)]
    names = [o.get("name") for p in CHAPTERS for _, o, _ in glue_figures(p).values()]
    for found in (keys, [n for n in names if n]):
        repeated = sorted({k for k in found if found.count(k) > 1})
        assert not repeated, f"figure keys or names used twice: {repeated}"


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


#: A PNG among a cell's outputs: shown (``image/png``) or glued for a ``glue:figure`` directive
#: (``glue(key, fig, display=False)`` stores it under myst-nb's prefix).
PNG_KEYS = ("image/png", "application/papermill.record/image/png")


@pytest.mark.parametrize("path", CHAPTERS, ids=IDS)
def test_every_figure_is_of_a_size_the_page_can_show(path: Path):
    nb = executed(path)
    sizes = [
        (i, *_png_size(o["data"][key]))
        for i, c in enumerate(nb["cells"])
        for o in c.get("outputs", [])
        for key in PNG_KEYS
        if key in o.get("data", {})
    ]
    glued = {
        o["metadata"]["scrapbook"]["name"]
        for c in nb["cells"]
        for o in c.get("outputs", [])
        if PNG_KEYS[1] in o.get("data", {})
    }
    assert glued == set(glue_figures(path)), f"{path.name}: glued PNGs {sorted(glued)}"
    bad = [
        (cell, w, h)
        for cell, w, h in sizes
        if min(w, h) < MIN_SIDE or w > MAX_WIDTH or w / h > MAX_ASPECT
    ]
    assert not bad, f"{path.name}: figures (cell, width, height) outside the page's limits: {bad}"
