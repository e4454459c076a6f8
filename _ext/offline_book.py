"""Sphinx extension for The GPU Memory Book: every page must render with no network.

The widget JavaScript and MathJax are self-hosted (``vendor/site``, see ``tools/fetch_vendor.py`` and
``_config.yml``). Two things remain that this extension handles, on every HTML page:

* sphinx-thebe (always loaded by Jupyter Book 1) adds an inline script naming ``https://unpkg.com/thebe…`` and
  ``_static/sphinx-thebe.js``. They only serve the "Live Code" launch button; the book does not enable it
  (``launch_buttons.thebe`` is off), so both are dropped from the page.
* A guard: any script or stylesheet that would still be fetched from another host, or inline script that
  names a CDN, is reported as a warning — a failure under ``jupyter-book build -W``.
"""
from __future__ import annotations

import re
from typing import Any

from sphinx.application import Sphinx
from sphinx.util import logging

__all__ = ["setup"]

logger = logging.getLogger(__name__)

_REMOTE = re.compile(r"^(https?:)?//", re.IGNORECASE)
_CDN = re.compile(r"https?://[^\s\"']*(cdn|unpkg\.com|jsdelivr)", re.IGNORECASE)


def _thebe_enabled(app: Sphinx) -> bool:
    options = app.config.html_theme_options or {}
    return bool((options.get("launch_buttons") or {}).get("thebe"))


def _is_thebe(asset: Any) -> bool:
    filename = str(getattr(asset, "filename", "") or "")
    body = str(getattr(asset, "attributes", {}).get("body", ""))
    return filename.endswith("sphinx-thebe.js") or "THEBE_JS_URL" in body


def _offline_assets(app: Sphinx, pagename: str, templatename: str, context: dict, doctree: Any) -> None:
    scripts = context.get("script_files")
    if scripts is not None and not _thebe_enabled(app):
        scripts[:] = [js for js in scripts if not _is_thebe(js)]
    for key in ("script_files", "css_files"):
        for asset in context.get(key) or ():
            filename = str(getattr(asset, "filename", "") or "")
            body = str(getattr(asset, "attributes", {}).get("body", ""))
            if _REMOTE.match(filename) or _CDN.search(body):
                logger.warning(
                    "page %r would load %s from the network; self-host it (see tools/fetch_vendor.py)",
                    pagename, filename or f"an inline script naming {_CDN.search(body).group(0)!r}",  # type: ignore[union-attr]
                    type="offline_book", subtype="remote_asset",
                )


def setup(app: Sphinx) -> dict[str, Any]:
    """Register the page hook late, after myst-nb and the theme have added their scripts."""
    app.connect("html-page-context", _offline_assets, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True, "version": "1"}
