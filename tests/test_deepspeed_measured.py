"""The estimator against the real DeepSpeed engine measured on CPU (issue 42).

``tests/fixtures/deepspeed_cpu.json`` holds what ``bench/deepspeed_cpu_memory.py`` measured: DeepSpeed's engine on
two gloo ranks and one (``DS_ACCELERATOR=cpu``), a tiny Llama in bf16 with ``{"type": "Adam"}`` (FusedAdam), rank 0's live
tensor bytes and their peak over the second optimizer step (ZeRO creates Adam's m and v at the first step: the
model is the steady state). Each record names the DeepSpeed version and the command. The estimate must be within
3 % of the measured peak less the reduce bucket (5·10⁸ bf16 elements, allocated in full whatever the model), for
every record.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from memlib.core.configs import load_config
from memlib.core.estimate import estimate_training
from memlib.core.frameworks.deepspeed import DEEPSPEED
from memlib.core.frameworks.zero3_fetch import MAX_LIVE_PARAMETERS, MAX_REUSE_DISTANCE, PREFETCH_BUCKET, gathered_peak

FIXTURE = Path(__file__).parent / "fixtures" / "deepspeed_cpu.json"
ALL = json.loads(FIXTURE.read_text(encoding="utf-8"))
#: The default data types (``grad_accum_dtype`` the model's); BF16 holds the ``grad_accum_dtype`` fp32 records.
KNOBS = ("stage3_prefetch_bucket_size", "stage3_max_live_parameters", "stage3_max_reuse_distance")
DEFAULTS = [r for r in ALL if "grad_accum_dtype" not in r and not any(k in r for k in KNOBS)]
#: Two gloo ranks (most checks) and one rank (the same stages and micro-batches: ``--nproc_per_node 1``).
RECORDS = [r for r in DEFAULTS if r["world_size"] == 2]
ONE_RANK = [r for r in DEFAULTS if r["world_size"] == 1]
BF16 = [r for r in ALL if r.get("grad_accum_dtype") == "fp32"]
#: ZeRO-3 with the coordinator's knobs set (``--prefetch-bucket``, ``--max-live``, ``--max-reuse``).
TUNED = [r for r in ALL if any(k in r for k in KNOBS)]


def _config(rec: dict) -> dict:
    c = rec["config"]
    return {"model_type": "llama", **c, "rms_norm_eps": 1e-6}


def _estimate(rec: dict) -> int:
    e = estimate_training(_config(rec), batch_size=1, seq_len=rec["seq_len"], precision="bf16-mixed",
                          framework="deepspeed", zero_stage=rec["stage"], num_gpus=rec["world_size"],
                          grad_accum=rec["grad_accum"], optimizer_impl="fused",
                          grad_accum_dtype=rec.get("grad_accum_dtype", "model"))
    return e.total_bytes


def _by(stage: int, k: int) -> dict:
    return next(r for r in RECORDS if (r["stage"], r["grad_accum"]) == (stage, k))


def _less_bucket(rec: dict, total: int) -> int:
    return total - rec["reduce_bucket_bytes"]


def test_the_fixture_names_its_engine_and_command() -> None:
    for group, world in ((RECORDS, 2), (ONE_RANK, 1)):
        assert sorted((r["stage"], r["grad_accum"]) for r in group) == [(z, k) for z in range(4) for k in (1, 2)]
        assert all(r["deepspeed"] == "0.19.8" and f"--nproc_per_node {world} " in r["command"] for r in group)
    assert {r["stage"]: r["optimizer"] for r in RECORDS + ONE_RANK} == {0: "FP16_Optimizer", 1: "DeepSpeedZeroOptimizer",
                                                           2: "DeepSpeedZeroOptimizer",
                                                           3: "DeepSpeedZeroOptimizer_Stage3"}


@pytest.mark.parametrize("rec", [pytest.param(r, id=f"k{r['grad_accum']}-ranks{r['world_size']}")
                                 for r in RECORDS + ONE_RANK if r["stage"] == 0])
def test_stage0_is_fp16_optimizer_24_bytes_per_param(rec: dict) -> None:
    """Stage 0 in bf16 runs FP16_Optimizer: 2 + 2 + 12 + 8 bytes/param at the step, measured within 3 %."""
    est, measured = _estimate(rec), rec["peak_bytes"]
    assert abs(est - measured) <= 0.03 * measured
    assert round(measured / rec["params"]) == 24


def test_zero1_measures_as_zero2_with_one_micro_batch() -> None:
    z1, z2 = _by(1, 1), _by(2, 1)
    assert abs(z1["peak_bytes"] - z2["peak_bytes"]) <= 0.001 * z2["peak_bytes"]  # measured
    assert _estimate(z1) == _estimate(z2)  # estimated
    assert _by(1, 2)["peak_bytes"] > z1["peak_bytes"] and _estimate(_by(1, 2)) > _estimate(z1)


@pytest.fixture(autouse=True)
def _bench_persistence(monkeypatch: pytest.MonkeyPatch) -> None:
    """The bench sets ``stage3_param_persistence_threshold`` 0 (every parameter of the tiny model partitioned);
    the estimator's default is DeepSpeed's, 10⁵ elements, which would keep the whole tiny model whole."""
    monkeypatch.setattr(type(DEEPSPEED), "param_persistence_threshold", 0)


@pytest.mark.parametrize("rec", [pytest.param(r, id=f"zero{r['stage']}-k{r['grad_accum']}-ranks{r['world_size']}")
                                 for r in RECORDS + ONE_RANK if r["stage"] > 0])
def test_estimate_within_3_percent_of_the_engine_less_the_bucket(rec: dict) -> None:
    """Every stage and micro-batch count: ZeRO-2 with accumulation holds two gradient partitions (the last
    micro-batch's and the new one, ``copy_grads_in_partition``); ZeRO-3's forward prefetch gathers the whole tiny
    model in one coalesced call and holds it twice (flat buffer and per-parameter copies)."""
    measured, estimated = _less_bucket(rec, rec["peak_bytes"]), _less_bucket(rec, _estimate(rec))
    assert abs(estimated - measured) <= 0.03 * measured


def test_zero2_accumulation_holds_a_second_partition() -> None:
    """Measured: ZeRO-2 with two micro-batches holds about g·Ψ/N more than with one; so does the estimate."""
    one, two = _by(2, 1), _by(2, 2)
    part = 2 * -(-one["params"] // one["world_size"])
    assert abs((two["peak_bytes"] - one["peak_bytes"]) - part) <= 0.1 * part
    assert _estimate(two) - _estimate(one) == part


def _layer(rec: dict) -> tuple:
    cfg = load_config(_config(rec))
    return cfg, (rec["params"] - 2 * cfg.vocab_size * cfg.hidden_size - cfg.hidden_size) // cfg.num_layers


def test_zero3_forward_holds_the_prefetched_model_twice() -> None:
    for k in (1, 2):
        rec = _by(3, k)
        cfg, layer = _layer(rec)
        assert rec["gathered_peak_bytes"] == 2 * 2 * rec["params"]  # measured: flat buffer + copies, bf16
        assert 2 * gathered_peak(cfg, layer, persistence_threshold=0) == rec["gathered_peak_bytes"]
    assert gathered_peak(cfg, layer) == rec["params"]  # DeepSpeed's default threshold: every tensor stays whole


@pytest.mark.parametrize("rec", TUNED, ids=lambda r: "-".join(str(r.get(k)) for k in KNOBS))
def test_zero3_gathered_bytes_match_the_coordinator_to_the_byte(rec: dict) -> None:
    """The all-gather's storages at their most over a measured step (rank 0), with the prefetch bucket, the
    live-parameter cap and the reuse distance set small enough to bind on the tiny Llama: the replay of
    ``PartitionedParameterCoordinator`` gives the same bytes."""
    cfg, layer = _layer(rec)
    kw = dict(prefetch_bucket=rec.get("stage3_prefetch_bucket_size", PREFETCH_BUCKET),
              max_live=rec.get("stage3_max_live_parameters", MAX_LIVE_PARAMETERS),
              max_reuse=rec.get("stage3_max_reuse_distance", MAX_REUSE_DISTANCE))
    assert 2 * gathered_peak(cfg, layer, persistence_threshold=0, **kw) == rec["gathered_peak_bytes"]


def test_the_knob_records_span_one_module_to_the_whole_model() -> None:
    """The records test the replay where it differs: one module gathered alone (no prefetch, no reuse), the cap
    binding, and prefetch groups held twice."""
    got = sorted(r["gathered_peak_bytes"] for r in TUNED)
    psi = TUNED[0]["params"]
    assert got[0] == 2 * 512 * 128 and got[-1] > 2 * psi and len(set(got)) == len(got) == 4


@pytest.mark.parametrize("rec", BF16, ids=lambda r: f"k{r['grad_accum']}")
def test_bf16_optimizer_within_3_percent(rec: dict) -> None:
    """``grad_accum_dtype`` fp32 at stage 1 runs BF16_Optimizer: 2 + 2 + 4 + 12/N bytes/param and the engine's
    allreduce flatten at the backward epilogue, no reduce bucket; the same with one and two micro-batches."""
    assert rec["optimizer"] == "BF16_Optimizer" and rec["reduce_bucket_bytes"] == 0 and rec["stage"] == 1
    est, measured = _estimate(rec), rec["peak_bytes"]
    assert abs(est - measured) <= 0.03 * measured
    psi, n = rec["params"], rec["world_size"]
    assert measured >= (2 + 2 + 4 + 2) * psi + 12 * psi // n  # the fp32 buffer is the whole model's


def test_bf16_optimizer_fixture_has_one_and_two_micro_batches() -> None:
    assert sorted(r["grad_accum"] for r in BF16) == [1, 2]
    assert all("--grad-accum-dtype fp32" in r["command"] for r in BF16)
