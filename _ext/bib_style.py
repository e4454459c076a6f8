"""Sphinx extension for The GPU Memory Book: one author–year label per bibliography entry, used in the text too.

sphinxcontrib-bibtex's default bibliography style ("alpha") labels entries ``[RRRH20]`` while the text cites
``[Rajbhandari et al., 2020]``, and it builds alpha labels from raw LaTeX (``Doll{\\'a}r`` gave ``[GDollarG+17]``).
This extension registers, with pybtex's plugin registry:

* the label style ``book_author_year``: ``Dao, 2023``, ``Ioffe and Szegedy, 2015``, ``Rajbhandari et al.,
  2020``, the names rendered from LaTeX to text; two entries that would get the same label get ``2023a`` and
  ``2023b`` (in the bibliography's order);
* the formatting style ``book`` (``bibtex_default_style``): pybtex's ``unsrt`` with those labels, sorted by
  author (as printed: ``{Hugging Face}`` under H), year and title, and **one link per entry, printed once**: the arXiv id (``eprint``) if there is one,
  else the DOI, else the URL;
* the reference style ``book_label`` (``bibtex_reference_style``): the in-text citation is that same label in
  brackets, several separated by semicolons (``[Ren et al., 2021; Rajbhandari et al., 2021]``), so the text
  and the bibliography cannot disagree.
"""
from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pybtex.plugin
import sphinxcontrib.bibtex.plugin
from pybtex.database import Entry, Person
from pybtex.richtext import Text
from pybtex.style.formatting.unsrt import Style as UnsrtStyle
from pybtex.style.labels import BaseLabelStyle
from pybtex.style.sorting.author_year_title import SortingStyle as AuthorYearTitleSortingStyle
from pybtex.style.template import first_of, optional, sentence
from sphinx.application import Sphinx
from sphinxcontrib.bibtex.style.referencing import BracketStyle
from sphinxcontrib.bibtex.style.referencing.label import LabelReferenceStyle

__all__ = ["AuthorYearLabelStyle", "AuthorYearTitleSorting", "BookReferenceStyle", "BookStyle", "entry_label", "setup"]


def _text(latex: str) -> str:
    """LaTeX (``Doll{\\'a}r``, ``{Hugging Face}``) as plain text (``Dollár``, ``Hugging Face``)."""
    return re.sub(r"\s+", " ", Text.from_latex(latex).render_as("text")).strip()


def _surname(person: Person) -> str:
    return _text(" ".join([*person.prelast_names, *person.last_names]))


def entry_label(entry: Entry) -> str:
    """``Surname, YEAR``, ``A and B, YEAR`` or ``A et al., YEAR`` (authors, else editors; no suffix)."""
    persons = entry.persons.get("author") or entry.persons.get("editor") or []
    real = [p for p in persons if str(p) != "others"]
    if not real:
        who = _text(entry.fields.get("organization", entry.fields.get("title", entry.key)))
    elif len(persons) == 1:
        who = _surname(real[0])
    elif len(persons) == 2 and len(real) == 2:
        who = f"{_surname(real[0])} and {_surname(real[1])}"
    else:
        who = f"{_surname(real[0])} et al."
    return f"{who}, {_text(entry.fields.get('year', 'n.d.'))}"


class AuthorYearLabelStyle(BaseLabelStyle):
    """Author–year labels; equal labels get a, b, … after the year, in the order given."""

    def format_labels(self, sorted_entries: Iterable[Entry]) -> Iterator[str]:
        entries = list(sorted_entries)
        labels = [entry_label(e) for e in entries]
        counts = Counter(labels)
        seen: defaultdict[str, int] = defaultdict(int)
        for label in labels:
            if counts[label] == 1:
                yield label
            else:
                yield label + "abcdefghijklmnopqrstuvwxyz"[seen[label]]
                seen[label] += 1


class AuthorYearTitleSorting(AuthorYearTitleSortingStyle):
    """pybtex's author–year–title order on the names as printed: ``{Hugging Face}`` sorts under H, not after Z."""

    def person_key(self, person: Person) -> str:
        return _text(str(super().person_key(person)))


class BookStyle(UnsrtStyle):
    """pybtex's unsrt with author–year labels, author–year–title order and one link per entry."""

    default_label_style = "book_author_year"
    default_sorting_style = "book_author_year_title"

    def format_web_refs(self, e: Entry) -> Any:
        """The entry's one link: arXiv (``eprint``), else DOI, else URL."""
        return sentence[
            first_of[
                optional[self.format_eprint(e)],
                optional[self.format_doi(e)],
                optional[self.format_url(e)],
            ]
        ]


@dataclass
class BookReferenceStyle(LabelReferenceStyle):
    """In-text citations are the bibliography's labels, ``[A et al., 2020; B and C, 2021]``."""

    bracket_parenthetical: BracketStyle = field(default_factory=lambda: BracketStyle(sep="; "))
    bracket_textual: BracketStyle = field(default_factory=lambda: BracketStyle(sep="; "))
    bracket_label: BracketStyle = field(default_factory=lambda: BracketStyle(sep="; "))


def _register() -> None:
    # Both registries skip a name already registered (a second build in the same process).
    pybtex.plugin.register_plugin("pybtex.style.labels", "book_author_year", AuthorYearLabelStyle)
    pybtex.plugin.register_plugin("pybtex.style.sorting", "book_author_year_title", AuthorYearTitleSorting)
    pybtex.plugin.register_plugin("pybtex.style.formatting", "book", BookStyle)
    sphinxcontrib.bibtex.plugin.register_plugin(
        "sphinxcontrib.bibtex.style.referencing", "book_label", BookReferenceStyle)


def setup(app: Sphinx) -> dict[str, Any]:
    """Register the styles; ``_config.yml`` selects them (``bibtex_default_style``, ``bibtex_reference_style``)."""
    _register()
    return {"parallel_read_safe": True, "parallel_write_safe": True, "version": "1"}
