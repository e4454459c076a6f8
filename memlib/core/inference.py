"""Serving memory: what fits a GPU — weights + KV cache + a stated reserve; MHA/GQA/MQA; paged KV (Chapter 11).

Pure Python: builds on :func:`memlib.core.estimate.estimate_inference` (weights in fp32/fp16/bf16/int8/int4/nf4 with
their quantization constants, KV cache in fp32/fp16/bf16/fp8) and adds what a real GPU also holds — the CUDA
context, the transient activations of the largest forward pass, and allocator fragmentation — to answer the
two serving questions: *how many sequences of this length fit?* and *how long may the sequences be at this
batch size?*
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .configs import ModelConfig, check_seq_len, load_config
from .errors import check_positive
from .hardware import GPU_MEMORY  # re-exported: the capacities of the one hardware table
from .params import count_params
from .search import largest_fitting
from .serve import request_kv_bytes, serve
from .serving_terms import (DEFAULT_CUDA_CONTEXT, DEFAULT_FRAGMENTATION, KV_LAYOUTS, ModelLike, Reserve, ServingFit,
                            check_tensor_parallel, forward_activation_bytes, kv_bytes_per_token, kv_cache_bytes,
                            kv_cached_tokens, kv_heads_for, reserve_bytes, serving_reserve, valid_tensor_parallel)

__all__ = [
    "GPU_MEMORY",
    "KV_LAYOUTS",
    "DEFAULT_CUDA_CONTEXT",
    "DEFAULT_FRAGMENTATION",
    "Reserve",
    "ServingFit",
    "kv_heads_for",
    "kv_bytes_per_token",
    "kv_cached_tokens",
    "kv_cache_bytes",
    "forward_activation_bytes",
    "serving_reserve",
    "reserve_bytes",
    "valid_tensor_parallel",
    "check_tensor_parallel",
    "serving_fit",
    "max_batch_size",
    "max_seq_len",
    "batch_context_frontier",
    "paged_kv_tokens",
]


def serving_fit(model: ModelLike, gpu_memory_bytes: int, *, batch_size: int = 1, seq_len: int = 2048,
                weights: str = "fp16", kv_dtype: str = "fp16", layout: str | None = None,
                prefill_tokens: int | None = None, cuda_context_bytes: int = DEFAULT_CUDA_CONTEXT,
                fragmentation: float = DEFAULT_FRAGMENTATION, tensor_parallel: int = 1,
                pipeline_parallel: int = 1) -> ServingFit:
    """Does a static batch fit a GPU: weights + KV cache + prefill activations + reserve. Chapter 11.

    The book's one serving fit is :func:`memlib.core.serve.serve` (Chapter 14, vLLM's accounting); this function
    asks it the question of a ``model.generate``-style server, which holds a contiguous cache for
    ``batch_size`` × ``seq_len`` tokens: the whole GPU (utilization 1), blocks of one token, no CUDA graphs,
    ``cuda_context_bytes`` as the non-torch memory, a prefill pass of ``prefill_tokens`` (or all the batch's
    tokens) and ``fragmentation``. serve gives the per-GPU terms (weights, KV bytes per token, the prefill
    activation peak); the verdict is the reserve policy of :func:`reserve_bytes`:
    total = (weights + KV + activations) × (1 + fragmentation) + CUDA context ≤ GPU memory.
    The planner's inference path (Chapter 13) calls it.
    With ``tensor_parallel`` × ``pipeline_parallel`` GPUs the terms are per GPU: weights and KV cache of
    ceil(L / pipeline_parallel) layers, split over ``tensor_parallel`` GPUs (KV heads replicated where the
    degree exceeds them), activations as in :func:`forward_activation_bytes`, a CUDA context on each GPU.
    Limitation: the embedding and LM head are spread like the layers, not kept on the first/last stage.

    Args:
        model: shipped name, config.json path, dict or ModelConfig.
        gpu_memory_bytes: the GPU's memory in bytes (e.g. ``24 * GiB``).
        batch_size: sequences served together.
        seq_len: tokens per sequence held in the cache (prompt + generated).
        weights: ``fp32``, ``fp16``, ``bf16``, ``int8``, ``int4`` or ``nf4``.
        kv_dtype: ``fp32``, ``fp16``, ``bf16``, ``fp8``, ``int8`` or ``int4`` (:data:`memlib.core.serve.SERVE_KV_DTYPES`).
        layout: KV layout (``"mha"``, ``"gqa"``, ``"mqa"``) or None (as configured).
        prefill_tokens: see :func:`serving_reserve`.
        cuda_context_bytes: see :func:`serving_reserve`.
        fragmentation: see :func:`serving_reserve`.
        tensor_parallel: GPUs each layer is split over; must suit the heads (:func:`check_tensor_parallel`).
        pipeline_parallel: pipeline stages, each holding ceil(L / stages) layers.

    Returns:
        The fit, term by term (per GPU when split).

    Raises:
        MemlibError: bad input, a ``seq_len`` above the model's positions, or a tensor-parallel degree the
            heads do not allow.
    """
    gpu = check_positive("gpu_memory_bytes", gpu_memory_bytes)
    cfg = load_config(model)
    b = check_positive("batch_size", batch_size)
    s = check_seq_len(cfg, check_positive("seq_len", seq_len))
    tokens = b * s if prefill_tokens is None else min(check_positive("prefill_tokens", prefill_tokens), b * s)
    reserve_bytes(0, cuda_context_bytes=cuda_context_bytes, fragmentation=fragmentation)  # validates both
    fit = serve(cfg, gpu_memory=gpu, max_model_len=s, gpu_memory_utilization=1.0, kv_dtype=kv_dtype,
                weights=weights, block_size=1, max_num_batched_tokens=tokens, max_num_seqs=b,
                tensor_parallel=tensor_parallel, pipeline_parallel=pipeline_parallel, layout=layout,
                non_torch_bytes=cuda_context_bytes, cuda_graph_bytes=0, fragmentation=fragmentation)
    kv_gpu = b * request_kv_bytes(cfg, s, kv_dtype, fit.settings["tensor_parallel"],
                                  pipeline_parallel=pipeline_parallel, layout=layout)  # sliding windows capped
    allocated = fit.weights_bytes + kv_gpu + fit.activation_bytes
    total = allocated + reserve_bytes(allocated, cuda_context_bytes=cuda_context_bytes, fragmentation=fragmentation)
    frag = total - allocated - int(cuda_context_bytes)
    settings: dict[str, Any] = {"model": cfg.name, "batch_size": b, "seq_len": s, "weights": weights,
                                "kv_dtype": kv_dtype, "params": count_params(cfg).params,
                                "layout": layout or "as configured", "prefill_tokens": prefill_tokens}
    tp, pp = fit.settings["tensor_parallel"], fit.settings.get("pipeline_parallel", 1)
    if tp > 1 or pp > 1:
        settings.update(tensor_parallel=tp, pipeline_parallel=pp)
    return ServingFit(fit.weights_bytes, kv_gpu, fit.activation_bytes, frag, int(cuda_context_bytes), total, gpu,
                      total <= gpu, settings)


def _fits_at(model: ModelLike, gpu_memory_bytes: int, limit: int, *, weights: str, kv_dtype: str,
             layout: str | None, prefill_tokens: int | None, cuda_context_bytes: int,
             fragmentation: float) -> tuple[ModelConfig, Callable[[int, int], bool]]:
    """The model's config and ``fits(batch_size, seq_len)`` for one GPU and serving setup (the searches below vary
    one; ``limit``, where they stop, is checked here)."""
    check_positive("limit", limit)
    cfg = load_config(model)

    def fits(batch_size: int, seq_len: int) -> bool:
        return serving_fit(cfg, gpu_memory_bytes, batch_size=batch_size, seq_len=seq_len, weights=weights,
                           kv_dtype=kv_dtype, layout=layout, prefill_tokens=prefill_tokens,
                           cuda_context_bytes=cuda_context_bytes, fragmentation=fragmentation).fits

    return cfg, fits


def max_batch_size(model: ModelLike, gpu_memory_bytes: int, *, seq_len: int = 2048, weights: str = "fp16",
                   kv_dtype: str = "fp16", layout: str | None = None, prefill_tokens: int | None = None,
                   cuda_context_bytes: int = DEFAULT_CUDA_CONTEXT, fragmentation: float = DEFAULT_FRAGMENTATION,
                   limit: int = 1 << 20) -> int:
    """The largest batch of ``seq_len``-token sequences that fits the GPU (0 if none). Chapter 11.

    Args:
        model: shipped name, config.json path, dict or ModelConfig.
        gpu_memory_bytes: the GPU's memory in bytes.
        seq_len: tokens per sequence.
        weights: weight format (see :func:`serving_fit`).
        kv_dtype: KV-cache dtype.
        layout: KV layout or None.
        prefill_tokens: see :func:`serving_reserve`.
        cuda_context_bytes: see :func:`serving_reserve`.
        fragmentation: see :func:`serving_reserve`.
        limit: the search stops here (returned if even this batch fits).

    Returns:
        The batch size.
    """
    _, fits = _fits_at(model, gpu_memory_bytes, limit, weights=weights, kv_dtype=kv_dtype, layout=layout,
                       prefill_tokens=prefill_tokens, cuda_context_bytes=cuda_context_bytes,
                       fragmentation=fragmentation)
    return largest_fitting(lambda b: fits(b, seq_len), start=16, cap=limit)


def max_seq_len(model: ModelLike, gpu_memory_bytes: int, *, batch_size: int = 1, weights: str = "fp16",
                kv_dtype: str = "fp16", layout: str | None = None, prefill_tokens: int | None = None,
                cuda_context_bytes: int = DEFAULT_CUDA_CONTEXT, fragmentation: float = DEFAULT_FRAGMENTATION,
                limit: int = 1 << 24) -> int:
    """The longest context (tokens per sequence) at ``batch_size`` that fits the GPU (0 if none). Chapter 11.

    The search stops at the model's maximum positions (``ModelConfig.max_positions``: GPT-2 1024, LLaMA-1
    2048, ...): a result equal to it means memory allows at least that much, the model no more.

    Args:
        batch_size: sequences served together.
        limit: the search stops here.
        model, gpu_memory_bytes, weights, kv_dtype, layout, prefill_tokens, cuda_context_bytes, fragmentation:
            as :func:`max_batch_size`'s.

    Returns:
        Tokens per sequence.
    """
    cfg, fits = _fits_at(model, gpu_memory_bytes, limit, weights=weights, kv_dtype=kv_dtype, layout=layout,
                         prefill_tokens=prefill_tokens, cuda_context_bytes=cuda_context_bytes,
                         fragmentation=fragmentation)
    cap = min(limit, cfg.max_positions)
    return largest_fitting(lambda s: fits(batch_size, s), start=min(1024, cap), cap=cap)


def batch_context_frontier(model: ModelLike, gpu_memory_bytes: int, seq_lens: Sequence[int], *,
                           weights: str = "fp16", kv_dtype: str = "fp16", layout: str | None = None,
                           prefill_tokens: int | None = None, cuda_context_bytes: int = DEFAULT_CUDA_CONTEXT,
                           fragmentation: float = DEFAULT_FRAGMENTATION) -> list[tuple[int, int]]:
    """The batch × context frontier: for each context length, the largest batch that fits. Chapter 11.

    Returns:
        ``[(seq_len, max_batch), ...]`` in the order given; every point below the frontier fits.

    Raises:
        MemlibError: a context length above the model's maximum positions (filter with
            ``ModelConfig.max_positions``).
    """
    cfg = load_config(model)
    return [(int(s), max_batch_size(cfg, gpu_memory_bytes, seq_len=s, weights=weights, kv_dtype=kv_dtype,
                                    layout=layout, prefill_tokens=prefill_tokens,
                                    cuda_context_bytes=cuda_context_bytes, fragmentation=fragmentation))
            for s in seq_lens]


def paged_kv_tokens(seq_lens: Sequence[int], block_size: int = 16) -> int:
    """KV slots a paged cache allocates for sequences of these lengths: whole blocks, rounded up. Chapter 11.

    PagedAttention (Kwon et al. 2023, vLLM) stores the cache in fixed blocks of ``block_size`` tokens
    (16 by default in vLLM), allocated as the sequence grows, so each sequence wastes less than one block.
    Compare ``len(seq_lens) × max_len`` slots for a contiguous cache reserved up front for the longest
    allowed sequence.

    Args:
        seq_lens: tokens held per sequence.
        block_size: tokens per block.

    Returns:
        Token slots allocated.
    """
    bs = check_positive("block_size", block_size)
    return sum(-(-check_positive("seq_len", s, allow_zero=True) // bs) * bs for s in seq_lens)
