"""The attacked scenario, built in one place: model, victims, normaliser, shared updates, bounds.

breaching's split of *case* (who is attacked, with what model and data, and
what the server sees) from *attack* (how the server reconstructs): a
:class:`Case` holds the first, and :meth:`Case.attack` runs any preset of
:mod:`leakagelib.attacks.presets` on it. Every experiment of
:mod:`leakagelib.experiments` builds its scenario with :func:`build_case`, so
the pipeline "per-image client updates → defense → stack → attack →
de-normalise → metric" is written once:

>>> case = build_case(model, images, labels, norm, defense=GaussianNoise(0.1))
>>> result = case.attack(attacks.preset("bayes", likelihood=case.defense.likelihood()))
>>> case.score(result, "psnr")           # one PSNR per victim image

Each victim image is its own client (a batch of one), as in the three
papers' single-image experiments; the defense's mechanism runs inside
:meth:`~leakagelib.defenses.GradientDefense.share`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import Tensor, nn

from .. import metrics
from ..attacks import Attack, AttackResult, image_bounds, run_together
from ..data import Normalizer
from ..defenses import GradientDefense, NoDefense
from ..gradients import Update

__all__ = ["METRICS", "Case", "build_case"]

#: Per-image metrics on [0, 1] images that :meth:`Case.score` knows by name.
METRICS: dict[str, Callable[[Tensor, Tensor], Tensor]] = {
    "psnr": metrics.psnr,
    "mse": metrics.mse,
    "ssim": metrics.ssim,
    "psnr_minmax": metrics.psnr_minmax,
    "mse_minmax": metrics.mse_minmax,
    "ssim_minmax": metrics.ssim_minmax,
    "lpips_minmax": metrics.lpips_minmax,
}


@dataclass
class Case:
    """One attacked scenario (see the module docstring).

    ``images`` are the victims in [0, 1] (N × C × H × W), ``labels`` their
    labels, ``normalizer`` maps them to the model's input space, ``updates``
    what the server sees (stacked: leading dimension N, one update per victim)
    and ``defense`` the mechanism that produced them.
    """

    model: nn.Module
    images: Tensor
    labels: Tensor
    normalizer: Normalizer
    updates: Update
    defense: GradientDefense
    device: str = "cpu"

    @property
    def input_shape(self) -> tuple[int, ...]:
        """One victim's shape, C × H × W."""
        return tuple(self.images.shape[1:])

    @property
    def bounds(self) -> tuple[Tensor, Tensor]:
        """The image box [0, 1] in the model's (normalised) input space, per channel."""
        return image_bounds(self.normalizer.mean, self.normalizer.std)

    def attack(
        self,
        attack: Attack | Sequence[Attack],
        *,
        generator: torch.Generator | None = None,
        **options: Any,
    ) -> AttackResult:
        """Run ``attack`` on every shared update (one batched program).

        Several attacks that share their loop (the Bayes attack and the
        heuristic distances of the Bayes paper's Table 2) run together as
        settings of that program, from the same starting points
        (:func:`leakagelib.attacks.run_together`; ``settings=`` and ``names=``
        among the ``options``). ``options`` go to
        :func:`leakagelib.attacks.reconstruct` (``settings``, ``callback``,
        ``initial``, ...). Labels are the victims' true labels unless the
        attack recovers or optimises its own.
        """
        attacks = [attack] if isinstance(attack, Attack) else list(attack)
        return run_together(
            self.model,
            self.updates,
            attacks,
            labels=self.labels.to(self.device),
            input_shape=self.input_shape,
            bounds=self.bounds,
            generator=generator,
            device=self.device,
            **options,
        )

    def first(self, n: int) -> Case:
        """The same scenario with only its first ``n`` victims (the Bayes paper tunes on these)."""
        if not 1 <= n <= len(self.labels):
            raise ValueError(
                f"n must be between 1 and the {len(self.labels)} victims of the case, got {n}"
            )
        updates = {k: v[:n] for k, v in self.updates.items()}
        return replace(self, images=self.images[:n], labels=self.labels[:n], updates=updates)

    def reconstructions(self, result: AttackResult, setting: int | str = 0) -> Tensor:
        """The reconstructions of ``setting`` as images in [0, 1] on the CPU (N × C × H × W)."""
        return self.normalizer.denormalize(result.inputs(setting).detach().cpu())

    def score(self, result: AttackResult, metric: str = "psnr", setting: int | str = 0) -> Tensor:
        """The per-victim ``metric`` (a name of :data:`METRICS`) of ``setting``'s reconstructions."""
        return self.score_images(self.reconstructions(result, setting), metric)

    def score_images(self, images: Tensor, metric: str = "psnr") -> Tensor:
        """The per-victim ``metric`` of ``images`` (N × C × H × W in [0, 1], one per victim).

        For reconstructions that do not come as an :class:`AttackResult` (the
        candidates of :func:`~leakagelib.defenses.layer_drop_attack`, say).
        """
        if metric not in METRICS:
            raise KeyError(f"unknown metric {metric!r}; use one of {sorted(METRICS)}")
        return METRICS[metric](images, self.images.cpu())


def build_case(
    model: nn.Module,
    images: Tensor,
    labels: Tensor,
    normalizer: Normalizer,
    *,
    defense: GradientDefense | None = None,
    generator: torch.Generator | None = None,
    device: str = "cpu",
    loss: str = "ce",
) -> Case:
    """The scenario in which each of ``images`` is a client sharing its ``defense``-d update.

    The updates are computed on ``device`` in one vectorised call
    (``defense.share(..., per_image=True)``) and kept there; ``defense``
    defaults to :class:`~leakagelib.defenses.NoDefense` (the plain gradient).
    The normalised images enter the model in its own floating-point type (a
    float64 model for the exact closed-form attacks sees float64 inputs).
    """
    defense = defense if defense is not None else NoDefense()
    model = model.to(device)
    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), None)
    x = normalizer.normalize(images).to(device=device, dtype=dtype)
    y = labels.to(device)
    updates = defense.share(model, x, y, generator, per_image=True, loss=loss)
    return Case(
        model=model,
        images=images.cpu(),
        labels=labels.cpu(),
        normalizer=normalizer,
        updates=updates,
        defense=defense,
        device=device,
    )
