"""Benchmark: how long `memlib train` takes for every shipped model. Target (issue 20): under 0.1 s.

Prints, per model, the estimate alone inside one process (``estimate_training`` at the command's defaults, best of
N after one warm-up call, so the config is parsed and cached as in a command) and the whole command in a fresh
process (Python start and memlib's imports included: ``python -m memlib train MODEL``), best of N.
The target is for the estimate; the command's start-up is Python's and is shown for comparison.
Run: python bench/train_speed.py [--runs 5] [--models a,b]
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import time

from memlib.core.configs import load_config, shipped_models
from memlib.core.estimate import estimate_training


def _attention(model: str) -> str:
    return "eager" if load_config(model).model_type == "gemma2" else "sdpa"  # transformers has no sdpa for gemma2


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", default=",".join(shipped_models(all_models=True)))
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args(argv)
    print("| model | estimate in process, best (ms) | command, best (s) |")
    print("|---|---|---|")
    worst = 0.0
    for model in args.models.split(","):
        kw = {"attention": _attention(model)}
        estimate_training(model, **kw)
        best = min(_timed(lambda: estimate_training(model, **kw)) for _ in range(args.runs))
        cmd = [sys.executable, "-m", "memlib", "train", model, "--attention", kw["attention"]]
        wall = min(_timed(lambda: subprocess.run(cmd, check=True, capture_output=True)) for _ in range(2))
        worst = max(worst, best)
        print(f"| {model} | {best * 1e3:.1f} | {wall:.2f} |", flush=True)
    print(f"\nslowest estimate: {worst * 1e3:.1f} ms (target < 100 ms)")
    return 0 if worst < 0.1 else 1


def _timed(fn: object) -> float:
    t0 = time.perf_counter()
    fn()  # type: ignore[operator]
    return time.perf_counter() - t0


if __name__ == "__main__":
    sys.exit(main())
