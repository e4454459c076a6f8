"""The numbers the model answers of the question bank quote, computed with memlib (Drills part).

A model answer in ``bank.json`` writes ``{{name}}`` where a number goes; :func:`answer_numbers` computes every
such number with memlib (never typed by hand) and :func:`memlib.drills.concepts.render_answer` fills them in.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from ..core.choices import RECOMPUTE
from ..core.configs import load_config
from ..core.dtypes import GB, GiB, MB, MiB, WEIGHT_FORMATS
from ..core.estimate import estimate_inference, state_bytes_per_param
from .engine import estimate_training  # DeepSpeed's layout: the ZeRO paper's accounting
from ..core.estimate import estimate_training as estimate_framework  # any framework, named at each call
from ..core.flops import matmul_params, palm_flops
from ..core.hardware import get_gpu
from ..core.inference import forward_activation_bytes, reserve_bytes, serving_fit
from ..core.lora import lora_params, qlora_base_bytes
from ..core.params import count_params
from ..core.serve import (DEFAULT_CUDA_GRAPH, DEFAULT_NON_TORCH, decode_bytes_per_step, decode_latency_s, serve,
                          serve_kv_bytes_per_token)
from .engine import _gb, _gib
from .numeric import korthikanti_bytes

__all__ = ["Number", "answer_numbers"]


@dataclass(frozen=True)
class Number:
    """A number quoted in a model answer. Introduced in the Drills part.

    Attributes:
        value: the formatted value with its unit (``"107.81 GB"``).
        how: the memlib computation it comes from, as a Python expression or formula.
    """

    value: str
    how: str


def _lora_params(model: str, rank: int, targets: str) -> int:
    """LoRA parameters r·(d_in + d_out) per adapted matrix, all layers; targets ``"attn"`` or ``"all"``."""
    return lora_params(model, rank, "attention" if targets == "attn" else "all-linear")


@lru_cache(maxsize=1)
def answer_numbers() -> dict[str, Number]:
    """Every number the model answers quote, computed with memlib. Introduced in the Drills part.

    Returns:
        name → :class:`Number`; the placeholders ``{{name}}`` in :data:`QUESTIONS` refer to these names.
    """
    n: dict[str, Number] = {}

    def put(key: str, value: str, how: str) -> None:
        n[key] = Number(value, how)

    p7 = count_params("llama-7b").params
    put("p7", f"{p7 / 1e9:.2f} B", "count_params('llama-7b').params")
    put("states7", _gb(16 * p7), "estimate_training('llama-7b').model_states_bytes")
    put("states7_seed", _gb(16 * 7e9, 0), "16 × 7e9 bytes")
    for att in ("sdpa", "eager"):
        e = estimate_training("llama-2-7b", batch_size=4, seq_len=4096, attention=att)
        put(f"act7_{att}", _gb(e.activations_bytes or 0, 0),
            f"estimate_training('llama-2-7b', batch_size=4, seq_len=4096, attention='{att}').activations_bytes")
        put(f"peak7_{att}", _gb(e.total_bytes, 0),
            f"estimate_training('llama-2-7b', batch_size=4, seq_len=4096, attention='{att}').total_bytes")
    for att in ("sdpa", "eager"):
        term = " + 5·a·s/h" if att == "eager" else ""
        put(f"k7_{att}", _gb(korthikanti_bytes("llama-2-7b", 4, 4096, att), 0),
            f"korthikanti_bytes('llama-2-7b', 4, 4096, '{att}'): L × s·b·h·(34{term})")
    e = estimate_training("llama-2-7b", batch_size=4, seq_len=4096, recompute="full")
    put("peak7_full", _gb(e.total_bytes, 0), "estimate_training('llama-2-7b', batch_size=4, seq_len=4096, "
        "recompute='full').total_bytes")
    # inference (the Tips notes §一)
    inf = estimate_inference("llama-7b", batch_size=8, seq_len=2048)
    put("inf7_w", _gb(inf.weights_bytes), "estimate_inference('llama-7b', batch_size=8, seq_len=2048).weights_bytes")
    put("inf7_kv", _gb(inf.kv_cache_bytes, 2),
        "estimate_inference('llama-7b', batch_size=8, seq_len=2048).kv_cache_bytes")
    put("inf7_total", _gb(inf.total_bytes), "estimate_inference('llama-7b', batch_size=8, seq_len=2048).total_bytes")
    put("inf7_total_gib", _gib(inf.total_bytes),
        "estimate_inference('llama-7b', batch_size=8, seq_len=2048).total_bytes / 2**30")
    fit = serving_fit("llama-7b", 24 * GiB, batch_size=8, seq_len=2048)
    chunked = serving_fit("llama-7b", 24 * GiB, batch_size=8, seq_len=2048, prefill_tokens=2048)
    put("serve7_total", _gb(fit.total_bytes),
        "serving_fit('llama-7b', 24 * GiB, batch_size=8, seq_len=2048).total_bytes (weights, KV, prefill "
        "activations, fragmentation, CUDA context)")
    put("serve7_short", _gb(-fit.headroom_bytes, 2), "−serving_fit('llama-7b', 24 * GiB, batch_size=8, "
        "seq_len=2048).headroom_bytes")
    put("serve7_chunked", _gb(chunked.total_bytes), "serving_fit('llama-7b', 24 * GiB, batch_size=8, "
        "seq_len=2048, prefill_tokens=2048).total_bytes")
    for fmt in ("int8", "int4", "nf4"):
        w = estimate_inference("llama-7b", weights=fmt).weights_bytes
        put(f"inf7_{fmt}", _gb(w), f"estimate_inference('llama-7b', weights='{fmt}').weights_bytes")
        put(f"save7_{fmt}", f"{100 * (1 - w / inf.weights_bytes):.0f} %", f"1 − {fmt} weights / fp16 weights")
    put("bpp_int4", f"{WEIGHT_FORMATS['int4']:.4f}", "WEIGHT_FORMATS['int4'] (0.5 + fp32 absmax per 64)")
    kv8 = estimate_inference("llama-3-8b", batch_size=8, seq_len=2048).kv_cache_bytes
    put("kv_l38b", _gb(kv8, 2), "estimate_inference('llama-3-8b', batch_size=8, seq_len=2048).kv_cache_bytes")
    kv8fp8 = estimate_inference("llama-7b", batch_size=8, seq_len=2048, kv_dtype="fp8").kv_cache_bytes
    put("kv7_fp8", _gb(kv8fp8, 2), "estimate_inference('llama-7b', batch_size=8, seq_len=2048, kv_dtype='fp8')")
    kv70 = estimate_inference("llama-2-70b", batch_size=1, seq_len=4096).kv_cache_bytes
    put("kv70", _gb(kv70, 2), "estimate_inference('llama-2-70b', batch_size=1, seq_len=4096).kv_cache_bytes")
    c70 = load_config("llama-2-70b")
    put("kv70_mha", _gb(kv70 * c70.num_heads // c70.num_kv_heads, 2), "the same with 64 KV heads (no GQA)")
    # max batch, llama-2-13b fp16 on an "80 GB" card (80 GiB) at 4096 tokens
    w13 = estimate_inference("llama-2-13b", batch_size=1, seq_len=4096)
    put("w13", _gb(w13.weights_bytes), "estimate_inference('llama-2-13b').weights_bytes")
    put("kv13_per_seq", _gb(w13.kv_cache_bytes, 2), "estimate_inference('llama-2-13b', seq_len=4096).kv_cache_bytes")
    put("maxbatch13", str(int((80 * GiB - w13.weights_bytes) // w13.kv_cache_bytes)),
        "⌊(80 GiB − weights) / KV per sequence⌋")
    put("gpu80_gb", _gb(80 * GiB), "80 × 2**30 bytes: an \"80 GB\" GPU holds 80 GiB")
    # activations and recomputation, Llama-2-7B (LLaMA-7B's architecture, 4096 positions), batch 1 × 4096
    for rec in RECOMPUTE:
        for att in ("sdpa", "eager"):
            a = estimate_training("llama-2-7b", batch_size=1, seq_len=4096, recompute=rec, attention=att)
            put(f"act1_{rec}_{att}", _gb(a.activations_bytes or 0),
                f"estimate_training('llama-2-7b', batch_size=1, seq_len=4096, recompute='{rec}', "
                f"attention='{att}').activations_bytes")
    # ZeRO, 7B over 8 GPUs
    for z in range(4):
        e = estimate_training(params=p7, zero_stage=z, num_gpus=8)
        put(f"zero{z}_7b", _gb(e.total_bytes), f"estimate_training(params={p7}, zero_stage={z}, num_gpus=8)")
    p70 = count_params("llama-2-70b").params
    put("p70", f"{p70 / 1e9:.1f} B", "count_params('llama-2-70b').params")
    n70 = next(k for k in range(1, 4097) if estimate_training(params=p70, zero_stage=3, num_gpus=k).total_bytes
               <= 80 * GiB)
    put("n70_z3", str(n70), "smallest num_gpus with estimate_training(params=Ψ70, zero_stage=3) ≤ 80 GiB")
    put("states70_z3_16", _gb(estimate_training(params=p70, zero_stage=3, num_gpus=16).total_bytes),
        "estimate_training(params=Ψ70, zero_stage=3, num_gpus=16)")
    # optimizers
    o = estimate_training("llama-7b", optimizer="adamw").optimizer_bytes
    o8 = estimate_training("llama-7b", optimizer="adamw-8bit").optimizer_bytes
    put("opt7_adamw", _gb(o), "estimate_training('llama-7b', optimizer='adamw').optimizer_bytes")
    put("opt7_8bit", _gb(o8), "estimate_training('llama-7b', optimizer='adamw-8bit').optimizer_bytes")
    put("moments7_save", _gb(o - o8), "AdamW's optimizer_bytes − 8-bit AdamW's")
    st8 = estimate_training("llama-7b", optimizer="adamw-8bit")
    put("states7_8bit", _gb(st8.model_states_bytes), "estimate_training('llama-7b', optimizer='adamw-8bit')"
        ".model_states_bytes")
    for rec in ("none", "full"):  # one GPU: plain PyTorch AMP (torch.autocast), no DeepSpeed
        e = estimate_framework("llama-2-7b", batch_size=1, seq_len=4096, optimizer="adamw-8bit", recompute=rec,
                               framework="pytorch")
        put(f"single7_8bit_{rec}", _gb(e.total_bytes), f"estimate_training('llama-2-7b', batch_size=1, seq_len=4096, "
            f"optimizer='adamw-8bit', recompute='{rec}', framework='pytorch').total_bytes")
    for impl in ("foreach", "fused"):  # PyTorch AMP's peak per parameter, by torch.optim.AdamW implementation
        e = estimate_framework("llama-2-7b", batch_size=1, seq_len=4096, recompute="full", optimizer_impl=impl,
                               framework="pytorch")
        put(f"amp7_bpp_{impl}", f"{e.total_bytes / e.settings['params']:.0f}",
            f"estimate_training('llama-2-7b', batch_size=1, seq_len=4096, recompute='full', optimizer_impl='{impl}', "
            "framework='pytorch').total_bytes / params")
    put("bpp_8bit", f"{sum(state_bytes_per_param('bf16-mixed', 'adamw-8bit')):g}",
        "sum(state_bytes_per_param('bf16-mixed', 'adamw-8bit'))")
    put("bpp_sgd", f"{sum(state_bytes_per_param('bf16-mixed', 'sgd')):g}",
        "sum(state_bytes_per_param('bf16-mixed', 'sgd'))")
    put("bpp_sgdm", f"{sum(state_bytes_per_param('bf16-mixed', 'sgd-momentum')):g}",
        "sum(state_bytes_per_param('bf16-mixed', 'sgd-momentum'))")
    put("bpp_adam", f"{sum(state_bytes_per_param('bf16-mixed', 'adamw')):g}",
        "sum(state_bytes_per_param('bf16-mixed', 'adamw'))")
    # offloading (ZeRO-Offload: fp16 params on GPU; gradients, master weights and moments on CPU)
    put("off7_gpu", _gb(2 * p7), "2Ψ (16-bit weights), Ψ = count_params('llama-7b').params")
    put("off7_cpu", _gb(estimate_training(params=p7, offload="optimizer").cpu_bytes),
        "estimate_training(params=Ψ, offload='optimizer').cpu_bytes = 16Ψ (fp32 master, m, v + fp32 gradients)")
    put("off7_pcie", f"{2 * p7 / 25e9:.2f} s", "2Ψ bytes each way (gradients down, weights up, both directions at "
        "once) / 25 GB/s per direction")
    # LoRA / QLoRA
    for tgt in ("attn", "all"):
        lp = _lora_params("llama-7b", 16, tgt)
        put(f"lora7_{tgt}", f"{lp / 1e6:.1f} M", f"r·(d_in + d_out) per adapted matrix, r = 16, targets={tgt}")
        put(f"lora7_{tgt}_pct", f"{100 * lp / p7:.2f} %", "LoRA params / count_params('llama-7b').params")
    lp = _lora_params("llama-7b", 16, "all")
    put("lora7_states", _gb(16 * lp, 2), "16 bytes × LoRA params (peft's fp32 adapter weight and grad, fp32 m, v)")
    put("lora7_frozen", _gb(2 * p7), "2Ψ: frozen bf16 base weights")
    put("dq65_save", _gb(65e9 * (WEIGHT_FORMATS["int4"] - WEIGHT_FORMATS["nf4"])),
        "65e9 × (0.5 − 0.127) bits / 8: constants without vs with double quantization")
    put("fp16_65", _gb(65e9 * 2, 0), "65e9 × 2 bytes")
    # QLoRA of LLaMA-65B on a 48 GiB card, as Chapters 9 and 13 set it: r = 64 on all linear layers, batch 1 × 512,
    # full recomputation, with the book's one reserve (1 GiB context + 5 %)
    l65 = {**load_config("llama-7b").raw, "hidden_size": 8192, "num_hidden_layers": 80, "num_attention_heads": 64,
           "num_key_value_heads": 64, "intermediate_size": 22016}
    kw65: dict[str, Any] = dict(method="qlora", lora_rank=64, precision="bf16-mixed", batch_size=1, seq_len=512,
                                recompute="full")
    # peft + bitsandbytes on one GPU: plain PyTorch AMP, as Chapter 9's table
    q32, q8 = (estimate_framework(l65, optimizer=o, framework="pytorch", **kw65) for o in ("adamw", "adamw-8bit"))
    put("nf4_65", _gb(qlora_base_bytes(l65), 2), "qlora_base_bytes(LLaMA-65B): NF4 decoder matrices, bf16 rest")
    put("lora65_r64", f"{q32.settings['trainable_params'] / 1e9:.2f} B",
        "estimate_training(LLaMA-65B, method='qlora', lora_rank=64).settings['trainable_params']")
    put("qlora65_need32", _gib(q32.total_bytes + reserve_bytes(q32.total_bytes)),
        "QLoRA r = 64, 32-bit AdamW, batch 1 × 512, full recompute, framework='pytorch': total_bytes + "
        "reserve_bytes(total_bytes)")
    put("qlora65_need8", _gib(q8.total_bytes + reserve_bytes(q8.total_bytes)),
        "the same with optimizer='adamw-8bit'")
    # attention matrix, LLaMA-7B at 8192 tokens, fp16
    c7 = load_config("llama-7b")
    head = 8192 * 8192 * 2
    put("attn_head", f"{head / MiB:.0f} MiB ({head / MB:.1f} MB)", "8192² × 2 bytes")
    put("attn_layer", _gib(head * c7.num_heads, 0), "× 32 heads")
    put("attn_model", _gib(head * c7.num_heads * c7.num_layers, 0), "× 32 heads × 32 layers")
    # the Tips notes' 7B recipe: batch 4 per GPU, accumulation 4, 8 GPUs; sequence 2048 assumed
    r = estimate_training("llama-7b", batch_size=4, seq_len=2048, zero_stage=2, num_gpus=8, recompute="full")
    rn = estimate_training("llama-7b", batch_size=4, seq_len=2048, zero_stage=2, num_gpus=8, recompute="none")
    put("recipe7", _gb(r.total_bytes), "estimate_training('llama-7b', batch_size=4, seq_len=2048, zero_stage=2, "
        "num_gpus=8, recompute='full')")
    put("recipe7_nock", _gb(rn.total_bytes), "the same with recompute='none'")
    put("recipe7_batch", str(4 * 4 * 8), "4 × 4 × 8")
    # MFU
    mm7 = matmul_params("llama-7b")
    attn7 = 12 * c7.num_layers * c7.num_heads * c7.head_dim * 2048
    per_token7 = palm_flops("llama-7b", 1, 2048) / 2048  # 6·N_matmul + 12·L·H·Q·T
    put("p7_matmul", f"{mm7 / 1e9:.2f} B", "matmul_params('llama-7b') (LM head in, embedding lookup out)")
    put("mfu7_dense", f"{6 * mm7 / 1e9:.1f} GFLOP", "6 · matmul_params('llama-7b')")
    put("mfu7_attn", f"{attn7 / 1e9:.1f} GFLOP", "12 · L · H · Q · T = 12 × 32 × 32 × 128 × 2048")
    put("mfu7_per_token", f"{per_token7 / 1e9:.1f} GFLOP", "palm_flops('llama-7b', 1, 2048) / 2048")
    a100 = get_gpu("a100-80gb").peak_flops("bf16")  # 312e12
    put("mfu7", f"{100 * per_token7 * 3000 / a100:.1f} %", "palm_flops('llama-7b', 1, 2048) / 2048 × 3000 / 312e12")
    put("mfu7_6n", f"{100 * 6 * p7 * 3000 / a100:.1f} %", "6 · count_params('llama-7b').params × 3000 / 312e12")
    put("mfu_seed", f"{100 * 100 / 312:.0f} %", "100 / 312")
    # checkpointing every √L layers
    L = c7.num_layers
    k = round(math.sqrt(L))
    put("sqrt_k", str(k), f"round(√{L})")
    put("sqrt_units", f"{math.ceil(L / k) + k}", f"⌈{L}/{k}⌉ checkpoints + {k} live layers")
    _serving_numbers(put)
    _moe_numbers(put)
    # Chapter 16: the CUDA caching allocator's rounding (memlib.core.allocator, c10's get_allocation_size)
    from ..core.allocator import get_allocation_size, round_size

    for name, nbytes in (("seg9", 9 * MiB), ("seg10", 10 * MiB), ("seg100b", 100)):
        put(name, f"{get_allocation_size(round_size(nbytes)) // MiB} MiB",
            f"get_allocation_size(round_size({nbytes:,d})): the segment a new cudaMalloc takes")
    put("block100b", f"{round_size(100)} B", "round_size(100): kMinBlockSize")
    _rl_numbers(put)
    _cluster_numbers(put)
    _chapters_1_to_8(put)
    _chapters_9_to_18(put)
    return n


def _rl_numbers(put: Callable[[str, str, str], None]) -> None:
    """The post-training questions' numbers (Chapter 18, :func:`memlib.core.rl.estimate_rl`)."""
    from dataclasses import replace

    from ..core.rl import RLSetup, estimate_rl
    from ..core.setup import TrainingSetup

    z3 = TrainingSetup(precision="bf16-mixed", framework="deepspeed", zero_stage=3, num_gpus=8, recompute="full")
    grpo = RLSetup(algo="grpo", group=8, prompt_len=512, completion_len=1024)
    call = ("estimate_rl('qwen2.5-7b', RLSetup(algo='grpo', group=8, prompt_len=512, completion_len=1024), "
            "DeepSpeed ZeRO-3 on 8 GPUs, recompute='full')")
    est = estimate_rl("qwen2.5-7b", grpo, z3)
    roll = est.phase("rollout").resident
    put("rl_kv", _gb(roll["KV cache"], 2), f"{call}: the rollout's KV cache per GPU, 8 × 1536 tokens")
    put("rl_engine_w", _gb(roll["rollout weights"], 1), "the bf16 vLLM copy of qwen2.5-7b's weights (tp 1)")
    awake = estimate_rl("qwen2.5-7b", replace(grpo, sleep_level=0), z3)
    put("rl_awake", _gib(awake.phase("training").peak_bytes, 1), f"{call} with sleep_level=0: training phase")
    put("rl_asleep", _gib(est.phase("training").peak_bytes, 1), f"{call} (sleep level 1): training phase")
    ppo = estimate_rl("qwen2.5-7b", RLSetup(algo="ppo", prompts=8), z3)
    put("rl_ppo", _gib(ppo.peak_bytes, 1), "estimate_rl('qwen2.5-7b', RLSetup(algo='ppo', prompts=8), ZeRO-3 × 8)"
        ".peak_bytes")
    put("rl_grpo", _gib(est.peak_bytes, 1), f"{call}.peak_bytes")


def _cluster_numbers(put: Callable[[str, str, str], None]) -> None:
    """The whiteboard cluster questions' numbers (issue 34: :mod:`memlib.core.cluster`)."""
    from ..core.cluster import (allreduce_time_s, critical_batch, min_gpus_serve, prefill_time,
                                ring_allreduce_bytes, train_days)

    put("td7", f"{train_days(7e9, 1e12, 64, 'h100-sxm', 0.4):.0f} days",
        "train_days(7e9, 1e12, 64, 'h100-sxm', 0.4): 6·N·D ÷ (64 × 989.5e12 × 0.4)")
    put("td7_flops", f"{6 * 7e9 * 1e12:.1e} FLOPs", "6 × 7e9 × 1e12")
    grads = 7e9 * 2
    put("ar7_gb", _gb(ring_allreduce_bytes(grads, 64), 1), "ring_allreduce_bytes(14e9, 64): 2 × 63/64 × 14 GB")
    put("ar7_s", f"{allreduce_time_s(grads, 64, 400e9 / 8):.2f} s", "allreduce_time_s(14e9, 64, 50e9)")
    put("cb_h100", f"{critical_batch('h100-sxm', 'bf16', 2.0)}", "critical_batch('h100-sxm'): ⌈ridge × 2 / 2⌉")
    put("ridge_h100", f"{get_gpu('h100-sxm').ridge_point('bf16'):.0f} FLOP/byte",
        "get_gpu('h100-sxm').ridge_point('bf16'): 989.5e12 / 3.35e12")
    put("cb_h100_fp8", f"{critical_batch('h100-sxm', 'fp8', 1.0)}", "critical_batch('h100-sxm', 'fp8', 1.0)")
    t = prefill_time("llama-3-8b", 2048)
    put("ttft8b_2k", f"{1e3 * t.seconds:.0f} ms", "prefill_time('llama-3-8b', 2048).seconds (compute-bound)")
    put("ttft8b_mem", f"{1e3 * t.memory_s:.1f} ms", "prefill_time('llama-3-8b', 2048).memory_s: weights ÷ bandwidth")
    for gpu in ("h100-sxm", "h200", "h20"):
        fit = min_gpus_serve("deepseek-v3", gpu, "fp8", concurrency=64, context_len=4096)
        put(f"v3_gpus_{gpu.split('-')[0]}", f"{fit.num_gpus}",
            f"min_gpus_serve('deepseek-v3', '{gpu}', 'fp8', concurrency=64, context_len=4096).num_gpus")
    fit = min_gpus_serve("deepseek-v3", "h200", "fp8", concurrency=64, context_len=4096)
    put("v3_w_fp8", _gb(fit.weight_bytes, 0), "count_params('deepseek-v3').params × 1 byte")
    put("v3_kv64", _gb(fit.kv_bytes, 1), "serve_kv_bytes_per_token('deepseek-v3') × 64 × 4096")
    from ..core.serve import serve_kv_bytes_per_token as kvtok

    put("pd_kv_gqa", _gb(kvtok("llama-3-70b") * 4096, 2), "serve_kv_bytes_per_token('llama-3-70b') × 4096")
    put("pd_kv_mla", _gb(kvtok("deepseek-v3") * 4096, 2), "serve_kv_bytes_per_token('deepseek-v3') × 4096")
    put("fp8_w7", _gb(7e9, 0), "7e9 parameters × 1 byte (an fp8 copy instead of bf16 saves this much)")


def _moe_numbers(put: Callable[[str, str, str], None]) -> None:
    """The MoE and MLA questions' numbers (issue 20: :mod:`memlib.core.families_moe`)."""
    from ..core.families_moe import moe_params
    from ..core.inference import kv_bytes_per_token

    mx, v3 = moe_params("mixtral-8x7b"), moe_params("deepseek-v3")
    put("mx_total", f"{mx.total / 1e9:.1f} B", "moe_params('mixtral-8x7b').total")
    put("mx_active", f"{mx.active / 1e9:.1f} B", "moe_params('mixtral-8x7b').active: 2 of 8 experts per layer")
    states = estimate_training(params=mx.total).model_states_bytes
    put("mx_states", _gb(states, 0), "estimate_training(params=moe_params('mixtral-8x7b').total): 16 bytes/param")
    put("mx_states_active", _gb(estimate_training(params=mx.active).model_states_bytes, 0),
        "estimate_training(params=moe_params('mixtral-8x7b').active)")
    put("v3_total", f"{v3.total / 1e9:.0f} B", "moe_params('deepseek-v3').total (without the MTP module)")
    put("v3_active", f"{v3.active / 1e9:.1f} B", "moe_params('deepseek-v3').active: 8 of 256 routed experts")
    put("v3_idle", f"{(v3.total - v3.active) / 1e9:.0f} B", "58 MoE layers × (256 − 8) experts × 3 × 7168 × 2048")
    put("v3_w", _gb(estimate_inference("deepseek-v3", weights="fp16", seq_len=1).weights_bytes, 0),
        "estimate_inference('deepseek-v3', weights='fp16').weights_bytes")
    # activations of one Mixtral MoE block vs Mistral-7B's dense MLP (same width 14336), b = 1, s = 2048
    from ..core.estimate import activation_terms

    moe_names = ("router", "top-k", "experts")
    mx_terms = activation_terms("mixtral-8x7b", seq_len=2048)
    moe_block = sum(t.bytes for t in mx_terms if t.name.startswith(moe_names))
    dense = next(t.bytes for t in activation_terms("mistral-7b", seq_len=2048) if t.name.startswith("MLP gate"))
    put("mx_moe_act", _gib(moe_block, 2), "sum of activation_terms('mixtral-8x7b', seq_len=2048)'s router, top-k "
        "and experts terms (one layer)")
    put("mx_dense_act", _gib(dense, 2), "activation_terms('mistral-7b', seq_len=2048): MLP gate, up, activation, "
        "product (one layer)")
    put("mx_rows", f"{2048 * 2:,}", "b·s·k = 1 × 2048 × 2 (token, expert) rows")
    c3 = load_config("deepseek-v3")
    assert c3.mla is not None
    latent = kv_bytes_per_token(c3)
    full = c3.num_layers * c3.num_heads * (c3.mla.qk_head_dim + c3.mla.v_head_dim) * 2
    put("v3_kv_tok", f"{latent / 1024:.1f} KiB", "kv_bytes_per_token('deepseek-v3'): 61 × (512 + 64) × 2 bytes")
    put("v3_kv_full", f"{full / MiB:.2f} MiB", "61 layers × 128 heads × (192 + 128) × 2 bytes: decompressed k and v")
    put("v3_kv_ratio", f"{full / latent:.0f}×", "decompressed k, v ÷ latent per token")
    put("v3_kv_128k", _gib(latent * 131072, 1), "kv_bytes_per_token('deepseek-v3') × 131,072 tokens")
    f2 = serve("deepseek-v2-lite", gpu="h100-sxm", max_model_len=8192)
    put("v2l_users", f"{f2.max_concurrent_seqs}", "serve('deepseek-v2-lite', gpu='h100-sxm', max_model_len=8192)"
        ".max_concurrent_seqs")
    put("v2l_kvtok", f"{f2.kv_bytes_per_token:,} bytes", "serve_kv_bytes_per_token('deepseek-v2-lite'): "
        "27 × (512 + 64) × 2")
    c2 = load_config("deepseek-v2-lite")
    assert c2.mla is not None
    full2 = c2.num_layers * c2.num_heads * (c2.mla.qk_head_dim + c2.mla.v_head_dim) * 2
    put("v2l_kvtok_full", f"{full2:,} bytes", "27 layers × 16 heads × (192 + 128) × 2 bytes")
    put("v2l_kv_ratio", f"{full2 / f2.kv_bytes_per_token:.1f}×", "decompressed k, v ÷ latent per token")
    v2 = moe_params(c2)
    put("v2l_total", f"{v2.total / 1e9:.1f} B", "moe_params('deepseek-v2-lite').total")
    put("v2l_active", f"{v2.active / 1e9:.1f} B", "moe_params('deepseek-v2-lite').active: 6 of 64 routed experts")


def _serving_numbers(put: Callable[[str, str, str], None]) -> None:
    """The serving questions' numbers (vLLM-style budgets from :func:`memlib.core.serve.serve`)."""
    f = serve("llama-3-8b", gpu="h100-sxm", max_model_len=8192)
    call = "serve('llama-3-8b', gpu='h100-sxm', max_model_len=8192)"
    put("srv_budget", _gib(f.budget_bytes, 0), f"{call}.budget_bytes: 0.9 × 80 GiB")
    put("srv_w", _gib(f.weights_bytes, 2), f"{call}.weights_bytes")
    put("srv_w_gb", _gb(f.weights_bytes, 2), f"{call}.weights_bytes, in GB")
    put("srv_act", _gib(f.activation_bytes, 2), f"{call}.activation_bytes: forward_activation_bytes of 2048 tokens")
    put("srv_over", _gib(DEFAULT_NON_TORCH + DEFAULT_CUDA_GRAPH, 1), "non-torch 1 GiB + CUDA graphs 0.5 GiB (memlib's)")
    put("srv_kv", _gib(f.kv_budget_bytes, 2), f"{call}.kv_budget_bytes")
    put("srv_kvtok", f"{f.kv_bytes_per_token // 1024} KiB", "serve_kv_bytes_per_token('llama-3-8b'): 2 × 32 × 8 × 128 × 2")
    put("srv_blocks", f"{f.num_blocks:,}", f"{call}.num_blocks")
    put("srv_users", f"{f.max_concurrent_seqs}", f"{call}.max_concurrent_seqs: ⌊(blocks − 1) / 512⌋")
    v1 = serve("llama-3-8b", gpu="h100-sxm", max_model_len=8192, vllm_version="0.34")
    v1call = "serve('llama-3-8b', gpu='h100-sxm', max_model_len=8192, vllm_version='0.34')"
    put("srv_v1_kv", _gib(v1.kv_budget_bytes, 1), f"{v1call}.kv_budget_bytes: vLLM V1's accounting")
    put("srv_v1_users", f"{v1.max_concurrent_seqs}", f"{v1call}.max_concurrent_seqs")
    put("srv_waste", f"{15 * f.kv_bytes_per_token / MiB:.3g} MiB", "15 tokens × serve_kv_bytes_per_token('llama-3-8b')")
    for kv in ("fp8", "int4"):
        q = serve("llama-3-8b", gpu="h100-sxm", max_model_len=8192, kv_dtype=kv)
        put(f"srv_users_{kv}", f"{q.max_concurrent_seqs}", f"serve('llama-3-8b', gpu='h100-sxm', max_model_len=8192, "
            f"kv_dtype='{kv}').max_concurrent_seqs")
    shared = 2000 // 16
    put("pfx_blocks", f"{shared}", "⌊2000 / 16⌋ full blocks of the shared prompt")
    put("pfx_save", _gib(99 * shared * f.block_bytes, 1), "99 requests × 125 blocks × 2 MiB held once instead")
    for t in (8192, 2048):
        put(f"act_{t}", _gib(forward_activation_bytes("llama-3-8b", t), 2),
            f"forward_activation_bytes('llama-3-8b', {t})")
    base70 = serve("llama-3-70b", gpu="h100-sxm", max_model_len=8192, tensor_parallel=4)
    spec70 = serve("llama-3-70b", gpu="h100-sxm", max_model_len=8192, tensor_parallel=4, draft="llama-3-8b",
                   num_speculative_tokens=4)
    c70 = "serve('llama-3-70b', gpu='h100-sxm', max_model_len=8192, tensor_parallel=4"
    put("spec_dw", _gib(spec70.draft_weights_bytes, 2), f"{c70}, draft='llama-3-8b', ...).draft_weights_bytes")
    put("spec_kv_pct", f"{100 * serve_kv_bytes_per_token('llama-3-8b', tensor_parallel=4) / base70.kv_bytes_per_token:.0f} %",
        "draft KV per token / target KV per token, per GPU")
    put("spec_users", f"{base70.max_concurrent_seqs} → {spec70.max_concurrent_seqs}",
        f"{c70}).max_concurrent_seqs without and with the draft (k = 4)")
    put("vocab_gpt2", f"{load_config('gpt2').vocab_size:,}", "load_config('gpt2').vocab_size")
    put("vocab_l3", f"{load_config('llama-3-8b').vocab_size:,}", "load_config('llama-3-8b').vocab_size")
    bw = get_gpu("h100-sxm").bandwidth_bytes_per_s
    put("h100_bw", f"{bw / 1e12:.2f} TB/s", "get_gpu('h100-sxm').bandwidth_bytes_per_s")
    t1 = decode_latency_s("llama-3-8b", gpu="h100-sxm")
    put("dec_ms_b1", f"{1e3 * t1:.1f} ms", "decode_latency_s('llama-3-8b', gpu='h100-sxm'): weights ÷ bandwidth")
    put("dec_tok_s", f"{1 / t1:.0f}", "1 / decode_latency_s('llama-3-8b', gpu='h100-sxm')")
    put("mbu_150", f"{100 * 150 * decode_bytes_per_step('llama-3-8b', batch_size=1, context_len=1) / bw:.0f} %",
        "150 tokens/s × decode_bytes_per_step(...) / bandwidth")
    b64 = decode_bytes_per_step("llama-3-8b", batch_size=64, context_len=8192)
    put("dec_kv_b64", _gb(b64 - f.weights_bytes, 1), "64 × 8192 × 128 KiB of KV read per step")
    put("dec_ms_b64", f"{1e3 * b64 / bw:.1f} ms", "decode_bytes_per_step('llama-3-8b', batch_size=64, "
        "context_len=8192) / bandwidth")


def _chapters_1_to_8(put: Callable[[str, str, str], None]) -> None:
    """The numbers of the questions Chapters 1–8 once held in their own Interview sections."""
    p2 = count_params("llama-2-7b").params
    for key, framework, impl in (("foreach", "pytorch", "foreach"), ("fused", "pytorch", "fused"),
                                 ("ds", "deepspeed", None)):
        e = estimate_framework("llama-2-7b", batch_size=1, seq_len=4096, precision="bf16-mixed", optimizer="adamw",
                               recompute="full", framework=framework, optimizer_impl=impl,
                               zero_stage=1 if framework == "deepspeed" else 0)
        put(f"ch1_fw_{key}", _gb(e.total_bytes), f"estimate_training('llama-2-7b', batch_size=1, seq_len=4096, "
            f"recompute='full', framework='{framework}', optimizer_impl={impl!r}).total_bytes")
        if key == "foreach":
            put("ch1_fw_foreach_bpp", f"{e.total_bytes / p2:.1f}", "the same / count_params('llama-2-7b').params")
    amp = estimate_framework("llama-2-7b", batch_size=4, seq_len=4096, precision="bf16-mixed", optimizer="adamw",
                             framework="pytorch")
    put("ch1_amp_peak", _gb(amp.total_bytes, 0), "estimate_training('llama-2-7b', batch_size=4, seq_len=4096, "
        "framework='pytorch').total_bytes")
    _chapter_2_numbers(put)
    # Chapter 3: GradScaler's defaults (memlib.core.scaler matches torch.amp.GradScaler) and PyTorch AMP's 7B bytes
    from ..core.scaler import DynamicLossScaler

    sc = DynamicLossScaler()
    put("scaler_init", f"2{int(math.log2(sc.scale))}".translate(_SUPERSCRIPT).replace("²", "2", 1),
        "DynamicLossScaler().scale (GradScaler's init_scale)")
    put("scaler_interval", f"{sc.growth_interval}", "DynamicLossScaler().growth_interval")
    for key, bpp in (("copies7", 2), ("sqrt7", 4), ("foreach7", 20)):
        put(f"ch3_{key}", _gb(bpp * 7e9, 0), f"{bpp} × 7e9 bytes")
    _chapter_4_numbers(put)
    for key, bpp in (("bf16", 2), ("fp32", 4), ("both", 6)):  # Chapter 5: a 7B model's accumulated gradients
        put(f"ch5_grad7_{key}", _gb(bpp * 7e9, 0), f"{bpp} × 7e9 bytes")
    _chapter_6_numbers(put)
    _chapter_7_numbers(put)
    # Chapter 8: bitsandbytes' 8-bit Adam keeps m and v in uint8 plus one fp32 absmax per block (256 since 0.50)
    block, p7 = 256, count_params("llama-7b").params
    q8 = 2 * (1 + 4 / block)
    put("q8_bpp", f"{q8:.2f}", "2 × (1 + 4/256): m and v in uint8 plus an fp32 absmax per 256 values")
    put("q8_opt_ds", f"{4 + q8:.2f}", "4 (fp32 master) + 2 × (1 + 4/256)")
    put("q8_states", f"{16 - 8 + q8:.2f}", "2 + 2 + 4 + 2 × (1 + 4/256)")
    put("q8_absmax_bits", f"{32 / block:.3f}", "32 / 256 bits per value")
    put("moments7_fp32", _gb(8 * p7), "8 × count_params('llama-7b').params")
    put("moments7_8bit", _gb(q8 * p7), "2 × (1 + 4/256) × count_params('llama-7b').params")


_SUPERSCRIPT = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")


def _sci(x: float, digits: int) -> str:
    """``x`` as ``5.96 × 10⁻⁸``."""
    mant, exp = f"{x:.{digits - 1}e}".split("e")
    return f"{mant} × 10" + f"{int(exp):d}".translate(_SUPERSCRIPT)


def _chapter_2_numbers(put: Callable[[str, str, str], None]) -> None:
    """Chapter 2's format facts (:mod:`memlib.core.formats`, bit-exact with PyTorch)."""
    from ..core import formats as fm

    props = {f: fm.format_properties(f) for f in ("fp32", "fp16", "bf16", "fp8_e4m3", "fp8_e5m2")}
    h, b = props["fp16"], props["bf16"]
    put("fp16_min_sub", _sci(h.min_subnormal, 3), "format_properties('fp16').min_subnormal = 2**-24")
    put("fp16_min_normal", _sci(h.min_normal, 3), "format_properties('fp16').min_normal = 2**-14")
    put("fp16_max", f"{h.max_normal:.0f}", "format_properties('fp16').max_normal")
    put("bf16_min_normal", _sci(b.min_normal, 2), "format_properties('bf16').min_normal")
    put("bf16_max", _sci(b.max_normal, 2), "format_properties('bf16').max_normal")
    for what in ("min_subnormal", "min_normal"):
        put(f"fp16_{what}_bits", f"`{fm.encode(getattr(h, what), 'fp16').grouped}`", f"encode({what}, 'fp16')")
    for f in ("fp32", "fp16", "bf16"):
        put(f"{f}_digits", f"{props[f].decimal_digits:.1f}", f"format_properties('{f}').decimal_digits")
        put(f"{f}_half_eps", _sci(props[f].eps / 2, 2), f"format_properties('{f}').eps / 2")
    for f in ("fp8_e4m3", "fp8_e5m2"):
        put(f"{f}_max", f"{props[f].max_normal:.0f}", f"format_properties('{f}').max_normal")
    e5 = props["fp8_e5m2"]
    put("e5m2_binades", f"{math.log2(e5.max_normal / e5.min_subnormal):.0f}", "log2(max_normal / min_subnormal)")
    for x in (65519, 65520, 1e-9):
        put(f"fp16_of_{x:g}".replace("-", "m"), f"{fm.encode(x, 'fp16').value:g}", f"encode({x:g}, 'fp16').value")
    put("e4m3_of_500", f"{fm.encode(500, 'fp8_e4m3').value:g}",
        "encode(500, 'fp8_e4m3').value (saturating, as float8_e4m3fn)")


def _chapter_4_numbers(put: Callable[[str, str, str], None]) -> None:
    """Chapter 4's checkpointing numbers: PyTorch AMP step peaks (the chapter's traces match these estimates)."""
    from ..core.activations import activation_terms

    peaks = {}
    for model, b, s in (("gpt2", 16, 1024), ("qwen2-0.5b", 8, 2048), ("llama-7b", 8, 2048)):
        none, full = (estimate_framework(model, batch_size=b, seq_len=s, precision="bf16-mixed", framework="pytorch",
                                         recompute=r).total_bytes for r in ("none", "full"))
        peaks[model] = 1 - full / none
        if model == "llama-7b":
            put("ch4_peak7_none", _gb(none, 0), "estimate_training('llama-7b', batch_size=8, seq_len=2048, "
                "framework='pytorch').total_bytes")
            put("ch4_peak7_full", _gb(full, 0), "the same with recompute='full'")
    put("ch4_peak_lo", f"{100 * min(peaks.values()):.0f}",
        "1 − full/none step peak, the least of GPT-2, Qwen2-0.5B and LLaMA-7B at 16k tokens")
    put("ch4_peak_hi", f"{100 * max(peaks.values()):.0f} %", "the same, the most")
    cfg = load_config("llama-7b")
    layer = sum(t.bytes for t in activation_terms("llama-7b", batch_size=1, seq_len=1024, precision="bf16-mixed",
                                                  attention="sdpa") if t.per_layer)
    put("ch4_p_over_i", f"{layer / (1024 * cfg.hidden_size) / 2:.0f}", "a LLaMA-7B layer's saved bytes (SDPA) / "
        "its 16-bit input 2·s·b·h")
    put("chain_k", f"{math.isqrt(64)}", "√64")


def _zero_states_bytes(params: int, stage: int, num_gpus: int) -> int:
    """The ZeRO paper's per-GPU model states (fp16 mixed precision, Adam) as DeepSpeed lays them out (Chapter 6)."""
    e = estimate_framework(params=params, zero_stage=stage, num_gpus=num_gpus, precision="fp16-mixed",
                           optimizer="adamw", framework="deepspeed", grad_accum=2 if stage == 1 else 1)
    return e.params_bytes + e.grads_bytes + e.optimizer_bytes


def _chapter_6_numbers(put: Callable[[str, str, str], None]) -> None:
    """Chapter 6's ZeRO numbers: the paper's 7.5B model on 64 GPUs, and on 16 × 32 GB V100s."""
    from ..core.frameworks import DS_REDUCE_BUCKET

    psi = 7_500_000_000
    for stage in range(4):
        put(f"zero75_64_{stage}", _gb(_zero_states_bytes(psi, stage, 64)),
            f"estimate_training(params=7.5e9, zero_stage={stage}, num_gpus=64, framework='deepspeed'): model states")
        if stage:
            put(f"zero75_16_{stage}", _gb(_zero_states_bytes(psi, stage, 16)),
                f"the same with num_gpus=16, stage {stage}")
    v100 = get_gpu("v100").memory_bytes
    put("v100_gb", _gb(v100), "get_gpu('v100').memory_bytes (32 GiB)")
    ds2 = _zero_states_bytes(psi, 2, 16) + 4 * psi // 16  # + DeepSpeed's fp32 gradient partition: 2Ψ + 18Ψ/N
    put("zero75_16_ds2", _gb(ds2), "2Ψ + 14Ψ/N + 4Ψ/N, Ψ = 7.5e9, N = 16 (DeepSpeed's ZeRO-2 estimator)")
    put("zero75_16_fp32g", _gb(4 * psi / 16), "4Ψ/N: DeepSpeed's fp32 gradient partition")
    left = [v100 - ds2 - 2 * DS_REDUCE_BUCKET - ctx for ctx in (2 * GB, 0.4 * GB)]  # CUDA context 2 .. 0.4 GB
    put("zero75_16_left_lo", f"{left[0] / GB:.0f}", "32 GiB − states − a 16-bit reduce bucket − a 2 GB context")
    put("zero75_16_left_hi", f"{left[1] / GB:.0f} GB", "the same with a 0.4 GB context (lazy loading)")


def _chapter_7_numbers(put: Callable[[str, str, str], None]) -> None:
    """Chapter 7's offload numbers (:mod:`memlib.core.offload`): bytes on each side, traffic, the step's overhead."""
    from ..core.offload import (DEFAULT_LINK_EFFICIENCY, GPU_PEAK_FLOPS, LINK_BANDWIDTH, offload_step_time,
                                offload_traffic, placement)

    for key, mode, side in (("gpu", "optimizer", "gpu"), ("host", "optimizer", "cpu"),
                            ("host3", "params+optimizer", "cpu")):
        put(f"off_bpp_{key}", f"{placement(mode).bytes_per_param(side):.0f}",
            f"placement('{mode}').bytes_per_param('{side}')")
    psi = count_params("llama-2-7b").params
    paper = offload_traffic(psi, "optimizer", implementation="zero-offload-paper").link_bytes
    put("off7_paper", _gb(paper, 0), "offload_traffic(Ψ, 'optimizer', implementation='zero-offload-paper')")
    put("off7_ds", _gb(offload_traffic(psi, "optimizer").link_bytes), "offload_traffic(Ψ, 'optimizer'): 6Ψ")
    bw4 = DEFAULT_LINK_EFFICIENCY * LINK_BANDWIDTH["pcie4"]
    put("off7_up_s", f"{2 * psi / bw4:.1f} s", "2Ψ bytes / (DEFAULT_LINK_EFFICIENCY × LINK_BANDWIDTH['pcie4'])")
    for key, impl in (("fsdp2", "fsdp2"), ("ds3", "deepspeed")):
        put(f"off_{key}_psi", f"{offload_traffic(psi, 'params+optimizer', implementation=impl).link_bytes / psi:.0f}Ψ",
            f"offload_traffic(Ψ, 'params+optimizer', implementation='{impl}').link_bytes / Ψ (per micro-batch)")
    for gpu, link in (("v100", "pcie3"), ("h100", "pcie5")):  # the Tips notes' case: 10B, 10 × 1024 tokens per step
        o = offload_step_time(10 * 10**9, 10_240, "optimizer", gpu=gpu, link=link, mfu=0.4, flops_per_token=8,
                              cpu_adam_params_per_s=4e9).overhead
        put(f"off_over_{gpu}", f"{o:+.0%}".replace("%", " %"), f"offload_step_time(10e9, 10_240, 'optimizer', "
            f"gpu='{gpu}', link='{link}', mfu=0.4, flops_per_token=8, cpu_adam_params_per_s=4e9).overhead")
    bw5 = DEFAULT_LINK_EFFICIENCY * LINK_BANDWIDTH["pcie5"]
    t30 = 0.4 * GPU_PEAK_FLOPS["h100"] * (1 / 4e9 + 2 / bw5) / (6 * 0.3)  # CPU Adam + upload = 30 % of 6·Ψ·T
    put("off_t30_h100", f"{round(t30, -3) / 1000:.0f}k",
        "tokens T at which Ψ/4e9 + 2Ψ/BW = 0.3 × 6ΨT / (0.4 × peak), H100 + PCIe5")


def _chapters_9_to_18(put: Callable[[str, str, str], None]) -> None:
    """The numbers of the questions Chapters 9–18 once answered in their own sections (issue 34: one bank)."""
    _chapters_9_10(put)
    _chapter_11(put)
    _chapter_12(put)
    _chapters_15_to_18(put)


def _chapters_9_10(put: Callable[[str, str, str], None]) -> None:
    """Chapter 9's NF4 bits and LoRA activation rule, Chapter 10's FlashAttention sizes and HBM traffic."""
    from ..core.flash import flash_io_bytes, standard_io_bytes

    bits = 8 * WEIGHT_FORMATS["nf4"]
    put("nf4_bits", f"{bits:.3f}", "8 × WEIGHT_FORMATS['nf4']: 4 + 8/64 + 32/(64·256)")
    put("nf4_bits_nodq", f"{4 + 32 / 64:g}", "4 + 32/64: one fp32 absmax per 64 weights")
    put("dq_bits", f"{bits - 4:.3f}", "8/64 + 32/(64·256) bits of constants per weight")
    put("nf4_factor", f"{16 / bits:.1f}", "16 / (8 × WEIGHT_FORMATS['nf4'])")
    put("qlora7_base", _gb(qlora_base_bytes("llama-7b"), 1), "qlora_base_bytes('llama-7b')")
    # the LoRA activations rule on Chapter 9's tiny LLaMA (the chapter's trace matches it within 64 bytes)
    tiny = {**load_config("llama-2-7b").raw, "num_hidden_layers": 2, "hidden_size": 256, "intermediate_size": 688,
            "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1024}
    kw: dict[str, Any] = {"precision": "bf16", "batch_size": 2, "seq_len": 128}
    full_acts = estimate_framework(tiny, **kw).activations_bytes or 1
    for name, targets in (("qv", "qv"), ("all", "all-linear")):
        acts = estimate_framework(tiny, method="lora", lora_rank=16, lora_targets=targets, **kw).activations_bytes
        put(f"lora_act_{name}", f"{100 * ((acts or 0) / full_acts - 1):+.0f} %",
            f"estimate_training(Chapter 9's 2-layer LLaMA, method='lora', lora_rank=16, lora_targets='{targets}', "
            "batch 2 × 128) activations ÷ full fine-tuning's − 1")
    # FlashAttention (memlib.core.flash), M = 98,304 fp16 elements = an A100 SM's 192 KB of SRAM
    c7 = load_config("llama-7b")
    put("lse_layer", f"{c7.num_heads * 8192 * 4 / MiB:.0f} MiB", "32 heads × 8192 rows × 4 bytes (fp32 log-sum-exp)")
    for name, (seq, dim, heads) in {"head": (4096, 64, 1), "layer": (8192, c7.head_dim, c7.num_heads)}.items():
        std, fa = (standard_io_bytes(seq, dim, num_heads=heads).total_bytes,
                   flash_io_bytes(seq, dim, 98304, num_heads=heads).total_bytes)
        unit, scale = ("MB", MB) if name == "head" else ("GB", GB)
        put(f"io_std_{name}", f"{std / scale:.1f} {unit}", f"standard_io_bytes({seq}, {dim}, num_heads={heads})")
        put(f"io_fa_{name}", f"{fa / scale:.1f} {unit}", f"flash_io_bytes({seq}, {dim}, 98304, num_heads={heads})")


def _chapter_11(put: Callable[[str, str, str], None]) -> None:
    """Chapter 11's numbers: 4-bit formats, the 24 GiB serving fit, KV per token, paged vs contiguous waste."""
    from ..core.serving_terms import kv_bytes_per_token

    four = {"int4, fp32 absmax per 64": 4 + 32 / 64, "GPTQ/AWQ g128, fp16 scale + 4-bit zero": 4 + (16 + 4) / 128,
            "NF4 + double quantization": 8 * WEIGHT_FORMATS["nf4"]}
    lo, hi = min(four.values()), max(four.values())
    put("int4_bits_range", f"{lo:.3g}–{hi:.3g}", "bits per weight of " + ", ".join(four))
    put("int4_save_range", f"{100 * (1 - hi / 16):.0f}–{100 * (1 - lo / 16):.0f} %", "1 − bits / 16")
    ref = estimate_inference("llama-7b", batch_size=8, seq_len=2048)
    q4 = [estimate_inference("llama-7b", batch_size=8, seq_len=2048, weights=w) for w in ("int4", "nf4")]
    saved = sorted(100 * (1 - e.total_bytes / ref.total_bytes) for e in q4)
    put("int4_total_save", f"{saved[0]:.0f}–{saved[1]:.0f} %", "1 − estimate_inference('llama-7b', batch_size=8, "
        "seq_len=2048, weights='int4' or 'nf4').total_bytes / the fp16 total")
    fit = serving_fit("llama-7b", 24 * GiB, batch_size=8, seq_len=2048)
    call = "serving_fit('llama-7b', 24 * GiB, batch_size=8, seq_len=2048)"
    put("fit24_act", _gb(fit.activation_bytes, 1), f"{call}.activation_bytes: one layer's MLP intermediates")
    put("fit24_reserve", _gb(fit.fragmentation_bytes + fit.cuda_context_bytes, 1),
        f"{call}: fragmentation (5 %) + CUDA context (1 GiB)")
    put("gpu24_gb", _gb(24 * GiB, 1), "24 × 2**30 bytes: a \"24 GB\" card holds 24 GiB")
    w8 = estimate_inference("llama-7b", weights="int8").weights_bytes
    w4 = min(e.weights_bytes for e in q4)
    put("quant_freed", f"{(ref.weights_bytes - w8) / GB:.1f}–{(ref.weights_bytes - w4) / GB:.1f} GB",
        "fp16 weights − int8 weights, − the smaller 4-bit weights (LLaMA-7B)")
    put("kv_tok_7b", f"{kv_bytes_per_token('llama-7b', 'fp16') / MiB:g} MiB", "kv_bytes_per_token('llama-7b', 'fp16')")
    for layout in ("gqa", "mha"):
        nbytes = kv_bytes_per_token("llama-2-70b", "fp16", layout=layout)
        put(f"kv70_tok_{layout}", f"{nbytes / 1024:,.0f} KiB" if nbytes < MiB else f"{nbytes / MiB:g} MiB",
            f"kv_bytes_per_token('llama-2-70b', 'fp16', layout='{layout}')")
    # lengths uniform over 1..2048: the expected waste of a 2048-token reservation and of 16-token blocks
    lengths = range(1, 2049)
    used = sum(lengths)
    put("contig_waste", f"{100 * (1 - used / (2048 * len(lengths))):.0f} %", "1 − mean length / 2048")
    paged = sum(-(-n // 16) * 16 for n in lengths)
    put("paged_waste", f"{100 * (1 - used / paged):.1f} %", "1 − Σ n / Σ ⌈n/16⌉·16 over n = 1…2048")


def _chapter_12(put: Callable[[str, str, str], None]) -> None:
    """Chapter 12's numbers: the A100's peaks behind the utilization pitfalls, one Llama-2-7B training step."""
    from ..core.flops import training_flops

    a100 = get_gpu("a100-80gb")
    assert a100.sparse_tflops_printed is not None
    put("a100_sparse", f"{a100.sparse_tflops_printed:.0f}",
        "get_gpu('a100-80gb').sparse_tflops_printed (with sparsity)")
    put("a100_bf16_fp32", f"{a100.peak_flops('bf16') / a100.peak_flops('fp32'):.0f}×",
        "get_gpu('a100-80gb').peak_flops('bf16') / .peak_flops('fp32')")
    # batch 8 × 4096 at 50 % MFU on 8 A100s
    step = training_flops("llama-2-7b", batch_size=8, seq_len=4096)
    c2 = load_config("llama-2-7b")
    n_mm, n_all = matmul_params("llama-2-7b"), count_params("llama-2-7b").params
    attn = 12 * c2.num_layers * c2.num_heads * c2.head_dim * 4096
    call = "training_flops('llama-2-7b', batch_size=8, seq_len=4096)"
    put("l2_nmm", f"{n_mm / 1e9:.2f} B", "matmul_params('llama-2-7b')")
    put("l2_nall", f"{n_all / 1e9:.2f} B", "count_params('llama-2-7b').params")
    put("l2_dense", f"{6 * n_mm / 1e9:.1f} GFLOP", "6 · matmul_params('llama-2-7b')")
    put("l2_attn", f"{attn / 1e9:.1f} GFLOP", "12 · L · H · Q · T = 12 × 32 × 32 × 128 × 4096")
    put("l2_per_tok", f"{step.per_token / 1e9:.1f} GFLOP", f"{call}.per_token")
    put("l2_6n", f"{6 * n_all / 1e9:.1f} GFLOP", "6 · count_params('llama-2-7b').params")
    put("l2_attn_pct", f"{100 * attn / step.per_token:.0f} %", "attention term ÷ FLOPs per token")
    put("l2_step_pflop", f"{step.model_flops / 1e15:.2f} PFLOP", f"{call}.model_flops")
    put("l2_step_s", f"{step.model_flops / (0.5 * 8 * a100.peak_flops('bf16')):.2f} s",
        f"{call}.model_flops / (0.5 × 8 × 312e12)")


def _chapters_15_to_18(put: Callable[[str, str, str], None]) -> None:
    """Chapter 15's pipeline bubble, Chapter 17's FP8 savings and logits, Chapter 18's rollout KV in GiB."""
    from ..core.schedules import bubble_fraction, bubble_ratio
    from ..core.serving_terms import kv_bytes_per_token

    # the bubble at p = 8, m = 16, both denominators
    for suffix, schedule in (("", "1f1b"), ("_v2", "interleaved")):
        args = f"8, 16, '{schedule}', virtual_stages=2"
        put(f"pp_idle{suffix}", f"{100 * bubble_fraction(8, 16, schedule, 2):.0f} %", f"bubble_fraction({args})")
        put(f"pp_ratio{suffix}", f"{100 * bubble_ratio(8, 16, schedule, 2):.0f} %", f"bubble_ratio({args})")
    # what FP8 recipes save on Llama-3.1-8B's activations (PyTorch AMP), and the fp32 logits of one 8K sequence
    bf16 = estimate_framework("llama-3.1-8b", precision="bf16-mixed", seq_len=8192).activations_bytes or 0
    for recipe in ("tensorwise", "blockwise"):
        fp8 = estimate_framework("llama-3.1-8b", precision="fp8-mixed", fp8_recipe=recipe, seq_len=8192)
        put(f"fp8_saved_{recipe}", _gb(bf16 - (fp8.activations_bytes or 0), 1),
            f"estimate_training('llama-3.1-8b', precision='fp8-mixed', fp8_recipe='{recipe}', seq_len=8192) "
            "activations below bf16-mixed's (PyTorch AMP)")
    put("logits_8k", _gb(4 * 8192 * load_config("llama-3.1-8b").vocab_size, 1), "4 bytes × 8192 × vocab_size")
    # the GRPO rollout's KV cache (rl_kv) in GiB: G = 8 sequences of 512 + 1024 tokens
    put("rl_kv_gib", _gib(kv_bytes_per_token("qwen2.5-7b", "bf16") * 8 * 1536, 2),
        "kv_bytes_per_token('qwen2.5-7b', 'bf16') × 8 × 1536")
