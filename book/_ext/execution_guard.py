"""The book build's guard against the stalled chapter (issue 11): a cause removed and a watchdog.

**The stall.** A build (or a papermill run) sometimes stopped at a widget cell with the kernel
and the client both idle, for minutes. It was reproduced outside the book with a notebook of
60 cells that each display ``widgets.interactive`` around a matplotlib figure, run by nbclient
0.11 on this 2-core machine under load: a run stopped with both sides idle in 4 of 4 tries with
ipykernel 7.4, in 2 of 2 with ipykernel 6.31, in 1 of 1 with ipykernel 6.31 and pyzmq 26
(the cells take well under a second each). The same cells sent by a plain
jupyter_client client, blocking or asyncio, never stopped (13 runs). What nbclient adds is a
mimic of the front end's Output widget (``nbclient.output_widget.OutputWidget``): for every
output captured inside an Output widget it sends a ``comm_msg`` back to the kernel on the
shell channel, *while* it is waiting on that channel for the cell's ``execute_reply``; with those
sends disabled, the same runs finished every time (``tools/stall_stress.py`` repeats the
measurement).

**The cause removed.** The sends only keep the kernel-side copy of the widget's outputs in sync
for a live front end; a headless build needs nothing back in the kernel, and the outputs the
site embeds come from nbclient's own ``widget_state``, which is still updated. So the build
turns ``OutputWidget.sync_state`` into a no-op.

**The watchdog.** If a cell still runs past the build's per-cell limit (``execute.timeout`` in
``_config.yml``) plus a minute, a thread independent of the event loop prints which chapter and
which cell stopped, and interrupts the build. nbclient's own timeout (``execute.timeout``)
normally ends such a cell first — a slow cell under heavy load was stopped by it after 300 s —
but it runs in the event loop that waits for the lost message; the thread does not.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from typing import Any

import nbclient.client
import nbclient.output_widget

#: Seconds a cell may run beyond the per-cell limit before the watchdog interrupts the build.
GRACE_SECONDS = 60

#: The chapter being executed, the cell running in it and since when (``time.monotonic``).
_running: dict[str, Any] = {"docname": None, "cell": None, "since": None}


def _no_sync(self: nbclient.output_widget.OutputWidget) -> None:
    """Keep the captured outputs client-side: send nothing back on the shell channel."""


def stalled_message(running: dict[str, Any], now: float, limit: float) -> str | None:
    """The watchdog's message if the running cell has passed ``limit`` seconds, else ``None``."""
    since = running.get("since")
    if since is None or now - since <= limit:
        return None
    return (
        f"book build stalled: chapter {running['docname']}, cell {running['cell']} has run for "
        f"{now - since:.0f} s without finishing (limit {limit:.0f} s: execute.timeout in "
        "_config.yml plus a grace minute); interrupting the build"
    )


def _watch(limit: float) -> None:
    """Interrupt the build once the running cell passes ``limit``; exit if that is not enough."""
    while True:
        time.sleep(5)
        message = stalled_message(_running, time.monotonic(), limit)
        if message is not None:
            print(message, file=sys.__stderr__, flush=True)
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(30)
            os._exit(3)


def _guard_cells() -> None:
    """Record which cell of which chapter runs, around nbclient's cell execution."""
    execute = nbclient.client.NotebookClient.async_execute_cell

    async def watched(self: Any, cell: Any, cell_index: int, *args: Any, **kwargs: Any) -> Any:
        _running.update(cell=cell_index, since=time.monotonic())
        try:
            return await execute(self, cell, cell_index, *args, **kwargs)
        finally:
            _running.update(cell=None, since=None)

    nbclient.client.NotebookClient.async_execute_cell = watched


def _builder_inited(app: Any) -> None:
    timeout = getattr(app.config, "nb_execution_timeout", None) or 300
    thread = threading.Thread(target=_watch, args=(timeout + GRACE_SECONDS,), daemon=True)
    thread.start()


def _source_read(app: Any, docname: str, source: list[str]) -> None:
    _running["docname"] = docname


def setup(app: Any) -> dict[str, Any]:
    nbclient.output_widget.OutputWidget.sync_state = _no_sync
    _guard_cells()
    app.connect("builder-inited", _builder_inited)
    app.connect("source-read", _source_read)
    return {"version": "1.0", "parallel_read_safe": False, "parallel_write_safe": True}
