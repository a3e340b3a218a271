"""Partial records: a long run writes every finished unit as it goes, and ``--resume`` continues it.

A paper-scale experiment is a sequence of *units* (a cell of a table, a
training step of a figure) whose rows do not depend on one another: each
unit draws its randomness from a seed derived from the run's seed and the
unit's key (:func:`unit_seed`), never from what earlier units consumed. An
experiment runs its units through :meth:`leakagelib.experiments.Context.units`,
which skips the units a :class:`PartialRecord` already holds and saves the
partial record atomically after each new one. So a run killed halfway and
resumed gives the same rows as a run that was never interrupted (a test
checks it). Each unit keeps how long it took and the commit and device that
made it, and the final record lists them (:meth:`PartialRecord.provenance`):
a resumed run's units may come from several processes, commits or devices.
``python -m leakagelib reproduce ID --out F.json`` keeps the partial record
in ``F.json.partial`` until the final record is written.

A run may be split into *shards* (``--shard K/N``): processes started side by
side, each running the units at positions K, K + N, ... of each
:meth:`~leakagelib.experiments.Context.units` call, all adding to one
partial record under a file lock. A lent GPU is nearly idle under one
process of small networks (the README's Speed section), so N shards run N
units at a time. A shard that finishes while others still run stops with
:class:`ShareDone`; the one that finishes last finds every unit and writes
the final record. Each unit's rows depend only on its key, so a sharded run
gives the rows of an unsharded one (a test checks it).

A run may also take only some of its units (``--units TEXT``: those whose
key, as :func:`unit_key` writes it, contains TEXT), leaving the others for
another run to add: the CPU-sized units of an experiment here, the rest on
a lent GPU (``--units soteria`` runs Fig. 2's Soteria curve but not its
ATS networks). It stops with :class:`ShareDone` once its units are in the
partial record, as a shard does.

A run's identity names its ``--data`` files by path and by content
(``data_sha256``), and a resume compares the content: a partial record made
on a GPU machine from a copy of the samples resumes on a CPU machine that
names them by another path (see ``results/README.md``).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any

from .. import records
from ..attacks.checkpoint import LoopCheckpoint
from ..records import write_json_atomically

try:  # POSIX: the shards of a run share one partial record
    import fcntl
except ImportError:  # pragma: no cover - Windows: --shard is refused there
    fcntl = None

__all__ = [
    "PartialRecord",
    "ShareDone",
    "data_digests",
    "device_kind",
    "pending_record",
    "unit_key",
    "unit_seed",
]


def unit_key(key: Any) -> str:
    """A unit's key as the JSON text the partial record stores it under."""
    return json.dumps(key, sort_keys=True)


def _unit_digest(key: Any) -> str:
    """A unit's key as a short file name (its checkpoints' prefix)."""
    return hashlib.sha256(unit_key(key).encode()).hexdigest()[:16]


def unit_seed(seed: int, key: Any) -> int:
    """The seed of one unit: a hash of the run's seed and the unit's key (63 bits)."""
    digest = hashlib.sha256(f"{seed}|{unit_key(key)}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def data_digests(data: dict[str, str]) -> dict[str, str]:
    """The SHA-256 of each ``--data`` override that names a file (specs that are not files: none)."""
    digests = {}
    for name, spec in data.items():
        path = Path(spec).expanduser()
        if path.is_file():
            digests[name] = hashlib.sha256(path.read_bytes()).hexdigest()
    return digests


def device_kind(device: str | None) -> str | None:
    """``"cuda"`` for any CUDA device (``"cuda:1"``), else the device as given."""
    return "cuda" if device is not None and device.startswith("cuda") else device


def _comparable(identity: dict[str, Any]) -> dict[str, Any]:
    """An identity with its data named by content where the content is known, in JSON's types.

    A data file is known by the ``data_sha256`` the identity carries, or else
    (a partial record written before identities carried it) by hashing the
    file its path names here, if there is one; otherwise by its path. Values
    pass through JSON, as the file's did, so a changed setting given as a tuple
    (``--set soteria_epochs=(0,4)``) compares equal to the list the file holds.
    """
    data = identity.get("data") or {}
    digests = {**data_digests(data), **identity.get("data_sha256", {})}
    same = {k: v for k, v in identity.items() if k not in ("data", "data_sha256")}
    if data:
        same["data"] = {name: digests.get(name, spec) for name, spec in data.items()}
    return json.loads(json.dumps(same))


class ShareDone(Exception):
    """A process has run its share of the units while others are still missing: a shard
    stops, and the shard that finishes last writes the record (``--shard``); a run of some
    units stops, and a later run adds the rest (``--units``; see the module docstring)."""


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``PATH.lock`` while the partial record in ``path`` is read and
    written by one of the shards that share it."""
    lock = path.with_name(path.name + ".lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a", encoding="utf-8") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield  # closing the file releases the lock


class PartialRecord:
    """The finished units of one run (experiment, scale, seed, data), kept in a JSON file.

    ``resume=False`` starts afresh (an old partial file is replaced on the
    first save); ``resume=True`` loads the file if it exists and refuses one
    written by a different run, naming the difference. ``shard = (k, n)``
    makes this process the k-th of n that share the file, and ``select`` has
    it run only the units whose key contains that text (module docstring).
    """

    def __init__(
        self,
        path: str | os.PathLike,
        identity: dict[str, Any],
        *,
        resume: bool,
        shard: tuple[int, int] | None = None,
        select: str | None = None,
    ) -> None:
        if shard is not None and not (resume and 0 <= shard[0] < shard[1]):
            raise ValueError(f"shard {shard} must be (k, n) with 0 <= k < n, of a resumed run")
        if shard is not None and fcntl is None:
            raise ValueError("shards need POSIX file locks, which this platform lacks")
        if select is not None and not (resume and select):
            raise ValueError(f"select {select!r} must be non-empty text, of a resumed run")
        self.path, self.shard, self.select = Path(path), shard, select
        self.identity = dict(identity)
        self.units: dict[str, list[dict[str, Any]]] = {}
        self.seconds: dict[str, float] = {}
        self.made: dict[str, dict[str, str]] = {}
        self.total: int | None = None
        self.loaded: frozenset[str] = frozenset()
        if resume and self.path.exists():
            self._load()
            self.loaded = frozenset(self.units)

    @classmethod
    def read(cls, path: str | os.PathLike) -> PartialRecord:
        """The partial record in ``path`` as it is, for reporting (``campaign``'s plan)."""
        partial = cls(path, {}, resume=False)
        partial.identity = partial._read()
        return partial

    def _load(self) -> None:
        theirs, mine = _comparable(self._read()), _comparable(self.identity)
        differ = sorted(k for k in set(theirs) | set(mine) if theirs.get(k) != mine.get(k))
        if differ:
            details = ", ".join(
                f"{k}: {theirs.get(k)!r} there, {mine.get(k)!r} now"
                + (" (files compared by content)" if k == "data" else "")
                for k in differ
            )
            raise ValueError(
                f"{self.path} belongs to another run ({details}); resume with the same "
                "arguments, or start afresh without --resume"
            )

    def _read(self) -> dict[str, Any]:
        """Read the file's units and timings; return the identity of the run that wrote it."""
        try:
            saved = json.loads(self.path.read_text())
        except json.JSONDecodeError as err:
            raise ValueError(f"{self.path} is not a partial record: {err}") from err
        if not isinstance(saved, dict) or not isinstance(saved.get("units"), dict):
            raise ValueError(f"{self.path} is not a partial record (no 'units' object)")
        self.units = saved["units"]
        self.seconds = saved.get("seconds", {})
        self.made = saved.get("made", {})
        self.total = saved.get("total")
        return saved.get("identity", {})

    def get(self, key: Any) -> list[dict[str, Any]] | None:
        """The rows of a finished unit, or ``None``."""
        return self.units.get(unit_key(key))

    def checkpoint(self, key: Any, index: int) -> LoopCheckpoint:
        """The checkpoint of the ``index``-th attack of unit ``key``: a file in ``PATH.attacks/``
        beside this partial record (``results/ID.json.partial.attacks/``), deleted by :meth:`add`."""
        return LoopCheckpoint(self._attacks_dir() / f"{_unit_digest(key)}-{index}.pt")

    def kept(self, name: str) -> LoopCheckpoint:
        """The file ``PATH.attacks/NAME.pt`` for what several units share (a network trained once
        per run, :func:`.kept.kept_run`): unlike a unit's checkpoints, it stays until the last unit."""
        return LoopCheckpoint(self._attacks_dir() / f"{name}.pt")

    def _attacks_dir(self) -> Path:
        return self.path.with_name(self.path.name + ".attacks")

    def add(
        self,
        key: Any,
        rows: list[dict[str, Any]],
        seconds: float,
        total: int,
        *,
        made: dict[str, str] | None = None,
    ) -> None:
        """Record a finished unit and save: its rows, how long it took, of ``total`` units.

        ``made`` says what made it (``{"commit": ..., "device": ...}``; see :meth:`provenance`).
        """
        self.units[unit_key(key)] = rows
        self.seconds[unit_key(key)] = round(float(seconds), 3)
        if made is not None:
            self.made[unit_key(key)] = dict(made)
        self.total = int(total)
        with self._guard():
            self._merge()
            saved = {"identity": self.identity, "total": self.total, "seconds": self.seconds}
            write_json_atomically({**saved, "made": self.made, "units": self.units}, self.path)
        folder = self._attacks_dir()  # the unit's attack checkpoints are no longer needed
        for path in folder.glob(f"{_unit_digest(key)}-*.pt"):
            path.unlink()
        # the folder goes with the last unit (a shard may be about to save into it), and with
        # it what the units shared (kept)
        if len(self.units) >= self.total and folder.is_dir():
            for path in folder.glob("*.pt"):
                path.unlink()
            if not any(folder.iterdir()):
                folder.rmdir()

    def share(self, keys: Sequence[Any], left: Sequence[Any]) -> list[Any]:
        """The units of ``left`` (unfinished, of ``keys``) this process runs: all of them, or
        those of its shard (positions k, k + n, ... in ``keys``) whose key holds ``select``."""
        mine = {unit_key(key) for i, key in enumerate(keys) if self.shard is None
                or i % self.shard[1] == self.shard[0]}  # fmt: skip
        if self.select is not None:
            mine = {key for key in mine if self.select in key}
            if not any(self.select in unit_key(key) for key in keys):
                named = ", ".join(unit_key(key) for key in keys[:3])
                raise ValueError(
                    f"--units {self.select!r} is in none of the {len(keys)} units' keys "
                    f"({named}, ...)"
                )
        return [key for key in left if unit_key(key) in mine]

    def others(self, keys: Sequence[Any], done: Mapping[str, Any]) -> dict[str, list[dict]]:
        """The rows of the units of ``keys`` not in ``done`` (by :func:`unit_key`), which other
        processes ran; raises :class:`ShareDone` while any of them is missing."""
        if self.shard is None and self.select is None:
            return {}
        with self._guard():
            self._merge()
        missing = [key for key in keys if unit_key(key) not in done and self.get(key) is None]
        if missing:
            who = "this run" if self.shard is None else "shard {}/{}".format(*self.shard)
            raise ShareDone(
                f"{who} has run its units; {len(missing)} of {len(keys)} are left to other runs "
                f"(the one that finds them all writes the record; {self.path})"
            )
        return {unit_key(key): self.get(key) for key in keys if unit_key(key) not in done}

    def _guard(self) -> AbstractContextManager[None]:
        """The file lock, for a run that shares the file with others (``shard``, ``select``)."""
        shared = self.shard is not None or self.select is not None
        return _locked(self.path) if shared and fcntl is not None else nullcontext()

    def _merge(self) -> None:
        """Take in the units other processes have saved in the file (a shard's, under the lock;
        a run of some units'), keeping this process's own."""
        if (self.shard is None and self.select is None) or not self.path.exists():
            return
        units, seconds, made, total = self.units, self.seconds, self.made, self.total
        self._load()  # the file's identity is checked against this run's
        self.loaded = self.loaded | (frozenset(self.units) - frozenset(units))
        self.units, self.seconds = {**self.units, **units}, {**self.seconds, **seconds}
        self.made, self.total = {**self.made, **made}, total or self.total

    def provenance(self) -> dict[str, Any]:
        """The units' part of a final record's provenance.

        ``resumed`` (whether units came from an earlier process), ``unit_seconds``
        (the units' summed time, across processes: a resumed record's
        ``wall_seconds`` is only the last process's) and ``units``, one entry per
        unit with its key, seconds, and the commit and device that made it
        (``None`` for units saved before partial records kept them).
        """
        unknown = {"commit": None, "device": None}
        units = [
            {
                "unit": json.loads(key),
                "seconds": self.seconds.get(key),
                **unknown,
                **self.made.get(key, {}),
            }
            for key in self.units
        ]
        return {
            "resumed": bool(self.loaded),
            "unit_seconds": round(sum(self.seconds.get(k, 0.0) for k in self.units), 3),
            "units": units,
        }

    def progress(self) -> str:
        """``"k of n units run"``: how far the run has got, as the chapters' captions, the
        reproduction index and the README's records table say it."""
        return f"{len(self.units)} of {self.total} units run"

    def devices(self) -> set[str | None]:
        """The kinds of device (``"cpu"``, ``"cuda"``) that made the finished units (``None``: unknown)."""
        return {device_kind(self.made.get(key, {}).get("device")) for key in self.units}

    def estimate(self, device: str | None = None) -> float | None:
        """Seconds the unfinished units will take at the mean pace of the finished ones, or,
        with ``device``, of those made on its kind.

        ``None`` before the first unit has finished (the pace is unknown), or
        when ``device`` is given and no finished unit ran on its kind (a GPU's
        pace says nothing about a CPU's). A run that moved between devices
        (Table 2's re-run: eleven units on lent GPUs, one on a CPU) is paced by
        its units on this one instead of probing step times (:mod:`.estimate`;
        Table 2's probes ran for over 150 s on this project's CPU, 2026-11-28).
        """
        if self.total is None:
            return None
        kind = None if device is None else device_kind(device)
        paces = [
            seconds
            for key, seconds in self.seconds.items()
            if kind is None or device_kind(self.made.get(key, {}).get("device")) == kind
        ]
        if not paces:
            return None
        return max(self.total - len(self.units), 0) * sum(paces) / len(paces)

    def discard(self) -> None:
        """Remove the partial file (the final record has been written), and a shards' lock."""
        self.path.unlink(missing_ok=True)
        self.path.with_name(self.path.name + ".lock").unlink(missing_ok=True)


def pending_record(
    experiment_id: str, results_dir: str | os.PathLike | None = None
) -> PartialRecord | None:
    """The units a paper-scale campaign has finished for ``experiment_id`` so far, or ``None``.

    A campaign run with ``--results results`` keeps its partial record in
    ``results/ID.json.partial`` until the last unit is done; a session that ends
    first commits it and the next resumes it. The reproduction index reports
    how far it has got, and :func:`leakagelib.reporting.compare` shows its
    finished rows where no final record exists yet. A partial record of
    another scale is not a paper-scale record: ``None``.
    """
    results = Path(results_dir or records.default_results_dir())
    path = results / (records.record_filename(experiment_id) + ".partial")
    if not path.is_file():
        return None
    partial = PartialRecord.read(path)
    return partial if partial.identity.get("scale") == "paper" else None
