"""How the Bayes authors trained the networks they attack after a few steps (Figs. 2, 3 and 5).

The paper gives the batch size (32, A.1 and A.2) and nothing else; the
authors' code (eth-sri/bayes-framework-leakage) gives the rest.

* **ATS and Soteria** networks were trained with the authors' copy of the
  Inverting Gradients library (``README.md``: "All our models have been trained
  with the Inverting Gradients library, the adapted code for which (for
  step-wise training) can be found in the repository of our attack on ATS"):
  ``defense_attacks/ats/benchmark/cifar_train.py`` runs
  ``inversefed.training_strategy('conservative')`` — SGD at lr 0.1, momentum
  0.9, Nesterov, weight decay 5·10⁻⁴ (``inversefed/optimization_strategy.py``,
  ``ConservativeStrategy``; ``training/training_routine.py``,
  ``set_optimizer``) — with the batch size set to 32. Its scheduler is a
  ``MultiStepLR`` (γ = 0.1) stepped after each epoch, with milestones
  ``epochs // 2.667``, ``epochs // 1.6`` and ``epochs // 1.142`` of the run's
  own epoch count (:func:`inversefed_milestones`). A run for ``--steps s``
  sets ``epochs = 1`` and stops after ``s`` batches, so its three milestones
  are all 0 and the rate is 0.1 · 0.1³ = 10⁻⁴ from the first step (PyTorch's
  schedulers apply a milestone 0 when they are built; checked with the pinned
  PyTorch). A run for ``--epochs e`` saves ``{arch}_{e}.pth``, and the Soteria
  attack loads ``models/ConvBig_{e}.pth`` for its point after ``e`` epochs
  (``defense_attacks/soteria/reconstruct_image_set.py``), so each of Fig. 2's
  Soteria epochs is its own run with its own schedule (:func:`epoch_run`),
  while the step-wise points (ATS's, and Soteria's after 10 steps for Figs. 3
  and 5) are the steps of one run at 10⁻⁴ (:func:`stepwise_run`).
  ATS trains on its augmentation (crop, flip and policy: ``benchmark/comm.py``,
  mode ``aug``); the Soteria network trains without defense (A.1) and, as the
  authors do not say which of ``cifar_train.py``'s modes they ran, here
  without augmentation (``normal``, ours).
* **PRECODE** (``defense_attacks/precode/train.py``): Adam at lr 5·10⁻³ with
  weight decay 10⁻⁵ (its per-epoch exponential decay does not act within the
  10 steps Fig. 3 attacks after), and the bottleneck's KL term, summed over the
  code in nats and averaged over the batch, weighted 0.003
  (:data:`PRECODE_KL_WEIGHT_BITS` in this library's convention).

Used by :mod:`.bayes_soteria`, :mod:`.bayes_defenses` and :mod:`.bayes_precode`
(the chapter "Breaking heuristic defenses").
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

__all__ = [
    "CONSERVATIVE",
    "PRECODE_KL_WEIGHT_BITS",
    "PRECODE_TRAINING",
    "epoch_rates",
    "epoch_run",
    "inversefed_milestones",
    "shared_epochs",
    "stepwise_run",
]

#: inversefed's "conservative" strategy as :func:`leakagelib.fl.train` takes it (module docstring).
CONSERVATIVE: dict[str, Any] = {
    "optimizer": "sgd",
    "lr": 0.1,
    "momentum": 0.9,
    "nesterov": True,
    "weight_decay": 5e-4,
}

#: The PRECODE MLP's optimiser (``defense_attacks/precode/train.py``: ``optim.Adam(...,
#: lr=0.005, weight_decay=1e-5)``).
PRECODE_TRAINING: dict[str, Any] = {"optimizer": "adam", "lr": 5e-3, "weight_decay": 1e-5}

#: ``train.py``'s ``0.003 * kl_loss`` (KL in nats) as the β of
#: :class:`~leakagelib.defenses.PRECODE`, whose KL is in bits: 0.003 · ln 2.
PRECODE_KL_WEIGHT_BITS = 0.003 * math.log(2.0)


def inversefed_milestones(epochs: int) -> list[int]:
    """The epochs after which a run of ``epochs`` epochs drops its rate tenfold.

    ``training_routine.set_optimizer`` of the authors' ATS copy:
    ``[epochs // 2.667, epochs // 1.6, epochs // 1.142]`` (floats, floored);
    a milestone may repeat, and each drops the rate once.
    """
    return [int(epochs // d) for d in (2.667, 1.6, 1.142)]


def epoch_rates(epochs: int) -> list[float]:
    """The learning rate during each epoch of the authors' run of ``epochs`` epochs (a
    step-wise run's is ``epoch_rates(1)``); the chapter "Breaking heuristic defenses" lists
    them."""
    drops = inversefed_milestones(epochs)
    return [CONSERVATIVE["lr"] * 0.1 ** sum(m <= e for m in drops) for e in range(epochs)]


def epoch_run(epochs: int, steps_per_epoch: int) -> dict[str, Any]:
    """:func:`leakagelib.fl.train`'s settings for the authors' run of ``epochs`` epochs.

    The conservative strategy with the run's milestones in steps (an epoch is
    ``steps_per_epoch`` batches), and ``steps``: all of them.
    """
    milestones = [m * steps_per_epoch for m in inversefed_milestones(epochs)]
    return {**CONSERVATIVE, "milestones": milestones, "steps": epochs * steps_per_epoch}


def stepwise_run(steps: int) -> dict[str, Any]:
    """:func:`leakagelib.fl.train`'s settings for the authors' ``--steps`` run: one epoch's
    schedule (every milestone 0, so lr 10⁻⁴ throughout), stopped after ``steps`` batches."""
    return {**CONSERVATIVE, "milestones": inversefed_milestones(1), "steps": steps}


def shared_epochs(epochs: int, others: Iterable[int]) -> list[int]:
    """For each run of ``others`` epochs, the number of first epochs (≥ 1) whose rates
    (:func:`epoch_rates`) the run of ``epochs`` epochs shares with it, as a sorted list. Runs
    with one seed on one data draw the same batches, so after those epochs both stand in one
    state, and the later run can continue from the earlier's (:class:`leakagelib.fl.TrainState`). For
    Fig. 2's ten Soteria runs, trained in turn from the shortest, this trains 35 epochs
    instead of 55."""
    mine, points = epoch_rates(epochs), set()
    for other in others:
        theirs = epoch_rates(other) if other != epochs else []
        pairs = zip(mine, theirs, strict=False)  # the shorter run's epochs
        agree = next((k for k, (a, b) in enumerate(pairs) if a != b), min(len(mine), len(theirs)))
        if agree:
            points.add(agree)
    return sorted(points)
