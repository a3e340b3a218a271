"""Experiments of the Bayes paper's §5–6: breaking Soteria, ATS and PRECODE early in training.

* ``bayes/precode-mlp``: PRECODE on an MLP falls to the closed-form recovery of
  the first layer's input (Phong et al. 2017), which needs no optimisation and
  ignores the bottleneck entirely (the paper reports PSNR > 150 dB).
* ``bayes/fig2-training``: the defense-aware attacks on ATS (Inverting
  Gradients on the augmented-trained ConvNet after each of the first training
  steps) and on Soteria (the layer-drop attack on ConvBig after the first
  epochs) — their PSNR falls as training proceeds, so a defense must be
  evaluated throughout training (Fig. 2); it also keeps the reconstructions
  after the 10th step (Fig. 3).
* ``bayes/fig5-soteria-layers``: the direct attack against the layer-drop
  attack on Soteria, with the largest or the second-largest linear layer
  defended, and the attack that does not know which (Fig. 5).

Attack settings from the paper (§6, A.1, A.2): cosine likelihood, Adam lr 0.1
with decay, TV 1e-5 (ATS) and 4e-4 (Soteria), 2,000 and 4,000 iterations,
batch size 1, random initialisation; training with batch size 32. The ci
scale of each experiment is in its docstring; the Soteria attacks there run
on 8×8 digits with a ConvBig of the table's proportions and the per-layer
Gaussian likelihood of A.5 (:func:`soteria_attack_setup`). All three are
called by the chapter "Breaking heuristic defenses".
"""

from __future__ import annotations

from functools import partial

import torch
from torch import Tensor, nn

from .. import metrics, models
from ..attacks import (
    AttackConfig,
    Cosine,
    Gaussian,
    Likelihood,
    TotalVariation,
    bias_attack,
    image_bounds,
    reconstruct,
)
from ..attacks.presets import inverting_gradients
from ..data import Normalizer
from ..defenses import ATSAugmentation, Soteria, layer_drop_attack
from ..defenses.surgery import apply_bottleneck_option
from ..fl import train
from ..gradients import client_update, per_sample_updates, stack_updates
from .registry import Context, experiment


@experiment("bayes/precode-mlp", row_keys=("image", "psnr"))
def precode_mlp(ctx: Context) -> dict:
    """PRECODE on an MLP broken exactly by the closed-form first-layer attack (Bayes paper §5–6).

    The Bayes authors' PRECODE network: five fully connected layers of 500,
    then Linear(256), the variational bottleneck (K = 256, β = 1e-3) and
    Linear(500) before the classifier, uniform ±0.05 initialisation
    (``models.build("mlp")``'s documented configuration). Every image is its own
    client; the bottleneck's noise changes nothing for the first layer, whose
    gradient still equals (dl/db)·xᵀ. Computed in float64. Rows: ``image``,
    ``label``, ``psnr`` (dB, on [0, 1] images; ``inf`` when exact). Extra
    entry ``figure3``: the first (up to) 8 originals and recoveries, as lists
    (Bayes Fig. 3's PRECODE row). Data: ``cifar10`` (``patches`` at ci).
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
    recovered = norm.denormalize(bias_attack(model, updates, labels, input_shape=shape).inputs())
    psnr = metrics.psnr(recovered.cpu(), images.double())
    rows = [{"image": i, "label": int(labels[i]), "psnr": float(psnr[i])} for i in range(n)]
    shown = slice(0, min(n, 8))
    figure3 = {"original": _images(images[shown]), "reconstruction": _images(recovered[shown])}
    return {"rows": rows, "figure3": figure3}


def _ig(
    ctx: Context,
    model: nn.Module,
    x: Tensor,
    y: Tensor,
    norm: Normalizer,
    *,
    tv: float,
    steps: int,
    offset: int,
) -> tuple[Tensor, Tensor]:
    """Inverting Gradients on each image's update, as the Bayes paper ran it on ATS (§6, A.2).

    The preset with Adam's plain (unsigned) gradient: cosine likelihood, TV
    weight ``tv``, lr 0.1 with step decay, box-constrained. Returns the PSNR
    per image and the reconstructions in [0, 1].
    """
    updates = stack_updates(
        [client_update(model, x[i : i + 1], y[i : i + 1]) for i in range(x.shape[0])]
    )
    attack = inverting_gradients(steps=steps, tv=tv, signed=False)
    result = attack(
        model, updates, labels=y, input_shape=tuple(x.shape[1:]),
        bounds=image_bounds(norm.mean, norm.std), generator=ctx.generator(offset),
        device=ctx.device,
    )  # fmt: skip
    recon = norm.denormalize(result.inputs().detach().cpu()).clamp(0, 1)
    return metrics.psnr(recon, norm.denormalize(x.cpu())), recon


#: The training step after which Fig. 3 shows reconstructions ("after the 10th training step").
FIG3_STEP = 10


def soteria_case(ctx: Context, n: int) -> tuple[Tensor, Tensor, Normalizer, Tensor, Tensor]:
    """Soteria's victims and training data: CIFAR-10 (paper scale, or a ``--data
    cifar10=...`` override) or else the 8×8 digits (ci).

    Returns ``(images in [0, 1], labels, normaliser, normalised training images, labels)``:
    the first ``n`` test images are the clients'. Chapter "Breaking heuristic defenses".
    """
    logical = "cifar10" if ctx.paper or "cifar10" in ctx.data else "digits"
    images, labels, norm = ctx.dataset(logical, n=n, shuffle=False)
    train_x, train_y, _ = ctx.dataset(logical, split="train")
    return images, labels, norm, norm.normalize(train_x).to(ctx.device), train_y.to(ctx.device)


def soteria_convbig(ctx: Context, in_shape: tuple[int, int, int]) -> nn.Module:
    """The Soteria network: ConvBig (Table 3) at paper scale, ConvBig with hidden (256, 144) at ci.

    The smaller widths keep the table's split of the linear weights (about 80 %
    in ``fc1``, 20 % in ``fc2``) on 1×8×8 digits. Chapter "Breaking heuristic defenses".
    """
    torch.manual_seed(ctx.seed)
    hidden = ctx.pick(ci=(256, 144), paper=(2000, 1000))
    return models.build("convbig", in_shape=in_shape, num_classes=10, hidden=hidden).to(ctx.device)


def soteria_attack_setup(ctx: Context) -> tuple[str, AttackConfig]:
    """The likelihood kind and loop of the attacks on Soteria at this scale.

    Paper (A.1): cosine similarity with all kept gradients weighted equally,
    TV 4e-4, Adam lr 0.1 with step decay, 4,000 iterations. ci: the per-layer
    Gaussian of A.5, Eq. 6 — the objective the paper says it optimises — with
    TV 1e-6 and 200 iterations of Adam at a constant lr 0.3: on the small ci
    network the cosine attack stalls at 1 − cos ≈ 0.02 for a thousand
    iterations (PSNR near 11 dB, layer-drop or not) while the Gaussian one
    converges in a few hundred; both read the same layers.
    """
    kind = ctx.pick(ci="gaussian", paper="cosine")
    config = AttackConfig(
        steps=ctx.pick(ci=200, paper=4000), optimizer="adam", lr=ctx.pick(ci=0.3, paper=0.1),
        schedule=ctx.pick(ci="constant", paper="step"), decay=0.1,
        beta=ctx.pick(ci=1e-6, paper=4e-4), box=True,
    )  # fmt: skip
    return kind, config


def _direct(kind: str) -> Likelihood:
    """The undefended attack's likelihood (every layer) of the given kind."""
    return Cosine() if kind == "cosine" else Gaussian()


def _images(t: Tensor) -> list:
    """Images as nested lists rounded to 4 decimals, for a JSON record."""
    return t.detach().cpu().double().clamp(0, 1).mul(1e4).round().div(1e4).tolist()


@experiment("bayes/fig2-training", row_keys=("defense", "step", "psnr"))
def fig2_training(ctx: Context) -> dict:
    """Bayes Fig. 2: PSNR of the defense-aware attacks on ATS and Soteria as training proceeds.

    ATS: ConvNet trained with each augmentation policy ("7-4-15", "21-13-3",
    their hybrid) and attacked by Inverting Gradients (cosine, TV 1e-5) after
    given training steps, on the augmented images the client trains on (PSNR
    against those). Soteria: ConvBig trained without defense (the paper
    applies the defense at inference time, A.1), defended on ``fc1`` at
    pruning rate 80 % and attacked by the layer-drop attack (all layers but
    ``fc1``); the direct attack on the defended update is reported alongside.
    Rows: ``defense`` ("ats 7-4-15", ..., "soteria", "soteria (direct
    attack)"), ``step`` (training steps, batch size 32), ``psnr`` (mean dB),
    ``psnr_std``. Extra entry ``figure3``: for every defense, the originals and
    reconstructions after :data:`FIG3_STEP` steps (Bayes Fig. 3), as lists.

    Paper scale: 10 CIFAR-10 images per defense, ConvNet width 64, ConvBig
    (Table 3), steps 0–1000, 2,000 (ATS) and 4,000 (Soteria) attack
    iterations. ci scale: ATS on one 3×32×32 ``patches`` image, ConvNet width 8,
    50 iterations (this only exercises the pipeline: the cosine attack on a
    deep ConvNet needs thousands of iterations); Soteria on two 8×8 digits,
    ConvBig with hidden (256, 144), see :func:`soteria_attack_setup`; steps
    0, 10 and 50. Data: ``cifar10`` (``patches`` at ci; ``digits`` for Soteria).
    """
    rows: list[dict] = []
    figure3: dict[str, dict[str, list]] = {}
    steps = ctx.pick(ci=(0, FIG3_STEP, 50), paper=(0, FIG3_STEP, 20, 50, 100, 200, 500, 1000))

    def add(defense: str, step: int, psnr: Tensor) -> None:
        rows.append({"defense": defense, "step": step, "psnr": float(psnr.mean()),
                     "psnr_std": float(psnr.std()) if psnr.numel() > 1 else 0.0})  # fmt: skip

    n = ctx.pick(ci=1, paper=10)
    images, labels, norm = ctx.dataset("cifar10", n=n, shuffle=False)
    train_x, train_y, _ = ctx.dataset("cifar10", split="train")
    train_x = norm.normalize(train_x).to(ctx.device)
    train_y = train_y.to(ctx.device)
    x, y = norm.normalize(images).to(ctx.device), labels.to(ctx.device)
    shape = tuple(images.shape[1:])
    policies = ctx.pick(ci=("7-4-15",), paper=("7-4-15", "21-13-3", "21-13-3+7-4-15"))
    for p_i, policy in enumerate(policies):
        torch.manual_seed(ctx.seed)
        net = models.build(
            "convnet", in_shape=shape, num_classes=10, width=ctx.pick(ci=8, paper=64)
        ).to(ctx.device)
        normalized_augment = partial(_in_normalized_space, ATSAugmentation(policy), norm)

        trained = train(net, train_x, train_y, steps=max(steps), batch_size=32, augment=normalized_augment,
                        snapshot_steps=steps, seed=ctx.seed)  # fmt: skip
        victims = normalized_augment(x, ctx.generator(100 + p_i))  # the client trains on these
        for step in ctx.track(steps, f"ATS {policy}"):
            net.load_state_dict(trained.snapshots[step])
            net.eval()  # batch norm with running statistics: each image's update on its own
            psnr, recon = _ig(ctx, net, victims, y, norm, tv=1e-5,
                              steps=ctx.pick(ci=50, paper=2000), offset=p_i)  # fmt: skip
            add(f"ats {policy}", step, psnr)
            if step == FIG3_STEP:
                original = norm.denormalize(victims.cpu())
                figure3[f"ats {policy}"] = {"original": _images(original), "reconstruction": _images(recon)}  # fmt: skip

    n = ctx.pick(ci=2, paper=10)
    images, labels, norm, train_x, train_y = soteria_case(ctx, n)
    x, y = norm.normalize(images).to(ctx.device), labels.to(ctx.device)
    net = soteria_convbig(ctx, tuple(images.shape[1:]))
    trained = train(
        net, train_x, train_y, steps=max(steps), batch_size=32, snapshot_steps=steps, seed=ctx.seed
    )
    kind, config = soteria_attack_setup(ctx)
    soteria = Soteria("fc1.linear", pruning_rate=0.8, attack=kind)
    for step in ctx.track(steps, "Soteria"):
        net.load_state_dict(trained.snapshots[step])
        shared = soteria.share(net, x, y, per_image=True)  # every image a client with its own mask
        likelihoods = {
            "soteria": soteria.likelihood(),
            "soteria (direct attack)": _direct(kind),
        }
        attacks = soteria_attacks(ctx, net, shared, x, y, norm, likelihoods, config)
        for name, (psnr, _) in attacks.items():
            add(name, step, psnr)
        if step == FIG3_STEP:
            recon = attacks["soteria"][1]
            figure3["soteria"] = {"original": _images(images), "reconstruction": _images(recon)}
    stand_in = not ctx.paper and "cifar10" not in ctx.data
    data = {"cifar10": f"{ctx.resolve('cifar10')} (ATS), digits (Soteria)"} if stand_in else {}
    return {"rows": rows, "figure3": figure3, "data": data}


def _in_normalized_space(augment: ATSAugmentation, norm, batch: torch.Tensor, g) -> torch.Tensor:
    """Apply an ATS policy (defined on [0, 1] images) to a batch in the model's normalised space."""
    return norm.normalize(augment(norm.denormalize(batch), g))


def soteria_attacks(
    ctx: Context,
    model: nn.Module,
    shared: dict[str, Tensor],
    x: Tensor,
    y: Tensor,
    norm: Normalizer,
    likelihoods: dict[str, Likelihood],
    config: AttackConfig,
) -> dict[str, tuple[Tensor, Tensor]]:
    """Attacks (TV prior, ``config``) on each single-image update, one per likelihood.

    ``shared`` holds the clients' updates stacked (leading dimension N, one
    image each, as ``Soteria.share(..., per_image=True)`` returns). Returns
    name → ``(PSNR per image, reconstructions in [0, 1])``. ``x`` are the
    normalised client images (only for the PSNR). All likelihoods run as
    settings of one batched program from the same seeded initialisation, so
    they are compared on equal terms. Used by Fig. 2 and the chapter
    "Breaking heuristic defenses".
    """
    names = list(likelihoods)
    result = reconstruct(
        model, shared, labels=y, likelihood=[likelihoods[k] for k in names],
        prior=TotalVariation(), config=config, settings=[config.setting()] * len(names),
        input_shape=tuple(x.shape[1:]), bounds=image_bounds(norm.mean, norm.std),
        generator=ctx.generator(7), device=ctx.device,
    )  # fmt: skip
    clean = norm.denormalize(x.cpu())
    out = {}
    for h, name in enumerate(names):
        recon = norm.denormalize(result.inputs(h).detach().cpu()).clamp(0, 1)
        out[name] = (metrics.psnr(recon, clean), recon)
    return out


@experiment("bayes/fig5-soteria-layers", row_keys=("defended", "attack", "psnr"))
def fig5_soteria_layers(ctx: Context) -> dict:
    """Bayes Fig. 5: the direct attack versus the layer-drop attack on Soteria, either layer defended.

    ConvBig trained for 10 steps (batch size 32, no defense during training,
    as in A.1); each client sends one image's update with Soteria (pruning
    rate 80 %) on ``fc1`` — the largest linear layer — or on ``fc2``, the
    second largest. Attacks, all from the same initialisation: "direct" (every
    layer, Fig. 5b), "layer-drop" (every layer but the defended one, 5c and
    5d) and, with ``fc1`` defended, "layer-drop, layer unknown" (one
    layer-drop attack per linear layer, the lowest final objective kept:
    :func:`~leakagelib.defenses.soteria.layer_drop_attack`).
    Rows: ``defended`` ("fc1", "fc2"), ``attack``, ``psnr`` (mean dB),
    ``psnr_std``, ``psnr_per_image``, ``chosen`` (the layer the unknown-layer
    attack dropped, per image; ``None`` for the others). Extra entry
    ``images``: ``original`` and ``"<defended> <attack>"`` → images in [0, 1]
    as lists.

    Paper scale: 10 CIFAR-10 images, ConvBig of Table 3, cosine likelihood, TV
    4e-4, Adam lr 0.1, 4,000 iterations. ci scale (about half a minute on one
    CPU core): 4 of the 8×8 digits, ConvBig with hidden (256, 144), the
    Gaussian layer likelihood of A.5 (see :func:`soteria_attack_setup`).
    Data: ``cifar10`` (``digits`` at ci).
    """
    n = ctx.pick(ci=4, paper=10)
    images, labels, norm, train_x, train_y = soteria_case(ctx, n)
    x, y = norm.normalize(images).to(ctx.device), labels.to(ctx.device)
    shape = tuple(images.shape[1:])
    net = soteria_convbig(ctx, shape)
    trained = train(net, train_x, train_y, steps=FIG3_STEP, batch_size=32, seed=ctx.seed)
    net = trained.model
    kind, config = soteria_attack_setup(ctx)
    rows: list[dict] = []
    pictures: dict[str, list] = {"original": _images(images)}

    def add(defended: str, attack: str, psnr: Tensor, recon: Tensor, chosen=None) -> None:
        rows.append({"defended": defended, "attack": attack, "psnr": float(psnr.mean()),
                     "psnr_std": float(psnr.std()) if psnr.numel() > 1 else 0.0,
                     "psnr_per_image": [float(p) for p in psnr], "chosen": chosen})  # fmt: skip
        pictures[f"{defended} {attack}"] = _images(recon)

    bounds = image_bounds(norm.mean, norm.std)
    for defended in ctx.track(("fc1", "fc2"), "Soteria layer"):
        soteria = Soteria(f"{defended}.linear", pruning_rate=0.8, attack=kind)
        shared = soteria.share(net, x, y, per_image=True)  # every image a client with its own mask
        # fc1: the direct attack (Fig. 5b) and the layer-drop attack for every linear layer run
        # as one batched program; fc2 (Fig. 5d): the layer-drop attack that knows the layer
        unknown = defended == "fc1"
        result = layer_drop_attack(
            net, shared, labels=y, input_shape=shape, prior=TotalVariation(),
            config=config, layers=None if unknown else [soteria.layer], kind=kind,
            extra={"direct": _direct(kind)} if unknown else None, bounds=bounds,
            generator=ctx.generator(7), device=ctx.device,
        )  # fmt: skip
        for attack, key in (("direct", "direct"), ("layer-drop", soteria.layer)):
            if key in result.candidates:
                recon = norm.denormalize(result.candidates[key][:, 0].cpu()).clamp(0, 1)
                add(defended, attack, metrics.psnr(recon, images), recon)
        if unknown:
            chosen = norm.denormalize(result.images[:, 0].cpu()).clamp(0, 1)
            add(defended, "layer-drop, layer unknown", metrics.psnr(chosen, images), chosen,
                [c.removesuffix(".linear") for c in result.chosen])  # fmt: skip
    stand_in = not ctx.paper and "cifar10" not in ctx.data
    data = {"cifar10": "digits"} if stand_in else {}  # what stood for CIFAR-10 here
    return {"rows": rows, "images": pictures, "data": data}
