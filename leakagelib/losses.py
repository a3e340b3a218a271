"""The losses a client trains on: the task losses and the training loss of a client's update.

:func:`loss_function` names the task losses — cross-entropy, and R-GAP's
margin losses of one logit (logistic, exponential, hinge; :data:`MARGIN_LOSSES`).
:func:`client_loss` is what a client actually differentiates: the task loss
plus the β·KL of any variational bottleneck. :mod:`leakagelib.gradients`
computes updates from it, :mod:`leakagelib.fl` trains with it, and the
attacks simulate it (:mod:`leakagelib.attacks.per_attack`). Introduced in the
chapter "What a client update reveals"; the margin losses in "R-GAP in
practice" (Figure 1).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

LossFn = Callable[[Tensor, Tensor], Tensor]

__all__ = ["MARGIN_LOSSES", "LossFn", "client_loss", "kl_rows", "loss_function"]


def _cross_entropy(logits: Tensor, labels: Tensor) -> Tensor:
    """Mean cross-entropy of ``logits`` (N×K) against integer ``labels`` (N)."""
    return F.cross_entropy(logits, labels)


def _logistic(outputs: Tensor, labels: Tensor) -> Tensor:
    """R-GAP's binary loss: mean of log(1 + exp(-y·μ)), y ∈ {-1, +1}, μ the single logit.

    R-GAP (Zhu & Blaschko 2021, §3) analyses a network with one output and this
    loss, because ∂ℓ/∂μ = -y/(1 + e^{yμ}) then ties the scalar μ to the gradient.
    """
    mu = outputs.reshape(outputs.shape[0], -1)
    if mu.shape[1] != 1:
        raise ValueError(
            f"the logistic loss needs one output per sample, got {tuple(outputs.shape)}"
        )
    y = labels.to(mu.dtype).reshape(-1)
    return F.softplus(-y * mu[:, 0]).mean()


def _margins(outputs: Tensor, labels: Tensor, loss: str) -> Tensor:
    """μ = y·f(x) per sample, for a model with one output logit."""
    mu = outputs.reshape(outputs.shape[0], -1)
    if mu.shape[1] != 1:
        raise ValueError(f"the {loss} loss needs one output per sample, got {tuple(outputs.shape)}")
    return labels.to(mu.dtype).reshape(-1) * mu[:, 0]


def _exponential(outputs: Tensor, labels: Tensor) -> Tensor:
    """Mean of exp(−y·μ), y ∈ {−1, +1}: R-GAP's Figure 1 exponential loss (:mod:`leakagelib.rgap.losses`)."""
    return torch.exp(-_margins(outputs, labels, "exponential")).mean()


def _hinge(outputs: Tensor, labels: Tensor) -> Tensor:
    """Mean of max(0, 1 − y·μ), y ∈ {−1, +1}: R-GAP's Figure 1 hinge loss."""
    return F.relu(1 - _margins(outputs, labels, "hinge")).mean()


_LOSSES: dict[str, LossFn] = {
    "ce": _cross_entropy,
    "logistic": _logistic,
    "exponential": _exponential,
    "hinge": _hinge,
}

#: The losses of one logit and a label y ∈ {−1, +1} (R-GAP's margin losses).
MARGIN_LOSSES = ("logistic", "exponential", "hinge")


def loss_function(name: str) -> LossFn:
    """The loss ``name`` ("ce", "logistic", "exponential" or "hinge") as ``fn(outputs, labels) -> scalar``."""
    if name not in _LOSSES:
        raise KeyError(f"unknown loss {name!r}; available losses: {', '.join(sorted(_LOSSES))}")
    return _LOSSES[name]


def client_loss(model: nn.Module, outputs: Tensor, labels: Tensor, *, loss: str = "ce") -> Tensor:
    """The loss a client trains on, whose gradient is its update.

    The mean ``loss`` of ``outputs`` (the model's forward pass just run) plus
    ``β·KL`` of every variational bottleneck that pass went through (CVB paper
    Eq. 3; the mean of :func:`kl_rows`, nothing for a model without one). The
    CVB authors' code shares this gradient, and simulates it in the attack,
    for their CVB models (``src/attacks.py``, ``get_gradient`` with
    ``config.training.loss``, ``VBLoss`` in ``configs/models/CNNCVB.yaml``):
    the paper's victim update is "a single training step". Training
    (:mod:`leakagelib.fl`), the client's update and the attacks' simulated one
    (:mod:`leakagelib.attacks.per_attack`,
    :func:`leakagelib.gradients.functional_gradient`) all use it.
    """
    kl = kl_rows(model)
    task = loss_function(loss)(outputs, labels)
    return task if kl is None else task + kl.mean()


def kl_rows(model: nn.Module) -> Tensor | None:
    """Each row's ``β·KL`` on the model's last forward pass, the term :func:`client_loss` adds
    (``None`` for a model without a variational bottleneck).

    :func:`leakagelib.defenses.bottlenecks.kl_loss_rows`; the attacks' hooked engine
    (:mod:`leakagelib.attacks.per_attack`) adds it to each row's loss.
    """
    # imported here, not at the top: the defenses package imports this module (through
    # leakagelib.gradients)
    from .defenses.bottlenecks import kl_loss_rows

    return kl_loss_rows(model)
