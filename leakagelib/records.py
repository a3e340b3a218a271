"""Experiment records: provenance, atomic JSON writing and validated reading.

A record is ``{"experiment": ID, "scale": "ci"|"paper", "rows": [...],
"provenance": {...}}`` plus any extra series an experiment returns (see
:mod:`leakagelib.experiments.registry`). Paper-scale records live in
``results/``, which ships with the library; the chapters read them with
:func:`paper_record` from :func:`default_results_dir`.
"""

from __future__ import annotations

import json
import math
import os
import platform
import subprocess
import tempfile
from pathlib import Path
from typing import Any

REQUIRED_KEYS = ("experiment", "scale", "rows", "provenance")


def _git_commit(where: Path | None = None) -> str | None:
    """The commit checked out at ``where`` (the library's folder), with ``+dirty`` when a tracked
    file under it differs from that commit: a record made so ran code the commit does not hold."""
    here = where or Path(__file__).resolve().parent

    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(
                ["git", *args], cwd=here, capture_output=True, text=True, timeout=5
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    head = git("rev-parse", "HEAD")
    if not head:
        return None
    changed = git("status", "--porcelain", "--untracked-files=no", "--", ".")
    return head + "+dirty" if changed else head


#: The commit checked out when the library was imported: the code a run executes. Read once, so
#: that a long run's record does not name a commit checked out while it ran.
IMPORTED_COMMIT = _git_commit()


def _device_name(device: str) -> str:
    import torch

    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.device(device))
    return platform.processor() or platform.machine()


def provenance(*, seed: int, device: str, wall_seconds: float) -> dict[str, Any]:
    """Where and how a record was made: commit, versions, device, seed, wall time, and what
    the attacked update is (:data:`leakagelib.gradients.CLIENT_UPDATE`).

    The commit is :data:`IMPORTED_COMMIT`, the one whose code ran, not the one checked out when
    the record is written (a paper-scale run can outlast several commits).
    """
    import numpy
    import torch

    from . import __version__
    from .gradients import CLIENT_UPDATE

    return {
        "commit": IMPORTED_COMMIT,
        "leakagelib": __version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": numpy.__version__,
        "device": device,
        "device_name": _device_name(device),
        "seed": seed,
        "wall_seconds": round(wall_seconds, 3),
        "client_update": CLIENT_UPDATE,
    }


def image_lists(images: Any) -> list:
    """Images (a tensor) clamped to [0, 1] as nested lists rounded to 4 decimals, for a record.

    The figures a record keeps (the Bayes paper's Figs. 3 and 6, the CVB paper's Figs. 10 and
    12) hold their originals and reconstructions this way.
    """
    return images.detach().cpu().double().clamp(0, 1).mul(1e4).round().div(1e4).tolist()


def pictures(originals: Any, reconstructions: Any, n: int) -> dict[str, list]:
    """The first ``n`` originals and their reconstructions (tensors in [0, 1]) as a record row
    keeps them (:func:`image_lists`), for a chapter's grid (:func:`leakagelib.viz.show_pictures`):
    the rows of the CVB tables, of R-GAP's tables and appendices, and of the Bayes paper's
    Table 5 and Figure 7."""
    return {
        "original": image_lists(originals[:n]),
        "reconstruction": image_lists(reconstructions[:n]),
    }


def run_seconds(prov: dict[str, Any]) -> float:
    """A record's run time: its units' summed seconds if it was resumed, else its wall time.

    A resumed record's ``wall_seconds`` counts only the last process; its
    ``unit_seconds`` (:meth:`leakagelib.experiments.resume.PartialRecord.provenance`)
    counts every unit. NaN when the record says neither. The command line and
    the reproduction index show it.
    """
    key = "unit_seconds" if prov.get("resumed") else "wall_seconds"
    value = prov.get(key)
    return float(value) if isinstance(value, (int, float)) else math.nan


def made_by(prov: dict[str, Any]) -> list[str]:
    """The commits whose code made a record: its units' (when it lists them) or its own."""
    units = [u.get("commit") for u in prov.get("units", [])]
    found = sorted({c for c in units if c}) or [prov.get("commit")]
    return [str(c) for c in found if c]


def predates_kl_update(record: dict[str, Any] | None) -> bool:
    """Whether a finished record was made before the client's update held β·KL (2026-11-27).

    Such a record's provenance lacks ``client_update``
    (:data:`leakagelib.gradients.CLIENT_UPDATE`): its attacks read the
    cross-entropy's gradient alone, which differs from today's update only
    for a model with a variational bottleneck. ``False`` for no record or a
    pending one (whose rows come without provenance). The chapters
    "Variational bottlenecks" and "CVB against attacks and architectures" say
    so beside such a record.
    """
    prov = (record or {}).get("provenance")
    return prov is not None and "client_update" not in prov


def _jsonable(value: Any) -> Any:
    """Turn tensors, numpy scalars and non-finite floats into plain JSON values."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if hasattr(value, "tolist"):  # torch.Tensor, numpy array or scalar
        return _jsonable(value.tolist())
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return value


def jsonable(value: Any) -> Any:
    """``value`` as plain JSON data: tensors and numpy values as lists and numbers, ±inf as text.

    What a record holds after :func:`write_record` and :func:`read_record`;
    partial records (:mod:`leakagelib.experiments.resume`) keep their rows
    in this form so that a resumed run equals an uninterrupted one.
    """
    return json.loads(json.dumps(_jsonable(value), allow_nan=False))


def write_json_atomically(value: Any, path: str | os.PathLike) -> Path:
    """Write ``value`` as JSON to ``path`` atomically (:func:`write_text_atomically`)."""
    return write_text_atomically(
        json.dumps(_jsonable(value), indent=1, allow_nan=False) + "\n", path
    )


def write_text_atomically(text: str, path: str | os.PathLike) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically (temporary file, fsync, then rename).

    An interrupted write never leaves a half-written file behind, and an
    existing file is only replaced by a complete new one; a reader meanwhile
    sees the old file or the new one (``tools/install_cells.py`` rewrites
    chapters while ``make test``'s unit tests read them). The file gets the
    permissions an ordinary new file would (``mkstemp`` alone makes it private).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_record(record: dict[str, Any], path: str | os.PathLike) -> Path:
    """Write ``record`` as JSON to ``path`` atomically (see :func:`write_json_atomically`)."""
    missing = [k for k in REQUIRED_KEYS if k not in record]
    if missing:
        raise ValueError(f"record lacks the keys {missing}")
    return write_json_atomically(record, path)


def read_record(path: str | os.PathLike) -> dict[str, Any]:
    """Read a record written by :func:`write_record`, checking its shape."""
    path = Path(path)
    try:
        record = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is not a valid JSON record: {err}") from err
    if not isinstance(record, dict):
        raise ValueError(f"{path} is not a record: expected a JSON object")
    missing = [k for k in REQUIRED_KEYS if k not in record]
    if missing:
        raise ValueError(f"{path} is not a record: it lacks the keys {missing}")
    if not isinstance(record["rows"], list) or not all(isinstance(r, dict) for r in record["rows"]):
        raise ValueError(f"{path} is not a record: 'rows' must be a list of objects")
    return record


#: The paper-scale records inside an installed library: ``results/`` ships as the package data
#: ``leakagelib.results`` (``pyproject.toml``), so a non-editable install, Colab's included, has them.
PACKAGED_RESULTS = Path(__file__).resolve().parent / "results"

#: The repository root when this module runs from a checkout (an editable install).
_CHECKOUT = Path(__file__).resolve().parents[1]


def default_results_dir() -> Path:
    """The folder of paper-scale records that the chapters and :func:`paper_record` read.

    In an installed library (``pip install``, also from git on Colab) that is
    the copy of ``results/`` shipped inside it (:data:`PACKAGED_RESULTS`); in
    a checkout, where the library is imported from the source tree, the
    repository's own ``results/``, so a record just written there shows at
    once. Every chapter reads records through this one function (via
    :func:`paper_record` and :func:`leakagelib.reporting.compare`), never by a
    path of its own.
    """
    if PACKAGED_RESULTS.is_dir():
        return PACKAGED_RESULTS
    if (_CHECKOUT / "pyproject.toml").is_file():
        return _CHECKOUT / "results"
    return PACKAGED_RESULTS


def record_filename(experiment_id: str) -> str:
    """``"bayes/table2"`` → ``"bayes-table2.json"``: the name of its record in ``results/``."""
    return experiment_id.replace("/", "-") + ".json"


def paper_record(experiment_id: str, results_dir: str | os.PathLike | None = None) -> dict | None:
    """The paper-scale record of ``experiment_id``, or ``None`` if there is none.

    Read from ``results_dir``, by default :func:`default_results_dir`.
    Chapters show it beside the paper's numbers and their own ci-scale run; a
    record that exists but is malformed raises (see :func:`read_record`).
    """
    path = Path(results_dir or default_results_dir()) / record_filename(experiment_id)
    return read_record(path) if path.exists() else None
