"""memlib serve against vLLM: its own KV-cache block arithmetic run on CPU, and public start-up logs.

Part 1 imports vLLM's pure-Python KV-cache spec and grouping (``vllm/v1/kv_cache_interface.py``,
``vllm/v1/core/kv_cache_utils.py``, vLLM 0.11.0 from its PyPI source distribution) and asks it for the KV
cache config of the same available memory memlib is given (``serve(..., kv_cache_memory=...)``): blocks,
logged tokens, maximum concurrency, padding layers. It needs a side environment; vLLM is never a memlib
dependency::

    curl -sO https://files.pythonhosted.org/packages/82/5a/36d2351206f4d8d871b10780f874d03957985e08298d430cc837723e07af/vllm-0.11.0.tar.gz
    tar xzf vllm-0.11.0.tar.gz -C /tmp/vllmsrc
    pip install --no-deps --target /tmp/vllmdeps cachetools cbor2 cloudpickle setproctitle aiohttp multidict \
        yarl propcache aiohappyeyeballs aiosignal frozenlist blake3 prometheus_client msgspec fastapi starlette \
        opentelemetry-api opentelemetry-sdk openai sniffio openai_harmony pybase64 diskcache
    VLLM_SRC=/tmp/vllmsrc/vllm-0.11.0 VLLM_DEPS=/tmp/vllmdeps python bench/serve_vs_vllm.py

Without them Part 1 is skipped. Part 2 needs nothing: public V0 start-up log lines (URL with each) against
``memlib serve`` with the logged settings; it prints each error and the median and maximum. The V1 logs
(vLLM >= 0.8) are in tests/data/vllm_v1_logs.json, compared figure by figure by bench/serve_vs_logs.py.
"""
from __future__ import annotations

import os
import statistics
import sys
from types import SimpleNamespace

from memlib.core.configs import load_config
from memlib.core.dtypes import GiB
from memlib.core.serve import serve, serve_kv_bytes_per_token

# (model, tensor_parallel, max_model_len, max_num_batched_tokens, available KV GiB)
ARITHMETIC_CASES = [
    ("llama-3.1-8b", 1, 8192, 8192, 40.0),
    ("qwen2.5-72b", 2, 32768, 8192, 8.0),
    ("mistral-7b", 1, 32768, 2048, 20.0),
    ("gemma-2-9b", 1, 8192, 2048, 30.0),
    ("gemma-3-27b", 1, 8192, 2048, 15.0),
    ("gemma-3-27b", 1, 32768, 8192, 15.0),
    ("qwen3-30b-a3b", 1, 40960, 8192, 12.0),
]

# Public start-up logs: settings and what vLLM logged. vllm_version is the release row whose behaviour applies.
#  url, model, gpu, tp, max_model_len, util, vllm_version, logged GPU KV tokens
PUBLIC_LOGS = [
    # V0 "Memory profiling results: total_gpu_memory=23.58GiB ... non_torch_memory=0.35GiB kv_cache_size=3.81GiB",
    # "# GPU blocks: 1952" → 31,232 tokens; 1478 blocks at 29k; 35k: chunked prefill
    ("https://github.com/vllm-project/vllm/issues/10517", "llama-3.1-8b", "rtx-3090", 1, 20000, 0.9, "0.6",
     1952 * 16),
    ("https://github.com/vllm-project/vllm/issues/10517", "llama-3.1-8b", "rtx-3090", 1, 29000, 0.9, "0.6",
     1478 * 16),
]

# Logs from releases older than the table's first row (v0.2.4, before the V0 profiler of 0.6): shown with the
# 0.6 rule, kept out of the summary. vLLM 0.2.4 took the peak as total − free after the profile, CUDA context and
# NCCL included. "# GPU blocks: 7351" (Llama-2-7B, 1 × A100-80GB) and 20865 (Llama-2-70B, TP 4), benchmark_throughput
# defaults (max_model_len 4096).
OLDER_LOGS = [
    ("https://github.com/vllm-project/vllm/pull/2031", "llama-2-7b", "a100-80gb", 1, 4096, 0.9, "0.6", 7351 * 16),
    ("https://github.com/vllm-project/vllm/pull/2031", "llama-2-70b", "a100-80gb", 4, 4096, 0.9, "0.6", 20865 * 16),
]


def _vllm_side(case: tuple) -> dict | None:
    src, deps = os.environ.get("VLLM_SRC"), os.environ.get("VLLM_DEPS")
    if not src:
        return None
    sys.path[:0] = [src] + ([deps] if deps else [])
    import torch
    from vllm.v1.core import kv_cache_utils as u
    from vllm.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec

    name, tp, length, chunk, avail_gib = case
    cfg = load_config(name)
    window = cfg.sliding_window or cfg.raw.get("sliding_window")
    kinds = cfg.layer_types or (("sliding_attention" if window else "full_attention"),) * cfg.num_layers
    heads = max(cfg.num_kv_heads // tp, 1)
    specs = {}
    for i, kind in enumerate(kinds):
        if kind == "sliding_attention":
            specs[f"layers.{i}"] = SlidingWindowSpec(16, heads, cfg.head_dim, torch.bfloat16, sliding_window=window)
        else:
            specs[f"layers.{i}"] = FullAttentionSpec(16, heads, cfg.head_dim, torch.bfloat16)
    vc = SimpleNamespace(
        model_config=SimpleNamespace(max_model_len=length),
        scheduler_config=SimpleNamespace(max_num_batched_tokens=chunk, disable_hybrid_kv_cache_manager=False),
        parallel_config=SimpleNamespace(decode_context_parallel_size=1),
        cache_config=SimpleNamespace(num_gpu_blocks_override=None))
    avail = int(avail_gib * GiB)
    kvc = u.get_kv_cache_configs(vc, [specs], [avail])[0]
    groups = len(kvc.kv_cache_groups)
    return {"num_blocks": kvc.num_blocks, "tokens": kvc.num_blocks // groups * 16,
            "concurrency": round(u.get_max_concurrency_for_kv_cache_config(vc, kvc), 2), "groups": groups}


def part1() -> None:
    print("Part 1: KV block arithmetic, memlib (vllm_version 0.11) vs vLLM 0.11.0's kv_cache_utils on CPU")
    head = f"{'model':<14} {'tp':>2} {'len':>6}  {'blocks m/v':>15} {'tokens m/v':>19} {'conc m/v':>15}  match"
    print(head)
    for case in ARITHMETIC_CASES:
        name, tp, length, chunk, avail = case
        fit = serve(name, max_model_len=length, gpu_memory="80GiB", tensor_parallel=tp, vllm_version="0.11",
                    max_num_batched_tokens=chunk, max_num_seqs=256, kv_cache_memory=int(avail * GiB),
                    weights="bf16", kv_dtype="bf16")
        v = _vllm_side(case)
        if v is None:
            print("  skipped: set VLLM_SRC (and VLLM_DEPS) to run vLLM's own arithmetic")
            return
        ok = (fit.num_blocks, fit.vllm_tokens, fit.vllm_concurrency) == (v["num_blocks"], v["tokens"],
                                                                        v["concurrency"])
        print(f"{name:<14} {tp:>2} {length:>6}  {fit.num_blocks:>7}/{v['num_blocks']:<7} "
              f"{fit.vllm_tokens:>9}/{v['tokens']:<9} {fit.vllm_concurrency:>7}/{v['concurrency']:<7}  {ok}")


def part2() -> None:
    print("\nPart 2: public start-up logs vs memlib serve (KV tokens)")
    errors = []
    for url, name, gpu, tp, length, util, version, logged in PUBLIC_LOGS:
        fit = serve(name, max_model_len=length, gpu=gpu, tensor_parallel=tp, gpu_memory_utilization=util,
                    vllm_version=version, weights="bf16")
        err = fit.vllm_tokens / logged - 1
        errors.append(abs(err))
        print(f"  {name} {gpu} tp{tp} len {length:,} vLLM {version}: logged {logged:,}, memlib "
              f"{fit.vllm_tokens:,} ({100 * err:+.1f} %)  {url}")
    print(f"  median |error| {100 * statistics.median(errors):.1f} %, max {100 * max(errors):.1f} % "
          f"over {len(errors)} logs")
    print("  older releases than the table (not in the summary):")
    for url, name, gpu, tp, length, util, version, logged in OLDER_LOGS:
        fit = serve(name, max_model_len=length, gpu=gpu, tensor_parallel=tp, gpu_memory_utilization=util,
                    vllm_version=version, weights="fp16")
        print(f"  {name} {gpu} tp{tp} len {length:,}: logged {logged:,}, memlib {fit.vllm_tokens:,} "
              f"({100 * (fit.vllm_tokens / logged - 1):+.1f} %)  {url}")


if __name__ == "__main__":
    part1()
    part2()
