"""ResNet-101 with base width 16, as R-GAP's Appendix E (Table 4) uses it.

R-GAP's Table 4 trains and attacks "ResNet101 with base width 16" and two
variants with one skip connection cut, with Geiping et al.'s attack. The
R-GAP authors' code (JunyiZhu-AI/R-GAP: ``models/`` holds CNN6, CNN6-d and
FCN3 only) has no ResNet; a base width is a parameter of the inverting-gradients
ResNet (``inversefed/nn/models.py``, class ``ResNet`` and its ``ResNet101``
entry), which this builder follows:

* the CIFAR stem: one 3×3 convolution, stride 1, padding 1, base width w
  channels, norm, ReLU (no max-pool);
* torchvision's bottleneck block (``torchvision.models.resnet.Bottleneck``,
  which inversefed uses): 1×1 convolution to ``planes``, 3×3 convolution with
  the block's stride, 1×1 convolution to 4·``planes``, each followed by norm,
  ReLU after the first two and after the sum with the shortcut; a 1×1
  convolution with norm on the shortcut where the shape changes;
* [3, 4, 23, 3] blocks with ``planes`` w, 2w, 4w, 8w and strides 1, 2, 2, 2;
  global average pooling and one linear layer from 32w features;
* bias-free convolutions, Kaiming-normal (fan_out) convolutions, norm weights
  1 and shifts 0, PyTorch's default for the linear layer.

``cut_skip`` removes the skip connections of the numbered blocks (1-based, in
forward order, 33 in all) together with their shortcut convolution, as
:func:`~leakagelib.models.resnet.build_resnet18` does for Figure 4: Table 4's
Variant 1 is ``cut_skip=(3,)``, Variant 2 ``cut_skip=(1,)``. The rank analysis
(:func:`leakagelib.rgap.rank_analysis`) counts a block with its skip as one
unit (Appendix D) and a cut block as three plain layers. Used by experiment
``rgap/table4-resnet101`` and the chapter "Rank analysis".
"""

from __future__ import annotations

from torch import Tensor, nn

from .init import initialise
from .registry import register
from .resnet import head, residual_layers, resnet_stem, shortcut
from .staging import norm_layer, staged

__all__ = ["BLOCKS", "Bottleneck", "build_resnet101"]

#: Bottleneck blocks per stage of ResNet-101 (inversefed's ``ResNet101`` entry).
BLOCKS = (3, 4, 23, 3)
#: Output channels of a bottleneck block per ``planes`` (torchvision's ``Bottleneck.expansion``).
EXPANSION = 4


class Bottleneck(nn.Module):
    """1×1 → 3×3 (stride) → 1×1 convolutions with norm, ReLU; (+ shortcut) → ReLU.

    With ``skip=False`` the shortcut is cut: the block is a plain three-layer
    stack and owns no shortcut convolution.
    """

    def __init__(
        self, in_channels: int, planes: int, stride: int, norm: str, groups: int, skip: bool
    ) -> None:
        super().__init__()
        out = planes * EXPANSION
        self.skip = skip
        self.conv1 = nn.Conv2d(in_channels, planes, 1, bias=False)
        self.norm1 = norm_layer(norm, planes, groups=groups)
        self.act1 = nn.ReLU()
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=stride, padding=1, bias=False)
        self.norm2 = norm_layer(norm, planes, groups=groups)
        self.act2 = nn.ReLU()
        self.conv3 = nn.Conv2d(planes, out, 1, bias=False)
        self.norm3 = norm_layer(norm, out, groups=groups)
        self.act3 = nn.ReLU()
        self.downsample = shortcut(in_channels, out, stride, norm, groups) if skip else None

    def forward(self, x: Tensor) -> Tensor:
        out = self.act1(self.norm1(self.conv1(x)))
        out = self.norm3(self.conv3(self.act2(self.norm2(self.conv2(out)))))
        if self.skip:
            out = out + (x if self.downsample is None else self.downsample(x))
        return self.act3(out)

    def extra_repr(self) -> str:
        return f"skip={self.skip}"


@register("resnet101")
def build_resnet101(
    in_shape: tuple[int, int, int],
    num_classes: int,
    *,
    bias: bool = True,
    width: int = 16,
    norm: str = "batch",
    groups: int = 2,
    cut_skip: tuple[int, ...] = (),
) -> nn.Sequential:
    """ResNet-101 of R-GAP's Table 4 (module docstring): base width 16, CIFAR stem, BatchNorm.

    Options: ``bias`` (the final linear layer's; the convolutions are
    bias-free), ``width`` (base width, default 16 as Table 4), ``norm``
    ("batch", default, inversefed's; "group" with ``groups`` groups; "none"),
    ``cut_skip`` (1-based indices of the 33 bottleneck blocks whose skip
    connection is removed). Stages: ``input``, ``stem``, ``layer1`` …
    ``layer4``, ``pool``, ``fc``. Batch norm in training mode couples the
    samples of a batch: call ``model.eval()`` before per-sample ``vmap``.
    """
    if width < 1:
        raise ValueError(f"width must be a positive integer, got {width}")
    cut = set(cut_skip)
    if not cut <= set(range(1, sum(BLOCKS) + 1)):
        raise ValueError(
            f"cut_skip holds 1-based bottleneck-block indices in 1..{sum(BLOCKS)}, "
            f"got {tuple(cut_skip)}"
        )
    stem = resnet_stem("cifar", in_shape[0], width, norm, groups)  # built first: torch init order
    layers, features = residual_layers(Bottleneck, BLOCKS, width, EXPANSION, norm, groups, cut)
    model = staged(
        in_shape, "resnet101", [("stem", stem), *layers, *head(features, num_classes, bias)]
    )
    return initialise(model, "kaiming")
