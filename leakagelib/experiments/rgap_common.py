"""What the R-GAP experiments share: input shapes, seeded float64 models, labels with μ < 0, the case.

The closed-form experiments of Zhu & Blaschko (2021) attack untrained networks
in float64 with R-GAP's logistic loss on images in [0, 1] (no normalisation).
As in the authors' code (JunyiZhu-AI/R-GAP, ``main.py``), the model is
initialised after seeding and the label is chosen so that μ < 0 (then μ is
unique), except in ``rgap/twin-data`` and ``rgap/twin-dlg``, which want the
twin. Used by every R-GAP experiment module (:mod:`.rgap_closed_form`,
:mod:`.rgap_lenet`, :mod:`.rgap_losses`, :mod:`.rgap_rank`,
:mod:`.rgap_resnet_skip`, :mod:`.rgap_skip`, :mod:`.rgap_batch_noise` and
:mod:`.rgap_twin`); :func:`solve_net` and :func:`dlg_net` name their networks
for ``campaign``'s estimates (:mod:`.work`, :mod:`.estimate`).
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
from torch import Tensor, nn

from ..data import Normalizer
from ..models import build
from ..models.rgap_nets import CNN6_LAYERS, conv_stack
from .case import Case, build_case
from .registry import Context
from .work import Net

__all__ = [
    "ARCHITECTURES",
    "DATASETS",
    "FIGURE2_NETWORKS",
    "PICTURES",
    "VISUALLY_EXACT_MSE",
    "dlg_net",
    "labels_mu_negative",
    "logistic_case",
    "mse_summary",
    "solve_net",
    "stack_model",
    "victims",
    "zoo_model",
]

#: The datasets of Table 1 with their input shapes.
DATASETS: dict[str, tuple[int, int, int]] = {"cifar10": (3, 32, 32), "mnist": (1, 28, 28)}

#: Victims whose reconstructions an R-GAP experiment's row keeps (``pictures``: the chapters
#: "R-GAP in practice" and "Rank analysis" draw them, :func:`leakagelib.viz.show_pictures`).
PICTURES = 2

#: Conv chains (conv layers as (channels, kernel, stride, padding)) of
#: ``rgap/appG-noise``: CNN6 and CNN6 with every layer twice as wide.
ARCHITECTURES: dict[str, tuple[tuple[int, int, int, int], ...]] = {
    "cnn6": CNN6_LAYERS,
    "wide": tuple((2 * c, k, s, p) for c, k, s, p in CNN6_LAYERS),
}


#: Zhu & Blaschko (2021), §5 on Table 2: "if the MSE is around or below 1×10⁻⁴,
#: the difference of the reconstruction will be visually undetectable" (images in
#: [0, 1], a PSNR of 40 dB). :func:`mse_summary` counts the images at or below it.
VISUALLY_EXACT_MSE = 1e-4


def mse_summary(err: Tensor, name: str = "mse") -> dict[str, Any]:
    """The per-image errors ``err`` of one attack as record columns named after ``name``.

    ``name`` (the mean over images, the papers' statistic) and ``name_std``,
    beside ``name_median``, ``name_recovered`` (the share of images whose MSE
    is at most :data:`VISUALLY_EXACT_MSE`) and ``name_per_image``. The mean
    alone misleads where an attack diverges on some images: DLG in its own
    setting on LeNet (``rgap/table2-lenet``) reached 4e-6 to 9e-5 on ten of
    twenty images and 38 to 1.9e14 on the other ten, a mean of 1e13. Tables
    1–3 (:mod:`.rgap_closed_form`, :mod:`.rgap_lenet`, :mod:`.rgap_rank`).
    """
    err = err.double().cpu()
    return {
        name: float(err.mean()),
        f"{name}_std": float(err.std()) if len(err) > 1 else 0.0,
        f"{name}_median": float(err.quantile(0.5)),
        f"{name}_recovered": float((err <= VISUALLY_EXACT_MSE).double().mean()),
        f"{name}_per_image": err.tolist(),
    }


def _k4(channels: int) -> tuple[int, int, int, int]:
    """A 4×4 convolution with stride 1 and no padding to ``channels`` outputs."""
    return (channels, 4, 1, 0)


#: The five networks of Figure 2 / Table 3 of Zhu & Blaschko (2021), constructed.
#:
#: The figure draws its networks as diagrams that the paper's text does not
#: carry (our extraction, ``shared/papers/rgap-recursive-gradient-attack.txt``,
#: keeps only the caption and Table 3's RA-i −484 / 405 / 405 / −208 / 316), and
#: the authors' code (JunyiZhu-AI/R-GAP: ``models/`` has CNN6, CNN6-d, FCN3 and
#: LeNet only) has neither these networks nor DLG. So they are constructed:
#: every convolution 4×4, stride 1, no padding, bias-free, LeakyReLU(0.2)
#: (CNN6's activation, authors' ``models/CNN6.py``), then one bias-free linear
#: layer to one logit, on 3×32×32 inputs. The choice is forced where the table
#: allows: of all first layers (1–128 channels, kernel 1–8, stride 1–3, padding
#: below the kernel) only a 4×4, stride-1, unpadded one gives −484 (4 channels)
#: or 405 (3 channels) with a usual geometry (the others: 7×7 stride 2 padding
#: 6, 3×3 stride 3 with 28 or 21 channels). The caption fixes the structure:
#: columns 2 and 3 share a rank-deficient first layer and have two and four
#: times column 1's parameters; column 4's second layer is locally
#: deficient (``|x| − |W| − |z|`` = 4,289) but its 4,497 virtual constraints compensate
#: it; column 5's third layer stays deficient after its virtual constraints.
#: The later channel counts are ours. ``leakagelib.rgap.rank_analysis`` gives
#: exactly the paper's RA-i (critical layers conv1, conv1, conv1, conv2, conv3).
FIGURE2_NETWORKS: dict[str, tuple[tuple[int, int, int, int], ...]] = {
    "fig2-col1": (_k4(4), _k4(8)),
    "fig2-col2": (_k4(3), _k4(16)),
    "fig2-col3": (_k4(3), _k4(16), _k4(32)),
    "fig2-col4": (_k4(9), _k4(4)),
    "fig2-col5": (_k4(4), _k4(10), _k4(4)),
}


def zoo_model(ctx: Context, name: str, in_shape: tuple[int, int, int], **options: Any) -> nn.Module:
    """Zoo model ``name`` with one output logit, built after seeding with ``ctx.seed``, float64."""
    torch.manual_seed(ctx.seed)
    return build(name, in_shape=in_shape, num_classes=1, **options).double().to(ctx.device)


def stack_model(
    ctx: Context, in_shape: tuple[int, int, int], layers: tuple, name: str, init: str = "default"
) -> nn.Module:
    """A one-logit chain of ``layers`` (:func:`~leakagelib.models.rgap_nets.conv_stack`), seeded, float64.

    ``init`` as :func:`~leakagelib.models.rgap_nets.conv_stack`'s ("normal": N(0, 0.01²)).
    """
    torch.manual_seed(ctx.seed)
    return conv_stack(in_shape, 1, layers, name=name, init=init).double().to(ctx.device)


def victims(ctx: Context, dataset: str, n: int) -> Tensor:
    """The first ``n`` images of the run's ``dataset`` in float64, on the run's device."""
    return ctx.dataset(dataset, n=n).images.double().to(ctx.device)


def labels_mu_negative(model: nn.Module, images: Tensor) -> Tensor:
    """Labels y ∈ {−1, +1} with y·f(x) < 0, the authors' choice that makes μ unique."""
    with torch.no_grad():
        out = model(images).reshape(-1)
    return torch.where(out > 0, -1, 1).long()


def logistic_case(ctx: Context, model: nn.Module, images: Tensor, labels: Tensor) -> Case:
    """Each image its own client sharing its logistic-loss gradient; images in [0, 1] as they are."""
    return build_case(
        model, images, labels, Normalizer.identity(), device=ctx.device, loss="logistic"
    )


def _seeded(make: Any, *args: Any, **options: Any) -> nn.Module:
    """``make(*args, **options)`` after seeding with 0 (a probe's network)."""
    torch.manual_seed(0)
    return make(*args, **options)


def solve_net(
    in_shape: tuple[int, int, int], name: str, layers: tuple | None = None, **options: Any
) -> Net:
    """The one-logit float64 network R-GAP solves, as the probes time it.

    Zoo model ``name`` (with ``options``), or the chain ``layers`` (of
    :data:`ARCHITECTURES` or :data:`FIGURE2_NETWORKS`) named ``name``, on
    inputs of ``in_shape``.
    """
    if layers is None:
        make = partial(_seeded, build, name, in_shape=in_shape, num_classes=1, **options)
    else:
        make = partial(_seeded, conv_stack, in_shape, 1, layers, name=name)
    shape = "×".join(map(str, in_shape))
    return Net(f"{name} {shape} (R-GAP)", lambda: make().double(), in_shape, classes=1)


def dlg_net(
    in_shape: tuple[int, int, int], name: str, layers: tuple | None = None, **options: Any
) -> Net:
    """Zoo model ``name``, or the chain ``layers`` named ``name``, as DLG attacks it
    (in float32), as the probes time it (ten outputs)."""
    shape = "×".join(map(str, in_shape))
    if layers is None:
        make = partial(_seeded, build, name, in_shape=in_shape, num_classes=10, **options)
    else:
        make = partial(_seeded, conv_stack, in_shape, 10, layers, name=name)
    return Net(f"{name} {shape}", make, in_shape)
