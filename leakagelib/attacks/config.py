"""The loop's hyper-parameters: :class:`Setting` (what may differ inside one batch) and :class:`AttackConfig`.

Both validate on construction, so that a typo (``steps=2.5``, ``lr=nan``,
``decay=1.5``) fails where it is written, with a message that names the
argument and says what it should be, instead of deep inside a batched attack.
Used by every optimisation attack, first in the chapter "Existing attacks are
approximations".
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ..validation import require_count, require_number
from .likelihoods import WEIGHTINGS

__all__ = [
    "BEST_ITERATES",
    "ENGINES",
    "INITS",
    "OPTIMIZERS",
    "SCHEDULES",
    "AttackConfig",
    "Setting",
]

OPTIMIZERS = ("adam", "lbfgs")
SCHEDULES = ("exponential", "step", "constant", "plateau")
INITS = ("normal", "uniform", "zeros", "pattern")
ENGINES = ("auto", "hooks", "vmap")
BEST_ITERATES = ("recorded", "after-step")


def _choice(name: str, value: object, options: tuple[str, ...]) -> None:
    if value not in options:
        raise ValueError(f"unknown {name} {value!r}; use one of {options}")


@dataclass(frozen=True)
class Setting:
    """The hyper-parameters that may differ between attacks run in one batch.

    ``lr`` the initial learning rate, ``decay`` the schedule's factor, ``beta``
    the prior weight, ``weighting`` the layer weighting (``None``: the
    likelihood's own). ``beta_start`` is the prior weight at the first step
    when the config anneals it (``AttackConfig.anneal_steps``): the weight
    then moves geometrically from ``beta_start`` to ``beta``; ``None`` keeps
    ``beta`` throughout.
    """

    lr: float
    decay: float
    beta: float
    weighting: str | None = None
    beta_start: float | None = None

    def __post_init__(self) -> None:
        require_number("lr", self.lr, "the initial learning rate", low=0.0, low_open=True)
        require_number(
            "decay", self.decay, "the schedule's factor, at most 1", low=0.0, low_open=True
        )
        if self.decay > 1:
            raise ValueError(
                f"decay must be in (0, 1] (the schedule's factor; 1 keeps lr), got {self.decay!r}"
            )
        require_number("beta", self.beta, "the prior weight", low=0.0, low_open=False)
        if self.weighting is not None:
            _choice("layer weighting", self.weighting, WEIGHTINGS)
        if self.beta_start is not None:
            meaning = "the annealed prior weight's start, with beta > 0"
            require_number("beta_start", self.beta_start, meaning, low=0.0, low_open=True)
            if self.beta <= 0:
                raise ValueError(f"an annealed prior weight needs beta > 0, got {self.beta!r}")


@dataclass(frozen=True)
class AttackConfig:
    """How the loop runs: steps, optimiser, schedule, initialisation and sampling.

    * ``optimizer``: ``"adam"`` or ``"lbfgs"`` (``torch.optim.LBFGS``, one
      ``.step`` of up to ``lbfgs_iterations`` inner iterations per step, as DLG).
    * ``schedule``: ``"exponential"`` (lr · decay^(t / decay_every), the Bayes
      code), ``"step"`` (lr · decay at 3/8, 5/8 and 7/8 of the steps, Inverting
      Gradients), ``"plateau"`` (each attack's lr times ``decay`` once its
      objective has not improved by the relative ``plateau_threshold`` for more
      than ``plateau_patience`` steps: torch's ``ReduceLROnPlateau``, as the
      CVB authors run every attack) or ``"constant"``. The defaults 10 and
      10⁻⁴ are torch's; the CVB values are in :mod:`.presets`.
    * ``stop_patience``: stop an attack once its objective has not strictly
      decreased for this many steps; ``stop_below``: stop it once its lowest
      objective is below this value (``None``: never; the CVB authors'
      ``EarlyStopping`` and their 10⁻⁵, ``src/attacks.py``). A stopped attack
      keeps its iterate while the others of the batch go on.
    * ``keep_best``: return each attack's iterate of lowest recorded objective
      rather than its last (the CVB authors' loop). These three and the plateau
      schedule act per attack (:mod:`.control`). ``best_iterate`` says which
      iterate a step that improves the objective keeps: ``"recorded"``, the
      iterate ``x_t`` whose objective ``f(x_t)`` improved, or ``"after-step"``,
      the iterate ``x_{t+1}`` that the step from it reached, as the CVB authors'
      ``attack_batch`` stores it (``src/attacks.py``).
    * ``per_attack``: with L-BFGS, give every attack its own L-BFGS
      (history, step lengths, stopping tests;
      :func:`~leakagelib.attacks.lbfgs.lbfgs_per_attack`) even without the
      per-attack control above, so that each attack follows the path
      ``torch.optim.LBFGS`` would follow on its image alone, as DLG's code
      attacks one image (mit-han-lab/dlg, ``main.py``). Off, the attacks'
      objectives are summed into one ``torch.optim.LBFGS``, whose curvature
      pairs, step length and stopping tests then mix the attacks.
    * ``init``: ``"normal"`` (N(0, init_scale²) in the model's input space, the
      Bayes code), ``"uniform"`` (U within ``bounds``, or U(0, 1)), ``"zeros"``,
      or ``"pattern"`` (CPL's patterned initialisation: one random
      ``pattern_size × pattern_size`` patch tiled over the image).
    * ``signed``: use the sign of the objective's gradient (Inverting Gradients).
    * ``anneal_steps``: the steps over which the prior weight moves from each
      setting's ``beta_start`` to its ``beta`` (0: no annealing), as the Bayes
      authors' tuners schedule it (:func:`~leakagelib.attacks.optimizers.annealed`).
    * ``box``: clamp iterates into ``bounds`` after each step.
    * ``mc_samples`` (k) and ``delta`` (δ): Algorithm 1's Monte-Carlo samples,
      uniform in the ℓ2 ball of radius δ around the iterate.
    * ``optimize_labels``: optimise soft labels jointly with the inputs (DLG).
    * ``engine``: how the attacks' simulated updates are batched — ``"hooks"``
      (one forward and backward pass of all candidates, per-attack gradients
      from recorded activations, :mod:`.per_attack`; models whose rows are
      independent), ``"vmap"`` (:func:`torch.func.vmap` over attacks; any
      model) or ``"auto"`` (hooks where the model allows). Both give the same
      objective; only the speed differs (and, through a variational
      bottleneck, which noise each attack draws: the same distribution).
    """

    steps: int = 200
    optimizer: str = "adam"
    lr: float = 0.5
    schedule: str = "exponential"
    decay: float = 0.94
    decay_every: int = 1
    beta: float = 1.0
    weighting: str | None = None
    init: str = "normal"
    init_scale: float = 1.0
    pattern_size: int = 4
    restarts: int = 1
    signed: bool = False
    anneal_steps: int = 0
    box: bool = False
    mc_samples: int = 1
    delta: float = 0.0
    optimize_labels: bool = False
    lbfgs_iterations: int = 20
    lbfgs_history: int = 100
    engine: str = "auto"
    plateau_patience: int = 10
    plateau_threshold: float = 1e-4
    stop_patience: int | None = None
    stop_below: float | None = None
    keep_best: bool = False
    best_iterate: str = "recorded"
    per_attack: bool = False

    def __post_init__(self) -> None:
        require_count("steps", self.steps, "optimiser steps")
        require_count("restarts", self.restarts, "independent starts per attack")
        require_count("mc_samples", self.mc_samples, "Monte-Carlo samples k per step")
        require_count("lbfgs_iterations", self.lbfgs_iterations, "L-BFGS iterations per step")
        require_count("lbfgs_history", self.lbfgs_history, "L-BFGS history size")
        require_count("decay_every", self.decay_every, "steps per exponential decay")
        require_count("pattern_size", self.pattern_size, "side of CPL's tiled patch")
        _choice("optimizer", self.optimizer, OPTIMIZERS)
        _choice("schedule", self.schedule, SCHEDULES)
        _choice("init", self.init, INITS)
        _choice("engine", self.engine, ENGINES)
        _choice("best_iterate", self.best_iterate, BEST_ITERATES)
        require_number(
            "init_scale", self.init_scale, "the normal init's std", low=0.0, low_open=True
        )
        require_number(
            "delta", self.delta, "the Monte-Carlo ball's radius", low=0.0, low_open=False
        )
        self._check_control()
        require_count(
            "anneal_steps", self.anneal_steps, "steps the prior weight anneals over", low=0
        )
        if self.optimizer == "lbfgs" and (self.signed or self.mc_samples > 1 or self.anneal_steps):
            raise ValueError(
                "L-BFGS needs a deterministic objective: no signed gradients, MC samples or "
                "annealed prior weight"
            )
        self.setting()  # validates lr, decay, beta and weighting

    def _check_control(self) -> None:
        """Validate the plateau schedule's and early stopping's fields."""
        require_count("plateau_patience", self.plateau_patience, "bad steps before lr drops", low=0)
        require_number("plateau_threshold", self.plateau_threshold, "the relative improvement that "
                "counts, below 1", low=0.0, low_open=False)  # fmt: skip
        if self.plateau_threshold >= 1:
            raise ValueError(f"plateau_threshold must be below 1, got {self.plateau_threshold!r}")
        if self.schedule == "plateau" and self.decay == 1:
            raise ValueError("decay must be below 1 with schedule='plateau' (the lr's factor)")
        if self.stop_patience is not None:
            require_count(
                "stop_patience", self.stop_patience, "steps without improvement before a stop"
            )
        if self.stop_below is not None:
            require_number("stop_below", self.stop_below, "the objective that ends an attack",
                    low=-math.inf, low_open=True)  # fmt: skip
        if not isinstance(self.keep_best, bool):
            raise TypeError(f"keep_best must be True or False, got {self.keep_best!r}")
        if not isinstance(self.per_attack, bool):
            raise TypeError(f"per_attack must be True or False, got {self.per_attack!r}")

    @property
    def watched(self) -> bool:
        """Whether the loop keeps per-attack state (:mod:`.control`): plateau, stops, best
        iterate, or L-BFGS per attack (``per_attack``)."""
        return (
            self.per_attack
            or self.schedule == "plateau"
            or self.stop_patience is not None
            or self.stop_below is not None
            or self.keep_best
        )

    @property
    def resumable(self) -> bool:
        """Whether the loop can resume from a checkpoint (:mod:`.checkpoint`): Adam, or L-BFGS
        per attack; torch's own L-BFGS on the summed objective cannot."""
        return self.optimizer == "adam" or self.watched

    def setting(self) -> Setting:
        """This configuration's own hyper-parameters as a :class:`Setting`."""
        return Setting(self.lr, self.decay, self.beta, self.weighting)

    def with_(self, **changes: object) -> AttackConfig:
        """A copy with ``changes`` applied."""
        return replace(self, **changes)
