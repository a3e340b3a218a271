"""The networks of the R-GAP paper (Zhu & Blaschko 2021): CNN6, CNN6-d and FCN3.

All three are bias-free with LeakyReLU (slope 0.2) after every hidden layer and
a single output logit for the paper's binary logistic loss (§3.1, Figure 3).
They are ``nn.Sequential`` of named stages (``conv1``, ``act1``, …, ``flatten``,
``fc``) so that R-GAP and the rank analysis (:mod:`leakagelib.rgap`) can read
each layer's geometry, and so that a bottleneck can be inserted at a position; the first stage is the
zoo's ``input`` shape check.

Initialisation: the authors' code (JunyiZhu-AI/R-GAP, ``main.py``) builds the
networks with PyTorch's default initialisation after ``torch.manual_seed(0)``
and attacks them untrained; ``init="default"`` does the same. For the noise
study (Appendix G) the same code offers ``weight_init`` drawing every weight
from N(0, 0.01²) (file ``utils/utils.py``); ``init="normal"`` reproduces it.

:func:`skip_net` builds the constructed networks of Figure 6 (a residual
block of :class:`SkipBlock` with or without its skip connection).

Used by the chapters "Closed-form attacks", "Rank analysis" and "Twin data".
"""

from __future__ import annotations

from collections import OrderedDict

import torch
from torch import Tensor, nn

from .registry import register
from .staging import staged

__all__ = ["SkipBlock", "build_cnn6", "build_cnn6d", "build_fcn3", "conv_stack", "skip_net"]

#: LeakyReLU slope of every R-GAP network (authors' code, ``models/CNN6.py``).
NEGATIVE_SLOPE = 0.2

#: (out_channels, kernel, stride, padding) of CNN6's six convolutions (Figure 3 and
#: the authors' ``models/CNN6.py``).
CNN6_LAYERS: tuple[tuple[int, int, int, int], ...] = (
    (12, 4, 2, 2),
    (36, 3, 2, 1),
    (36, 3, 1, 1),
    (36, 3, 1, 1),
    (64, 3, 2, 1),
    (128, 3, 1, 1),
)

_INITS = ("default", "normal")


def _activation(name: str) -> nn.Module:
    """The hidden activation ``name`` (R-GAP handles all four of these)."""
    table = {
        "leaky_relu": lambda: nn.LeakyReLU(NEGATIVE_SLOPE),
        "relu": nn.ReLU,
        "sigmoid": nn.Sigmoid,
        "identity": nn.Identity,
    }
    if name not in table:
        raise ValueError(f"unknown activation {name!r}; use one of {sorted(table)}")
    return table[name]()


def _initialise(model: nn.Module, init: str) -> nn.Module:
    """Apply the R-GAP authors' initialisation choice ``init`` (see the module docstring)."""
    if init not in _INITS:
        raise ValueError(f"unknown init {init!r}; use one of {_INITS}")
    if init == "normal":
        for module in model.modules():
            if isinstance(module, (nn.Conv2d, nn.Linear)):
                nn.init.normal_(module.weight, 0.0, 0.01)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
    return model


def conv_stack(
    in_shape: tuple[int, int, int],
    num_classes: int,
    layers: tuple[tuple[int, int, int, int], ...],
    *,
    bias: bool = False,
    activation: str = "leaky_relu",
    init: str = "default",
    name: str = "conv-stack",
) -> nn.Sequential:
    """Convolutions ``(out_channels, kernel, stride, padding)`` each followed by an
    activation, then a flatten and one bias-free-by-default linear layer.

    The linear layer's width is computed from ``in_shape``, so the same stack
    runs on 3×32×32 CIFAR-10 and 1×28×28 MNIST. The rank-analysis chapter builds
    its Figure-2 style architectures with this function.
    """
    c, h, w = in_shape
    stages: OrderedDict[str, nn.Module] = OrderedDict()
    for i, (out_c, k, s, p) in enumerate(layers, start=1):
        if min(out_c, k, s) < 1 or p < 0:
            raise ValueError(
                f"layer {i}: bad (out_channels, kernel, stride, padding) {layers[i - 1]}"
            )
        stages[f"conv{i}"] = nn.Conv2d(c, out_c, k, stride=s, padding=p, bias=bias)
        stages[f"act{i}"] = _activation(activation)
        h, w = (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
        if h < 1 or w < 1:
            raise ValueError(f"input {in_shape} is too small: layer {i} leaves no output pixels")
        c = out_c
    stages["flatten"] = nn.Flatten()
    stages["fc"] = nn.Linear(c * h * w, num_classes, bias=bias)
    return _initialise(staged(in_shape, name, stages.items()), init)


@register("cnn6")
def build_cnn6(
    in_shape: tuple[int, int, int],
    num_classes: int,
    *,
    bias: bool = False,
    activation: str = "leaky_relu",
    init: str = "default",
) -> nn.Sequential:
    """CNN6 of R-GAP (Figure 3): six convolutions and one linear layer, 125,456
    parameters on 3×32×32 with one output (``num_classes=1``, the paper's setting).

    Options: ``bias`` (default False, as in the paper), ``activation``
    ("leaky_relu" with slope 0.2, "relu", "sigmoid", "identity"), ``init``
    ("default": PyTorch's, as the authors' code; "normal": N(0, 0.01²)).
    Every layer is full rank under R-GAP's gradient and weight constraints.
    """
    return conv_stack(
        in_shape,
        num_classes,
        CNN6_LAYERS,
        bias=bias,
        activation=activation,
        init=init,
        name="cnn6",
    )


@register("cnn6-d")
def build_cnn6d(
    in_shape: tuple[int, int, int],
    num_classes: int,
    *,
    bias: bool = False,
    activation: str = "leaky_relu",
    init: str = "default",
) -> nn.Sequential:
    """CNN6-d of R-GAP (§5): CNN6 with 20 instead of 36 channels out of the second
    convolution, which makes that layer rank-deficient for R-GAP.

    Options as :func:`build_cnn6`.
    """
    layers = list(CNN6_LAYERS)
    layers[1] = (20, *layers[1][1:])
    return conv_stack(
        in_shape,
        num_classes,
        tuple(layers),
        bias=bias,
        activation=activation,
        init=init,
        name="cnn6-d",
    )


@register("fcn3")
def build_fcn3(
    in_shape: tuple[int, int, int],
    num_classes: int,
    *,
    bias: bool = False,
    activation: str = "leaky_relu",
    init: str = "default",
) -> nn.Sequential:
    """FCN3 of R-GAP (Appendix F): 784 → 1000 → 100 → 1 on MNIST, bias-free,
    LeakyReLU (0.2) after the two hidden layers.

    The authors' ``models/FCN3.py`` also puts a LeakyReLU on the output logit;
    here the logit stays linear as in the paper's equation 4 (the logistic loss
    is applied to it directly). The input width follows ``in_shape``.
    """
    stages: OrderedDict[str, nn.Module] = OrderedDict()
    stages["flatten"] = nn.Flatten()
    stages["fc1"] = nn.Linear(int(torch.tensor(in_shape).prod()), 1000, bias=bias)
    stages["act1"] = _activation(activation)
    stages["fc2"] = nn.Linear(1000, 100, bias=bias)
    stages["act2"] = _activation(activation)
    stages["fc3"] = nn.Linear(100, num_classes, bias=bias)
    return _initialise(staged(in_shape, "fcn3", stages.items()), init)


class SkipBlock(nn.Module):
    """Shape-preserving convolutions with LeakyReLU between them, (+ the input), LeakyReLU.

    ``widths`` are the inner convolutions' output channels; the last
    convolution maps back to ``channels``, so that the block's input can be
    added to its output (``skip=True``, Appendix D's residual block) or not
    (``skip=False``, a plain stack). Every convolution has kernel ``kernel``,
    stride 1, padding ``kernel // 2`` (odd kernels) and no bias.
    """

    def __init__(self, channels: int, widths: tuple[int, ...], kernel: int, skip: bool) -> None:
        super().__init__()
        if kernel < 1 or kernel % 2 == 0:
            raise ValueError(f"a shape-preserving block needs an odd kernel, got {kernel}")
        if any(w < 1 for w in widths):
            raise ValueError(f"inner widths must be positive, got {widths}")
        self.skip = skip
        c = channels
        for i, out_c in enumerate((*widths, channels), start=1):
            if i > 1:
                self.add_module(f"act{i - 1}", nn.LeakyReLU(NEGATIVE_SLOPE))
            self.add_module(
                f"conv{i}", nn.Conv2d(c, out_c, kernel, padding=kernel // 2, bias=False)
            )
            c = out_c
        self.out = nn.LeakyReLU(NEGATIVE_SLOPE)

    def forward(self, x: Tensor) -> Tensor:
        h = x
        for name, module in self.named_children():
            if name != "out":
                h = module(h)
        return self.out(h + x if self.skip else h)

    def extra_repr(self) -> str:
        return f"skip={self.skip}"


def skip_net(
    in_shape: tuple[int, int, int],
    num_classes: int,
    widths: tuple[int, ...],
    *,
    skip: bool,
    kernel: int = 3,
    name: str = "skip-net",
) -> nn.Sequential:
    """One :class:`SkipBlock` (inner ``widths``, with or without its skip), flatten, one linear layer.

    Bias-free, LeakyReLU (0.2), PyTorch's default initialisation, as R-GAP's
    networks. Experiment ``rgap/fig6-skip-dlg`` builds Figure 6's pairs with it.
    """
    block = SkipBlock(in_shape[0], tuple(widths), kernel, skip)
    fc = nn.Linear(int(torch.tensor(in_shape).prod()), num_classes, bias=False)
    return staged(in_shape, name, [("block", block), ("flatten", nn.Flatten()), ("fc", fc)])
