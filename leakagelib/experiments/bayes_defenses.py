"""Bayes paper §5–6 (Balunović et al., ICLR 2022): ATS, Soteria and PRECODE broken early in training.

* ``bayes/fig2-training``: the defense-aware attacks on ATS (Inverting
  Gradients on the augmented-trained ConvNet) and on Soteria (the layer-drop
  attack on ConvBig, :mod:`.bayes_soteria`) after given numbers of training
  steps (ATS) and epochs (Soteria) — their PSNR falls as training proceeds,
  so a defense must be evaluated throughout training (Fig. 2); the
  reconstructions after the 10th step are kept for Fig. 3, and ATS 7-4-15's
  after 5, 10, 20 and 50 steps for Fig. 6 (Appendix A.2).
* ``bayes/precode-mlp``: PRECODE on an MLP falls to the closed-form recovery
  of the first layer's input (Phong et al. 2017), which ignores the
  bottleneck (the paper reports PSNR > 150 dB; Fig. 3's PRECODE row).

Both are called by the chapter "Breaking heuristic defenses".

ATS's networks and the attack on them live in :mod:`.bayes_ats` (which says why ATS attacks
digits at ci scale), Soteria's in :mod:`.bayes_soteria`.
"""

from __future__ import annotations

from functools import cache, partial
from typing import Any

from torch import Tensor

from ..data import Normalizer
from ..defenses import Soteria
from ..fl import TrainResult
from ..records import image_lists
from .bayes_ats import ATS_STAND_IN, AtsScenario, ats_reconstructions, ats_scenario
from .bayes_fig2_records import NETWORK, curve_rows, record_networks, record_pictures
from .bayes_soteria import (
    SOTERIA_CI,
    SOTERIA_PAPER,
    SOTERIA_SOURCES,
    SOTERIA_STAND_IN,
    TRAIN_BATCH,
    convbig_fit,
    psnr_summary,
    soteria_attacks,
    trained_convbig,
)
from .bayes_training import epoch_rates, epoch_run, shared_epochs, stepwise_run
from .bayes_work import fig2_work
from .case import build_case
from .config import ScaleConfig, Settings
from .registry import Context, experiment
from .work import split_size

__all__ = [
    "FIG2",
    "fig2_training",
    "soteria_runs",
    "soteria_steps",
    "steps_per_epoch",
]

FIG2 = ScaleConfig(
    ci={
        "train_steps": (0, 10, 50),
        "fig3_step": 10,
        "fig3_victims": 3,
        "fig6_steps": (0, 10, 50),
        "soteria_epochs": (0, 3),
        "epoch_images": None,
        "ats_policies": ("7-4-15",),
        "ats_victims": 8,
        "ats_width": 16,
        "ats_attack_steps": 200,
        "ats_tv": 1e-5,
        "ats_signed": True,
        "soteria_victims": 3,
        **SOTERIA_CI,
    },
    paper={
        "train_steps": (0, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000),
        "fig3_step": 10,
        "fig3_victims": 40,
        "fig6_steps": (5, 10, 20, 50),
        "soteria_epochs": (0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10),
        "epoch_images": 50_000,
        "ats_policies": ("7-4-15", "21-13-3", "21-13-3+7-4-15"),
        "ats_victims": 10,
        "ats_width": 64,
        "ats_attack_steps": 2000,
        "ats_tv": 1e-5,
        "ats_signed": True,
        "soteria_victims": 10,
        **SOTERIA_PAPER,
    },
    sources={
        "train_steps": "§6, Fig. 2: ATS 'for the first 1000 steps of training', batch size 32 "
        "(A.1, A.2), 'measuring PSNR ... at every step': here steps 1, 2 and 5, then about "
        "two points per decade",
        "fig3_step": "Fig. 3: 'after the 10th training step'",
        "fig3_victims": "§6: 'Fig. 3 visualizes the first 40 reconstructed images' (per defense; "
        "attacked at fig3_step only, the curve's PSNR stays over the first ats_victims / "
        "soteria_victims); ci: ours",
        "fig6_steps": "A.2, Fig. 6 (a)–(d): reconstructions after 5, 10, 20 and 50 training steps "
        "with ATS 7-4-15; ci: every ci step, so that the figure starts before training",
        "soteria_epochs": "§6, Fig. 2: Soteria 'for the first 10 epochs' (each epoch: "
        "epoch_images in batches of 32), here after each epoch, each its own run "
        "(bayes_training); ci: 3, the shortest run whose schedule starts at lr 0.1 (a run of "
        "one epoch trains at 10⁻⁴ throughout, of two at 10⁻² then 10⁻⁴: 20.0 and 22.5 dB at "
        "ci against 19.9 dB untrained, seed 0, 2026-11-29)",
        "epoch_images": "the images in an epoch: CIFAR-10's training split (Krizhevsky 2009: "
        "50,000), so that ten epochs are the paper's 15,620 steps whatever stands for the data "
        "(the shared 500-image sample's training split cycles, as it does for ATS's 1,000 "
        "steps); ci: None, the stand-in's own training split",
        "ats_policies": "A.2: '7-4-15', '21-13-3', '21-13-3+7-4-15'",
        "ats_victims": "ours (10 CIFAR-10 images per defense; ci: 8 digits28 images, so that "
        "the fall's paired interval has images to stand on: module docstring)",
        "ats_width": "A.2, Table 4: ConvNet of width 64; ci: 16 (module docstring: on "
        "digits28, width 8 barely leaks before training)",
        "ats_attack_steps": "§6: 2000 attack iterations; ci: 200 (module docstring)",
        "ats_signed": "defense_attacks/ats/benchmark/comm.py lines 194–207: the 'inversed' "
        "config (cifar_attack.py --optim='inversed') runs inversefed with signed=True",
        "ats_tv": "§6, A.2: total variation 10⁻⁵ (defense_attacks/ats/benchmark/comm.py, "
        "config 'inversed'), in inversefed's convention (defense_attacks/ats/inversefed/"
        "metrics.py: mean absolute difference per direction), which the Inverting Gradients "
        "preset uses; ci: the paper's value",
        "soteria_victims": "ours (10 CIFAR-10 images per defense)",
        **SOTERIA_SOURCES,
    },
)


@experiment(
    "bayes/fig2-training",
    row_keys=("defense", "step", "psnr"),
    config=FIG2,
    datasets=("cifar10",),
    work=fig2_work,
)
def fig2_training(ctx: Context) -> dict:
    """Bayes Fig. 2: PSNR of the defense-aware attacks on ATS and Soteria as training proceeds.

    ATS: ConvNet trained with each augmentation policy and attacked after
    each of ``train_steps`` by Inverting Gradients (cosine, TV ``ats_tv``,
    Adam signed as in the authors' runs at paper scale) on the augmented
    images the client trains on (PSNR against those). Soteria: ConvBig
    trained without defense (A.1), defended on ``fc1`` and attacked by the
    layer-drop attack, the direct attack alongside, after each of
    :func:`soteria_steps` (the steps that end ``soteria_epochs``, and
    ``fig3_step``). One unit per (defense, training step): ATS's
    ``("ats 7-4-15", 10)``, ...; Soteria's ``("soteria", 10)``, ..., each
    followed by ``("soteria network", 10)``, ..., which measures how closely
    that ConvBig fits its training images and the victims (a pass over them,
    on the network the Soteria unit kept). Every
    network trains as the authors' did (:mod:`.bayes_training`): each ATS
    policy's ConvNet once, in the step-wise run whose steps its units attack;
    Soteria's ConvBig once per point (:func:`soteria_runs`), in its unit. Rows:
    ``defense`` ("ats 7-4-15", ..., "soteria", "soteria (direct attack)"),
    ``step``, ``epoch`` (the step over :func:`steps_per_epoch`; set again as
    the record is assembled, so units made under an earlier epoch length agree),
    ``psnr`` (mean dB), ``psnr_std``, ``psnr_per_image``. Extra entries:
    ``figure3``, per defense, the originals and reconstructions after
    ``fig3_step`` steps (Fig. 3: ``fig3_victims`` images, attacked at that step
    only; the row's PSNR stays over the curve's victims); ``figure6``, for the first ATS policy, one
    entry per step of ``fig6_steps`` (``step``, ``original``,
    ``reconstruction``: Fig. 6); ``networks``, per Soteria step in order, its
    network's fit (``step``, ``epoch`` and the fields of
    :func:`~.bayes_soteria.convbig_fit`); images as lists. The paper plots Fig. 2 without
    numbers, so there are no reference rows. Data: ``cifar10`` (at ci
    ``digits28`` for both defenses: the module docstring and
    :mod:`.bayes_soteria` say why).
    A command-line run keeps ConvBig's training and each attack's loop as it
    goes (:meth:`~.registry.Context.checkpoint`), so a unit killed halfway
    resumes there.
    """
    cfg = ctx.config
    ats = cache(partial(ats_scenario, ctx))
    runs = soteria_runs(ctx)

    def unit(key: tuple[str, int]) -> list[dict]:
        defense, step = key
        if defense in ("soteria", NETWORK):
            shown = max(cfg.soteria_victims, cfg.fig3_victims)
            shared = _shared_states(ctx, step)
            scenario = trained_convbig(ctx, shown, runs[step], f"convbig-{step}", shared)
            if defense == NETWORK:  # the network the Soteria unit before it kept, read back
                return [_network_row(ctx, scenario, step)]
            return _soteria_rows(ctx, scenario, step)
        policy = defense.removeprefix("ats ")
        return [_ats_row(ctx, policy, ats(policy), step)]

    keys = [(f"ats {p}", s) for p in cfg.ats_policies for s in cfg.train_steps]
    keys += [(d, s) for s in sorted(runs) for d in ("soteria", NETWORK)]
    return _fig2_record(ctx, ctx.units(keys, unit, "Fig. 2"))


def _fig2_record(ctx: Context, found: list[dict[str, Any]]) -> dict[str, Any]:
    """Fig. 2's record from the rows of all its units (``found``, in order): the curves' rows,
    with Fig. 3's and Fig. 6's pictures and the Soteria networks' fit in entries of their own."""
    rows = curve_rows({"rows": found})
    used = {
        d: ctx.resolve("cifar10", s)
        for d, s in (("ATS", ATS_STAND_IN), ("Soteria", SOTERIA_STAND_IN))
    }
    extras = ("figure3", "figure6")
    figure3, figure6 = record_pictures({"rows": rows})
    return {
        "rows": [_with_epoch(ctx, {k: v for k, v in r.items() if k not in extras}) for r in rows],
        "figure3": figure3,
        "figure6": figure6,
        "networks": [_with_epoch(ctx, r) for r in record_networks({"rows": found})],
        "data": {"cifar10": ", ".join(f"{spec} ({d})" for d, spec in used.items())}
        if set(used.values()) != {ctx.resolve("cifar10")}  # stand-ins of their own at ci
        else {},
    }


def soteria_steps(ctx: Context) -> tuple[int, ...]:
    """The training steps after which Fig. 2 attacks Soteria in a run in ``ctx``.

    The steps that end each of the config's ``soteria_epochs`` (see
    :func:`steps_per_epoch`) and Fig. 3's ``fig3_step``. A split's size is
    read from the data's header, so ``bayes_work`` can estimate the run before
    any data is loaded.
    """
    return tuple(sorted(soteria_runs(ctx)))


def soteria_runs(ctx: Context) -> dict[int, dict[str, Any]]:
    """Each Soteria point of Fig. 2 (its training step) and the authors' run that trains its
    network, as :func:`leakagelib.fl.train`'s settings: after ``e`` of ``soteria_epochs`` a run
    of ``e`` epochs with that run's own schedule, after ``fig3_step`` the step-wise run
    (:mod:`.bayes_training` says why each point is a run of its own)."""
    cfg = ctx.config
    per_epoch = steps_per_epoch(ctx, SOTERIA_STAND_IN)
    runs = {e * per_epoch: epoch_run(e, per_epoch) for e in cfg.soteria_epochs}
    return {**runs, cfg.fig3_step: stepwise_run(cfg.fig3_step)}


def _shared_states(ctx: Context, step: int) -> dict[int, str]:
    """The states the Soteria run of Fig. 2's point after ``step`` shares with the config's other
    epoch runs (:func:`.bayes_training.shared_epochs`), by step, each named by the schedule
    that leads to it; none for the step-wise run."""
    per_epoch = steps_per_epoch(ctx, SOTERIA_STAND_IN)
    epochs = ctx.config.soteria_epochs
    if step % per_epoch or step // per_epoch not in epochs:
        return {}
    rates = epoch_rates(step // per_epoch)
    return {k * per_epoch: "convbig-rates-" + "-".join(f"{r:g}" for r in rates[:k])
            for k in shared_epochs(step // per_epoch, epochs)}  # fmt: skip


def steps_per_epoch(ctx: Context, stand_in: str | None = None) -> int:
    """Training steps in one epoch of Fig. 2's networks: the config's ``epoch_images`` (the
    paper's CIFAR-10 training split) or, where that is ``None``, the training split of what
    stands for CIFAR-10 (``stand_in`` as in :meth:`Context.resolve`), in whole batches of
    :data:`~.bayes_soteria.TRAIN_BATCH` (:func:`leakagelib.fl.train` reshuffles after the last
    whole batch)."""
    images = ctx.config.epoch_images or split_size(ctx, "cifar10", "train", stand_in)
    return max(1, images // TRAIN_BATCH)


def _with_epoch(ctx: Context, row: dict[str, Any]) -> dict[str, Any]:
    """A Fig. 2 row with its ``epoch``: the step over the epoch length of the data its network
    trained on (each defense's stand-in at ci)."""
    stand_in = ATS_STAND_IN if row["defense"].startswith("ats") else SOTERIA_STAND_IN
    return {**row, "epoch": row["step"] / steps_per_epoch(ctx, stand_in)}


def _ats_row(
    ctx: Context,
    policy: str,
    scenario: AtsScenario,
    step: int,
) -> dict[str, Any]:
    """Fig. 2's ATS row of ``policy`` after ``step`` training steps (with Fig. 3's images)."""
    cfg = ctx.config
    n = _attacked(cfg, cfg.ats_victims, step)
    victims, recon, scores = ats_reconstructions(ctx, policy, scenario, step, n)
    psnr = scores[: cfg.ats_victims]
    row = _with_epoch(ctx, _curve_row(f"ats {policy}", step, psnr, victims, recon, cfg))
    if policy == cfg.ats_policies[0] and step in cfg.fig6_steps:
        row["figure6"] = _pictures(victims[: cfg.ats_victims], recon[: cfg.ats_victims])
    return row


def _attacked(cfg: Settings, victims: int, step: int) -> int:
    """How many images a defense's attack takes after ``step`` training steps: its ``victims``,
    or Fig. 3's ``fig3_victims`` at ``fig3_step`` if those are more."""
    return max(victims, cfg.fig3_victims) if step == cfg.fig3_step else victims


def _soteria_rows(
    ctx: Context, scenario: tuple[Tensor, Tensor, Normalizer, TrainResult], step: int
) -> list[dict[str, Any]]:
    """Fig. 2's Soteria rows after ``step`` training steps: layer-drop and direct attack.

    Both attack the curve's ``soteria_victims`` as one batched program. At
    ``fig3_step`` the layer-drop attack also takes the rest of Fig. 3's
    ``fig3_victims``, which the direct attack, absent from Fig. 3, does not: its
    30 extra ConvBig attacks of 4,000 iterations would cost about 45 minutes on
    this project's CPU (the curve's ten took 16 min on two threads, 2026-11-29).
    The layer-drop attack then runs as a program of its own.
    """
    cfg = ctx.config
    images, labels, norm, trained = scenario
    n = _attacked(cfg, cfg.soteria_victims, step)
    images, labels = images[:n], labels[:n]
    defense = Soteria("fc1.linear", cfg.pruning_rate, attack=cfg.likelihood)
    attacks = {"soteria": "layer-drop", "soteria (direct attack)": "direct"}
    configs = soteria_attacks(cfg, defense)
    case = build_case(trained.model, images, labels, norm, defense=defense, device=ctx.device)
    curve = case.first(cfg.soteria_victims)
    programs = [(case, list(attacks))] if n == cfg.soteria_victims else [
        (case, ["soteria"]), (curve, ["soteria (direct attack)"])]  # fmt: skip
    rows = []
    for victims, names in programs:
        result = victims.attack([configs[attacks[a]] for a in names], names=names,
                                generator=ctx.generator(7), checkpoint=ctx.checkpoint())  # fmt: skip
        for name in names:
            recon = victims.reconstructions(result, name).clamp(0, 1)
            shown = images if name == "soteria" else None  # Fig. 3 shows the layer-drop attack
            psnr = victims.score_images(recon)[: cfg.soteria_victims]
            rows.append(_with_epoch(ctx, _curve_row(name, step, psnr, shown, recon, cfg)))
    return rows


def _network_row(
    ctx: Context, scenario: tuple[Tensor, Tensor, Normalizer, TrainResult], step: int
) -> dict[str, Any]:
    """The :data:`~.bayes_fig2_records.NETWORK` row after ``step`` training steps: how closely
    that ConvBig fits its training images and the curve's victims
    (:func:`~.bayes_soteria.convbig_fit`)."""
    images, labels, norm, trained = scenario
    n = ctx.config.soteria_victims
    fit = convbig_fit(ctx, trained.model, images[:n], labels[:n], norm)
    return _with_epoch(ctx, {"defense": NETWORK, "step": step, **fit})


def _curve_row(
    defense: str,
    step: int,
    psnr: Tensor,
    original: Tensor | None,
    reconstruction: Tensor,
    cfg: Settings,
) -> dict[str, Any]:
    """A row of Fig. 2: defense, training step, mean PSNR, its standard deviation and the
    per-image values, with Fig. 3's images (``figure3``) at ``fig3_step`` when ``original``
    is given."""
    row = {"defense": defense, "step": step, **psnr_summary(psnr), "psnr_per_image": psnr.tolist()}
    if original is not None and step == cfg.fig3_step:
        row["figure3"] = _pictures(original, reconstruction)
    return row


def _pictures(original: Tensor, reconstruction: Tensor) -> dict[str, list]:
    """A Fig. 3 entry: originals and reconstructions as lists."""
    return {"original": image_lists(original), "reconstruction": image_lists(reconstruction)}
