"""The experiment of the chapter "What a client update reveals": the closed-form bias attack.

``intro/bias-attack`` recovers every client's image exactly from its fully
connected network's first-layer gradient (Phong et al. 2017) — the attack
the later chapters' defenses have to stop. It reproduces no table of the
three papers, so it has no reference numbers.
"""

from __future__ import annotations

import torch

from .. import models
from ..attacks import bias_attack
from .case import build_case
from .config import ScaleConfig
from .registry import Context, experiment
from .work import Load, Net

#: The attacked MLP on MNIST-sized inputs, as ``campaign``'s probes time it.
MLP_NET = Net("mlp 1×28×28", lambda: models.build("mlp", (1, 28, 28), 10), (1, 28, 28))

__all__ = ["bias_attack_experiment"]


@experiment(
    "intro/bias-attack",
    row_keys=("image", "psnr"),
    config=ScaleConfig(
        ci={"victims": 8},
        paper={"victims": 100},
        sources={"victims": "ours (the first 100 MNIST test images; the attack is exact for any)"},
    ),
    datasets=("mnist",),
    work=lambda ctx: [[Load(MLP_NET, "train", ctx.config.victims)]],  # the per-image gradients
)
def bias_attack_experiment(ctx: Context) -> list[dict]:
    """Closed-form recovery of each image from an MLP's first-layer gradient (Phong et al.).

    Each image is a separate client with its own update (per-sample
    gradients, one vectorised call); the attack inverts all of them at once,
    in float64 from images converted to float64 before normalising, so the
    PSNR shows the attack's own precision. Rows: ``image`` (index), ``label``,
    ``psnr`` (dB; ``inf`` when exact), ``mse``. Data: ``mnist`` (the embedded
    ``digits28`` at ci scale).
    """
    images, labels, norm = ctx.dataset("mnist", n=ctx.config.victims, shuffle=False)
    shape = tuple(images.shape[1:])
    torch.manual_seed(ctx.seed)
    model = models.build("mlp", shape, 10).to(device=ctx.device, dtype=torch.float64)
    case = build_case(model, images.double(), labels, norm, device=ctx.device)
    result = bias_attack(case.model, case.updates, case.labels, input_shape=shape)
    psnr, mse = case.score(result, "psnr"), case.score(result, "mse")
    return [
        {"image": i, "label": int(labels[i]), "psnr": float(psnr[i]), "mse": float(mse[i])}
        for i in range(len(labels))
    ]
