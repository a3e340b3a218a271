"""Figure 1 of Zhu & Blaschko (2021): μ·ℓ'(μ) for the logistic, exponential and hinge losses.

For each loss the run gives the closed form's landmarks (its value at μ = 0,
the infimum on μ > 0 and where it lies, whether some value has two roots, the
twin of Appendix B), its curve on a grid of μ (the figure), and on a live CNN6
whether equation 10 holds (every layer's ⟨∇W_i, W_i⟩ equals μ·ℓ'(μ)) and what
R-GAP recovers when the client trains with that loss. Chapter "Closed-form
attacks" shows it.
"""

from __future__ import annotations

import numpy as np
import torch

from ..data import Normalizer
from ..losses import MARGIN_LOSSES
from ..rgap import rgap
from ..rgap.losses import margin_loss
from .case import build_case
from .config import ScaleConfig
from .registry import Context, experiment
from .rgap_common import DATASETS, labels_mu_negative, solve_net, victims, zoo_model
from .work import Load

FIG1_CONFIG = ScaleConfig(
    ci={"victims": 1, "mu_range": (-2.0, 6.0)},
    paper={"victims": 10, "mu_range": (-2.0, 6.0)},
    sources={
        "victims": "Figure 1 is analytic; the live check runs on the first 10 CIFAR-10 test "
        "images (ours)",
        "mu_range": "Figure 1 prints no axis range; μ from −2 to 6 shows each curve's minimum "
        "and tail (ours)",
    },
)

#: Points of the μ grid drawn per curve.
GRID_POINTS = 801


def _reference(loss: str, mu_star: float | None, twin: bool | None) -> dict:
    """What Figure 1's caption and §3.1.1 / Appendix B say of ``loss``'s μ·ℓ'(μ)."""
    return {"loss": loss, "at_zero": 0.0, "mu_star": mu_star, "c_min": None, "twin": twin,
            "eq10_spread": None, "mse": None}  # fmt: skip


def _landmarks(loss: str) -> dict:
    """The closed form's value at 0, its infimum on μ > 0 and whether a value has two roots."""
    spec = margin_loss(loss)
    below = spec.c_min / 2  # a value between the infimum and 0
    return {
        "loss": loss,
        "formula": spec.formula,
        "at_zero": spec.mu_dl_dmu(0.0) + 0.0,  # not −0.0
        "mu_star": spec.mu_star,
        "c_min": spec.c_min,
        "twin": len(spec.roots(below)) == 2,
    }


def _live(ctx: Context, loss: str, x: torch.Tensor) -> dict:
    """Equation 10's spread over CNN6's layers and R-GAP's MSE, clients training with ``loss``."""
    shape = DATASETS["cifar10"]
    model = zoo_model(ctx, "cnn6", shape)
    case = build_case(model, x, labels_mu_negative(model, x), Normalizer.identity(),
                      device=ctx.device, loss=loss)  # fmt: skip
    with torch.no_grad():
        mus = case.labels.to(x) * model(x.to(ctx.device)).reshape(-1).cpu()
    spec, spread = margin_loss(loss), 0.0
    for i, mu in enumerate(mus.tolist()):
        target = spec.mu_dl_dmu(mu)
        dots = [float((case.updates[n][i] * p.detach()).sum()) for n, p in model.named_parameters()]
        spread = max(spread, max(abs(d - target) for d in dots) / abs(target))
    result = rgap(model, case.updates, case.labels, input_shape=shape, loss=loss)
    return {"eq10_spread": spread, "mse": float(case.score(result, "mse").mean()), "n": len(x)}


@experiment(
    "rgap/fig1-losses",
    on=("loss",),
    row_keys=("loss", "at_zero", "mu_star", "c_min", "twin", "eq10_spread", "mse"),
    config=FIG1_CONFIG,
    reference=[
        _reference("logistic", None, True),
        _reference("exponential", None, True),
        _reference("hinge", 1.0, None),
    ],
    reference_source="Figure 1 of Zhu & Blaschko (2021), its caption (μ·ℓ'(μ) is 0 at μ = 0, "
    "then approaches 0⁻, or for the hinge loss equals 0 after decreasing to μ = 1) and §3.1.1 "
    "and Appendix B (two μ for one value, the twin, for the logistic loss and the monotonic "
    "convex losses of Bartlett et al.); the figure prints no other numbers",
    datasets=("cifar10",),
    work=lambda ctx: [
        [Load(solve_net(DATASETS["cifar10"], "cnn6"), "solve", ctx.config.victims)]
        for _ in MARGIN_LOSSES
    ],
)
def fig1_losses(ctx: Context) -> dict:
    """Figure 1: μ·ℓ'(μ) of the logistic, exponential and hinge losses, and R-GAP under each.

    Rows: loss, formula, at_zero (μ·ℓ'(μ) at μ = 0), mu_star and c_min (the
    infimum of μ·ℓ'(μ) on μ > 0 and where it lies; the hinge loss approaches
    −1 as μ → 1⁻), twin (whether a value between the infimum and 0 has two
    roots μ), eq10_spread (the largest relative difference between a layer's
    ⟨∇W_i, W_i⟩ and μ·ℓ'(μ) over CNN6's seven layers and the images),
    mse (R-GAP's mean MSE with ``loss=`` that loss, :mod:`leakagelib.rgap.losses`),
    n. ``curves``: ``mu`` (the grid) and per loss its μ·ℓ'(μ). Untrained
    float64 CNN6 with one logit, seeded with the run's seed, labels with μ < 0,
    images in [0, 1] (``cifar10``; ``patches`` at ci). One unit per loss.
    """
    x = victims(ctx, "cifar10", ctx.config.victims)
    grid = np.linspace(*ctx.config.mu_range, GRID_POINTS)
    curves = {"mu": grid.tolist()}
    for loss in MARGIN_LOSSES:
        curves[loss] = [margin_loss(loss).mu_dl_dmu(m) for m in grid]
    rows = ctx.units(MARGIN_LOSSES, lambda loss: [{**_landmarks(loss), **_live(ctx, loss, x)}],
                     "Figure 1")  # fmt: skip
    return {"rows": rows, "curves": curves}
