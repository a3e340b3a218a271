"""The small Vision Transformer of the CVB paper (§VI-D, Table V).

The paper gives patch size 4, four transformer blocks, hidden size 256 (a
square, so that CVB can reshape each token to 16×16), 16 attention heads and
GELU. The rest comes from the authors' code (dAI-SY-Group/
ConvolutionalVariationalBottleneck, ``src/models/ViT.py`` with
``configs/models/ViT.yaml``):

* patch embedding: a linear map of each flattened 4×4 patch, a learned class
  token prepended, a learned position embedding added (both drawn from
  N(0, 1));
* pre-norm blocks: LayerNorm (eps 1e-6) → multi-head self-attention (query,
  key and value maps always bias-free; output map with ``bias``) → residual;
  LayerNorm → MLP → residual. The MLP is Linear(256 → 256) → GELU →
  Linear(256 → 256) → GELU (width 256; the code applies the activation after
  *both* linear maps, and so do we);
* head: final LayerNorm, then a linear classifier on the class token;
* every dropout rate in the config is 0, so there is no dropout;
* ``bias: False`` for the embedding, attention output, MLP and classifier —
  the default here. LayerNorm keeps its affine shift, as in the code.

Used by the chapter on CVB, which inserts the bottleneck after ``block1``.
"""

from __future__ import annotations

import math
from collections import OrderedDict

import torch
from torch import Tensor, nn

from .init import initialise
from .registry import register
from .staging import staged

__all__ = ["Attention", "PatchEmbedding", "TransformerBlock", "ViTHead", "build_vit_small"]

_LN_EPS = 1e-6  # the authors' LayerNorm eps


class PatchEmbedding(nn.Module):
    """Image (N, C, H, W) → tokens (N, 1 + H·W/p², hidden): patches, class token, positions.

    Patches are flattened in (row-in-patch, column-in-patch, channel) order, as
    the authors' ``Rearrange('b c (h p1) (w p2) -> b (h w) (p1 p2 c)')``.
    """

    def __init__(self, in_shape: tuple[int, int, int], patch: int, hidden: int, bias: bool) -> None:
        super().__init__()
        c, h, w = in_shape
        self.patch = patch
        self.num_patches = (h // patch) * (w // patch)
        self.linear = nn.Linear(c * patch * patch, hidden, bias=bias)
        self.cls_token = nn.Parameter(torch.randn(1, 1, hidden))
        self.position = nn.Parameter(torch.randn(1, self.num_patches + 1, hidden))

    def forward(self, x: Tensor) -> Tensor:
        n, c, h, w = x.shape
        p = self.patch
        patches = x.reshape(n, c, h // p, p, w // p, p).permute(0, 2, 4, 3, 5, 1)
        tokens = self.linear(patches.reshape(n, (h // p) * (w // p), p * p * c))
        cls = self.cls_token.expand(n, -1, -1)
        return torch.cat([cls, tokens], dim=1) + self.position


class Attention(nn.Module):
    """Multi-head self-attention with bias-free query/key/value maps (authors' code)."""

    def __init__(self, hidden: int, heads: int, bias: bool) -> None:
        super().__init__()
        self.heads = heads
        self.head_dim = hidden // heads
        self.query = nn.Linear(hidden, hidden, bias=False)
        self.key = nn.Linear(hidden, hidden, bias=False)
        self.value = nn.Linear(hidden, hidden, bias=False)
        self.out = nn.Linear(hidden, hidden, bias=bias)

    def _split(self, x: Tensor) -> Tensor:
        n, t, _ = x.shape
        return x.reshape(n, t, self.heads, self.head_dim).transpose(1, 2)

    def forward(self, x: Tensor) -> Tensor:
        q, k, v = self._split(self.query(x)), self._split(self.key(x)), self._split(self.value(x))
        scores = q @ k.transpose(-1, -2) / math.sqrt(self.head_dim)
        context = scores.softmax(dim=-1) @ v
        n, _, t, _ = context.shape
        return self.out(context.transpose(1, 2).reshape(n, t, self.heads * self.head_dim))


class TransformerBlock(nn.Module):
    """Pre-norm transformer block: x + Attn(LN(x)), then x + MLP(LN(x))."""

    def __init__(self, hidden: int, heads: int, mlp_width: int, bias: bool) -> None:
        super().__init__()
        self.attention_norm = nn.LayerNorm(hidden, eps=_LN_EPS)
        self.attention = Attention(hidden, heads, bias)
        self.mlp_norm = nn.LayerNorm(hidden, eps=_LN_EPS)
        self.mlp = nn.Sequential(
            OrderedDict(
                fc1=nn.Linear(hidden, mlp_width, bias=bias),
                act1=nn.GELU(),
                fc2=nn.Linear(mlp_width, hidden, bias=bias),
                act2=nn.GELU(),
            )
        )

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attention(self.attention_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class ViTHead(nn.Module):
    """Final LayerNorm, then a linear classifier on the class token (token 0)."""

    def __init__(self, hidden: int, num_classes: int, bias: bool) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(hidden, eps=_LN_EPS)
        self.classifier = nn.Linear(hidden, num_classes, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(self.norm(x)[:, 0])


@register("vit-small")
def build_vit_small(
    in_shape: tuple[int, int, int],
    num_classes: int,
    *,
    bias: bool = False,
    patch: int = 4,
    depth: int = 4,
    hidden: int = 256,
    heads: int = 16,
    mlp_width: int = 256,
    init: str = "torch",
) -> nn.Sequential:
    """CVB paper's ViT: patch 4, 4 blocks, hidden 256, 16 heads, MLP width 256, GELU.

    Options (defaults are the authors' config): ``bias`` (default False —
    ``bias: False`` in ``configs/models/ViT.yaml``; query/key/value maps are
    bias-free either way and LayerNorm shifts stay), ``patch``, ``depth``,
    ``hidden`` (divisible by ``heads``; a square if CVB is to reshape tokens),
    ``heads``, ``mlp_width``, ``init`` ("torch", the authors' PyTorch defaults;
    "lecun" re-draws the linear maps). 65 tokens on 32×32 inputs.

    Stages: ``input``, ``embed``, ``block1`` … ``block<depth>``, ``head``.
    Between blocks the features are tokens (N, 1 + patches, hidden).
    """
    c, h, w = in_shape
    if patch < 1 or h % patch or w % patch:
        raise ValueError(f"image size {h}×{w} must be divisible by the patch size {patch}")
    if hidden % heads:
        raise ValueError(f"hidden size {hidden} must be divisible by the number of heads {heads}")
    if depth < 1 or mlp_width < 1:
        raise ValueError(f"depth and mlp_width must be positive, got {depth} and {mlp_width}")
    model = staged(
        in_shape,
        "vit-small",
        [
            ("embed", PatchEmbedding(in_shape, patch, hidden, bias)),
            *[
                (f"block{i}", TransformerBlock(hidden, heads, mlp_width, bias))
                for i in range(1, depth + 1)
            ],
            ("head", ViTHead(hidden, num_classes, bias)),
        ],
    )
    return initialise(model, init)
