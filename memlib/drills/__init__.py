"""Interview drills: the question bank, randomized numeric drills graded by memlib, and a drill mode (Drills).

Pure Python on top of the estimators (no torch, no ipywidgets). Three parts:

* :data:`QUESTIONS` — every interview question of the two source notes, the Tips notes (显存优化技巧)
  and the Strategies notes (常用的显存优化策略) (quoted in the original Chinese with an
  English translation) plus the book's own, each with a difficulty tag (E/M/H), a model answer and the
  chapter that proves it. Numbers in the answers are ``{{name}}`` placeholders filled by
  :func:`answer_numbers`, which computes them with memlib, never by hand.
* Numeric drills — :func:`generate` builds one drill of a registered kind from a seed with
  ``random.Random(seed)``; :func:`grade` checks an answer against memlib's value within the drill's tolerance.
  New kinds are one decorated function (see :func:`drill_kind`).
* Drill mode — :func:`make_drills` and :func:`drill_mode` ask N random drills and return a score,
  deterministic for a given seed.
"""
from __future__ import annotations

import math
import random
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from ..core.configs import load_config
from ..core.dtypes import GB, GiB, MB, MiB, WEIGHT_FORMATS, weight_bytes_per_param
from ..core.errors import MemlibError, check_choice, check_positive
from ..core.lora import lora_params, qlora_base_bytes
from ..core.estimate import (
    KV_DTYPES,
    estimate_inference,
    estimate_training,
    korthikanti_activation_bytes,
    state_bytes_per_param,
)
from ..core.flops import matmul_params, palm_flops
from ..core.inference import forward_activation_bytes, reserve_bytes, serving_fit
from ..core.params import count_params
from ..core.hardware import get_gpu
from ..core.serve import (DEFAULT_CUDA_GRAPH, DEFAULT_NON_TORCH, decode_bytes_per_step, decode_latency_s, serve,
                    serve_kv_bytes_per_token)

__all__ = [
    "CHAPTERS",
    "CHAPTER_PAGES",
    "DIFFICULTIES",
    "SOURCES",
    "Question",
    "Number",
    "QUESTIONS",
    "SEED_QUESTIONS_ZH",
    "answer_numbers",
    "render_answer",
    "questions",
    "find_question",
    "question_markdown",
    "chapter_markdown",
    "Drill",
    "DrillKind",
    "DRILL_KINDS",
    "drill_kind",
    "generate",
    "BYTE_UNITS",
    "MULTIPLIERS",
    "UNIT_WORDS",
    "parse_answer",
    "KORTHIKANTI_RULE",
    "korthikanti_bytes",
    "grade",
    "drill_markdown",
    "DrillResult",
    "DrillScore",
    "make_drills",
    "score",
    "drill_mode",
]

#: The book's chapters, as planned (numbers used in "proved in Chapter N").
CHAPTERS: dict[int, str] = {
    1: "Where the memory goes",
    2: "Number formats",
    3: "Mixed precision",
    4: "Activations and checkpointing",
    5: "Gradient accumulation and DDP no_sync",
    6: "ZeRO and FSDP",
    7: "Offloading",
    8: "8-bit optimizers",
    9: "LoRA, QLoRA and paged optimizers",
    10: "FlashAttention",
    11: "Inference memory and quantization",
    12: "Profiling and MFU",
    13: "Putting it together",
    14: "Serving memory",
    15: "Tensor, pipeline, context and expert parallelism",
}
#: Each chapter's page in the book (chapters/<stem>.ipynb), for the "Proved in Chapter N" links.
CHAPTER_PAGES: dict[int, str] = {
    1: "01_where_memory_goes", 2: "02_number_formats", 3: "03_mixed_precision", 4: "04_activations_checkpointing",
    5: "05_gradient_accumulation", 6: "06_zero_fsdp", 7: "07_offloading", 8: "08_8bit_optimizers",
    9: "09_lora_qlora", 10: "10_flash_attention", 11: "11_inference_memory", 12: "12_profiling",
    13: "13_putting_it_together", 14: "14_serving_memory", 15: "15_parallelism",
}
DIFFICULTIES = ("E", "M", "H")
SOURCES = ("Tips notes, top", "Tips notes §八", "Strategies notes", "book")


# --------------------------------------------------------------------------------------------------------
# Numbers the answers quote, computed with memlib
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Number:
    """A number quoted in a model answer. Introduced in the Drills part.

    Attributes:
        value: the formatted value with its unit (``"107.81 GB"``).
        how: the memlib computation it comes from, as a Python expression or formula.
    """

    value: str
    how: str


def _gb(n: float, digits: int = 1) -> str:
    return f"{n / GB:,.{digits}f} GB"


def _gib(n: float, digits: int = 1) -> str:
    return f"{n / GiB:,.{digits}f} GiB"


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
    for rec in ("none", "selective", "full"):
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
    for rec in ("none", "full"):
        e = estimate_training("llama-2-7b", batch_size=1, seq_len=4096, optimizer="adamw-8bit", recompute=rec)
        put(f"single7_8bit_{rec}", _gb(e.total_bytes), f"estimate_training('llama-2-7b', batch_size=1, seq_len=4096, "
            f"optimizer='adamw-8bit', recompute='{rec}').total_bytes")
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
    q32, q8 = (estimate_training(l65, optimizer=o, **kw65) for o in ("adamw", "adamw-8bit"))
    put("nf4_65", _gb(qlora_base_bytes(l65), 2), "qlora_base_bytes(LLaMA-65B): NF4 decoder matrices, bf16 rest")
    put("lora65_r64", f"{q32.settings['trainable_params'] / 1e9:.2f} B",
        "estimate_training(LLaMA-65B, method='qlora', lora_rank=64).settings['trainable_params']")
    put("qlora65_need32", _gib(q32.total_bytes + reserve_bytes(q32.total_bytes)),
        "QLoRA r = 64, 32-bit AdamW, batch 1 × 512, full recompute: total_bytes + reserve_bytes(total_bytes)")
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
    put("mfu7", f"{100 * per_token7 * 3000 / 312e12:.1f} %", "palm_flops('llama-7b', 1, 2048) / 2048 × 3000 / 312e12")
    put("mfu7_6n", f"{100 * 6 * p7 * 3000 / 312e12:.1f} %", "6 · count_params('llama-7b').params × 3000 / 312e12")
    put("mfu_seed", f"{100 * 100 / 312:.0f} %", "100 / 312")
    # checkpointing every √L layers
    L = c7.num_layers
    k = round(math.sqrt(L))
    put("sqrt_k", str(k), f"round(√{L})")
    put("sqrt_units", f"{math.ceil(L / k) + k}", f"⌈{L}/{k}⌉ checkpoints + {k} live layers")
    _serving_numbers(put)
    _moe_numbers(put)
    return n


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


_PLACEHOLDER = re.compile(r"\{\{(\w+)\}\}")


# --------------------------------------------------------------------------------------------------------
# The question bank
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Question:
    """One interview question with its model answer. Introduced in the Drills part.

    Attributes:
        id: stable identifier (``"s000-top-1"`` for the Tips notes' questions, ``"s004-1"`` for the
            Strategies notes', ``"b06-2"`` for the book's).
        chapter: the chapter that proves the answer (see :data:`CHAPTERS`).
        difficulty: ``"E"`` (easy), ``"M"`` (medium) or ``"H"`` (hard).
        topic: a short topic tag (``"ZeRO"``).
        text: the question in English (a translation for the source notes' questions).
        answer: the model answer in MyST Markdown; ``{{name}}`` placeholders are numbers from
            :func:`answer_numbers`.
        source: ``"Tips notes, top"``, ``"Tips notes §八"``, ``"Strategies notes"`` or ``"book"``.
        text_zh: the original Chinese wording, for the source notes' questions ("" for the book's own).
    """

    id: str
    chapter: int
    difficulty: str
    topic: str
    text: str
    answer: str
    source: str = "book"
    text_zh: str = ""

    def __post_init__(self) -> None:
        check_choice("difficulty", self.difficulty, DIFFICULTIES)
        check_choice("source", self.source, SOURCES)
        check_choice("chapter", self.chapter, CHAPTERS)


def _q(id: str, chapter: int, difficulty: str, topic: str, text: str, answer: str, source: str = "book",
       text_zh: str = "") -> Question:
    return Question(id, chapter, difficulty, topic, " ".join(text.split()), " ".join(answer.split()), source,
                    text_zh)


#: The 16 interview questions of the two source notes, verbatim (the Tips notes: 6 at the top and 4 in §八; the
#: Strategies notes: 6 at the end).
SEED_QUESTIONS_ZH: tuple[str, ...] = (
    "训练一个模型需要多少显存？怎么计算？",
    "梯度检查点（Gradient Checkpointing）牺牲了什么换显存？",
    "FP16 和 BF16 的区别，训练时用哪个？",
    "为什么 Adam 优化器比 SGD 占更多显存？",
    "ZeRO 的三个阶段分别分片什么？",
    "Flash Attention 如何节省显存？",
    "为什么 Adam 比 SGD 多占 3 倍显存？",
    "梯度检查点一定选每隔一层保存吗？",
    "显存不够训练时，优先用哪个优化手段？",
    "FSDP 和 ZeRO-3 是什么关系？",
    "如何估算一个nB大模型推理和训练分别需要多少显存？",
    "Gradient Checkpointing 的原理是什么？它是如何节省显存的？",
    "梯度累积 (Gradient Accumulation) 的作用是什么？",
    "什么是Offloading？有什么优缺点？",
    "为什么量化能节省显存？INT4量化能节省多少显存？",
    "LoRA为什么能大幅减少显存占用？",
)

_T, _S8, _S4 = "Tips notes, top", "Tips notes §八", "Strategies notes"

QUESTIONS: tuple[Question, ...] = (
    # ---------------------------------------------------------------- the Tips notes, the six at the top
    _q("s000-top-1", 1, "M", "training memory", "How much GPU memory does training a model need, and how do you "
       "compute it?", """
       Add the five consumers. Model states with mixed-precision AdamW are 16 bytes per parameter: 2 (16-bit
       weights) + 2 (16-bit gradients) + 12 (fp32 master weights, m, v). LLaMA-7B has {{p7}} parameters, so
       16Ψ = {{states7}} (the Tips notes' 16 × 7e9 = {{states7_seed}} rounds Ψ up). Then activations, which grow
       with batch × sequence × layers and depend on the attention kernel: at batch 4 × 4096 tokens Llama-2-7B
       saves {{act7_sdpa}} with SDPA/FlashAttention and {{act7_eager}} with eager attention. Then temporaries
       (the loss's fp32 logits, the optimizer step's buffers). memlib's estimate of the peak is {{peak7_sdpa}}
       (SDPA), checked within 3 % against a traced step — not the Tips notes' 150–170 GB. Recomputation brings it to
       {{peak7_full}}.""", _T, SEED_QUESTIONS_ZH[0]),
    _q("s000-top-2", 4, "E", "checkpointing", "What does gradient checkpointing give up in exchange for memory?",
       """
       Compute. Only some activations (the checkpoints, e.g. each block's input) are kept in the forward
       pass; the rest are recomputed from the nearest checkpoint during the backward pass — roughly one extra
       forward pass, about a third more compute for a training step (forward ≈ 1/3 of forward + backward).
       Nothing else changes: the gradients are bit-for-bit the same up to non-deterministic kernels. For
       Llama-2-7B at batch 1 × 4096 with SDPA, full recomputation cuts saved activations from
       {{act1_none_sdpa}} to {{act1_full_sdpa}}.""", _T, SEED_QUESTIONS_ZH[1]),
    _q("s000-top-3", 2, "E", "formats", "FP16 vs BF16: what is the difference, and which one do you train with?",
       """
       Both are 16 bits. FP16 is 1 + 5 + 10 (sign, exponent, mantissa): range ≈ 6 × 10⁻⁸ (subnormal) to 65504,
       3.3 decimal digits. BF16 is 1 + 8 + 7: FP32's exponent, so FP32's range (10⁻³⁸ … 3 × 10³⁸), 2.4 digits.
       Train in BF16 where the hardware has it (A100, H100, TPU): no overflow, no gradient underflow, no loss
       scaling. FP16 (V100, T4) needs dynamic loss scaling. Either way, master weights stay in FP32
       (Chapter 3).""", _T, SEED_QUESTIONS_ZH[2]),
    _q("s000-top-4", 1, "E", "optimizers", "Why does the Adam optimizer take more GPU memory than SGD?", """
       Adam keeps two moments per parameter, m and v, in fp32: 8 bytes/param. Plain SGD keeps none, SGD with
       momentum one (4 bytes). With mixed precision both also keep the fp32 master weights (4 bytes), so model
       states are {{bpp_sgd}} bytes/param for SGD, {{bpp_sgdm}} with momentum and {{bpp_adam}} for Adam. For
       LLaMA-7B Adam's optimizer states alone are {{opt7_adamw}}.""", _T, SEED_QUESTIONS_ZH[3]),
    _q("s000-top-5", 6, "M", "ZeRO", "What does each of ZeRO's three stages shard?", """
       Stage 1 shards the optimizer states (fp32 master weights, m, v) across the N data-parallel GPUs;
       stage 2 also the gradients; stage 3 also the 16-bit parameters. Per GPU with mixed-precision Adam:
       16Ψ → 4Ψ + 12Ψ/N → 2Ψ + 14Ψ/N → 16Ψ/N. (The Tips notes' "4Φ + 14Φ/N" (their Φ is Ψ) for ZeRO-2 is wrong: it is
       2Ψ + 14Ψ/N.) A 7B model ({{p7}} params) over 8 GPUs: {{zero0_7b}}, {{zero1_7b}}, {{zero2_7b}},
       {{zero3_7b}} of model states per GPU. Activations are not sharded by any stage.""", _T,
       SEED_QUESTIONS_ZH[4]),
    _q("s000-top-6", 10, "M", "FlashAttention", "How does FlashAttention save memory?", """
       It never stores the N×N scores or probabilities. Q, K, V are processed in tiles in on-chip SRAM with an
       online softmax (running max and normalizer per row), so only the output and one log-sum-exp per row go
       to HBM; the backward pass recomputes each probability tile from them. Memory goes from O(N²) to O(N) per
       head: for a LLaMA-7B-sized model (32 heads, 32 layers) at 8192 tokens in fp16 one N×N matrix is {{attn_head}} per head, {{attn_layer}} per
       layer and {{attn_model}} for the 32 layers, per sample — all avoided.""", _T, SEED_QUESTIONS_ZH[5]),
    # ---------------------------------------------------------------- the Tips notes §八
    _q("s000-8-1", 1, "M", "optimizers", "Why does Adam take 3 times more memory than SGD?", """
       The "3×" compares Adam's 12 bytes/param of optimizer state (fp32 master 4 + m 4 + v 4) with a 4-byte fp32
       parameter. Against the 2-byte working weights of mixed precision it is 6×, and against SGD's total it is
       {{bpp_adam}} vs {{bpp_sgd}} bytes/param of model states (2×), or vs {{bpp_sgdm}} for SGD with momentum.
       Adam's extra is m and v, 8 bytes/param ({{moments7_save}} of it can be saved with 8-bit states for
       LLaMA-7B); that is why ZeRO-1 shards the optimizer states first.""", _S8, SEED_QUESTIONS_ZH[6]),
    _q("s000-8-2", 4, "H", "checkpointing", "Must gradient checkpointing save every other layer?", """
       No. Chen et al.'s scheme keeps a checkpoint every k layers and recomputes one segment at a time:
       memory ≈ L/k stored segment inputs + one k-layer segment's activations, minimal at k ≈ √L — for L = 32,
       k = {{sqrt_k}}: at most {{sqrt_units}} layer-sized units (counting a checkpoint as a whole layer's
       activations, the pessimistic case) instead of 32 — for one extra forward pass. In practice frameworks
       checkpoint every transformer block (keep each block's input, recompute its inside): simple, and the
       saved inputs are small. Megatron's selective recomputation recomputes only the attention core (the s²
       terms). With FlashAttention there is no s² term left, so selective recomputation saves almost nothing
       (Llama-2-7B, batch 1 × 4096: {{act1_selective_sdpa}} vs {{act1_none_sdpa}}), while with eager attention it
       saves most of it ({{act1_selective_eager}} vs {{act1_none_eager}}).""", _S8, SEED_QUESTIONS_ZH[7]),
    _q("s000-8-3", 13, "M", "strategy", "When memory is short for training, which technique do you reach for "
       "first?", """
       The cheapest first: BF16 mixed precision and FlashAttention (free, often faster); gradient accumulation
       (keeps the effective batch while shrinking the micro-batch); activation checkpointing (~+33 % compute);
       ZeRO-2 across GPUs (no extra communication); 8-bit Adam (m, v in 8 bits); ZeRO-3/FSDP (+50 % communication);
       LoRA/QLoRA (changes what is trained); CPU/NVMe offload (slowest). But first find the bottleneck: if
       activations dominate (long sequences), checkpointing and FlashAttention help and ZeRO does not; if the
       model states dominate, sharding and 8-bit states help and checkpointing does not.""", _S8,
       SEED_QUESTIONS_ZH[8]),
    _q("s000-8-4", 6, "M", "FSDP", "What is the relationship between FSDP and ZeRO-3?", """
       The same idea — shard parameters, gradients and optimizer states across data-parallel ranks, all-gather
       each layer's parameters just before use, reduce-scatter its gradients — in two implementations. FSDP is
       PyTorch's native one (FSDP2's per-parameter DTensor sharding composes with torch.compile and tensor
       parallelism); ZeRO-3 is DeepSpeed's, with Offload/Infinity extensions. FSDP's `SHARD_GRAD_OP` strategy
       corresponds to ZeRO-2 and `NO_SHARD` to DDP. Memory per GPU for model states is 16Ψ/N in both.""", _S8,
       SEED_QUESTIONS_ZH[9]),
    # ---------------------------------------------------------------- the Strategies notes, the six at the end
    _q("s004-1", 1, "E", "rules of thumb", "How do you estimate how much GPU memory an nB-parameter model needs "
       "for inference and for training?", """
       Inference in fp16/bf16: 2n GB of weights plus the KV cache (2 · layers · kv_heads · head_dim · tokens ·
       2 bytes: {{inf7_kv}} for LLaMA-7B at batch 8 × 2048) plus workspace. Training with mixed-precision Adam:
       16n GB of model states (20n GB if gradients are also accumulated in fp32) plus activations, which are
       often as large again: Llama-2-7B at batch 4 × 4096 peaks near {{peak7_sdpa}}.""", _S4,
       SEED_QUESTIONS_ZH[10]),
    _q("s004-2", 4, "M", "checkpointing", "What is the principle of gradient checkpointing, and how does it save "
       "memory?", """
       Backward needs the forward's intermediate activations. Checkpointing keeps only some of them (e.g. each
       transformer block's input) and drops the rest; during the backward pass each block's forward is run again
       from its checkpoint to rebuild its activations, just before they are needed, then freed. Memory drops from
       all layers' activations to the checkpoints plus one layer's activations: Llama-2-7B at batch 1 × 4096,
       {{act1_none_sdpa}} → {{act1_full_sdpa}}, at about a third more compute. (The Strategies notes' "saves about 30–50 %"
       understates full recomputation.)""", _S4, SEED_QUESTIONS_ZH[11]),
    _q("s004-3", 5, "E", "accumulation", "What is gradient accumulation for?", """
       Training with a large effective batch on a small memory budget: run k micro-batches forward and
       backward, summing their gradients (loss divided by k), and step the optimizer once. The effective batch is
       micro-batch × k × data-parallel GPUs; activation memory depends only on the micro-batch. It costs no
       memory beyond the gradient buffer (which exists anyway) and little speed, but it does not make any step
       faster: k micro-steps take k times as long.""", _S4, SEED_QUESTIONS_ZH[12]),
    _q("s004-4", 7, "M", "offloading", "What is offloading, and what are its pros and cons?", """
       Moving model states out of GPU memory — to CPU RAM (ZeRO-Offload) or NVMe (ZeRO-Infinity) — and moving
       them back, or computing on the CPU, when needed. ZeRO-Offload keeps the 16-bit weights on the GPU
       ({{off7_gpu}} for LLaMA-7B) and puts gradients, fp32 master weights, m and v in CPU memory
       ({{off7_cpu}}), where the CPU runs the Adam step. Pro: a single GPU trains models several times larger.
       Con: every step moves gradients down and weights up over PCIe — 4Ψ bytes, 2Ψ each way, {{off7_pcie}} at
       25 GB/s per direction for 7B — and the CPU's Adam is slow; overlap hides part of it, large batches amortize it.""", _S4,
       SEED_QUESTIONS_ZH[13]),
    _q("s004-5", 11, "M", "quantization", "Why does quantization save memory? How much does INT4 quantization "
       "save?", """
       Memory is elements × bytes per element: storing weights in 8 or 4 bits instead of 16 halves or quarters
       them, plus small per-block scale factors. LLaMA-7B's fp16 weights are {{inf7_w}}; INT8 {{inf7_int8}}
       ({{save7_int8}} less), INT4 with an fp32 scale per 64 weights ({{bpp_int4}} bytes/param) {{inf7_int4}}
       ({{save7_int4}} less), NF4 with double quantization {{inf7_nf4}} ({{save7_nf4}} less; embeddings and
       norms stay 16-bit). So "INT4 saves 75 %" is the limit, not the result. Weight quantization does not
       shrink the KV cache or the activations.""", _S4, SEED_QUESTIONS_ZH[14]),
    _q("s004-6", 9, "M", "LoRA", "Why does LoRA reduce GPU memory so much?", """
       Because the base weights are frozen: no gradients and no optimizer states for them, only their 16-bit
       copy (2Ψ = {{lora7_frozen}} for LLaMA-7B instead of 16Ψ = {{states7}}). The trainable low-rank matrices
       B·A (r·(d_in + d_out) per adapted matrix) are tiny: r = 16 on all linear layers of LLaMA-7B is
       {{lora7_all}} parameters ({{lora7_all_pct}} of the model), whose states take {{lora7_states}}. Activations
       are not reduced much (they still flow through the frozen layers; Chapter 9 measured −16 % with q, v
       adapters and +34 % with peft's fp32 adapters on every linear layer, which keep an fp32 copy of each
       adapted layer's input), so checkpointing still matters; QLoRA shrinks the frozen weights to 4 bits.""", _S4, SEED_QUESTIONS_ZH[15]),
    # ---------------------------------------------------------------- Chapter 1
    _q("b01-1", 1, "E", "inference", "LLaMA-7B in fp16 serves batch 8 at 2048 tokens. How much memory do the "
       "weights and the KV cache take?", """
       Weights {{inf7_w}} (2 bytes × {{p7}}); KV cache 2 × 32 layers × 32 heads × 128 × 2048 × 8 × 2 bytes =
       {{inf7_kv}}; total {{inf7_total}} = {{inf7_total_gib}}, before workspace and the CUDA context. On a 24 GiB
       card (an RTX 3090 as much as a 4090: both 24 GiB) it is on the edge: with the forward pass's activations,
       the CUDA context and fragmentation, prefilling all 8 prompts at once needs {{serve7_total}}, {{serve7_short}}
       too much; prefilling in 2048-token chunks ({{serve7_chunked}}) fits (Chapter 11).""", text_zh=""),
    _q("b01-2", 1, "M", "activations", "What do activations scale with, and how large are they for Llama-2-7B at "
       "batch 4 × 4096?", """
       Linearly with batch, sequence and layers (and hidden/MLP width); with eager attention also with
       heads × sequence² per layer. At a whiteboard, Korthikanti et al.'s GPT-layer formula
       L·s·b·h·(34 + 5·a·s/h) gives {{k7_eager}} with eager attention and L·34·s·b·h = {{k7_sdpa}} with
       FlashAttention. memlib's term-by-term count of Llama's own layers (SwiGLU MLP, RMSNorm, no dropout) and
       loss gives {{act7_sdpa}} with SDPA/FlashAttention and {{act7_eager}} with eager attention (fp32 and 16-bit
       softmax probabilities kept), for estimated peaks of {{peak7_sdpa}} and {{peak7_eager}} — the model states
       are {{states7}}.""", text_zh=""),
    _q("b01-3", 1, "H", "peak", "Where in a training step is memory at its peak?", """
       Usually at the start of the backward pass: all activations are still saved, the loss adds fp32 logits
       gradients (4·b·s·V bytes), and gradients start to accumulate as activations are freed. With little
       activation memory (small batch, recomputation) the peak moves to the optimizer step, where all gradients
       exist and `torch.optim.AdamW`'s multi-tensor path allocates a buffer the size of v for √v. memlib's
       `estimate_training` reports which one as `peak_phase`.""", text_zh=""),
    _q("b01-4", 1, "E", "units", "A card is sold as \"24 GB\" and `nvidia-smi` shows 24564 MiB. How many GB "
       "(10⁹ bytes) is that?", """
       24564 × 2²⁰ bytes = 25.76 GB (decimal) = 23.99 GiB. Papers and datasheets use GB = 10⁹, PyTorch and
       nvidia-smi use MiB/GiB = 2²⁰/2³⁰: the same card is "24 GB" or "25.8 GB" depending on the unit. Always
       say which; a 7 % difference decides whether a job fits.""", text_zh=""),
    _q("b01-5", 1, "M", "KV cache", "Llama-3-8B is larger than LLaMA-7B. Why is its KV cache at batch 8 × 2048 "
       "four times smaller?", """
       Grouped-query attention: 8 KV heads shared by 32 query heads. The cache is 2 · L · n_kv · d_head · s · b ·
       bytes, so it shrinks by n_heads / n_kv = 4: {{kv_l38b}} against {{inf7_kv}} for LLaMA-7B's 32 KV
       heads.""", text_zh=""),
    # ---------------------------------------------------------------- Chapter 2
    _q("b02-1", 2, "E", "formats", "How many bytes per element do fp32, fp16, bf16, fp8 and int4 take?", """
       4, 2, 2, 1 and 0.5 (two int4 values packed per byte), before any quantization constants.""",
       text_zh=""),
    _q("b02-2", 2, "M", "formats", "What is the smallest positive fp16 number, and what happens to 1e-9 in "
       "fp16?", """
       2⁻²⁴ ≈ 5.96 × 10⁻⁸, a subnormal (the smallest normal is 2⁻¹⁴ ≈ 6.1 × 10⁻⁵). Values below 2⁻²⁵ round to 0,
       so 1e-9 becomes 0 — the reason small fp16 gradients vanish without loss scaling.""", text_zh=""),
    _q("b02-3", 2, "H", "FP8", "Why are there two FP8 formats, and where is each used?", """
       Eight bits cannot buy both range and precision. E4M3 (3 mantissa bits, max 448, no inf) is used for
       weights and activations; E5M2 (2 mantissa bits, max 57344) for gradients, which spread over more
       binades. Both need a scale per tensor (or per block).""", text_zh=""),
    _q("b02-4", 2, "M", "precision", "How large is the relative rounding error of a cast to fp16 and to bf16?",
       """
       At most half a unit in the last place: 2⁻¹¹ ≈ 4.9 × 10⁻⁴ for fp16 (10 mantissa bits) and 2⁻⁸ ≈ 3.9 × 10⁻³
       for bf16 (7 bits), for normal numbers; about 3.3 and 2.4 decimal digits.""", text_zh=""),
    # ---------------------------------------------------------------- Chapter 3
    _q("b03-1", 3, "M", "master weights", "Why does mixed-precision training keep fp32 master weights?", """
       A 16-bit weight ignores any update smaller than half its ulp — relative 2⁻¹¹ in fp16, 2⁻⁸ in bf16 — and
       late in training most lr × grad are that small, so pure 16-bit training stalls. Applying the update to an
       fp32 copy keeps it; the 16-bit weights are re-rounded from it each step. The threshold is relative to the
       weight, not fp16's smallest number.""", text_zh=""),
    _q("b03-2", 3, "M", "loss scaling", "What does dynamic loss scaling do on a step whose gradients overflow?",
       """
       `GradScaler` multiplies the loss by S before backward. `scaler.step` unscales the gradients, finds
       inf/NaN and skips `optimizer.step()`; `scaler.update` halves S. After 2000 clean steps it doubles S. So S
       settles just below the overflow point, at the cost of an occasional skipped step.""", text_zh=""),
    _q("b03-3", 3, "E", "loss scaling", "Does bf16 training need loss scaling?", """
       Normally no: bf16 has fp32's 8 exponent bits (smallest normal ≈ 1.2 × 10⁻³⁸), so gradients do not
       underflow. Only fp16's 5-bit exponent makes scaling necessary.""", text_zh=""),
    _q("b03-4", 3, "H", "AMP memory", "PyTorch AMP keeps fp32 weights and fp32 gradients. Is that still 16 bytes "
       "per parameter with Adam?", """
       Yes, differently split: 4 (fp32 weights) + 4 (fp32 grads) + 8 (m, v) = 16, versus ZeRO's 2 + 2 + 12. On top,
       autocast caches a 16-bit copy of each matmul weight during forward and backward (2 bytes/param): about
       18 bytes/param at the peak. For 7B: {{states7}} of states plus up to 14 GB of copies, before
       activations.""", text_zh=""),
    # ---------------------------------------------------------------- Chapter 4
    _q("b04-1", 4, "M", "recomputation", "For Llama-2-7B at batch 1 × 4096 with SDPA, how much activation memory "
       "do no, selective and full recomputation save?", """
       memlib: {{act1_none_sdpa}} with none, {{act1_selective_sdpa}} with selective (only the log-sum-exp is left
       to recompute under SDPA), {{act1_full_sdpa}} with full recomputation (each layer's input, plus the
       per-model terms such as the fp32 log-softmax) — {{act1_full_eager}} with eager attention too, since
       only layer inputs are kept.""", text_zh=""),
    _q("b04-2", 4, "M", "selective recomputation", "What does Megatron's selective recomputation recompute, and "
       "why that part?", """
       The attention core: scores, softmax, dropout and the probabilities × V — the terms that grow with
       a·s² (5as/h of Korthikanti's 34 + 5as/h per token and hidden unit) but cost few FLOPs to redo. With eager
       attention on Llama-2-7B at 4096 tokens that is {{act1_none_eager}} → {{act1_selective_eager}}; with
       FlashAttention the s² terms are already gone.""", text_zh=""),
    _q("b04-3", 4, "E", "checkpointing", "Does gradient checkpointing reduce the memory of parameters, gradients "
       "or optimizer states?", """
       No — only activations. If model states are the bottleneck (e.g. 16Ψ = {{states7}} for 7B on one 80 GB
       GPU) checkpointing cannot make it fit; that needs sharding (ZeRO), 8-bit states, LoRA or offloading.""",
       text_zh=""),
    _q("b04-4", 4, "H", "recompute cost", "Why does full recomputation cost about 33 % more compute, not 100 %?",
       """
       A training step is forward (≈ 2 FLOPs per parameter per token) plus backward (≈ 4): 6 in all.
       Recomputation re-runs the forward once more: 8/6 ≈ 1.33×. Selective recomputation re-runs only the
       attention core, a few percent.""", text_zh=""),
    # ---------------------------------------------------------------- Chapter 5
    _q("b05-1", 5, "E", "effective batch", "Batch 4 per GPU, 4 accumulation steps, 8 GPUs: what is the "
       "effective batch?", """
       4 × 4 × 8 = {{recipe7_batch}} sequences per optimizer step (the Tips notes' recipe says 128: right).""",
       text_zh=""),
    _q("b05-2", 5, "M", "accumulation", "Why divide the loss by the number of accumulation steps?", """
       Gradients add up across backward calls. With a mean loss per micro-batch, summing k micro-batch gradients
       gives k times the full-batch mean gradient; dividing each loss by k makes the accumulated gradient equal
       the big batch's (for equal-sized micro-batches). Otherwise the effective learning rate is k× larger.""",
       text_zh=""),
    _q("b05-3", 5, "M", "no_sync", "With DDP, what does `model.no_sync()` do during gradient accumulation, and "
       "does it save memory?", """
       It skips DDP's gradient all-reduce on the micro-steps that do not end in an optimizer step, so gradients
       are reduced once per step instead of k times: it saves communication (k−1 of every k gradient
       all-reduces), not memory. Local gradients keep accumulating in the usual gradient buffers.""", text_zh=""),
    _q("b05-4", 5, "H", "accumulation", "Is gradient accumulation exactly equivalent to a k-times larger batch?",
       """
       For losses that are means over independent samples, yes up to floating-point summation order. Not for
       BatchNorm (statistics per micro-batch), nor for token-level losses whose micro-batches have different
       numbers of tokens (dividing by k weights tokens unequally — normalize by the total token count instead).
       Memory: peak depends on the micro-batch only.""", text_zh=""),
    # ---------------------------------------------------------------- Chapter 6
    _q("b06-1", 6, "M", "ZeRO", "How much does ZeRO-1/2/3 communicate compared with DDP?", """
       DDP all-reduces gradients: 2Ψ elements per step (reduce-scatter + all-gather). ZeRO-1 and ZeRO-2 do the
       same volume (reduce-scatter the gradients, all-gather the updated parameters). ZeRO-3 all-gathers
       parameters in the forward and again in the backward, plus the reduce-scatter: 3Ψ, 1.5× DDP.""",
       text_zh=""),
    _q("b06-2", 6, "H", "ZeRO", "How many GPUs of 80 GB does Llama-2-70B need for its model states alone under "
       "ZeRO-3 with mixed-precision Adam?", """
       Ψ = {{p70}}, 16Ψ/N ≤ 80 GiB ({{gpu80_gb}}: GPU memory is binary) → N ≥ {{n70_z3}}. In practice 16 (2 nodes of 8): {{states70_z3_16}} per GPU, the
       rest for activations, gathered layers and buffers.""", text_zh=""),
    _q("b06-3", 6, "M", "ZeRO", "What does ZeRO not shard?", """
       Activations, temporary buffers and (in stage 3) the fully gathered parameters of the layer being computed.
       Activations are reduced by recomputation, sequence/context parallelism or smaller micro-batches; ZeRO-R
       (partitioned activation checkpoints, constant-size buffers) handles the residual memory.""", text_zh=""),
    _q("b06-4", 6, "E", "ZeRO", "What is the per-GPU model-state memory of a 7B model on 8 GPUs with plain DDP "
       "and with ZeRO-3?", """
       DDP replicates everything: {{zero0_7b}} per GPU; ZeRO-3 shards it: {{zero3_7b}} per GPU (16Ψ/8).""",
       text_zh=""),
    # ---------------------------------------------------------------- Chapter 7
    _q("b07-1", 7, "M", "ZeRO-Offload", "In ZeRO-Offload, what stays on the GPU and what goes to the CPU?", """
       GPU: the 16-bit parameters and the forward/backward computation (with activations). CPU: the gradients
       (streamed down during backward), the fp32 master weights, m and v, and the Adam step itself; updated
       16-bit weights are copied back. LLaMA-7B: {{off7_gpu}} on the GPU, {{off7_cpu}} on the CPU.""",
       text_zh=""),
    _q("b07-2", 7, "H", "offload cost", "What limits the speed of CPU offloading?", """
       PCIe bandwidth and the CPU's Adam throughput. Each step moves gradients down and weights up: 4Ψ bytes,
       2Ψ each way at once, {{off7_pcie}} per step for 7B at 25 GB/s per direction (PCIe 4.0 ×16 in practice), and the CPU's Adam step reads and
       writes the 12 bytes/param of fp32 states. Overlapping transfers with backward and a larger batch per step
       amortize it; ZeRO-Offload's one-step delayed update hides the CPU step at small batch.""", text_zh=""),
    _q("b07-3", 7, "M", "ZeRO-Infinity", "When does ZeRO-Infinity (NVMe offload) make sense?", """
       When model states exceed even CPU memory: parameters and optimizer states go to NVMe, read back in
       chunks. NVMe reads at a few GB/s per drive, an order of magnitude below PCIe to CPU RAM, so it suits
       experiments with very large models on few GPUs, not fast training.""", text_zh=""),
    # ---------------------------------------------------------------- Chapter 8
    _q("b08-1", 8, "E", "8-bit Adam", "How much does 8-bit Adam save on LLaMA-7B?", """
       m and v go from 4 + 4 to 1 + 1 bytes/param (plus one fp32 absmax per block). memlib: optimizer states
       {{opt7_adamw}} → {{opt7_8bit}}, saving {{moments7_save}}; the fp32 master weights stay. Model states per
       parameter: {{bpp_adam}} → {{bpp_8bit}} bytes.""", text_zh=""),
    _q("b08-2", 8, "M", "block-wise quantization", "Why do 8-bit optimizers quantize in blocks?", """
       One scale per tensor lets a single outlier stretch the range and crush every other value to a few levels.
       With one absmax per block (2048 elements in the paper; bitsandbytes uses 256), an outlier only affects
       its block, and blocks are quantized independently in parallel. Dynamic (non-linear) 8-bit codes keep
       precision for small values.""", text_zh=""),
    _q("b08-3", 8, "M", "8-bit Adam", "Which tensors does bitsandbytes keep in 32-bit states, and why?", """
       Tensors with fewer than 4096 elements (`min_8bit_size`): norms and biases. They are a tiny share of the
       parameters but sensitive; memlib's estimate counts them at 32-bit (via `count_params(...)
       .small_tensor_params`). The paper also recommends a stable embedding layer.""", text_zh=""),
    _q("b08-4", 8, "H", "8-bit Adam", "The Tips notes say 8-bit Adam saves 75 % of optimizer memory. Is that right "
       "for mixed-precision training?", """
       For m and v, yes (8Ψ → 2Ψ). For the optimizer states as counted by ZeRO — with the fp32 master weights —
       12Ψ → 6Ψ: half ({{opt7_adamw}} → {{opt7_8bit}} on LLaMA-7B), and the whole step goes from {{bpp_adam}} to
       {{bpp_8bit}} bytes/param.""", text_zh=""),
    # ---------------------------------------------------------------- Chapter 9
    _q("b09-1", 9, "M", "LoRA", "How many trainable parameters does LoRA r = 16 add to LLaMA-7B?", """
       r·(d_in + d_out) per adapted matrix. On q, k, v, o: {{lora7_attn}} ({{lora7_attn_pct}}); on all seven
       linear layers: {{lora7_all}} ({{lora7_all_pct}}).""", text_zh=""),
    _q("b09-2", 9, "H", "QLoRA", "Can a 65B model be fine-tuned on one 48 GB GPU? How?", """
       With QLoRA: the frozen base in NF4 with double quantization is {{nf4_65}} for LLaMA-65B as built (4.127-bit
       decoder matrices; embeddings, LM head and norms in bf16), against {{fp16_65}} in 16 bits. LoRA r = 64 on
       all linear layers (the paper's setting) adds {{lora65_r64}} parameters, with fp32 weights, gradients and
       AdamW states (16 bytes each); gradient checkpointing keeps activations small. With the book's reserve
       (1 GiB CUDA context + 5 % fragmentation) 32-bit AdamW needs {{qlora65_need32}} at batch 1 × 512 tokens,
       over a 48 GiB card ("48 GB" cards hold 48 GiB); 8-bit AdamW needs {{qlora65_need8}} and fits, which is
       what `memlib plan` picks. The paper's paged optimizer lets the states step aside during activation
       spikes. So yes, but only just: the rank and the optimizer decide.""",
       text_zh=""),
    _q("b09-3", 9, "M", "double quantization", "What is QLoRA's double quantization, and what does it save?",
       """
       The quantization constants are quantized too: one fp32 absmax per 64 weights costs 0.5 bits/param; QLoRA
       stores them in 8 bits with one fp32 constant per 256 blocks, 0.127 bits/param. For 65B that saves
       {{dq65_save}}.""", text_zh=""),
    _q("b09-4", 9, "E", "paged optimizer", "What does a paged optimizer do? Does it reduce memory?", """
       Its states live in CUDA unified memory: when the GPU runs short (a long batch's activation spike), pages
       are evicted to CPU RAM and brought back on demand. It does not shrink the states; it avoids
       out-of-memory crashes at the price of transfer time when paging happens.""", text_zh=""),
    # ---------------------------------------------------------------- Chapter 10
    _q("b10-1", 10, "M", "attention matrix", "A note says \"8192 × 8192 × 2 = 128 MB per layer\". What is wrong?",
       """
       8192² × 2 bytes = {{attn_head}} is one head of one sample. A LLaMA-7B layer has 32 heads: {{attn_layer}}
       per layer and {{attn_model}} for 32 layers, per sample and per N×N matrix.""", text_zh=""),
    _q("b10-2", 10, "M", "speed", "Why is FlashAttention faster although it recomputes attention in the backward "
       "pass?", """
       Standard attention is memory-bound: the N×N matrices go to and from HBM several times. FlashAttention's
       HBM traffic is Θ(N²d²/M) instead of Θ(Nd + N²), and the extra matmul to rebuild P costs FLOPs the GPU has to
       spare. Fusing everything into one kernel also removes launches and round trips.""", text_zh=""),
    _q("b10-3", 10, "E", "exactness", "Is FlashAttention an approximation?", """
       No: it computes exact attention in a different summation order; results match standard attention up to
       floating-point reassociation (10⁻¹² relative in float64 in Chapter 10's tests).""", text_zh=""),
    _q("b10-4", 10, "M", "online softmax", "What is online softmax?", """
       Softmax in one pass over chunks, keeping a running max m, normalizer ℓ and unnormalized output o per row;
       when the max grows to m', ℓ and o are rescaled by e^(m − m'). At the end o/ℓ is the output and m + log ℓ
       the log-sum-exp saved for backward.""", text_zh=""),
    # ---------------------------------------------------------------- Chapter 11
    _q("b11-1", 11, "M", "KV cache", "How large is Llama-2-70B's fp16 KV cache for one 4096-token sequence, and "
       "what would it be without GQA?", """
       2 × 80 layers × 8 KV heads × 128 × 4096 × 2 bytes = {{kv70}}; with 64 KV heads (plain multi-head
       attention) it would be {{kv70_mha}}.""", text_zh=""),
    _q("b11-2", 11, "M", "KV cache", "Does quantizing the weights to INT4 shrink the KV cache?", """
       No: weights and KV cache are separate. The cache shrinks with a smaller KV dtype (fp8: LLaMA-7B at batch
       8 × 2048 from {{inf7_kv}} to {{kv7_fp8}}), GQA/MQA, shorter contexts or paged allocation (vLLM's
       PagedAttention avoids reserving the maximum length).""", text_zh=""),
    _q("b11-3", 11, "H", "capacity", "Llama-2-13B in fp16 on one 80 GB GPU: how many 4096-token sequences fit "
       "in the KV cache?", """
       The card holds 80 GiB = {{gpu80_gb}}. Weights {{w13}}, KV {{kv13_per_seq}} per 4096-token sequence →
       ⌊(80 GiB − weights) / KV⌋ =
       {{maxbatch13}}, before workspace and fragmentation (leave a few GB).""", text_zh=""),
    _q("b11-4", 11, "E", "weights", "How much memory do LLaMA-7B's weights take in INT8?", """
       {{inf7_int8}} — one byte per quantized weight, embeddings and norms kept in 16 bits — against {{inf7_w}}
       in fp16.""", text_zh=""),
    # ---------------------------------------------------------------- Chapter 11: serving engines
    _q("b14-1", 14, "E", "continuous batching", "What is continuous batching, and why does it let a server take "
       "more requests than static batching?", """
       Static batching (`model.generate` on a fixed batch) admits a batch, runs it until its longest answer ends and
       reserves every sequence's cache for the maximum length; finished sequences idle in the batch. Continuous
       (iteration-level) batching, from Orca (Yu et al., OSDI 2022) and used by vLLM, schedules every decode step
       anew: a finished request leaves, a waiting one joins at the next step. Memory is then held only by
       requests in flight, for the tokens they have, which is what PagedAttention's blocks make cheap.""",
       text_zh=""),
    _q("b14-2", 14, "M", "serving budget", "vLLM serves Llama-3-8B (fp16) on one 80 GiB H100 with max-model-len "
       "8192 and the default gpu_memory_utilization 0.9. Where does the memory go, and how many 8k requests fit "
       "at once?", """
       The engine takes 0.9 × 80 GiB = {{srv_budget}}. Its start-up profile (`determine_available_memory`)
       subtracts the weights ({{srv_w}}), the activation peak of one scheduler step of max_num_batched_tokens =
       2048 tokens ({{srv_act}}) and the memory outside PyTorch's allocator plus CUDA graphs (memlib assumes
       {{srv_over}}). The rest, {{srv_kv}}, becomes KV blocks: at {{srv_kvtok}} per token and 16 tokens per
       block that is {{srv_blocks}} blocks. An 8192-token request needs 8192 / 16 = 512 blocks, so {{srv_users}} requests of
       the full length fit (one block is the pool's null block). `memlib serve llama-3-8b --gpu h100
       --max-model-len 8192` prints the same budget.""", text_zh=""),
    _q("b14-3", 14, "M", "PagedAttention", "How much KV memory does PagedAttention waste per sequence, and why "
       "did earlier servers waste so much more?", """
       A sequence holds whole blocks, so it wastes less than one block: at most 15 of 16 token slots, for
       Llama-3-8B {{srv_waste}}. Earlier systems reserved a contiguous cache for the maximum length up front
       and lost the unused tail plus fragmentation between reservations; the vLLM paper (Kwon et al. 2023)
       measured 60–80 % of the KV memory wasted in them against under 4 % in vLLM. Smaller blocks waste less
       but make the attention kernel's gathers less efficient; 16 is vLLM's default on CUDA.""", text_zh=""),
    _q("b14-4", 14, "M", "prefix caching", "A hundred concurrent requests to Llama-3-8B share a 2,000-token system "
       "prompt. What does automatic prefix caching save, and what is copy-on-write for?", """
       The prompt's full blocks — ⌊2000 / 16⌋ = {{pfx_blocks}} — are hashed and held once with a reference count;
       the tokens of the last, partial block are recomputed per request. Held once instead of a hundred times,
       that saves {{pfx_save}} of KV cache. A shared block is read-only: a request that would write into it
       (a partly filled shared block, or beam search / parallel sampling forking a sequence) first gets its own
       copy — copy-on-write — so sharing never changes what another request sees.""", text_zh=""),
    _q("b14-5", 14, "M", "chunked prefill", "Why does chunked prefill bound a server's activation memory? Compare "
       "Llama-3-8B prefilling an 8192-token prompt at once with chunks of 2048 tokens.", """
       The activation peak of a forward pass grows with the tokens in it; nothing is kept for backward, so one
       layer's intermediates (the SwiGLU MLP's three T × 14336 tensors) set it. The whole prompt at once peaks
       near {{act_8192}}; a step of at most max_num_batched_tokens = 2048 tokens near {{act_2048}}, whatever the
       prompt's length. vLLM profiles that one step at start-up and gives the rest to KV blocks, and the
       scheduler mixes the chunks with other requests' decode tokens in the same step.""", text_zh=""),
    _q("b14-6", 14, "H", "speculative decoding", "You add Llama-3-8B as a draft (4 speculative tokens) to "
       "Llama-3-70B served on 4 × H100 with tensor parallelism at max-model-len 8192. What does it cost in memory?",
       """
       Three things, all taken out of the KV blocks: the draft's weights ({{spec_dw}} per GPU when split four
       ways), the draft's own KV cache for every token (its layers sit in the same block pool: {{spec_kv_pct}} on
       top of the target's per token here) and k lookahead slots per request for the proposed tokens. The
       target verifies the k + 1 tokens in one forward pass, a prefill-like step bounded by
       max_num_batched_tokens. memlib: the full-length requests that fit go from {{spec_users}}. It pays off when
       the latency saved per accepted token matters more than that concurrency.""", text_zh=""),
    _q("b14-7", 14, "E", "speculative decoding", "Can GPT-2 serve as a draft model for Llama-3-8B?", """
       No: the target verifies the draft's tokens by id, so both must share a tokenizer and vocabulary, and
       GPT-2 has {{vocab_gpt2}} tokens against Llama-3's {{vocab_l3}}. `memlib serve --draft gpt2` refuses it;
       pick a small model of the same family (or an n-gram / EAGLE-style head trained on the target).""",
       text_zh=""),
    _q("b14-8", 14, "M", "KV quantization", "How many 8k-token Llama-3-8B requests fit on one H100 with an fp8 or "
       "an int4 KV cache instead of fp16, and what is the catch?", """
       The KV budget stays the same; bytes per token shrink. memlib: {{srv_users}} requests with fp16, {{srv_users_fp8}}
       with fp8 (one byte per element, a per-tensor scale) and {{srv_users_int4}} with int4 (half a byte plus one
       fp16 scale and zero-point per head vector). The catch is accuracy: fp8 costs little on most models, while
       4- and 2-bit caches need care — KIVI (Liu et al. 2024) quantizes keys per channel and values per token
       because keys have outlier channels; check the task's quality, not only perplexity.""", text_zh=""),
    _q("b14-9", 14, "M", "decode latency", "Llama-3-8B in fp16 decodes one sequence on an H100 SXM (3.35 TB/s "
       "of memory bandwidth on its datasheet). What is the least time per generated token?", """
       A decode step at batch 1 reads every weight once and does ~2 FLOPs per weight per token: far too little
       arithmetic to be compute-bound, so time ≈ bytes moved ÷ bandwidth = {{srv_w_gb}} / {{h100_bw}} ≈
       {{dec_ms_b1}} per token, at most about {{dec_tok_s}} tokens/s. Quantized weights move fewer bytes and
       decode faster for that reason.""", text_zh=""),
    _q("b14-10", 14, "M", "MBU", "The same server reaches 150 tokens/s for one sequence. What is its model "
       "bandwidth utilization (MBU)?", """
       MBU = bytes moved per token × tokens/s ÷ peak bandwidth = weights × 150 / {{h100_bw}} = {{mbu_150}}.
       MBU is to decode what MFU is to training: the fraction of the roofline's memory side achieved; what is
       missing goes to kernel launches, synchronization and kernels that do not stream memory at full speed.""", text_zh=""),
    _q("b14-11", 14, "H", "decode latency", "Batch 64 decodes barely slower than batch 1 at short contexts. What "
       "changes for Llama-3-8B at 8192 tokens of context per sequence?", """
       The weights are read once per step whatever the batch, so at short contexts 64 sequences cost about what
       one does. The KV cache is read per sequence: 64 × 8192 tokens × {{srv_kvtok}} = {{dec_kv_b64}} per step,
       more than the weights themselves, so the step takes ≈ {{dec_ms_b64}} instead of {{dec_ms_b1}}. At long contexts KV
       bytes, not weights, set decode latency — a reason for GQA, fp8 KV caches and prefix sharing.""",
       text_zh=""),
    # ---------------------------------------------------------------- Chapter 12
    _q("b12-1", 12, "E", "utilization", "An A100 (312 TFLOP/s dense bf16) achieves 100 TFLOP/s. What is its "
       "utilization?", """
       100 / 312 = {{mfu_seed}} (the Strategies notes' example). Model FLOPs utilization counts only the FLOPs
       the model needs, 6·N_matmul + 12·L·H·Q·T per token (Chapter 12), not recomputation.""", text_zh=""),
    _q("b12-2", 12, "M", "MFU", "LLaMA-7B trains on 2048-token sequences at 3000 tokens/s per A100 (312 TFLOP/s "
       "dense bf16). What is its MFU?", """
       MFU = FLOPs per token × tokens/s / peak, with Chapter 12's count of 6·N_matmul + 12·L·H·Q·T FLOPs per
       token. N_matmul = {{p7_matmul}} weights take part in a matmul (the LM head in, the embedding lookup out):
       6·N_matmul = {{mfu7_dense}}; attention adds 12 × 32 layers × 32 heads × 128 × 2048 = {{mfu7_attn}};
       {{mfu7_per_token}} per token in all. × 3000 / 312e12 = {{mfu7}}. The shortcut 6 × all {{p7}} parameters
       gives {{mfu7_6n}}: close at 2048 tokens, increasingly low at longer sequences.""", text_zh=""),
    _q("b12-3", 12, "M", "allocator", "`torch.cuda.memory_allocated()` says 60 GB, `nvidia-smi` says 70 GB. "
       "Why?", """
       nvidia-smi sees memory reserved by PyTorch's caching allocator (freed blocks kept for reuse,
       fragmentation) plus the CUDA context and library workspaces (cuBLAS, NCCL), none of which
       `memory_allocated` counts. Compare `memory_reserved()` and `max_memory_allocated()`;
       `torch.cuda.memory._record_memory_history` and a snapshot show who allocated what.""", text_zh=""),
    _q("b12-4", 12, "E", "utilization", "nvidia-smi shows 100 % GPU-Util. Is the GPU fully used?", """
       No: GPU-Util is the fraction of time at least one kernel runs, not the fraction of the arithmetic
       units busy. A memory-bound kernel on one SM shows 100 %. Measure achieved FLOP/s (MFU) or use a
       profiler (Nsight, torch.profiler) for tensor-core activity.""", text_zh=""),
    # ---------------------------------------------------------------- Chapter 13
    _q("b13-1", 13, "M", "recipe", "The Tips notes' recipe: LLaMA-7B full fine-tune on 8 × 80 GB, BF16 + ZeRO-2 + "
       "FlashAttention + checkpointing, batch 4 per GPU. Does it fit?", """
       At 2048 tokens memlib estimates {{recipe7}} per GPU (ZeRO-2 states 2Ψ + 14Ψ/8 plus checkpointed
       activations) — comfortable headroom; without checkpointing {{recipe7_nock}}. Effective batch
       4 × 4 × 8 = {{recipe7_batch}}.""", text_zh=""),
    _q("b13-2", 13, "H", "strategy", "Your 7B full fine-tune is out of memory on one 80 GB GPU at batch 1 × 4096. "
       "What do you try, in order?", """
       Find the bottleneck first: model states alone are {{states7}}, so no activation trick can fit it —
       checkpointing and FlashAttention are necessary but not sufficient. On one GPU, 8-bit AdamW cuts the states
       to {{states7_8bit}} ({{bpp_8bit}} bytes/param); with full checkpointing memlib estimates {{single7_8bit_full}}
       at batch 1 × 4096 ({{single7_8bit_none}} without), which fits with room for the CUDA context. Beyond that:
       CPU offload of the optimizer ({{off7_gpu}} left on the GPU) or LoRA/QLoRA (frozen base {{lora7_frozen}}).
       With 8 GPUs, ZeRO-2 ({{zero2_7b}} of states per GPU) is enough without 8-bit states.""", text_zh=""),
    _q("b13-3", 13, "M", "strategy", "Which memory techniques are lossless, and which change the result?", """
       Lossless for the math: gradient accumulation, checkpointing, FlashAttention, ZeRO/FSDP, offloading (only
       speed changes). Numerically different but standard: bf16 mixed precision. Approximations: 8-bit optimizer
       states (tiny effect), quantized base weights (QLoRA), and LoRA itself, which restricts what is learned.""",
       text_zh=""),
    # --- Parallelism (issue 21) ---
    _q("b15-1", 15, "M", "tensor parallelism", "With tensor parallelism over t GPUs, why do the activations per GPU "
       "not fall to 1/t, and what fixes it?", """
       Megatron TP splits what lives inside attention and the MLP (heads, MLP width), but every TP rank computes the
       norms, the residual stream and its dropout whole: Korthikanti et al. count sbh(10 + 24/t + 5as/(ht)) bytes
       per layer, 10·sbh of it replicated. Sequence parallelism splits that part along the sequence between the TP
       ranks (the all-reduce becomes a reduce-scatter plus an all-gather, the same volume): sbh/t·(34 + 5as/h)."""),
    _q("b15-2", 15, "M", "tensor parallelism", "What does tensor parallelism communicate, how often, and why is it "
       "kept inside a node?", """
       Per layer, one all-reduce of the b·s·h activation after attention and one after the MLP in the forward pass,
       and two in the backward (Megatron's f and g operators): 4 × 2(t − 1)/t · e·bsh bytes sent per GPU per layer
       and micro-batch, on the critical path. That needs NVLink bandwidth: TP stays within the 8 GPUs of a node;
       pipeline and data parallelism cross nodes."""),
    _q("b15-3", 15, "E", "valid degrees", "Which tensor-parallel degrees can Llama-3.1-70B (64 heads, 8 KV heads) "
       "use, and why not 3?", """
       tp must divide the attention heads and the KV heads so that every GPU computes whole heads and owns whole KV
       groups: 1, 2, 4 or 8. 3 divides neither 64 nor 8; `memlib train llama-3.1-70b --gpus 3 --tp 3` says so in
       one line and exits with status 2 (Chapter 15)."""),
    _q("b15-4", 15, "M", "pipeline parallelism", "In 1F1B pipeline parallelism, which stage holds the most "
       "activations and how many micro-batches? And with GPipe?", """
       The first stage: it runs p forwards before its first backward, so it holds p micro-batches of its L/p
       layers — a whole model's worth of one micro-batch — plus the embedding; stage i holds p − i. GPipe runs all m
       forwards first: every stage holds m micro-batches, and the last also m micro-batches of fp32 logits."""),
    _q("b15-5", 15, "E", "pipeline bubble", "What is the pipeline bubble for p stages and m micro-batches, and how "
       "do you shrink it?", """
       (p − 1)/(m + p − 1) of the step for GPipe and 1F1B alike (Narayanan et al. 2021): with p = 8, m = 16, 7/23
       ≈ 30 %. More micro-batches shrink it (with 1F1B at no memory cost on the first stage); the interleaved
       schedule with v chunks per GPU divides it by v, (p − 1)/(vm + p − 1), for v times more point-to-point
       messages."""),
    _q("b15-6", 15, "H", "pipeline parallelism", "Does pipeline parallelism reduce the activation memory of the "
       "first stage? What does it reduce?", """
       Not with 1F1B and m ≥ p: the first stage holds p micro-batches × L/p layers = L layers of one micro-batch, as
       much as without a pipeline. PP divides the weights, gradients and optimizer states by p (each stage owns
       L/p layers). To cut activations use TP + SP, CP or recomputation; GPipe makes it worse (m micro-batches)."""),
    _q("b15-7", 15, "M", "context parallelism", "What does context parallelism split, what does it leave to "
       "communicate, and when do you add it?", """
       Every per-token activation, divided by cp (each GPU keeps s/cp tokens of every layer). Attention needs the
       keys and values of all earlier tokens: ring attention passes K/V chunks around the cp GPUs (two in flight
       per GPU), or K and V are all-gathered (Llama 3; cheap with GQA's 8 KV heads). Add it for long context once
       TP + SP no longer fit one sequence: Llama 3 405B used CP 16 at 128K tokens."""),
    _q("b15-8", 15, "M", "expert parallelism", "What does expert parallelism save and what does it cost?", """
       Each GPU holds num_experts/ep experts: the expert weights (most of an MoE's parameters) and their
       optimizer states divide by ep. Each MoE layer adds two all-to-alls forward (dispatch tokens to their
       experts, combine the outputs) and two backward, with send and receive buffers of capacity × top-k ×
       tokens × h elements; load imbalance makes the capacity, and the buffers, larger. ep must divide the
       experts."""),
    _q("b15-9", 15, "H", "3D parallelism", "In which order do you add data, tensor, pipeline and context "
       "parallelism for a dense model, and why?", """
       By communication cost and by what overflows. Data parallelism with ZeRO-1 first (one gradient
       reduce-scatter + all-gather per step); ZeRO-3/FSDP when the states overflow; TP + SP inside a node when the
       activations overflow (ZeRO-3 does not split activations); PP across nodes when one node's TP is not
       enough (only point-to-point messages, but a bubble); CP for long context. Llama 3 405B: TP 8, PP 16, CP 1
       (16 at 128K), DP for the rest. memlib's `plan --parallel` climbs that ladder."""),
    _q("b15-10", 15, "H", "TP vs ZeRO-3", "When does tensor parallelism beat ZeRO-3 / FSDP?", """
       When the activations, not the model states, are what does not fit: ZeRO-3 shards weights, gradients and
       optimizer states over the data-parallel GPUs but every GPU still holds a whole micro-batch's activations
       of every layer; TP + SP divides those by t. And at large scale ZeRO-3's 3Ψ per step over slow inter-node
       links costs more than TP's activation all-reduces over NVLink. For a small model at short sequences
       ZeRO-3 (no change to the model code) is simpler."""),
    _q("b15-11", 15, "M", "sequence parallelism", "PyTorch's SequenceParallel with ColwiseParallel saved more "
       "activations than Megatron's formula in Chapter 15's measurement. Why?", """
       DTensor's `ColwiseParallel(input_layouts=Shard(1))` all-gathers the input of each column-parallel linear
       (q, k, v, gate, up separately) and autograd keeps each gathered copy for the weight gradient; Megatron
       all-gathers once per block and re-gathers in the backward instead of saving it. memlib models the
       difference as `sp_gathered_extra_bytes`; the measurement matches it."""),
    _q("b15-12", 15, "M", "pipeline balance", "Llama-3.1-405B has 126 layers. What happens with 16 pipeline "
       "stages, and what did Meta do?", """
       126 is not a multiple of 16: stages hold 8 or 7 layers, and the slowest stage sets the pace. The first
       stage also holds the embedding and p micro-batches, the last the LM head and the loss. Llama 3 removed one
       layer from the first and the last stage to balance memory and time; memlib's planner states the
       imbalance when pp does not divide the layers."""),
    # --- MoE and MLA (issue 20) ---
    _q("b13-4", 13, "M", "MoE", "Mixtral 8x7B sends each token through 2 of its 8 experts. Does full fine-tuning "
       "need the memory of its active parameters or of all of them?", """
       Of all of them. Every expert is trained, so weights, gradients and AdamW states exist for all
       {{mx_total}} parameters: {{mx_states}} of model states in bf16 mixed precision (16 bytes/param), against
       {{mx_states_active}} for a dense model of its {{mx_active}} active parameters. Active parameters set the
       compute per token; total parameters set the memory.""", text_zh=""),
    _q("b13-5", 13, "E", "MoE", "What are the total and active parameters of DeepSeek-V3, and where does the "
       "difference go?", """
       {{v3_total}} in total, {{v3_active}} active per token. The {{v3_idle}} in between are the routed experts a
       token is not sent to: each MoE layer holds 256 routed experts and picks 8 (the shared expert, attention,
       the dense first layers, embeddings and LM head are always on). Serving still loads every expert:
       {{v3_w}} of fp16 weights.""", text_zh=""),
    _q("b13-6", 13, "M", "MoE", "How much activation memory does a MoE layer save for backward, compared with a "
       "dense MLP of the same expert width?", """
       Each token goes through k experts, so the experts keep b·s·k rows ({{mx_rows}} for Mixtral at b = 1,
       s = 2048): gathered inputs, gate/up output, act(gate), their product, down output, plus the router's fp32
       softmax and the int64 indices that sort and unsort the rows. memlib's terms give {{mx_moe_act}} per
       Mixtral layer against {{mx_dense_act}} for Mistral-7B's dense MLP of the same width 14,336 — about k = 2
       times, not E = 8 times.""", text_zh=""),
    _q("b13-7", 13, "H", "MoE", "Does an unbalanced router change a MoE layer's activation memory in "
       "transformers' implementation?", """
       Not its size. transformers' grouped experts kernel sorts all b·s·k (token, expert) pairs by expert and
       runs one grouped matrix product over them: every saved tensor has b·s·k rows however the router splits
       them. memlib states balanced routing (b·s·k/E tokens per expert); a trace with the real router on CPU
       tensors agrees within the bench's 10 % target. What imbalance does change is compute per expert and, with
       expert parallelism, the token buffers on the busiest GPU (capacity factors).""", text_zh=""),
    _q("b13-8", 13, "M", "MLA", "What does DeepSeek's multi-head latent attention (MLA) keep in the KV cache, and "
       "how much smaller is it?", """
       One compressed latent per token and layer: kv_lora_rank = 512 values plus the shared 64-wide rotary key,
       {{v3_kv_tok}} per token for DeepSeek-V3 in 16 bits, against {{v3_kv_full}} if the decompressed per-head
       k and v (128 heads × (192 + 128)) were cached — {{v3_kv_ratio}} less. A 128k-token context holds
       {{v3_kv_128k}}. transformers' DeepSeek cache and vLLM's MLA backends store the latent and decompress (or
       absorb kv_b_proj into the queries) at attention time.""", text_zh=""),
    _q("b13-9", 13, "H", "MLA", "How many 8k-token requests can one H100 serve with DeepSeek-V2-Lite, and what "
       "does MLA change?", """
       memlib's serving budget gives {{v2l_users}} concurrent requests: the KV cache costs {{v2l_kvtok}} per
       token (the latent), where per-head k and v would cost {{v2l_kvtok_full}}, {{v2l_kv_ratio}} more per token
       and so about that many times fewer requests. The weights hold all 64 experts ({{v2l_total}} parameters,
       though only {{v2l_active}} are active per token) and take most of the rest of the GPU.""", text_zh=""),
)


def render_answer(q: Question) -> str:
    """The model answer with its ``{{name}}`` placeholders replaced by memlib's numbers.

    Raises:
        MemlibError: if a placeholder has no number.
    """
    numbers = answer_numbers()

    def sub(m: re.Match[str]) -> str:
        key = m.group(1)
        if key not in numbers:
            raise MemlibError(f"unknown number {key!r} in the answer to {q.id}")
        return numbers[key].value

    return _PLACEHOLDER.sub(sub, q.answer)


def questions(chapter: int | None = None, source: str | None = None,
              difficulty: str | None = None) -> list[Question]:
    """Questions of the bank, filtered by chapter, source and/or difficulty, in bank order."""
    if chapter is not None:
        check_choice("chapter", chapter, CHAPTERS)
    if source is not None:
        check_choice("source", source, SOURCES)
    if difficulty is not None:
        check_choice("difficulty", difficulty, DIFFICULTIES)
    return [q for q in QUESTIONS if (chapter is None or q.chapter == chapter)
            and (source is None or q.source == source) and (difficulty is None or q.difficulty == difficulty)]


def _norm(text: str) -> str:
    return re.sub(r"\s+", "", text).lower()


def find_question(text: str) -> Question | None:
    """The first question whose Chinese or English wording contains ``text`` (whitespace ignored)."""
    key = _norm(text)
    for q in QUESTIONS:
        if key and (key in _norm(q.text_zh) or key in _norm(q.text)):
            return q
    return None


def question_markdown(q: Question, number: int) -> str:
    """MyST Markdown for one question: the question, the Chinese original if any, and an Answer dropdown."""
    origin = f" ({q.source})" if q.source != "book" else ""
    head = f"**Question {number} [{q.difficulty}] [{q.topic}].**{origin} "
    if q.text_zh:
        head += f"{q.text_zh} — *{q.text}*"
    else:
        head += q.text
    proof = f"*Proved in {{doc}}`Chapter {q.chapter} <../chapters/{CHAPTER_PAGES[q.chapter]}>` ({CHAPTERS[q.chapter]}).*"
    return f"{head}\n\n```{{dropdown}} Answer\n{render_answer(q)}\n\n{proof}\n```\n"


def chapter_markdown(chapter: int, start: int = 1) -> str:
    """MyST Markdown for all of a chapter's questions, numbered from ``start``."""
    return "\n".join(question_markdown(q, start + i) for i, q in enumerate(questions(chapter=chapter)))


# --------------------------------------------------------------------------------------------------------
# Numeric drills
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Drill:
    """One numeric drill, with memlib's answer. Introduced in the Drills part.

    Attributes:
        kind: the generator's name (a key of :data:`DRILL_KINDS`).
        seed: the seed it was generated from (``generate(kind, seed)`` rebuilds it).
        question: the question text, units stated.
        answer: memlib's value, in ``unit``.
        unit: ``"GB"`` (10⁹ bytes), ``"GiB"``, ``"MiB"``, ``"GPUs"``, ``"sequences"``, ``"parameters"``, ``"%"``...
        rel_tol: relative tolerance of :func:`grade`.
        abs_tol: absolute tolerance (in ``unit``); the larger of the two applies.
        difficulty: ``"E"``, ``"M"`` or ``"H"``.
        chapter: the chapter that teaches it.
        explanation: how memlib computed the answer.
        settings: the randomized parameters.
    """

    kind: str
    seed: int
    question: str
    answer: float
    unit: str
    rel_tol: float
    abs_tol: float
    difficulty: str
    chapter: int
    explanation: str
    settings: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def tolerance_text(self) -> str:
        """The tolerance in words (``"±5 %"``, ``"exact"``)."""
        if self.rel_tol > 0:
            return f"±{100 * self.rel_tol:g} %"
        if self.abs_tol >= 0.5 and float(self.answer).is_integer():
            return "exact" if self.abs_tol < 1 else f"±{self.abs_tol:g}"
        return f"±{self.abs_tol:g} {self.unit}"

    @property
    def answer_text(self) -> str:
        """memlib's answer with its unit (``"7,372,800 parameters"``, ``"43.22 GB"``)."""
        if float(self.answer).is_integer() and self.unit not in ("GB", "GiB", "MiB", "%"):
            unit = self.unit[:-1] if self.answer == 1 and self.unit.endswith("s") else self.unit
            return f"{int(self.answer):,} {unit}"
        return f"{self.answer:,.2f} {self.unit}"


@dataclass(frozen=True)
class DrillKind:
    """A registered drill generator. Introduced in the Drills part.

    Attributes:
        name: the kind's name.
        chapter: the chapter it drills.
        description: one line saying what is asked.
        make: ``make(rng, seed) -> Drill``.
    """

    name: str
    chapter: int
    description: str
    make: Callable[[random.Random, int], Drill]


#: Registered generators, by name. Add one with the :func:`drill_kind` decorator.
DRILL_KINDS: dict[str, DrillKind] = {}


def drill_kind(name: str, chapter: int, description: str) -> Callable[[Callable[[random.Random, int], Drill]],
                                                                      Callable[[random.Random, int], Drill]]:
    """Register a drill generator ``f(rng, seed) -> Drill`` under ``name``. Introduced in the Drills part.

    A new kind is one function: draw its parameters from ``rng`` (a ``random.Random``), compute the answer
    with memlib, and return a :class:`Drill`.
    """
    check_choice("chapter", chapter, CHAPTERS)

    def register(f: Callable[[random.Random, int], Drill]) -> Callable[[random.Random, int], Drill]:
        if name in DRILL_KINDS:
            raise MemlibError(f"drill kind {name!r} is already registered")
        DRILL_KINDS[name] = DrillKind(name, chapter, description, f)
        return f

    return register


def generate(kind: str, seed: int) -> Drill:
    """Build the drill of ``kind`` for ``seed`` (deterministic). Introduced in the Drills part.

    Raises:
        MemlibError: for an unknown kind, listing the registered ones.
    """
    check_choice("drill kind", kind, DRILL_KINDS)
    seed = check_positive("seed", seed, allow_zero=True)
    return DRILL_KINDS[kind].make(random.Random(seed), seed)


_TRAIN_MODELS = ("gpt2", "gpt2-xl", "qwen2-0.5b", "gemma-2b", "llama-2-7b", "mistral-7b", "llama-3-8b",
                 "llama-2-13b")
_INFER_MODELS = ("qwen2-0.5b", "gemma-2b", "llama-2-7b", "mistral-7b", "llama-3-8b", "llama-2-13b",
                 "llama-2-70b", "llama-3-70b")
_PRECISION_WORDS = {"fp32": "fp32", "fp16-mixed": "fp16 mixed precision", "bf16-mixed": "bf16 mixed precision",
                    "bf16": "pure bf16 (no fp32 master weights)"}
_OPT_WORDS = {"sgd": "plain SGD", "sgd-momentum": "SGD with momentum", "adamw": "AdamW",
              "adamw-8bit": "8-bit AdamW (bitsandbytes)"}


def _seq_lens(model: str, lengths: tuple[int, ...]) -> tuple[int, ...]:
    """The lengths the model's position table holds (memlib refuses longer sequences)."""
    limit = load_config(model).max_position_embeddings
    return tuple(s for s in lengths if s <= limit) or (limit,)


def _zero_words(stage: int, gpus: int) -> str:
    if stage == 0:
        return f"plain data parallelism (no ZeRO) on {gpus} GPU{'s' if gpus > 1 else ''}"
    return f"ZeRO stage {stage} over {gpus} GPUs"


@drill_kind("model_states", 6, "model states per GPU for N parameters, a precision, an optimizer and a ZeRO stage")
def _model_states(rng: random.Random, seed: int) -> Drill:
    billions = rng.choice((1, 3, 7, 13, 30, 65, 70, 175))
    precision = rng.choice(("fp32", "bf16-mixed", "bf16-mixed", "bf16"))
    optimizer = rng.choice(("sgd", "sgd-momentum", "adamw", "adamw", "adamw-8bit"))
    stage = rng.choice((0, 1, 2, 3))
    gpus = 1 if stage == 0 and rng.random() < 0.3 else rng.choice((2, 4, 8, 16, 64))
    e = estimate_training(params=billions * 10**9, precision=precision, optimizer=optimizer, zero_stage=stage,
                          num_gpus=gpus)
    q = (f"A {billions}B-parameter model is trained with {_PRECISION_WORDS[precision]} and "
         f"{_OPT_WORDS[optimizer]}, {_zero_words(stage, gpus)}. How many GB (10⁹ bytes) of model states "
         f"(weights + gradients + optimizer states) does each GPU hold?")
    w, g, o = state_bytes_per_param(precision, optimizer)
    how = (f"estimate_training(params={billions}e9, precision='{precision}', optimizer='{optimizer}', "
           f"zero_stage={stage}, num_gpus={gpus}): {w:g} + {g:g} + {o:g} bytes/param before sharding → "
           f"weights {_gb(e.params_bytes, 2)}, grads {_gb(e.grads_bytes, 2)}, optimizer {_gb(e.optimizer_bytes, 2)}")
    return Drill("model_states", seed, q, e.total_bytes / GB, "GB", 0.02, 0.01, "E" if stage == 0 else "M", 6, how,
                 {"params": billions * 10**9, "precision": precision, "optimizer": optimizer, "zero_stage": stage,
                  "num_gpus": gpus})


#: The activation accounting the activation and peak drills state, so that they can be answered at a whiteboard.
KORTHIKANTI_RULE = ("Count activations with Korthikanti et al.'s GPT-layer formula: s·b·h·(34 + 5·a·s/h) bytes "
                    "per layer (16-bit activations, the a·s² attention scores kept); FlashAttention or selective "
                    "recomputation drops the 5·a·s/h term, and full recomputation keeps only each layer's "
                    "2·s·b·h-byte input.")


def korthikanti_bytes(model: str, batch_size: int, seq_len: int, attention: str = "eager",
                      recompute: str = "none") -> int:
    """Saved activations of all layers by Korthikanti et al.'s GPT-layer formula (:data:`KORTHIKANTI_RULE`).

    Introduced in the Drills part: the whiteboard answer of the activation and peak drills. Per layer
    s·b·h·(34 + 5·a·s/h) bytes (:func:`memlib.core.estimate.korthikanti_activation_bytes`); 34·s·b·h with
    FlashAttention (``attention="sdpa"``) or selective recomputation; 2·s·b·h with full recomputation.
    Limitation: it treats every model as a GPT layer (MHA, a 4h GELU MLP, dropout) with the model's h, a and L;
    memlib's term-by-term :func:`memlib.core.estimate.estimate_training` counts the real architecture.
    """
    check_choice("attention", attention, ("eager", "sdpa"))
    check_choice("recompute", recompute, ("none", "selective", "full"))
    cfg = load_config(model)
    s, b, h = seq_len, batch_size, cfg.hidden_size
    if recompute == "full":
        per_layer = 2 * s * b * h
    elif recompute == "selective" or attention == "sdpa":
        per_layer = 34 * s * b * h
    else:
        per_layer = korthikanti_activation_bytes(cfg, b, s)
    return cfg.num_layers * per_layer


def _shape_words(model: str) -> str:
    cfg = load_config(model)
    return f"L = {cfg.num_layers} layers, h = {cfg.hidden_size}, a = {cfg.num_heads} heads"


_ATTENTION_WORDS = {"sdpa": "FlashAttention (SDPA)", "eager": "eager attention"}
_RECOMPUTE_WORDS = {"none": "no recomputation", "selective": "selective recomputation",
                    "full": "full activation checkpointing"}


@drill_kind("training_peak", 1, "peak training memory per GPU: model states + activations by Korthikanti's formula")
def _training_peak(rng: random.Random, seed: int) -> Drill:
    model = rng.choice(_TRAIN_MODELS)
    b = rng.choice((1, 2, 4, 8))
    s = rng.choice(_seq_lens(model, (512, 1024, 2048, 4096)))
    precision = rng.choice(("bf16-mixed", "bf16-mixed", "bf16"))
    optimizer = rng.choice(("adamw", "adamw", "adamw-8bit", "sgd-momentum"))
    stage = rng.choice((0, 0, 1, 2, 3))
    gpus = 1 if stage == 0 else rng.choice((2, 4, 8))
    recompute = rng.choice(("none", "none", "selective", "full"))
    attention = rng.choice(("sdpa", "sdpa", "eager"))
    n = count_params(model).params
    w, g, o = state_bytes_per_param(precision, optimizer)
    states = estimate_training(params=n, precision=precision, optimizer=optimizer, zero_stage=stage,
                               num_gpus=gpus).total_bytes
    acts = korthikanti_bytes(model, b, s, attention, recompute)
    e = estimate_training(model, batch_size=b, seq_len=s, precision=precision, optimizer=optimizer,
                          zero_stage=stage, num_gpus=gpus, recompute=recompute, attention=attention)
    q = (f"Train {model} ({n / 1e9:.2f} B parameters; {_shape_words(model)}) at batch {b} × {s} tokens per GPU "
         f"with {_PRECISION_WORDS[precision]}, {_OPT_WORDS[optimizer]} ({w:g} + {g:g} + {o:g} bytes per "
         f"parameter of weights, gradients and optimizer states before sharding), {_zero_words(stage, gpus)}, "
         f"{_ATTENTION_WORDS[attention]} and {_RECOMPUTE_WORDS[recompute]}. Estimate the peak memory per GPU in "
         f"GB (10⁹ bytes) as model states + saved activations (no temporaries, CUDA context or allocator "
         f"overhead). {KORTHIKANTI_RULE}")
    how = (f"model states {_gb(states, 2)} (estimate_training(params={n}, precision='{precision}', "
           f"optimizer='{optimizer}', zero_stage={stage}, num_gpus={gpus})) + activations {_gb(acts, 2)} "
           f"(korthikanti_bytes('{model}', {b}, {s}, '{attention}', '{recompute}')). For comparison, memlib's "
           f"term-by-term estimate of {model}'s own layers, temporaries included, is {_gb(e.total_bytes, 2)} "
           f"(activations {_gb(e.activations_bytes or 0, 2)}, temporaries {_gb(e.temp_bytes, 2)}, peak in the "
           f"{e.peak_phase})")
    return Drill("training_peak", seed, q, (states + acts) / GB, "GB", 0.05, 0.05, "H", 1, how,
                 {"model": model, "batch_size": b, "seq_len": s, "precision": precision, "optimizer": optimizer,
                  "zero_stage": stage, "num_gpus": gpus, "recompute": recompute, "attention": attention,
                  "params": n})


@drill_kind("activations", 4, "saved activations by Korthikanti's formula for a shipped model, batch and sequence")
def _activations(rng: random.Random, seed: int) -> Drill:
    model = rng.choice(_TRAIN_MODELS)
    b = rng.choice((1, 2, 4))
    s = rng.choice(_seq_lens(model, (1024, 2048, 4096)))
    recompute = rng.choice(("none", "selective", "full"))
    attention = rng.choice(("sdpa", "eager"))
    acts = korthikanti_bytes(model, b, s, attention, recompute)
    e = estimate_training(model, batch_size=b, seq_len=s, recompute=recompute, attention=attention)
    q = (f"{model} ({_shape_words(model)}) in bf16 mixed precision at batch {b} × {s} tokens with "
         f"{_ATTENTION_WORDS[attention]} and {_RECOMPUTE_WORDS[recompute]}: how many GB (10⁹ bytes) of "
         f"activations do its layers save for the backward pass? {KORTHIKANTI_RULE}")
    how = (f"korthikanti_bytes('{model}', {b}, {s}, '{attention}', '{recompute}'). For comparison, memlib's "
           f"term-by-term count of {model}'s own layers and loss (estimate_training('{model}', batch_size={b}, "
           f"seq_len={s}, recompute='{recompute}', attention='{attention}').activations_bytes) is "
           f"{_gb(e.activations_bytes or 0, 2)}")
    return Drill("activations", seed, q, acts / GB, "GB", 0.03, 0.02, "H", 4, how,
                 {"model": model, "batch_size": b, "seq_len": s, "recompute": recompute, "attention": attention})


@drill_kind("kv_cache", 11, "KV-cache size for a shipped model, batch, sequence and KV dtype")
def _kv_cache(rng: random.Random, seed: int) -> Drill:
    model = rng.choice(_INFER_MODELS)
    b = rng.choice((1, 4, 8, 16, 32))
    s = rng.choice(_seq_lens(model, (1024, 2048, 4096, 8192)))
    kv = rng.choice(("fp16", "fp16", "bf16", "fp8"))
    e = estimate_inference(model, batch_size=b, seq_len=s, kv_dtype=kv)
    cfg = load_config(model)
    q = (f"{model} serves {b} sequences of {s} tokens with a {kv} KV cache. How many GB (10⁹ bytes) does the KV "
         f"cache take?")
    how = (f"2 × {cfg.num_layers} layers × {cfg.num_kv_heads} KV heads × {cfg.head_dim} × {s} × {b} × "
           f"{KV_DTYPES[kv]} bytes = estimate_inference('{model}', batch_size={b}, seq_len={s}, "
           f"kv_dtype='{kv}').kv_cache_bytes")
    return Drill("kv_cache", seed, q, e.kv_cache_bytes / GB, "GB", 0.02, 0.01, "M", 11, how,
                 {"model": model, "batch_size": b, "seq_len": s, "kv_dtype": kv})


@drill_kind("inference_total", 11, "weights + KV cache for a shipped model in a weight format")
def _inference_total(rng: random.Random, seed: int) -> Drill:
    model = rng.choice(_INFER_MODELS)
    weights = rng.choice(("fp16", "bf16", "int8", "int4", "nf4"))
    b = rng.choice((1, 2, 4, 8))
    s = rng.choice(_seq_lens(model, (2048, 4096, 8192)))
    e = estimate_inference(model, batch_size=b, seq_len=s, weights=weights)
    q = (f"{model} with {weights} weights (16-bit embeddings and norms), fp16 KV cache, {b} sequence"
         f"{'s' if b > 1 else ''} of {s} tokens: how many GB (10⁹ bytes) for weights + KV cache?")
    how = (f"estimate_inference('{model}', batch_size={b}, seq_len={s}, weights='{weights}'): weights "
           f"{_gb(e.weights_bytes, 2)} ({weight_bytes_per_param(weights):.4f} bytes/param for quantized matrices) "
           f"+ KV {_gb(e.kv_cache_bytes, 2)}")
    return Drill("inference_total", seed, q, e.total_bytes / GB, "GB", 0.05, 0.05, "M", 11, how,
                 {"model": model, "weights": weights, "batch_size": b, "seq_len": s})


@drill_kind("zero_min_gpus", 6, "fewest GPUs (a power of two) whose ZeRO-sharded model states fit")
def _zero_min_gpus(rng: random.Random, seed: int) -> Drill:
    while True:
        billions = rng.choice((7, 13, 30, 65, 70, 175))
        stage = rng.choice((1, 2, 3, 3))
        mem = rng.choice((24, 40, 48, 80, 141))
        optimizer = rng.choice(("adamw", "adamw", "adamw-8bit"))
        counts = [2**k for k in range(11)]
        fits = [n for n in counts if estimate_training(params=billions * 10**9, optimizer=optimizer,
                                                       zero_stage=stage, num_gpus=n).total_bytes <= mem * GiB]
        if fits:
            break
    n = fits[0]
    q = (f"A {billions}B-parameter model, bf16 mixed precision, {_OPT_WORDS[optimizer]}, ZeRO stage {stage}. "
         f"What is the smallest power-of-two number of {mem} GiB GPUs on which the model states alone (no "
         f"activations) fit?")
    per = estimate_training(params=billions * 10**9, optimizer=optimizer, zero_stage=stage, num_gpus=n).total_bytes
    prev = (f"; with {n // 2}: {_gb(estimate_training(params=billions * 10**9, optimizer=optimizer, zero_stage=stage, num_gpus=n // 2).total_bytes, 1)}"  # noqa: E501
            if n > 1 else "")
    how = (f"smallest n in 1, 2, 4, … with estimate_training(params={billions}e9, optimizer='{optimizer}', "
           f"zero_stage={stage}, num_gpus=n).total_bytes ≤ {mem} GiB: with {n}: {_gb(per, 1)}{prev}")
    return Drill("zero_min_gpus", seed, q, float(n), "GPUs", 0.0, 0.5, "H", 6, how,
                 {"params": billions * 10**9, "zero_stage": stage, "gpu_memory_gib": mem, "optimizer": optimizer})


@drill_kind("max_batch", 11, "most sequences whose weights + KV cache fit in one GPU")
def _max_batch(rng: random.Random, seed: int) -> Drill:
    while True:
        model = rng.choice(_INFER_MODELS)
        weights = rng.choice(("fp16", "int8", "int4"))
        kv = rng.choice(("fp16", "fp8"))
        s = rng.choice(_seq_lens(model, (2048, 4096, 8192)))
        mem = rng.choice((24, 40, 48, 80))
        one = estimate_inference(model, batch_size=1, seq_len=s, weights=weights, kv_dtype=kv)
        if one.total_bytes <= mem * GiB:
            break
    n = (mem * GiB - one.weights_bytes) // one.kv_cache_bytes
    q = (f"{model} with {weights} weights and a {kv} KV cache on one {mem} GiB GPU: how many "
         f"{s}-token sequences fit at once, counting only weights and KV cache?")
    how = (f"⌊({mem} GiB = {_gb(mem * GiB, 2)} − weights {_gb(one.weights_bytes, 2)}) / KV per sequence {_gb(one.kv_cache_bytes, 3)}⌋ "
           f"(estimate_inference('{model}', seq_len={s}, weights='{weights}', kv_dtype='{kv}'))")
    return Drill("max_batch", seed, q, float(n), "sequences", 0.0, 0.5, "M", 11, how,
                 {"model": model, "weights": weights, "kv_dtype": kv, "seq_len": s, "gpu_memory_gib": mem})


_SERVE_GPUS = ("l4", "a10", "rtx-4090", "l40s", "a100-40gb", "a100-80gb", "h100-sxm", "h200")


def _serve_setup(rng: random.Random, users: bool) -> tuple[dict[str, Any], Any]:
    """Draw a serving setup whose budget leaves KV blocks (and, for ``users``, at least one full request)."""
    while True:
        kw: dict[str, Any] = dict(gpu=rng.choice(_SERVE_GPUS), weights=rng.choice(("fp16", "fp16", "int8", "int4")),
                                  kv_dtype=rng.choice(("fp16", "fp8")), block_size=rng.choice((16, 16, 32)),
                                  gpu_memory_utilization=rng.choice((0.8, 0.85, 0.9, 0.9, 0.95)))
        model = rng.choice(_INFER_MODELS)
        length = rng.choice(_seq_lens(model, (2048, 4096, 8192)))
        fit = serve(model, max_model_len=length, **kw)
        if fit.max_concurrent_seqs >= 1 if users else fit.num_blocks > 1:
            return {"model": model, "max_model_len": length, **kw}, fit


def _serve_words(st: dict[str, Any], fit: Any) -> str:
    gpu = get_gpu(st["gpu"])
    return (f"A vLLM-style engine serves {st['model']} ({st['weights']} weights, {st['kv_dtype']} KV cache) on one "
            f"{gpu.full_name} ({fit.gpu_memory_bytes / GiB:.0f} GiB) with gpu_memory_utilization "
            f"{st['gpu_memory_utilization']} and KV blocks of {st['block_size']} tokens. Count the weights as "
            f"{fit.weights_bytes / GiB:.2f} GiB, the activation peak of a 2048-token prefill chunk as "
            f"{fit.activation_bytes / GiB:.2f} GiB, and {(fit.non_torch_bytes + fit.cuda_graph_bytes) / GiB:g} GiB for "
            "non-torch memory and CUDA graphs.")


def _serve_how(st: dict[str, Any], fit: Any) -> str:
    return (f"kv budget = {st['gpu_memory_utilization']} × {fit.gpu_memory_bytes / GiB:.0f} GiB − "
            f"{fit.weights_bytes / GiB:.2f} − {fit.activation_bytes / GiB:.2f} − "
            f"{(fit.non_torch_bytes + fit.cuda_graph_bytes) / GiB:g} GiB = "
            f"{fit.kv_budget_bytes / GiB:.2f} GiB; a block is {st['block_size']} tokens × "
            f"{fit.kv_bytes_per_token:,} bytes = {fit.block_bytes / MiB:g} MiB → {fit.num_blocks:,} blocks "
            f"(serve('{st['model']}', max_model_len={st['max_model_len']}, gpu='{st['gpu']}', "
            f"weights='{st['weights']}', kv_dtype='{st['kv_dtype']}', block_size={st['block_size']}, "
            f"gpu_memory_utilization={st['gpu_memory_utilization']}))")


@drill_kind("serve_blocks", 14, "KV blocks a vLLM-style engine allocates from its memory budget")
def _serve_blocks(rng: random.Random, seed: int) -> Drill:
    st, fit = _serve_setup(rng, users=False)
    q = _serve_words(st, fit) + " How many KV blocks does it allocate?"
    return Drill("serve_blocks", seed, q, float(fit.num_blocks), "blocks", 0.01, 1.0, "M", 14, _serve_how(st, fit),
                 st)


@drill_kind("serve_users", 14, "requests of max-model-len tokens a vLLM-style engine holds at once")
def _serve_users(rng: random.Random, seed: int) -> Drill:
    st, fit = _serve_setup(rng, users=True)
    q = (_serve_words(st, fit) + f" How many requests of {st['max_model_len']} tokens fit at once (one block is the "
         f"pool's null block)?")
    how = (_serve_how(st, fit) + f"; ⌊({fit.num_blocks:,} − 1) / ⌈{st['max_model_len']} / {st['block_size']}⌉ = "
           f"{fit.blocks_per_seq}⌋ = {fit.max_concurrent_seqs}")
    return Drill("serve_users", seed, q, float(fit.max_concurrent_seqs), "requests", 0.0, 1.0, "H", 14, how, st)


@drill_kind("decode_latency", 14, "least time of one decode step: bytes moved ÷ memory bandwidth")
def _decode_latency(rng: random.Random, seed: int) -> Drill:
    while True:
        model = rng.choice(_INFER_MODELS)
        gpu = get_gpu(rng.choice(_SERVE_GPUS))
        weights = rng.choice(("fp16", "int8", "int4"))
        b = rng.choice((1, 1, 8, 32, 64))
        s = rng.choice(_seq_lens(model, (1024, 2048, 4096, 8192)))
        moved = decode_bytes_per_step(model, batch_size=b, context_len=s, weights=weights)
        if moved <= 0.9 * gpu.memory_bytes:
            break
    w = estimate_inference(model, seq_len=1, weights=weights).weights_bytes
    ms = 1e3 * moved / gpu.bandwidth_bytes_per_s
    q = (f"{model} with {weights} weights ({_gb(w, 2)}) and an fp16 KV cache decodes {b} sequence"
         f"{'s' if b > 1 else ''} with {s} tokens of context{' each' if b > 1 else ''} on one {gpu.full_name} "
         f"({gpu.bandwidth_gb_s:,.0f} GB/s). Taking the step as memory-bound — every weight and every sequence's "
         f"KV cache read once — what is the least time per decode step, in ms?")
    how = (f"(weights {_gb(w, 2)} + KV {b} × {s} × {serve_kv_bytes_per_token(model):,} bytes = "
           f"{_gb(moved - w, 2)}) ÷ {gpu.bandwidth_gb_s:,.0f} GB/s (decode_latency_s('{model}', gpu='{gpu.name}', "
           f"batch_size={b}, context_len={s}, weights='{weights}'))")
    return Drill("decode_latency", seed, q, ms, "ms", 0.05, 0.01, "M", 14, how,
                 {"model": model, "gpu": gpu.name, "weights": weights, "batch_size": b, "context_len": s})


@drill_kind("attention_matrix", 10, "size of one N×N attention matrix per head, per layer or per model")
def _attention_matrix(rng: random.Random, seed: int) -> Drill:
    model = rng.choice(("gpt2", "gpt2-xl", "llama-2-7b", "llama-2-13b", "llama-3-8b", "llama-2-70b"))
    s = rng.choice(_seq_lens(model, (1024, 2048, 4096, 8192, 16384)))
    dtype = rng.choice(("fp16", "fp32"))
    scope = rng.choice(("head", "layer", "model"))
    cfg = load_config(model)
    nbytes = s * s * (2 if dtype == "fp16" else 4)
    mult = {"head": 1, "layer": cfg.num_heads, "model": cfg.num_heads * cfg.num_layers}[scope]
    unit, div = ("MiB", MiB) if scope == "head" else ("GiB", GiB)
    where = {"head": "for one head", "layer": f"for one layer ({cfg.num_heads} heads)",
             "model": f"for the whole model ({cfg.num_layers} layers × {cfg.num_heads} heads)"}[scope]
    q = (f"Eager attention in {model} at {s} tokens stores the {dtype} attention probabilities (an N×N matrix per "
         f"head). How many {unit} does that take {where}, for one sample?")
    how = f"{s}² × {2 if dtype == 'fp16' else 4} bytes × {mult} = {nbytes * mult:,} bytes"
    return Drill("attention_matrix", seed, q, nbytes * mult / div, unit, 0.01, 0.01, "M", 10, how,
                 {"model": model, "seq_len": s, "dtype": dtype, "scope": scope})


@drill_kind("adam8bit_saving", 8, "GB saved by 8-bit AdamW over AdamW for a shipped model")
def _adam8bit_saving(rng: random.Random, seed: int) -> Drill:
    model = rng.choice(_TRAIN_MODELS + ("llama-2-70b",))
    stage = rng.choice((0, 0, 1))
    gpus = 1 if stage == 0 else rng.choice((4, 8))
    a = estimate_training(model, zero_stage=stage, num_gpus=gpus).optimizer_bytes
    b = estimate_training(model, optimizer="adamw-8bit", zero_stage=stage, num_gpus=gpus).optimizer_bytes
    q = (f"Training {model} with bf16 mixed precision, {_zero_words(stage, gpus)}: how many GB (10⁹ bytes) of "
         f"optimizer state per GPU does switching from AdamW to bitsandbytes' 8-bit AdamW save?")
    how = (f"estimate_training('{model}', zero_stage={stage}, num_gpus={gpus}).optimizer_bytes: "
           f"{_gb(a, 2)} (adamw) − {_gb(b, 2)} (adamw-8bit: m, v in 8 bits + absmax per 256, small tensors 32-bit)")
    return Drill("adam8bit_saving", seed, q, (a - b) / GB, "GB", 0.03, 0.01, "E", 8, how,
                 {"model": model, "zero_stage": stage, "num_gpus": gpus})


@drill_kind("mfu", 12, "model FLOPs utilization from tokens/s per GPU, 6·N_matmul + 12·L·H·Q·T FLOPs per token")
def _mfu(rng: random.Random, seed: int) -> Drill:
    model = rng.choice(("gpt2-xl", "gemma-2b", "llama-2-7b", "llama-3-8b", "llama-2-13b", "llama-2-70b"))
    cfg = load_config(model)
    s = rng.choice(_seq_lens(model, (1024, 2048, 4096, 8192)))
    gpu, peak = rng.choice((("A100", 312e12), ("H100", 989.5e12)))
    n_mm = matmul_params(cfg)
    per_token = palm_flops(cfg, 1, s) / s  # 6·N_matmul + 12·L·H·Q·T
    mfu_target = rng.choice((0.25, 0.35, 0.45, 0.55))
    raw = mfu_target * peak / per_token
    tokens = max(1, int(round(raw, -1 if raw > 100 else 0)))
    value = 100 * per_token * tokens / peak
    n_all = count_params(model).params
    q = (f"Training {model} on {s}-token sequences runs at {tokens:,} tokens/s per {gpu} (dense bf16 peak "
         f"{peak / 1e12:g} TFLOP/s). Counting 6·N + 12·L·H·Q·T FLOPs per token (Chapter 12), with "
         f"N = {n_mm / 1e9:.3g} B matmul weights (the LM head in, the embedding lookup out), L = {cfg.num_layers} "
         f"layers, H = {cfg.num_heads} heads of Q = {cfg.head_dim} and T = {s}, what is the model FLOPs "
         f"utilization, in %?")
    how = (f"(6 × {n_mm:,} + 12 × {cfg.num_layers} × {cfg.num_heads} × {cfg.head_dim} × {s}) = "
           f"{per_token / 1e9:.2f} GFLOP per token (palm_flops('{model}', 1, {s}) / {s}), × {tokens:,} / "
           f"{peak:.4g}. 6 × all {n_all / 1e9:.2f} B parameters would give {100 * 6 * n_all * tokens / peak:.1f} %")
    return Drill("mfu", seed, q, value, "%", 0.02, 0.2, "M", 12, how,
                 {"model": model, "gpu": gpu, "tokens_per_s": tokens, "seq_len": s, "peak_flops": peak,
                  "matmul_params": n_mm})


@drill_kind("effective_batch", 5, "effective batch from micro-batch, accumulation and data-parallel GPUs")
def _effective_batch(rng: random.Random, seed: int) -> Drill:
    micro = rng.choice((1, 2, 4, 8, 16))
    accum = rng.choice((1, 2, 4, 8, 16, 32))
    gpus = rng.choice((1, 2, 4, 8, 16, 64))
    q = (f"Micro-batch {micro} per GPU, {accum} gradient-accumulation step{'s' if accum > 1 else ''}, {gpus} "
         f"data-parallel GPU{'s' if gpus > 1 else ''}: how many "
         f"sequences does one optimizer step see?")
    return Drill("effective_batch", seed, q, float(micro * accum * gpus), "sequences", 0.0, 0.5, "E", 5,
                 f"{micro} × {accum} × {gpus}", {"micro_batch": micro, "accumulation": accum, "num_gpus": gpus})


@drill_kind("lora_params", 9, "trainable LoRA parameters for a shipped model, rank and target modules")
def _lora_params_drill(rng: random.Random, seed: int) -> Drill:
    model = rng.choice(_TRAIN_MODELS)
    rank = rng.choice((4, 8, 16, 32, 64))
    targets = rng.choice(("all-linear", "attention", "qv"))
    words = {"all-linear": "every Linear layer of each decoder block (q, k, v, o and the MLP)",
             "attention": "the four attention projections (q, k, v, o)", "qv": "W_q and W_v only"}[targets]
    n = lora_params(model, rank, targets)
    q = (f"LoRA with rank {rank} on {words} of {model}: how many trainable parameters? "
         f"(A and B matrices, no bias; an answer such as 7.4M or 7,372,800 is fine)")
    how = f"lora_params('{model}', {rank}, '{targets}') = Σ over layers and targets of r·(d_in + d_out)"
    return Drill("lora_params", seed, q, float(n), "parameters", 0.01, 0.5, "M", 9, how,
                 {"model": model, "rank": rank, "targets": targets})


@drill_kind("offload_host", 7, "GPU and host memory of ZeRO-Offload model states for N parameters")
def _offload_host(rng: random.Random, seed: int) -> Drill:
    billions = rng.choice((1, 3, 7, 13, 30, 70))
    gpus = rng.choice((1, 2, 4, 8))
    e = estimate_training(params=billions * 10**9, zero_stage=1 if gpus > 1 else 0, num_gpus=gpus,
                          offload="optimizer")
    shard = f", ZeRO sharding the offloaded states over {gpus} GPUs" if gpus > 1 else " on one GPU"
    q = (f"A {billions}B-parameter model is trained with bf16 mixed-precision AdamW and ZeRO-Offload (optimizer "
         f"states, fp32 master weights and fp32 gradients in CPU memory){shard}. How many GB (10⁹ bytes) of host "
         f"memory do the offloaded states of one GPU's process take (without DeepSpeed's 1.5× buffers)?")
    how = (f"estimate_training(params={billions}e9, offload='optimizer', ...).cpu_bytes = (12 + 4) bytes/param "
           f"/ {gpus} = {_gb(e.cpu_bytes, 2)}")
    return Drill("offload_host", seed, q, e.cpu_bytes / GB, "GB", 0.02, 0.01, "M", 7, how,
                 {"params": billions * 10**9, "num_gpus": gpus})


#: Memory units an answer may carry, in bytes (decimal KB…TB as in papers, binary KiB…TiB as in torch).
BYTE_UNITS: dict[str, int] = {"B": 1, "KB": 10**3, "MB": MB, "GB": GB, "TB": 10**12, "KiB": 2**10, "MiB": MiB,
                              "GiB": GiB, "TiB": 2**40}
#: Multipliers a number may carry: SI suffixes (``7.37M``; ``B`` for billion where the answer is not in bytes) and
#: words.
MULTIPLIERS: dict[str, float] = {"k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "B": 1e9, "T": 1e12, "thousand": 1e3,
                                 "million": 1e6, "mn": 1e6, "billion": 1e9, "bn": 1e9, "trillion": 1e12}
#: Words accepted for a count unit (case-insensitive).
UNIT_WORDS: dict[str, tuple[str, ...]] = {
    "sequences": ("seq", "seqs", "sequence", "sequences", "sample", "samples"),
    "GPUs": ("gpu", "gpus", "card", "cards"),
    "parameters": ("param", "params", "parameter", "parameters"),
    "tokens": ("tok", "toks", "token", "tokens"),
    "%": ("%", "percent", "pct"),
}
_BYTE_UNITS_LOWER = {u.lower(): n for u, n in BYTE_UNITS.items()} | {"byte": 1, "bytes": 1}
_NUMBER = re.compile(r"\s*(?P<num>[-+]?(?:(?:\d{1,3}(?:,\d{3})+|\d+(?:_\d+)*)(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?)"
                     r"\s*(?P<rest>.*?)\s*")


def _unit_words(unit: str) -> tuple[str, ...]:
    return UNIT_WORDS.get(unit, (unit.lower(), unit.lower().rstrip("s")))


def parse_answer(text: str | float | int, unit: str) -> float:
    """Read an answer and return it in ``unit``. Introduced in the Drills part.

    Accepted: a number with optional thousands separators (``7,372,800``) or exponent (``7.4e6``), then
    optionally an SI multiplier (``k``/``K``, ``M``, ``G``, ``B`` = billion, ``T``, or a word such as
    ``million``) and/or a unit. Memory units (``B``, ``KB``…``TB``, ``KiB``…``TiB``, any case) are converted to
    a memory ``unit`` (``parse_answer("1.225 TB", "GB") == 1225``, ``parse_answer("20 GiB", "GB") == 21.47…``);
    for a memory question a bare multiplier means decimal bytes (``"1.2T"`` = 1.2 TB) and ``B`` means bytes.
    Count units take a multiplier and their own words (``"7.37M params"``, ``"775 seqs"``, ``"8 GPUs"``,
    ``"32 %"``).

    Raises:
        MemlibError: if the text is not a finite number with an optional multiplier and unit, or if its unit
            does not fit ``unit`` (``"3 GB"`` for a count of sequences).
    """
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value = float(text)
    else:
        m = _NUMBER.fullmatch(str(text))
        if not m:
            raise MemlibError(f"cannot read the answer {text!r}; expected a number such as 12.5, 7.4M or "
                              f"'12.5 {unit}'")
        value = float(m.group("num").replace(",", "").replace("_", ""))
        value = _apply_unit(value, m.group("rest"), unit, text)
    if not math.isfinite(value):
        raise MemlibError(f"answer must be a finite number, got {text!r}")
    return value


def _apply_unit(value: float, rest: str, unit: str, text: object) -> float:
    """``value`` followed by ``rest`` (multiplier and/or unit), expressed in ``unit``."""
    memory = unit in BYTE_UNITS
    words = rest.replace("\u00a0", " ").replace("\u202f", " ").split()
    if not words:
        return value
    if len(words) == 1 and not memory and words[0] not in MULTIPLIERS and words[0].lower() not in MULTIPLIERS:
        # "7.37Mparams": split a leading SI letter off a unit word
        w = words[0]
        if w[0] in MULTIPLIERS and w[1:].lower() in _unit_words(unit):
            words = [w[0], w[1:]]
    mult = 1.0
    head = words[0]
    if memory and head.lower() in _BYTE_UNITS_LOWER and len(words) == 1:
        return value * _BYTE_UNITS_LOWER[head.lower()] / BYTE_UNITS[unit]
    if head in MULTIPLIERS or head.lower() in MULTIPLIERS:
        mult = MULTIPLIERS.get(head, MULTIPLIERS.get(head.lower(), 1.0))
        words = words[1:]
        if unit == "%":
            raise MemlibError(f"a multiplier ({head!r}) makes no sense for an answer in %; got {text!r}")
        if memory:  # "1.2G" for a question in GB: decimal bytes
            if words:
                raise MemlibError(f"cannot read the unit of {text!r}; expected one of: "
                                  + ", ".join(BYTE_UNITS))
            return value * mult / BYTE_UNITS[unit]
    if not words:
        return value * mult
    if len(words) > 1:
        raise MemlibError(f"cannot read the unit of {text!r}; expected at most a multiplier and a unit")
    given = words[0]
    if memory:
        raise MemlibError(f"unit {given!r} does not match the drill's unit {unit!r}; expected one of: "
                          + ", ".join(BYTE_UNITS))
    if given.lower() in _unit_words(unit):
        return value * mult
    if given.lower() in _BYTE_UNITS_LOWER:
        raise MemlibError(f"unit {given!r} is memory; the drill asks for {unit}")
    raise MemlibError(f"unit {given!r} does not match the drill's unit {unit!r}; expected one of: "
                      + ", ".join(_unit_words(unit)))


def grade(drill: Drill, answer: str | float | int | None) -> bool:
    """True if ``answer`` is within the drill's tolerance of memlib's value. Introduced in the Drills part.

    Args:
        drill: the drill.
        answer: a number in the drill's unit, or text such as ``"21.5"``, ``"20 GiB"``, ``"7.37M"`` or
            ``"775 seqs"`` (see :func:`parse_answer`);
            None or unreadable text counts as wrong.
    """
    if answer is None:
        return False
    try:
        value = parse_answer(answer, drill.unit)
    except MemlibError:
        return False
    return abs(value - drill.answer) <= max(drill.abs_tol, drill.rel_tol * abs(drill.answer))


def drill_markdown(drill: Drill, number: int) -> str:
    """MyST Markdown for one drill: the question and an Answer dropdown with memlib's value and how."""
    return (f"**Drill {number} [{drill.difficulty}] [{drill.kind}].** {drill.question}\n\n"
            f"```{{dropdown}} Answer\n**{drill.answer_text}** (graded {drill.tolerance_text}). "
            f"{drill.explanation}.\n\n*Chapter {drill.chapter} ({CHAPTERS[drill.chapter]}).*\n```\n")


# --------------------------------------------------------------------------------------------------------
# Drill mode
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DrillResult:
    """One asked drill, the answer given and whether it was right."""

    drill: Drill
    given: str | float | int | None
    correct: bool


@dataclass(frozen=True)
class DrillScore:
    """The outcome of a drill session. Introduced in the Drills part."""

    results: tuple[DrillResult, ...]

    @property
    def correct(self) -> int:
        """Number of right answers."""
        return sum(r.correct for r in self.results)

    @property
    def total(self) -> int:
        """Number of drills asked."""
        return len(self.results)

    @property
    def fraction(self) -> float:
        """correct / total (0 for an empty session)."""
        return self.correct / self.total if self.total else 0.0

    def by_kind(self) -> dict[str, tuple[int, int]]:
        """kind → (correct, asked)."""
        out: dict[str, tuple[int, int]] = {}
        for r in self.results:
            c, t = out.get(r.drill.kind, (0, 0))
            out[r.drill.kind] = (c + r.correct, t + 1)
        return dict(sorted(out.items()))


def make_drills(n: int, seed: int = 0, kinds: Iterable[str] | None = None) -> list[Drill]:
    """N random drills, deterministic for a given seed. Introduced in the Drills part.

    Args:
        n: how many drills.
        seed: seeds ``random.Random``; each drill gets its own seed drawn from it.
        kinds: restrict to these kinds (default: all registered kinds).
    """
    n = check_positive("n", n)
    names = sorted(DRILL_KINDS) if kinds is None else list(kinds)
    if not names:
        raise MemlibError("kinds is empty; expected one or more of: " + ", ".join(sorted(DRILL_KINDS)))
    for k in names:
        check_choice("drill kind", k, DRILL_KINDS)
    rng = random.Random(seed)
    return [generate(rng.choice(names), rng.randrange(2**31)) for _ in range(n)]


def score(drills: Sequence[Drill], answers: Sequence[str | float | int | None]) -> DrillScore:
    """Grade ``answers`` against ``drills`` (same length). Introduced in the Drills part."""
    if len(drills) != len(answers):
        raise MemlibError(f"got {len(answers)} answers for {len(drills)} drills")
    return DrillScore(tuple(DrillResult(d, a, grade(d, a)) for d, a in zip(drills, answers)))


def drill_mode(n: int, answer: Callable[[Drill], str | float | int | None], seed: int = 0,
               kinds: Iterable[str] | None = None) -> DrillScore:
    """Ask N random drills, get each answer from ``answer(drill)``, and return the score.

    Introduced in the Drills part. Deterministic for a given seed and a deterministic ``answer``, so a
    notebook can run it under nbval; interactively, ``answer`` can be ``lambda d: input(d.question + " ")``.
    """
    drills = make_drills(n, seed, kinds)
    return score(drills, [answer(d) for d in drills])


# --- Parallelism (issue 21) ---


@drill_kind("pp_bubble", 15, "pipeline bubble (p − 1)/(m + p − 1), interleaved (p − 1)/(vm + p − 1), in %")
def _pp_bubble(rng: random.Random, seed: int) -> Drill:
    from ..core.parallel import bubble_fraction

    p = rng.choice((2, 4, 8, 16))
    m = rng.choice((4, 8, 16, 32, 64))
    sched = rng.choice(("1f1b", "gpipe", "interleaved"))
    v = 2 if sched == "interleaved" else 1
    words = {"1f1b": "1F1B", "gpipe": "GPipe", "interleaved": "the interleaved 1F1B schedule with v = 2 chunks "
             "per GPU"}[sched]
    q = f"{p} pipeline stages, {m} micro-batches, {words}: what percentage of the step is bubble?"
    ans = 100 * bubble_fraction(p, m, sched, max(v, 1))
    return Drill("pp_bubble", seed, q, ans, "%", 0.02, 0.5, "E", 15,
                 f"bubble_fraction({p}, {m}, '{sched}'{', 2' if v == 2 else ''}) = (p − 1)/({'v' if v == 2 else ''}m + p − 1)",
                 {"pp": p, "micro_batches": m, "schedule": sched})


@drill_kind("tp_activations", 15, "activations of one layer per GPU with TP (and SP), Korthikanti et al. 2022")
def _tp_activations(rng: random.Random, seed: int) -> Drill:
    from ..core.parallel import korthikanti_layer_bytes

    model = rng.choice(("gpt2-xl", "llama-2-7b", "llama-2-13b", "llama-3-70b"))
    cfg = load_config(model)
    t = rng.choice((2, 4, 8))
    sp = rng.random() < 0.5
    s = rng.choice(_seq_lens(model, (1024, 2048, 4096)))
    b = rng.choice((1, 2, 4))
    n = korthikanti_layer_bytes(s, b, cfg.hidden_size, cfg.num_heads, t, sp)
    q = (f"{model} (h = {cfg.hidden_size}, a = {cfg.num_heads}), micro-batch {b} × {s} tokens, tensor parallel "
         f"t = {t}{' with sequence parallelism' if sp else ' without sequence parallelism'}: activation GB (10⁹ "
         f"bytes) of one layer per GPU by Korthikanti et al.'s formula (16-bit, no recomputation)?")
    form = "sbh/t·(34 + 5as/h)" if sp else "sbh(10 + 24/t + 5as/(ht))"
    return Drill("tp_activations", seed, q, n / GB, "GB", 0.03, 0.005, "M", 15,
                 f"korthikanti_layer_bytes({s}, {b}, {cfg.hidden_size}, {cfg.num_heads}, {t}, {sp}) = {form}",
                 {"model": model, "tp": t, "sequence_parallel": sp, "seq_len": s, "batch_size": b})


@drill_kind("pp_first_stage", 15, "micro-batches the first pipeline stage holds (GPipe, 1F1B, interleaved)")
def _pp_first_stage(rng: random.Random, seed: int) -> Drill:
    from ..core.parallel import in_flight

    p = rng.choice((2, 4, 8))
    m = rng.choice((4, 8, 16, 32))
    sched = rng.choice(("1f1b", "gpipe", "interleaved"))
    if sched == "interleaved" and m % p:
        m = 2 * p
    words = {"1f1b": "1F1B", "gpipe": "GPipe", "interleaved": "interleaved 1F1B with v = 2"}[sched]
    q = (f"{p} stages, {m} micro-batches, {words}: at its peak, how many micro-batches' worth of its layers' "
         f"activations does the first stage hold? (interleaved: in units of a whole stage)")
    return Drill("pp_first_stage", seed, q, in_flight(p, m, sched, 0, 2), "micro-batches", 0.0, 0.01, "M", 15,
                 f"in_flight({p}, {m}, '{sched}', stage=0): GPipe m, 1F1B min(p, m), interleaved p(1 + (p − 1)/(pv))",
                 {"pp": p, "micro_batches": m, "schedule": sched})


@drill_kind("dp_degree", 15, "data-parallel degree dp = GPUs / (tp · pp · cp)")
def _dp_degree(rng: random.Random, seed: int) -> Drill:
    t = rng.choice((1, 2, 4, 8))
    p = rng.choice((1, 2, 4, 8, 16))
    c = rng.choice((1, 1, 2, 4))
    dp = rng.choice((1, 2, 4, 8, 16, 64))
    n = t * p * c * dp
    q = f"{n:,} GPUs with tensor parallel {t}, pipeline parallel {p} and context parallel {c}: how many data-parallel replicas?"
    return Drill("dp_degree", seed, q, float(dp), "replicas", 0.0, 0.01, "E", 15, f"{n} / ({t} · {p} · {c})",
                 {"num_gpus": n, "tp": t, "pp": p, "cp": c})
