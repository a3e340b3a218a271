"""The attack loop: Algorithm 1 of the Bayes paper, batched over images, restarts and settings.

An optimisation attack maximises ``(1/k) Σᵢ log p(g | xᵢ) + β log p(xᵢ)``
with ``x₁..x_k`` drawn uniformly from the δ-ball around the current iterate
(Balunović et al. 2022, Eq. 3 and Algorithm 1; ``k = 1`` with ``δ = 0`` is the
ball's centre, the usual attack). The loop owns everything that is not the
likelihood or the prior: the initialisation, the optimiser (Adam with
exponential or step decay, or L-BFGS), signed gradients, box constraints,
restarts and the Monte-Carlo samples.

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

Used by every optimisation attack in the book, first in the chapter
"Existing attacks are approximations".
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import torch
from torch import Tensor, nn
from torch.func import grad_and_value, vmap

from ..gradients import functional_gradient, params_of
from .likelihoods import WEIGHTINGS, Likelihood
from .priors import Prior, bind_model

Update = dict[str, Tensor]

__all__ = ["AttackConfig", "AttackResult", "Setting", "image_bounds", "run_attack", "sample_ball"]

OPTIMIZERS = ("adam", "lbfgs")
SCHEDULES = ("exponential", "step", "constant")
INITS = ("normal", "uniform", "zeros", "pattern")


@dataclass(frozen=True)
class Setting:
    """The hyper-parameters that may differ between attacks run in one batch.

    ``lr`` the initial learning rate, ``decay`` the schedule's factor, ``beta``
    the prior weight, ``weighting`` the layer weighting (``None``: the
    likelihood's own).
    """

    lr: float
    decay: float
    beta: float
    weighting: str | None = None

    def __post_init__(self) -> None:
        if not self.lr > 0:
            raise ValueError(f"learning rate must be positive, got {self.lr}")
        if not 0 < self.decay <= 1:
            raise ValueError(f"decay must be in (0, 1], got {self.decay}")
        if self.beta < 0:
            raise ValueError(f"the prior weight beta must be non-negative, got {self.beta}")
        if self.weighting is not None and self.weighting not in WEIGHTINGS:
            raise ValueError(f"unknown layer weighting {self.weighting!r}; use one of {WEIGHTINGS}")


@dataclass(frozen=True)
class AttackConfig:
    """How the loop runs: steps, optimiser, schedule, initialisation and sampling.

    * ``optimizer``: ``"adam"`` or ``"lbfgs"`` (``torch.optim.LBFGS``, one
      ``.step`` of up to ``lbfgs_iterations`` inner iterations per step, as DLG).
    * ``schedule``: ``"exponential"`` (lr · decay^(t / decay_every), the Bayes
      code), ``"step"`` (lr · decay at 3/8, 5/8 and 7/8 of the steps, Inverting
      Gradients) or ``"constant"``.
    * ``init``: ``"normal"`` (N(0, init_scale²) in the model's input space, the
      Bayes code), ``"uniform"`` (U within ``bounds``, or U(0, 1)), ``"zeros"``,
      or ``"pattern"`` (CPL's patterned initialisation: one random
      ``pattern_size × pattern_size`` patch tiled over the image).
    * ``signed``: use the sign of the objective's gradient (Inverting Gradients).
    * ``box``: clamp iterates into ``bounds`` after each step.
    * ``mc_samples`` (k) and ``delta`` (δ): Algorithm 1's Monte-Carlo samples,
      uniform in the ℓ2 ball of radius δ around the iterate.
    * ``optimize_labels``: optimise soft labels jointly with the inputs (DLG).
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
    box: bool = False
    mc_samples: int = 1
    delta: float = 0.0
    optimize_labels: bool = False
    lbfgs_iterations: int = 20
    lbfgs_history: int = 100

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise ValueError(f"steps must be at least 1, got {self.steps}")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"unknown optimizer {self.optimizer!r}; use one of {OPTIMIZERS}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"unknown schedule {self.schedule!r}; use one of {SCHEDULES}")
        if self.init not in INITS:
            raise ValueError(f"unknown init {self.init!r}; use one of {INITS}")
        if self.restarts < 1 or self.mc_samples < 1 or self.decay_every < 1:
            raise ValueError("restarts, mc_samples and decay_every must be at least 1")
        if self.delta < 0:
            raise ValueError(f"delta must be non-negative, got {self.delta}")
        if self.optimizer == "lbfgs" and (self.signed or self.mc_samples > 1):
            raise ValueError(
                "L-BFGS needs a deterministic objective: no signed gradients or MC samples"
            )
        Setting(self.lr, self.decay, self.beta, self.weighting)  # validates those fields

    def setting(self) -> Setting:
        """This configuration's own hyper-parameters as a :class:`Setting`."""
        return Setting(self.lr, self.decay, self.beta, self.weighting)

    def with_(self, **changes: object) -> AttackConfig:
        """A copy with ``changes`` applied."""
        return replace(self, **changes)


@dataclass
class AttackResult:
    """What :func:`run_attack` returns.

    ``images``: ``H × N × n × C × H × W``, the best restart per setting and
    update, in the model's input space. ``objective``: ``H × N``, its final
    objective (negative log posterior up to constants). ``all_images`` and
    ``all_objective`` keep every restart (``H × N × R × ...``). ``labels``:
    ``H × N × n`` label estimates when labels were optimised, else ``None``.
    ``history``: the mean objective per step (a list of floats).
    """

    images: Tensor
    objective: Tensor
    all_images: Tensor
    all_objective: Tensor
    settings: list[Setting]
    labels: Tensor | None = None
    history: list[float] = field(default_factory=list)


def image_bounds(mean: Sequence[float], std: Sequence[float]) -> tuple[Tensor, Tensor]:
    """The box [0, 1] in normalised coordinates: per-channel ``((0 − m)/s, (1 − m)/s)``."""
    m = torch.as_tensor(list(mean), dtype=torch.float32).reshape(-1, 1, 1)
    s = torch.as_tensor(list(std), dtype=torch.float32).reshape(-1, 1, 1)
    return (0.0 - m) / s, (1.0 - m) / s


def _distinct(items: Sequence[object], device: torch.device) -> tuple[list, Tensor]:
    """The distinct objects of ``items`` (by identity) and a one-hot choice per item."""
    distinct: list = []
    for item in items:
        if not any(item is d for d in distinct):
            distinct.append(item)
    choice = torch.tensor([[float(i is d) for d in distinct] for i in items], device=device)
    return distinct, choice


def _lr_factor(config: AttackConfig, step: int, decay: Tensor) -> Tensor:
    """The schedule's multiplier at ``step`` for each setting's ``decay``."""
    if config.schedule == "exponential":
        return decay ** (step / config.decay_every)
    if config.schedule == "step":
        passed = sum(step >= int(config.steps * f) for f in (3 / 8, 5 / 8, 7 / 8))
        return decay**passed
    return torch.ones_like(decay)


def sample_ball(
    shape: tuple[int, ...],
    d: int,
    delta: float,
    gen: torch.Generator | None = None,
    device: str | torch.device = "cpu",
) -> Tensor:
    """Uniform samples in the ℓ2 ball of radius ``delta`` in R^d; ``shape`` ends in the d dims.

    A uniform direction (a normalised Gaussian) times a radius ``δ·U^(1/d)``:
    Algorithm 1's "sample x₁..x_k uniformly from B(x, δ)".
    """
    lead = shape[: len(shape) - 1]
    z = torch.randn((*lead, d), generator=gen, device=device)
    z = z / z.norm(dim=-1, keepdim=True)
    r = delta * torch.rand((*lead, 1), generator=gen, device=device) ** (1.0 / d)
    return z * r


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
) -> AttackResult:
    """Run ``H × N × R`` attacks in one batched program (see the module docstring).

    ``observed`` is a *stacked* update: every tensor has a leading dimension
    ``N`` (one shared update per attack). ``labels`` is ``N × num_images``
    (int64) or ``None`` with ``config.optimize_labels``. ``callback(step, x)``
    is called after every step with the detached iterates ``H × N × R × n × ...``
    (for per-step curves). ``likelihood`` may be a sequence with one
    likelihood per setting, so that different attacks (Bayes, ℓ2, ℓ1, cosine)
    on the same updates run in one program; likewise ``prior``. ``initial``
    (``N × n × input shape``) replaces ``config.init`` with given starting
    points — R-GAP's output for R-GAP → DLG (R-GAP paper §5). Prefer :func:`leakagelib.attacks.reconstruct`, which
    also accepts a single update and fills these arguments in.
    """
    device = torch.device(device) if device is not None else next(model.parameters()).device
    dtypes = {p.dtype for p in model.parameters()}
    if dtypes != {torch.float32}:
        raise ValueError(
            f"the attack loop runs in float32, but the model's parameters are {sorted(map(str, dtypes))}: "
            "attack a float32 copy (copy.deepcopy(model).float()); float64 is for the closed-form attacks"
        )
    names = list(observed)
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
    if config.optimizer == "lbfgs" and len({s.lr for s in settings}) > 1:
        raise ValueError("L-BFGS runs all settings with one learning rate")
    gen = generator if generator is not None else torch.Generator().manual_seed(0)
    dev_gen = torch.Generator(device=device).manual_seed(
        int(torch.randint(2**62, (1,), generator=gen))
    )

    H, N, R, n, k = len(settings), n_upd, config.restarts, num_images, config.mc_samples
    params = {kk: v.to(device) for kk, v in params_of(model).items()}
    observed = {kk: v.to(device=device, dtype=torch.float32) for kk, v in observed.items()}
    gradient = functional_gradient(model, loss=loss)
    per_setting = (
        [likelihood] * len(settings) if isinstance(likelihood, Likelihood) else list(likelihood)
    )
    if len(per_setting) != len(settings):
        raise ValueError(f"got {len(per_setting)} likelihoods for {len(settings)} settings")
    if not all(isinstance(lik, Likelihood) for lik in per_setting):
        raise TypeError("likelihood must be a Likelihood or a sequence of them")
    distinct, choice = _distinct(per_setting, device)
    distinct = [d.to(device) for d in distinct]
    priors = [prior] * len(settings) if isinstance(prior, Prior) else list(prior)
    if len(priors) != len(settings) or not all(isinstance(p, Prior) for p in priors):
        raise ValueError(f"prior must be a Prior or one Prior per setting ({len(settings)})")
    distinct_priors, prior_choice = _distinct(priors, device)
    # priors that read the network (BatchNorm statistics, CPL's label term) meet the model here
    distinct_priors = [bind_model(p, model) for p in distinct_priors]
    weights = torch.stack(
        [lik.weights(names, s.weighting) for lik, s in zip(per_setting, settings, strict=True)]
    )
    weights = weights.to(device=device, dtype=torch.float32)
    betas = torch.tensor([s.beta for s in settings], device=device)
    lrs = torch.tensor([s.lr for s in settings], device=device)
    decays = torch.tensor([s.decay for s in settings], device=device)
    with torch.no_grad():
        num_classes = int(model(torch.zeros((1, *input_shape), device=device)).shape[-1])

    def log_lik(g: Update, s: Update, w: Tensor, c: Tensor) -> Tensor:
        if len(distinct) == 1:
            return distinct[0].log_prob(g, s, w)
        return sum(c[i] * lik.log_prob(g, s, w) for i, lik in enumerate(distinct))

    def log_prior(x: Tensor, c: Tensor, target: Tensor) -> Tensor:
        if len(distinct_priors) == 1:
            return distinct_priors[0].log_prob_given(x, target)
        return sum(c[i] * p.log_prob_given(x, target) for i, p in enumerate(distinct_priors))

    def objective(x, z, y, g: Update, w: Tensor, c: Tensor, beta: Tensor, d: Tensor) -> Tensor:
        """Negative MC objective of one attack: x is n × input, d its k ball offsets.

        ``c`` holds the setting's one-hot choices of likelihood and prior.
        """
        c_lik, c_prior = c[: len(distinct)], c[len(distinct) :]

        def one(xi: Tensor) -> Tensor:
            target = torch.softmax(z, dim=-1) if config.optimize_labels else y
            s = gradient(params, xi, target)
            return -(log_lik(g, s, w, c_lik) + beta * log_prior(xi, c_prior, target))

        if k == 1:
            return one(x + d[0])
        return vmap(one, randomness="different")(x.unsqueeze(0) + d).mean()

    choice = torch.cat([choice, prior_choice], dim=1)
    argnums = (0, 1) if config.optimize_labels else 0
    step_fn = grad_and_value(objective, argnums=argnums)
    # restarts: x, z, d vary; setting-level and update-level inputs are shared
    # randomness="different": a stochastic model (PRECODE, CVB) draws its own noise in every
    # attack, as independent clients would; deterministic models are unaffected
    f = vmap(step_fn, in_dims=(0, 0, None, None, None, None, None, 0), randomness="different")
    f = vmap(f, in_dims=(0, 0, 0, 0, None, None, None, 0), randomness="different")  # updates: N
    f = vmap(f, in_dims=(0, 0, None, None, 0, 0, 0, 0), randomness="different")  # settings: H

    shape = (H, N, R, n, *input_shape)
    d_in = n * math.prod(input_shape)
    lo_hi = None if bounds is None else tuple(b.to(device) for b in bounds)
    # common random numbers: every setting starts from the same iterates and sees the same
    # ball samples, so settings (and attacks) are compared on equal terms
    if initial is None:
        x = _initial(config, (1, *shape[1:]), lo_hi, gen, device).expand(shape).clone()
    elif tuple(initial.shape) != (N, n, *input_shape):
        raise ValueError(
            f"initial must have shape {(N, n, *input_shape)}, got {tuple(initial.shape)}"
        )
    else:
        x = initial.to(device, torch.float32)[None, :, None].expand(shape).clone()
    z = (
        torch.randn((1, N, R, n, num_classes), generator=gen)
        .to(device)
        .expand(H, N, R, n, num_classes)
        .clone()
        if config.optimize_labels
        else torch.zeros((H, N, R, 1, 1), device=device)
    )
    y = (
        labels.to(device)
        if labels is not None
        else torch.zeros((N, n), dtype=torch.long, device=device)
    )
    zero_d = torch.zeros((H, N, R, 1, n, *input_shape), device=device)

    def offsets() -> Tensor:
        if config.delta == 0.0:
            return zero_d if k == 1 else zero_d.expand(H, N, R, k, n, *input_shape)
        flat = sample_ball((1, N, R, k, d_in), d_in, config.delta, dev_gen, device)
        return flat.reshape(1, N, R, k, n, *input_shape).expand(H, N, R, k, n, *input_shape)

    def evaluate(xv: Tensor, zv: Tensor, d: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        out, value = f(xv, zv, y, observed, weights, choice, betas, d)
        gx, gz = out if config.optimize_labels else (out, None)
        return gx, gz, value

    def clamp(xv: Tensor) -> Tensor:
        return torch.maximum(torch.minimum(xv, lo_hi[1]), lo_hi[0]) if config.box else xv

    history: list[float] = []
    steps = range(config.steps)
    if progress:
        from tqdm.auto import tqdm

        steps = tqdm(steps, desc="attack", leave=False)
    if config.optimizer == "adam":
        b1, b2, eps = 0.9, 0.999, 1e-8
        state = [(torch.zeros_like(t), torch.zeros_like(t)) for t in (x, z)]
        for t in steps:
            gx, gz, value = evaluate(x, z, offsets())
            history.append(float(value.detach().mean()))
            lr_t = lrs * _lr_factor(config, t, decays)
            new = []
            for var, g, (m, v) in zip((x, z), (gx, gz), state, strict=True):
                if g is None:
                    new.append(var)
                    continue
                if config.signed:
                    g = g.sign()
                m.mul_(b1).add_(g, alpha=1 - b1)
                v.mul_(b2).addcmul_(g, g, value=1 - b2)
                mhat = m / (1 - b1 ** (t + 1))
                vhat = v / (1 - b2 ** (t + 1))
                step = lr_t.reshape((H,) + (1,) * (var.dim() - 1)) * mhat / (vhat.sqrt() + eps)
                new.append(var - step)
            x, z = clamp(new[0]), new[1]
            if callback is not None:
                callback(t, x.detach())
    else:
        xp = x.clone().requires_grad_(True)
        zp = z.clone().requires_grad_(config.optimize_labels)
        variables = [xp, zp] if config.optimize_labels else [xp]
        opt = torch.optim.LBFGS(
            variables,
            lr=settings[0].lr,
            max_iter=config.lbfgs_iterations,
            history_size=config.lbfgs_history,
        )
        d0 = offsets()

        def closure() -> Tensor:
            gx, gz, value = evaluate(xp.detach(), zp.detach(), d0)
            xp.grad = gx
            if config.optimize_labels:
                zp.grad = gz
            return value.sum()

        for t in steps:
            value = opt.step(closure)
            history.append(float(value) / (H * N * R))
            with torch.no_grad():
                xp.copy_(clamp(xp))
            if callback is not None:
                callback(t, xp.detach().clone())
        x, z = xp.detach(), zp.detach()

    _, _, final = evaluate(x, z, zero_d)
    final = torch.nan_to_num(final, nan=float("inf"))
    best = final.argmin(dim=2)  # H × N
    idx = best.reshape(H, N, 1, *([1] * (len(shape) - 3))).expand(H, N, 1, *shape[3:])
    images = x.gather(2, idx).squeeze(2)
    objective_best = final.gather(2, best.unsqueeze(2)).squeeze(2)
    est_labels = None
    if config.optimize_labels:
        zi = best.reshape(H, N, 1, 1, 1).expand(H, N, 1, n, num_classes)
        est_labels = z.gather(2, zi).squeeze(2).argmax(-1)
    return AttackResult(
        images=images.detach(),
        objective=objective_best.detach(),
        all_images=x.detach(),
        all_objective=final.detach(),
        settings=settings,
        labels=est_labels,
        history=history,
    )
