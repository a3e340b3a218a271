"""Optimisation attacks as (likelihood, prior, loop): one ``reconstruct`` for all of them.

The Bayes paper (Balunović et al. 2022, §4) shows that DLG, Inverting
Gradients, GradInversion and the Bayes-optimal adversary maximise the same
objective ``log p(g | x) + β log p(x)`` with different parts. The package
mirrors that: :mod:`.likelihoods`, :mod:`.priors`, the loop of :mod:`.loop`
(its settings in :mod:`.config`), the named attacks of :mod:`.presets` (one
registry, :data:`PRESETS`, whose ids name attacks in every record) and the
hyper-parameter search of :mod:`.search`. Every attack — presets,
:func:`reconstruct` and the closed-form :func:`bias_attack` — takes stacked
updates (a leading dimension ``N``, one update per client) and returns an
:class:`AttackResult`.

Introduced in the chapter "Existing attacks are approximations".
"""

from __future__ import annotations

from .attack import Attack, run_together
from .closed_form import bias_attack
from .config import AttackConfig, Setting
from .cosine import Cosine
from .likelihoods import Gaussian, Laplace, LayerSelection, Likelihood, Pruned
from .loop import image_bounds, reconstruct
from .network_priors import BatchNormStatistics, LabelAlignment, LogitLabelDistance, gradinversion
from .presets import PRESETS, preset
from .priors import (
    GaussianPrior,
    LaplacePrior,
    PixelRange,
    Prior,
    TotalVariation,
    Uniform,
    WeightedSum,
)
from .result import AttackResult

__all__ = [
    "PRESETS",
    "Attack",
    "AttackConfig",
    "AttackResult",
    "BatchNormStatistics",
    "Cosine",
    "Gaussian",
    "GaussianPrior",
    "LabelAlignment",
    "Laplace",
    "LogitLabelDistance",
    "LaplacePrior",
    "LayerSelection",
    "Likelihood",
    "PixelRange",
    "Prior",
    "Pruned",
    "Setting",
    "TotalVariation",
    "Uniform",
    "WeightedSum",
    "bias_attack",
    "gradinversion",
    "image_bounds",
    "preset",
    "reconstruct",
    "run_together",
]
