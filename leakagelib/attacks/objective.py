"""The objective of a batch of attacks and its gradient, as one batched function.

An attack's negative Monte-Carlo objective
``-(1/k) Σᵢ [log p(g | xᵢ) + β log p(xᵢ)]`` (Balunović et al. 2022, Eq. 3)
is evaluated for all attacks of a batch at once, by one of two routes
(``AttackConfig.engine``):

* **hooks** (:func:`_hooked`): all candidates go through the model as one
  batch of rows and :func:`leakagelib.attacks.per_attack.simulate` forms each
  attack's simulated update from recorded activations; the likelihoods then
  compare them with the observed updates in batched form. Several times
  faster on the CPU (``benchmarks/attack_throughput.py``); models whose rows
  are computed independently.
* **vmap** (:func:`_vmapped`): :func:`torch.func.grad_and_value` of one
  attack, mapped over restarts, shared updates and settings with three nested
  :func:`torch.func.vmap` s; any model, including batch norm in training mode
  and stochastic bottlenecks.

Built once per :func:`leakagelib.attacks.loop.run_attack` and called at
every step by the optimisers of :mod:`.optimizers`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn
from torch.func import grad_and_value, vmap

from ..gradients import functional_gradient, params_of
from .config import AttackConfig, Setting
from .likelihoods import Likelihood
from .optimizers import Evaluate
from .per_attack import Observed, simulate, unsupported_reason
from .priors import Prior, Uniform, bind_model

Update = dict[str, Tensor]

__all__ = ["batched_objective"]


def _distinct(items: Sequence[object], device: torch.device) -> tuple[list, Tensor]:
    """The distinct objects of ``items`` (by identity) and a one-hot choice per item."""
    distinct: list = []
    for item in items:
        if not any(item is d for d in distinct):
            distinct.append(item)
    choice = torch.tensor([[float(i is d) for d in distinct] for i in items], device=device)
    return distinct, choice


def _per_setting(item: object, kind: type, what: str, count: int) -> list:
    """``item`` (one ``kind`` for all settings, or a sequence of one per setting) as a list."""
    items = [item] * count if isinstance(item, kind) else list(item)  # type: ignore[call-overload]
    if not all(isinstance(i, kind) for i in items):
        raise TypeError(f"{what} must be a {kind.__name__} or a sequence of them, got {item!r}")
    if len(items) != count:
        raise ValueError(f"got {len(items)} {what}s for {count} settings; give one per setting")
    return items


def batched_objective(
    model: nn.Module,
    observed: Update,
    labels: Tensor | None,
    settings: list[Setting],
    likelihood: Likelihood | Sequence[Likelihood],
    prior: Prior | Sequence[Prior],
    config: AttackConfig,
    *,
    shape: tuple[int, ...],
    loss: str,
    device: torch.device,
) -> Evaluate:
    """The objective of all ``H × N × R`` attacks and its gradient, as one batched function.

    A setting has its own likelihood and prior (one each, or one per
    setting), so different attacks (Bayes, ℓ2, ℓ1, cosine) run in the same
    program; updates and labels are shared across settings and restarts,
    never copied. ``config.engine`` picks the route (module docstring).
    """
    H, N = shape[:2]
    names = list(observed)
    observed = {kk: v.to(device=device, dtype=torch.float32) for kk, v in observed.items()}
    likelihoods = _once_each(
        _per_setting(likelihood, Likelihood, "likelihood", H), lambda li: li.to(device)
    )
    # priors that read the network (BatchNorm statistics, CPL's label term) meet the model here
    priors = _once_each(_per_setting(prior, Prior, "prior", H), lambda p: bind_model(p, model))
    weights = torch.stack(
        [lik.weights(names, s.weighting) for lik, s in zip(likelihoods, settings, strict=True)]
    )
    weights = weights.to(device=device, dtype=torch.float32)
    betas = torch.tensor([s.beta for s in settings], device=device)
    y = (labels if labels is not None else torch.zeros((N, shape[3]), dtype=torch.long)).to(device)
    for lik in likelihoods:  # a grouped likelihood needs N in whole blocks
        lik.check_updates(N)
    reason = unsupported_reason(model)
    if config.engine == "hooks" and reason is not None:
        raise ValueError(f"engine='hooks' cannot batch attacks on this model: {reason}; use 'vmap'")
    if config.engine == "vmap" or reason is not None:
        grouped = [lik for lik in likelihoods if lik.group != 1]
        if grouped:  # the vmap route differentiates every update's attack on its own
            why = "engine='vmap'" if reason is None else reason
            raise ValueError(
                f"{grouped[0]!r} couples blocks of {grouped[0].group} updates, which only the "
                f"hooked route evaluates together ({why})"
            )
        return _vmapped(model, observed, y, likelihoods, priors, weights, betas, config, loss)
    return _hooked(model, observed, y, likelihoods, priors, weights, betas, config, loss)


def _once_each(items: list, f: Callable) -> list:
    """``[f(i) for i in items]``, calling ``f`` once per distinct item, so identity is kept."""
    done = {id(i): f(i) for i in items}
    return [done[id(i)] for i in items]


def _groups(items: list, device: torch.device) -> list[tuple[object, Tensor]]:
    """The distinct objects of ``items`` (by identity), each with the indices where it appears."""
    distinct, choice = _distinct(items, device)
    return [(d, choice[:, j].nonzero().flatten()) for j, d in enumerate(distinct)]


def _hooked(
    model: nn.Module,
    observed: Update,
    y: Tensor,
    likelihoods: list[Likelihood],
    priors: list[Prior],
    weights: Tensor,
    betas: Tensor,
    config: AttackConfig,
    loss: str,
) -> Evaluate:
    """The objective by the hooked route (:mod:`.per_attack`): no ``vmap`` over the model."""
    H = len(likelihoods)
    names, obs = list(observed), Observed(observed)
    lik_groups = []
    for lik, idx in _groups(likelihoods, weights.device):
        w = weights.index_select(0, idx)
        active = [i for i in range(len(names)) if bool((w[:, i] != 0).any())]
        lik_groups.append((lik, idx, [(names[i], w[:, i]) for i in active]))
    prior_groups = [
        (p, idx) for p, idx in _groups(priors, weights.device) if not isinstance(p, Uniform)
    ]

    def evaluate(
        x: Tensor, z: Tensor, d: Tensor, beta: Tensor | None = None, *, grad: bool = True
    ) -> tuple[Tensor | None, Tensor | None, Tensor]:
        b = betas if beta is None else beta
        x = x.detach().requires_grad_()
        z = z.detach().requires_grad_() if config.optimize_labels else z
        _, N, R, k, n, *input_shape = d.shape
        lead = (H, N, R * k)
        candidates = (x.unsqueeze(3) + d).reshape(H, N, R * k, n, *input_shape)
        if config.optimize_labels:
            target = torch.softmax(z, dim=-1).unsqueeze(3).expand(H, N, R, k, n, z.shape[-1])
        else:
            target = y[None, :, None, None].expand(H, N, R, k, n)
        target = target.reshape(H, N, R * k, n, *target.shape[5:])
        rows = candidates.reshape(-1, *input_shape)
        sim = simulate(model, rows, target.reshape(-1, *target.shape[4:]), lead, loss)
        log_lik = x.new_zeros(lead)
        for lik, idx, weighted in lik_groups:
            part = sim if len(idx) == H else sim.select(idx)
            log_lik = log_lik.index_add(0, idx, lik.batched_log_prob(obs, part, weighted))
        log_prior = x.new_zeros(lead)
        for prior, idx in prior_groups:
            xs = candidates.index_select(0, idx).flatten(0, 2)
            ts = target.index_select(0, idx).flatten(0, 2)
            value = vmap(prior.log_prob_given, randomness="different")(xs, ts)
            log_prior = log_prior.index_add(0, idx, value.reshape(len(idx), N, R * k))
        value = -(log_lik + b[:, None, None] * log_prior).reshape(H, N, R, k).mean(3)
        if not grad:  # the objective alone: no backward pass through the simulated updates
            return None, None, value.detach()
        wrt = [x, z] if config.optimize_labels else [x]
        grads = torch.autograd.grad(value.sum(), wrt)
        return grads[0], grads[1] if config.optimize_labels else None, value.detach()

    return evaluate


def _vmapped(
    model: nn.Module,
    observed: Update,
    y: Tensor,
    likelihoods: list[Likelihood],
    priors: list[Prior],
    weights: Tensor,
    betas: Tensor,
    config: AttackConfig,
    loss: str,
) -> Evaluate:
    """The objective by the ``vmap`` route: one attack's ``grad_and_value``, mapped over all.

    A setting picks its likelihood and prior through one-hot weights over
    the distinct ones.
    """
    params = {kk: v.to(weights.device) for kk, v in params_of(model).items()}
    distinct, choice = _distinct(likelihoods, weights.device)
    distinct_priors, prior_choice = _distinct(priors, weights.device)
    choice = torch.cat([choice, prior_choice], dim=1)
    gradient = functional_gradient(model, loss=loss)
    one = _one_attack(gradient, params, distinct, distinct_priors, config)
    f, value_only = _over_all_attacks(one, config), _over_all_attacks(one, config, grad=False)

    def evaluate(
        x: Tensor, z: Tensor, d: Tensor, beta: Tensor | None = None, *, grad: bool = True
    ) -> tuple[Tensor | None, Tensor | None, Tensor]:
        args = (x, z, y, observed, weights, choice, betas if beta is None else beta, d)
        if not grad:
            return None, None, value_only(*args).detach()
        out, value = f(*args)
        gx, gz = out if config.optimize_labels else (out, None)
        return gx, gz, value

    return evaluate


def _over_all_attacks(
    one_attack: Callable[..., Tensor], config: AttackConfig, *, grad: bool = True
) -> Callable:
    """``grad_and_value`` of one attack (with ``grad=False`` its value alone), mapped over
    restarts, updates and settings.

    Restarts vary ``x``, ``z`` and the offsets ``d`` only; the updates and
    labels vary over ``N`` and are shared by settings and restarts; the layer
    weights, choices and β vary over settings. ``randomness="different"``: a
    stochastic model (PRECODE, CVB) draws its own noise in every attack, as
    independent clients would; deterministic models are unaffected.
    """
    argnums = (0, 1) if config.optimize_labels else 0
    f = grad_and_value(one_attack, argnums=argnums) if grad else one_attack
    f = vmap(f, in_dims=(0, 0, None, None, None, None, None, 0), randomness="different")  # R
    f = vmap(f, in_dims=(0, 0, 0, 0, None, None, None, 0), randomness="different")  # updates: N
    return vmap(f, in_dims=(0, 0, None, None, 0, 0, 0, 0), randomness="different")  # settings: H


def _one_attack(
    gradient: Callable[[Update, Tensor, Tensor], Update],
    params: Update,
    likelihoods: list[Likelihood],
    priors: list[Prior],
    config: AttackConfig,
) -> Callable[..., Tensor]:
    """The negative MC objective of one attack, ``(x, z, y, g, w, c, beta, d) -> scalar``.

    ``x`` is the attack's ``n × input`` iterate and ``d`` its ``k`` ball
    offsets, ``z`` the soft-label logits (DLG), ``y`` the labels, ``g`` the
    observed update, ``w`` the layer weights, ``c`` the one-hot choices of
    likelihood and prior, ``beta`` the prior weight.
    """
    n_lik = len(likelihoods)

    def log_lik(g: Update, s: Update, w: Tensor, c: Tensor) -> Tensor:
        if n_lik == 1:
            return likelihoods[0].log_prob(g, s, w)
        return sum(c[i] * lik.log_prob(g, s, w) for i, lik in enumerate(likelihoods))

    def log_prior(x: Tensor, c: Tensor, target: Tensor) -> Tensor:
        if len(priors) == 1:
            return priors[0].log_prob_given(x, target)
        return sum(c[i] * p.log_prob_given(x, target) for i, p in enumerate(priors))

    def objective(x, z, y, g: Update, w: Tensor, c: Tensor, beta: Tensor, d: Tensor) -> Tensor:
        c_lik, c_prior = c[:n_lik], c[n_lik:]

        def one(xi: Tensor) -> Tensor:
            target = torch.softmax(z, dim=-1) if config.optimize_labels else y
            s = gradient(params, xi, target)
            return -(log_lik(g, s, w, c_lik) + beta * log_prior(xi, c_prior, target))

        if config.mc_samples == 1:
            return one(x + d[0])
        return vmap(one, randomness="different")(x.unsqueeze(0) + d).mean()

    return objective
