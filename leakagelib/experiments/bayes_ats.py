"""Bayes paper §5–6 and A.2 (Balunović et al., ICLR 2022): ATS's networks and the attack on them.

ATS (Gao et al. 2021) trains a ConvNet on images augmented by a policy
(:class:`~leakagelib.defenses.ATSAugmentation`); the Bayes paper attacks the
augmented images a client trains on with Inverting Gradients after given
numbers of training steps (Fig. 2's left panel, Fig. 3's ATS row, Fig. 6).
:func:`ats_scenario` trains a policy's ConvNet once, keeping the steps the
figure attacks, and :func:`ats_reconstructions` runs the attack after one of
them; ``bayes/fig2-training`` (:mod:`.bayes_defenses`) makes its rows from
them, for the chapter "Breaking heuristic defenses".

**ci scale.** ATS attacks the MNIST-sized ``digits28`` (:data:`ATS_STAND_IN`), as
Soteria's ci victims do, not the ``patches`` that stand for CIFAR-10. Inverting
Gradients needs the paper's network width and thousands of iterations to invert
a ConvNet's gradient on 3×32×32 images, and no cheaper setting showed the effect
there on a CPU. Measured on the ci patches (2026-11-28, one thread, signed Adam,
a paper-scale run beside it): width 8, 300 iterations: 9.0 dB on average over 3
images at steps 0, 10 and 50 alike; width 16, 500 iterations: 11.8 dB after one
training step, 14.0 dB at 1,500 iterations (2 images); width 32, 500 iterations
at step 0: 14.0 dB; width 64, 200 iterations: 9.9 dB, at 0.43 s an iteration
per image, so the paper's 2,000 would take a quarter of an hour per image; and
at width 16 with 500 iterations at a constant learning rate, steps 1 and 100
scored alike (12.1 and 11.7 dB over 5 images). On ``digits28`` (1×28×28) the
same attack shows the paper's fall within a ci budget (2026-12-07, one thread,
the ci code of this module and :mod:`.bayes_defenses`, policy 7-4-15, signed Adam, TV 10⁻⁵, mean PSNR of
the augmented victims after 0, 10 and 50 training steps): width 16 and 200
iterations on 3 images gave 18.0, 14.3 and 9.1 dB (seed 0), 16.3, 12.0 and 8.3
(seed 1), 26.6, 17.9 and 9.7 (seed 2), 22.4, 21.3 and 9.1 (seed 3), on 6 images
17.3, 12.7 and 8.2 dB (seed 0, 29 s an attack); 400 iterations on 4 images
21.7, 14.8 and 8.9 (seed 0) up to 30.6, 23.2 and 10.2 (seed 2); width 8 with
200 iterations on 6 images only 12.6, 10.5 and 7.7 (seed 0). Some images leak
far more than others, so the fall after Fig. 3's step (step 10 against 50,
paired over the images) is the claim with the least margin: on seed 2 its 95 %
interval starts at +0.47 dB with 6 images, +0.89 dB with 8 and +0.97 dB with 6
images and 300 iterations. The ci config takes width 16, 200 iterations and 8
images. The paper's setting runs on a GPU (a unit in one to two minutes on a
lent one).
"""

from __future__ import annotations

from functools import partial

import torch
from torch import Tensor

from .. import models
from ..attacks import preset
from ..data import Normalizer
from ..defenses import ATSAugmentation
from ..fl import TrainResult, train
from .bayes_soteria import TRAIN_BATCH
from .bayes_training import stepwise_run
from .case import build_case
from .kept import kept_run
from .registry import Context

__all__ = ["ATS_STAND_IN", "AtsScenario", "ats_reconstructions", "ats_scenario"]

#: The embedded images the ATS networks train on and are attacked on at ci scale, with MNIST's
#: normalisation (the module docstring says why not the CIFAR-10 stand-in ``patches``).
ATS_STAND_IN = "digits28"

#: A policy's trained ConvNet (with its snapshots), its victims as the client trains on them
#: (augmented, in [0, 1]), their labels and the normaliser.
AtsScenario = tuple[TrainResult, Tensor, Tensor, Normalizer]


def ats_scenario(ctx: Context, policy: str) -> AtsScenario:
    """ATS under ``policy`` in a run of ``bayes/fig2-training``: the ConvNet of width
    ``ats_width`` trained with the policy in the authors' step-wise run (:mod:`.bayes_training`)
    to the last of ``train_steps``, a snapshot after each; its victims (Fig. 3's
    ``fig3_victims`` if more than ``ats_victims``) augmented as the client trains on them, their
    labels and the normaliser. Data: CIFAR-10, at ci scale :data:`ATS_STAND_IN`. A command-line
    run keeps the trained network and its snapshots beside its partial record
    (:func:`.kept.kept_run`, ``ats-POLICY``, 140 MB with its snapshots at paper scale): the
    1,000 steps take about an hour on this project's CPU (3.5 s a step on two threads,
    2026-12-07), and retrained on a GPU the network would differ in its last bits and a unit's
    attack checkpoint on it be refused."""
    cfg = ctx.config
    n = max(cfg.ats_victims, cfg.fig3_victims)
    stand_in = ctx.resolve("cifar10", ATS_STAND_IN) == ATS_STAND_IN
    options = {"stand_in": ATS_STAND_IN, **({"constants_of": "mnist"} if stand_in else {})}
    images, labels, norm = ctx.dataset("cifar10", n=n, shuffle=False, **options)
    train_x, train_y, _ = ctx.dataset("cifar10", split="train", **options)
    torch.manual_seed(ctx.seed)
    net = models.build("convnet", in_shape=tuple(images.shape[1:]), num_classes=10,
                       width=cfg.ats_width).to(ctx.device)  # fmt: skip
    augment = partial(_in_normalized_space, ATSAugmentation(policy), norm)
    inputs, targets = norm.normalize(train_x).to(ctx.device), train_y.to(ctx.device)
    run = stepwise_run(max(cfg.train_steps))
    trained = kept_run(
        None if ctx.partial is None else ctx.partial.kept(f"ats-{policy}"), net,
        lambda: train(net, inputs, targets, batch_size=TRAIN_BATCH, augment=augment,
                      snapshot_steps=cfg.train_steps, seed=ctx.seed, **run),
        parts=[policy, cfg.ats_width, TRAIN_BATCH, sorted(run.items()), list(cfg.train_steps),
               ctx.seed],
        data={"x": inputs, "y": targets.double(), **net.state_dict()},
    )  # fmt: skip
    p_i = cfg.ats_policies.index(policy)
    victims = norm.denormalize(augment(norm.normalize(images), ctx.generator(100 + p_i)))
    return trained, victims, labels, norm


def ats_reconstructions(
    ctx: Context, policy: str, scenario: AtsScenario, step: int, n: int
) -> tuple[Tensor, Tensor, Tensor]:
    """Inverting Gradients (cosine, TV ``ats_tv``, ``ats_attack_steps`` iterations, signed Adam
    where ``ats_signed``) on the first ``n`` victims of ``scenario`` after ``step`` training
    steps, as one batched program: the victims, their reconstructions (clamped to [0, 1]) and
    each one's PSNR. Every step starts the policy's attack from the same images."""
    cfg = ctx.config
    trained, victims, labels, norm = scenario
    victims, labels = victims[:n], labels[:n]
    attack = preset("inverting-gradients", steps=cfg.ats_attack_steps, tv=cfg.ats_tv,
                    signed=cfg.ats_signed)  # fmt: skip
    trained.model.load_state_dict(trained.snapshots[step])
    trained.model.eval()  # batch norm with running statistics: each image on its own
    case = build_case(trained.model, victims, labels, norm, device=ctx.device)
    result = case.attack(attack, generator=ctx.generator(cfg.ats_policies.index(policy)),
                         checkpoint=ctx.checkpoint())  # fmt: skip
    recon = case.reconstructions(result).clamp(0, 1)
    return victims, recon, case.score_images(recon)


def _in_normalized_space(
    augment: ATSAugmentation, norm: Normalizer, batch: Tensor, g: torch.Generator | None
) -> Tensor:
    """Apply an ATS policy (defined on [0, 1] images) to a batch in the model's normalised space."""
    return norm.normalize(augment(norm.denormalize(batch), g))
