"""The model zoo: every architecture the three papers use.

``build(name, in_shape=(C, H, W), num_classes=K, **options)`` returns an
``nn.Module``; ``available()`` lists the names. Each architecture lives in a
module named for the paper that defines it and registers itself on import.
"""

from importlib import import_module
from pkgutil import iter_modules

from .registry import available, build, register

for _info in iter_modules(__path__):
    if _info.name != "registry":
        import_module(f"{__name__}.{_info.name}")

__all__ = ["available", "build", "register"]
