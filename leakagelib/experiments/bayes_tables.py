"""The Bayes-framework paper's (Balunović et al., ICLR 2022) image experiments: Tables 2 and 5.

Each builds its scenario with :func:`~leakagelib.experiments.case.build_case`:
``bayes-cnn`` (seeded LeCun-normal initialisation, trained for 0 or 500
steps), the first victims of the training split ("the first 100 images of the
training set", §6), each its own client behind a noise defense. The attacks
are presets of :mod:`leakagelib.attacks.presets` named as the rows name them:
``bayes`` with the defense's likelihood, and Table 2's heuristic ``l2``,
``l1`` and ``cosine``. Each is tuned by the search of A.3
(:mod:`leakagelib.attacks.search`) on the first ``tune_victims`` victims and
then attacks every victim with its tuned setting; the attacks of one defense run as settings of
one batched program. The chapter "Bayes versus heuristics under defenses"
runs both, and Fig. 7 (:mod:`.bayes_mc_samples`), which shares their scenario.

**ci scale.** The ci runs attack the data at their real resolutions: the
embedded stand-ins ``digits28`` (1×28×28) for MNIST and ``patches`` (3×32×32)
for CIFAR-10, or a ``--data`` override as it is. Double back-propagation
through ``bayes-cnn`` at those sizes costs about ten times more per image and
step than on 8×8 thumbnails, so the ci budget (a few minutes on one CPU core)
is spent where the paper's tables differ, on enough images for a paired
comparison. Table 2 at ci runs prune + Gauss at training step 0 on both
datasets: under plain Gaussian or Laplacian noise the Bayes attack is the ℓ2
or ℓ1 attack up to a constant factor (a unit test shows the identical
iterates), so those cells wait for the paper scale, as does prune + Laplace,
which makes the same point; Table 5 (the same victims, MNIST after 500
training steps) supplies the ℓ2 attack's step-500 cell. Table 2's own
step-500 cells were tried at ci and left to the paper scale, because the ci
search cannot resolve them (2026-12-01, prune + Gauss, seeds 0–2): with β
widened to 10⁻⁶…10³ (on the six powers below the Bayes attack's choice sat at
their edge, 1, at step 500 on MNIST for seed 0; widened, it chose 10), the
Bayes attack's paired lead at step 500 changed sign with the seed on both
stand-ins — against cosine from +1.1 to −1.5 dB with 16 victims, against ℓ2
from +1.9 to −0.7 dB on the patches — with 8 or 16 victims, 25 or 50 steps,
one or two tuning victims, while at step 0 its mean lead was 1.3–7.4 dB with
every interval above zero. One tuning victim and a constant β choose poorly
once training has shrunk the gradients under the noise; the paper-scale
record, with A.3's search on ten tuning victims and 100 scored ones, shows
the step-500 lead in its MNIST cells. Eight victims, 25 attack steps (the
learning rate decays by 0.94 per step, to a fifth of its start by step 25, so
the rest of the paper's 200 steps move little) and β on six powers of ten,
which hold the best β of each attack at step 0 on both stand-ins (10⁻⁵ for
cosine up to 1 for Bayes; widened to 10⁻⁶…10³, every attack chose as before
on seed 0), held constant: a reduced search, with neither the linear
refinement, the grid nor the annealed prior weight. Each attack is tuned on
one victim, and Table 2's cosine is one cosine per victim.

**paper scale.** The authors' tuners (:func:`~.bayes_scenario.tuners`):
the heuristic one with its 480-setting grid for ℓ2, ℓ1 and cosine, the Bayes
one with its own 540-setting grid, the prior weight annealed over the first
100 of 200 steps; each "step 500" network trained under its cell's
defense as the authors' scripts indicate (:data:`~.bayes_scenario.SCENARIO`).
Table 2 follows the authors' ``--k_batches 10 --batch_size 1``: its cosine
attack takes one cosine over each block of ten consecutive victims (their
``cos_sim_global``; :class:`~leakagelib.attacks.Cosine` with ``group=10``),
and every attack is tuned on the first ten victims, the one loader batch
their tuners score. Table 5 tunes on one victim (:func:`table5_priors`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, replace
from typing import Any

from .. import records
from ..attacks import PixelRange, Prior, TotalVariation, preset
from .bayes_scenario import (
    ATTACKS,
    DEFENSES,
    SCENARIO,
    attack_tuned,
    gray_baseline,
    make_defense,
    scenario,
    table2_attacks,
    tune,
)
from .bayes_work import table2_work, table5_work
from .case import Case, build_case
from .config import ScaleConfig
from .registry import Context, experiment

__all__ = ["SHOWN", "TABLE2", "TABLE5", "cell_offsets", "table2", "table5_priors"]

#: ci: eight victims, 25 attack steps, a constant β on a coarse log grid only (module docstring);
#: paper: the authors' tuners (:func:`~.bayes_scenario.tuners`). Table 2 tunes on ten victims at
#: paper scale (:data:`_TABLE2_PAPER`); these are Table 5's values as its record was made.
_SEARCH_CI = {"victims": 8, "tune_victims": 1, "steps": 25, "anneal_steps": 0,
              "betas": tuple(10.0**e for e in range(-5, 1)), "refine": 0, "grid": False}  # fmt: skip
_SEARCH_PAPER = {"victims": 100, "tune_victims": 1, "steps": 200, "anneal_steps": 100,
                 "betas": None, "refine": 20, "grid": True}  # fmt: skip
#: What the authors' tuners tune on (their final run attacks ten such batches: ``n_attack = 10``,
#: tune_attacks_dp.py line 268, tune_attacks_theory.py line 250).
_AUTHORS_TUNING = (
    "the authors' tuners set n_attack = 1 (tune_attacks_dp.py lines 197, 219, 247; "
    "tune_attacks_theory.py lines 189, 211, 231): one loader batch of batch_size · k_batches "
    "images (datasets/common.py line 78), ten with the scripts' --batch_size 1 --k_batches 10"
)
_TABLE2_CI = {**_SEARCH_CI, "cosine_group": 1}
_TABLE2_PAPER = {**_SEARCH_PAPER, "tune_victims": 10, "cosine_group": 10}
_SEARCH_SOURCES = {
    "victims": "§6: 'the first 100 images of the training set'; in the authors' code a random "
    "draw from it (datasets/common.py lines 71 and 78: a random split, then a shuffled loader, "
    "read on its second pass, tune_attacks_theory.py lines 101 and 123)",
    "steps": "the authors' scripts/run_mnist_tune.sh: --att_epochs 100, run twice over "
    "(attacks/grad_attack.py line 100: 2 · att_epochs steps)",
    "anneal_steps": "attacks/grad_attack.py lines 72–102: the likelihood's factor anneals over "
    "att_epochs = 100 steps, then stays; ci: 0 (its constant-β search anneals nothing)",
    "betas": "A.3: β on a log scale in [1e-7, 1e5]; None: the authors' tuners — heuristic "
    "f = 1e7/2^k while f > 5e-6 (41 values, β = c·s/f from 1e-7 to 1.1e5; the code's last "
    "halving passes A.3's 1e5, and we follow the code), Bayes f = 1000/2^k while f > 1e-4 "
    "(24 values; tune_attacks_dp.py lines 188–210, tune_attacks_theory.py lines 181–202); "
    "ci: a constant β on six powers of ten (a reduced search)",
    "refine": "A.3: [0.5 β*, 2 β*]; 20 values linear in f around the mean of the tied f "
    "(tune_attacks_dp.py lines 212–228, tune_attacks_theory.py lines 204–219); ci: none",
    "grid": "§6: 480 combinations for ℓ2, ℓ1 and cosine (HeuristicGrid: tune_attacks_dp.py "
    "lines 162–169), 540 for Bayes (BayesGrid: tune_attacks_theory.py lines 162–167); ci: none",
}
_TABLE2_SOURCES = {
    **_SEARCH_SOURCES,
    "tune_victims": f"{_AUTHORS_TUNING}: the first ten victims, one block of the cosine; "
    "ci: one victim, with the per-image cosine (cosine_group 1), so the ci run takes as long "
    "as before",
    "cosine_group": "the authors' scripts run --k_batches 10 --batch_size 1 --att_metric "
    "cos_sim_global (scripts/run_mnist_tune.sh, run_cifar_tune.sh): one cosine over ten "
    "single-image updates attacked together (utils/flax_losses.py lines 78–86, 133–140; their "
    "distance divided by k_batches and TV averaged over the images, lines 101 and 144, so β = "
    "c/f as for one image); ci: 1, one cosine per victim (ci tunes on one victim)",
}
_TABLE5_SOURCES = {
    **_SEARCH_SOURCES,
    "tune_victims": f"ours: one victim, where {_AUTHORS_TUNING}; left at one because Table 5's "
    "paper-scale record was made with it (Table 2 tunes on ten)",
}

#: How many victims of a Table 2 cell keep their reconstructions in the rows (Table 2 has no
#: figure; the chapter shows these beside the originals). Two keep the paper-scale record near
#: 3 MB: 16 cells × 4 attacks × 2 images and their originals, up to 3×32×32 values each.
#: Table 5's and Figure 7's (:mod:`.bayes_mc_samples`) rows keep as many.
SHOWN = 2

#: The defenses whose Table 2 and Table 5 cells the ci scale runs (module docstring).
_CI_DEFENSES = ("prune+gauss",)

TABLE2 = ScaleConfig(
    ci={"datasets": ("mnist", "cifar10"), "train_steps": (0,), "defenses": _CI_DEFENSES,
        "attacks": ATTACKS, **_TABLE2_CI, **SCENARIO.ci},
    paper={"datasets": ("mnist", "cifar10"), "train_steps": (0, 500), "defenses": tuple(DEFENSES),
           "attacks": ATTACKS, **_TABLE2_PAPER, **SCENARIO.paper},
    sources={"datasets": "Table 2", "train_steps": "Table 2: 'Train step 0', 'Train step 500'; "
             "ci: step 0 (Table 5 runs step 500)", "defenses": "§6: σ = b = 0.1, pruning 50 % "
             "of the entries; ci: prune + Gauss", "attacks": "Table 2",
             **_TABLE2_SOURCES, **SCENARIO.sources},
)  # fmt: skip

TABLE5 = ScaleConfig(
    ci={"train_step": 500, "defenses": _CI_DEFENSES, "phis": (0.1, 0.5), **_SEARCH_CI,
        **SCENARIO.ci},
    paper={"train_step": 500, "defenses": tuple(DEFENSES), "phis": (0.1, 0.25, 0.3, 0.5),
           **_SEARCH_PAPER, **SCENARIO.paper},
    sources={"train_step": "A.4: 'MNIST network trained for 500 steps'", "defenses": "A.4; ci: "
             "prune + Gauss, as Table 2 at ci", "phis": "A.4's φ·L_TV + (1 − φ)·L_[0,1] with the "
             "authors' --reg_tv values whose pairs with --reg_clip sum to 1 (tune_attacks_dp.py "
             "lines 167–168, 237–239; the code's filter also keeps (0.25, 0.7) and (0.3, 0.75), "
             "which A.4's formula does not); ci: two of them", **_TABLE5_SOURCES,
             "grid": "A.4: 'the same grid search procedure, ... extended to search for φ': the "
             "ℓ2 attack's 480 per φ and for TV alone (the authors search φ inside one grid, "
             "after stages 1–2 with φ = 0.25; here every φ is tuned as an attack of its own and "
             "chosen by its tuning score); ci: none", **SCENARIO.sources},
)  # fmt: skip


def _per_attack(table: dict[tuple[str, str, int], tuple[float, ...]]) -> list[dict]:
    """Table 2 as printed — (dataset, defense, step) → one PSNR per attack of :data:`ATTACKS` — as rows."""
    return [
        {"dataset": dataset, "defense": defense, "step": step, "attack": attack, "psnr": psnr}
        for (dataset, defense, step), values in table.items()
        for attack, psnr in zip(ATTACKS, values, strict=True)
    ]


def cell_offsets(
    cells: Mapping[str, Any], dataset: str, step: int, defense: str
) -> tuple[int, int]:
    """The generator offsets of Table 2's cell (``dataset``, ``step``, ``defense``) in a run
    whose config lists ``cells`` (its ``datasets``, ``train_steps`` and ``defenses``): the
    victims' updates' noise, and the search's, whose next offset starts the final attack
    (:func:`~.bayes_scenario.attack_tuned`). :mod:`.bayes_pool` takes the paper scale's to
    attack a cell's victims again from the same starting images."""
    blocks = [(d, s) for d in cells["datasets"] for s in cells["train_steps"]]
    i, j = blocks.index((dataset, step)), list(cells["defenses"]).index(defense)
    return 100 * i + j, 1000 * i + 10 * j


@experiment(
    "bayes/table2",
    on=("dataset", "defense", "attack", "step"),
    row_keys=("dataset", "defense", "attack", "step", "psnr"),
    config=TABLE2,
    reference=_per_attack(
        {
            ("mnist", "gaussian", 0): (19.63, 19.95, 19.39, 19.70),
            ("mnist", "laplacian", 0): (19.48, 18.86, 19.99, 18.64),
            ("mnist", "prune+gauss", 0): (18.40, 14.44, 13.95, 16.72),
            ("mnist", "prune+lap", 0): (18.27, 14.01, 13.86, 15.21),
            ("mnist", "gaussian", 500): (16.06, 16.18, 15.86, 15.39),
            ("mnist", "laplacian", 500): (15.95, 15.47, 16.31, 15.14),
            ("mnist", "prune+gauss", 500): (16.42, 13.15, 13.24, 14.47),
            ("mnist", "prune+lap", 500): (16.52, 13.60, 13.54, 14.57),
            ("cifar10", "gaussian", 0): (21.86, 21.81, 21.49, 21.53),
            ("cifar10", "laplacian", 0): (21.87, 21.02, 21.89, 20.87),
            ("cifar10", "prune+gauss", 0): (20.73, 16.60, 16.20, 18.73),
            ("cifar10", "prune+lap", 0): (20.54, 16.25, 16.13, 17.40),
            ("cifar10", "gaussian", 500): (17.94, 18.64, 18.00, 18.34),
            ("cifar10", "laplacian", 500): (18.41, 18.37, 19.11, 18.02),
            ("cifar10", "prune+gauss", 500): (18.67, 15.61, 15.27, 16.74),
            ("cifar10", "prune+lap", 500): (18.51, 15.32, 15.24, 15.51),
        }
    ),
    reference_source="Table 2 of Balunović et al. (ICLR 2022): PSNR (dB), 100 images",
    datasets=("mnist", "cifar10"),
    work=table2_work,
)
def table2(ctx: Context) -> list[dict]:
    """Bayes paper Table 2: PSNR of the Bayes, ℓ2, ℓ1 and cosine attacks under four noise defenses.

    One unit per (dataset, training step, defense) of the config: the network
    at that step (at step 500 trained under the defense), a case and the
    tuned attacks — at paper scale about 2 minutes each on a lent H200
    (2026-11-27, tuning on ten victims; 24 s when it tuned on one), so that
    an interrupted campaign keeps most of its work. On a CPU a unit takes
    hours: its search runs in pieces that fit the memory
    (:mod:`leakagelib.attacks.programs`), and a command-line run keeps the
    step-500 network, the finished pieces of the search and the final
    attack's loop as they go (:meth:`~leakagelib.experiments.Context.checkpoint`),
    so a unit killed halfway resumes there. Rows: ``dataset``,
    ``defense``, ``attack`` (preset id), ``step`` (training step), ``psnr``
    (mean over the victims, dB), ``psnr_per_image``, and what A.3's search
    chose: ``tuned`` (the :class:`~leakagelib.attacks.config.Setting`: lr,
    decay, β, layer weighting, annealing start) and ``tuning_psnr`` (its score
    on the tuning victims) with ``tune_victims`` (how many it tuned on) and
    ``cosine_group`` (victims per cosine), so that a cell that misses the
    paper's number can be traced to its search (records made before 2026-11-26
    lack the last two: they tuned on one victim, one cosine per victim); ``original`` and ``reconstruction``, the first
    :data:`SHOWN` victims and the attack's images of them (clamped to [0, 1],
    as lists), for the chapter's figure. Seeds follow each cell's (dataset,
    step) and defense's position in the config's lists.
    """
    cfg = ctx.config
    if "cosine" in cfg.attacks:  # before any network is trained
        for what in ("victims", "tune_victims"):
            if cfg[what] % cfg.cosine_group:
                raise ValueError(
                    f"{what} = {cfg[what]} is not a multiple of cosine_group = "
                    f"{cfg.cosine_group}: the cosine attack takes whole blocks of victims"
                )
    cells = [(d, step, name) for d in cfg.datasets for step in cfg.train_steps
             for name in cfg.defenses]  # fmt: skip

    def unit(cell: tuple[str, int, str]) -> list[dict]:
        dataset, step, name = cell
        updates, search = cell_offsets(cfg, *cell)
        model, victims = scenario(ctx, dataset, step, cfg.victims, defense=name)
        defense = make_defense(name, seed=ctx.seed)
        case = build_case(model, *victims, defense=defense, generator=ctx.generator(updates),
                          device=ctx.device)  # fmt: skip
        attacks = table2_attacks(defense, cfg.attacks, steps=cfg.steps,
                                 anneal_steps=cfg.anneal_steps,
                                 cosine_group=cfg.cosine_group)  # fmt: skip
        found = tune(ctx, case, attacks, offset=search, defense=name)
        psnr, images = attack_tuned(ctx, case, attacks, found, offset=search)
        return [{"dataset": dataset, "defense": name, "attack": a, "step": step,
                 "psnr": float(v.mean()), "psnr_per_image": v.tolist(),
                 "tuned": asdict(found.best[a]), "tuning_psnr": found.best_psnr[a],
                 "tune_victims": cfg.tune_victims, "cosine_group": cfg.cosine_group,
                 "original": records.image_lists(case.images[:SHOWN]),
                 "reconstruction": records.image_lists(images[a][:SHOWN])}
                for a, v in psnr.items()]  # fmt: skip

    return ctx.units(cells, unit, "table2")


def _range_priors(case: Case, phis: tuple[float, ...]) -> dict[str, Prior]:
    """A.4's priors: ``"tv"``, and ``"tv+range:φ"`` = φ·TV + (1 − φ)·pixel range for every φ.

    TV is the Bayes authors' (squared differences summed over each image,
    ``utils/measures.py``); the range term sums over pixels as their
    ``clip_prior`` does, so φ weighs the two as in their code.
    """
    if not phis or not all(0.0 <= phi < 1.0 for phi in phis):
        raise ValueError(f"phis must be a non-empty list of values in [0, 1), got {phis}")
    tv, norm = TotalVariation(power=2, reduction="sum"), case.normalizer
    in_range = PixelRange(norm.mean, norm.std)
    return {"tv": tv, **{f"tv+range:{phi:g}": phi * tv + (1.0 - phi) * in_range for phi in phis}}


def _table5_row(ctx: Context, case: Case, offset: int, defense: str) -> dict:
    """The ℓ2 attack with TV and with the φ whose *tuning* score is best, on all victims.

    Every φ is tuned like an attack of its own (A.4: φ joins the search), so
    the scored images never choose it.
    """
    cfg = ctx.config  # one likelihood object below: evaluated once per step
    base = preset("l2", steps=cfg.steps).with_config(anneal_steps=cfg.anneal_steps)
    attacks = {p: replace(base, prior=prior) for p, prior in _range_priors(case, cfg.phis).items()}
    found = tune(ctx, case, attacks, offset=offset, defense=defense,
                 distance=dict.fromkeys(attacks, "l2"))  # fmt: skip
    best = max((p for p in attacks if p != "tv"), key=lambda p: found.best_psnr[p])
    chosen = {"tv": attacks["tv"], best: attacks[best]}
    psnr, images = attack_tuned(ctx, case, chosen, found, offset=offset)
    return {
        "psnr_tv": float(psnr["tv"].mean()),
        "psnr_tv_range": float(psnr[best].mean()),
        "phi": float(best.split(":")[1]),
        "psnr_per_image_tv": psnr["tv"].tolist(),
        "psnr_per_image_tv_range": psnr[best].tolist(),
        "psnr_gray": float(gray_baseline(case.images).mean()),
        "pictures_tv": records.pictures(case.images, images["tv"], SHOWN),
        "pictures_tv_range": records.pictures(case.images, images[best], SHOWN),
    }


@experiment(
    "bayes/table5-priors",
    on=("dataset", "defense", "step"),
    row_keys=("defense", "psnr_tv", "psnr_tv_range"),
    config=TABLE5,
    reference=[
        {"dataset": "mnist", "defense": defense, "step": 500, "psnr_tv": tv, "psnr_tv_range": both}
        for defense, tv, both in (
            ("gaussian", 16.18, 16.30),
            ("laplacian", 15.47, 15.76),
            ("prune+gauss", 13.15, 13.63),
            ("prune+lap", 13.60, 14.10),
        )
    ],
    reference_source="Table 5 of Balunović et al. (ICLR 2022): PSNR (dB), MNIST, step 500",
    datasets=("mnist",),
    work=table5_work,
)
def table5_priors(ctx: Context) -> list[dict]:
    """Bayes paper Table 5: the ℓ2 attack with a TV prior versus TV + the pixel-range prior of A.4.

    Rows (one unit per defense): ``dataset`` (mnist), ``defense``, ``step``
    (500), ``psnr_tv``, ``psnr_tv_range`` (the φ with the best tuning score),
    ``phi``, the per-image values of both, ``psnr_gray`` (the PSNR of a
    constant image at the victims' mean: what an attack that learns nothing
    scores), and ``pictures_tv`` and ``pictures_tv_range`` (the first
    :data:`SHOWN` victims and each prior's reconstructions of them). Every
    prior is tuned by the ℓ2 attack's search (at paper scale with its
    480-setting grid, A.4).

    The search tunes on the first victim (``tune_victims`` 1), where the
    authors' tuner scores one loader batch of ten images (``n_attack = 1``
    with ``--k_batches 10``; Table 2 tunes on ten). It was left at one
    because the paper-scale record was being produced with it; for the ℓ2
    attack the ten images' objective is the sum of ten per-image ones, so
    only the tuning sample differs, not the attack.
    """
    cfg = ctx.config

    def unit(name: str) -> list[dict]:
        j = cfg.defenses.index(name)
        model, victims = scenario(ctx, "mnist", cfg.train_step, cfg.victims, defense=name)
        case = build_case(model, *victims, defense=make_defense(name, seed=ctx.seed),
                          generator=ctx.generator(500 + j), device=ctx.device)  # fmt: skip
        head = {"dataset": "mnist", "defense": name, "step": cfg.train_step}
        return [{**head, **_table5_row(ctx, case, offset=5000 + 10 * j, defense=name)}]

    return ctx.units(cfg.defenses, unit, "table5")
