"""The whole-book PDF (tools/build_pdf.py, run by README.md's build command): it exists, it is the whole book,
and the answers are printed open."""
from __future__ import annotations

import html
import os
import re
import sys
import unicodedata
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))

import build_pdf  # noqa: E402

PDF = Path(os.environ.get("BOOK_PDF", build_pdf.PDF))
SINGLE_PAGE = build_pdf.SINGLE / "intro.html"
_ANSWER = re.compile(r'(?s)<div class="sd-summary-content[^"]*">\s*<p[^>]*>(.*?)</p>')


def _squash(text: str) -> str:
    """Compare text without whitespace or ligatures (the PDF breaks lines and sets "ﬁ" for "fi")."""
    return "".join(unicodedata.normalize("NFKC", text).split())


@pytest.fixture(scope="module")
def pdf() -> Path:
    if not PDF.is_file():
        pytest.fail(f"no {PDF}: run README.md's build command (it ends with python tools/build_pdf.py)")
    return PDF


@pytest.fixture(scope="module")
def pdf_text(pdf: Path) -> str:
    return _squash("".join(build_pdf.pdf_text(pdf)))


def test_pdf_is_the_whole_book(pdf: Path) -> None:
    pages = build_pdf.count_pages(pdf)
    assert pages > 100, f"{pdf} has {pages} pages; the whole book has about 300"
    assert pdf.read_bytes().startswith(b"%PDF-")


def test_pdf_prints_every_answer_open(pdf_text: str) -> None:
    """The first words of every answer dropdown (as the single-page build has them) are in the PDF's text."""
    if not SINGLE_PAGE.is_file():
        pytest.fail(f"no {SINGLE_PAGE}: tools/build_pdf.py prints the single-page build from there")
    answers = []
    for body in _ANSWER.findall(SINGLE_PAGE.read_text(encoding="utf-8")):
        if "math" in body or "<img" in body:  # typeset math has no plain text to compare
            continue
        words = _squash(html.unescape(re.sub(r"<[^>]+>", "", body)))[:40]
        if len(words) >= 20:
            answers.append(words)
    assert len(answers) >= 100, f"only {len(answers)} answers found in {SINGLE_PAGE}"
    missing = [a for a in answers if a not in pdf_text]
    assert not missing, f"{len(missing)} of {len(answers)} answers are not in the PDF, e.g. {missing[:3]}"


def test_pdf_has_no_link_to_the_print_server(pdf: Path) -> None:
    """Links to the temporary local server the page was printed from would be dead in the PDF."""
    assert not re.search(rb"/URI \(http://(127\.0\.0\.1|localhost)", pdf.read_bytes())
