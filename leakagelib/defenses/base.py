"""The interface every gradient defense implements.

A defense is a mechanism p(g | x): it maps the true client update to the
update the server sees. Where that distribution is tractable, the defense also
hands out its matched likelihood, so that the Bayes-optimal attacker of the
Bayes paper (§4) is simply ``reconstruct(..., likelihood=defense.likelihood())``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:  # the likelihood family lives with the attacks
    from ..attacks.likelihoods import Likelihood

Update = dict[str, torch.Tensor]


class GradientDefense(ABC):
    """A randomised map from a client update to the shared update."""

    @abstractmethod
    def apply(self, update: Update, generator: torch.Generator | None = None) -> Update:
        """The defended update; ``update`` is not modified."""

    def __call__(self, update: Update, generator: torch.Generator | None = None) -> Update:
        return self.apply(update, generator)

    def likelihood(self) -> Likelihood:
        """The likelihood p(g | x) this mechanism induces, for the matched (Bayes) attack.

        Defenses whose distribution is intractable raise ``NotImplementedError``
        with a sentence saying why; the book's chapters then attack them with
        the heuristic likelihoods instead.
        """
        raise NotImplementedError(f"{type(self).__name__} has no tractable likelihood p(g|x)")

    def describe(self) -> dict[str, Any]:
        """The defense's name and parameters, for experiment rows."""
        return {"defense": type(self).__name__}
