"""H-GAP and DLG against R-GAP's setting (Zhu & Blaschko 2021, §5).

H-GAP chooses, per image and without the ground truth, between R-GAP's and
DLG's reconstructions: a good reconstruction has little salt-and-pepper noise,
measured as the norm of the difference between the image and its 3×3
average-smoothed version (:func:`roughness`). :func:`dlg_logistic` runs the
library's DLG preset (Zhu et al. 2019) with R-GAP's logistic loss and the
label given, as the paper does ("the experiment actually compares R-GAP with
iDLG"). :func:`rgap_then_dlg` is the paper's R-GAP → DLG (§5, Table 2): the
same DLG loop started from R-GAP's reconstruction instead of noise, so that
where R-GAP is only partly right (rank-deficient layers, ill-conditioned
systems) the optimiser refines its output. Used by experiments ``rgap/table1``
and ``rgap/table2-lenet`` and the chapters "Closed-form attacks" and "Rank analysis".
"""

from __future__ import annotations

import copy
from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..attacks import reconstruct
from ..attacks.presets import dlg
from ..gradients import Update

__all__ = ["dlg_logistic", "hgap", "rgap_then_dlg", "roughness"]


def roughness(images: Tensor) -> Tensor:
    """‖x − smooth₃ₓ₃(x)‖ per image (N×C×H×W → N), the smoothing replicate-padded."""
    if images.dim() != 4:
        raise ValueError(f"images must be N×C×H×W, got shape {tuple(images.shape)}")
    c = images.shape[1]
    kernel = torch.full((c, 1, 3, 3), 1 / 9, dtype=images.dtype, device=images.device)
    smooth = F.conv2d(F.pad(images, (1, 1, 1, 1), mode="replicate"), kernel, groups=c)
    return (images - smooth).flatten(1).norm(dim=1)


def hgap(rgap_images: Tensor, dlg_images: Tensor) -> tuple[Tensor, Tensor]:
    """Per image, the smoother of the two reconstructions; also which one (True: R-GAP)."""
    if rgap_images.shape != dlg_images.shape:
        raise ValueError(
            f"R-GAP and DLG images differ in shape: {tuple(rgap_images.shape)} vs "
            f"{tuple(dlg_images.shape)}"
        )
    a, b = rgap_images.to(dlg_images.dtype), dlg_images
    pick = roughness(a) <= roughness(b)
    return torch.where(pick[:, None, None, None], a, b), pick


def dlg_logistic(
    model: nn.Module,
    updates: Update,
    labels: Tensor,
    *,
    in_shape: tuple[int, int, int],
    steps: int,
    generator: torch.Generator | None = None,
    initial: Tensor | None = None,
    relative: bool = False,
) -> Tensor:
    """DLG (L-BFGS on the squared gradient distance) on stacked logistic-loss updates.

    ``updates`` has a leading dimension N (one single-image update each) and
    ``labels`` (N, values ±1) are given. All N attacks run as one batched
    program; the loop runs in float32 even when ``model`` is float64.
    ``initial`` (N×C×H×W) replaces DLG's random start with given images
    (see :func:`rgap_then_dlg`). ``relative`` divides the objective by the
    mean squared norm of the updates: the same minimisers, but L-BFGS's
    absolute stopping tolerances (``torch.optim.LBFGS``'s ``tolerance_grad``
    and ``tolerance_change``) no longer depend on the update's magnitude;
    experiment ``rgap/twin-dlg`` (chapter "Twin data") uses it. The default
    keeps DLG's published, unscaled objective.
    Returns the N×C×H×W reconstructions.
    """
    attack = dlg(steps=steps)
    likelihood = attack.likelihood
    if relative:
        sq = torch.stack([v.double().flatten(1).pow(2).sum(dim=1) for v in updates.values()])
        scale = float(sq.sum(dim=0).mean().sqrt())
        if scale > 0:
            likelihood = replace(likelihood, sigma=likelihood.sigma * scale)
    result = reconstruct(
        copy.deepcopy(model).float(),
        {k: v.float() for k, v in updates.items()},
        labels=labels.reshape(-1, 1).long(),
        likelihood=likelihood,
        prior=attack.prior,
        config=attack.config.with_(optimize_labels=False),
        input_shape=in_shape,
        loss="logistic",
        generator=generator,
        initial=None if initial is None else initial.float().reshape(-1, 1, *in_shape),
    )
    return result.inputs()


def rgap_then_dlg(
    model: nn.Module,
    updates: Update,
    labels: Tensor,
    rgap_images: Tensor,
    *,
    in_shape: tuple[int, int, int],
    steps: int,
    generator: torch.Generator | None = None,
) -> Tensor:
    """R-GAP → DLG (Zhu & Blaschko 2021, §5): DLG started from R-GAP's reconstructions.

    ``updates`` are stacked single-image logistic-loss updates (leading
    dimension N), ``labels`` their N labels (±1) and ``rgap_images`` (N×C×H×W)
    R-GAP's outputs on them (:func:`leakagelib.rgap.recursive.rgap`). Non-finite
    pixels of R-GAP's output (a failed solve) start from zero instead. Returns
    the N×C×H×W refined reconstructions.
    """
    n = next(iter(updates.values())).shape[0]
    if tuple(rgap_images.shape) != (n, *in_shape):
        raise ValueError(
            f"rgap_images must have shape {(n, *in_shape)} (one per update), "
            f"got {tuple(rgap_images.shape)}"
        )
    start = torch.nan_to_num(rgap_images.detach(), nan=0.0, posinf=0.0, neginf=0.0)
    return dlg_logistic(
        model, updates, labels, in_shape=in_shape, steps=steps, generator=generator, initial=start
    )
