"""Likelihoods log p(g | x): how the shared update g relates to the simulated one.

The Bayes paper (Balunović et al. 2022, §4 and Table 1) reads every
optimisation attack as maximising ``log p(g | x) + β log p(x)``. This module
holds the first half. A likelihood compares the *observed* update ``g`` with
the update ``s = ∇θ ℓ(h_θ(x), y)`` the attacker simulates for a candidate
``x`` and returns ``log p(g | x)`` up to an additive constant:

* :class:`Gaussian` — noise N(0, σ²): ``-‖g − s‖² / 2σ²`` (DLG's ℓ2 distance);
* :class:`Laplace` — noise Lap(0, b): ``-‖g − s‖₁ / b`` (the ℓ1 attack);
* :class:`~.cosine.Cosine` (module :mod:`.cosine`) — ``-(1 − cos(g, s))``
  (Inverting Gradients), or one cosine over each block of ``group``
  consecutive updates (the Bayes authors' ``cos_sim_global``);
* :class:`Pruned` — a random keep-mask then Gaussian or Laplace noise (the
  "prune + noise" defenses of Table 2): with the mask known, the noise
  likelihood on the kept entries and ``g`` against 0 on the pruned ones; with
  the mask unknown, the per-entry mixture
  ``p·N(g; s, σ²) + (1 − p)·N(g; 0, σ²)``.

*Which layers count, and with what weight* is a :class:`LayerSelection`: all
layers, a subset (a list of parameter names, layer indices or a predicate on
names) and a weighting (uniform, or the exponential decay of Inverting
Gradients). The "ignore the bottleneck" attack on PRECODE/CVB and the
layer-drop attack on Soteria are likelihoods with a subset selection.

Every ``log_prob`` is a pure tensor function, safe under :func:`torch.func.vmap`
and :func:`torch.func.grad`. Used by the chapters "Existing attacks are
approximations" and "Bayes versus heuristics under defenses".
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import torch
from torch import Tensor
from torch.func import vmap

from .per_attack import Observed, Simulated
from .residuals import residual_sums

Update = dict[str, Tensor]
#: The selected parameters of a batch of attacks and each one's weight per setting (``h``).
Weighted = list[tuple[str, Tensor]]

__all__ = [
    "WEIGHTINGS",
    "Gaussian",
    "Laplace",
    "LayerSelection",
    "Likelihood",
    "Pruned",
    "layer_groups",
]

#: Layer weightings a :class:`LayerSelection` (and the hyper-parameter search) accepts.
WEIGHTINGS = ("uniform", "exponential")


def layer_groups(names: Sequence[str]) -> list[int]:
    """The layer index of each parameter name: a layer is a module prefix.

    ``conv1.weight`` and ``conv1.bias`` share layer 0, ``fc.weight`` is layer 1,
    so a weighting gives a layer's weight and bias the same factor (as the
    authors' code does, eth-sri/bayes-framework-leakage, utils/flax_losses.py).
    """
    index: dict[str, int] = {}
    out = []
    for name in names:
        prefix = name.rsplit(".", 1)[0] if "." in name else name
        out.append(index.setdefault(prefix, len(index)))
    return out


@dataclass(frozen=True)
class LayerSelection:
    """Which layers of an update a likelihood reads, and how each is weighted.

    ``include`` picks the parameters that count: ``None`` (all), a sequence of
    parameter names (``"fc.weight"``) or of layer indices (ints, negative
    allowed, counted over :func:`layer_groups`), or a predicate on the name.
    ``weighting`` is ``"uniform"`` or ``"exponential"``: layer ``l`` (counted
    over the *selected* layers, first = 0) gets weight ``exp(-l)``, the
    normalisation of the Bayes authors' code, which follows the exponential
    layer weights Inverting Gradients introduced (Geiping et al. 2020).
    """

    include: Sequence[str] | Sequence[int] | Callable[[str], bool] | None = None
    weighting: str = "uniform"

    def __post_init__(self) -> None:
        if self.weighting not in WEIGHTINGS:
            raise ValueError(f"unknown layer weighting {self.weighting!r}; use one of {WEIGHTINGS}")

    def mask(self, names: Sequence[str]) -> list[bool]:
        """Whether each parameter in ``names`` is selected."""
        names = list(names)
        inc = self.include
        if inc is None:
            chosen = [True] * len(names)
        elif callable(inc):
            chosen = [bool(inc(n)) for n in names]
        else:
            items = list(inc)
            if all(isinstance(i, int) and not isinstance(i, bool) for i in items):
                groups = layer_groups(names)
                n_layers = max(groups) + 1 if groups else 0
                wanted = set()
                for i in items:
                    if not -n_layers <= i < n_layers:
                        raise ValueError(f"layer index {i} is out of range for {n_layers} layers")
                    wanted.add(i % n_layers)
                chosen = [g in wanted for g in groups]
            elif all(isinstance(i, str) for i in items):
                unknown = [i for i in items if i not in names]
                if unknown:
                    raise KeyError(f"layer selection names parameters {unknown} the update lacks")
                chosen = [n in items for n in names]
            else:
                raise TypeError("include must be parameter names, layer indices or a predicate")
        if not any(chosen):
            raise ValueError("the layer selection keeps no parameter of the update")
        return chosen

    def weights(self, names: Sequence[str], weighting: str | None = None) -> Tensor:
        """A weight per parameter tensor (0 where not selected), float64 on the CPU.

        ``weighting`` overrides this selection's own (the search tries both).
        """
        weighting = self.weighting if weighting is None else weighting
        if weighting not in WEIGHTINGS:
            raise ValueError(f"unknown layer weighting {weighting!r}; use one of {WEIGHTINGS}")
        chosen = self.mask(names)
        groups = layer_groups(names)
        kept = sorted({g for g, c in zip(groups, chosen, strict=True) if c})
        rank = {g: r for r, g in enumerate(kept)}
        out = []
        for g, c in zip(groups, chosen, strict=True):
            if not c:
                out.append(0.0)
            elif weighting == "uniform":
                out.append(1.0)
            else:
                out.append(math.exp(-rank[g]))
        return torch.tensor(out, dtype=torch.float64)


class Likelihood(ABC):
    """log p(g | x) up to a constant, comparing an observed and a simulated update.

    ``log_prob(observed, simulated, weights)`` takes two updates with the same
    names and a weight per parameter tensor (from :meth:`weights`) and returns
    a scalar. Subclasses implement :meth:`_terms` (per-parameter sums) or
    override :meth:`log_prob` when the likelihood does not split over layers.
    """

    layers: LayerSelection
    #: How many consecutive updates (along ``N``) one value of the likelihood couples: 1 for
    #: every likelihood but a grouped :class:`~.cosine.Cosine`.
    group: int = 1

    def check_updates(self, n_updates: int) -> None:
        """Raise unless ``n_updates`` updates split into blocks of :attr:`group`."""
        if n_updates % self.group:
            raise ValueError(
                f"{type(self).__name__}(group={self.group}) compares blocks of {self.group} "
                f"consecutive updates, but got N = {n_updates} updates, not a multiple of "
                f"{self.group}"
            )

    def weights(self, names: Sequence[str], weighting: str | None = None) -> Tensor:
        """This likelihood's weight per parameter tensor of an update with ``names``."""
        return self.layers.weights(names, weighting)

    def log_prob(self, observed: Update, simulated: Update, weights: Tensor) -> Tensor:
        """Weighted sum over parameter tensors of the per-tensor log-likelihoods."""
        terms = self._terms(observed, simulated)
        return (torch.stack(terms) * weights.to(terms[0].dtype)).sum()

    def _terms(self, observed: Update, simulated: Update) -> list[Tensor]:
        """Per-parameter-tensor log-likelihoods; a subclass that splits over layers defines it."""
        raise NotImplementedError(f"{type(self).__name__} defines neither _terms nor log_prob")

    def batched_log_prob(
        self, observed: Observed, simulated: Simulated, weighted: Weighted
    ) -> Tensor:
        """:meth:`log_prob` of ``h × N × M`` attacks at once (the hooked route of :mod:`.per_attack`).

        ``weighted`` lists the selected parameters with their weight in each
        of the ``h`` settings. This general form materialises every simulated
        gradient and maps :meth:`log_prob` over the attacks; likelihoods that
        need only squared distances or inner products override it.
        """
        names = [k for k, _ in weighted]
        g = {k: observed.update[k] for k in names}
        s = {k: simulated.tensor(k) for k in names}
        w = torch.stack([v for _, v in weighted], dim=1)
        f = vmap(self.log_prob, in_dims=(None, 0, None))  # restarts × samples: M
        f = vmap(f, in_dims=(0, 0, None))  # updates: N
        return vmap(f, in_dims=(None, 0, 0))(g, s, w)  # settings: h

    def to(self, device: str | torch.device) -> Likelihood:
        """This likelihood with its tensors (if any) on ``device``."""
        return self

    @abstractmethod
    def describe(self) -> dict[str, object]:
        """Name and parameters, for experiment rows and the Table 1 chapter."""


@dataclass(frozen=True)
class Gaussian(Likelihood):
    """Gaussian noise of standard deviation ``sigma``: ``-Σ (g − s)² / (2σ²)``.

    With a uniform prior this is DLG's objective (Table 1); the matched
    likelihood of :class:`leakagelib.defenses.noise.GaussianNoise`.
    """

    sigma: float = 1.0
    layers: LayerSelection = field(default_factory=LayerSelection)

    def __post_init__(self) -> None:
        if not self.sigma > 0:
            raise ValueError(f"sigma must be positive, got {self.sigma}")

    def _terms(self, observed: Update, simulated: Update) -> list[Tensor]:
        c = 1.0 / (2.0 * self.sigma**2)
        return [-c * (observed[k] - simulated[k]).pow(2).sum() for k in observed]

    def batched_log_prob(
        self, observed: Observed, simulated: Simulated, weighted: Weighted
    ) -> Tensor:
        c = 1.0 / (2.0 * self.sigma**2)
        return -c * sum(w[:, None, None] * simulated.sq_dist(k, observed) for k, w in weighted)

    def describe(self) -> dict[str, object]:
        return {"likelihood": "gaussian", "sigma": self.sigma, "weighting": self.layers.weighting}


@dataclass(frozen=True)
class Laplace(Likelihood):
    """Laplace noise of scale ``b``: ``-Σ |g − s| / b`` (the ℓ1 attack)."""

    b: float = 1.0
    layers: LayerSelection = field(default_factory=LayerSelection)

    def __post_init__(self) -> None:
        if not self.b > 0:
            raise ValueError(f"b must be positive, got {self.b}")

    def _terms(self, observed: Update, simulated: Update) -> list[Tensor]:
        return [-(observed[k] - simulated[k]).abs().sum() / self.b for k in observed]

    def batched_log_prob(
        self, observed: Observed, simulated: Simulated, weighted: Weighted
    ) -> Tensor:
        sums = (w[:, None, None] * residual_sums(simulated, k, observed, 1) for k, w in weighted)
        return -sum(sums) / self.b

    def describe(self) -> dict[str, object]:
        return {"likelihood": "laplace", "b": self.b, "weighting": self.layers.weighting}


NOISES = ("gaussian", "laplace")


@dataclass(frozen=True)
class Pruned(Likelihood):
    """Random pruning (keep probability ``keep``) followed by Gaussian or Laplace noise.

    ``noise`` is ``"gaussian"`` (``scale`` = σ) or ``"laplace"`` (``scale`` = b).
    With ``masks`` (an update of 0/1 tensors: the defense's fixed per-layer
    keep-mask, known to the attacker as in the authors' code,
    eth-sri/bayes-framework-leakage, defenses/noise_defenses.py) the
    likelihood is the noise density of ``g`` around ``mask · s``. With
    ``masks=None`` the mask is marginalised entry by entry:
    ``log(keep·q(g − s) + (1 − keep)·q(g))``, q the noise density.
    """

    noise: str = "gaussian"
    scale: float = 0.1
    keep: float = 0.5
    masks: Update | None = None
    layers: LayerSelection = field(default_factory=LayerSelection)

    def __post_init__(self) -> None:
        if self.noise not in NOISES:
            raise ValueError(f"unknown noise {self.noise!r}; use one of {NOISES}")
        if not self.scale > 0:
            raise ValueError(f"scale must be positive, got {self.scale}")
        if not 0.0 < self.keep <= 1.0:
            raise ValueError(f"keep must be in (0, 1], got {self.keep}")

    def _log_q(self, r: Tensor) -> Tensor:
        if self.noise == "gaussian":
            return -r.pow(2) / (2.0 * self.scale**2)
        return -r.abs() / self.scale

    def _terms(self, observed: Update, simulated: Update) -> list[Tensor]:
        out = []
        for k in observed:
            g, s = observed[k], simulated[k]
            if self.masks is not None:
                out.append(self._log_q(g - self.masks[k] * s).sum())
            elif self.keep == 1.0:
                out.append(self._log_q(g - s).sum())
            else:
                kept = self._log_q(g - s) + math.log(self.keep)
                pruned = self._log_q(g) + math.log(1.0 - self.keep)
                out.append(torch.logaddexp(kept, pruned).sum())
        return out

    def batched_log_prob(
        self, observed: Observed, simulated: Simulated, weighted: Weighted
    ) -> Tensor:
        if self.masks is None and self.keep < 1.0:  # the marginalised mask: the general form
            return super().batched_log_prob(observed, simulated, weighted)
        power, c = (
            (2, 1.0 / (2.0 * self.scale**2)) if self.noise == "gaussian" else (1, 1 / self.scale)
        )
        masks = self.masks or {}
        return -c * sum(
            w[:, None, None] * residual_sums(simulated, k, observed, power, masks.get(k))
            for k, w in weighted
        )

    def to(self, device: str | torch.device) -> Pruned:
        if self.masks is None:
            return self
        return replace(
            self, masks={k: m.to(device=device, dtype=torch.float32) for k, m in self.masks.items()}
        )

    def describe(self) -> dict[str, object]:
        return {
            "likelihood": f"pruned-{self.noise}",
            "scale": self.scale,
            "keep": self.keep,
            "mask_known": self.masks is not None,
            "weighting": self.layers.weighting,
        }
