"""Sphinx extension for The GPU Memory Book: the ".pdf" download button links to the whole-book PDF.

sphinx-book-theme's download menu has a ".pdf" entry that only runs ``window.print()`` on the current page
(one chapter, cut at the right edge, answers collapsed). The book has a real PDF instead, printed by
``tools/build_pdf.py`` from a single-page build into ``_build/pdf/book.pdf`` and copied next to the HTML
(``_build/html/book.pdf``). This extension turns that menu entry into a link to it; the ``.ipynb`` and
source downloads stay as they are.
"""
from __future__ import annotations

from typing import Any

from sphinx.application import Sphinx

__all__ = ["PDF_NAME", "setup"]

PDF_NAME = "book.pdf"  # at the root of the HTML output, written by tools/build_pdf.py
_LABEL = "download-pdf-button"


def _link_whole_book_pdf(app: Sphinx, pagename: str, templatename: str, context: dict, doctree: Any) -> None:
    groups = [b for b in context.get("header_buttons") or () if b.get("type") == "group"]
    for group in groups:
        buttons = group.get("buttons") or []
        for i, button in enumerate(buttons):
            if button.get("label") == _LABEL:
                buttons[i] = {
                    "type": "link",
                    "url": context["pathto"](PDF_NAME, 1),
                    "text": ".pdf",
                    "tooltip": "Download the whole book as one PDF",
                    "icon": "fas fa-file-pdf",
                    "label": _LABEL,
                }


def setup(app: Sphinx) -> dict[str, Any]:
    """Run after sphinx-book-theme has added its header buttons (priority 501)."""
    app.connect("html-page-context", _link_whole_book_pdf, priority=600)
    return {"parallel_read_safe": True, "parallel_write_safe": True, "version": "1"}
