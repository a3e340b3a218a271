"""The own analyses of the chapter "Variational bottlenecks": the CVB protocol, explicit arguments.

Beside the registered experiments (:mod:`.cvb_precode`, :mod:`.cvb_defenses`,
:mod:`.cvb_architectures`) the chapter attacks models of its own choosing:
the ignore attack against reading every gradient, CVB against no defense,
the widgets' PRECODE and CVB variants, the per-layer gradient similarities
of the CVB paper's Fig. 6 and the gradient entries of its Fig. 5. These
functions run the same protocol (:mod:`.cvb_common`) at the ``scale`` and
``seed`` they are given.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn

from .. import analysis
from ..data import Normalizer
from ..defenses import GradientDefense
from .cvb_common import (
    ATTACK,
    TRAINING,
    Victims,
    attack_layers,
    cvb_attack,
    cvb_config,
    fedavg_accuracy,
    load_victims,
    run_attack,
)
from .registry import Context

__all__ = ["attack_ssim", "gradient_entries", "gradient_trace", "utility", "victims"]

#: The protocol alone, as the chapter's analyses run it (no experiment's own settings).
PROTOCOL = cvb_config(ATTACK, TRAINING, ci={}, paper={}, sources={})


def _context(scale: str, seed: int, device: str = "cpu") -> Context:
    """A quiet run of the CVB protocol at ``scale`` with ``seed``."""
    return Context(scale=scale, seed=seed, device=device, progress=False, settings=PROTOCOL)


def victims(logical: str, n: int, *, scale: str = "ci", seed: int = 0) -> Victims:
    """``n`` training images of client 0 of ``logical`` (3×32×32), their labels, the normaliser.

    Drawn as the registered experiments draw their victims
    (:func:`~.cvb_data.load_victims`: the paper attacks one client's training
    data, §V-B). At ``scale="ci"`` from the embedded stand-ins (``digits28``
    for MNIST, ``patches`` for CIFAR-10) resized to 32×32, at ``"paper"``
    from the datasets themselves; ``seed`` fixes the clients' split and the draw.
    """
    return load_victims(_context(scale, seed), logical, n)


def attack_ssim(
    model: nn.Module,
    images: Tensor,
    labels: Tensor,
    norm: Normalizer,
    *,
    attack: str = "inverting-gradients",
    include: Sequence[str] | None = None,
    defense: GradientDefense | None = None,
    steps: int | None = None,
    lr: float | None = None,
    scale: str = "ci",
    seed: int = 0,
    offset: int = 0,
    device: str = "cpu",
    callback: Callable[[int, Tensor], None] | None = None,
) -> tuple[Tensor, Tensor]:
    """(SSIM per image, reconstructions in [0, 1]) of ``attack`` on every image's own update.

    ``attack`` is a preset id of :data:`~.cvb_common.ATTACKS`, configured as
    the CVB authors do at ``scale`` (:func:`~.cvb_common.cvb_attack`; ``steps``
    and ``lr`` replace the scale's values). ``include`` restricts the
    likelihood to those parameter names; by default a model with a bottleneck
    is attacked with the ignore attack (:func:`~.cvb_common.attack_layers`).
    Every image shares its update through ``defense`` (default: none).
    ``seed`` and ``offset`` seed the noise and the initialisation as in the
    registered experiments; ``callback(step, iterates)`` sees every iterate.
    """
    ctx = _context(scale, seed, device)
    chosen = cvb_attack(attack, ctx.config, steps=steps, lr=lr,
                        include=attack_layers(model) if include is None else include)  # fmt: skip
    case, result = run_attack(ctx, model, Victims(images, labels, norm), chosen,
                              defense=defense, offset=offset, callback=callback)  # fmt: skip
    return case.score(result, "ssim_minmax"), case.reconstructions(result)


def _first_image_attack(
    model: nn.Module,
    images: Tensor,
    labels: Tensor,
    norm: Normalizer,
    *,
    steps: int,
    include: Sequence[str] | None,
    seed: int,
    device: str,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Inverting Gradients on ``images`` (each its own client, as :func:`attack_ssim`), with
    ``include`` defaulting to every parameter: the first image's iterates (T×1×C×H×W) and its
    shared update. The authors' TV weight for the CNN; ``model`` is left on the CPU."""
    if include is None:
        include = [n for n, p in model.named_parameters() if p.requires_grad]
    iterates: list[Tensor] = []

    def keep(_step: int, x: Tensor) -> None:
        iterates.append(x[0, 0, 0, :1].cpu())  # setting 0, first update, restart 0: image 0

    ctx = _context("ci", seed, device)  # IG's learning rate is the same at both scales
    attack = cvb_attack("inverting-gradients", ctx.config, include=include, steps=steps)
    case, _ = run_attack(ctx, model, Victims(images, labels, norm), attack, callback=keep)
    model.cpu()
    return torch.cat(iterates), {k: v[0].cpu() for k, v in case.updates.items()}


def gradient_trace(
    model: nn.Module,
    images: Tensor,
    labels: Tensor,
    norm: Normalizer,
    *,
    steps: int = 40,
    include: Sequence[str] | None = None,
    seed: int = 0,
    device: str = "cpu",
) -> dict[str, Tensor]:
    """CVB paper §III-A, Fig. 6: per-layer cosine(dummy, client gradient) along an IG attack.

    Runs Inverting Gradients for ``steps`` iterations on ``images`` (each its
    own client, as :func:`attack_ssim`), keeps the iterates of the first
    image and returns :func:`leakagelib.analysis.similarity_trace` against
    that image's shared update: ``{layer: tensor of steps similarities}``.
    Every dummy gradient is recomputed with fresh bottleneck noise, as the
    attack saw it. ``include`` defaults to *all* parameters (the plain attack
    of Fig. 6(a, b)); pass :func:`leakagelib.defenses.attacked_parameters`
    for the ignore attack of Fig. 6(c). The authors' TV weight for the CNN;
    40 steps keep the chapter fast, and the figure's shape shows early. The similarities are
    computed on the CPU, so ``model`` is left there (moved in place).
    """
    iterates, target = _first_image_attack(model, images, labels, norm, steps=steps,
                                           include=include, seed=seed, device=device)  # fmt: skip
    return analysis.similarity_trace(model, target, iterates, labels[:1].cpu())


def gradient_entries(
    model: nn.Module,
    images: Tensor,
    labels: Tensor,
    norm: Normalizer,
    *,
    parameters: Sequence[str],
    steps: int = 40,
    include: Sequence[str] | None = None,
    seed: int = 0,
    device: str = "cpu",
) -> dict[str, tuple[Tensor, float]]:
    """CVB paper §III-A, Fig. 5: one randomly chosen entry of each of ``parameters``' gradients.

    The same attack as :func:`gradient_trace`; for every parameter name, the
    entry's value in the dummy gradient after each iteration
    (:func:`leakagelib.analysis.entry_trace`, fresh bottleneck noise at every
    iterate) and in the client's update. The entries are drawn from a
    generator seeded with ``seed``. Fig. 5 plots two such entries against
    each other: without a defense they walk to the client's point, after a
    stochastic bottleneck they jump from step to step.
    """
    params = dict(model.named_parameters())
    unknown = [name for name in parameters if name not in params]
    if unknown:
        raise KeyError(f"the model has no parameters {unknown}; it has {sorted(params)}")
    gen = torch.Generator().manual_seed(seed)
    entries = {
        name: int(torch.randint(params[name].numel(), (1,), generator=gen)) for name in parameters
    }
    iterates, target = _first_image_attack(model, images, labels, norm, steps=steps,
                                           include=include, seed=seed, device=device)  # fmt: skip
    values = analysis.entry_trace(model, iterates, labels[:1].cpu(), entries)
    return {name: (values[name], float(target[name].reshape(-1)[i])) for name, i in entries.items()}


def utility(
    model: nn.Module,
    logical: str,
    *,
    scale: str = "ci",
    seed: int = 0,
    device: str = "cpu",
    defense: GradientDefense | None = None,
) -> float:
    """Final test accuracy of FedAvg training of ``model`` on ``logical`` at ``scale``."""
    return fedavg_accuracy(_context(scale, seed, device), model, logical, defense=defense)
