"""Open every page of a built book in headless Chromium, offline, and list what a reader would see broken.

The site is served from a local HTTP server; the browser (Debian's ``chromium``, driven by Playwright, no
browser download) may reach nothing else: every other request is aborted and counted as a problem. For every
page the checker reports:

* ``blocked-request`` — any attempt to reach a host other than the local server (CDN, fonts, analytics);
* ``failed-request`` — a local request that failed or answered HTTP >= 400 (a missing script, font, image);
* ``console-error`` / ``page-error`` — a console error message or an uncaught JavaScript exception;
* ``image`` — an ``<img>`` that did not load (``naturalWidth == 0``);
* ``raw-math`` / ``math-error`` — formula text left untypeset (``$$``, ``\\(``, ``\\[``, ``\\begin{``, ``^{``,
  ``_{``, ``\\frac`` and other TeX commands in the text outside code and math, or a ``.math`` element without
  MathJax output) or a MathJax TeX error box;
* ``code-scroll`` — a code cell or output (``div.highlight pre``) that scrolls sideways instead of wrapping;
* ``widget`` — an ipywidgets view that rendered nothing (empty or zero-height container);
* ``link`` — an internal link whose page does not answer HTTP 200, or whose ``#anchor`` is not on that page;
* ``figure`` — an image in a notebook cell's output (a matplotlib figure) that is not in a ``<figure>`` with a
  numbered caption ("Fig. 3.2 …"), or whose alt text is missing, its file name or a hash;
* ``table`` — a reference table (``table.memlib-table``) without ``<caption>`` or ``<thead>``, with a numeric
  column not right-aligned, or not inside a box that scrolls sideways (``overflow-x: auto``).

Usage: ``python browser_tests/checker.py _build/html`` (exit status 1 when anything is wrong).
"""
from __future__ import annotations

import functools
import http.server
import re
import shutil
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["CHROMIUM", "CHROMIUM_ARGS", "Problem", "PageReport", "book_pages", "check_site", "figure_problems",
           "navigation_walk", "pages_wider_than", "search_finds", "serve", "static_offline_problems"]

CHROMIUM = "/usr/bin/chromium"  # Debian's package (apt-get install -y chromium); never a downloaded browser
CHROMIUM_ARGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    # Belt and braces under the request router: names other than the local server do not resolve.
    "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1, EXCLUDE localhost",
)
SKIP_DIRS = ("_static", "_sources", "_images", "vendor", "jupyter_execute")
# TeX a reader should never see as text: delimiters, scripts with braces ("ℝ^{N×d}", "S_{ij}") and commands.
RAW_MATH = ("$$", "\\(", "\\[", "\\begin{", "^{", "_{", "\\frac", "\\sqrt", "\\sum", "\\mathbb", "\\mathrm",
            "\\text{", "\\ell", "\\times", "\\cdot", "\\le ", "\\lceil")
PAGE_TIMEOUT_MS = 30_000
WIDGET_TIMEOUT_MS = 15_000


@dataclass(frozen=True)
class Problem:
    """One thing broken on one page."""

    page: str
    kind: str
    detail: str

    def __str__(self) -> str:
        return f"{self.page}: [{self.kind}] {self.detail}"


@dataclass
class PageReport:
    """What the checker saw on one page."""

    page: str
    problems: list[Problem] = field(default_factory=list)
    links: set[str] = field(default_factory=set)  # absolute local URLs (with fragment) found on the page
    images: int = 0
    math: int = 0
    widgets: int = 0  # rendered ipywidgets views plus live calculators (.memlib-live)
    tables: list[dict] = field(default_factory=list)   # every <table>: caption, header, rows (cell texts)
    figures: list[dict] = field(default_factory=list)  # every image in a cell output: alt, caption, id
    seconds: float = 0.0


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (stdlib signature)
        pass


@contextmanager
def serve(root: Path) -> Iterator[str]:
    """Serve ``root`` on 127.0.0.1 (free port) in a thread; yield the base URL ending in '/'."""
    handler = functools.partial(_QuietHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def book_pages(root: Path) -> list[str]:
    """Every built HTML page (relative POSIX paths), leaving out assets and vendored files."""
    pages = []
    for path in sorted(root.rglob("*.html")):
        rel = path.relative_to(root)
        if rel.parts[0] not in SKIP_DIRS:
            pages.append(rel.as_posix())
    return pages


# JavaScript run in the page once it has loaded.
_SETTLE_JS = """async (widgetTimeout) => {
  // Lazy images load now; wait for every image to finish (or fail).
  const imgs = Array.from(document.images);
  imgs.forEach(i => { i.loading = 'eager'; });
  await Promise.all(imgs.map(i => i.complete ? null : new Promise(r => {
    i.addEventListener('load', r, {once: true}); i.addEventListener('error', r, {once: true});
    setTimeout(r, 10000);
  })));
  // MathJax 3: wait for the first typeset pass.
  if (window.MathJax && MathJax.startup && MathJax.startup.promise) { await MathJax.startup.promise; }
  // ipywidgets: wait until every view has a rendered container (or time out and let the check report it).
  const views = () => Array.from(document.querySelectorAll('script[type="application/vnd.jupyter.widget-view+json"]'));
  const rendered = s => {
    const box = s.previousElementSibling;
    return box && box.classList.contains('widget-subarea') && box.childElementCount > 0
      && box.getBoundingClientRect().height > 0;
  };
  const t0 = Date.now();
  while (views().some(s => !rendered(s)) && Date.now() - t0 < widgetTimeout) {
    await new Promise(r => setTimeout(r, 100));
  }
  // Web fonts requested by what was just rendered (MathJax, widget icons), then a moment for late requests.
  await document.fonts.ready;
  await new Promise(r => setTimeout(r, 300));
  return true;
}"""

_INSPECT_JS = """(rawMath) => {
  const out = {nimages: document.images.length, images: [], rawMath: [], untypeset: 0, mathErrors: [], math: 0, widgets: 0, emptyWidgets: [],
               links: []};
  for (const i of document.images) {
    if (!(i.complete && i.naturalWidth > 0)) out.images.push(i.currentSrc || i.src || i.outerHTML.slice(0, 120));
  }
  // Text a reader sees, without code, program output and MathJax's own output.
  const clone = document.body.cloneNode(true);
  clone.querySelectorAll('pre, code, script, style, textarea, mjx-container, .highlight, .output, .cell_output')
       .forEach(e => e.remove());
  const text = clone.textContent;
  for (const token of rawMath) {
    let at = text.indexOf(token);
    if (at >= 0) out.rawMath.push(JSON.stringify(text.slice(Math.max(0, at - 40), at + 60).replace(/\\s+/g, ' ')));
  }
  const maths = document.querySelectorAll('.math');
  out.math = maths.length;
  for (const m of maths) { if (!m.querySelector('mjx-container')) out.untypeset += 1; }
  for (const e of document.querySelectorAll('mjx-merror')) out.mathErrors.push(e.textContent.slice(0, 120));
  const views = document.querySelectorAll('script[type="application/vnd.jupyter.widget-view+json"]');
  // rendered ipywidgets, and the live calculators that replace them on the web page (memlib.viz.live)
  out.widgets = views.length + document.querySelectorAll('.memlib-live').length;
  views.forEach((s, k) => {
    const box = s.previousElementSibling;
    const ok = box && box.classList.contains('widget-subarea') && box.childElementCount > 0
      && box.getBoundingClientRect().height > 0;
    if (!ok) out.emptyWidgets.push(`widget ${k + 1} of ${views.length} (${s.textContent.slice(0, 60)})`);
  });
  for (const a of document.querySelectorAll('a[href]')) out.links.push(a.href);
  // Tables as a reader sees them, and the reference tables' form (caption, header, aligned numbers, scroll box).
  const txt = e => (e ? e.textContent : '').replace(/\\s+/g, ' ').trim();
  out.tables = Array.from(document.querySelectorAll('table')).map(t => ({
    caption: txt(t.querySelector(':scope > caption')),
    header: Array.from(t.querySelectorAll(':scope > thead > tr:last-child > th')).map(txt),
    rows: Array.from(t.querySelectorAll(':scope > tbody > tr')).map(tr => Array.from(tr.children).map(txt)),
    reference: t.classList.contains('memlib-table')}));
  out.badTables = [];
  document.querySelectorAll('table.memlib-table').forEach((t, k) => {
    const name = `table ${k + 1} (${JSON.stringify(txt(t.querySelector('caption')).slice(0, 60))})`;
    if (!t.querySelector(':scope > caption') || !txt(t.querySelector(':scope > caption')))
      out.badTables.push(`${name}: no caption`);
    if (!t.querySelector(':scope > thead')) out.badTables.push(`${name}: no <thead>`);
    const box = t.parentElement;
    if (!box || getComputedStyle(box).overflowX !== 'auto') out.badTables.push(`${name}: not in a box that scrolls sideways`);
    for (const c of t.querySelectorAll('.num')) {
      if (getComputedStyle(c).textAlign !== 'right') { out.badTables.push(`${name}: numeric cell ${JSON.stringify(txt(c))} not right-aligned`); break; }
    }
  });
  // Images in notebook cell outputs (the matplotlib figures): numbered caption and meaningful alt text.
  out.figures = Array.from(document.querySelectorAll('div.cell_output img, div.output img')).map(img => {
    const fig = img.closest('figure');
    const cap = fig ? fig.querySelector('figcaption') : null;
    const file = (img.getAttribute('src') || '').split('/').pop();
    return {src: file, alt: img.getAttribute('alt') || '', caption: txt(cap), id: fig ? (fig.id || '') : ''};
  });
  // Code cells and outputs wrap (the book's _static/book.css); one that scrolls sideways is reported.
  out.scrolling = [];
  for (const p of document.querySelectorAll('div.highlight pre')) {
    if (p.scrollWidth > p.clientWidth + 1) {
      const line = p.textContent.split('\\n').reduce((a, b) => (b.length > a.length ? b : a), '');
      out.scrolling.push(`${p.scrollWidth} px in a ${p.clientWidth} px column: ${JSON.stringify(line.slice(0, 80))}`);
    }
  }
  return out;
}"""


_FIG_NUMBER = re.compile(r"^Fig\. \d+(\.\d+)*\s+\S")
_HASHLIKE = re.compile(r"^[0-9a-f]{16,}(\.\w+)?$")


def figure_problems(fig: dict) -> list[str]:
    """What is wrong with one figure of a cell output: its caption (numbered, with text) and its alt text."""
    out = []
    if not fig.get("id") and not fig.get("caption"):
        out.append("not in a numbered, captioned figure")
    elif not _FIG_NUMBER.match(fig.get("caption", "")):
        out.append(f"caption without a number or text: {fig.get('caption', '')[:60]!r}")
    alt = fig.get("alt", "").strip()
    if len(alt) < 20 or alt == fig.get("src") or _HASHLIKE.match(alt) or alt.endswith((".png", ".svg", ".jpg")):
        out.append(f"alt text is not a description: {alt[:60]!r}")
    return out


def _where(message) -> str:
    loc = message.location or {}
    return f"(at {loc.get('url')}:{loc.get('lineNumber')})" if loc.get("url") else ""


def _is_favicon_probe(message) -> bool:
    """Chromium asks every host for /favicon.ico on its own; no page references it, so a 404 there is no fault."""
    return (message.location or {}).get("url", "").endswith("/favicon.ico")


_REDIRECT = re.compile(r"""<meta\s+http-equiv=["']refresh["']\s+content=["']\d+;\s*url=([^"']+)["']""", re.I)


def _check_page(context, root: Path, base: str, page: str, screenshot: Path | None,
                widget_timeout_ms: int = WIDGET_TIMEOUT_MS) -> PageReport:
    report = PageReport(page)
    origin = urllib.parse.urlsplit(base).netloc
    add = lambda kind, detail: report.problems.append(Problem(page, kind, detail))  # noqa: E731
    blocked: list[str] = []

    def route(r) -> None:
        url = r.request.url
        if urllib.parse.urlsplit(url).netloc == origin:
            r.continue_()
        else:
            blocked.append(url)
            r.abort("blockedbyclient")

    html = (root / page).read_text(encoding="utf-8", errors="replace")
    redirect = _REDIRECT.search(html)
    if redirect:  # a redirect stub such as index.html: its target must resolve, like any link
        report.links.add(urllib.parse.urljoin(base + page, redirect.group(1)))
        return report

    pg = context.new_page()
    pg.route("**/*", route)
    pg.on("websocket", lambda ws: blocked.append(ws.url))
    pg.on("console", lambda m: add("console-error", f"{m.text[:300]} {_where(m)}".rstrip())
          if m.type == "error" and not _is_favicon_probe(m) else None)
    pg.on("pageerror", lambda e: add("page-error", str(e)[:300]))
    pg.on("requestfailed", lambda r: None if r.url in blocked else add(
        "failed-request", f"{r.url} ({r.failure})"))
    pg.on("response", lambda r: add("failed-request", f"{r.url} (HTTP {r.status})") if r.status >= 400 else None)
    t0 = time.perf_counter()
    try:
        pg.goto(base + page, wait_until="load", timeout=PAGE_TIMEOUT_MS)
        pg.evaluate(_SETTLE_JS, widget_timeout_ms)
        info = pg.evaluate(_INSPECT_JS, list(RAW_MATH))
        if screenshot is not None:
            screenshot.parent.mkdir(parents=True, exist_ok=True)
            pg.screenshot(path=str(screenshot))
    except Exception as exc:  # a page that hangs or crashes is a problem, not a checker crash
        add("page-error", f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}")
        info = {"nimages": 0, "images": [], "rawMath": [], "untypeset": 0, "mathErrors": [], "math": 0, "widgets": 0,
                "emptyWidgets": [], "links": [], "tables": [], "badTables": [], "figures": []}
    finally:
        pg.close()
    report.seconds = time.perf_counter() - t0
    for url in dict.fromkeys(blocked):
        add("blocked-request", url)
    for src in info["images"]:
        add("image", f"not loaded: {src}")
    for snippet in info["rawMath"]:
        add("raw-math", f"untypeset TeX in the text: {snippet}")
    if info["untypeset"]:
        add("raw-math", f"{info['untypeset']} of {info['math']} .math elements have no MathJax output")
    for err in info["mathErrors"]:
        add("math-error", err)
    for w in info["emptyWidgets"]:
        add("widget", f"empty: {w}")
    for detail in info.get("scrolling", ()):
        add("code-scroll", detail)
    for detail in info.get("badTables", ()):
        add("table", detail)
    for fig in info.get("figures", ()):
        for detail in figure_problems(fig):
            add("figure", f"{fig['src'][:24]}: {detail}")
    report.images, report.math, report.widgets = info["nimages"], info["math"], info["widgets"]
    report.tables, report.figures = info.get("tables", []), info.get("figures", [])
    report.links = {u for u in info["links"] if urllib.parse.urlsplit(u).netloc == origin}
    return report


def _check_links(base: str, reports: Sequence[PageReport]) -> list[Problem]:
    """HTTP 200 for every distinct local link target; the #anchor must exist on the target page."""
    problems: list[Problem] = []
    bodies: dict[str, str | int] = {}
    for rep in reports:
        for url in sorted(rep.links):
            target, _, fragment = url.partition("#")
            if target not in bodies:
                try:
                    with urllib.request.urlopen(target, timeout=10) as resp:  # noqa: S310 (local server)
                        bodies[target] = resp.read().decode("utf-8", "replace") if resp.status == 200 else resp.status
                except urllib.error.HTTPError as err:
                    bodies[target] = err.code
            body = bodies[target]
            shown = url.removeprefix(base)
            if isinstance(body, int):
                problems.append(Problem(rep.page, "link", f"{shown} -> HTTP {body}"))
            elif fragment and not re.search(
                    r"""\b(id|name)=["']%s["']""" % re.escape(urllib.parse.unquote(fragment)), body):
                problems.append(Problem(rep.page, "link", f"{shown}: no element with id {fragment!r} on that page"))
    return problems


def check_site(root: Path, pages: Sequence[str] | None = None, screenshots: dict[str, Path] | None = None,
               widget_timeout_ms: int = WIDGET_TIMEOUT_MS) -> tuple[list[PageReport], list[Problem]]:
    """Check ``pages`` (default: every page) of the static site in ``root``; return reports and all problems.

    ``screenshots`` maps a page to the PNG file to save of it; ``widget_timeout_ms`` is how long a page's
    widgets may take to render before an empty one is reported.
    """
    from playwright.sync_api import sync_playwright

    root = Path(root)
    pages = list(pages) if pages is not None else book_pages(root)
    screenshots = screenshots or {}
    reports: list[PageReport] = []
    profile = Path(tempfile.mkdtemp(prefix="book-chromium-"))  # a fresh user-data dir every run
    try:
        with serve(root) as base, sync_playwright() as pw:
            context = pw.chromium.launch_persistent_context(
                str(profile), executable_path=CHROMIUM, headless=True, args=list(CHROMIUM_ARGS),
                viewport={"width": 1280, "height": 900}, service_workers="block",
            )
            try:
                for page in pages:
                    reports.append(_check_page(context, root, base, page, screenshots.get(page), widget_timeout_ms))
            finally:
                context.close()
            problems = [p for rep in reports for p in rep.problems] + _check_links(base, reports)
    finally:
        shutil.rmtree(profile, ignore_errors=True)
    return reports, problems


_ASSET = re.compile(r"""<(script|link|img|iframe|source|video|audio)\b[^>]*?\b(?:src|href)=["']((?:https?:)?//[^"']+)""",
                    re.I)
_CDN_URL = re.compile(r"""https?://[a-z0-9.-]*(?:cdn|unpkg|jsdelivr)[^\s"'<>]*""", re.I)  # a URL on a CDN host
_ANCHOR = re.compile(r"<a\b[^>]*>.*?</a>", re.S | re.I)


def static_offline_problems(root: Path) -> list[Problem]:
    """Without a browser: HTML that would fetch from another host, or names a CDN URL outside a hyperlink.

    The issue's ``grep -r "cdn\\|unpkg\\|jsdelivr" --include=*.html``, made precise: hyperlinks (``<a href>``, e.g.
    a paper's PDF in the bibliography) are for the reader to follow, not loaded, so they are left out.
    """
    problems = []
    for path in sorted(Path(root).rglob("*.html")):
        page = path.relative_to(root).as_posix()
        html = path.read_text(encoding="utf-8", errors="replace")
        problems += [Problem(page, "remote-asset", f"<{tag}> {url}") for tag, url in _ASSET.findall(html)]
        problems += [Problem(page, "cdn-url", url[:160]) for url in sorted(set(_CDN_URL.findall(_ANCHOR.sub("", html))))]
    return problems


def search_finds(root: Path, word: str) -> int:
    """Open the Sphinx search page for ``word`` offline; return how many results it lists."""
    from playwright.sync_api import sync_playwright

    profile = Path(tempfile.mkdtemp(prefix="book-chromium-"))
    try:
        with serve(Path(root)) as base, sync_playwright() as pw:
            context = pw.chromium.launch_persistent_context(
                str(profile), executable_path=CHROMIUM, headless=True, args=list(CHROMIUM_ARGS))
            try:
                pg = context.new_page()
                pg.route("**/*", lambda r: r.continue_() if r.request.url.startswith(base) else r.abort())
                pg.goto(f"{base}search.html?q={urllib.parse.quote(word)}", wait_until="load")
                pg.wait_for_function(
                    "() => { const s = document.querySelector('#search-results'); "
                    "return s && (s.querySelectorAll('ul.search li').length > 0 "
                    "|| /did not match|found/i.test(s.textContent)); }", timeout=PAGE_TIMEOUT_MS)
                return pg.locator("#search-results ul.search li").count()
            finally:
                context.close()
    finally:
        shutil.rmtree(profile, ignore_errors=True)


# What a reader can see of the navigation: visible toggles and search controls, and the sidebar dialogs.
_NAV_STATE_JS = """() => {
  const shown = e => { const r = e.getBoundingClientRect(); const s = getComputedStyle(e);
    return r.width > 0 && r.height > 0 && s.visibility !== 'hidden' && r.bottom > 0 && r.right > 0
      && r.top < innerHeight && r.left < innerWidth; };
  const all = sel => Array.from(document.querySelectorAll(sel)).filter(shown);
  const dialog = id => document.getElementById(id);
  const links = id => { const d = dialog(id); return d && d.open ? Array.from(d.querySelectorAll('a[href]'))
    .filter(shown).map(a => a.getAttribute('href')) : []; };
  const header = document.getElementById('pst-header');
  return {
    primaryToggles: all('.primary-toggle').length,
    secondaryToggles: all('.secondary-toggle').length,
    searchControls: all('.search-button-field, .search-button, form.bd-search input').map(e => {
      const r = e.getBoundingClientRect(); return {top: Math.round(r.top), left: Math.round(r.left)}; }),
    headerHeight: header ? Math.round(header.getBoundingClientRect().height) : 0,
    primaryOpen: !!(dialog('pst-primary-sidebar-modal') || {}).open,
    primaryLinks: links('pst-primary-sidebar-modal'),
    primaryRight: dialog('pst-primary-sidebar-modal') ? dialog('pst-primary-sidebar-modal').getBoundingClientRect().right : 0,
    secondaryOpen: !!(dialog('pst-secondary-sidebar-modal') || {}).open,
    secondaryLinks: links('pst-secondary-sidebar-modal'),
    searchOpen: !!(dialog('pst-search-dialog') || {}).open,
  };
}"""


def navigation_walk(root: Path, page: str, width: int, height: int = 900,
                    screenshot: Path | None = None) -> dict[str, object]:
    """Use ``page``'s navigation at ``width`` px as a reader would, offline; return what was seen at each step.

    The steps (each key holds the state from ``_NAV_STATE_JS``): ``loaded``; ``toc_open`` after a click on the
    visible ☰ button (``screenshot`` is taken then); ``toc_closed_by_escape``; ``toc_closed_by_backdrop`` after
    reopening it and clicking beside it; ``contents_open`` after a click on the visible "Contents" button (only
    where one is visible) and ``contents_closed``; ``search_open`` after a click on the visible search control;
    ``followed`` is the link and the URL reached by clicking the first other page in the reopened table of contents.
    A step whose button is missing or does nothing is recorded as it is, for the test to judge.
    """
    from playwright.sync_api import sync_playwright

    steps: dict[str, object] = {}
    profile = Path(tempfile.mkdtemp(prefix="book-chromium-"))
    try:
        with serve(Path(root)) as base, sync_playwright() as pw:
            context = pw.chromium.launch_persistent_context(
                str(profile), executable_path=CHROMIUM, headless=True, args=list(CHROMIUM_ARGS),
                viewport={"width": width, "height": height}, service_workers="block")
            try:
                pg = context.new_page()
                pg.route("**/*", lambda r: r.continue_() if r.request.url.startswith(base) else r.abort())
                pg.goto(base + page, wait_until="load", timeout=PAGE_TIMEOUT_MS)
                pg.wait_for_timeout(500)  # the theme's deferred script wires the buttons after load
                state = lambda: pg.evaluate(_NAV_STATE_JS)  # noqa: E731

                def click(selector: str) -> None:
                    # a button keeps focus (and its tooltip) after Escape; a tooltip over the next button would
                    # take the click, so blur it and move the pointer away first
                    pg.evaluate("() => document.activeElement && document.activeElement.blur()")
                    pg.mouse.move(width // 2, height - 2)  # over the page text, away from the header
                    buttons = pg.locator(f"{selector} >> visible=true")
                    if buttons.count():
                        buttons.first.click(timeout=15_000)
                    pg.wait_for_timeout(400)

                def settled(key: str, want: bool) -> dict:
                    """The state once ``key`` reads ``want`` (polled up to 5 s: a loaded machine animates slowly)."""
                    s = state()
                    for _ in range(50):
                        if bool(s[key]) == want:
                            break
                        pg.wait_for_timeout(100)
                        s = state()
                    return s

                steps["loaded"] = state()
                click(".primary-toggle")
                steps["toc_open"] = settled("primaryOpen", True)
                if screenshot is not None:
                    screenshot.parent.mkdir(parents=True, exist_ok=True)
                    pg.screenshot(path=str(screenshot))
                pg.keyboard.press("Escape")
                pg.wait_for_timeout(400)
                steps["toc_closed_by_escape"] = settled("primaryOpen", False)
                click(".primary-toggle")
                opened = settled("primaryOpen", True)
                if opened["primaryOpen"]:
                    pg.mouse.click(min(width - 5, opened["primaryRight"] + 40), height // 2)
                    pg.wait_for_timeout(400)
                steps["toc_closed_by_backdrop"] = settled("primaryOpen", False)
                if steps["loaded"]["secondaryToggles"]:
                    click(".secondary-toggle")
                    steps["contents_open"] = settled("secondaryOpen", True)
                    pg.keyboard.press("Escape")
                    pg.wait_for_timeout(400)
                    steps["contents_closed"] = settled("secondaryOpen", False)
                click(".search-button-field, .search-button")
                steps["search_open"] = settled("searchOpen", True)
                pg.keyboard.press("Escape")
                pg.wait_for_timeout(400)
                click(".primary-toggle")
                chapter = pg.locator("#pst-primary-sidebar-modal li.toctree-l1:not(.current) > a >> visible=true")
                if chapter.count():
                    href = chapter.first.get_attribute("href")
                    with pg.expect_navigation(timeout=PAGE_TIMEOUT_MS):
                        chapter.first.click()
                    steps["followed"] = {"href": href, "url": pg.url.removeprefix(base)}
            finally:
                context.close()
    finally:
        shutil.rmtree(profile, ignore_errors=True)
    return steps


_WIDEST_JS = """() => {
  const W = document.documentElement.clientWidth, out = [];
  for (const e of document.querySelectorAll('.bd-main *')) {
    const r = e.getBoundingClientRect();
    if (r.width === 0 || r.right <= W + 1 || e.closest('.bd-sidebar-secondary')) continue;  // (off-canvas)
    let a = e.parentElement, clipped = false;  // inside a box that scrolls on its own (a table, a formula): fine
    while (a && a !== document.body) {
      if (getComputedStyle(a).overflowX !== 'visible' && a.getBoundingClientRect().right <= W + 1) { clipped = true; break; }
      a = a.parentElement;
    }
    if (!clipped) out.push(e);
  }
  const innermost = out.filter(e => !out.some(d => d !== e && e.contains(d)));
  return {width: document.documentElement.scrollWidth, culprits: innermost.slice(0, 3).map(e =>
    `<${e.tagName.toLowerCase()} class="${String(e.className).slice(0, 40)}"> ends at `
    + `${Math.round(e.getBoundingClientRect().right)} px: ${JSON.stringify((e.textContent || '').trim().slice(0, 60))}`)};
}"""


def pages_wider_than(root: Path, pages: Sequence[str], width: int = 390) -> list[Problem]:
    """Pages that scroll sideways at ``width`` px (a phone), each with the innermost elements that stick out."""
    from playwright.sync_api import sync_playwright

    problems: list[Problem] = []
    profile = Path(tempfile.mkdtemp(prefix="book-chromium-"))
    try:
        with serve(Path(root)) as base, sync_playwright() as pw:
            context = pw.chromium.launch_persistent_context(
                str(profile), executable_path=CHROMIUM, headless=True, args=list(CHROMIUM_ARGS),
                viewport={"width": width, "height": 900}, service_workers="block")
            try:
                pg = context.new_page()
                pg.route("**/*", lambda r: r.continue_() if r.request.url.startswith(base) else r.abort())
                for page in pages:
                    if _REDIRECT.search((Path(root) / page).read_text(encoding="utf-8", errors="replace")):
                        continue
                    pg.goto(base + page, wait_until="load", timeout=PAGE_TIMEOUT_MS)
                    pg.evaluate("async () => { if (window.MathJax && MathJax.startup && MathJax.startup.promise) "
                                "await MathJax.startup.promise; await document.fonts.ready; }")
                    seen = pg.evaluate(_WIDEST_JS)
                    if seen["width"] > width:
                        problems.append(Problem(page, "too-wide", f"{seen['width']} px wide at {width} px; "
                                                + "; ".join(seen["culprits"])))
            finally:
                context.close()
    finally:
        shutil.rmtree(profile, ignore_errors=True)
    return problems


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    root = Path(args[0] if args else "_build/html")
    reports, problems = check_site(root)
    for rep in reports:
        print(f"{rep.seconds:5.1f}s  {rep.page}  images={rep.images} math={rep.math} widgets={rep.widgets} links={len(rep.links)} "
              f"problems={len(rep.problems)}")
    print("\n".join(map(str, problems)) or f"{len(reports)} pages, no problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
