"""glibc's allocator kept from returning freed memory: applied on Linux, and no number changes.

Each case runs in a fresh interpreter, so that the pytest process keeps its own allocator.
"""

import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")

# a small Inverting Gradients attack on ConvNet; prints a digest of its reconstructions
_ATTACK = """
import hashlib, sys
import torch
from leakagelib import models
from leakagelib.allocator import keep_freed_memory
from leakagelib.attacks.presets import preset
from leakagelib.data import Normalizer
from leakagelib.experiments.case import build_case

if sys.argv[1] == "kept":
    assert keep_freed_memory()
torch.set_num_threads(1)
torch.manual_seed(0)
net = models.build("convnet", in_shape=(3, 32, 32), num_classes=10, width=32).eval()
images, labels = torch.rand(3, 3, 32, 32), torch.arange(3)
case = build_case(net, images, labels, Normalizer((0.5, 0.5, 0.5), (0.25, 0.25, 0.25)))
attack = preset("inverting-gradients", steps=4, tv=1e-4, signed=True)
result = case.attack(attack, generator=torch.Generator().manual_seed(1))
print(hashlib.sha256(case.reconstructions(result).numpy().tobytes()).hexdigest())
"""


def _digest(mode: str) -> str:
    done = subprocess.run([sys.executable, "-c", _ATTACK, mode], capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_keep_freed_memory_applies_under_glibc():
    code = "from leakagelib.allocator import keep_freed_memory; print(keep_freed_memory())"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True"


def test_an_attack_is_the_same_to_the_last_bit_with_freed_memory_kept():
    kept, default = _digest("kept"), _digest("default")
    assert len(kept) == 64 and kept == default
