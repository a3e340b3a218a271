"""DP-SGD: per-sample clipping, Gaussian noise, and the (ε, δ) it spends.

Abadi et al. (2016): every per-sample gradient ``g_i`` is clipped to norm at
most ``C`` (over all parameters together), the clipped gradients are summed,
Gaussian noise ``N(0, (σC)² I)`` is added (σ the *noise multiplier*) and the sum
is divided by the batch size ``B``:

    g̃ = ( Σ_i g_i · min(1, C / ‖g_i‖) + N(0, σ²C² I) ) / B.

The privacy it spends over ``T`` steps with sampling rate ``q`` is computed
with Opacus's Rényi-DP accountant (``opacus.accountants.RDPAccountant``, through
its public ``step`` and ``get_epsilon``), as the CVB paper does (§VI-C, "Opacus'
implementation of DPSGD"; the clipping threshold and the noise multipliers
of its Table IV are set by the experiment, not here).

Used by the chapter "Variational bottlenecks" (Table IV, Fig. 11) and by the
experiment ``cvb/table4-defenses``.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from ..attacks.likelihoods import LayerSelection, Likelihood
from ..gradients import Update, per_sample_norms
from .base import GradientDefense, Objective, client_gradients, require

__all__ = ["DPSGD", "ClippedGaussian", "clip_per_sample", "epsilon_spent"]

_NOISE = "a finite number >= 0 (the noise's standard deviation over the clipping norm)"
_NORM = "a finite positive number (the clipping threshold C)"
_RATE = "in (0, 1] (the probability that a record is in a batch)"
_DELTA = "in (0, 1) (the δ of (ε, δ)-DP)"


def clip_per_sample(updates: Update, max_grad_norm: float) -> Update:
    """Scale each sample's gradient (leading dim N) to global norm at most ``max_grad_norm``.

    The norm is taken over all parameter tensors of one sample together
    (Opacus's "flat" clipping); the factor is ``min(1, C / ‖g_i‖)``.
    """
    require("max_grad_norm", max_grad_norm, lambda v: v > 0, _NORM)
    n = _batch_size(updates)
    factor = (max_grad_norm / (per_sample_norms(updates) + 1e-12)).clamp(max=1.0)
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


def _integer(name: str, value: int, minimum: int, what: str) -> int:
    """``value`` as an int when it is an integer >= ``minimum``; else a ``ValueError`` naming it."""
    try:
        number = operator.index(value)
    except TypeError:
        number = minimum - 1
    if isinstance(value, bool) or number < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum} ({what}), got {value!r}")
    return number


def epsilon_spent(noise_multiplier: float, sample_rate: float, steps: int, delta: float) -> float:
    """ε of ``steps`` DP-SGD steps at ``noise_multiplier`` and ``sample_rate``, for ``delta``.

    Opacus's RDP accountant (Mironov 2017; the subsampled Gaussian mechanism),
    fed one ``step`` per step: it merges identical consecutive steps into one
    entry, so this stays cheap for long runs. ``inf`` for a noise multiplier
    of 0 (no privacy).
    """
    sigma = require("noise_multiplier", noise_multiplier, lambda v: v >= 0, _NOISE)
    q = require("sample_rate", sample_rate, lambda v: 0 < v <= 1, _RATE)
    d = require("delta", delta, lambda v: 0 < v < 1, _DELTA)
    count = _integer("steps", steps, 0, "DP-SGD steps taken")
    if count == 0:
        return 0.0
    if sigma == 0:
        return float("inf")
    accountant = _rdp_accountant()
    for _ in range(count):
        accountant.step(noise_multiplier=sigma, sample_rate=q)
    return float(accountant.get_epsilon(delta=d))


def _rdp_accountant() -> Any:
    """A fresh ``opacus.accountants.RDPAccountant``, imported on first use (Opacus takes
    seconds to import, which every chapter importing leakagelib.defenses would otherwise pay)."""
    from opacus.accountants import RDPAccountant

    return RDPAccountant()


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

    :meth:`share` computes the per-sample gradients of the batch, clips each to
    norm ``max_grad_norm`` (C), sums them, adds ``N(0, σ²C²)`` (σ the noise
    multiplier) and divides by the batch size B. ``per_image=True`` makes every
    image a client taking one DP-SGD step on a batch of one: each image's own
    gradient is clipped and noised independently (one vectorised gradient
    computation). Every share is one step in the ledger, an
    ``opacus.accountants.RDPAccountant`` at ``sample_rate`` (the probability
    that a record is in a batch: batch size over dataset size); with
    ``per_image`` it is one step of each (symmetric) client. :meth:`spent`
    reports (ε, δ) so far. :meth:`likelihood` is matched to the batch size of
    the last share (1 per image), or to ``batch_size`` before any share.
    """

    def __init__(
        self,
        noise_multiplier: float,
        max_grad_norm: float = 1.0,
        *,
        sample_rate: float = 1.0,
        delta: float = 1e-5,
        batch_size: int | None = None,
    ) -> None:
        self.noise_multiplier = require(
            "noise_multiplier", noise_multiplier, lambda v: v >= 0, _NOISE
        )
        self.max_grad_norm = require("max_grad_norm", max_grad_norm, lambda v: v > 0, _NORM)
        self.sample_rate = require("sample_rate", sample_rate, lambda v: 0 < v <= 1, _RATE)
        self.delta = require("delta", delta, lambda v: 0 < v < 1, _DELTA)
        self.accountant = _rdp_accountant()
        self.steps = 0
        self._batch = (
            None
            if batch_size is None
            else _integer("batch_size", batch_size, 1, "the batch the attacked step used")
        )

    def share(
        self,
        model: nn.Module,
        images: Tensor,
        labels: Tensor,
        generator: torch.Generator | None = None,
        *,
        per_image: bool = False,
        loss: str | Objective = "ce",
    ) -> Update:
        per = client_gradients(model, images, labels, per_image=True, loss=loss)
        clipped = clip_per_sample(per, self.max_grad_norm)
        std = self.noise_multiplier * self.max_grad_norm
        if per_image:
            # the draws of N one-image clients in turn (image by image, then layer by layer)
            noise = [_noise(clipped, std, generator, row=i) for i in range(images.shape[0])]
            out = {k: g + torch.stack([z[k] for z in noise]) for k, g in clipped.items()}
            self._batch = 1
        else:
            summed = {k: g.sum(dim=0) for k, g in clipped.items()}
            noise = _noise(summed, std, generator)
            out = {k: (g + noise[k]) / images.shape[0] for k, g in summed.items()}
            self._batch = images.shape[0]
        self.accountant.step(noise_multiplier=self.noise_multiplier, sample_rate=self.sample_rate)
        self.steps += 1
        return out

    def state_dict(self) -> dict[str, Any]:
        """The privacy ledger (the accountant's history, the step count) and the last batch."""
        return {"accountant": self.accountant.state_dict(), "steps": self.steps,
                "batch": self._batch}  # fmt: skip

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Take back a :meth:`state_dict` (a resumed training run's ledger)."""
        self.accountant.load_state_dict(state["accountant"])
        self.steps, self._batch = int(state["steps"]), state["batch"]

    def spent(self) -> tuple[float, float]:
        """(ε, δ) after the steps shared so far, from the accountant."""
        return float(self.accountant.get_epsilon(delta=self.delta)), self.delta

    def likelihood(self) -> Likelihood:
        """The matched likelihood of a step on the last share's batch (see the class doc).

        Exact for a batch of one (:class:`ClippedGaussian`); for larger batches it
        treats the noise on the mean of clipped gradients, σC/B, as the only
        randomness, which is what it is.
        """
        if self.noise_multiplier == 0:
            raise NotImplementedError(
                "DP-SGD without noise is deterministic: p(g|x) is a point mass"
            )
        if self._batch is None:
            raise ValueError(
                "the DP-SGD likelihood depends on the batch size: share a batch first, or "
                "build the defense with batch_size=B"
            )
        return ClippedGaussian(
            sigma=self.noise_multiplier * self.max_grad_norm / self._batch,
            max_grad_norm=self.max_grad_norm,
        )

    def describe(self) -> dict[str, Any]:
        return {
            "defense": "dpsgd",
            "noise_multiplier": self.noise_multiplier,
            "max_grad_norm": self.max_grad_norm,
            "sample_rate": self.sample_rate,
            "delta": self.delta,
        }


def _noise(
    like: Update, std: float, generator: torch.Generator | None, *, row: int | None = None
) -> Update:
    """N(0, std²) for every tensor of ``like`` (its slice ``row`` when given); zeros when std = 0."""
    out = {}
    for k, g in like.items():
        t = g if row is None else g[row]
        if std > 0:
            z = torch.randn(t.shape, generator=generator, device=t.device, dtype=t.dtype)
            out[k] = std * z
        else:
            out[k] = torch.zeros_like(t)
    return out
