"""Algorithm 1's Monte-Carlo samples: uniform points in the δ-ball around each iterate.

The Bayes paper's attack (Balunović et al. 2022, Algorithm 1) averages the
objective over ``k`` points drawn uniformly from the ball ``B(x, δ)``
(:func:`sample_ball`); the attack loop (:mod:`.loop`) draws fresh offsets
every Adam step, the same for every setting (:class:`BallOffsets`). Used
first in the chapter "Existing attacks are approximations".
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .config import AttackConfig

__all__ = ["BallOffsets", "sample_ball"]


def sample_ball(
    shape: tuple[int, ...],
    d: int,
    delta: float,
    gen: torch.Generator | None = None,
    device: str | torch.device = "cpu",
) -> Tensor:
    """Uniform samples in the ℓ2 ball of radius ``delta`` in R^d; ``shape`` ends in the d dims.

    A uniform direction (a normalised Gaussian) times a radius ``δ·U^(1/d)``:
    Algorithm 1's "sample x₁..x_k uniformly from B(x, δ)".
    """
    lead = shape[: len(shape) - 1]
    z = torch.randn((*lead, d), generator=gen, device=device)
    z = z / z.norm(dim=-1, keepdim=True)
    r = delta * torch.rand((*lead, 1), generator=gen, device=device) ** (1.0 / d)
    return z * r


class BallOffsets:
    """Algorithm 1's ball samples: ``H × N × R × k × n × input`` offsets per step.

    All settings see the same samples (common random numbers); ``zero`` is
    the ball's centre, where the final objective is evaluated.
    """

    def __init__(self, config: AttackConfig, shape: tuple[int, ...], gen: torch.Generator) -> None:
        H, N, R, n, *input_shape = shape
        self.config, self.gen, self.shape = config, gen, shape
        self.zero = torch.zeros((H, N, R, 1, n, *input_shape), device=gen.device)

    def draw(self) -> Tensor:
        """One step's offsets (the centre itself when δ = 0), the same for every setting."""
        H, N, R, n, *input_shape = self.shape
        k, delta = self.config.mc_samples, self.config.delta
        if delta == 0.0:
            return self.zero if k == 1 else self.zero.expand(H, N, R, k, n, *input_shape)
        d_in = n * math.prod(input_shape)
        flat = sample_ball((1, N, R, k, d_in), d_in, delta, self.gen, self.gen.device)
        return flat.reshape(1, N, R, k, n, *input_shape).expand(H, N, R, k, n, *input_shape)
