"""Benchmark: `memlib train` estimate vs `memlib trace` (meta device) for every shipped decoder model.

Prints a table (bf16, adamw, batch 1 and 4, seq 512 and 2048 — or the model's maximum positions where that is
shorter, e.g. GPT-2's 1024 — eager and sdpa, no recomputation) and the median and max absolute error. Targets: median ≤ 3 %, max ≤ 8 %. Run: python bench/accuracy.py
"""
from __future__ import annotations

import argparse
import statistics
import sys

from memlib.configs import load_config, shipped_models
from memlib.dtypes import GB
from memlib.estimate import estimate_training
from memlib.trace import trace_training


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", default=",".join(shipped_models()))
    args = parser.parse_args(argv)
    errors: list[float] = []
    print(f"| model | attention | batch | seq | estimate GB | trace GB | error % | peak phase (est / trace) |")
    print("|---|---|---|---|---|---|---|---|")
    for model in args.models.split(","):
        limit = load_config(model).max_positions
        for attention in ("eager", "sdpa"):
            for batch in (1, 4):
                for seq in sorted({min(512, limit), min(2048, limit)}):
                    kw = dict(batch_size=batch, seq_len=seq, precision="bf16", optimizer="adamw", attention=attention)
                    est = estimate_training(model, **kw)
                    measured = trace_training(model, **kw)
                    err = 100 * (est.total_bytes - measured.peak_bytes) / measured.peak_bytes
                    errors.append(abs(err))
                    print(f"| {model} | {attention} | {batch} | {seq} | {est.total_bytes / GB:.2f} | "
                          f"{measured.peak_bytes / GB:.2f} | {err:+.2f} | {est.peak_phase} / {measured.peak_phase} |",
                          flush=True)
    median, worst = statistics.median(errors), max(errors)
    print(f"\ncases: {len(errors)}  median |error|: {median:.2f} %  max |error|: {worst:.2f} %  "
          f"(targets: median ≤ 3 %, max ≤ 8 %)")
    return 0 if median <= 3 and worst <= 8 else 1


if __name__ == "__main__":
    sys.exit(main())
