"""The experiment registry behind ``python -m leakagelib reproduce``.

An experiment is a plain function ``fn(ctx: Context) -> rows`` registered with
:func:`experiment` under an id that names the paper's table or figure
(``"bayes/table2"``). It returns a list of row dicts, or a dict with a
``"rows"`` list and further JSON-able entries (per-step curves, say) that are
copied into the record; a ``"data"`` entry (logical name → description)
refines the record's account of which data stood for which dataset. Chapters call :func:`run` with the same ids, so the
book shows exactly what the command line computes.

For a dataset replaced with ``--data`` the record says which of its images
played which role (:func:`.data_roles.data_entry`): attacked images come from the
``"test"`` split and training images from ``"train"``, which for an ``.npz``
file are two disjoint parts of it (:func:`leakagelib.data.split_indices`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch

from .. import data as _data
from ..attacks.checkpoint import LoopCheckpoint
from ..records import IMPORTED_COMMIT, jsonable, provenance
from .config import EMPTY, ScaleConfig, Settings
from .data_roles import data_entry
from .resume import PartialRecord, unit_key, unit_seed
from .work import WorkFn

T = TypeVar("T")
K = TypeVar("K")

SCALES = ("ci", "paper")

#: Embedded stand-ins used at ``--scale ci`` when no ``--data`` override is given:
#: logical dataset → (embedded spec, dataset whose normalisation constants apply).
STAND_INS: dict[str, str] = {
    "mnist": "digits28",
    "fashion-mnist": "digits28",
    "cifar10": "patches",
    "cifar100": "patches",
}

DATA_ENV = "LEAKAGELIB_DATA"
#: The device of :func:`run` when none is named (``cpu`` when unset): a chapter's
#: ``%env LEAKAGELIB_DEVICE=cuda`` puts its registered experiments on the GPU.
DEVICE_ENV = "LEAKAGELIB_DEVICE"


def parse_data_overrides(items: Iterable[str]) -> dict[str, str]:
    """Parse ``LOGICAL=SPEC`` strings (``mnist=path.npz``) into a dict."""
    overrides: dict[str, str] = {}
    for item in items:
        logical, sep, spec = item.partition("=")
        if not sep or not logical.strip() or not spec.strip():
            raise ValueError(f"data override {item!r} is not of the form LOGICAL=SPEC")
        overrides[logical.strip()] = spec.strip()
    return overrides


def env_data_overrides() -> dict[str, str]:
    """Overrides from ``$LEAKAGELIB_DATA`` (comma-separated ``LOGICAL=SPEC``)."""
    raw = os.environ.get(DATA_ENV, "").strip()
    return parse_data_overrides(p for p in raw.split(",") if p.strip()) if raw else {}


@dataclass
class Context:
    """What an experiment may ask of its run: scale, device, seed and data.

    ``dataset("mnist", n=10)`` resolves a logical dataset name: a ``--data``
    override (or ``$LEAKAGELIB_DATA``) wins; otherwise at ``ci`` scale the
    embedded stand-in of :data:`STAND_INS` is used, and at ``paper`` scale the
    torchvision dataset itself. ``download`` lets a missing torchvision or
    MedMNIST dataset be downloaded; ``None`` (the default) means "at paper
    scale", so that a paper-scale run on a fresh Colab machine fetches its
    data, while a ci run never touches the network.

    ``uses`` collects, for each overridden dataset, the images every
    :meth:`dataset` call loaded: ``(split, selection) → indices`` (see
    :class:`leakagelib.data.Dataset`), for the record's ``data`` field.
    """

    scale: str = "ci"
    device: str = "cpu"
    seed: int = 0
    data: dict[str, str] = field(default_factory=dict)
    progress: bool = True
    download: bool | None = None
    settings: ScaleConfig = EMPTY
    partial: PartialRecord | None = None
    uses: dict[str, dict[tuple[str, str], torch.Tensor]] = field(default_factory=dict, repr=False)
    running: tuple[Any, list[LoopCheckpoint]] | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.scale not in SCALES:
            raise ValueError(f"unknown scale {self.scale!r}; use one of {SCALES}")
        if self.device.startswith("cuda") and not torch.cuda.is_available():
            raise RuntimeError(f"device {self.device!r} asked for, but CUDA is not available")

    @property
    def paper(self) -> bool:
        """True at paper scale."""
        return self.scale == "paper"

    @property
    def config(self) -> Settings:
        """The running experiment's settings at this run's scale (see :class:`ScaleConfig`)."""
        return self.settings.at(self.scale)

    def pick(self, ci: T, paper: T) -> T:
        """The value for this run's scale."""
        return paper if self.paper else ci

    @property
    def may_download(self) -> bool:
        """Whether missing datasets may be downloaded in this run (see ``download``)."""
        return self.paper if self.download is None else self.download

    def resolve(self, logical: str, stand_in: str | None = None) -> str:
        """The data spec that stands for ``logical`` in this run.

        ``stand_in`` replaces the :data:`STAND_INS` entry at ci scale, for an
        experiment whose ci budget asks for other embedded data (the 8×8
        ``digits`` instead of ``digits28`` for MNIST, say); overrides and the
        paper scale ignore it.
        """
        if logical in self.data:
            return self.data[logical]
        if self.paper:
            return logical
        return stand_in if stand_in is not None else STAND_INS.get(logical, logical)

    def dataset(
        self,
        logical: str,
        n: int | None = None,
        *,
        split: str = "test",
        stand_in: str | None = None,
        **options: Any,
    ) -> _data.Dataset:
        """Load the dataset this run uses for ``logical`` (see :meth:`resolve`, also for ``stand_in``).

        Images to attack come from ``split="test"`` (the default), training
        images from ``split="train"``; an ``.npz`` override is split into
        these two disjoint parts of its file (:func:`leakagelib.data.split_indices`),
        so that no attacked image was trained on. ``options`` go to
        :func:`leakagelib.data.load`; the normalisation constants are those of
        ``logical`` unless ``options`` say otherwise. For an overridden
        dataset the images loaded are noted in :attr:`uses`.
        """
        spec = self.resolve(logical, stand_in)
        options.setdefault("seed", self.seed)
        options.setdefault("download", self.may_download)
        if spec != logical:
            options.setdefault("constants_of", logical)
        ds = _data.load(spec, n=n, split=split, **options)
        if logical in self.data and ds.indices is not None:
            self.uses.setdefault(logical, {})[(split, ds.selection)] = ds.indices
        return ds

    def generator(self, offset: int = 0) -> torch.Generator:
        """A seeded CPU generator, distinct for each ``offset``."""
        return torch.Generator().manual_seed(self.seed * 1_000_003 + offset)

    def track(
        self, iterable: Iterable[T], desc: str, total: int | None = None, initial: int = 0
    ) -> Iterator[T]:
        """Iterate with a tqdm progress bar when ``progress`` is on.

        ``initial`` items count as done before the first (a resumed run's
        finished units): the bar starts there and its rate and ETA count only
        the items iterated here.
        """
        if not self.progress:
            yield from iterable
            return
        from tqdm.auto import tqdm

        yield from tqdm(iterable, desc=desc, total=total, initial=initial, leave=False)

    def checkpoint(self) -> LoopCheckpoint | None:
        """A checkpoint for the next attack of the unit being computed, in a command-line run.

        :meth:`units` runs each unit; the k-th attack that a unit starts gets
        the k-th checkpoint file of the unit (:meth:`.resume.PartialRecord.checkpoint`),
        so an attack killed halfway resumes there, and a unit whose attack had
        ended before it was killed does not attack again. ``None`` outside a
        unit or without a partial record (a chapter's run).
        """
        if self.partial is None or self.running is None:
            return None
        key, handed = self.running
        handed.append(self.partial.checkpoint(key, len(handed)))
        return handed[-1]

    def units(
        self, keys: Iterable[K], compute: Callable[[K], list[dict[str, Any]]], desc: str
    ) -> list[dict[str, Any]]:
        """The rows of every unit ``key`` (``compute(key)``), in order, resuming where possible.

        Each unit starts from the global seed :func:`~.resume.unit_seed` of the
        run's seed and its key, so its rows do not depend on the units before
        it; with a partial record (a command-line run) finished units are read
        back instead of recomputed, and every new one is saved as it finishes.
        The progress bar counts the finished units as done (and, in a shard or
        a ``--units`` run, only this run's share as left) and shows an ETA from
        the pace of the units computed in this run. An attack in a unit
        may save its loop as it goes (:meth:`checkpoint`).
        """
        keys = list(keys)
        found = {unit_key(k): self.partial.get(k) for k in keys} if self.partial is not None else {}
        done = {k: rows for k, rows in found.items() if rows is not None}
        left = [k for k in keys if unit_key(k) not in done]
        if self.partial is not None:  # a shard's or a --units run's share
            left = self.partial.share(keys, left)
        for key in self.track(left, desc, total=len(done) + len(left), initial=len(done)):
            torch.manual_seed(unit_seed(self.seed, key))
            start, self.running = time.perf_counter(), (key, [])
            try:
                rows = compute(key)
                earlier = sum(c.earlier_s for c in self.running[1])  # resumed attacks' time
            finally:
                self.running = None
            if self.partial is not None:
                rows = jsonable(rows)
                made = {"commit": IMPORTED_COMMIT, "device": self.device}
                seconds = time.perf_counter() - start + earlier
                self.partial.add(key, rows, seconds, len(keys), made=made)
            done[unit_key(key)] = rows
        if self.partial is not None:  # the other runs' units, or ShareDone
            done.update(self.partial.others(keys, done))
        return [row for key in keys for row in done[unit_key(key)]]


ExperimentFn = Callable[[Context], "list[dict[str, Any]] | dict[str, Any]"]


@dataclass(frozen=True)
class Experiment:
    """A registered experiment: id, function, row keys, summary, config and the paper's numbers.

    ``config`` holds its settings at both scales (:class:`ScaleConfig`);
    ``reference`` the paper's numbers as rows with the same keys as the
    experiment's own rows (what :func:`leakagelib.reporting.compare` puts
    beside them), and ``reference_source`` where in the paper they stand;
    ``on`` the columns that name a row; ``work`` each unit's computation
    (:mod:`.work`), for the time estimates of ``campaign`` (:mod:`.estimate`).
    """

    id: str
    fn: ExperimentFn
    row_keys: tuple[str, ...]
    summary: str
    config: ScaleConfig = EMPTY
    reference: tuple[dict[str, Any], ...] = ()
    reference_source: str = ""
    datasets: tuple[str, ...] = ()
    work: WorkFn | None = None
    on: tuple[str, ...] = ()


_EXPERIMENTS: dict[str, Experiment] = {}


def experiment(
    id: str,
    *,
    row_keys: Iterable[str],
    config: ScaleConfig = EMPTY,
    reference: Iterable[dict[str, Any]] = (),
    reference_source: str = "",
    datasets: Iterable[str] = (),
    work: WorkFn | None = None,
    on: Sequence[str] = (),
) -> Callable[[ExperimentFn], ExperimentFn]:
    """Register ``fn(ctx) -> rows`` under ``id``; every row must carry ``row_keys``.

    ``config`` is the experiment's :class:`ScaleConfig` (the function reads
    ``ctx.config``); ``reference`` the paper's numbers as rows, and
    ``reference_source`` the table or figure they come from; ``datasets``
    the logical dataset names it loads (what ``--data NAME=...`` may replace);
    ``work(ctx)`` the loads of each unit of a run in ``ctx`` (:mod:`.work`);
    ``on`` the columns that tell the paper's rows apart (required with ``reference``).
    """

    def decorate(fn: ExperimentFn) -> ExperimentFn:
        if id in _EXPERIMENTS:
            raise ValueError(f"experiment id {id!r} is registered twice")
        summary = (fn.__doc__ or "").strip().splitlines()[0] if fn.__doc__ else ""
        rows = tuple(dict(r) for r in reference)
        if rows and (not on or len({tuple(r.get(k) for k in on) for r in rows}) < len(rows)):
            raise ValueError(f"experiment {id!r}: `on` {on} must tell the paper's rows apart")
        _EXPERIMENTS[id] = Experiment(
            id, fn, tuple(row_keys), summary, config, rows, reference_source, tuple(datasets),
            work, tuple(on),
        )  # fmt: skip
        return fn

    return decorate


def available() -> list[str]:
    """All registered experiment ids, sorted."""
    return sorted(_EXPERIMENTS)


def known_datasets() -> list[str]:
    """Every logical dataset name some registered experiment loads, sorted."""
    return sorted({name for exp in _EXPERIMENTS.values() for name in exp.datasets})


def get(id: str) -> Experiment:
    """The experiment registered under ``id``."""
    if id not in _EXPERIMENTS:
        raise KeyError(
            f"unknown experiment {id!r}; available experiments: {', '.join(available())}"
        )
    return _EXPERIMENTS[id]


def run(
    id: str,
    scale: str = "ci",
    *,
    device: str | None = None,
    seed: int = 0,
    data: dict[str, str] | None = None,
    progress: bool = True,
    download: bool | None = None,
    partial: PartialRecord | None = None,
    changes: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Run experiment ``id`` and return its record (rows, extras, provenance).

    Overrides in ``$LEAKAGELIB_DATA`` apply first; ``data`` overrides them.
    ``download`` is :attr:`Context.download` (default: only at paper scale).
    ``partial`` keeps finished units (see :meth:`Context.units`) so that an
    interrupted run can be resumed. ``device`` defaults to ``$LEAKAGELIB_DEVICE`` or ``cpu``.
    ``changes`` replace settings of the experiment's config at ``scale``
    (:meth:`ScaleConfig.changed`; ``reproduce --set``, e.g. fewer victims on a
    CPU); the record lists them as ``settings_changed``, registered value and
    value used.
    """
    exp, device = get(id), device or os.environ.get(DEVICE_ENV, "").strip() or "cpu"
    overrides = {**env_data_overrides(), **(data or {})}
    settings = exp.config.changed(scale, changes) if changes else exp.config
    ctx = Context(scale=scale, device=device, seed=seed, data=overrides, progress=progress,
                  download=download, settings=settings, partial=partial)  # fmt: skip
    torch.manual_seed(seed)
    start = time.perf_counter()
    out = exp.fn(ctx)
    wall = time.perf_counter() - start
    record = _record(exp, scale, out)
    if changes:
        registered = exp.config.at(scale)
        record["settings_changed"] = {
            name: {"registered": registered[name], "used": ctx.config[name]} for name in changes
        }
    record["data"] = _described(ctx, overrides, record.pop("data", {}))
    units = partial.provenance() if partial is not None else {}  # a resumable run's units
    record["provenance"] = {**provenance(seed=seed, device=device, wall_seconds=wall), **units}
    return record


def _record(exp: Experiment, scale: str, out: Any) -> dict[str, Any]:
    """The record of ``exp``'s output ``out`` (its rows, or a dict of rows and extras), checked."""
    extras: dict[str, Any] = {}
    if isinstance(out, dict):
        extras = {k: v for k, v in out.items() if k != "rows"}
        rows = out.get("rows")
    else:
        rows = out
    if not isinstance(rows, list) or not rows:
        raise RuntimeError(f"experiment {exp.id!r} returned no rows")
    for i, row in enumerate(rows):
        missing = [k for k in exp.row_keys if k not in row]
        if missing:
            raise RuntimeError(f"experiment {exp.id!r}: row {i} lacks the keys {missing}")
    return {"experiment": exp.id, "scale": scale, "rows": rows, **extras}


def _described(ctx: Context, overrides: dict[str, str], notes: dict[str, Any]) -> dict[str, Any]:
    """The record's ``data``: each dataset the run could use, with what it made of an override."""
    described: dict[str, Any] = {
        k: data_entry(ctx.resolve(k), ctx.uses.get(k, {})) if k in overrides else ctx.resolve(k)
        for k in sorted(set(STAND_INS) | set(overrides))
    }
    for name, note in notes.items():  # an experiment may say what it made of a dataset
        entry = described.get(name)
        described[name] = {**entry, "note": note} if isinstance(entry, dict) else note
    return described
