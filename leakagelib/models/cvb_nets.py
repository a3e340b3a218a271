"""The small CNN of the CVB paper (Scheliga, Mäder, Seeland: PRECODE analysed, CVB proposed).

The paper's gradient analysis (its Figure 4) and most of its tables use a CNN
of three convolutions — 16, 32, 64 channels, kernel 5, stride 2, no padding,
each followed by ReLU — and one linear classifier (dAI-SY-Group/
ConvolutionalVariationalBottleneck, ``configs/models/CNN.yaml`` with
``src/models/CNN.py``). CVB positions 1, 2, 3 of the paper are the stages
``conv1``, ``conv2``, ``conv3`` here; PRECODE's original position (between the
last feature layer and the classifier) is after ``flatten``. Used by the
chapter on PRECODE and CVB.
"""

from __future__ import annotations

from collections import OrderedDict

from torch import nn

from .init import initialise
from .registry import register
from .staging import dry_run_shape, staged

__all__ = ["CVB_CNN_CHANNELS", "build_cvb_cnn"]

#: Output channels of the three convolutions (``configs/models/CNN.yaml``).
CVB_CNN_CHANNELS = (16, 32, 64)


@register("cvb-cnn")
def build_cvb_cnn(
    in_shape: tuple[int, int, int],
    num_classes: int,
    *,
    bias: bool = True,
    init: str = "torch",
) -> nn.Sequential:
    """CVB paper CNN: [Conv(k=5, stride 2, no padding) → ReLU] for 16/32/64 channels → Linear.

    On 3×32×32 the maps are 14×14, 5×5, 1×1, and the model has 65,962
    parameters for 10 classes. The authors resize MNIST to 32×32 and repeat
    its grey channel three times (``configs/data/MNIST.yaml``: shape
    [3, 32, 32]); on 1×28×28 the third convolution would have no output.
    Options: ``bias`` (the authors' blocks keep
    biases: ``nn.Conv2d``'s default; CVB Table VII studies removing them),
    ``init`` (default ``"torch"``, the authors' PyTorch defaults).

    Stages: ``input``, ``conv1``, ``conv2``, ``conv3``, ``flatten``, ``head``.
    """
    features: list[tuple[str, nn.Module]] = []
    channels = in_shape[0]
    for i, out in enumerate(CVB_CNN_CHANNELS, start=1):
        block = nn.Sequential(
            OrderedDict(conv=nn.Conv2d(channels, out, 5, stride=2, bias=bias), act=nn.ReLU())
        )
        features.append((f"conv{i}", block))
        channels = out
    features.append(("flatten", nn.Flatten()))
    n = int(dry_run_shape(nn.Sequential(OrderedDict(features)), in_shape, "cvb-cnn").numel())
    model = staged(in_shape, "cvb-cnn", [*features, ("head", nn.Linear(n, num_classes, bias=bias))])
    return initialise(model, init)
