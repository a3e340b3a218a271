"""Gradient analysis during an attack: per-layer cosine similarity to the client's gradient.

The CVB paper (§III-A, Figs. 5–6) explains why PRECODE stops an optimisation
attack by following, at every attack iteration, how the dummy image's
gradient compares with the client's, layer by layer: without a bottleneck all
layers' cosine similarities climb towards 1; with one, the decoder's and the
later layers' similarities jump around at a low level because every forward
pass draws new noise, and the optimiser finds no consistent direction.

:func:`similarity_trace` takes the sequence of dummy images an attack visited
(its iterates) and returns, for every layer, the cosine similarity at each
iteration; :func:`entry_trace` follows single gradient entries (Fig. 5).
A layer is a module: its weight and bias count together. The dummy gradients
are recomputed with fresh bottleneck noise per iterate, as the attack saw
them. Used by the chapter "Variational bottlenecks".
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from .gradients import Update, client_update

__all__ = ["entry_trace", "layer_cosine", "layer_names", "similarity_trace"]


def layer_names(update: Update) -> list[str]:
    """The layers (module prefixes) of an update, in order: ``conv1.weight`` → ``conv1``."""
    out: list[str] = []
    for name in update:
        prefix = name.rsplit(".", 1)[0] if "." in name else name
        if prefix not in out:
            out.append(prefix)
    return out


def layer_cosine(a: Update, b: Update, *, eps: float = 1e-12) -> dict[str, float]:
    """Cosine similarity of two updates per layer (weight and bias concatenated)."""
    if list(a) != list(b):
        raise ValueError("the two updates name different parameters")
    groups: dict[str, list[str]] = {}
    for name in a:
        groups.setdefault(name.rsplit(".", 1)[0] if "." in name else name, []).append(name)
    out = {}
    for layer, names in groups.items():
        va = torch.cat([a[n].reshape(-1) for n in names]).double()
        vb = torch.cat([b[n].reshape(-1) for n in names]).double()
        out[layer] = float(va @ vb / (va.norm() * vb.norm() + eps))
    return out


def _as_steps(iterates: Tensor | Sequence[Tensor]) -> list[Tensor]:
    steps = list(iterates) if not isinstance(iterates, Tensor) else list(iterates.unbind(0))
    if not steps:
        raise ValueError("no iterates to analyse")
    return [x if x.dim() == 4 else x.unsqueeze(0) for x in steps]


def similarity_trace(
    model: nn.Module,
    target: Update,
    iterates: Tensor | Sequence[Tensor],
    labels: Tensor,
    *,
    loss: str = "ce",
) -> dict[str, Tensor]:
    """Per-layer cosine similarity between the dummy gradient at each iterate and ``target``.

    ``iterates`` is a T×N×C×H×W tensor (or a list of N×C×H×W / C×H×W images)
    of the dummy data after each attack iteration, ``labels`` the labels the
    attack used. Returns ``{layer: tensor of T similarities}``.
    """
    rows = []
    for x in _as_steps(iterates):
        dummy = client_update(model, x.detach(), labels, loss=loss)
        rows.append(layer_cosine(dummy, target))
    return {layer: torch.tensor([r[layer] for r in rows]) for layer in rows[0]}


def entry_trace(
    model: nn.Module,
    iterates: Tensor | Sequence[Tensor],
    labels: Tensor,
    entries: dict[str, int],
    *,
    loss: str = "ce",
) -> dict[str, Tensor]:
    """The values of chosen gradient entries (``{parameter name: flat index}``) at each iterate.

    Fig. 5 of the CVB paper plots two such entries of different layers
    against each other over the iterations.
    """
    values: dict[str, list[float]] = {n: [] for n in entries}
    for x in _as_steps(iterates):
        dummy = client_update(model, x.detach(), labels, loss=loss)
        for name, index in entries.items():
            if name not in dummy:
                raise KeyError(f"the model has no trainable parameter {name!r}")
            values[name].append(float(dummy[name].reshape(-1)[index]))
    return {n: torch.tensor(v) for n, v in values.items()}
