"""What this machine can do, measured on the spot, for the benchmarks' share-of-peak columns.

Used by ``attack_throughput.py`` and ``peers.py``: a benchmark states how
much of the float32 matrix-multiply peak an attack reaches, so a target
speed-up can be checked against what the arithmetic allows.
"""

from __future__ import annotations

import os
import time

import torch

__all__ = ["allocator_settings", "matmul_peak", "sync"]


def allocator_settings() -> dict[str, str]:
    """The C allocator's settings this process was started with (glibc's ``MALLOC_*_``
    variables and ``GLIBC_TUNABLES``), for a benchmark's record: they move the batched
    attacks' speed (README, Speed), so a number is quoted with them."""
    return {k: v for k, v in os.environ.items() if k.startswith("MALLOC_") or k == "GLIBC_TUNABLES"}


def sync(device: str) -> None:
    """Wait for the device's queued work (a no-op on the CPU)."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def matmul_peak(device: str = "cpu", size: int = 2048, repeats: int = 5) -> float:
    """This device's float32 matrix-multiply rate in FLOP/s (the best of ``repeats``)."""
    a = torch.randn(size, size, device=device)
    b = torch.randn(size, size, device=device)
    a @ b
    best = float("inf")
    for _ in range(repeats):
        sync(device)
        start = time.perf_counter()
        a @ b
        sync(device)
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best
