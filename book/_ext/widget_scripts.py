"""Loads the widget manager only on the pages that embed widgets, and once there.

jupyter-book adds every ``*.js`` under ``_static`` to every page (``html_js_files``), so
``_static/widgets/widgets.js`` (RequireJS and the ipywidgets HTML manager, fetched by
``make book``) was loaded on every page, and a second time on a page with widgets, where
myst-nb adds it with its ``data-jupyter-widgets-cdn`` attribute (``nb_ipywidgets_js`` in
``_config.yml``). Two managers each rendered every embedded widget, so a reader saw each one
twice. This removes the global entry; myst-nb's per-page one stays, on the pages whose
notebooks carry widget state. ``tools/check_offline.py`` fails a page that shows more widget
views than it embeds.
"""

from __future__ import annotations

from typing import Any


def _script_name(entry: Any) -> str:
    """The file an ``html_js_files`` entry names (a path, or a ``(path, attributes)`` pair)."""
    return str(entry[0] if isinstance(entry, (tuple, list)) else entry)


def drop_global_widget_manager(app: Any, config: Any) -> None:
    """Remove from the scripts that every page loads those myst-nb loads on pages with widgets
    (the keys of ``nb_ipywidgets_js``)."""
    per_page = set(config.nb_ipywidgets_js)
    config.html_js_files = [e for e in config.html_js_files if _script_name(e) not in per_page]


def setup(app: Any) -> dict[str, Any]:
    app.connect("config-inited", drop_global_widget_manager)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
