"""Experiments of the CVB paper (Scheliga, Mäder, Seeland): PRECODE analysed, CVB proposed.

Protocol (CVB paper §V, with values from the authors' code, dAI-SY-Group/
ConvolutionalVariationalBottleneck): the attacked model is the *untrained*
network (``ckpt: 0`` in ``configs/attacks/*.yaml``); each victim image is
attacked on its own, labels known. Inverting Gradients (IG): cosine distance,
TV weight 0.01 (0.1 for the CVB CNN, ``configs/models/CNNCVB.yaml``), Adam with
lr 1 on the signed gradient, N(0, 1) initialisation, iterates clipped to the
image box; iDLG: ℓ2 distance, L-BFGS; CPL: ℓ2 distance, L-BFGS, CPL's
patterned initialisation. Against PRECODE and CVB the "ignore" attack reads
only the gradients before the first stochastic decoder (§III-B). SSIM and
the ASR (share of images with SSIM ≥ 0.5) use min–max rescaled images, as the
authors' ``Scaled*`` metrics do. Utility is the test accuracy of FedAvg
training (:func:`leakagelib.fl.federated_averaging`).

At ci scale everything is small (two images, 100 IG or 2×20 L-BFGS steps,
one or two short federated rounds on the embedded stand-ins); MNIST is
brought to the authors' 3×32×32 (resized, grey channel repeated). At paper
scale: 128 victim images (the authors' victim sets), 20,000 IG iterations
(early stopping is not modelled: the step budget is fixed), 300 rounds with
patience 40.

The chapter "Variational bottlenecks" (``book/variational_bottlenecks.ipynb``)
runs Tables II–IV and Fig. 9 at ci scale beside the paper's numbers, and
builds its own analyses from :func:`attack_ssim`, :func:`gradient_trace` and
:func:`side_by_side`. At ci scale each of these experiments takes under a
minute on one CPU core (Table III about 15 s, Table V about a minute), because
every image's attack and every shared update run as one vectorised program.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .. import analysis, data, metrics, models
from ..attacks import Attack, image_bounds
from ..attacks.attack import Include
from ..attacks.presets import cpl, idlg, inverting_gradients
from ..defenses import DPSGD, GradientCompression, GradientDefense, NoDefense, epsilon_spent
from ..defenses.bottlenecks import bottlenecks
from ..defenses.surgery import apply_bottleneck_option, attacked_parameters
from ..fl import federated_averaging
from ..gradients import Update
from .registry import Context, experiment

SHAPE = (3, 32, 32)
#: Table III's attacks by preset id (:data:`leakagelib.attacks.PRESETS`), as its rows name them.
ATTACKS = ("idlg", "cpl", "inverting-gradients")


# ----------------------------------------------------------------------------- plumbing


def victims(
    ctx: Context, logical: str, n: int, *, split: str = "test"
) -> tuple[Tensor, Tensor, data.Normalizer]:
    """``n`` images of ``logical`` as the authors feed them: 3×32×32 in [0, 1], and a normaliser.

    Grey datasets are resized to 32×32 and their channel repeated three times
    (``configs/data/MNIST.yaml``: shape [3, 32, 32]).
    """
    images, labels, norm = ctx.dataset(logical, n=n, split=split)
    images, norm = _to_rgb32(images, norm)
    return images, labels, norm


def _to_rgb32(images: Tensor, norm: data.Normalizer) -> tuple[Tensor, data.Normalizer]:
    if images.shape[-2:] != (32, 32):
        images = F.interpolate(images, size=(32, 32), mode="bilinear", align_corners=False).clamp(
            0, 1
        )
    if images.shape[1] == 1:
        images = images.repeat(1, 3, 1, 1)
        norm = data.Normalizer(mean=norm.mean * 3, std=norm.std * 3)
    return images, norm


def attack_preset(ctx: Context, attack: str, *, tv: float, include: Include) -> Attack:
    """iDLG, CPL or Inverting Gradients as the CVB authors configure them (steps scaled at ci).

    ``attack`` is a preset id of :data:`ATTACKS`; ``include`` restricts the
    likelihood to those parameters (the ignore attack; ``None``: all). Labels
    are known (the paper's protocol). Inverting Gradients: TV weight ``tv``,
    signed Adam with the authors' learning rate 1 (``configs/attacks/IG.yaml``)
    at both scales — with the ci budget of 100 steps it is also the stronger
    choice (undefended SSIM 0.38 / 0.47 on the MNIST / CIFAR-10 stand-ins
    against 0.24 / 0.24 with lr 0.1), so the ci run does not understate the
    attack that CVB is measured against. iDLG (box-constrained) and CPL: the ℓ2
    distance as a Gaussian likelihood with σ = 1, L-BFGS with lr 0.01 (0.1 at
    ci); ``tv`` is not used.
    """
    if attack == "inverting-gradients":
        steps = ctx.pick(ci=100, paper=20_000)
        return inverting_gradients(steps=steps, lr=1.0, tv=tv, include=include)
    lbfgs = {"steps": ctx.pick(ci=2, paper=2_000), "lr": ctx.pick(ci=0.1, paper=0.01),
             "sigma": 1.0, "labels": "given", "include": include}  # fmt: skip
    if attack == "idlg":
        return idlg(box=True, **lbfgs)
    if attack == "cpl":
        return cpl(**lbfgs)
    raise ValueError(f"unknown attack {attack!r}; use one of {ATTACKS}")


def attack_ssim(
    ctx: Context,
    model: nn.Module,
    images: Tensor,
    labels: Tensor,
    norm: data.Normalizer,
    *,
    attack: str = "inverting-gradients",
    include: Sequence[str] | None = None,
    defense: GradientDefense | None = None,
    tv: float = 0.01,
    offset: int = 0,
    steps: int | None = None,
    lr: float | None = None,
    callback: Callable[[int, Tensor], None] | None = None,
) -> tuple[Tensor, Tensor]:
    """(SSIM per image, reconstructions in [0, 1]) of ``attack`` on ``model``'s updates.

    ``include`` restricts the likelihood to those parameter names (the
    ignore attack); by default a model with a bottleneck is attacked with
    :func:`leakagelib.defenses.surgery.attacked_parameters`. Every image is
    its own client and shares its update through ``defense`` (default
    :class:`~leakagelib.defenses.NoDefense`). ``steps`` and ``lr``
    override :func:`attack_preset`'s values for this scale (the chapter's
    widgets run short attacks); ``callback(step, iterates)`` sees every
    iterate, as in :func:`leakagelib.attacks.reconstruct`. Every experiment
    of this module attacks through it, and so does the chapter "Variational
    bottlenecks".
    """
    shared = NoDefense() if defense is None else defense
    ssim, recon, _ = _attack(ctx, model, images, labels, norm, attack=attack, include=include,
                             defense=shared, tv=tv, offset=offset, steps=steps, lr=lr,
                             callback=callback)  # fmt: skip
    return ssim, recon


def _attack(
    ctx: Context,
    model: nn.Module,
    images: Tensor,
    labels: Tensor,
    norm: data.Normalizer,
    *,
    attack: str,
    include: Sequence[str] | None,
    defense: GradientDefense,
    tv: float,
    offset: int,
    steps: int | None,
    lr: float | None,
    callback: Callable[[int, Tensor], None] | None,
) -> tuple[Tensor, Tensor, Update]:
    """:func:`attack_ssim`, also returning the shared (stacked) updates the attack saw."""
    model = model.to(ctx.device)
    gen = ctx.generator(offset)
    torch.manual_seed(ctx.seed + offset)
    x = norm.normalize(images).to(ctx.device)
    y = labels.to(ctx.device)
    observed = defense.share(model, x, y, gen, per_image=True)  # one client per image
    if include is None and bottlenecks(model):
        include = attacked_parameters(model)
    chosen = attack_preset(ctx, attack, tv=tv, include=include)
    if steps is not None:
        chosen = chosen.with_config(steps=steps)
    if lr is not None:
        chosen = chosen.with_config(lr=lr)
    result = chosen(
        model, observed, labels=y, input_shape=tuple(images.shape[1:]),
        bounds=image_bounds(norm.mean, norm.std), generator=gen, device=ctx.device,
        callback=callback,
    )  # fmt: skip
    recon = norm.denormalize(result.inputs().detach().cpu())
    return metrics.ssim_minmax(recon, images.cpu()), recon, observed


def gradient_trace(
    ctx: Context,
    model: nn.Module,
    images: Tensor,
    labels: Tensor,
    norm: data.Normalizer,
    *,
    steps: int = 40,
    tv: float = 0.01,
    include: Sequence[str] | None = None,
) -> dict[str, Tensor]:
    """CVB paper §III-A, Fig. 6: per-layer cosine(dummy, client gradient) along an IG attack.

    Runs Inverting Gradients for ``steps`` iterations on ``images`` (each its
    own client, as :func:`attack_ssim`), keeps the iterates of the first
    image and returns :func:`leakagelib.analysis.similarity_trace` against
    that image's shared update: ``{layer: tensor of steps similarities}``.
    Every dummy gradient is recomputed with fresh bottleneck noise, as the
    attack saw it. ``include`` defaults to *all* parameters (the plain attack
    of Fig. 6(a, b)); pass :func:`leakagelib.defenses.surgery.attacked_parameters`
    for the ignore attack of Fig. 6(c). TV weight 0.01 and 40 steps keep the
    chapter "Variational bottlenecks" fast; the figure's shape shows early.
    The similarities are computed on the CPU, so ``model`` is left there (moved
    in place, like the move to ``ctx.device`` that every attack here makes).
    """
    if include is None:
        include = [n for n, p in model.named_parameters() if p.requires_grad]
    iterates: list[Tensor] = []

    def keep(_step: int, x: Tensor) -> None:
        iterates.append(x[0, 0, 0, :1].cpu())  # setting 0, first update, restart 0: image 0

    _, _, observed = _attack(ctx, model, images, labels, norm, attack="inverting-gradients",
                             include=include, defense=NoDefense(), tv=tv, offset=0, steps=steps,
                             lr=None, callback=keep)  # fmt: skip
    target = {k: v[0].cpu() for k, v in observed.items()}
    return analysis.similarity_trace(model.cpu(), target, torch.cat(iterates), labels[:1].cpu())


def side_by_side(
    rows: Sequence[Mapping[str, Any]],
    paper: Mapping[tuple[Any, ...], Mapping[str, Any]],
    *,
    key: Sequence[str],
    columns: Sequence[str],
    record: Mapping[str, Any] | None = None,
    label: str = "ci",
) -> list[dict[str, Any]]:
    """The paper's numbers, a paper-scale record's and this run's, one row per ``key``.

    ``rows`` are this run's record rows, ``paper`` maps a tuple of ``key``
    values to the values a paper table prints (typed in by the chapter),
    ``record`` is a paper-scale record from ``results/`` or ``None``
    (:func:`leakagelib.records.paper_record`). Each output row holds the key
    and, per column ``c``, ``"c paper"``, ``"c paper-run"`` (only with a
    record) and ``"c ci"`` (``label``: this run's scale); missing values read "-".
    Keys appear in this run's order, then the paper's remaining ones. The
    chapter "Variational bottlenecks" prints these with
    :func:`leakagelib.reporting.format_table`.
    """

    def index(items: Sequence[Mapping[str, Any]]) -> dict[tuple[Any, ...], Mapping[str, Any]]:
        return {tuple(r[k] for k in key): r for r in items}

    ours, theirs = index(rows), index(record["rows"]) if record else {}
    keys = list(ours) + [k for k in paper if k not in ours]
    out = []
    for k in keys:
        row: dict[str, Any] = dict(zip(key, k, strict=True))
        sources = [("paper", paper.get(k, {}))]
        if record is not None:
            sources.append(("paper-run", theirs.get(k, {})))
        sources.append((label, ours.get(k, {})))
        for c in columns:
            for source, values in sources:
                value = values.get(c)
                row[f"{c} {source}"] = "-" if value is None else value
        out.append(row)
    return out


def fl_setup(ctx: Context) -> dict[str, Any]:
    """The federated protocol at this scale: clients, rounds, patience, training images used."""
    return {
        "clients": ctx.pick(ci=2, paper=10),
        "rounds": ctx.pick(ci=2, paper=300),
        "patience": ctx.pick(ci=None, paper=40),
        "n_train": ctx.pick(ci=256, paper=None),
        "batch_size": 64,
        "val_fraction": 0.1,
    }


def utility(
    ctx: Context, model: nn.Module, logical: str, *, defense: GradientDefense | None = None
) -> float:
    """Final test accuracy of FedAvg training of ``model`` on ``logical`` (the paper's protocol)."""
    setup = fl_setup(ctx)
    x, y, norm = ctx.dataset(logical, split="train")
    xt, yt, _ = ctx.dataset(logical, split="test")
    x, norm3 = _to_rgb32(x, norm)
    xt, _ = _to_rgb32(xt, norm)
    if setup["n_train"] is not None:
        x, y = x[: setup["n_train"]], y[: setup["n_train"]]
    result = federated_averaging(
        model, norm3.normalize(x).to(ctx.device), y.to(ctx.device),
        rounds=setup["rounds"], clients=setup["clients"], patience=setup["patience"],
        batch_size=setup["batch_size"], val_fraction=setup["val_fraction"],
        test=(norm3.normalize(xt).to(ctx.device), yt.to(ctx.device)), defense=defense, seed=ctx.seed,
    )  # fmt: skip
    accs = [h["test_accuracy"] for h in result.history]
    return float(accs[-1]) if accs else float("nan")


def client_epsilon(ctx: Context, dp: DPSGD, n_train: int) -> float:
    """ε (δ = dp.delta) one client spent: its own steps at sampling rate batch / its training set.

    ``dp.steps`` counts the steps of all clients, which each touch only their own data.
    """
    setup = fl_setup(ctx)
    n = n_train if setup["n_train"] is None else min(n_train, setup["n_train"])
    per_client = n / setup["clients"] * (1 - setup["val_fraction"])
    rate = min(1.0, setup["batch_size"] / per_client)
    return epsilon_spent(dp.noise_multiplier, rate, dp.steps // setup["clients"], dp.delta)


def cnn(ctx: Context, bottleneck: Any = None, **options: Any) -> nn.Module:
    """The CVB paper's CNN (seeded), optionally with a bottleneck spec."""
    torch.manual_seed(ctx.seed)
    model = models.build("cvb-cnn", in_shape=SHAPE, num_classes=10, **options)
    return apply_bottleneck_option(model, bottleneck, SHAPE)


def n_added(model: nn.Module) -> int:
    return sum(m.added_parameters for _, m in bottlenecks(model))


def _row(ssim: Tensor, **fields: Any) -> dict[str, Any]:
    return {**fields, "ssim": float(ssim.mean()), "ssim_std": float(ssim.std()) if ssim.numel() > 1 else 0.0,
            "asr": metrics.asr(ssim)}  # fmt: skip


CVB_DEFAULT = {"kind": "cvb", "position": 1, "kernel_size": 5, "beta": 0.1}
PRECODE_TABLE2 = {"kind": "precode", "K": "adaptive", "bias": False}


# ----------------------------------------------------------------------------- experiments


@experiment("cvb/table1-ignore", row_keys=("position", "attacked", "ssim", "asr"))
def table1_ignore(ctx: Context) -> list[dict]:
    """CVB Table I: which gradients the attack reads versus its success, PRECODE at positions 3 and 2.

    IG on all gradients, then the "ignore" variants: without the decoder only,
    without the classifier only, and without the decoder and every later layer
    (the paper's attack). Rows: ``position`` (0 = no PRECODE), ``attacked``
    (which variant), ``ssim`` (mean, min–max rescaled), ``ssim_std``, ``asr``.
    At ci scale only position 3. Data: ``cifar10`` (``patches`` at ci).
    """
    n = ctx.pick(ci=2, paper=128)
    images, labels, norm = victims(ctx, "cifar10", n)
    rows = []
    base = cnn(ctx)
    ssim, _ = attack_ssim(ctx, base, images, labels, norm, tv=0.01)
    rows.append(_row(ssim, position=0, attacked="all"))
    for position in ctx.track(ctx.pick(ci=(3,), paper=(3, 2)), "PRECODE positions"):
        model = cnn(ctx, {**PRECODE_TABLE2, "position": position})
        names = [n for n, p in model.named_parameters() if p.requires_grad]
        decoder = {n for n in names if n.startswith("precode.decoder.")}
        variants = {
            "all": names,
            "without decoder": [n for n in names if n not in decoder],
            "without classifier": [n for n in names if not n.startswith("head.")],
            "without decoder and later": attacked_parameters(model),
        }
        for i, (label, include) in enumerate(variants.items()):
            ssim, _ = attack_ssim(ctx, model, images, labels, norm, include=include, offset=i)
            rows.append(_row(ssim, position=position, attacked=label))
    return rows


@experiment("cvb/table2-placement", row_keys=("position", "parameters", "ssim", "asr", "accuracy"))
def table2_placement(ctx: Context) -> list[dict]:
    """CVB Table II: PRECODE at each position — added parameters, privacy (ignore attack) and accuracy.

    PRECODE with K = C/2 and no biases (which reproduces the table's parameter
    counts exactly). Rows: ``position`` (0 = baseline), ``parameters`` (total),
    ``added`` (by PRECODE), ``ssim``, ``ssim_std``, ``asr``, ``accuracy``.
    Data: ``cifar10`` (``patches`` at ci).
    """
    n = ctx.pick(ci=2, paper=128)
    images, labels, norm = victims(ctx, "cifar10", n)
    rows = []
    for position in ctx.track((0, 3, 2, 1), "positions"):
        spec = None if position == 0 else {**PRECODE_TABLE2, "position": position}
        model = cnn(ctx, spec)
        ssim, _ = attack_ssim(ctx, model, images, labels, norm)
        total = sum(p.numel() for p in model.parameters())
        acc = utility(ctx, cnn(ctx, spec), "cifar10")
        rows.append(
            _row(ssim, position=position, parameters=total, added=n_added(model), accuracy=acc)
        )
    return rows


@experiment("cvb/table3-attacks", row_keys=("dataset", "defense", "attack", "ssim", "asr"))
def table3_attacks(ctx: Context) -> list[dict]:
    """CVB Table III: iDLG, CPL and IG against the CNN without defense and with CVB, on MNIST and CIFAR-10.

    Rows: ``dataset``, ``defense`` ("none" or "cvb"), ``attack``, ``ssim``,
    ``ssim_std``, ``asr``, ``psnr`` (min–max rescaled, as the paper's
    supplementary tables). CPL's label regulariser is not modelled (its
    patterned initialisation and ℓ2 objective are). Data: ``mnist``,
    ``cifar10`` (``digits28``, ``patches`` at ci).
    """
    n = ctx.pick(ci=2, paper=128)
    rows = []
    for dataset in ("mnist", "cifar10"):
        images, labels, norm = victims(ctx, dataset, n)
        for defense, spec in (("none", None), ("cvb", CVB_DEFAULT)):
            model = cnn(ctx, spec)
            for i, attack in enumerate(ctx.track(ATTACKS, f"{dataset}/{defense}")):
                tv = 0.1 if spec else 0.01
                ssim, recon = attack_ssim(
                    ctx, model, images, labels, norm, attack=attack, tv=tv, offset=i
                )
                psnr = metrics.psnr_minmax(recon, images)
                rows.append(
                    _row(
                        ssim,
                        dataset=dataset,
                        defense=defense,
                        attack=attack,
                        psnr=float(psnr.mean()),
                    )
                )
    return rows


@experiment(
    "cvb/table4-defenses",
    row_keys=("dataset", "defense", "parameter", "ssim", "asr", "accuracy", "epsilon"),
)
def table4_defenses(ctx: Context) -> list[dict]:
    """CVB Table IV: DP-SGD noise levels, gradient compression rates, PRECODE sizes and CVB compared.

    DP-SGD clips each per-sample gradient to C = 1 and adds noise of multiplier
    σ (the parameter; the paper's values are lost in the extraction, these are
    ours; ε for δ = 1e-5 that one client spends over its training steps, Opacus
    RDP accountant); GC prunes the share p of every layer's smallest entries;
    PRECODE (β = 1e-3) sits at position 1 with size K; CVB as chosen in §VI-A.
    Perturbation defenses are attacked by IG on all gradients, model defenses
    by the ignore attack. Rows: ``dataset``, ``defense``, ``parameter``,
    ``ssim``, ``ssim_std``, ``asr``, ``psnr`` (min–max rescaled), ``accuracy``,
    ``epsilon`` (None except DP), ``added`` (bottleneck parameters).
    Data: ``mnist``, ``cifar10`` (stand-ins at ci).
    """
    n = ctx.pick(ci=2, paper=128)
    noise = ctx.pick(ci=(0.1, 1.0), paper=(0.01, 0.1, 0.5, 1.0))
    rates = ctx.pick(ci=(0.9,), paper=(0.5, 0.9, 0.99))
    sizes = ctx.pick(ci=(32,), paper=(32, 64, 128, 256, 512))
    datasets = ctx.pick(ci=("cifar10",), paper=("mnist", "cifar10"))
    rows = []
    for dataset in datasets:
        images, labels, norm = victims(ctx, dataset, n)
        _, train_labels, _ = ctx.dataset(dataset, split="train")
        train_n = len(train_labels)
        # (name, parameter, bottleneck spec, the gradient defense's constructor)
        configs: list[tuple[str, Any, Any, Callable[[], GradientDefense]]] = [
            ("none", None, None, NoDefense)
        ]
        configs += [("dp", s, None, partial(DPSGD, s, 1.0)) for s in noise]
        configs += [("gc", p, None, partial(GradientCompression, p)) for p in rates]
        configs += [
            ("precode", k, {"kind": "precode", "position": 1, "K": k}, NoDefense) for k in sizes
        ]
        configs += [("cvb", "k=5,s=0.5,beta=0.1", CVB_DEFAULT, NoDefense)]
        for i, (name, parameter, spec, make) in enumerate(ctx.track(configs, dataset)):
            model = cnn(ctx, spec)
            tv = 0.1 if spec else 0.01
            ssim, recon = attack_ssim(
                ctx, model, images, labels, norm, defense=make(), tv=tv, offset=i
            )
            psnr = float(metrics.psnr_minmax(recon, images).mean())
            trained = make()  # a fresh privacy ledger for the training run
            acc = utility(ctx, cnn(ctx, spec), dataset, defense=trained)
            epsilon = client_epsilon(ctx, trained, train_n) if name == "dp" else None
            rows.append(_row(ssim, dataset=dataset, defense=name, parameter=parameter, accuracy=acc, epsilon=epsilon,
                             psnr=psnr, added=n_added(model)))  # fmt: skip
    return rows


@experiment("cvb/fig9-hyperparams", row_keys=("study", "value", "ssim", "asr", "accuracy"))
def fig9_hyperparams(ctx: Context) -> list[dict]:
    """CVB Fig. 9: CVB position, kernel size, bottleneck scale and β versus privacy and accuracy.

    One study varies one hyper-parameter around the chosen CVB (position 1,
    k = 5, scale 0.5, β = 0.1). Rows: ``study`` ("position", "kernel",
    "scale", "beta"), ``value``, ``added`` parameters, ``ssim``, ``ssim_std``,
    ``asr``, ``accuracy``. Data: ``cifar10`` (``patches`` at ci).
    """
    n = ctx.pick(ci=2, paper=128)
    images, labels, norm = victims(ctx, "cifar10", n)
    studies: list[tuple[str, Any, dict[str, Any]]] = []
    for pos in ctx.pick(
        ci=((1,), (3,)), paper=((1,), (2,), (3,), (1, 2), (1, 3), (2, 3), (1, 2, 3))
    ):
        studies.append(("position", ",".join(map(str, pos)), {"position": list(pos)}))
    for k in ctx.pick(ci=(1, 5), paper=(1, 3, 5, 7)):
        studies.append(("kernel", k, {"kernel_size": k}))
    for s in ctx.pick(ci=(0.25, 1.0), paper=(0.125, 0.25, 0.5, 1.0, 2.0, 4.0)):
        studies.append(("scale", s, {"scale": s}))
    for b in ctx.pick(ci=(1e-3, 1.0), paper=(1e-4, 1e-3, 1e-2, 1e-1, 1.0)):
        studies.append(("beta", b, {"beta": b}))
    rows = []
    for i, (study, value, change) in enumerate(ctx.track(studies, "CVB hyper-parameters")):
        spec = {**CVB_DEFAULT, **change}
        model = cnn(ctx, spec)
        ssim, _ = attack_ssim(ctx, model, images, labels, norm, tv=0.1, offset=i)
        acc = utility(ctx, cnn(ctx, spec), "cifar10")
        rows.append(_row(ssim, study=study, value=value, added=n_added(model), accuracy=acc))
    return rows


def _architecture(ctx: Context, name: str, cvb: bool) -> nn.Module:
    """The CNN, ResNet-18 or ViT of Table V, with the paper's CVB placement when ``cvb``."""
    torch.manual_seed(ctx.seed)
    if name == "cnn":
        return cnn(ctx, CVB_DEFAULT if cvb else None)
    if name == "resnet18":
        model = models.build(
            "resnet18", in_shape=SHAPE, num_classes=10, width=ctx.pick(ci=8, paper=64)
        )
        spec = {"kind": "cvb", "position": "layer1", "kernel_size": 5, "beta": 5e-5}
    else:
        size = ctx.pick(ci={"depth": 2, "hidden": 64, "heads": 4, "mlp_width": 64}, paper={})
        model = models.build("vit-small", in_shape=SHAPE, num_classes=10, **size)
        spec = {"kind": "cvb", "position": "block1", "kernel_size": 3, "beta": 0.1}
    return apply_bottleneck_option(model, spec if cvb else None, SHAPE)


@experiment(
    "cvb/table5-architectures", row_keys=("dataset", "model", "defense", "ssim", "asr", "accuracy")
)
def table5_architectures(ctx: Context) -> list[dict]:
    """CVB Table V: CNN, ResNet-18 and ViT with and without CVB (IG / ignore attack, accuracy).

    CVB after the ResNet's first residual stage (k = 5, β = 5e-5) and after the
    ViT's first block on tokens viewed as 16×16 grids (k = 3, β = 0.1), values
    from the authors' configs. At ci the ResNet has base width 8 and the ViT 2
    blocks of width 64. Rows: ``dataset``, ``model``, ``defense``, ``ssim``,
    ``ssim_std``, ``asr``, ``accuracy``. Data: ``cifar10`` (and ``mnist`` at
    paper scale).
    """
    n = ctx.pick(ci=2, paper=128)
    rows = []
    for dataset in ctx.pick(ci=("cifar10",), paper=("mnist", "cifar10")):
        images, labels, norm = victims(ctx, dataset, n)
        for name in ("cnn", "resnet18", "vit"):
            for cvb in (False, True):
                model = _architecture(ctx, name, cvb)
                ssim, _ = attack_ssim(ctx, model, images, labels, norm, tv=0.1 if cvb else 0.01)
                acc = utility(ctx, _architecture(ctx, name, cvb), dataset)
                rows.append(
                    _row(
                        ssim,
                        dataset=dataset,
                        model=name,
                        defense="cvb" if cvb else "none",
                        accuracy=acc,
                    )
                )
    return rows


@experiment("cvb/table7-bias", row_keys=("model", "bias", "accuracy"))
def table7_bias(ctx: Context) -> list[dict]:
    """CVB Table VII: accuracy of an MLP with and without biases, with and without PRECODE.

    The supplementary's MLP: four fully connected layers with batch norm and
    ReLU, then the classifier (its width is lost in the extraction; 512 at
    paper scale, 64 at ci); PRECODE (K = 256, β = 1e-3) before the classifier.
    Removing biases defeats the closed-form attack (which needs a bias
    gradient) at almost no cost in accuracy. Rows: ``model`` ("baseline" or
    "precode"), ``bias`` (bool), ``accuracy``. Data: ``cifar10``.
    """
    width = ctx.pick(ci=64, paper=512)
    rows = []
    for precode in (False, True):
        for bias in (True, False):
            torch.manual_seed(ctx.seed)
            model = models.build("mlp", in_shape=SHAPE, num_classes=10, widths=(width,) * 3, norm="batch",
                                 bias=bias, init="torch")  # fmt: skip
            spec = {"kind": "precode", "bias": bias} if precode else None
            model = apply_bottleneck_option(model, spec, SHAPE)
            rows.append({"model": "precode" if precode else "baseline", "bias": bias,
                         "accuracy": utility(ctx, model, "cifar10")})  # fmt: skip
    return rows


#: MedMNIST datasets of Table VI with the CVB kernel size the paper fixed for each (position 1).
MEDMNIST_KERNELS = {"pneumoniamnist": 5, "dermamnist": 3, "retinamnist": 3, "bloodmnist": 5}


@experiment("cvb/table6-medical", row_keys=("dataset", "defense", "ssim", "asr", "accuracy"))
def table6_medical(ctx: Context) -> dict[str, Any]:
    """CVB Table VI: the CNN with and without CVB on four MedMNIST datasets.

    MedMNIST is not embedded. Each dataset is found as :func:`leakagelib.data.load`
    finds it: a ``--data pneumoniamnist=PATH.npz`` override (this library's
    format; likewise ``dermamnist``, ``retinamnist``, ``bloodmnist``), else
    the MedMNIST release file ``NAME.npz`` under ``$LEAKAGELIB_DATA_ROOT``,
    which the ``medmnist`` package downloads there at paper scale (or with
    ``--download``) when the machine is online. Datasets that cannot be had
    are skipped and named in the record's ``data``; with none at all the run
    fails with those instructions (the chapter then shows the paper's table).
    CVB at position 1 with the paper's kernel size per dataset (5, 3, 3, 5).
    Rows: ``dataset``, ``defense``, ``ssim``, ``ssim_std``, ``asr``, ``accuracy``.
    """
    present, skipped = [], {}
    for name in MEDMNIST_KERNELS:
        try:
            ctx.dataset(name, n=1)
            present.append(name)
        except (FileNotFoundError, RuntimeError) as error:
            skipped[name] = f"skipped: {error}"
    if not present:
        raise RuntimeError(
            "cvb/table6-medical found none of the MedMNIST datasets "
            f"({', '.join(MEDMNIST_KERNELS)}). With network access: pip install medmnist, then "
            "reproduce with --download (the default at --scale paper); offline: put the "
            "release files NAME.npz under $LEAKAGELIB_DATA_ROOT, or pass --data NAME=PATH.npz "
            "(images uint8 N×C×H×W, labels)."
        )
    n = ctx.pick(ci=2, paper=128)
    rows = []
    for name in present:
        images, labels, norm = victims(ctx, name, n)
        _, train_labels, _ = ctx.dataset(name, split="train")
        classes = int(train_labels.max()) + 1
        for defense in ("none", "cvb"):
            spec = (
                {**CVB_DEFAULT, "kernel_size": MEDMNIST_KERNELS[name]} if defense == "cvb" else None
            )
            torch.manual_seed(ctx.seed)
            model = apply_bottleneck_option(models.build("cvb-cnn", SHAPE, classes), spec, SHAPE)
            ssim, _ = attack_ssim(ctx, model, images, labels, norm, tv=0.1 if spec else 0.01)
            torch.manual_seed(ctx.seed)
            fresh = apply_bottleneck_option(models.build("cvb-cnn", SHAPE, classes), spec, SHAPE)
            rows.append(
                _row(ssim, dataset=name, defense=defense, accuracy=utility(ctx, fresh, name))
            )
    return {"rows": rows, "data": skipped}
