"""Adversarial risk, estimated by Monte Carlo on a distribution known exactly.

The Bayes paper (Balunović et al. 2022, §4) defines the risk of an adversary
f, which maps a shared gradient g to a guess of the input, as
``R(f) = E_{x ~ p(x)} E_{g ~ p(g|x)} 1{‖x − f(g)‖₂ > δ}``, and shows that the
minimiser is the Bayes-optimal adversary. For images p(x) is unknown, so the
paper turns to a synthetic distribution (§6, Fig. 4): ``x ~ N(0, I₂₀)``, the
label ``y = argmax(W x)`` for a fixed random matrix W, a two-layer MLP, and
Laplace noise of scale 0.1 on its gradient. There every ingredient is
known, and the risk of *any* adversary can be estimated by sampling (x, g)
pairs — with a confidence interval, because each pair is a Bernoulli trial.

Used by the chapter "The Bayes-optimal adversary" and the experiment
``bayes/fig4-synthetic``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from scipy.stats import norm
from torch import Tensor, nn

from .attacks import Attack
from .defenses.base import GradientDefense
from .validation import require_count

Update = dict[str, Tensor]
Adversary = Callable[[Update, Tensor], Tensor]

__all__ = [
    "RiskEstimate",
    "SyntheticGaussian",
    "adversarial_risk",
    "defended",
    "optimisation_adversary",
]


@dataclass
class SyntheticGaussian:
    """§6's synthetic task: x ~ N(0, I_d), y = argmax(W x), a two-layer ReLU MLP.

    Inputs are vectors; the network (and attacks on it) see them as
    ``1 × 1 × d`` "images" so that the library's update functions apply.

    The paper fixes d = 20 and a "2-layer MLP" without giving widths or the
    number of classes; we use ``num_classes = 10`` and ``hidden = 20`` hidden
    units (a network whose gradient carries few numbers per input coordinate,
    so that the prior matters). W and the MLP (PyTorch's default
    initialisation) are drawn from ``seed``.
    """

    dim: int = 20
    num_classes: int = 10
    hidden: int = 20
    seed: int = 0

    def __post_init__(self) -> None:
        require_count("dim", self.dim, "the input's dimension")
        require_count("num_classes", self.num_classes, "the number of classes")
        require_count("hidden", self.hidden, "the network's hidden units")
        gen = torch.Generator().manual_seed(self.seed)
        self.W = torch.randn((self.num_classes, self.dim), generator=gen)
        torch.manual_seed(self.seed)
        self.model = nn.Sequential(
            nn.Flatten(),
            nn.Linear(self.dim, self.hidden),
            nn.ReLU(),
            nn.Linear(self.hidden, self.num_classes),
        )

    def sample(self, n: int, generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
        """``n`` inputs (``n × dim``) and their labels ``argmax(W x)``."""
        x = torch.randn((n, self.dim), generator=generator)
        return x, (x @ self.W.T).argmax(1)

    def images(self, x: Tensor) -> Tensor:
        """Inputs ``n × dim`` as the ``n × 1 × 1 × dim`` "images" the network takes."""
        return x.reshape(x.shape[0], 1, 1, -1)


@dataclass
class RiskEstimate:
    """``risk`` ± a ``confidence`` interval (Wilson score), from ``n`` samples."""

    risk: float
    low: float
    high: float
    n: int
    confidence: float
    distances: Tensor


def _wilson(failures: int, n: int, confidence: float) -> tuple[float, float]:
    z = float(norm.ppf(0.5 + confidence / 2))
    p = failures / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    low = 0.0 if failures == 0 else max(0.0, centre - half)
    high = 1.0 if failures == n else min(1.0, centre + half)
    return low, high


def adversarial_risk(
    adversary: Adversary,
    *,
    x: Tensor,
    shared: Update,
    labels: Tensor,
    delta: float,
    confidence: float = 0.95,
) -> RiskEstimate:
    """Estimate ``R(f) = P(‖x − f(g)‖₂ > δ)`` from samples ``x`` and their shared updates.

    ``shared`` is stacked (one defended update per sample) and ``adversary``
    maps ``(shared, labels)`` to guesses shaped like ``x``. The interval is
    the Wilson score interval for a binomial proportion.
    """
    if delta <= 0:
        raise ValueError(f"delta must be positive, got {delta}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    guess = adversary(shared, labels)
    if guess.shape != x.shape:
        raise ValueError(
            f"the adversary returned shape {tuple(guess.shape)}, expected {tuple(x.shape)}"
        )
    dist = (guess - x).reshape(x.shape[0], -1).norm(dim=1)
    failures, n = int((dist > delta).sum()), x.shape[0]
    low, high = _wilson(failures, n, confidence)
    return RiskEstimate(failures / n, low, high, n, confidence, dist)


def optimisation_adversary(
    task: SyntheticGaussian,
    attack: Attack,
    *,
    generator: torch.Generator | None = None,
    callback: Callable[[int, Tensor], None] | None = None,
) -> Adversary:
    """The adversary that runs ``attack`` (a preset, e.g. the Bayes attack with §6's parts) on ``task``."""

    def adversary(shared: Update, labels: Tensor) -> Tensor:
        result = attack(
            task.model,
            shared,
            labels=labels,
            input_shape=(1, 1, task.dim),
            generator=generator,
            callback=callback,
        )
        return result.inputs().reshape(-1, task.dim)

    return adversary


def defended(
    task: SyntheticGaussian,
    defense: GradientDefense,
    x: Tensor,
    y: Tensor,
    generator: torch.Generator | None = None,
) -> Update:
    """The defended, stacked updates of inputs ``x`` on ``task``'s network (one client per input)."""
    return defense.share(task.model, task.images(x), y, generator, per_image=True)
