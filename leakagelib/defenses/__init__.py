"""Defenses against gradient leakage: mechanisms p(g | x), and the model defenses.

Every gradient defense implements :class:`~leakagelib.defenses.base.GradientDefense`:
``share(model, images, labels, generator)`` is what the client sends (clipping,
mask fitting and pruning happen inside) and ``likelihood()`` its matched
likelihood where tractable. Each lives in a module named for what it is
(``noise``, ``dpsgd``, ``compression``, ``bias_removal``, ``soteria``); ``ats``
holds the augmentation policies of ATS. The model defenses PRECODE and CVB
are layers (``bottlenecks``) inserted into a network (``surgery``). The public
classes are re-exported here: ``from leakagelib.defenses import GaussianNoise``.
"""

from .ats import ATSAugmentation
from .base import GradientDefense, NoDefense, UpdateMechanism
from .bias_removal import BiasRemoval
from .bottlenecks import CVB, PRECODE, TokenGrid, VariationalBottleneck, kl_loss, kl_loss_rows
from .compression import GradientCompression
from .dpsgd import DPSGD, ClippedGaussian, epsilon_spent
from .noise import GaussianNoise, LaplaceNoise, PruneNoise
from .soteria import Soteria, layer_drop_attack, layer_drop_likelihoods
from .surgery import apply_bottleneck_option, attacked_parameters, insert_bottleneck

__all__ = [
    "CVB",
    "DPSGD",
    "PRECODE",
    "ATSAugmentation",
    "BiasRemoval",
    "ClippedGaussian",
    "GaussianNoise",
    "GradientCompression",
    "GradientDefense",
    "LaplaceNoise",
    "NoDefense",
    "PruneNoise",
    "Soteria",
    "TokenGrid",
    "UpdateMechanism",
    "VariationalBottleneck",
    "apply_bottleneck_option",
    "attacked_parameters",
    "epsilon_spent",
    "insert_bottleneck",
    "kl_loss",
    "kl_loss_rows",
    "layer_drop_attack",
    "layer_drop_likelihoods",
]
