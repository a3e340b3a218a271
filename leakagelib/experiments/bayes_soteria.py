"""Bayes paper §5 and A.1 (Balunović et al., ICLR 2022): Soteria broken by dropping one layer (Fig. 5).

Soteria (Sun et al. 2021) prunes the gradient of one fully connected layer
and sends every other layer unchanged; the Bayes paper's attack reads the
Soteria likelihood of A.5, Eq. 6 — the unchanged layers only — and an
attacker who does not know the defended layer runs it once per layer.

* ``bayes/fig5-soteria-layers``: the direct attack against the layer-drop
  attack, with the largest (``fc1``) or the second-largest (``fc2``) linear
  layer of ConvBig defended, and the attack that does not know which.

The Soteria scenario is built here once and reused by ``bayes/fig2-training``
(:mod:`.bayes_defenses`) and the chapter "Breaking heuristic defenses":
:func:`soteria_case` (victims, ConvBig trained for ten steps, their Soteria
updates) and :func:`soteria_attacks` (the layer-drop and the direct attack at
a scale's settings).

**ci scale.** The victims are CIFAR-10 images at paper scale (and with a
``--data cifar10=...`` override); at ci scale they are the MNIST-sized
``digits28`` (1×28×28, :data:`SOTERIA_STAND_IN`), not the ``patches``
stand-in of CIFAR-10. On 3×32×32 patches the layer-drop attack does not
separate from the direct attack within a ci budget: after 200 steps both sit
at 10–13 dB, with ConvBig's ``fc1`` 128, 256 or the table's 2000 wide, TV
weights from 10⁻⁶ to 10⁻⁴ and learning rates 0.3 and 0.6 (measured with the
ci loop; the paper runs 4000 steps). On ``digits28`` it reaches 18–23 dB in
100 steps while the direct attack stays at 10–14 dB (seeds 0–2). ConvBig
keeps the table's split of the linear weights (``fc1`` about 80 %, ``fc2``
about 20 %) with ``fc1`` 128 wide, and the attack optimises Eq. 6's per-layer
Gaussian with a TV weight of 5·10⁻⁵ at a constant learning rate of 1, which
converges in about 100 steps on that network where the paper's cosine attack
stalls. That ci weight was tuned here for the anisotropic TV summed over an
image's differences (``TotalVariation(power=1, reduction="sum")``) and is
kept in that convention. The paper-scale attack is the authors' run
(eth-sri/bayes-framework-leakage, ``defense_attacks/soteria``): TV weight
4·10⁻⁴ (A.1; ``run_experiment.sh``) on their inversefed copy's
``total_variation``, which *squares* the differences and averages each
direction (``inversefed/metrics.py``) — ``TotalVariation(power=2,
reduction="mean")``, so 4·10⁻⁴ is typed as the paper writes it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from .. import models
from ..attacks import Attack, TotalVariation, preset
from ..data import Dataset, Normalizer
from ..defenses import GradientDefense, Soteria, layer_drop_attack
from ..fl import TrainResult, evaluate, train
from ..records import image_lists
from .bayes_training import stepwise_run
from .bayes_work import fig5_work
from .case import Case, build_case
from .config import ScaleConfig
from .kept import keep_state, kept_run, kept_state
from .registry import Context, experiment

__all__ = [
    "DIRECT",
    "FIG5",
    "SOTERIA_CI",
    "SOTERIA_PAPER",
    "SOTERIA_SOURCES",
    "SOTERIA_STAND_IN",
    "TRAIN_BATCH",
    "convbig",
    "convbig_fit",
    "fig5_soteria_layers",
    "psnr_summary",
    "soteria_attacks",
    "soteria_case",
    "stand_in_note",
    "trained_convbig",
]

#: The Soteria setting both figures share: network, defense and attack loop, at ci scale ...
SOTERIA_CI: dict[str, Any] = {
    "hidden": (128, 1024),
    "pruning_rate": 0.8,
    "likelihood": "gaussian",
    "attack_steps": 100,
    "attack_lr": 1.0,
    "attack_schedule": "constant",
    "attack_signed": False,
    "tv": 5e-5,
    "tv_power": 1,
    "tv_reduction": "sum",
}
#: ... and at paper scale,
SOTERIA_PAPER: dict[str, Any] = {
    "hidden": (2000, 1000),
    "pruning_rate": 0.8,
    "likelihood": "cosine",
    "attack_steps": 4000,
    "attack_lr": 0.1,
    "attack_schedule": "step",
    "attack_signed": True,
    "tv": 4e-4,
    "tv_power": 2,
    "tv_reduction": "mean",
}
#: ... with where each paper value comes from.
SOTERIA_SOURCES: dict[str, str] = {
    "hidden": "A.1, Table 3 (ConvBig on 3×32×32: fc1 84 %, fc2 16 % of the linear weights; "
    "ci: 79 % and 20 % on 1×28×28)",
    "pruning_rate": "A.1: 'we set the pruning rate ... to 80%'",
    "likelihood": "A.1: cosine similarity, all kept gradients weighted equally; ci: the "
    "per-layer Gaussian of A.5, Eq. 6 (the cosine attack stalls on the ci network)",
    "attack_steps": "§6: 4000 attack iterations",
    "attack_lr": "§6, A.1: Adam with a learning rate of 0.1",
    "attack_schedule": "A.1: 'with decay' (Inverting Gradients' step decay, whose code they ran)",
    "attack_signed": "defense_attacks/soteria/reconstruct_image_set.py line 144 passes "
    "signed=args.signed, and inversefed/options.py line 30 declares --signed store_false: "
    "signed Adam unless switched off, and run_experiment.sh does not; ci: unsigned (ours, the "
    "loop the ci TV weight and lr were tuned with)",
    "tv": "§6, A.1: total variation 4×10⁻⁴ (defense_attacks/soteria/run_experiment.sh: "
    "tv=0.0004), in the convention of tv_power and tv_reduction; ci: 5·10⁻⁵ tuned here for "
    "the summed ℓ1 TV (module docstring)",
    "tv_power": "defense_attacks/soteria/inversefed/metrics.py: total_variation squares the "
    "differences; ci: 1 (ours, tuned with it)",
    "tv_reduction": "defense_attacks/soteria/inversefed/metrics.py: torch.mean per direction; "
    "ci: 'sum' (ours, the convention the ci weight was tuned in)",
}

FIG5 = ScaleConfig(
    ci={**SOTERIA_CI, "victims": 3, "train_steps": 10},
    paper={**SOTERIA_PAPER, "victims": 10, "train_steps": 10},
    sources={
        **SOTERIA_SOURCES,
        "victims": "ours (Fig. 5 shows one CIFAR-10 image per panel)",
        "train_steps": "Fig. 5: 'All networks have been trained for 10 steps' (the authors' "
        "step-wise run: bayes_training)",
    },
)

#: The direct attack's preset for each form of the layer-drop likelihood (same distance, all layers).
DIRECT = {"gaussian": "l2", "cosine": "cosine"}

#: The batch size of the ATS and Soteria networks' training (A.1, A.2: "a batch size of 32").
TRAIN_BATCH = 32

#: The embedded images the Soteria victims are at ci scale, with MNIST's normalisation (the
#: module docstring says why not the CIFAR-10 stand-in ``patches``).
SOTERIA_STAND_IN = "digits28"


def convbig(in_shape: tuple[int, ...], hidden: tuple[int, int], *, seed: int) -> nn.Module:
    """ConvBig (Bayes A.1, Table 3) with fully connected widths ``hidden``.

    Seeds torch's global generator with ``seed`` first, so a seed always builds the same network.
    """
    torch.manual_seed(seed)
    return models.build("convbig", in_shape=in_shape, num_classes=10, hidden=hidden)


def _soteria_data(ctx: Context, n: int | None, split: str) -> Dataset:
    """``n`` images of the Soteria victims' dataset: CIFAR-10, or :data:`SOTERIA_STAND_IN` at ci."""
    stand_in = ctx.resolve("cifar10", SOTERIA_STAND_IN) == SOTERIA_STAND_IN
    options = {"constants_of": "mnist"} if stand_in else {}
    return ctx.dataset("cifar10", n, split=split, shuffle=split == "train",
                       stand_in=SOTERIA_STAND_IN, **options)  # fmt: skip


def stand_in_note(ctx: Context) -> str | None:
    """What stood for CIFAR-10 in the Soteria attacks when it was not ``ctx.resolve("cifar10")``."""
    return (
        SOTERIA_STAND_IN if ctx.resolve("cifar10", SOTERIA_STAND_IN) == SOTERIA_STAND_IN else None
    )


def trained_convbig(
    ctx: Context,
    n: int,
    run: Mapping[str, Any],
    name: str = "convbig",
    shared: Mapping[int, str] | None = None,
) -> tuple[Tensor, Tensor, Normalizer, TrainResult]:
    """The Soteria victims and ConvBig after one of the authors' training runs.

    Returns the first ``n`` test images of CIFAR-10 (of :data:`SOTERIA_STAND_IN`
    at ci scale) in [0, 1], their labels, the normaliser and the training: ConvBig
    trained without defense or augmentation (A.1) on the training split in
    batches of :data:`TRAIN_BATCH`, with ``run``'s settings of
    :func:`leakagelib.fl.train` (:func:`.bayes_training.stepwise_run` or
    :func:`.bayes_training.epoch_run`, which say why). A command-line run keeps the
    trained network beside its partial record under ``name``
    (:func:`.kept.kept_run`), so a resumed Fig. 2 does not train an epoch run again.
    ``shared`` names, by step, the states this run shares with others
    (:func:`.bayes_training.shared_epochs`): it starts from the latest of them already kept
    and keeps the others as it passes them.
    """
    images, labels, norm = _soteria_data(ctx, n, "test")
    train_x, train_y, _ = _soteria_data(ctx, None, "train")
    net = convbig(tuple(images.shape[1:]), ctx.config.hidden, seed=ctx.seed).to(ctx.device)
    inputs, targets = norm.normalize(train_x).to(ctx.device), train_y.to(ctx.device)
    data = {"x": inputs, "y": targets.double(), **net.state_dict()}
    files = (
        {} if ctx.partial is None else {s: ctx.partial.kept(f) for s, f in (shared or {}).items()}
    )

    def fit() -> TrainResult:
        parts = [ctx.config.hidden, TRAIN_BATCH, ctx.seed]  # the state's name says its schedule
        start = next(filter(None, (kept_state(files[s], parts=parts, data=data)
                                   for s in sorted(files, reverse=True))), None)  # fmt: skip
        later = [s for s in files if start is None or s > start.step]
        result = train(net, inputs, targets, batch_size=TRAIN_BATCH, seed=ctx.seed,
                       start=start, state_steps=later, **run)  # fmt: skip
        for s, state in result.states.items():
            keep_state(files[s], state, parts=parts, data=data)
        return result

    trained = kept_run(
        None if ctx.partial is None else ctx.partial.kept(name), net, fit,
        parts=[ctx.config.hidden, TRAIN_BATCH, sorted(run.items()), ctx.seed], data=data,
    )  # fmt: skip
    return images, labels, norm, trained


def convbig_fit(
    ctx: Context, model: nn.Module, images: Tensor, labels: Tensor, norm: Normalizer
) -> dict[str, float]:
    """How closely a trained ConvBig fits its training split and the victims ``images`` (in [0, 1]).

    Each set's mean cross-entropy and accuracy in eval mode (:func:`leakagelib.fl.evaluate`),
    and how many images the network trained on. At paper scale on the shared 500-image CIFAR-10
    sample, Fig. 2's networks cycle through its 400 training images, where the paper's see
    each of CIFAR-10's 50,000 once an epoch; the training fit shows from which epoch on a
    network has memorised what it trained on (the chapter "Breaking heuristic defenses" reads
    it from the record of ``bayes/fig2-training``).
    """
    train_x, train_y, _ = _soteria_data(ctx, None, "train")
    device = next(model.parameters()).device
    train_loss, train_accuracy = evaluate(
        model, norm.normalize(train_x).to(device), train_y.to(device)
    )
    victim_loss, victim_accuracy = evaluate(
        model, norm.normalize(images).to(device), labels.to(device)
    )
    return {
        "train_images": len(train_y),
        "train_loss": train_loss,
        "train_accuracy": train_accuracy,
        "victim_loss": victim_loss,
        "victim_accuracy": victim_accuracy,
    }


def soteria_case(
    scale: str = "ci",
    n: int = 1,
    *,
    seed: int = 0,
    layer: str = "fc1.linear",
    pruning_rate: float | None = None,
    device: str = "cpu",
) -> Case:
    """Fig. 5's scenario at ``scale``: ``n`` victims sharing Soteria updates of ConvBig after ten steps.

    ``layer`` is the defended layer, ``pruning_rate`` Soteria's (default: the
    scale's, 80 %). The chapter "Breaking heuristic defenses" opens its
    Soteria section with this case; ``bayes/fig5-soteria-layers`` builds the
    same one for each defended layer.
    """
    ctx = Context(scale=scale, seed=seed, device=device, progress=False, settings=FIG5)
    images, labels, norm, trained = trained_convbig(ctx, n, stepwise_run(ctx.config.train_steps))
    rate = ctx.config.pruning_rate if pruning_rate is None else pruning_rate
    defense = Soteria(layer, rate, attack=ctx.config.likelihood)
    return build_case(trained.model, images, labels, norm, defense=defense, device=device)


def soteria_attacks(settings: Mapping[str, Any], defense: GradientDefense) -> dict[str, Attack]:
    """The layer-drop attack on ``defense``'s updates and the direct attack, with ``settings``' loop.

    ``settings`` are a Soteria experiment's values at one scale (``ctx.config``,
    or ``experiments.get("bayes/fig5-soteria-layers").config.at(scale)``).
    Both are Bayes-preset attacks with the TV prior (weight ``tv``, in the
    convention ``tv_power`` and ``tv_reduction`` name) and one loop — Adam at
    ``attack_lr``, Inverting Gradients' step decay (÷10) or a constant rate,
    box-constrained — and differ only in the likelihood: the defense's
    layer-drop likelihood (Eq. 6) or the same distance on every layer.
    ``attack_signed`` runs Adam on the gradient's sign (inversefed's default).
    """
    prior = TotalVariation(power=settings["tv_power"], reduction=settings["tv_reduction"])
    loop = {
        "prior": prior,
        "beta": settings["tv"],
        "steps": settings["attack_steps"],
        "lr": settings["attack_lr"],
        "schedule": settings["attack_schedule"],
        "decay": 0.1,
        "box": True,
        "signed": settings["attack_signed"],
    }
    return {
        "layer-drop": preset("bayes", likelihood=defense.likelihood(), **loop),
        "direct": preset(DIRECT[settings["likelihood"]], **loop),
    }


def psnr_summary(psnr: Tensor) -> dict[str, float]:
    """The mean PSNR over the victims and its standard deviation (0 for one victim), for a row."""
    return {"psnr": float(psnr.mean()), "psnr_std": float(psnr.std()) if psnr.numel() > 1 else 0.0}


@experiment(
    "bayes/fig5-soteria-layers",
    row_keys=("defended", "attack", "psnr"),
    config=FIG5,
    datasets=("cifar10",),
    work=fig5_work,
)
def fig5_soteria_layers(ctx: Context) -> dict:
    """Bayes Fig. 5: the direct attack versus the layer-drop attack on Soteria, either layer defended.

    ConvBig trained ``train_steps`` steps without defense (A.1), as the authors'
    step-wise run (:func:`.bayes_training.stepwise_run`); every victim
    is a client sending its image's update with Soteria on ``fc1`` — the
    largest linear layer — or on ``fc2``, the second largest. Attacks, all from
    the same starting points: "direct" (every layer, Fig. 5b), "layer-drop"
    (every layer but the defended one, 5c and 5d) and "layer-drop, layer
    unknown" (one layer-drop attack per linear layer, the lowest final
    objective kept: :func:`~leakagelib.defenses.layer_drop_attack`), run with
    either layer defended, so that a rule which merely favoured the largest
    layer would show.
    One unit per defended layer. Rows: ``defended``, ``attack``, ``psnr``
    (mean dB), ``psnr_std``, ``psnr_per_image``, ``chosen`` (the layer the
    unknown-layer attack dropped, per image; ``None`` for the others). Extra
    entry ``images``: ``original`` and ``"<defended> <attack>"`` → images in
    [0, 1] as lists. The paper shows Fig. 5 as images only, so there are no
    reference numbers. Data: ``cifar10`` (``digits28`` at ci, see the module
    docstring).
    """
    cfg = ctx.config
    images, labels, norm, trained = trained_convbig(ctx, cfg.victims, stepwise_run(cfg.train_steps))

    def unit(defended: str) -> list[dict]:
        layer = f"{defended}.linear"
        defense = Soteria(layer, cfg.pruning_rate, attack=cfg.likelihood)
        case = build_case(trained.model, images, labels, norm, defense=defense, device=ctx.device)
        rows = []
        for attack, recon, chosen in _fig5_attacks(ctx, case, layer):
            psnr = case.score_images(recon)
            rows.append({"defended": defended, "attack": attack, **psnr_summary(psnr),
                         "psnr_per_image": psnr.tolist(), "chosen": chosen,
                         "reconstruction": image_lists(recon)})  # fmt: skip
        return rows

    rows = ctx.units(("fc1", "fc2"), unit, "Soteria layer")
    pictures = {"original": image_lists(images)}
    pictures.update({f"{r['defended']} {r['attack']}": r["reconstruction"] for r in rows})
    note = stand_in_note(ctx)
    return {
        "rows": [{k: v for k, v in r.items() if k != "reconstruction"} for r in rows],
        "images": pictures,
        "data": {"cifar10": note} if note else {},
    }


def _fig5_attacks(
    ctx: Context, case: Case, layer: str
) -> list[tuple[str, Tensor, list[str] | None]]:
    """``(attack, reconstructions in [0, 1], chosen layers)`` of the attacks on ``layer`` defended.

    The direct attack (Fig. 5b) and the layer-drop attack for every linear
    layer in one batched program, reported as "direct", "layer-drop" (the
    candidate that drops the defended layer: 5c, or 5d with ``fc2``) and
    "layer-drop, layer unknown".
    """
    attacks = soteria_attacks(ctx.config, case.defense)
    drop, direct = attacks["layer-drop"], attacks["direct"]
    result = layer_drop_attack(
        case.model, case.updates, labels=case.labels.to(ctx.device), input_shape=case.input_shape,
        prior=drop.prior, config=drop.config, kind=ctx.config.likelihood,
        extra={"direct": direct.likelihood},
        bounds=case.bounds, generator=ctx.generator(7), device=ctx.device,
    )  # fmt: skip

    def images(candidates: Tensor) -> Tensor:
        return case.normalizer.denormalize(candidates[:, 0].cpu()).clamp(0, 1)

    chosen = [name.removesuffix(".linear") for name in result.chosen]
    return [
        ("direct", images(result.candidates["direct"]), None),
        ("layer-drop", images(result.candidates[layer]), None),
        ("layer-drop, layer unknown", images(result.images), chosen),
    ]
