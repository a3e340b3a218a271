"""``glue`` for the chapters: myst-nb's in the book build, and one that works on Colab too.

The chapters store computed numbers and figures with myst-nb's ``glue`` so that
the prose (``{glue:text}``) and the numbered, captioned figures
(``{glue:figure}``) show what the code computed. A figure cell glues its
figure with ``display=False`` and closes it: in the built book the figure then
appears once, where its caption is. Read outside the book — on Colab or a
JupyterHub, where myst-nb is usually not installed, or anywhere a chapter runs
outside ``jupyter-book build`` — that would leave the reader without the
figure, and ``from myst_nb import glue`` would fail altogether. This ``glue``
therefore

* delegates to myst-nb's when it is installed, and does nothing for values
  when it is not (the prose that reads them is only rendered in the book);
* shows a glued matplotlib figure under its cell whenever the chapter is not
  being executed by the book build, whatever ``display`` says.

The book build marks the kernels it starts with the environment variable
:data:`BOOK_BUILD_ENV` (``book/_ext/build_mark.py``). Used by every chapter in
``book/``.
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["BOOK_BUILD_ENV", "glue", "in_book_build"]

#: Set to "1" by the book build (``book/_ext/build_mark.py``) for the kernels it starts.
BOOK_BUILD_ENV = "LEAKAGELIB_BOOK_BUILD"


def in_book_build() -> bool:
    """Whether this kernel was started by ``jupyter-book build`` (see :data:`BOOK_BUILD_ENV`)."""
    return os.environ.get(BOOK_BUILD_ENV) == "1"


def glue(name: str, value: Any, display: bool = True) -> None:
    """Store ``value`` under ``name`` for the book's ``{glue:...}`` roles and directives.

    As :func:`myst_nb.glue` where myst-nb is installed. Outside the book
    build a matplotlib figure is also displayed, so that a reader running the
    chapter in a plain notebook sees every figure the book shows; without
    myst-nb, values other than figures are displayed only if ``display`` is
    true, as myst-nb would.
    """
    from IPython.display import display as show
    from matplotlib.figure import Figure

    try:
        from myst_nb import glue as myst_glue
    except ImportError:
        myst_glue = None
    shown_here = isinstance(value, Figure) and not in_book_build()
    if myst_glue is not None:
        myst_glue(name, value, display=display and not shown_here)
    if shown_here or (myst_glue is None and display):
        show(value)
