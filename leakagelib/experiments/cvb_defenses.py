"""CVB paper Tables III–IV: CVB against three attacks and against other defenses.

Table III attacks the CNN with and without CVB by iDLG, CPL and Inverting
Gradients; Table IV compares CVB with DP-SGD, gradient compression and
PRECODE on privacy and accuracy (its Fig. 11 plots the same numbers).
Fig. 9 is :mod:`.cvb_hyperparams`. Protocol and machinery: :mod:`.cvb_common`
and :mod:`.cvb_quality`. Run by the chapters "CVB against attacks and
architectures" and "CVB against DP-SGD and gradient compression".

**Table III's record.** The paper-scale record's iDLG on undefended MNIST (128 victims, a lent H100)
reached SSIM 0.52 and ASR 60 % where the paper has 0.76 and 91 %. Not our
L-BFGS: on the record's first 8 victims (this CPU, 2026-11-26) our attack
gave 0.51 and 62 %, and the authors' loop as ``src/attacks.py`` runs it
(``torch.optim.LBFGS`` at lr 0.01 on one image at a time, the plateau
schedule, early stopping after 400 steps, the best iterate; other N(0, 1)
starts) gave 0.48 and 38 %, stopping after 430–570 steps. The draw of the
CNN's initial weights moves it: with ``cnn(seed=1)`` and ``cnn(seed=2)``
instead of 0, our attack on those 8 victims gave 0.61 / 100 % and
0.57 / 88 %. No draw reached the paper's mean; the paper gives no spread
over draws. Nor is it the victims: on the authors' own stored ones (the
first 8 of ``data/victim_datasets/MNIST_128.tdump`` in
dAI-SY-Group/ConvolutionalVariationalBottleneck, brought back from their
normalisation to [0, 1]; their size, ink and channels match ours) our
attack gave 0.52 / 62 % with ``cnn(seed=0)`` and 0.58 / 75 % with
``cnn(seed=1)`` (this CPU, 2026-11-27). Over seven draws (seeds 0–5 and
42, the same 8 stored victims, the after-step rule from seed 2 on; this CPU,
2026-11-27) our attack's mean SSIM ranged from 0.30 to 0.63 (0.47, 0.58,
0.33, 0.54, 0.63, 0.30, 0.49; standard deviation 0.12 between draws): the
draw moves the mean by as much as the gap, but none of the seven reaches
0.76. Nor is it our implementation: the
authors' own code, run unchanged from their repository (``get_attack("iDLG",
...)`` of ``src/attacks.py`` with ``configs/attacks/iDLG.yaml``, their
``CNN`` with our network's weights copied in, the same 8 stored victims,
this CPU, torch 2.14, 2026-11-27), gave SSIM 0.44 (ASR 38 %) with
``cnn(seed=0)``'s weights and 0.49 (62 %) with ``cnn(seed=1)``'s, where
ours gave 0.47 (50 %) and 0.58 (75 %) in the same run (SSIM by
:func:`leakagelib.metrics.ssim_minmax` on both sides). So their published
code does not reach the paper's 0.76 here either; what does (their GPU,
their library versions) is open. Their IG (``configs/attacks/IG.yaml``,
TV 0.1 of ``configs/models/CNN.yaml``) on undefended MNIST, ``cnn(seed=0)``,
the same 8 victims: theirs 0.76, ours 0.75 (record: 0.77 on 128; paper
0.95); their best iterates came at 800–2,400 iterations.

One input channel would account for iDLG's MNIST shortfall, not for IG's.
The authors' configs feed MNIST as three identical channels
(``configs/data/MNIST.yaml``: ``Grayscale_to_RGB``, shape [3, 32, 32]), and
so do we. Fed as one channel instead (the CNN built for 1×32×32 inputs,
the same 8 stored victims, this CPU, 2026-11-27), our iDLG gave 0.88 /
100 %, 0.76 / 88 % and 0.55 / 50 % with seeds 0, 1 and 2, where three
channels gave 0.47, 0.58 and 0.33: a mean of 0.73 over the three draws,
near the paper's 0.76 / 91 %. IG gave 0.745 and 0.82 with seeds 0 and 1
(three channels: 0.75 and 0.70), still short of 0.95. Whether the paper's
MNIST runs had one channel, their published material does not say; we keep
their configs' three.

The record (2026-11-27) finished on this CPU with 32 CIFAR-10 victims
(``victims_at``: client 0 of ten holds 36 images of the 500-image
sample). There the undefended attacks part from the paper the other way:
iDLG SSIM 0.51 and CPL 0.43 (paper 0.43 and 0.32) are stronger, IG 0.81
(paper 0.87) close; with CVB, IG keeps SSIM 0.28 (paper 0.21) and iDLG and
CPL nothing (0.017 and 0.028; paper 0.01 and 0.03). Why MNIST falls short
is open; the best-iterate rule below does not move it (our iDLG on the first
32 of the authors' stored MNIST victims: SSIM 0.50 ± 0.04 with the recorded
iterate and with theirs alike, paired difference 0.005 ± 0.013; this CPU,
2026-11-27). On CIFAR-10 the overshoot is mostly in which iterate the attack
returns, as probes on the first 32 of the authors' stored CIFAR-10 victims
(``data/victim_datasets/CIFAR10_128.tdump``, ``cnn(seed=0)``'s weights, this
CPU, 2026-11-27; ± is 1.96 standard errors over the images) show:

* Not the victims: our iDLG gave SSIM 0.51 ± 0.05 (ASR 53 %) there, as on
  the record's own victims; our CPL 0.38 ± 0.05 (19 %).
* The authors' code (``get_attack`` with ``configs/attacks/iDLG.yaml`` and
  ``CPL.yaml``, their ``CNN`` holding the same weights, SSIM scored alike)
  gave iDLG 0.41 ± 0.07 (38 %) and CPL 0.33 ± 0.07 (19 %), the paper's 0.43
  and 0.32 inside both intervals. Paired over the images, ours was higher by
  0.10 ± 0.07 for iDLG; for CPL the difference, 0.05 ± 0.07, is within chance.
* Their loop keeps the iterate *after* the step whose starting loss was the
  lowest, which returns a diverged iterate where that step diverged; the
  record kept the iterate whose loss was recorded. With their rule
  (``best_iterate="after-step"``, now :data:`~.cvb_common.ATTACK`'s value)
  our iDLG gave 0.46 ± 0.06 (44 %), 0.05 ± 0.05 below the recorded rule, and
  our CPL 0.29 ± 0.06 (12.5 %), 0.09 ± 0.05 below it; against their code
  the differences are within chance (0.05 ± 0.09 and −0.04 ± 0.09), and the
  paper's 0.43 and 0.32 lie inside both intervals.

The CVB records made before ``best_iterate`` existed (Tables I, II and III,
Figure 9) say ``"recorded"`` in their ``settings_changed``; Table IV's record,
begun before the rule, kept it for all its units, so that its rows agree.
Scoring in the normalised space, as the authors' metrics do
(``rate_reconstruction_quality`` on the normalised tensors), moves Table
III's record's pictured CIFAR-10 images' SSIM by at most 0.05 either way.

**Table IV's record** (this CPU, one thread, 2026-11-27/28, 13 h 19 min; 128
MNIST and 32 CIFAR-10 victims). With CVB no image is recovered (ASR 0; SSIM
0.18 on MNIST, 0.27 on CIFAR-10; paper 0.29, 0.21); DP-SGD from σ = 0.1 and
compression at p = 0.99 stop every recovery; PRECODE's SSIM and ASR rise with K
on MNIST (0.56 / 73 % at K = 32 to 0.67 / 100 % at 512; paper 0.46 / 34 % to
0.78 / 100 %), and on CIFAR-10 it leaks more than in the paper at small K
(K = 32: ASR 47 %, paper 1.6 %), as in Tables I and II (:mod:`.cvb_precode`).
The accuracies are those of networks trained on the offline sample (CIFAR-10
15–27 %, MNIST 82–96 %), not the paper's.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache, partial
from typing import Any

from ..defenses import DPSGD, GradientCompression, GradientDefense, NoDefense
from .config import Settings
from .cvb_common import (
    ATTACK,
    ATTACKS,
    CVB_DEFAULT,
    FIGURE_IMAGES,
    TRAINING,
    attack_layers,
    attack_load,
    check_victims,
    client_epsilon,
    cnn,
    cvb_attack,
    cvb_config,
    fedavg_accuracy,
    load_victims,
    n_added,
    reference_rows,
    run_attack,
    training_loads,
    victim_fields,
    with_victims,
)
from .cvb_quality import LPIPS, quality_row, require_lpips
from .registry import Context, experiment
from .work import Load


@experiment(
    "cvb/table3-attacks",
    on=("dataset", "defense", "attack"),
    row_keys=("dataset", "defense", "attack", "ssim", "asr", "psnr", "mse", "lpips"),
    config=cvb_config(
        ATTACK,
        TRAINING,
        LPIPS,
        ci={"datasets": ("mnist", "cifar10")},
        paper={"datasets": ("mnist", "cifar10")},
        sources={"datasets": "Table III"},
    ),
    reference=reference_rows(
        ("dataset", "defense", "attack", "ssim", "asr", "psnr", "mse", "lpips"),
        ("mnist", "none", "idlg", 0.76, 0.9141, 15.98, 0.03, 0.40),
        ("mnist", "none", "cpl", 0.32, 0.1240, 7.63, 0.18, 0.55),
        ("mnist", "none", "inverting-gradients", 0.95, 1.0, 33.13, 0.00, 0.03),
        ("mnist", "cvb", "idlg", 0.00, 0.0, 8.67, 0.14, 0.82),
        ("mnist", "cvb", "cpl", 0.00, 0.0, 6.13, 0.25, 0.85),
        ("mnist", "cvb", "inverting-gradients", 0.29, 0.0156, 7.35, 0.20, 0.64),
        ("cifar10", "none", "idlg", 0.43, 0.4766, 11.76, 0.08, 0.54),
        ("cifar10", "none", "cpl", 0.32, 0.2266, 12.25, 0.07, 0.55),
        ("cifar10", "none", "inverting-gradients", 0.87, 0.9688, 21.09, 0.01, 0.20),
        ("cifar10", "cvb", "idlg", 0.01, 0.0, 9.14, 0.12, 0.67),
        ("cifar10", "cvb", "cpl", 0.03, 0.0, 10.55, 0.09, 0.64),
        ("cifar10", "cvb", "inverting-gradients", 0.21, 0.0, 9.51, 0.12, 0.58),
    ),
    reference_source="CVB paper, Table III (mean SSIM and ASR as a fraction, 128 images per "
    "cell) and the supplementary Table IX (the same rows' mean PSNR, MSE and LPIPS)",
    datasets=("mnist", "cifar10"),
    work=lambda ctx: [
        [attack_load(ctx.config, name)] for _, _, name in table3_units(ctx.config.datasets)
    ],
)
def table3_attacks(ctx: Context) -> dict[str, Any]:
    """CVB Table III: iDLG, CPL and IG against the CNN without defense and with CVB, on MNIST and CIFAR-10.

    Against CVB every attack reads only the gradients before its decoder; IG's
    TV weight is the authors' 0.1 for this CNN with and without CVB
    (:data:`~.cvb_common.IG_TV`). CPL's label term has the CNN's weight in
    the authors' model config, 0.1 (:data:`~.cvb_common.CPL_LABEL_WEIGHT`).
    Victims: client 0's training images of each dataset (named in the
    record's ``data``). Rows: ``dataset``, ``defense`` ("none" or "cvb"),
    ``attack`` (a preset id) and :func:`~.cvb_quality.quality_row`'s columns
    (``ssim``, ``asr``, and ``psnr``, ``mse``, ``lpips`` as the supplementary
    Table IX, each mean with its ``_std``; ``pictures``: the first victims and
    their reconstructions). Data: ``mnist``, ``cifar10``.
    One unit per row (:func:`table3_units`).

    The record against the paper, and the probes behind it: the module's
    docstring, "Table III's record".
    """
    require_lpips(ctx)
    check_victims(ctx, ctx.config.datasets)
    victims = cache(lambda dataset: load_victims(ctx, dataset))

    def unit(cell: tuple[str, str, str]) -> list[dict[str, Any]]:
        dataset, defense, name = cell
        spec = None if defense == "none" else CVB_DEFAULT
        model = cnn(spec, seed=ctx.seed)
        attack = cvb_attack(name, ctx.config, include=attack_layers(model))
        case, result = run_attack(ctx, model, victims(dataset), attack, offset=ATTACKS.index(name))
        return [quality_row(case, result, lpips=ctx.config.lpips, dataset=dataset,
                            defense=defense, attack=name, **victim_fields(ctx, dataset),
                            pictures=FIGURE_IMAGES)]  # fmt: skip

    rows = ctx.units(table3_units(ctx.config.datasets), unit, "Table III")
    return with_victims(ctx, rows, ctx.config.datasets)


def table3_units(datasets: tuple[str, ...]) -> list[tuple[str, str, str]]:
    """Table III's cells in its order: (dataset, defense, attack)."""
    return [(d, defense, a) for d in datasets for defense in ("none", "cvb") for a in ATTACKS]


#: DP-SGD's per-example clipping norm C in Table IV: ours, as the paper's value is lost in our
#: copy of its text (:func:`table4_defenses`).
DP_CLIP = 1.0

#: One defense of Table IV: (name, parameter, bottleneck spec, the gradient defense's constructor).
DefenseChoice = tuple[str, Any, dict[str, Any] | None, Callable[[], GradientDefense]]


def table4_choices(settings: Settings) -> list[DefenseChoice]:
    """Table IV's defenses in its order: none, DP-SGD (C = :data:`DP_CLIP`), GC, PRECODE at
    position 1, CVB."""
    choices: list[DefenseChoice] = [("none", None, None, NoDefense)]
    choices += [("dp", s, None, partial(DPSGD, s, DP_CLIP)) for s in settings.noise]
    choices += [("gc", p, None, partial(GradientCompression, p)) for p in settings.rates]
    choices += [
        ("precode", k, {"kind": "precode", "position": 1, "K": k}, NoDefense)
        for k in settings.sizes
    ]
    choices.append(("cvb", "k=5,s=0.5,beta=0.1", CVB_DEFAULT, NoDefense))
    return choices


def _table4_work(ctx: Context) -> list[list[Load]]:
    """An IG attack and a training run per row (DP-SGD's per-sample steps counted as plain ones)."""
    ig = attack_load(ctx.config, "inverting-gradients")
    return [
        [ig, *training_loads(ctx, dataset)]
        for dataset in ctx.config.datasets
        for _ in table4_choices(ctx.config)
    ]


@experiment(
    "cvb/table4-defenses",
    on=("dataset", "defense", "parameter"),
    row_keys=(
        "dataset",
        "defense",
        "parameter",
        "ssim",
        "asr",
        "psnr",
        "mse",
        "lpips",
        "accuracy",
        "epsilon",
    ),
    config=cvb_config(
        ATTACK,
        TRAINING,
        LPIPS,
        ci={"datasets": ("cifar10",), "noise": (0.1, 1.0), "rates": (0.9,), "sizes": (32,)},
        paper={
            "datasets": ("mnist", "cifar10"),
            "noise": (0.01, 0.1, 0.5, 1.0),
            "rates": (0.9, 0.99),
            "sizes": (32, 64, 128, 256, 512),
        },
        sources={
            "datasets": "Table IV",
            "noise": "ours (values lost in §VI-C's text and Table IV's Parameters column of our "
            "copy, in the main and the supplementary table; not in the authors' configs): four, "
            "as Table IV has four DP rows",
            "rates": "ours (lost likewise; the authors' code has no compression): two, as Table "
            "IV has two GC rows",
            "sizes": "§VI-C: PRECODE sizes K",
        },
    ),
    reference=reference_rows(
        ("dataset", "defense", "parameter", "ssim", "asr", "psnr", "mse", "lpips", "accuracy"),
        ("mnist", "none", None, 0.95, 1.0, 33.13, 0.00, 0.03, 0.9910),
        ("mnist", "dp", "lost-1", 0.00, 0.0, 7.43, 0.18, 0.74, 0.9473),
        ("mnist", "dp", "lost-2", 0.01, 0.0, 7.58, 0.18, 0.74, 0.9817),
        ("mnist", "dp", "lost-3", 0.08, 0.0, 8.52, 0.14, 0.74, 0.9887),
        ("mnist", "dp", "lost-4", 0.64, 0.8516, 17.83, 0.02, 0.43, 0.9897),
        ("mnist", "gc", "lost-1", 0.63, 0.8984, 18.12, 0.02, 0.42, 0.9831),
        ("mnist", "gc", "lost-2", 0.24, 0.0, 11.57, 0.07, 0.72, 0.2308),
        ("mnist", "precode", 32, 0.46, 0.3359, 10.22, 0.10, 0.69, 0.9855),
        ("mnist", "precode", 64, 0.52, 0.5938, 11.89, 0.07, 0.63, 0.9842),
        ("mnist", "precode", 128, 0.59, 0.8281, 14.47, 0.04, 0.55, 0.9849),
        ("mnist", "precode", 256, 0.68, 0.9062, 18.67, 0.01, 0.40, 0.9837),
        ("mnist", "precode", 512, 0.78, 1.0, 24.37, 0.00, 0.24, 0.9822),
        ("mnist", "cvb", "k=5,s=0.5,beta=0.1", 0.29, 0.0078, 7.34, 0.20, 0.64, 0.9915),
        ("cifar10", "none", None, 0.87, 0.9688, 21.09, 0.01, 0.20, 0.6253),
        ("cifar10", "dp", "lost-1", 0.01, 0.0, 8.13, 0.16, 0.68, 0.4987),
        ("cifar10", "dp", "lost-2", 0.01, 0.0, 8.16, 0.16, 0.68, 0.5902),
        ("cifar10", "dp", "lost-3", 0.03, 0.0, 8.50, 0.14, 0.68, 0.6077),
        ("cifar10", "dp", "lost-4", 0.31, 0.0547, 12.91, 0.05, 0.57, 0.6073),
        ("cifar10", "gc", "lost-1", 0.48, 0.4688, 15.25, 0.03, 0.47, 0.5438),
        ("cifar10", "gc", "lost-2", 0.15, 0.0, 12.03, 0.07, 0.59, 0.1149),
        ("cifar10", "precode", 32, 0.32, 0.0156, 10.67, 0.09, 0.57, 0.6149),
        ("cifar10", "precode", 64, 0.35, 0.0781, 11.29, 0.08, 0.55, 0.6160),
        ("cifar10", "precode", 128, 0.41, 0.1953, 12.58, 0.06, 0.50, 0.6065),
        ("cifar10", "precode", 256, 0.53, 0.6172, 15.07, 0.03, 0.42, 0.6097),
        ("cifar10", "precode", 512, 0.72, 0.9766, 19.07, 0.01, 0.27, 0.5995),
        ("cifar10", "cvb", "k=5,s=0.5,beta=0.1", 0.21, 0.0, 9.51, 0.12, 0.58, 0.6717),
    ),
    reference_source=(
        "CVB paper, Table IV (ASR and accuracy as fractions) and the supplementary Table X (the "
        "same rows' PSNR, MSE and LPIPS; it lists two more PRECODE rows above K = 32, whose sizes "
        "are lost in our copy, which are left out). The DP noise multipliers and GC "
        "rates are lost in our copy: those rows carry the parameter 'lost-1', 'lost-2', ... in "
        "the table's order (DP: most noise first, judging by accuracy; GC: smaller rate first)"
    ),
    datasets=("mnist", "cifar10"),
    work=_table4_work,
)
def table4_defenses(ctx: Context) -> dict[str, Any]:
    """CVB Table IV: DP-SGD noise levels, gradient compression rates, PRECODE sizes and CVB compared.

    Each defense of :func:`table4_choices` is attacked by IG (the authors' TV
    0.1 for this CNN) — on all gradients for the perturbations, with the
    ignore attack for the bottlenecks — and trained with FedAvg, every local step's update
    going through it. DP-SGD clips each per-sample gradient to C = :data:`DP_CLIP` and adds
    noise of multiplier σ (the parameter); ε for δ = 1e-5 is what one client
    spends (Opacus RDP accountant). GC prunes the share p of every layer's
    smallest entries; PRECODE (β = 1e-3) sits at position 1 with size K.

    The paper's σ, C and p are lost in our copy: §VI-C's sentences that give
    them ("We search for C ∈ … and eventually fix C = …", "the noise multiplier
    σ ∈ …", "the pruning ratio p, which we set to …") lost every value, and
    so did the Parameters column of Table IV and of the supplementary's full
    table; the authors' code (configs and ``src``) implements neither DP-SGD
    nor compression. So C = 1 and the values of ``noise`` and ``rates`` are
    ours — as many as the table has rows (four DP, two GC) — and the paper's
    rows keep the labels ``lost-1``, ``lost-2``, … in its order.
    Victims: client 0's training images (named in the record's ``data``).
    Rows: ``dataset``, ``defense``, ``parameter``,
    :func:`~.cvb_quality.quality_row`'s columns (``ssim``, ``asr``, and
    ``psnr``, ``mse``, ``lpips`` as the supplementary Table X; ``pictures``: the
    first victims and their reconstructions), ``accuracy``,
    ``epsilon`` (None except DP), ``added`` (bottleneck parameters). Data:
    ``mnist``, ``cifar10``. One unit per row: (dataset, defense, parameter).
    """
    require_lpips(ctx)
    choices = table4_choices(ctx.config)
    named = [(name, parameter) for name, parameter, _, _ in choices]
    check_victims(ctx, ctx.config.datasets)
    victims = cache(lambda dataset: load_victims(ctx, dataset))

    def unit(cell: tuple[str, str, Any]) -> list[dict[str, Any]]:
        dataset, i = cell[0], named.index((cell[1], cell[2]))
        name, parameter, spec, make = choices[i]
        model = cnn(spec, seed=ctx.seed)
        attack = cvb_attack("inverting-gradients", ctx.config, include=attack_layers(model))
        case, result = run_attack(ctx, model, victims(dataset), attack, defense=make(), offset=i)
        trained = make()  # a fresh privacy ledger for the training run
        accuracy = fedavg_accuracy(ctx, cnn(spec, seed=ctx.seed), dataset, defense=trained)
        epsilon = None
        if name == "dp":
            epsilon = client_epsilon(ctx.config, trained, len(ctx.dataset(dataset, split="train")))
        return [quality_row(case, result, lpips=ctx.config.lpips, dataset=dataset, defense=name,
                            parameter=parameter, accuracy=accuracy, epsilon=epsilon,
                            added=n_added(model), **victim_fields(ctx, dataset),
                            pictures=FIGURE_IMAGES)]  # fmt: skip

    cells = [(dataset, *choice) for dataset in ctx.config.datasets for choice in named]
    return with_victims(ctx, ctx.units(cells, unit, "Table IV"), ctx.config.datasets)
