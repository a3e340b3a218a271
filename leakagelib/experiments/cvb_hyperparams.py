"""CVB paper Fig. 9 (values: the supplementary Table VIII): CVB's knobs, one at a time.

Position, kernel size, bottleneck scale and β are varied around the chosen
CVB, each variant attacked by Inverting Gradients (the ignore attack) and
trained with FedAvg; studies that build the same network share one run, as
the paper's identical rows show theirs did. Protocol and machinery:
:mod:`.cvb_common` and :mod:`.cvb_quality`. Run by the chapter "CVB against
attacks and architectures".

The record (32 victims, ``--set victims=32``; 2026-11-27, CPU, 3 h 05 min)
holds the client's β·KL term (:func:`fig9_hyperparams`). Against the paper (Table VIII):

* with CVB at position 1 and k = 1 (the position study) the paper's SSIMs
  lie inside the record's intervals (0.12 / 0.13 / 0.15 / 0.13 for
  positions 1 / 1,2 / 1,3 / 1,2,3; paper 0.13 / 0.13 / 0.12 / 0.14), and
  k = 3 too (0.20; paper 0.19);
* from k = 5 on the record leaks more: the chosen CVB 0.26 (ASR 3 %)
  against 0.21 (0 %), k = 7 0.33 against 0.23;
* the SSIM rises with the scale only up to s = 1, where it meets the
  paper's (0.21, 0.24, 0.26, 0.31 for s = 0.125 … 1; paper 0.10 … 0.30),
  then stays (0.32, 0.31 at s = 2, 4) where the paper's rises to 0.44;
* β moves it little (0.22–0.26 over β = 0.1 … 1e-5; paper 0.19–0.21);
* positions 2 and 3 leak more (0.35 and 0.67, ASR 6 % and 91 %, against
  0.24 and 0.46 / 48 %), as Tables I and II do with PRECODE there
  (:func:`~.cvb_precode.table1_ignore`).

The earlier record (2026-11-27, replaced the same day), made on the
cross-entropy's gradient alone with the exact Gaussian KL, had similar
single-position and kernel rows (chosen CVB 0.22, position 3 0.70 /
97 %), lower ones for positions 1,2 and 1,2,3 (0.08 each), and an SSIM
that barely moved with the scale (0.20–0.26) or with β (0.22–0.25). So
the KL term's gradient in the encoders, which grows with K, is part of
the paper's rise with the scale; the authors' own code stays flat above
s = 1 too (below). A
first probe outside the library (plain autograd, 1,000 signed-Adam steps
of lr 0.1, 6 images; 2026-11-27) had found the term changes little
(0.20 → 0.22 at s = 0.125, 0.25 → 0.27 at s = 4): too short an attack.

The gaps at position 3, at k = 5 and at s = 4 are not our implementation. The
authors' own IG code, run unchanged from their repository
(``get_attack("IG", ...)`` of ``src/attacks.py`` with
``configs/attacks/IG.yaml`` and their ``VBCNN`` of
``configs/models/CNNCVB.yaml``, our network's weights copied in), on the
first 8 of their stored CIFAR-10 victims
(``data/victim_datasets/CIFAR10_128.tdump``), full budget, this CPU, torch
2.14 (2026-11-27), SSIM by :func:`leakagelib.metrics.ssim_minmax` on both
sides, with ``cnn(seed=0)``'s and ``cnn(seed=1)``'s weights:

* CVB moved to position 3 (their index 2), k = 1, their ignore list
  ``['decoder', 'mlp_layers']``: theirs 0.68 (ASR 7 of 8) and 0.71 (8 of
  8), ours 0.68 and 0.73 in the same run; the paper has 0.46 (ASR 48 %);
* their configuration as published (position 1, k = 5, ignore list
  ``['decoder', '1.conv', '2.conv', 'mlp_layers']``): theirs 0.26 and
  0.26, ours 0.25 and 0.27; the paper has 0.21;
* the same at scale s = 4 (their ``K`` set to 64 = 4·16 channels, ours
  ``scale=4.0``; ``cnn(seed=0)``'s weights, 2026-11-27): theirs 0.30
  (ASR 1 of 8, stopping after 3,000–11,700 iterations), ours 0.29 (0 of
  8); the paper has 0.44 (ASR 27 %).
"""

from __future__ import annotations

from typing import Any

import torch

from ..defenses.bottlenecks import bottlenecks
from .config import Settings
from .cvb_common import (
    ATTACK,
    CVB_DEFAULT,
    FIGURE_IMAGES,
    TRAINING,
    attack_layers,
    attack_load,
    cnn,
    cvb_attack,
    cvb_config,
    fedavg_accuracy,
    load_victims,
    n_added,
    reference_rows,
    run_attack,
    training_loads,
    with_victims,
)
from .cvb_quality import LPIPS, quality_row, require_lpips
from .registry import Context, experiment


def fig9_studies(settings: Settings) -> list[tuple[str, Any, dict[str, Any]]]:
    """Fig. 9's studies: (study, value, the change to :data:`CVB_DEFAULT`), one knob at a time.

    The position study runs with kernel size ``position_kernel`` (1, as the
    supplementary Table VIII's rows show), the others at position 1.
    """
    studies: list[tuple[str, Any, dict[str, Any]]] = [
        ("position", ",".join(map(str, pos)),
         {"position": list(pos), "kernel_size": settings.position_kernel})
        for pos in settings.positions
    ]  # fmt: skip
    studies += [("kernel", k, {"kernel_size": k}) for k in settings.kernels]
    studies += [("scale", s, {"scale": s}) for s in settings.scales]
    studies += [("beta", b, {"beta": b}) for b in settings.betas]
    return studies


def fig9_runs(settings: Settings) -> list[list[int]]:
    """The indices of :func:`fig9_studies` grouped by the network they build, in first-seen order.

    Studies that build the same bottlenecks (position 1 with k = 1 in the
    position and the kernel study; the chosen CVB in the kernel, scale and β
    studies) are one run, as in the paper, whose Table VIII gives them
    identical rows.
    """
    groups: dict[str, list[int]] = {}
    # building a network seeds torch's generator: leave the caller's as it was
    with torch.random.fork_rng(devices=[]):
        for i, (_, _, change) in enumerate(fig9_studies(settings)):
            model = cnn({**CVB_DEFAULT, **change})
            key = repr([(n, m.extra_repr()) for n, m in bottlenecks(model)])
            groups.setdefault(key, []).append(i)
    return list(groups.values())


@experiment(
    "cvb/fig9-hyperparams",
    on=("study", "value"),
    row_keys=("study", "value", "ssim", "asr", "psnr", "mse", "lpips", "accuracy"),
    config=cvb_config(
        ATTACK,
        TRAINING,
        LPIPS,
        ci={
            "positions": ((1,), (3,)),
            "position_kernel": 1,
            "kernels": (1, 5),
            "scales": (0.25, 1.0),
            "betas": (0.1, 1e-3),
        },
        paper={
            "positions": ((1,), (2,), (3,), (1, 2), (1, 3), (2, 3), (1, 2, 3)),
            "position_kernel": 1,
            "kernels": (1, 3, 5, 7),
            "scales": (0.125, 0.25, 0.5, 1.0, 2.0, 4.0),
            "betas": (0.1, 1e-2, 1e-3, 1e-4, 1e-5),
        },
        sources={
            "positions": "§VI-A1, Fig. 9(a); the supplementary Table VIII's seven rows",
            "position_kernel": "the supplementary Table VIII: the position study's row at "
            "position 1 equals the kernel study's k = 1 row in every column (SSIM 0.13 (0.06), "
            "PSNR 9.82 (1.45), accuracy 62.01 (1.66)), so the position study ran with k = 1 "
            "(§VI-A1's own values are lost in our copy)",
            "kernels": "§VI-A2, Fig. 9(b); Table VIII's four rows, k = 5 the chosen one's",
            "scales": "§VI-A3, Fig. 9(c): six values, as Table VIII's six rows, whose third is "
            "the chosen s = 0.5 (its row equals the chosen CVB's) and whose SSIM and accuracy "
            "rise down the table as §VI-A3 says they rise with s; the values are lost in our "
            "copy: halving and doubling around 0.5 (ours)",
            "betas": "§VI-A4, Fig. 9(d): five values, as Table VIII's five rows. The first row "
            "equals the chosen CVB's (β = 0.1), the accuracy falls down the rows, and §VI-A4 "
            "says larger β gives higher accuracy and chooses the β of the highest: so 0.1 is "
            "the largest value. The others are lost in our copy: powers of ten below 0.1 "
            "(ours); ci: 0.1 and 1e-3",
        },
    ),
    reference=reference_rows(
        ("study", "value", "ssim", "asr", "psnr", "mse", "lpips", "accuracy"),
        ("position", "1", 0.13, 0.0, 9.82, 0.11, 0.55, 0.6201),
        ("position", "2", 0.24, 0.0, 10.05, 0.10, 0.58, 0.6510),
        ("position", "3", 0.46, 0.4766, 13.19, 0.06, 0.48, 0.6393),
        ("position", "1,2", 0.13, 0.0, 10.96, 0.09, 0.51, 0.6196),
        ("position", "1,3", 0.12, 0.0, 10.45, 0.10, 0.53, 0.6079),
        ("position", "2,3", 0.23, 0.0, 10.75, 0.09, 0.57, 0.6505),
        ("position", "1,2,3", 0.14, 0.0, 11.78, 0.07, 0.51, 0.6080),
        ("kernel", 1, 0.13, 0.0, 9.82, 0.11, 0.55, 0.6201),
        ("kernel", 3, 0.19, 0.0, 9.97, 0.11, 0.55, 0.6588),
        ("kernel", 5, 0.21, 0.0, 9.51, 0.12, 0.58, 0.6717),
        ("kernel", 7, 0.23, 0.0, 10.03, 0.11, 0.57, 0.6823),
        ("scale", 0.125, 0.10, 0.0, 8.70, 0.14, 0.61, 0.5563),
        ("scale", 0.25, 0.15, 0.0, 8.59, 0.14, 0.62, 0.6524),
        ("scale", 0.5, 0.21, 0.0, 9.51, 0.12, 0.58, 0.6717),
        ("scale", 1.0, 0.30, 0.0156, 11.60, 0.08, 0.52, 0.6805),
        ("scale", 2.0, 0.38, 0.125, 13.45, 0.05, 0.46, 0.6879),
        ("scale", 4.0, 0.44, 0.2656, 14.59, 0.04, 0.42, 0.6893),
        ("beta", 0.1, 0.21, 0.0, 9.51, 0.12, 0.58, 0.6717),
        ("beta", "lost-2", 0.19, 0.0, 9.75, 0.11, 0.59, 0.6497),
        ("beta", "lost-3", 0.19, 0.0, 10.34, 0.10, 0.58, 0.6355),
        ("beta", "lost-4", 0.20, 0.0, 10.32, 0.10, 0.58, 0.6331),
        ("beta", "lost-5", 0.21, 0.0078, 10.43, 0.09, 0.57, 0.6356),
    ),
    reference_source=(
        "CVB paper, the supplementary Table VIII: Fig. 9's values (CIFAR-10; ASR and accuracy as "
        "fractions). Its row labels are lost in our copy; the rows are matched to the studies by "
        "their order and count (the config's sources say how), the β rows after the first keep "
        "the labels 'lost-2', ... in the table's order"
    ),
    datasets=("cifar10",),
    work=lambda ctx: [
        [attack_load(ctx.config, "inverting-gradients"), *training_loads(ctx, "cifar10")]
        for _ in fig9_runs(ctx.config)
    ],
)
def fig9_hyperparams(ctx: Context) -> dict[str, Any]:
    """CVB Fig. 9: CVB position, kernel size, bottleneck scale and β versus privacy and accuracy.

    One study varies one hyper-parameter around the chosen CVB (position 1,
    k = 5, scale 0.5, β = 0.1; the position study with k = 1), attacked by
    IG (TV 0.1, ignore attack) and trained with FedAvg. Studies that build
    the same network share one run (:func:`fig9_runs`). Rows: ``study``
    ("position", "kernel", "scale", "beta"), ``value``, ``added`` parameters,
    :func:`~.cvb_quality.quality_row`'s columns (``ssim``, ``asr``, ``psnr``,
    ``mse``, ``lpips``, and ``pictures``: the first victims and their
    reconstructions), ``accuracy``, in the studies' order. Data:
    ``cifar10``. One unit per run, keyed by its first (study, value).

    The client's update, and the attacker's simulated one, are those of the
    training loss, cross-entropy plus β·KL, as in the authors' code
    (:func:`leakagelib.losses.client_loss` cites the files), with the KL
    in their log-variance form (``kl="reference"`` in
    :data:`~.cvb_common.CVB_DEFAULT`). The KL term depends on the input
    through the encoders without passing through the noise.

    The record against the paper: the module's docstring.
    """
    require_lpips(ctx)
    studies = fig9_studies(ctx.config)
    runs = {tuple(studies[group[0]][:2]): group for group in fig9_runs(ctx.config)}
    victims = load_victims(ctx, "cifar10")

    def unit(cell: tuple[str, Any]) -> list[dict[str, Any]]:
        group = runs[tuple(cell)]
        first = group[0]
        spec = {**CVB_DEFAULT, **studies[first][2]}
        model = cnn(spec, seed=ctx.seed)
        attack = cvb_attack("inverting-gradients", ctx.config, include=attack_layers(model))
        case, result = run_attack(ctx, model, victims, attack, offset=first)
        accuracy = fedavg_accuracy(ctx, cnn(spec, seed=ctx.seed), "cifar10")
        row = quality_row(case, result, lpips=ctx.config.lpips, added=n_added(model),
                          accuracy=accuracy, pictures=FIGURE_IMAGES)  # fmt: skip
        return [{"study": studies[i][0], "value": studies[i][1], **row} for i in group]

    rows = ctx.units([list(key) for key in runs], unit, "Fig. 9")
    order = {(r["study"], r["value"]): r for r in rows}
    rows = [order[(study, value)] for study, value, _ in studies]
    return with_victims(ctx, rows, ["cifar10"])
