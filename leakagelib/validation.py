"""Argument checks shared across the library: counts and finite numbers, named in the message.

Issue 11's reliability work: a bad hyper-parameter (``steps=2.5``, ``lr=nan``) fails at the call,
naming the argument, what it means and what it got, before any work, rather than deep inside
torch. Used by the attack configuration (:mod:`leakagelib.attacks.config`), local training
(:func:`leakagelib.gradients.local_update`, :func:`leakagelib.fl.train`) and the synthetic
Bayes-risk setting (:mod:`leakagelib.bayes_risk`).
"""

from __future__ import annotations

import math
from numbers import Integral, Real

__all__ = ["require_count", "require_number"]


def require_count(name: str, value: object, meaning: str, *, low: int = 1) -> None:
    """``value`` must be an integer >= ``low`` (not a bool, not 2.5)."""
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise TypeError(f"{name} must be an integer >= {low} ({meaning}), got {value!r}")
    if value < low:
        raise ValueError(f"{name} must be an integer >= {low} ({meaning}), got {value!r}")


def require_number(name: str, value: object, meaning: str, *, low: float, low_open: bool) -> None:
    """``value`` must be a finite real number above ``low`` (strictly when ``low_open``)."""
    bound = f"> {low:g}" if low_open else f">= {low:g}"
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"{name} must be a finite number {bound} ({meaning}), got {value!r}")
    if not math.isfinite(value) or value < low or (low_open and value == low):
        raise ValueError(f"{name} must be a finite number {bound} ({meaning}), got {value!r}")
