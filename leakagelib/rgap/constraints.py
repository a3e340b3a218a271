"""Per-layer linear constraints on a layer's input, as sparse float64 matrices.

R-GAP (Zhu & Blaschko 2021, §3.1) reads a layer ``z = W x`` (a convolution is
multiplication by a sparse block-Toeplitz matrix) in two ways:

* **weight constraints** ``W x = z`` — one row per output entry, known once
  the layer's output has been recovered (equation 16);
* **gradient constraints** ``K x = vec(∂ℓ/∂W)`` — one row per weight, because
  ``∂ℓ/∂W[o, c, u, v] = Σ_{i,j} k[o, i, j] · x_pad[c, s·i + u, s·j + v]`` with
  ``k = ∂ℓ/∂z`` (equation 15);
* **padding constraints** ``P x_pad = 0`` — the zero border of a padded input
  (§3.1.2: padding adds as many unknowns as constraints).

The matrices are built from the layer's geometry alone (index arithmetic, never
by differentiating a dense Jacobian). Their sparsity pattern depends only on the
geometry and is cached; a new weight or ``k`` only refills the values. By
default the padded border is eliminated — the columns of border entries are
dropped, which is the same as solving with ``P`` as hard constraints — and
``padded=True`` keeps them for the paper's literal formulation.

One builder serves R-GAP (:mod:`leakagelib.rgap.recursive`), the rank analysis
(:mod:`leakagelib.rgap.rank`) and the condition-number tables. Chapter
"Closed-form attacks" draws these matrices.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import scipy.sparse as sp
from torch import nn

__all__ = [
    "ConvGeometry",
    "LayerConstraints",
    "gradient_block",
    "gradient_matrix",
    "gradient_rhs",
    "layer_constraints",
    "padding_matrix",
    "weight_matrix",
]


@dataclass(frozen=True)
class ConvGeometry:
    """The shape of a 2-D convolution (a linear layer is a 1×1 one on a 1×1 image).

    ``in_channels × height × width`` is the unpadded input; ``kernel``, ``stride``
    and ``padding`` are (rows, columns) pairs. Dilation 1, one group, zero padding.
    """

    in_channels: int
    out_channels: int
    height: int
    width: int
    kernel: tuple[int, int] = (1, 1)
    stride: tuple[int, int] = (1, 1)
    padding: tuple[int, int] = (0, 0)

    def __post_init__(self) -> None:
        if min(self.in_channels, self.out_channels, self.height, self.width) < 1:
            raise ValueError(f"a convolution needs positive sizes, got {self}")
        if min(*self.kernel, *self.stride) < 1 or min(self.padding) < 0:
            raise ValueError(f"bad kernel/stride/padding in {self}")
        if min(self.out_size) < 1:
            raise ValueError(f"the kernel does not fit the padded input: {self}")

    @classmethod
    def of(cls, module: nn.Module, in_shape: tuple[int, ...]) -> ConvGeometry:
        """The geometry of ``module`` (``nn.Conv2d`` or ``nn.Linear``) on input ``in_shape``.

        ``in_shape`` is (C, H, W) for a convolution and (D,) for a linear layer.
        """
        if isinstance(module, nn.Linear):
            return cls(module.in_features, module.out_features, 1, 1)
        if isinstance(module, nn.Conv2d):
            if module.groups != 1 or tuple(module.dilation) != (1, 1):
                raise ValueError("only convolutions with one group and dilation 1 are supported")
            if module.padding_mode != "zeros" or isinstance(module.padding, str):
                raise ValueError("only explicit zero padding is supported (not 'same'/'valid')")
            if len(in_shape) != 3 or in_shape[0] != module.in_channels:
                raise ValueError(f"input shape {in_shape} does not fit {module}")
            return cls(
                module.in_channels,
                module.out_channels,
                int(in_shape[1]),
                int(in_shape[2]),
                tuple(module.kernel_size),
                tuple(module.stride),
                tuple(module.padding),
            )
        raise TypeError(
            f"constraints are defined for nn.Conv2d and nn.Linear, not {type(module).__name__}"
        )

    @property
    def padded_size(self) -> tuple[int, int]:
        """(H + 2p, W + 2p)."""
        return self.height + 2 * self.padding[0], self.width + 2 * self.padding[1]

    @property
    def out_size(self) -> tuple[int, int]:
        """(H_out, W_out)."""
        hp, wp = self.padded_size
        return (
            (hp - self.kernel[0]) // self.stride[0] + 1,
            (wp - self.kernel[1]) // self.stride[1] + 1,
        )

    @property
    def n_in(self) -> int:
        """``|x|``: entries of the unpadded input."""
        return self.in_channels * self.height * self.width

    @property
    def n_padded(self) -> int:
        """Entries of the padded input."""
        hp, wp = self.padded_size
        return self.in_channels * hp * wp

    @property
    def n_out(self) -> int:
        """``|z|``: entries of the output (the number of weight constraints)."""
        ho, wo = self.out_size
        return self.out_channels * ho * wo

    @property
    def n_weights(self) -> int:
        """``|W|``: number of weights (the number of gradient constraints)."""
        return self.out_channels * self.in_channels * self.kernel[0] * self.kernel[1]

    def interior(self) -> np.ndarray:
        """Indices of the unpadded entries within the flattened padded input."""
        hp, wp = self.padded_size
        ph, pw = self.padding
        c, r, q = np.meshgrid(
            np.arange(self.in_channels),
            np.arange(ph, ph + self.height),
            np.arange(pw, pw + self.width),
            indexing="ij",
        )
        return (c * hp * wp + r * wp + q).ravel()


@dataclass(frozen=True)
class _Pattern:
    """CSR structure of W and K for one geometry, plus where each value comes from."""

    n_cols: int
    w_indptr: np.ndarray
    w_indices: np.ndarray
    w_take: np.ndarray  # flat index into weight[o, c, u, v] for every stored entry of W
    k_indptr: np.ndarray
    k_indices: np.ndarray
    k_take: np.ndarray  # flat index into k[o, i, j] for every stored entry of K


def _csr_from_grid(rows: np.ndarray, cols: np.ndarray, keep: np.ndarray, n_rows: int):
    """indptr/indices of a CSR matrix whose entries, in row order, are ``cols[keep]``."""
    counts = np.bincount(rows[keep], minlength=n_rows)
    indptr = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
    return indptr, cols[keep].astype(np.int32)


@lru_cache(maxsize=64)
def _pattern(geom: ConvGeometry, padded: bool) -> _Pattern:
    """Build (once per geometry) the sparsity of W and K by index arithmetic."""
    co, ci = geom.out_channels, geom.in_channels
    (kh, kw), (sh, sw), (ph, pw) = geom.kernel, geom.stride, geom.padding
    (ho, wo), (hp, wp) = geom.out_size, geom.padded_size
    o = np.arange(co).reshape(co, 1, 1, 1, 1, 1)
    i = np.arange(ho).reshape(1, ho, 1, 1, 1, 1)
    j = np.arange(wo).reshape(1, 1, wo, 1, 1, 1)
    c = np.arange(ci).reshape(1, 1, 1, ci, 1, 1)
    u = np.arange(kh).reshape(1, 1, 1, 1, kh, 1)
    v = np.arange(kw).reshape(1, 1, 1, 1, 1, kw)
    shape = (co, ho, wo, ci, kh, kw)
    row_pix = np.broadcast_to(i * sh + u, shape)
    col_pix = np.broadcast_to(j * sw + v, shape)
    if padded:
        col = c * hp * wp + row_pix * wp + col_pix
        keep = np.ones(shape, dtype=bool)
        n_cols = geom.n_padded
    else:
        r, q = row_pix - ph, col_pix - pw
        keep = (r >= 0) & (r < geom.height) & (q >= 0) & (q < geom.width)
        col = c * geom.height * geom.width + r * geom.width + q
        n_cols = geom.n_in
    col = np.broadcast_to(col, shape)
    keep = np.broadcast_to(keep, shape)
    w_flat = np.broadcast_to(((o * ci + c) * kh + u) * kw + v, shape)
    k_flat = np.broadcast_to((o * ho + i) * wo + j, shape)
    # W: rows (o, i, j), entries already in row order in this (o, i, j, c, u, v) grid.
    w_rows = np.broadcast_to(k_flat, shape).ravel()
    w_keep = keep.ravel()
    w_indptr, w_indices = _csr_from_grid(w_rows, col.ravel(), w_keep, geom.n_out)
    w_take = w_flat.ravel()[w_keep]
    # K: rows (o, c, u, v); reorder the grid to (o, c, u, v, i, j) so rows come in order.
    perm = (0, 3, 4, 5, 1, 2)
    k_keep = keep.transpose(perm).ravel()
    k_rows = w_flat.transpose(perm).ravel()
    k_indptr, k_indices = _csr_from_grid(
        k_rows, col.transpose(perm).ravel(), k_keep, geom.n_weights
    )
    k_take = k_flat.transpose(perm).ravel()[k_keep]
    return _Pattern(n_cols, w_indptr, w_indices, w_take, k_indptr, k_indices, k_take)


def weight_matrix(geom: ConvGeometry, weight: np.ndarray, *, padded: bool = False) -> sp.csr_matrix:
    """The weight-constraint matrix W (``|z|`` × ``|x|``, or × padded ``|x|``): ``W @ vec(x) = vec(z)``.

    ``weight`` is the layer's weight (C_out×C_in×k×k, or C_out×C_in for a linear layer).
    """
    weight = np.asarray(weight, dtype=np.float64)
    if weight.size != geom.n_weights:
        raise ValueError(
            f"weight has {weight.size} entries, the geometry {geom} needs {geom.n_weights}"
        )
    pat = _pattern(geom, padded)
    data = weight.ravel()[pat.w_take]
    return sp.csr_matrix((data, pat.w_indices, pat.w_indptr), shape=(geom.n_out, pat.n_cols))


def gradient_matrix(geom: ConvGeometry, k: np.ndarray, *, padded: bool = False) -> sp.csr_matrix:
    """The gradient-constraint matrix K (``|W|`` × ``|x|``): ``K @ vec(x) = vec(∂ℓ/∂W)``.

    ``k`` is ∂ℓ/∂z, the gradient of the loss at the layer's output (``|z|`` entries).
    """
    k = np.asarray(k, dtype=np.float64)
    if k.size != geom.n_out:
        raise ValueError(f"k has {k.size} entries, the layer has {geom.n_out} outputs")
    pat = _pattern(geom, padded)
    data = k.ravel()[pat.k_take]
    return sp.csr_matrix((data, pat.k_indices, pat.k_indptr), shape=(geom.n_weights, pat.n_cols))


def padding_matrix(geom: ConvGeometry) -> sp.csr_matrix:
    """The padding constraints P (border entries × padded ``|x|``): ``P @ vec(x_pad) = 0``."""
    border = np.setdiff1d(np.arange(geom.n_padded), geom.interior())
    n = border.size
    return sp.csr_matrix(
        (np.ones(n), border, np.arange(n + 1)), shape=(n, geom.n_padded), dtype=np.float64
    )


@dataclass
class LayerConstraints:
    """A layer's stacked system ``A x = b`` with A = [W; K] (and P when padded).

    ``weight_rows`` selects which output entries contribute a weight constraint
    (ReLU outputs that are zero do not: their pre-activation is unknown).
    """

    geometry: ConvGeometry
    weight: sp.csr_matrix
    gradient: sp.csr_matrix
    z: np.ndarray
    grad: np.ndarray
    padding: sp.csr_matrix | None = None

    @property
    def matrix(self) -> sp.csr_matrix:
        """A: the weight, gradient (and padding) constraints stacked."""
        blocks = [self.weight, self.gradient]
        if self.padding is not None:
            blocks.append(self.padding)
        return sp.vstack(blocks, format="csr")

    @property
    def rhs(self) -> np.ndarray:
        """b: the recovered pre-activations, the flattened gradient (and zeros)."""
        parts = [self.z, self.grad]
        if self.padding is not None:
            parts.append(np.zeros(self.padding.shape[0]))
        return np.concatenate(parts)


def layer_constraints(
    geom: ConvGeometry,
    weight: np.ndarray,
    k: np.ndarray,
    z: np.ndarray,
    grad: np.ndarray,
    *,
    weight_rows: np.ndarray | None = None,
    padded: bool = False,
) -> LayerConstraints:
    """Assemble the constraints of one layer from its weight, ``k = ∂ℓ/∂z``, the
    recovered pre-activation ``z`` (bias already subtracted) and its weight gradient.
    """
    z = np.asarray(z, dtype=np.float64).ravel()
    grad = np.asarray(grad, dtype=np.float64).ravel()
    if z.size != geom.n_out or grad.size != geom.n_weights:
        raise ValueError(
            f"z has {z.size} entries and the gradient {grad.size}; the layer needs "
            f"{geom.n_out} and {geom.n_weights}"
        )
    w_mat = weight_matrix(geom, weight, padded=padded)
    if weight_rows is not None:
        w_mat, z = w_mat[weight_rows], z[weight_rows]
    return LayerConstraints(
        geometry=geom,
        weight=w_mat,
        gradient=gradient_matrix(geom, k, padded=padded),
        z=z,
        grad=grad,
        padding=padding_matrix(geom) if padded else None,
    )


def gradient_block(geom: ConvGeometry, k: np.ndarray) -> sp.csr_matrix:
    """The per-channel gradient block B ((C_out·k·k) × (H·W)), with K = I_{C_in} ⊗ B.

    The gradient of weight (o, c, u, v) only involves input channel c, and the
    coefficients ``k[o, i, j]`` do not depend on c, so after reordering the rows
    K is block diagonal with C_in copies of B. B's rank bounds what the gradient
    constraints can say about each channel: at most C_out·k·k of its H·W pixels
    (the reason counting rows is not rank for strided convolutions).
    """
    single = ConvGeometry(
        1, geom.out_channels, geom.height, geom.width, geom.kernel, geom.stride, geom.padding
    )
    return gradient_matrix(single, k)


def gradient_rhs(geom: ConvGeometry, grad: np.ndarray) -> np.ndarray:
    """The weight gradient arranged as B's right-hand sides: ((C_out·k·k) × C_in)."""
    g = np.asarray(grad, dtype=np.float64).reshape(
        geom.out_channels, geom.in_channels, geom.kernel[0] * geom.kernel[1]
    )
    return g.transpose(0, 2, 1).reshape(-1, geom.in_channels)
