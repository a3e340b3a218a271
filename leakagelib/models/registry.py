"""The name → constructor table behind :func:`leakagelib.models.build`.

Each zoo module decorates its builders with :func:`register`; the package's
``__init__`` imports every module so that the table is complete on import.
"""

from __future__ import annotations

from collections.abc import Callable
from numbers import Integral

from torch import nn

Builder = Callable[..., nn.Module]

_BUILDERS: dict[str, Builder] = {}


def register(name: str) -> Callable[[Builder], Builder]:
    """Register ``fn(in_shape, num_classes, **options) -> nn.Module`` under ``name``."""

    def decorate(fn: Builder) -> Builder:
        if name in _BUILDERS:
            raise ValueError(f"model name {name!r} is registered twice")
        _BUILDERS[name] = fn
        return fn

    return decorate


def available() -> list[str]:
    """The names :func:`build` accepts, sorted."""
    return sorted(_BUILDERS)


def build(
    name: str,
    in_shape: tuple[int, int, int] = (3, 32, 32),
    num_classes: int = 10,
    *,
    bottleneck: str | dict | None = None,
    **options,
) -> nn.Module:
    """Build zoo model ``name`` for inputs of shape ``in_shape`` = (C, H, W).

    ``options`` are the model's own switches (``bias``, ``width``, ...); each
    builder's docstring lists them. ``bottleneck`` inserts a variational
    bottleneck — ``"cvb"``, ``"precode"``, ``"cvb@2"``, or a dict with ``kind``,
    ``position`` and the module's options — as
    :func:`leakagelib.defenses.surgery.apply_bottleneck_option` describes (the
    chapter on variational bottlenecks uses it). Unknown names raise a
    ``KeyError`` that lists the known ones.
    """
    if name not in _BUILDERS:
        raise KeyError(f"unknown model {name!r}; available models: {', '.join(available())}")
    if len(in_shape) != 3 or any(int(s) <= 0 for s in in_shape):
        raise ValueError(f"in_shape must be (C, H, W) with positive sizes, got {in_shape!r}")
    if isinstance(num_classes, bool) or not isinstance(num_classes, Integral) or num_classes < 1:
        raise ValueError(f"num_classes must be a whole number of classes >= 1, got {num_classes!r}")
    shape = tuple(int(s) for s in in_shape)
    model = _BUILDERS[name](shape, int(num_classes), **options)
    if bottleneck is None:
        return model
    # imported on use: the defenses package loads the attacks and Opacus, which the zoo does not need
    from ..defenses.surgery import apply_bottleneck_option

    return apply_bottleneck_option(model, bottleneck, shape)
