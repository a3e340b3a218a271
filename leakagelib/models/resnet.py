"""ResNet-18 as the CVB paper and R-GAP's Figure 4 use it.

Two reference codes build ResNet-18 differently, and the builder offers both:

* The CVB paper (Table V) uses torchvision's ResNet-18 — the ImageNet stem
  (7×7 convolution with stride 2, then a 3×3 max-pool with stride 2) — with
  GroupNorm of 2 groups in place of BatchNorm (dAI-SY-Group/
  ConvolutionalVariationalBottleneck, ``src/models/ResNet.py``, architecture
  ``ResNet18GN``; ``configs/models/ResNet18.yaml``: ``gn_groups: 2``), on
  3×32×32 inputs. These are the defaults here: ``stem="imagenet"``,
  ``norm="group"``, ``width=64``. Group norm is per sample, so the model runs
  under per-sample ``vmap`` in training mode too.
* R-GAP's Figure 4 attacks a "ResNet18 with base width 16" with Geiping et
  al.'s inverting-gradients attack; a base width is a parameter of the
  inverting-gradients ResNet (``inversefed/nn/models.py``, copied in
  eth-sri/bayes-framework-leakage ``defense_attacks/ats/inversefed/nn/models.py``),
  which has the CIFAR stem (3×3 convolution, stride 1, no max-pool) and
  BatchNorm: ``stem="cifar"``, ``norm="batch"``, ``width=16``, plus
  ``cut_skip=(3,)`` (Variant 1) or ``cut_skip=(8,)`` (Variant 2). Batch norm
  in training mode couples the samples of a batch: call ``model.eval()``
  before per-sample ``vmap``.

Both codes share everything else: BasicBlocks [2, 2, 2, 2] with widths w, 2w,
4w, 8w and strides 1, 2, 2, 2; bias-free convolutions; a 1×1 convolution with
norm on the shortcut where shape changes; global average pooling; one linear
layer; Kaiming-normal (fan_out) convolutions, norm weights 1 and shifts 0,
PyTorch's default for the linear layer (``init="kaiming"``).

Used by the chapters on rank analysis (cutting skip connections) and on CVB.
"""

from __future__ import annotations

from collections import OrderedDict

from torch import Tensor, nn

from .init import initialise
from .registry import register
from .staging import norm_layer, staged

__all__ = ["BasicBlock", "build_resnet18", "head", "residual_layers", "resnet_stem", "shortcut"]

_STEMS = ("imagenet", "cifar")
_BLOCKS_PER_LAYER = (2, 2, 2, 2)


def shortcut(
    in_channels: int, out_channels: int, stride: int, norm: str, groups: int
) -> nn.Module | None:
    """A residual block's shortcut: a 1×1 convolution with norm where the shape changes, else none."""
    if stride == 1 and in_channels == out_channels:
        return None
    return nn.Sequential(
        OrderedDict(
            conv=nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False),
            norm=norm_layer(norm, out_channels, groups=groups),
        )
    )


class BasicBlock(nn.Module):
    """ResNet basic block: conv3×3 → norm → ReLU → conv3×3 → norm, (+ shortcut) → ReLU.

    With ``skip=False`` the shortcut is cut (R-GAP Figure 4): the block is a
    plain two-layer stack and owns no downsampling convolution.
    """

    def __init__(
        self, in_channels: int, channels: int, stride: int, norm: str, groups: int, skip: bool
    ) -> None:
        super().__init__()
        self.skip = skip
        self.conv1 = nn.Conv2d(in_channels, channels, 3, stride=stride, padding=1, bias=False)
        self.norm1 = norm_layer(norm, channels, groups=groups)
        self.act1 = nn.ReLU()
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.norm2 = norm_layer(norm, channels, groups=groups)
        self.act2 = nn.ReLU()
        self.downsample = shortcut(in_channels, channels, stride, norm, groups) if skip else None

    def forward(self, x: Tensor) -> Tensor:
        out = self.norm2(self.conv2(self.act1(self.norm1(self.conv1(x)))))
        if self.skip:
            out = out + (x if self.downsample is None else self.downsample(x))
        return self.act2(out)

    def extra_repr(self) -> str:
        return f"skip={self.skip}"


def resnet_stem(kind: str, c: int, width: int, norm: str, groups: int) -> nn.Sequential:
    """The stem: torchvision's 7×7/2 convolution and max-pool ("imagenet"), or a 3×3 ("cifar")."""
    if kind == "imagenet":
        return nn.Sequential(
            OrderedDict(
                conv=nn.Conv2d(c, width, 7, stride=2, padding=3, bias=False),
                norm=norm_layer(norm, width, groups=groups),
                act=nn.ReLU(),
                pool=nn.MaxPool2d(3, stride=2, padding=1),
            )
        )
    return nn.Sequential(
        OrderedDict(
            conv=nn.Conv2d(c, width, 3, stride=1, padding=1, bias=False),
            norm=norm_layer(norm, width, groups=groups),
            act=nn.ReLU(),
        )
    )


def residual_layers(
    block: type[nn.Module],
    counts: tuple[int, ...],
    width: int,
    expansion: int,
    norm: str,
    groups: int,
    cut: set[int],
) -> tuple[list[tuple[str, nn.Module]], int]:
    """``layer1`` … of ``counts[i]`` blocks each, and the last width (ResNet-18 and ResNet-101).

    Stage i has ``width·2^(i-1)`` planes and stride 1 for the first stage, 2
    after (on its first block); ``block(in, planes, stride, norm, groups,
    skip)`` outputs ``expansion·planes`` channels; blocks are named
    ``block1``, ``block2``, … in forward order, and those numbered in ``cut``
    lose their skip connection.
    """
    layers: list[tuple[str, nn.Module]] = []
    in_channels, index = width, 0
    for layer_i, count in enumerate(counts, start=1):
        planes, stride = width * 2 ** (layer_i - 1), 1 if layer_i == 1 else 2
        blocks: OrderedDict[str, nn.Module] = OrderedDict()
        for j in range(count):
            index += 1
            blocks[f"block{index}"] = block(
                in_channels, planes, stride if j == 0 else 1, norm, groups, skip=index not in cut
            )
            in_channels = planes * expansion
        layers.append((f"layer{layer_i}", nn.Sequential(blocks)))
    return layers, in_channels


def head(features: int, num_classes: int, bias: bool) -> list[tuple[str, nn.Module]]:
    """The ``pool`` (global average pool, flatten) and ``fc`` stages of a ResNet."""
    pool = nn.Sequential(OrderedDict(avg=nn.AdaptiveAvgPool2d(1), flat=nn.Flatten()))
    return [("pool", pool), ("fc", nn.Linear(features, num_classes, bias=bias))]


@register("resnet18")
def build_resnet18(
    in_shape: tuple[int, int, int],
    num_classes: int,
    *,
    bias: bool = True,
    width: int = 64,
    stem: str = "imagenet",
    norm: str = "group",
    groups: int = 2,
    cut_skip: tuple[int, ...] = (),
    init: str = "kaiming",
) -> nn.Sequential:
    """ResNet-18 (see the module docstring for the two reference configurations).

    Options: ``bias`` (the final linear layer's; convolutions are bias-free in
    both reference codes, as a norm follows each), ``width`` (base width,
    default 64; R-GAP Figure 4 uses 16), ``stem`` ("imagenet", default, CVB's
    torchvision stem; "cifar", inverting-gradients'), ``norm`` ("group",
    default, CVB's; "batch"; "none"), ``groups`` (group-norm groups, default 2
    as in CVB's config), ``cut_skip`` (1-based indices of the eight basic
    blocks whose skip connection is removed — R-GAP Figure 4's Variant 1 is
    ``(3,)``, Variant 2 ``(8,)``), ``init`` ("kaiming", default, or "torch").

    Stages: ``input``, ``stem``, ``layer1`` … ``layer4`` (blocks ``block1`` …
    ``block8`` inside, two per layer), ``pool`` (global average pool and
    flatten), ``fc``. CVB's ResNet positions 0–4 are after ``layer1`` …
    ``layer4`` and after ``pool``.
    """
    if stem not in _STEMS:
        raise ValueError(f"unknown stem {stem!r}; use one of {_STEMS}")
    if width < 1:
        raise ValueError(f"width must be a positive integer, got {width}")
    n_blocks = sum(_BLOCKS_PER_LAYER)
    cut = set(cut_skip)
    if not cut <= set(range(1, n_blocks + 1)):
        raise ValueError(
            f"cut_skip holds 1-based basic-block indices in 1..{n_blocks}, got {tuple(cut_skip)}"
        )
    if init not in ("kaiming", "torch"):
        raise ValueError(f"unknown init {init!r} for resnet18; use 'kaiming' or 'torch'")
    stem_module = resnet_stem(stem, in_shape[0], width, norm, groups)  # built first
    layers, features = residual_layers(BasicBlock, _BLOCKS_PER_LAYER, width, 1, norm, groups, cut)
    model = staged(
        in_shape, "resnet18", [("stem", stem_module), *layers, *head(features, num_classes, bias)]
    )
    return initialise(model, init)
