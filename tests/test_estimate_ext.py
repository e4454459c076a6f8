"""Estimator options added for chapters 4, 7 and 9: checkpoint interval, offload, LoRA/QLoRA (and their CLI)."""
from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memlib import MemlibError, count_params, load_config, shipped_models
from memlib.cli import main
from memlib.core.estimate import estimate_training
from memlib.core.lora import lora_params, qlora_base_bytes
from memlib._book.ch09_lora_qlora import frozen_linear_params


def test_lora_params_llama2_7b_matches_the_published_peft_count() -> None:
    # peft prints "trainable params: 39,976,960" for Llama-2-7B, r=16, all linear layers of the blocks
    assert lora_params("llama-2-7b", 16, "all-linear") == 39_976_960
    # q and v only (the LoRA paper's choice): 32 layers × 2 × 16 × (4096 + 4096)
    assert lora_params("llama-2-7b", 16, "qv") == 32 * 2 * 16 * 8192
    assert lora_params("llama-2-7b", 8, "attention") == 32 * 4 * 8 * 8192


def test_lora_params_gqa_uses_kv_width() -> None:
    cfg = load_config("llama-3-8b")
    per_layer = 16 * ((4096 + 4096) * 2 + (4096 + 1024) * 2 + (4096 + 14336) * 2 + (14336 + 4096))
    assert lora_params(cfg, 16) == cfg.num_layers * per_layer


@pytest.mark.parametrize("name", shipped_models())
def test_frozen_linears_are_params_minus_embeddings_norms_and_biases(name: str) -> None:
    pc = count_params(name)
    cfg = load_config(name)
    biases = pc.params - pc.embeddings - pc.lm_head - pc.norms - frozen_linear_params(cfg)
    assert 0 <= biases < 0.001 * pc.params  # what is left is biases only (qwen2/gpt2) or nothing


def test_qlora_base_bytes_double_quant_bits() -> None:
    q = frozen_linear_params("llama-2-7b")
    rest = count_params("llama-2-7b").params - q
    dq = qlora_base_bytes("llama-2-7b")
    plain = qlora_base_bytes("llama-2-7b", double_quant=False)
    assert dq == int(q * (4 + 8 / 64 + 32 / (64 * 256)) / 8) + 2 * rest
    assert plain - dq == pytest.approx(q * (0.5 - 0.127) / 8, rel=1e-3)


def test_lora_and_qlora_states() -> None:
    # full fine-tuning of the 16-bit model LoRA freezes (DeepSpeed's layout: no autocast weight copies)
    full = estimate_training("llama-2-7b", batch_size=1, seq_len=512, framework="deepspeed")
    lora = estimate_training("llama-2-7b", batch_size=1, seq_len=512, method="lora")
    qlora = estimate_training("llama-2-7b", batch_size=1, seq_len=512, method="qlora")
    n_t = 39_976_960
    assert lora.grads_bytes == qlora.grads_bytes == 4 * n_t
    assert lora.optimizer_bytes == 8 * n_t  # fp32 m and v; adapters are their own fp32 masters
    assert lora.params_bytes == 2 * count_params("llama-2-7b").params + 4 * n_t
    assert qlora.params_bytes == qlora_base_bytes("llama-2-7b") + 4 * n_t
    assert qlora.total_bytes < lora.total_bytes < full.total_bytes
    # frozen weights save less; each adapted Linear adds an fp32 copy of its input (Chapter 9 measures it)
    assert lora.activations_bytes > full.activations_bytes  # all-linear: the fp32 copies dominate
    qv = estimate_training("llama-2-7b", batch_size=1, seq_len=512, method="lora", lora_targets="qv")
    assert qv.activations_bytes < full.activations_bytes
    assert lora.settings["trainable_params"] == n_t


def test_method_needs_a_model() -> None:
    with pytest.raises(MemlibError, match="needs a model"):
        estimate_training(params=10**9, method="lora")
    with pytest.raises(MemlibError, match="lora targets"):
        estimate_training("gpt2", method="lora", lora_targets="mlp")


def test_checkpoint_every_one_is_full_recompute_and_sqrt_n_is_the_optimum() -> None:
    # a 16-bit model (DeepSpeed's layout): each kept layer input is 2·b·s·h (4·b·s·h under PyTorch AMP)
    base = estimate_training("llama-2-7b", batch_size=1, seq_len=4096, recompute="full", framework="deepspeed")
    assert estimate_training("llama-2-7b", batch_size=1, seq_len=4096, recompute="full",
                             checkpoint_every=1, framework="deepspeed") == base
    L = 32
    acts = {}
    for k in range(1, L + 1):
        est = estimate_training("llama-2-7b", batch_size=1, seq_len=4096, recompute="full", checkpoint_every=k,
                                framework="deepspeed")
        acts[k] = est.activations_bytes
    # stored inputs shrink as ceil(L/k): the saved activations never grow with k
    assert all(acts[k + 1] <= acts[k] for k in range(1, L))
    # kept + re-materialized has its minimum near sqrt(L * input / per_layer), not at 1 or L
    from memlib.core.estimate import _sum_terms, activation_terms

    per_layer, _ = _sum_terms(activation_terms("llama-2-7b", batch_size=1, seq_len=4096))
    layer_input = 2 * 4096 * 4096
    _, outside = _sum_terms(activation_terms("llama-2-7b", batch_size=1, seq_len=4096))
    assert all(acts[k] == math.ceil(L / k) * layer_input + outside for k in acts)
    # kept + re-materialized, ceil(L/k)·input + k·per_layer, is smallest near sqrt(L·input/per_layer): a
    # LLaMA layer saves ~17× its input, so for whole layers that is k = 1 (Chapter 4 shows √N on equal ops)
    cost = {k: math.ceil(L / k) * layer_input + k * per_layer for k in acts}
    k_best = min(cost, key=cost.__getitem__)
    assert abs(k_best - max(1.0, math.sqrt(L * layer_input / per_layer))) <= 1


def test_checkpoint_every_needs_full_recompute() -> None:
    with pytest.raises(MemlibError, match="checkpoint_every=4 needs recompute='full'"):
        estimate_training("gpt2", recompute="selective", checkpoint_every=4)
    with pytest.raises(MemlibError, match="checkpoint_every"):
        estimate_training("gpt2", recompute="full", checkpoint_every=0)


def test_optimizer_offload_moves_16_bytes_per_param_to_the_cpu() -> None:
    n = 7_500_000_000
    est = estimate_training(params=n, offload="optimizer", framework="deepspeed")
    assert est.optimizer_bytes == 0
    assert est.params_bytes == est.grads_bytes == 2 * n
    assert est.cpu_bytes == 12 * n + 4 * n + 2 * n  # fp32 master, m, v + fp32 gradients + pinned 16-bit partition
    sharded = estimate_training(params=n, zero_stage=2, num_gpus=8, offload="optimizer", framework="deepspeed")
    assert sharded.cpu_bytes == -(-16 * n // 8) + -(-2 * n // 8)
    assert sharded.grads_bytes == 2 * 500_000_000  # one reduce bucket: ZeRO-2 offload streams gradients out
    accum = estimate_training(params=n, zero_stage=2, num_gpus=8, offload="optimizer", framework="deepspeed",
                              grad_accum=4)
    assert accum.cpu_bytes == sharded.cpu_bytes + -(-2 * n // 8)  # accumulated_grads_in_cpu: 20Ψ/N
    stage1 = estimate_training(params=n, zero_stage=1, num_gpus=8, offload="optimizer", framework="deepspeed")
    assert stage1.grads_bytes == sharded.grads_bytes  # one micro-batch: stage 1 streams them out as stage 2
    stage1k = estimate_training(params=n, zero_stage=1, num_gpus=8, offload="optimizer", framework="deepspeed",
                                grad_accum=2)
    assert stage1k.grads_bytes == 2 * n  # with accumulation stage 1 keeps them all until the boundary


def test_param_offload_needs_stage_3_and_keeps_a_working_set() -> None:
    with pytest.raises(MemlibError, match="needs zero_stage 3"):
        estimate_training("llama-2-7b", offload="params+optimizer", zero_stage=2, framework="deepspeed")
    est = estimate_training("llama-2-7b", zero_stage=3, num_gpus=1, offload="params+optimizer", framework="deepspeed")
    n = count_params("llama-2-7b").params
    assert est.cpu_bytes == 2 * n + 16 * n + 2 * n  # + the gradient partitions' 16-bit flat buffer
    layer = count_params("llama-2-7b").per_layer
    # two gathered layers (computed + prefetched) and one layer's gradients in the backward pass, none at the step
    assert est.params_bytes == est.grads_bytes == 0
    assert est.peak_phase == "backward" and est.temp_bytes >= (2 * 2 + 2) * layer
    plain3 = estimate_training("llama-2-7b", zero_stage=3, num_gpus=1, framework="deepspeed")
    assert plain3.peak_phase == "optimizer" and plain3.params_bytes == 2 * n  # step() re-partitions everything first


@settings(max_examples=40, deadline=None)
@given(name=st.sampled_from(["gpt2", "llama-2-7b", "llama-3-8b", "qwen2-0.5b", "gemma-2b"]),
       b=st.integers(1, 8), s=st.sampled_from([128, 512, 2048]), stage=st.integers(0, 3),
       gpus=st.sampled_from([1, 2, 8]), opt=st.sampled_from(["adamw", "adamw-8bit", "sgd-momentum"]))
def test_offload_never_raises_gpu_memory_and_qlora_never_exceeds_lora(name: str, b: int, s: int, stage: int,
                                                                      gpus: int, opt: str) -> None:
    kw = dict(batch_size=b, seq_len=min(s, load_config(name).max_positions), zero_stage=stage, num_gpus=gpus,
              optimizer=opt, framework="deepspeed")
    try:
        plain = estimate_training(name, **kw)
    except MemlibError:  # bitsandbytes on a DeepSpeed ZeRO-1/2 partition above int32: refused
        assert opt == "adamw-8bit" and stage in (1, 2)
        return
    off = estimate_training(name, offload="optimizer", **kw)
    assert off.total_bytes <= plain.total_bytes
    if stage == 3:
        off3 = estimate_training(name, offload="params+optimizer", **kw)
        assert off3.total_bytes <= off.total_bytes
        assert off3.cpu_bytes >= off.cpu_bytes
    lora = estimate_training(name, method="lora", **kw)
    qlora = estimate_training(name, method="qlora", **kw)
    assert qlora.total_bytes <= lora.total_bytes
    # LoRA is not always below full fine-tuning: peft's fp32 input copies can outweigh ZeRO-sharded states
    assert lora.params_bytes + lora.grads_bytes + lora.optimizer_bytes <= (
        estimate_training(name, **{**kw, "zero_stage": 0, "num_gpus": 1}).model_states_bytes)


def test_cli_train_new_flags(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "llama-2-7b", "--method", "qlora", "--lora-rank", "64", "--recompute", "full",
                 "--checkpoint-every", "4", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["settings"]["trainable_params"] == lora_params("llama-2-7b", 64)
    assert data["settings"]["checkpoint_every"] == 4
    assert main(["train", "--params", "1000000000", "--offload", "optimizer", "--framework", "deepspeed",
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["cpu_bytes"] == 18 * 10**9


@pytest.mark.parametrize("argv, needle", [
    (["train", "gpt2", "--offload", "params+optimizer", "--framework", "deepspeed"], "needs zero_stage 3"),
    (["train", "gpt2", "--method", "dora"], "invalid choice: 'dora'"),
    (["train", "gpt2", "--lora-rank", "0"], "expected a positive integer"),
    (["train", "gpt2", "--checkpoint-every", "2"], "needs recompute='full'"),
])
def test_cli_new_flags_bad_input(argv: list[str], needle: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "memlib", *argv], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert needle in proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
