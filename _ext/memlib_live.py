"""Sphinx extension for The GPU Memory Book's live calculators (memlib under Pyodide in the reader's browser).

* Adds ``vendor/memlib-live.js`` (the loader, the book's own file) to each page that holds a calculator
  (an element of class ``memlib-live``), and to no other page.
* Writes memlib's pure modules (:data:`memlib.viz.live.LIVE_MODULES`) and their data files
  (:data:`memlib.viz.live.LIVE_DATA`: the shipped model configs, the drills' question bank) as one zip to
  ``<site>/live/memlib.zip``; pages fetch it as ``live/memlib.zip?v=<sha256[:12]>`` (``window.MEMLIB_LIVE``), so
  a browser never runs a stale cached copy after a rebuild. (One fixed file name: a page an incremental build
  does not rewrite keeps an older ``?v=`` but still gets the current zip.)
* Checks that Pyodide is in place (``vendor/site/vendor/pyodide/``, fetched by
  ``python tools/fetch_vendor.py --build``) and that every file matches the sha256 in ``vendor/manifest.json``;
  otherwise warns, which fails ``jupyter-book build -W``.
"""
from __future__ import annotations

import ast
import hashlib
import io
import json
import zipfile
from pathlib import Path
from typing import Any

from sphinx.application import Sphinx
from sphinx.util import logging

__all__ = ["memlib_zip", "setup"]

logger = logging.getLogger(__name__)
REPO = Path(__file__).resolve().parents[1]
_STATE: dict[str, Any] = {}
LOADER = "../vendor/memlib-live.js"  # vendor/site/vendor/memlib-live.js; relative paths resolve under _static/


def memlib_zip(repo: Path = REPO) -> bytes:
    """The zip of memlib's modules the calculators import, byte-identical for identical sources."""
    # LIVE_MODULES and LIVE_DATA are read from the source, not imported: the build's Python may hold another memlib.
    tree = ast.parse((repo / "memlib" / "viz" / "live.py").read_text(encoding="utf-8"))
    lists = {node.target.id: ast.literal_eval(node.value) for node in tree.body if isinstance(node, ast.AnnAssign)
             and isinstance(node.target, ast.Name) and node.target.id in ("LIVE_MODULES", "LIVE_DATA")}
    files = [f"memlib/{m}.py" for m in lists["LIVE_MODULES"]]
    for pattern in lists["LIVE_DATA"]:
        found = sorted(p.relative_to(repo).as_posix() for p in (repo / "memlib").glob(pattern))
        if not found:
            raise FileNotFoundError(f"LIVE_DATA pattern {pattern!r} matches no file under memlib/")
        files += found
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for rel in files:
            info = zipfile.ZipInfo(rel, date_time=(2026, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, (repo / rel).read_bytes())
    return buf.getvalue()


def _pyodide_problems() -> list[str]:
    manifest = json.loads((REPO / "vendor" / "manifest.json").read_text(encoding="utf-8"))
    entry = manifest["packages"].get("pyodide")
    root = REPO / "vendor" / "site" / "vendor" / "pyodide"
    if entry is None:
        return ["vendor/manifest.json has no pyodide entry"]
    problems = []
    for rel, digest in entry["files"].items():
        path = root / rel
        if not path.is_file():
            problems.append(f"{path.relative_to(REPO)} missing")
        elif hashlib.sha256(path.read_bytes()).hexdigest() != digest:
            problems.append(f"{path.relative_to(REPO)}: sha256 differs from vendor/manifest.json")
    return problems


def _inited(app: Sphinx) -> None:
    data = memlib_zip()
    _STATE.update(zip=data, name="live/memlib.zip", version=hashlib.sha256(data).hexdigest()[:12])
    problems = _pyodide_problems()
    if problems:
        logger.warning("the live calculators need Pyodide: run `python tools/fetch_vendor.py --build` (%s)",
                       "; ".join(problems[:3]), type="memlib_live", subtype="pyodide")


def _page(app: Sphinx, pagename: str, templatename: str, context: dict, doctree: Any) -> None:
    """Only a page that holds a calculator loads the script (Sphinx adds page-local assets during this event)."""
    if 'class="memlib-live"' not in str(context.get("body", "")):
        return
    url = f"{_STATE['name']}?v={_STATE['version']}"
    app.add_js_file(None, body=f"window.MEMLIB_LIVE = {json.dumps({'zip': url})};")
    app.add_js_file(LOADER)


def _finished(app: Sphinx, exception: Exception | None) -> None:
    if exception is not None or app.builder.format != "html" or "zip" not in _STATE:
        return
    target = Path(app.outdir) / _STATE["name"]
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(_STATE["zip"])


def setup(app: Sphinx) -> dict[str, Any]:
    """Write the memlib zip with the site and check Pyodide is there."""
    app.connect("builder-inited", _inited)
    app.connect("html-page-context", _page, priority=800)  # before offline_book's check (900)
    app.connect("build-finished", _finished)
    return {"parallel_read_safe": True, "parallel_write_safe": True, "version": "1"}
