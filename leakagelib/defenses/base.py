"""The contract every gradient defense implements: a mechanism p(g | x).

A defense is what a client runs between its data and the server. Its one
entry point, :meth:`GradientDefense.share`, takes the model and the client's
batch and returns the update the server sees; whatever the mechanism needs
happens inside — per-sample clipping (DP-SGD), fitting a mask to the data
(Soteria), drawing a pruning mask (prune + noise). Where the distribution
p(g | x) is tractable, :meth:`GradientDefense.likelihood` (no arguments, for
every defense) hands out its matched likelihood, so the Bayes-optimal
attacker of the Bayes paper (§4) is simply
``reconstruct(..., likelihood=defense.likelihood())``.

:class:`UpdateMechanism` is the base of the mechanisms that act on an update
already computed (noise, pruning, compression, bias removal): it computes the
update and hands it to :meth:`UpdateMechanism.perturb`. :class:`NoDefense`
shares the update unchanged, so callers never special-case "no defense".

``share(..., per_image=True)`` treats every image as its own client with a
batch of one and returns the N updates stacked (leading dimension N), in one
vectorised program; this is how the book's experiments attack N images at once.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn
from torch.func import functional_call, grad, vmap

from ..gradients import Update, check_batch, client_update, params_of, per_sample_updates

if TYPE_CHECKING:  # the likelihood family lives with the attacks
    from ..attacks.likelihoods import Likelihood

__all__ = [
    "GradientDefense",
    "NoDefense",
    "Objective",
    "UpdateMechanism",
    "client_gradients",
]

#: A client's objective as a function of (model, images, labels) → scalar, e.g.
#: :func:`leakagelib.fl.training_loss` (cross-entropy plus a bottleneck's β·KL).
Objective = Callable[[nn.Module, Tensor, Tensor], Tensor]


class GradientDefense(ABC):
    """A randomised map from a client's data to the update it shares."""

    @abstractmethod
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
        """What the client sends for the batch ``(images, labels)``.

        ``per_image=False``: one client whose batch is ``images`` → one update
        (parameter name → tensor). ``per_image=True``: every image is its own
        client with a batch of one → the N updates stacked with a leading
        dimension N. ``loss`` names a loss of :mod:`leakagelib.gradients`
        ("ce", "logistic") or is an :data:`Objective` the client differentiates
        (training passes :func:`leakagelib.fl.training_loss`). All randomness
        of the mechanism comes from ``generator``; the model is not changed.
        """

    def likelihood(self) -> Likelihood:
        """The likelihood p(g | x) this mechanism induces, for the matched (Bayes) attack.

        Whatever it needs (a mask, a batch size, the attack's variant) was bound
        when the defense was built or last shared. Defenses whose distribution
        is intractable raise ``NotImplementedError`` with a sentence saying why;
        the book's chapters then attack them with the heuristic likelihoods.
        """
        raise NotImplementedError(f"{type(self).__name__} has no tractable likelihood p(g|x)")

    def state_dict(self) -> dict[str, Any]:
        """What the defense has accumulated over its shares (none by default; DP-SGD's privacy
        ledger), for a training run's checkpoint (:func:`leakagelib.fedavg.federated_averaging`)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Take back a :meth:`state_dict` (a stateless defense has nothing to take back)."""
        if state:
            raise ValueError(f"{type(self).__name__} keeps no state; got {sorted(state)}")

    def describe(self) -> dict[str, Any]:
        """The defense's name and parameters, for experiment rows."""
        return {"defense": type(self).__name__}


class UpdateMechanism(GradientDefense):
    """A defense that perturbs the client's update once it is computed.

    :meth:`share` computes the update of the batch (or every image's own
    update, stacked) and passes it to :meth:`perturb`.
    """

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
        update = client_gradients(model, images, labels, per_image=per_image, loss=loss)
        return self.perturb(update, generator, stacked=per_image)

    @abstractmethod
    def perturb(
        self, update: Update, generator: torch.Generator | None = None, *, stacked: bool = False
    ) -> Update:
        """The shared version of ``update``; ``update`` is not modified.

        ``stacked=True``: every tensor has a leading dimension N of independent
        clients' updates; random perturbations are drawn independently for
        every slice.
        """


class NoDefense(UpdateMechanism):
    """Share the update as it is; its likelihood is the plain Gaussian (the ℓ2 attack)."""

    def perturb(
        self, update: Update, generator: torch.Generator | None = None, *, stacked: bool = False
    ) -> Update:
        return dict(update)

    def likelihood(self) -> Likelihood:
        from ..attacks.likelihoods import Gaussian

        return Gaussian()

    def describe(self) -> dict[str, Any]:
        return {"defense": "none"}


# ----------------------------------------------------------------------------- helpers


def client_gradients(
    model: nn.Module,
    images: Tensor,
    labels: Tensor,
    *,
    per_image: bool,
    loss: str | Objective,
) -> Update:
    """The undefended update of the batch, or (``per_image``) every image's own update stacked.

    A loss name goes to :func:`leakagelib.gradients.client_update` /
    :func:`~leakagelib.gradients.per_sample_updates`; an :data:`Objective` is
    differentiated directly (per image through ``vmap``, with independent
    randomness per image, as for the named losses). Either way the batch is
    checked first (:func:`leakagelib.gradients.check_batch`: no empty batch,
    no NaN pixels, labels that are class indices of the model).
    """
    if isinstance(loss, str):  # the gradients module checks the batch
        if per_image:
            return per_sample_updates(model, images, labels, loss=loss)
        return client_update(model, images, labels, loss=loss)
    if not callable(loss):
        raise TypeError(f"loss must be a loss name or a callable objective, got {loss!r}")
    check_batch(model, images, labels)  # a callable objective classifies, as training's does
    if per_image:
        return _per_sample_objective(model, images, labels, loss)
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    params = [p for p in model.parameters() if p.requires_grad]
    grads = torch.autograd.grad(loss(model, images, labels), params)
    return {n: g.detach() for n, g in zip(names, grads, strict=True)}


class _Bound(nn.Module):
    """``objective(model, images, labels)`` as a module, so ``functional_call`` can swap its parameters."""

    def __init__(self, model: nn.Module, objective: Objective) -> None:
        super().__init__()
        self.model = model
        self.objective = objective

    def forward(self, images: Tensor, labels: Tensor) -> Tensor:
        return self.objective(self.model, images, labels)


def _per_sample_objective(
    model: nn.Module, images: Tensor, labels: Tensor, objective: Objective
) -> Update:
    """Each image's gradient of ``objective`` on a batch of one, stacked (one ``vmap``)."""
    bound = _Bound(model, objective)
    buffers = {f"model.{k}": v for k, v in model.named_buffers()}

    def value(params: Update, x: Tensor, y: Tensor) -> Tensor:
        return functional_call(bound, {**params, **buffers}, (x.unsqueeze(0), y.unsqueeze(0)))

    params = {f"model.{k}": v for k, v in params_of(model).items()}
    grads = vmap(grad(value), in_dims=(None, 0, 0), randomness="different")(params, images, labels)
    return {k.removeprefix("model."): v for k, v in grads.items()}


def require(name: str, value: float, ok: Callable[[float], bool], expected: str) -> float:
    """``value`` as a float when it is finite and ``ok``; else a ``ValueError`` saying what to pass.

    ``expected`` completes "``name`` must be ...", e.g. "a finite positive number
    (the noise's standard deviation)".
    """
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be {expected}, got {value!r}") from None
    if not math.isfinite(number) or not ok(number):
        raise ValueError(f"{name} must be {expected}, got {value!r}")
    return number
