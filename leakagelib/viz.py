"""Figures the chapters share: image grids and original-versus-reconstruction panels.

Kept here so that chapter cells stay short and every chapter draws images the
same way (channels last, grey maps for one channel, values clipped to [0, 1]).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.figure import Figure

__all__ = ["image_array", "show_grid", "show_rows"]


def image_array(image: torch.Tensor) -> np.ndarray:
    """A C×H×W tensor in [0, 1] as an H×W (grey) or H×W×3 array for ``imshow``."""
    if image.dim() != 3:
        raise ValueError(f"an image is C×H×W, got shape {tuple(image.shape)}")
    array = image.detach().to("cpu", torch.float64).clamp(0, 1).numpy()
    return array[0] if array.shape[0] == 1 else np.transpose(array, (1, 2, 0))


def _draw(ax: plt.Axes, image: torch.Tensor, title: str | None) -> None:
    ax.imshow(image_array(image), cmap="gray", vmin=0, vmax=1, interpolation="nearest")
    ax.set_xticks([])
    ax.set_yticks([])
    if title:
        ax.set_title(title, fontsize=8)


def show_grid(
    images: torch.Tensor, titles: Sequence[str] | None = None, ncols: int = 8, size: float = 1.4
) -> Figure:
    """Draw N×C×H×W ``images`` in a grid with optional per-image titles."""
    n = images.shape[0]
    ncols = max(1, min(ncols, n))
    nrows = -(-n // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(size * ncols, size * nrows), squeeze=False)
    for i, ax in enumerate(axes.flat):
        if i < n:
            _draw(ax, images[i], titles[i] if titles else None)
        else:
            ax.axis("off")
    fig.tight_layout()
    return fig


def show_rows(
    rows: Mapping[str, torch.Tensor | Sequence[torch.Tensor]],
    titles: Mapping[str, Sequence[str]] | None = None,
    size: float = 1.4,
) -> Figure:
    """One row per entry of ``rows`` (label → N×C×H×W, or a list of C×H×W images, which may
    differ in size and channels: MNIST digits beside CIFAR patches), e.g. originals above
    reconstructions."""
    if not rows:
        raise ValueError("show_rows needs at least one row of images")
    n = max(len(t) for t in rows.values())
    fig, axes = plt.subplots(
        len(rows), n, figsize=(size * n, size * len(rows) + 0.2), squeeze=False
    )
    for r, (label, images) in enumerate(rows.items()):
        for c in range(n):
            ax = axes[r, c]
            if c < len(images):
                _draw(ax, images[c], (titles or {}).get(label, [None] * n)[c])
            else:
                ax.axis("off")
        axes[r, 0].set_ylabel(label, fontsize=9)
    fig.tight_layout()
    return fig
