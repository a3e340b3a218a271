"""The Bayes paper's Figure 7 (Balunović et al., ICLR 2022, A.6): the Bayes attack with k
Monte-Carlo samples of the δ-ball per step, and how fast each k converges.

It shares the scenario of Tables 2 and 5 (:mod:`.bayes_tables`, :func:`~.bayes_scenario.scenario`):
``bayes-cnn`` at initialisation, the first victims of the training split, each its own client,
here behind Gaussian noise. The chapter "Bayes versus heuristics under defenses" runs it.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .. import records
from ..attacks import Attack, preset
from ..defenses import GaussianNoise
from .bayes_scenario import SCENARIO, scenario
from .bayes_tables import SHOWN
from .bayes_work import fig7_work
from .case import Case, build_case
from .config import ScaleConfig
from .registry import Context, experiment

__all__ = ["FIG7", "fig7_mc_samples"]

FIG7 = ScaleConfig(
    ci={"victims": 6, "steps": 30, "mc_samples": (1, 4, 16), "delta": 9.0, "noise": 0.1,
        "beta": 0.1, **SCENARIO.ci},
    paper={"victims": 100, "steps": 200, "mc_samples": (1, 2, 4, 8, 16), "delta": 9.0,
           "noise": 0.1, "beta": 0.1, **SCENARIO.paper},
    sources={"victims": "A.6: '100 different sampled images'", "steps": "Table 2's attack",
             "mc_samples": "Fig. 7; ci: three of its five", "delta": "A.6: δ = 9.0 on 28×28 inputs (scaled by "
             "√(pixels / 784) on others)", "noise": "A.6: Gaussian noise σ = 0.1",
             "beta": "ours: the Bayes preset's default", **SCENARIO.sources},
)  # fmt: skip


def _psnr_curves(case: Case, attack: Attack, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """Every victim's PSNR after every step of ``attack`` on ``case`` (``steps × victims``), and
    the attack's reconstructions."""
    curves: list[Tensor] = []

    def record(step: int, x: Tensor) -> None:
        rec = case.normalizer.denormalize(x[0, :, 0, 0].cpu())  # setting 0, restart 0, input 0
        curves.append(case.score_images(rec, "psnr"))

    result = case.attack(attack, generator=generator, callback=record)
    return torch.stack(curves), case.reconstructions(result)


@experiment(
    "bayes/fig7-mc-samples",
    row_keys=("k", "psnr"),
    config=FIG7,
    reference_source="Fig. 7 of Balunović et al. (ICLR 2022), a figure without numbers",
    datasets=("mnist",),
    work=fig7_work,
)
def fig7_mc_samples(ctx: Context) -> list[dict]:
    """Bayes paper Fig. 7: PSNR per attack step for k Monte-Carlo samples (k ∈ ``mc_samples``).

    The MNIST network at initialisation, Gaussian noise, the Bayes attack with
    δ = 9 on 28×28 inputs (A.6; scaled by √(pixels / 784) on other sizes, so
    that the ball covers the same share of each pixel). Every k starts from
    the same initial images (common random numbers: with a seed per k the
    spread between initialisations hides the effect of k). One unit per k.
    Rows: ``k``, ``delta``, ``psnr`` (final, mean over the victims),
    ``psnr_mean`` (mean over the steps: the area under the curve, which grows
    with faster convergence), both per image (``psnr_per_image``,
    ``psnr_mean_per_image``), ``curve`` (the victims' mean PSNR per step), and
    ``pictures`` (the first :data:`SHOWN` victims and the final reconstructions).
    """
    cfg = ctx.config
    model, victims = scenario(ctx, "mnist", 0, cfg.victims)
    defense = GaussianNoise(cfg.noise)
    case = build_case(
        model, *victims, defense=defense, generator=ctx.generator(7), device=ctx.device
    )
    delta = cfg.delta * math.sqrt(math.prod(case.input_shape) / 784.0)

    def unit(k: int) -> list[dict]:
        attack = preset("bayes", likelihood=defense.likelihood(), beta=cfg.beta, steps=cfg.steps,
                        mc_samples=k, delta=delta)  # fmt: skip
        curves, found = _psnr_curves(case, attack, ctx.generator(70))
        final, area = curves[-1], curves.mean(0)
        return [{"k": k, "delta": delta, "psnr": float(final.mean()), "psnr_mean": float(area.mean()),
                 "psnr_per_image": final.tolist(), "psnr_mean_per_image": area.tolist(),
                 "curve": curves.mean(1).tolist(),
                 "pictures": records.pictures(case.images, found, SHOWN)}]  # fmt: skip

    return ctx.units(cfg.mc_samples, unit, "fig7")
