"""Print the whole book into one PDF, ``_build/pdf/book.pdf``, with Debian's chromium (run after the HTML build).

README.md's build command runs it after ``jupyter-book build . -W -n --keep-going``:

1. ``jupyter-book build . --builder singlehtml -W -n --keep-going`` writes every page of the book into one HTML
   page, ``_build/singlehtml/intro.html`` (the root page; index.html only redirects to it). It reuses the HTML
   build's parsed pages (``_build/.doctrees``), so it mostly writes; like the HTML build, any warning fails it.
2. Debian's ``/usr/bin/chromium`` (``apt-get install chromium``; never a downloaded browser), driven headless by
   Playwright, opens that page from a local server on 127.0.0.1 with every other request refused (no network),
   waits for MathJax and the images, opens every answer dropdown (``<details>``; myst-nb's folded plotting code
   stays folded), drops links to other files of the site (dead in a PDF) and prints it with the print
   stylesheet ``_static/print.css`` (no sidebars or buttons, code wrapped, one section per book page; it is
   inside ``@media print`` and changes nothing on screen) to A4 pages with page numbers.
3. The PDF is copied next to the HTML (``_build/html/book.pdf``), where the intro and every page's ".pdf"
   download button link to it (``_ext/book_pdf.py``), and its page count is checked.

Usage::

    python tools/build_pdf.py              # build the single page, then print it
    python tools/build_pdf.py --no-build   # print an existing _build/singlehtml
"""
from __future__ import annotations

import argparse
import functools
import http.server
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["CHROMIUM", "MIN_PAGES", "build_singlehtml", "count_pages", "main", "pdf_text", "print_pdf"]

REPO = Path(__file__).resolve().parents[1]
BUILD = REPO / "_build"
SINGLE = BUILD / "singlehtml"
PDF = BUILD / "pdf" / "book.pdf"
HTML_COPY = BUILD / "html" / "book.pdf"  # linked from intro.md and the ".pdf" buttons (_ext/book_pdf.py)
CHROMIUM = "/usr/bin/chromium"  # Debian's package, as in browser_tests/checker.py
CHROMIUM_ARGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync",
    "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1, EXCLUDE localhost",
)
MIN_PAGES = 100  # the book is ~300 A4 pages; fewer than this means pages went missing
TIMEOUT_MS = 180_000

# Run in the page before printing: every image loaded, fonts and MathJax done, every dropdown open.
_SETTLE_JS = """async () => {
  for (const img of document.images) { img.loading = 'eager'; }
  await Promise.all(Array.from(document.images).map(i => i.complete ? null :
    new Promise(r => { i.addEventListener('load', r, {once: true}); i.addEventListener('error', r, {once: true}); })));
  if (document.fonts) { await document.fonts.ready; }
  if (window.MathJax && MathJax.startup && MathJax.startup.promise) { await MathJax.startup.promise; }
  // Answers and other dropdowns open; myst-nb's folded cell parts (details.hide: plotting code) stay folded.
  const answers = document.querySelectorAll('details:not(.hide)');
  let opened = 0;
  for (const d of answers) { if (!d.open) { d.open = true; opened += 1; } }
  // Links to other files of the site (the intro's link to this PDF, downloads) would point at the
  // temporary local server in the PDF: drop them. Links within the book are in-page anchors and stay.
  let dropped = 0;
  for (const a of document.querySelectorAll('a[href]')) {
    const u = new URL(a.href, location.href);
    if (u.origin === location.origin && u.pathname !== location.pathname) { a.removeAttribute('href'); dropped += 1; }
  }
  return {details: answers.length, opened: opened, dropped_links: dropped,
          math: document.querySelectorAll('mjx-container').length};
}"""
_FOOTER = ('<div style="font-size:8px; width:100%; text-align:center; color:#555;">'
           '<span class="pageNumber"></span> / <span class="totalPages"></span></div>')


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (stdlib signature)
        pass


@contextmanager
def _serve(root: Path) -> Iterator[str]:
    """Serve ``root`` on 127.0.0.1 (a free port) in a thread; yield its base URL ending in '/'."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_QuietHandler, directory=str(root)))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def _root_page() -> str:
    """The single page's file name: the book's root document (``_toc.yml``'s ``root``; index.html redirects)."""
    found = re.search(r"^root:\s*[\"']?([^\s\"'#]+)", (REPO / "_toc.yml").read_text(encoding="utf-8"), re.M)
    root = found.group(1) if found else "index"
    return f"{Path(root).with_suffix('').as_posix()}.html"


def build_singlehtml() -> Path:
    """Run ``jupyter-book build . --builder singlehtml -W -n --keep-going``; return the single page."""
    jb = shutil.which("jupyter-book", path=str(Path(sys.executable).parent)) or "jupyter-book"
    done = subprocess.run([jb, "build", str(REPO), "--builder", "singlehtml", "-W", "-n", "--keep-going"], cwd=REPO)
    if done.returncode != 0:
        raise SystemExit(f"build_pdf: the single-page build failed (exit {done.returncode}; warnings above)")
    page = SINGLE / _root_page()
    if not page.is_file():
        raise SystemExit(f"build_pdf: the single-page build wrote no {page}")
    return page


def count_pages(pdf: Path) -> int:
    """Pages of a PDF written by chromium (its page objects: ``/Type /Page``, not ``/Pages``)."""
    return len(re.findall(rb"/Type\s*/Page(?![a-zA-Z])", pdf.read_bytes()))


_OBJ = re.compile(rb"(?s)(\d+) 0 obj\s*(.*?)\s*endobj")
_REF = rb"(\d+) 0 R"


def _to_unicode(cmap: bytes) -> dict[int, str]:
    """Glyph id -> text, from a ToUnicode CMap (bfchar and bfrange sections)."""
    out: dict[int, str] = {}

    def text(hexstr: bytes) -> str:
        return bytes.fromhex(hexstr.decode()).decode("utf-16-be", errors="replace")

    for block in re.findall(rb"(?s)beginbfchar(.*?)endbfchar", cmap):
        for src, dst in re.findall(rb"<([0-9A-Fa-f]+)>\s*<([0-9A-Fa-f]*)>", block):
            out[int(src, 16)] = text(dst)
    for block in re.findall(rb"(?s)beginbfrange(.*?)endbfrange", cmap):
        for lo, hi, dst in re.findall(rb"<([0-9A-Fa-f]+)>\s*<([0-9A-Fa-f]+)>\s*(<[0-9A-Fa-f]*>|\[[^\]]*\])", block):
            lo_i, hi_i = int(lo, 16), int(hi, 16)
            if dst.startswith(b"["):
                for i, d in enumerate(re.findall(rb"<([0-9A-Fa-f]*)>", dst)):
                    out[lo_i + i] = text(d)
            else:
                base = text(dst[1:-1])
                for i in range(hi_i - lo_i + 1):
                    out[lo_i + i] = base[:-1] + chr(ord(base[-1]) + i) if base else ""
    return out


def pdf_text(pdf: Path) -> list[str]:
    """The text of each page of a PDF written by chromium (Skia), one string per page, lines joined by '\\n'.

    Standard library only, for this one producer: uncompressed object table, Flate content streams, Type0 fonts
    with ToUnicode maps, text shown with ``<hex> Tj`` / ``[<hex> n <hex>] TJ``. Enough to find a sentence.
    """
    data = pdf.read_bytes()
    objs = {int(m.group(1)): m.group(2) for m in _OBJ.finditer(data)}

    def stream(num: int) -> bytes:
        obj = objs[num]
        start = obj.index(b"stream") + len(b"stream")
        start += 2 if obj[start:start + 2] == b"\r\n" else 1
        length = re.search(rb"/Length (\d+)(?! 0 R)", obj[:start])
        raw = obj[start:start + int(length.group(1))] if length else obj[start:obj.rindex(b"endstream")]
        return zlib.decompress(raw) if b"/FlateDecode" in obj[:start] else raw

    maps: dict[int, dict[int, str]] = {}

    def font_map(num: int) -> dict[int, str]:
        if num not in maps:
            ref = re.search(rb"/ToUnicode " + _REF, objs[num])
            maps[num] = _to_unicode(stream(int(ref.group(1)))) if ref else {}
        return maps[num]

    pages = []
    for num, obj in sorted(objs.items()):
        if not re.match(rb"<<\s*/Type /Page(?![a-zA-Z])", obj):
            continue
        fonts = re.search(rb"/Font\s*<<(.*?)>>", obj, re.S)
        names = {n: int(r) for n, r in re.findall(rb"/(\w+) " + _REF, fonts.group(1))} if fonts else {}
        contents = re.search(rb"/Contents\s*(\[[^\]]*\]|\d+ 0 R)", obj)
        refs = [int(r) for r in re.findall(_REF, contents.group(1))] if contents else []
        lines, current = [], {}
        for ref in refs:
            for op in re.finditer(rb"/(\w+) [\d.]+ Tf|<([0-9A-Fa-f]*)> Tj|\[([^\]]*)\] TJ|(ET)", stream(ref)):
                if op.group(1):
                    current = font_map(names[op.group(1)]) if op.group(1) in names else {}
                elif op.group(4):
                    lines.append("\n")
                else:
                    hexes = [op.group(2)] if op.group(2) is not None else re.findall(rb"<([0-9A-Fa-f]*)>", op.group(3))
                    for h in hexes:
                        lines.extend(current.get(int(h[i:i + 4], 16), "") for i in range(0, len(h), 4))
        pages.append("".join(lines))
    return pages


def print_pdf(root: Path, page_name: str, out: Path) -> dict[str, int]:
    """Print ``root/page_name`` to ``out`` with Debian's chromium, offline; return what the page held."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as err:
        raise SystemExit("build_pdf: needs playwright (pip install -r requirements.txt)") from err
    if not Path(CHROMIUM).is_file():
        raise SystemExit(f"build_pdf: no {CHROMIUM}; install Debian's chromium (apt-get install -y chromium)")
    out.parent.mkdir(parents=True, exist_ok=True)
    with _serve(root) as base, sync_playwright() as pw, tempfile.TemporaryDirectory() as profile:
        context = pw.chromium.launch_persistent_context(
            profile, executable_path=CHROMIUM, headless=True, args=list(CHROMIUM_ARGS), service_workers="block")
        try:
            page = context.new_page()
            page.route("**/*", lambda r: r.continue_() if r.request.url.startswith(base) else r.abort())
            page.goto(base + page_name, wait_until="load", timeout=TIMEOUT_MS)
            page.emulate_media(media="print")
            seen: dict[str, int] = page.evaluate(_SETTLE_JS)
            page.wait_for_timeout(1000)  # widgets' views and MathJax's last layout pass
            page.pdf(path=str(out), format="A4", print_background=True, display_header_footer=True,
                     header_template="<span></span>", footer_template=_FOOTER,
                     margin={"top": "14mm", "bottom": "16mm", "left": "14mm", "right": "14mm"})
        finally:
            context.close()
    return seen


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--no-build", action="store_true", help="print the existing _build/singlehtml")
    args = parser.parse_args(argv)
    start = time.monotonic()
    single = SINGLE / _root_page() if args.no_build else build_singlehtml()
    if not single.is_file():
        raise SystemExit(f"build_pdf: no {single}; run without --no-build")
    built = time.monotonic()
    seen = print_pdf(SINGLE, single.name, PDF)
    pages = count_pages(PDF)
    if pages < MIN_PAGES:
        raise SystemExit(f"build_pdf: {PDF} has {pages} pages; expected at least {MIN_PAGES}")
    if HTML_COPY.parent.is_dir():
        shutil.copyfile(PDF, HTML_COPY)
    print(f"build_pdf: {PDF.relative_to(REPO)}: {pages} pages, {PDF.stat().st_size / 1e6:.1f} MB; "
          f"{seen['details']} dropdowns open ({seen['opened']} opened), {seen['math']} formulas; "
          f"single-page build {built - start:.0f} s, print {time.monotonic() - built:.0f} s"
          + (f"; copied to {HTML_COPY.relative_to(REPO)}" if HTML_COPY.parent.is_dir() else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
