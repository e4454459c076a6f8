"""The checker itself: a deliberately broken page must fail it in every way it checks; a sound page passes."""
from __future__ import annotations

import base64
import shutil
from collections import defaultdict
from pathlib import Path

import pytest
from checker import check_site, static_offline_problems

REPO = Path(__file__).resolve().parents[1]
MATHJAX = REPO / "vendor" / "site" / "vendor" / "mathjax"
# A 1x1 PNG.
PNG = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==")

GOOD = """<!DOCTYPE html><html><head><meta charset="utf-8"><title>good</title>
<script>window.MathJax = {tex: {inlineMath: [['\\\\(', '\\\\)']]}};</script>
<script defer src="vendor/mathjax/tex-chtml.js"></script></head><body>
<h1 id="top">Good</h1>
<p>Inline <span class="math notranslate nohighlight">\\(E = mc^2\\)</span> and an image <img src="dot.png" alt="dot">.</p>
<div class="math notranslate nohighlight">\\[\\sum_i x_i\\]</div>
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
<div class="cell_output"><script type="application/vnd.jupyter.widget-view+json">
{"model_id": "abc", "version_major": 2, "version_minor": 0}</script></div>
<p><a href="nowhere.html">dead link</a> <a href="other.html#no-such-anchor">dead anchor</a></p>
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
    ("widget", "empty"),                            # a widget view nobody rendered
    ("link", "nowhere.html -> HTTP 404"),
    ("link", "no-such-anchor"),
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
    assert reports[0].math == 2 and reports[0].images == 1 and len(reports[0].links) == 2  # local links only
    assert static_offline_problems(root) == []
