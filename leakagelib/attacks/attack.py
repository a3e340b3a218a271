"""An optimisation attack as one object: :class:`Attack` = likelihood, prior, loop and label source.

The presets of :mod:`.presets` build these; calling one runs
:func:`leakagelib.attacks.loop.reconstruct` on stacked updates (a leading
dimension ``N``, one per client), and :func:`run_together` runs several on
the same updates as settings of one batched program (Bayes versus the
heuristic distances of Table 2, Soteria's direct versus layer-drop attack).
Used by every experiment and the chapter "Existing attacks are approximations".
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import Tensor, nn

from ..gradients import recover_label_idlg
from .config import AttackConfig, Setting
from .likelihoods import Likelihood
from .loop import reconstruct
from .priors import Prior
from .result import AttackResult

Update = dict[str, Tensor]
#: Which parameters a likelihood reads: names, layer indices, a predicate, or ``None`` (all).
Include = Sequence[str] | Sequence[int] | Callable[[str], bool] | None

__all__ = ["LABEL_MODES", "Attack", "Include", "restrict", "run_together"]

LABEL_MODES = ("given", "optimize", "idlg")


@dataclass(frozen=True)
class Attack:
    """A named optimisation attack: likelihood, prior, loop and how labels are obtained.

    ``name`` is the registry id that records use (``"idlg"``), ``title`` the
    name in prose (``"iDLG"``). ``labels`` is ``"given"`` (the caller passes
    them), ``"optimize"`` (soft labels optimised jointly, DLG) or ``"idlg"``
    (read off the last layer's gradient, one image per update).
    """

    name: str
    title: str
    likelihood: Likelihood
    prior: Prior
    config: AttackConfig
    labels: str = "given"

    def __post_init__(self) -> None:
        if self.labels not in LABEL_MODES:
            raise ValueError(f"unknown label mode {self.labels!r}; use one of {LABEL_MODES}")

    def with_config(self, **changes: Any) -> Attack:
        """This attack with some loop settings changed (``steps=50``, ``beta=0.1``, ...)."""
        return replace(self, config=replace(self.config, **changes))

    def on_layers(self, include: Include) -> Attack:
        """This attack with a likelihood that reads only the parameters ``include`` selects.

        ``include`` is a :class:`~leakagelib.attacks.likelihoods.LayerSelection`
        ``include`` (parameter names, layer indices, a predicate, or ``None``
        for every layer): the "ignore the bottleneck" attack on PRECODE and
        CVB, and Soteria's layer-drop attack. The layer weighting is kept.
        """
        return replace(self, likelihood=_with_include(self.likelihood, include))

    def parts(self) -> dict[str, Any]:
        """The attack's ingredients as plain data (the Table 1 chapter prints these)."""
        return {
            "attack": self.name,
            "prior": self.prior.describe(),
            "likelihood": self.likelihood.describe(),
            "optimizer": self.config.optimizer,
            "steps": self.config.steps,
            "labels": self.labels,
        }

    def labels_for(self, model: nn.Module, updates: Update, labels: Tensor | None) -> Tensor | None:
        """The labels the attack runs with: ``labels``, iDLG's per update, or ``None`` (DLG)."""
        if self.labels == "optimize":
            return None
        if self.labels == "idlg":
            n = next(iter(updates.values())).shape[0]
            slices = ({k: v[i] for k, v in updates.items()} for i in range(n))
            return torch.tensor([[recover_label_idlg(model, u)] for u in slices])
        if labels is None:
            raise ValueError(f"the {self.title} attack needs the labels (labels=...)")
        return labels

    def __call__(
        self,
        model: nn.Module,
        updates: Update,
        *,
        input_shape: tuple[int, ...],
        labels: Tensor | None = None,
        num_images: int = 1,
        **options: Any,
    ) -> AttackResult:
        """Attack the stacked ``updates`` (leading dimension ``N``, one per client).

        ``labels`` (``N`` or ``N × n``) are used in the ``"given"`` mode and
        ignored otherwise; ``num_images`` is the inputs per update when labels
        are optimised. ``options`` go to :func:`leakagelib.attacks.reconstruct`
        (``bounds``, ``generator``, ``device``, ``callback``, ``initial``, ...).
        """
        return run_together(
            model,
            updates,
            [self],
            input_shape=input_shape,
            labels=labels,
            num_images=num_images,
            **options,
        )


def _loop_of(config: AttackConfig) -> AttackConfig:
    """``config`` without the fields a :class:`Setting` may change within a batch."""
    return replace(config, lr=1.0, decay=1.0, beta=0.0, weighting=None)


def run_together(
    model: nn.Module,
    updates: Update,
    attacks: Sequence[Attack],
    *,
    input_shape: tuple[int, ...],
    labels: Tensor | None = None,
    settings: Sequence[Setting] | None = None,
    names: Sequence[str] | None = None,
    num_images: int = 1,
    **options: Any,
) -> AttackResult:
    """Several attacks on the same stacked ``updates`` as settings of one batched program.

    ``attacks[h]`` runs with ``settings[h]`` (default: its own
    ``config.setting()``). The attacks must share their loop — the
    :class:`~leakagelib.attacks.config.AttackConfig` up to the fields of a
    :class:`Setting` — and their label mode; they start from the same
    iterates (common random numbers). The result's settings are named by
    ``names``, by default the attacks' names when these are unique. Bayes
    versus ℓ2/ℓ1/cosine (Table 2) and Soteria's direct versus layer-drop
    attack run this way.
    """
    attacks = list(attacks)
    if not attacks or any(not isinstance(a, Attack) for a in attacks):
        raise TypeError(f"attacks must be a non-empty sequence of Attack, got {attacks!r}")
    first = attacks[0]
    for a in attacks[1:]:
        if _loop_of(a.config) != _loop_of(first.config) or a.labels != first.labels:
            raise ValueError(
                f"attacks {first.name!r} and {a.name!r} differ in their loop or label mode; "
                "only settings (lr, decay, beta, weighting) may differ within one batch"
            )
    settings = list(settings) if settings is not None else [a.config.setting() for a in attacks]
    if names is None and len({a.name for a in attacks}) == len(attacks):
        names = [a.name for a in attacks]
    if first.labels == "idlg" and num_images != 1:
        raise ValueError(f"{first.title} reads one label per update; use num_images=1")
    labels = first.labels_for(model, updates, labels)
    return reconstruct(
        model,
        updates,
        labels=labels,
        likelihood=[a.likelihood for a in attacks],
        prior=[a.prior for a in attacks],
        config=first.config,
        input_shape=input_shape,
        num_images=num_images if labels is None else None,
        settings=settings,
        names=names,
        **options,
    )


def _with_include(likelihood: Likelihood, include: Include) -> Likelihood:
    """``likelihood`` reading the parameters ``include`` selects (``None``: all of them)."""
    include = list(include) if include is not None and not callable(include) else include
    return replace(likelihood, layers=replace(likelihood.layers, include=include))


def restrict(likelihood: Likelihood, include: Include) -> Likelihood:
    """``likelihood`` restricted to ``include`` (``None`` leaves it as it is): the presets' ``include``."""
    return likelihood if include is None else _with_include(likelihood, include)
