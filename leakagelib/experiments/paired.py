"""Paired comparisons over images: the statistic every chapter's claim is asserted with.

A chapter's claim compares two attacks (or one attack in two settings) on the
same images, so its evidence is the mean per-image difference with a Student-t
interval over the images (:func:`paired_interval`), and the claim holds when
the interval's ``low`` is above 0. The Bayes paper's claims
(:mod:`.bayes_claims`, :func:`.bayes_scenario.paired_gap`), the CVB paper's
(:mod:`.cvb_claims`) and R-GAP's Appendix G (:func:`.rgap_batch_noise.wider_gap`)
all use it, as do the chapters that glue the intervals they state.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

__all__ = [
    "CLAIM_SEEDS",
    "CLAIM_SEEDS_TEXT",
    "PairedGap",
    "crossed_interval",
    "mean_interval",
    "paired_interval",
]

#: The seeds besides the book's ``SEED = 0`` on which the tests check the chapters' claims
#: again, so that each claim holds on three seeds: ``tests/test_chapter_seeds.py`` runs whole
#: chapters with them, ``tests/test_bayes_claims.py`` and ``tests/test_cvb_claims.py`` the
#: claims that live in :mod:`.bayes_claims` and :mod:`.cvb_claims`. The chapters glue them
#: where their prose says so.
CLAIM_SEEDS: tuple[int, ...] = (1, 2)
#: :data:`CLAIM_SEEDS` as the chapters' prose reads them ("1 and 2"), glued as ``claim_seeds``.
CLAIM_SEEDS_TEXT = " and ".join(map(str, CLAIM_SEEDS))


@dataclass(frozen=True)
class PairedGap:
    """A mean over images and its two-sided Student-t interval at ``confidence`` (a fraction:
    chapters glue it rather than type the level): of the per-image differences ``a − b`` from
    :func:`paired_interval`, of one value per image from :func:`mean_interval`."""

    mean: float
    low: float
    high: float
    n: int
    confidence: float

    def __format__(self, spec: str) -> str:
        """``f"{gap:+.2f}"`` → ``"+0.77 (+0.47 to +1.07)"``: the mean and the interval, each
        number in ``spec``, as the chapters state them (an empty ``spec``: the repr)."""
        if not spec:
            return repr(self)
        return f"{self.mean:{spec}} ({self.low:{spec}} to {self.high:{spec}})"


def paired_interval(a: Sequence[float], b: Sequence[float], confidence: float = 0.95) -> PairedGap:
    """The mean per-image difference ``a − b`` with its ``confidence`` interval (Student's t).

    ``a`` and ``b`` are one value per image (PSNRs of two attacks, or of one
    attack in two settings, on the same images), so the interval is that of
    a paired comparison. The chapters assert their claims as
    ``paired_interval(...).low > 0``.
    """
    if len(a) != len(b):
        raise ValueError(
            "a and b must be equally long lists of at least two values (one per image), "
            f"got lengths {len(a)} and {len(b)}"
        )
    return mean_interval(np.asarray(a, dtype=float) - np.asarray(b, dtype=float), confidence)


def mean_interval(values: Sequence[float], confidence: float = 0.95) -> PairedGap:
    """The mean of one value per image with its ``confidence`` interval (Student's t).

    A paired comparison is this interval of the differences; a record's mean
    PSNR is this interval of its images' PSNRs, which the chapters set beside
    the paper's number.
    """
    x = np.asarray(values, dtype=float)
    if x.ndim != 1 or len(x) < 2:
        raise ValueError(f"need a list of at least two values (one per image), got shape {x.shape}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), e.g. 0.95, got {confidence}")
    n, mean = len(x), float(x.mean())
    half = float(stats.t.ppf(0.5 + confidence / 2, n - 1) * x.std(ddof=1) / math.sqrt(n))
    return PairedGap(mean, mean - half, mean + half, n, confidence)


def crossed_interval(values: Sequence[Sequence[float]], confidence: float = 0.95) -> PairedGap:
    """The mean of ``values[s][i]``, network ``s`` on image ``i``, with an interval that counts
    both samples: other networks (seeds) and other images would each give another mean.

    :func:`mean_interval` over one network's images leaves out the networks' spread; the
    seeds' means alone leave out the images', which all seeds share. This is the two-way
    random-effects model y = μ + a_s + b_i + e (networks and images crossed, one value per
    pair; Searle, Casella and McCulloch, *Variance Components*, 1992, §4): the grand mean's
    variance σ_a²/k + σ_b²/n + σ_e²/(kn) from the ANOVA mean squares, each component
    truncated at zero, and a Student-t interval with Satterthwaite's degrees of freedom. With
    the same values for every network it is :func:`mean_interval` of one network's. The
    chapter "Bayes versus heuristics under defenses" sets the ``bayes/table2-pool`` record's
    networks beside the paper's cells with it (:func:`.bayes_pool_claims.pool_cells`).
    ``n`` of the result is the number of images.
    """
    y = np.asarray(values, dtype=float)
    if y.ndim != 2 or min(y.shape) < 2:
        raise ValueError(
            f"need one row per network and one column per image, at least 2 × 2, got shape {y.shape}"
        )
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), e.g. 0.95, got {confidence}")
    k, n = y.shape
    grand, nets, images = float(y.mean()), y.mean(axis=1), y.mean(axis=0)
    squares = np.array([
        n * nets.var(ddof=1),  # networks, k - 1 degrees of freedom
        k * images.var(ddof=1),  # images, n - 1
        ((y - nets[:, None] - images[None, :] + grand) ** 2).sum() / ((k - 1) * (n - 1)),
    ])  # fmt: skip
    freedom = np.array([k - 1, n - 1, (k - 1) * (n - 1)])
    kept = squares[:2] > squares[2]  # a component whose estimate is positive
    weights = np.append(kept, 1.0 - kept.sum()) / (k * n)
    variance = float(weights @ squares)
    df = variance**2 / float(((weights * squares) ** 2 / freedom).sum()) if variance > 0 else 1.0
    half = float(stats.t.ppf(0.5 + confidence / 2, df) * math.sqrt(variance))
    return PairedGap(grand, grand - half, grand + half, n, confidence)
