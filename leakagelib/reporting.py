"""Tables for the book and the command line: paper | paper-scale record | this run, side by side.

Every chapter shows an experiment's numbers the same way: the paper's (stored
with the experiment as its ``reference`` rows, see
:func:`leakagelib.experiments.experiment`), the paper-scale record in
``results/`` when one exists, and the run the chapter just made.
:func:`compare` joins the three on the rows' key columns; :class:`Table`
renders as an HTML table in a notebook and as aligned text elsewhere
(:func:`format_table`, which the command line prints).

Used by every chapter and by :mod:`leakagelib.cli`.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .experiments.resume import PartialRecord

__all__ = [
    "MISSING",
    "Table",
    "compare",
    "format_table",
    "rerun_record",
    "results_record",
    "unit_times",
]

#: What :func:`compare` shows where a source has no value.
MISSING = "–"


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        return f"{value:.4g}" if abs(value) < 1e5 else f"{value:.4e}"
    return str(value)


def _columns(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The union of the rows' scalar keys, in order of first appearance."""
    columns: list[str] = []
    for row in rows:
        columns.extend(k for k in row if k not in columns and not isinstance(row[k], (list, dict)))
    return columns


def format_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None) -> str:
    """Rows as a plain aligned text table (default columns: the union of scalar keys)."""
    columns = list(columns) if columns is not None else _columns(rows)
    cells = [[_fmt(row.get(c, "")) for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines.extend("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) for r in cells)
    return "\n".join(lines)


class Table:
    """Rows shown as a table: HTML in a notebook (``_repr_html_``), aligned text with ``str``."""

    def __init__(
        self,
        rows: Sequence[Mapping[str, Any]],
        columns: Sequence[str] | None = None,
        caption: str = "",
    ) -> None:
        self.rows = [dict(r) for r in rows]
        self.columns = list(columns) if columns is not None else _columns(self.rows)
        self.caption = caption

    def __str__(self) -> str:
        text = format_table(self.rows, self.columns)
        return f"{self.caption}\n{text}" if self.caption else text

    def __repr__(self) -> str:
        return str(self)

    def _repr_html_(self) -> str:
        head = "".join(f"<th>{html.escape(c)}</th>" for c in self.columns)
        body = "".join(
            "<tr>"
            + "".join(f"<td>{html.escape(_fmt(r.get(c, '')))}</td>" for c in self.columns)
            + "</tr>"
            for r in self.rows
        )
        caption = f"<caption>{html.escape(self.caption)}</caption>" if self.caption else ""
        return f"<table>{caption}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _index(rows: Iterable[Mapping[str, Any]], on: Sequence[str]) -> dict[tuple, Mapping[str, Any]]:
    return {tuple(r.get(k) for k in on): r for r in rows}


def results_record(experiment_id: str) -> tuple[dict[str, Any] | None, str]:
    """The paper-scale record in ``results/``, or the finished units of a pending one, and a
    note saying how many units a pending record has and which registered settings its run
    changed (``reproduce --set``, e.g. fewer victims on a CPU; else ``""``): what
    :func:`compare` shows, for chapters that discuss the record beside the paper
    (``(None, "")`` where there is none). A pending record comes as a finished one's ``rows``,
    ``scale`` and ``settings_changed``, so :func:`~leakagelib.verdicts.images_per_row` reads
    both alike."""
    from .experiments.resume import pending_record
    from .records import paper_record

    record = paper_record(experiment_id)
    partial = pending_record(experiment_id) if record is None else None
    if partial is None:
        used = {k: v["used"] for k, v in (record or {}).get("settings_changed", {}).items()}
        return record, _changed_note(used)
    return _as_record(partial, "record pending")


def rerun_record(experiment_id: str) -> tuple[dict[str, Any] | None, str]:
    """The finished units of a paper-scale re-run under way beside a finished record, as
    :func:`results_record` gives a pending one (``(None, "")`` where there is no such re-run).

    A re-run replaces a record made before the experiment changed (``bayes/table2``'s,
    before it followed the authors' grouped cosine); until its last unit is done the
    record stays in ``results/`` and the re-run's units wait beside it in
    ``results/ID.json.partial``. The chapter "Bayes versus heuristics under defenses"
    shows both.
    """
    from .experiments.resume import pending_record
    from .records import paper_record

    partial = pending_record(experiment_id) if paper_record(experiment_id) else None
    return (None, "") if partial is None else _as_record(partial, "re-run under way")


def _as_record(partial: PartialRecord, state: str) -> tuple[dict[str, Any], str]:
    """A partial record's finished rows in a finished record's form, and the note that says
    how many units it has run (``state``: "record pending" or "re-run under way")."""
    rows = [row for rows in partial.units.values() for row in rows]
    changes = partial.identity.get("changes", {})
    note = f" ({state}: {partial.progress()})"
    settings = {k: {"used": v} for k, v in changes.items()}  # a finished record's form
    return {"rows": rows, "scale": "paper", "settings_changed": settings}, note + _changed_note(
        changes
    )


def _changed_note(changes: Mapping[str, Any]) -> str:
    """`` (the record's run changed victims to 32)`` for settings a record's run changed."""
    if not changes:
        return ""
    return (
        " (the record's run changed " + ", ".join(f"{k} to {v!r}" for k, v in changes.items()) + ")"
    )


def compare(
    experiment_id: str,
    run: Mapping[str, Any] | None,
    *,
    on: Sequence[str],
    values: Sequence[str],
    record: Mapping[str, Any] | None | str = "results",
    caption: str = "",
    long: bool = False,
) -> Table:
    """The paper's reference rows, the paper-scale record and ``run`` side by side.

    ``run`` and ``record`` are experiment records (``{"rows": [...], ...}``);
    ``record="results"`` (the default) reads the experiment's record from
    ``results/`` (none: an empty column). Rows are matched on the ``on``
    columns; for every name in ``values`` the table has the columns
    ``NAME (paper)``, ``NAME (record)`` and ``NAME (this run)``, with :data:`MISSING`
    where a source has no such row. Where a paper-scale campaign has finished
    only some units (:func:`~leakagelib.experiments.resume.pending_record`),
    the record column holds theirs and the caption says how many. Row order:
    the paper's, then rows only the record or the run has. ``long=True`` gives
    one row per key and value instead, with the columns ``on``, ``value``,
    ``paper``, ``record`` and ``this run``: a narrow table where many values are
    compared (chapter "R-GAP in practice", Table 2's five errors).
    """
    from . import experiments

    exp = experiments.get(experiment_id)
    pending = ""
    if record == "results":
        record, pending = results_record(experiment_id)
    sources = {
        "paper": list(exp.reference),
        "record": list(record["rows"]) if record else [],
        "this run": list(run["rows"]) if run else [],
    }
    indexed = {name: _index(rows, on) for name, rows in sources.items()}
    keys: list[tuple] = []
    for rows in indexed.values():
        keys.extend(k for k in rows if k not in keys)
    out = []
    for key in keys:
        head: dict[str, Any] = dict(zip(on, key, strict=True))
        row = dict(head)
        for value in values:
            found = {
                name: MISSING
                if key not in rows or rows[key].get(value) is None
                else rows[key][value]
                for name, rows in indexed.items()
            }
            if long:
                out.append({**head, "value": value, **found})
            else:
                row.update({f"{value} ({name})": v for name, v in found.items()})
        if not long:
            out.append(row)
    caption = caption or f"{experiment_id}: paper | results/ record | this run"
    return Table(out, caption=caption + pending)


def unit_times(experiment_id: str) -> list[tuple[Any, float, str]]:
    """``(unit key, seconds, device)`` of every unit the paper-scale record in ``results/`` ran
    (its provenance's ``units``), or that a pending one has finished so far, in run order.

    The chapter "CVB against attacks and architectures" states how long Table III's rows took
    and where, read from the record rather than typed. A unit key comes back as the unit's
    key (a list for a tuple), as the record stores it.
    """
    from .experiments.resume import pending_record
    from .records import paper_record

    record = paper_record(experiment_id)
    if record is not None:
        units = record["provenance"].get("units", [])
        return [(u["unit"], u["seconds"], u.get("device") or "?") for u in units]
    partial = pending_record(experiment_id)
    if partial is None:
        return []
    return [
        (json.loads(key), seconds, partial.made.get(key, {}).get("device") or "?")
        for key, seconds in partial.seconds.items()
    ]
