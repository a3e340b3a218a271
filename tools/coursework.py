"""Coursework from the chapters: a student version of each and an otter-grader autograder.

``make coursework`` runs ``python tools/coursework.py build``. For every chapter in ``_toc.yml``
it writes, under ``_build/coursework/<chapter>/``:

- ``student/<chapter>.ipynb``: the student version, which runs on its own: each exercise's
  gated solution (prose, code and check cells) is gone, and in its place is one answer cell
  that names what the grader reads (``name = ...``); the chapter's hidden cells lose their
  asserts and ``glue`` calls, keeping only what later cells read (tools/coursework_code.py);
- ``autograder/``: Otter's reference notebook (the chapter with its solutions) and the
  autograder zip, whose tests, hidden from students, are the exercises' check cells: the
  asserts that the chapter's reference solution satisfies (tools/coursework_read.py);
- ``master/<chapter>.ipynb``: the chapter in Otter Assign's format (a question per exercise),
  from which ``otter assign`` made the other two.

``python tools/coursework.py grade CHAPTER SUBMISSION...`` grades submissions with ``otter run``
(in this environment, no Docker), prints each one's score and writes ``grades.csv``. The
teachers' page (book/teachers.md) says how a course uses them; tests/test_coursework.py checks
them.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import nbformat
import otter.assign
import otter.run
import yaml

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1] / "book" / "_ext"))
from coursework_read import ROOT, Chapter, Exercise, Plan, chapters, plan, read_chapter  # noqa: E402
from execution_guard import keep_widget_outputs_client_side  # noqa: E402
from install_cells import install_requirement, package_version  # noqa: E402

OUT = ROOT / "_build" / "coursework"
INCLUDE = re.compile(r"^(`{3,})\{include\}[ \t]+(\S+)[ \t]*\n\1[ \t]*$", re.MULTILINE)
GLUE_ROLE = re.compile(r"\{glue(?::\w*)?\}`([^`:]+)(?::[^`]*)?`")
GLUE_FIGURE = re.compile(r"^(`{3,})\{glue:figure\}[ \t]+(\S+)[ \t]*\n(.*?)^\1[ \t]*$", re.S | re.M)
FIGURE_REF = re.compile(r"\{numref\}`(fig-[^`<]+)`")
OPTION = re.compile(r"^:[\w-]+:.*$", re.M)
STUDENT_NOTE = """\
**Coursework version.** This is the chapter with its exercises left for you: under each
exercise an answer cell names the variables your code must define (`name = ...`); the grader
runs the whole notebook and then checks those variables. Numbers that the book's page prints in
the prose appear here as the names the chapter computes them under, in code font; run the
notebook, or read them on the book's page."""


def student_markdown(source: str) -> str:
    """Markdown as a notebook without Sphinx shows it: an included file inlined, a glued number
    as the name the chapter computes it under, a numbered figure as its caption (the cell above
    shows the figure: ``coursework_code.show_figures``) and a reference to one as its name."""
    inlined = INCLUDE.sub(lambda m: (ROOT / "book" / m[2]).read_text().strip(), source)
    captioned = GLUE_FIGURE.sub(
        lambda m: f"*Figure `{m[2]}` (above):* " + OPTION.sub("", m[3]).strip(), inlined
    )
    named = FIGURE_REF.sub(lambda m: f"figure `{m[1]}`", captioned)
    return GLUE_ROLE.sub(lambda m: f"`{m[1]}`", named)


def master(chapter: Chapter, out: Path, public_tests: bool) -> nbformat.NotebookNode:
    """The chapter in Otter Assign's format: a question per exercise, its solution in a
    solution block, its checks as tests (hidden from students unless ``public_tests``)."""
    steps = plan(chapter)
    hidden = iter(steps.hidden)
    config = {
        "name": chapter.path.stem,
        "init_cell": public_tests,
        "check_all_cell": False,
        "export_cell": False,
        "python_version": f"{sys.version_info.major}.{sys.version_info.minor}",
        "run_tests": False,
        "requirements": str(_requirements(out / chapter.path.stem)),
        "generate": {"pdf": False},
        "tests": {"files": public_tests, "ok_format": True},
    }
    cells = [_raw("# ASSIGNMENT CONFIG", yaml.safe_dump(config, sort_keys=False))]
    for kind, part in chapter.parts:
        if kind == "markdown":
            cells.append(nbformat.v4.new_markdown_cell(student_markdown(part.source)))
        elif kind == "code":
            cells.append(nbformat.v4.new_code_cell(part.source, metadata=part.metadata))
        elif kind == "hidden":
            source = next(hidden)
            cells += [nbformat.v4.new_code_cell(source, metadata=part.metadata)] if source else []
        else:
            cells += _question(part, steps, public_tests)
    nb = nbformat.v4.new_notebook(cells=cells, metadata=chapter.metadata)
    return nb


def _raw(head: str, body: str = "") -> nbformat.NotebookNode:
    return nbformat.v4.new_raw_cell(f"{head}\n{body}".strip())


def _question(ex: Exercise, steps: Plan, public_tests: bool) -> list[nbformat.NotebookNode]:
    """Otter Assign's cells for one exercise: prompt, solution block, tests block."""
    md = nbformat.v4.new_markdown_cell
    title = f"### Exercise {ex.number}" + (f": {ex.title}" if ex.title else "")
    names = steps.answers[ex.label]
    prompt = [
        f"# Exercise {ex.number} ({ex.label}): your answer; add cells as you need. The grader",
        "# runs the notebook, then checks what these names hold:",
        *(f"{name} = ..." for name in names),
    ]
    cells = [_raw("# BEGIN QUESTION", f"name: {ex.question}\npoints: 1")]
    cells += [md(student_markdown(f"{title}\n\n{ex.body}")), _raw("# BEGIN SOLUTION")]
    for i, source in enumerate(ex.solution):
        cells += [md(text) for at, text in ex.prose if at == i]
        lines = [
            *(prompt if i == 0 else []),
            "# BEGIN SOLUTION NO PROMPT",
            source,
            "# END SOLUTION",
        ]
        cells.append(nbformat.v4.new_code_cell("\n".join(lines)))
    cells += [md(text) for at, text in ex.prose if at == len(ex.solution)]
    cells += [_raw("# END SOLUTION"), _raw("# BEGIN TESTS")]
    hidden = "false" if public_tests else "true"
    config = f'""" # BEGIN TEST CONFIG\nhidden: {hidden}\n""" # END TEST CONFIG'
    cells += [nbformat.v4.new_code_cell(f"{config}\n{test}") for test in steps.tests[ex.label]]
    return cells + [_raw("# END TESTS"), _raw("# END QUESTION")]


def _requirements(folder: Path) -> Path:
    """The autograder's requirements (for Otter's Docker grading): the book's pins (Otter adds
    its own) and the library from the repository that ``_config.yml`` names, pinned to the
    release the chapters' install cells pin (``tools/install_cells.py``)."""
    url = yaml.safe_load((ROOT / "_config.yml").read_text())["repository"]["url"]
    pins = [p for p in (ROOT / "requirements.txt").read_text().splitlines() if "otter" not in p]
    path = folder / "requirements.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join([*pins, install_requirement(url, package_version()), ""]))
    return path


def build(path: Path, out: Path, public_tests: bool = False) -> Path:
    """Writes the chapter's master, student and autograder versions under ``out/<chapter>``
    (Otter Assign, in this process, without running the tests: tests/test_coursework.py grades
    one chapter)."""
    target = out / path.stem
    nb = master(read_chapter(path), out, public_tests)
    (target / "master").mkdir(parents=True, exist_ok=True)
    master_path = target / "master" / path.name
    nbformat.write(nb, master_path)
    for old in ("student", "autograder"):
        shutil.rmtree(target / old, ignore_errors=True)
    log = io.StringIO()
    try:
        with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
            otter.assign.main(str(master_path), str(target), no_pdfs=True, no_run_tests=True)
    except Exception as err:  # Otter's own errors name the cell; keep them with the chapter
        raise RuntimeError(f"otter assign failed on {path.name}: {err}\n{log.getvalue()}") from err
    _finish_student(target / "student" / path.name)
    return target


def _finish_student(path: Path) -> None:
    """The student notebook without the empty cells that later solution cells leave, and with
    a note under the title on what the coursework version is."""
    nb = nbformat.read(path, as_version=4)
    nb.cells = [c for c in nb.cells if c.cell_type == "markdown" or c.source.strip()]
    title = next(i for i, c in enumerate(nb.cells) if c.cell_type == "markdown")
    nb.cells.insert(title + 1, nbformat.v4.new_markdown_cell(STUDENT_NOTE))
    nbformat.write(nb, path)


def autograder_zip(chapter: str, out: Path = OUT) -> Path:
    """The autograder zip ``build`` wrote for the chapter (named by Otter with a time stamp)."""
    found = sorted((out / chapter / "autograder").glob("*.zip"))
    if not found:
        raise FileNotFoundError(f"no autograder for {chapter} in {out}: run `make coursework`")
    return found[-1]


@dataclass
class Grade:
    """One graded submission: question → (score, possible), and the cells that raised when the
    autograder ran the notebook (``"cell N: ErrorName"``; an unanswered exercise raises none)."""

    scores: dict[str, tuple[float, float]]
    errors: list[str]

    @property
    def total(self) -> tuple[float, float]:
        return tuple(sum(s[i] for s in self.scores.values()) for i in (0, 1))


def grade(chapter: str, submission: Path, out: Path = OUT) -> Grade:
    """Grades one submission with Otter's ``otter run`` in this environment (no Docker).

    The notebook is executed afresh (its own outputs are ignored), a cell that fails does not
    stop the rest, and then the exercises' checks run against what it left defined. Otter
    executes it with nbclient, so the book build's fix for the widget-cell stall applies here
    too (``book/_ext/execution_guard.py``: a grading run of ``client_updates`` stalled without
    it, kernel and client idle, under load)."""
    keep_widget_outputs_client_side()
    log = io.StringIO()
    with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
        results = otter.run.main(
            str(submission), autograder=str(autograder_zip(chapter, out)), output_dir=None
        )
    if results.has_catastrophic_failure():
        raise RuntimeError(f"otter could not grade {submission}:\n{log.getvalue()}")
    scores = {
        name: (float(results.get_score(name)), float(results.get_result(name).possible))
        for name in results.test_files
    }
    errors = [
        f"cell {i}: {output.ename}"
        for i, cell in enumerate(results.notebook.cells)
        for output in cell.get("outputs", [])
        if output.output_type == "error"
    ]
    return Grade(scores, errors)


def grade_all(chapter: str, submissions: list[Path], out: Path = OUT) -> Path:
    """Grades the submissions, printing each one's total, and writes a table of every score
    to ``out/<chapter>/grades.csv``."""
    rows = []
    for submission in submissions:
        graded = grade(chapter, submission, out)
        got, possible = graded.total
        print(f"{submission}: {got:g} / {possible:g}" + "".join(f"; {e}" for e in graded.errors))
        rows.append(
            {"submission": str(submission), **{q: s for q, (s, _) in graded.scores.items()}}
        )
        rows[-1]["total"] = got
    path = out / chapter / "grades.csv"
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


def main(argv: list[str] | None = None) -> int:
    """``build [CHAPTER...]`` (all chapters by default) or ``grade CHAPTER SUBMISSION...``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out", type=Path, default=OUT, help="folder to write (default %(default)s)"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    make = sub.add_parser("build", help="student versions and autograders")
    make.add_argument("chapters", nargs="*", help="chapter names (default: all in _toc.yml)")
    make.add_argument("--public-tests", action="store_true", help="show students the checks")
    marks = sub.add_parser("grade", help="grade submissions of one chapter with otter run")
    marks.add_argument("chapter")
    marks.add_argument("submissions", nargs="+", type=Path)
    args = parser.parse_args(argv)
    if args.command == "grade":
        print("scores:", grade_all(args.chapter, args.submissions, args.out))
        return 0
    paths = [ROOT / "book" / f"{c}.ipynb" for c in args.chapters] or chapters()
    failed = []
    for path in paths:
        try:
            target = build(path, args.out, args.public_tests)
            print(f"{path.stem}: {len(read_chapter(path).exercises)} exercises -> {target}")
        except (ValueError, RuntimeError) as err:
            failed.append(f"{path.stem}: {err}")
    for failure in failed:
        print(failure, file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
