"""Bayes paper §5–6 (Balunović et al., ICLR 2022): PRECODE on an MLP, broken in closed form.

``bayes/precode-mlp``: PRECODE on an MLP falls to the closed-form recovery of
the first layer's input (Phong et al. 2017), which ignores the bottleneck (the
paper reports PSNR > 150 dB; Fig. 3's PRECODE row). Called by the chapter
"Breaking heuristic defenses"; the chapter "Variational bottlenecks" takes
PRECODE apart in depth.
"""

from __future__ import annotations

import torch
from torch import nn

from .. import models
from ..attacks import bias_attack
from ..fl import train
from ..records import image_lists
from ..verdicts import EVERY_IMAGE
from .bayes_soteria import TRAIN_BATCH
from .bayes_training import PRECODE_KL_WEIGHT_BITS, PRECODE_TRAINING
from .bayes_work import precode_work
from .case import build_case
from .config import ScaleConfig
from .registry import Context, experiment

__all__ = ["precode_mlp", "precode_network"]


def precode_network(in_shape: tuple[int, ...]) -> nn.Module:
    """The Bayes authors' PRECODE MLP on ``in_shape`` inputs (float32; the caller seeds torch).

    Five fully connected layers of 500, Linear(256), the PRECODE bottleneck
    (K = 256, its KL weighted as the authors' training weights it:
    :data:`.bayes_training.PRECODE_KL_WEIGHT_BITS`) at ``fc6``, Linear(500) and
    the classifier of ten classes (``models.build("mlp")``'s documented
    configuration). Built here for ``bayes/precode-mlp`` and for its declared
    work (:mod:`.bayes_work`).
    """
    return models.build(
        "mlp", in_shape=in_shape, num_classes=10, widths=(500,) * 5 + (256, 500),
        bottleneck={"kind": "precode", "position": "fc6", "K": 256, "beta": PRECODE_KL_WEIGHT_BITS},
    )  # fmt: skip


@experiment(
    "bayes/precode-mlp",
    on=("image",),
    row_keys=("image", "psnr"),
    config=ScaleConfig(
        ci={"victims": 8, "train_steps": 10},
        paper={"victims": 40, "train_steps": 10},
        sources={
            "victims": "ours (Fig. 3 shows the first 40 reconstructed images)",
            "train_steps": "Fig. 3: attacked 'after the 10th training step', batch size 32 as the "
            "paper's other networks (A.1, A.2)",
        },
    ),
    reference=[{"image": EVERY_IMAGE, "psnr": "> 150"}],
    reference_source="§6: 'In all of our PRECODE experiments we obtain perfect reconstruction "
    "with PSNR values > 150'",
    datasets=("cifar10",),
    work=precode_work,
)
def precode_mlp(ctx: Context) -> dict:
    """PRECODE on an MLP broken exactly by the closed-form first-layer attack (Bayes paper §5–6).

    The Bayes authors' PRECODE network: five fully connected layers of 500,
    then Linear(256), the variational bottleneck (K = 256, β = 1e-3) and
    Linear(500) before the classifier, uniform ±0.05 initialisation
    (``models.build("mlp")``'s documented configuration), in float64,
    trained for ``train_steps`` steps of batch size 32 on the training split
    (the authors' Adam, :data:`.bayes_training.PRECODE_TRAINING`, on cross-entropy plus
    the bottleneck's β·KL) as Fig. 3 attacks it after the 10th step. Every
    image is its own client (its own bottleneck noise); the noise changes
    nothing for the first layer, whose gradient still equals (dl/db)·xᵀ, so
    :func:`~leakagelib.attacks.bias_attack` inverts it. Rows: ``image``,
    ``label``, ``psnr`` (dB on [0, 1] images; ``inf`` when exact — here the
    float32 normalisation of the images bounds it near 160 dB). Extra entries:
    ``figure3``, the first (up to) 8 originals and recoveries, as lists
    (Fig. 3's PRECODE row); ``train_losses``, the training loss of each step.
    Data: ``cifar10`` (``patches`` at ci).
    """
    images, labels, norm = ctx.dataset("cifar10", n=ctx.config.victims, shuffle=False)
    train_x, train_y, _ = ctx.dataset("cifar10", split="train")
    shape = tuple(images.shape[1:])
    torch.manual_seed(ctx.seed)
    model = precode_network(shape).to(device=ctx.device, dtype=torch.float64)
    trained = train(
        model, norm.normalize(train_x).to(ctx.device, torch.float64), train_y.to(ctx.device),
        steps=ctx.config.train_steps, batch_size=TRAIN_BATCH, seed=ctx.seed, **PRECODE_TRAINING,
    )  # fmt: skip
    case = build_case(trained.model, images, labels, norm, device=ctx.device)
    result = bias_attack(case.model, case.updates, case.labels, input_shape=shape)
    psnr = case.score(result, "psnr")
    rows = [
        {"image": i, "label": int(labels[i]), "psnr": float(psnr[i])} for i in range(len(labels))
    ]
    shown = slice(0, 8)  # Fig. 3's PRECODE row
    return {
        "rows": rows,
        "figure3": {
            "original": image_lists(images[shown]),
            "reconstruction": image_lists(case.reconstructions(result)[shown]),
        },
        "train_losses": trained.losses,
    }
