"""Reading a record of ``bayes/fig2-training`` (:mod:`.bayes_defenses`): its curves, pictures
and networks, alike whether the record is finished or pending.

A finished record keeps Fig. 3's and Fig. 6's pictures and its Soteria networks' fit in entries
of their own beside its rows; a pending one
(:func:`leakagelib.reporting.results_record`) has only the rows of its finished units, which
still carry them. The chapter "Breaking heuristic defenses" reads the paper-scale record with
these functions, and the experiment assembles its own record with them.
"""

from __future__ import annotations

from typing import Any

__all__ = ["NETWORK", "curve_rows", "record_networks", "record_pictures"]

#: The ``defense`` of the rows that say how closely each Soteria network of Fig. 2 fits its
#: training images and the victims (:func:`~.bayes_soteria.convbig_fit`); a finished record keeps
#: them as its ``networks`` (:func:`record_networks`), apart from the curve's rows.
NETWORK = "soteria network"


def record_pictures(record: dict[str, Any] | None) -> tuple[dict[str, dict], list[dict]]:
    """Fig. 3's pictures (defense → ``original``, ``reconstruction``) and Fig. 6's (one entry
    per step, in order) in a record of ``bayes/fig2-training``: a finished record keeps them
    beside its rows, a pending one (:func:`leakagelib.reporting.results_record`) in the rows of
    its finished units; empty where it has none yet. The chapter "Breaking heuristic defenses"
    shows the paper-scale record's beside its own run's."""
    record = record or {}
    rows = record.get("rows", [])
    figure3 = record.get("figure3") or {r["defense"]: r["figure3"] for r in rows if "figure3" in r}
    figure6 = record.get("figure6") or [{"step": r["step"], **r["figure6"]} for r in rows
                                        if "figure6" in r]  # fmt: skip
    return figure3, sorted(figure6, key=lambda e: e["step"])


def curve_rows(record: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The rows of Fig. 2's curves in a record of ``bayes/fig2-training``: all of a finished
    record's; of a pending one (:func:`leakagelib.reporting.results_record`), those of its
    finished units but the :data:`NETWORK` rows, which a finished record keeps apart."""
    return [r for r in (record or {}).get("rows", []) if r["defense"] != NETWORK]


def record_networks(record: dict[str, Any] | None) -> list[dict[str, Any]]:
    """How closely each Soteria network of a ``bayes/fig2-training`` record fits its training
    images and the victims, in step order: a finished record's ``networks``, a pending one's
    :data:`NETWORK` rows (empty for records made before these units existed). The chapter
    "Breaking heuristic defenses" reads them beside the record's Soteria curve."""
    record = record or {}
    found = record.get("networks") or [r for r in record.get("rows", []) if r["defense"] == NETWORK]
    return sorted(found, key=lambda e: e["step"])
