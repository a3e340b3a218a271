"""Experiments of R-GAP (Zhu & Blaschko 2021): Table 1, Table 3, Figure 4, Appendices B, F, G.

Every experiment attacks untrained networks in float64 with R-GAP's logistic
loss. As in the authors' code (JunyiZhu-AI/R-GAP, ``main.py``), the model is
initialised after seeding and the label is chosen so that μ < 0 (then μ is
unique), except in ``rgap/twin-data``, which picks the other label on purpose.
Chapters "Closed-form attacks", "Rank analysis" and "Twin data" show these.
"""

from __future__ import annotations

import time

import torch
from torch import Tensor, nn

from ..gradients import client_update, per_sample_updates
from ..models import build
from ..models.rgap_nets import CNN6_LAYERS, conv_stack
from ..rgap.hgap import dlg_logistic, hgap, rgap_then_dlg
from ..rgap.rank import rank_analysis
from ..rgap.recursive import rgap
from .registry import Context, experiment

#: Table 1's datasets with their input shapes.
DATASETS = {"cifar10": (3, 32, 32), "mnist": (1, 28, 28)}


def _model(ctx: Context, name: str, in_shape: tuple[int, int, int], offset: int = 0) -> nn.Module:
    torch.manual_seed(ctx.seed + offset)
    return build(name, in_shape=in_shape, num_classes=1).double().to(ctx.device)


def _labels_mu_negative(model: nn.Module, images: Tensor) -> Tensor:
    """Labels y ∈ {−1, +1} with y·f(x) < 0, the authors' choice that makes μ unique."""
    with torch.no_grad():
        out = model(images).reshape(-1)
    return torch.where(out > 0, -1, 1).long()


def _images(ctx: Context, dataset: str, n: int) -> Tensor:
    return ctx.dataset(dataset, n=n).images.double().to(ctx.device)


def _mse(a: Tensor, b: Tensor) -> Tensor:
    return ((a.to(b.dtype) - b) ** 2).flatten(1).mean(dim=1)


def _rgap_many(model: nn.Module, updates: dict, labels: Tensor, in_shape, **options):
    """R-GAP on each stacked update (each image's sparse systems differ; no batching)."""
    out, seconds = [], []
    for i in range(labels.shape[0]):
        res = rgap(
            model,
            {k: v[i] for k, v in updates.items()},
            int(labels[i]),
            in_shape=in_shape,
            **options,
        )
        out.append(res.image.to(labels.device))
        seconds.append(res.seconds)
    return torch.cat(out), seconds


@experiment("rgap/table1", row_keys=("dataset", "model", "attack", "mse", "seconds"))
def table1(ctx: Context) -> list[dict]:
    """Table 1: R-GAP, DLG, H-GAP and R-GAP → DLG on CNN6 and CNN6-d at initialisation (MSE).

    Rows: dataset, model, attack ("rgap", "dlg", "hgap", "rgap→dlg"), mse (mean
    over images), mse_std, seconds (per image), n. DLG (label given, i.e. iDLG)
    runs ``ctx.pick(ci=4, paper=300)`` L-BFGS steps on all images at once;
    R-GAP → DLG runs as many steps from R-GAP's output (the paper reports it
    in Table 2 only).
    """
    n = ctx.pick(ci=1, paper=100)
    steps = ctx.pick(ci=4, paper=300)
    rows = []
    for dataset, shape in DATASETS.items():
        x = _images(ctx, dataset, n)
        for name in ("cnn6", "cnn6-d"):
            model = _model(ctx, name, shape)
            y = _labels_mu_negative(model, x)
            updates = per_sample_updates(model, x, y, loss="logistic")
            rec_rgap, secs = _rgap_many(model, updates, y, shape)
            start = time.perf_counter()
            rec_dlg = dlg_logistic(
                model, updates, y, in_shape=shape, steps=steps, generator=ctx.generator(1)
            ).to(x)
            dlg_secs = (time.perf_counter() - start) / n
            rec_hgap, _ = hgap(rec_rgap, rec_dlg)
            start = time.perf_counter()
            rec_both = rgap_then_dlg(
                model, updates, y, rec_rgap, in_shape=shape, steps=steps, generator=ctx.generator(1)
            ).to(x)
            both_secs = (time.perf_counter() - start) / n
            for attack, rec, sec in (
                ("rgap", rec_rgap, sum(secs) / n),
                ("dlg", rec_dlg, dlg_secs),
                ("hgap", rec_hgap, sum(secs) / n + dlg_secs),
                ("rgap→dlg", rec_both, sum(secs) / n + both_secs),
            ):
                err = _mse(rec, x)
                rows.append(
                    {
                        "dataset": dataset,
                        "model": name,
                        "attack": attack,
                        "mse": float(err.mean()),
                        "mse_std": float(err.std()) if n > 1 else 0.0,
                        "seconds": sec,
                        "n": n,
                    }
                )
    return rows


#: Figure-2 style architectures (conv layers as (channels, kernel, stride, padding)).
RANK_ARCHITECTURES: dict[str, tuple[tuple[int, int, int, int], ...]] = {
    "cnn6": CNN6_LAYERS,
    "cnn6-d": (CNN6_LAYERS[0], (20, 3, 2, 1), *CNN6_LAYERS[2:]),
    "wide": tuple((2 * c, k, s, p) for c, k, s, p in CNN6_LAYERS),
    "deficient-early": ((4, 4, 2, 2), *CNN6_LAYERS[1:]),
    "deficient-middle": (*CNN6_LAYERS[:2], (4, 3, 1, 1), *CNN6_LAYERS[3:]),
}


@experiment("rgap/table3-rank", row_keys=("model", "ra_i", "local_deficiency", "mse"))
def table3_rank(ctx: Context) -> list[dict]:
    """Table 3: RA-i and the exact local rank deficiency against R-GAP's MSE.

    Rows: model, ra_i, critical (layer), local_deficiency (largest unknowns −
    exact rank of a layer's own constraints; positive: R-GAP cannot fully
    recover), mse (R-GAP, mean over images), n.
    """
    n = ctx.pick(ci=1, paper=100)
    shape = DATASETS["cifar10"]
    x = _images(ctx, "cifar10", n)
    rows = []
    for name, layers in RANK_ARCHITECTURES.items():
        torch.manual_seed(ctx.seed)
        model = conv_stack(shape, 1, layers, name=name).double().to(ctx.device)
        analysis = rank_analysis(model, shape, exact=True, image=x[:1])
        y = _labels_mu_negative(model, x)
        updates = per_sample_updates(model, x, y, loss="logistic")
        rec, _ = _rgap_many(model, updates, y, shape)
        rows.append(
            {
                "model": name,
                "ra_i": analysis.ra_i,
                "critical": analysis.critical,
                "local_deficiency": analysis.local_deficiency,
                "mse": float(_mse(rec, x).mean()),
                "n": n,
            }
        )
    return rows


@experiment("rgap/twin-data", row_keys=("candidate", "mu", "mse", "scale", "update_distance"))
def twin_data(ctx: Context) -> list[dict]:
    """Appendix B: with μ > 0 two values of μ fit the update — the image and its twin.

    Rows (one per root): candidate ("real" or "twin"), mu, mse (to the real
    image), scale (least-squares factor from the real image to the candidate),
    update_distance (relative ℓ2 distance between the candidate's update and
    the observed one: zero for both).
    """
    shape = DATASETS["cifar10"]
    x = _images(ctx, "cifar10", 1)
    model = _model(ctx, "cnn6", shape)
    y = -_labels_mu_negative(model, x)  # the label with μ > 0
    update = client_update(model, x, y, loss="logistic")
    res = rgap(model, update, int(y[0]), in_shape=shape)
    norm = torch.sqrt(sum((g**2).sum() for g in update.values()))
    rows = []
    errors = [float(_mse(c.to(x), x)) for c in res.candidates]
    real = min(range(len(errors)), key=errors.__getitem__)
    for i, (mu, cand) in enumerate(zip(res.mus, res.candidates, strict=True)):
        cand = cand.to(x)
        twin_update = client_update(model, cand, y, loss="logistic")
        diff = torch.sqrt(sum(((twin_update[k] - update[k]) ** 2).sum() for k in update))
        rows.append(
            {
                "candidate": "real" if i == real else "twin",
                "mu": mu,
                "mse": errors[i],
                "scale": float((cand * x).sum() / (x * x).sum()),
                "update_distance": float(diff / norm),
            }
        )
    return rows


@experiment("rgap/fig4-resnet-skip", row_keys=("variant", "cut_skip", "ra_i", "critical"))
def fig4_resnet_skip(ctx: Context) -> list[dict]:
    """Figure 4: RA-i of ResNet-18 (base width 16) and its two skip-cut variants.

    Rows: variant, cut_skip, ra_i, critical. Cutting the third block's skip
    (the critical one) raises RA-i; cutting the eighth does not. Training the
    three networks and attacking them with Inverting Gradients is not part of
    this experiment yet.
    """
    rows = []
    for variant, cut in (("resnet18", ()), ("variant1", (3,)), ("variant2", (8,))):
        model = build(
            "resnet18",
            in_shape=DATASETS["cifar10"],
            num_classes=10,
            width=16,
            stem="cifar",
            norm="batch",
            cut_skip=cut,
        )
        analysis = rank_analysis(model, DATASETS["cifar10"])
        rows.append(
            {
                "variant": variant,
                "cut_skip": list(cut),
                "ra_i": analysis.ra_i,
                "critical": analysis.critical,
            }
        )
    return rows


@experiment("rgap/appF-batch", row_keys=("batch_size", "fit_residual"))
def appf_batch(ctx: Context) -> list[dict]:
    """Appendix F: R-GAP on a batch update of FCN3 returns a linear combination of the images.

    Rows: batch_size, fit_residual (relative residual of the best linear
    combination of the batch's images to R-GAP's output; ~0 means it is one),
    coefficients. Fully connected layers use gradient constraints only, as in
    the authors' code.
    """
    shape = DATASETS["mnist"]
    rows = []
    for size in (2, 5):
        x = _images(ctx, "mnist", size)
        model = _model(ctx, "fcn3", shape)
        y = _labels_mu_negative(model, x)
        update = client_update(model, x, y, loss="logistic")
        res = rgap(model, update, 1, in_shape=shape, fc_weight_constraints=False)
        basis = x.flatten(1).T
        target = res.image.to(x).flatten()
        coef = torch.linalg.lstsq(basis, target.unsqueeze(1)).solution.squeeze(1)
        residual = (basis @ coef - target).norm() / target.norm()
        rows.append(
            {"batch_size": size, "fit_residual": float(residual), "coefficients": coef.tolist()}
        )
    return rows


@experiment("rgap/appG-noise", row_keys=("model", "noise", "mse"))
def appg_noise(ctx: Context) -> list[dict]:
    """Appendix G: R-GAP's error under Gaussian gradient noise, CNN6 against a wider CNN6.

    Rows: model ("cnn6", "wide": every layer twice as wide), noise (standard
    deviation relative to each layer's gradient RMS), mse (mean over images).
    MNIST-sized inputs; the structured solver averages the noise over each
    layer's gradient rows, of which a wider layer has more.
    """
    shape = DATASETS["mnist"]
    n = ctx.pick(ci=1, paper=20)
    x = _images(ctx, "mnist", n)
    levels = ctx.pick(ci=(0.0, 1e-4, 1e-2), paper=(0.0, 1e-6, 1e-4, 1e-3, 1e-2))
    rows = []
    for name in ("cnn6", "wide"):
        torch.manual_seed(ctx.seed)
        model = conv_stack(shape, 1, RANK_ARCHITECTURES[name], name=name).double().to(ctx.device)
        y = _labels_mu_negative(model, x)
        updates = per_sample_updates(model, x, y, loss="logistic")
        gen = ctx.generator(2)
        for level in levels:
            noisy = {
                k: g
                + level
                * g.pow(2).flatten(1).mean(dim=1).sqrt().reshape(-1, *[1] * (g.dim() - 1))
                * torch.randn(g.shape, generator=gen, dtype=g.dtype).to(g.device)
                for k, g in updates.items()
            }
            try:
                rec, _ = _rgap_many(model, noisy, y, shape)
                mse = float(_mse(rec, x).mean())
            except ValueError:  # noise pushed <∇w, w> below the range of μ·ℓ'(μ)
                mse = float("nan")
            rows.append({"model": name, "noise": level, "mse": mse})
    return rows


@experiment(
    "rgap/table2-lenet",
    row_keys=(
        "model",
        "cond_conv1",
        "cond_conv2",
        "cond_conv3",
        "mse_dlg",
        "mse_rgap",
        "mse_rgap_dlg",
    ),
)
def table2_lenet(ctx: Context) -> list[dict]:
    """Table 2: condition numbers of LeNet's convolutions; MSE of DLG, R-GAP and R-GAP → DLG.

    Rows: model ("lenet": sigmoid, "lenet-leaky": LeakyReLU 0.2), cond_conv1..3
    (condition number of each convolution's stacked constraints [W; K], mean
    over images), mse_dlg, mse_rgap, mse_rgap_dlg (DLG started from R-GAP's
    output, the same number of steps as DLG), n. R-GAP's copy of DLG's LeNet:
    bias-free, one logit, PyTorch's initialisation, 1×28×28 (see
    ``leakagelib.models.dlg_nets``).
    """
    n = ctx.pick(ci=1, paper=100)
    steps = ctx.pick(ci=4, paper=300)
    shape = DATASETS["mnist"]
    x = _images(ctx, "mnist", n)
    rows = []
    for name in ("lenet", "lenet-leaky"):
        torch.manual_seed(ctx.seed)
        model = build(name, in_shape=shape, num_classes=1, bias=False, init="torch")
        model = model.double().to(ctx.device)
        y = _labels_mu_negative(model, x)
        updates = per_sample_updates(model, x, y, loss="logistic")
        conds, recs = [], []
        for i in range(n):
            res = rgap(
                model,
                {k: v[i] for k, v in updates.items()},
                int(y[i]),
                in_shape=shape,
                diagnostics=True,
            )
            conds.append([layer.condition for layer in res.layers[:3]])
            recs.append(res.image.to(x))
        rec_dlg = dlg_logistic(
            model, updates, y, in_shape=shape, steps=steps, generator=ctx.generator(1)
        ).to(x)
        rec_rgap = torch.cat(recs)
        rec_both = rgap_then_dlg(
            model, updates, y, rec_rgap, in_shape=shape, steps=steps, generator=ctx.generator(1)
        ).to(x)
        cond = torch.tensor(conds, dtype=torch.float64).mean(dim=0)
        rows.append(
            {
                "model": name,
                "cond_conv1": float(cond[0]),
                "cond_conv2": float(cond[1]),
                "cond_conv3": float(cond[2]),
                "mse_dlg": float(_mse(rec_dlg, x).mean()),
                "mse_rgap": float(_mse(rec_rgap, x).mean()),
                "mse_rgap_dlg": float(_mse(rec_both, x).mean()),
                "n": n,
            }
        )
    return rows
