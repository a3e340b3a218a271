"""Reading a chapter for coursework (tools/coursework.py): its exercises in sphinx-exercise form,
each with its gated solution, and from them what the autograder checks.

An exercise is a markdown cell holding an ``{exercise}`` directive with a ``:label:``, followed
directly by its solution: ``{solution-start} LABEL`` … ``{solution-end}`` markdown cells around
code cells. A code cell tagged ``solution`` is solution code; any other code cell in the solution
that asserts is a *check* (hidden in the book), and becomes an autograder test. The names a
check reads that the solution code assigns are what a student's answer must define.
"""

from __future__ import annotations

import ast
import builtins
import re
from dataclasses import dataclass, field
from pathlib import Path

import coursework_code as code
import nbformat
import yaml

ROOT = Path(__file__).resolve().parents[1]
EXERCISE = re.compile(
    r"^(?P<fence>`{3,}|:{3,})\{exercise\}[ \t]*(?P<title>[^\n]*)\n"
    r"(?P<options>(?::[\w-]+:[^\n]*\n)*)\n*(?P<body>.*?)\n*^(?P=fence)[ \t]*$",
    re.MULTILINE | re.DOTALL,
)
LABEL = re.compile(r":label:[ \t]*(\S+)")
SOLUTION_START = re.compile(r"^(?:`{3,}|:{3,})\{solution-start\}[ \t]+(\S+)", re.MULTILINE)
SOLUTION_END = re.compile(r"^(?:`{3,}|:{3,})\{solution-end\}", re.MULTILINE)


@dataclass
class Exercise:
    """One exercise: its prompt and the cells of its gated solution, sorted by role."""

    label: str
    number: int
    title: str
    body: str
    prose: list[tuple[int, str]] = field(default_factory=list)  # (position, markdown)
    solution: list[str] = field(default_factory=list)  # code cells shown as the solution
    checks: list[str] = field(default_factory=list)  # hidden cells that assert

    @property
    def question(self) -> str:
        """The otter question name: the label, as an identifier."""
        return re.sub(r"\W", "_", self.label)


@dataclass
class Chapter:
    """A chapter read for coursework: its cells in order, each exercise in place of its prompt
    cell (``("exercise", Exercise)``), the solutions gathered into their exercises."""

    path: Path
    metadata: dict
    parts: list[tuple[str, object]]  # ("markdown" | "code" | "hidden", cell) or ("exercise", …)

    @property
    def exercises(self) -> list[Exercise]:
        return [part for kind, part in self.parts if kind == "exercise"]


def chapters() -> list[Path]:
    """The notebook chapters of ``_toc.yml``, in the book's order."""
    files: list[str] = []

    def walk(node: object) -> None:
        if isinstance(node, dict):
            files.extend([node["file"]] if "file" in node else [])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(yaml.safe_load((ROOT / "_toc.yml").read_text()))
    return [ROOT / f"{f}.ipynb" for f in files if (ROOT / f"{f}.ipynb").exists()]


def read_chapter(path: Path, student: bool = True) -> Chapter:
    """Reads the chapter's cells; a solution must directly follow its exercise. With
    ``student``, the code the reader sees (visible cells, solution code) is as the student
    version runs it: without ``glue`` calls, its figures shown (``coursework_code.show_figures``);
    without, as the book shows it."""
    nb = nbformat.read(path, as_version=4)
    parts: list[tuple[str, object]] = []
    current: Exercise | None = None
    for i, cell in enumerate(nb.cells):
        where, source = f"{path.name}, cell {i}", cell.source
        tags = set(cell.metadata.get("tags", []))
        if student and cell.cell_type == "code" and not tags & code.HIDDEN_TAGS:
            source = code.show_figures(source, where)
            cell = nbformat.from_dict({**cell, "source": source})
        if current is not None:
            if cell.cell_type == "markdown":
                current.prose.append((len(current.solution), source))
                current = None if SOLUTION_END.search(source) else current
            elif "solution" not in tags and code.has_assert(source, where):
                current.checks.append(source)
            else:
                current.solution.append(source)
        elif cell.cell_type == "markdown" and EXERCISE.search(source):
            parts.append(("exercise", _exercise(source, where, parts)))
        elif cell.cell_type == "markdown" and SOLUTION_START.search(source):
            current = _open_solution(source, where, parts)
            current.prose.append((0, source))
            current = None if SOLUTION_END.search(source) else current  # a solution of prose
        elif cell.cell_type == "markdown":
            parts.append(("markdown", cell))
        else:
            parts.append(("hidden" if tags & code.HIDDEN_TAGS else "code", cell))
    if current is not None:
        raise ValueError(f"{path.name}: the solution to {current.label} is never closed")
    chapter = Chapter(path, dict(nb.metadata), parts)
    _check_exercises(chapter)
    return chapter


def _exercise(source: str, where: str, parts: list) -> Exercise:
    match = EXERCISE.search(source)
    label = LABEL.search(match["options"])
    if label is None:
        raise ValueError(f"{where}: an exercise without a :label: cannot be graded")
    if source[: match.start()].strip() or source[match.end() :].strip():
        raise ValueError(f"{where}: an exercise's cell must hold the exercise alone")
    number = sum(kind == "exercise" for kind, _ in parts) + 1
    return Exercise(label[1], number, match["title"].strip(), match["body"].strip())


def _open_solution(source: str, where: str, parts: list) -> Exercise:
    label = SOLUTION_START.search(source)[1]
    kind, last = parts[-1] if parts else (None, None)
    if kind != "exercise" or last.label != label:
        raise ValueError(f"{where}: the solution to {label} does not follow its exercise")
    return last


def _check_exercises(chapter: Chapter) -> None:
    """Every exercise has solution code and a check; a chapter without exercises is an error."""
    name = chapter.path.name
    if not chapter.exercises:
        raise ValueError(f"{name}: no exercise in sphinx-exercise form ({{exercise}} with :label:)")
    for ex in chapter.exercises:
        if not ex.prose:
            raise ValueError(f"{name}: {ex.label} has no solution (solution-start … solution-end)")
        if not ex.solution:
            raise ValueError(f"{name}: the solution to {ex.label} has no code")
        if not ex.checks:
            raise ValueError(f"{name}: the solution to {ex.label} has no hidden cell that asserts")


@dataclass
class Plan:
    """What the build writes for a chapter: the student version's hidden cells (what is kept of
    them), and per exercise the names its answer must define and its autograder tests."""

    hidden: list[str]
    answers: dict[str, list[str]]
    tests: dict[str, list[str]]


def plan(chapter: Chapter) -> Plan:
    """Works out the tests and answer names of every exercise, then prunes the hidden cells to
    what the remaining code (chapter, solutions, tests) reads."""
    name = chapter.path.name
    code_parts = [c.source for kind, c in chapter.parts if kind == "code"]
    solutions = [s for ex in chapter.exercises for s in ex.solution]
    visible = [code.parse(s, name) for s in code_parts + solutions]
    hidden = [
        code.surgery(c.source, f"{name} (hidden cell)", asserts=True)
        for kind, c in chapter.parts
        if kind == "hidden"
    ]
    answers, tests = {}, {}
    for ex in chapter.exercises:
        answers[ex.label], tests[ex.label] = _tests(ex, name)
    test_reads = {n for ts in tests.values() for t in ts for n in code.reads(ast.parse(t))}
    reads = set().union(*(code.reads(t) for t in visible), test_reads)
    kept = [stmts for stmts, _ in hidden]
    while True:  # a statement dropped may leave others unread: prune until nothing changes
        before = kept
        kept = [
            code.needed(stmts, reads | _reads_of(kept[:i] + kept[i + 1 :]), keep_asserts=False)
            for i, (stmts, _) in enumerate(hidden)
        ]
        if [len(k) for k in kept] == [len(b) for b in before]:
            break
    rendered = [code.render(k, python) for k, (_, python) in zip(kept, hidden, strict=True)]
    _check_tests_read_what_the_notebook_binds(chapter, visible, kept, tests)
    return Plan(rendered, answers, tests)


def _reads_of(cells: list[list[ast.stmt]]) -> set[str]:
    return {name for stmts in cells for s in stmts for name in code.reads(s)}


def _tests(ex: Exercise, name: str) -> tuple[list[str], list[str]]:
    """The names an answer to ``ex`` must define, and its tests: each check cell without its
    ``glue`` calls, cut to its asserts and what they read, after the solution's imports it
    reads (an answer need not import the same way)."""
    where = f"{name}, solution to {ex.label}"
    solution = [s for source in ex.solution for s in code.parse(source, where).body]
    imports = [s for s in solution if isinstance(s, ast.Import | ast.ImportFrom)]
    assigned = set().union(*(code.assigns(s) for s in solution))
    answers: dict[str, None] = {}
    tests = []
    for source in ex.checks:
        stmts, python = code.surgery(source, f"{where} (check)", asserts=False)
        stmts = code.needed(stmts, set(), keep_asserts=True)
        read = code.free(stmts)
        graded = [n for n in read if n in assigned]
        if not graded:  # it would pass on an unanswered notebook
            raise ValueError(f"{where}: a check reads nothing the solution defines: no answer")
        answers.update((n, None) for n in graded)
        needed = [s for s in imports if code.binds(s) & set(read)]
        header = [ast.unparse(s) for s in needed]
        tests.append("\n".join([*header, code.render(stmts, python)]))
    return list(answers), tests


def _check_tests_read_what_the_notebook_binds(
    chapter: Chapter, visible: list[ast.Module], kept: list[list[ast.stmt]], tests: dict
) -> None:
    """A test runs after the notebook: every name it reads must be bound by the notebook."""
    stmts = [s for t in visible for s in t.body] + [s for k in kept for s in k]
    bound = set(dir(builtins)).union(*(code.binds(s) for s in stmts))
    for label, cases in tests.items():
        for case in cases:
            missing = set(code.free(ast.parse(case).body)) - bound
            if missing:
                raise ValueError(
                    f"{chapter.path.name}: the check of {label} reads {sorted(missing)}, which "
                    "only a hidden check cell sets: set it in the solution's code instead"
                )
