"""The bibliography's labels in the text's author–year style ("Balunović et al. 2022").

The chapters cite author–year (``bibtex_reference_style: author_year`` in
``_config.yml``); pybtex's default labels in the bibliography itself are
alpha codes ("BDSV22"), which a reader cannot match to "Balunović et al.
[2022]" in the text. This extension registers the pybtex formatting style
``authoryear`` (``bibtex_default_style`` in ``_config.yml``): pybtex's
``unsrt`` entries, sorted by author, year and title, labelled "Last YEAR",
"Last and Last YEAR" or "Last et al. YEAR", with a, b, ... where two
entries would share a label. Used by ``book/bibliography.md``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator
from typing import Any

from pybtex.plugin import register_plugin
from pybtex.style.formatting.unsrt import Style as UnsrtStyle
from pybtex.style.labels import BaseLabelStyle
from pybtex.style.sorting.author_year_title import SortingStyle


def _surname(person: Any) -> str:
    """A person's surname as text, with its "von" part: "Balunović", "van der Walt"."""
    parts = [*person.rich_prelast_names, *person.rich_last_names]
    return " ".join(part.render_as("text") for part in parts)


def author_year(entry: Any) -> str:
    """The label of one entry: its authors' (or editors') surnames and its year."""
    persons = entry.persons.get("author") or entry.persons.get("editor") or []
    names = [_surname(p) for p in persons if str(p) != "others"]
    year = entry.fields.get("year", "n.d.")
    if not names:
        return f"{entry.key} {year}"
    if len(names) == 1 and len(persons) == 1:
        who = names[0]
    elif len(names) == 2 and len(persons) == 2:
        who = f"{names[0]} and {names[1]}"
    else:
        who = f"{names[0]} et al."
    return f"{who} {year}"


class AuthorYearLabelStyle(BaseLabelStyle):
    """Labels "Surname et al. YEAR"; entries that would share one get a, b, ... after the year."""

    def format_labels(self, sorted_entries: Iterable[Any]) -> Iterator[str]:
        entries = list(sorted_entries)
        labels = [author_year(e) for e in entries]
        shared = {label for label, n in Counter(labels).items() if n > 1}
        seen: Counter[str] = Counter()
        for label in labels:
            if label in shared:
                seen[label] += 1
                yield f"{label}{chr(ord('a') + seen[label] - 1)}"
            else:
                yield label


class AuthorYearStyle(UnsrtStyle):
    """pybtex's ``unsrt`` entries, sorted by author, year and title, with author–year labels."""

    default_label_style = AuthorYearLabelStyle
    default_sorting_style = SortingStyle


def setup(app: Any) -> dict[str, Any]:
    register_plugin("pybtex.style.formatting", "authoryear", AuthorYearStyle)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
