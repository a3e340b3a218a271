"""Model surgery: insert a variational bottleneck (PRECODE, CVB) into a zoo model.

:func:`insert_bottleneck` places a bottleneck at a position of a model,
:func:`apply_bottleneck_option` is what ``models.build(..., bottleneck=spec)``
calls, and :func:`attacked_parameters` lists the layers the "ignore" attack
reads (those before the first stochastic decoder, CVB paper §III-B). The
layers themselves are in :mod:`leakagelib.defenses.bottlenecks`. Used by the
chapters "Breaking heuristic defenses" and "Variational bottlenecks".
"""

from __future__ import annotations

import copy
import math
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from .bottlenecks import CVB, PRECODE, TokenGrid, VariationalBottleneck, _shape, bottlenecks

__all__ = [
    "apply_bottleneck_option",
    "attacked_parameters",
    "insert_bottleneck",
    "stage_count",
    "stochastic_parameters",
]

Factory = Callable[[tuple[int, ...]], nn.Module]
_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.GroupNorm, nn.LayerNorm, nn.InstanceNorm2d)
_RESHAPES = (nn.Flatten, nn.Unflatten)


def stochastic_parameters(model: nn.Module) -> list[str]:
    """Names of the parameters whose gradients the bottleneck's sampling makes stochastic.

    These are the first bottleneck's decoder and every parameter registered after
    it; in a model built by :func:`insert_bottleneck` registration order is
    forward order. Empty when the model has no bottleneck.
    """
    found = bottlenecks(model)
    if not found:
        return []
    name, module = found[0]
    first = {f"{name}.{d}" if name else d for d in module.decoder_parameter_names()}
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    start = min(i for i, n in enumerate(names) if n in first)
    return names[start:]


def attacked_parameters(model: nn.Module) -> list[str]:
    """The parameters the "ignore" attack reads: all before the first stochastic decoder.

    CVB paper §III-B, Eq. 4: the gradients of the decoder and of all
    subsequent layers are omitted. Pass the list to
    ``leakagelib.attacks.likelihoods.LayerSelection(include=...)``.
    """
    skip = set(stochastic_parameters(model))
    return [n for n, p in model.named_parameters() if p.requires_grad and n not in skip]


def _is_stage(module: nn.Module) -> bool:
    """A stage starts at a top-level child with parameters that is not a normalisation layer."""
    has_params = any(True for _ in module.parameters())
    return has_params and not isinstance(module, _NORMS) and not _is_bottleneck(module)


def _is_bottleneck(module: nn.Module) -> bool:
    return isinstance(module, (VariationalBottleneck, TokenGrid))


def stage_count(model: nn.Module) -> int:
    """How many stages (integer positions 1..n) a sequential model has."""
    _require_sequential(model)
    return sum(_is_stage(m) for m in model.children())


def _require_sequential(model: nn.Module) -> None:
    if not isinstance(model, nn.Sequential):
        raise TypeError(
            f"integer bottleneck positions need an nn.Sequential model, got {type(model).__name__}; "
            "name the child to insert after instead (e.g. position='blocks.0')"
        )


def _insertion_index(model: nn.Sequential, position: int) -> int:
    """Index in ``model`` where a bottleneck at integer ``position`` goes.

    Position 0 is the input (after a leading parameter-free input check, before
    any flatten). Position p ≥ 1 is right after stage p — its main
    layer together with the parameter-free modules and normalisation layers
    that follow it (activation, pooling, dropout, batch norm) — and before any
    flatten, so that a CVB after the last convolution still sees a feature map.
    """
    children = list(model.children())
    n_stages = sum(_is_stage(m) for m in children)
    if not 0 <= position <= n_stages:
        raise ValueError(
            f"position must be between 0 and {n_stages} for this model, got {position}"
        )
    if position == 0:  # on the input, after any leading input check (no parameters)
        j = 0
        while j < len(children) and not _is_stage(children[j]) and not _is_bottleneck(children[j]):
            if isinstance(children[j], _RESHAPES) or any(True for _ in children[j].parameters()):
                break
            j += 1
        return j
    seen = 0
    for i, child in enumerate(children):
        if _is_stage(child):
            seen += 1
            if seen == position:
                j = i + 1
                while j < len(children) and not _is_stage(children[j]):
                    if isinstance(children[j], _RESHAPES) or _is_bottleneck(children[j]):
                        break
                    j += 1
                return j
    raise AssertionError("unreachable: position was checked against the stage count")


def _resolve(model: nn.Module, position: int | str) -> tuple[nn.Sequential, int]:
    """The sequential container and the index at which to insert."""
    if isinstance(position, bool):
        raise TypeError("position must be an int or a child name, not a bool")
    if isinstance(position, int):
        _require_sequential(model)
        return model, _insertion_index(model, position)
    if not isinstance(position, str) or not position:
        raise TypeError(f"position must be an int or a child name, got {position!r}")
    parent_path, _, child = position.rpartition(".")
    parent = model.get_submodule(parent_path) if parent_path else model
    if not isinstance(parent, nn.Sequential):
        raise TypeError(
            f"cannot insert after {position!r}: its parent {parent_path or 'model'!r} is a "
            f"{type(parent).__name__}, not an nn.Sequential"
        )
    names = [n for n, _ in parent.named_children()]
    if child not in names:
        raise KeyError(f"{parent_path or 'model'!r} has no child {child!r}; children: {names}")
    return parent, names.index(child) + 1


def _probe(
    model: nn.Module, parent: nn.Sequential, index: int, in_shape: Sequence[int]
) -> tuple[int, ...]:
    """Shape (without batch) of the features at ``parent``'s insertion ``index``."""
    children = list(parent.children())
    captured: dict[str, tuple[int, ...]] = {}

    if index == 0:

        def pre(_m: nn.Module, args: tuple[Any, ...]) -> None:
            captured["shape"] = tuple(args[0].shape[1:])

        handle = children[0].register_forward_pre_hook(pre)
    else:

        def post(_m: nn.Module, _a: tuple[Any, ...], out: Tensor) -> None:
            captured["shape"] = tuple(out.shape[1:])

        handle = children[index - 1].register_forward_hook(post)
    was_training = model.training
    model.eval()
    try:
        p = next(model.parameters(), None)
        x = torch.zeros(2, *in_shape, device=p.device if p is not None else None)
        with torch.no_grad():
            model(x)
    finally:
        handle.remove()
        model.train(was_training)
    if "shape" not in captured:
        raise RuntimeError("the probe pass never reached the insertion point")
    return captured["shape"]


def insert_bottleneck(
    model: nn.Module,
    module: nn.Module | Factory,
    position: int | str,
    *,
    in_shape: Sequence[int] | None = None,
    name: str = "bottleneck",
) -> nn.Module:
    """A copy of ``model`` with ``module`` inserted at ``position``; ``model`` is unchanged.

    ``position`` is an integer stage (0 = on the input, p = after the p-th
    parametrised layer with its activation/pooling/normalisation; the CVB
    paper's numbering for its CNN) for an ``nn.Sequential`` model, or the dotted
    name of a child of any ``nn.Sequential`` inside the model to insert after
    (``"layer1"`` in a ResNet, ``"blocks.0"`` in a ViT). Child names are kept, so
    parameter names of the original layers do not change.

    ``module`` is a ready module, or a factory ``shape -> module`` called with the
    features' shape at that point (probed with a forward pass of zeros of
    ``in_shape``, which a factory requires): e.g. ``lambda s: CVB(s[0])``. When
    the features are transformer tokens ``N×D`` and the factory builds a
    :class:`CVB`, it is called with the grid shape ``(N, √D, √D)`` and wrapped in
    :class:`TokenGrid` (CVB paper §VI-D).
    """
    model = copy.deepcopy(model)
    parent, index = _resolve(model, position)
    block = _block(model, parent, index, module, in_shape)
    return _splice(model, parent, index, block, name)


def _block(
    model: nn.Module,
    parent: nn.Sequential,
    index: int,
    module: nn.Module | Factory,
    in_shape: Sequence[int] | None,
) -> nn.Module:
    """The module to insert: a copy of a ready one, or the factory's for the probed feature shape."""
    if isinstance(module, nn.Module):
        return copy.deepcopy(module)
    if not callable(module):
        raise TypeError(f"module must be an nn.Module or a factory, got {type(module).__name__}")
    if in_shape is None:
        raise ValueError("a bottleneck factory needs in_shape (C, H, W) to probe the feature shape")
    shape = _probe(model, parent, index, _shape(in_shape, "in_shape"))
    block = module(shape)
    if isinstance(block, CVB) and len(shape) == 2:
        side = math.isqrt(shape[1])
        if side * side != shape[1]:
            raise ValueError(
                f"tokens of width {shape[1]} cannot be viewed as a square grid for a CVB"
            )
        block = TokenGrid(module((shape[0], side, side)), shape[1])
    elif isinstance(block, CVB) and len(shape) != 3:
        raise ValueError(
            f"a CVB needs C×H×W feature maps or N×D tokens, got features of shape {shape}"
        )
    if not isinstance(block, nn.Module):
        raise TypeError(f"the bottleneck factory returned {type(block).__name__}, not an nn.Module")
    return block


def _splice(
    model: nn.Module, parent: nn.Sequential, index: int, block: nn.Module, name: str
) -> nn.Module:
    """``model`` with ``block`` inserted into ``parent`` at ``index``, under a name not yet taken."""
    items = list(parent.named_children())
    taken = {n for n, _ in items}
    unique, k = name, 1
    while unique in taken:
        k += 1
        unique = f"{name}{k}"
    items.insert(index, (unique, block))
    rebuilt = nn.Sequential(OrderedDict(items))
    if parent is model:
        return rebuilt
    grand_path, _, attr = _path_of(model, parent).rpartition(".")
    setattr(model.get_submodule(grand_path) if grand_path else model, attr, rebuilt)
    return model


def _path_of(model: nn.Module, target: nn.Module) -> str:
    for n, m in model.named_modules():
        if m is target:
            return n
    raise AssertionError("unreachable: the container belongs to the model")


_KINDS = ("precode", "cvb")


def _parse_spec(spec: str | dict[str, Any]) -> dict[str, Any]:
    if isinstance(spec, str):
        kind, _, pos = spec.partition("@")
        out: dict[str, Any] = {"kind": kind.strip().lower()}
        if pos:
            parts = [p.strip() for p in pos.split(",") if p.strip()]
            out["position"] = [int(p) if p.lstrip("-").isdigit() else p for p in parts]
        return out
    if isinstance(spec, dict):
        if "kind" not in spec:
            raise KeyError(
                f"a bottleneck spec needs a 'kind' ({' or '.join(_KINDS)}), got {spec!r}"
            )
        return dict(spec)
    raise TypeError(
        f"a bottleneck spec is a string like 'cvb@1' or a dict, got {type(spec).__name__}"
    )


def apply_bottleneck_option(
    model: nn.Module, spec: str | dict[str, Any] | None, in_shape: Sequence[int]
) -> nn.Module:
    """Insert the bottleneck(s) a ``bottleneck=`` option of ``models.build`` asks for.

    ``spec`` is ``None``/``"none"`` (no change), a string ``"cvb"``,
    ``"precode"``, ``"cvb@1"``, ``"cvb@1,2"`` or ``"cvb@layer1"``, or a dict
    ``{"kind": "cvb", "position": 1 | "layer1" | [1, 2], **options}`` whose other
    keys go to :class:`CVB` (``K``, ``scale``, ``kernel_size``, ``beta``,
    ``bias``, ``kl``) or :class:`PRECODE` (``K``, ``beta``, ``bias``). Default
    positions: CVB at 1 (the CVB paper's choice), PRECODE before the last
    layer (PRECODE's own default: between the last feature layer and the
    classifier). Several positions insert one bottleneck each, the latest first
    so that earlier positions keep their meaning. The inserted child is named
    after the kind (``cvb``, ``precode``), or ``cvb_1``, ``cvb_2``, ... for several.
    """
    if spec is None or (isinstance(spec, str) and spec.strip().lower() == "none"):
        return model
    opts = _parse_spec(spec)
    kind = str(opts.pop("kind")).lower()
    if kind not in _KINDS:
        raise ValueError(f"unknown bottleneck kind {kind!r}; use one of {_KINDS}")
    position = opts.pop("position", None)
    if position is None:
        position = 1 if kind == "cvb" else stage_count(model) - 1
    positions = list(position) if isinstance(position, (list, tuple)) else [position]
    ints = sorted((p for p in positions if isinstance(p, int)), reverse=True)
    names = [p for p in positions if not isinstance(p, int)]

    def factory(shape: tuple[int, ...]) -> nn.Module:
        if kind == "cvb":
            return CVB(shape[0], **opts)
        return PRECODE(shape, **opts)

    for pos in ints + names:
        label = kind if len(positions) == 1 else f"{kind}_{str(pos).replace('.', '_')}"
        model = insert_bottleneck(model, factory, pos, in_shape=in_shape, name=label)
    return model
