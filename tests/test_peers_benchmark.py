"""The peers benchmark compares equal work: same networks, same TV weight, same attack.

``benchmarks/peers.py`` copies our weights into the peer's networks by
position and converts our TV weight into breaching's convention; these tests
check that this is right, so that the benchmark's timings compare the same
computation. The breaching tests skip (saying so) where breaching is not
installed in ``.peers/`` (see ``benchmarks/requirements-peers.txt``). No
timing is asserted: the benchmark is not a test.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

from leakagelib.attacks.priors import TotalVariation
from leakagelib.data import load
from leakagelib.models import build

REPO = Path(__file__).resolve().parents[1]


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("peers_bench", REPO / "benchmarks" / "peers.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


BENCH = _bench()


@pytest.fixture(scope="module")
def breaching() -> ModuleType:
    found = BENCH.import_breaching(REPO / ".peers")
    if isinstance(found, str):
        pytest.skip(f"{found}; this test did NOT run")
    return found


def _images(n: int) -> torch.Tensor:
    ds = load("patches", n=n, seed=0, constants="ig", constants_of="cifar10")
    return ds.normalizer.normalize(ds.images)


def test_peer_cnn6_is_our_cnn6() -> None:
    torch.manual_seed(0)
    ours = build("cnn6", BENCH.SHAPE, 1).eval()
    peer = BENCH.copy_weights(ours, BENCH.PeerCNN6()).eval()
    x = load("patches", n=2, seed=0).images
    assert BENCH.check_same_function(ours, lambda t: peer(t)[0], x) < 1e-5


@pytest.mark.parametrize("name", ["convnet16", "cvb-cnn"])
def test_peer_networks_compute_our_function(name: str, breaching: ModuleType) -> None:
    registry_id, options = BENCH.MODELS[name]
    torch.manual_seed(0)
    ours = build(registry_id, BENCH.SHAPE, 10, **options).eval()
    peer = BENCH.peer_model(name, ours, breaching)
    x = _images(3)
    assert BENCH.check_same_function(ours, peer, x) < 1e-5
    y = torch.tensor([0, 1, 2])
    loss = torch.nn.functional.cross_entropy
    g_ours = torch.autograd.grad(loss(ours(x), y), list(ours.parameters()))
    g_peer = torch.autograd.grad(loss(peer(x), y), list(peer.parameters()))
    for a, b in zip(g_ours, g_peer, strict=True):
        torch.testing.assert_close(a, b)


def test_tv_weight_conversion_matches_breaching(breaching: ModuleType) -> None:
    """Away from the border (last row and column zero) the two TVs agree with β = scale·(H−1)/H."""
    from breaching.attacks.auxiliaries.regularizers import TotalVariation as PeerTV

    x = torch.randn(1, *BENCH.SHAPE, generator=torch.Generator().manual_seed(0))
    x[..., -1, :] = 0.0
    x[..., :, -1] = 0.0
    settings = BENCH.IGSettings(iterations=1, lr=0.1, tv=0.2)
    peer = PeerTV({"dtype": torch.float, "device": torch.device("cpu")}, scale=settings.tv)
    ours = -settings.tv_ours * TotalVariation(1, reduction="mean").log_prob(x)
    torch.testing.assert_close(peer(x), ours, rtol=1e-5, atol=1e-6)


def test_both_sides_run_the_same_attack(breaching: ModuleType) -> None:
    """A few steps from the same start: the two reconstructions nearly coincide."""
    torch.manual_seed(0)
    ours = build("cvb-cnn", BENCH.SHAPE, 10).eval()
    ds, _ = BENCH.load_cifar(2, Path("/nonexistent.npz"), seed=0)
    v = BENCH.victims_for(ours, ds, "patches", seed=0)
    peer = BENCH.peer_model("cvb-cnn", ours, breaching)
    settings = BENCH.IGSettings(iterations=4, lr=0.1, tv=0.2)
    attacker = BENCH.breaching_attacker(breaching, peer, settings)
    rec_ours, _ = BENCH.ours_attack(ours, v, slice(0, 1), settings)
    rec_peer, _ = BENCH.breaching_attack(attacker, peer, v, 0)
    moved = (rec_ours - v.start[0]).abs().mean()
    gap = (rec_ours - rec_peer).abs().mean()
    assert gap < 0.05 * moved, (float(gap), float(moved))
