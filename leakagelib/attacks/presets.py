"""Named attacks as presets of (likelihood, prior, loop): the Bayes paper's Table 1, runnable.

========================  ==============  ===============  ==============================
attack                    prior p(x)      likelihood       loop
========================  ==============  ===============  ==============================
DLG (Zhu et al. 2019)     uniform         Gaussian         L-BFGS, labels optimised
iDLG (Zhao et al. 2020)   uniform         Gaussian         L-BFGS, labels read off g
Inverting Gradients       TV (ℓ1)         cosine           Adam, signed, box, step decay
CPL (Wei et al. 2020)     uniform/label   Gaussian         L-BFGS, patterned init
Bayes (this paper)        TV              the defense's    Adam, exponential decay
GradInversion (prior)     TV+ℓ2+BN stats  Gaussian         see priors.gradinversion
========================  ==============  ===============  ==============================

Each function returns an :class:`Attack`; calling it runs
:func:`leakagelib.attacks.reconstruct`. Hyper-parameters come from each
paper or its code (cited per preset); every one is a field that callers may
override with :meth:`Attack.with_config`. Used by the chapter "Existing
attacks are approximations".
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import Tensor, nn

from ..gradients import recover_label_idlg
from .likelihoods import Cosine, Gaussian, Likelihood
from .loop import AttackConfig, AttackResult
from .priors import LabelAlignment, Prior, TotalVariation, Uniform

Update = dict[str, Tensor]

__all__ = ["PRESETS", "Attack", "bayes", "cpl", "dlg", "idlg", "inverting_gradients"]

LABEL_MODES = ("given", "optimize", "idlg")


@dataclass(frozen=True)
class Attack:
    """A named optimisation attack: likelihood, prior, loop and how labels are obtained.

    ``labels`` is ``"given"`` (the caller passes them), ``"optimize"`` (soft
    labels optimised jointly, DLG) or ``"idlg"`` (read off the last layer's
    gradient, one image per update).
    """

    name: str
    likelihood: Likelihood
    prior: Prior
    config: AttackConfig
    labels: str = "given"

    def __post_init__(self) -> None:
        if self.labels not in LABEL_MODES:
            raise ValueError(f"unknown label mode {self.labels!r}; use one of {LABEL_MODES}")

    def with_config(self, **changes: Any) -> Attack:
        """This attack with some loop settings changed (``steps=50``, ``beta=0.1``, ...)."""
        return replace(self, config=replace(self.config, **changes))

    def parts(self) -> dict[str, Any]:
        """The attack's ingredients as plain data (the Table 1 chapter prints these)."""
        return {
            "attack": self.name,
            "prior": self.prior.describe(),
            "likelihood": self.likelihood.describe(),
            "optimizer": self.config.optimizer,
            "steps": self.config.steps,
            "labels": self.labels,
        }

    def __call__(
        self,
        model: nn.Module,
        shared_update: Update,
        *,
        input_shape: tuple[int, ...],
        labels: Tensor | None = None,
        num_images: int = 1,
        stacked: bool = False,
        **options: Any,
    ) -> AttackResult:
        """Run the attack; ``options`` go to :func:`leakagelib.attacks.reconstruct`."""
        from . import reconstruct

        if self.labels == "given" and labels is None:
            raise ValueError(f"the {self.name} attack needs the labels (labels=...)")
        if self.labels == "idlg":
            if num_images != 1:
                raise ValueError("iDLG reads one label per update; use num_images=1")
            if stacked:
                n = next(iter(shared_update.values())).shape[0]
                labels = torch.tensor(
                    [
                        recover_label_idlg({k: v[i] for k, v in shared_update.items()})
                        for i in range(n)
                    ]
                )
            else:
                labels = torch.tensor([recover_label_idlg(shared_update)])
        if self.labels == "optimize":
            labels = None
        return reconstruct(
            model,
            shared_update,
            labels=labels,
            likelihood=self.likelihood,
            prior=self.prior,
            config=self.config,
            input_shape=input_shape,
            num_images=num_images if labels is None else None,
            stacked=stacked,
            **options,
        )


#: DLG's objective ‖g − s‖² is the Gaussian log-likelihood with 1/(2σ²) = 1.
_DLG_SIGMA = 1.0 / math.sqrt(2.0)


def dlg(steps: int = 300) -> Attack:
    """DLG: uniform prior, Gaussian likelihood (the squared ℓ2 distance), L-BFGS with lr 1.

    Dummy inputs and soft labels start from N(0, 1) and are optimised jointly
    (Zhu et al. 2019, Algorithm 1; L-BFGS with lr 1 and 300 iterations as in
    their code, mit-han-lab/dlg).
    """
    config = AttackConfig(
        steps=steps,
        optimizer="lbfgs",
        lr=1.0,
        schedule="constant",
        decay=1.0,
        beta=0.0,
        optimize_labels=True,
    )
    return Attack("DLG", Gaussian(sigma=_DLG_SIGMA), Uniform(), config, labels="optimize")


def idlg(steps: int = 300) -> Attack:
    """iDLG: DLG with the label read off the last layer's gradient (Zhao et al. 2020)."""
    config = AttackConfig(
        steps=steps, optimizer="lbfgs", lr=1.0, schedule="constant", decay=1.0, beta=0.0
    )
    return Attack("iDLG", Gaussian(sigma=_DLG_SIGMA), Uniform(), config, labels="idlg")


def inverting_gradients(steps: int = 4000, tv: float = 4e-4, lr: float = 0.1) -> Attack:
    """Inverting Gradients (Geiping et al. 2020): cosine likelihood, TV prior, signed Adam.

    Box-constrained iterates, signed gradients and a step schedule that divides
    the learning rate by 10 at 3/8, 5/8 and 7/8 of the run, as in their code.
    Defaults are the values the Bayes paper used with that code (§6): lr 0.1,
    TV weight 4·10⁻⁴ and 4000 iterations (its Soteria experiment). Pass
    ``bounds`` (:func:`~leakagelib.attacks.loop.image_bounds`) when calling.
    """
    config = AttackConfig(
        steps=steps,
        optimizer="adam",
        lr=lr,
        schedule="step",
        decay=0.1,
        beta=tv,
        signed=True,
        box=True,
    )
    return Attack("Inverting Gradients", Cosine(), TotalVariation(power=1), config)


def cpl(steps: int = 300, pattern_size: int = 4, label_weight: float = 0.0) -> Attack:
    """CPL (Wei et al. 2020): DLG's ℓ2 objective and L-BFGS from a patterned initialisation.

    The patterned seed is one random ``pattern_size`` × ``pattern_size`` patch
    tiled over the image; labels are read off the gradient as in iDLG. CPL's
    label-based regulariser ``α‖F(x; W) − y‖²`` (:class:`LabelAlignment`,
    bound to the attacked model when the attack runs) is the prior with
    weight ``α = label_weight``; the default 0 follows the authors' public
    notebook, where the term is commented out, and leaves a uniform prior.
    """
    if label_weight < 0:
        raise ValueError(f"label_weight must be non-negative, got {label_weight}")
    config = AttackConfig(
        steps=steps,
        optimizer="lbfgs",
        lr=1.0,
        schedule="constant",
        decay=1.0,
        beta=label_weight,
        init="pattern",
        pattern_size=pattern_size,
    )
    prior: Prior = LabelAlignment() if label_weight > 0 else Uniform()
    return Attack("CPL", Gaussian(sigma=_DLG_SIGMA), prior, config, labels="idlg")


def bayes(
    likelihood: Likelihood,
    *,
    prior: Prior | None = None,
    beta: float = 0.1,
    steps: int = 200,
    mc_samples: int = 1,
    delta: float = 0.0,
) -> Attack:
    """The approximate Bayes-optimal adversary (Algorithm 1) for a defense's likelihood.

    ``likelihood`` is ``defense.likelihood()``. Loop values from the authors'
    code (eth-sri/bayes-framework-leakage, scripts/run_mnist_tune.sh and
    attacks/grad_attack.py): N(0, 1) initialisation in normalised space, Adam
    with lr 0.5 and exponential decay 0.94 per step, 200 steps, their
    squared-difference TV prior. ``beta`` is the prior weight the paper tunes
    per attack (A.3; see :mod:`leakagelib.attacks.search`); ``mc_samples`` and
    ``delta`` are Algorithm 1's k and δ.
    """
    config = AttackConfig(
        steps=steps,
        optimizer="adam",
        lr=0.5,
        schedule="exponential",
        decay=0.94,
        beta=beta,
        mc_samples=mc_samples,
        delta=delta,
    )
    return Attack("Bayes", likelihood, prior or TotalVariation(power=2), config)


#: The presets that need no defense, by name (the Table 1 chapter iterates over these).
PRESETS = {"dlg": dlg, "idlg": idlg, "inverting-gradients": inverting_gradients, "cpl": cpl}
