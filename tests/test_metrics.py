"""Tests for leakagelib.metrics: known values, agreement with scikit-image, CVB variants, LPIPS."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from skimage.metrics import structural_similarity

from leakagelib import metrics
from leakagelib.data import load


@pytest.fixture(scope="module")
def patches() -> torch.Tensor:
    return load("patches", n=6, seed=0).images


def _noisy(x: torch.Tensor, sigma: float, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (x + sigma * torch.randn(x.shape, generator=g)).clamp(0, 1)


# ------------------------------------------------------------------------------------------
# Input checks
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fn", [metrics.mse, metrics.psnr, metrics.ssim, metrics.psnr_minmax])
def test_inputs_are_checked(fn) -> None:
    x = torch.rand(2, 1, 12, 12)
    with pytest.raises(ValueError, match="4-D"):
        fn(x[0], x[0])
    with pytest.raises(ValueError, match="differ in shape"):
        fn(x, x[:1])
    with pytest.raises(TypeError, match="torch.Tensor"):
        fn(x.numpy(), x)


# ------------------------------------------------------------------------------------------
# MSE and PSNR
# ------------------------------------------------------------------------------------------


def test_mse_and_psnr_known_values() -> None:
    a = torch.full((3, 2, 4, 4), 0.2, dtype=torch.float64)
    b = a + torch.tensor([0.1, 0.01, 0.3], dtype=torch.float64).view(-1, 1, 1, 1)
    assert torch.allclose(metrics.mse(a, b), torch.tensor([1e-2, 1e-4, 9e-2], dtype=torch.float64))
    values = metrics.psnr(a, b)
    assert values.shape == (3,) and values.dtype == torch.float64
    assert values[0].item() == pytest.approx(20.0, abs=1e-9)
    assert values[1].item() == pytest.approx(40.0, abs=1e-9)
    assert values[2].item() == pytest.approx(-20 * math.log10(0.3), abs=1e-9)
    # data range 255: the same error in 8-bit units gives the same PSNR
    assert metrics.psnr(a * 255, b * 255, data_range=255)[0].item() == pytest.approx(20.0)
    with pytest.raises(ValueError, match="data_range"):
        metrics.psnr(a, b, data_range=0)


def test_psnr_identical_is_inf_and_mean_psnr_averages_decibels() -> None:
    a = torch.rand(2, 1, 8, 8, dtype=torch.float64)
    assert torch.isinf(metrics.psnr(a, a)).all()
    b = a.clone()
    b[0] += 0.1
    b[1] += 0.01
    # mean of per-image PSNR (20 and 40 dB), not the PSNR of the pooled MSE (about 23 dB)
    assert metrics.mean_psnr(a, b).item() == pytest.approx(30.0, abs=1e-9)
    assert metrics.mean_psnr(a, b).ndim == 0


# ------------------------------------------------------------------------------------------
# SSIM
# ------------------------------------------------------------------------------------------


def test_ssim_identical_is_one_and_falls_with_noise(patches: torch.Tensor) -> None:
    same = metrics.ssim(patches, patches)
    assert same.shape == (6,) and torch.allclose(same, torch.ones(6, dtype=torch.float64))
    light = metrics.ssim(_noisy(patches, 0.05), patches)
    heavy = metrics.ssim(_noisy(patches, 0.3), patches)
    assert (light < 1).all() and (heavy < light).all()
    assert float(heavy.max()) < 0.5


@pytest.mark.parametrize("spec", ["patches", "digits28", "faces"])
def test_ssim_matches_scikit_image(spec: str) -> None:
    x = load(spec, n=4, seed=1).images
    y = _noisy(x, 0.1, seed=2)
    ours = metrics.ssim(y, x)
    reference = [
        structural_similarity(
            y[i].double().numpy(),
            x[i].double().numpy(),
            data_range=1.0,
            channel_axis=0,
            gaussian_weights=True,
            sigma=1.5,
            use_sample_covariance=False,
        )
        for i in range(len(x))
    ]
    assert torch.allclose(ours, torch.tensor(reference, dtype=torch.float64), atol=1e-6)


def test_ssim_rejects_images_smaller_than_the_window() -> None:
    x = load("digits", n=2).images
    with pytest.raises(ValueError, match="at least 11"):
        metrics.ssim(x, x)


def test_asr_counts_threshold_hits() -> None:
    values = torch.tensor([0.2, 0.5, 0.7, 0.49999])
    assert metrics.asr(values) == pytest.approx(0.5)
    assert metrics.asr(values, threshold=0.1) == 1.0
    assert metrics.asr(values, threshold=0.9) == 0.0
    assert metrics.asr([0.6, 0.4]) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="NaN"):
        metrics.asr(torch.tensor([0.6, float("nan")]))
    with pytest.raises(ValueError, match="1-D"):
        metrics.asr(torch.zeros(2, 2))


# ------------------------------------------------------------------------------------------
# CVB code's min-max variants
# ------------------------------------------------------------------------------------------


def test_minmax_rescale_follows_the_cvb_formula() -> None:
    x = torch.tensor([[[[-1.0, 0.0], [1.0, 3.0]]], [[[5.0, 5.0], [5.0, 5.0]]]])
    out = metrics.minmax_rescale(x)
    eps = metrics.MINMAX_EPS
    expected = (torch.tensor([-1.0, 0.0, 1.0, 3.0], dtype=torch.float64) + 1 + eps) / (4 + eps)
    assert torch.allclose(out[0].flatten(), expected)
    assert torch.equal(out[1], torch.ones_like(out[1]))  # a constant image maps to ones


def test_minmax_variants_are_invariant_to_affine_rescaling(patches: torch.Tensor) -> None:
    recon = _noisy(patches, 0.1)
    # a reconstruction with the wrong brightness and contrast, in normalised-like units
    shifted, scaled = 3.0 * recon - 1.2, 0.5 * patches + 0.4
    # equal up to the CVB code's eps = 1e-5 in the rescaling (relative effect about eps / range)
    for fn in (metrics.psnr_minmax, metrics.ssim_minmax, metrics.mse_minmax):
        assert torch.allclose(fn(recon, patches), fn(shifted, scaled), rtol=1e-3, atol=0), fn
    # ... while the standard metrics are not
    assert (
        float((metrics.psnr(recon, patches) - metrics.psnr(recon.mul(0.5), patches)).abs().min())
        > 1
    )
    assert metrics.psnr_minmax(patches, 0.5 * patches).min() > 80  # same image up to contrast
    assert metrics.ssim_minmax(patches, 0.5 * patches + 0.2).min() > 0.9999


# ------------------------------------------------------------------------------------------
# LPIPS (no network here: the error path, and the wiring with a stand-in backbone file)
# ------------------------------------------------------------------------------------------


def test_lpips_offline_raises_a_precise_error(tmp_path: Path, monkeypatch, patches) -> None:
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    with pytest.raises(RuntimeError) as info:
        metrics.lpips_distance(patches, patches)
    message = str(info.value)
    assert "alexnet-owt-7be5be79.pth" in message and str(tmp_path) in message
    assert "download=True" in message and "https://download.pytorch.org" in message
    with pytest.raises(RuntimeError, match="vgg16"):
        metrics.lpips_minmax(patches, patches)


def test_lpips_rejects_images_too_small_for_alexnet() -> None:
    x = torch.rand(2, 1, 28, 28)
    with pytest.raises(ValueError, match="at least 31"):
        metrics.lpips_distance(x, x)


def test_lpips_wiring_with_a_stand_in_backbone(tmp_path: Path, monkeypatch, patches) -> None:
    """Randomly initialised AlexNet weights placed in a temporary torch-hub cache exercise the
    code path (cache lookup, grey-to-RGB, per-image output); the values are meaningless and
    never leave this test."""
    import torchvision

    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    _, checkpoint = metrics._backbone_checkpoint("alex")
    checkpoint.parent.mkdir(parents=True)
    torch.manual_seed(0)
    torch.save(torchvision.models.alexnet().state_dict(), checkpoint)
    noisy = _noisy(patches, 0.2)
    distance = metrics.lpips_distance(noisy, patches)
    assert distance.shape == (6,) and distance.dtype == torch.float64
    assert torch.equal(
        metrics.lpips_distance(patches, patches), torch.zeros(6, dtype=torch.float64)
    )
    assert (distance > 0).all()
    grey = patches.mean(1, keepdim=True)
    assert metrics.lpips_distance(grey, grey.flip(-1)).shape == (6,)


def test_lpips_with_real_weights_when_cached(patches) -> None:
    _, checkpoint = metrics._backbone_checkpoint("alex")
    if not checkpoint.is_file():
        pytest.skip(f"AlexNet weights not cached at {checkpoint}; this test did NOT run")
    light = metrics.lpips_distance(_noisy(patches, 0.02), patches)
    heavy = metrics.lpips_distance(_noisy(patches, 0.3), patches)
    assert (heavy > light).all() and np.isfinite(heavy.numpy()).all()


@pytest.mark.parametrize("metric", [metrics.mse, metrics.psnr, metrics.ssim, metrics.psnr_minmax])
def test_metrics_refuse_8_bit_images_with_the_conversion(metric):
    a = torch.zeros(2, 1, 16, 16, dtype=torch.uint8)
    with pytest.raises(
        TypeError, match=r"floating-point pixels in \[0, 1\].*images.float\(\) / 255"
    ):
        metric(a, a)


@pytest.mark.parametrize("metric", [metrics.mse, metrics.psnr, metrics.ssim, metrics.ssim_minmax])
def test_metrics_refuse_nan_images(metric):
    a = torch.rand(2, 1, 16, 16)
    b = a.clone()
    b[1, 0, 3, 3] = float("nan")
    with pytest.raises(ValueError, match="NaN or infinite pixels"):
        metric(b, a)
