"""R-GAP and rank analysis (Zhu & Blaschko, ICLR 2021).

* :mod:`.constraints` — per-layer gradient, weight and padding constraints as
  sparse float64 matrices built from the layer's geometry;
* :mod:`.mu` — μ from ⟨∇w, w⟩ by exact root-finding (both roots: twin data);
* :mod:`.last_layer` — step 1: the last layer's output and gradient, for the
  logistic loss and for cross-entropy with the label recovered from the gradient;
* :mod:`.recursive` — the recursive attack (:func:`rgap`) from there down to the input;
* :mod:`.solve` — the structured least-squares solvers behind it;
* :mod:`.rank` — the rank analysis index RA-i, the critical layer, residual
  blocks, and the exact per-layer rank;
* :mod:`.hgap` — H-GAP, DLG in R-GAP's logistic setting, and R-GAP → DLG.

The attacks (:func:`rgap`, :func:`hgap`, :func:`rgap_then_dlg`,
:func:`dlg_logistic`) take stacked updates (leading dimension N), N labels and
``input_shape``, and return an :class:`~leakagelib.attacks.AttackResult`.
Chapters "Closed-form attacks", "Rank analysis" and "Twin data" use them.
"""

from .hgap import dlg_logistic, hgap, rgap_then_dlg
from .mu import mu_dl_dmu, mu_roots
from .rank import RankAnalysis, exact_ranks, rank_analysis
from .recursive import RGAPDetails, rgap

__all__ = [
    "RGAPDetails",
    "RankAnalysis",
    "dlg_logistic",
    "exact_ranks",
    "hgap",
    "mu_dl_dmu",
    "mu_roots",
    "rank_analysis",
    "rgap",
    "rgap_then_dlg",
]
