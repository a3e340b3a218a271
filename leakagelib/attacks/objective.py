"""The objective of a batch of attacks and its gradient, as one vectorised function.

An attack's negative Monte-Carlo objective
``-(1/k) Σᵢ [log p(g | xᵢ) + β log p(xᵢ)]`` (Balunović et al. 2022, Eq. 3)
is differentiated with :func:`torch.func.grad_and_value` and mapped over
restarts, shared updates and settings with three nested
:func:`torch.func.vmap` s. Built once per :func:`leakagelib.attacks.loop.run_attack`
and called at every step by the optimisers of :mod:`.optimizers`.
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
from .priors import Prior, bind_model

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

    One attack's negative Monte-Carlo objective is differentiated with
    :func:`torch.func.grad_and_value` and mapped over restarts, updates and
    settings (three nested ``vmap`` s; updates and labels are shared across
    settings and restarts, never copied). A setting picks its likelihood and
    prior through one-hot weights over the distinct ones, so different attacks
    (Bayes, ℓ2, ℓ1, cosine) run in the same program.
    """
    H, N, _, n = shape[:4]
    names = list(observed)
    params = {kk: v.to(device) for kk, v in params_of(model).items()}
    observed = {kk: v.to(device=device, dtype=torch.float32) for kk, v in observed.items()}
    gradient = functional_gradient(model, loss=loss)
    per_setting = _per_setting(likelihood, Likelihood, "likelihood", H)
    distinct, choice = _distinct(per_setting, device)
    distinct = [d.to(device) for d in distinct]
    distinct_priors, prior_choice = _distinct(_per_setting(prior, Prior, "prior", H), device)
    # priors that read the network (BatchNorm statistics, CPL's label term) meet the model here
    distinct_priors = [bind_model(p, model) for p in distinct_priors]
    weights = torch.stack(
        [lik.weights(names, s.weighting) for lik, s in zip(per_setting, settings, strict=True)]
    )
    weights = weights.to(device=device, dtype=torch.float32)
    betas = torch.tensor([s.beta for s in settings], device=device)
    choice = torch.cat([choice, prior_choice], dim=1)
    f = _over_all_attacks(_one_attack(gradient, params, distinct, distinct_priors, config), config)
    y = (labels if labels is not None else torch.zeros((N, n), dtype=torch.long)).to(device)

    def evaluate(x: Tensor, z: Tensor, d: Tensor) -> tuple[Tensor, Tensor | None, Tensor]:
        out, value = f(x, z, y, observed, weights, choice, betas, d)
        gx, gz = out if config.optimize_labels else (out, None)
        return gx, gz, value

    return evaluate


def _over_all_attacks(one_attack: Callable[..., Tensor], config: AttackConfig) -> Callable:
    """``grad_and_value`` of one attack, mapped over restarts, updates and settings.

    Restarts vary ``x``, ``z`` and the offsets ``d`` only; the updates and
    labels vary over ``N`` and are shared by settings and restarts; the layer
    weights, choices and β vary over settings. ``randomness="different"``: a
    stochastic model (PRECODE, CVB) draws its own noise in every attack, as
    independent clients would; deterministic models are unaffected.
    """
    argnums = (0, 1) if config.optimize_labels else 0
    f = grad_and_value(one_attack, argnums=argnums)
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
