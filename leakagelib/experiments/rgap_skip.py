"""Skip connections and rank (Zhu & Blaschko 2021, Appendices D and E): Table 4 and Figure 6.

``rgap/table4-resnet101`` counts RA-i per block of ResNet-101 (base width 16)
and its two variants of Appendix E, and of every network with one skip
connection cut — counting only, no training and no attack (the paper's
accuracy and MSE stand beside it as its reference). ``rgap/fig6-skip-dlg``
attacks Figure 6's three pairs of networks, each with and without a skip
connection, with DLG. Chapter "Rank analysis" shows both.
"""

from __future__ import annotations

from functools import partial

import torch
from torch import nn

from .. import records
from ..models import build
from ..models.resnet101 import BLOCKS
from ..models.rgap_nets import skip_net
from ..rgap import dlg_logistic, rank_analysis
from .config import ScaleConfig
from .registry import Context, experiment
from .rgap_common import DATASETS, PICTURES, labels_mu_negative, logistic_case, victims
from .work import LBFGS_EVALUATIONS, Load, Net

TABLE4_CONFIG = ScaleConfig(
    ci={"width": 16, "single_cuts": True},
    paper={"width": 16, "single_cuts": True},
    sources={
        "width": "Table 4's caption: 'ResNet101 with base width 16'",
        "single_cuts": "Appendix E: 'It is not possible to decrease the RA-i by cutting a single "
        "skip connection': the run counts every one of the 33 single cuts (counting is cheap, "
        "so at both scales)",
    },
)

#: Table 4's networks: ResNet-101 and its variants (Appendix E): Variant 1 cuts the third
#: residual block's skip connection, Variant 2 the first's.
TABLE4_VARIANTS: tuple[tuple[str, tuple[int, ...]], ...] = (
    ("resnet101", ()),
    ("variant1", (3,)),
    ("variant2", (1,)),
)


def _two_figures(value: int) -> float:
    """``value`` rounded to two significant figures, as Table 4 prints RA-i (−1.4×10⁴)."""
    return float(f"{value:.2g}")


def _table4_reference(model: str, cut: tuple[int, ...], acc: float, mse: float, std: float) -> dict:
    """A row of Table 4: RA-i −1.4×10⁴ (two figures), accuracy and IG's MSE, as printed."""
    return {
        "model": model,
        "cut_skip": list(cut),
        "ra_i": -1.4e4,
        "ra_i_2sf": -1.4e4,
        "critical": None,
        "local_max": None,
        "accuracy": acc,
        "mse": mse,
        "mse_std": std,
    }


def _resnet101(width: int, cut: tuple[int, ...]) -> nn.Module:
    """Table 4's ResNet-101 (CIFAR-10 inputs, ten classes) with the skips of ``cut`` removed."""
    return build("resnet101", in_shape=DATASETS["cifar10"], num_classes=10, width=width,
                 cut_skip=cut)  # fmt: skip


def _counted(width: int, cut: tuple[int, ...]) -> dict:
    """RA-i, critical layer and the largest local deficiency of one ResNet-101 variant."""
    analysis = rank_analysis(_resnet101(width, cut), DATASETS["cifar10"])
    worst = max(analysis.layers, key=lambda layer: layer.local)
    return {
        "cut_skip": list(cut),
        "ra_i": analysis.ra_i,
        "ra_i_2sf": _two_figures(analysis.ra_i),
        "critical": analysis.critical,
        "local_max": worst.local,
        "local_max_layer": worst.name,
        "layers": analysis.rows(),
    }


@experiment(
    "rgap/table4-resnet101",
    on=("model",),
    row_keys=("model", "cut_skip", "ra_i", "ra_i_2sf", "critical", "local_max"),
    config=TABLE4_CONFIG,
    reference=[
        _table4_reference("resnet101", (), 0.9104, 0.96, 0.091),
        _table4_reference("variant1", (3,), 0.9036, 1.8, 0.14),
        _table4_reference("variant2", (1,), 0.9016, 1.3, 0.14),
    ],
    reference_source="Table 4 of Zhu & Blaschko (2021), Appendix E: RA-i (two significant "
    "figures), accuracy on the validation set after 200 epochs on CIFAR-10 and the MSE of "
    "Inverting Gradients' reconstructions (mean ± std) of ResNet-101 (base width 16) and its "
    "two variants",
    datasets=("cifar10",),
    work=lambda ctx: [
        [
            Load(
                Net(
                    "resnet101 (Table 4)",
                    partial(_resnet101, ctx.config.width, ()),
                    DATASETS["cifar10"],
                ),
                "forward",
                1,
                len(TABLE4_VARIANTS) + (sum(BLOCKS) if ctx.config.single_cuts else 0),
            ),
        ]
    ],  # fmt: skip
)
def table4_resnet101(ctx: Context) -> dict:
    """Table 4: the rank analysis of ResNet-101 (base width 16) and its two variants, per block.

    Rows: model ("resnet101"; "variant1", the third bottleneck block's skip
    cut; "variant2", the first's), cut_skip, ra_i (the network's, exact),
    ra_i_2sf (rounded to two significant figures as Table 4 prints it),
    critical (layer), local_max (the largest ``|x|`` − ``|W|`` − ``|z|`` over layers,
    before virtual constraints) and local_max_layer, layers (every layer's or
    residual unit's counts, :meth:`~leakagelib.rgap.rank.RankAnalysis.rows`).
    ``single_cuts`` (with the setting of that name): for each of the 33 blocks,
    RA-i and the critical layer of the network with only that block's skip
    cut. Counting needs no data and no training: the networks are built on
    CIFAR-10's 3×32×32 inputs (:func:`~leakagelib.models.resnet101.build_resnet101`);
    Table 4's accuracy and MSE are the paper's, not run here.
    """
    width = ctx.config.width
    rows = [{"model": name, **_counted(width, cut)} for name, cut in TABLE4_VARIANTS]
    out: dict = {"rows": rows}
    if ctx.config.single_cuts:
        cuts = [{"cut": i, **_counted(width, (i,))} for i in range(1, sum(BLOCKS) + 1)]
        out["single_cuts"] = [
            {key: c[key] for key in ("cut", "ra_i", "ra_i_2sf", "critical")} for c in cuts
        ]
    return out


FIG6_CONFIG = ScaleConfig(
    ci={"victims": 2, "dlg_steps": 3, "crop": 16},
    paper={"victims": 10, "dlg_steps": 300, "crop": 32},
    sources={
        "victims": "Figure 6 shows one image per network; the first 10 CIFAR-10 test images (ours)",
        "dlg_steps": "DLG's 300 L-BFGS iterations of lr 1 (Zhu et al. 2019's code, "
        "mit-han-lab/dlg), as rgap/table3-rank; the paper names no count for Figure 6",
        "crop": "CIFAR-10's 32×32 (Figure 6's images); at ci the top-left 16×16 of each image, "
        "so that the six DLG runs take seconds (ours)",
    },
)

#: Figure 6's three rows, constructed (the diagrams are not in the paper's text nor in the
#: authors' code): the inner widths of a :class:`~leakagelib.models.rgap_nets.SkipBlock` of
#: 3×3 convolutions on the image's 3 channels — one layer skipped; a bottleneck of one
#: channel (rank-deficient without its skip); two full-rank layers through 8 channels.
FIG6_NETWORKS: dict[str, tuple[int, ...]] = {"one-layer": (), "bottleneck": (1,), "wide": (8,)}


def _fig6_reference(row: int, model: str, skip: bool, full_rank: bool | None) -> dict:
    """What Figure 6's caption says of one network: whether the data are fully recoverable."""
    return {"row": row, "model": model, "skip": skip, "ra_i": None, "critical": None,
            "full_rank": full_rank, "mse": None, "mse_std": None, "recovered": None}  # fmt: skip


def _fig6_shape(ctx: Context) -> tuple[int, int, int]:
    """3 × crop × crop: the input of Figure 6's networks in this run."""
    return (DATASETS["cifar10"][0], ctx.config.crop, ctx.config.crop)


def _fig6_work(ctx: Context) -> list[list[Load]]:
    """Per network: every image's DLG run (one after another)."""
    cfg, shape = ctx.config, _fig6_shape(ctx)
    return [
        [Load(Net(f"{name} skip={skip} (Figure 6)",
                  partial(skip_net, shape, 10, widths, skip=skip), shape),
              "attack", 1, cfg.victims * cfg.dlg_steps * LBFGS_EVALUATIONS)]
        for name, widths in FIG6_NETWORKS.items() for skip in (True, False)
    ]  # fmt: skip


@experiment(
    "rgap/fig6-skip-dlg",
    on=("row", "skip"),
    row_keys=(
        "row",
        "model",
        "skip",
        "ra_i",
        "critical",
        "full_rank",
        "mse",
        "mse_std",
        "recovered",
    ),  # fmt: skip
    config=FIG6_CONFIG,
    reference=[
        _fig6_reference(1, "one-layer", True, None),
        _fig6_reference(1, "one-layer", False, None),
        _fig6_reference(2, "bottleneck", True, True),
        _fig6_reference(2, "bottleneck", False, False),
        _fig6_reference(3, "wide", True, True),
        _fig6_reference(3, "wide", False, True),
    ],
    reference_source="Figure 6 of Zhu & Blaschko (2021), Appendix D (images only, no numbers): "
    "row 1, a skip over one layer has no impact on DLG's reconstruction; row 2, a skip over a "
    "rank-deficient bottleneck makes the network full rank and the data fully recoverable, the "
    "plain bottleneck does not; row 3, both networks are full rank, the skip marginally better",
    datasets=("cifar10",),
    work=_fig6_work,
)
def fig6_skip_dlg(ctx: Context) -> list[dict]:
    """Figure 6: DLG on three networks with and without a skip connection.

    Rows: row (of Figure 6), model (a :data:`FIG6_NETWORKS` key), skip, ra_i
    and critical (rank analysis: the block counted as one residual unit with
    its skip, as plain layers without), full_rank (RA-i ≤ 0), mse and mse_std
    (DLG: mean and standard deviation over images of the per-image MSE,
    reconstruction clamped to [0, 1]), recovered (the share of images with
    MSE ≤ 1e-4, where Table 3's caption says reconstructions can barely be told
    from the data), mse_per_image, n, pictures (the first victims and DLG's
    reconstructions). DLG is :func:`~leakagelib.rgap.dlg_logistic`
    (L-BFGS, lr 1, label given, R-GAP's logistic loss, U(0, 1) start as
    ``rgap/table3-rank``, the objective divided by the update's norm so that
    L-BFGS's tolerances do not stop it on these small updates) on each image
    alone. Untrained float64 networks (:func:`~leakagelib.models.rgap_nets.skip_net`,
    one logit) seeded with the run's seed, labels with μ < 0. One unit per network.
    """
    shape, crop = _fig6_shape(ctx), ctx.config.crop
    x = victims(ctx, "cifar10", ctx.config.victims)[:, :, :crop, :crop].contiguous()
    rows = {name: i + 1 for i, name in enumerate(FIG6_NETWORKS)}

    def unit(key: tuple[str, bool]) -> list[dict]:
        name, skip = key
        torch.manual_seed(ctx.seed)
        model = skip_net(shape, 1, FIG6_NETWORKS[name], skip=skip, name=name).double()
        model = model.to(ctx.device)
        case = logistic_case(ctx, model, x, labels_mu_negative(model, x))
        analysis = rank_analysis(model, shape)
        errors, found_images = [], []
        for i in range(len(x)):
            update = {k: v[i : i + 1] for k, v in case.updates.items()}
            found = dlg_logistic(model, update, case.labels[i : i + 1], input_shape=shape,
                                 steps=ctx.config.dlg_steps, generator=ctx.generator(1 + i),
                                 init="uniform", relative=True)  # fmt: skip
            rec = found.inputs().detach().double().clamp(0, 1).cpu()
            errors.append(float((rec - x[i : i + 1].cpu()).pow(2).mean()))
            found_images.append(rec)
        err = torch.tensor(errors, dtype=torch.float64)
        return [{
            "row": rows[name], "model": name, "skip": skip, "ra_i": analysis.ra_i,
            "critical": analysis.critical, "full_rank": analysis.ra_i <= 0,
            "mse": float(err.mean()), "mse_std": float(err.std()) if len(err) > 1 else 0.0,
            "recovered": float((err <= 1e-4).double().mean()), "mse_per_image": errors,
            "n": len(errors),
            "pictures": records.pictures(x.cpu(), torch.cat(found_images), PICTURES),
        }]  # fmt: skip

    keys = [(name, skip) for name in FIG6_NETWORKS for skip in (True, False)]
    return ctx.units(keys, unit, "Figure 6")
