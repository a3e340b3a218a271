"""Check that the built site reads offline: every page in headless Chromium with no network.

``make offline-check`` runs this on ``_build/html`` after ``make book``. Each page is
served from this machine (``http.server`` on 127.0.0.1) and opened in headless Chromium
whose resolver maps every other host to nothing, so a script or font that still comes from
a CDN fails to load, as it would for a reader offline. After the page's scripts have run,
the rendered DOM must show

* no raw TeX: no ``\\(``, ``\\[`` or ``$$`` left in the text outside code blocks, and a
  rendered MathJax element wherever the page has math;
* every widget cell rendered, once: as many widget views in the DOM as the page embeds
  (``application/vnd.jupyter.widget-view+json`` scripts), no fewer and no more.

A screenshot of each page goes to ``--screenshots`` so that a person can look. Exit status 1
names each failing page and what failed; 2 when Chromium is missing.
"""

from __future__ import annotations

import argparse
import functools
import html.parser
import re
import shutil
import subprocess
import sys
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

#: Chromium without a network: every host but this machine resolves to nothing, and none of
#: the browser's own background connections (updates, sync, metrics) is attempted.
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-sync",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-quic",
    "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",
    "--virtual-time-budget=20000",
]
RAW_TEX = re.compile(r"\\\(|\\\[|\$\$")
VIEW_SCRIPT = 'type="application/vnd.jupyter.widget-view+json"'


class _Text(html.parser.HTMLParser):
    """The text of a DOM outside scripts, styles and code; counts MathJax and widget views."""

    SKIP = {"script", "style", "pre", "code", "textarea", "mjx-container"}

    def __init__(self) -> None:
        super().__init__()
        self.depth = 0
        self.text: list[str] = []
        self.mathjax = 0
        self.views = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        classes = dict(attrs).get("class") or ""
        self.mathjax += tag == "mjx-container"
        self.views += "widget-subarea" in classes.split()
        if tag in self.SKIP:
            self.depth += 1

    def handle_endtag(self, tag: str) -> None:
        if tag in self.SKIP and self.depth:
            self.depth -= 1

    def handle_data(self, data: str) -> None:
        if not self.depth:
            self.text.append(data)


def chromium() -> str:
    """The Chromium executable, or exit 2 saying how to install it."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if found := shutil.which(name):
            return found
    sys.exit("error: no chromium on PATH (Debian: apt-get install chromium)")


class _QuietHandler(SimpleHTTPRequestHandler):
    """Serves files without a log line per request."""

    def log_message(self, format: str, *args: object) -> None:
        pass


def serve(site: Path) -> ThreadingHTTPServer:
    """Serve ``site`` on 127.0.0.1 (a free port) from a daemon thread."""
    handler = functools.partial(_QuietHandler, directory=str(site))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def check_page(browser: str, url: str, source: str, screenshot: Path | None) -> list[str]:
    """What is wrong with the page at ``url`` once rendered offline (empty: nothing)."""
    dom = subprocess.run(
        [browser, *CHROMIUM_FLAGS, "--dump-dom", url],
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    if screenshot is not None:
        subprocess.run(
            [
                browser,
                *CHROMIUM_FLAGS,
                "--window-size=1280,2400",
                f"--screenshot={screenshot}",
                url,
            ],
            capture_output=True,
            timeout=120,
        )
    if "</html>" not in dom:
        return ["the page did not render"]
    parsed = _Text()
    parsed.feed(dom)
    problems = []
    raw = RAW_TEX.findall("".join(parsed.text))
    if raw:
        problems.append(f"{len(raw)} pieces of raw TeX")
    if 'class="math' in source and not parsed.mathjax:
        problems.append("math on the page but no MathJax output")
    if problem := widget_problem(source.count(VIEW_SCRIPT), parsed.views):
        problems.append(problem)
    return problems


def widget_problem(embedded: int, rendered: int) -> str | None:
    """What is wrong when a page embeds ``embedded`` widget views and shows ``rendered``.

    Fewer: a widget cell is empty (its scripts did not load). More: a widget is shown twice
    (two widget managers on the page, as when jupyter-book also loaded the manager globally;
    book/_ext/widget_scripts.py).
    """
    if rendered == embedded:
        return None
    return f"{embedded} widget views embedded, {rendered} rendered"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("site", type=Path, help="the built site, e.g. _build/html")
    parser.add_argument("--screenshots", type=Path, help="folder for one PNG per page")
    args = parser.parse_args(argv)
    if not (args.site / "index.html").is_file():
        sys.exit(f"error: {args.site} holds no built site (run `make book` first)")
    browser = chromium()
    if args.screenshots:
        args.screenshots.mkdir(parents=True, exist_ok=True)
    pages = sorted(
        p
        for p in args.site.rglob("*.html")
        if "_static" not in p.parts and not p.name.startswith(("_", "genindex"))
    )
    server = serve(args.site)
    failed = 0
    try:
        for page in pages:
            rel = page.relative_to(args.site).as_posix()
            url = f"http://127.0.0.1:{server.server_address[1]}/{rel}"
            shot = (
                args.screenshots / rel.replace("/", "_").replace(".html", ".png")
                if args.screenshots
                else None
            )
            problems = check_page(browser, url, page.read_text(errors="replace"), shot)
            failed += bool(problems)
            print(
                f"{'FAIL' if problems else 'ok  '} {rel}"
                + (f": {'; '.join(problems)}" if problems else "")
            )
    finally:
        server.shutdown()
    print(f"{len(pages) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
