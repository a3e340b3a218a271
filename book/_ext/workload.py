"""The ``{chapter-workload}`` directive: what each chapter asks of a student, counted from it.

``book/teachers.md`` shows it so that a teacher can plan a class: per chapter, in the table of
contents' order, the words of prose a student reads (every markdown cell but the solutions,
which the student version removes), the reading time those words take at
:data:`WORDS_PER_MINUTE`, the code cells a student runs (those the page shows, solutions not
counted) and the number of exercises. Everything is counted from the notebooks at build time,
never typed; how long the cells take to execute is the build's own measurement, in the
execution table beside it.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.util.docutils import SphinxDirective

#: Words a minute for the reading time: a little below the 238 that Brysbaert (2019, *How many
#: words do we read per minute?*, in ``book/references.bib``) gives for silent reading of
#: non-fiction; a class working through the derivations takes longer.
WORDS_PER_MINUTE = 200

_WORD = re.compile(r"[A-Za-z0-9][\w'’-]*")
_SOLUTION = re.compile(r"\{solution-start\}.*?\{solution-end\}", re.DOTALL)
_HIDDEN = {"remove-cell", "solution"}
#: Markup a reader does not read: directives' fences and option lines (a directive's title, as
#: an exercise's, is read), and role and directive names.
_MARKUP = re.compile(r"^\s*(`{3,}|:{3,})|^\s*:\w[\w-]*:.*$|\{[\w:-]+\}", re.MULTILINE)


def workload(notebook: Path) -> dict[str, int]:
    """Words of prose (solutions left out), reading minutes, code cells shown, exercises."""
    cells = json.loads(notebook.read_text())["cells"]
    prose = "\n".join(
        "".join(c["source"]) for c in cells if c["cell_type"] == "markdown"
    )  # a solution's prose runs from its start cell to its end cell
    words = len(_WORD.findall(_MARKUP.sub(" ", _SOLUTION.sub(" ", prose))))
    shown = [
        c
        for c in cells
        if c["cell_type"] == "code" and not _HIDDEN & set(c["metadata"].get("tags", []))
    ]
    return {
        "words": words,
        "minutes": math.ceil(words / WORDS_PER_MINUTE),
        "code cells": len(shown),
        "exercises": prose.count("{exercise}"),
    }


def chapters(root: Path) -> list[str]:
    """The notebooks' document names (``book/client_updates``) in the table of contents' order."""
    toc = (root / "_toc.yml").read_text()
    names = re.findall(r"file:\s*(\S+)", toc)
    return [name for name in names if (root / f"{name}.ipynb").is_file()]


def workload_lines(root: Path) -> list[str]:
    """The table as Markdown lines: one row per chapter and a total."""
    reading = f"reading time (min, at {WORDS_PER_MINUTE} words/min)"
    header = ["chapter", "words", reading, "code cells", "exercises"]
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    total = dict.fromkeys(("words", "minutes", "code cells", "exercises"), 0)
    for name in chapters(root):
        counts = workload(root / f"{name}.ipynb")
        total = {k: total[k] + counts[k] for k in total}
        cells = [f"{{doc}}`/{name}`", *(f"{counts[k]:,}" for k in total)]
        lines.append("| " + " | ".join(cells) + " |")
    hours = f"{total['minutes']:,} ({math.ceil(total['minutes'] / 60)} h)"
    lines.append(
        f"| all chapters | {total['words']:,} | {hours} | {total['code cells']:,} "
        f"| {total['exercises']} |"
    )
    return lines


class ChapterWorkload(SphinxDirective):
    """The workload table of every chapter, counted from the notebooks as the book builds."""

    has_content = False

    def run(self) -> list[nodes.Node]:
        root = Path(self.env.srcdir)
        for name in chapters(root):
            self.env.note_dependency(str(root / f"{name}.ipynb"))
        container = nodes.container(classes=["chapter-workload"])
        lines = StringList(workload_lines(root), source="chapter-workload")
        self.state.nested_parse(lines, 0, container)
        return [container]


def setup(app: Any) -> dict[str, Any]:
    app.add_directive("chapter-workload", ChapterWorkload)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
