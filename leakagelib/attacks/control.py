"""Per-attack control of the loop: a plateau schedule, early stopping and the best iterate.

The CVB authors' attack loop (dAI-SY-Group/ConvolutionalVariationalBottleneck,
``src/attacks.py``, ``IterativeGradientInversionAttack.attack_batch``) watches
the reconstruction loss ``f(x_t)`` of every step and

* lowers the learning rate by a factor when ``f`` has not improved for
  ``patience`` steps (``torch.optim.lr_scheduler.ReduceLROnPlateau`` with
  torch's defaults: mode ``min``, relative threshold 10⁻⁴, no cooldown,
  a change below 10⁻⁸ skipped; ``src/utils.py``, ``set_scheduler``);
* stops when ``f`` has not strictly improved for ``patience`` steps
  (``src/utils.py``, ``EarlyStopping`` with ``delta: 0``) or when the lowest
  ``f`` so far is below a threshold (10⁻⁵ in ``attack_batch``);
* returns the iterate it stored when ``f`` last improved: the iterate
  *after* the step whose starting loss improved (``x_{t+1}``, the loss being
  ``f(x_t)``; ``best_reconstructed_data = dummy_data`` after
  ``optimizer.step``).

Our loop runs many independent attacks as one tensor program, so
:class:`Watch` keeps all of that *per attack*: each attack (a setting, an
update and a restart: a cell of ``H × N × R``) has its own learning rate,
counters, stop flag and best iterate, and a stopped attack no longer
changes. Each attack therefore follows exactly the path it would follow if
run alone. Which iterate an improvement keeps is the config's
``best_iterate``: ``"after-step"`` is the authors' ``x_{t+1}``; ``"recorded"``
(the default) keeps ``x_t`` itself, the iterate whose objective was
recorded. The two part where a step from the best iterate diverges: the
authors' rule then returns the diverged iterate. On the first 32 of the CVB
authors' stored CIFAR-10 victims, with ``cvb-cnn``'s seed-0 weights, our
iDLG gave mean SSIM 0.51 with ``"recorded"`` and 0.46 with ``"after-step"``
(paired difference 0.05 ± 0.05, 95 % interval), our CPL 0.38 and 0.29
(0.09 ± 0.05); the authors' code gave 0.41 and 0.33, the paper 0.43 and
0.32 (this CPU, 2026-11-27; :mod:`leakagelib.experiments.cvb_defenses` has
the runs).

Used by :func:`leakagelib.attacks.optimizers.adam_loop` and
:func:`leakagelib.attacks.lbfgs.lbfgs_per_attack` when an
:class:`~leakagelib.attacks.config.AttackConfig` asks for any of it (first in
the chapter "Variational bottlenecks").
"""

from __future__ import annotations

import torch
from torch import Tensor

from .config import AttackConfig

__all__ = ["PLATEAU_MIN_CHANGE", "Watch"]

#: ReduceLROnPlateau's ``eps``: a reduction that changes lr by less than this is skipped (torch's default).
PLATEAU_MIN_CHANGE = 1e-8


def _broadcast(per_attack: Tensor, like: Tensor) -> Tensor:
    """``per_attack`` (``H × N × R``) with trailing singleton dims to broadcast against ``like``."""
    return per_attack.reshape(per_attack.shape + (1,) * (like.dim() - per_attack.dim()))


class Watch:
    """The per-attack state of one run: learning rates, counters, stop flags, best iterates.

    ``lr`` holds each attack's initial learning rate (``H × N × R``). Per
    step, the optimiser calls :meth:`record` with ``f(x_t)`` and the iterates
    ``x_t`` (before the step), then :meth:`settle` after the step to keep
    stopped attacks where they were and to update the schedule and the stop
    flags from ``f(x_t)``.
    """

    def __init__(self, config: AttackConfig, lr: Tensor) -> None:
        self.config = config
        self.lr = lr.clone()
        inf = torch.full_like(lr, float("inf"))
        self.best = inf.clone()  # lowest f(x_t) so far (best iterate, early stopping)
        self.plateau_best = inf  # the plateau schedule's reference value
        self.bad_steps = torch.zeros_like(lr, dtype=torch.long)  # since the plateau reference
        self.stale_steps = torch.zeros_like(lr, dtype=torch.long)  # since the last improvement
        self.active = torch.ones_like(lr, dtype=torch.bool)
        self.best_x: Tensor | None = None
        self.best_z: Tensor | None = None
        self.improved: Tensor | None = None  # this step's improvements, for "after-step"

    #: The attributes that make up the state (:meth:`state_dict`), in a checkpoint's order.
    STATE = ("lr", "best", "plateau_best", "bad_steps", "stale_steps", "active", "best_x", "best_z")

    def state_dict(self) -> dict[str, Tensor | None]:
        """The per-attack state, for a checkpoint (:mod:`leakagelib.attacks.checkpoint`)."""
        return {name: getattr(self, name) for name in self.STATE}

    def load_state_dict(self, state: dict[str, Tensor | None]) -> None:
        """Take back a :meth:`state_dict`, on the device of the current ``lr``."""
        for name in self.STATE:
            value = state[name]
            setattr(self, name, None if value is None else value.to(self.lr.device))

    def record(self, value: Tensor, x: Tensor, z: Tensor) -> None:
        """Note ``f(x_t)`` of every attack; an active attack that improves keeps ``x_t`` as its
        best (``best_iterate="recorded"``), or the iterate :meth:`settle` receives after this
        step (``"after-step"``)."""
        improved = self.active & (value < self.best)
        self.best = torch.where(improved, value, self.best)
        if self.config.best_iterate == "after-step":
            self.improved = improved
        else:
            self._keep(improved, x, z)
        self.stale_steps = torch.where(improved, 0, self.stale_steps + self.active.long())

    def _keep(self, improved: Tensor, x: Tensor, z: Tensor) -> None:
        """Store ``x`` and ``z`` as the best iterates of the attacks that ``improved``."""
        if not self.config.keep_best:
            return
        if self.best_x is None:
            self.best_x, self.best_z = x.clone(), z.clone()
        self.best_x = torch.where(_broadcast(improved, x), x, self.best_x)
        self.best_z = torch.where(_broadcast(improved, z), z, self.best_z)

    def settle(
        self, value: Tensor, x: tuple[Tensor, Tensor], z: tuple[Tensor, Tensor]
    ) -> tuple[Tensor, Tensor]:
        """The iterates after a step, ``(before, after)`` pairs of inputs ``x`` and labels ``z``.

        Stopped attacks keep their ``before``; with ``best_iterate="after-step"``
        the attacks that improved at this step store its result as their best;
        then the schedule and the stop flags see ``f(x_t)`` = ``value``.

        The plateau rule (ReduceLROnPlateau, mode ``min``, relative threshold):
        ``f(x_t) < best·(1 − threshold)`` resets the count of bad steps, and
        more than ``plateau_patience`` bad steps multiply lr by the factor
        (``decay``) and reset the count.
        """
        kept = tuple(torch.where(_broadcast(self.active, a), a, b) for b, a in (x, z))
        if self.improved is not None:  # "after-step": the step's result is the best iterate
            self._keep(self.improved, *kept)
            self.improved = None
        config = self.config
        if config.schedule == "plateau":
            better = value < self.plateau_best * (1 - config.plateau_threshold)
            self.plateau_best = torch.where(better & self.active, value, self.plateau_best)
            self.bad_steps = torch.where(better, 0, self.bad_steps + 1)
            reduce = self.active & (self.bad_steps > config.plateau_patience)
            lowered = self.lr * config.decay
            change = reduce & (self.lr - lowered > PLATEAU_MIN_CHANGE)
            self.lr = torch.where(change, lowered, self.lr)
            self.bad_steps = torch.where(reduce, 0, self.bad_steps)
        stop = torch.zeros_like(self.active)
        if config.stop_patience is not None:
            stop |= self.stale_steps >= config.stop_patience
        if config.stop_below is not None:
            stop |= self.best < config.stop_below
        self.active = self.active & ~stop
        return kept[0], kept[1]

    def finished(self) -> bool:
        """Whether every attack has stopped."""
        return not bool(self.active.any())

    def result(self, x: Tensor, z: Tensor) -> tuple[Tensor, Tensor]:
        """The iterates to return: the best ones with ``keep_best``, else the last ones."""
        if self.config.keep_best and self.best_x is not None:
            return self.best_x, self.best_z  # type: ignore[return-value]
        return x, z
