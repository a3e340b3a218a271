"""The chapters as a course uses them, checked on the notebooks' sources (nothing is executed).

Every chapter in ``_toc.yml`` has numbered exercises (sphinx-exercise's
``exercise`` directive), each answered by a gated solution
(``solution-start`` … ``solution-end``) that holds code cells: they run
whenever the chapter runs, so the book build executes every solution and
``tests/test_chapters.py`` fails on any error in them. Every chapter ends with
a Summary (before its exercises) whose numbers are glued from the run; a
chapter with a paper scale includes the GPU note from the one shared file,
``book/_gpu.md``, right after its title; and every ``{glue:…}`` role on a page
names a key that one of the page's code cells glues.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from test_chapters import CHAPTERS, IDS, ROOT

GPU_NOTE = ROOT / "book" / "_gpu.md"
GPU_INCLUDE = "```{include} _gpu.md\n```"
EXERCISE = re.compile(r"^`{3,}\{exercise\}[^\n]*\n:label: (\S+)", re.MULTILINE)
SOLUTION_START = re.compile(r"^`{3,}\{solution-start\} (\S+)", re.MULTILINE)
SOLUTION_END = re.compile(r"^`{3,}\{solution-end\}", re.MULTILINE)
GLUE_ROLE = re.compile(r"\{glue(?::\w+)?\}`([^`:]+)")
GLUED = re.compile(r"""\bglue\(\s*["']([^"']+)["']""")
# keys built in a loop: glue(f"t4_ra_{name}", ...) or key = f"..."; glue(key, ...)
GLUED_F = re.compile(r'\bglue\(\s*f"([^"]+)"')
KEY_F = re.compile(r'\b(\w+)\s*=\s*f"([^"]+)"')


def key_patterns(source: str) -> list[re.Pattern]:
    """The glue keys a code cell builds from f-strings, as patterns ({...} matches anything)."""
    built = GLUED_F.findall(source) + [
        fstring
        for name, fstring in KEY_F.findall(source)
        if re.search(rf"\bglue\(\s*{name}\b", source)
    ]
    return [
        re.compile(".+".join(re.escape(part) for part in re.split(r"\{[^{}]*\}", fstring)))
        for fstring in built
    ]


def cells(path: Path) -> list[dict]:
    """The notebook's cells, each with its source joined into one string."""
    nb = json.loads(path.read_text())
    return [{**c, "source": "".join(c["source"])} for c in nb["cells"]]


def tags(cell: dict) -> list[str]:
    return cell["metadata"].get("tags", [])


def solutions(path: Path) -> dict[str, list[dict]]:
    """Exercise label → the code cells between its ``solution-start`` and ``solution-end``."""
    found: dict[str, list[dict]] = {}
    current: str | None = None
    for cell in cells(path):
        if cell["cell_type"] == "code":
            if current is not None:
                found[current].append(cell)
            continue
        starts = SOLUTION_START.findall(cell["source"])
        ends = SOLUTION_END.findall(cell["source"])
        assert len(starts) + len(ends) <= 1, "one gated directive per markdown cell"
        if starts:
            assert current is None, f"solution {starts[0]} opens inside solution {current}"
            assert starts[0] not in found, f"two solutions to {starts[0]}"
            current = starts[0]
            found[current] = []
        if ends:
            assert current is not None, "solution-end without a solution-start"
            current = None
    assert current is None, f"solution {current} is never closed"
    return found


def runs_code(cell: dict) -> bool:
    """A code cell that executes something: not skipped, not only comments."""
    lines = [ln for ln in cell["source"].splitlines() if ln.strip()]
    skipped = {"skip-execution", "raises-exception"} & set(tags(cell))
    return not skipped and any(not ln.lstrip().startswith("#") for ln in lines)


def has_paper_scale(path: Path) -> bool:
    """Whether the chapter runs differently at ``SCALE = "paper"``: code past the
    parameters cell reads ``SCALE``."""
    code = [c for c in cells(path) if c["cell_type"] == "code"]
    return any(re.search(r"\bSCALE\b", c["source"]) for c in code[1:])


@pytest.mark.parametrize("path", CHAPTERS, ids=IDS)
def test_every_exercise_has_a_solution_whose_code_runs(path: Path):
    text = "\n".join(c["source"] for c in cells(path) if c["cell_type"] == "markdown")
    exercises = EXERCISE.findall(text)
    assert exercises, f"{path.name}: no ```{{exercise}} with a :label:"
    assert len(set(exercises)) == len(exercises), f"{path.name}: repeated labels {exercises}"
    answered = solutions(path)
    assert sorted(answered) == sorted(exercises), (
        f"{path.name}: exercises {exercises}, solutions {sorted(answered)}"
    )
    for label, code in answered.items():
        shown = [c for c in code if "solution" in tags(c) and runs_code(c)]
        assert shown, f"{path.name}: the solution to {label} has no code cell tagged solution"
        assert all(runs_code(c) for c in code), f"{path.name}: {label} holds a skipped cell"


@pytest.mark.parametrize("path", CHAPTERS, ids=IDS)
def test_chapter_ends_with_a_glued_summary_before_its_exercises(path: Path):
    headings = [
        (i, line)
        for i, c in enumerate(cells(path))
        if c["cell_type"] == "markdown"
        for line in c["source"].splitlines()
        if line.startswith("## ")
    ]
    names = [line[3:].strip() for _, line in headings]
    assert names[-2:] == ["Summary", "Exercises"], f"{path.name}: sections end with {names[-3:]}"
    summary = cells(path)[headings[-2][0]]["source"]
    assert GLUE_ROLE.search(summary), f"{path.name}: the Summary glues none of its numbers"


@pytest.mark.parametrize("path", CHAPTERS, ids=IDS)
def test_gpu_note_is_included_from_the_shared_file(path: Path):
    chapter = cells(path)
    notes = [c for c in chapter if "_gpu.md" in c["source"] or "runtime type" in c["source"]]
    if has_paper_scale(path):
        assert chapter[1]["cell_type"] == "markdown", f"{path.name}: no note after the title"
        assert chapter[1]["source"].strip() == GPU_INCLUDE, f"{path.name}: cell 1 is not the note"
        assert notes == [chapter[1]], f"{path.name}: a second GPU note of its own"
    else:
        assert not notes, f"{path.name} has no paper scale but shows the GPU note"


def test_the_shared_gpu_note_says_how_to_switch_and_is_no_page_of_its_own():
    note = GPU_NOTE.read_text()
    for needed in ('SCALE = "paper"', "LEAKAGELIB_DEVICE=cuda", "GPU", "Colab", "JupyterHub"):
        assert needed in note, needed
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    assert "book/_gpu.md" in config["exclude_patterns"]
    assert {"sphinx_exercise", "sphinx_proof"} <= set(config["sphinx"]["extra_extensions"])


@pytest.mark.parametrize("path", CHAPTERS, ids=IDS)
def test_every_glued_number_is_glued_by_the_chapter(path: Path):
    chapter = cells(path)
    used = {
        k for c in chapter if c["cell_type"] == "markdown" for k in GLUE_ROLE.findall(c["source"])
    }
    code = [c["source"] for c in chapter if c["cell_type"] == "code"]
    glued = {k for source in code for k in GLUED.findall(source)}
    patterns = [p for source in code for p in key_patterns(source)]
    missing = {k for k in used - glued if not any(p.fullmatch(k) for p in patterns)}
    assert not missing, f"{path.name}: glue keys used but never glued: {sorted(missing)}"
