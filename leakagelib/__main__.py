"""``python -m leakagelib``: see :mod:`leakagelib.cli`."""

import sys

from .cli import main

sys.exit(main())
