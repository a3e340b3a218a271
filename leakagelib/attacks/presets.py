"""Named attacks as presets of (likelihood, prior, loop): the Bayes paper's Tables 1 and 2, runnable.

=========================== ==============  ===============  ==============================
attack (registry id)        prior p(x)      likelihood       loop
=========================== ==============  ===============  ==============================
DLG (``dlg``)               uniform         Gaussian         L-BFGS, labels optimised
iDLG (``idlg``)             uniform         Gaussian         L-BFGS, labels read off g
Inverting Gradients         TV (ℓ1)         cosine           Adam, signed, box, step decay
(``inverting-gradients``)
CPL (``cpl``)               uniform/label   Gaussian         L-BFGS, patterned init
                                                             (CVB: N(0, 1), logit label)
GradInversion               TV+ℓ2+BN stats  Gaussian         Adam, box
(``gradinversion``)
Bayes (``bayes``)           TV              the defense's    Adam, exponential decay
ℓ2, ℓ1, cosine              TV              Gaussian,        as Bayes (Table 2's
(``l2``, ``l1``,                            Laplace, cosine  heuristic baselines)
``cosine``)
=========================== ==============  ===============  ==============================

Each preset function returns an :class:`~leakagelib.attacks.attack.Attack`;
every hyper-parameter a caller may need is a keyword of the function
(defaults are the cited values), :meth:`~leakagelib.attacks.attack.Attack.with_config`
changes any loop field afterwards and
:meth:`~leakagelib.attacks.attack.Attack.on_layers` restricts the likelihood
to some layers. :data:`PRESETS` maps the registry ids — the names every
experiment record uses for its attacks — to the functions, and
:func:`preset` looks one up. Used by the chapter "Existing attacks are
approximations" and by every experiment.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from .attack import Attack, Include, restrict
from .config import AttackConfig
from .cosine import Cosine
from .likelihoods import Gaussian, Laplace, LayerSelection, Likelihood
from .network_priors import LabelAlignment, LogitLabelDistance, gradinversion
from .priors import Prior, TotalVariation, Uniform

__all__ = [
    "PRESETS",
    "bayes",
    "cosine",
    "cpl",
    "dlg",
    "grad_inversion",
    "idlg",
    "inverting_gradients",
    "l1",
    "l2",
    "preset",
]

#: DLG's objective ‖g − s‖² is the Gaussian log-likelihood with 1/(2σ²) = 1.
_DLG_SIGMA = 1.0 / math.sqrt(2.0)


def _lbfgs(
    steps: int,
    lr: float,
    beta: float = 0.0,
    schedule: str = "constant",
    decay: float = 1.0,
    **fields: Any,
) -> AttackConfig:
    """The L-BFGS loop of DLG, iDLG and CPL: a constant lr (1 in their code), no prior by default.

    ``schedule="plateau"`` with ``decay`` its factor, and the early-stopping
    and best-iterate ``fields`` of :class:`AttackConfig`, give the CVB
    authors' loop (:data:`~leakagelib.experiments.cvb_common.CVB_LOOP`), run per attack.
    """
    return AttackConfig(
        steps=steps, optimizer="lbfgs", lr=lr, schedule=schedule, decay=decay, beta=beta, **fields
    )  # fmt: skip


def dlg(
    *,
    steps: int = 300,
    lr: float = 1.0,
    sigma: float = _DLG_SIGMA,
    init: str = "normal",
    box: bool = False,
    restarts: int = 1,
    lbfgs_iterations: int = 20,
    include: Include = None,
) -> Attack:
    """DLG: uniform prior, Gaussian likelihood (the squared ℓ2 distance), L-BFGS with lr 1.

    Dummy inputs and soft labels start from N(0, 1) and are optimised jointly
    (Zhu et al. 2019, Algorithm 1; L-BFGS with lr 1 and 300 iterations as in
    their code, mit-han-lab/dlg). ``sigma`` = 1/√2 makes the likelihood
    exactly minus DLG's distance; ``include`` restricts it to some layers.
    """
    config = _lbfgs(
        steps,
        lr,
        init=init,
        box=box,
        restarts=restarts,
        lbfgs_iterations=lbfgs_iterations,
        optimize_labels=True,
    )
    lik = restrict(Gaussian(sigma=sigma), include)
    return Attack("dlg", "DLG", lik, Uniform(), config, labels="optimize")


def idlg(
    *,
    steps: int = 300,
    lr: float = 1.0,
    sigma: float = _DLG_SIGMA,
    init: str = "normal",
    box: bool = False,
    restarts: int = 1,
    lbfgs_iterations: int = 20,
    include: Include = None,
    labels: str = "idlg",
    **control: Any,
) -> Attack:
    """iDLG: DLG with the label read off the last layer's gradient (Zhao et al. 2020).

    ``labels="given"`` runs the same loop with known labels (the CVB paper's
    protocol). ``control``: the loop's schedule, early-stopping and
    best-iterate fields of :class:`AttackConfig` (``schedule``, ``decay``,
    ``plateau_patience``, ``stop_patience``, ``stop_below``, ``keep_best``,
    ``best_iterate``; the CVB authors' values are :data:`~leakagelib.experiments.cvb_common.CVB_LOOP` with patience 40 and 400).
    Other keywords as :func:`dlg`.
    """
    config = _lbfgs(
        steps,
        lr,
        init=init,
        box=box,
        restarts=restarts,
        lbfgs_iterations=lbfgs_iterations,
        **control,
    )
    lik = restrict(Gaussian(sigma=sigma), include)
    return Attack("idlg", "iDLG", lik, Uniform(), config, labels=labels)


#: CPL's label term by name: Wei et al.'s one-hot softmax distance, or the CVB authors' logit form.
_LABEL_TERMS: dict[str, Callable[[], Prior]] = {
    "softmax": LabelAlignment,
    "logits": LogitLabelDistance,
}


def cpl(
    *,
    steps: int = 300,
    lr: float = 1.0,
    pattern_size: int = 4,
    label_weight: float = 0.0,
    label_term: str = "softmax",
    init: str = "pattern",
    sigma: float = _DLG_SIGMA,
    box: bool = False,
    restarts: int = 1,
    lbfgs_iterations: int = 20,
    include: Include = None,
    labels: str = "idlg",
    **control: Any,
) -> Attack:
    """CPL (Wei et al. 2020): DLG's ℓ2 objective and L-BFGS from a patterned initialisation.

    The patterned seed is one random ``pattern_size`` × ``pattern_size`` patch
    tiled over the image; labels are read off the gradient as in iDLG
    (``labels="given"`` uses known ones). CPL's label-based regulariser
    ``α‖F(x; W) − y‖²`` (:class:`LabelAlignment`, bound to the attacked model
    when the attack runs) is the prior with weight ``α = label_weight``; the
    default 0 follows the authors' public notebook, where the term is
    commented out, and leaves a uniform prior. ``label_term="logits"`` is the
    CVB authors' form of the term, ``‖h(x) − y‖₂`` on the logits
    (:class:`LogitLabelDistance`; their weight 0.01, with ``init="normal"``,
    ``configs/attacks/CPL.yaml``). ``control``: the loop fields as in :func:`idlg`.
    """
    if label_weight < 0:
        raise ValueError(f"label_weight must be non-negative, got {label_weight}")
    if label_term not in _LABEL_TERMS:
        raise ValueError(f"unknown label_term {label_term!r}; use one of {tuple(_LABEL_TERMS)}")
    config = _lbfgs(
        steps,
        lr,
        beta=label_weight,
        init=init,
        box=box,
        pattern_size=pattern_size,
        restarts=restarts,
        lbfgs_iterations=lbfgs_iterations,
        **control,
    )
    prior: Prior = _LABEL_TERMS[label_term]() if label_weight > 0 else Uniform()
    lik = restrict(Gaussian(sigma=sigma), include)
    return Attack("cpl", "CPL", lik, prior, config, labels=labels)


def inverting_gradients(
    *,
    steps: int = 4000,
    tv: float = 1e-4,
    lr: float = 0.1,
    signed: bool = True,
    box: bool = True,
    schedule: str = "step",
    decay: float = 0.1,
    init: str = "normal",
    restarts: int = 1,
    weighting: str = "uniform",
    include: Include = None,
    **control: Any,
) -> Attack:
    """Inverting Gradients (Geiping et al. 2020): cosine likelihood, TV prior, signed Adam.

    Box-constrained iterates, signed gradients and a step schedule that divides
    the learning rate by 10 at 3/8, 5/8 and 7/8 of the run, as in their code.
    The prior is their TV in their convention,
    ``TotalVariation(power=1, reduction="mean")`` (inversefed/metrics.py: each
    direction's absolute differences averaged, the two means added), so ``tv``
    is a weight as their code and every paper built on it write it. Default
    ``tv`` 10⁻⁴: inversefed's ``--tv`` default (``inversefed/options.py``),
    which the README's CIFAR-10 command (``reconstruct_image.py``) runs with;
    lr 0.1 is theirs too; 4000 iterations are those the Bayes paper ran with
    that code (§6). ``weighting="exponential"`` is their layer weighting. Pass
    ``bounds`` (:func:`~leakagelib.attacks.loop.image_bounds`) when calling.
    ``control``: ``plateau_patience``, ``stop_patience``, ``stop_below``,
    ``keep_best`` and ``best_iterate`` of :class:`AttackConfig`; the CVB authors' loop is
    ``schedule="plateau"`` with :data:`~leakagelib.experiments.cvb_common.CVB_LOOP`, patience 400 and 4,000.
    """
    config = AttackConfig(
        steps=steps,
        optimizer="adam",
        lr=lr,
        schedule=schedule,
        decay=decay,
        beta=tv,
        init=init,
        restarts=restarts,
        signed=signed,
        box=box,
        **control,
    )
    lik = restrict(Cosine(layers=LayerSelection(weighting=weighting)), include)
    prior = TotalVariation(power=1, reduction="mean")
    return Attack("inverting-gradients", "Inverting Gradients", lik, prior, config)


def grad_inversion(
    *,
    steps: int = 20_000,
    lr: float = 0.1,
    tv: float = 1e-4,
    l2: float = 1e-6,
    bn: float = 0.1,
    sigma: float = _DLG_SIGMA,
    box: bool = True,
    restarts: int = 1,
    include: Include = None,
) -> Attack:
    """GradInversion (Yin et al. 2021): Gaussian likelihood, TV + ℓ2 + BatchNorm-statistics prior.

    The Bayes paper's Table 1 reading: the ℓ2 gradient distance is a Gaussian
    likelihood, and :func:`~leakagelib.attacks.network_priors.gradinversion` the prior
    with weights ``tv``, ``l2`` and ``bn`` (β = 1). The paper's code is not
    public; the values are those of breaching's re-implementation
    (JonasGeiping/breaching, ``config/attack/seethroughgradients.yaml``):
    Adam with lr 0.1, box-constrained, 20,000 iterations, TV 10⁻⁴, image norm
    10⁻⁶, DeepInversion (BatchNorm) 0.1, labels given (recover them with
    :func:`leakagelib.gradients.recover_labels_batch`). Not modelled: the
    cosine learning-rate decay (the lr stays constant), the Langevin noise and
    the group-consistency term of several seeds. ``tv`` is breaching's scale
    in inversefed's per-direction mean convention (see
    :func:`~leakagelib.attacks.network_priors.gradinversion` for the small
    difference at the border). ``bn > 0`` needs a model with BatchNorm layers
    (pass ``bn=0`` otherwise); pass ``bounds``.
    """
    config = AttackConfig(
        steps=steps,
        optimizer="adam",
        lr=lr,
        schedule="constant",
        decay=1.0,
        beta=1.0,
        restarts=restarts,
        box=box,
    )
    prior = gradinversion(tv=tv, l2=l2, bn=bn)
    return Attack(
        "gradinversion", "GradInversion", restrict(Gaussian(sigma=sigma), include), prior, config
    )


def bayes(
    likelihood: Likelihood,
    *,
    prior: Prior | None = None,
    beta: float = 0.1,
    steps: int = 200,
    lr: float = 0.5,
    decay: float = 0.94,
    schedule: str = "exponential",
    init: str = "normal",
    box: bool = False,
    restarts: int = 1,
    mc_samples: int = 1,
    delta: float = 0.0,
    signed: bool = False,
    include: Include = None,
) -> Attack:
    """The approximate Bayes-optimal adversary (Algorithm 1) for a defense's likelihood.

    ``likelihood`` is ``defense.likelihood()``. Loop values from the authors'
    code (eth-sri/bayes-framework-leakage, scripts/run_mnist_tune.sh and
    attacks/grad_attack.py): N(0, 1) initialisation in normalised space, Adam
    with lr 0.5 and exponential decay 0.94 per step, 200 steps, their
    squared-difference TV prior in their convention,
    ``TotalVariation(power=2, reduction="sum")`` (utils/measures.py: summed
    over each image, averaged over images). ``beta`` is the prior weight the paper tunes
    per attack (A.3; see :mod:`leakagelib.attacks.search`); ``mc_samples`` and
    ``delta`` are Algorithm 1's k and δ; ``signed`` runs Adam on the
    gradient's sign (inversefed's loop, which the Bayes authors' Soteria
    attack runs: :mod:`leakagelib.experiments.bayes_soteria`); ``include``
    restricts the likelihood to some layers.
    """
    config = AttackConfig(
        steps=steps,
        optimizer="adam",
        lr=lr,
        schedule=schedule,
        decay=decay,
        beta=beta,
        init=init,
        box=box,
        restarts=restarts,
        mc_samples=mc_samples,
        delta=delta,
        signed=signed,
    )
    lik = restrict(likelihood, include)
    prior = prior or TotalVariation(power=2, reduction="sum")
    return Attack("bayes", "Bayes", lik, prior, config)


def _baseline(name: str, title: str, likelihood: Likelihood, overrides: dict[str, Any]) -> Attack:
    """A heuristic attack of Table 2: the Bayes loop and prior with a fixed distance."""
    return replace(bayes(likelihood, **overrides), name=name, title=title)


def l2(**overrides: Any) -> Attack:
    """Table 2's ℓ2 attack: the Bayes attack's loop and TV prior with the ℓ2 distance (σ = 1).

    The heuristic baselines of the Bayes paper (§6, A.3) share the Bayes
    attack's loop and prior and differ only in the distance; ``overrides``
    are the keywords of :func:`bayes` (``steps``, ``beta``, ``prior``, ...).
    """
    return _baseline("l2", "ℓ2", Gaussian(), overrides)


def l1(**overrides: Any) -> Attack:
    """Table 2's ℓ1 attack (Laplace likelihood, b = 1); ``overrides`` as :func:`bayes`."""
    return _baseline("l1", "ℓ1", Laplace(), overrides)


def cosine(**overrides: Any) -> Attack:
    """Table 2's cosine attack (cosine likelihood); ``overrides`` as :func:`bayes`."""
    return _baseline("cosine", "cosine", Cosine(), overrides)


#: Every preset by its registry id: the names experiment records give their attacks.
PRESETS: dict[str, Callable[..., Attack]] = {
    "dlg": dlg,
    "idlg": idlg,
    "inverting-gradients": inverting_gradients,
    "cpl": cpl,
    "gradinversion": grad_inversion,
    "bayes": bayes,
    "l2": l2,
    "l1": l1,
    "cosine": cosine,
}


def preset(name: str, **overrides: Any) -> Attack:
    """The preset ``name`` (a key of :data:`PRESETS`) built with ``overrides``.

    ``preset("bayes", likelihood=defense.likelihood(), beta=0.01)``.
    """
    if name not in PRESETS:
        raise KeyError(f"unknown attack preset {name!r}; use one of {sorted(PRESETS)}")
    return PRESETS[name](**overrides)
