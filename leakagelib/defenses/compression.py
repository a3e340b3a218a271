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
chapters attack it with the cosine likelihood. Shared per image, every
client prunes its own update. Used by ``cvb/table4-defenses`` and the chapter
"Variational bottlenecks".
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from ..gradients import Update
from .base import UpdateMechanism, require

if TYPE_CHECKING:
    from ..attacks.likelihoods import Likelihood

__all__ = ["GradientCompression", "prune_smallest"]

_RATE = "in [0, 1] (the share of each tensor's entries set to zero)"


def prune_smallest(tensor: torch.Tensor, rate: float, *, stacked: bool = False) -> torch.Tensor:
    """A copy of ``tensor`` with its ``round(rate · numel)`` smallest-magnitude entries set to 0.

    ``stacked=True``: every slice along the leading dimension is pruned on its
    own (``round(rate · numel)`` of the slice's entries), in one vectorised call.
    """
    rate = require("rate", rate, lambda v: 0 <= v <= 1, _RATE)
    rows = tensor.reshape(tensor.shape[0] if stacked else 1, -1)
    k = round(rate * rows.shape[1])
    if k == 0:
        return tensor.clone()
    order = torch.argsort(rows.abs(), dim=1, stable=True)
    out = rows.clone()
    out.scatter_(1, order[:, :k], 0)
    return out.reshape(tensor.shape)


class GradientCompression(UpdateMechanism):
    """Per-layer magnitude pruning at rate ``rate`` (share of entries zeroed in each tensor)."""

    def __init__(self, rate: float) -> None:
        self.rate = require("rate", rate, lambda v: 0 <= v <= 1, _RATE)

    def perturb(
        self, update: Update, generator: torch.Generator | None = None, *, stacked: bool = False
    ) -> Update:
        """Prune every tensor (every client's slice of it when ``stacked``); deterministic."""
        return {k: prune_smallest(g, self.rate, stacked=stacked) for k, g in update.items()}

    def likelihood(self) -> Likelihood:
        raise NotImplementedError(
            "gradient compression keeps the largest entries of the unknown gradient, so p(g|x) "
            "has no tractable form; attack it with the cosine likelihood instead"
        )

    def describe(self) -> dict[str, Any]:
        return {"defense": "compression", "rate": self.rate}
