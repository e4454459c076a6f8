"""Benchmark (Chapter 17): what torch.compile saves for backward, eager against compiled, and the memory–recompute
curve of ``torch._functorch.config.activation_memory_budget``, traced on CPU on a tiny Llama-3-shaped model.

Each setting runs in a fresh process (the budget is read when AOTAutograd partitions, one setting per process).
Prints a Markdown table: backend, budget, bytes saved for backward (distinct storages, parameters excluded), the
ratio to eager, backward GFLOP (``FlopCounterMode``). Inductor (C++ on CPU, about 100 s to compile here) only with
``--inductor``.
Run: python bench/compile_memory.py [--inductor] [--json PATH]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys

BUDGETS = (1.0, 0.8, 0.6, 0.4, 0.2, 0.0)


def _one(backend: str, budget: float) -> dict:
    code = ("import json; from memlib._book.ch17_kernels_and_compilers import compiled_step; "
            f"print(json.dumps(compiled_step({backend!r}, {budget})))")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--inductor", action="store_true", help="add Inductor at budget 1.0 (slow: C++ compile)")
    ap.add_argument("--json", help="also write the rows as JSON to this path")
    args = ap.parse_args()
    rows = [_one("eager", 1.0), _one("aot_eager", 1.0)]
    rows += [_one("aot_eager_decomp_partition", b) for b in BUDGETS]
    if args.inductor:
        rows.append(_one("inductor", 1.0))
    eager = rows[0]["saved_bytes"]
    print("| backend | activation_memory_budget | saved for backward (bytes) | vs eager | backward GFLOP |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['backend']} | {r['budget']} | {r['saved_bytes']:,} | {r['saved_bytes'] / eager:.2f} | "
              f"{r['backward_flops'] / 1e9:.3f} |")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    main()
