"""Marks the kernels the book build starts, so that chapters know they are being built.

Sets :data:`leakagelib.glue.BOOK_BUILD_ENV` to "1" in the build's environment,
which the kernels nbclient starts inherit. :func:`leakagelib.glue.glue` then
leaves a glued figure to its ``{glue:figure}`` directive (shown once, numbered
and captioned); in any other run of a chapter it also shows the figure under its
cell.
"""

from __future__ import annotations

import os
from typing import Any

from leakagelib.glue import BOOK_BUILD_ENV


def setup(app: Any) -> dict[str, Any]:
    os.environ[BOOK_BUILD_ENV] = "1"
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
