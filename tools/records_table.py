"""The README's table of paper-scale records, generated from ``results/`` as the book's index is.

One row per registered experiment: the paper's table or figure, what its record says (the
verdict of :mod:`leakagelib.verdicts`, or how far a pending campaign has got), the run time and
the device. The rows come from the same functions as the reproduction index
(``book/_ext/reproduction.py``), so the README and the book cannot disagree, and
``tests/test_readme.py`` fails when the README's copy is stale.

Usage: ``python tools/records_table.py`` prints the table; ``--write README.md`` replaces the
table between the README's two ``records-table`` markers; ``--check README.md`` exits 1 when
that table is not the current one.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "book" / "_ext"))
import reproduction  # noqa: E402

#: The lines around the generated table in the README.
START, END = "<!-- records-table: start -->", "<!-- records-table: end -->"

#: The papers by experiment namespace, as the README names them.
PAPERS = {"intro": "Phong et al.", "bayes": "Bayes", "cvb": "CVB", "rgap": "R-GAP"}


def table_lines() -> list[str]:
    """The table's Markdown lines, from the registry and ``results/``."""
    from leakagelib import experiments, records, verdicts

    rows = []
    for exp_id in experiments.available():
        exp = experiments.get(exp_id)
        record = records.paper_record(exp_id)
        if record is None:
            status, time, dev = reproduction.pending(exp_id)
        else:
            status = verdicts.verdict(reproduction.judgements(exp, record)) + reproduction.rerun(
                exp_id
            )
            time = reproduction.duration(records.run_seconds(record["provenance"]))
            dev = reproduction.device(record)
        where = reproduction.where(exp.summary)
        paper = PAPERS[exp_id.split("/", 1)[0]] + ("" if where == "—" else f" {where}")
        rows.append([f"`{exp_id}`", paper, status, time, reproduction.cell(dev)])
    header = ["experiment", "paper", "paper-scale record", "run time", "device"]
    return reproduction.markdown_table(header, rows)


def replaced(readme: str, table: list[str]) -> str:
    """``readme`` with the table between its markers replaced by ``table``."""
    head, start, rest = readme.partition(START)
    _, end, tail = rest.partition(END)
    if not start or not end:
        raise SystemExit(f"error: the README has no {START} ... {END} block for the table")
    return head + start + "\n" + "\n".join(table) + "\n" + end + tail


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--write", type=Path, help="replace the table in this README")
    action.add_argument("--check", type=Path, help="exit 1 if this README's table is stale")
    args = parser.parse_args(argv)
    table = table_lines()
    if args.write:
        args.write.write_text(replaced(args.write.read_text(), table))
    elif args.check:
        text = args.check.read_text()
        if replaced(text, table) != text:
            print(f"{args.check}: the records table is stale; run {Path(__file__).name} --write")
            return 1
    else:
        print("\n".join(table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
