"""L-BFGS per attack, all attacks of a batch in one program: the CVB authors' iDLG and CPL loop.

:func:`leakagelib.attacks.optimizers.lbfgs_loop` hands the *summed*
objective of a batch to one ``torch.optim.LBFGS``; its curvature pairs and
inner products then mix the attacks, and one learning rate serves all of
them. The CVB authors run each image's attack alone with its own L-BFGS,
``ReduceLROnPlateau`` and early stopping (``src/attacks.py``,
``configs/attacks/iDLG.yaml`` and ``CPL.yaml``). :func:`lbfgs_per_attack`
does that for a whole batch at once: the algorithm of ``torch.optim.LBFGS``
without line search (two-loop recursion over the last ``lbfgs_history``
curvature pairs, first step ``min(1, 1/‖g‖₁)·lr``, torch's tolerances 10⁻⁷ on
the gradient and 10⁻⁹ on changes, at most ``lbfgs_iterations`` iterations and
``⌊5/4·lbfgs_iterations⌋`` evaluations per step), with every scalar — step
length, history, curvature scale, stop tests — kept per attack. An attack
that stops early in a step waits, unchanged, while the others finish it; the
objective is evaluated for all attacks at once. Each attack follows the
path torch's L-BFGS would follow on it alone.

Used when an L-BFGS :class:`~leakagelib.attacks.config.AttackConfig` is
``watched`` (plateau schedule, early stopping, best iterate); the chapter
"Variational bottlenecks" runs iDLG and CPL with it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import Tensor

from .checkpoint import LoopCheckpoint, remaining, restore
from .config import AttackConfig
from .control import Watch

__all__ = ["TOLERANCE_CHANGE", "TOLERANCE_GRAD", "lbfgs_per_attack"]

#: torch.optim.LBFGS's defaults: a gradient this small ends a step; so do changes this small.
TOLERANCE_GRAD, TOLERANCE_CHANGE = 1e-7, 1e-9
#: torch.optim.LBFGS keeps a curvature pair only when ``y·s`` exceeds this.
CURVATURE_MIN = 1e-10


def _dot(a: Tensor, b: Tensor) -> Tensor:
    return (a * b).sum(1)


class _History:
    """Each attack's last ``m`` curvature pairs, its step and its last gradient.

    The pairs sit in a ring per attack: ``pos`` is the slot the next pair
    goes to and ``count`` how many are stored, so a new pair is one indexed
    write of its attacks' rows, not a shift of the whole ``attacks × m × dim``
    history (which, at 100 attacks of 3×32×32 images, had cost more than the
    objective evaluations themselves).
    """

    def __init__(self, attacks: int, dim: int, m: int, like: Tensor) -> None:
        self.s = like.new_zeros((attacks, m, dim))
        self.y = like.new_zeros((attacks, m, dim))
        self.rho = like.new_zeros((attacks, m))
        self.count = torch.zeros(attacks, dtype=torch.long, device=like.device)
        self.pos = torch.zeros(attacks, dtype=torch.long, device=like.device)
        self.h_diag = like.new_ones(attacks)
        self.d = like.new_zeros((attacks, dim))
        self.t = like.new_zeros(attacks)
        self.prev_g = like.new_zeros((attacks, dim))
        self.prev_loss = like.new_zeros(attacks)
        self.n_iter = torch.zeros(attacks, dtype=torch.long, device=like.device)

    #: The tensors that make up the state, for a checkpoint (:mod:`leakagelib.attacks.checkpoint`).
    STATE = ("s", "y", "rho", "count", "pos", "h_diag", "d", "t", "prev_g", "prev_loss", "n_iter")

    def state_dict(self) -> dict[str, Tensor]:
        """Every attack's pairs, step and counters, for a checkpoint."""
        return {name: getattr(self, name) for name in self.STATE}

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        """Take back a :meth:`state_dict`, on this history's device."""
        for name in self.STATE:
            setattr(self, name, state[name].to(self.s.device))

    def push(self, g: Tensor, keep: Tensor) -> None:
        """Store the pair of the last move for attacks in ``keep`` whose curvature is positive."""
        y, s = g - self.prev_g, self.d * self.t[:, None]
        ys = _dot(y, s)
        keep = keep & (ys > CURVATURE_MIN)
        rows = keep.nonzero().squeeze(1)
        if rows.numel():
            slot = self.pos[rows]
            self.s[rows, slot] = s[rows]
            self.y[rows, slot] = y[rows]
            self.rho[rows, slot] = 1.0 / ys[rows]
            self.pos[rows] = (slot + 1) % self.s.shape[1]
            self.count[rows] = (self.count[rows] + 1).clamp(max=self.s.shape[1])
        self.h_diag = torch.where(keep, ys / _dot(y, y), self.h_diag)

    def _pairs(self) -> list[tuple[Tensor, Tensor, Tensor]]:
        """``(s, y, ρ)`` of every attack, oldest first; ρ = 0 past an attack's ``count``."""
        m, rows = self.s.shape[1], torch.arange(self.s.shape[0], device=self.s.device)
        stored = int(self.count.max())
        pairs = []
        for i in range(stored):
            age = stored - i  # the i-th oldest of ``stored`` is ``age`` writes back
            slot = (self.pos - age) % m
            valid = age <= self.count
            pairs.append((self.s[rows, slot], self.y[rows, slot],
                          torch.where(valid, self.rho[rows, slot], 0.0)))  # fmt: skip
        return pairs

    def direction(self, g: Tensor) -> Tensor:
        """``−H g`` by the two-loop recursion (pairs an attack does not hold have ρ = 0)."""
        pairs = self._pairs()
        q, alpha = -g, []
        for s, y, rho in reversed(pairs):
            alpha.append(rho * _dot(s, q))
            q = q - alpha[-1][:, None] * y
        r = q * self.h_diag[:, None]
        for (s, y, rho), a in zip(pairs, reversed(alpha), strict=True):
            beta = rho * _dot(y, r)
            r = r + s * (a - beta)[:, None]
        return r


def _step(
    state: _History,
    v: Tensor,
    loss: Tensor,
    g: Tensor,
    lr: Tensor,
    running: Tensor,
    closure: Callable[[Tensor], tuple[Tensor, Tensor]],
    config: AttackConfig,
) -> Tensor:
    """One ``LBFGS.step`` of every attack in ``running`` from ``v`` (loss and gradient given)."""
    max_iter = config.lbfgs_iterations
    running = running & (g.abs().amax(1) > TOLERANCE_GRAD)
    for it in range(max_iter):
        if not bool(running.any()):
            break
        state.n_iter = state.n_iter + running.long()
        first = (state.n_iter == 1)[:, None]
        state.push(g, running & ~first[:, 0])
        d = torch.where(first, -g, state.direction(g))
        t = torch.where(first[:, 0], (1.0 / g.abs().sum(1)).clamp(max=1.0) * lr, lr)
        state.d = torch.where(running[:, None], d, state.d)
        state.t = torch.where(running, t, state.t)
        state.prev_g = torch.where(running[:, None], g, state.prev_g)
        state.prev_loss = torch.where(running, loss, state.prev_loss)
        running = running & (_dot(g, state.d) <= -TOLERANCE_CHANGE)
        v = v + torch.where(running, state.t, 0.0)[:, None] * state.d
        if it == max_iter - 1 or it + 2 >= max_iter * 5 // 4:  # iterations, evaluations
            break
        new_loss, new_g = closure(v)
        loss = torch.where(running, new_loss, loss)
        g = torch.where(running[:, None], new_g, g)
        running = running & (g.abs().amax(1) > TOLERANCE_GRAD)
        running = running & ((state.d * state.t[:, None]).abs().amax(1) > TOLERANCE_CHANGE)
        running = running & ((loss - state.prev_loss).abs() >= TOLERANCE_CHANGE)
    return v


class _Flat:
    """Each attack's inputs (and, with ``labels``, its label logits) as one row of a matrix."""

    def __init__(self, x: Tensor, z: Tensor, labels: bool) -> None:
        self.x_shape, self.z, self.labels = x.shape, z, labels
        self.n_x, self.rows = x[0, 0, 0].numel(), x.shape[:3].numel()

    def split(self, v: Tensor) -> tuple[Tensor, Tensor]:
        """The inputs ``H × N × R × ...`` and labels of the rows ``v``."""
        xv = v[:, : self.n_x].reshape(self.x_shape)
        return xv, (v[:, self.n_x :].reshape(self.z.shape) if self.labels else self.z)

    def join(self, xv: Tensor, zv: Tensor | None) -> Tensor:
        """The rows of inputs ``xv`` and labels ``zv`` (left out without ``labels``)."""
        parts = [xv.reshape(self.rows, -1)]
        if self.labels and zv is not None:
            parts.append(zv.reshape(self.rows, -1))
        return torch.cat(parts, 1)


def lbfgs_per_attack(
    config: AttackConfig,
    evaluate: Callable[[Tensor, Tensor, Tensor], tuple[Tensor, Tensor | None, Tensor]],
    x: Tensor,
    z: Tensor,
    lrs: Tensor,
    draw: Callable[[], Tensor],
    clamp: Callable[[Tensor], Tensor],
    steps: Iterable[int],
    callback: Callable[[int, Tensor], None] | None,
    checkpoint: LoopCheckpoint | None = None,
) -> tuple[Tensor, Tensor, list[float]]:
    """L-BFGS on every attack of ``x`` (``H × N × R × ...``) alone, with :class:`Watch`'s control.

    ``lrs`` holds one learning rate per setting. As in the authors' loop, the
    objective recorded for step t is the one at its start, ``f(x_t)``; the box
    (``clamp``) acts after each step. Returns the iterates (the best ones with
    ``keep_best``), the labels and the mean objective per step. A
    ``checkpoint`` (:mod:`.checkpoint`) resumes the loop.
    """
    lead, flat = x.shape[:3], _Flat(x, z, config.optimize_labels)
    watch = Watch(config, lrs.reshape(-1, 1, 1).expand(lead).clone())
    d0 = draw()

    def closure(v: Tensor) -> tuple[Tensor, Tensor]:
        gx, gz, value = evaluate(*flat.split(v), d0)
        return value.reshape(-1), flat.join(gx, gz)

    v = flat.join(x, z)
    state = _History(v.shape[0], v.shape[1], config.lbfgs_history, v)
    start, ended, history = restore(checkpoint, {"v": v}, {"watch": watch, "lbfgs": state})

    def saved() -> dict:
        return dict(v=v, history=history, watch=watch.state_dict(), lbfgs=state.state_dict())

    t = start - 1
    for t in remaining(steps, start, ended):
        loss, g = closure(v)
        value = loss.reshape(lead)
        history.append(float(value.mean()))
        watch.record(value, *flat.split(v))
        before = flat.split(v)
        xv, zv = flat.split(_step(state, v, loss, g, watch.lr.reshape(-1),
                                  watch.active.reshape(-1), closure, config))  # fmt: skip
        xv, zv = watch.settle(value, (before[0], clamp(xv)), (before[1], zv))
        v = flat.join(xv, zv)
        if checkpoint is not None:
            checkpoint.tick(t, saved)
        if callback is not None:
            callback(t, xv.detach().clone())
        if watch.finished():
            break
    if checkpoint is not None and not ended:
        checkpoint.tick(t, saved, final=True)
    return (*watch.result(*flat.split(v)), history)
