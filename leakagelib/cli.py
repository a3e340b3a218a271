"""The command line: ``python -m leakagelib list | reproduce | campaign``.

``reproduce ID --scale ci|paper [--data LOGICAL=SPEC ...] [--device cpu|cuda]
[--seed N] [--out FILE.json] [--resume] [--download | --no-download]`` runs a
registered experiment (downloading missing datasets only at paper scale
unless told otherwise), prints its rows as a table and writes the JSON record
atomically (see :mod:`leakagelib.records`). Every argument is checked before
any work starts; a bad one exits with status 2 and one line. Finished units
are kept in ``OUT.partial`` as the run goes, so ``--resume`` continues an
interrupted run (:mod:`leakagelib.experiments.resume`). ``campaign --scale
paper [--only ID ...]`` runs every experiment into ``results/`` in order,
skipping finished records and resuming partial ones, after printing its plan
with an estimate of each unfinished experiment's time on this device
(:mod:`leakagelib.experiments.estimate`). ``--shard K/N`` (with ``--resume``
for ``reproduce``) makes the process one of N started side by side that share
the run's units and its partial record; the last to finish writes the record.
``--units TEXT`` (with ``--resume`` for ``reproduce``, one ``--only`` experiment
for ``campaign``) runs only the units whose key contains TEXT (the CPU-sized
ones here, the rest on a GPU), adding them to the partial record; the run that
finds every unit there writes the record.
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from signal import SIGINT, SIGTERM
from typing import TYPE_CHECKING, Any, NoReturn

from . import data, models
from .cli_checks import (
    MAX_SEED,
    UsageError,
    campaign_changes,
    campaign_data,
    check_data,
    check_device,
    check_out,
    checked_changes,
    parse_shard,
)
from .records import record_filename, run_seconds, write_record
from .reporting import format_table

if TYPE_CHECKING:
    from .experiments.estimate import Estimator


def _cmd_list(_: argparse.Namespace) -> int:
    from . import experiments

    print("models:      " + ", ".join(models.available()))
    print("datasets:    " + ", ".join(data.available()))
    print("experiments:")
    for exp_id in experiments.available():
        print(f"  {exp_id:28s} {experiments.get(exp_id).summary}")
    return 0


def _write_safely(record: dict, path: Path) -> Path:
    """Write ``record`` to ``path``; if that fails, to a fallback file, so the run is never lost."""
    try:
        return write_record(record, path)
    except OSError as err:
        fallback = Path(tempfile.gettempdir()) / f"leakagelib-{path.name}"
        written = write_record(record, fallback)
        print(f"error: could not write {path} ({err}); the record is in {written}", file=sys.stderr)
        raise SystemExit(1) from err


def _checked_overrides(args: argparse.Namespace) -> dict[str, str]:
    """Check the run's arguments before any work; return its ``--data`` overrides."""
    from . import experiments
    from .experiments.registry import env_data_overrides, parse_data_overrides

    experiments.get(args.id)  # an unknown id fails here, naming the known ones
    if not 0 <= args.seed <= MAX_SEED:
        raise UsageError(f"--seed must be between 0 and {MAX_SEED}, got {args.seed}")
    check_device(args.device)
    overrides = parse_data_overrides(args.data or [])
    check_data(args.id, overrides, "--data")
    env = {k: v for k, v in env_data_overrides().items() if k not in overrides}
    check_data(args.id, env, "LEAKAGELIB_DATA")
    return overrides


def _checked_changes(args: argparse.Namespace) -> dict[str, Any]:
    """``reproduce --set NAME=VALUE`` as ``{NAME: value}``, each checked against the config."""
    return checked_changes(args.id, args.scale, getattr(args, "set", None) or [])


def _partial(args: argparse.Namespace, out: Path, overrides: dict[str, str], changes: dict):
    """The partial record beside ``out`` (``OUT.partial``); refuses to drop one without --resume."""
    from .experiments.resume import PartialRecord, data_digests

    path = out.with_name(out.name + ".partial")
    if path.exists() and not args.resume:
        raise UsageError(
            f"{path} holds finished units of an earlier run: pass --resume to continue it, "
            "or delete it to start afresh"
        )
    identity = {"experiment": args.id, "scale": args.scale, "seed": args.seed, "data": overrides}
    if overrides:  # the files' content, so that a resume may name them by another path
        identity["data_sha256"] = data_digests(overrides)
    if changes:  # an older partial record, made without changes, keeps its identity
        identity["changes"] = changes
    return PartialRecord(path, identity, resume=args.resume, shard=args.shard,
                         select=args.units)  # fmt: skip


def run_to_record(args: argparse.Namespace, out: Path) -> Path | None:
    """Run ``args.id`` resumably and write its record to ``out`` (used by reproduce and campaign);
    ``None`` when this process (a shard, or a ``--units`` run) left units to other runs."""
    from . import experiments
    from .experiments.resume import ShareDone

    overrides, changes = _checked_overrides(args), _checked_changes(args)
    partial = _partial(args, out, overrides, changes)
    try:
        record = experiments.run(
            args.id,
            args.scale,
            device=args.device,
            seed=args.seed,
            data=overrides,
            progress=not args.quiet,
            download=args.download,
            partial=partial,
            changes=changes,
        )
    except ShareDone as done:
        print(f"{args.id}: {done}")
        return None
    print(format_table(record["rows"]))
    path = _write_safely(record, out)
    partial.discard()
    wall = run_seconds(record["provenance"])
    print(f"\n{len(record['rows'])} rows in {wall:.1f} s; record written to {path}")
    return path


def _cmd_reproduce(args: argparse.Namespace) -> int:
    if args.shard is not None and not args.resume:
        raise UsageError("--shard needs --resume: the shards share one partial record")
    if args.units is not None and not args.resume:
        raise UsageError("--units needs --resume: the other units join its partial record later")
    default = record_filename(args.id).replace(".json", f".{args.scale}.json")
    out = check_out(default if args.out is None else args.out)
    _checked_overrides(args)
    run_to_record(args, out)
    return 0


def _plan_line(
    exp_id: str, out: Path, args: argparse.Namespace, estimator: Estimator | None
) -> tuple[str, str, float | None]:
    """``(status, line, seconds)`` of one campaign entry: done, partial or to run, with its ETA.

    A partial record beside a finished one is a re-run under way (the
    experiment changed since the record was made) and is resumed like any
    other. A partial record's ETA is the pace of its finished units when they ran on
    this kind of device; otherwise (a GPU's partial record resumed on a CPU),
    and for an experiment not started yet, it is the estimate of the declared
    work (of the units left) at step times probed on this device
    (:mod:`leakagelib.experiments.estimate`), unless ``estimator`` is ``None``
    (``--no-estimate``: a lent GPU's short call spends no time probing);
    ``seconds`` is ``None`` when there is no ETA.
    """
    from . import experiments
    from .experiments.estimate import format_duration
    from .experiments.registry import env_data_overrides, parse_data_overrides
    from .experiments.resume import PartialRecord
    from .records import read_record

    data = {**env_data_overrides(), **parse_data_overrides(args.data or [])}
    partial_path = out.with_name(out.name + ".partial")
    if out.exists() and not partial_path.exists():
        prov = read_record(out)["provenance"]
        where = f"{run_seconds(prov):.1f} s on {prov.get('device_name', '?')}"
        return "done", f"{exp_id:28s} done ({where})", 0.0
    if partial_path.exists():  # beside a finished record: a re-run that will replace it
        partial = PartialRecord.read(partial_path)
        rerun = "re-run " if out.exists() else ""
        changed = "".join(f"{item}, " for item in _partial_changes(out))
        head = (
            f"{exp_id:28s} {rerun}partial: {len(partial.units)} of {partial.total} units, {changed}"
        )
        if any(partial_path.with_name(partial_path.name + ".attacks").glob("*.pt")):
            head += "a unit resumes from its checkpoint, "
        eta = partial.estimate(args.device)
        if eta is not None:
            pace = "so far" if len(partial.devices()) == 1 else f"of its units on {args.device}"
            return "partial", head + f"about {format_duration(eta)} left at the pace {pace}", eta
        if estimator is None:
            return "partial", head + "time left not estimated (--no-estimate)", None
        found = estimator.of(experiments.get(exp_id), args.scale, data)
        if found is None or not partial.total:
            return "partial", head + "time left unknown", None
        eta = found.seconds * (partial.total - len(partial.units)) / partial.total
        ran = ", ".join(sorted(str(d) for d in partial.devices()))
        line = head + f"about {format_duration(eta)} left (estimate here; they ran on {ran})"
        return "partial", line, eta
    if estimator is None:
        return "to run", f"{exp_id:28s} to run (not estimated: --no-estimate)", None
    found = estimator.of(experiments.get(exp_id), args.scale, data)
    if found is None:
        return "to run", f"{exp_id:28s} to run (no estimate: it declares no work)", None
    return "to run", f"{exp_id:28s} to run, {found.describe()}", found.seconds


def _partial_changes(out: Path) -> list[str]:
    """The ``--set NAME=VALUE`` items of the run that wrote ``out``'s partial record (none
    without one), so that the campaign resumes it as that run (``victims_at`` for Table III
    on the CIFAR-10 sample) instead of refusing it as another run's."""
    from .experiments.resume import PartialRecord

    path = out.with_name(out.name + ".partial")
    changes = PartialRecord.read(path).identity.get("changes", {}) if path.exists() else {}
    return [f"{name}={value!r}" for name, value in changes.items()]


def _cmd_campaign(args: argparse.Namespace) -> int:
    """Every experiment (or ``--only`` ones) in order into ``--results``, skipping finished ones.

    It first prints the plan: which records are done, which partial records
    will be resumed (with the time their unfinished units will take at the
    pace measured so far, on this machine), and which will run, with an
    estimate of their time on this device (probed, see
    :mod:`leakagelib.experiments.estimate`; not with ``--no-estimate``), then
    the total.
    """
    from . import experiments
    from .experiments.estimate import Estimator, format_duration

    ids = args.only or experiments.available()
    if args.units is not None and len(ids) != 1:
        raise UsageError("--units names units of one experiment: give it with --only ID")
    for exp_id in ids:
        experiments.get(exp_id)
    data = campaign_data(ids, args.data or [])
    sets = campaign_changes(ids, args.scale, args.set or [])
    check_device(args.device)
    estimator = None if args.no_estimate else Estimator(args.device)
    plan, seconds = [], []
    for exp_id in ids:
        out = check_out(str(Path(args.results) / record_filename(exp_id)), "--results")
        mine = argparse.Namespace(**{**vars(args), "id": exp_id, "data": data[exp_id]})
        status, line, eta = _plan_line(exp_id, out, mine, estimator)
        plan.append((exp_id, out, status))
        seconds.append(eta)
        print(line, flush=True)
    known = [s for s in seconds if s is not None]
    unknown = len(seconds) - len(known)
    print(f"total left: about {format_duration(sum(known))}"
          + (f" and {unknown} without an estimate" if unknown else ""), flush=True)  # fmt: skip
    if estimator is not None and estimator.probed:
        print(f"(estimates: each experiment's declared work × step times probed now on "
              f"{args.device}; L-BFGS and early-stopped training counted at their maximum)")  # fmt: skip
    for exp_id, out, status in plan:
        if status == "done":
            continue
        print(f"\n== {exp_id} ({args.scale}, {args.device})")
        changes = sets[exp_id] or _partial_changes(out)  # a partial resumes with its run's
        run_args = argparse.Namespace(**{**vars(args), "id": exp_id, "data": data[exp_id],
                                         "resume": True, "set": changes})  # fmt: skip
        run_to_record(run_args, out)
    return 0


def _run_options() -> argparse.ArgumentParser:
    """The options every run takes (``reproduce`` and ``campaign``)."""
    common = _Parser(add_help=False)
    common.add_argument("--scale", choices=("ci", "paper"), default="ci")
    common.add_argument(
        "--data",
        action="append",
        metavar="LOGICAL=SPEC",
        help="replace a dataset the experiment uses, e.g. mnist=../shared/data/mnist.npz (repeatable)",
    )
    common.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    common.add_argument("--seed", type=int, default=0)
    common.add_argument(
        "--download",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="download missing torchvision/MedMNIST datasets (default: only with --scale paper)",
    )
    common.add_argument("--quiet", action="store_true", help="no progress bars")
    common.add_argument(
        "--shard",
        type=parse_shard,
        metavar="K/N",
        help="run the units at positions K, K+N, ... of a run split over N processes started "
        "side by side, sharing its partial record (e.g. 0/8 ... 7/8 on one GPU)",
    )
    common.add_argument("--units", metavar="TEXT", help="run only the units whose key contains "
                        "TEXT, e.g. soteria, leaving the others to another run")  # fmt: skip
    return common


class _Parser(argparse.ArgumentParser):
    """argparse's parser with its usage errors on one line and exit status 2, as the checks of
    :mod:`.cli_checks` report theirs (the usage block stays with ``--help``)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m leakagelib", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="list models, datasets and experiments").set_defaults(fn=_cmd_list)
    common = _run_options()
    rep = sub.add_parser(
        "reproduce", parents=[common], help="run an experiment and write its JSON record"
    )
    rep.add_argument("id", help="experiment id, e.g. intro/bias-attack (see `list`)")
    rep.add_argument("--out", help="record path (default: ID with / as -, then .SCALE.json)")
    rep.add_argument(
        "--set",
        action="append",
        metavar="NAME=VALUE",
        help="change a setting of the experiment at this scale, e.g. victims=16 (repeatable; "
        "the record lists the changes)",
    )
    rep.add_argument(
        "--resume",
        action="store_true",
        help="continue an interrupted run from OUT.partial (same arguments, same seeds)",
    )
    rep.set_defaults(fn=_cmd_reproduce)
    camp = sub.add_parser(
        "campaign",
        parents=[common],
        help="run every experiment (or --only some) into --results, skipping finished ones",
    )
    camp.add_argument("--only", nargs="+", metavar="ID", help="these experiments, in this order")
    camp.add_argument(
        "--set",
        action="append",
        metavar="NAME=VALUE",
        help="change a setting of each experiment that has it, e.g. victims_at={'cifar10': 32} "
        "(repeatable; a partial record otherwise resumes with its own run's changes)",
    )
    camp.add_argument(
        "--results", default="results", help="folder of the records (default: results)"
    )
    camp.add_argument(
        "--no-estimate",
        action="store_true",
        help="plan without probing step times (a partial record's pace is still shown)",
    )
    camp.set_defaults(fn=_cmd_campaign)
    return parser


@contextmanager
def _graceful_signals() -> Iterator[None]:
    """SIGTERM and SIGINT let a running attack or training save its checkpoint before the run stops
    (:func:`leakagelib.attacks.checkpoint.stop_gracefully`); the handlers are restored after."""
    from .attacks.checkpoint import stop_gracefully

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = {signum: signal.signal(signum, stop_gracefully) for signum in (SIGTERM, SIGINT)}
    try:
        yield
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status (2 for bad input, 130 when interrupted)."""
    args = build_parser().parse_args(argv)
    try:
        with _graceful_signals():
            return args.fn(args)
    except (KeyError, ValueError, FileNotFoundError, RuntimeError) as err:
        message = err.args[0] if isinstance(err, KeyError) and err.args else err
        print(f"error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(
            "interrupted: no record written; finished units stay in OUT.partial, and a unit's "
            "attack or training under way in OUT.partial.attacks/ (rerun with --resume)",
            file=sys.stderr,
        )
        return 130


if __name__ == "__main__":
    sys.exit(main())
