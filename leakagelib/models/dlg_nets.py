"""The LeNet of Deep Leakage from Gradients (Zhu et al., NeurIPS 2019), as R-GAP uses it.

DLG attacks a small "LeNet": three 5×5 convolutions (12 channels; strides 2,
2, 1; padding 2), each followed by a sigmoid, then one linear layer (mit-han-lab/dlg,
``models/vision.py``). R-GAP's Table 2 benchmarks R-GAP against DLG on this
network (``lenet``) and on "LeNet*", identical but with Leaky ReLU
(``lenet-leaky``); the slope 0.2 is the one in R-GAP's code (JunyiZhu-AI/R-GAP,
``models/LeNet.py``, commented-out line, and every network in ``models/``).

R-GAP's own copy of the network is bias-free with a single logit for the
logistic loss on 1×28×28 inputs: ``build("lenet", (1, 28, 28), 1, bias=False)``
with ``loss="logistic"``. DLG's is 3×32×32 with biases and 100 classes
(CIFAR-100). Used by the chapters on DLG and on closed-form attacks.
"""

from __future__ import annotations

from collections import OrderedDict

from torch import nn

from .init import initialise
from .registry import register
from .staging import activation as make_activation
from .staging import dry_run_shape, staged

__all__ = ["DLG_INIT_SCALE", "build_lenet", "build_lenet_leaky"]

#: DLG's ``weights_init``: every weight and bias from U(−0.5, 0.5) (mit-han-lab/dlg,
#: ``models/vision.py``, applied in ``main.py``).
DLG_INIT_SCALE = 0.5

_INITS = ("dlg", "torch", "lecun")


def _lenet(
    name: str,
    in_shape: tuple[int, int, int],
    num_classes: int,
    act: str,
    bias: bool,
    init: str,
) -> nn.Sequential:
    if init not in _INITS:
        raise ValueError(f"unknown init {init!r} for {name}; use one of {_INITS}")
    plan = [(in_shape[0], 2), (12, 2), (12, 1)]  # (in_channels, stride), 12 out channels each
    features: list[tuple[str, nn.Module]] = []
    for i, (c, stride) in enumerate(plan, start=1):
        block = nn.Sequential(
            OrderedDict(
                conv=nn.Conv2d(c, 12, 5, stride=stride, padding=2, bias=bias),
                act=make_activation(act, negative_slope=0.2),
            )
        )
        features.append((f"conv{i}", block))
    features.append(("flatten", nn.Flatten()))
    n = int(dry_run_shape(nn.Sequential(OrderedDict(features)), in_shape, name).numel())
    model = staged(in_shape, name, [*features, ("fc", nn.Linear(n, num_classes, bias=bias))])
    if init == "dlg":
        return initialise(model, "uniform", scale=DLG_INIT_SCALE)
    return initialise(model, init)


@register("lenet")
def build_lenet(
    in_shape: tuple[int, int, int],
    num_classes: int,
    *,
    bias: bool = True,
    init: str = "dlg",
) -> nn.Sequential:
    """DLG's LeNet: [Conv(12, 5×5, pad 2; strides 2, 2, 1) → Sigmoid] × 3 → Linear(classes).

    768 features on 32×32 inputs (12 × 8 × 8), 588 on 28×28. Options:
    ``bias`` (DLG: on; R-GAP's copy: off), ``init`` — ``"dlg"`` (default,
    U(±0.5) for every weight and bias, DLG's ``weights_init``), ``"torch"``
    (PyTorch defaults, as R-GAP's code leaves its networks) or ``"lecun"``.

    Stages: ``input``, ``conv1``, ``conv2``, ``conv3``, ``flatten``, ``fc``.
    """
    return _lenet("lenet", in_shape, num_classes, "sigmoid", bias, init)


@register("lenet-leaky")
def build_lenet_leaky(
    in_shape: tuple[int, int, int],
    num_classes: int,
    *,
    bias: bool = True,
    init: str = "dlg",
) -> nn.Sequential:
    """R-GAP's "LeNet*" (Table 2): DLG's LeNet with LeakyReLU(0.2) in place of the sigmoids.

    Same options and stages as ``lenet``.
    """
    return _lenet("lenet-leaky", in_shape, num_classes, "leaky_relu", bias, init)
