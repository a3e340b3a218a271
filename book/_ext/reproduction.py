"""The reproduction index (``book/reproduction.md``), generated from the registry and the records.

Three directives, each re-read on every build so that the page follows the
registry (:mod:`leakagelib.experiments`) and ``results/`` without anyone
typing a number:

- ``{reproduction-index}``: for every registered experiment, its paper, the
  table or figure (read from the experiment's summary), the chapters whose
  code runs it (found by its id in their code cells), and what its
  paper-scale record says: run time, device, and "record pending" when there
  is none;
- ``{reproduction-commands}``: the command lines that run each experiment at
  ci and at paper scale, and the datasets it loads;
- ``{reproduction-records}``: for every record, its numbers beside the
  paper's (the experiment's reference rows, joined by
  :func:`leakagelib.reporting.compare`) and each judged value.

The index's verdict on a record, "reproduced", "diverges" or "not judged", is
:func:`leakagelib.verdicts.verdict`: whether each number of the paper (with its
rounding) lies inside the record's 95 % interval for it, computed from the record's own spread.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.errors import ExtensionError
from sphinx.util.docutils import SphinxDirective

#: The paper each experiment namespace reproduces: its bibliography key.
PAPERS = {
    "intro": "phong2017privacy",
    "bayes": "balunovic2022bayesian",
    "cvb": "scheliga2023cvb",
    "rgap": "zhu2021rgap",
}

#: Most record rows one comparison shows (the record file holds them all).
MAX_ROWS = 20

_WHERE = re.compile(r"Table|Fig\.|Figure|Appendix|§")
_PAPER_NAME = re.compile(r"^(?:Bayes|CVB|R-GAP)(?: paper)?\s+")


def paper_key(exp_id: str) -> str:
    """The bibliography key of the paper experiment ``exp_id`` belongs to (by its namespace)."""
    namespace = exp_id.split("/", 1)[0]
    if namespace not in PAPERS:
        raise ExtensionError(
            f"reproduction index: experiment {exp_id!r} is in namespace {namespace!r}, which "
            f"names no paper; add it to PAPERS in book/_ext/reproduction.py"
        )
    return PAPERS[namespace]


def where(summary: str) -> str:
    """The table or figure an experiment's summary names ("Table 2", "Appendix B, Figure 5")."""
    head, sep, _ = summary.partition(": ")
    if sep and _WHERE.search(head):
        return _PAPER_NAME.sub("", head.strip())
    for inside in re.findall(r"\(([^()]*)\)", summary):
        if _WHERE.search(inside):
            return _PAPER_NAME.sub("", inside.strip())
    return "—"


def notebooks(env: Any) -> dict[str, Path]:
    """The book's notebooks: docname → source path (from the Sphinx environment)."""
    paths = {d: Path(env.doc2path(d)) for d in sorted(env.found_docs)}
    return {d: p for d, p in paths.items() if p.suffix == ".ipynb"}


def running_chapters(chapters: dict[str, Path]) -> dict[str, list[str]]:
    """For every experiment, the chapters (docnames) whose code cells quote its id."""
    from leakagelib import experiments

    found: dict[str, list[str]] = {exp_id: [] for exp_id in experiments.available()}
    for docname, path in chapters.items():
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        code = "\n".join(
            "".join(c["source"]) if isinstance(c["source"], list) else c["source"]
            for c in cells
            if c["cell_type"] == "code"
        )
        for exp_id, docs in found.items():
            if f'"{exp_id}"' in code or f"'{exp_id}'" in code:
                docs.append(docname)
    return found


def duration(seconds: float) -> str:
    """``seconds`` as a reader reads a run time: "2.1 s", "47 min", "3 h 05 min"; "—" if unknown."""
    if not math.isfinite(seconds):
        return "—"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes = round(seconds / 60)
    return f"{minutes} min" if minutes < 60 else f"{minutes // 60} h {minutes % 60:02d} min"


def device(record: dict[str, Any]) -> str:
    """The device a record was made on, as its provenance says; a resumed record whose units
    ran on several kinds of device (a GPU's first units, the CPU's rest) names each kind."""
    prov = record.get("provenance", {})
    kinds = sorted({u["device"] for u in prov.get("units", []) if u.get("device")})
    if len(kinds) > 1:
        return ", ".join(kinds)
    name, kind = prov.get("device_name"), prov.get("device", "?")
    return f"{kind} ({name})" if name else str(kind)


def cell(value: Any) -> str:
    """One value as a Markdown table cell."""
    if isinstance(value, float):
        text = str(value) if not math.isfinite(value) else f"{value:.4g}"
    else:
        text = str(value)
    return text.replace("|", "\\|").replace("\n", " ")


def markdown_table(header: list[str], rows: list[list[str]]) -> list[str]:
    """A Markdown table's lines."""
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


class _Generated(SphinxDirective):
    """A directive whose content is Markdown generated at build time (re-read every build)."""

    has_content = False

    def lines(self) -> list[str]:
        raise NotImplementedError

    def run(self) -> list[nodes.Node]:
        self.env.note_reread()
        container = nodes.container(classes=["reproduction"])
        text = StringList(self.lines(), source=self.name)
        self.state.nested_parse(text, self.content_offset, container)
        return [container]


def pending(exp_id: str) -> tuple[str, str, str]:
    """(status, run time, device) of an experiment without a record: "record pending", and how
    far a paper-scale run has got where its partial record (``results/ID.json.partial``, which
    a campaign interrupted at the end of a session leaves, and the next resumes) is there."""
    from leakagelib.experiments.resume import pending_record

    partial = pending_record(exp_id)
    if partial is None:
        return "record pending", "—", "—"
    made = sorted({m.get("device") or "?" for m in partial.made.values()}) or ["?"]
    status = f"record pending: {partial.progress()}"
    return status, duration(sum(partial.seconds.values())), ", ".join(made)


def rerun(exp_id: str) -> str:
    """``"; a re-run is under way: k of n units run"`` where a paper-scale partial record waits
    beside a finished one (a re-run that will replace it), else ``""``."""
    from leakagelib.experiments.resume import pending_record

    partial = pending_record(exp_id)
    if partial is None:
        return ""
    return f"; a re-run is under way: {partial.progress()}"


def judgements(exp: Any, record: dict[str, Any]) -> list[Any]:
    """Every number of the paper's that ``record`` holds too, judged against the record's
    95 % interval (:func:`leakagelib.verdicts.judge`)."""
    from leakagelib import verdicts

    if not exp.reference:
        return []
    keys, values = split_columns(exp)
    return verdicts.judge(
        exp.reference, record["rows"], keys, values, verdicts.images_per_row(exp, record)
    )


def index_lines(chapters: dict[str, Path]) -> list[str]:
    """The index table: paper → table/figure → chapter → record (run time, device), per experiment."""
    from leakagelib import experiments, records, verdicts

    running = running_chapters(chapters)
    rows = []
    for exp_id in experiments.available():
        exp = experiments.get(exp_id)
        record = records.paper_record(exp_id)
        ran_in = ", ".join(f"{{doc}}`/{d}`" for d in running[exp_id]) or "—"
        if record is None:
            status, time, dev = pending(exp_id)
        else:
            judged = verdicts.verdict(judgements(exp, record))
            status = f"{record['scale']}-scale record (below): {judged}{rerun(exp_id)}"
            time = duration(records.run_seconds(record["provenance"]))
            dev = device(record)
        paper = f"{{cite:t}}`{paper_key(exp_id)}`"
        rows.append(
            [f"`{exp_id}`", paper, cell(where(exp.summary)), ran_in, status, time, cell(dev)]
        )
    header = ["experiment", "paper", "table / figure", "chapter", "record", "run time", "device"]
    return markdown_table(header, rows)


def commands_lines() -> list[str]:
    """The ci and paper command lines of every experiment, and the datasets it loads."""
    from leakagelib import experiments, records

    rows = []
    for exp_id in experiments.available():
        base = f"python -m leakagelib reproduce {exp_id}"
        out = f"results/{records.record_filename(exp_id)}"
        datasets = ", ".join(f"`{d}`" for d in experiments.get(exp_id).datasets)
        rows.append(
            [
                f"`{exp_id}`",
                f"`{base} --scale ci`",
                f"`{base} --scale paper --device cuda --out {out}`",
                datasets or "none (synthetic or embedded)",
            ]
        )
    return markdown_table(["experiment", "ci scale", "paper scale", "datasets"], rows)


def split_columns(exp: Any) -> tuple[list[str], list[str]]:
    """An experiment's columns split into those that name a row (the registry's ``on``) and
    those that measure: its other row keys, and any further column the paper's rows give (a
    standard deviation, say)."""
    keys = list(exp.on)
    values = [k for k in exp.row_keys if k not in keys]
    for ref in exp.reference:
        values += [k for k, v in ref.items() if k not in keys + values and not isinstance(v, list)]
    return keys, values


def side_by_side(exp: Any, record: dict[str, Any]) -> list[tuple[str, Any]]:
    """The tables that show ``record`` beside the paper: (caption, :class:`reporting.Table`) pairs.

    One table joined by :func:`leakagelib.reporting.compare` where the paper
    has reference rows and the record's naming columns tell its rows apart;
    otherwise the paper's rows (if any) and the record's rows, each as they are.
    """
    from leakagelib import reporting

    rows = record["rows"]
    keys, values = split_columns(exp)
    distinct = len({tuple(r.get(k) for k in keys) for r in rows}) == len(rows)
    if exp.reference and keys and distinct:
        joined = reporting.compare(exp.id, None, on=keys, values=values, record=record)
        columns = [c for c in joined.columns if not c.endswith("(this run)")]
        return [("", reporting.Table(joined.rows, columns))]
    tables = [("The paper's numbers, as the registry holds them:", reporting.Table(exp.reference))]
    return tables[: bool(exp.reference)] + [("The record's rows:", reporting.Table(rows))]


def _nested(value: Any) -> bool:
    """Whether ``value`` is a list or mapping (per-image series: too long for a table cell)."""
    return isinstance(value, (list, tuple, dict))


def record_lines(exp: Any, record: dict[str, Any]) -> list[str]:
    """A dropdown with a record's provenance, its numbers beside the paper's and the verdict."""
    from leakagelib import records, verdicts

    prov = record["provenance"]
    table_fig = where(exp.summary)
    title = f"`{exp.id}`" + (f" ({cell(table_fig)})" if table_fig != "—" else "")
    paper = exp.reference_source or "the registry holds no numbers of the paper for it"
    lines = [
        f":::{{dropdown}} {title}: the record beside the paper",
        f"Paper: {cell(paper)}.",
        f"Record: `results/{records.record_filename(exp.id)}`, {record['scale']} scale, "
        f"{duration(records.run_seconds(prov))} on {cell(device(record))}, "
        f"seed {prov.get('seed', '?')}, "
        + ("resumed, its units made at " if prov.get("resumed") else "")
        + (", ".join(f"commit `{c[:12]}`" for c in records.made_by(prov)) or "commit unknown")
        + ".",
    ]
    changed = record.get("settings_changed", {})
    if changed:  # reproduce --set: e.g. fewer victims than the paper's on a CPU
        lines.append(
            "Settings changed from the registered ones: "
            + "; ".join(
                f"`{k}` {v['used']} (registered: {v['registered']})" for k, v in changed.items()
            )
            + "."
        )
    for caption, table in side_by_side(exp, record):
        shown = table.rows[:MAX_ROWS]
        columns = [c for c in table.columns if not any(_nested(r.get(c)) for r in table.rows)]
        lines += ["", caption] if caption else [""]
        lines += [
            "",
            *markdown_table(columns, [[cell(r.get(c, "")) for c in columns] for r in shown]),
        ]
        if len(table.rows) > len(shown):
            lines += ["", f"The first {len(shown)} of {len(table.rows)} rows (the file holds all)."]
    judged = judgements(exp, record)
    lines += ["", f"Verdict: {verdicts.verdict(judged)}."]
    lines += [""] * bool(judged) + [f"- {cell(str(j))}" for j in judged[:MAX_ROWS]]
    if len(judged) > MAX_ROWS:
        lines += ["", f"The first {MAX_ROWS} of {len(judged)} judged values."]
    return [*lines, ":::", ""]


def records_lines() -> list[str]:
    """A dropdown per paper-scale record, its numbers beside the paper's."""
    from leakagelib import experiments, records

    lines: list[str] = []
    for exp_id in experiments.available():
        record = records.paper_record(exp_id)
        if record is not None:
            lines += record_lines(experiments.get(exp_id), record)
    return lines or ["No paper-scale record has been made yet."]


class ReproductionIndex(_Generated):
    """``{reproduction-index}``: :func:`index_lines` for the book's notebooks."""

    def lines(self) -> list[str]:
        return index_lines(notebooks(self.env))


class ReproductionCommands(_Generated):
    """``{reproduction-commands}``: :func:`commands_lines`."""

    def lines(self) -> list[str]:
        return commands_lines()


class ReproductionRecords(_Generated):
    """``{reproduction-records}``: :func:`records_lines`."""

    def lines(self) -> list[str]:
        return records_lines()


def setup(app: Any) -> dict[str, Any]:
    app.add_directive("reproduction-index", ReproductionIndex)
    app.add_directive("reproduction-commands", ReproductionCommands)
    app.add_directive("reproduction-records", ReproductionRecords)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
