"""Initialisation schemes of the papers' reference code.

Initialisation decides how large an untrained network's gradients are, and so
how much a fixed amount of defensive noise hides: the Bayes paper's networks,
built with Flax defaults, have gradients about four times larger than the same
CNN with PyTorch's defaults (see ``/work/shared/papers/README.md``). Every zoo
builder therefore takes an ``init`` option and defaults to the scheme its
paper's code used. The schemes:

``"torch"``
    PyTorch's own layer defaults (Kaiming-uniform with a = √5 for weights,
    U(±1/√fan_in) for biases), i.e. what ``nn.Conv2d``/``nn.Linear`` draw on
    construction. Used by the CVB code, R-GAP, and the Soteria/ATS code that
    the Bayes paper ran in PyTorch.
``"lecun"``
    Flax's defaults for ``nn.Dense``/``nn.Conv``: weights from
    ``lecun_normal`` — a normal truncated to ±2 standard units, rescaled so
    that the standard deviation is exactly 1/√fan_in (JAX's
    ``variance_scaling(1, "fan_in", "truncated_normal")`` divides by
    0.87962566103423978, the standard deviation of a standard normal truncated
    to (−2, 2)) — and zero biases. Used by the Bayes paper's own attacks
    (eth-sri/bayes-framework-leakage, ``bayes_optimal_attack/models/base_flax.py``).
``"uniform"``
    Every weight and bias from U(−scale, scale): DLG's ``weights_init``
    (scale 0.5, mit-han-lab/dlg ``models/vision.py``) and the Bayes authors'
    PRECODE training script (scale 0.05, ``defense_attacks/precode/train.py``).
``"kaiming"``
    The ResNet convention of torchvision and inverting-gradients: convolution
    weights from Kaiming-normal (fan_out, ReLU gain), normalisation weights 1
    and shifts 0; linear layers keep PyTorch's defaults.

Used by every builder in :mod:`leakagelib.models` and by the chapter on the
Bayesian framework, which compares the schemes' gradient scales.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

__all__ = ["SCHEMES", "TRUNCATED_NORMAL_STD", "initialise", "lecun_normal_"]

#: Standard deviation of a standard normal truncated to (−2, 2); JAX's
#: ``variance_scaling`` divides by it so that the truncated draw has the target std.
TRUNCATED_NORMAL_STD = 0.87962566103423978

SCHEMES = ("torch", "lecun", "uniform", "kaiming")

_AFFINE = (nn.Conv2d, nn.Linear)
_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.GroupNorm, nn.LayerNorm)


def lecun_normal_(tensor: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """Fill ``tensor`` in place as Flax's ``lecun_normal``: truncated normal, std 1/√fan_in.

    fan_in is ``tensor.shape[1] × receptive field`` (PyTorch's layout of
    ``nn.Linear``/``nn.Conv2d`` weights), equal to Flax's fan_in of the same layer.
    """
    fan_in, _ = nn.init._calculate_fan_in_and_fan_out(tensor)
    std = 1.0 / math.sqrt(fan_in) / TRUNCATED_NORMAL_STD
    return nn.init.trunc_normal_(tensor, 0.0, std, -2.0 * std, 2.0 * std, generator=generator)


def initialise(
    model: nn.Module,
    scheme: str,
    *,
    scale: float | None = None,
    generator: torch.Generator | None = None,
) -> nn.Module:
    """Re-initialise ``model``'s convolutions, linear and norm layers with ``scheme``.

    ``scale`` is the half-width of the ``"uniform"`` scheme (required there,
    rejected elsewhere). ``"torch"`` leaves the construction-time draw as it
    is. Other parameters (a ViT's class token and position embedding) are the
    builder's business. Returns ``model``.
    """
    if scheme not in SCHEMES:
        raise ValueError(f"unknown init scheme {scheme!r}; use one of {SCHEMES}")
    if (scale is not None) != (scheme == "uniform"):
        raise ValueError(
            f"init_scale is the half-width of the 'uniform' scheme; got init={scheme!r}, "
            f"init_scale={scale!r}"
        )
    if scheme == "uniform" and not scale > 0:
        raise ValueError(f"init_scale must be positive, got {scale!r}")
    with torch.no_grad():
        for module in model.modules():
            if scheme == "lecun" and isinstance(module, _AFFINE):
                lecun_normal_(module.weight, generator)
                if module.bias is not None:
                    module.bias.zero_()
            elif scheme == "uniform" and isinstance(module, _AFFINE):
                module.weight.uniform_(-scale, scale, generator=generator)
                if module.bias is not None:
                    module.bias.uniform_(-scale, scale, generator=generator)
            elif scheme == "kaiming" and isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(
                    module.weight, mode="fan_out", nonlinearity="relu", generator=generator
                )
            elif scheme == "kaiming" and isinstance(module, _NORMS) and module.weight is not None:
                module.weight.fill_(1.0)
                if module.bias is not None:
                    module.bias.zero_()
    return model
