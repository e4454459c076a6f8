"""The step peak of Megatron-Core and TorchTitan run on CPU against memlib's estimate for their own models (issue 33).

``tests/data/engines_on_cpu.json`` (``bench/engines_on_cpu.py``) holds two training steps of each engine on one gloo
rank, measured with :class:`memlib.measure.tracker.MemoryTracker` (every live CPU storage, their peak): Megatron-Core
0.16.1's ``DistributedDataParallel`` (fp32 ``main_grad`` buffer) with its ``DistributedOptimizer``, and TorchTitan
0.3.0's ``apply_fsdp_to_decoder`` (FSDP2, bf16 compute, fp32 reduce) with fused AdamW. The second step is the
steady state (Adam's m and v are made at the first).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memlib.core.configs import load_config
from memlib.core.engines import engine_activation_terms, estimate_engine_step
from memlib.core.errors import MemlibError
from memlib.core.estimate import estimate_training

FIXTURE = json.loads((Path(__file__).parent / "data" / "engines_on_cpu.json").read_text(encoding="utf-8"))
#: The settings each engine ran with, as memlib names them (Megatron's distributed optimizer is ZeRO-1; FSDP2's
#: ``reshard_after_forward=True`` on the blocks is zero 3; Megatron's local spec on CPU is unfused attention).
SETTINGS = {"megatron-core": dict(framework="megatron", zero_stage=1, attention="eager"),
            "torchtitan": dict(framework="fsdp2", zero_stage=3, attention="sdpa")}


def _run(engine: str) -> dict:
    return next(r for r in FIXTURE["steps"] if r["engine"] == engine)


def _estimate(engine: str, device: str = "cpu") -> object:
    return estimate_engine_step(FIXTURE["config"], device=device, num_gpus=1, batch_size=FIXTURE["batch_size"],
                                seq_len=FIXTURE["seq_len"], precision="bf16-mixed", optimizer_impl="fused",
                                **SETTINGS[engine])


def test_the_record_names_the_engines_and_the_command() -> None:
    assert FIXTURE["command"] == "python bench/engines_on_cpu.py --write"
    assert {(r["engine"], r["version"]) for r in FIXTURE["steps"]} == {("megatron-core", "0.16.1"),
                                                                       ("torchtitan", "0.3.0")}
    assert all(len(r["steps"]) == 2 for r in FIXTURE["steps"])


@pytest.mark.parametrize("engine", ["megatron-core", "torchtitan"])
def test_step_peak_within_3_percent_of_the_engine(engine: str) -> None:
    """The steady-state step's peak of live bytes (forward, backward, optimizer step) against memlib's estimate."""
    measured = _run(engine)["steps"][1]["peak_bytes"]
    est = _estimate(engine)
    assert abs(est.total_bytes - measured) <= 0.03 * measured, (engine, est.total_bytes, measured)
    assert est.peak_phase == "backward"


@pytest.mark.parametrize("engine", ["megatron-core", "torchtitan"])
def test_model_states_within_3_percent_of_the_engine(engine: str) -> None:
    states, est = _run(engine)["states"], _estimate(engine)
    for name in ("params_bytes", "grads_bytes", "optimizer_bytes"):
        assert abs(getattr(est, name) - states[name]) <= 0.03 * states[name], (engine, name)


def test_megatron_buffers_are_bf16_params_and_fp32_main_grad() -> None:
    """``param_and_grad_buffer.py``: ``param_data`` bf16 and ``grad_data`` fp32 over the same padded numel (each
    param starts at a multiple of 64 values, the bucket ends at a multiple of lcm(dp, 128): ``_pad_end_of_bucket_
    if_needed``); the distributed optimizer's fp32 main params, m and v are 12 bytes per parameter."""
    rec = _run("megatron-core")
    st_ = rec["states"]
    assert st_["grads_bytes"] == 2 * st_["params_bytes"]
    assert st_["params_bytes"] // 2 % 128 == 0 and 0 <= st_["params_bytes"] // 2 - rec["params"] < 128 * 8
    assert st_["optimizer_bytes"] == 12 * rec["params"]


def test_the_engine_model_changes_only_the_activations() -> None:
    """On the GPU's kernels Megatron-Core's model (TransformerEngine) saves less than its CPU run's local spec."""
    gpu, cpu = _estimate("megatron-core", "cuda"), _estimate("megatron-core", "cpu")
    assert gpu.activations_bytes < cpu.activations_bytes
    assert (gpu.params_bytes, gpu.grads_bytes, gpu.optimizer_bytes) == (cpu.params_bytes, cpu.grads_bytes,
                                                                         cpu.optimizer_bytes)


@settings(max_examples=25, deadline=None)
@given(framework=st.sampled_from(["megatron", "fsdp2"]), gpus=st.sampled_from([1, 2, 8, 64]),
       batch=st.integers(1, 4), seq=st.sampled_from([512, 2048, 8192]))
def test_engine_states_are_the_frameworks(framework: str, gpus: int, batch: int, seq: int) -> None:
    """Whatever the settings, the engine's step has the framework's model states; only the activations differ."""
    kw = dict(framework=framework, zero_stage=1 if framework == "megatron" else 3, num_gpus=gpus, batch_size=batch,
              seq_len=seq, attention="sdpa")
    eng, tf = estimate_engine_step("llama-3-8b", **kw), estimate_training("llama-3-8b", **kw)
    assert (eng.params_bytes, eng.grads_bytes, eng.optimizer_bytes) == (tf.params_bytes, tf.grads_bytes,
                                                                         tf.optimizer_bytes)
    cfg = load_config("llama-3-8b")
    terms = engine_activation_terms(cfg, framework, batch, seq)
    assert eng.activations_bytes == sum(t.bytes * (cfg.num_layers if t.per_layer else 1) for t in terms)


@pytest.mark.parametrize(("kw", "message"), [
    (dict(framework="deepspeed"), r"unknown framework 'deepspeed'; expected one of: megatron, fsdp2"),
    (dict(framework="megatron", device="tpu"), r"unknown device 'tpu'; expected one of: cuda, cpu"),
    (dict(framework="megatron", tp=2, num_gpus=2), r"with tp/pp/cp/ep use estimate_training \(got tp\)"),
    (dict(framework="fsdp2", zero_stage=3, loss="chunked"), r"loss 'chunked' is not estimated"),
])
def test_bad_settings_get_one_error_line(kw: dict, message: str) -> None:
    with pytest.raises(MemlibError, match=message) as err:
        estimate_engine_step("llama-3-8b", **kw)
    assert "\n" not in str(err.value)


def test_a_model_the_engines_do_not_build_is_refused() -> None:
    with pytest.raises(MemlibError, match=r"model_type 'mixtral' is not one of the engines' dense models"):
        estimate_engine_step("mixtral-8x7b", framework="megatron")
