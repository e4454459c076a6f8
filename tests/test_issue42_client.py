"""Issue 42, items 5, 13, 14 and Megatron's precisions: Chapter 1's column, DeepSpeed with the client's optimizer,
bitsandbytes' int32 partitions on DeepSpeed, and Megatron-LM without a pure-bf16 mode."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from memlib._book.ch01_where_memory_goes import FRAMEWORK_COLUMNS, framework_row
from memlib.core.dtypes import GB
from memlib.core.errors import MemlibError
from memlib.core.configs import load_config
from memlib.core.estimate import estimate_training
from memlib.core.frameworks import framework_for
from memlib.core.frameworks.deepspeed_client import INT32_MAX
from memlib.core.params import count_params
from memlib.core.plan import plan
from memlib.core.setup import TrainingSetup
from memlib.core.terms import TrainingEstimate

PSI = count_params("llama-2-7b").params
RUN = dict(batch_size=1, seq_len=4096, recompute="full", precision="bf16-mixed", optimizer="adamw")


# --- item 5: Chapter 1's "on top of the states at the peak" column ------------------------------------------------
@pytest.mark.parametrize("framework, impl", [("pytorch", "foreach"), ("pytorch", "fused"), ("deepspeed", None),
                                             ("megatron", None)])
def test_chapter1_column_is_the_peak_less_the_states(framework: str, impl: str | None) -> None:
    e = estimate_training("llama-2-7b", framework=framework, optimizer_impl=impl,
                          zero_stage=1 if framework == "deepspeed" else 0, **RUN)
    row = dict(zip(FRAMEWORK_COLUMNS, framework_row(framework, e, PSI, e.total_bytes)))
    assert row["on top of the states at the peak (GB)"] == f"{(e.total_bytes - e.model_states_bytes) / GB:.1f}"
    if e.peak_phase == "backward":  # the gradients made by then are in the states column: not counted twice
        assert e.beyond_states_bytes < e.temp_bytes - e.grads_bytes // 2
        assert e.beyond_states_bytes < 3 * GB  # fused 0.3 GB, Megatron 2.8 GB (was 24.2 and 28.0)
    else:
        assert e.beyond_states_bytes == e.temp_bytes


@settings(max_examples=25, deadline=None)
@given(framework=hs.sampled_from(["pytorch", "deepspeed", "fsdp2", "megatron"]), batch=hs.integers(1, 4),
       recompute=hs.sampled_from(["none", "selective", "full"]))
def test_the_peak_never_holds_less_than_the_model_states(framework: str, batch: int, recompute: str) -> None:
    zero = {"pytorch": 0, "deepspeed": 2, "fsdp2": 3, "megatron": 1}[framework]
    e = estimate_training("gpt2", framework=framework, zero_stage=zero, num_gpus=2, batch_size=batch, seq_len=256,
                          recompute=recompute, precision="bf16-mixed")
    # never negative: the estimated peak holds at least the model states (at a backward peak the gradients made
    # by then plus the backward's moment are never below the states' gradients)
    assert e.beyond_states_bytes >= 0


# --- item 13: DeepSpeed with the client's optimizer -----------------------------------------------------------------
def test_deepspeed_config_fusedadam_ignores_optimizer_impl_but_a_client_adamw_does_not() -> None:
    kw = dict(framework="deepspeed", zero_stage=0, num_gpus=1, **RUN)
    config = {impl: estimate_training("llama-2-7b", optimizer_impl=impl, **kw).total_bytes
              for impl in ("foreach", "fused")}
    client = {impl: estimate_training("llama-2-7b", optimizer_impl=impl, optimizer_source="client", **kw)
              for impl in ("foreach", "fused")}
    assert config["foreach"] == config["fused"]  # FusedAdam from the config: optimizer_impl unused
    # FP16_UnfusedOptimizer: per-parameter fp32 gradients 4Ψ (+ foreach's √v 4Ψ): 24 B/param, fused 20
    assert client["foreach"].temp_bytes - client["fused"].temp_bytes == 4 * PSI
    assert client["fused"].temp_bytes == 4 * PSI
    assert client["foreach"].settings["optimizer_source"] == "client"


@pytest.mark.parametrize("stage", [1, 2])
def test_client_foreach_at_zero_1_2_takes_the_place_of_the_freed_16_bit_gradients(stage: int) -> None:
    kw = dict(framework="deepspeed", zero_stage=stage, num_gpus=8, **RUN)
    config = estimate_training("llama-2-7b", **kw)
    part = -(-PSI // 8)
    foreach = estimate_training("llama-2-7b", optimizer_source="client", **kw)
    loop = estimate_training("llama-2-7b", optimizer_source="client", optimizer_impl="for-loop", **kw)
    assert foreach.total_bytes == config.total_bytes  # 4 fp32 + 4 √v − 2 freed = the flatten's 6Ψ/N
    assert loop.temp_bytes == (4 + 8 - 2) * part  # √v and the quotient over the flat partition


def test_client_foreach_at_zero_3_adds_two_bytes_per_sub_group_element() -> None:
    kw = dict(framework="deepspeed", zero_stage=3, num_gpus=8, **RUN)
    part = -(-PSI // 8)
    extra = (estimate_training("llama-2-7b", optimizer_source="client", **kw).total_bytes
             - estimate_training("llama-2-7b", **kw).total_bytes)
    assert extra == 2 * part  # 4 fp32 + 4 √v against the flatten's 2 + 4


def test_client_optimizer_is_deepspeeds_only() -> None:
    with pytest.raises(MemlibError, match="expected framework: deepspeed"):
        TrainingSetup(framework="pytorch", optimizer_source="client")
    with pytest.raises(MemlibError, match="expected one of: framework, client"):
        TrainingSetup(framework="deepspeed", optimizer_source="trainer")


# --- item 13: bitsandbytes on DeepSpeed ---------------------------------------------------------------------------
@pytest.mark.parametrize("gpus, runs", [(1, False), (2, False), (3, False), (4, True), (8, True)])
def test_bitsandbytes_flat_partition_fits_int32_or_is_refused(gpus: int, runs: bool) -> None:
    kw = dict(framework="deepspeed", zero_stage=2, num_gpus=gpus, **{**RUN, "optimizer": "adamw-8bit"})
    assert (-(-PSI // gpus) <= INT32_MAX) == runs
    if runs:
        e = estimate_training("llama-2-7b", **kw)
        # one flat partition: every element in 8-bit blocks, no small-tensor fp32 states
        assert e.optimizer_bytes == -(-int(4 * PSI + 2 * PSI * (1 + 4 / 256)) // gpus)
    else:
        with pytest.raises(MemlibError, match=r"int32|2,147,483,647"):
            estimate_training("llama-2-7b", **kw)


def test_bitsandbytes_runs_on_zero_0_and_3() -> None:
    for stage in (0, 3):
        estimate_training("llama-2-7b", framework="deepspeed", zero_stage=stage, num_gpus=1,
                          **{**RUN, "optimizer": "adamw-8bit"})


def test_cli_refuses_bitsandbytes_on_a_too_large_partition_in_one_line() -> None:
    r = subprocess.run([sys.executable, "-m", "memlib", "train", "llama-2-7b", "--framework", "deepspeed", "--zero",
                        "2", "--gpus", "2", "--optimizer", "adamw-8bit", "--precision", "bf16-mixed"],
                       capture_output=True, text=True, check=False)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "2,147,483,647" in r.stderr


def test_the_planner_never_proposes_bitsandbytes_on_a_too_large_deepspeed_partition() -> None:
    p = plan("llama-2-7b", num_gpus=2, gpu_memory="80GiB", batch_size=4, seq_len=4096, framework="deepspeed")
    assert -(-PSI // 2) > INT32_MAX
    rung = next(st for st in p.steps if st.technique == "8-bit AdamW")
    assert not rung.applicable  # ZeRO-2 on 2 GPUs: the flat partition is above int32
    assert all(st.settings.get("optimizer") != "adamw-8bit" for st in p.steps)


# --- Megatron-LM has no pure bf16 ----------------------------------------------------------------------------------
def test_megatron_pure_bf16_is_refused_naming_its_precisions() -> None:
    with pytest.raises(ValueError, match="expected one of: fp32, fp16-mixed, bf16-mixed, fp8-mixed"):
        estimate_training("llama-2-7b", framework="megatron", precision="bf16")
    r = subprocess.run([sys.executable, "-m", "memlib", "train", "llama-2-7b", "--framework", "megatron",
                        "--precision", "bf16"], capture_output=True, text=True, check=False)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "bf16-mixed" in r.stderr


def test_the_planners_pure_bf16_rung_skips_megatron() -> None:
    p = plan("llama-2-7b", num_gpus=1, gpu_memory="80GiB", batch_size=1, seq_len=4096, framework="megatron")
    rung = next(st for st in p.steps if st.technique == "pure bf16")
    assert not rung.applicable


# --- measured: the real DeepSpeed 0.19.8 engine on CPU with a client torch.optim.AdamW ------------------------------
MEASURED = json.loads((Path(__file__).parent / "fixtures" / "deepspeed_client_cpu.json").read_text(encoding="utf-8"))


def _client_estimate(rec: dict) -> tuple[TrainingEstimate, int]:
    """The estimate of a measured record, and its optimizer-step moment (states + the step's temporaries)."""
    cfg = {"model_type": "llama", **rec["config"], "rms_norm_eps": 1e-6}
    setup = TrainingSetup(batch_size=1, seq_len=rec["seq_len"], precision="bf16-mixed", framework="deepspeed",
                          zero_stage=rec["stage"], num_gpus=rec["world_size"], optimizer_source="client",
                          optimizer_impl=rec["impl"])
    e = estimate_training(cfg, setup)
    n = rec["params"]
    return e, e.model_states_bytes + framework_for(setup).step_temp_bytes(load_config(cfg), setup, n, n)


def test_the_client_fixture_names_its_engine_and_command() -> None:
    assert {(r["stage"], r["impl"]) for r in MEASURED} == {(z, i) for z in range(4) for i in ("foreach", "fused")}
    assert all(r["deepspeed"] == "0.19.8" and "bench/deepspeed_client_memory.py" in r["command"] for r in MEASURED)
    assert {r["stage"]: r["optimizer"] for r in MEASURED}[0] == "FP16_UnfusedOptimizer"


@pytest.mark.parametrize("rec", MEASURED, ids=lambda r: f"zero{r['stage']}-{r['impl']}")
def test_client_optimizer_step_matches_the_measured_engine(rec: dict) -> None:
    """The optimizer step's peak, measured inside ``engine.step()``, within 3 % (ZeRO-3's includes its bucket, so
    it is compared less the bucket); at ZeRO-0 the step is the whole peak."""
    e, step = _client_estimate(rec)
    bucket = rec["reduce_bucket_bytes"] if rec["stage"] == 3 else 0
    assert abs(step - rec["step_peak_bytes"]) <= 0.03 * (rec["step_peak_bytes"] - bucket)
    if rec["stage"] == 0:
        assert e.peak_phase == "optimizer" and abs(e.total_bytes - rec["peak_bytes"]) <= 0.03 * rec["peak_bytes"]


def test_client_foreach_costs_what_the_engine_shows() -> None:
    """foreach's √v over fused, measured: 4Ψ at ZeRO-0 (per-parameter copies), 0 at ZeRO-1/2 (it takes the place of
    the freed 16-bit gradients), 2·Ψ/N at ZeRO-3 (where they stay)."""
    by = {(r["stage"], r["impl"]): r for r in MEASURED}
    n = MEASURED[0]["params"]
    for stage, extra in ((0, 4 * n), (1, 0), (2, 0), (3, 2 * n // 2)):
        measured = by[stage, "foreach"]["step_peak_bytes"] - by[stage, "fused"]["step_peak_bytes"]
        est = _client_estimate(by[stage, "foreach"])[1] - _client_estimate(by[stage, "fused"])[1]
        assert est == extra and abs(measured - extra) <= 0.01 * n
