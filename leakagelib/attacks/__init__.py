"""Optimisation attacks as (likelihood, prior, loop): one ``reconstruct`` for all of them.

The Bayes paper (Balunović et al. 2022, §4) shows that DLG, Inverting
Gradients, GradInversion and the Bayes-optimal adversary maximise the same
objective ``log p(g | x) + β log p(x)`` with different parts. The package
mirrors that: :mod:`.likelihoods`, :mod:`.priors`, the loop of :mod:`.loop`,
the named combinations of :mod:`.presets` and the hyper-parameter search of
:mod:`.search`. :func:`reconstruct` is the single entry point.

Introduced in the chapter "Existing attacks are approximations".
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn

from ..gradients import check_update
from .likelihoods import Cosine, Gaussian, Laplace, LayerSelection, Likelihood, Pruned
from .loop import AttackConfig, AttackResult, Setting, image_bounds, run_attack
from .priors import (
    BatchNormStatistics,
    GaussianPrior,
    LabelAlignment,
    LaplacePrior,
    PixelRange,
    Prior,
    TotalVariation,
    Uniform,
    WeightedSum,
    gradinversion,
)

Update = dict[str, Tensor]

__all__ = [
    "AttackConfig",
    "AttackResult",
    "BatchNormStatistics",
    "Cosine",
    "Gaussian",
    "GaussianPrior",
    "LabelAlignment",
    "Laplace",
    "LaplacePrior",
    "LayerSelection",
    "Likelihood",
    "PixelRange",
    "Prior",
    "Pruned",
    "Setting",
    "TotalVariation",
    "Uniform",
    "WeightedSum",
    "gradinversion",
    "image_bounds",
    "reconstruct",
]


def reconstruct(
    model: nn.Module,
    shared_update: Update,
    *,
    labels: Tensor | None,
    likelihood: Likelihood | Sequence[Likelihood],
    prior: Prior | Sequence[Prior],
    config: AttackConfig | None = None,
    input_shape: tuple[int, ...],
    num_images: int | None = None,
    stacked: bool = False,
    settings: Sequence[Setting] | None = None,
    bounds: tuple[Tensor, Tensor] | None = None,
    loss: str = "ce",
    generator: torch.Generator | None = None,
    device: str | torch.device | None = None,
    callback: Callable[[int, Tensor], None] | None = None,
    progress: bool = False,
    initial: Tensor | None = None,
) -> AttackResult:
    """Reconstruct the inputs behind ``shared_update`` by maximising the log posterior.

    * ``shared_update``: the update the server saw (an ordered name → tensor
      dict). With ``stacked=True`` every tensor has a leading dimension ``N``
      and each slice is attacked independently (the Bayes code's 10 single-
      image attacks, vectorised); ``labels`` is then ``N × n`` (or ``N``,
      meaning one image per update).
    * ``labels``: the true labels (known, or recovered with
      :func:`leakagelib.gradients.recover_label_idlg`), or ``None`` with
      ``config.optimize_labels`` (DLG), in which case ``num_images`` says how
      many inputs each update came from.
    * ``input_shape``: one input's shape, ``(C, H, W)`` or ``(D,)``.
    * ``likelihood``, ``prior``, ``config``: the attack (see :mod:`.presets`).
    * ``settings``: several :class:`Setting` s run in the same batch;
      ``likelihood`` and ``prior`` may then be sequences with one entry per setting.
    * ``bounds``: per-channel box ``(lo, hi)`` in input space
      (:func:`image_bounds`), used by ``config.box`` and the uniform init.
    * ``initial``: given starting points instead of ``config.init`` —
      ``n × input shape``, or ``N × n × input shape`` when stacked (R-GAP → DLG).

    Returns an :class:`AttackResult` whose ``images`` are ``H × N × n × ...``
    in the model's input space (``H = len(settings)``, ``N = 1`` unless
    stacked).
    """
    config = config or AttackConfig()
    liks = [likelihood] if isinstance(likelihood, Likelihood) else list(likelihood)
    if not liks or not all(isinstance(lik, Likelihood) for lik in liks):
        raise TypeError(
            f"likelihood must be a Likelihood or a sequence of them, got {likelihood!r}"
        )
    pri = [prior] if isinstance(prior, Prior) else list(prior)
    if not pri or not all(isinstance(p, Prior) for p in pri):
        raise TypeError(f"prior must be a Prior or a sequence of them, got {prior!r}")
    if stacked:
        n_upd = {t.shape[0] for t in shared_update.values()}
        if len(n_upd) != 1:
            raise ValueError("a stacked update needs the same leading dimension N in every tensor")
        check_update(model, {k: v[0] for k, v in shared_update.items()})
        observed = dict(shared_update)
        if labels is not None and labels.dim() == 1:
            labels = labels.unsqueeze(1)
    else:
        check_update(model, shared_update)
        observed = {k: v.unsqueeze(0) for k, v in shared_update.items()}
        if labels is not None:
            if labels.dim() != 1:
                raise ValueError(
                    f"labels of one update must be a vector, got {tuple(labels.shape)}"
                )
            labels = labels.unsqueeze(0)
    if labels is not None:
        labels = labels.long()
        if num_images is not None and num_images != labels.shape[1]:
            raise ValueError(f"num_images={num_images} disagrees with labels {tuple(labels.shape)}")
        num_images = labels.shape[1]
    if num_images is None or num_images < 1:
        raise ValueError("give labels, or num_images with config.optimize_labels")
    if initial is not None and not stacked:
        initial = initial.unsqueeze(0)
    return run_attack(
        model,
        observed,
        labels=labels,
        num_images=num_images,
        input_shape=tuple(input_shape),
        likelihood=likelihood,
        prior=prior,
        config=config,
        settings=settings,
        bounds=bounds,
        loss=loss,
        generator=generator,
        device=device,
        callback=callback,
        progress=progress,
        initial=initial,
    )
