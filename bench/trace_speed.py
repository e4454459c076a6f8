"""Benchmark: wall time of `memlib trace` on the meta device for the largest shipped models. Targets: llama-2-70b
(batch 1, seq 4096) ≤ 5 s; deepseek-v3 and llama-3.1-405b (batch 1, seq 2048) < 10 s, on 2 CPU cores.

Prints, per model, the time of the whole command (a fresh process: Python start, imports, model builds, traced
steps of the few-layer models the full-depth result is extrapolated from — DeepSeek-V3's three dense first layers
included, see memlib.measure.trace._extrapolate), best of N, and once the trace call alone inside one process and the full
trace of every layer for comparison (the two results must be equal), plus the CPU time of the command (user + sys),
which is less sensitive than wall time to other processes on a shared machine.
Run: python bench/trace_speed.py [--models llama-2-70b,deepseek-v3,llama-3.1-405b] [--runs 3] [--no-full]
"""
from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import time

#: model → (sequence length, target seconds)
MODELS = {"llama-2-70b": (4096, 5.0), "deepseek-v3": (2048, 10.0), "llama-3.1-405b": (2048, 10.0)}


def _command(model: str, seq: int) -> tuple[float, float]:
    """Wall and CPU seconds (user + sys of the child) of one `memlib trace` command."""
    cmd = [sys.executable, "-m", "memlib", "trace", model, "--batch", "1", "--seq", str(seq), "--json"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--no-full", action="store_true", help="skip the full (every layer) trace")
    args = parser.parse_args(argv)
    from memlib.measure.trace import trace_training

    trace_training("gpt2", batch_size=1, seq_len=64)  # warm the imports for the in-process timings
    print("| model | seq | command, best of N (s) | command CPU (s) | all runs (s) | trace_training in process (s) | "
          "method | full trace (s) | same result | target (s) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    ok = True
    for model in args.models.split(","):
        seq, target = MODELS.get(model, (2048, 10.0))
        runs = [_command(model, seq) for _ in range(args.runs)]
        t0 = time.perf_counter()
        fast = trace_training(model, batch_size=1, seq_len=seq)
        inner = time.perf_counter() - t0
        if args.no_full:
            t_full, same = float("nan"), "—"
        else:
            t0 = time.perf_counter()
            full = trace_training(model, batch_size=1, seq_len=seq, extrapolate=False)
            t_full = time.perf_counter() - t0
            same = str(fast.as_dict() == full.as_dict())
            ok = ok and same == "True"
        best = min(w for w, _ in runs)
        print(f"| {model} | {seq} | {best:.2f} | {min(c for _, c in runs):.2f} | "
              f"{', '.join(f'{w:.2f}' for w, _ in runs)} | {inner:.2f} | {fast.method} | {t_full:.2f} | {same} | "
              f"{target:g} |", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
