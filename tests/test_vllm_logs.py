"""memlib serve against public vLLM V1 start-up logs (tests/data/vllm_v1_logs.json, via bench/serve_vs_logs.py)."""
import importlib.util
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location(
    "serve_vs_logs", Path(__file__).resolve().parent.parent / "bench" / "serve_vs_logs.py")
logs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(logs)

RECORDS = logs.load_records()


def _checks(kind):
    return [(rec["id"], logged, ours, tol) for rec in RECORDS for k, logged, ours, tol in logs.compare(rec)
            if k == kind]


@pytest.mark.parametrize("rec", RECORDS, ids=[r["id"] for r in RECORDS])
def test_each_record_is_sourced_and_quotes_what_it_claims(rec):
    assert rec["url"] or rec["index_id"]
    text = "\n".join(rec["lines"])
    lg = rec["logged"]
    if "kv_tokens" in lg:
        assert f"GPU KV cache size: {lg['kv_tokens']:,} tokens" in text
    if "available_kv_gib" in lg:
        assert f"Available KV cache memory: {lg['available_kv_gib']}" in text
    if "model_loading_gib" in lg and rec["memlib"].get("model") and rec["url"]:
        assert f"Model loading took {lg['model_loading_gib']} GiB" in text
    if "cudagraph_estimate_gib" in lg:
        assert f"Estimated CUDA graph memory: {lg['cudagraph_estimate_gib']} GiB" in text


def test_block_arithmetic_matches_the_logged_tokens_within_the_logs_rounding():
    checks = _checks("arithmetic")
    assert len(checks) >= 3
    for rid, logged, ours, tol in checks:
        assert abs(ours / logged - 1) <= tol + 2e-4, rid


def test_weights_match_model_loading_took():
    # bf16 checkpoints within 1 %; the AWQ checkpoint against memlib's int4 layout within 5 %
    for rid, logged, ours, _ in _checks("weights"):
        assert abs(ours / logged - 1) <= (0.05 if "awq" in rid else 0.01), rid


def test_cuda_graph_estimate_within_a_fifth_of_vllms():
    checks = _checks("cudagraph")
    assert len(checks) == 2 and all(abs(ours / logged - 1) <= 0.2 for _, logged, ours, _ in checks)


def test_reported_totals_are_the_logged_ones():
    for rid, logged, ours, tol in _checks("total"):
        assert abs(ours / logged - 1) <= tol, rid


def test_whole_budget_where_the_log_gives_total_and_weights():
    # The only public V1 log found with the card's total, the utilization and the weights (vLLM 0.26, RTX 4080)
    (rid, logged, ours, _), = _checks("budget")
    assert abs(ours / logged - 1) <= 0.02, rid


def test_non_torch_memory_by_interconnect():
    by_id = {rid: (logged, ours) for rid, logged, ours, _ in _checks("non_torch")}
    logged, ours = by_id["qwen3-235b-fp8-l40s-tp4"]  # TP 4 over PCIe: NCCL only, custom all-reduce off
    assert abs(ours - logged) < 0.05
    logged, ours = by_id["qwen2.5-7b-awq-v0.26-rtx4080"]  # TP 1
    assert abs(ours - logged) < 0.25
    logged, ours = by_id["qwen3-next-80b-v0.10.2-2xh200"]  # TP 2 over NVLink: NCCL and custom all-reduce
    assert 1.0 < logged < ours < 2.5  # memlib's 2.1 GiB (issue 32's survey) is above this log's 1.38
