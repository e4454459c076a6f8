"""The terms every serving estimate composes: KV layouts and bytes, tensor-parallel degrees, the reserve (Chapter 11).

Pure Python, below :mod:`memlib.core.estimate` (whose ``estimate_inference`` counts the KV cache with
:func:`kv_cache_bytes`), :mod:`memlib.core.serve` (vLLM's accounting) and :mod:`memlib.core.inference` (the
static-batch fits of Chapter 11, which re-exports every name here).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .choices import KV_DTYPES
from .configs import ModelConfig, load_config
from .dtypes import GiB
from .errors import MemlibError, check_choice, check_positive
from .families_moe import kv_elements_per_token

__all__ = ["ModelLike", "KV_LAYOUTS", "DEFAULT_CUDA_CONTEXT", "DEFAULT_FRAGMENTATION", "Reserve", "ServingFit",
           "kv_heads_for", "kv_bytes_per_token", "kv_cached_tokens", "kv_cache_bytes", "forward_activation_bytes",
           "serving_reserve", "reserve_bytes", "valid_tensor_parallel", "check_tensor_parallel"]

ModelLike = str | Path | dict[str, Any] | ModelConfig


#: KV-cache layouts: multi-head (one K/V head per query head), grouped-query (the config's KV heads),
#: multi-query (one K/V head shared by all query heads).
KV_LAYOUTS = ("mha", "gqa", "mqa")

#: CUDA context + library workspaces, held outside PyTorch's tensors. The context alone is ≈ 0.3–0.6 GiB with
#: lazy module loading (CUDA ≥ 11.7; more without it); cuBLAS/cuBLASLt workspaces and attention kernels' scratch
#: add tens to hundreds of MiB. We round up to 1 GiB.
DEFAULT_CUDA_CONTEXT: int = 1 * GiB

#: Fraction added on top of the tensors the allocator holds (weights, KV, activations) for fragmentation:
#: PyTorch's caching allocator rounds large blocks up to 2 MiB and a contiguous KV cache that grows by
#: ``torch.cat`` (transformers' DynamicCache) leaves freed blocks of every older size behind. 5 % is a
#: middle value; vLLM leaves 10 % of the GPU unused by default (``gpu_memory_utilization=0.9``) for all of
#: this together with the context.
DEFAULT_FRAGMENTATION: float = 0.05


def reserve_bytes(allocated_bytes: int, *, cuda_context_bytes: int = DEFAULT_CUDA_CONTEXT,
                  fragmentation: float = DEFAULT_FRAGMENTATION) -> int:
    """The book's one reserve policy: what a GPU needs beyond the tensors an estimate counts. Chapter 11.

    reserve = CUDA context and workspaces + fragmentation × allocated (default 1 GiB + 5 %). Serving
    (:func:`serving_fit`) and the planner (:func:`memlib.core.plan.plan`, training and inference) both use it:
    an estimate fits a GPU when ``allocated + reserve_bytes(allocated) <= GPU memory``.

    Args:
        allocated_bytes: the tensors the estimate counts (weights, states, KV cache, activations).
        cuda_context_bytes: CUDA context and library workspaces.
        fragmentation: fraction of ``allocated_bytes`` added for the allocator's fragmentation, in [0, 1).

    Returns:
        Bytes to keep free beside the estimate.
    """
    alloc = check_positive("allocated_bytes", allocated_bytes, allow_zero=True)
    ctx = check_positive("cuda_context_bytes", cuda_context_bytes, allow_zero=True)
    if not 0.0 <= fragmentation < 1.0:
        raise MemlibError(f"fragmentation must be in [0, 1), got {fragmentation!r}")
    return ctx + int(math.ceil(alloc * fragmentation))


def valid_tensor_parallel(model: ModelLike, limit: int = 64) -> list[int]:
    """Tensor-parallel degrees a model's attention allows, up to ``limit``. Chapter 11.

    vLLM's rule: the degree divides the query heads, and either divides the KV heads (each GPU holds
    num_kv_heads / tp of them) or is a multiple of them (each KV head replicated on tp / num_kv_heads GPUs).
    """
    cfg = load_config(model)
    return [t for t in range(1, check_positive("limit", limit) + 1)
            if cfg.num_heads % t == 0 and (cfg.num_kv_heads % t == 0 or t % cfg.num_kv_heads == 0)]


def check_tensor_parallel(model: ModelLike, tensor_parallel: int) -> int:
    """Return ``tensor_parallel``, or raise :class:`MemlibError` if the model's heads cannot be split that way.

    Introduced in Chapter 11 (see :func:`valid_tensor_parallel`): Llama-3-70B (64 query heads, 8 KV heads)
    takes 1, 2, 4, 8, 16, 32 or 64 GPUs, not 3.
    """
    cfg = load_config(model)
    tp = check_positive("tensor_parallel", tensor_parallel)
    valid = valid_tensor_parallel(cfg, max(tp, 8))
    if tp not in valid:
        raise MemlibError(f"tensor_parallel {tp} does not divide {cfg.name}'s {cfg.num_heads} attention heads and "
                          f"{cfg.num_kv_heads} KV heads; expected one of: {', '.join(map(str, valid))}")
    return tp


@dataclass(frozen=True)
class Reserve:
    """Memory a serving process needs besides weights and KV cache, in bytes. Introduced in Chapter 11.

    Attributes:
        cuda_context_bytes: CUDA context and library workspaces (not PyTorch tensors).
        activation_bytes: the largest transient of one forward pass (see :func:`forward_activation_bytes`).
        fragmentation: fraction of the allocated tensors (weights + KV + activations) added for fragmentation.
        prefill_tokens: tokens in the largest forward pass (None: the whole batch's prompts at once).
    """

    cuda_context_bytes: int
    activation_bytes: int
    fragmentation: float
    prefill_tokens: int | None


@dataclass(frozen=True)
class ServingFit:
    """Whether a serving configuration fits a GPU, term by term, in bytes. Introduced in Chapter 11.

    Attributes:
        weights_bytes: weights, quantization constants included.
        kv_cache_bytes: K and V of every layer for batch_size × seq_len tokens.
        activation_bytes: transient of the largest forward pass.
        fragmentation_bytes: fragmentation fraction × (weights + KV + activations).
        cuda_context_bytes: CUDA context and workspaces.
        total_bytes: the sum of the five.
        gpu_memory_bytes: the GPU's memory.
        fits: total_bytes <= gpu_memory_bytes.
        settings: the inputs, echoed.
    """

    weights_bytes: int
    kv_cache_bytes: int
    activation_bytes: int
    fragmentation_bytes: int
    cuda_context_bytes: int
    total_bytes: int
    gpu_memory_bytes: int
    fits: bool
    settings: dict[str, Any]

    @property
    def headroom_bytes(self) -> int:
        """GPU memory left (negative when it does not fit)."""
        return self.gpu_memory_bytes - self.total_bytes

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready dict (all byte values are ints)."""
        return asdict(self)


def kv_heads_for(model: ModelLike, layout: str | None = None, num_kv_heads: int | None = None) -> int:
    """Number of K/V heads for a KV layout of a model's attention. Introduced in Chapter 11.

    Args:
        model: shipped name, config.json path, dict or ModelConfig.
        layout: ``"mha"`` (num_heads), ``"gqa"`` (the config's num_kv_heads, or ``num_kv_heads``), ``"mqa"`` (1);
            None: as configured.
        num_kv_heads: for ``"gqa"``: the number of KV groups; must divide num_heads.

    Returns:
        K/V heads per layer.
    """
    cfg = load_config(model)
    if layout is None:
        return cfg.num_kv_heads
    check_choice("KV layout", layout, KV_LAYOUTS)
    if layout == "mha":
        return cfg.num_heads
    if layout == "mqa":
        return 1
    groups = cfg.num_kv_heads if num_kv_heads is None else check_positive("num_kv_heads", num_kv_heads)
    if cfg.num_heads % groups:
        raise MemlibError(f"num_kv_heads {groups} must divide num_heads {cfg.num_heads}")
    return groups


def kv_cached_tokens(model: ModelLike, seq_len: int) -> tuple[int, ...]:
    """Tokens each layer's KV cache holds once a sequence has ``seq_len`` tokens. Introduced in Chapter 11.

    A sliding-window layer attends to the last ``sliding_window`` tokens only, so its cache keeps at most that
    many (transformers' ``DynamicSlidingWindowLayer`` for the ``layer_types`` of Gemma 2 — every other layer —
    and Gemma 3 — five local layers in six; vLLM's ``SlidingWindowSpec``); a global layer keeps every token.
    A window over all layers (Mistral's, Phi-3's ``sliding_window``) caps every layer: transformers'
    ``get_layer_types_and_kwargs`` (``cache_utils.py``) makes every layer with a ``sliding_window`` a sliding
    layer of ``DynamicCache``, and vLLM gives such a model a ``SlidingWindowSpec`` for all layers.

    Args:
        model: shipped name, config.json path, dict or ModelConfig.
        seq_len: tokens in the sequence (prompt + generated).

    Returns:
        Cached tokens per layer.
    """
    cfg = load_config(model)
    s = check_positive("seq_len", seq_len)
    window = cfg.sliding_window
    if window is None and cfg.model_type == "mistral":
        window = cfg.raw.get("sliding_window")
    if not isinstance(window, int) or window <= 0:
        return (s,) * cfg.num_layers
    if not cfg.layer_types:  # one window for every layer
        return (min(s, window),) * cfg.num_layers
    return tuple(min(s, window) if kind == "sliding_attention" else s for kind in cfg.layer_types)


def kv_cache_bytes(model: ModelLike, seq_len: int, batch_size: int = 1, kv_dtype: str = "fp16", *,
                   layout: str | None = None, num_kv_heads: int | None = None) -> int:
    """Bytes of KV cache of ``batch_size`` sequences of ``seq_len`` tokens. Introduced in Chapter 11.

    2 (K, V) × KV heads × head_dim × bytes × the tokens each layer caches (:func:`kv_cached_tokens`: sliding-
    window layers of Gemma 2/3 stop at the window) × batch. Without such layers: 2 × layers × KV heads ×
    head_dim × seq_len × batch × bytes. Falcon-7B's multi-query attention caches one KV head; GPT-NeoX
    (Pythia) all of them.

    Args:
        model: shipped name, config.json path, dict or ModelConfig.
        seq_len: tokens per sequence.
        batch_size: sequences.
        kv_dtype: ``fp32``, ``fp16``, ``bf16`` or ``fp8``.
        layout: ``"mha"``, ``"gqa"``, ``"mqa"`` or None (as configured).
        num_kv_heads: KV groups for ``layout="gqa"`` (default: the config's).

    Returns:
        Bytes.
    """
    cfg = load_config(model)
    check_choice("kv dtype", kv_dtype, KV_DTYPES)
    b = check_positive("batch_size", batch_size)
    latent = kv_elements_per_token(cfg)
    if latent is not None and layout is None:  # MLA (DeepSeek-V2/V3): the latent of every layer, per token
        return latent * KV_DTYPES[kv_dtype] * check_positive("seq_len", seq_len) * b
    heads = kv_heads_for(cfg, layout, num_kv_heads)
    return 2 * heads * cfg.head_dim * KV_DTYPES[kv_dtype] * sum(kv_cached_tokens(cfg, seq_len)) * b


def kv_bytes_per_token(model: ModelLike, kv_dtype: str = "fp16", *, layout: str | None = None,
                       num_kv_heads: int | None = None, seq_len: int | None = None) -> int:
    """Bytes of KV cache per token of one sequence: 2 (K, V) × layers × KV heads × head_dim × bytes.

    Introduced in Chapter 11. MHA keeps one K/V head per query head; GQA (Ainslie et al. 2023) shares one
    per group; MQA (Shazeer 2019) one for all — so GQA divides the MHA cache by num_heads / groups. MLA
    (DeepSeek-V2/V3, DeepSeek-AI 2024 §2.1) caches a compressed latent instead: L·(kv_lora_rank +
    qk_rope_head_dim) elements per token (:func:`memlib.core.families_moe.kv_elements_per_token`; what transformers'
    DeepSeek cache and vLLM's MLA backends store). Mixtral and Qwen-MoE models cache GQA K/V as usual.

    Args:
        model: shipped name, config.json path, dict or ModelConfig.
        kv_dtype: ``fp32``, ``fp16``, ``bf16`` or ``fp8``.
        layout: ``"mha"``, ``"gqa"``, ``"mqa"`` or None (as configured; an MLA model's latent).
        num_kv_heads: KV groups for ``layout="gqa"`` (default: the config's).
        seq_len: with a sequence length, the average per token of a sequence that long (rounded up): Gemma 2/3's
            sliding-window layers stop caching at their window, so past it a token costs less
            (:func:`kv_cache_bytes` ÷ seq_len); None: every layer caching the token.

    Returns:
        Bytes per token.
    """
    # one formula, in kv_cache_bytes: a one-token sequence is cached by every layer (windows and MLA included)
    s = 1 if seq_len is None else check_positive("seq_len", seq_len)
    return -(-kv_cache_bytes(model, s, 1, kv_dtype, layout=layout, num_kv_heads=num_kv_heads) // s)


def forward_activation_bytes(model: ModelLike, tokens: int, batch_size: int = 1, act_bytes: int = 2,
                             tensor_parallel: int = 1) -> int:
    """Estimated largest transient of one inference forward pass over ``tokens`` tokens, in bytes.

    Introduced in Chapter 11. Nothing is saved for backward at inference, so only one layer's intermediates
    are alive at a time. The MLP is the widest point: a gated MLP holds act(gate), up and their product
    (3·T·f) beside four T·h tensors of the residual stream (the layer's input, still referenced by the model's
    loop, the attention block's sum, the normalized input and the MLP's output); GPT-2's tanh-approximated GELU
    makes five T·f temporaries (counted beside two T·h). The attention block (q, k, v, rotated copies of q and k, its
    output; with FlashAttention-style SDPA no T² scores) is narrower for every shipped model. After the last
    layer come the logits of the last position of each sequence, in 16 bits and in fp32 (generation upcasts
    them): b·V·(2 + 4) beside two T·h tensors — the peak is the larger of the two moments.
    Checked against a meta-device trace of the transformers models
    (:func:`memlib._book.ch11_inference_memory.measure_forward_peak`) for every shipped config: within 2 % for the gated
    models (LLaMA, Mistral, Qwen2, Gemma), 2–5 % over for GPT-2. A MoE layer's experts see every token k times
    (balanced routing assumed): its MLP width is taken as k·f_expert + f_shared (not checked against a trace).

    Args:
        model: shipped name, config.json path, dict or ModelConfig.
        tokens: tokens in the forward pass (prefill: batch × prompt length, or a prefill chunk).
        batch_size: sequences (for the last-position logits).
        act_bytes: bytes per activation element (2 for fp16/bf16).
        tensor_parallel: GPUs a layer is split over (Megatron-style): the MLP's intermediate and the heads'
            q, k, v divide by it, the residual stream (T·h) and the logits do not.

    Returns:
        Bytes per GPU. An estimate of the peak transient, not a measurement; it ignores kernel workspaces.
    """
    cfg = load_config(model)
    t = check_positive("tokens", tokens)
    b = check_positive("batch_size", batch_size)
    tp = check_positive("tensor_parallel", tensor_parallel)
    h, f = cfg.hidden_size, cfg.intermediate_size
    if cfg.moe is not None:  # the experts' rows: every token k times (balanced routing), plus the shared expert
        routed = cfg.moe.top_k * cfg.moe.expert_intermediate_size + cfg.moe.shared_intermediate_size
        f = max(routed, f if len(cfg.moe.moe_layers) < cfg.num_layers else 0)
    mlp = (-(-3 * f // tp) + 4 * h) if cfg.mlp == "gated" else (-(-5 * f // tp) + 2 * h)
    attn = -(-(3 * cfg.q_dim + 4 * cfg.kv_dim) // tp) + 4 * h
    layers = t * max(mlp, attn) * act_bytes
    head = t * 2 * h * act_bytes + b * cfg.vocab_size * (act_bytes + 4)  # after the last layer
    return max(layers, head)


def serving_reserve(model: ModelLike, *, batch_size: int = 1, seq_len: int = 2048,
                    prefill_tokens: int | None = None, cuda_context_bytes: int = DEFAULT_CUDA_CONTEXT,
                    fragmentation: float = DEFAULT_FRAGMENTATION, tensor_parallel: int = 1) -> Reserve:
    """The reserve for CUDA context, activations and fragmentation. Introduced in Chapter 11.

    Args:
        model: shipped name, config.json path, dict or ModelConfig.
        batch_size: sequences served together.
        seq_len: tokens per sequence (the prompt is at most this long).
        prefill_tokens: tokens per prefill forward pass (chunked prefill, as in vLLM); None: the whole batch's
            prompts in one pass (batch_size × seq_len, as ``model.generate`` does).
        cuda_context_bytes: CUDA context and workspaces (default 1 GiB, see :data:`DEFAULT_CUDA_CONTEXT`).
        fragmentation: fraction of the allocated tensors added for fragmentation (default 0.05).
        tensor_parallel: GPUs each layer is split over (see :func:`forward_activation_bytes`).

    Returns:
        The reserve (per GPU).
    """
    b = check_positive("batch_size", batch_size)
    s = check_positive("seq_len", seq_len)
    reserve_bytes(0, cuda_context_bytes=cuda_context_bytes, fragmentation=fragmentation)  # validates both
    tokens = b * s if prefill_tokens is None else min(check_positive("prefill_tokens", prefill_tokens), b * s)
    act = forward_activation_bytes(model, tokens, b, tensor_parallel=tensor_parallel)
    return Reserve(int(cuda_context_bytes), act, float(fragmentation), prefill_tokens)


