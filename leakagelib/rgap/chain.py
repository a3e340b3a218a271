"""Reading a sequential network as R-GAP's chain of (linear map, activation) stages.

R-GAP (Zhu & Blaschko 2021, equation 4) views a network as
``μ = y · w_d σ_{d-1}(W_{d-1} σ_{d-2}(… W_1 x))``: linear maps (fully connected
or convolutional) separated by element-wise activations. :func:`chain_of`
introspects any ``nn.Sequential`` (nested ones too) built from ``nn.Conv2d``,
``nn.Linear``, ``nn.Flatten`` and the activations below, and records each
stage's input shape, so that no table of layer sizes is ever written by hand.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from ..models.staging import InputCheck
from .constraints import ConvGeometry

__all__ = ["ACTIVATIONS", "Stage", "chain_of", "inverse"]

#: Activations R-GAP can invert element-wise (monotonic; ReLU only where positive).
ACTIVATIONS = (nn.LeakyReLU, nn.ReLU, nn.Sigmoid, nn.Tanh)

#: Modules that are the identity on R-GAP's path and are skipped: dropout at evaluation,
#: the zoo's shape check, and ``nn.Identity`` (e.g. the zoo ``mlp``'s ``norm=None`` slot,
#: or the identity "activation" after the authors' last layer).
_SKIPPED = (nn.Dropout, nn.Dropout2d, InputCheck, nn.Identity)


@dataclass
class Stage:
    """One linear map of the chain and the activation that follows it."""

    name: str
    layer: nn.Conv2d | nn.Linear
    activation: nn.Module | None
    in_shape: tuple[int, ...]
    out_shape: tuple[int, ...]

    @property
    def geometry(self) -> ConvGeometry:
        """The layer's geometry (see :class:`~leakagelib.rgap.constraints.ConvGeometry`)."""
        return ConvGeometry.of(self.layer, self.in_shape)

    @property
    def weight_key(self) -> str:
        """The update key of this layer's weight."""
        return f"{self.name}.weight" if self.name else "weight"

    @property
    def bias_key(self) -> str | None:
        """The update key of this layer's bias, or None."""
        if self.layer.bias is None:
            return None
        return f"{self.name}.bias" if self.name else "bias"


def _leaves(module: nn.Module, prefix: str) -> list[tuple[str, nn.Module]]:
    if isinstance(module, nn.Sequential):
        out: list[tuple[str, nn.Module]] = []
        for child_name, child in module.named_children():
            out.extend(_leaves(child, f"{prefix}.{child_name}" if prefix else child_name))
        return out
    return [(prefix, module)]


def chain_of(model: nn.Module, in_shape: tuple[int, int, int]) -> list[Stage]:
    """The (layer, activation) stages of ``model`` for one input of shape ``in_shape``.

    Raises ``TypeError`` naming the first module that is not a convolution,
    linear layer, flatten or supported activation (R-GAP's recursion needs a
    plain chain; residual networks are handled by the rank analysis alone).
    """
    stages: list[Stage] = []
    x = torch.zeros(1, *in_shape, dtype=torch.float64)
    param = next(model.parameters(), None)
    if param is not None:
        x = x.to(device=param.device, dtype=param.dtype)
    with torch.no_grad():
        for name, module in _leaves(model, ""):
            if isinstance(module, (nn.Conv2d, nn.Linear)):
                shape = tuple(x.shape[1:])
                x = module(x)
                stages.append(Stage(name, module, None, shape, tuple(x.shape[1:])))
            elif isinstance(module, ACTIVATIONS):
                if not stages or stages[-1].activation is not None:
                    raise TypeError(f"activation {name!r} does not follow a linear layer")
                stages[-1].activation = module
                x = module(x)
            elif isinstance(module, nn.Flatten):
                x = module(x)
            elif not isinstance(module, _SKIPPED):
                raise TypeError(
                    f"R-GAP cannot attack this model: module {name!r} ({type(module).__name__}) "
                    "is not part of a plain chain of Conv2d/Linear layers and invertible "
                    "element-wise activations (LeakyReLU, ReLU, Sigmoid, Tanh)"
                )
    if not stages:
        raise TypeError("the model has no Conv2d or Linear layer")
    return stages


def inverse(
    activation: nn.Module | None, f: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Undo ``activation`` on its output ``f``: (pre-activation z, σ'(z), known mask).

    ``known`` is False where z cannot be read off ``f`` (ReLU outputs that are
    zero: their pre-activation is any non-positive number, §3.1.2).
    """
    f = np.asarray(f, dtype=np.float64)
    known = np.ones(f.shape, dtype=bool)
    if activation is None or isinstance(activation, nn.Identity):
        return f.copy(), np.ones_like(f), known
    if isinstance(activation, nn.LeakyReLU):
        slope = float(activation.negative_slope)
        if slope <= 0:
            raise ValueError("a LeakyReLU with a non-positive slope cannot be inverted")
        neg = f < 0
        return np.where(neg, f / slope, f), np.where(neg, slope, 1.0), known
    if isinstance(activation, nn.ReLU):
        scale = np.abs(f).max() if f.size else 0.0
        known = f > 1e-10 * scale
        return np.where(known, f, 0.0), known.astype(np.float64), known
    if isinstance(activation, nn.Sigmoid):
        s = np.clip(f, 1e-15, 1 - 1e-15)
        return np.log(s) - np.log1p(-s), s * (1 - s), known
    if isinstance(activation, nn.Tanh):
        t = np.clip(f, -1 + 1e-15, 1 - 1e-15)
        return np.arctanh(t), 1 - t * t, known
    raise TypeError(f"cannot invert activation {type(activation).__name__}")
