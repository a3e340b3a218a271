"""``python -m leakagelib``: see :mod:`leakagelib.cli`.

The process keeps freed memory for reuse (:func:`leakagelib.allocator.keep_freed_memory`):
a paper-scale attack frees and allocates blocks of hundreds of MiB at every iteration.
"""

import sys

from .allocator import keep_freed_memory
from .cli import main

keep_freed_memory()
sys.exit(main())
