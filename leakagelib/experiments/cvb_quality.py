"""The CVB experiments' quality columns: SSIM and ASR, and the supplementary's PSNR, MSE, LPIPS.

The CVB paper's main tables give each row's mean SSIM and ASR (the share of
images with SSIM ≥ 0.5); its supplementary Tables VIII–XII give the same
rows' PSNR, MSE and LPIPS too, all measured by the authors' ``Scaled*``
metrics on min–max rescaled images (:mod:`leakagelib.metrics`). Every
``cvb/*`` experiment that attacks writes its rows with :func:`quality_row`;
those with a supplementary table (Tables III–VI, Fig. 9) take the
:data:`LPIPS` setting and call :func:`require_lpips` before their attacks.
Chapters "Variational bottlenecks", "CVB against attacks and architectures"
and "CVB against DP-SGD and gradient compression" show them.
"""

from __future__ import annotations

from typing import Any

from .. import metrics, records
from ..attacks import AttackResult
from .case import Case
from .config import ScaleConfig
from .registry import Context

__all__ = ["LPIPS", "quality_row", "require_lpips"]

#: LPIPS, the supplementary tables' last quality column, as a setting of the experiments that
#: have such a table (Tables III–VI, Fig. 9): off unless ``--set lpips=True``, see its source.
LPIPS = ScaleConfig(
    ci={"lpips": False},
    paper={"lpips": False},
    sources={
        "lpips": "the supplementary Tables VIII–XII report LPIPS with the VGG-16 backbone "
        "(configs/metrics/lpips.yaml; metrics.lpips_minmax). It needs VGG-16's ImageNet weights "
        "(528 MB from download.pytorch.org), which the machines that made results/ cannot "
        "reach: off (ours) unless --set lpips=True where the weights are cached or may be "
        "downloaded (--download); the run checks that before any attack",
    },
)


def quality_row(
    case: Case,
    result: AttackResult,
    *,
    lpips: bool | None = None,
    pictures: int = 0,
    **fields: Any,
) -> dict[str, Any]:
    """``fields`` with the reconstructions' quality, as the CVB paper's tables report it.

    The mean SSIM, its standard deviation and the ASR (the main tables), and
    the PSNR, MSE and LPIPS with theirs (the supplementary Tables VIII–XII),
    all on min–max rescaled images as the authors' ``Scaled*`` metrics
    (:mod:`leakagelib.metrics`). ``lpips``: ``None`` leaves the LPIPS columns
    out (Tables I–II, which have no supplementary table), ``False`` writes them
    as None (not measured: the ``lpips`` setting of :data:`LPIPS`), ``True``
    measures them (call :func:`require_lpips` before the attacks).
    ``pictures`` > 0 adds the first that many victims and their reconstructions
    (``{"original": ..., "reconstruction": ...}``, :func:`leakagelib.records.pictures`):
    the example reconstructions of the CVB paper's Figs. 10 and 12 (Tables V and VI), and
    the chapters' grids of Tables I–IV.
    """
    names = ["ssim", "psnr", "mse"] + (["lpips"] if lpips is not None else [])
    row: dict[str, Any] = dict(fields)
    for name in names:
        if name == "lpips" and not lpips:
            row.update(lpips=None, lpips_std=None)
            continue
        values = case.score(result, f"{name}_minmax")
        row[name] = float(values.mean())
        row[f"{name}_std"] = float(values.std()) if values.numel() > 1 else 0.0
        if name == "ssim":
            row["asr"] = metrics.asr(values)
    if pictures > 0:
        row["pictures"] = records.pictures(case.images, case.reconstructions(result), pictures)
    return row


def require_lpips(ctx: Context) -> None:
    """Before any attack: with the ``lpips`` setting on, load LPIPS's VGG backbone or stop.

    Downloads it where the run may download (:attr:`Context.may_download`);
    otherwise a missing file stops the run here, naming it and the way out.
    """
    if not ctx.config.lpips:
        return
    try:
        metrics.load_lpips("vgg", download=ctx.may_download)
    except RuntimeError as error:
        raise RuntimeError(
            f"--set lpips=True: {error} Or run without it: the LPIPS columns are then None."
        ) from error
