"""Each framework's layout (memlib.core.frameworks): bytes per parameter, sharding, step temporaries, offload traffic."""
import json
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memlib.cli import main
from memlib.core.configs import load_config
from memlib.core.errors import MemlibError
from memlib.core.estimate import estimate_training, optimizer_step_bytes, state_bytes_per_param
from memlib.core.params import count_params
from memlib.core.frameworks import (DS_REDUCE_BUCKET, GRAD_SCALER_BYTES, bucket_bytes, gathered_bytes,
                                    layout_bytes, state_bytes)
from memlib.core.offload import offload_traffic
from memlib.core.params import count_params
from memlib.core.setup import TrainingSetup
from memlib._book.ch06_zero_fsdp import TABLE1_DP, TABLE1_PARAMS, table1

PSI = 10**9
N7 = count_params(load_config("llama-2-7b")).params


def _bpp(framework: str, precision: str = "bf16-mixed", **kw: object) -> tuple[float, float, float]:
    e = estimate_training(params=PSI, precision=precision, framework=framework, **kw)
    return e.params_bytes / PSI, e.grads_bytes / PSI, e.optimizer_bytes / PSI


def test_table1_exact_through_the_cli(capsys: pytest.CaptureFixture) -> None:
    cells = {(c.params, c.dp, c.stage): c.bytes for c in table1()}
    assert all(c.match for c in table1())
    for psi in TABLE1_PARAMS:
        for dp in (1, 16, 1024):
            for z in (1, 2, 3):  # the paper's P_os keeps all gradients: DeepSpeed's ZeRO-1 with accumulation
                assert main(["train", "--params", str(psi), "--precision", "bf16-mixed", "--optimizer", "adamw",
                             "--zero", str(z), "--gpus", str(dp), "--framework", "deepspeed", "--json",
                             "--grad-accum", "2" if z == 1 else "1"]) == 0
                data = json.loads(capsys.readouterr().out)
                assert data["total_bytes"] == cells[(psi, dp, z)]
                assert data["settings"]["framework"] == "deepspeed"
    assert set(TABLE1_DP) >= {1, 16, 1024}


def test_bytes_per_param_per_framework() -> None:
    assert _bpp("pytorch") == (4, 4, 8)  # AMP: fp32 params are the master
    assert _bpp("deepspeed") == (2, 2, 12)  # the ZeRO paper's 2 + 2 + 12
    assert _bpp("megatron") == (2, 4, 12)  # fp32 main_grad: 18 B/param
    assert sum(_bpp("megatron", zero_stage=1, num_gpus=8)) == pytest.approx(6 + 12 / 8)
    assert _bpp("fsdp2", zero_stage=3, num_gpus=8) == (0.5, 0.5, 1.0)  # (4 + 4 + 8) / 8
    assert _bpp("pytorch", zero_stage=1, num_gpus=4) == (4, 8, 2)  # ZeroRedundancyOptimizer: Adam only; DDP's buckets
    assert _bpp("pytorch", zero_stage=1, num_gpus=4, gradient_as_bucket_view=True) == (4, 4, 2)
    assert _bpp("pytorch", precision="bf16") == (2, 2, 4)
    assert _bpp("pytorch", precision="fp32") == _bpp("deepspeed", precision="fp32") == (4, 4, 8)
    fp16 = estimate_training(params=PSI, precision="fp16-mixed")
    assert fp16.optimizer_bytes == 8 * PSI + GRAD_SCALER_BYTES  # GradScaler's scale, growth tracker, found_inf
    assert state_bytes_per_param("bf16-mixed", "adamw") == (2, 2, 12)
    assert state_bytes_per_param("bf16-mixed", "adamw", "pytorch") == (4, 4, 8)
    assert layout_bytes("megatron", "bf16-mixed") == (2, 4, 4, 4)


def test_llama7b_amp_foreach_step_is_20_bytes_per_param() -> None:
    kw = dict(batch_size=1, seq_len=4096, recompute="full", precision="bf16-mixed")
    foreach = estimate_training("llama-2-7b", **kw)
    assert foreach.peak_phase == "optimizer"
    assert foreach.total_bytes / N7 == pytest.approx(20, rel=0.01)
    assert foreach.temp_bytes == 4 * N7  # _foreach_sqrt(exp_avg_sq) in fp32
    fused = estimate_training("llama-2-7b", optimizer_impl="fused", **kw)
    assert fused.total_bytes / N7 == pytest.approx(16, rel=0.03)
    assert fused.total_bytes < foreach.total_bytes
    zro = estimate_training("llama-2-7b", zero_stage=1, num_gpus=8, **kw)
    assert zro.settings["framework"] == "pytorch"
    cfg = load_config("llama-2-7b")
    assert optimizer_step_bytes(cfg, TrainingSetup(zero_stage=1, num_gpus=8), 4 * N7, N7, N7) == -(-4 * N7 // 8)


def test_deepspeed_fp32_gradient_partition_and_bucket() -> None:
    cfg = load_config("llama-2-7b")
    for z, n in ((1, 8), (2, 8)):
        s = TrainingSetup(framework="deepspeed", zero_stage=z, num_gpus=n)
        # torch.cat's flat 16-bit copy of the partition and its fp32 conversion (single_grad_partition) coexist
        assert optimizer_step_bytes(cfg, s, 0, N7, N7) == (2 + 4) * -(-N7 // n)
    # stage 0 in mixed precision is FP16_Optimizer: per-parameter fp32 gradient copies and their flat copy
    assert optimizer_step_bytes(cfg, TrainingSetup(framework="deepspeed"), 0, N7, N7) == 8 * N7
    s3 = TrainingSetup(framework="deepspeed", zero_stage=3, num_gpus=2)
    # _prepare_fp32_grad_for_sub_group: the flat 16-bit copy and its fp32 conversion of one sub-group (1e9)
    assert optimizer_step_bytes(cfg, s3, 0, N7, N7) == (2 + 4) * 10**9
    assert bucket_bytes(TrainingSetup(framework="deepspeed", zero_stage=2, num_gpus=8)) == (2 * DS_REDUCE_BUCKET, 0)
    assert bucket_bytes(s3) == (2 * DS_REDUCE_BUCKET, 2 * DS_REDUCE_BUCKET)
    assert bucket_bytes(TrainingSetup(zero_stage=1, num_gpus=8)) == (0, 0)
    off = TrainingSetup(framework="deepspeed", zero_stage=2, num_gpus=8, offload="optimizer")
    assert optimizer_step_bytes(cfg, off, 0, N7, N7) == 0 and bucket_bytes(off) == (0, 0)


def test_megatron_step_has_no_temporary_and_fsdp2_working_set() -> None:
    cfg = load_config("llama-2-7b")
    assert optimizer_step_bytes(cfg, TrainingSetup(framework="megatron"), 0, N7, N7) == 0
    layer = count_params(cfg).per_layer
    big = max(layer, cfg.vocab_size * cfg.hidden_size)
    # With CPU offload (or LoRA) the coarse working set stays: two gathered units (zero 3) or every layer (zero 2).
    s3 = TrainingSetup(framework="fsdp2", zero_stage=3, num_gpus=8, offload="params+optimizer")
    assert gathered_bytes(cfg, layer, 0, N7, N7, s3) == (2 * 2 * big, (2 + 4) * big)
    s2 = TrainingSetup(framework="fsdp2", zero_stage=2, num_gpus=8, method="lora")
    assert gathered_bytes(cfg, layer, 0, N7, N7, s2)[0] == 2 * N7  # reshard_after_forward=False keeps them all
    # Without offload FSDP2 frees its working set before the step (fsdp2_backward_bytes counts it in the
    # backward): the step's parameters are the fp32 shards alone (checked against real traces: test_trace_fsdp2).
    plain = TrainingSetup(framework="fsdp2", zero_stage=3, num_gpus=8)
    root = N7 - cfg.num_layers * layer
    assert gathered_bytes(cfg, layer, 0, N7, N7, plain)[0] == 2 * (root + 2 * layer)  # + the prefetched layer
    e = estimate_training("llama-2-7b", framework="fsdp2", zero_stage=3, num_gpus=8, seq_len=1024)
    assert e.params_bytes == -(-4 * N7 // 8)
    assert optimizer_step_bytes(cfg, plain, 0, N7, N7) == -(-4 * N7 // 8)


def test_deepspeed_offload_traffic_is_6_psi() -> None:
    ds = offload_traffic(N7, "optimizer")
    paper = offload_traffic(N7, "optimizer", implementation="zero-offload-paper")
    assert ds.link_bytes == 6 * N7 and paper.link_bytes == 4 * N7
    assert round(ds.link_bytes / 1e9, 1) == 40.4 and round(paper.link_bytes / 1e9) == 27
    with pytest.raises(MemlibError, match="zero-offload-paper"):
        offload_traffic(N7, "params+optimizer", implementation="zero-offload-paper")


@pytest.mark.parametrize("args", [["--framework", "pytorch", "--zero", "2", "--gpus", "8"],
                                  ["--framework", "fsdp2", "--zero", "1", "--gpus", "8"],
                                  ["--framework", "megatron", "--offload", "optimizer"],
                                  ["--framework", "deepspeed", "--tp", "2", "--gpus", "2"]])
def test_cli_bad_combination_exits_2(args: list[str]) -> None:
    res = subprocess.run([sys.executable, "-m", "memlib", "train", "--params", "1000000000", *args],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 2
    assert len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.stderr
    assert "valid combinations" in res.stderr


def test_framework_without_the_rung_is_refused_in_the_api() -> None:
    with pytest.raises(MemlibError, match="does not support zero 3"):
        TrainingSetup(zero_stage=3, num_gpus=8)
    with pytest.raises(MemlibError, match="ep parallelism with zero 3"):
        TrainingSetup(framework="deepspeed", zero_stage=3, num_gpus=8, ep=2)
    assert TrainingSetup(framework="deepspeed", zero_stage=2, num_gpus=8, ep=2).parallel_degrees == ("ep",)


@settings(max_examples=40, deadline=None)
@given(fw=st.sampled_from(["pytorch", "deepspeed", "fsdp2", "megatron"]), zero=st.integers(0, 3),
       n=st.integers(1, 64), psi=st.integers(10**6, 10**12),
       precision=st.sampled_from(["fp32", "bf16-mixed", "fp16-mixed", "bf16"]))
def test_sharded_states_do_not_grow_with_gpus(fw: str, zero: int, n: int, psi: int, precision: str) -> None:
    try:
        a = estimate_training(params=psi, framework=fw, zero_stage=zero, num_gpus=n, precision=precision)
    except MemlibError:
        return  # a stage the framework does not have
    b = estimate_training(params=psi, framework=fw, zero_stage=zero, num_gpus=2 * n, precision=precision)
    w, g, k = state_bytes(fw, precision, "adamw")
    # PyTorch on more than one GPU is DDP, whose Reducer buckets hold one more copy of the gradients.
    buckets = g * psi if fw == "pytorch" else 0
    # DeepSpeedZeroOptimizer clones its partition into a master copy also in fp32 and pure bf16 (ZeRO >= 1)
    master = w * psi if fw == "deepspeed" and zero >= 1 and precision in ("fp32", "bf16") else 0
    assert b.total_bytes <= a.total_bytes + (buckets if n == 1 else 0)
    assert a.total_bytes <= (w + g + k) * psi + GRAD_SCALER_BYTES + (buckets if n > 1 else 0) + master


@settings(max_examples=25, deadline=None)
@given(fw=st.sampled_from(["pytorch", "fsdp2"]), n=st.sampled_from([1, 2, 8]),
       model=st.sampled_from(["llama-2-7b", "qwen2-0.5b", "gpt2"]),
       precision=st.sampled_from(["fp32", "bf16-mixed", "bf16"]))
def test_fused_step_never_exceeds_foreach(fw: str, n: int, model: str, precision: str) -> None:
    cfg = load_config(model)
    pc = count_params(cfg)
    zero = 3 if fw == "fsdp2" else (1 if n > 1 else 0)
    s = TrainingSetup(framework=fw, zero_stage=zero, num_gpus=n, precision=precision)
    from dataclasses import replace

    fused = optimizer_step_bytes(cfg, replace(s, optimizer_impl="fused"), 0, pc.params, pc.params)
    foreach = optimizer_step_bytes(cfg, s, 0, pc.params, pc.params)
    assert fused == 0 <= foreach


def test_megatron_main_grad_is_live_through_the_backward_pass() -> None:
    # Megatron's fp32 main_grad buffer exists before the backward pass starts: its backward peak holds all of
    # it beside the saved activations, where PyTorch's gradients accumulate as activations are freed
    kw = dict(batch_size=1, seq_len=4096, precision="bf16-mixed", optimizer="adamw", recompute="full")
    mg = estimate_training("llama-2-7b", framework="megatron", **kw)
    assert mg.peak_phase == "backward"
    assert mg.total_bytes >= mg.params_bytes + mg.grads_bytes + mg.optimizer_bytes + mg.activations_bytes
    assert mg.grads_bytes == 4 * count_params("llama-2-7b").params


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
@pytest.mark.parametrize("recompute", ["none", "full"])
def test_megatron_recipe_matches_its_estimate_on_cpu(attention: str, recompute: str) -> None:
    from memlib.measure.trace import trace_training

    cfg = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 4,
           "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 512}
    kw = dict(batch_size=2, seq_len=64, precision="bf16-mixed", optimizer="adamw", attention=attention,
              recompute=recompute, framework="megatron")
    est = estimate_training(cfg, **kw)
    traced = trace_training(cfg, device="cpu", **kw)
    assert traced.by_category["grads"] == 4 * count_params(cfg).params  # main_grad, live at the backward peak
    assert est.peak_phase == traced.peak_phase == "backward"
    assert abs(est.total_bytes - traced.peak_bytes) <= 0.01 * traced.peak_bytes


def test_megatron_llama2_7b_meta_trace() -> None:
    from memlib.measure.trace import trace_training

    kw = dict(batch_size=1, seq_len=4096, precision="bf16-mixed", optimizer="adamw", recompute="full",
              framework="megatron")
    est, traced = estimate_training("llama-2-7b", **kw), trace_training("llama-2-7b", **kw)
    assert abs(est.total_bytes - traced.peak_bytes) <= 1e-4 * traced.peak_bytes
    with pytest.raises(MemlibError, match="framework 'megatron' traces mixed precision, not precision 'bf16'"):
        trace_training("llama-2-7b", precision="bf16", framework="megatron")
