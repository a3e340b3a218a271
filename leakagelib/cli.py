"""The command line: ``python -m leakagelib list`` and ``python -m leakagelib reproduce``.

``reproduce ID --scale ci|paper [--data LOGICAL=SPEC ...] [--device cpu|cuda]
[--seed N] [--out FILE.json] [--download | --no-download]`` runs a registered
experiment (downloading missing datasets only at paper scale unless told
otherwise), prints its rows
as a table and writes the JSON record atomically (see :mod:`leakagelib.records`).
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from typing import Any

from . import data, models
from .records import record_filename, write_record


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        return f"{value:.4g}" if abs(value) < 1e5 else f"{value:.4e}"
    return str(value)


def format_table(rows: list[dict[str, Any]]) -> str:
    """Rows as a plain aligned text table (columns: the union of keys, in order of appearance)."""
    columns: list[str] = []
    for row in rows:
        columns.extend(k for k in row if k not in columns and not isinstance(row[k], (list, dict)))
    cells = [[_fmt(row.get(c, "")) for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines.extend("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) for r in cells)
    return "\n".join(lines)


def _cmd_list(_: argparse.Namespace) -> int:
    from . import experiments

    print("models:      " + ", ".join(models.available()))
    print("datasets:    " + ", ".join(data.available()))
    print("experiments:")
    for exp_id in experiments.available():
        print(f"  {exp_id:28s} {experiments.get(exp_id).summary}")
    return 0


def _cmd_reproduce(args: argparse.Namespace) -> int:
    from . import experiments
    from .experiments.registry import parse_data_overrides

    overrides = parse_data_overrides(args.data or [])
    record = experiments.run(
        args.id,
        args.scale,
        device=args.device,
        seed=args.seed,
        data=overrides,
        progress=not args.quiet,
        download=args.download,
    )
    print(format_table(record["rows"]))
    out = args.out or record_filename(args.id).replace(".json", f".{args.scale}.json")
    path = write_record(record, out)
    wall = record["provenance"]["wall_seconds"]
    print(f"\n{len(record['rows'])} rows in {wall:.1f} s; record written to {path}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m leakagelib", description=__doc__.splitlines()[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="list models, datasets and experiments").set_defaults(fn=_cmd_list)
    rep = sub.add_parser("reproduce", help="run an experiment and write its JSON record")
    rep.add_argument("id", help="experiment id, e.g. intro/bias-attack (see `list`)")
    rep.add_argument("--scale", choices=("ci", "paper"), default="ci")
    rep.add_argument(
        "--data",
        action="append",
        metavar="LOGICAL=SPEC",
        help="replace a dataset the experiment uses, e.g. mnist=../shared/data/mnist.npz (repeatable)",
    )
    rep.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    rep.add_argument("--seed", type=int, default=0)
    rep.add_argument("--out", help="record path (default: ID with / as -, then .SCALE.json)")
    rep.add_argument(
        "--download",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="download missing torchvision/MedMNIST datasets (default: only with --scale paper)",
    )
    rep.add_argument("--quiet", action="store_true", help="no progress bars")
    rep.set_defaults(fn=_cmd_reproduce)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status (2 for bad input, 130 when interrupted)."""
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except (KeyError, ValueError, FileNotFoundError, RuntimeError) as err:
        message = err.args[0] if isinstance(err, KeyError) and err.args else err
        print(f"error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: no record written", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
