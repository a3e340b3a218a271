"""Noise defenses with tractable likelihoods: the mechanisms of the Bayes paper's Table 2.

Each perturbs a client update and hands out its matched likelihood, so the
Bayes attack is ``reconstruct(..., likelihood=defense.likelihood())``:

* :class:`GaussianNoise` — add N(0, σ²) to every entry (σ = 0.1 in Table 2;
  with clipping this is DP-SGD's mechanism);
* :class:`LaplaceNoise` — add Lap(0, b) to every entry (b = 0.1);
* :class:`PruneNoise` — "soft pruning": multiply by a random keep-mask
  (keep probability 0.5), fixed per layer for the defense's lifetime, then add
  Gaussian or Laplace noise (the authors' code draws the mask once per
  defense, eth-sri/bayes-framework-leakage, defenses/noise_defenses.py).

Shared per image (``share(..., per_image=True)``, a stacked update with one
slice per client), the noise is independent per slice and the prune mask is
shared, as for N clients of the same defended network. Used by the chapter
"Bayes versus heuristics under defenses".
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ..attacks.likelihoods import NOISES, Gaussian, Laplace, Pruned
from ..gradients import Update
from .base import UpdateMechanism, require

__all__ = ["GaussianNoise", "LaplaceNoise", "PruneNoise"]


def _check(update: Update) -> None:
    if not isinstance(update, dict) or not update:
        raise ValueError("a defense needs a non-empty update (dict of name → tensor)")
    for name, t in update.items():
        if not isinstance(t, Tensor) or not t.is_floating_point():
            raise ValueError(f"update[{name!r}] must be a floating-point tensor")


def _laplace(shape: torch.Size, scale: float, like: Tensor, gen: torch.Generator | None) -> Tensor:
    """Lap(0, scale) samples as the difference of two exponentials (seedable)."""
    u = torch.empty(shape, dtype=like.dtype).exponential_(generator=gen)
    v = torch.empty(shape, dtype=like.dtype).exponential_(generator=gen)
    return (scale * (u - v)).to(like.device)


def _gauss(shape: torch.Size, scale: float, like: Tensor, gen: torch.Generator | None) -> Tensor:
    return (scale * torch.randn(shape, generator=gen, dtype=like.dtype)).to(like.device)


class GaussianNoise(UpdateMechanism):
    """Add N(0, σ²) noise to every entry of the update; matched likelihood Gaussian(σ)."""

    def __init__(self, sigma: float = 0.1) -> None:
        self.sigma = require(
            "sigma",
            sigma,
            lambda v: v > 0,
            "a finite positive number (the noise's standard deviation)",
        )

    def perturb(
        self, update: Update, generator: torch.Generator | None = None, *, stacked: bool = False
    ) -> Update:
        _check(update)
        return {k: v + _gauss(v.shape, self.sigma, v, generator) for k, v in update.items()}

    def likelihood(self) -> Gaussian:
        return Gaussian(sigma=self.sigma)

    def describe(self) -> dict[str, Any]:
        return {"defense": "gaussian", "sigma": self.sigma}


class LaplaceNoise(UpdateMechanism):
    """Add Lap(0, b) noise to every entry of the update; matched likelihood Laplace(b)."""

    def __init__(self, b: float = 0.1) -> None:
        self.b = require("b", b, lambda v: v > 0, "a finite positive number (the Laplace scale)")

    def perturb(
        self, update: Update, generator: torch.Generator | None = None, *, stacked: bool = False
    ) -> Update:
        _check(update)
        return {k: v + _laplace(v.shape, self.b, v, generator) for k, v in update.items()}

    def likelihood(self) -> Laplace:
        return Laplace(b=self.b)

    def describe(self) -> dict[str, Any]:
        return {"defense": "laplacian", "b": self.b}


class PruneNoise(UpdateMechanism):
    """Zero a random half of the entries (a mask fixed per layer), then add noise.

    ``noise`` is ``"gaussian"`` (``scale`` = σ) or ``"laplace"`` (``scale`` =
    b); ``keep`` the probability an entry survives (0.5 in Table 2). The masks
    are drawn from ``mask_seed`` on the first share (they need the update's
    shapes) and reused afterwards. :meth:`likelihood` returns the
    :class:`~leakagelib.attacks.likelihoods.Pruned` likelihood with the mask
    known to the attacker (``attacker_knows_mask=True``, as in the authors'
    code), or else the mixture that marginalises an unknown mask.
    """

    def __init__(
        self,
        noise: str = "gaussian",
        scale: float = 0.1,
        keep: float = 0.5,
        mask_seed: int = 0,
        *,
        attacker_knows_mask: bool = True,
    ) -> None:
        if noise not in NOISES:
            raise ValueError(
                f"noise must be one of {NOISES} (the noise added after pruning), got {noise!r}"
            )
        self.noise = noise
        self.scale = require(
            "scale", scale, lambda v: v > 0, "a finite positive number (σ or b of the noise)"
        )
        self.keep = require(
            "keep", keep, lambda v: 0 < v <= 1, "in (0, 1] (the probability an entry survives)"
        )
        self.mask_seed = int(mask_seed)
        self.attacker_knows_mask = bool(attacker_knows_mask)
        self.masks: Update | None = None

    def _masks_for(self, update: Update, stacked: bool) -> Update:
        shapes = {k: (v.shape[1:] if stacked else v.shape) for k, v in update.items()}
        if self.masks is None:
            gen = torch.Generator().manual_seed(self.mask_seed)
            self.masks = {
                k: (torch.rand(s, generator=gen) < self.keep).float() for k, s in shapes.items()
            }
        if {k: m.shape for k, m in self.masks.items()} != shapes:
            raise ValueError(
                "this PruneNoise defense's masks were drawn for an update of other shapes"
            )
        return self.masks

    def perturb(
        self, update: Update, generator: torch.Generator | None = None, *, stacked: bool = False
    ) -> Update:
        """The pruned, noised update; every slice of a stacked update gets the same masks."""
        _check(update)
        masks = self._masks_for(update, stacked)
        sample = _gauss if self.noise == "gaussian" else _laplace
        return {
            k: v * masks[k].to(v) + sample(v.shape, self.scale, v, generator)
            for k, v in update.items()
        }

    def likelihood(self) -> Pruned:
        if self.attacker_knows_mask and self.masks is None:
            raise ValueError(
                "the prune mask is drawn on the first share(); share an update first, or build "
                "the defense with attacker_knows_mask=False for the mask-marginalising likelihood"
            )
        return Pruned(
            noise=self.noise,
            scale=self.scale,
            keep=self.keep,
            masks=dict(self.masks) if self.attacker_knows_mask else None,
        )

    def describe(self) -> dict[str, Any]:
        name = "prune+gauss" if self.noise == "gaussian" else "prune+lap"
        return {"defense": name, "scale": self.scale, "keep": self.keep}
