"""The closed-form input recovery from a fully connected layer with bias.

Phong et al. (2017), as written out in the Bayes paper (§5, "PRECODE"): for a
layer ``y = A x + b`` and one input, the chain rule gives

    dl/db_i = dl/dy_i      and      dl/dA_{i,:} = dl/dy_i · xᵀ = dl/db_i · xᵀ,

so every row ``i`` with ``dl/db_i ≠ 0`` yields ``x`` exactly. Instead of
picking one row we take the least-squares combination of all of them,
``x = Σ_i (dl/db_i)(dl/dA_{i,:}) / Σ_i (dl/db_i)²``, which equals the same
``x`` when the gradient is exact and averages out rounding otherwise.

Used by the chapter "What a client update reveals" (experiment
``intro/bias-attack``) and to break PRECODE on an MLP (Bayes paper §6).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..gradients import Update

__all__ = [
    "first_linear_layer",
    "linear_inputs",
    "linear_layers",
    "recover_input_from_linear",
    "recover_inputs_from_update",
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


def recover_inputs_from_update(
    model: nn.Module, update: Update, in_shape: tuple[int, ...], *, batched: bool = False
) -> Tensor:
    """Invert ``update`` (one image's, or per-sample with ``batched=True``) to the model's input.

    The model must begin with a fully connected layer with bias (after a
    flatten); the recovered vector is reshaped to ``in_shape`` (C×H×W), giving
    an image tensor of shape 1×C×H×W, or N×C×H×W with ``batched=True``.
    """
    layer = first_linear_layer(model)
    prefix = f"{layer}." if layer else ""
    try:
        weight, bias = update[prefix + "weight"], update[prefix + "bias"]
    except KeyError as err:
        raise ValueError(f"update lacks the gradient {err.args[0]!r} of the first layer") from err
    if not batched:
        weight, bias = weight.unsqueeze(0), bias.unsqueeze(0)
    x = recover_input_from_linear(weight, bias)
    numel = 1
    for s in in_shape:
        numel *= int(s)
    if x.shape[-1] != numel:
        raise ValueError(
            f"the first layer takes {x.shape[-1]} inputs, but in_shape {in_shape} has {numel}"
        )
    return x.reshape(x.shape[0], *in_shape)


def linear_layers(model: nn.Module) -> list[str]:
    """Names of the model's fully connected layers that have a bias, in forward order."""
    return [n for n, m in model.named_modules() if isinstance(m, nn.Linear) and m.bias is not None]


def recover_linear_inputs(
    model: nn.Module, update: Update, *, batched: bool = False
) -> dict[str, Tensor]:
    """Apply the closed form to *every* biased linear layer: layer name → its recovered input.

    The first layer's input is the image; a deeper layer's input is the
    previous layer's activation — the update reveals it just as exactly. The
    chapter "What a client update reveals" compares these with
    :func:`linear_inputs`.
    """
    out = {}
    for name in linear_layers(model):
        weight, bias = update[f"{name}.weight"], update[f"{name}.bias"]
        if not batched:
            weight, bias = weight.unsqueeze(0), bias.unsqueeze(0)
        out[name] = recover_input_from_linear(weight, bias)
    return out


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
