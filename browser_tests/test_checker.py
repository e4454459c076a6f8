"""The checker itself: a deliberately broken page must fail it in every way it checks; a sound page passes."""
from __future__ import annotations

import base64
import shutil
from collections import defaultdict
from pathlib import Path

import pytest
from checker import check_site, navigation_walk, pages_wider_than, static_offline_problems

REPO = Path(__file__).resolve().parents[1]
MATHJAX = REPO / "vendor" / "site" / "vendor" / "mathjax"
# A 1x1 PNG.
PNG = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==")

GOOD = """<!DOCTYPE html><html><head><meta charset="utf-8"><title>good</title>
<script>window.MathJax = {tex: {inlineMath: [['\\\\(', '\\\\)']]}};</script>
<script defer src="vendor/mathjax/tex-chtml.js"></script></head><body>
<h1 id="top">Good</h1>
<p>Inline <span class="math notranslate nohighlight">\\(E = mc^2\\)</span> and an image <img src="dot.png" alt="dot">.</p>
<figure id="fig-dot"><div class="cell_output"><img src="dot.png" alt="One black dot on a white square, one pixel wide"></div>
<figcaption><p><span class="caption-number">Fig. 1.2 </span><span class="caption-text">A dot.</span></p></figcaption></figure>
<div class="memlib-table-wrap" style="overflow-x: auto"><table class="memlib-table"><caption>Sizes</caption>
<thead><tr><th scope="col">model</th><th scope="col" class="num" style="text-align: right">GB</th></tr></thead>
<tbody><tr><th scope="row">gpt2</th><td class="num" style="text-align: right">10.10</td></tr></tbody></table></div>
<div class="math notranslate nohighlight">\\[\\sum_i x_i\\]</div>
<div class="highlight"><pre>x_{i} = a^{2} / \\frac  # TeX-like text inside code is code, not an untypeset formula</pre></div>
<p><a href="other.html#part">same site, existing anchor</a> <a href="#top">top</a>
<a href="https://example.org/paper.pdf">a paper (a hyperlink, never fetched)</a></p>
</body></html>"""

OTHER = """<!DOCTYPE html><html><head><meta charset="utf-8"><title>other</title></head>
<body><h2 id="part">Part</h2></body></html>"""

BROKEN = """<!DOCTYPE html><html><head><meta charset="utf-8"><title>broken</title>
<script src="https://cdn.jsdelivr.net/npm/mathjax@3/es5/tex-mml-chtml.js"></script></head><body>
<p>Missing image <img src="missing.png" alt="missing"> and an external one
<img src="https://example.com/logo.png" alt="external">.</p>
<p>Raw display math $$x^2$$ and inline <span class="math notranslate nohighlight">\\(y\\)</span>.</p>
<p>Untypeset Q ∈ ℝ^{N×d}, then P_{ij} = \\frac{a}{b}.</p>
<div class="highlight"><pre>long_line = "LONG_LINE_THAT_DOES_NOT_WRAP_________________________________________________________________________________________________________________________________________________________________"</pre></div>
<div class="cell_output"><script type="application/vnd.jupyter.widget-view+json">
{"model_id": "abc", "version_major": 2, "version_minor": 0}</script></div>
<p><a href="nowhere.html">dead link</a> <a href="other.html#no-such-anchor">dead anchor</a></p>
<div class="cell_output"><img src="0f3a9c2e8b7d6a5f4e3d2c1b0a9f8e7d6c5b4a3f2e1d0c9b8a7f6e5d4c3b2a1f.png"
 alt="0f3a9c2e8b7d6a5f4e3d2c1b0a9f8e7d6c5b4a3f2e1d0c9b8a7f6e5d4c3b2a1f.png"></div>
<figure id="fig-nonumber"><div class="cell_output"><img src="dot.png" alt="A dot plot of nothing in particular, drawn small"></div>
<figcaption><p>A caption without its number</p></figcaption></figure>
<table class="memlib-table"><tr><td class="num">1</td></tr></table>
<script>console.error("boom from the fixture"); undefinedFunctionCall();</script>
</body></html>"""


def _site(tmp_path: Path, pages: dict[str, str]) -> Path:
    root = tmp_path / "html"
    root.mkdir()
    for name, html in pages.items():
        (root / name).write_text(html, encoding="utf-8")
    (root / "dot.png").write_bytes(PNG)
    return root


@pytest.fixture(scope="module")
def broken(tmp_path_factory: pytest.TempPathFactory):
    root = _site(tmp_path_factory.mktemp("broken"), {"broken.html": BROKEN, "other.html": OTHER})
    reports, problems = check_site(root, ["broken.html"], widget_timeout_ms=2000)
    by_kind: dict[str, list[str]] = defaultdict(list)
    for p in problems:
        assert p.page == "broken.html"
        by_kind[p.kind].append(p.detail)
    return root, by_kind


@pytest.mark.parametrize(("kind", "needle"), [
    ("blocked-request", "cdn.jsdelivr.net"),        # a CDN script, with the network blocked
    ("blocked-request", "example.com/logo.png"),    # an external image
    ("failed-request", "missing.png"),              # a local 404
    ("console-error", "boom from the fixture"),
    ("page-error", "undefinedFunctionCall"),
    ("image", "missing.png"),
    ("raw-math", "$$x^2$$"),                        # TeX left as text
    ("raw-math", ".math elements have no MathJax output"),
    ("raw-math", "ℝ^{N×d}"),                        # a TeX superscript left as text (chapter 10's old prose)
    ("raw-math", "P_{ij}"),                         # a subscript with braces
    ("raw-math", "\\\\frac{a}{b}"),                   # a TeX command (JSON-quoted in the report)
    ("code-scroll", "LONG_LINE_THAT_DOES_NOT_WRAP"),  # a code block that scrolls sideways
    ("widget", "empty"),                            # a widget view nobody rendered
    ("link", "nowhere.html -> HTTP 404"),
    ("link", "no-such-anchor"),
    ("figure", "not in a numbered, captioned figure"),  # a bare matplotlib image (the book before captions)
    ("figure", "alt text is not a description"),       # alt = the hash file name myst-nb writes
    ("figure", "caption without a number"),
    ("table", "no caption"),                            # a reference table without <caption>, <thead> …
    ("table", "no <thead>"),
    ("table", "not in a box that scrolls sideways"),
    ("table", "not right-aligned"),
])
def test_broken_page_fails_the_checker(broken, kind: str, needle: str) -> None:
    _, by_kind = broken
    assert any(needle in d for d in by_kind[kind]), f"{kind} {needle!r} not reported; got {dict(by_kind)}"


def test_broken_page_fails_the_static_check(broken) -> None:
    root, _ = broken
    kinds = {(p.kind, p.detail.split("/")[2]) for p in static_offline_problems(root)}
    assert ("remote-asset", "cdn.jsdelivr.net") in kinds and ("remote-asset", "example.com") in kinds


def test_sound_page_passes_with_self_hosted_mathjax(tmp_path: Path) -> None:
    root = _site(tmp_path, {"good.html": GOOD, "other.html": OTHER})
    shutil.copytree(MATHJAX, root / "vendor" / "mathjax")
    reports, problems = check_site(root, ["good.html"])
    assert problems == []
    assert reports[0].math == 2 and reports[0].images == 2 and len(reports[0].links) == 2  # local links only
    assert reports[0].figures == [{"src": "dot.png", "alt": "One black dot on a white square, one pixel wide",
                                   "caption": "Fig. 1.2 A dot.", "id": "fig-dot"}]
    assert reports[0].tables == [{"caption": "Sizes", "header": ["model", "GB"], "rows": [["gpt2", "10.10"]],
                                  "reference": True}]
    assert static_offline_problems(root) == []


# A ☰ button nobody wired (what the theme's extra header left below 992 px), and a page wider than a phone.
DEAD_MENU = """<!DOCTYPE html><html><head><meta charset="utf-8"><title>dead menu</title></head><body>
<button class="primary-toggle">menu</button><button class="search-button">search</button>
<dialog id="pst-primary-sidebar-modal"><nav><ul><li class="toctree-l1"><a href="other.html">Other</a></li></ul></nav></dialog>
<main class="bd-main"><p><code>""" + "x" * 200 + """</code></p></main></body></html>"""


def test_dead_menu_and_wide_page_are_seen(tmp_path: Path) -> None:
    root = _site(tmp_path, {"dead.html": DEAD_MENU, "other.html": OTHER})
    steps = navigation_walk(root, "dead.html", 390)
    assert steps["loaded"]["primaryToggles"] == 1 and len(steps["loaded"]["searchControls"]) == 1
    assert not steps["toc_open"]["primaryOpen"] and not steps["toc_open"]["primaryLinks"]
    assert not steps["search_open"]["searchOpen"] and "followed" not in steps
    problems = pages_wider_than(root, ["dead.html", "other.html"], 390)
    assert [p.page for p in problems] == ["dead.html"] and "xxxxxxxx" in problems[0].detail, problems
