"""leakagelib: gradient leakage in federated learning.

The library behind the book *Gradient Leakage, Executed*. It holds the data
loaders, the model zoo of the three papers, client updates, metrics, attacks,
defenses and rank analysis; the chapters in ``book/`` call it and never
re-implement it.

``import leakagelib as ll`` reaches every submodule (``ll.models.build``,
``ll.attacks.preset``, ``ll.experiments.run``, ...): they are imported on
first use, so importing the package stays cheap.
"""

from __future__ import annotations

import importlib
from types import ModuleType

__version__ = "0.1.0"

#: The submodules ``leakagelib.NAME`` reaches (imported on first attribute access).
SUBMODULES = (
    "analysis",
    "attacks",
    "bayes_risk",
    "cli",
    "data",
    "defenses",
    "experiments",
    "fedavg",
    "fl",
    "gradients",
    "metrics",
    "models",
    "records",
    "reporting",
    "rgap",
    "viz",
)

__all__ = ["SUBMODULES", "__version__", *SUBMODULES]


def __getattr__(name: str) -> ModuleType:
    """Import the submodule ``name`` on first access (PEP 562)."""
    if name in SUBMODULES:
        module = importlib.import_module(f"{__name__}.{name}")
        globals()[name] = module
        return module
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
