"""Priors log p(x): what the attacker believes about inputs before seeing g.

The second half of the Bayes paper's objective ``log p(g | x) + β log p(x)``
(§4, Table 1). Each prior maps a job's candidate inputs ``x`` (shape
``n × ...``: one or more images, or vectors for the synthetic study) to a
scalar ``log p(x)`` up to a constant, averaged over the ``n`` inputs as the
authors' code does. All are pure tensor functions (vmap/grad safe).

* :class:`Uniform` — constant (DLG);
* :class:`TotalVariation` — anisotropic total variation (Inverting Gradients,
  the Bayes attack);
* :class:`GaussianPrior`, :class:`LaplacePrior` — the synthetic study of §6;
* :class:`PixelRange` — the term of Appendix A.4 that pulls de-normalised
  pixels into [0, 1];
* :class:`WeightedSum` — ``Σ wᵢ log pᵢ(x)``; priors add and scale with ``+``
  and ``*``, so A.4's ``φ·L_TV + (1 − φ)·L_[0,1]`` reads as written.

The priors that read the network as well as ``x`` — GradInversion's
BatchNorm statistics and CPL's label term — are in :mod:`.network_priors`; a
prior built without its network is *bound* to the attacked model by the
attack loop (:func:`bind_model`), and label-aware priors see the attack's
labels through :meth:`Prior.log_prob_given`.

Used by the chapters "Existing attacks are approximations" and "Bayes versus
heuristics under defenses".
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

__all__ = [
    "GaussianPrior",
    "LaplacePrior",
    "TV_REDUCTIONS",
    "PixelRange",
    "Prior",
    "TotalVariation",
    "Uniform",
    "WeightedSum",
    "bind_model",
]


class Prior(ABC):
    """An (unnormalised) log-density over a job's inputs ``x`` (``n × ...``)."""

    @abstractmethod
    def log_prob(self, x: Tensor) -> Tensor:
        """``log p(x)`` up to a constant, a scalar (mean over the ``n`` inputs)."""

    @abstractmethod
    def describe(self) -> dict[str, object]:
        """Name and parameters, for experiment rows and the Table 1 chapter."""

    def log_prob_given(self, x: Tensor, target: Tensor) -> Tensor:
        """``log p(x)`` for an attack whose labels are ``target``; most priors ignore them.

        ``target`` is the attack's labels: ``n`` class indices, or ``n × K``
        soft labels when labels are optimised (DLG). The attack loop calls
        this, so that label-aware priors (:class:`LabelAlignment`) see them.
        """
        return self.log_prob(x)

    def bind(self, model: nn.Module) -> Prior:
        """This prior for the attacked ``model`` (itself unless it reads the network)."""
        return self

    def __add__(self, other: Prior) -> WeightedSum:
        return WeightedSum.of(self) + WeightedSum.of(other)

    def __rmul__(self, weight: float) -> WeightedSum:
        return WeightedSum(((float(weight), self),))


@dataclass(frozen=True)
class Uniform(Prior):
    """The uniform (improper) prior: ``log p(x) = 0`` (DLG, Table 1)."""

    def log_prob(self, x: Tensor) -> Tensor:
        return x.sum() * 0.0

    def describe(self) -> dict[str, object]:
        return {"prior": "uniform"}


#: The reductions :class:`TotalVariation` knows (see its docstring).
TV_REDUCTIONS = ("sum", "mean")


@dataclass(frozen=True)
class TotalVariation(Prior):
    """Anisotropic total variation ``-TV_p(x)``, averaged over the ``n`` images; inputs ``n×C×H×W``.

    With ``Δ_h`` and ``Δ_w`` the ``C·(H−1)·W`` vertical and ``C·H·(W−1)``
    horizontal neighbour differences of one image, and ``p = power``:

    * ``reduction="sum"``: ``TV_p(x) = Σ |Δ_h x|^p + Σ |Δ_w x|^p``. With
      ``power=2`` this is the Bayes authors' TV (eth-sri/bayes-framework-leakage,
      ``bayes_optimal_attack/utils/measures.py``, ``total_variation``: squared
      differences summed over each image's pixels and channels, then averaged
      over the images in ``utils/flax_losses.py``), so the β of the Bayes paper's
      search (A.3) is in this convention. Their code takes the differences with
      ``jnp.roll``, which also counts the wrap-around pair (last row against
      first, last column against first); ours counts interior pairs only.
    * ``reduction="mean"``: ``TV_p(x) = mean |Δ_h x|^p + mean |Δ_w x|^p``, each
      direction averaged over its own differences. With ``power=1`` this is
      inversefed's ``total_variation`` (JonasGeiping/invertinggradients,
      ``inversefed/metrics.py``: ``torch.mean`` of the absolute differences
      of each direction, the two means added), the convention of every
      Inverting Gradients weight and of the CVB authors' ``TV``
      (dAI-SY-Group/ConvolutionalVariationalBottleneck, ``src/loss.py``),
      which copy it. With ``power=2`` it is the squared variant in the
      inversefed copy the Bayes authors ran against Soteria
      (``defense_attacks/soteria/inversefed/metrics.py``). inversefed averages
      over the whole batch at once; for images of one shape that equals our
      average over images of the per-image means.

    On square images the two reductions differ by the factor ``C·(H−1)·W``
    (2,976 on 3×32×32, 756 on 1×28×28): a weight copied from one code must be
    used with that code's reduction. ``reduction`` defaults to ``"sum"``.
    Used by the presets (:mod:`.presets`) and the chapters "Existing attacks
    are approximations" and "Breaking heuristic defenses".
    """

    power: int = 1
    reduction: str = "sum"

    def __post_init__(self) -> None:
        if self.power not in (1, 2):
            raise ValueError(f"power must be 1 or 2, got {self.power}")
        if self.reduction not in TV_REDUCTIONS:
            raise ValueError(
                f"reduction must be one of {TV_REDUCTIONS} (total variation summed over an "
                f"image's differences, or averaged per direction), got {self.reduction!r}"
            )

    def log_prob(self, x: Tensor) -> Tensor:
        if x.dim() != 4:
            raise ValueError(f"total variation needs images n×C×H×W, got shape {tuple(x.shape)}")
        dh = x[:, :, 1:, :] - x[:, :, :-1, :]
        dw = x[:, :, :, 1:] - x[:, :, :, :-1]
        reduce = Tensor.sum if self.reduction == "sum" else Tensor.mean
        terms = [d.abs() if self.power == 1 else d.pow(2) for d in (dh, dw)]
        return -(reduce(terms[0], (1, 2, 3)) + reduce(terms[1], (1, 2, 3))).mean()

    def describe(self) -> dict[str, object]:
        return {"prior": "tv", "power": self.power, "reduction": self.reduction}


@dataclass(frozen=True)
class GaussianPrior(Prior):
    """``N(mean, std²)`` per coordinate: ``-Σ (x − mean)² / (2 std²)``, averaged over inputs."""

    mean: float = 0.0
    std: float = 1.0

    def __post_init__(self) -> None:
        if not self.std > 0:
            raise ValueError(f"std must be positive, got {self.std}")

    def log_prob(self, x: Tensor) -> Tensor:
        z = (x - self.mean).reshape(x.shape[0], -1)
        return -(z.pow(2).sum(1) / (2.0 * self.std**2)).mean()

    def describe(self) -> dict[str, object]:
        return {"prior": "gaussian", "mean": self.mean, "std": self.std}


@dataclass(frozen=True)
class LaplacePrior(Prior):
    """``Lap(mean, b)`` per coordinate: ``-Σ |x − mean| / b``, averaged over inputs."""

    mean: float = 0.0
    b: float = 1.0

    def __post_init__(self) -> None:
        if not self.b > 0:
            raise ValueError(f"b must be positive, got {self.b}")

    def log_prob(self, x: Tensor) -> Tensor:
        z = (x - self.mean).reshape(x.shape[0], -1)
        return -(z.abs().sum(1) / self.b).mean()

    def describe(self) -> dict[str, object]:
        return {"prior": "laplace", "mean": self.mean, "b": self.b}


@dataclass(frozen=True)
class PixelRange(Prior):
    """Appendix A.4's pixel-range term: ``-‖u − clip(u, 0, 1)‖²``, u = de-normalised x.

    ``mean`` and ``std`` are the per-channel normalisation constants of the
    attacked inputs (``normalizer.mean``, ``normalizer.std``). The paper writes
    the ℓ2 norm; the authors' code squares it (eth-sri/bayes-framework-leakage,
    utils/flax_losses.py, ``clip_prior``), and so do we.
    """

    mean: Sequence[float] = (0.0,)
    std: Sequence[float] = (1.0,)

    def __post_init__(self) -> None:
        if len(self.mean) != len(self.std) or any(s <= 0 for s in self.std):
            raise ValueError("mean and std need one entry per channel and std must be positive")

    def log_prob(self, x: Tensor) -> Tensor:
        if x.dim() != 4:
            raise ValueError(f"the pixel-range prior needs images n×C×H×W, got {tuple(x.shape)}")
        shape = (1, -1, 1, 1)
        mean = torch.as_tensor(self.mean, dtype=x.dtype, device=x.device).reshape(shape)
        std = torch.as_tensor(self.std, dtype=x.dtype, device=x.device).reshape(shape)
        u = x * std + mean
        return -(u - u.clamp(0.0, 1.0)).pow(2).sum((1, 2, 3)).mean()

    def describe(self) -> dict[str, object]:
        return {"prior": "pixel-range"}


@dataclass(frozen=True)
class WeightedSum(Prior):
    """``Σ wᵢ log pᵢ(x)`` over ``terms = ((w₁, p₁), (w₂, p₂), ...)``."""

    terms: tuple[tuple[float, Prior], ...] = ()

    def __post_init__(self) -> None:
        if not self.terms:
            raise ValueError("a weighted sum of priors needs at least one term")
        for w, p in self.terms:
            if not isinstance(p, Prior):
                raise TypeError(f"prior terms must be Prior instances, got {type(p).__name__}")
            if w < 0:
                raise ValueError(f"prior weights must be non-negative, got {w}")

    @staticmethod
    def of(prior: Prior) -> WeightedSum:
        """``prior`` as a weighted sum (itself if it already is one)."""
        return prior if isinstance(prior, WeightedSum) else WeightedSum(((1.0, prior),))

    def __add__(self, other: Prior) -> WeightedSum:
        return WeightedSum(self.terms + WeightedSum.of(other).terms)

    def __rmul__(self, weight: float) -> WeightedSum:
        return WeightedSum(tuple((float(weight) * w, p) for w, p in self.terms))

    def log_prob(self, x: Tensor) -> Tensor:
        return sum(w * p.log_prob(x) for w, p in self.terms)

    def log_prob_given(self, x: Tensor, target: Tensor) -> Tensor:
        return sum(w * p.log_prob_given(x, target) for w, p in self.terms)

    def bind(self, model: nn.Module) -> WeightedSum:
        terms = tuple((w, p.bind(model)) for w, p in self.terms)
        return (
            self
            if all(a is b for (_, a), (_, b) in zip(terms, self.terms, strict=True))
            else WeightedSum(terms)
        )

    def describe(self) -> dict[str, object]:
        return {"prior": "sum", "terms": [{"weight": w, **p.describe()} for w, p in self.terms]}


def bind_model(prior: Prior, model: nn.Module) -> Prior:
    """``prior`` with every network-reading term bound to ``model`` (a no-op for the others).

    The attack loop calls this once per distinct prior, so that presets can
    name :class:`BatchNormStatistics` or :class:`LabelAlignment` before the
    attacked model is known.
    """
    if not isinstance(prior, Prior):
        raise TypeError(f"expected a Prior, got {type(prior).__name__}")
    return prior.bind(model)
