"""Priors that read the attacked network: GradInversion's BatchNorm statistics and CPL's label term.

The Bayes paper's Table 1 lists, beside the image priors of :mod:`.priors`,
two that need more than the candidate ``x``:

* :class:`BatchNormStatistics` — GradInversion's (and DeepInversion's)
  feature-statistics prior: the reconstruction's per-channel mean and variance
  at every BatchNorm layer's input should match that layer's running
  statistics;
* :class:`LabelAlignment` — CPL's label-based regulariser: the network's
  prediction on the reconstruction should match the (recovered) label;
  :class:`LogitLabelDistance` is the form the CVB authors' CPL uses;
* :func:`gradinversion` — TV plus an ℓ2 image norm, plus the BatchNorm term
  when given a model with BatchNorm layers.

Built without a network, they are *bound* to the attacked model by the attack
loop (:func:`~leakagelib.attacks.priors.bind_model`); :class:`LabelAlignment`
reads the attack's labels through :meth:`~leakagelib.attacks.priors.Prior.log_prob_given`.
Used by the chapter "Existing attacks are approximations".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch
from torch import Tensor, nn
from torch.func import functional_call

from .priors import GaussianPrior, Prior, TotalVariation, WeightedSum

__all__ = ["BatchNormStatistics", "LabelAlignment", "LogitLabelDistance", "gradinversion"]


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
class _LabelPrior(Prior):
    """A prior on the network's output for the attack's labels (CPL's label terms).

    It reads the attack's labels, so it acts through :meth:`log_prob_given`
    (which the attack loop calls); :meth:`log_prob` without labels raises.
    ``model=None`` leaves it unbound; the attack loop binds it to the attacked
    network. ``term`` names the prior in messages.
    """

    term: ClassVar[str]
    model: nn.Module | None = field(default=None, compare=False, repr=False)

    def bind(self, model: nn.Module) -> _LabelPrior:
        return self if self.model is not None else type(self)(model)

    def log_prob(self, x: Tensor) -> Tensor:
        raise ValueError(
            f"the {self.term} needs the attack's labels: call log_prob_given(x, labels)"
        )

    def _output(self, x: Tensor) -> Tensor:
        """The bound network's output on ``x`` (its weights frozen)."""
        if self.model is None:
            raise ValueError(
                f"this {self.term} is not bound to a model: build it with "
                f"{type(self).__name__}(model), or pass it to reconstruct, which binds it"
            )
        return _frozen_forward(self.model, x)


@dataclass(frozen=True)
class LabelAlignment(_LabelPrior):
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

    Bound to a model as every :class:`_LabelPrior`.
    """

    term: ClassVar[str] = "label-alignment prior"

    def log_prob_given(self, x: Tensor, target: Tensor) -> Tensor:
        probs = torch.softmax(self._output(x), dim=-1)
        if target.dim() == probs.dim():  # soft labels n × K
            onehot = target.to(probs.dtype)
        else:
            classes = torch.arange(probs.shape[-1], device=probs.device)
            onehot = (classes == target.unsqueeze(-1)).to(probs.dtype)
        return -(probs - onehot).pow(2).sum(-1).mean()

    def describe(self) -> dict[str, object]:
        return {"prior": "label-alignment"}


@dataclass(frozen=True)
class LogitLabelDistance(_LabelPrior):
    """CPL's label term as the CVB authors run it: ``-‖h(x) − y‖₂`` with ``h`` the logits.

    The CVB authors' CPL (dAI-SY-Group/ConvolutionalVariationalBottleneck,
    ``src/attacks.py``, ``CPL.attack_specific_regularization``, weight
    ``regularization: 0.01`` in ``configs/attacks/CPL.yaml``) adds
    ``0.01 · torch.dist(prediction, label, 2)`` to the gradient distance:
    the plain (not squared) Euclidean distance between the network's output
    ``h(x)`` — its logits, the models end in a linear layer — and the integer
    class label ``y``, which broadcasting subtracts from every logit:
    ``‖h(x) − y·𝟙‖₂``. It is not the one-hot distance of
    :class:`LabelAlignment`. Their victims are single images; for ``n`` inputs
    the distance is taken over all ``n × K`` entries (``y`` per input). Soft
    labels (DLG's) are not defined for this form and raise.
    """

    term: ClassVar[str] = "logit-label distance"

    def log_prob_given(self, x: Tensor, target: Tensor) -> Tensor:
        logits = self._output(x)
        if target.dim() == logits.dim():
            raise ValueError("the logit-label distance takes class indices, not soft labels")
        diff = logits - target.to(logits.dtype).unsqueeze(-1)
        return -diff.pow(2).sum().sqrt()

    def describe(self) -> dict[str, object]:
        return {"prior": "logit-label-distance"}


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
    default TV and ℓ2 weights are those of breaching's re-implementation of
    the attack (JonasGeiping/breaching, ``config/attack/seethroughgradients.yaml``;
    the paper's code is not public), which the
    :func:`~leakagelib.attacks.presets.grad_inversion` preset uses with
    ``bn = 0.1``. The TV term is ``TotalVariation(power=1, reduction="mean")``,
    the convention nearest breaching's ``TotalVariation`` (``regularizers.py``:
    the mean over all ``C·H·W`` positions of ``|Δ_w x| + |Δ_h x|`` from a
    zero-padded difference convolution): on an H×H image a breaching scale
    ``s`` is our weight ``s·(H−1)/H`` away from the border, where breaching
    also penalises ``|x|`` on the last row and column and we do not. The ℓ2
    term is a Gaussian prior with ``1/(2 std²) = 1``, summed over an image's
    pixels, where breaching's ``NormRegularization`` averages ``½x²`` over
    them (a factor ``2·C·H·W``), so ``l2`` is a starting point for the search
    (:mod:`leakagelib.attacks.search`) rather than a reproduction.
    """
    if tv < 0 or l2 < 0 or bn < 0:
        raise ValueError("prior weights must be non-negative")
    terms: tuple[tuple[float, Prior], ...] = (
        (tv, TotalVariation(power=1, reduction="mean")),
        (l2, GaussianPrior(std=2**-0.5)),
    )
    if bn > 0:
        stats = BatchNormStatistics() if model is None else BatchNormStatistics().bind(model)
        terms = (*terms, (bn, stats))
    return WeightedSum(terms)
