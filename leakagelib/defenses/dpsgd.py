"""DP-SGD: per-sample clipping, Gaussian noise, and the (ε, δ) it spends.

Abadi et al. (2016): every per-sample gradient ``g_i`` is clipped to norm at
most ``C`` (over all parameters together), the clipped gradients are summed,
Gaussian noise ``N(0, (σC)² I)`` is added (σ the *noise multiplier*) and the sum
is divided by the batch size ``B``:

    g̃ = ( Σ_i g_i · min(1, C / ‖g_i‖) + N(0, σ²C² I) ) / B.

The privacy it spends over ``T`` steps with sampling rate ``q`` is computed
with Opacus's Rényi-DP accountant, as the CVB paper does (§VI-C, "Opacus'
implementation of DPSGD"; the clipping threshold and the noise multipliers
of its Table IV are set by the experiment, not here).

Used by the chapter "Variational bottlenecks" (Table IV, Fig. 11) and by the
experiment ``cvb/table4-defenses``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from opacus.accountants import RDPAccountant
from torch import Tensor, nn

from ..attacks.likelihoods import LayerSelection, Likelihood
from ..gradients import Update, per_sample_updates
from .base import GradientDefense

__all__ = ["DPSGD", "ClippedGaussian", "clip_per_sample", "epsilon_spent"]


def clip_per_sample(updates: Update, max_grad_norm: float) -> Update:
    """Scale each sample's gradient (leading dim N) to global norm at most ``max_grad_norm``.

    The norm is taken over all parameter tensors of one sample together
    (Opacus's "flat" clipping); the factor is ``min(1, C / ‖g_i‖)``.
    """
    if not max_grad_norm > 0:
        raise ValueError(f"max_grad_norm must be positive, got {max_grad_norm}")
    n = _batch_size(updates)
    sq = sum(g.reshape(n, -1).pow(2).sum(dim=1) for g in updates.values())
    factor = (max_grad_norm / (sq.sqrt() + 1e-12)).clamp(max=1.0)
    return {k: g * factor.reshape(n, *([1] * (g.dim() - 1))) for k, g in updates.items()}


def _batch_size(updates: Update) -> int:
    if not updates:
        raise ValueError("the per-sample update is empty")
    sizes = {g.shape[0] if g.dim() > 0 else None for g in updates.values()}
    if len(sizes) != 1 or None in sizes:
        raise ValueError(
            "DP-SGD needs per-sample updates: every tensor with the same leading sample "
            f"dimension (from leakagelib.gradients.per_sample_updates); got leading sizes {sizes}"
        )
    return int(next(iter(sizes)))


def epsilon_spent(noise_multiplier: float, sample_rate: float, steps: int, delta: float) -> float:
    """ε of ``steps`` DP-SGD steps at ``noise_multiplier`` and ``sample_rate``, for ``delta``.

    Opacus's RDP accountant (Mironov 2017; the subsampled Gaussian mechanism).
    ``inf`` for a noise multiplier of 0 (no privacy).
    """
    if noise_multiplier < 0:
        raise ValueError(f"noise_multiplier must be non-negative, got {noise_multiplier}")
    if not 0 < sample_rate <= 1:
        raise ValueError(f"sample_rate must be in (0, 1], got {sample_rate}")
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    if steps < 0:
        raise ValueError(f"steps must be non-negative, got {steps}")
    if steps == 0:
        return 0.0
    if noise_multiplier == 0:
        return float("inf")
    accountant = RDPAccountant()
    accountant.history = [(float(noise_multiplier), float(sample_rate), int(steps))]
    return float(accountant.get_epsilon(delta=delta))


@dataclass(frozen=True)
class ClippedGaussian(Likelihood):
    """The likelihood of one DP-SGD step on one image: ``g ~ N(clip_C(s), σ_g²)``.

    The attacker clips its simulated gradient ``s`` the way the client does,
    then compares it with the Gaussian density of the noise, ``σ_g = σC / B``.
    It is DP-SGD's exact p(g | x) for a batch of one (the Bayes-optimal attack
    of the Bayes paper, §4, against this mechanism).
    """

    sigma: float = 1.0
    max_grad_norm: float = 1.0
    layers: LayerSelection = field(default_factory=LayerSelection)

    def __post_init__(self) -> None:
        if not self.sigma > 0 or not self.max_grad_norm > 0:
            raise ValueError("sigma and max_grad_norm must be positive")

    def _terms(self, observed: Update, simulated: Update) -> list[Tensor]:
        norm = torch.sqrt(sum(s.pow(2).sum() for s in simulated.values()) + 1e-12)
        factor = torch.clamp(self.max_grad_norm / norm, max=1.0)
        c = 1.0 / (2.0 * self.sigma**2)
        return [-c * (observed[k] - factor * simulated[k]).pow(2).sum() for k in observed]

    def describe(self) -> dict[str, object]:
        return {
            "likelihood": "clipped-gaussian",
            "sigma": self.sigma,
            "max_grad_norm": self.max_grad_norm,
            "weighting": self.layers.weighting,
        }


class DPSGD(GradientDefense):
    """Differentially private SGD's gradient mechanism with an RDP privacy ledger.

    ``apply(per_sample, generator)`` takes *per-sample* updates (every tensor
    with a leading sample dimension B), clips, sums, adds ``N(0, σ²C²)`` and
    divides by B; each call counts as one step in the ledger, at
    ``sample_rate`` (the probability that a record is in a batch: batch size
    over dataset size). :meth:`privatize` computes the per-sample updates of a
    model on a batch first. :meth:`spent` reports (ε, δ) so far.
    """

    def __init__(
        self,
        noise_multiplier: float,
        max_grad_norm: float = 1.0,
        *,
        sample_rate: float = 1.0,
        delta: float = 1e-5,
    ) -> None:
        if noise_multiplier < 0:
            raise ValueError(f"noise_multiplier must be non-negative, got {noise_multiplier}")
        if not max_grad_norm > 0:
            raise ValueError(f"max_grad_norm must be positive, got {max_grad_norm}")
        if not 0 < sample_rate <= 1:
            raise ValueError(f"sample_rate must be in (0, 1], got {sample_rate}")
        if not 0 < delta < 1:
            raise ValueError(f"delta must be in (0, 1), got {delta}")
        self.noise_multiplier = float(noise_multiplier)
        self.max_grad_norm = float(max_grad_norm)
        self.sample_rate = float(sample_rate)
        self.delta = float(delta)
        self.steps = 0
        self._last_batch = 1

    def apply(self, update: Update, generator: torch.Generator | None = None) -> Update:
        """The privatised mean gradient of the per-sample ``update`` (one DP-SGD step)."""
        n = _batch_size(update)
        clipped = clip_per_sample(update, self.max_grad_norm)
        std = self.noise_multiplier * self.max_grad_norm
        out = {}
        for k, g in clipped.items():
            total = g.sum(dim=0)
            if std > 0:
                noise = torch.randn(
                    total.shape, generator=generator, device=total.device, dtype=total.dtype
                )
                total = total + std * noise
            out[k] = total / n
        self.steps += 1
        self._last_batch = n
        return out

    def privatize(
        self,
        model: nn.Module,
        images: Tensor,
        labels: Tensor,
        *,
        loss: str = "ce",
        generator: torch.Generator | None = None,
    ) -> Update:
        """One DP-SGD step's shared update for ``model`` on the batch (per-sample, then :meth:`apply`)."""
        return self.apply(per_sample_updates(model, images, labels, loss=loss), generator)

    def spent(self, steps: int | None = None) -> tuple[float, float]:
        """(ε, δ) after ``steps`` steps (default: the steps applied so far)."""
        t = self.steps if steps is None else steps
        return epsilon_spent(self.noise_multiplier, self.sample_rate, t, self.delta), self.delta

    def likelihood(self, batch_size: int | None = None) -> Likelihood:
        """The matched likelihood of a step on ``batch_size`` images (default: the last batch).

        Exact for a batch of one (:class:`ClippedGaussian`); for larger batches it
        treats the noise on the mean of clipped gradients, σC/B, as the only
        randomness, which is what it is.
        """
        if self.noise_multiplier == 0:
            raise NotImplementedError(
                "DP-SGD without noise is deterministic: p(g|x) is a point mass"
            )
        b = self._last_batch if batch_size is None else int(batch_size)
        return ClippedGaussian(
            sigma=self.noise_multiplier * self.max_grad_norm / b, max_grad_norm=self.max_grad_norm
        )

    def describe(self) -> dict[str, Any]:
        return {
            "defense": "dpsgd",
            "noise_multiplier": self.noise_multiplier,
            "max_grad_norm": self.max_grad_norm,
            "sample_rate": self.sample_rate,
            "delta": self.delta,
        }
