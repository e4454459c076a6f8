"""Every page of the built book, opened in headless Chromium with the network blocked, renders completely."""
from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest
import yaml
from checker import book_pages, navigation_walk, pages_wider_than, search_finds, static_offline_problems

REPO = Path(__file__).resolve().parents[1]


def test_every_page_renders_offline(book_check) -> None:
    reports, problems = book_check
    kinds = Counter(p.kind for p in problems)
    assert not problems, (f"{len(problems)} problems on {len({p.page for p in problems})} of {len(reports)} pages "
                          f"({dict(kinds)}):\n" + "\n".join(map(str, problems)))


def test_no_untypeset_tex_on_any_page(book_check) -> None:
    """No TeX left as text ("ℝ^{N×d}", "\\frac", "$$") outside code and typeset math, and no MathJax error."""
    _, problems = book_check
    tex = [p for p in problems if p.kind in ("raw-math", "math-error")]
    assert not tex, "\n".join(map(str, tex))


def test_code_wraps_instead_of_scrolling_sideways(book_check) -> None:
    _, problems = book_check
    scrolling = [p for p in problems if p.kind == "code-scroll"]
    assert not scrolling, "\n".join(map(str, scrolling))


def test_every_toc_page_was_checked(book_check, site: Path) -> None:
    reports, _ = book_check
    checked = {r.page for r in reports}
    toc = yaml.safe_load((REPO / "_toc.yml").read_text(encoding="utf-8"))
    files = [toc["root"], *re.findall(r"file:\s*(\S+)", (REPO / "_toc.yml").read_text(encoding="utf-8"))]
    missing = [f for f in files if f"{f}.html" not in checked]
    assert not missing, f"toc pages not built or not checked: {missing}"
    assert checked == set(book_pages(site))


def test_checks_saw_math_widgets_images_and_links(book_check) -> None:
    """Guard against a vacuous pass: the book has typeset formulas, widgets or live calculators, images, links."""
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


def _chapter_page(site: Path) -> str:
    return next(p for p in book_pages(site) if p.startswith("chapters/01_"))


@pytest.mark.parametrize("width", [390, 800])
def test_table_of_contents_opens_and_closes_at_phone_and_tablet_width(site: Path, screenshot_dir: Path,
                                                                       width: int) -> None:
    """Below 992 px the ☰ button opens the book's table of contents (a dialog), Esc or a tap beside it closes
    it, a chapter link in it works; the "Contents" button opens the page's sections; one search control."""
    shot = screenshot_dir / f"toc-open-{width}px.png"
    steps = navigation_walk(site, _chapter_page(site), width, screenshot=shot)
    loaded, opened = steps["loaded"], steps["toc_open"]
    assert loaded["primaryToggles"] == 1 and loaded["secondaryToggles"] == 1, loaded
    assert not loaded["primaryOpen"] and not loaded["primaryLinks"], "the table of contents shows before the click"
    assert opened["primaryOpen"], f"the ☰ button did not open the table of contents at {width} px"
    assert len(opened["primaryLinks"]) >= 5 and any(h.endswith(".html") for h in opened["primaryLinks"]), opened
    for step in ("toc_closed_by_escape", "toc_closed_by_backdrop"):
        assert not steps[step]["primaryOpen"] and not steps[step]["primaryLinks"], f"{step}: still open"
    assert steps["contents_open"]["secondaryOpen"] and steps["contents_open"]["secondaryLinks"], \
        "the Contents button did not open the page's sections"
    assert not steps["contents_closed"]["secondaryOpen"]
    assert len(loaded["searchControls"]) == 1, f"search controls at {width} px: {loaded['searchControls']}"
    assert steps["search_open"]["searchOpen"], "the search control did not open the search box"
    followed = steps.get("followed")
    assert followed and followed["url"].endswith(followed["href"].split("/")[-1]), f"chapter link: {followed}"
    assert shot.is_file() and shot.stat().st_size > 10_000


def test_one_search_box_in_the_desktop_header(site: Path) -> None:
    """At 1400 px the page shows exactly one search box, at the top (no second, empty header bar)."""
    steps = navigation_walk(site, _chapter_page(site), 1400)
    loaded = steps["loaded"]
    assert loaded["headerHeight"] == 0, f"an extra top header bar of {loaded['headerHeight']} px"
    assert len(loaded["searchControls"]) == 1, f"search boxes at 1400 px: {loaded['searchControls']}"
    assert loaded["searchControls"][0]["top"] < 150, f"the search box is not at the top: {loaded['searchControls']}"
    assert steps["search_open"]["searchOpen"], "the search box did not open the search dialog"


def test_no_page_scrolls_sideways_at_phone_width(site: Path) -> None:
    """At 390 px every page fits the screen: code wraps, long inline code and URLs break, wide formulas and
    tables scroll inside their own box."""
    problems = pages_wider_than(site, book_pages(site), 390)
    assert not problems, "\n".join(map(str, problems))


def _report(book_check, prefix: str):
    reports, _ = book_check
    found = [r for r in reports if r.page.startswith(prefix)]
    assert found, f"no page {prefix}* was checked"
    return found[0]


def _table(report, caption_part: str) -> dict:
    tables = [t for t in report.tables if caption_part in t["caption"]]
    assert len(tables) == 1, (f"{report.page}: want one <table> captioned …{caption_part}…; captions: "
                              f"{[t['caption'] for t in report.tables]}")
    return tables[0]


def test_zero_table_1_is_an_html_table(book_check) -> None:
    """Chapter 6 shows the ZeRO paper's Table 1 as a real <table>: the 54 cells memlib recomputes, in place."""
    import sys
    sys.path.insert(0, str(REPO))
    from memlib._book.ch06_zero_fsdp import TABLE1_DP, TABLE1_PARAMS, table1

    t = _table(_report(book_check, "chapters/06_"), "Table 1")
    assert t["reference"]
    assert t["header"] == ["DP"] + ["P_os", "P_os+g", "P_os+g+p"] * 3
    by = {(c.params, c.dp, c.stage): c for c in table1()}
    want = [[str(dp)] + [f"{by[p, dp, s].printed}{'✓' if by[p, dp, s].fits_v100 else ''}"
                         for p in TABLE1_PARAMS for s in (1, 2, 3)] for dp in TABLE1_DP]
    assert t["rows"] == want


def test_gpu_table_is_an_html_table(book_check) -> None:
    """Chapter 12's GPU peaks are a real <table>: one row per GPU of memlib.core.hardware, every column present."""
    import sys
    sys.path.insert(0, str(REPO))
    from memlib import GiB
    from memlib.core.hardware import GPUS

    t = _table(_report(book_check, "chapters/12_"), "GPU peaks")
    assert t["reference"]
    assert t["header"] == ["GPU", "architecture", "bf16", "fp16", "tf32", "fp32", "fp8", "sparse*", "memory (GiB)",
                           "GB/s", "ridge (FLOP/B)", "NVLink GB/s", "PCIe"]
    assert [r[0] for r in t["rows"]] == [g.full_name for g in GPUS.values()]
    assert [r[8] for r in t["rows"]] == [f"{g.memory_bytes / GiB:.0f}" for g in GPUS.values()]
    assert [r[12] for r in t["rows"]] == [f"Gen{g.pcie_gen}" for g in GPUS.values()]
    assert all(len(r) == 13 for r in t["rows"])


@pytest.mark.parametrize(("prefix", "caption_part", "first_header"), [
    ("chapters/01_", "estimate vs the traced peak", "model"),
    ("chapters/13_", "The ladder taken to its end", "rung"),
    ("chapters/12_", "Llama-2-7B's operations at 4096 tokens", "op"),
    ("drills/01_", "The question bank", "chapter"),
    ("drills/02_", "The kinds of numeric drill", "kind"),
])
def test_other_reference_tables_are_html_tables(book_check, prefix: str, caption_part: str,
                                                first_header: str) -> None:
    t = _table(_report(book_check, prefix), caption_part)
    assert t["reference"] and t["header"][0] == first_header and len(t["rows"]) >= 4


def test_reference_tables_have_caption_header_aligned_numbers_and_scroll(book_check) -> None:
    """Every table.memlib-table: a caption, a <thead>, right-aligned numbers, a box that scrolls sideways."""
    reports, problems = book_check
    bad = [p for p in problems if p.kind == "table"]
    assert not bad, "\n".join(map(str, bad))
    assert sum(t["reference"] for r in reports for t in r.tables) >= 6


def test_every_figure_is_numbered_captioned_and_described(book_check) -> None:
    """Every matplotlib figure of a cell output sits in a <figure> whose caption starts "Fig. N", and its alt text
    describes it (not the image's hash file name)."""
    reports, problems = book_check
    bad = [p for p in problems if p.kind == "figure"]
    assert not bad, f"{len(bad)} figures:\n" + "\n".join(map(str, bad))
    figures = [f for r in reports for f in r.figures]
    assert len(figures) >= 30, f"only {len(figures)} figures seen in cell outputs"
    assert len({f["id"] for f in figures}) == len(figures), "two figures share an id"


def test_every_chapter_links_its_terms_to_the_glossary(book_check) -> None:
    """Each chapter links the first use of at least five glossary terms ({term}), and every such link resolves
    (the link check of test_every_page_renders_offline covers the anchors)."""
    reports, _ = book_check
    chapters = [r for r in reports if re.match(r"chapters/\d\d_", r.page)]
    assert len(chapters) >= 15
    few = {r.page: n for r in chapters if (n := len({u for u in r.links if "glossary.html#term-" in u})) < 5}
    assert not few, f"chapters with fewer than 5 glossary links: {few}"
