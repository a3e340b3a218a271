"""Figures the chapters share: image grids and original-versus-reconstruction panels.

Kept here so that chapter cells stay short and every chapter draws images the
same way (channels last, grey maps for one channel, values clipped to [0, 1]).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.figure import Figure

__all__ = ["image_array", "show_grid", "show_pictures", "show_rows"]


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


def show_pictures(
    rows: Sequence[Mapping[str, Any]], label: Callable[[Mapping[str, Any]], str], size: float = 1.2
) -> Figure:
    """The reconstructions a run's rows keep in their ``pictures`` (the CVB experiments'
    ``quality_row``): one figure row per victim, its original first, then one column per record
    row, titled ``label(row)``. Rows without pictures are left out; the others must have
    attacked the same victims, as every row of one CVB table on one dataset does. The chapters
    "Variational bottlenecks", "CVB against attacks and architectures" and "CVB against DP-SGD
    and gradient compression" draw Tables I–V with it."""
    kept = [row for row in rows if row.get("pictures")]
    if not kept:
        raise ValueError("no row keeps 'pictures' (the first victims and their reconstructions)")
    original = torch.tensor(kept[0]["pictures"]["original"])
    columns = {"client": original}
    for row in kept:
        if not torch.equal(torch.tensor(row["pictures"]["original"]), original):
            raise ValueError(f"the rows attacked different victims: {label(row)!r} and the first")
        name = label(row)
        if name in columns:
            raise ValueError(f"two rows are labelled {name!r}: a column each needs its own label")
        columns[name] = torch.tensor(row["pictures"]["reconstruction"])
    per_image = {
        f"image {i + 1}": torch.stack([images[i] for images in columns.values()])
        for i in range(len(original))
    }
    return show_rows(per_image, titles={"image 1": list(columns)}, size=size)
