"""glibc's allocator set for long attack runs on the CPU: freed memory is kept for reuse.

glibc's ``malloc`` maps every block above its mmap threshold (at most 32 MiB)
from the kernel on its own, and gives it back when it is freed; the next
block of that size is mapped afresh and its pages are zeroed by the kernel
as they are first touched. A paper-scale attack allocates and frees tensors
of hundreds of MiB at every iteration (the simulated gradients of 40 victims
on ConvNet-64's 2.9 million parameters are 464 MB each), so that traffic
becomes a large share of the run. Fig. 2's ATS unit after 10 training steps
(the chapter "Breaking heuristic defenses": 40 images, 2,000 Inverting
Gradients iterations) ran 12.7 s an iteration with 28 % of its CPU time in
the kernel; with mmap switched off, so that freed blocks stay in the heap
and are reused, it ran 8.7 s with almost none (2026-12-07, this
project's 2-core AMD EPYC, the same unit before and after a resume; README,
Speed section). Where the tensors are small the gain is small or none (the
chapters' ci experiments, measured with glibc's thresholds raised instead;
README, Speed section).

The setting changes where memory comes from, not what is computed: an
attack's reconstructions are the same to the last bit with and without it
(``tests/test_allocator.py``). The heap does not shrink while the process
lives, so a run holds its peak memory until it ends (6.3 GB against 3.6 GB
for that unit). It belongs to a process that runs long attacks, not to a
library imported into someone else's: ``python -m leakagelib`` applies it
(``leakagelib/__main__.py``); ``main()`` called in-process (the tests) does not.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

__all__ = ["keep_freed_memory"]

#: ``mallopt`` parameters (glibc's ``malloc.h``).
_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4
#: The largest trim threshold ``mallopt`` takes (an ``int``): free memory at the heap's top
#: is returned to the kernel only above it.
_INT_MAX = 2**31 - 1


def keep_freed_memory() -> bool:
    """Switch glibc's mmap off for this process and keep freed memory in the heap for reuse.

    Returns whether it was applied: ``False`` off Linux, or where the C library is not
    glibc (no ``mallopt``) or refuses a setting.
    """
    if not sys.platform.startswith("linux"):
        return False
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    libc = ctypes.CDLL(name)
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is None:
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(_M_MMAP_MAX, 0)) and bool(mallopt(_M_TRIM_THRESHOLD, _INT_MAX))
