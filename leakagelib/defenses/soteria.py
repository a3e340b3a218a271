"""Soteria: prune the gradient of one layer where the representation leaks the most.

Sun et al. (2021) perturb the representation ``r`` that enters a chosen fully
connected layer ``l`` (Bayes paper §5, Eq. 4). Their code computes, for every
feature ``f`` of ``r``,

    ρ_f = Σ_b ‖∂r_{b,f} / ∂X_b‖₂ / (r_{b,f} + 0.1),

the size of the input change a unit change of the feature needs, relative to
the feature, summed over the batch. The features whose ``ρ_f`` lies below the
``pruning_rate`` percentile are the ones an attacker can move the input with
the least: their columns of the layer's *weight* gradient are zeroed, and the
other layers are sent unchanged (jeremy313/Soteria,
GS_attack/reconstruct_image.py; the ``+ 0.1`` and the percentile rule are
from there, as is the default rate 80 % the Bayes paper uses, A.1).

The Bayes paper breaks it by dropping the defended layer from the likelihood
(§5; A.5 Eq. 6): :meth:`Soteria.likelihood` is that attack, and when the
defended layer is unknown the attacker runs it once per layer
(:func:`layer_drop_likelihoods`) and keeps, for every update, the candidate
that explains the rest of the gradient best (:func:`layer_drop_attack`). Used
by the chapter "Breaking heuristic defenses" and the experiments
``bayes/fig2-training`` and ``bayes/fig5-soteria-layers``.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.autograd import forward_ad

from ..attacks import AttackConfig, Prior, reconstruct
from ..attacks.cosine import Cosine
from ..attacks.likelihoods import Gaussian, LayerSelection, Likelihood
from ..gradients import Update, per_sample_updates
from .base import GradientDefense, Objective, client_gradients, require

__all__ = [
    "LayerDropResult",
    "Soteria",
    "layer_drop_attack",
    "layer_drop_likelihoods",
    "soteria_scores",
]


def _defended(model: nn.Module, layer: str) -> nn.Linear:
    """The layer Soteria defends, which must be fully connected."""
    module = model.get_submodule(layer)
    if not isinstance(module, nn.Linear):
        raise TypeError(
            f"Soteria defends a fully connected layer; {layer!r} is a {type(module).__name__}"
        )
    return module


def _representation(model: nn.Module, layer: str, x: Tensor) -> Tensor:
    """The flattened input of ``layer`` (a fully connected layer) when ``model`` runs on ``x``."""
    module = _defended(model, layer)
    captured: dict[str, Tensor] = {}

    def hook(_m: nn.Module, args: tuple[Tensor, ...]) -> None:
        captured["r"] = args[0]

    handle = module.register_forward_pre_hook(hook)
    try:
        model(x)
    finally:
        handle.remove()
    return captured["r"].reshape(x.shape[0], -1)


def _row_norms_reverse(
    model: nn.Module, images: Tensor, layer: str, chunk: int
) -> tuple[Tensor, Tensor]:
    """``(r, ‖∂r_{b,f}/∂X_b‖)``, the norms as features × images, by reverse mode: batched
    backward passes, ``chunk`` features each."""
    x = images.detach().clone().requires_grad_(True)
    r = _representation(model, layer, x)
    n, width = r.shape
    norms = torch.empty(width, n, dtype=r.dtype, device=r.device)
    for lo in range(0, width, chunk):
        hi = min(lo + chunk, width)
        basis = torch.zeros(hi - lo, n, width, dtype=r.dtype, device=r.device)
        basis[torch.arange(hi - lo), :, torch.arange(lo, hi)] = 1.0
        (jac,) = torch.autograd.grad(
            r, x, grad_outputs=basis, is_grads_batched=True, retain_graph=True
        )
        norms[lo:hi] = jac.reshape(hi - lo, n, -1).norm(dim=2)
    return r.detach(), norms


def _row_norms_forward(
    model: nn.Module, images: Tensor, layer: str, chunk: int
) -> tuple[Tensor, Tensor]:
    """The same by forward mode: ``chunk`` input coordinates at a time, each a column of the
    Jacobian for every image, their squares summed over the coordinates."""
    n = images.shape[0]
    flat = images.detach().reshape(n, -1)
    dims = flat.shape[1]
    with torch.no_grad():
        r = _representation(model, layer, images.detach())
    squares = torch.zeros(r.shape[1], n, dtype=r.dtype, device=r.device)
    for lo in range(0, dims, chunk):
        k = min(lo + chunk, dims) - lo
        tangent = torch.zeros(k, n, dims, dtype=flat.dtype, device=flat.device)
        tangent[torch.arange(k), :, torch.arange(lo, lo + k)] = 1.0
        with torch.no_grad(), forward_ad.dual_level(), warnings.catch_warnings():
            # torch's first forward-mode pass loads its decompositions through the deprecated
            # torch.jit.script, which warns; the warning is torch's own, not about this code
            warnings.filterwarnings("ignore", "`torch.jit.script` is deprecated", FutureWarning)
            x = forward_ad.make_dual(flat.expand(k, n, dims).clone(), tangent)
            rows = _representation(model, layer, x.reshape(k * n, *images.shape[1:]))
            column = forward_ad.unpack_dual(rows).tangent.reshape(k, n, -1)
        squares += column.square().sum(dim=0).T
    return r, squares.sqrt()


def soteria_scores(
    model: nn.Module, images: Tensor, layer: str, *, rows: int = 64, per_image: bool = False
) -> Tensor:
    """ρ_f for every input feature of ``layer`` (a vector of the layer's ``in_features``).

    ``per_image=True``: each image's own ρ (N × ``in_features``), the scores a
    client holding only that image computes. The reference code runs one
    backward pass per feature; here the norms ``‖∂r_f/∂X‖`` come from whichever
    side of the Jacobian is shorter: batched backward passes over the features
    (``is_grads_batched``) when the layer has fewer inputs than an image has
    pixels, forward-mode passes over the pixels otherwise (ConvBig's ``fc1``
    reads 4,096 features of a 784-pixel digit in the chapter "Breaking
    heuristic defenses"). Each pass carries about ``rows`` rows (features or
    pixels times images): on the 2-core CPU, passes of 32–256 rows were the
    fastest, and 768 rows (the earlier 256 features of 3 images) took up to
    twice their time. Both routes give the same scores (``tests/test_defenses.py``).
    Like the reference, every image's representation must depend on that
    image alone (a model in eval mode).
    """
    if images.dim() != 4:
        raise ValueError(f"images must be N×C×H×W, got shape {tuple(images.shape)}")
    if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1:
        raise ValueError(f"rows must be a positive integer (rows per batched pass), got {rows!r}")
    width = _defended(model, layer).in_features
    pixels = images[0].numel()
    route = _row_norms_forward if pixels < width else _row_norms_reverse
    r, norms = route(model, images, layer, max(1, rows // images.shape[0]))
    scores = norms / (r.T + 0.1)
    return scores.T if per_image else scores.sum(dim=1)


class Soteria(GradientDefense):
    """Soteria on the fully connected layer ``layer`` (its module name) at ``pruning_rate``.

    The mask depends on the client's data: :meth:`share` derives it from the
    model and the batch, keeps it in :attr:`mask` (1 = gradient column kept;
    one row per image with ``per_image=True``, since every client fits its
    own) and zeroes the masked input columns of ``layer``'s weight gradient.
    ``attack`` chooses the form of the layer-drop likelihood :meth:`likelihood`
    hands out: ``"cosine"``, the Bayes paper's experimental setting (A.1:
    cosine similarity, all other gradients weighted equally), or
    ``"gaussian"``, the per-layer Gaussian of A.5, Eq. 6.
    """

    def __init__(self, layer: str, pruning_rate: float = 0.8, *, attack: str = "cosine") -> None:
        self.pruning_rate = require(
            "pruning_rate", pruning_rate, lambda v: 0 <= v < 1,
            "in [0, 1) (the share of the layer's input features pruned)",
        )  # fmt: skip
        if attack not in _KINDS:
            raise ValueError(
                f"attack must be one of {_KINDS} (the layer-drop likelihood's form), got {attack!r}"
            )
        self.layer = layer
        self.attack = attack
        self.mask: Tensor | None = None

    def share(
        self,
        model: nn.Module,
        images: Tensor,
        labels: Tensor,
        generator: torch.Generator | None = None,
        *,
        per_image: bool = False,
        loss: str | Objective = "ce",
    ) -> Update:
        """Fit the feature mask on the batch (each image's own when ``per_image``), then prune."""
        update = client_gradients(model, images, labels, per_image=per_image, loss=loss)
        scores = soteria_scores(model, images, self.layer, per_image=per_image).abs()
        rows = scores.reshape(-1, scores.shape[-1]).double()
        thresh = torch.quantile(rows, self.pruning_rate, dim=1, keepdim=True).to(scores.dtype)
        self.mask = (scores >= thresh.reshape(*scores.shape[:-1], 1)).to(scores.dtype)
        key = f"{self.layer}.weight"
        if key not in update:
            raise KeyError(f"the update has no gradient {key!r} for the defended layer")
        mask = self.mask.unsqueeze(-2) if per_image else self.mask  # N×1×D against N×K×D
        out = dict(update)
        out[key] = update[key] * mask.to(update[key].device, update[key].dtype)
        return out

    def likelihood(self) -> Likelihood:
        """The layer-drop attack: a likelihood (of kind ``attack``) over every layer but ``layer``."""
        return _drop(self.layer, self.attack)

    def describe(self) -> dict[str, Any]:
        return {"defense": "soteria", "layer": self.layer, "pruning_rate": self.pruning_rate}


_KINDS = ("cosine", "gaussian")


def _drop(layer: str, kind: str) -> Likelihood:
    prefix = f"{layer}."
    selection = LayerSelection(include=lambda name: not name.startswith(prefix))
    if kind == "cosine":
        return Cosine(layers=selection)
    if kind == "gaussian":
        return Gaussian(layers=selection)
    raise ValueError(f"kind must be 'cosine' or 'gaussian', got {kind!r}")


def layer_drop_likelihoods(model: nn.Module, kind: str = "cosine") -> dict[str, Likelihood]:
    """One layer-drop likelihood per fully connected layer, for an attacker who does not know
    which layer Soteria defends (Bayes paper §5: "simply run the attack for all")."""
    layers = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    if not layers:
        raise ValueError("the model has no fully connected layer Soteria could defend")
    return {name: _drop(name, kind) for name in layers}


@dataclass
class LayerDropResult:
    """What :func:`layer_drop_attack` returns.

    ``images``: ``N × n × C × H × W``, each update's chosen reconstruction (in
    the model's input space); ``chosen``: the layer each of them dropped;
    ``candidates``: layer (or ``extra`` name) → its reconstructions
    (``N × n × ...``); ``objective``: final objectives, one row per entry of
    ``candidates`` in its order, one column per update; ``residual``: the
    choice's score (:func:`_kept_layer_residuals`), one row per candidate layer.
    """

    images: Tensor
    chosen: list[str]
    candidates: dict[str, Tensor]
    objective: Tensor
    residual: Tensor


def _kept_layer_residuals(
    model: nn.Module,
    shared_update: dict[str, Tensor],
    labels: Tensor,
    images: Tensor,
    layers: Sequence[str],
) -> Tensor:
    """``L × N``: for candidate ``l`` (dropping ``layers[l]``) and update ``i``, the sum over
    the layers it keeps of ``‖g − u‖² / ‖u‖²``, ``g`` the gradient at its reconstruction of
    ``i`` and ``u`` the shared one; a layer is a module's parameters together.

    :func:`layer_drop_attack` keeps each update's candidate of least score: the
    attack that drops the defended layer fits true gradients only and can
    match them all, while any other candidate reads the pruned gradient,
    which no input reproduces. The candidates' own final objectives are no
    fair judge, as each sums other layers at their own scales and one without
    the largest layer (``fc1``) has the least to fit: at ci scale, with
    ``fc2`` defended on the nearly untrained network, that rule took ``fc1``
    for one image in three on seeds 1 and 2, and a rule reading only the
    layers no candidate drops (the convolutions) took ``fc3`` for one on seed
    0, where this one chose right on all 18 (2026-11-29).
    """
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    modules: dict[str, list[str]] = {}
    for name in names:
        modules.setdefault(name.rsplit(".", 1)[0], []).append(name)
    count, device = images.shape[1], images.device
    if images.shape[2] != 1:
        raise ValueError(f"each update must hold one image, got {images.shape[2]}")

    def flat(update: dict[str, Tensor], ps: list[str]) -> Tensor:  # N × the module's entries
        return torch.cat([update[n].reshape(count, -1).to(device) for n in ps], dim=1)

    shared = {module: flat(shared_update, ps) for module, ps in modules.items()}
    scores = torch.zeros(images.shape[:2], device=device)
    for li, dropped in enumerate(layers):  # one batched gradient per candidate's images
        fit = per_sample_updates(model, images[li, :, 0], labels.reshape(count).to(device))
        for module, ps in modules.items():
            if not f"{module}.".startswith(f"{dropped}."):
                g, u = flat(fit, ps), shared[module]
                scores[li] += (g - u).pow(2).sum(1) / u.pow(2).sum(1).clamp_min(1e-30)
    return scores


def layer_drop_attack(
    model: nn.Module,
    shared_update: dict[str, Tensor],
    *,
    labels: Tensor,
    input_shape: tuple[int, ...],
    prior: Prior,
    config: AttackConfig,
    layers: Sequence[str] | None = None,
    kind: str = "cosine",
    extra: Mapping[str, Likelihood] | None = None,
    bounds: tuple[Tensor, Tensor] | None = None,
    generator: torch.Generator | None = None,
    device: str | torch.device | None = None,
) -> LayerDropResult:
    """The layer-drop attack on Soteria when the defended layer is unknown (Bayes paper §5).

    One attack per candidate fully connected layer (``layers``, default every
    ``nn.Linear`` of ``model``), each reading every gradient but that layer's;
    all run as settings of one batched program from the same starting points.
    ``shared_update`` is stacked (leading dimension ``N``, one image per
    update; ``labels`` of length ``N``). For every update the candidate is kept
    whose reconstruction's gradient is nearest the shared one on the layers
    it reads, each layer's error relative to its size
    (:func:`_kept_layer_residuals` says why). The paper says only "run the
    attack for all"; this choice rule makes that runnable without looking at
    the client's image. ``extra`` adds named likelihoods to
    the same batched program (the direct attack, for comparison): their
    reconstructions join ``candidates`` but are never chosen. Used by
    ``bayes/fig5-soteria-layers`` and the chapter "Breaking heuristic defenses".
    """
    likelihoods = layer_drop_likelihoods(model, kind)
    if layers is not None:
        unknown = [name for name in layers if name not in likelihoods]
        if unknown:
            raise KeyError(f"{unknown} are not fully connected layers of the model")
        likelihoods = {name: likelihoods[name] for name in layers}
    names = list(likelihoods)
    extra = dict(extra or {})
    clash = [name for name in extra if name in likelihoods]
    if clash:
        raise ValueError(f"extra likelihoods {clash} clash with candidate layer names")
    liks = [*likelihoods.values(), *extra.values()]
    result = reconstruct(
        model, shared_update, labels=labels, likelihood=liks, prior=prior,
        config=config, settings=[config.setting()] * len(liks), input_shape=input_shape,
        bounds=bounds, generator=generator, device=device,
    )  # fmt: skip
    images = result.images.detach()  # L × N × n × ...
    objective = result.objective.detach()
    fit = _kept_layer_residuals(model, shared_update, labels, images[: len(names)], names)
    best = fit.argmin(dim=0)  # N
    chosen = images[best, torch.arange(images.shape[1], device=images.device)]
    return LayerDropResult(
        images=chosen,
        chosen=[names[int(i)] for i in best],
        candidates={name: images[i] for i, name in enumerate([*names, *extra])},
        objective=objective,
        residual=fit,
    )
