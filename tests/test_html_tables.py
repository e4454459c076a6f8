"""memlib.viz.html_tables: reference tables as HTML (caption, header, right-aligned numbers, escaped text)."""
from __future__ import annotations

import re
from html.parser import HTMLParser

import pytest
from hypothesis import given
from hypothesis import strategies as st

from memlib.core.errors import MemlibError
from memlib.viz.html_tables import html_table, is_numeric_cell


class _Cells(HTMLParser):
    """Collects (tag, attrs, text) for every th/td and the caption, in document order."""

    def __init__(self) -> None:
        super().__init__()
        self.cells: list[tuple[str, dict[str, str | None], str]] = []
        self._open: tuple[str, dict[str, str | None]] | None = None
        self._text: list[str] = []
        self.tags: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        if tag in ("th", "td", "caption"):
            self._open, self._text = (tag, dict(attrs)), []

    def handle_data(self, data: str) -> None:
        if self._open:
            self._text.append(data)

    def handle_endtag(self, tag: str) -> None:
        if self._open and tag == self._open[0]:
            self.cells.append((tag, self._open[1], "".join(self._text)))
            self._open = None


def _parse(text: str) -> _Cells:
    p = _Cells()
    p.feed(text)
    return p


def test_structure_caption_header_rows() -> None:
    out = html_table(["GPU", "memory (GiB)"], [["H100", "80"], ["A100", "40"]], caption="GPU peaks")
    p = _parse(out)
    assert p.tags[:3] == ["div", "table", "caption"]
    assert out.startswith('<div class="memlib-table-wrap">') and out.endswith("</div>")
    assert ["thead", "tbody"] == [t for t in p.tags if t in ("thead", "tbody")]
    assert p.cells[0] == ("caption", {}, "GPU peaks")
    assert [c[2] for c in p.cells[1:3]] == ["GPU", "memory (GiB)"]
    body = p.cells[3:]
    assert [(c[0], c[2]) for c in body] == [("th", "H100"), ("td", "80"), ("th", "A100"), ("td", "40")]
    assert body[0][1].get("scope") == "row"


def test_numeric_columns_are_right_aligned_words_left() -> None:
    out = html_table(["model", "saved", "peak"], [["gpt2", "-13.0%", "10.10 GB"], ["llama", "—", "1,024"]],
                     caption="c")
    p = _parse(out)
    header = {c[2]: c[1].get("class") for c in p.cells[1:4]}
    assert header == {"model": None, "saved": "num", "peak": "num"}


def test_explicit_alignment_and_its_errors() -> None:
    p = _parse(html_table(["a", "b"], [["1", "x"]], caption="c", align="lc", row_headers=False))
    assert [c[1].get("class") for c in p.cells[1:]] == [None, "center", None, "center"]
    assert [c[0] for c in p.cells[3:]] == ["td", "td"]
    with pytest.raises(MemlibError, match="align='lx'"):
        html_table(["a", "b"], [["1", "x"]], caption="c", align="lx")
    with pytest.raises(MemlibError, match="align='l'"):
        html_table(["a", "b"], [["1", "x"]], caption="c", align="l")


def test_groups_span_the_columns() -> None:
    out = html_table(["DP", "a", "b", "c"], [["1", "2", "3", "4"]], caption="c", groups=[("", 1), ("7.5B", 3)])
    assert '<th colspan="3" scope="colgroup" class="group">7.5B</th>' in out
    with pytest.raises(MemlibError, match="spans add up to 3"):
        html_table(["DP", "a", "b", "c"], [["1", "2", "3", "4"]], caption="c", groups=[("", 1), ("x", 2)])


def test_bad_rows_and_empty_header() -> None:
    with pytest.raises(MemlibError, match="row 1 has 1 cells: give 2"):
        html_table(["a", "b"], [["1", "2"], ["3"]], caption="c")
    with pytest.raises(MemlibError, match="header"):
        html_table([], [], caption="c")


def test_notes_in_a_footer() -> None:
    out = html_table(["a"], [["1"]], caption="c", notes="✓ = fits")
    assert '<tfoot><tr><td colspan="1">✓ = fits</td></tr></tfoot>' in out


@pytest.mark.parametrize("text", ["41.3", "1,024", "-13.0%", "−2", "30✓", "541.09 GB", "1.5 GiB", "0.53 s",
                                  "3350 GB/s", "2×"])
def test_numbers_read_as_numbers(text: str) -> None:
    assert is_numeric_cell(text)


@pytest.mark.parametrize("text", ["", "—", "H100", "ZeRO-2", "P_os+g", "fp32 baseline", "1.2.3", "x 1"])
def test_words_do_not(text: str) -> None:
    assert not is_numeric_cell(text)


@given(st.lists(st.lists(st.text(max_size=12), min_size=3, max_size=3), max_size=5),
       st.lists(st.text(max_size=12), min_size=3, max_size=3), st.text(max_size=20))
def test_any_text_is_escaped_and_round_trips(rows: list[list[str]], header: list[str], caption: str) -> None:
    """Whatever the cells hold (<, &, quotes), the parsed table gives back exactly the cells, in order."""
    p = _parse(html_table(header, rows, caption=caption))
    texts = [c[2] for c in p.cells]
    assert texts == [caption, *header, *(c for r in rows for c in r)]
    assert not re.search(r"<(?!/?(div|table|caption|thead|tbody|tfoot|tr|th|td)\b)", html_table(header, rows,
                                                                                              caption=caption))
