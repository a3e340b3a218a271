"""Whether a paper-scale record reproduces the paper's numbers: a verdict per value and per record.

The reproduction index (``book/reproduction.md``, built by ``book/_ext/reproduction.py``) says of
every record whether it reproduces the paper, computed here from the record's own spread, never
typed. A number of the paper counts as reproduced when it lies inside the record's 95 %
confidence interval for the same quantity:

* a mean over images (SSIM, PSNR, MSE): the mean ± 1.96 standard errors, from the record's
  per-image values (``psnr_per_image``) where it keeps them, else from its standard deviation
  (``ssim_std``) and the number of images behind the row (``n`` in the row, or the experiment's
  ``victims``);
* a share of images (the attack success rate ``asr``, a ``*_recovered`` share): a Wilson
  interval;
* a count (parameters, RA-i): equality with the paper's count (not with a number the paper
  rounds, such as an RA-i to two significant figures);
* a bound the paper states as text ("> 150"): the whole interval on its side; a paper row
  whose row names are all :data:`EVERY_IMAGE` ("every image", as ``bayes/precode-mlp``'s
  "> 150 dB on every image") states the bound of each image, and is judged against every
  record row, each row's value on its own.

A number the paper prints rounded stands for every value that rounds to it: the paper's SSIM
"0.00" for anything in [−0.005, 0.005]. The paper's values of a column are printed to one
precision, so :func:`judge` takes half a unit of the last decimal the column's values show
(:func:`rounding`) as the paper's own width, and a value agrees when that width and the
record's interval overlap. The paper's own sampling error is not counted, so the test is
strict: over many images a record close to the paper can still fall outside. A value with no
interval (an accuracy, a condition number, a time) is shown beside the paper's but not judged.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "EVERY_IMAGE",
    "Judgement",
    "images_per_row",
    "interval",
    "judge",
    "rounding",
    "setting_used",
    "sides",
    "verdict",
    "victims_per_row",
]

#: What a paper row names instead of a row when its bound holds for each image of the record.
EVERY_IMAGE = "every image"

#: The two-sided 95 % normal quantile.
Z95 = 1.959963984540054
_BOUND = re.compile(r"^\s*([<>])\s*([-+0-9.eE]+)\s*$")


@dataclass(frozen=True)
class Judgement:
    """One number of the paper against the record's: the row, the column and the verdict."""

    row: tuple[tuple[str, Any], ...]
    column: str
    paper: Any
    record: float
    low: float
    high: float
    agrees: bool
    #: The paper's rounding (:func:`rounding`) the judgement allowed the paper's number.
    width: float = 0.0

    @property
    def side(self) -> str:
        """Where the record lies against the paper: ``"inside"`` (the verdict agrees), else
        ``"below"`` or ``"above"`` the paper's number (its mean does; for a share or an SSIM,
        "below" is a weaker attack; ``"outside"`` a bound such as "> 150" that the record
        misses). Chapters group their records' rows by it."""
        if self.agrees:
            return "inside"
        if isinstance(self.paper, bool) or not isinstance(self.paper, (int, float)):
            return "outside"
        return "below" if self.record < self.paper else "above"

    def __str__(self) -> str:
        where = ", ".join(f"{k} {v}" for k, v in self.row)
        if self.low == self.high:  # a count
            span = f"{self.low:.0f}" if self.low.is_integer() else f"{self.low:.4g}"
        else:
            span = f"[{self.low:.4g}, {self.high:.4g}]"
        word = "inside" if self.agrees else "outside"
        strictly = not isinstance(self.paper, float) or self.low <= self.paper <= self.high
        rounded = "" if strictly or not self.agrees else f" (within its rounding, ±{self.width:g})"
        return f"{where}: {self.column}, paper {self.paper} {word} the record's {span}{rounded}"


def _per_image(row: Mapping[str, Any], column: str) -> list[Any] | None:
    """The per-image values behind ``row[column]``: ``psnr_per_image`` for ``psnr``, and
    ``psnr_per_image_tv`` for ``psnr_tv`` (Table 5's naming), where the row keeps them."""
    parts = column.split("_")
    names = [f"{column}_per_image"] + [
        "_".join(parts[:i]) + "_per_image_" + "_".join(parts[i:]) for i in range(1, len(parts))
    ]
    found = [row[name] for name in names if isinstance(row.get(name), list)]
    return found[0] if found else None


def _is_share(column: str) -> bool:
    return column == "asr" or column.endswith("_recovered")


def interval(row: Mapping[str, Any], column: str, n: int | None) -> tuple[float, float] | None:
    """The record's 95 % interval for ``row[column]``, or ``None`` when the row cannot give one.

    ``n`` is the number of images behind the row when the row does not say (its ``n``).
    """
    value = row.get(column)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    if isinstance(value, int):
        return float(value), float(value)
    per_image = _per_image(row, column)
    if per_image is not None and len(per_image) > 1:
        values = [float(v) for v in per_image]  # ±inf arrive as text ("inf")
        if not all(map(math.isfinite, values)):
            return None
        mean = sum(values) / len(values)
        sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
        half = Z95 * sd / math.sqrt(len(values))
        return mean - half, mean + half
    n = row.get("n", n)
    if not isinstance(n, int) or n < 2:
        return None
    if _is_share(column) and 0 <= value <= 1:
        return _wilson(value, n)
    std = row.get(f"{column}_std")
    if isinstance(std, (int, float)) and math.isfinite(std):
        half = Z95 * std / math.sqrt(n)
        return value - half, value + half
    return None


def _wilson(share: float, n: int) -> tuple[float, float]:
    """The Wilson 95 % interval of a share observed on ``n`` images."""
    z2 = Z95 * Z95
    centre = (share + z2 / (2 * n)) / (1 + z2 / n)
    half = Z95 * math.sqrt(share * (1 - share) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def rounding(values: Sequence[Any]) -> float:
    """Half a unit of the last decimal that any of a column's ``values`` (the paper's) shows:
    the paper prints a column to one precision, and a float keeps no trailing zeros, so the
    column's longest decimal part gives it (0.76, 0.0 and 0.32: 0.005). 0 for counts (ints) and
    for a column without a printed decimal."""
    places = []
    for value in values:
        if isinstance(value, float) and math.isfinite(value):
            digits = f"{value:.10f}".rstrip("0").split(".")[1]
            places.append(len(digits))
    return 0.5 * 10.0 ** -max(places) if places and max(places) else 0.0


def _agrees(paper: Any, record: Any, low: float, high: float, width: float = 0.0) -> bool | None:
    """Whether the paper's value (a number, or a bound such as "> 150") fits the interval, the
    number widened by its rounding ``width``; ``None`` where it cannot be judged (a count
    against a rounded number of the paper's)."""
    if isinstance(paper, bool) or (isinstance(record, int) and not isinstance(paper, (int, str))):
        return None
    if isinstance(paper, int):
        return low <= paper <= high
    if isinstance(paper, float):
        return low - width <= paper <= high + width if math.isfinite(paper) else None
    bound = _BOUND.match(paper) if isinstance(paper, str) else None
    if bound is None:
        return None
    side, limit = bound.group(1), float(bound.group(2))
    return low > limit if side == ">" else high < limit


def judge(
    paper_rows: Sequence[Mapping[str, Any]],
    record_rows: Sequence[Mapping[str, Any]],
    on: Sequence[str],
    columns: Sequence[str],
    n: int | None = None,
) -> list[Judgement]:
    """Every value of ``columns`` that a paper row and the record row with the same ``on``
    values both hold, judged where the record gives an interval (:func:`interval`), the
    paper's number widened by the column's :func:`rounding`; a paper row of
    :data:`EVERY_IMAGE` is judged against each record row."""
    by_key = {tuple(r.get(k) for k in on): r for r in record_rows}
    width = {c: rounding([p.get(c) for p in paper_rows]) for c in columns}
    found = []
    for paper in paper_rows:
        key = tuple(paper.get(k) for k in on)
        every = bool(key) and all(k == EVERY_IMAGE for k in key)
        rows = record_rows if every else [by_key[key]] if key in by_key else []
        for row in rows:
            for column in columns:
                span = _each(row, column, paper.get(column)) if every else interval(row, column, n)
                agrees = (
                    _agrees(paper.get(column), row[column], *span, width[column]) if span else None
                )
                if agrees is not None:
                    where = tuple(zip(on, (row.get(k) for k in on), strict=True))
                    value = float(row[column])
                    found.append(
                        Judgement(where, column, paper[column], value, *span, agrees, width[column])
                    )
    return found


def _each(row: Mapping[str, Any], column: str, paper: Any) -> tuple[float, float] | None:
    """One image's own value as its "interval", where the paper states a bound of every image
    (a number of the paper's is not about each image, and is not judged so)."""
    value = row.get(column)
    if not (isinstance(paper, str) and _BOUND.match(paper)):
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value), float(value)


def setting_used(exp: Any, record: Mapping[str, Any], name: str) -> Any:
    """The value of setting ``name`` that a record's run used: the one it changed
    (``reproduce --set``, which the record keeps in ``settings_changed``), else the
    experiment's registered value at the record's scale (``None`` where it has no such
    setting). Chapter "CVB against attacks and architectures" reads which iterate its
    Table III record returned (``best_iterate``)."""
    changed = record.get("settings_changed", {}).get(name)
    if changed is not None:
        return changed["used"]
    return exp.config.at(record.get("scale", "paper")).get(name)


def images_per_row(exp: Any, record: Mapping[str, Any]) -> int | None:
    """How many images stand behind a record row that does not say (its ``n``): the
    ``victims`` its run used (:func:`setting_used`). The ``n`` that :func:`judge` needs, for
    the reproduction index and for a chapter that judges a record in its text
    (``variational_bottlenecks``)."""
    return setting_used(exp, record, "victims")


def sides(judgements: Sequence[Judgement], name: Callable[[dict[str, Any]], str]) -> dict[str, str]:
    """The judged rows grouped by :attr:`Judgement.side` (``inside``, ``below``, ``above``,
    ``outside``), each group the rows' names (``name`` of the row's ``on`` values as a dict)
    joined by commas, or "none": what a chapter says of its record beside the paper
    ("CVB against attacks and architectures", "CVB against DP-SGD and gradient compression")."""
    grouped: dict[str, list[str]] = {"inside": [], "below": [], "above": [], "outside": []}
    for j in judgements:
        grouped[j.side].append(name(dict(j.row)))
    return {side: ", ".join(names) or "none" for side, names in grouped.items()}


def agreement(
    paper_rows: Sequence[Mapping[str, Any]],
    record_rows: Sequence[Mapping[str, Any]],
    on: Sequence[str],
    columns: Mapping[str, str],
    name: Callable[[dict[str, Any]], str],
    n: int | None = None,
) -> list[str]:
    """One clause per column of ``columns`` (column → its name in words) that the record can be
    judged on (:func:`judge`): "its SSIM agrees with the paper's (to the 95 % interval) for …,
    is lower for … and higher for …", the rows named by ``name`` (:func:`sides`), and the rows
    that miss a bound of the paper's where there are any. What the chapters "CVB against
    attacks and architectures" (Table VI) and "CVB against DP-SGD and gradient compression"
    (Table IV) say of a paper-scale record beside the paper."""
    said = []
    for column, what in columns.items():
        judged = judge(paper_rows, record_rows, on, (column,), n)
        if not judged:
            continue
        listed = sides(judged, name)
        clause = (
            f"its {what} agrees with the paper's (to the 95 % interval) for {listed['inside']}, "
            f"is lower for {listed['below']} and higher for {listed['above']}"
        )
        if listed["outside"] != "none":
            clause += f", and misses the paper's bound for {listed['outside']}"
        said.append(clause)
    return said


def victims_per_row(
    rows: Sequence[Mapping[str, Any]], n: int | None, dataset: Callable[[str], str]
) -> str:
    """ "128 victims per row", or "victims per row: 128 on MNIST, 32 on CIFAR-10" where a
    record's rows say their own ``n`` (:func:`leakagelib.experiments.cvb_data.victim_fields`);
    ``n`` is :func:`images_per_row`'s, ``dataset`` names a row's ``dataset``."""
    counts = {dataset(r["dataset"]): r.get("n", n) for r in rows}
    if set(counts.values()) <= {n}:
        return f"{n} victims per row"
    return "victims per row: " + ", ".join(f"{k} on {d}" for d, k in counts.items())


def verdict(judgements: Sequence[Judgement]) -> str:
    """A record's verdict: "reproduced", "diverges" (with how many values), or "not judged"."""
    if not judgements:
        return "not judged (no value of the paper's with an interval in the record)"
    outside = sum(not j.agrees for j in judgements)
    if not outside:
        return f"reproduced ({len(judgements)} of {len(judgements)} values inside)"
    return f"diverges ({outside} of {len(judgements)} values outside)"
