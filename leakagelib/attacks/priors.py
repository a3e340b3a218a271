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
  and ``*``, so A.4's ``φ·L_TV + (1 − φ)·L_[0,1]`` reads as written;
* :class:`BatchNormStatistics` — GradInversion's (and DeepInversion's)
  feature-statistics prior: the reconstruction's per-channel mean and variance
  at every BatchNorm layer's input should match that layer's running
  statistics;
* :class:`LabelAlignment` — CPL's label-based regulariser: the network's
  prediction on the reconstruction should match the (recovered) label;
* :func:`gradinversion` — TV plus an ℓ2 image norm, plus the BatchNorm term
  when given a model with BatchNorm layers.

The last two read more than ``x``: the network (a prior built without one is
*bound* to the attacked model by the attack loop, :func:`bind_model`) and, for
:class:`LabelAlignment`, the labels of the attack (:meth:`Prior.log_prob_given`).

Used by the chapters "Existing attacks are approximations" and "Bayes versus
heuristics under defenses".
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn
from torch.func import functional_call

__all__ = [
    "BatchNormStatistics",
    "GaussianPrior",
    "LabelAlignment",
    "LaplacePrior",
    "PixelRange",
    "Prior",
    "TotalVariation",
    "Uniform",
    "WeightedSum",
    "bind_model",
    "gradinversion",
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


@dataclass(frozen=True)
class TotalVariation(Prior):
    """Anisotropic total variation: ``-Σ (|Δₕx|^p + |Δ_w x|^p)`` per image, averaged.

    ``power=1`` is the anisotropic TV of Inverting Gradients; ``power=2`` sums
    squared neighbour differences, which is what the Bayes authors' code
    computes for its "total variation" (eth-sri/bayes-framework-leakage,
    utils/measures.py) and what the Bayes preset uses. Inputs must be images
    ``n × C × H × W``.
    """

    power: int = 1

    def __post_init__(self) -> None:
        if self.power not in (1, 2):
            raise ValueError(f"power must be 1 or 2, got {self.power}")

    def log_prob(self, x: Tensor) -> Tensor:
        if x.dim() != 4:
            raise ValueError(f"total variation needs images n×C×H×W, got shape {tuple(x.shape)}")
        dh = x[:, :, 1:, :] - x[:, :, :-1, :]
        dw = x[:, :, :, 1:] - x[:, :, :, :-1]
        if self.power == 1:
            tv = dh.abs().sum((1, 2, 3)) + dw.abs().sum((1, 2, 3))
        else:
            tv = dh.pow(2).sum((1, 2, 3)) + dw.pow(2).sum((1, 2, 3))
        return -tv.mean()

    def describe(self) -> dict[str, object]:
        return {"prior": "tv", "power": self.power}


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


def _frozen_forward(model: nn.Module, x: Tensor) -> Tensor:
    """``model(x)`` with the network's parameters and buffers held constant.

    The priors that read the network differentiate with respect to the input
    only; calling the module directly would also record a graph through its
    (trainable) weights on every attack step.
    """
    state = {k: v.detach() for k, v in (*model.named_parameters(), *model.named_buffers())}
    return functional_call(model, state, (x,))


#: BatchNorm layers whose running statistics :class:`BatchNormStatistics` matches.
_BATCHNORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)


@dataclass(frozen=True)
class BatchNormStatistics(Prior):
    """GradInversion's BatchNorm prior: ``-Σ_l ‖μ_l(x) − μ_l^BN‖₂ + ‖σ²_l(x) − σ²_l^BN‖₂``.

    Yin et al. (2021, "See through gradients", §3, R_BN) regularise a
    reconstruction by asking that, at the input of every BatchNorm layer
    ``l``, the per-channel mean ``μ_l(x)`` and variance ``σ²_l(x)`` of the
    reconstructed batch match the layer's running statistics — the training
    data's statistics that the network carries. The norms are plain (not
    squared) ℓ2 norms and the variance is the biased one, as in DeepInversion's
    feature hook, which GradInversion reuses (NVlabs/DeepInversion,
    ``DeepInversionFeatureHook``). Statistics are taken over the reconstructed
    batch of one attack (its ``n`` inputs) and every position, i.e. every
    dimension but the channel.

    The layer inputs are read with forward pre-hooks during a forward pass of
    ``model``; hooks are plain Python, so this works inside the attack loop's
    ``vmap``/``grad`` (the captured tensors are the batched tensors of that
    trace). The model must be in eval mode: in training mode BatchNorm would
    write its running statistics in place, which ``vmap`` forbids — and the
    attacked gradient is then computed with those same running statistics.

    ``model=None`` leaves the prior unbound; the attack loop binds it to the
    attacked network (:func:`bind_model`). Used by :func:`gradinversion` and
    the chapter "Existing attacks are approximations".
    """

    model: nn.Module | None = field(default=None, compare=False, repr=False)

    def bind(self, model: nn.Module) -> BatchNormStatistics:
        if self.model is not None:
            return self
        if not any(isinstance(m, _BATCHNORMS) for m in model.modules()):
            raise ValueError(
                "the BatchNorm-statistics prior needs a model with BatchNorm layers; "
                f"{type(model).__name__} has none"
            )
        return BatchNormStatistics(model)

    def _layers(self) -> list[nn.Module]:
        if self.model is None:
            raise ValueError(
                "this BatchNorm-statistics prior is not bound to a model: build it with "
                "BatchNormStatistics(model), or pass it to reconstruct, which binds it"
            )
        layers = [m for m in self.model.modules() if isinstance(m, _BATCHNORMS)]
        if any(m.training for m in layers):
            raise ValueError(
                "the BatchNorm-statistics prior needs model.eval(): in training mode BatchNorm "
                "updates its running statistics in place, which the batched attack cannot do"
            )
        if any(m.running_mean is None or m.running_var is None for m in layers):
            raise ValueError("every BatchNorm layer needs running statistics (track_running_stats)")
        return layers

    def log_prob(self, x: Tensor) -> Tensor:
        layers = self._layers()
        inputs: list[tuple[nn.Module, Tensor]] = []
        handles = [
            m.register_forward_pre_hook(lambda mod, args: inputs.append((mod, args[0])))
            for m in layers
        ]
        try:
            _frozen_forward(self.model, x)
        finally:
            for h in handles:
                h.remove()
        total = x.sum() * 0.0
        for mod, a in inputs:
            dims = [d for d in range(a.dim()) if d != 1]
            mean = a.mean(dims)
            var = (a - mean.reshape(1, -1, *([1] * (a.dim() - 2)))).pow(2).mean(dims)
            total = total + (mean - mod.running_mean).norm() + (var - mod.running_var).norm()
        return -total

    def describe(self) -> dict[str, object]:
        return {"prior": "bn-statistics"}


@dataclass(frozen=True)
class LabelAlignment(Prior):
    """CPL's label-based regulariser: ``-‖softmax(h(x)) − e_y‖₂²``, averaged over the inputs.

    Wei et al. (2020, "A framework for evaluating client privacy leakages in
    federated learning", §4, the attack's label-based regularisation) add to
    the gradient distance a term that pulls the network's prediction on the
    reconstruction towards the label the attacker has already recovered from
    the gradient (iDLG's rule), ``α‖F(x_rec; W) − y_rec‖²``. Here ``F`` is the
    softmax output and ``y`` the one-hot label (a soft label when labels are
    optimised); the weight α is the attack's β. In the Bayes reading it is a
    label-conditional prior ``p(x | y) ∝ exp(−‖p(·|x) − e_y‖²)``: inputs the
    network already assigns to class y are a priori more likely. The authors'
    public notebook (git-disl/CPL_attack, ``LFW_enhanced_random_ASR.ipynb``)
    keeps a variant of the term commented out, so its default weight there is 0.

    It reads the attack's labels, so it acts through
    :meth:`log_prob_given` (which the attack loop calls); :meth:`log_prob`
    without labels raises. ``model=None`` leaves it unbound; the attack loop
    binds it to the attacked network.
    """

    model: nn.Module | None = field(default=None, compare=False, repr=False)

    def bind(self, model: nn.Module) -> LabelAlignment:
        return self if self.model is not None else LabelAlignment(model)

    def log_prob(self, x: Tensor) -> Tensor:
        raise ValueError(
            "the label-alignment prior needs the attack's labels: call log_prob_given(x, labels)"
        )

    def log_prob_given(self, x: Tensor, target: Tensor) -> Tensor:
        if self.model is None:
            raise ValueError(
                "this label-alignment prior is not bound to a model: build it with "
                "LabelAlignment(model), or pass it to reconstruct, which binds it"
            )
        probs = torch.softmax(_frozen_forward(self.model, x), dim=-1)
        if target.dim() == probs.dim():  # soft labels n × K
            onehot = target.to(probs.dtype)
        else:
            classes = torch.arange(probs.shape[-1], device=probs.device)
            onehot = (classes == target.unsqueeze(-1)).to(probs.dtype)
        return -(probs - onehot).pow(2).sum(-1).mean()

    def describe(self) -> dict[str, object]:
        return {"prior": "label-alignment"}


def gradinversion(
    tv: float = 1e-4, l2: float = 1e-6, bn: float = 0.0, model: nn.Module | None = None
) -> WeightedSum:
    """GradInversion's image prior: ``tv·TV + l2·‖x‖² + bn·R_BN``.

    Yin et al. (2021) combine total variation, an ℓ2 image norm and the
    DeepInversion term matching BatchNorm statistics
    (:class:`BatchNormStatistics`). The BatchNorm term is included when
    ``bn > 0``; it is then bound to ``model`` if given, else to the attacked
    model by the attack loop (which must have BatchNorm layers — the networks
    of this library's Bayes chapters have none, so there ``bn`` stays 0). The
    default weights are illustrative starting points for the hyper-parameter
    search (:mod:`leakagelib.attacks.search`), not values from that paper;
    the ℓ2 term is a Gaussian prior with ``1/(2 std²) = 1``.
    """
    if tv < 0 or l2 < 0 or bn < 0:
        raise ValueError("prior weights must be non-negative")
    terms: tuple[tuple[float, Prior], ...] = (
        (tv, TotalVariation(power=1)),
        (l2, GaussianPrior(std=2**-0.5)),
    )
    if bn > 0:
        stats = BatchNormStatistics() if model is None else BatchNormStatistics().bind(model)
        terms = (*terms, (bn, stats))
    return WeightedSum(terms)
