"""Variational bottlenecks, the model defenses PRECODE and the Convolutional Variational Bottleneck.

A variational bottleneck (VB) encodes the features ``z`` it receives into a
Gaussian ``q(b | z) = N(μ(z), σ(z)²)``, draws ``b = μ + σ·ε`` with fresh noise
``ε ~ N(0, I)`` on every forward pass (the reparameterisation trick), and
decodes ``b`` back to the shape of ``z``; the training loss gains
``β·KL(q(b | z) ‖ N(0, I))``. Because ``ε`` changes on every pass, the gradients
of the decoder and of every layer after it are stochastic — which is what stops
an optimisation attack, and why ignoring those layers breaks PRECODE (CVB
paper §III).

* :class:`PRECODE` (Scheliga et al. 2022): fully connected. The features are
  flattened, a ``Linear`` encoder gives ``2K`` statistics (mean, and a standard
  deviation through softplus), a ``Linear`` decoder maps the ``K`` samples
  back. Parameters grow with the feature size.
* :class:`CVB` (Scheliga et al., CVB paper §IV): two bias-free ``k×k`` same-padded
  convolutions give the mean and standard-deviation maps with ``K`` channels,
  a ``1×1`` convolution decodes back to ``C`` channels. Parameters
  ``2·k²·C·K + K·C`` do not depend on the feature map's height and width.

These are the layers; :mod:`leakagelib.defenses.surgery` inserts them into a
zoo model. :func:`kl_loss` is the term the training loss adds; the client's
update is that loss's gradient (:func:`leakagelib.losses.client_loss`,
used by training, the shared update and the attacks' simulated one alike).
Unlike the gradient defenses of this package, a model defense changes the
network, not the update: the client's update of a model with a bottleneck is
shared as it is (``NoDefense``). Used by the chapters "Breaking heuristic
defenses", "Variational bottlenecks" and "CVB against attacks and
architectures".
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = [
    "CVB",
    "PRECODE",
    "TokenGrid",
    "VariationalBottleneck",
    "adaptive_size",
    "bottlenecks",
    "kl_loss",
    "kl_loss_rows",
]


def adaptive_size(channels: int) -> int:
    """The bottleneck size ``K`` the CVB authors call "adaptive": half the channels, or 8 below 8.

    Value from the authors' code (dAI-SY-Group/ConvolutionalVariationalBottleneck,
    src/models/modules.py, ``K == 'adaptive'``): ``C // 2`` when ``C >= 8``, else 8.
    It also reproduces the added-parameter counts of the CVB paper's Table II for
    bias-free PRECODE at positions 1–3 of its CNN (K = 8, 16, 32).
    """
    if channels < 1:
        raise ValueError(f"channels must be positive, got {channels}")
    return channels // 2 if channels >= 8 else 8


class VariationalBottleneck(nn.Module):
    """Base of the bottlenecks: remembers the last KL terms and counts its parameters.

    Subclasses set ``self.last_kl_rows`` (the un-weighted KL divergence of
    each row of the last forward pass, a vector) and implement ``forward``.
    ``last_kl`` is their mean over the batch and ``kl_rows()`` is
    ``β·last_kl_rows``, from which :func:`kl_loss` and :func:`kl_loss_rows`
    take the term the training loss adds.
    Every row of a batch is encoded, sampled with its own noise and decoded
    on its own, and its KL term is its own (:attr:`rows_independent`), so the
    attacks' hooked engine (:mod:`leakagelib.attacks.per_attack`) can batch
    attacks through it, each attack's loss taking the KL terms of its own rows.
    """

    beta: float
    last_kl_rows: Tensor | None
    #: Each output row and each row's KL term depend on that row's input and noise only.
    rows_independent = True

    def __init__(self, beta: float) -> None:
        super().__init__()
        if not beta >= 0:
            raise ValueError(f"beta must be non-negative, got {beta}")
        self.beta = float(beta)
        self.last_kl_rows = None

    @property
    def last_kl(self) -> Tensor | None:
        """The un-weighted KL term of the last forward pass: its rows' mean (``None`` before one)."""
        return None if self.last_kl_rows is None else self.last_kl_rows.mean()

    @property
    def added_parameters(self) -> int:
        """The number of trainable parameters this module adds to the model."""
        return sum(p.numel() for p in self.parameters() if p.requires_grad)

    def kl_rows(self) -> Tensor:
        """``β · KL`` of each row of the last forward pass; raises if there was none."""
        if self.last_kl_rows is None:
            raise RuntimeError(f"{type(self).__name__} has not run a forward pass yet")
        return self.beta * self.last_kl_rows

    def decoder_parameter_names(self) -> list[str]:
        """Names (relative to this module) of the decoder's parameters — the first stochastic ones."""
        return [f"decoder.{n}" for n, _ in self.decoder.named_parameters()]


class PRECODE(VariationalBottleneck):
    """PRECODE's fully connected variational bottleneck of size ``K``.

    ``in_shape`` is the shape of the features it receives (without the batch
    dimension), any rank: they are flattened to ``D = prod(in_shape)``. The
    encoder is ``Linear(D, 2K)``; the first ``K`` outputs are the mean, the last
    ``K`` pass through softplus to give the standard deviation; the decoder is
    ``Linear(K, D)`` and the output is reshaped to ``in_shape``. Defaults
    ``K = 256`` and ``β = 1e-3`` are PRECODE's (CVB paper §II-C3). ``K`` may be
    ``"adaptive"`` (:func:`adaptive_size` of the channel count ``in_shape[0]``),
    which with ``bias=False`` is the configuration whose parameter counts the
    CVB paper's Table II reports.

    The KL divergence to N(0, I) is the exact Gaussian one, summed over the
    ``K`` dimensions, averaged over the batch and expressed in bits (divided by
    ln 2), as in the PRECODE family's reference bottleneck (a public copy,
    ``VariationalBottleneck.loss``: "KLD to standard normal distribution").
    """

    def __init__(
        self,
        in_shape: Sequence[int],
        K: int | str = 256,
        *,
        beta: float = 1e-3,
        bias: bool = True,
    ) -> None:
        super().__init__(beta)
        self.in_shape = _shape(in_shape, "in_shape")
        self.K = _size(K, self.in_shape[0])
        features = math.prod(self.in_shape)
        self.encoder = nn.Linear(features, 2 * self.K, bias=bias)
        self.decoder = nn.Linear(self.K, features, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        if tuple(x.shape[1:]) != self.in_shape:
            raise ValueError(
                f"PRECODE was built for features of shape {self.in_shape}, got {tuple(x.shape[1:])}"
            )
        stats = self.encoder(x.flatten(1))
        mu, raw = stats[:, : self.K], stats[:, self.K :]
        std = F.softplus(raw)
        sample = mu + std * torch.randn_like(std)
        kl = 0.5 * (mu.pow(2) + std.pow(2) - 1.0 - 2.0 * std.clamp_min(1e-12).log())
        self.last_kl_rows = kl.sum(dim=1) / math.log(2.0)
        return self.decoder(sample).reshape(x.shape)

    def extra_repr(self) -> str:
        return f"in_shape={self.in_shape}, K={self.K}, beta={self.beta}"


class CVB(VariationalBottleneck):
    """The Convolutional Variational Bottleneck (CVB paper §IV, Fig. 8).

    Input: feature maps ``B×C×H×W`` (``in_channels = C``). The mean map
    ``μ = conv_μ(z)`` and the standard-deviation map
    ``σ = softplus(clip(conv_σ(z), −5, 5))`` come from two bias-free ``k×k``
    convolutions with ``K`` output channels and "same" zero padding; the sample
    ``b = μ + σ·ε`` goes through a bias-free ``1×1`` decoder convolution back to
    ``C`` channels, so the output has the input's shape and the module fits at
    any position.

    ``K`` defaults to :func:`adaptive_size` of ``C``; ``scale = s`` sets
    ``K = round(s·C)`` instead (the paper's bottleneck scale, Fig. 9c).
    Defaults ``kernel_size = 5`` and ``β = 0.1`` are the CVB paper's choice for its
    CNN (§VI-A; values from the authors' code, configs/models/CNNCVB.yaml; the
    ViT uses k = 3, β = 0.1 and the ResNet-18 k = 5, β = 5e-5, same folder). The
    clip to [−5, 5] before softplus is also the authors' (src/models/modules.py).

    ``kl`` chooses the regulariser. ``"gaussian"`` (default) is the exact
    ``KL(N(μ, σ²) ‖ N(0, 1))`` the paper names (Eq. 3). ``"reference"`` is the
    term the authors' code evaluates, ``−½ Σ (1 + σ − μ² − e^σ)``, i.e. the
    closed form with the softplus output in the place of the log-variance
    (non-negative too, but minimal at σ → 0 rather than σ = 1); use it to match
    their training runs and their shared updates, which are the training loss's
    gradients (the CVB chapters' experiments do:
    :data:`leakagelib.experiments.cvb_common.CVB_DEFAULT`). Both are summed over
    channels and averaged over positions and batch, as in the authors' code.
    """

    def __init__(
        self,
        in_channels: int,
        K: int | str | None = None,
        *,
        scale: float | None = None,
        kernel_size: int = 5,
        beta: float = 0.1,
        bias: bool = False,
        kl: str = "gaussian",
    ) -> None:
        super().__init__(beta)
        if isinstance(in_channels, (tuple, list, torch.Size)):
            in_channels = int(in_channels[0])
        if int(in_channels) < 1:
            raise ValueError(f"in_channels must be positive, got {in_channels}")
        if kernel_size < 1 or kernel_size % 2 == 0:
            raise ValueError(f"kernel_size must be a positive odd integer, got {kernel_size}")
        if kl not in ("gaussian", "reference"):
            raise ValueError(f"kl must be 'gaussian' or 'reference', got {kl!r}")
        if K is not None and scale is not None:
            raise ValueError("give the bottleneck size K or its scale, not both")
        self.in_channels = int(in_channels)
        if scale is not None:
            if not scale > 0:
                raise ValueError(f"scale must be positive, got {scale}")
            self.K = max(1, round(scale * self.in_channels))
        else:
            self.K = _size("adaptive" if K is None else K, self.in_channels)
        self.kernel_size = int(kernel_size)
        self.kl = kl
        c, k = self.in_channels, self.kernel_size
        self.mu_encoder = nn.Conv2d(c, self.K, k, padding="same", bias=bias)
        self.std_encoder = nn.Conv2d(c, self.K, k, padding="same", bias=bias)
        self.decoder = nn.Conv2d(self.K, c, 1, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        if x.dim() != 4 or x.shape[1] != self.in_channels:
            raise ValueError(
                f"CVB expects B×{self.in_channels}×H×W feature maps, got shape {tuple(x.shape)}"
            )
        mu = self.mu_encoder(x)
        std = F.softplus(self.std_encoder(x).clamp(-5.0, 5.0))
        sample = mu + std * torch.randn_like(std)
        if self.kl == "gaussian":
            kl = 0.5 * (mu.pow(2) + std.pow(2) - 1.0 - 2.0 * std.clamp_min(1e-12).log())
        else:
            kl = -0.5 * (1.0 + std - mu.pow(2) - std.exp())
        self.last_kl_rows = kl.sum(dim=1).flatten(1).mean(1)
        return self.decoder(sample)

    def extra_repr(self) -> str:
        return (
            f"in_channels={self.in_channels}, K={self.K}, kernel_size={self.kernel_size}, "
            f"beta={self.beta}, kl={self.kl!r}"
        )


class TokenGrid(nn.Module):
    """Run a convolutional bottleneck on transformer tokens by viewing them as a grid.

    Tokens ``B×N×D`` with ``D = h²`` are reshaped to ``B×N×h×h`` — the token
    (patch) dimension becomes the channels — passed through ``bottleneck`` and
    reshaped back, as the CVB paper does for its ViT (§VI-D; hidden size 256 =
    16²).
    """

    #: Each token grid is reshaped and passed through the bottleneck on its own.
    rows_independent = True

    def __init__(self, bottleneck: nn.Module, hidden_size: int) -> None:
        super().__init__()
        side = math.isqrt(hidden_size)
        if side * side != hidden_size:
            raise ValueError(
                f"a token grid needs a square hidden size, got {hidden_size} (CVB paper §VI-D)"
            )
        self.side = side
        self.bottleneck = bottleneck

    def forward(self, x: Tensor) -> Tensor:
        if x.dim() != 3 or x.shape[2] != self.side**2:
            raise ValueError(f"TokenGrid expects B×N×{self.side**2} tokens, got {tuple(x.shape)}")
        b, n, d = x.shape
        return self.bottleneck(x.reshape(b, n, self.side, self.side)).reshape(b, n, d)


def _shape(shape: Sequence[int], what: str) -> tuple[int, ...]:
    out = tuple(int(s) for s in shape)
    if not out or any(s < 1 for s in out):
        raise ValueError(f"{what} must be a non-empty shape of positive sizes, got {shape!r}")
    return out


def _size(K: int | str, channels: int) -> int:
    if K == "adaptive":
        return adaptive_size(channels)
    if isinstance(K, bool) or not isinstance(K, int) or K < 1:
        raise ValueError(
            f"the bottleneck size K must be a positive integer or 'adaptive', got {K!r}"
        )
    return K


def bottlenecks(model: nn.Module) -> list[tuple[str, VariationalBottleneck]]:
    """The model's variational bottlenecks with their qualified names, in registration order."""
    return [(n, m) for n, m in model.named_modules() if isinstance(m, VariationalBottleneck)]


def kl_loss(model: nn.Module) -> Tensor:
    """The sum of ``β · KL`` over the model's bottlenecks after a forward pass (0 without any).

    The training loss adds it to the cross-entropy (CVB paper Eq. 3), and the
    client's update is that loss's gradient
    (:func:`leakagelib.losses.client_loss`).
    """
    rows = kl_loss_rows(model)
    if rows is None:
        p = next(model.parameters(), None)
        return torch.zeros((), device=p.device if p is not None else None)
    return rows.mean()


def kl_loss_rows(model: nn.Module) -> Tensor | None:
    """Each row's ``β · KL``, summed over the model's bottlenecks after a forward pass.

    ``None`` for a model without bottlenecks. Its mean over the rows is
    :func:`kl_loss` (every bottleneck sees every row); the attacks' hooked engine
    (:mod:`leakagelib.attacks.per_attack`) gives each attack the mean over its
    own rows, as each client's training loss holds its own batch's KL term.
    """
    terms = [m.kl_rows() for _, m in bottlenecks(model)]
    return torch.stack(terms).sum(0) if terms else None
