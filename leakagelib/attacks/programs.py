"""The search's batched programs: split to fit the device, and kept as they finish.

A stage of A.3's search (:func:`leakagelib.attacks.search.search`) runs all its
candidates on all tuning victims as one batched program. At paper scale that
is large: a CIFAR-10 unit of the Bayes paper's Table 2 tunes three heuristic
attacks and the Bayes attack on ten victims, so its grid stage is
(3 · 480 + 540) · 10 = 19,800 attacks of 3 × 32 × 32 images in one program. A
lent H200 runs it in a minute or two; on this project's 24 GiB CPU machine it
was killed for memory (2026-11-28). :class:`Programs` therefore splits a stage
into pieces of at most :data:`CPU_PROGRAM_ATTACKS` attacks on a CPU (the whole
stage on a GPU, halved each time a piece runs out of its memory: a CIFAR-10
unit's grid stage had run out of an H100's 79 GiB before the allocator's
segments were made growable, and a 16 GB Colab GPU holds far less). Every
piece starts from the generator's state at the start of
the stage, so it draws the same starting iterates as the whole stage would:
the candidates of a stage share them (common random numbers), and the loop
draws them, and its ball samples, for one candidate and repeats them.

Hours of search on a CPU must survive a session's end: given a
:class:`~leakagelib.attacks.checkpoint.LoopCheckpoint`, the scores of the
finished pieces, each with the generator's state after it, are saved at most
every few minutes and once more at the end; a search run again with the
same checkpoint replays the saved pieces in order instead of running them,
then continues. ``tests/test_search.py`` checks that a search split into
pieces, and one killed and resumed, gives the whole stage's scores.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from typing import Any

import numpy as np
import torch

from .checkpoint import LoopCheckpoint

__all__ = ["CPU_PROGRAM_ATTACKS", "Programs", "piece_size"]

#: Most attacks (candidates × tuning updates) in one batched program of the search on a CPU.
#: Measured on the first stage of a Table 2 CIFAR-10 unit (147 candidates × 10 victims, 10
#: steps, one thread, 2026-11-28): the whole stage as one program took 71 s, pieces of 490,
#: 300, 150, 100 and 50 attacks 64, 60, 56, 53 and 58 s. Small pieces stay in the caches
#: and reuse the allocator's memory; below about a hundred, the per-step overhead of a
#: program shows.
CPU_PROGRAM_ATTACKS = 128


def piece_size(device: torch.device, updates: int, size: int | None = None) -> int | None:
    """Candidates per program: ``size // updates`` (at least one), ``size`` defaulting to
    :data:`CPU_PROGRAM_ATTACKS` on a CPU; ``None`` (a stage at once) on a GPU without ``size``."""
    if size is None:
        if device.type != "cpu":
            return None
        size = CPU_PROGRAM_ATTACKS
    if size < 1:
        raise ValueError(f"a program needs at least one attack, got size {size}")
    return max(1, size // updates)


class Programs:
    """Runs the stages of a search as programs of at most ``size`` candidates (``None``: a stage at
    once), with ``run`` (candidates → one score each), saving them in ``checkpoint``.

    ``generator`` is the one ``run`` draws from; the checkpoint must already be bound to the
    search (:meth:`LoopCheckpoint.bind`, no generators of its own).
    """

    def __init__(
        self,
        run: Callable[[Sequence[Any]], np.ndarray],
        generator: torch.Generator,
        size: int | None,
        checkpoint: LoopCheckpoint | None,
    ) -> None:
        self.run, self.gen, self.size, self.checkpoint = run, generator, size, checkpoint
        saved = None if checkpoint is None else checkpoint.load()
        #: The finished programs' scores and the generator's state after each, in order.
        self.done: list[tuple[torch.Tensor, torch.Tensor]] = (
            [] if saved is None else list(zip(saved["scores"], saved["rng"], strict=True))
        )
        self.count = 0

    def guard(self) -> LoopCheckpoint | nullcontext:
        """Enter around the search: a stop signal then lets the running program end and save."""
        return self.checkpoint if self.checkpoint is not None else nullcontext()

    def stage(self, candidates: Sequence[Any]) -> np.ndarray:
        """Every candidate's score, the stage split into programs that start alike.

        A program that runs out of GPU memory is run again as two of half its size, and so
        are the search's later programs (the scores do not depend on the split, so nothing
        else changes), for GPUs smaller than the lent ones (simulated in the tests; no such
        GPU has run it yet). A program replayed from the checkpoint keeps the size it was
        run at.
        """
        start, scores, lo = self.gen.get_state(), [], 0
        while lo < len(candidates):
            step = self._step(len(candidates))
            self.gen.set_state(start)
            try:
                scores.append(self._program(candidates[lo : lo + step]))
                lo += step
                continue
            except torch.cuda.OutOfMemoryError:
                if step == 1:
                    raise
            # out of the handler, whose traceback held the failed program's tensors
            self.size = step // 2
            torch.cuda.empty_cache()
            warnings.warn(
                f"a program of {step} candidates ran out of GPU memory; the search goes on in "
                f"programs of {self.size}",
                RuntimeWarning,
                stacklevel=2,
            )
        return np.concatenate(scores)

    def _step(self, total: int) -> int:
        """Candidates in the next program: a replayed program's, else ``size`` or the stage's
        ``total`` if smaller (or without a size)."""
        if self.count < len(self.done):
            return len(self.done[self.count][0])
        return max(1, min(self.size or total, total))

    def _program(self, candidates: Sequence[Any]) -> np.ndarray:
        """One program's scores: replayed from the checkpoint, or run and saved."""
        index = self.count
        if index < len(self.done):
            scores, rng = self.done[index]
            if len(scores) != len(candidates):
                raise ValueError(
                    f"program {index} of the checkpoint scored {len(scores)} candidates, this "
                    f"search has {len(candidates)} there; delete {self.checkpoint.path} to search afresh"
                )
            self.gen.set_state(rng)
            self.count += 1
            return scores.numpy()
        scores = np.asarray(self.run(candidates), dtype=np.float64)
        self.done.append((torch.from_numpy(scores.copy()), self.gen.get_state()))
        self.count += 1
        if self.checkpoint is not None:
            self.checkpoint.tick(index, self._state)
        return scores

    def finish(self) -> None:
        """Save every program's scores once more, marked final (the search has ended)."""
        if self.checkpoint is not None:
            self.checkpoint.tick(self.count - 1, self._state, final=True)

    def _state(self) -> dict[str, Any]:
        return {"scores": [s for s, _ in self.done], "rng": [r for _, r in self.done]}
