"""Registered experiments: one module per paper, each registering its tables and figures.

``run(id, scale)`` runs one and returns its record; ``available()`` lists ids.
Importing this package imports every experiment module so the registry is full.
"""

from importlib import import_module
from pkgutil import iter_modules

from .registry import Context, Experiment, available, experiment, get, run

for _info in iter_modules(__path__):
    if _info.name != "registry":
        import_module(f"{__name__}.{_info.name}")

__all__ = ["Context", "Experiment", "available", "experiment", "get", "run"]
