"""Benchmark: the live calculators' startup and update times in a real browser. Targets: first result ≤ 10 s
after first use (Pyodide's 13 MB from a cold cache, memlib, one render) on a laptop; each later update ≤ 200 ms.

Opens the calculators of chapters 1, 2 and 7 and the numeric drills' flashcard in the built book in Debian's chromium (network
blocked, a fresh profile per run, so every run starts cold), moves controls, and prints a Markdown table: the
first result after first use and its phases (Pyodide runtime loaded, memlib imported), then the later updates
as the page itself counts them (memlib.viz.live.render in Pyodide + the DOM swap) and as seen from outside (action
to new result, Playwright's round trips included). The CPU's load average is printed with it: on a shared
machine the startup mostly measures the contention.
Run (after the book build): python bench/live_startup.py [--runs 3] [--site _build/html]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "browser_tests"))

from checker import book_pages  # noqa: E402
from live_check import Step, run_live  # noqa: E402

CASES = {
    "chapter 1 (training)": ("chapters/01_", [Step("select", "select[name=zero_stage]", "3"),
                                              Step("select", "select[name=num_gpus]", "8"),
                                              Step("select", "select[name=seq_len]", "2048"),
                                              Step("select", "select[name=precision]", "fp32")]),
    "numeric drills (flashcard)": ("drills/02_numeric", [Step("fill", "input[name=answer]", "1"),
                                                         Step("click", "button[value=reveal]"),
                                                         Step("click", "button[value=next]"),
                                                         Step("click", "button[value=next]")]),
    "chapter 2 (a number's bits)": ("chapters/02_", [Step("fill", "input[name=value]", "65520"),
                                                     Step("fill", "input[name=value]", "1e-9"),
                                                     Step("fill", "input[name=value]", "-0.333")]),
    "chapter 7 (offload time)": ("chapters/07_", [Step("select", "select[name=link]", "pcie3"),
                                                  Step("select", "select[name=tokens_per_step]", "16384"),
                                                  Step("select", "select[name=delayed_update]", "yes")]),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--runs", type=int, default=3, help="cold-cache runs per page")
    parser.add_argument("--site", type=Path, default=REPO / "_build" / "html", help="the built book")
    args = parser.parse_args(argv)
    pages = book_pages(args.site)
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; {args.runs} cold runs per page\n")
    print("| calculator | first result (s) | Pyodide runtime (s) | memlib imported (s) | later updates, page (ms) "
          "| later updates, outside (ms) |")
    print("|---|---|---|---|---|---|")
    for name, (prefix, steps) in CASES.items():
        page = next(p for p in pages if p.startswith(prefix))
        first, runtime, imported, inside, outside = [], [], [], [], []
        for _ in range(args.runs):
            run = run_live(args.site, page, steps)
            if run.blocked or run.errors or len(run.update_ms) != len(steps):
                print(f"{page}: failed: blocked={run.blocked} errors={run.errors}", file=sys.stderr)
                return 1
            first.append(run.startup_ms / 1000)
            runtime.append(run.phases.get("runtime", float("nan")) / 1000)
            imported.append(run.phases.get("memlib", float("nan")) / 1000)
            inside += run.update_ms[1:]
            outside += run.wall_ms[1:]

        def cell(xs: list[float], fmt: str) -> str:
            return f"{statistics.median(xs):{fmt}} (max {max(xs):{fmt}})"

        print(f"| {name} | {cell(first, '.1f')} | {cell(runtime, '.1f')} | {cell(imported, '.1f')} "
              f"| {cell(inside, '.0f')} | {cell(outside, '.0f')} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
