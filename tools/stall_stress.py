"""Measure the widget-cell stall of issue 11: run a notebook of widget cells again and again.

Each run executes, with nbclient (as the book build and papermill do), a notebook of ``--cells``
cells that each display ``widgets.interactive`` around a small matplotlib figure. A run in
which no cell finishes for ``--stall`` seconds (they take well under a second each) counts as
a stall: the kernel is stopped and the next run starts. ``--no-sync`` applies the book build's
fix (``book/_ext/execution_guard.py``: nbclient's Output-widget mimic sends nothing back on the
shell channel). Run it under load to see the difference::

    python tools/stall_stress.py --runs 5            # nbclient as shipped
    python tools/stall_stress.py --runs 15 --no-sync # with the build's fix
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

sys.path.insert(0, str(Path(__file__).parents[1] / "book" / "_ext"))
from execution_guard import keep_widget_outputs_client_side  # noqa: E402

SETUP = """\
import matplotlib
matplotlib.use("module://matplotlib_inline.backend_inline")
import matplotlib.pyplot as plt, numpy as np, ipywidgets as widgets
from IPython.display import display
def show(k):
    fig, ax = plt.subplots(figsize=(2, 2))
    ax.imshow(np.random.rand(8, 8))
    ax.set_title(str(k))
    plt.show()
"""


def widget_notebook(cells: int) -> nbformat.NotebookNode:
    """A setup cell and ``cells`` cells that each display an interactive widget with a figure."""
    nb = nbformat.v4.new_notebook()
    options = "widgets.Dropdown(options=list(range({})))"
    nb.cells = [nbformat.v4.new_code_cell(SETUP)] + [
        nbformat.v4.new_code_cell(
            f"display(widgets.interactive(show, k={options.format(i % 5 + 2)}))"
        )
        for i in range(cells)
    ]
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    return nb


def run_once(cells: int, stall: float) -> str:
    """One execution: 'ok' with its time, or 'stall after cell N' (the kernel is then stopped)."""
    progress = {"cell": -1, "at": time.monotonic()}

    def mark(cell: object, cell_index: int, execute_reply: object) -> None:
        progress.update(cell=cell_index, at=time.monotonic())

    client = NotebookClient(widget_notebook(cells), timeout=600, on_cell_executed=mark)
    outcome: dict[str, str] = {}

    def execute() -> None:
        start = time.monotonic()
        try:
            client.execute()
            outcome["result"] = f"ok in {time.monotonic() - start:.0f} s"
        except Exception as error:  # a stopped kernel ends the run with an error
            outcome.setdefault("result", f"error: {type(error).__name__}")

    worker = threading.Thread(target=execute, daemon=True)
    worker.start()
    while worker.is_alive():
        worker.join(2)
        if time.monotonic() - progress["at"] > stall:
            outcome["result"] = f"STALL after cell {progress['cell']} (kernel and client idle)"
            process = getattr(getattr(client.km, "provisioner", None), "process", None)
            if process is not None:  # the kernel's process (jupyter_client's local provisioner)
                process.kill()
            worker.join(30)
            break
    return outcome.get("result", "unknown")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--cells", type=int, default=60)
    parser.add_argument("--stall", type=float, default=90.0, help="seconds without a finished cell")
    parser.add_argument("--no-sync", action="store_true", help="apply the book build's fix")
    args = parser.parse_args()
    if args.no_sync:
        keep_widget_outputs_client_side()
    stalls = 0
    for run in range(1, args.runs + 1):
        result = run_once(args.cells, args.stall)
        stalls += result.startswith("STALL")
        print(f"run {run}: {result}", flush=True)
    print(f"{'with' if args.no_sync else 'without'} the fix: {stalls} stalls in {args.runs} runs")


if __name__ == "__main__":
    main()
