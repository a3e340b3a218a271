"""The experiment registry behind ``python -m leakagelib reproduce``.

An experiment is a plain function ``fn(ctx: Context) -> rows`` registered with
:func:`experiment` under an id that names the paper's table or figure
(``"bayes/table2"``). It returns a list of row dicts, or a dict with a
``"rows"`` list and further JSON-able entries (per-step curves, say) that are
copied into the record; a ``"data"`` entry (logical name → description)
refines the record's account of which data stood for which dataset. Chapters call :func:`run` with the same ids, so the
book shows exactly what the command line computes.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch

from .. import data as _data
from ..records import provenance
from .config import EMPTY, ScaleConfig, Settings

T = TypeVar("T")

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
    """

    scale: str = "ci"
    device: str = "cpu"
    seed: int = 0
    data: dict[str, str] = field(default_factory=dict)
    progress: bool = True
    download: bool | None = None
    settings: ScaleConfig = EMPTY

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

    def resolve(self, logical: str) -> str:
        """The data spec that stands for ``logical`` in this run."""
        if logical in self.data:
            return self.data[logical]
        if not self.paper and logical in STAND_INS:
            return STAND_INS[logical]
        return logical

    def dataset(self, logical: str, n: int | None = None, **options: Any) -> _data.Dataset:
        """Load the dataset this run uses for ``logical`` (see :meth:`resolve`).

        ``options`` go to :func:`leakagelib.data.load`; the normalisation
        constants are those of ``logical`` unless ``options`` say otherwise.
        """
        spec = self.resolve(logical)
        options.setdefault("seed", self.seed)
        options.setdefault("download", self.may_download)
        if spec != logical:
            options.setdefault("constants_of", logical)
        return _data.load(spec, n=n, **options)

    def generator(self, offset: int = 0) -> torch.Generator:
        """A seeded CPU generator, distinct for each ``offset``."""
        return torch.Generator().manual_seed(self.seed * 1_000_003 + offset)

    def track(self, iterable: Iterable[T], desc: str, total: int | None = None) -> Iterator[T]:
        """Iterate with a tqdm progress bar when ``progress`` is on."""
        if not self.progress:
            yield from iterable
            return
        from tqdm.auto import tqdm

        yield from tqdm(iterable, desc=desc, total=total, leave=False)


ExperimentFn = Callable[[Context], "list[dict[str, Any]] | dict[str, Any]"]


@dataclass(frozen=True)
class Experiment:
    """A registered experiment: id, function, row keys, summary, config and the paper's numbers.

    ``config`` holds its settings at both scales (:class:`ScaleConfig`);
    ``reference`` the paper's numbers as rows with the same keys as the
    experiment's own rows (what :func:`leakagelib.reporting.compare` puts
    beside them), and ``reference_source`` where in the paper they stand.
    """

    id: str
    fn: ExperimentFn
    row_keys: tuple[str, ...]
    summary: str
    config: ScaleConfig = EMPTY
    reference: tuple[dict[str, Any], ...] = ()
    reference_source: str = ""
    datasets: tuple[str, ...] = ()


_EXPERIMENTS: dict[str, Experiment] = {}


def experiment(
    id: str,
    *,
    row_keys: Iterable[str],
    config: ScaleConfig = EMPTY,
    reference: Iterable[dict[str, Any]] = (),
    reference_source: str = "",
    datasets: Iterable[str] = (),
) -> Callable[[ExperimentFn], ExperimentFn]:
    """Register ``fn(ctx) -> rows`` under ``id``; every row must carry ``row_keys``.

    ``config`` is the experiment's :class:`ScaleConfig` (the function reads
    ``ctx.config``); ``reference`` the paper's numbers as rows, and
    ``reference_source`` the table or figure they come from; ``datasets``
    the logical dataset names it loads (what ``--data NAME=...`` may replace).
    """

    def decorate(fn: ExperimentFn) -> ExperimentFn:
        if id in _EXPERIMENTS:
            raise ValueError(f"experiment id {id!r} is registered twice")
        summary = (fn.__doc__ or "").strip().splitlines()[0] if fn.__doc__ else ""
        rows = tuple(dict(r) for r in reference)
        _EXPERIMENTS[id] = Experiment(
            id, fn, tuple(row_keys), summary, config, rows, reference_source, tuple(datasets)
        )
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
    device: str = "cpu",
    seed: int = 0,
    data: dict[str, str] | None = None,
    progress: bool = True,
    download: bool | None = None,
) -> dict[str, Any]:
    """Run experiment ``id`` and return its record (rows, extras, provenance).

    Overrides in ``$LEAKAGELIB_DATA`` apply first; ``data`` overrides them.
    ``download`` is :attr:`Context.download` (default: only at paper scale).
    """
    exp = get(id)
    overrides = {**env_data_overrides(), **(data or {})}
    ctx = Context(
        scale=scale,
        device=device,
        seed=seed,
        data=overrides,
        progress=progress,
        download=download,
        settings=exp.config,
    )
    torch.manual_seed(seed)
    start = time.perf_counter()
    out = exp.fn(ctx)
    wall = time.perf_counter() - start
    extras: dict[str, Any] = {}
    if isinstance(out, dict):
        extras = {k: v for k, v in out.items() if k != "rows"}
        rows = out.get("rows")
    else:
        rows = out
    if not isinstance(rows, list) or not rows:
        raise RuntimeError(f"experiment {id!r} returned no rows")
    for i, row in enumerate(rows):
        missing = [k for k in exp.row_keys if k not in row]
        if missing:
            raise RuntimeError(f"experiment {id!r}: row {i} lacks the keys {missing}")
    record: dict[str, Any] = {"experiment": id, "scale": scale, "rows": rows}
    notes = extras.pop("data", {})  # an experiment may say what it made of a dataset
    record.update(extras)
    resolved = {k: ctx.resolve(k) for k in sorted(set(STAND_INS) | set(overrides))}
    record["data"] = {**resolved, **notes}
    record["provenance"] = provenance(seed=seed, device=device, wall_seconds=wall)
    return record
