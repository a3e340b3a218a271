"""Twin data (Zhu & Blaschko 2021, Appendix B, Figure 5): two inputs, one update.

With μ > 0 the equation μ·ℓ'(μ) = ⟨∇w, w⟩ has two roots; R-GAP follows both
and finds the image and its *twin*, which produces exactly the same update.
``rgap/twin-data`` checks this on CNN6, ``rgap/twin-dlg`` shows DLG ending on
the image or on its twin depending on where it starts. Chapter "Twin data"
shows both.
"""

from __future__ import annotations

from functools import partial

import torch
from torch import Tensor

from .. import metrics
from ..gradients import client_update
from ..models.rgap_nets import conv_stack
from ..rgap import dlg_logistic, rgap
from ..rgap.recursive import RGAPDetails
from .case import Case
from .config import ScaleConfig
from .registry import Context, experiment
from .rgap_common import (
    DATASETS,
    labels_mu_negative,
    logistic_case,
    solve_net,
    stack_model,
    victims,
    zoo_model,
)
from .work import LBFGS_EVALUATIONS, Load, Net


def _errors(found: RGAPDetails, x: Tensor) -> list[float]:
    """Each μ-candidate's MSE to the real image ``x``."""
    return [float(metrics.mse(c.to(x), x)) for c in found.candidates]


def _update_distance(case: Case, image: Tensor) -> float:
    """‖g(image) − g‖ / ‖g‖: how far ``image``'s update is from the case's (one) update."""
    update = {k: v[0] for k, v in case.updates.items()}
    other = client_update(case.model, image, case.labels.to(image.device), loss="logistic")
    norm = torch.sqrt(sum((g**2).sum() for g in update.values()))
    diff = torch.sqrt(sum(((other[k] - update[k]) ** 2).sum() for k in update))
    return float(diff / norm)


@experiment(
    "rgap/twin-data",
    row_keys=("candidate", "mu", "mse", "scale", "update_distance"),
    datasets=("cifar10",),
    work=lambda ctx: [[Load(solve_net(DATASETS["cifar10"], "cnn6"), "solve", 1)]],
)
def twin_data(ctx: Context) -> list[dict]:
    """Appendix B: with μ > 0 two values of μ fit the update — the image and its twin.

    Rows (one per root): candidate ("real" or "twin"), mu, mse (to the real
    image), scale (least-squares factor from the real image to the candidate),
    update_distance (relative ℓ2 distance between the candidate's update and
    the observed one: zero for both).
    """
    shape = DATASETS["cifar10"]
    x = victims(ctx, "cifar10", 1)
    model = zoo_model(ctx, "cnn6", shape)
    case = logistic_case(ctx, model, x, -labels_mu_negative(model, x))  # the label with μ > 0
    found = rgap(case.model, case.updates, case.labels, input_shape=shape).details[0]
    errors = _errors(found, x)
    real = min(range(len(errors)), key=errors.__getitem__)
    rows = []
    for i, (mu, cand) in enumerate(zip(found.mus, found.candidates, strict=True)):
        cand = cand.to(x)
        rows.append(
            {
                "candidate": "real" if i == real else "twin",
                "mu": mu,
                "mse": errors[i],
                "scale": float((cand * x).sum() / (x * x).sum()),
                "update_distance": _update_distance(case, cand),
            }
        )
    return rows


#: Relative distance (‖·−x‖/‖x‖) within which ``rgap/twin-dlg`` says DLG's end has converged
#: to the real image or the twin; chapter "Twin data" glues it.
CONVERGED_WITHIN = 1e-2

TWIN_DLG_CONFIG = ScaleConfig(
    ci={
        "mu": 2.0,
        "ray_starts": (0.1, 0.2, 0.3, 0.45, 0.6, 0.8, 1.0, 1.3),
        "start_noise": 0.2,
        "random_starts": 3,
        "dlg_steps": 20,
    },
    paper={
        "mu": 2.0,
        "ray_starts": tuple(round(0.05 * i, 2) for i in range(1, 31)),
        "start_noise": 0.2,
        "random_starts": 10,
        "dlg_steps": 300,
    },
    sources={
        "mu": "μ = y·f(x) above μ* ≈ 1.28, as on a confident (trained) network, so the twin "
        "is Figure 5's dimmer copy (ours)",
        "ray_starts": "Figure 5 (right) starts DLG along the ray through the image; this grid "
        "of t is ours",
        "start_noise": "Gaussian noise of 0.2·std(x) added to each ray start (ours)",
        "random_starts": "DLG's own N(0, 1) starts (ours: 10)",
        "dlg_steps": "DLG's 300 L-BFGS iterations (Zhu et al. 2019's code)",
    },
)


def _twin_case(ctx: Context) -> tuple[Case, Tensor]:
    """Bias-free logistic regression on one 8×8 digit with μ = ``mu``; and R-GAP's twin."""
    x = victims(ctx, "digits", 1)
    shape = tuple(x.shape[1:])
    model = stack_model(ctx, shape, (), "logreg")
    with torch.no_grad():
        model.fc.weight.mul_(ctx.config.mu / model(x).abs().item())
        y = 1 if model(x).item() > 0 else -1
    case = logistic_case(ctx, model, x, torch.tensor([y], device=ctx.device))
    found = rgap(case.model, case.updates, case.labels, input_shape=shape).details[0]
    errors = _errors(found, x)
    return case, found.candidates[max(range(len(errors)), key=errors.__getitem__)].to(x)


def _starts(ctx: Context, x: Tensor) -> Tensor:
    """t·x plus noise for every ray start t, then DLG's random N(0, 1) starts."""
    cfg, shape = ctx.config, tuple(x.shape[1:])
    gen = ctx.generator(5)
    noise = torch.randn((len(cfg.ray_starts), *shape), generator=gen, dtype=x.dtype).to(x.device)
    ray = torch.tensor(cfg.ray_starts, dtype=x.dtype, device=x.device).reshape(-1, 1, 1, 1) * x
    random = torch.randn((cfg.random_starts, *shape), generator=gen, dtype=x.dtype).to(x.device)
    return torch.cat([ray + cfg.start_noise * x.std() * noise, random])


def _twin_dlg_work(ctx: Context) -> list[list[Load]]:
    """One L-BFGS run of ``dlg_steps`` steps on one 8×8 image per start (one unit)."""
    cfg = ctx.config
    shape = (1, 8, 8)
    net = Net("logistic regression 1×8×8", partial(conv_stack, shape, 10, (), name="logreg"), shape)
    runs = len(cfg.ray_starts) + cfg.random_starts
    return [[Load(net, "attack", 1, cfg.dlg_steps * LBFGS_EVALUATIONS)] * runs]


def _distance(a: Tensor, b: Tensor) -> float:
    """‖a − b‖ / ‖b‖ for one image each."""
    return float((a - b).flatten(1).norm(dim=1) / b.norm())


@experiment(
    "rgap/twin-dlg",
    row_keys=("start", "t", "start_real", "start_twin", "end_real", "end_twin", "converged"),
    config=TWIN_DLG_CONFIG,
    datasets=("digits",),
    work=_twin_dlg_work,
)
def twin_dlg(ctx: Context) -> list[dict]:
    """Appendix B, Figure 5 (right): DLG converges to the real image or its twin, by its start.

    A bias-free logistic-regression model (one linear layer, the smallest
    network with twin data and one on which DLG converges reliably) on one of
    scikit-learn's 8×8 digits at both scales (the twin is a property of the
    model's μ, not of the image size), its weights scaled so that μ = ``mu``.
    R-GAP gives the twin (the other root of μ); DLG
    (:func:`~leakagelib.rgap.hgap.dlg_logistic`, L-BFGS, label given, the
    objective divided by ‖g‖²) then starts from t·x plus Gaussian noise of
    ``start_noise``·std(x) for every t of ``ray_starts``, and from DLG's own
    N(0, 1) start, one L-BFGS per start: the batched loop would sum the
    starts' objectives into one L-BFGS problem, and a diverging start would
    stall the others.

    Rows: start ("ray" or "random"), t (NaN for random), start_real,
    start_twin, end_real, end_twin (relative ℓ2 distances ‖·−x‖/‖x‖ and
    ‖·−x̃‖/‖x̃‖ before and after DLG), converged ("real", "twin" or "neither":
    within :data:`CONVERGED_WITHIN`), twin_scale. Chapter "Twin data" plots these.
    """
    case, twin = _twin_case(ctx)
    x = case.images.to(twin)
    starts = _starts(ctx, x)
    ts = ctx.config.ray_starts
    rows = []
    for i, start in enumerate(starts):
        end = dlg_logistic(
            case.model,
            case.updates,
            case.labels,
            input_shape=case.input_shape,
            steps=ctx.config.dlg_steps,
            initial=start[None],
            relative=True,
        ).inputs()
        end = end.to(x)
        end_real, end_twin = _distance(end, x), _distance(end, twin)
        converged = "neither"
        if min(end_real, end_twin) < CONVERGED_WITHIN:
            converged = "real" if end_real < end_twin else "twin"
        rows.append(
            {
                "start": "ray" if i < len(ts) else "random",
                "t": float(ts[i]) if i < len(ts) else float("nan"),
                "start_real": _distance(start[None], x),
                "start_twin": _distance(start[None], twin),
                "end_real": end_real,
                "end_twin": end_twin,
                "converged": converged,
                "twin_scale": float((twin * x).sum() / (x * x).sum()),
            }
        )
    return rows
