"""Coursework (``make coursework``, tools/coursework.py): student versions and autograders.

Every chapter is built (Otter Assign, nothing executed: a few seconds for the whole book) and its
student version checked against the chapter's source: every exercise is a graded question whose
tests come from the solution's check cells, no solution code, solution prose, assert or ``glue``
call is left, and every code cell the reader sees in the book is still there. One small chapter,
``client_updates``, is then graded for real: its reference solutions score full marks and its
unanswered student notebook scores zero, both running without an error (``make grading`` grades
every chapter so).
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import sys
import zipfile
from pathlib import Path

import nbformat
import pytest
from test_chapters import CHAPTERS, IDS, ROOT

_spec = importlib.util.spec_from_file_location("coursework", ROOT / "tools" / "coursework.py")
coursework = importlib.util.module_from_spec(_spec)
sys.modules["coursework"] = coursework  # its dataclasses look their module up by name
_spec.loader.exec_module(coursework)
read = coursework.read_chapter
code = sys.modules["coursework_code"]  # tools/coursework_code.py, as the build imports it


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("coursework")
    for path in CHAPTERS:
        coursework.build(path, out)
    return out


def student(built: Path, path: Path) -> list[nbformat.NotebookNode]:
    return nbformat.read(built / path.stem / "student" / path.name, as_version=4).cells


def graded_tests(built: Path, path: Path) -> dict[str, dict]:
    """The autograder's test files (OK format): question name → its ``test`` dictionary."""
    found = {}
    with zipfile.ZipFile(coursework.autograder_zip(path.stem, built)) as z:
        for name in z.namelist():
            if name.startswith("tests/") and name.endswith(".py"):
                namespace: dict = {}
                exec(z.read(name).decode(), namespace)
                found[namespace["test"]["name"]] = namespace["test"]
    return found


def statements(sources: list[str]) -> set[str]:
    return {ast.dump(s) for src in sources for s in code.parse(src, "test").body}


@pytest.mark.parametrize("path", CHAPTERS, ids=IDS)
def test_every_exercise_is_a_graded_question_with_hidden_tests(built: Path, path: Path):
    chapter = read(path)
    tests = graded_tests(built, path)
    assert sorted(tests) == sorted(ex.question for ex in chapter.exercises)
    answers = [c for c in student(built, path) if "otter_answer_cell" in c.metadata.get("tags", [])]
    assert len(answers) == len(chapter.exercises), f"{path.name}: one answer cell per exercise"
    for ex, answer in zip(chapter.exercises, answers, strict=True):
        cases = [c for suite in tests[ex.question]["suites"] for c in suite["cases"]]
        assert len(cases) == len(ex.checks) and tests[ex.question]["points"] == 1
        assert all(c["hidden"] for c in cases) and all("assert" in c["code"] for c in cases)
        names = coursework.plan(chapter).answers[ex.label]
        assert answer.source.splitlines()[2:] == [f"{n} = ..." for n in names], answer.source
        assert all(n in "".join(c["code"] for c in cases) for n in names)


@pytest.mark.parametrize("path", CHAPTERS, ids=IDS)
def test_student_version_has_no_solution_no_check_and_no_glue(built: Path, path: Path):
    chapter = read(path)
    cells = student(built, path)
    kept = [c.source for c in cells if c.cell_type == "code"]
    text = "\n".join(c.source for c in cells if c.cell_type == "markdown")
    shown = statements([c.source for kind, c in chapter.parts if kind in ("code", "hidden")])
    for ex in chapter.exercises:
        leaked = (statements(ex.solution) - shown) & statements(kept)
        assert not leaked, f"{path.name}: solution code of {ex.label} in the student version"
        assert all(prose.strip()[-200:] not in text for _, prose in ex.prose), ex.label
    trees = [code.parse(src, path.name) for src in kept]
    assert not any(isinstance(n, ast.Assert) for t in trees for n in ast.walk(t)), path.name
    assert not any(code.is_glue(s) for t in trees for s in ast.walk(t) if isinstance(s, ast.stmt))
    for directive in ("{exercise}", "{solution-start}", "{solution-end}", "{include}", "{glue"):
        assert directive not in text, f"{path.name}: {directive} left in the student version"


@pytest.mark.parametrize("path", CHAPTERS, ids=IDS)
def test_student_version_keeps_every_cell_the_reader_sees(built: Path, path: Path):
    chapter = read(path)
    code_cells = [c.source for c in student(built, path) if c.cell_type == "code"]
    visible = [c.source for kind, c in chapter.parts if kind == "code"]
    assert [s for s in code_cells if s in visible] == visible, path.name
    as_shown = [c.source for kind, c in read(path, student=False).parts if kind == "code"]
    assert [code.show_figures(s, path.name) for s in as_shown] == visible, path.name
    headings = [
        ln for kind, c in chapter.parts if kind == "markdown" for ln in c.source.split("\n")
    ]
    markdown = "\n".join(c.source for c in student(built, path) if c.cell_type == "markdown")
    assert all(h in markdown for h in headings if h.startswith("#")), path.name


def test_hidden_cells_lose_asserts_and_glue_and_keep_what_later_code_reads():
    source = (
        "from leakagelib.glue import glue\n"
        "per_image = f(x)  # read later\n"
        "found = [g(per_image[i]) for i in range(3)]\n"
        "for delta in (1, 2):\n"
        "    est = risk(delta)\n"
        "    assert est < 1\n"
        "if SCALE == 'ci':\n"
        "    assert found == [0, 1, 2], found\n"
        "glue('n_found', len(found), display=False)\n"
        "%matplotlib inline\n"
    )
    stmts, python = code.surgery(source, "example", asserts=True)
    kept = code.needed(stmts, {"per_image", "i"}, keep_asserts=False)
    assert code.render(kept, python).splitlines()[0] == "per_image = f(x)  # read later"
    assert len(kept) == 2 and "matplotlib" in code.render(kept, python)  # the magic is kept
    checks, python = code.surgery(source, "example", asserts=False)
    test = code.render(code.needed(checks, set(), keep_asserts=True), python)
    assert "glue" not in test and "assert found" in test and "assert est < 1" in test
    names = code.free(code.needed(checks, set(), keep_asserts=True))
    assert names == ["f", "x", "g", "range", "risk", "SCALE", "get_ipython"], names


def test_a_glued_figure_is_shown_where_it_is_drawn_with_its_caption_below():
    source = (
        "fig, ax = plt.subplots()  # one panel\n"
        "ax.plot(x)\n"
        "glue(\n"
        '    "fig-x", fig, display=False\n'
        ")\n"
        "plt.close(fig)\n"
        "for k in keys:\n"
        "    glue(k, 1, display=False)\n"
        "    print(k)\n"
    )
    assert code.show_figures(source, "example") == (
        "fig, ax = plt.subplots()  # one panel\nax.plot(x)\nplt.show()\n"
        "for k in keys:\n    print(k)"
    )
    assert code.show_figures("x = 1  # kept as it is\n", "example") == "x = 1  # kept as it is\n"
    only_glue = 'note = f()\nfor k, v in note.items():\n    glue(f"n_{k}", v, display=False)\ny = 2'
    assert code.show_figures(only_glue, "example") == "note = f()\ny = 2", "no empty loop left"
    markdown = (
        "As {numref}`fig-x` shows:\n\n"
        "```{glue:figure} fig-x\n:name: fig-x\n:alt: A line.\n\n"
        "The line, {glue:text}`n` points.\n```\n"
    )
    assert coursework.student_markdown(markdown) == (
        "As figure `fig-x` shows:\n\n*Figure `fig-x` (above):* The line, `n` points.\n"
    )


def chapter_file(tmp_path: Path, cells: list) -> Path:
    nb = nbformat.v4.new_notebook(
        cells=cells, metadata={"kernelspec": {"name": "python3", "display_name": "Python 3"}}
    )
    path = tmp_path / "example.ipynb"
    nbformat.write(nb, path)
    return path


def exercise_cells(check: str) -> list:
    md, py = nbformat.v4.new_markdown_cell, nbformat.v4.new_code_cell
    return [
        md("# A chapter"),
        py("x = 2"),
        md("````{exercise} Square it\n:label: ex-square\n\nSquare `x`.\n````"),
        md("```{solution-start} ex-square\n:class: dropdown\n```\n\nMultiply."),
        py("square = x * x", metadata={"tags": ["solution"]}),
        py(check, metadata={"tags": ["remove-cell"]}),
        md("That is all.\n\n```{solution-end}\n```"),
    ]


def test_a_chapter_not_in_the_exercise_form_is_refused_with_the_reason(tmp_path: Path):
    md = nbformat.v4.new_markdown_cell
    with pytest.raises(ValueError, match="no exercise in sphinx-exercise form"):
        read(chapter_file(tmp_path, [md("# A chapter"), md("Exercise: square x.")]))
    with pytest.raises(ValueError, match="no hidden cell that asserts"):
        read(chapter_file(tmp_path, exercise_cells("glue('sq', square, display=False)")))
    with pytest.raises(ValueError, match="a check reads nothing the solution defines"):
        coursework.plan(read(chapter_file(tmp_path, exercise_cells("assert x == 2"))))
    reads_only_checks = exercise_cells("z = square\nassert z == 4")
    reads_only_checks.insert(6, nbformat.v4.new_code_cell("assert square == z"))
    with pytest.raises(ValueError, match=r"reads \['z'\], which only a hidden check cell sets"):
        coursework.plan(read(chapter_file(tmp_path, reads_only_checks)))
    chapter = read(chapter_file(tmp_path, exercise_cells("assert square == 4, square")))
    assert coursework.plan(chapter).answers == {"ex-square": ["square"]}


#: The chapters graded for real: ``client_updates`` (about 15 s a run at ci) here, every chapter
#: with ``make grading`` (which names them in ``$GRADED_CHAPTERS``).
GRADED = tuple(os.environ.get("GRADED_CHAPTERS", "client_updates").split())


@pytest.mark.slow
@pytest.mark.parametrize("chapter", GRADED)
def test_reference_solutions_score_full_marks_and_a_blank_notebook_zero(built: Path, chapter: str):
    reference = coursework.grade(
        chapter, built / chapter / "autograder" / f"{chapter}.ipynb", built
    )
    blank = coursework.grade(chapter, built / chapter / "student" / f"{chapter}.ipynb", built)
    questions = {ex.question for ex in read(ROOT / "book" / f"{chapter}.ipynb").exercises}
    assert set(reference.scores) == set(blank.scores) == questions
    assert reference.total == (len(questions), len(questions)) and not reference.errors
    assert blank.total == (0, len(questions)) and not blank.errors, blank


def test_the_teachers_page_lists_every_chapter_with_its_exercises_and_paper_scale():
    page = (ROOT / "book" / "teachers.md").read_text()
    assert "book/teachers" in (ROOT / "_toc.yml").read_text()
    rows = {m[1]: m[0] for m in re.finditer(r"^\| \{doc\}`(\w+)` \|.*$", page, re.MULTILINE)}
    assert list(rows) == [p.stem for p in CHAPTERS], "one row per chapter, in the book's order"
    for path in CHAPTERS:
        refs = re.findall(r"\{ref\}`([^`<]+) <([\w-]+)>`", rows[path.stem])
        assert refs == [(ex.title, ex.label) for ex in read(path).exercises], path.stem
        parameters = next(
            c
            for kind, c in read(path).parts
            if kind == "code" and "parameters" in c.metadata.get("tags", [])
        )
        comment = re.search(r'^SCALE = "ci"\s*#\s*(.*)$', parameters.source, re.MULTILINE)[1]
        paper = comment[comment.index('"paper":') :] if '"paper":' in comment else comment
        assert paper in rows[path.stem], f"{path.stem}: the paper-scale column is not {paper!r}"


def test_grading_runs_with_the_builds_fix_for_the_widget_stall(monkeypatch, tmp_path):
    """Otter executes a submission through nbclient, whose Output-widget mimic stalled a grading
    run of client_updates (kernel and client idle): grade() turns its sends off first, as the
    book build does (book/_ext/execution_guard.py)."""
    import nbclient.output_widget

    guard = sys.modules["execution_guard"]
    monkeypatch.setattr(nbclient.output_widget.OutputWidget, "sync_state", lambda self: "sent")
    seen = []

    def otter_main(*args, **kwargs):
        seen.append(nbclient.output_widget.OutputWidget.sync_state)
        raise RuntimeError("stop before grading")

    monkeypatch.setattr(coursework.otter.run, "main", otter_main)
    monkeypatch.setattr(coursework, "autograder_zip", lambda chapter, out: tmp_path / "a.zip")
    with pytest.raises(RuntimeError, match="stop before grading"):
        coursework.grade("client_updates", tmp_path / "submission.ipynb")
    assert seen == [guard._no_sync]


def test_the_autograder_installs_the_release_the_install_cells_pin(tmp_path: Path):
    """Otter's grading image installs the library at the tag the chapters' install cells name
    (``tools/install_cells.py``), not whatever the repository's default branch holds."""
    lines = coursework._requirements(tmp_path).read_text().splitlines()
    cells = sys.modules["install_cells"]
    url = cells.repository_url(cells.read_config())
    assert lines[-1] == f"leakagelib @ git+{url}@v{cells.package_version()}", lines
    assert sum(line.startswith("leakagelib") for line in lines) == 1, lines
