"""Checkpoints of a running attack loop: a long attack killed halfway resumes where it was.

A paper-scale unit of the CVB tables is one attack of 20,000 Inverting
Gradients iterations (or 2,000 L-BFGS steps) on 128 victims: on this
project's CPU an hour or more, on a lent GPU more than one command may run.
Killed before its end (a session that closes, a command's time limit), the
unit was lost whole. With a :class:`LoopCheckpoint` the optimiser writes its
whole state every ``every_s`` seconds — the step, the iterates, Adam's
moments or each attack's L-BFGS history, the per-attack control of
:class:`~leakagelib.attacks.control.Watch` (learning rates, counters, stop
flags, best iterates), the per-step objective so far, and the random number
generators the loop draws from (the Monte-Carlo ball samples and torch's
global generator, from which a variational bottleneck draws its noise) — and
a new run of the same attack continues from it. The resumed attack then ends
exactly where the uninterrupted one would have (``tests/test_attack_checkpoint.py``);
only ``callback`` misses the steps run before the interruption. Federated
training (:func:`leakagelib.fedavg.federated_averaging`) saves itself through
the same class after a round, with its own state.

Stopped by a signal (``timeout`` on a lent GPU sends SIGTERM; Ctrl-C sends
SIGINT), the command line's handler :func:`stop_gracefully` lets a running
attack finish its step, save, and stop; outside an attack it stops at once.

The file belongs to one attack: a fingerprint of the loop's config, the
settings, the batch's shape and the observed updates is stored with it, and a
checkpoint of another attack is refused by name. The updates are known by
each tensor's sum and sum of squares, compared to the last bit and, failing
that, to a relative :data:`SUMS_TOLERANCE`: the same victims' updates
computed on another number of threads differ in their last bits (a resume
of a Table IV unit on one thread, started on two, was refused), the updates
of other victims or another model by far more. A checkpoint resumes on the
device it was saved on, whose random generators it restores; another device
is refused by name. Files are written atomically and read with
``weights_only=True``.
:meth:`leakagelib.experiments.Context.checkpoint` gives one to every attack of
a paper-scale unit run from the command line (``reproduce --out``), beside
its partial record.
"""

from __future__ import annotations

import hashlib
import math
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import torch
from torch import Tensor

__all__ = [
    "CHECKPOINT_EVERY_S",
    "Fingerprint",
    "LoopCheckpoint",
    "SUMS_TOLERANCE",
    "fingerprint",
    "remaining",
    "restore",
    "stop_gracefully",
]

#: Seconds between two checkpoints of a running attack: at most this much work is lost.
CHECKPOINT_EVERY_S = 300.0

#: How far (relative) the observed updates' sums may move between the run that saved a
#: checkpoint and the one that resumes it: float32 rounding of one set of updates on another
#: number of threads moves them by about 1e-7.
SUMS_TOLERANCE = 1e-5

#: How many attack loops with a checkpoint are running, and whether a signal asked them to stop.
_LOOPS = {"running": 0, "stop": False}


def stop_gracefully(signum: int, frame: FrameType | None) -> None:
    """A signal handler (``reproduce`` and ``campaign`` install it for SIGTERM and SIGINT): a
    running attack (or training) saves at the end of its step (round) and stops (:meth:`LoopCheckpoint.tick`);
    without one, or at a second signal, the run stops at once (``KeyboardInterrupt``)."""
    if _LOOPS["running"] and not _LOOPS["stop"]:
        _LOOPS["stop"] = True
        return
    raise KeyboardInterrupt


@dataclass(frozen=True)
class Fingerprint:
    """What a checkpoint belongs to (:func:`fingerprint`): ``exact``, a digest of everything to
    the last bit; ``layout``, a digest of the ``parts`` and the tensors' names and shapes; and
    ``sums``, every tensor's element count, sum and sum of squares (float64)."""

    exact: str
    layout: str
    sums: tuple[tuple[int, float, float], ...]

    def matches(self, saved: Mapping[str, Any]) -> bool:
        """Whether a saved checkpoint's fingerprint is this one: to the last bit, or with the
        same layout and sums within :data:`SUMS_TOLERANCE` (a sum, which may cancel to near
        zero, on the scale ``√(n·Σx²)`` that bounds it)."""
        if saved.get("key") == self.exact:
            return True
        theirs = saved.get("sums")
        if saved.get("layout") != self.layout or theirs is None or len(theirs) != len(self.sums):
            return False
        return all(
            abs(sq - sq2) <= SUMS_TOLERANCE * max(sq, sq2)
            and abs(total - total2) <= SUMS_TOLERANCE * math.sqrt(n * max(sq, sq2))
            for (n, total, sq), (_, total2, sq2) in zip(self.sums, theirs, strict=True)
        )


def fingerprint(parts: Sequence[Any], observed: Mapping[str, Tensor]) -> Fingerprint:
    """The :class:`Fingerprint` of an attack (or a training run): the ``repr`` of ``parts``
    (config, settings, shape) and, for every tensor of ``observed``, its name, shape, sum and
    sum of squares (float64)."""
    exact = hashlib.sha256("|".join(map(repr, parts)).encode())
    layout = exact.copy()
    sums = []
    for name in sorted(observed):
        t = observed[name].detach().double()
        total, square = float(t.sum()), float(t.square().sum())
        exact.update(f"{name}:{tuple(t.shape)}:{total!r}:{square!r}".encode())
        layout.update(f"{name}:{tuple(t.shape)}".encode())
        sums.append((t.numel(), total, square))
    return Fingerprint(exact.hexdigest(), layout.hexdigest(), tuple(sums))


class LoopCheckpoint:
    """The checkpoint file ``path`` of one attack loop, saved at most every ``every_s`` seconds
    (default :data:`CHECKPOINT_EVERY_S`).

    :func:`leakagelib.attacks.loop.run_attack` calls :meth:`bind` with the
    attack's fingerprint and its ball-sample generator; the optimisers
    (:func:`~leakagelib.attacks.optimizers.adam_loop`,
    :func:`~leakagelib.attacks.lbfgs.lbfgs_per_attack`) call :meth:`load`
    before their first step, :meth:`tick` after every step and once more,
    with ``final=True``, after their last: a run that finds a final state
    returns it without a step (a unit killed after its attack, while training,
    keeps the attack); delete the file to run the attack afresh.
    """

    def __init__(self, path: str | os.PathLike, *, every_s: float | None = None) -> None:
        self.path = Path(path)
        self.every_s = CHECKPOINT_EVERY_S if every_s is None else every_s
        self.key = Fingerprint("", "", ())
        self.generators: list[torch.Generator] = []
        self.saved_at = self.started = time.monotonic()
        #: Seconds the loop ran in earlier processes, up to the state :meth:`load` found.
        self.earlier_s = 0.0

    def __enter__(self) -> LoopCheckpoint:
        """The loop is running: a signal now lets it save first (:func:`stop_gracefully`)."""
        _LOOPS["running"] += 1
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        """The loop has ended; a signal that came after its last save stops the run now."""
        _LOOPS["running"] -= 1
        if _LOOPS["stop"] and not _LOOPS["running"]:
            _LOOPS["stop"] = False
            if exc_type is None:
                raise KeyboardInterrupt(f"stopped after the attack; it is saved in {self.path}")

    def bind(self, key: Fingerprint, generators: Sequence[torch.Generator]) -> None:
        """Tie the file to the attack ``key`` (:func:`fingerprint`) and the generators it draws from."""
        self.key, self.generators = key, list(generators)

    def load(self) -> dict[str, Any] | None:
        """The saved loop state (``step``: the next step to run), with the generators restored;
        ``None`` when there is no file. A file of another attack raises, naming it."""
        if not self.path.exists():
            return None
        saved = torch.load(self.path, map_location="cpu", weights_only=True)
        if not self.key.matches(saved):
            raise ValueError(
                f"{self.path} is the checkpoint of another attack (its config, batch or updates "
                "differ); delete it to start this attack afresh"
            )
        devices = [str(gen.device) for gen in self.generators]
        if saved.get("devices", devices) != devices:
            raise ValueError(
                f"{self.path} was saved by the attack running on {', '.join(saved['devices'])}; "
                f"resume it there (this run is on {', '.join(devices)}), or delete it to start "
                "this attack afresh"
            )
        torch.set_rng_state(saved["torch_rng"])
        if torch.cuda.is_available() and saved.get("cuda_rng") is not None:
            torch.cuda.set_rng_state(saved["cuda_rng"])
        for gen, state in zip(self.generators, saved["generators"], strict=True):
            gen.set_state(state)
        self.saved_at = self.started = time.monotonic()
        self.earlier_s = float(saved["seconds"])
        return saved["loop"]

    def tick(self, step: int, state: Callable[[], dict[str, Any]], *, final: bool = False) -> None:
        """After ``step``: save ``state()`` (the loop's; ``step + 1`` is the next to run) when
        due, or at once with ``final`` (the loop has ended: ``finished`` is saved with it) or
        when a signal asked the run to stop, which it then does (``KeyboardInterrupt``)."""
        stop = _LOOPS["stop"]
        if not (final or stop) and time.monotonic() - self.saved_at < self.every_s:
            return
        loop = {**state(), "step": step + 1, "finished": final}
        saved = {
            "key": self.key.exact,
            "layout": self.key.layout,
            "sums": [list(t) for t in self.key.sums],
            "loop": loop,
            "seconds": self.earlier_s + time.monotonic() - self.started,
            "torch_rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state() if torch.cuda.is_available() else None,
            "generators": [gen.get_state() for gen in self.generators],
            "devices": [str(gen.device) for gen in self.generators],
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        torch.save(saved, tmp)
        os.replace(tmp, self.path)
        self.saved_at = time.monotonic()
        if stop:
            _LOOPS["stop"] = False
            raise KeyboardInterrupt(
                f"stopped after step {step}; the attack is saved in {self.path}"
            )


def restore(
    checkpoint: LoopCheckpoint | None, tensors: Mapping[str, Tensor], parts: Mapping[str, Any]
) -> tuple[int, bool, list[float]]:
    """Bring a loop back to its saved state, if ``checkpoint`` holds one.

    ``tensors`` are the loop's tensors, overwritten in place by the saved
    ones of the same name; ``parts`` are objects with ``load_state_dict``
    (:class:`~leakagelib.attacks.control.Watch`, the L-BFGS history) or
    ``None``. Returns the step to run next, whether the loop had ended, and
    the per-step objective so far (``0, False, []`` without a saved state).
    """
    saved = None if checkpoint is None else checkpoint.load()
    if saved is None:
        return 0, False, []
    for name, tensor in tensors.items():
        tensor.copy_(saved[name])
    for name, part in parts.items():
        if part is not None:
            part.load_state_dict(saved[name])
    return int(saved["step"]), bool(saved["finished"]), list(saved["history"])


def remaining(steps: Iterable[int], start: int, ended: bool) -> Iterator[int]:
    """The steps of ``steps`` still to run after :func:`restore`: from ``start`` on, none if
    the loop had ended (a progress bar wrapping ``steps`` still counts the skipped ones)."""
    if ended:
        return
    yield from (t for t in steps if t >= start)
