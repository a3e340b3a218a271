"""The two optimisers of the attack loop, run on all attacks of a batch at once.

* :func:`adam_loop` — element-wise Adam with a learning rate and schedule per
  setting (the Bayes code, Inverting Gradients), optionally on the sign of the
  gradient (inversefed's ``signed``) and with an annealed prior weight
  (:func:`annealed`, the Bayes authors' tuners), with fresh Monte-Carlo ball
  samples every step;
* :func:`lbfgs_loop` — ``torch.optim.LBFGS`` (DLG, iDLG, CPL) on the summed
  objectives of the batch, which do not interact.

Both take ``evaluate(x, z, d[, beta])``, the batched objective and gradient built by
:func:`leakagelib.attacks.loop.run_attack`, and return the final iterates and
the mean objective per step. Used by every optimisation attack.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import torch
from torch import Tensor

from .checkpoint import LoopCheckpoint, remaining, restore
from .config import AttackConfig, Setting
from .control import Watch

__all__ = ["Evaluate", "adam_loop", "annealed", "lbfgs_loop"]

#: ``evaluate(x, z, d, beta=None, *, grad=True) -> (∂/∂x, ∂/∂z or None, objective)`` of every
#: attack of a batch; ``beta`` (one per setting) replaces the settings' prior weights for one
#: call; ``grad=False`` gives the objective alone (``(None, None, objective)``), without the
#: backward pass through the simulated updates that a step's gradient costs.
Evaluate = Callable[..., tuple[Tensor | None, Tensor | None, Tensor]]

#: Adam's moment decays and its denominator's epsilon (Kingma & Ba 2015, the defaults).
ADAM_BETAS, ADAM_EPS = (0.9, 0.999), 1e-8


def _lr_factor(config: AttackConfig, step: int, decay: Tensor) -> Tensor:
    """The schedule's multiplier at ``step`` for each setting's ``decay``."""
    if config.schedule == "exponential":
        return decay ** (step / config.decay_every)
    if config.schedule == "step":  # the plateau schedule's lr lives in control.Watch
        passed = sum(step >= int(config.steps * f) for f in (3 / 8, 5 / 8, 7 / 8))
        return decay**passed
    return torch.ones_like(decay)


def annealed(
    config: AttackConfig, step: int, settings: list[Setting], device: torch.device | None = None
) -> tuple[Tensor, Tensor] | None:
    """The prior weight β_t of every setting at ``step`` and the factor the objective is scaled by.

    The Bayes authors' tuners (eth-sri/bayes-framework-leakage,
    ``attacks/grad_attack.py`` lines 72–102; ``utils/flax_losses.py`` line
    145 for the heuristic attacks, line 148 for the Bayes attack, whose TV
    weight ``c`` is line 101's and whose sum over the images is line 151)
    minimise ``f_t · D(g, ĝ) + c · TV(x)`` and move the likelihood's
    factor ``f_t`` geometrically from ``f_start`` to ``f_end`` over
    ``att_epochs`` steps (``f_t = f_start · α^(t+1)`` with
    ``α = (f_end/f_start)^(1/att_epochs)``, clamped at ``f_end``), then keep
    it for the other ``att_epochs`` steps of the run. In the prior weight of
    Eq. 3, ``β = c/f``, that is ``β_t = β_start · (β/β_start)^(min(t+1, E)/E)``
    with ``E = config.anneal_steps``; divided by the constant ``f_end``, their
    objective is ``(β/β_t) · [-log p(g|x) − β_t log p(x)]``, so the factor
    ``β/β_t`` is returned too (Adam sees it: it shrinks the steps while the
    prior dominates). ``None`` when no setting anneals (``config.anneal_steps``
    0 or no ``beta_start``); a setting without ``beta_start`` keeps its β.
    """
    starts = [s.beta_start for s in settings]
    if all(b is None for b in starts):
        return None
    if config.anneal_steps == 0:
        raise ValueError("a setting with beta_start needs AttackConfig.anneal_steps > 0")
    beta = torch.tensor([s.beta for s in settings], dtype=torch.float64)
    start = torch.tensor([s.beta if b is None else b for s, b in zip(settings, starts, strict=True)],
                         dtype=torch.float64)  # fmt: skip
    r = min(step + 1, config.anneal_steps) / config.anneal_steps
    beta_t = start * (beta / start) ** r
    return beta_t.float().to(device), (beta / beta_t).float().to(device)


def _scaled(t: Tensor, factor: Tensor) -> Tensor:
    """``t`` (leading dimension: the settings) times one ``factor`` per setting."""
    return t * factor.reshape(-1, *([1] * (t.dim() - 1)))


def _adam_step(
    var: Tensor, g: Tensor, m: Tensor, v: Tensor, t: int, lr_t: Tensor, signed: bool
) -> Tensor:
    """One Adam update of ``var`` with learning rates ``lr_t`` per setting or per attack (moments in place)."""
    b1, b2 = ADAM_BETAS
    if signed:
        g = g.sign()
    m.mul_(b1).add_(g, alpha=1 - b1)
    v.mul_(b2).addcmul_(g, g, value=1 - b2)
    mhat = m / (1 - b1 ** (t + 1))
    vhat = v / (1 - b2 ** (t + 1))
    lr_t = lr_t.reshape(lr_t.shape + (1,) * (var.dim() - lr_t.dim()))
    return var - lr_t * mhat / (vhat.sqrt() + ADAM_EPS)


def adam_loop(
    config: AttackConfig,
    evaluate: Evaluate,
    x: Tensor,
    z: Tensor,
    settings: list[Setting],
    draw: Callable[[], Tensor],
    clamp: Callable[[Tensor], Tensor],
    steps: Iterable[int],
    callback: Callable[[int, Tensor], None] | None,
    checkpoint: LoopCheckpoint | None = None,
) -> tuple[Tensor, Tensor, list[float]]:
    """Element-wise Adam with a learning rate and schedule per setting.

    ``draw()`` gives each step's ball offsets (fresh Monte-Carlo samples).
    With ``config.watched`` (the plateau schedule, early stopping or the best
    iterate) every attack has its own lr, stop flag and best iterate
    (:class:`~leakagelib.attacks.control.Watch`): a stopped attack's iterate
    no longer changes (its moments may, unread), and the loop ends early once
    all have stopped. A ``checkpoint`` (:mod:`.checkpoint`) resumes the loop.
    """
    lrs = torch.tensor([s.lr for s in settings], device=x.device)
    decays = torch.tensor([s.decay for s in settings], device=x.device)
    (mx, vx), (mz, vz) = moments = [(torch.zeros_like(t), torch.zeros_like(t)) for t in (x, z)]
    watch = Watch(config, lrs.reshape(-1, 1, 1).expand(x.shape[:3])) if config.watched else None
    start, ended, history = restore(checkpoint, dict(x=x, z=z, mx=mx, vx=vx, mz=mz, vz=vz),
                                    {"watch": watch})  # fmt: skip

    def state() -> dict:
        return dict(x=x, z=z, mx=mx, vx=vx, mz=mz, vz=vz, history=history,
                    watch=None if watch is None else watch.state_dict())  # fmt: skip

    t = start - 1
    for t in remaining(steps, start, ended):
        anneal = annealed(config, t, settings, x.device)
        if anneal is None:
            gx, gz, value = evaluate(x, z, draw())
        else:  # the objective scaled per setting (:func:`annealed`)
            gx, gz, value = evaluate(x, z, draw(), anneal[0])
            gx, value = _scaled(gx, anneal[1]), _scaled(value, anneal[1])
            gz = None if gz is None else _scaled(gz, anneal[1])
        history.append(float(value.detach().mean()))
        factor = _lr_factor(config, t, decays)  # per setting; ones for the plateau schedule
        lr_t = lrs * factor if watch is None else watch.lr * factor.reshape(-1, 1, 1)
        if watch is not None:
            watch.record(value.detach(), x, z)
        x_new = clamp(_adam_step(x, gx, *moments[0], t, lr_t, config.signed))
        z_new = z if gz is None else _adam_step(z, gz, *moments[1], t, lr_t, config.signed)
        if watch is not None:
            x_new, z_new = watch.settle(value.detach(), (x, x_new), (z, z_new))
        x, z = x_new, z_new
        if checkpoint is not None:
            checkpoint.tick(t, state)
        if callback is not None:
            callback(t, x.detach())
        if watch is not None and watch.finished():
            break
    if checkpoint is not None and not ended:
        checkpoint.tick(t, state, final=True)
    return (x, z, history) if watch is None else (*watch.result(x, z), history)


def lbfgs_loop(
    config: AttackConfig,
    evaluate: Evaluate,
    x: Tensor,
    z: Tensor,
    lr: float,
    draw: Callable[[], Tensor],
    clamp: Callable[[Tensor], Tensor],
    steps: Iterable[int],
    callback: Callable[[int, Tensor], None] | None,
) -> tuple[Tensor, Tensor, list[float]]:
    """``torch.optim.LBFGS`` on all attacks at once (their objectives summed; they do not interact).

    ``draw()`` is called once: one set of offsets for the whole run (L-BFGS
    needs a deterministic objective).
    """
    xp = x.clone().requires_grad_(True)
    zp = z.clone().requires_grad_(config.optimize_labels)
    opt = torch.optim.LBFGS(
        [xp, zp] if config.optimize_labels else [xp],
        lr=lr,
        max_iter=config.lbfgs_iterations,
        history_size=config.lbfgs_history,
    )
    d0 = draw()

    def closure() -> Tensor:
        gx, gz, value = evaluate(xp.detach(), zp.detach(), d0)
        xp.grad = gx
        if config.optimize_labels:
            zp.grad = gz
        return value.sum()

    history: list[float] = []
    for t in steps:
        value = opt.step(closure)
        history.append(float(value) / math.prod(x.shape[:3]))
        with torch.no_grad():
            xp.copy_(clamp(xp))
        if callback is not None:
            callback(t, xp.detach().clone())
    return xp.detach(), zp.detach(), history
