"""memlib serve against public vLLM V1 start-up logs (tests/data/vllm_v1_logs.json).

Each record holds the settings of one public vLLM >= 0.8 run and the lines it logged. A log rarely gives everything
``memlib serve`` needs (the GPU is often unnamed, the utilization sometimes cut off), so each figure is compared
on its own, from what the log gives:

- ``weights``: memlib's weights per GPU against "Model loading took X GiB";
- ``arithmetic``: the KV tokens memlib derives from the logged "Available KV cache memory" (``serve(...,
  kv_cache_memory=...)``) against "GPU KV cache size" (the logged GiB has two decimals: that rounding is the
  tolerance);
- ``cudagraph``: memlib's CUDA-graph estimate against "Estimated CUDA graph memory" (v0.20+);
- ``total``: memlib's reported total of a named card (:data:`memlib.core.vllm_engine.REPORTED_TOTAL_BYTES`) against
  the total the log prints;
- ``non_torch``: memlib's non-torch memory by TP against the log's start-up report;
- ``activation``: memlib's profiled peak against the profile's "torch peak memory increase";
- ``budget``: the whole start-up accounting, ``memlib serve`` with the logged settings and the card named (its
  own weights, the card's reported total), against "GPU KV cache size": issue 32's target;
- ``budget_given``: the same where the card is not in memlib's table but the log gives its total and the weights
  (memlib is handed those and derives the rest).

Run: ``python bench/serve_vs_logs.py``. tests/test_vllm_logs.py pins the errors.
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path

from memlib.core import vllm_engine as ve
from memlib.core.configs import load_config
from memlib.core.dtypes import GiB
from memlib.core.hardware import GPUS
from memlib.core.serve import serve

DATA = Path(__file__).resolve().parent.parent / "tests" / "data" / "vllm_v1_logs.json"
KINDS = ("weights", "arithmetic", "cudagraph", "total", "non_torch", "activation", "budget", "budget_given")


def load_records() -> list[dict]:
    """The records of tests/data/vllm_v1_logs.json."""
    return json.loads(DATA.read_text(encoding="utf-8"))["records"]


def _fit(rec: dict, **over):
    s, m = rec["settings"], rec["memlib"]
    kw = dict(max_model_len=s["max_model_len"], tensor_parallel=s["tensor_parallel"], weights=m["weights"],
              kv_dtype=m["kv_dtype"], vllm_version=rec["vllm_version"],
              gpu_memory_utilization=s["gpu_memory_utilization"] or 0.9,
              max_num_batched_tokens=s.get("max_num_batched_tokens"), max_num_seqs=s.get("max_num_seqs"))
    if "gpu_memory" not in over:
        kw["gpu"] = m["gpu"] or "h100-sxm"  # the card only matters to the budget, which these calls bypass
    kw.update(over)
    return serve(m["model"], **kw)


def compare(rec: dict) -> list[tuple[str, float, float, float]]:
    """``(kind, logged, memlib, tolerance)`` for every figure of ``rec`` memlib can be compared on.

    Figures are GiB except ``arithmetic`` and ``budget`` (tokens). ``tolerance`` is the relative error the log's
    own rounding allows (0 where the log gives the figure exactly).
    """
    s, m, lg = rec["settings"], rec["memlib"], rec["logged"]
    model, out = m.get("model"), []
    if model and "model_loading_gib" in lg:
        fit = _fit(rec, kv_cache_memory=GiB)
        out.append(("weights", lg["model_loading_gib"], fit.weights_bytes / GiB, 0.00005 / lg["model_loading_gib"]))
    if model and "available_kv_gib" in lg:
        fit = _fit(rec, kv_cache_memory=round(lg["available_kv_gib"] * GiB))
        out.append(("arithmetic", lg["kv_tokens"], fit.vllm_tokens, 0.005 / lg["available_kv_gib"]))
    if model and "cudagraph_estimate_gib" in lg:
        est = ve.cuda_graph_bytes(load_config(model), ve.get_release(rec["vllm_version"]),
                                  max_num_seqs=s["max_num_seqs"], tensor_parallel=s["tensor_parallel"],
                                  max_num_batched_tokens=s.get("max_num_batched_tokens"))
        out.append(("cudagraph", lg["cudagraph_estimate_gib"], est / GiB, 0.005 / lg["cudagraph_estimate_gib"]))
    if m.get("gpu") and "total_gib" in lg:
        out.append(("total", lg["total_gib"], ve.reported_total(m["gpu"], 0) / GiB, 0.005 / lg["total_gib"]))
    if "non_torch_gib" in lg:
        gpu = GPUS.get(m.get("gpu") or "")
        nvlink = gpu is None or (gpu.nvlink_bytes_per_s or 0) >= 600e9
        out.append(("non_torch", lg["non_torch_gib"], ve.non_torch_bytes(s["tensor_parallel"], nvlink) / GiB, 0.0))
    if model and "profile_activation_gib" in lg:
        fit = _fit(rec, kv_cache_memory=GiB)
        out.append(("activation", lg["profile_activation_gib"], fit.activation_bytes / GiB,
                    0.005 / lg["profile_activation_gib"]))
    if model and "kv_tokens" in lg and s["gpu_memory_utilization"] and m.get("gpu"):
        out.append(("budget", lg["kv_tokens"], _fit(rec).vllm_tokens, 0.0))
    elif model and "kv_tokens" in lg and s["gpu_memory_utilization"] and "total_gib" in lg and "model_loading_gib" in lg:
        fit = _fit(rec, gpu_memory=round(lg["total_gib"] * GiB), weights_bytes=round(lg["model_loading_gib"] * GiB))
        out.append(("budget_given", lg["kv_tokens"], fit.vllm_tokens, 0.005 / lg["total_gib"]))
    return out


def errors_by_kind(records: list[dict] | None = None) -> dict[str, list[tuple[str, float]]]:
    """Relative error (memlib / logged − 1) of each compared figure, by kind, with the record's id."""
    found: dict[str, list[tuple[str, float]]] = {k: [] for k in KINDS}
    for rec in records if records is not None else load_records():
        for kind, logged, ours, _tol in compare(rec):
            found[kind].append((rec["id"], ours / logged - 1))
    return found


def main() -> None:
    records = load_records()
    print(f"{'record':<34} {'vLLM':<7} {'figure':<12} {'logged':>11} {'memlib':>11} {'error':>8} {'log rounding':>12}")
    for rec in records:
        for kind, logged, ours, tol in compare(rec):
            fmt = (lambda v: f"{v:,.0f}") if kind in ("arithmetic", "budget", "budget_given") else (lambda v: f"{v:.3f}")
            print(f"{rec['id']:<34} {rec['vllm_version'] or '?':<7} {kind:<12} {fmt(logged):>11} {fmt(ours):>11} "
                  f"{100 * (ours / logged - 1):>+7.1f}% {100 * tol:>11.2f}%")
    print()
    for kind, errs in errors_by_kind(records).items():
        if errs:
            vals = [abs(e) for _, e in errs]
            print(f"{kind:<12} {len(vals)} figure(s): median |error| {100 * statistics.median(vals):.1f} %, "
                  f"max {100 * max(vals):.1f} %")
    print("\nThe whole budget needs a log with the card, the utilization and the KV tokens; most public logs omit one"
          " (tests/data/vllm_v1_logs.json's notes say which).")


if __name__ == "__main__":
    main()
