"""DeepSpeed and Megatron as their code allocates (issue 42): the figures of the issue's example, pinned.

Llama-2-7B, bf16-mixed, batch 1 × 4096, full recomputation. Each figure is re-derived from the source lines
cited in :mod:`memlib.core.frameworks.deepspeed` and :mod:`memlib.core.frameworks.megatron`.
"""
from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memlib import MemlibError
from memlib.cli import main
from memlib.core.estimate import estimate_training
from memlib.core.offload import offload_traffic
from memlib.core.params import count_params
from memlib.core.plan import plan

KW = dict(batch_size=1, seq_len=4096, recompute="full", precision="bf16-mixed")
PSI = count_params("llama-2-7b").params


def _ds(**kw: object):
    return estimate_training("llama-2-7b", framework="deepspeed", **{**KW, **kw})


def test_zero3_step_flattens_a_16_bit_copy_and_gathers_nothing() -> None:
    e = _ds(zero_stage=3, num_gpus=8)
    part = -(-PSI // 8)
    assert e.peak_phase == "optimizer"
    assert e.params_bytes == -(-2 * PSI // 8)  # step() calls _partition_all_parameters() first
    assert e.temp_bytes == 6 * part + 2 * 500_000_000  # (2 + 4)·min(sub_group_size, Ψ/N) + the bucket
    assert round(e.total_bytes / 1e9, 2) == 19.53


def test_zero1_is_zero2_with_one_micro_batch_and_keeps_all_gradients_when_accumulating() -> None:
    z1, z2 = _ds(zero_stage=1, num_gpus=8), _ds(zero_stage=2, num_gpus=8)
    assert z1.total_bytes == z2.total_bytes and z1.grads_bytes == z2.grads_bytes
    z1k, z2k = _ds(zero_stage=1, num_gpus=8, grad_accum=4), _ds(zero_stage=2, num_gpus=8, grad_accum=4)
    assert z2k.total_bytes == z2.total_bytes  # ZeRO-2 reduces every micro-batch into its partition
    assert z1k.grads_bytes == 2 * PSI
    assert z1k.total_bytes - z2k.total_bytes == 2 * PSI - z2.grads_bytes  # 2Ψ(1 − 1/8), ≈ 11.8 GB
    assert round((z1k.total_bytes - z2k.total_bytes) / 1e9, 1) == 11.8


def test_stage0_mixed_is_fp16_optimizer_24_bytes_per_param() -> None:
    e = _ds(zero_stage=0, num_gpus=1)
    assert e.total_bytes >= 24 * PSI and round(24 * PSI / 1e9, 1) == 161.7
    assert e.temp_bytes == 8 * PSI  # per-parameter fp32 gradient copies + their flattened copy


def test_megatron_fp16_keeps_a_16_bit_gradient_buffer() -> None:
    e = estimate_training("llama-2-7b", framework="megatron", zero_stage=1, num_gpus=8,
                          **{**KW, "precision": "fp16-mixed"})
    assert e.params_bytes + e.grads_bytes + e.optimizer_bytes == 4 * PSI + 16 * PSI // 8  # 4 + 16/d
    assert round((e.params_bytes + e.grads_bytes + e.optimizer_bytes) / 1e9, 2) == 40.43
    bf = estimate_training("llama-2-7b", framework="megatron", zero_stage=1, num_gpus=8, **KW)
    assert bf.params_bytes + bf.grads_bytes + bf.optimizer_bytes == 6 * PSI + 12 * PSI // 8  # 6 + 12/d
    one = estimate_training(params=PSI, framework="megatron", precision="fp16-mixed")
    assert one.total_bytes == 20 * PSI  # Megatron's table: fp16 20 bytes/param


def test_deepspeed_clones_its_partition_in_fp32_and_pure_bf16() -> None:
    n = 10**9
    fp32 = estimate_training(params=n, framework="deepspeed", zero_stage=2, num_gpus=8, precision="fp32")
    assert fp32.params_bytes == 4 * n and fp32.optimizer_bytes == 12 * n // 8
    bf16 = estimate_training(params=n, framework="deepspeed", zero_stage=2, num_gpus=8, precision="bf16")
    assert bf16.params_bytes == 2 * n and bf16.optimizer_bytes == 6 * n // 8  # bf16_master_weights_and_grads
    plain = estimate_training(params=n, framework="deepspeed", precision="fp32")  # stage 0: the client's optimizer
    assert plain.optimizer_bytes == 8 * n


@settings(max_examples=30, deadline=None)
@given(k=st.integers(1, 16), n=st.sampled_from([1, 2, 8, 64]))
def test_offload_traffic_counts_every_micro_batch(k: int, n: int) -> None:
    psi = 10**9 * n
    t = offload_traffic(psi, "optimizer", num_gpus=n, grad_accum_steps=k).link_bytes
    assert t == (6 if k == 1 else 4 * k + 4) * (psi // n)
    t3 = offload_traffic(psi, "optimizer", num_gpus=n, grad_accum_steps=k, zero_stage=3).link_bytes
    assert t3 == (4 * k + 6) * (psi // n)


def test_grad_accum_is_validated_and_echoed() -> None:
    with pytest.raises(MemlibError, match="grad_accum"):
        estimate_training("gpt2", grad_accum=0)
    assert "grad_accum" not in estimate_training("gpt2").settings
    assert estimate_training("gpt2", grad_accum=4).settings["grad_accum"] == 4
    with pytest.raises(MemlibError, match="grad_accum 3"):
        plan("gpt2", batch_size=4, seq_len=512, grad_accum=3)


def test_cli_grad_accum(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["train", "llama-2-7b", "--batch", "1", "--seq", "4096", "--recompute", "full", "--framework",
            "deepspeed", "--gpus", "8", "--zero", "1", "--json"]
    import json
    assert main(args) == 0
    one = json.loads(capsys.readouterr().out)
    assert main([*args, "--grad-accum", "4"]) == 0
    four = json.loads(capsys.readouterr().out)
    assert four["total_bytes"] - one["total_bytes"] == 2 * PSI - one["grads_bytes"]
    assert main(["plan", "gpt2", "--batch", "4", "--seq", "512", "--grad-accum", "2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["inputs"]["grad_accum"] == 2


def test_planner_offload_cost_counts_every_micro_batch_and_never_pairs_8_bit_adam() -> None:
    p = plan("llama-2-7b", num_gpus=8, gpu_memory=10**6, reserve=0, fragmentation=0, batch_size=4, seq_len=4096,
             framework="deepspeed")
    off = next(s for s in p.steps if s.technique == "CPU offload")
    assert off.settings["optimizer"] == "adamw"  # DeepSpeedCPUAdam steps offloaded states; no 8-bit kernels
    k = off.settings["accumulation_steps"]
    assert k == 4
    gb = offload_traffic(PSI, off.settings["offload"], num_gpus=8, grad_accum_steps=k,
                         zero_stage=off.settings["zero_stage"]).link_bytes / 1e9
    assert f"≈ {gb:,.1f} GB over PCIe per step" in off.cost
    for s in p.steps:
        assert not (s.settings["offload"] != "none" and s.settings["optimizer"] == "adamw-8bit")


def test_grad_accum_dtype_fp32_is_bf16_optimizer_with_an_unsharded_fp32_buffer() -> None:
    """``BF16_Optimizer``: 2 + 2 + 4 + 12/N bytes/param of states, the backward epilogue's flatten on top."""
    e = _ds(zero_stage=1, num_gpus=8, grad_accum_dtype="fp32")
    assert e.params_bytes == 2 * PSI and e.grads_bytes == 6 * PSI
    assert e.optimizer_bytes == -(-12 * PSI // 8)
    assert e.settings["grad_accum_dtype"] == "fp32" and "grad_accum_dtype" not in _ds(zero_stage=1).settings
    assert e.total_bytes > _ds(zero_stage=1, num_gpus=8).total_bytes


@pytest.mark.parametrize("kw", [dict(zero_stage=2), dict(zero_stage=1, framework="pytorch"),
                                dict(zero_stage=1, precision="fp16-mixed"), dict(zero_stage=1, offload="optimizer")])
def test_grad_accum_dtype_fp32_outside_bf16_optimizer_is_one_error(kw: dict) -> None:
    with pytest.raises(MemlibError, match="grad_accum_dtype 'fp32' is DeepSpeed's BF16_Optimizer"):
        estimate_training("llama-2-7b", **{**KW, "framework": "deepspeed", "num_gpus": 8, "grad_accum_dtype": "fp32",
                                           **kw})
    with pytest.raises(MemlibError, match="grad accum dtype"):
        estimate_training("gpt2", framework="deepspeed", zero_stage=1, grad_accum_dtype="bf16")


def test_cli_grad_accum_dtype(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["train", "llama-2-7b", "--batch", "1", "--seq", "4096", "--recompute", "full", "--precision",
            "bf16-mixed", "--framework", "deepspeed", "--gpus", "8", "--zero", "1", "--json"]
    assert main([*args, "--grad-accum-dtype", "fp32"]) == 0
    assert json.loads(capsys.readouterr().out)["settings"]["grad_accum_dtype"] == "fp32"
    assert main([*args[:-2], "2", "--grad-accum-dtype", "fp32"]) == 2  # --zero 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "BF16_Optimizer" in err and "Traceback" not in err
