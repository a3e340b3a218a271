"""Experiments of the Bayes paper's §5–6: breaking Soteria, ATS and PRECODE early in training.

* ``bayes/precode-mlp``: PRECODE on an MLP falls to the closed-form recovery of
  the first layer's input (Phong et al. 2017), which needs no optimisation and
  ignores the bottleneck entirely (the paper reports PSNR > 150 dB).
* ``bayes/fig2-training``: the defense-aware attacks on ATS (Inverting
  Gradients on the augmented-trained ConvNet after each of the first training
  steps) and on Soteria (the layer-drop attack on ConvBig after the first
  epochs) — their PSNR falls as training proceeds, so a defense must be
  evaluated throughout training (Fig. 2).

Attack settings from the paper (§6, A.1, A.2): cosine likelihood, Adam lr 0.1
with decay, TV 1e-5 (ATS) and 4e-4 (Soteria), 2,000 and 4,000 iterations,
batch size 1, random initialisation; training with batch size 32. At ci
scale (one image, ConvNet of width 8, Soteria on the smaller ``bayes-cnn``
whose ``fc1`` is likewise the largest linear layer after the convolutions,
25 attack iterations, steps 0 and 20) the run only exercises the pipeline:
on CPU these networks' attack steps cost seconds each.
"""

from __future__ import annotations

from functools import partial

import torch
from torch import nn

from .. import metrics, models
from ..attacks import (
    AttackConfig,
    Cosine,
    LayerSelection,
    TotalVariation,
    image_bounds,
    reconstruct,
)
from ..attacks.closed_form import recover_inputs_from_update
from ..bottlenecks import apply_bottleneck_option
from ..defenses.ats import ATSAugmentation
from ..defenses.soteria import Soteria
from ..fl import train
from ..gradients import client_update, per_sample_updates
from .registry import Context, experiment


@experiment("bayes/precode-mlp", row_keys=("image", "psnr"))
def precode_mlp(ctx: Context) -> list[dict]:
    """PRECODE on an MLP broken exactly by the closed-form first-layer attack (Bayes paper §5–6).

    The Bayes authors' PRECODE network: five fully connected layers of 500,
    then Linear(256), the variational bottleneck (K = 256, β = 1e-3) and
    Linear(500) before the classifier, uniform ±0.05 initialisation
    (``models.build("mlp")``'s documented configuration). Every image is its own
    client; the bottleneck's noise changes nothing for the first layer, whose
    gradient still equals (dl/db)·xᵀ. Computed in float64. Rows: ``image``,
    ``label``, ``psnr`` (dB, on [0, 1] images; ``inf`` when exact). Data:
    ``cifar10`` (``patches`` at ci).
    """
    n = ctx.pick(ci=8, paper=40)
    images, labels, norm = ctx.dataset("cifar10", n=n, shuffle=False)
    shape = tuple(images.shape[1:])
    torch.manual_seed(ctx.seed)
    base = models.build("mlp", in_shape=shape, num_classes=10, widths=(500,) * 5 + (256, 500))
    model = apply_bottleneck_option(base, {"kind": "precode", "position": "fc6", "K": 256}, shape)
    model = model.to(device=ctx.device, dtype=torch.float64)
    x = norm.normalize(images).to(ctx.device, torch.float64)
    # one client per image: per-sample updates, each with its own bottleneck noise, in one vmap
    updates = per_sample_updates(model, x, labels.to(ctx.device))
    recovered = norm.denormalize(recover_inputs_from_update(model, updates, shape, batched=True))
    psnr = metrics.psnr(recovered.cpu(), images.double())
    return [{"image": i, "label": int(labels[i]), "psnr": float(psnr[i])} for i in range(n)]


def _ig(
    ctx: Context, model: nn.Module, x, y, norm, *, likelihood, tv: float, steps: int, offset: int
):
    """PSNR of Inverting Gradients (cosine, TV, Adam lr 0.1, step decay) on each image's update."""
    gen = ctx.generator(offset)
    updates = [client_update(model, x[i : i + 1], y[i : i + 1]) for i in range(x.shape[0])]
    stacked = {k: torch.stack([u[k] for u in updates]) for k in updates[0]}
    config = AttackConfig(
        steps=steps, optimizer="adam", lr=0.1, schedule="step", decay=0.1, beta=tv, box=True
    )
    result = reconstruct(
        model, stacked, labels=y, likelihood=likelihood, prior=TotalVariation(), config=config,
        input_shape=tuple(x.shape[1:]), stacked=True, bounds=image_bounds(norm.mean, norm.std),
        generator=gen, device=ctx.device,
    )  # fmt: skip
    recon = norm.denormalize(result.images[0, :, 0].detach().cpu())
    return metrics.psnr(recon.clamp(0, 1), norm.denormalize(x.cpu()))


@experiment("bayes/fig2-training", row_keys=("defense", "step", "psnr"))
def fig2_training(ctx: Context) -> list[dict]:
    """Bayes Fig. 2: PSNR of the defense-aware attacks on ATS and Soteria as training proceeds.

    ATS: ConvNet trained with each augmentation policy ("7-4-15", "21-13-3",
    their hybrid) and attacked by Inverting Gradients after given training
    steps, on the augmented images the client trains on (PSNR against
    those). Soteria: ConvBig trained without defense (the paper applies the
    defense at inference time, A.1), defended on ``fc1`` at pruning rate 80 %
    and attacked by the layer-drop attack (all layers but ``fc1``); the
    direct attack on the defended update is reported alongside. Rows:
    ``defense`` ("ats 7-4-15", ..., "soteria", "soteria (direct attack)"),
    ``step`` (training steps, batch size 32), ``psnr`` (mean dB), ``psnr_std``.
    Data: ``cifar10`` (``patches`` at ci).
    """
    n = ctx.pick(ci=1, paper=10)
    images, labels, norm = ctx.dataset("cifar10", n=n, shuffle=False)
    train_x, train_y, _ = ctx.dataset("cifar10", split="train")
    train_x = norm.normalize(train_x).to(ctx.device)
    train_y = train_y.to(ctx.device)
    x, y = norm.normalize(images).to(ctx.device), labels.to(ctx.device)
    shape = tuple(images.shape[1:])
    steps = ctx.pick(ci=(0, 20), paper=(0, 10, 20, 50, 100, 200, 500, 1000))
    rows = []

    def add(defense: str, step: int, psnr: torch.Tensor) -> None:
        rows.append({"defense": defense, "step": step, "psnr": float(psnr.mean()),
                     "psnr_std": float(psnr.std()) if psnr.numel() > 1 else 0.0})  # fmt: skip

    policies = ctx.pick(ci=("7-4-15",), paper=("7-4-15", "21-13-3", "21-13-3+7-4-15"))
    for p_i, policy in enumerate(policies):
        torch.manual_seed(ctx.seed)
        net = models.build(
            "convnet", in_shape=shape, num_classes=10, width=ctx.pick(ci=8, paper=64)
        )
        normalized_augment = partial(_in_normalized_space, ATSAugmentation(policy), norm)

        trained = train(net, train_x, train_y, steps=max(steps), batch_size=32, augment=normalized_augment,
                        snapshot_steps=steps, seed=ctx.seed)  # fmt: skip
        victims = normalized_augment(x, ctx.generator(100 + p_i))  # the client trains on these
        for step in ctx.track(steps, f"ATS {policy}"):
            net.load_state_dict(trained.snapshots[step])
            net.eval()  # batch norm with running statistics: each image's update on its own
            psnr = _ig(ctx, net, victims, y, norm, likelihood=Cosine(), tv=1e-5,
                       steps=ctx.pick(ci=25, paper=2000), offset=p_i)  # fmt: skip
            add(f"ats {policy}", step, psnr)

    torch.manual_seed(ctx.seed)
    net = models.build(ctx.pick(ci="bayes-cnn", paper="convbig"), in_shape=shape, num_classes=10)
    trained = train(
        net, train_x, train_y, steps=max(steps), batch_size=32, snapshot_steps=steps, seed=ctx.seed
    )
    soteria = Soteria("fc1.linear", pruning_rate=0.8)
    attack_steps = ctx.pick(ci=25, paper=4000)
    for step in ctx.track(steps, "Soteria"):
        net.load_state_dict(trained.snapshots[step])
        updates = []
        for i in range(n):
            updates.append(soteria.defend(net, x[i : i + 1], y[i : i + 1]))
        psnr_drop = _soteria_attack(
            ctx, net, updates, x, y, norm, soteria.likelihood(), attack_steps
        )
        psnr_direct = _soteria_attack(
            ctx, net, updates, x, y, norm, Cosine(layers=LayerSelection()), attack_steps
        )
        add("soteria", step, psnr_drop)
        add("soteria (direct attack)", step, psnr_direct)
    return rows


def _in_normalized_space(augment: ATSAugmentation, norm, batch: torch.Tensor, g) -> torch.Tensor:
    """Apply an ATS policy (defined on [0, 1] images) to a batch in the model's normalised space."""
    return norm.normalize(augment(norm.denormalize(batch), g))


def _soteria_attack(
    ctx: Context, model, updates, x, y, norm, likelihood, steps: int
) -> torch.Tensor:
    stacked = {k: torch.stack([u[k] for u in updates]) for k in updates[0]}
    config = AttackConfig(
        steps=steps, optimizer="adam", lr=0.1, schedule="step", decay=0.1, beta=4e-4, box=True
    )
    result = reconstruct(
        model, stacked, labels=y, likelihood=likelihood, prior=TotalVariation(), config=config,
        input_shape=tuple(x.shape[1:]), stacked=True, bounds=image_bounds(norm.mean, norm.std),
        generator=ctx.generator(7), device=ctx.device,
    )  # fmt: skip
    recon = norm.denormalize(result.images[0, :, 0].detach().cpu())
    return metrics.psnr(recon.clamp(0, 1), norm.denormalize(x.cpu()))
