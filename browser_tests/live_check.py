"""Drive a page's live calculator (memlib under Pyodide) in headless Chromium, offline, and time it.

Used by ``browser_tests/test_live.py`` (the result changes when a control moves) and ``bench/live_startup.py``
(the startup and update times). The site is served locally; every request to another host is aborted and
reported, as in :mod:`checker`.
"""
from __future__ import annotations

import json
import shutil
import tempfile
import time
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from checker import CHROMIUM, CHROMIUM_ARGS, serve

__all__ = ["LiveRun", "Step", "offline_page", "run_live"]

LOAD_TIMEOUT_MS = 120_000  # the first result: Pyodide's 13 MB on a slow CI machine


@dataclass(frozen=True)
class Step:
    """One reader action on the calculator: choose an option, type text, or press a button."""

    action: str  # "select", "fill" (then Enter) or "click"
    selector: str  # CSS selector inside the calculator
    value: str = ""


@dataclass
class LiveRun:
    """What the browser showed: the result's text before and after each step, and the times."""

    page: str
    status_before: str = ""
    results: list[str] = field(default_factory=list)  # result text: initial, then after each step
    controls: list[str] = field(default_factory=list)  # controls' text (the drill's question), same order
    wall_ms: list[float] = field(default_factory=list)  # per step: action to new result, seen from Python
    update_ms: list[float] = field(default_factory=list)  # per step: the page's own count (render + DOM swap)
    startup_ms: float = 0.0  # the page's own count: first use to first result (Pyodide + memlib + render)
    phases: dict[str, float] = field(default_factory=dict)  # ms after first use: runtime loaded, memlib imported
    status_after: str = ""
    enabled: bool = False  # the controls were enabled when the page had loaded
    blocked: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


@contextmanager
def offline_page(root: Path, page: str, blocked: list[str], errors: list[str], *,
                 init_script: str | None = None) -> Iterator[Any]:
    """Open ``page`` of the site in ``root`` in headless Chromium, offline, and yield the Playwright page.

    The site is served on 127.0.0.1; every request to another host is aborted and its URL appended to ``blocked``;
    page errors and console errors go to ``errors``. ``init_script`` runs before the page's own scripts. A fresh
    profile each time, so ``localStorage`` starts empty (a reload within one call keeps it).
    """
    from playwright.sync_api import sync_playwright

    profile = Path(tempfile.mkdtemp(prefix="book-chromium-"))
    try:
        with serve(Path(root)) as base, sync_playwright() as pw:
            origin = urllib.parse.urlsplit(base).netloc
            context = pw.chromium.launch_persistent_context(
                str(profile), executable_path=CHROMIUM, headless=True, args=list(CHROMIUM_ARGS),
                viewport={"width": 1280, "height": 900}, service_workers="block")
            try:
                pg = context.new_page()

                def route(r) -> None:  # noqa: ANN001 (playwright's Route)
                    if urllib.parse.urlsplit(r.request.url).netloc == origin:
                        r.continue_()
                    else:
                        blocked.append(r.request.url)
                        r.abort("blockedbyclient")

                pg.route("**/*", route)
                if init_script:
                    pg.add_init_script(init_script)
                pg.on("pageerror", lambda e: errors.append(str(e)[:300]))
                pg.on("console", lambda m: errors.append(m.text[:300]) if m.type == "error" else None)
                pg.goto(base + page, wait_until="load", timeout=60_000)
                yield pg
            finally:
                context.close()
    finally:
        shutil.rmtree(profile, ignore_errors=True)


def run_live(root: Path, page: str, steps: list[Step], *, index: int = 0, webassembly: bool = True) -> LiveRun:
    """Open ``page`` of the site in ``root``, apply ``steps`` to its ``index``-th calculator, record the results.

    ``webassembly=False`` removes ``WebAssembly`` from the page before its scripts run (a browser without it).
    """
    run = LiveRun(page)
    init = None if webassembly else "delete globalThis.WebAssembly;"
    with offline_page(root, page, run.blocked, run.errors, init_script=init) as pg:
        calc = pg.locator(".memlib-live").nth(index)
        calc.scroll_into_view_if_needed()
        run.status_before = calc.locator(".memlib-live-status").inner_text()
        run.results.append(calc.locator(".memlib-live-result").inner_text())
        run.controls.append(calc.locator(".memlib-live-controls").inner_text())
        run.enabled = calc.locator(".memlib-live-controls [name]:disabled").count() == 0
        handle = calc.element_handle()
        for n, step in enumerate(steps, start=1):
            target = calc.locator(step.selector).first
            t0 = time.perf_counter()
            if step.action == "select":
                target.select_option(step.value)
            elif step.action == "fill":
                target.fill(step.value)
                target.press("Enter")
            elif step.action == "click":
                target.click()
            else:
                raise ValueError(f"unknown step action {step.action!r}; expected select, fill or click")
            pg.wait_for_function("([el, n]) => Number(el.dataset.updates || 0) >= n || el.dataset.error",
                                 arg=[handle, n], timeout=LOAD_TIMEOUT_MS)
            run.wall_ms.append((time.perf_counter() - t0) * 1000)
            run.update_ms.append(float(calc.get_attribute("data-last-ms") or "nan"))
            run.results.append(calc.locator(".memlib-live-result").inner_text())
            run.controls.append(calc.locator(".memlib-live-controls").inner_text())
        run.startup_ms = float(calc.get_attribute("data-startup-ms") or "nan")
        run.phases = json.loads(calc.get_attribute("data-phases") or "{}")
        run.status_after = calc.locator(".memlib-live-status").inner_text()
    return run
