"""Registered experiments: one module per paper, each registering its tables and figures.

``run(id, scale)`` runs one and returns its record; ``available()`` lists ids.
Importing this package imports every experiment module so the registry is full.
"""

from importlib import import_module
from pkgutil import iter_modules

from .case import Case, build_case
from .config import ScaleConfig, Settings
from .registry import Context, Experiment, available, experiment, get, run

#: Modules of this package that hold the machinery, not experiments.
_MACHINERY = {"registry", "config", "case"}

for _info in iter_modules(__path__):
    if _info.name not in _MACHINERY:
        import_module(f"{__name__}.{_info.name}")

__all__ = [
    "Case",
    "Context",
    "Experiment",
    "ScaleConfig",
    "Settings",
    "available",
    "build_case",
    "experiment",
    "get",
    "run",
]
