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

**The watchdog.** A thread independent of the event loop watches the running cell's kernel
and tells a stall from a slow cell by the kernel's CPU time (the kernel process and its
children, read from ``/proc``). A stalled kernel is idle; a slow one computes. So once the
kernel has used no CPU for :data:`IDLE_SECONDS` while a cell runs, the thread prints which
chapter and which cell stopped, and interrupts the build — within a few minutes, however long
the per-cell limit is. The limit (``execute.timeout`` in ``_config.yml``) is for slow cells:
under load a compute cell can take many times its usual time (``rgap_rank``'s Table 3 cell,
under a minute alone, ran past 300 s in three builds beside two campaigns and other builds,
its kernel busy throughout), so the limit is generous, and past it plus a minute the thread
interrupts the build too. nbclient's own timeout normally ends such a cell first, but it runs
in the event loop that waits for the lost message; the thread does not. Where ``/proc`` is
missing (not Linux), only the time limit applies.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import nbclient.client
import nbclient.output_widget

#: Seconds a cell may run beyond the per-cell limit before the watchdog interrupts the build.
GRACE_SECONDS = 60

#: Seconds a running cell's kernel may use no CPU before the watchdog calls it stalled (a cell
#: that waits on a subprocess counts its CPU: the kernel's children are included).
IDLE_SECONDS = 120

#: CPU seconds below which the kernel counts as idle over :data:`IDLE_SECONDS` (its heartbeat and
#: I/O threads use a little even when it waits).
IDLE_CPU = 0.5

#: The chapter being executed, the cell running in it, since when (``time.monotonic``), and the
#: pid of the kernel that runs it (``None`` where nbclient's kernel manager does not give one).
_running: dict[str, Any] = {"docname": None, "cell": None, "since": None, "kernel": None}


def _no_sync(self: nbclient.output_widget.OutputWidget) -> None:
    """Keep the captured outputs client-side: send nothing back on the shell channel."""


def keep_widget_outputs_client_side() -> None:
    """The stall's fix for any headless nbclient run in this process: the build (``setup``) and
    the coursework autograder (``tools/coursework.py``), which executes chapters with widget cells
    through nbclient too."""
    nbclient.output_widget.OutputWidget.sync_state = _no_sync


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


def idle_message(running: dict[str, Any], idle_for: float) -> str | None:
    """The watchdog's message if the running cell's kernel has been idle for ``IDLE_SECONDS``."""
    if running.get("since") is None or idle_for < IDLE_SECONDS:
        return None
    return (
        f"book build stalled: chapter {running['docname']}, cell {running['cell']}: its kernel "
        f"has used no CPU for {idle_for:.0f} s while the cell runs (kernel and client both "
        "waiting); interrupting the build"
    )


def process_tree_cpu(pid: int, proc: Path = Path("/proc")) -> float | None:
    """CPU seconds (user + system) of process ``pid`` and all its descendants, from ``proc``;
    ``None`` where that cannot be read (no ``/proc``, the process gone)."""
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    parents: dict[int, int] = {}
    cpu: dict[int, float] = {}
    for entry in proc.iterdir() if proc.is_dir() else ():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        parents[int(entry.name)] = int(fields[1])
        cpu[int(entry.name)] = (int(fields[11]) + int(fields[12])) / tick
    if pid not in cpu:
        return None
    tree, frontier = {pid}, [pid]
    while frontier:
        children = [c for c, parent in parents.items() if parent in frontier and c not in tree]
        tree.update(children)
        frontier = children
    return sum(cpu[p] for p in tree)


def _watch(limit: float) -> None:
    """Interrupt the build once the running cell's kernel has been idle for ``IDLE_SECONDS`` or
    the cell has passed ``limit``; exit if the interrupt is not enough."""
    last_cpu, active_at, cell = None, time.monotonic(), None
    while True:
        time.sleep(5)
        now, running = time.monotonic(), dict(_running)
        if (running["docname"], running["cell"], running["since"]) != cell:
            cell, last_cpu, active_at = (
                (running["docname"], running["cell"], running["since"]),
                None,
                now,
            )
        used = process_tree_cpu(running["kernel"]) if running.get("kernel") else None
        if used is not None and (last_cpu is None or used - last_cpu >= IDLE_CPU):
            last_cpu, active_at = used, now
        message = (idle_message(running, now - active_at) if used is not None else None) or (
            stalled_message(running, now, limit)
        )
        if message is not None:
            print(message, file=sys.__stderr__, flush=True)
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(30)
            os._exit(3)


def _guard_cells() -> None:
    """Record which cell of which chapter runs, around nbclient's cell execution."""
    execute = nbclient.client.NotebookClient.async_execute_cell

    async def watched(self: Any, cell: Any, cell_index: int, *args: Any, **kwargs: Any) -> Any:
        _running.update(cell=cell_index, since=time.monotonic(), kernel=_kernel_pid(self))
        try:
            return await execute(self, cell, cell_index, *args, **kwargs)
        finally:
            _running.update(cell=None, since=None, kernel=None)

    nbclient.client.NotebookClient.async_execute_cell = watched


def _kernel_pid(client: Any) -> int | None:
    """The pid of the kernel ``client`` (an nbclient NotebookClient) runs, if it has one locally."""
    process = getattr(getattr(getattr(client, "km", None), "provisioner", None), "process", None)
    return getattr(process, "pid", None)


def _builder_inited(app: Any) -> None:
    timeout = getattr(app.config, "nb_execution_timeout", None) or 300
    thread = threading.Thread(target=_watch, args=(timeout + GRACE_SECONDS,), daemon=True)
    thread.start()


def _source_read(app: Any, docname: str, source: list[str]) -> None:
    _running["docname"] = docname


def setup(app: Any) -> dict[str, Any]:
    keep_widget_outputs_client_side()
    _guard_cells()
    app.connect("builder-inited", _builder_inited)
    app.connect("source-read", _source_read)
    return {"version": "1.0", "parallel_read_safe": False, "parallel_write_safe": True}
