"""The attack loop: Algorithm 1 of the Bayes paper, batched over images, restarts and settings.

An optimisation attack maximises ``(1/k) Σᵢ log p(g | xᵢ) + β log p(xᵢ)``
with ``x₁..x_k`` drawn uniformly from the δ-ball around the current iterate
(Balunović et al. 2022, Eq. 3 and Algorithm 1; ``k = 1`` with ``δ = 0`` is the
ball's centre, the usual attack). The loop owns everything that is not the
likelihood or the prior: the initialisation, the optimiser (Adam with
exponential, step or plateau decay, or L-BFGS), signed gradients, box
constraints, restarts, the Monte-Carlo samples, and — per attack — early
stopping and the best iterate (:mod:`.control`, :mod:`.lbfgs`).

**Batched by design.** Independent attacks form a tensor of shape
``H × N × R × n × C × H × W``: ``H`` hyper-parameter settings (learning rate,
decay, β, layer weighting), ``N`` shared updates (one attack each), ``R``
restarts, and ``n`` inputs reconstructed jointly from one update. The
objective's gradient for all of them is one program: :func:`torch.func.grad`
of the objective (which itself differentiates the model through
:func:`leakagelib.gradients.functional_gradient`) under three nested
:func:`torch.func.vmap` s; the shared updates are never copied per setting or
restart. Adam runs element-wise with a learning rate per setting. All
settings start from the same initial iterates and see the same Monte-Carlo
samples (common random numbers), so they are compared on equal terms. The
reconstruction reported for each (setting, update) is the restart with the
lowest final objective — what an attacker who cannot see the input would pick.

The pieces live in small modules: the hyper-parameters in :mod:`leakagelib.attacks.config`,
the batched objective in :mod:`.objective`, Adam and L-BFGS in
:mod:`.optimizers`, the returned :class:`~leakagelib.attacks.result.AttackResult`
in :mod:`.result`, the ball samples in :mod:`.ball`, saving and resuming a loop in
:mod:`.checkpoint`. This module draws the starting points,
runs one of the optimisers and keeps the best restart (:func:`run_attack`);
:func:`reconstruct` is its checked public entry, which every preset calls.

Used by every optimisation attack in the book, first in the chapter
"Existing attacks are approximations".
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from contextlib import nullcontext

import torch
from torch import Tensor, nn

from ..gradients import check_update
from .ball import BallOffsets, sample_ball
from .checkpoint import LoopCheckpoint, fingerprint
from .config import AttackConfig, Setting
from .lbfgs import lbfgs_per_attack
from .likelihoods import Likelihood
from .objective import batched_objective
from .optimizers import Evaluate, adam_loop, lbfgs_loop
from .priors import Prior
from .result import AttackResult

Update = dict[str, Tensor]

__all__ = ["image_bounds", "reconstruct", "run_attack", "sample_ball"]


def image_bounds(mean: Sequence[float], std: Sequence[float]) -> tuple[Tensor, Tensor]:
    """The box [0, 1] in normalised coordinates: per-channel ``((0 − m)/s, (1 − m)/s)``."""
    m = torch.as_tensor(list(mean), dtype=torch.float32).reshape(-1, 1, 1)
    s = torch.as_tensor(list(std), dtype=torch.float32).reshape(-1, 1, 1)
    return (0.0 - m) / s, (1.0 - m) / s


def _initial(
    config: AttackConfig,
    shape: tuple[int, ...],
    bounds: tuple[Tensor, Tensor] | None,
    gen: torch.Generator,
    device: torch.device,
) -> Tensor:
    """Initial iterates of ``shape`` = ``H × N × R × n × (input shape)``.

    Drawn on the CPU from ``gen`` (seeded, the same on every device), then moved.
    """
    if config.init == "normal":
        return (config.init_scale * torch.randn(shape, generator=gen)).to(device)
    if config.init == "zeros":
        return torch.zeros(shape, device=device)
    if config.init == "uniform":
        u = torch.rand(shape, generator=gen).to(device)
        if bounds is None:
            return u
        lo, hi = (b.to(device) for b in bounds)
        return lo + (hi - lo) * u
    if len(shape) < 6:
        raise ValueError("the patterned initialisation needs image inputs C×H×W")
    p = config.pattern_size
    *lead, height, width = shape
    tile = torch.rand((*lead, p, p), generator=gen).to(device)
    reps = (1,) * len(lead) + (math.ceil(height / p), math.ceil(width / p))
    return tile.repeat(reps)[..., :height, :width].contiguous()


def _validate(
    model: nn.Module,
    observed: Update,
    labels: Tensor | None,
    num_images: int,
    config: AttackConfig,
    bounds: tuple[Tensor, Tensor] | None,
    settings: Sequence[Setting] | None,
) -> list[Setting]:
    """Check the arguments of :func:`run_attack`; return the settings to run (``config``'s own by default)."""
    dtypes = {p.dtype for p in model.parameters()}
    if dtypes != {torch.float32}:
        raise ValueError(
            f"the attack loop runs in float32, but the model's parameters are {sorted(map(str, dtypes))}: "
            "attack a float32 copy (copy.deepcopy(model).float()); float64 is for the closed-form attacks"
        )
    n_upd = next(iter(observed.values())).shape[0]
    if any(t.shape[0] != n_upd for t in observed.values()):
        raise ValueError("every tensor of a stacked update needs the same leading dimension N")
    if labels is None and not config.optimize_labels:
        raise ValueError("labels are required unless config.optimize_labels is set")
    if labels is not None and tuple(labels.shape) != (n_upd, num_images):
        raise ValueError(f"labels must have shape {(n_upd, num_images)}, got {tuple(labels.shape)}")
    if config.box and bounds is None:
        raise ValueError("config.box needs bounds (see image_bounds)")
    settings = list(settings) if settings else [config.setting()]
    if config.optimizer == "lbfgs" and not config.watched and len({s.lr for s in settings}) > 1:
        raise ValueError(
            "L-BFGS on the summed objective runs all settings with one learning rate "
            "(a watched config, e.g. keep_best=True, runs L-BFGS per attack)"
        )
    return settings


def _start(
    config: AttackConfig,
    shape: tuple[int, ...],
    bounds: tuple[Tensor, Tensor] | None,
    initial: Tensor | None,
    num_classes: int,
    gen: torch.Generator,
    device: torch.device,
) -> tuple[Tensor, Tensor]:
    """The first iterates ``x`` (``H × N × R × n × input``) and soft-label logits ``z``.

    Common random numbers: every setting starts from the same iterates, so
    settings (and attacks) are compared on equal terms. ``z`` is a dummy when
    labels are not optimised.
    """
    H, N, R, n, *input_shape = shape
    if initial is None:
        x = _initial(config, (1, *shape[1:]), bounds, gen, device).expand(shape).clone()
    elif tuple(initial.shape) != (N, n, *input_shape):
        raise ValueError(
            f"initial must have shape {(N, n, *input_shape)}, got {tuple(initial.shape)}"
        )
    else:
        x = initial.to(device, torch.float32)[None, :, None].expand(shape).clone()
    if not config.optimize_labels:
        return x, torch.zeros((H, N, R, 1, 1), device=device)
    z = torch.randn((1, N, R, n, num_classes), generator=gen).to(device)
    return x, z.expand(H, N, R, n, num_classes).clone()


def _optimise(
    config: AttackConfig,
    evaluate: Evaluate,
    x: Tensor,
    z: Tensor,
    settings: list[Setting],
    offsets: BallOffsets,
    bounds: tuple[Tensor, Tensor] | None,
    callback: Callable[[int, Tensor], None] | None,
    progress: bool,
    checkpoint: LoopCheckpoint | None,
) -> tuple[Tensor, Tensor, list[float]]:
    """Run ``config.optimizer`` for ``config.steps`` steps, clamping into ``bounds`` with ``config.box``.

    A ``checkpoint`` resumes Adam and the per-attack L-BFGS; the L-BFGS on the
    summed objective (:func:`~.optimizers.lbfgs_loop`, torch's own) has none.
    """

    def clamp(xv: Tensor) -> Tensor:
        return torch.maximum(torch.minimum(xv, bounds[1]), bounds[0]) if config.box else xv

    if checkpoint is not None and not config.resumable:
        raise ValueError("torch's L-BFGS on the summed objective cannot resume from a checkpoint")
    steps: Iterable[int] = range(config.steps)
    if progress:
        from tqdm.auto import tqdm

        steps = tqdm(steps, desc="attack", leave=False)
    with checkpoint or nullcontext():  # a signal lets a checkpointed loop save first
        if config.optimizer == "adam":
            return adam_loop(config, evaluate, x, z, settings, offsets.draw, clamp, steps,
                             callback, checkpoint)  # fmt: skip
        if config.watched:  # per attack: its own L-BFGS, lr, stops and best iterate
            lrs = torch.tensor([s.lr for s in settings], device=x.device)
            return lbfgs_per_attack(config, evaluate, x, z, lrs, offsets.draw, clamp, steps,
                                    callback, checkpoint)  # fmt: skip
        lr = settings[0].lr
        return lbfgs_loop(config, evaluate, x, z, lr, offsets.draw, clamp, steps, callback)


def _best_restart(
    x: Tensor, z: Tensor, final: Tensor, config: AttackConfig
) -> tuple[Tensor, Tensor, Tensor | None]:
    """Per setting and update, the restart with the lowest final objective (NaN counts as +∞).

    Returns its inputs ``H × N × n × ...``, its objective ``H × N`` and, when
    labels were optimised, its label estimates ``H × N × n``.
    """
    H, N, _, n = x.shape[:4]
    best = final.argmin(dim=2)  # H × N
    idx = best.reshape(H, N, 1, *([1] * (x.dim() - 3))).expand(H, N, 1, *x.shape[3:])
    images = x.gather(2, idx).squeeze(2)
    objective = final.gather(2, best.unsqueeze(2)).squeeze(2)
    if not config.optimize_labels:
        return images, objective, None
    zi = best.reshape(H, N, 1, 1, 1).expand(H, N, 1, n, z.shape[-1])
    return images, objective, z.gather(2, zi).squeeze(2).argmax(-1)


def run_attack(
    model: nn.Module,
    observed: Update,
    *,
    labels: Tensor | None,
    num_images: int,
    input_shape: tuple[int, ...],
    likelihood: Likelihood | Sequence[Likelihood],
    prior: Prior | Sequence[Prior],
    config: AttackConfig,
    settings: Sequence[Setting] | None = None,
    bounds: tuple[Tensor, Tensor] | None = None,
    loss: str = "ce",
    generator: torch.Generator | None = None,
    device: str | torch.device | None = None,
    callback: Callable[[int, Tensor], None] | None = None,
    progress: bool = False,
    initial: Tensor | None = None,
    names: Sequence[str] | None = None,
    checkpoint: LoopCheckpoint | None = None,
) -> AttackResult:
    """Run ``H × N × R`` attacks in one batched program (see the module docstring).

    ``observed`` is a *stacked* update: every tensor has a leading dimension
    ``N`` (one shared update per attack). ``labels`` is ``N × num_images``
    (int64) or ``None`` with ``config.optimize_labels``. ``callback(step, x)``
    sees every step's detached iterates ``H × N × R × n × ...``. ``likelihood`` may be a sequence with one
    likelihood per setting, so that different attacks (Bayes, ℓ2, ℓ1, cosine)
    on the same updates run in one program; likewise ``prior``; ``names``
    names the settings in the result. ``initial`` (``N × n × input shape``)
    replaces ``config.init`` (R-GAP → DLG, R-GAP paper §5); ``checkpoint``
    saves and resumes the loop (:mod:`.checkpoint`). Prefer :func:`reconstruct`
    or a preset (:mod:`.presets`), which check the update and fill these in.
    """
    device = torch.device(device) if device is not None else next(model.parameters()).device
    settings = _validate(model, observed, labels, num_images, config, bounds, settings)
    gen = generator if generator is not None else torch.Generator().manual_seed(0)
    seed = int(torch.randint(2**62, (1,), generator=gen))
    n_updates = next(iter(observed.values())).shape[0]
    shape = (len(settings), n_updates, config.restarts, num_images, *input_shape)
    with torch.no_grad():
        num_classes = int(model(torch.zeros((1, *input_shape), device=device)).shape[-1])
    evaluate = batched_objective(
        model, observed, labels, settings, likelihood, prior, config, shape=shape, loss=loss,
        device=device,
    )  # fmt: skip
    lo_hi = None if bounds is None else tuple(b.to(device) for b in bounds)
    x, z = _start(config, shape, lo_hi, initial, num_classes, gen, device)
    offsets = BallOffsets(config, shape, torch.Generator(device=device).manual_seed(seed))
    if checkpoint is not None:  # the file belongs to this attack; it resumes the ball samples
        checkpoint.bind(fingerprint([config, settings, shape, names], observed), [offsets.gen])
    x, z, history = _optimise(config, evaluate, x, z, settings, offsets, lo_hi, callback,
                              progress, checkpoint)  # fmt: skip
    final = torch.nan_to_num(evaluate(x, z, offsets.zero, grad=False)[2], nan=float("inf"))
    images, objective, est_labels = _best_restart(x, z, final, config)
    return AttackResult(
        images=images.detach(), objective=objective.detach(), all_images=x.detach(),
        all_objective=final.detach(), settings=settings, labels=est_labels, history=history,
        names=None if names is None else list(names),
    )  # fmt: skip


def _checked_labels(
    labels: Tensor | None, num_images: int | None, n_updates: int
) -> tuple[Tensor | None, int]:
    """``labels`` as ``N × n`` int64 and the inputs per update ``n``; a mismatch raises."""
    if labels is not None:
        labels = (labels.unsqueeze(1) if labels.dim() == 1 else labels).long()
        if labels.dim() != 2 or labels.shape[0] != n_updates:
            raise ValueError(
                f"labels must be N × n or N with N = {n_updates} updates, got {tuple(labels.shape)}"
            )
        if num_images is not None and num_images != labels.shape[1]:
            raise ValueError(f"num_images={num_images} disagrees with labels {tuple(labels.shape)}")
        num_images = labels.shape[1]
    if num_images is None or num_images < 1:
        raise ValueError("give labels, or num_images with config.optimize_labels")
    return labels, num_images


def reconstruct(
    model: nn.Module,
    updates: Update,
    *,
    labels: Tensor | None,
    likelihood: Likelihood | Sequence[Likelihood],
    prior: Prior | Sequence[Prior],
    config: AttackConfig | None = None,
    input_shape: tuple[int, ...],
    num_images: int | None = None,
    settings: Sequence[Setting] | None = None,
    names: Sequence[str] | None = None,
    bounds: tuple[Tensor, Tensor] | None = None,
    loss: str = "ce",
    generator: torch.Generator | None = None,
    device: str | torch.device | None = None,
    callback: Callable[[int, Tensor], None] | None = None,
    progress: bool = False,
    initial: Tensor | None = None,
    checkpoint: LoopCheckpoint | None = None,
) -> AttackResult:
    """Reconstruct the inputs behind the shared ``updates`` by maximising the log posterior.

    * ``updates``: what the server saw, *stacked*: every tensor has a leading
      dimension ``N`` (one client each, attacked independently — the Bayes
      code's 10 single-image attacks, vectorised). One update ``g`` is
      ``stack_updates([g])`` (:func:`leakagelib.gradients.stack_updates`).
    * ``labels``: ``N × n`` (or ``N``: one image per update), the true labels
      (known, or recovered with :func:`leakagelib.gradients.recover_label_idlg`),
      or ``None`` with ``config.optimize_labels`` (DLG), in which case
      ``num_images`` says how many inputs each update came from.
    * ``input_shape``: one input's shape, ``(C, H, W)`` or ``(D,)``.
    * ``likelihood``, ``prior``, ``config``: the attack (see :mod:`.presets`).
    * ``settings``: several :class:`Setting` s run in the same batch, named by
      ``names``; ``likelihood`` and ``prior`` may then have one entry per setting.
    * ``bounds``: per-channel box ``(lo, hi)`` in input space
      (:func:`image_bounds`), used by ``config.box`` and the uniform init.
    * ``initial``: given starting points ``N × n × input shape`` instead of
      ``config.init`` (R-GAP → DLG).
    * ``checkpoint``: a :class:`~leakagelib.attacks.checkpoint.LoopCheckpoint`
      that saves the loop now and then and resumes it after an interruption.

    Returns an :class:`AttackResult` in the model's input space.
    """
    n_updates = check_update(model, updates, stacked=True)
    labels, num_images = _checked_labels(labels, num_images, n_updates)
    return run_attack(
        model, updates, labels=labels, num_images=num_images, input_shape=tuple(input_shape),
        likelihood=likelihood, prior=prior, config=config or AttackConfig(), settings=settings,
        bounds=bounds, loss=loss, generator=generator, device=device, callback=callback,
        progress=progress, initial=initial, names=names, checkpoint=checkpoint,
    )  # fmt: skip
