"""Gradient compression: prune each layer's smallest-magnitude gradient entries to zero.

For every parameter tensor separately, the share ``p`` (the pruning rate) of
entries with the smallest absolute value is set to zero; the rest are sent
unchanged (Zhu et al. 2019, §5; Huang et al. 2021, whose protocol the CVB paper
follows, §VI-C). The reference implementations prune the entries below the
``p``-th percentile of ``|g|`` (e.g. the Soteria code's ``prune`` defense,
jeremy313/Soteria, GS_attack/reconstruct_image.py); here the count is exact —
``round(p · n)`` entries per tensor, ties broken by position — so the share is
the same for every tensor whatever its values.

Its likelihood is intractable for the attacker (which entries survive depends
on the unknown gradient), so :meth:`GradientCompression.likelihood` raises; the
chapters attack it with the cosine likelihood. Used by ``cvb/table4-defenses``.
"""

from __future__ import annotations

from typing import Any

import torch

from ..gradients import Update
from .base import GradientDefense

__all__ = ["GradientCompression", "prune_smallest"]


def prune_smallest(tensor: torch.Tensor, rate: float) -> torch.Tensor:
    """A copy of ``tensor`` with its ``round(rate · numel)`` smallest-magnitude entries set to 0."""
    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"the pruning rate must be in [0, 1], got {rate}")
    flat = tensor.reshape(-1)
    k = round(rate * flat.numel())
    if k == 0:
        return tensor.clone()
    order = torch.argsort(flat.abs(), stable=True)
    out = flat.clone()
    out[order[:k]] = 0
    return out.reshape(tensor.shape)


class GradientCompression(GradientDefense):
    """Per-layer magnitude pruning at rate ``rate`` (share of entries zeroed in each tensor)."""

    def __init__(self, rate: float) -> None:
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"the pruning rate must be in [0, 1], got {rate}")
        self.rate = float(rate)

    def apply(self, update: Update, generator: torch.Generator | None = None) -> Update:
        """Prune every tensor of ``update``; deterministic, so ``generator`` is unused."""
        return {k: prune_smallest(g, self.rate) for k, g in update.items()}

    def likelihood(self):  # noqa: ANN201 - the base class documents the return type
        raise NotImplementedError(
            "gradient compression keeps the largest entries of the unknown gradient, so p(g|x) "
            "has no tractable form; attack it with the cosine likelihood instead"
        )

    def describe(self) -> dict[str, Any]:
        return {"defense": "compression", "rate": self.rate}
