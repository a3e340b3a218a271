"""CVB paper Tables I–II: PRECODE analysed — which gradients to ignore, where a bottleneck protects.

Table I attacks PRECODE reading every gradient, then fewer: the "ignore"
attack (§III-B) leaves out the decoder and every later layer, whose
gradients depend on noise the attacker cannot reproduce. Table II moves
PRECODE from the last position to the first and weighs the privacy it buys
against the parameters it adds and the accuracy it costs. Protocol and
machinery: :mod:`.cvb_common`. Run by the chapter "Variational bottlenecks".
"""

from __future__ import annotations

from functools import partial
from typing import Any

from torch import nn

from ..defenses import attacked_parameters
from .config import Settings
from .cvb_common import (
    ATTACK,
    FIGURE_IMAGES,
    PRECODE_TABLE2,
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
from .cvb_quality import quality_row
from .registry import Context, experiment
from .work import Load

#: Table I's variants at each PRECODE position, in its order: the gradients each attack leaves
#: out. At position 3 (before the head) the table leaves out the decoder, the classifier or
#: both; at position 2 (between conv2 and conv3) also conv3, alone and with the decoder (its
#: six rows; the paper's columns there are conv1, conv2, encoder, decoder, conv3, classifier).
VARIANTS: dict[int, tuple[str, ...]] = {
    3: ("all", "without decoder", "without classifier", "without decoder and later"),
    2: ("all", "without classifier", "without conv3", "without decoder",
        "without decoder and conv3", "without decoder and later"),
}  # fmt: skip
#: Every variant's name, in a fixed order: a variant's index is its attack's seed offset.
VARIANT_NAMES = ("all", "without decoder", "without classifier", "without decoder and later",
                 "without conv3", "without decoder and conv3")  # fmt: skip
#: The parameter-name prefixes each partial variant leaves out (the full one: the decoder and
#: everything after it, :func:`leakagelib.defenses.attacked_parameters`).
LEFT_OUT = {
    "without decoder": ("precode.decoder.",),
    "without classifier": ("head.",),
    "without conv3": ("conv3.",),
    "without decoder and conv3": ("precode.decoder.", "conv3."),
}


def ignore_variants(model: nn.Module, position: int) -> dict[str, list[str]]:
    """Table I's variants for PRECODE at ``position``: the parameters each attack reads.

    From all of them to the ignore attack's (those before the decoder), in
    the table's order (:data:`VARIANTS`).
    """
    if position not in VARIANTS:
        raise ValueError(f"Table I places PRECODE at {sorted(VARIANTS)}, not {position}")
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    chosen = {"all": names, "without decoder and later": attacked_parameters(model)}
    chosen |= {v: [n for n in names if not n.startswith(p)] for v, p in LEFT_OUT.items()}
    return {v: chosen[v] for v in VARIANTS[position]}


def table1_units(settings: Settings) -> list[tuple[int, str]]:
    """Table I's cells: (0, "all") without PRECODE, then (position, variant) for every position."""
    return [(0, "all")] + [(pos, label) for pos in settings.positions for label in VARIANTS[pos]]


def _table1_work(ctx: Context) -> list[list[Load]]:
    """One IG attack per cell of Table I."""
    ig = attack_load(ctx.config, "inverting-gradients")
    return [[ig] for _ in table1_units(ctx.config)]


@experiment(
    "cvb/table1-ignore",
    on=("position", "attacked"),
    row_keys=("position", "attacked", "ssim", "asr"),
    config=cvb_config(
        ATTACK,
        TRAINING,
        ci={"positions": (3,)},
        paper={"positions": (3, 2)},
        sources={"positions": "Table I: PRECODE at positions 3 and 2"},
    ),
    reference=reference_rows(
        ("position", "attacked", "asr"),
        (0, "all", 0.9688),
        (3, "all", 0.0),
        (3, "without decoder", 0.0),
        (3, "without classifier", 0.0),
        (3, "without decoder and later", 0.8594),
        (2, "all", 0.0),
        (2, "without classifier", 0.0),
        (2, "without conv3", 0.0),
        (2, "without decoder", 0.0),
        (2, "without decoder and conv3", 0.0),
        (2, "without decoder and later", 0.0781),
    ),
    reference_source="CVB paper, Table I (ASR as a fraction; its SSIMs are lost in our copy)",
    datasets=("cifar10",),
    work=_table1_work,
)
def table1_ignore(ctx: Context) -> dict[str, Any]:
    """CVB Table I: which gradients the attack reads versus its success, PRECODE at positions 3 and 2.

    IG (the authors' TV 0.1 for this CNN) on the CNN without PRECODE, then on PRECODE (Table II's) at
    each position reading the gradients of :func:`ignore_variants` — at position 2 also the
    two variants that leave out conv3. Victims: client 0's training images
    (:func:`~.cvb_data.load_victims`, named in the record's ``data``). Rows:
    ``position`` (0 = no PRECODE), ``attacked`` (the variant) and
    :func:`~.cvb_quality.quality_row`'s columns (``ssim``, ``asr``, ``psnr``,
    ``mse``, each mean with its ``_std``, min–max rescaled) with ``pictures``
    (the first :data:`~.cvb_common.FIGURE_IMAGES` victims and their
    reconstructions: the chapter's grid). Data: ``cifar10``. One unit per row
    (:func:`table1_units`).

    Why the record's full ignore attack succeeds more often than the paper's
    (position 2 here; positions 3, 2 and 1 in Table II's record) is open. Ruled
    out, each measured on the first 8 of the authors' own 128 CIFAR-10
    training victims (``data/victim_datasets/CIFAR10_128.tdump`` in
    dAI-SY-Group/ConvolutionalVariationalBottleneck, brought back from their
    normalisation to [0, 1]) with 2,000 steps of this loop, one freshly drawn
    network per seed (2026-11-27):

    * the victims: SSIM 0.71–0.74 and ASR 100 % at position 3 (seeds 0–2),
      0.41–0.48 and 25–50 % at position 2 (seeds 0–2), 0.51–0.78 and
      62–100 % at position 1 (seeds 0–4) — as strong as on the offline sample;
    * the network's weight draw: none of those draws comes near the paper's
      85.9 %, 7.8 % and 0.78 %;
    * the KL term: PRECODE's authors add β·KL to the victim's loss
      (dAI-SY-Group/PRECODE, ``src/attack.py``, ``get_gradient``); added to
      the victim's update alone, at PRECODE's β = 1e-3, it changed nothing
      (position 1, seeds 0 and 1: SSIM 0.52 and 0.70, against 0.51 and 0.70
      without it). The records of 2026-11-27 hold it in both updates
      (:func:`leakagelib.losses.client_loss`): against the earlier ones,
      Table I's position 3 went from 100 % to 97 %, Table II's position 1
      from 88 % to 53 %.

    The attack loop, TV weight, SSIM and success threshold follow the
    authors' code (:mod:`.cvb_common`), which has no PRECODE to compare
    with; with CVB at position 3 their own attack code, run here, is as
    strong as ours, where the paper's Figure 9 is weaker (:mod:`.cvb_hyperparams`).
    """
    ig = partial(cvb_attack, "inverting-gradients", ctx.config)
    victims = load_victims(ctx, "cifar10")

    def unit(cell: tuple[int, str]) -> list[dict[str, Any]]:
        position, label = cell
        if position == 0:
            case, result = run_attack(ctx, cnn(seed=ctx.seed), victims, ig(include=None))
        else:
            model = cnn({**PRECODE_TABLE2, "position": position}, seed=ctx.seed)
            include = ignore_variants(model, position)[label]
            case, result = run_attack(ctx, model, victims, ig(include=include),
                                      offset=VARIANT_NAMES.index(label))  # fmt: skip
        return [quality_row(case, result, position=position, attacked=label,
                            pictures=FIGURE_IMAGES)]  # fmt: skip

    return with_victims(ctx, ctx.units(table1_units(ctx.config), unit, "Table I"), ["cifar10"])


@experiment(
    "cvb/table2-placement",
    on=("position",),
    row_keys=("position", "parameters", "ssim", "asr", "accuracy"),
    config=cvb_config(
        ATTACK,
        TRAINING,
        ci={"positions": (0, 3, 2, 1)},
        paper={"positions": (0, 3, 2, 1)},
        sources={"positions": "Table II: no PRECODE (0), then positions 3, 2, 1"},
    ),
    reference=reference_rows(
        ("position", "parameters", "ssim", "asr", "accuracy"),
        (0, 65_962, None, 0.9688, None),
        (3, 72_106, 0.63, 0.8594, None),
        (2, 104_362, 0.23, 0.0781, 0.6280),
        (1, 141_226, None, 0.0078, 0.6024),
    ),
    reference_source=(
        "CVB paper, Table II (CIFAR-10; ASR and accuracy as fractions; values lost in our "
        "copy are absent; position 2's ASR is Table I's ignore attack at position 2)"
    ),
    datasets=("cifar10",),
    work=lambda ctx: [
        [attack_load(ctx.config, "inverting-gradients"), *training_loads(ctx, "cifar10")]
        for _ in ctx.config.positions
    ],
)
def table2_placement(ctx: Context) -> dict[str, Any]:
    """CVB Table II: PRECODE at each position — added parameters, privacy (ignore attack) and accuracy.

    PRECODE with K = C/2 and no biases (which reproduces the table's parameter
    counts exactly), attacked by IG (TV 0.1, the authors' for this CNN) reading the gradients before its
    decoder. Rows: ``position`` (0 = baseline), ``parameters`` (total),
    ``added`` (by PRECODE), :func:`~.cvb_quality.quality_row`'s columns
    (``ssim``, ``asr``, ``psnr``, ``mse``, and ``pictures``: the first victims and
    their reconstructions), ``accuracy``.
    Victims: client 0's training images (named in the record's ``data``).
    Data: ``cifar10``. One unit per position.

    Where the record (32 victims, ``--set victims=32``; 2026-11-27, with
    PRECODE's β·KL in the update, 16 min) parts from the paper: at position
    1 its ignore attack reaches SSIM 0.48 and ASR 53 %, where the paper's
    reaches ASR 0.78 % (the earlier record, on the cross-entropy's gradient
    alone: 0.66 and 88 %). The leak is PRECODE's encoder, a fully connected
    layer on conv1's output whose weight gradient holds that output up to a
    factor per row (the first-layer leak of an MLP, one layer in). Measured
    before the update held the term, on 8 victims with 2,000 IG steps, seed
    0: the ignore attack reaches SSIM 0.62 (ASR 75 %); without the encoder's
    gradient, 0.14 (ASR 0). The paper's ignore attack reads the encoder too
    (§III-B, Eq. 4: only the decoder and later layers are left out), so this
    does not explain its number; the authors' code has no PRECODE
    configuration to compare with. Their victims and other weight draws do
    not explain it either (:func:`table1_ignore`'s docstring).
    """
    ig = partial(cvb_attack, "inverting-gradients", ctx.config)
    victims = load_victims(ctx, "cifar10")

    def unit(position: int) -> list[dict[str, Any]]:
        spec = None if position == 0 else {**PRECODE_TABLE2, "position": position}
        model = cnn(spec, seed=ctx.seed)
        case, result = run_attack(ctx, model, victims, ig(include=attack_layers(model)))
        total = sum(p.numel() for p in model.parameters())
        accuracy = fedavg_accuracy(ctx, cnn(spec, seed=ctx.seed), "cifar10")
        return [quality_row(case, result, position=position, parameters=total,
                            added=n_added(model), accuracy=accuracy,
                            pictures=FIGURE_IMAGES)]  # fmt: skip

    return with_victims(ctx, ctx.units(ctx.config.positions, unit, "Table II"), ["cifar10"])
