"""Fixtures for the real-browser test: where the built book is, and one offline check of all its pages."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from checker import PageReport, Problem, book_pages, check_site  # noqa: E402

REPO = HERE.parent


@pytest.fixture(scope="session")
def site() -> Path:
    root = Path(os.environ.get("BOOK_HTML", REPO / "_build" / "html")).resolve()
    if not (root / "index.html").is_file():
        pytest.fail(f"no built book at {root}: run the book build first (or set BOOK_HTML)")
    return root


@pytest.fixture(scope="session")
def screenshot_dir(site: Path) -> Path:
    return site.parent / "screenshots"


@pytest.fixture(scope="session")
def book_check(site: Path, screenshot_dir: Path) -> tuple[list[PageReport], list[Problem]]:
    pages = book_pages(site)
    chapter1 = next((p for p in pages if p.startswith("chapters/01_")), None)
    shots = {"intro.html": screenshot_dir / "intro.png"}
    if chapter1:
        shots[chapter1] = screenshot_dir / "chapter01.png"
    return check_site(site, pages, screenshots=shots)
