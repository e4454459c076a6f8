"""Benchmark: wall time of `memlib trace llama-2-70b --batch 1 --seq 4096` (meta device). Target ≤ 5 s.

Prints the time of the whole command (a fresh process: Python start, imports, model builds, traced steps of
the 2- to 5-layer models the 80-layer result is extrapolated from) and of the trace call alone inside one
process, best of N, and the full 80-layer trace for comparison (the two results must be equal).
Run: python bench/trace_speed.py
"""
from __future__ import annotations

import subprocess
import sys
import time


def main() -> int:
    runs = 3
    cmd = [sys.executable, "-m", "memlib", "trace", "llama-2-70b", "--batch", "1", "--seq", "4096", "--json"]
    whole = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True)
        whole.append(time.perf_counter() - t0)
    from memlib.trace import trace_training

    trace_training("gpt2", batch_size=1, seq_len=64)  # warm the imports
    inner = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fast = trace_training("llama-2-70b", batch_size=1, seq_len=4096)
        inner.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    full = trace_training("llama-2-70b", batch_size=1, seq_len=4096, extrapolate=False)
    t_full = time.perf_counter() - t0
    assert fast.as_dict() == full.as_dict(), "extrapolated trace differs from the full trace"
    print("| what | best of 3 (s) | all runs (s) |")
    print("|---|---|---|")
    print(f"| memlib trace llama-2-70b --batch 1 --seq 4096 (whole command) | {min(whole):.2f} | "
          f"{', '.join(f'{t:.2f}' for t in whole)} |")
    print(f"| trace_training(...) inside one process ({fast.method}) | {min(inner):.2f} | "
          f"{', '.join(f'{t:.2f}' for t in inner)} |")
    print(f"| trace_training(..., extrapolate=False): all 80 layers traced | {t_full:.2f} | {t_full:.2f} |")
    print(f"same result, extrapolated and full: {fast.as_dict() == full.as_dict()} (peak {fast.peak_bytes:,} B)")
    print("target: ≤ 5 s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
