"""The command line's argument checks: every user error is found before any work starts.

Each raises :class:`UsageError`, which :func:`leakagelib.cli.main` turns into
exit status 2 and one line naming the argument and the fix (issue 11's
reliability checks; tests/test_cli.py holds one test per kind of bad input).
"""

from __future__ import annotations

import argparse
import ast
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any


class UsageError(ValueError):
    """A bad command line, found before any work starts (exit status 2, one line)."""


#: Seeds are fed to ``torch.Generator.manual_seed`` after scaling (see ``Context.generator``).
MAX_SEED = 2**31 - 1


def check_out(out: str, option: str = "--out") -> Path:
    """The record path ``out``, checked: a file path whose folder exists or can be made, writable.

    Messages name ``option``, the argument the path came from (``campaign`` builds its records'
    paths from ``--results``). The folder's writability is tried, not asked of ``os.access``: a
    file is created and removed in the nearest existing folder, since some folders refuse files
    whatever their permission bits say (``/proc``, ``/sys``, a read-only mount, an immutable
    folder under root)."""
    if not out.strip():
        raise UsageError(f"{option} is empty; give a file path such as results/record.json")
    path = Path(out).expanduser()
    if path.is_dir() or out.endswith(("/", os.sep)):
        raise UsageError(
            f"{option} {out!r} is a directory; give a file path such as {out.rstrip('/')}/record.json"
        )
    folder = path.parent if str(path.parent) else Path(".")
    existing = folder
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise UsageError(f"{option} {out!r}: {existing} is a file, so the folder cannot be made")
    try:
        with tempfile.NamedTemporaryFile(dir=existing, prefix=".leakagelib-write-test-"):
            pass
    except OSError as err:
        raise UsageError(
            f"{option} {out!r}: the folder {existing} is not writable ({err.strerror})"
        ) from None
    if path.exists() and not os.access(path, os.W_OK):
        raise UsageError(f"{option} {out!r} exists and is not writable")
    return path


def parse_shard(text: str) -> tuple[int, int]:
    """``--shard K/N`` as ``(K, N)``, with 0 <= K < N (an argparse type: a bad one is a usage
    error naming the option)."""
    head, sep, tail = text.partition("/")
    if not (sep and head.isdigit() and tail.isdigit() and int(head) < int(tail)):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not K/N with 0 <= K < N (the K-th of N shards, e.g. 0/4)"
        )
    return int(head), int(tail)


def check_device(device: str) -> None:
    """``cpu``, ``cuda`` or ``cuda:N`` with that GPU present."""
    import torch

    if device == "cpu":
        return
    head, _, index = device.partition(":")
    if head != "cuda" or (index and not index.isdigit()):
        raise UsageError(f"--device {device!r} is not one of cpu, cuda, cuda:N")
    if not torch.cuda.is_available():
        raise UsageError(
            f"--device {device!r}: CUDA is not available on this machine; use --device cpu"
        )
    if index and int(index) >= torch.cuda.device_count():
        raise UsageError(
            f"--device {device!r}: this machine has {torch.cuda.device_count()} GPU(s)"
        )


def check_data(exp_id: str, overrides: dict[str, str], source: str) -> None:
    """Every overridden dataset name is one the experiment uses; every path exists.

    ``$LEAKAGELIB_DATA`` serves every run (chapters included), so its names
    need only be known to some experiment: that still catches a typo.
    """
    from . import experiments
    from .experiments.registry import known_datasets

    if source == "--data":
        check_names(
            overrides,
            experiments.get(exp_id).datasets,
            f"which {exp_id} does not use; it uses",
            source,
        )
    else:
        check_names(overrides, known_datasets(), "which no experiment uses; known:", source)


def check_names(overrides: dict[str, str], uses: Sequence[str], who: str, source: str) -> None:
    """Each name of ``overrides`` is in ``uses`` (when it names any) and each path is a file."""
    for logical, spec in overrides.items():
        if uses and logical not in uses:
            raise UsageError(f"{source} names dataset {logical!r}, {who} {', '.join(uses)}")
        looks_like_path = spec.endswith(".npz") or os.sep in spec
        if looks_like_path and not Path(spec).expanduser().is_file():
            raise UsageError(f"{source} {logical}={spec}: no such file")
        if spec.endswith(".npz"):  # its format now, not when the experiment first loads it
            from .data.npz_format import check_file

            try:
                check_file(spec, logical)
            except (ValueError, MemoryError, OSError) as err:
                raise UsageError(f"{source} {logical}: {err}") from None


def campaign_data(ids: Sequence[str], items: Sequence[str]) -> dict[str, list[str]]:
    """Each campaign experiment's share of ``--data``, checked once before any work.

    A campaign's ``--data`` serves all of its experiments: a name must be one
    that some of them uses (a typo still fails at once, not hours later), and
    each experiment is handed only the names it uses, so that the checks of
    its own run pass and its partial record's identity names only its data.
    """
    from . import experiments
    from .experiments.registry import parse_data_overrides

    given = parse_data_overrides(items)
    used = sorted({name for exp_id in ids for name in experiments.get(exp_id).datasets})
    check_names(given, used, "which none of this campaign's experiments uses; they use", "--data")
    return {
        exp_id: [f"{k}={v}" for k, v in given.items() if k in experiments.get(exp_id).datasets]
        for exp_id in ids
    }


def _parsed_changes(items: Sequence[str]) -> dict[str, Any]:
    """``--set NAME=VALUE`` items as ``{NAME: value}`` (VALUE a Python literal)."""
    changes = {}
    for item in items:
        name, sep, text = item.partition("=")
        if not sep or not name.strip():
            raise UsageError(f"--set {item}: expected NAME=VALUE, e.g. --set victims=16")
        try:
            changes[name.strip()] = ast.literal_eval(text.strip())
        except (ValueError, SyntaxError):
            raise UsageError(
                f"--set {item}: VALUE must be a Python literal (a number, True or False, a "
                "quoted string, a tuple or None), e.g. --set victims=16"
            ) from None
    return changes


def checked_changes(exp_id: str, scale: str, items: Sequence[str]) -> dict[str, Any]:
    """``reproduce --set`` items as ``{NAME: value}``, each a setting of ``exp_id``'s config of
    the value's kind (:meth:`leakagelib.experiments.ScaleConfig.changed` raises, naming it)."""
    from . import experiments

    changes = _parsed_changes(items)
    experiments.get(exp_id).config.changed(scale, changes)  # names and kinds, before work
    return changes


def campaign_changes(ids: Sequence[str], scale: str, items: Sequence[str]) -> dict[str, list[str]]:
    """Each campaign experiment's share of ``--set``, checked once before any work.

    As with ``--data`` (:func:`campaign_data`), a name must be a setting of
    some experiment of the campaign, and each experiment gets the items that
    name its own settings, checked against its config.
    """
    from . import experiments

    changes = _parsed_changes(items)
    settings = {exp_id: set(experiments.get(exp_id).config.at(scale)) for exp_id in ids}
    unused = sorted(set(changes) - set().union(*settings.values()))
    if unused:
        raise UsageError(f"--set {', '.join(unused)}: no experiment of this campaign has it")
    shares = {}
    for exp_id in ids:
        mine = [item for item in items if item.partition("=")[0].strip() in settings[exp_id]]
        checked_changes(exp_id, scale, mine)
        shares[exp_id] = mine
    return shares
