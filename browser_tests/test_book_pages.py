"""Every page of the built book, opened in headless Chromium with the network blocked, renders completely."""
from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import yaml
from checker import book_pages, search_finds, static_offline_problems

REPO = Path(__file__).resolve().parents[1]


def test_every_page_renders_offline(book_check) -> None:
    reports, problems = book_check
    kinds = Counter(p.kind for p in problems)
    assert not problems, (f"{len(problems)} problems on {len({p.page for p in problems})} of {len(reports)} pages "
                          f"({dict(kinds)}):\n" + "\n".join(map(str, problems)))


def test_every_toc_page_was_checked(book_check, site: Path) -> None:
    reports, _ = book_check
    checked = {r.page for r in reports}
    toc = yaml.safe_load((REPO / "_toc.yml").read_text(encoding="utf-8"))
    files = [toc["root"], *re.findall(r"file:\s*(\S+)", (REPO / "_toc.yml").read_text(encoding="utf-8"))]
    missing = [f for f in files if f"{f}.html" not in checked]
    assert not missing, f"toc pages not built or not checked: {missing}"
    assert checked == set(book_pages(site))


def test_checks_saw_math_widgets_images_and_links(book_check) -> None:
    """Guard against a vacuous pass: the book has typeset formulas, rendered widgets, images and links."""
    reports, _ = book_check
    assert sum(r.math for r in reports) > 0
    assert sum(r.widgets for r in reports) > 0
    assert sum(r.images for r in reports) > 0
    assert sum(len(r.links) for r in reports) > 100


def test_screenshots_of_intro_and_chapter_1(book_check, screenshot_dir: Path) -> None:
    for name in ("intro.png", "chapter01.png"):
        shot = screenshot_dir / name
        assert shot.is_file() and shot.stat().st_size > 10_000, f"{shot}: missing or blank"
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_no_page_loads_anything_from_a_cdn(site: Path) -> None:
    """The issue's grep (cdn|unpkg|jsdelivr) and any script/stylesheet/image URL on another host, in the HTML."""
    problems = static_offline_problems(site)
    assert not problems, "\n".join(map(str, problems))


def test_search_page_finds_a_word(site: Path) -> None:
    assert (site / "searchindex.js").is_file()
    assert search_finds(site, "activation") > 0
    assert search_finds(site, "zzqxjvk") == 0
