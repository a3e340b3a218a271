"""Experiments of the chapter "What a client update reveals"."""

from __future__ import annotations

import torch

from .. import metrics, models
from ..attacks import closed_form
from ..gradients import per_sample_updates
from .registry import Context, experiment


@experiment("intro/bias-attack", row_keys=("image", "psnr"), datasets=("mnist",))
def bias_attack(ctx: Context) -> list[dict]:
    """Closed-form recovery of each image from an MLP's first-layer gradient (Phong et al.).

    Each image is a separate client with its own update (per-sample gradients,
    one vectorised call); the attack inverts all of them at once in float64.
    Rows: ``image`` (index), ``label``, ``psnr`` (dB; ``inf`` when exact),
    ``mse``. Data: ``mnist`` (the embedded ``digits28`` at ci scale).
    """
    n = ctx.pick(ci=8, paper=100)
    images, labels, norm = ctx.dataset("mnist", n=n, shuffle=False)
    in_shape = tuple(images.shape[1:])
    torch.manual_seed(ctx.seed)
    model = models.build("mlp", in_shape, 10).to(device=ctx.device, dtype=torch.float64)
    x = norm.normalize(images.to(ctx.device, torch.float64))
    updates = per_sample_updates(model, x, labels.to(ctx.device))
    result = closed_form.bias_attack(model, updates, labels, input_shape=in_shape)
    recovered = norm.denormalize(result.inputs())
    target = images.to(ctx.device, torch.float64)
    psnr = metrics.psnr(recovered, target)
    mse = metrics.mse(recovered, target)
    return [
        {"image": i, "label": int(labels[i]), "psnr": float(psnr[i]), "mse": float(mse[i])}
        for i in range(n)
    ]
