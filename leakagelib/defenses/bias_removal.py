"""Bias removal: the client does not share the gradients of its biases.

The closed-form attack of Phong et al. (2017) reads a fully connected layer's
input off the ratio of its weight and bias gradients (``dl/dA = dl/db · xᵀ``),
and it is what breaks PRECODE on an MLP (Bayes paper §6). Withholding the bias
gradients takes that ratio away. The CVB paper (Scheliga et al., §VI and
Table VII) weighs the other way of getting the same effect, a network built
without biases, against its cost in accuracy (experiment ``cvb/table7-bias``,
``models.build(..., bias=False)``); this module is the gradient-side version,
which leaves the model and its training unchanged.

The shared update keeps the model's shapes — bias entries are sent as zeros —
so every attack's shape checks still apply. The mechanism is deterministic:
``p(g | x)`` is a point mass at the weight gradients, and the bias entries say
nothing about ``x``. Its matched likelihood is therefore any of the noise-free
likelihoods restricted to the weights (:meth:`BiasRemoval.likelihood`, the
Gaussian or the cosine one as chosen by ``attack``); an
optimisation attack with it still recovers the input, which is the point the
chapter "What a client update reveals" makes: bias removal stops one attack,
not gradient leakage.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from ..gradients import Update
from .base import UpdateMechanism

if TYPE_CHECKING:
    from ..attacks.likelihoods import Likelihood

__all__ = ["BiasRemoval", "is_bias"]

_ATTACKS = ("gaussian", "cosine")


def is_bias(name: str) -> bool:
    """Whether a parameter name is a bias (``fc1.bias``, ``bias``)."""
    return name == "bias" or name.endswith(".bias")


class BiasRemoval(UpdateMechanism):
    """Send every bias gradient as zeros; the weight gradients go unchanged.

    ``attack`` ("gaussian" or "cosine") is the variant of the matched
    likelihood :meth:`likelihood` hands out.
    """

    def __init__(self, *, attack: str = "gaussian") -> None:
        if attack not in _ATTACKS:
            raise ValueError(
                f"attack must be one of {_ATTACKS} (the matched likelihood's form), got {attack!r}"
            )
        self.attack = attack

    def perturb(
        self, update: Update, generator: torch.Generator | None = None, *, stacked: bool = False
    ) -> Update:
        """The update with its bias entries zeroed; deterministic, so ``generator`` is unused.

        Raises ``ValueError`` when the update has no bias entry (nothing to remove:
        the model was probably built with ``bias=False``).
        """
        if not any(is_bias(k) for k in update):
            raise ValueError(
                "the update has no bias gradients to remove (parameter names: "
                f"{sorted(update)[:6]}{' …' if len(update) > 6 else ''})"
            )
        return {k: torch.zeros_like(g) if is_bias(k) else g.clone() for k, g in update.items()}

    def likelihood(self) -> Likelihood:
        """The matched likelihood: the ``attack`` form over the weight gradients only.

        The mechanism adds no noise, so the Gaussian's σ only rescales the
        objective (the prior weight β absorbs it); the cosine variant is the
        Inverting Gradients reading of the same selection.
        """
        from ..attacks.cosine import Cosine
        from ..attacks.likelihoods import Gaussian, LayerSelection

        weights_only = LayerSelection(include=lambda name: not is_bias(name))
        if self.attack == "gaussian":
            return Gaussian(layers=weights_only)
        return Cosine(layers=weights_only)

    def describe(self) -> dict[str, Any]:
        return {"defense": "bias-removal"}
