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

__all__ = ["CLAIM_SEEDS", "CLAIM_SEEDS_TEXT", "PairedGap", "mean_interval", "paired_interval"]

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
