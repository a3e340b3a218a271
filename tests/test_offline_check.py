"""The offline check's reading of a rendered page (tools/check_offline.py; no browser needed)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "check_offline", Path(__file__).parents[1] / "tools" / "check_offline.py"
)
check_offline = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(check_offline)


def read(dom: str) -> check_offline._Text:
    parsed = check_offline._Text()
    parsed.feed(dom)
    return parsed


def test_raw_tex_in_prose_is_found_and_tex_in_code_or_rendered_math_is_not():
    raw = read('<p>the risk <span class="math">\\(R(f)\\)</span></p>')
    assert check_offline.RAW_TEX.findall("".join(raw.text)) and raw.mathjax == 0
    rendered = read('<p><span class="math"><mjx-container>R(f)</mjx-container></span></p>')
    assert not check_offline.RAW_TEX.findall("".join(rendered.text)) and rendered.mathjax == 1
    code = read("<pre>print('$$x$$')</pre><code>\\(y\\)</code>")
    assert not check_offline.RAW_TEX.findall("".join(code.text))


def test_rendered_widget_views_are_counted():
    page = read('<div class="widget-subarea"><div class="jupyter-widgets"></div></div>')
    assert page.views == 1 and read("<div class='jupyter-widgets'></div>").views == 0


def test_a_widget_shown_twice_or_not_at_all_is_a_problem_and_once_is_not():
    assert check_offline.widget_problem(2, 2) is None
    assert check_offline.widget_problem(2, 4) == "2 widget views embedded, 4 rendered"
    assert check_offline.widget_problem(1, 0) == "1 widget views embedded, 0 rendered"
