"""The numeric drill kinds: each draws its settings from a seeded ``random.Random`` and asks memlib for the answer.

Pure Python (Drills part). One decorated function per kind (:func:`memlib.drills.engine.drill_kind`); the
registration order below is the order of :data:`memlib.drills.engine.DRILL_KINDS`. Every answer comes from a
memlib function (estimators, serving budget, GPU table, parallelism), never from a formula retyped here; only
the whiteboard arithmetic a few kinds ask for (an effective batch, an N×N matrix, a data-parallel degree) is
written out.
"""
from __future__ import annotations

import random
from typing import Any

from ..core.choices import ATTENTION, LORA_TARGETS, RECOMPUTE
from ..core.configs import load_config
from ..core.dtypes import GB, GiB, MiB, dtype_bytes, weight_bytes_per_param
from ..core.errors import check_choice
from ..core.estimate import KV_DTYPES, estimate_inference, korthikanti_activation_bytes, state_bytes_per_param
from ..core.frameworks.deepspeed_client import flat_partition_too_big
from .engine import estimate_training  # DeepSpeed's layout: the ZeRO paper's accounting
from ..core.flops import matmul_params, palm_flops
from ..core.cluster import (allreduce_time_s, critical_batch, min_gpus_serve, prefill_time,
                             ring_allreduce_bytes, train_days)
from ..core.hardware import H20, SERVE_GPUS, get_gpu
from ..core.lora import lora_params
from ..core.parallel import bubble_fraction, in_flight, korthikanti_layer_bytes
from ..core.params import count_params
from ..core.serve import decode_bytes_per_step, serve, serve_kv_bytes_per_token
from .engine import Drill, _gb, drill_kind

__all__ = ["KORTHIKANTI_RULE", "korthikanti_bytes"]

#: The pipeline schedules the drills draw from (SCHEDULES reordered: the drills' seeds fix this order).
_DRILL_SCHEDULES = ("1f1b", "gpipe", "interleaved")


_TRAIN_MODELS = ("gpt2", "gpt2-xl", "qwen2-0.5b", "gemma-2b", "llama-2-7b", "mistral-7b", "llama-3-8b",
                 "llama-2-13b")
_INFER_MODELS = ("qwen2-0.5b", "gemma-2b", "llama-2-7b", "mistral-7b", "llama-3-8b", "llama-2-13b",
                 "llama-2-70b", "llama-3-70b")
# The drills count states in DeepSpeed's layout (:mod:`memlib.drills.engine`); the question names it.
_PRECISION_WORDS = {"fp32": "fp32", "fp16-mixed": "fp16 mixed precision in DeepSpeed",
                    "bf16-mixed": "bf16 mixed precision in DeepSpeed", "bf16": "pure bf16 (no fp32 master weights)"}
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
    if flat_partition_too_big(billions * 10**9, gpus, stage, optimizer):
        stage = 3  # bitsandbytes cannot step a flat ZeRO-1/2 partition above 2³¹ − 1 elements (int32 numel)
    e = estimate_training(params=billions * 10**9, precision=precision, optimizer=optimizer, zero_stage=stage,
                          num_gpus=gpus)
    q = (f"A {billions}B-parameter model is trained with {_PRECISION_WORDS[precision]} and "
         f"{_OPT_WORDS[optimizer]}, {_zero_words(stage, gpus)}. How many GB (10⁹ bytes) of model states "
         f"(weights + gradients + optimizer states) does each GPU hold?")
    w, g, o = state_bytes_per_param(precision, optimizer)
    o += w if stage >= 1 and precision in ("fp32", "bf16") else 0  # DeepSpeedZeroOptimizer's partition clone
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
    FlashAttention (``attention="sdpa"``) or selective recomputation; 2·s·b·h with full recomputation (both
    :func:`memlib.core.parallel.korthikanti_layer_bytes` without tensor parallelism).
    Limitation: it treats every model as a GPT layer (MHA, a 4h GELU MLP, dropout) with the model's h, a and L;
    memlib's term-by-term :func:`memlib.core.estimate.estimate_training` counts the real architecture.
    """
    check_choice("attention", attention, ATTENTION)
    check_choice("recompute", recompute, RECOMPUTE)
    cfg = load_config(model)
    s, b, h = seq_len, batch_size, cfg.hidden_size
    if recompute == "none" and attention == "eager":
        per_layer = korthikanti_activation_bytes(cfg, b, s)
    else:  # FlashAttention keeps no a·s² scores: the same saved set as selective recomputation
        per_layer = korthikanti_layer_bytes(s, b, h, cfg.num_heads, recompute="full" if recompute == "full"
                                            else "selective")
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
    while flat_partition_too_big(n, gpus, stage, optimizer):
        gpus *= 2  # bitsandbytes takes the ZeRO-1/2 partition's numel as an int32: enough GPUs that it fits
    w, g, o = state_bytes_per_param(precision, optimizer)
    o += w if stage >= 1 and precision in ("fp32", "bf16") else 0  # DeepSpeedZeroOptimizer's partition clone
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
    recompute = rng.choice(RECOMPUTE)
    attention = rng.choice(("sdpa", "eager"))
    acts = korthikanti_bytes(model, b, s, attention, recompute)
    e = estimate_training(model, batch_size=b, seq_len=s, recompute=recompute, attention=attention)
    q = (f"{model} ({_shape_words(model)}) in bf16 mixed precision in DeepSpeed at batch {b} × {s} tokens with "
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
        if optimizer == "adamw-8bit" and stage < 3:  # bitsandbytes on a flat ZeRO-1/2 partition: int32-bound
            continue
        counts = [2**k for k in range(11)]
        fits = [n for n in counts if estimate_training(params=billions * 10**9, optimizer=optimizer,
                                                       zero_stage=stage, num_gpus=n).total_bytes <= mem * GiB]
        if fits:
            break
    n = fits[0]
    q = (f"A {billions}B-parameter model, bf16 mixed precision in DeepSpeed, {_OPT_WORDS[optimizer]}, "
         f"ZeRO stage {stage}. "
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


def _serve_setup(rng: random.Random, users: bool) -> tuple[dict[str, Any], Any]:
    """Draw a serving setup whose budget leaves KV blocks (and, for ``users``, at least one full request)."""
    while True:
        kw: dict[str, Any] = dict(gpu=rng.choice(SERVE_GPUS), weights=rng.choice(("fp16", "fp16", "int8", "int4")),
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
        gpu = get_gpu(rng.choice(SERVE_GPUS))
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
    size = int(dtype_bytes(dtype))
    nbytes = s * s * size
    mult = {"head": 1, "layer": cfg.num_heads, "model": cfg.num_heads * cfg.num_layers}[scope]
    unit, div = ("MiB", MiB) if scope == "head" else ("GiB", GiB)
    where = {"head": "for one head", "layer": f"for one layer ({cfg.num_heads} heads)",
             "model": f"for the whole model ({cfg.num_layers} layers × {cfg.num_heads} heads)"}[scope]
    q = (f"Eager attention in {model} at {s} tokens stores the {dtype} attention probabilities (an N×N matrix per "
         f"head). How many {unit} does that take {where}, for one sample?")
    how = f"{s}² × {size} bytes × {mult} = {nbytes * mult:,} bytes"
    return Drill("attention_matrix", seed, q, nbytes * mult / div, unit, 0.01, 0.01, "M", 10, how,
                 {"model": model, "seq_len": s, "dtype": dtype, "scope": scope})


@drill_kind("adam8bit_saving", 8, "GB saved by 8-bit AdamW over AdamW for a shipped model")
def _adam8bit_saving(rng: random.Random, seed: int) -> Drill:
    model = rng.choice(_TRAIN_MODELS + ("llama-2-70b",))
    stage = rng.choice((0, 0, 1))
    gpus = 1 if stage == 0 else rng.choice((4, 8))
    while flat_partition_too_big(count_params(model).params, gpus, stage, "adamw-8bit"):
        gpus *= 2  # as in training_peak: the int32 partition must fit
    a = estimate_training(model, zero_stage=stage, num_gpus=gpus).optimizer_bytes
    b = estimate_training(model, optimizer="adamw-8bit", zero_stage=stage, num_gpus=gpus).optimizer_bytes
    q = (f"Training {model} with bf16 mixed precision in DeepSpeed, {_zero_words(stage, gpus)}: how many GB "
         f"(10⁹ bytes) of "
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
    gpu, name = rng.choice((("A100", "a100-80gb"), ("H100", "h100-sxm")))
    peak = get_gpu(name).peak_flops("bf16")
    n_mm = matmul_params(cfg)
    per_token = palm_flops(cfg, 1, s) / s  # 6·N_matmul + 12·L·H·Q·T
    mfu_target = rng.choice((0.25, 0.35, 0.45, 0.55))
    raw = mfu_target * peak / per_token
    tokens = max(1, int(round(raw, -1 if raw > 100 else 0)))
    value = 100 * per_token * tokens / peak
    n_all = count_params(model).params
    q = (f"Training {model} on {s}-token sequences runs at {tokens:,} tokens/s per {gpu} (dense bf16 peak "
         f"{peak / 1e12:g} TFLOP/s). It has {n_mm / 1e9:.3g} B matmul weights (the LM head in, the embedding "
         f"lookup out), {cfg.num_layers} layers and {cfg.num_heads} heads of dimension {cfg.head_dim}, counting "
         f"attention's FLOPs (PaLM's count). What is the model FLOPs utilization, in %?")
    how = (f"(6 × {n_mm:,} + 12 × {cfg.num_layers} × {cfg.num_heads} × {cfg.head_dim} × {s}) = "
           f"{per_token / 1e9:.2f} GFLOP per token (palm_flops('{model}', 1, {s}) / {s}), × {tokens:,} / "
           f"{peak:.4g}. 6 × all {n_all / 1e9:.2f} B parameters would give {100 * 6 * n_all * tokens / peak:.1f} %")
    return Drill("mfu", seed, q, value, "%", 0.02, 0.2, "M", 12, how,
                 {"model": model, "gpu": gpu, "tokens_per_s": tokens, "seq_len": s, "peak_flops": peak,
                  "matmul_params": n_mm}, hint="6·N + 12·L·H·Q·T FLOPs per token (N matmul weights, L layers, H "
                                               "heads of Q, T tokens) × tokens/s ÷ peak")


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
    targets = rng.choice(LORA_TARGETS)
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


# --- Parallelism (issue 21) ---


@drill_kind("pp_bubble", 15, "pipeline bubble (p − 1)/(m + p − 1), interleaved (p − 1)/(vm + p − 1), in %")
def _pp_bubble(rng: random.Random, seed: int) -> Drill:
    p = rng.choice((2, 4, 8, 16))
    m = rng.choice((4, 8, 16, 32, 64))
    sched = rng.choice(_DRILL_SCHEDULES)
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
    p = rng.choice((2, 4, 8))
    m = rng.choice((4, 8, 16, 32))
    sched = rng.choice(_DRILL_SCHEDULES)
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


# --- Cluster arithmetic (issue 34): the formula is the hint, never in the question ---

_LINKS_GBIT = (100, 200, 400)  # InfiniBand/RoCE per-GPU line rates, Gb/s


@drill_kind("train_days", 12, "days to train N parameters on D tokens on a cluster at an MFU")
def _train_days(rng: random.Random, seed: int) -> Drill:
    billions = rng.choice((1, 3, 7, 8, 13, 34, 70))
    tera = rng.choice((0.3, 1, 2, 15))
    gpus = rng.choice((8, 64, 256, 1024, 2048))
    gpu, name = rng.choice((("A100", "a100-80gb"), ("H100", "h100-sxm")))
    mfu = rng.choice((0.3, 0.4, 0.5))
    days = train_days(billions * 1e9, tera * 1e12, gpus, name, mfu)
    peak = get_gpu(name).peak_flops("bf16")
    q = (f"A {billions}B-parameter dense model is pre-trained on {tera:g} trillion tokens on {gpus:,} {gpu}s "
         f"(dense bf16 peak {peak / 1e12:g} TFLOP/s each) at {100 * mfu:g} % MFU. How many days does it take?")
    how = (f"6 × {billions}e9 × {tera:g}e12 = {6 * billions * tera * 1e21:.3g} FLOPs ÷ ({gpus:,} × {peak:.4g} × "
           f"{mfu:g}) ÷ 86,400 s (train_days)")
    return Drill("train_days", seed, q, days, "days", 0.05, 0.05, "M", 12, how,
                 {"params": billions * 10**9, "tokens": tera * 1e12, "num_gpus": gpus, "gpu": name, "mfu": mfu},
                 hint="6·N·D FLOPs ÷ (GPUs · peak · MFU); a day is 86,400 s")


@drill_kind("allreduce_time", 15, "least time of a ring all-reduce of the gradients over the network")
def _allreduce_time(rng: random.Random, seed: int) -> Drill:
    billions = rng.choice((1, 7, 8, 13, 70))
    gpus = rng.choice((8, 16, 64, 256))
    gbit = rng.choice(_LINKS_GBIT)
    nbytes = billions * 1e9 * 2
    s = allreduce_time_s(nbytes, gpus, gbit * 1e9 / 8)
    q = (f"Data parallelism over {gpus} GPUs all-reduces the bf16 gradients of a {billions}B-parameter model with a "
         f"ring; each GPU's network link carries {gbit} Gb/s. Ignoring latency and overlap, what is the least time "
         f"of one all-reduce, in s?")
    how = (f"2 × ({gpus} − 1)/{gpus} × {nbytes / 1e9:g} GB = {ring_allreduce_bytes(nbytes, gpus) / 1e9:.2f} GB per "
           f"GPU ÷ {gbit / 8:g} GB/s (allreduce_time_s)")
    return Drill("allreduce_time", seed, q, s, "s", 0.03, 0.005, "M", 15, how,
                 {"params": billions * 10**9, "num_gpus": gpus, "link_gbit_s": gbit},
                 hint="ring all-reduce: each GPU sends 2(N − 1)/N × bytes; time = that ÷ link bandwidth "
                      "(Gb/s ÷ 8 = GB/s)")


@drill_kind("prefill_time", 14, "least time to first token of one prompt: FLOPs ÷ peak vs bytes ÷ bandwidth")
def _prefill_time(rng: random.Random, seed: int) -> Drill:
    model = rng.choice(("qwen2-0.5b", "llama-2-7b", "llama-3-8b", "mistral-7b", "llama-2-13b"))
    gpu = get_gpu(rng.choice(("a100-80gb", "h100-sxm", "h200")))
    prompt = rng.choice(_seq_lens(model, (16, 128, 512, 2048, 4096)))
    t = prefill_time(model, prompt, gpu.name)
    q = (f"{model} in bf16 prefills one {prompt}-token prompt on one {gpu.full_name} (dense bf16 peak "
         f"{gpu.peak_flops('bf16') / 1e12:g} TFLOP/s, {gpu.bandwidth_gb_s:,.0f} GB/s). At 100 % of whichever "
         f"resource limits it, what is the least time to first token, in ms?")
    how = (f"compute {1e3 * t.compute_s:.2f} ms (forward FLOPs, causal attention ÷ peak), memory "
           f"{1e3 * t.memory_s:.2f} ms (weights ÷ bandwidth): {t.bound}-bound (prefill_time('{model}', {prompt}))")
    return Drill("prefill_time", seed, q, 1e3 * t.seconds, "ms", 0.05, 0.01, "M", 14, how,
                 {"model": model, "gpu": gpu.name, "prompt_len": prompt},
                 hint="max(≈2·N·tokens FLOPs ÷ peak, weight bytes ÷ bandwidth); long prompts are compute-bound")


@drill_kind("arith_intensity", 12, "batch at which a decode matmul turns compute-bound (roofline ridge point)")
def _arith_intensity(rng: random.Random, seed: int) -> Drill:
    gpu = get_gpu(rng.choice(("a100-80gb", "h100-sxm", "h200", "l40s")))
    fmt, nbytes, dt = rng.choice((("bf16", 2.0, "bf16"), ("bf16", 2.0, "bf16"), ("fp8", 1.0, "fp8")))
    if gpu.fp8_tflops is None:
        fmt, nbytes, dt = "bf16", 2.0, "bf16"
    b = critical_batch(gpu.name, dt, nbytes)
    q = (f"A decode step multiplies a batch of b token vectors by a {fmt} weight matrix on one {gpu.full_name} "
         f"(dense {dt} peak {gpu.peak_flops(dt) / 1e12:g} TFLOP/s, {gpu.bandwidth_gb_s:,.0f} GB/s). From what "
         f"batch b is the matmul compute-bound rather than memory-bound?")
    how = (f"ridge point {gpu.ridge_point(dt):.0f} FLOP/byte; intensity 2b ÷ {nbytes:g} bytes per weight "
           f"(decode_intensity) reaches it at b = {b} (critical_batch)")
    return Drill("arith_intensity", seed, q, float(b), "sequences", 0.05, 1.0, "H", 12, how,
                 {"gpu": gpu.name, "weights": fmt},
                 hint="intensity = 2·b·k·n FLOPs ÷ (k·n·bytes per weight) = 2b ÷ bytes; compare with peak ÷ "
                      "bandwidth")


@drill_kind("min_gpus_serve", 14, "fewest GPUs (power of two) holding a model's weights and the KV cache it serves")
def _min_gpus_serve(rng: random.Random, seed: int) -> Drill:
    model = rng.choice(("deepseek-v3", "deepseek-v3", "llama-3-70b", "llama-2-70b", "mixtral-8x7b"))
    gpu = rng.choice(("h100-sxm", "h200", "h20", "a100-80gb"))
    weights = rng.choice(("fp8", "bf16")) if gpu != "a100-80gb" else rng.choice(("bf16", "int8"))
    users = rng.choice((16, 64, 256))
    ctx = rng.choice((4096, 8192, 32768))
    fit = min_gpus_serve(model, gpu, weights, users, ctx)
    spec = H20 if gpu == "h20" else get_gpu(gpu)
    attn = "MLA latent KV" if model.startswith("deepseek") else "GQA KV"
    q = (f"Serve {model} with {weights} weights on {spec.full_name} GPUs ({spec.memory_gib:g} GiB each, 90 % usable) "
         f"for {users} concurrent requests of {ctx:,} tokens with an fp16 {attn} cache. What is the fewest GPUs, "
         f"a power of two, that holds it?")
    how = (f"weights {_gb(fit.weight_bytes, 0)} + KV {_gb(fit.kv_bytes, 1)} ({serve_kv_bytes_per_token(model):,} "
           f"bytes per token × {users} × {ctx:,}) ÷ {_gb(fit.usable_bytes_per_gpu, 1)} per GPU, rounded up to a "
           f"power of two (min_gpus_serve)")
    return Drill("min_gpus_serve", seed, q, float(fit.num_gpus), "GPUs", 0.0, 0.5, "H", 14, how,
                 {"model": model, "gpu": gpu, "weights": weights, "concurrency": users, "context_len": ctx},
                 hint="parameters × bytes per weight + KV bytes per token × requests × context; divide by usable "
                      "memory per GPU")
