"""Reference tables as real HTML: a caption, a header, right-aligned numbers, scrolling in their own box.

The book's notebooks used to ``print`` their reference tables (the ZeRO paper's Table 1, the GPU peaks, the
planner's ladder) in a monospace font; on the web page the columns wrapped or were cut at the column's width.
:func:`html_table` returns the same cells as a ``<table>`` with ``<caption>``, ``<thead>`` and ``<tbody>``, inside
a ``<div class="memlib-table-wrap">`` that scrolls sideways on a phone (``_static/book.css``). A notebook shows
it with ``display(HTML(html_table(...)))``; nbval compares the stored ``text/html`` like any other output.

Pure stdlib; the cells are the strings the notebook formats (numbers are computed there, never typed here).
"""
from __future__ import annotations

import html
import re
from collections.abc import Sequence

from memlib.core.errors import MemlibError

__all__ = ["html_table", "is_numeric_cell"]

# A number as the book prints it: optional sign, digits with thousands commas and a decimal point, then an
# optional unit or mark ("%", "GB", "GiB", "MiB", "KiB", "×", "✓", "s"); "—" or "" stands for "no value".
_NUMBER = re.compile(r"^[−+\-]?\d[\d,]*(\.\d+)?\s*(%|×|✓|[KMGT]i?B|[KMGT]B/s|s|ms)?$")
_EMPTY = ("", "—", "-")


def is_numeric_cell(text: str) -> bool:
    """Whether a cell's text reads as a number (with an optional unit or ✓), so it is right-aligned.

    Args:
        text: The cell as displayed, e.g. ``"41.3"``, ``"1,024"``, ``"-13.0%"``, ``"30✓"``, ``"541.09 GB"``.

    Returns:
        True for a number with an optional unit or mark, False for words and for empty cells.
    """
    return bool(_NUMBER.match(text.strip()))


def _alignments(header: Sequence[str], rows: Sequence[Sequence[str]], align: str | None) -> str:
    if align is not None:
        if len(align) != len(header) or set(align) - {"l", "r", "c"}:
            raise MemlibError(f"align={align!r}: give one of 'l', 'r', 'c' per column ({len(header)} columns)")
        return align
    out = []
    for j in range(len(header)):
        cells = [r[j].strip() for r in rows if r[j].strip() not in _EMPTY]
        out.append("r" if cells and all(is_numeric_cell(c) for c in cells) else "l")
    return "".join(out)


def html_table(header: Sequence[str], rows: Sequence[Sequence[object]], *, caption: str,
               align: str | None = None, groups: Sequence[tuple[str, int]] | None = None,
               row_headers: bool = True, notes: str | None = None) -> str:
    """One reference table as HTML (escaped text; numbers right-aligned).

    Args:
        header: The column headings.
        rows: The cells, one sequence per row, each as long as ``header``; cells are shown with ``str()``.
        caption: What the table shows (the ``<caption>``; required: every reference table says what it is).
        align: One letter per column, ``l``/``r``/``c``; by default a column whose non-empty cells are all
            numbers (:func:`is_numeric_cell`) is right-aligned, any other left-aligned.
        groups: An optional first header row of ``(label, span)`` pairs spanning the columns (spans add up to
            the number of columns), e.g. ``[("", 1), ("7.5B", 3), ("128B", 3)]``.
        row_headers: Whether each row's first cell is its heading (``<th scope="row">``).
        notes: An optional line under the table (units, marks), shown in a ``<tfoot>``.

    Returns:
        The HTML text: ``<div class="memlib-table-wrap"><table class="memlib-table">…</table></div>``.

    Raises:
        MemlibError: a row whose length is not the header's, spans that do not add up, or a bad ``align``.
    """
    ncol = len(header)
    if ncol == 0:
        raise MemlibError("header=[]: give at least one column")
    cells = [[str(c) for c in row] for row in rows]
    for i, row in enumerate(cells):
        if len(row) != ncol:
            raise MemlibError(f"row {i} has {len(row)} cells: give {ncol}, one per column of the header")
    if groups is not None and sum(span for _, span in groups) != ncol:
        raise MemlibError(f"groups={list(groups)!r}: spans add up to {sum(s for _, s in groups)}, "
                          f"give spans adding up to {ncol}")
    aligns = _alignments(header, cells, align)
    cls = {"l": "", "r": ' class="num"', "c": ' class="center"'}
    esc = html.escape
    lines = ['<div class="memlib-table-wrap">', '<table class="memlib-table">', f"<caption>{esc(caption)}</caption>",
             "<thead>"]
    if groups is not None:
        lines.append("<tr>" + "".join(f'<th colspan="{span}" scope="colgroup" class="group">{esc(label)}</th>'
                                      if span > 1 else f"<th>{esc(label)}</th>" for label, span in groups) + "</tr>")
    lines.append("<tr>" + "".join(f'<th scope="col"{cls[a]}>{esc(h)}</th>' for h, a in zip(header, aligns)) + "</tr>")
    lines += ["</thead>", "<tbody>"]
    for row in cells:
        tds = []
        for j, (c, a) in enumerate(zip(row, aligns)):
            tag = "th" if row_headers and j == 0 else "td"
            scope = ' scope="row"' if tag == "th" else ""
            tds.append(f"<{tag}{scope}{cls[a]}>{esc(c)}</{tag}>")
        lines.append("<tr>" + "".join(tds) + "</tr>")
    lines.append("</tbody>")
    if notes:
        lines.append(f'<tfoot><tr><td colspan="{ncol}">{esc(notes)}</td></tr></tfoot>')
    lines += ["</table>", "</div>"]
    return "\n".join(lines)
