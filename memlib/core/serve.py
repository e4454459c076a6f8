"""Serving memory as vLLM budgets it: utilization × GPU − weights − prefill peak − overheads → KV blocks.

Pure Python (Chapter 14). A vLLM-style engine does not grow its KV cache per request: at start-up it
profiles one forward pass, takes what is left of ``gpu_memory_utilization`` × GPU memory and pre-allocates
it as fixed blocks of ``block_size`` tokens (PagedAttention, Kwon et al. 2023). :func:`serve` follows that
accounting, term by term, and says how many sequences of ``max_model_len`` tokens the blocks hold.

Sources (vLLM, github.com/vllm-project/vllm):

- ``vllm/v1/worker/gpu_worker.py``, ``Worker.determine_available_memory``: available KV memory =
  total GPU memory × ``gpu_memory_utilization`` − the torch peak of a profiling forward pass (weights +
  activations of ``max_num_batched_tokens`` tokens) − non-torch allocations (CUDA context, cuBLAS, NCCL).
- ``vllm/v1/worker/gpu_model_runner.py``, ``GPUModelRunner.profile_run`` / ``_dummy_run``: the profiling pass
  runs ``max_num_batched_tokens`` tokens spread over at most ``max_num_seqs`` requests, then the sampler on
  ``max_num_seqs`` rows of logits.
- ``vllm/v1/core/kv_cache_utils.py``, ``get_num_blocks`` / ``check_enough_kv_cache_memory`` /
  ``estimate_max_model_len``: blocks = available // (page size × layers); start-up fails when one request of
  ``max_model_len`` does not fit, naming the longest length that would; ``get_max_concurrency_for_kv_cache_config``
  logs the maximum concurrency. ``vllm/v1/core/block_pool.py``, ``BlockPool``: one block is kept as the null block.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .configs import ModelConfig, load_config
from .dtypes import GiB, MiB, parse_size
from .errors import MemlibError, check_choice, check_positive
from .estimate import estimate_inference
from .families_moe import kv_elements_per_token
from .hardware import get_gpu
from .serving_terms import (DEFAULT_CUDA_CONTEXT, check_tensor_parallel, forward_activation_bytes, kv_cached_tokens,
                            kv_heads_for)
from . import vllm_engine as ve

__all__ = [
    "SERVE_KV_DTYPES",
    "DEFAULT_GPU_MEMORY_UTILIZATION",
    "DEFAULT_BLOCK_SIZE",
    "DEFAULT_MAX_NUM_BATCHED_TOKENS",
    "DEFAULT_MAX_NUM_SEQS",
    "DEFAULT_NON_TORCH",
    "DEFAULT_CUDA_GRAPH",
    "MAX_BLOCK_SIZE",
    "ServeFit",
    "serve_kv_bytes_per_token",
    "request_kv_bytes",
    "serve",
    "decode_bytes_per_step",
    "decode_latency_s",
]

ModelLike = str | Path | dict[str, Any] | ModelConfig

#: KV-cache formats and their bits per element (fp32 for CPU runs and the static fit of Chapter 11). fp8 (E4M3/E5M2) keeps a per-tensor scale (negligible, not
#: counted), as vLLM's ``kv_cache_dtype="fp8"``; int8 and int4 (KIVI-style, Liu et al. 2024) keep one fp16
#: scale and one fp16 zero-point per head vector of ``head_dim`` elements, counted in
#: :func:`serve_kv_bytes_per_token`.
SERVE_KV_DTYPES: dict[str, int] = {"fp32": 32, "fp16": 16, "bf16": 16, "fp8": 8, "int8": 8, "int4": 4}

#: vLLM's default ``gpu_memory_utilization`` (``vllm/config.py``, ``CacheConfig``): the engine's share of the GPU.
DEFAULT_GPU_MEMORY_UTILIZATION: float = 0.9

#: vLLM's default block size on CUDA: 16 tokens per KV block (``CacheConfig.block_size``).
DEFAULT_BLOCK_SIZE: int = 16

#: Largest block size memlib accepts (a power of two; vLLM's CUDA kernels take 8, 16 or 32, some backends more).
MAX_BLOCK_SIZE: int = 512

#: Tokens per scheduler step with chunked prefill: vLLM's ``SchedulerConfig`` default in its online server for
#: many releases; newer releases pick it by GPU and usage. The prefill activation peak is bounded by it.
DEFAULT_MAX_NUM_BATCHED_TOKENS: int = 2048

#: vLLM's default cap on requests per scheduler step (``SchedulerConfig.max_num_seqs``, 256 for many releases):
#: the profiling pass computes this many rows of logits.
DEFAULT_MAX_NUM_SEQS: int = 256

#: Memory outside PyTorch's allocator that vLLM measures as "non-torch": CUDA context, cuBLAS/cuBLASLt
#: workspaces, NCCL buffers. memlib takes the book's 1 GiB (:data:`memlib.core.inference.DEFAULT_CUDA_CONTEXT`).
DEFAULT_NON_TORCH: int = DEFAULT_CUDA_CONTEXT

#: CUDA-graph memory, memlib's assumption (0 with ``enforce_eager``). vLLM logs the real figure after capture
#: ("Graph capturing finished ... took X GiB"); releases that capture after allocating the KV cache take it
#: from the 1 − utilization slack instead, so counting it here errs on the safe side.
DEFAULT_CUDA_GRAPH: int = 512 * MiB


@dataclass(frozen=True)
class ServeFit:
    """A vLLM-style serving budget, term by term, in bytes per GPU. Introduced in Chapter 14.

    Attributes:
        gpu_memory_bytes: the GPU's memory.
        budget_bytes: gpu_memory_utilization × gpu_memory_bytes (floored).
        weights_bytes: the target model's weights on this GPU.
        draft_weights_bytes: the draft model's weights (speculative decoding), 0 without one.
        activation_bytes: peak transient of the profiling forward pass of ``max_num_batched_tokens`` tokens.
        non_torch_bytes: CUDA context, library workspaces, NCCL.
        cuda_graph_bytes: captured CUDA graphs.
        kv_budget_bytes: what is left for the KV cache (negative when the rest does not fit).
        kv_bytes_per_token: KV bytes of one token on this GPU, target + draft layers.
        block_size: tokens per KV block.
        block_bytes: bytes of one block (block_size × kv_bytes_per_token).
        num_blocks: blocks allocated (kv_budget // block_bytes, 0 if negative).
        kv_cache_bytes: num_blocks × block_bytes, the KV cache allocated.
        blocks_per_seq: blocks one request of max_model_len tokens (+ speculative lookahead) needs.
        max_concurrent_seqs: requests of max_model_len tokens the usable blocks hold at once.
        max_concurrent_seqs_prefix: the same when each request's shared prefix is cached once
            (equals max_concurrent_seqs at a prefix-cache hit rate of 0).
        max_model_len_fits: the longest single request the blocks hold (vLLM's ``estimate_max_model_len``).
        fits: at least one request of max_model_len tokens fits.
        reasons: why not (empty when it fits).
        settings: the inputs, echoed.
        vllm_tokens: with ``vllm_version``, the "GPU KV cache size: N tokens" vLLM logs (None otherwise).
        vllm_concurrency: with ``vllm_version``, the "Maximum concurrency" vLLM logs (None otherwise).
    """

    gpu_memory_bytes: int
    budget_bytes: int
    weights_bytes: int
    draft_weights_bytes: int
    activation_bytes: int
    non_torch_bytes: int
    cuda_graph_bytes: int
    kv_budget_bytes: int
    kv_bytes_per_token: int
    block_size: int
    block_bytes: int
    num_blocks: int
    kv_cache_bytes: int
    blocks_per_seq: int
    max_concurrent_seqs: int
    max_concurrent_seqs_prefix: int
    max_model_len_fits: int
    fits: bool
    reasons: tuple[str, ...] = ()
    settings: dict[str, Any] = field(default_factory=dict)
    vllm_tokens: int | None = None
    vllm_concurrency: float | None = None

    @property
    def kv_tokens(self) -> int:
        """Token slots in the allocated blocks."""
        return self.num_blocks * self.block_size

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready dict (byte values are ints; reasons a list)."""
        d = asdict(self)
        d["reasons"] = list(self.reasons)
        d["kv_tokens"] = self.kv_tokens
        return d


def _kv_heads_per_gpu(cfg: ModelConfig, tp: int, layout: str | None = None) -> int:
    heads = kv_heads_for(cfg, layout)
    return heads // tp if heads % tp == 0 else 1  # fewer KV heads than GPUs: each GPU holds a replica of one


def _stage_layers(cfg: ModelConfig, pipeline_parallel: int) -> int:
    """Layers on the fullest pipeline stage, ceil(L / stages); the stages must not outnumber the layers."""
    pp = check_positive("pipeline_parallel", pipeline_parallel)
    if pp > cfg.num_layers:
        raise MemlibError(f"pipeline_parallel {pp} exceeds {cfg.name}'s {cfg.num_layers} layers; "
                          f"expected at most {cfg.num_layers}")
    return -(-cfg.num_layers // pp)


def serve_kv_bytes_per_token(model: ModelLike, kv_dtype: str = "fp16", tensor_parallel: int = 1, *,
                             pipeline_parallel: int = 1, layout: str | None = None) -> int:
    """KV bytes of one token on one GPU: 2 (K, V) × layers × KV heads per GPU × head_dim × bits / 8.

    Introduced in Chapter 14; the same count as :func:`memlib.core.inference.kv_bytes_per_token` for 16- and 8-bit
    floats, plus int8/int4 with one fp16 scale and one fp16 zero-point per head vector (4 bytes per head per
    K or V). vLLM's page size (``AttentionSpec.page_size_bytes`` in ``vllm/v1/kv_cache_interface.py``) is
    this × block_size / layers. An MLA model (DeepSeek-V2/V3) caches one latent of kv_lora_rank +
    qk_rope_head_dim values per layer (vLLM's ``MLAAttentionSpec``), the same on every tensor-parallel GPU.

    Args:
        model: shipped name, config.json path, dict or ModelConfig.
        kv_dtype: one of :data:`SERVE_KV_DTYPES`.
        tensor_parallel: GPUs the KV heads are split over (replicated when fewer heads than GPUs).
        pipeline_parallel: pipeline stages; the fullest holds ceil(L / stages) layers.
        layout: KV layout (``"mha"``, ``"gqa"``, ``"mqa"``, see :func:`memlib.core.inference.kv_heads_for`) or None
            (as configured).

    Returns:
        Bytes per token per GPU.
    """
    cfg = load_config(model)
    check_choice("kv dtype", kv_dtype, SERVE_KV_DTYPES)
    heads = _kv_heads_per_gpu(cfg, check_positive("tensor_parallel", tensor_parallel), layout)
    bits = SERVE_KV_DTYPES[kv_dtype]
    stage = _stage_layers(cfg, pipeline_parallel)
    latent = kv_elements_per_token(cfg)
    if latent is not None:  # MLA: one latent vector per layer and token, replicated on every tensor-parallel GPU
        return latent * stage // cfg.num_layers * bits // 8 + (4 * stage if kv_dtype in ("int8", "int4") else 0)
    vectors = 2 * stage * heads  # K and V head vectors per token
    scales = 4 if kv_dtype in ("int8", "int4") else 0
    return vectors * (cfg.head_dim * bits // 8 + scales)


def _gpu_bytes(gpu: str | None, gpu_memory: int | str | None) -> int:
    if (gpu is None) == (gpu_memory is None):
        raise MemlibError("give a GPU name or a GPU memory size, not both and not neither "
                          "(e.g. gpu='h100-sxm' or gpu_memory='80GiB')")
    if gpu is not None:
        return get_gpu(gpu).memory_bytes
    return parse_size(gpu_memory) if isinstance(gpu_memory, str) else check_positive("gpu_memory", gpu_memory)


def _check_block_size(block_size: int) -> int:
    bs = check_positive("block_size", block_size)
    if bs & (bs - 1) or bs > MAX_BLOCK_SIZE:
        valid = ", ".join(str(1 << i) for i in range(MAX_BLOCK_SIZE.bit_length()))
        raise MemlibError(f"block_size {bs} is not a power of two up to {MAX_BLOCK_SIZE}; expected one of: {valid}")
    return bs


def request_kv_bytes(model: ModelLike, tokens: int, kv_dtype: str = "fp16", tensor_parallel: int = 1, *,
                     pipeline_parallel: int = 1, layout: str | None = None) -> int:
    """KV bytes of one request of ``tokens`` tokens on one GPU. Chapters 11 and 14.

    Sliding-window layers stop at their window (:func:`memlib.core.inference.kv_cached_tokens`; vLLM's
    ``SlidingWindowSpec`` frees the blocks behind it); with pipeline stages, the fullest stage's share
    (ceil(L / stages) of the L layers). Without sliding-window layers: tokens × :func:`serve_kv_bytes_per_token`.

    Args:
        model: shipped name, config.json path, dict or ModelConfig.
        tokens: tokens the request holds.
        kv_dtype: one of :data:`SERVE_KV_DTYPES`.
        tensor_parallel: GPUs the KV heads are split over.
        pipeline_parallel: pipeline stages.
        layout: KV layout override (``"mha"``, ``"gqa"``, ``"mqa"``) or None.

    Returns:
        Bytes.
    """
    cfg = load_config(model)
    n = check_positive("tokens", tokens)
    per_layer_token = serve_kv_bytes_per_token(cfg, kv_dtype, tensor_parallel, layout=layout) // cfg.num_layers
    stage = _stage_layers(cfg, pipeline_parallel)
    return -(-per_layer_token * sum(kv_cached_tokens(cfg, n)) * stage // cfg.num_layers)


def serve(model: ModelLike, *, max_model_len: int, gpu: str | None = None, gpu_memory: int | str | None = None,
          gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION, kv_dtype: str = "fp16",
          weights: str = "fp16", block_size: int = DEFAULT_BLOCK_SIZE,
          max_num_batched_tokens: int | None = None, max_num_seqs: int | None = None,
          tensor_parallel: int = 1, pipeline_parallel: int = 1, draft: ModelLike | None = None,
          num_speculative_tokens: int = 0, prefix_cache_hit_rate: float = 0.0,
          non_torch_bytes: int | None = None, cuda_graph_bytes: int | None = None,
          layout: str | None = None, fragmentation: float = 0.0, vllm_version: str | None = None,
          entry_point: str = "serve", enforce_eager: bool = False,
          kv_cache_memory: int | None = None, weights_bytes: int | None = None) -> ServeFit:
    """How many requests a vLLM-style engine serves at once: the KV-block budget, term by term. Chapter 14.

    kv_budget = utilization × GPU − weights (− draft weights) − activation peak of a prefill chunk of
    ``max_num_batched_tokens`` tokens − non-torch memory − CUDA graphs, as in vLLM's
    ``Worker.determine_available_memory`` (``vllm/v1/worker/gpu_worker.py``). The budget becomes
    ``num_blocks = kv_budget // (block_size × KV bytes per token)`` blocks (``get_num_blocks`` in
    ``vllm/v1/core/kv_cache_utils.py``); one is the block pool's null block. A request of ``max_model_len``
    tokens (+ ``num_speculative_tokens`` lookahead slots) needs ceil((len + k) / block_size) blocks.
    With ``fragmentation`` f > 0 (0 for vLLM, whose blocks are allocated once) the tensors are held to
    (budget − non-torch − graphs) / (1 + f), the reserve policy of :func:`memlib.core.inference.reserve_bytes`;
    Chapter 11's static fit (:func:`memlib.core.inference.serving_fit`) asks this function with utilization 1,
    blocks of one token and 5 %. With speculative decoding the draft's layers share the block pool: each token's page holds target and
    draft K/V. With prefix caching, a fraction ``prefix_cache_hit_rate`` of every request is a prefix shared
    by all requests: its full blocks are held once (vLLM shares only full blocks; a shared block is copied
    on write only when a request writes into it, which full prefix blocks never are).

    Limitations: the activation peak is :func:`memlib.core.inference.forward_activation_bytes`, an estimate of
    PyTorch's peak, not vLLM's fused kernels; the draft's own forward pass and the sampler's top-k/top-p
    buffers are not counted; weights under tensor parallelism are split evenly (embeddings included).

    Args:
        model: shipped name, config.json path, dict or ModelConfig.
        max_model_len: tokens per request (prompt + output), at most the model's positions.
        gpu: a GPU of :data:`memlib.core.hardware.GPUS` (``"h100-sxm"``); or give ``gpu_memory``.
        gpu_memory: memory of one GPU in bytes or as text (``"80GiB"``).
        gpu_memory_utilization: the engine's share of the GPU, in (0, 1].
        kv_dtype: KV-cache format, one of :data:`SERVE_KV_DTYPES`.
        weights: weight format (``fp16``, ``bf16``, ``int8``, ``int4``, ``nf4``, ``fp32``).
        block_size: tokens per KV block, a power of two.
        max_num_batched_tokens: tokens per scheduler step (the prefill chunk).
        max_num_seqs: requests per scheduler step.
        tensor_parallel: GPUs each layer is split over (the numbers are per GPU).
        pipeline_parallel: pipeline stages; the numbers are for the fullest, with ceil(L / stages) layers
            (weights split like the layers, embeddings included).
        draft: draft model for speculative decoding (same vocabulary as ``model``).
        num_speculative_tokens: tokens the draft proposes per step (needs ``draft``).
        prefix_cache_hit_rate: fraction of each request's tokens that is a prefix shared by all, in [0, 1).
        non_torch_bytes: CUDA context, workspaces, NCCL (see :data:`DEFAULT_NON_TORCH`).
        cuda_graph_bytes: captured CUDA graphs (see :data:`DEFAULT_CUDA_GRAPH`; 0 for eager mode).
        layout: KV layout override (``"mha"``, ``"gqa"``, ``"mqa"``) or None (as configured).
        fragmentation: fraction of the held tensors kept free for the allocator's fragmentation, in [0, 1).
        vllm_version: None for the book's simple model above; a vLLM release (``"0.11"``, see
            :data:`memlib.core.vllm_engine.VLLM_RELEASES`) for that release's start-up accounting
            (:mod:`memlib.core.vllm_engine`): the GPU total ``mem_get_info`` reports, non-torch memory by TP,
            the profiled peak with the sampler, CUDA graphs, batch defaults by GPU (``max_num_batched_tokens``
            and ``max_num_seqs`` None pick them), hybrid page padding and the sliding-window admission rule.
        entry_point: ``"serve"`` (``vllm serve``) or ``"llm"`` (the ``LLM`` class), for the batch defaults.
        enforce_eager: no CUDA graphs (with ``vllm_version``).
        kv_cache_memory: ``--kv-cache-memory`` bytes: the KV cache size, profiling ignored (with ``vllm_version``).
        weights_bytes: the weights on this GPU when known (vLLM logs it: "Model loading took X GiB"), in place of
            memlib's estimate from ``weights`` (a checkpoint quantized another way, AWQ or GPTQ, differs from it).

    Returns:
        The budget and what it holds.

    Raises:
        MemlibError: a block size that is not a power of two, a utilization outside (0, 1], a max_model_len
            above the model's positions, a draft with another vocabulary, or other bad input.
    """
    cfg = load_config(model)
    mem = _gpu_bytes(gpu, gpu_memory)
    release = ve.get_release(vllm_version) if vllm_version is not None else None
    if release is not None and gpu is not None:
        mem = ve.reported_total(get_gpu(gpu).name, mem)
    util = float(gpu_memory_utilization)
    if not 0.0 < util <= 1.0:
        raise MemlibError(f"gpu_memory_utilization {gpu_memory_utilization!r} is outside (0, 1]; "
                          f"expected a fraction such as {DEFAULT_GPU_MEMORY_UTILIZATION}")
    length = check_positive("max_model_len", max_model_len)
    if length > cfg.max_positions:
        raise MemlibError(f"max_model_len {length:,} exceeds {cfg.name}'s {cfg.max_positions:,} positions; "
                          f"expected max_model_len ≤ {cfg.max_positions:,}")
    check_choice("kv dtype", kv_dtype, SERVE_KV_DTYPES)
    bs = _check_block_size(block_size)
    d_chunk, d_seqs = DEFAULT_MAX_NUM_BATCHED_TOKENS, DEFAULT_MAX_NUM_SEQS
    if release is not None:
        d_chunk, d_seqs = ve.batch_defaults(release, gpu_total_bytes=mem, gpu=get_gpu(gpu).name if gpu else None,
                                            max_model_len=length, entry_point=entry_point)
    chunk = check_positive("max_num_batched_tokens", d_chunk if max_num_batched_tokens is None
                           else max_num_batched_tokens)
    seqs = check_positive("max_num_seqs", d_seqs if max_num_seqs is None else max_num_seqs)
    tp = check_tensor_parallel(cfg, tensor_parallel)
    k = check_positive("num_speculative_tokens", num_speculative_tokens, allow_zero=True)
    rate = float(prefix_cache_hit_rate)
    if not 0.0 <= rate < 1.0:
        raise MemlibError(f"prefix_cache_hit_rate {prefix_cache_hit_rate!r} is outside [0, 1); "
                          "expected a fraction such as 0.5")
    nvlink = gpu is None or (get_gpu(gpu).nvlink_bytes_per_s or 0) >= 600e9
    d_over = ve.non_torch_bytes(tp, nvlink) if release is not None else DEFAULT_NON_TORCH
    overhead = check_positive("non_torch_bytes", d_over if non_torch_bytes is None else non_torch_bytes,
                              allow_zero=True)
    frag = float(fragmentation)
    if not 0.0 <= frag < 1.0:
        raise MemlibError(f"fragmentation {fragmentation!r} is outside [0, 1); expected e.g. 0.05 (0 for vLLM)")
    pp = check_positive("pipeline_parallel", pipeline_parallel)
    layers = _stage_layers(cfg, pp)

    est = estimate_inference(cfg, seq_len=1, weights=weights)
    w = -(-est.weights_bytes * layers // (cfg.num_layers * tp))
    if weights_bytes is not None:
        w = check_positive("weights_bytes", weights_bytes)
    per_token = serve_kv_bytes_per_token(cfg, kv_dtype, tp, pipeline_parallel=pp, layout=layout)
    draft_w = 0
    draft_name = None
    if draft is not None:
        dcfg = load_config(draft)
        draft_name = dcfg.name
        if dcfg.vocab_size != cfg.vocab_size:
            raise MemlibError(f"draft {dcfg.name} has a vocabulary of {dcfg.vocab_size:,} tokens, {cfg.name} "
                              f"{cfg.vocab_size:,}; expected a draft with the same vocabulary "
                              f"({cfg.vocab_size:,} tokens)")
        if k == 0:
            raise MemlibError("a draft model needs num_speculative_tokens ≥ 1; expected e.g. 3 to 5")
        if pp > 1:
            raise MemlibError(f"a draft model with pipeline_parallel {pp} is not modelled; expected "
                              "pipeline_parallel 1 with --draft")
        dtp = check_tensor_parallel(dcfg, tp)
        draft_w = -(-estimate_inference(dcfg, seq_len=1, weights=weights).weights_bytes // dtp)
        per_token += serve_kv_bytes_per_token(dcfg, kv_dtype, dtp)
    elif k:
        raise MemlibError(f"num_speculative_tokens {k} needs a draft model; expected 0 without --draft")

    request = request_kv_bytes(cfg, length + k, kv_dtype, tp, pipeline_parallel=pp, layout=layout)
    if draft is not None:
        request += request_kv_bytes(dcfg, length + k, kv_dtype, dtp)
    if release is None:
        act = forward_activation_bytes(cfg, chunk, min(seqs, chunk), tensor_parallel=tp)
        d_graphs = DEFAULT_CUDA_GRAPH
    else:
        act = ve.profile_activation_bytes(cfg, max_num_batched_tokens=chunk, max_num_seqs=seqs, tensor_parallel=tp,
                                          sampler_bytes_per_logit=release.sampler_bytes_per_logit)
        d_graphs = ve.cuda_graph_bytes(cfg, release, max_num_seqs=seqs, tensor_parallel=tp,
                                       enforce_eager=enforce_eager, max_num_batched_tokens=chunk)
    graphs = check_positive("cuda_graph_bytes", d_graphs if cuda_graph_bytes is None else cuda_graph_bytes,
                            allow_zero=True)
    if release is not None:
        return _serve_vllm(cfg, release, mem=mem, util=util, weights_bytes=w + draft_w, act=act,
                           overhead=overhead, graphs=graphs, per_token=per_token, bs=bs, length=length,
                           chunk=chunk, seqs=seqs, tp=tp, layers=layers, k=k, rate=rate, draft=draft is not None,
                           kv_cache_memory=kv_cache_memory, settings={
                               "model": cfg.name, "max_model_len": length, "gpu": gpu,
                               "gpu_memory_utilization": util, "weights": weights, "kv_dtype": kv_dtype,
                               "block_size": bs, "max_num_batched_tokens": chunk, "max_num_seqs": seqs,
                               "tensor_parallel": tp, "draft": draft_name, "num_speculative_tokens": k,
                               "prefix_cache_hit_rate": rate, "vllm_version": vllm_version,
                               "vllm_release_row": release.version, "entry_point": entry_point,
                               "enforce_eager": enforce_eager, "kv_cache_memory": kv_cache_memory})
    budget = int(mem * util)
    held = budget - overhead - graphs  # what the tensors may take, fragmentation included
    if frag:
        held = math.floor(held / (1.0 + frag)) if held > 0 else held
    kv_budget = held - w - draft_w - act
    block_bytes = bs * per_token
    num_blocks = max(kv_budget, 0) // block_bytes
    usable = max(num_blocks - 1, 0)  # the block pool keeps one null block
    blocks_per_seq = -(-request // block_bytes)  # ceil((length + k) / block_size) without sliding-window layers
    concurrent = usable // blocks_per_seq
    shared = int(rate * length) // bs  # full blocks of the shared prefix, held once
    private = blocks_per_seq - shared
    concurrent_prefix = (usable - shared) // private if usable >= blocks_per_seq else 0
    longest = min(usable * bs - k, cfg.max_positions) if usable else 0

    reasons: list[str] = []
    if kv_budget <= 0:
        reasons.append(_no_kv_room(f"weights {(w + draft_w) / GiB:.2f} GiB + activations {act / GiB:.2f} GiB + "
                                   f"overheads {(overhead + graphs) / GiB:.2f} GiB", util, mem, kv_budget))
    elif concurrent < 1:
        reasons.append(f"one request of {length:,} tokens needs {blocks_per_seq:,} blocks "
                       f"({blocks_per_seq * block_bytes / GiB:.2f} GiB) but {usable:,} usable blocks "
                       f"({usable * block_bytes / GiB:.2f} GiB) are left; the longest request that fits is "
                       f"{max(longest, 0):,} tokens (lower max_model_len or use a smaller kv dtype)")
    settings: dict[str, Any] = {
        "model": cfg.name, "max_model_len": length, "gpu": gpu, "gpu_memory_utilization": util,
        "weights": weights, "kv_dtype": kv_dtype, "block_size": bs, "max_num_batched_tokens": chunk,
        "max_num_seqs": seqs, "tensor_parallel": tp, "draft": draft_name, "num_speculative_tokens": k,
        "prefix_cache_hit_rate": rate}
    if pp > 1 or layout is not None or frag:
        settings.update(pipeline_parallel=pp, layout=layout or "as configured", fragmentation=frag)
    return ServeFit(mem, budget, w, draft_w, act, overhead, graphs, kv_budget, per_token, bs, block_bytes,
                    num_blocks, num_blocks * block_bytes, blocks_per_seq, concurrent, max(concurrent_prefix, 0),
                    max(longest, 0), concurrent >= 1, tuple(reasons), settings)


def _no_kv_room(terms: str, util: float, mem: int, kv_budget: int) -> str:
    """The reason a setup leaves no KV cache: ``terms`` (what the budget holds, in words) exceed it."""
    return (f"no memory left for the KV cache: {terms} exceed the {util:g} × {mem / GiB:.2f} GiB budget by "
            f"{-kv_budget / GiB:.2f} GiB; raise gpu_memory_utilization, quantize the weights or add tensor-parallel "
            "GPUs")


def _serve_vllm(cfg: ModelConfig, release: ve.VllmRelease, *, mem: int, util: float, weights_bytes: int, act: int,
                overhead: int, graphs: int, per_token: int, bs: int, length: int, chunk: int, seqs: int, tp: int,
                layers: int, k: int, rate: float, draft: bool, kv_cache_memory: int | None,
                settings: dict[str, Any]) -> ServeFit:
    """:func:`serve` for one vLLM release (``determine_available_memory`` then ``get_kv_cache_config``)."""
    budget = int(mem * util)
    if kv_cache_memory is not None:  # --kv-cache-memory: the KV cache size, the profile ignored
        kv_budget = check_positive("kv_cache_memory", kv_cache_memory)
    else:
        kv_budget = budget - weights_bytes - act - overhead - graphs
    groups = ve.KVGroups(layers, (None,), 0) if draft else ve.kv_groups(cfg, release, layers)
    if len(groups.groups) == 1:
        block_bytes = bs * per_token
    else:  # one block spans one layer of every group: page × group size
        block_bytes = bs * (per_token // layers) * groups.group_size
    stored_per_token = block_bytes // bs * len(groups.groups)  # padding layers included
    num_blocks = max(kv_budget, 0) // block_bytes
    per_req = ve.blocks_per_request(groups, max_model_len=length + k, max_num_batched_tokens=chunk,
                                    block_size=bs, engine=release.engine)
    concurrency = num_blocks / per_req
    if release.tokens_from_concurrency:
        tokens = int(concurrency * length)
    else:
        tokens = num_blocks // len(groups.groups) * bs
    usable = max(num_blocks - 1, 0)
    concurrent = usable // per_req
    shared = int(rate * length) // bs * len(groups.groups)
    concurrent_prefix = (usable - shared) // (per_req - shared) if usable >= per_req and per_req > shared else 0
    longest = min(usable // len(groups.groups) * bs - k, cfg.max_positions) if usable else 0
    reasons: list[str] = []
    if kv_budget <= 0:
        reasons.append(_no_kv_room(f"weights {weights_bytes / GiB:.2f} GiB + profiled peak {act / GiB:.2f} GiB + "
                                   f"non-torch {overhead / GiB:.2f} GiB + CUDA graphs {graphs / GiB:.2f} GiB",
                                   util, mem, kv_budget))
    elif concurrent < 1:
        reasons.append(f"one request of {length:,} tokens needs {per_req:,} blocks but {usable:,} are left; "
                       f"vLLM refuses to start (lower max_model_len to about {max(longest, 0):,} or use a smaller "
                       "kv dtype)")
    if groups.padding_layers:
        settings["padding_layers"] = groups.padding_layers
    return ServeFit(mem, budget, weights_bytes, 0, act, overhead, graphs, kv_budget, stored_per_token, bs,
                    block_bytes, num_blocks, num_blocks * block_bytes, per_req, concurrent, max(concurrent_prefix, 0),
                    max(longest, 0), concurrent >= 1, tuple(reasons), settings, tokens, round(concurrency, 2))


def decode_bytes_per_step(model: ModelLike, *, batch_size: int, context_len: int, weights: str = "fp16",
                          kv_dtype: str = "fp16") -> int:
    """Bytes one decode step reads from GPU memory: all weights once + every sequence's KV cache. Chapter 14.

    At small batch a decode step is memory-bound: each weight is read once per step however many sequences
    share it, and each sequence's K/V of ``context_len`` tokens is read once.

    Args:
        model: shipped name, config.json path, dict or ModelConfig.
        batch_size: sequences decoded together.
        context_len: tokens already in each sequence's cache.
        weights: weight format.
        kv_dtype: KV format (see :data:`SERVE_KV_DTYPES`).

    Returns:
        Bytes read per step.
    """
    cfg = load_config(model)
    b = check_positive("batch_size", batch_size)
    s = check_positive("context_len", context_len)
    w = estimate_inference(cfg, seq_len=1, weights=weights).weights_bytes
    return w + b * s * serve_kv_bytes_per_token(cfg, kv_dtype)


def decode_latency_s(model: ModelLike, *, gpu: str, batch_size: int = 1, context_len: int = 1,
                     weights: str = "fp16", kv_dtype: str = "fp16", mbu: float = 1.0) -> float:
    """Lower bound of one decode step's time: bytes moved ÷ (bandwidth × MBU). Chapter 14.

    MBU (model bandwidth utilization) is the fraction of the datasheet bandwidth a kernel achieves;
    1.0 gives the roofline bound.

    Args:
        model: shipped name, config.json path, dict or ModelConfig.
        gpu: a GPU of :data:`memlib.core.hardware.GPUS`.
        batch_size: sequences decoded together.
        context_len: tokens in each sequence's cache.
        weights: weight format.
        kv_dtype: KV format.
        mbu: achieved fraction of peak bandwidth, in (0, 1].

    Returns:
        Seconds per decode step (per generated token of each sequence).
    """
    if not 0.0 < float(mbu) <= 1.0:
        raise MemlibError(f"mbu {mbu!r} is outside (0, 1]; expected a fraction such as 0.7")
    moved = decode_bytes_per_step(model, batch_size=batch_size, context_len=context_len, weights=weights,
                                  kv_dtype=kv_dtype)
    return moved / (get_gpu(gpu).bandwidth_bytes_per_s * float(mbu))
