"""Sets up the environment of the kernels the book build starts (they inherit the build's).

* :data:`leakagelib.glue.BOOK_BUILD_ENV` is "1", so that
  :func:`leakagelib.glue.glue` leaves a glued figure to its ``{glue:figure}``
  directive (shown once, numbered and captioned); in any other run of a
  chapter it also shows the figure under its cell.
* ``MPLBACKEND`` is matplotlib-inline's backend, whatever the build's own
  environment says. ipykernel keeps a ``MPLBACKEND`` it inherits, and with
  ``Agg`` (which ``.ci/run`` exports for the tests) IPython has no PNG
  formatter for figures: a glued figure was then stored as text only and the
  site showed no figure (found by the figure-size test in a CI run).
"""

from __future__ import annotations

import os
from typing import Any

from leakagelib.glue import BOOK_BUILD_ENV

#: The backend whose figures IPython renders as PNG (ipykernel's default when none is set).
INLINE_BACKEND = "module://matplotlib_inline.backend_inline"


def setup(app: Any) -> dict[str, Any]:
    os.environ[BOOK_BUILD_ENV] = "1"
    os.environ["MPLBACKEND"] = INLINE_BACKEND
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
