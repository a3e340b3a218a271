"""H-GAP and DLG against R-GAP's setting (Zhu & Blaschko 2021, §5).

H-GAP chooses, per image and without the ground truth, between R-GAP's and
DLG's reconstructions: a good reconstruction has little salt-and-pepper noise,
measured as the norm of the difference between the image and its 3×3
average-smoothed version (:func:`roughness`). :func:`dlg_logistic` runs DLG
(Zhu et al. 2019) with R-GAP's logistic loss and the label given — the
library's iDLG preset with given labels, as the paper says: "the experiment
actually compares R-GAP with iDLG". :func:`rgap_then_dlg` is the paper's
R-GAP → DLG (§5, Table 2): the same DLG loop started from R-GAP's
reconstruction instead of noise, so that where R-GAP is only partly right
(rank-deficient layers, ill-conditioned systems) the optimiser refines its
output.

Every attack here takes what :func:`~leakagelib.rgap.recursive.rgap` takes —
stacked single-image updates (leading dimension N), their N labels (±1) and
``input_shape`` — and returns an :class:`~leakagelib.attacks.AttackResult`
with one setting, restart and input per update. Used by experiments
``rgap/table1``, ``rgap/table2-lenet`` and ``rgap/twin-dlg`` and the chapters
"Closed-form attacks" and "Twin data".
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..attacks import AttackResult
from ..attacks.presets import idlg
from ..gradients import Update, check_update
from .recursive import rgap

__all__ = ["dlg_logistic", "hgap", "rgap_then_dlg", "roughness", "smoother"]


def roughness(images: Tensor) -> Tensor:
    """‖x − smooth₃ₓ₃(x)‖ per image (N×C×H×W → N), the smoothing replicate-padded."""
    if images.dim() != 4:
        raise ValueError(f"images must be N×C×H×W, got shape {tuple(images.shape)}")
    c = images.shape[1]
    kernel = torch.full((c, 1, 3, 3), 1 / 9, dtype=images.dtype, device=images.device)
    smooth = F.conv2d(F.pad(images, (1, 1, 1, 1), mode="replicate"), kernel, groups=c)
    return (images - smooth).flatten(1).norm(dim=1)


def smoother(rgap_images: Tensor, dlg_images: Tensor) -> tuple[Tensor, Tensor]:
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
    input_shape: tuple[int, int, int],
    steps: int,
    generator: torch.Generator | None = None,
    initial: Tensor | None = None,
    relative: bool = False,
    init: str = "normal",
    per_attack: bool = False,
) -> AttackResult:
    """DLG (L-BFGS on the squared gradient distance) on stacked logistic-loss updates.

    ``updates`` has a leading dimension N (one single-image update each) and
    ``labels`` (N, values ±1) are given — or ``labels`` N×B for updates of a
    batch of B images each, of which DLG then reconstructs all B (batch DLG,
    Appendix F; experiment ``rgap/appF-batch-dlg``): the :func:`~leakagelib.attacks.presets.idlg`
    preset with ``labels="given"`` and ``steps`` L-BFGS steps. All N attacks
    run as one batched program; the loop runs in float32 even when ``model``
    is float64. ``initial`` (N×C×H×W, or N·B images) replaces DLG's random start with given
    images (see :func:`rgap_then_dlg`). ``relative`` divides the objective by
    the mean squared norm of the updates: the same minimisers, but L-BFGS's
    absolute stopping tolerances (``torch.optim.LBFGS``'s ``tolerance_grad``
    and ``tolerance_change``) no longer depend on the update's magnitude;
    experiment ``rgap/twin-dlg`` (chapter "Twin data") uses it. The default
    keeps DLG's published, unscaled objective. ``init`` is the random start
    (an :class:`~leakagelib.attacks.AttackConfig` ``init``): ``"normal"``,
    N(0, 1) as DLG's code, or ``"uniform"``, U(0, 1) over the pixel range
    (experiment ``rgap/table3-rank``). ``per_attack`` gives every update's
    attack its own L-BFGS, the path ``torch.optim.LBFGS`` takes on that image
    alone as in DLG's code (:class:`~leakagelib.attacks.AttackConfig`'s
    ``per_attack``; experiment ``rgap/table2-lenet``); by default the N
    objectives are summed into one L-BFGS.
    """
    per_update = labels.reshape(labels.shape[0], -1) if labels.dim() == 2 else labels.reshape(-1, 1)
    attack = idlg(steps=steps, labels="given", init=init, per_attack=per_attack)
    if relative:
        sq = torch.stack([v.double().flatten(1).pow(2).sum(dim=1) for v in updates.values()])
        scale = float(sq.sum(dim=0).mean().sqrt())
        if scale > 0:
            sigma = attack.likelihood.sigma * scale
            attack = idlg(
                steps=steps, labels="given", sigma=sigma, init=init, per_attack=per_attack
            )
    return attack(
        copy.deepcopy(model).float(),
        {k: v.float() for k, v in updates.items()},
        input_shape=input_shape,
        labels=per_update.long(),
        loss="logistic",
        generator=generator,
        initial=None
        if initial is None
        else initial.float().reshape(-1, per_update.shape[1], *input_shape),
    )


def _rgap_of(
    model: nn.Module,
    updates: Update,
    labels: Tensor,
    input_shape: tuple[int, int, int],
    given: AttackResult | None,
) -> AttackResult:
    """R-GAP's result on ``updates``: ``given`` (checked to hold one image per update) or a new run."""
    if given is None:
        return rgap(model, updates, labels, input_shape=input_shape)
    n = check_update(model, updates, stacked=True)
    if tuple(given.inputs().shape) != (n, *input_shape):
        raise ValueError(
            f"rgap_result must hold one reconstruction of shape {tuple(input_shape)} per update "
            f"({n}), got inputs of shape {tuple(given.inputs().shape)}"
        )
    return given


def rgap_then_dlg(
    model: nn.Module,
    updates: Update,
    labels: Tensor,
    *,
    input_shape: tuple[int, int, int],
    steps: int,
    generator: torch.Generator | None = None,
    rgap_result: AttackResult | None = None,
    per_attack: bool = False,
) -> AttackResult:
    """R-GAP → DLG (Zhu & Blaschko 2021, §5): DLG started from R-GAP's reconstructions.

    ``updates`` are stacked single-image logistic-loss updates (leading
    dimension N) and ``labels`` their N labels (±1). R-GAP runs first unless
    ``rgap_result``, its result on the same updates, is given (experiments
    that also report R-GAP alone pass it). Non-finite pixels of R-GAP's output
    (a failed solve) start from zero instead. The result is DLG's
    (:func:`dlg_logistic`, ``steps`` L-BFGS steps, ``per_attack`` as
    there); its ``details`` are R-GAP's per-update details of the start.
    """
    start = _rgap_of(model, updates, labels, input_shape, rgap_result)
    images = torch.nan_to_num(start.inputs().detach(), nan=0.0, posinf=0.0, neginf=0.0)
    result = dlg_logistic(
        model,
        updates,
        labels,
        input_shape=input_shape,
        steps=steps,
        generator=generator,
        initial=images,
        per_attack=per_attack,
    )
    result.details = start.details
    return result


def hgap(
    model: nn.Module,
    updates: Update,
    labels: Tensor,
    *,
    input_shape: tuple[int, int, int],
    steps: int | None = None,
    generator: torch.Generator | None = None,
    rgap_result: AttackResult | None = None,
    dlg_result: AttackResult | None = None,
) -> AttackResult:
    """H-GAP (§5): per update, the smoother of R-GAP's and DLG's reconstructions.

    Runs R-GAP and DLG (:func:`dlg_logistic`, ``steps`` L-BFGS steps) on the
    stacked logistic-loss ``updates`` with their N ``labels`` (±1), unless
    their results on the same updates are given as ``rgap_result`` and
    ``dlg_result``. The images are compared in R-GAP's dtype (float64); the
    result's ``objective`` is the chosen image's :func:`roughness` and its
    ``details`` say, per update, which attack was chosen (``"rgap"`` or ``"dlg"``).
    """
    first = _rgap_of(model, updates, labels, input_shape, rgap_result)
    if dlg_result is None:
        if steps is None:
            raise ValueError("steps (DLG's L-BFGS steps) is needed unless dlg_result is given")
        dlg_result = dlg_logistic(
            model, updates, labels, input_shape=input_shape, steps=steps, generator=generator
        )
    a = first.inputs().detach()
    chosen, pick = smoother(a, dlg_result.inputs().detach().to(a))
    return AttackResult.one_per_update(
        chosen, roughness(chosen), details=["rgap" if p else "dlg" for p in pick.tolist()]
    )
