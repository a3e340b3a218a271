"""The API appendix (book/api.md) documents every leakagelib module a chapter imports.

The chapters' code cells are parsed (IPython magics dropped) and every import
from leakagelib is resolved: ``from leakagelib.rgap import rank`` needs the
module ``leakagelib.rgap.rank``; ``from leakagelib.attacks import Gaussian``
needs the module that defines ``Gaussian`` (``leakagelib.attacks.likelihoods``),
which is where a reader looks it up; ``from leakagelib import experiments``
needs the package ``leakagelib.experiments``. Each must have an
``automodule`` entry in book/api.md.
"""

from __future__ import annotations

import ast
import importlib
import json
import re
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = sorted((ROOT / "book").glob("*.ipynb"))


def _python(line: str) -> str:
    """``line`` with an IPython magic or shell escape replaced by ``pass`` at its indentation."""
    stripped = line.lstrip()
    return line[: len(line) - len(stripped)] + "pass" if stripped.startswith(("%", "!")) else line


def _code(notebook: Path) -> str:
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    sources = ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]
    return "\n".join(_python(line) for line in "\n".join(sources).splitlines())


def _module_of(package: str, name: str) -> str:
    """The module a reader looks up for ``from package import name``."""
    owner = importlib.import_module(package)
    value = getattr(owner, name)
    if isinstance(value, types.ModuleType):
        return value.__name__
    return getattr(value, "__module__", None) or package


def imported_modules(notebook: Path) -> set[str]:
    """The leakagelib modules whose documentation ``notebook``'s imports call for."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(_code(notebook))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "leakagelib"}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "leakagelib":
            found |= {_module_of(node.module, a.name) for a in node.names}
    return {m for m in found if m != "leakagelib"}


def documented_modules() -> set[str]:
    text = (ROOT / "book" / "api.md").read_text(encoding="utf-8")
    return set(re.findall(r"^\.\. automodule:: (\S+)", text, re.MULTILINE))


def test_the_chapters_import_from_leakagelib():
    assert CHAPTERS
    assert all(imported_modules(nb) for nb in CHAPTERS)


def test_every_module_a_chapter_imports_has_an_automodule_entry():
    documented = documented_modules()
    missing = {
        nb.name: sorted(imported_modules(nb) - documented)
        for nb in CHAPTERS
        if imported_modules(nb) - documented
    }
    assert not missing, f"modules without an automodule entry in book/api.md: {missing}"


def test_every_automodule_entry_names_a_module():
    for name in documented_modules():
        assert isinstance(importlib.import_module(name), types.ModuleType), name
