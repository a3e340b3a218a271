"""Reconstruction-quality metrics: MSE, PSNR, SSIM, LPIPS, attack success rate.

Every metric compares two batches of images ``N x C x H x W`` (the reconstruction and the
original, in pixel space: de-normalise with :class:`leakagelib.data.Normalizer` first, as the
papers' code does) and returns one value per image, a tensor of shape ``N``. Values are not
clipped (clamp a reconstruction to [0, 1] yourself where a paper does), inputs are detached
(these are evaluation metrics, not losses), and the result lives on the inputs' device.

Two families:

* The standard metrics (:func:`mse`, :func:`psnr`, :func:`ssim`, :func:`lpips_distance`) assume
  images in [0, 1] (data range 1). The Bayes-framework and R-GAP chapters report these.
* The ``*_minmax`` variants reproduce the CVB/PRECODE code (dAI-SY-Group/
  ConvolutionalVariationalBottleneck, ``src/metrics.py`` and ``src/utils.py``): each image is
  first rescaled on its own to [0, 1] by :func:`minmax_rescale`, then measured. This makes the
  numbers invariant to any per-image affine map ``a*x + b`` (a > 0) -- it forgives a wrong
  brightness or contrast -- so they are *not* comparable with standard PSNR/SSIM. The CVB
  chapters report them, with :func:`asr`.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import torch

__all__ = [
    "ASR_THRESHOLD",
    "EXACT_PSNR",
    "MINMAX_EPS",
    "asr",
    "load_lpips",
    "lpips_distance",
    "lpips_minmax",
    "mean_psnr",
    "minmax_rescale",
    "mse",
    "mse_minmax",
    "psnr",
    "psnr_minmax",
    "ssim",
    "ssim_minmax",
]


#: PSNR (dB, data range 1) above which the book calls a reconstruction exact: a mean squared
#: error below 10⁻¹⁰, pixels within about 10⁻⁵ of the image's. Closed-form recoveries in
#: float64 reach it (round-off), optimisation attacks do not (the Bayes paper reports PSNR
#: above 150 dB for its closed-form break of PRECODE's MLP, Fig. 3). The chapters
#: ``client_updates``, ``variational_bottlenecks``, ``breaking_defenses`` and ``cvb_defenses``
#: assert their exact recoveries against it.
EXACT_PSNR = 100.0


def _check_images(x: torch.Tensor, what: str) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{what} must be a torch.Tensor, got {type(x).__name__}.")
    if x.ndim != 4:
        raise ValueError(f"{what} must be N x C x H x W (4-D); got shape {tuple(x.shape)}.")
    if x.shape[0] == 0:
        raise ValueError(f"{what} holds no images (shape {tuple(x.shape)}).")
    if not x.is_floating_point():
        raise TypeError(
            f"{what} must hold floating-point pixels in [0, 1], got dtype {x.dtype}; "
            "convert 8-bit images with images.float() / 255."
        )
    if not bool(torch.isfinite(x).all()):
        raise ValueError(
            f"{what} holds NaN or infinite pixels: a diverged attack has no image to score."
        )


def _check_pair(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Validate two image batches and return them as float64 on ``a``'s device."""
    _check_images(a, "the first image batch")
    _check_images(b, "the second image batch")
    if a.shape != b.shape:
        raise ValueError(
            f"The two image batches differ in shape: {tuple(a.shape)} vs {tuple(b.shape)}."
        )
    return a.detach().double(), b.detach().to(a.device).double()


# --------------------------------------------------------------------------------------------
# MSE and PSNR
# --------------------------------------------------------------------------------------------


def mse(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Mean squared error per image (mean over C, H, W), float64, shape ``N``."""
    x, y = _check_pair(a, b)
    return (x - y).pow(2).flatten(1).mean(1)


def psnr(a: torch.Tensor, b: torch.Tensor, data_range: float = 1.0) -> torch.Tensor:
    """Peak signal-to-noise ratio per image in dB: ``10 log10(data_range^2 / MSE)``, shape ``N``.

    ``data_range`` is the span of valid pixel values (1 for images in [0, 1], as the Bayes
    code computes it on de-normalised images). Identical images have MSE 0 and PSNR ``+inf``
    (the limit, not an error); :func:`mean_psnr` then returns ``inf`` too, which says exactly
    what happened (a perfect reconstruction) rather than hiding it.
    """
    if not data_range > 0:
        raise ValueError(f"data_range must be positive; got {data_range}.")
    error = mse(a, b)
    return 10.0 * torch.log10(float(data_range) ** 2 / error)


def mean_psnr(a: torch.Tensor, b: torch.Tensor, data_range: float = 1.0) -> torch.Tensor:
    """The mean over images of the per-image PSNR (a 0-d float64 tensor).

    This is the convention of the Inverting Gradients code (``inversefed.metrics.psnr`` with
    ``batched=False``) and of the Bayes paper's tables: average the dB values, not the MSEs.
    """
    return psnr(a, b, data_range).mean()


# --------------------------------------------------------------------------------------------
# SSIM
# --------------------------------------------------------------------------------------------

#: SSIM settings: Gaussian window sigma 1.5 (11x11 taps), K1 = 0.01, K2 = 0.03 (Wang et al. 2004).
SSIM_SIGMA = 1.5
SSIM_K1 = 0.01
SSIM_K2 = 0.03
#: Half-width of the Gaussian window (torchmetrics and scikit-image: ``int(3.5 sigma + 0.5)``).
SSIM_RADIUS = int(3.5 * SSIM_SIGMA + 0.5)


def ssim(a: torch.Tensor, b: torch.Tensor, data_range: float = 1.0) -> torch.Tensor:
    """Structural similarity per image (mean SSIM over the valid pixels and channels), shape N.

    Settings are those of Wang et al. (2004) and of the CVB code, which uses torchmetrics'
    ``StructuralSimilarityIndexMeasure`` with its defaults and only ``reduction: none`` set
    (``configs/metrics/ssim.yaml``): a Gaussian window with sigma 1.5 (11x11 taps), K1 = 0.01,
    K2 = 0.03. ``data_range`` is fixed (1 for [0, 1] images) rather than inferred from the
    batch, so one image's value does not depend on the others in its batch.

    The SSIM map comes from torchmetrics' ``structural_similarity_index_measure``
    (``return_full_image=True``); its mean is taken over the pixels at least 5 pixels from the
    border, where the 11x11 window lies inside the image. That is the definition of Wang et
    al.'s MATLAB code, of scikit-image's ``structural_similarity`` (``gaussian_weights=True,
    sigma=1.5, use_sample_covariance=False``) and of torchmetrics 0.11.4, the version pinned in
    the CVB code's ``environment.yaml``. torchmetrics 1.5 and later average the whole
    reflection-padded map instead (Lightning-AI/torchmetrics PR #2721), which on MNIST-like
    images with black borders changes SSIM by up to 0.4 and would change the CVB paper's
    attack success rates. Images need at least 11 pixels per side (the 8x8 digits do not
    qualify: use ``digits28``).
    """
    from torchmetrics.functional.image import structural_similarity_index_measure

    x, y = _check_pair(a, b)
    window = 2 * SSIM_RADIUS + 1
    if min(x.shape[-2:]) < window:
        raise ValueError(
            f"SSIM's {window}x{window} window needs images of at least {window} pixels per side; "
            f"got {tuple(x.shape[-2:])}."
        )
    if not data_range > 0:
        raise ValueError(f"data_range must be positive; got {data_range}.")
    _, full = structural_similarity_index_measure(
        x,
        y,
        gaussian_kernel=True,
        sigma=SSIM_SIGMA,
        k1=SSIM_K1,
        k2=SSIM_K2,
        data_range=float(data_range),
        reduction="none",
        return_full_image=True,
    )
    r = SSIM_RADIUS
    return full[..., r:-r, r:-r].flatten(1).mean(1)


#: The SSIM at which the CVB paper counts an attack as successful (:func:`asr`), and the red line
#: of its Figure 11 (chapter "CVB against defenses").
ASR_THRESHOLD = 0.5


def asr(ssim_values: torch.Tensor, threshold: float = ASR_THRESHOLD) -> float:
    """Attack success rate: the share of images whose SSIM is at least ``threshold``.

    The CVB paper counts an attack as successful when the reconstruction's SSIM reaches a
    threshold; the value is lost in our text extraction, and 0.5 is the one its tables are
    consistent with (mean SSIM, spread and ASR side by side), so 0.5 is the default. Returns a
    fraction in [0, 1] (the paper prints percentages).
    """
    if not isinstance(ssim_values, torch.Tensor):
        ssim_values = torch.as_tensor(ssim_values)
    if ssim_values.ndim != 1 or ssim_values.numel() == 0:
        raise ValueError(
            f"asr expects a non-empty 1-D tensor of per-image SSIM values; got shape "
            f"{tuple(ssim_values.shape)}."
        )
    if torch.isnan(ssim_values).any():
        raise ValueError("asr got NaN SSIM values; a NaN reconstruction is not a measurement.")
    return float((ssim_values >= threshold).double().mean())


# --------------------------------------------------------------------------------------------
# LPIPS
# --------------------------------------------------------------------------------------------

#: Smallest image side each LPIPS backbone accepts (found by running each backbone on growing
#: square inputs: AlexNet's stride-4 first layer and two pools leave nothing below 31 pixels).
LPIPS_MIN_SIDE = {"alex": 31, "vgg": 16, "squeeze": 17}

_LPIPS_WEIGHTS = {
    "alex": "AlexNet_Weights",
    "vgg": "VGG16_Weights",
    "squeeze": "SqueezeNet1_1_Weights",
}
_LPIPS_MODELS: dict[tuple[str, str, str], torch.nn.Module] = {}


def _backbone_checkpoint(net: str) -> tuple[str, Path]:
    """URL and torch-hub cache path of the ImageNet backbone ``lpips`` loads for ``net``.

    The ``lpips`` package ships its linear calibration layers (``lpips/weights/v0.1/*.pth``)
    but builds the backbone with ``torchvision.models.<net>(pretrained=True)``, which reads
    ``$TORCH_HOME/hub/checkpoints/<file>`` and downloads it from download.pytorch.org when
    absent.
    """
    import torchvision

    weights = getattr(torchvision.models, _LPIPS_WEIGHTS[net]).IMAGENET1K_V1
    url = weights.url
    return url, Path(torch.hub.get_dir()) / "checkpoints" / os.path.basename(url)


def _lpips_model(net: str, device: torch.device, download: bool) -> torch.nn.Module:
    if net not in _LPIPS_WEIGHTS:
        raise ValueError(f"Unknown LPIPS network {net!r}; choose one of {sorted(_LPIPS_WEIGHTS)}.")
    url, checkpoint = _backbone_checkpoint(net)
    if not checkpoint.is_file() and not download:
        raise RuntimeError(
            f"LPIPS ({net}) needs torchvision's ImageNet backbone weights, which are not in the "
            f"torch hub cache ({checkpoint}) and were not downloaded (download=False; this "
            f"project never reaches the network on its own). Get them on a machine with "
            f"network access with lpips_distance(..., download=True) or by downloading {url} "
            f"into {checkpoint.parent} (set $TORCH_HOME to use another cache)."
        )
    key = (net, str(checkpoint), str(device))
    if key not in _LPIPS_MODELS:
        import lpips

        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # torchvision's "pretrained is deprecated"
                model = lpips.LPIPS(net=net, verbose=False)
        except OSError as error:  # URLError and friends
            raise RuntimeError(
                f"LPIPS ({net}): the backbone weights could not be downloaded from {url} into "
                f"{checkpoint.parent}: {error}. Copy the file there from a machine with network "
                f"access."
            ) from error
        _LPIPS_MODELS[key] = model.to(device).eval()
    return _LPIPS_MODELS[key]


def load_lpips(net: str = "alex", *, download: bool = False) -> None:
    """Load LPIPS's ``net`` backbone now (downloading it only with ``download=True``), or raise.

    A run that reports LPIPS calls this before its attacks (the CVB
    experiments with ``--set lpips=True``, :mod:`leakagelib.experiments.cvb_common`), so that
    missing weights stop it at once with the file to fetch, not after hours of work.
    """
    _lpips_model(net, torch.device("cpu"), download)


def _lpips(
    a: torch.Tensor, b: torch.Tensor, net: str, download: bool, scale_to_pm1: bool
) -> torch.Tensor:
    x, y = _check_pair(a, b)
    channels = x.shape[1]
    if channels not in (1, 3):
        raise ValueError(f"LPIPS compares 1- or 3-channel images; got {channels} channels.")
    side = min(x.shape[-2:])
    if net in LPIPS_MIN_SIDE and side < LPIPS_MIN_SIDE[net]:
        raise ValueError(
            f"LPIPS with net={net!r} needs images of at least {LPIPS_MIN_SIDE[net]} pixels per "
            f"side; got {tuple(x.shape[-2:])}. Use net='vgg' (at least 16) or compare upsampled "
            f"images."
        )
    model = _lpips_model(net, x.device, download)
    if channels == 1:  # grey images as RGB, as the CVB code does
        x, y = x.expand(-1, 3, -1, -1), y.expand(-1, 3, -1, -1)
    with torch.no_grad():
        value = model(x.float(), y.float(), normalize=scale_to_pm1)
    return value.flatten().double()


def lpips_distance(
    a: torch.Tensor, b: torch.Tensor, net: str = "alex", *, download: bool = False
) -> torch.Tensor:
    """LPIPS perceptual distance per image (Zhang et al. 2018, ``lpips`` package, v0.1), shape N.

    Images in [0, 1] are mapped to the [-1, 1] range LPIPS expects; grey images are repeated to
    three channels. ``net`` picks the backbone: ``"alex"`` (the package's recommended default,
    images of at least 31 pixels per side), ``"vgg"`` or ``"squeeze"``. The backbone's ImageNet
    weights come from torchvision's model zoo; offline and uncached this raises a RuntimeError
    naming the file and where to put it, and it downloads only with ``download=True``.
    """
    return _lpips(a, b, net, download, scale_to_pm1=True)


# --------------------------------------------------------------------------------------------
# CVB code's min-max variants
# --------------------------------------------------------------------------------------------

#: The CVB code's guard against division by zero in its per-image rescaling.
MINMAX_EPS = 1e-5


def minmax_rescale(x: torch.Tensor) -> torch.Tensor:
    """Rescale each image on its own (over all its channels and pixels) to [0, 1].

    Follows ``Normalizer(mode='single')`` of the CVB code (``src/utils.py``):
    ``1 - (max - x) / (max - min + 1e-5)``, i.e. ``(x - min + eps) / (max - min + eps)``: the
    maximum maps to exactly 1 and the minimum to ``eps / (range + eps)``, about 0. A constant
    image maps to all ones. Returns float64.
    """
    _check_images(x, "the image batch")
    v = x.detach().double()
    flat = v.flatten(1)
    high = flat.max(1).values.view(-1, 1, 1, 1)
    low = flat.min(1).values.view(-1, 1, 1, 1)
    return 1.0 - (high - v) / (high - low + MINMAX_EPS)


def _rescaled_pair(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    x, y = _check_pair(a, b)
    return minmax_rescale(x), minmax_rescale(y)


def mse_minmax(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """:func:`mse` after :func:`minmax_rescale` of each image (the CVB code's "MSE")."""
    return mse(*_rescaled_pair(a, b))


def psnr_minmax(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """:func:`psnr` after :func:`minmax_rescale` of each image (the CVB code's "PSNR").

    The CVB code lets torchmetrics infer the data range from the rescaled target (``1 - eps``
    away from 1 by ``eps / range``); we use 1, which differs by under 1e-4 dB.
    """
    return psnr(*_rescaled_pair(a, b), data_range=1.0)


def ssim_minmax(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """:func:`ssim` after :func:`minmax_rescale` of each image (the CVB code's "SSIM").

    The CVB paper's SSIM columns and its ASR (:func:`asr` of these values) use this.
    """
    return ssim(*_rescaled_pair(a, b), data_range=1.0)


def lpips_minmax(
    a: torch.Tensor, b: torch.Tensor, net: str = "vgg", *, download: bool = False
) -> torch.Tensor:
    """LPIPS as the CVB code computes it, per image, shape ``N``.

    The CVB code (``configs/metrics/lpips.yaml``, ``src/metrics.py``) uses torchmetrics'
    LPIPS -- the same network and calibration as the ``lpips`` package -- with the VGG
    backbone, on min-max rescaled images, and leaves torchmetrics' ``normalize=False``: the
    [0, 1] images are fed as if they were in LPIPS's [-1, 1] range. We reproduce that
    faithfully (so the numbers match the paper's), which is why this is not
    ``lpips_distance(minmax_rescale(a), minmax_rescale(b))``.
    """
    x, y = _rescaled_pair(a, b)
    return _lpips(x, y, net, download, scale_to_pm1=False)
