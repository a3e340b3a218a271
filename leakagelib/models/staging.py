"""Shared plumbing of the model zoo: the input check and the stage layout.

Every zoo model is an ``nn.Sequential`` whose named children are its *stages*:
the first is always ``input`` (an :class:`InputCheck`, which rejects images of
the wrong shape with a ``ValueError`` naming the expected and the received
shape), the others are the paper's layers or blocks (``conv1``, ``fc1``,
``layer1``, ``block1``, ``head``, ...). A model-based defense (PRECODE, CVB) is
inserted *after* a stage; :func:`stages` lists the names in forward order, so
"after stage ``conv1``" is one unambiguous position, and "after ``input``" is
the position on the image itself.

Stages never use in-place operations, so every model runs under
:func:`torch.func.functional_call` with :func:`torch.func.vmap` (per-sample
gradients, batched attacks). The builders run one dry forward pass in eval mode
to size the first linear layer; that pass leaves batch-norm statistics alone.

Used by every module of :mod:`leakagelib.models` and by the chapters on
model-based defenses, which insert a bottleneck at a stage.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

import torch
from torch import Tensor, nn

__all__ = ["InputCheck", "activation", "dry_run_shape", "norm_layer", "staged", "stages"]


class InputCheck(nn.Module):
    """Identity on images of shape (N, C, H, W) = (N, *in_shape); ``ValueError`` otherwise.

    It sits at the entry of every zoo model, so a wrong-shaped batch fails with
    a sentence naming both shapes instead of a cryptic matrix-size error deep
    inside the network. Under :func:`torch.func.vmap` the check sees the
    per-sample shape, so callers add the batch axis (``x.unsqueeze(0)``).
    """

    def __init__(self, in_shape: tuple[int, int, int], model_name: str) -> None:
        super().__init__()
        self.in_shape = tuple(int(s) for s in in_shape)
        self.model_name = model_name

    def forward(self, x: Tensor) -> Tensor:
        if x.dim() != 4 or tuple(x.shape[1:]) != self.in_shape:
            c, h, w = self.in_shape
            raise ValueError(
                f"model {self.model_name!r} expects images of shape (N, C, H, W) = "
                f"(N, {c}, {h}, {w}), got shape {tuple(x.shape)}"
            )
        return x

    def extra_repr(self) -> str:
        return f"in_shape={self.in_shape}"


def staged(
    in_shape: tuple[int, int, int],
    model_name: str,
    named_stages: Iterable[tuple[str, nn.Module]],
) -> nn.Sequential:
    """An ``nn.Sequential`` of an :class:`InputCheck` followed by ``named_stages`` in order."""
    children: OrderedDict[str, nn.Module] = OrderedDict(input=InputCheck(in_shape, model_name))
    for name, module in named_stages:
        if name in children:
            raise ValueError(f"stage name {name!r} appears twice in model {model_name!r}")
        children[name] = module
    return nn.Sequential(children)


def stages(model: nn.Module) -> list[str]:
    """The insertion points of a zoo model: its stage names in forward order.

    A bottleneck inserted "after stage ``s``" receives the output of ``s``.
    Raises ``TypeError`` for a module that is not a staged zoo model.
    """
    if not isinstance(model, nn.Sequential) or not isinstance(
        next(iter(model.children()), None), InputCheck
    ):
        raise TypeError(
            "stages() needs a zoo model (an nn.Sequential whose first stage is an "
            f"InputCheck), got {type(model).__name__}"
        )
    return [name for name, _ in model.named_children()]


def dry_run_shape(module: nn.Module, in_shape: tuple[int, ...], model_name: str) -> torch.Size:
    """Output shape (without the batch axis) of ``module`` on one zero input of ``in_shape``.

    Runs in eval mode under ``no_grad`` (batch-norm statistics stay untouched)
    and turns a too-small input into a ``ValueError`` naming the model.
    """
    was_training = module.training
    module.eval()
    try:
        with torch.no_grad():
            out = module(torch.zeros(1, *in_shape))
    except RuntimeError as error:
        raise ValueError(
            f"input shape {tuple(in_shape)} is too small for model {model_name!r}: {error}"
        ) from error
    finally:
        module.train(was_training)
    if out.numel() == 0:
        raise ValueError(f"input shape {tuple(in_shape)} is too small for model {model_name!r}")
    return out.shape[1:]


_ACTIVATIONS = {
    "relu": nn.ReLU,
    "sigmoid": nn.Sigmoid,
    "tanh": nn.Tanh,
    "gelu": nn.GELU,
    "identity": nn.Identity,
}


def activation(name: str, *, negative_slope: float = 0.2) -> nn.Module:
    """A fresh activation module: "relu", "leaky_relu" (slope ``negative_slope``),
    "sigmoid", "tanh", "gelu" or "identity"."""
    if name == "leaky_relu":
        return nn.LeakyReLU(negative_slope)
    if name not in _ACTIVATIONS:
        known = sorted([*_ACTIVATIONS, "leaky_relu"])
        raise ValueError(f"unknown activation {name!r}; use one of {known}")
    return _ACTIVATIONS[name]()


def norm_layer(kind: str, channels: int, *, groups: int = 2, dims: int = 2) -> nn.Module:
    """A normalisation layer: "batch" (BatchNorm over ``dims`` = 1 or 2 spatial dims),
    "group" (GroupNorm with ``groups`` groups) or "none" (identity).

    Batch norm in training mode mixes the samples of a batch, so per-sample
    gradients under ``vmap`` need ``model.eval()`` (running statistics) or
    ``"group"``/``"none"``; group norm is per sample and vmaps in either mode.
    """
    if kind == "batch":
        return nn.BatchNorm2d(channels) if dims == 2 else nn.BatchNorm1d(channels)
    if kind == "group":
        if channels % groups:
            raise ValueError(
                f"group norm needs channels ({channels}) divisible by groups ({groups})"
            )
        return nn.GroupNorm(groups, channels)
    if kind == "none":
        return nn.Identity()
    raise ValueError(f"unknown norm {kind!r}; use 'batch', 'group' or 'none'")
