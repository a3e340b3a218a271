"""The protocol every CVB-paper experiment shares: victims, models, attacks, training, rows.

CVB paper (Scheliga, Mäder, Seeland) §V, with values from the authors' code
(dAI-SY-Group/ConvolutionalVariationalBottleneck): the victims are training
images of one client (§V-B; :mod:`.cvb_data`), the attacked model is the
*untrained* network (``ckpt: 0`` in ``configs/attacks/*.yaml``); each victim
image is its own client (:func:`~leakagelib.experiments.case.build_case`),
attacked with its label known. Inverting Gradients (IG): cosine distance, TV
with the authors' weight for the architecture (:data:`ATTACK`'s ``ig_tv``:
0.1 for the CNN and the ResNet-18, 10⁻⁴ for the ViT, in their TV's
convention), signed Adam with lr 1, N(0, 1) initialisation, iterates clipped
to the image box; iDLG and CPL: the ℓ2 distance and L-BFGS from N(0, 1), CPL
with its label term, weighted like the TV per architecture
(:data:`CPL_LABEL_WEIGHT`). Every attack runs the authors' loop per image: plateau
schedule, early stopping and the best iterate (:func:`cvb_attack`).
Against PRECODE and CVB the "ignore" attack reads only the gradients before
the first stochastic decoder (§III-B). SSIM and the ASR (share of images with
SSIM ≥ 0.5), and the PSNR, MSE and LPIPS of the supplementary Tables
VIII–XII, use min–max rescaled images, as the authors' ``Scaled*`` metrics
do (:mod:`.cvb_quality`). Utility is the test accuracy of FedAvg training at
its best round (:func:`~.cvb_data.fedavg_accuracy`,
:func:`leakagelib.fedavg.federated_averaging`).

The protocol's numbers at both scales are :data:`ATTACK` and :data:`TRAINING`;
every experiment's config includes the parts it uses (:func:`cvb_config`). At
ci scale everything is small (two images, 100 IG or 10×20 L-BFGS steps, two
short federated rounds on the embedded stand-ins); MNIST is brought to the
authors' 3×32×32 (resized, grey channel repeated). At paper scale: 128 victim
images, at most 20,000 IG iterations, 300 rounds with patience 40.

The experiments live in :mod:`.cvb_precode` (Tables I–II), :mod:`.cvb_defenses`
(Tables III–IV), :mod:`.cvb_hyperparams` (Fig. 9) and :mod:`.cvb_architectures`
(Tables V–VII); the three CVB chapters run them and build their own analyses
with :mod:`.cvb_analysis`. Each of them runs its table's cells as units
(:meth:`~leakagelib.experiments.Context.units`, one attack and its training
run each), so that an interrupted paper-scale run resumes; every unit seeds
what it draws itself (:func:`cnn`, :func:`run_attack`, FedAvg's ``seed``), so
its rows are those of a run without units. :func:`attack_load` and
:func:`training_loads` count a unit's work for ``campaign``'s estimates
(:mod:`.work`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from .. import models
from ..attacks import Attack, AttackResult, preset
from ..defenses import (
    DPSGD,
    GradientDefense,
    apply_bottleneck_option,
    attacked_parameters,
    epsilon_spent,
)
from ..defenses.bottlenecks import bottlenecks
from .case import Case, build_case
from .config import ScaleConfig, Settings
from .cvb_data import (
    Victims,
    check_victims,
    fedavg_accuracy,
    load_victims,
    to_rgb32,
    victim_fields,
    with_victims,
)
from .registry import Context
from .work import LBFGS_EVALUATIONS, Load, Net, evaluation_load, split_size

__all__ = [
    "ATTACK",
    "ATTACKS",
    "CPL_LABEL_WEIGHT",
    "CVB_LOOP",
    "CVB_DEFAULT",
    "CVB_NET",
    "FIGURE_IMAGES",
    "IG_TV",
    "PRECODE_TABLE2",
    "SHAPE",
    "TRAINING",
    "Victims",
    "attack_layers",
    "attack_load",
    "check_victims",
    "client_epsilon",
    "cnn",
    "cvb_attack",
    "cvb_config",
    "fedavg_accuracy",
    "load_victims",
    "n_added",
    "reference_rows",
    "run_attack",
    "scale_note",
    "to_rgb32",
    "training_loads",
    "victim_fields",
    "with_victims",
]

#: Victims whose reconstructions a Table V or VI row keeps (the CVB paper's Figs. 10 and 12 show
#: a few examples per model; ours).
FIGURE_IMAGES = 4

#: The authors' input shape for every dataset (``configs/data/*.yaml``: [3, 32, 32]).
SHAPE = (3, 32, 32)
#: Table III's attacks by preset id (:data:`leakagelib.attacks.PRESETS`), as its rows name them.
ATTACKS = ("idlg", "cpl", "inverting-gradients")
#: The CVB chosen in §VI-A: position 1, kernel 5, scale 0.5 (the default K = C/2), β = 0.1,
#: with the KL term in the log-variance form the authors' code evaluates (``kl="reference"``:
#: ``src/models/modules.py``, ``VBModule.loss``), which their training loss and their shared
#: and simulated updates hold (:func:`leakagelib.losses.client_loss`).
CVB_DEFAULT = {"kind": "cvb", "position": 1, "kernel_size": 5, "beta": 0.1, "kl": "reference"}
#: Table II's PRECODE: K = C/2 and no biases (which reproduces the table's parameter counts).
PRECODE_TABLE2 = {"kind": "precode", "K": "adaptive", "bias": False}

#: The CVB authors' IG TV weight per architecture (``attack.regularization`` in
#: ``configs/models/{CNN,CNNCVB,ResNet18,ResNet18CVB,ViT,ViTCVB}.yaml``, which override
#: ``configs/attacks/IG.yaml``'s 0.01), for their ``TV`` (``src/loss.py``: inversefed's
#: mean absolute difference per direction), i.e. ``TotalVariation(power=1, reduction="mean")``,
#: the Inverting Gradients preset's prior. The same with and without a bottleneck.
IG_TV = {"cnn": 0.1, "resnet18": 0.1, "vit": 1e-4}

#: CPL's label term in the CVB authors' code, α·‖h(x) − y‖₂ on the logits (``src/attacks.py``,
#: ``CPL.attack_specific_regularization``), with α their ``attack.regularization``:
#: ``configs/attacks/CPL.yaml`` sets 0.01, but ``reconstruction.ipynb`` merges the model's
#: config after the attack's and ``configs/models/{CNN,CNNCVB,ResNet18,ResNet18CVB}.yaml`` set
#: 0.1, ``ViT.yaml`` and ``ViTCVB.yaml`` 10⁻⁴ — the same key and values as IG's TV weight
#: (:data:`IG_TV`). So α per architecture, with and without a bottleneck.
CPL_LABEL_WEIGHT = {"cnn": 0.1, "resnet18": 0.1, "vit": 1e-4}

#: The CVB authors' per-attack loop control (dAI-SY-Group/ConvolutionalVariationalBottleneck):
#: ``ReduceLROnPlateau`` with factor 0.1 and, for IG, patience 400, early stopping after
#: 4,000 steps without a lower loss (``configs/attacks/IG.yaml``; iDLG and CPL: 40 and 400 in
#: ``configs/attacks/iDLG.yaml`` and ``CPL.yaml``), a stop once the loss falls below 10⁻⁵ and the
#: best iterate returned (``src/attacks.py``, ``attack_batch``; which iterate is
#: :data:`ATTACK`'s ``best_iterate``). Pass as ``**CVB_LOOP`` with the patience values of the
#: attack (``plateau_patience``, ``stop_patience``).
CVB_LOOP: dict[str, Any] = {
    "schedule": "plateau",
    "decay": 0.1,
    "stop_below": 1e-5,
    "keep_best": True,
}

#: The attack protocol: victims per dataset and the attacks' loop budgets.
ATTACK = ScaleConfig(
    ci={"victims": 2, "victims_at": {}, "ig_steps": 100, "ig_lr": 1.0, "ig_tv": IG_TV, "ig_plateau": 10,
        "ig_stop": 100, "lbfgs_steps": 10, "lbfgs_lr": 1.0, "lbfgs_plateau": 40, "lbfgs_stop": 400,
        "cpl_label": CPL_LABEL_WEIGHT, "best_iterate": "after-step"},
    paper={"victims": 128, "victims_at": {}, "ig_steps": 20_000, "ig_lr": 1.0, "ig_tv": IG_TV, "ig_plateau": 400,
           "ig_stop": 4_000, "lbfgs_steps": 2_000, "lbfgs_lr": 0.01, "lbfgs_plateau": 40,
           "lbfgs_stop": 400, "cpl_label": CPL_LABEL_WEIGHT, "best_iterate": "after-step"},
    sources={
        "victims": "§V-B: the victim set of 128 images per dataset",
        "victims_at": "ours: a dataset's own count where its client 0 holds fewer training "
                      "images than victims (cvb_data.victim_count; none as registered)",
        "ig_steps": "§V-B and configs/attacks/IG.yaml: at most 20,000 iterations",
        "ig_lr": "configs/attacks/IG.yaml: lr 1 (at ci also the stronger of 1 and 0.1)",
        "ig_tv": "configs/models/*.yaml: attack.regularization per architecture (§V-B's value "
        "is lost in our copy), inversefed's mean convention; ci: the same",
        "ig_plateau": "configs/attacks/IG.yaml: ReduceLROnPlateau patience 400 (ci: 10, to act "
                      "within 100 steps)",
        "ig_stop": "configs/attacks/IG.yaml: early stopping patience 4,000 (ci: the budget)",
        "lbfgs_steps": "configs/attacks/iDLG.yaml and CPL.yaml: at most 2,000 iterations "
                       "(L-BFGS steps of up to 20 inner iterations; ci: 10, where the undefended "
                       "iDLG first recovers an image on both stand-ins)",
        "lbfgs_lr": "configs/attacks/iDLG.yaml and CPL.yaml: LBFGS lr 0.01 (ci: ours, 1, the "
                    "larger step that 10 steps need; 3 diverges)",
        "lbfgs_plateau": "configs/attacks/iDLG.yaml and CPL.yaml: ReduceLROnPlateau patience 40",
        "lbfgs_stop": "configs/attacks/iDLG.yaml and CPL.yaml: early stopping patience 400",
        "cpl_label": "configs/models/*.yaml: attack.regularization per architecture, which "
                     "overrides configs/attacks/CPL.yaml's 0.01 (CPL_LABEL_WEIGHT); ci: the same",
        "best_iterate": "src/attacks.py, attack_batch: the iterate after the step whose starting "
                        "loss improved (AttackConfig.best_iterate; records made before this "
                        "setting existed kept the recorded iterate, 'recorded')",
    },
)  # fmt: skip

#: The federated training protocol behind every accuracy (§V-A) and the victims' client split
#: (:mod:`.cvb_data`). The optimiser, its constant lr, the global validation loss and the
#: reported best round are :func:`leakagelib.fedavg.federated_averaging`'s (its docstring
#: cites the authors' code).
TRAINING = ScaleConfig(
    ci={"clients": 2, "rounds": 2, "patience": None, "n_train": 256, "batch_size": 64,
        "val_fraction": 0.1},
    paper={"clients": 10, "rounds": 300, "patience": 40, "n_train": None, "batch_size": 64,
           "val_fraction": 0.1},
    sources={
        "clients": "§V-A; configs/fedavg.yaml num_clients 10",
        "rounds": "§V-A; configs/fedavg.yaml communication_rounds 300",
        "patience": "§V-A; configs/fedavg.yaml glob.early_stopping: 40 rounds on the global "
                    "model's validation loss",
        "n_train": "§V-A: the whole training split (None)",
        "batch_size": "§V-A; configs/fedavg.yaml batch_size 64",
        "val_fraction": "§V-A; configs/data/*.yaml create_validation_split 0.1",
    },
)  # fmt: skip


def scale_note(own_images: int, own_steps: Sequence[int]) -> dict[str, str]:
    """The ci settings that the CVB chapters' "Scale of this chapter" notes name, as text to glue.

    ``own_images`` and ``own_steps`` are the chapter's own attacks at ci (its
    victims; its Inverting Gradients iterations); the registered experiments'
    come from :data:`ATTACK` and :data:`TRAINING`. Keys: ``images`` and
    ``steps`` (ranges over both), ``paper_steps`` (the paper's iterations),
    ``rounds`` and ``train`` (the ci federated rounds and training images).
    Used by the chapters "Variational bottlenecks", "CVB against attacks and
    architectures" and "CVB against DP-SGD and gradient compression".
    """

    def span(values: Sequence[int]) -> str:
        low, high = min(values), max(values)
        return f"{low:,}" if low == high else f"{low:,}–{high:,}"

    return {
        "images": span([ATTACK.ci["victims"], own_images]),
        "steps": span([ATTACK.ci["ig_steps"], *own_steps]),
        "paper_steps": f"{ATTACK.paper['ig_steps']:,}",
        "rounds": str(TRAINING.ci["rounds"]),
        "train": f"{TRAINING.ci['n_train']:,}",
    }


def cvb_config(
    *parts: ScaleConfig,
    ci: dict[str, Any],
    paper: dict[str, Any],
    sources: dict[str, str],
) -> ScaleConfig:
    """An experiment's config: the protocol ``parts`` it uses (:data:`ATTACK`...), then its own."""
    merged = [*parts, ScaleConfig(ci=ci, paper=paper, sources=sources)]
    return ScaleConfig(
        ci={k: v for part in merged for k, v in part.ci.items()},
        paper={k: v for part in merged for k, v in part.paper.items()},
        sources={k: v for part in merged for k, v in part.sources.items()},
    )


def reference_rows(columns: Sequence[str], *values: Sequence[Any]) -> list[dict[str, Any]]:
    """The paper's rows as dicts of ``columns``; a ``None`` (lost in our copy) is left out."""
    return [{c: v for c, v in zip(columns, row, strict=True) if v is not None} for row in values]


def cnn(bottleneck: Any = None, *, seed: int = 0, num_classes: int = 10) -> nn.Module:
    """The CVB paper's CNN (``cvb-cnn``) built after seeding, optionally with a bottleneck spec."""
    torch.manual_seed(seed)
    model = models.build("cvb-cnn", in_shape=SHAPE, num_classes=num_classes)
    return apply_bottleneck_option(model, bottleneck, SHAPE)


def n_added(model: nn.Module) -> int:
    """The parameters ``model``'s bottlenecks add."""
    return sum(m.added_parameters for _, m in bottlenecks(model))


def attack_layers(model: nn.Module) -> list[str] | None:
    """The ignore attack's parameters of a model with a bottleneck (§III-B); else ``None`` (all)."""
    return attacked_parameters(model) if bottlenecks(model) else None


def cvb_attack(
    name: str,
    settings: Settings,
    *,
    architecture: str = "cnn",
    include: Sequence[str] | None = None,
    steps: int | None = None,
    lr: float | None = None,
) -> Attack:
    """The preset ``name`` (:data:`ATTACKS`) with the CVB authors' loop at ``settings``' scale.

    ``settings`` holds :data:`ATTACK`'s values (``ctx.config``). Labels are
    known. Every attack runs the authors' loop per image
    (:data:`CVB_LOOP`): the lr times 0.1 after a
    plateau, early stopping, a stop below 10⁻⁵, the best iterate returned
    (as ``best_iterate`` picks it: the authors' is the iterate after the best step).
    IG: at most ``ig_steps`` signed-Adam steps from lr ``ig_lr``, plateau
    patience ``ig_plateau``, stop patience ``ig_stop``, TV weight
    ``ig_tv[architecture]`` (``"cnn"``, ``"resnet18"`` or ``"vit"``) in the
    authors' convention, N(0, 1) start, iterates clipped to the image box.
    iDLG (clipped) and CPL (not clipped, ``configs/attacks/*.yaml``,
    ``clip_dummies``): at most ``lbfgs_steps`` L-BFGS steps from
    ``lbfgs_lr``, patience ``lbfgs_plateau`` and ``lbfgs_stop``, N(0, 1)
    start, the ℓ2 distance ‖g − s‖² (the authors' ``GL2``, a sum of squares:
    σ = 1/√2); CPL adds ``cpl_label[architecture]`` (:data:`CPL_LABEL_WEIGHT`)
    times the distance of the logits to the label (:class:`~leakagelib.attacks.LogitLabelDistance`).
    ``include`` restricts the likelihood (the ignore attack,
    :func:`attack_layers`); ``steps`` and ``lr`` replace the scale's values
    (the chapter's short attacks).
    """
    if architecture not in settings.ig_tv:
        raise ValueError(
            f"unknown architecture {architecture!r}; use one of {list(settings.ig_tv)}"
        )
    if name == "inverting-gradients":
        options: dict[str, Any] = {
            "steps": settings.ig_steps, "lr": settings.ig_lr, "tv": settings.ig_tv[architecture],
            "plateau_patience": settings.ig_plateau, "stop_patience": settings.ig_stop,
        }  # fmt: skip
    elif name in ("idlg", "cpl"):
        options = {"steps": settings.lbfgs_steps, "lr": settings.lbfgs_lr, "init": "normal",
                   "labels": "given", "plateau_patience": settings.lbfgs_plateau,
                   "stop_patience": settings.lbfgs_stop}  # fmt: skip
        options.update({"box": True} if name == "idlg" else
                       {"label_weight": settings.cpl_label[architecture], "label_term": "logits"})  # fmt: skip
    else:
        raise ValueError(f"unknown attack {name!r}; use one of {ATTACKS}")
    options.update(CVB_LOOP, best_iterate=settings.best_iterate)
    options.update({k: v for k, v in (("steps", steps), ("lr", lr)) if v is not None})
    return preset(name, include=include, **options)


def run_attack(
    ctx: Context,
    model: nn.Module,
    victims: Victims,
    attack: Attack,
    *,
    defense: GradientDefense | None = None,
    offset: int = 0,
    callback: Callable[[int, Tensor], None] | None = None,
) -> tuple[Case, AttackResult]:
    """Every victim its own client sharing through ``defense``; ``attack`` on all their updates.

    One generator (``ctx.generator(offset)``) draws the defense's noise and
    the attack's initialisation; torch's global generator, seeded with
    ``ctx.seed + offset``, the bottlenecks' noise. ``callback(step, iterates)``
    sees every iterate. The model and the updates live on ``ctx.device``. In a
    command-line run the attack saves its loop every few minutes
    (:meth:`~leakagelib.experiments.Context.checkpoint`).
    """
    generator = ctx.generator(offset)
    torch.manual_seed(ctx.seed + offset)
    case = build_case(model, *victims, defense=defense, generator=generator, device=ctx.device)
    # a paper-scale unit's attack resumes where it was killed
    checkpoint = ctx.checkpoint() if attack.config.resumable else None
    return case, case.attack(attack, generator=generator, callback=callback, checkpoint=checkpoint)


def client_epsilon(settings: Settings, dp: DPSGD, n_train: int) -> float:
    """ε (δ = ``dp.delta``) one client spent training: its own steps at rate batch / its data.

    ``settings`` holds :data:`TRAINING`'s values; ``dp.steps`` counts the
    steps of all clients, which each touch only their own data.
    """
    n = n_train if settings.n_train is None else min(n_train, settings.n_train)
    per_client = n / settings.clients * (1 - settings.val_fraction)
    rate = min(1.0, settings.batch_size / per_client)
    return epsilon_spent(dp.noise_multiplier, rate, dp.steps // settings.clients, dp.delta)


#: The CVB CNN as ``campaign``'s probes time it; its bottleneck variants are counted at its cost.
CVB_NET = Net("cvb-cnn", cnn, SHAPE)


def attack_load(settings: Settings, name: str, net: Net = CVB_NET) -> Load:
    """The work of attack ``name`` (:data:`ATTACKS`) on all victims at ``settings``' scale.

    L-BFGS (iDLG, CPL) is counted at :data:`~.work.LBFGS_EVALUATIONS` evaluations per step.
    """
    if name == "inverting-gradients":
        return Load(net, "attack", settings.victims, settings.ig_steps)
    return Load(net, "attack", settings.victims, settings.lbfgs_steps * LBFGS_EVALUATIONS)


def training_loads(ctx: Context, logical: str, net: Net = CVB_NET) -> list[Load]:
    """The work of :func:`fedavg_accuracy` on ``logical``: every round's local steps and evaluations.

    All ``rounds`` are counted (early stopping may end training sooner);
    each round evaluates the clients' validation shares and the test split.
    """
    s = ctx.config
    n = split_size(ctx, logical, "train")
    n = n if s.n_train is None else min(n, s.n_train)
    shard = n / s.clients
    n_val = max(1, round(s.val_fraction * shard)) if s.val_fraction > 0 else 0
    local_steps = math.ceil((shard - n_val) / s.batch_size)
    return [
        Load(net, "train", s.batch_size, s.rounds * s.clients * local_steps),
        evaluation_load(net, split_size(ctx, logical, "test") + s.clients * n_val, s.rounds),
    ]
