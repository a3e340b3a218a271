"""The closed-form input recovery from a fully connected layer with bias.

Phong et al. (2017), as written out in the Bayes paper (§5, "PRECODE"): for a
layer ``y = A x + b`` and one input, the chain rule gives

    dl/db_i = dl/dy_i      and      dl/dA_{i,:} = dl/dy_i · xᵀ = dl/db_i · xᵀ,

so every row ``i`` with ``dl/db_i ≠ 0`` yields ``x`` exactly. Instead of
picking one row we take the least-squares combination of all of them,
``x = Σ_i (dl/db_i)(dl/dA_{i,:}) / Σ_i (dl/db_i)²``, which equals the same
``x`` when the gradient is exact and averages out rounding otherwise.

:func:`bias_attack` takes the arguments of every attack (stacked updates,
labels, input shape) and returns the same
:class:`~leakagelib.attacks.result.AttackResult`. Used by the chapter "What a
client update reveals" (experiment ``intro/bias-attack``) and to break PRECODE
on an MLP (Bayes paper §6).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ..gradients import Update, check_update
from .result import AttackResult

__all__ = [
    "bias_attack",
    "first_linear_layer",
    "linear_inputs",
    "linear_layers",
    "recover_input_from_linear",
    "recover_linear_inputs",
]


def recover_input_from_linear(weight_grad: Tensor, bias_grad: Tensor) -> Tensor:
    """Recover the layer input ``x`` from ``dl/dA`` (…×m×n) and ``dl/db`` (…×m).

    Leading dimensions are batch dimensions (one single-image update each), so
    per-sample gradients of a whole batch are inverted in one call. Raises
    ``ValueError`` when the shapes disagree or when every bias gradient is zero
    (then the layer's gradient carries no information about ``x``).
    """
    if weight_grad.dim() < 2 or bias_grad.shape != weight_grad.shape[:-1]:
        raise ValueError(
            f"weight gradient …×m×n and bias gradient …×m expected, got "
            f"{tuple(weight_grad.shape)} and {tuple(bias_grad.shape)}"
        )
    energy = (bias_grad * bias_grad).sum(dim=-1, keepdim=True)
    if bool((energy == 0).any()):
        raise ValueError("every bias gradient is zero: the layer's gradient does not determine x")
    return torch.einsum("...m,...mn->...n", bias_grad, weight_grad) / energy


def first_linear_layer(model: nn.Module) -> str:
    """The name of the model's first parametrised module, which must be ``nn.Linear`` with bias."""
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear):
            if module.bias is None:
                raise ValueError(f"layer {name!r} has no bias: the closed-form attack needs one")
            return name
        if any(True for _ in module.parameters(recurse=False)):
            raise ValueError(
                f"the first parametrised layer {name!r} is a {type(module).__name__}, "
                "not a fully connected layer: the closed-form attack does not apply"
            )
    raise ValueError("model has no fully connected layer")


def bias_attack(
    model: nn.Module,
    updates: Update,
    labels: Tensor | None = None,
    *,
    input_shape: tuple[int, ...],
) -> AttackResult:
    """Invert every update of the stacked ``updates`` (leading dimension ``N``) to the model's input.

    The model must begin with a fully connected layer with bias (after a
    flatten); each update is one image's. ``labels`` is accepted so that every
    attack takes the same arguments; the closed form does not need them. The
    result has one setting, one restart and one input per update
    (``result.inputs()`` is ``N × input_shape``, in the model's input space and
    dtype) and no :class:`~leakagelib.attacks.config.Setting` (``settings`` is
    empty). Its ``objective`` is the relative residual of the rank-one fit,
    ``‖dl/dA − (dl/db) xᵀ‖² / ‖dl/dA‖²`` per update: 0 (up to rounding) when
    the update is one image's exact gradient, larger for a batch's mean
    gradient or a perturbed one.
    """
    n = check_update(model, updates, stacked=True)
    layer = first_linear_layer(model)
    prefix = f"{layer}." if layer else ""
    weight, bias = updates[prefix + "weight"], updates[prefix + "bias"]
    x = recover_input_from_linear(weight, bias)
    if x.shape[-1] != math.prod(input_shape):
        raise ValueError(
            f"the first layer takes {x.shape[-1]} inputs, but input_shape {tuple(input_shape)} "
            f"has {math.prod(input_shape)}; pass one input's shape, e.g. (C, H, W)"
        )
    fit = bias.unsqueeze(-1) * x.unsqueeze(-2)
    residual = (weight - fit).flatten(1).pow(2).sum(1) / weight.flatten(1).pow(2).sum(1)
    images = x.reshape(1, n, 1, *input_shape)
    return AttackResult(
        images=images,
        objective=residual.unsqueeze(0),
        all_images=images.unsqueeze(2),
        all_objective=residual.reshape(1, n, 1),
        settings=[],
    )


def linear_layers(model: nn.Module) -> list[str]:
    """Names of the model's fully connected layers that have a bias, in forward order."""
    return [n for n, m in model.named_modules() if isinstance(m, nn.Linear) and m.bias is not None]


def recover_linear_inputs(model: nn.Module, updates: Update) -> dict[str, Tensor]:
    """Apply the closed form to *every* biased linear layer: layer name → its recovered inputs.

    ``updates`` is stacked (leading dimension ``N``, one image's update each);
    each layer's recovered inputs are ``N × fan-in``. The first layer's input
    is the image; a deeper layer's input is the previous layer's activation —
    the update reveals it just as exactly. The chapter "What a client update
    reveals" compares these with :func:`linear_inputs`.
    """
    check_update(model, updates, stacked=True)
    return {
        name: recover_input_from_linear(updates[f"{name}.weight"], updates[f"{name}.bias"])
        for name in linear_layers(model)
    }


def linear_inputs(model: nn.Module, images: Tensor) -> dict[str, Tensor]:
    """The true (flattened) input of every biased linear layer for ``images``, via forward hooks."""
    seen: dict[str, Tensor] = {}
    wanted = set(linear_layers(model))
    handles = [
        module.register_forward_hook(
            lambda _m, args, _out, name=name: seen.__setitem__(name, args[0].detach().flatten(1))
        )
        for name, module in model.named_modules()
        if name in wanted
    ]
    try:
        with torch.no_grad():
            model(images)
    finally:
        for h in handles:
            h.remove()
    return seen
