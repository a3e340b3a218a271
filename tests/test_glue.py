"""leakagelib.glue: the chapters' figures show in a plain notebook and once in the built book.

A chapter glues each figure with ``display=False`` and closes it, so that the
book shows it once, numbered and captioned; outside the book build (Colab, a
JupyterHub, papermill) the same cell must still show it under the cell, and
the import must not need myst-nb.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from leakagelib import glue as glue_module  # noqa: E402
from leakagelib.glue import BOOK_BUILD_ENV, glue, in_book_build  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def shown(monkeypatch: pytest.MonkeyPatch) -> list:
    """What ``glue`` hands to IPython's ``display`` (the cell's visible outputs)."""
    out: list = []
    monkeypatch.setattr("IPython.display.display", lambda value: out.append(value))
    return out


@pytest.fixture
def myst(monkeypatch: pytest.MonkeyPatch) -> list:
    """What ``glue`` hands to myst-nb's ``glue``."""
    calls: list = []
    monkeypatch.setattr("myst_nb.glue", lambda *a, **k: calls.append((a, k)))
    return calls


def test_outside_the_build_a_glued_figure_is_also_shown(monkeypatch, shown, myst):
    monkeypatch.delenv(BOOK_BUILD_ENV, raising=False)
    fig = plt.figure()
    glue("fig-x", fig, display=False)
    assert shown == [fig]  # the reader of a plain notebook sees it
    assert myst == [(("fig-x", fig), {"display": False})]  # and it is glued all the same
    plt.close(fig)


def test_in_the_build_a_glued_figure_is_left_to_its_directive(monkeypatch, shown, myst):
    monkeypatch.setenv(BOOK_BUILD_ENV, "1")
    assert in_book_build()
    fig = plt.figure()
    glue("fig-x", fig, display=False)
    assert shown == [] and myst == [(("fig-x", fig), {"display": False})]
    plt.close(fig)


def test_values_follow_myst_nb(monkeypatch, shown, myst):
    monkeypatch.delenv(BOOK_BUILD_ENV, raising=False)
    glue("psnr", 12.5, display=False)
    glue("shown", 3)
    assert shown == [] and myst == [
        (("psnr", 12.5), {"display": False}),
        (("shown", 3), {"display": True}),
    ]


def test_without_myst_nb_the_chapters_still_run(monkeypatch, shown):
    """Colab has no myst-nb: values are dropped (or displayed when asked), figures shown."""
    monkeypatch.delenv(BOOK_BUILD_ENV, raising=False)
    monkeypatch.setitem(sys.modules, "myst_nb", None)  # import myst_nb raises ImportError
    fig = plt.figure()
    glue("psnr", 12.5, display=False)
    glue("fig-x", fig, display=False)
    glue("count", 3)
    assert shown == [fig, 3]
    plt.close(fig)


def test_the_build_marks_its_kernels(monkeypatch):
    """The kernels get the build's mark and the inline backend, even where MPLBACKEND=Agg."""
    monkeypatch.delenv(BOOK_BUILD_ENV, raising=False)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    path = ROOT / "book" / "_ext" / "build_mark.py"
    spec = importlib.util.spec_from_file_location("book_ext_build_mark", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.setup(object())
    assert in_book_build() and glue_module.BOOK_BUILD_ENV == BOOK_BUILD_ENV
    assert os.environ["MPLBACKEND"] == "module://matplotlib_inline.backend_inline"
    assert "build_mark: book/_ext" in (ROOT / "_config.yml").read_text()
