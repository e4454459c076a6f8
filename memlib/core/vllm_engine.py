"""vLLM's start-up memory accounting by release: GPU total, non-torch memory, profiled peak, CUDA graphs, KV groups.

Pure Python (Chapter 14). :func:`memlib.core.serve.serve` with ``vllm_version`` composes these terms the way
vLLM's worker does at start-up; each one cites the vLLM source it follows (pinned: the v0.11.0 and v0.34.0
source distributions on PyPI, ``vllm-<version>.tar.gz``); the release rows of :data:`VLLM_RELEASES` were bisected
over the source distributions of every release from 0.7.3 to 0.34.0.

- ``vllm/v1/worker/gpu_worker.py``, ``Worker.init_device`` / ``determine_available_memory``: the requested
  memory is ``MemorySnapshot().total_memory × gpu_memory_utilization``, the total being what
  ``torch.cuda.mem_get_info`` reports (an 80 GB H100 reports 79.19 GiB), not the nominal size; the KV cache
  gets the requested memory − weights − the profiled torch peak − non-torch memory grown since the snapshot
  (− the CUDA-graph estimate from v0.20, ``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS``, default 1);
  ``--kv-cache-memory`` replaces it all.
- ``vllm/utils/mem_utils.py``, ``memory_profiling``: non-torch memory is counted from the snapshot taken after
  the CUDA context exists, so the context sits in the 1 − utilization slack; NCCL and custom all-reduce buffers
  (tensor parallelism ≥ 2) are created later and counted.
- ``vllm/v1/worker/gpu_model_runner.py``, ``profile_run`` / ``_dummy_run`` / ``_dummy_sampler_run``: one forward
  pass of ``max_num_batched_tokens`` tokens, then the sampler on ``min(max_num_seqs, tokens)`` rows of
  logits with top-k and top-p set, which sorts the full vocabulary up to v0.16 and runs a Triton kernel from
  v0.17 (``vllm/v1/sample/ops/topk_topp_sampler.py``, ``apply_top_k_top_p``).
- ``vllm/engine/arg_utils.py``, ``EngineArgs.get_batch_defaults``: 8192 batched tokens for ``vllm serve``
  (16384 for ``LLM``) and 1024 sequences on GPUs of ≥ 70 GiB that are not A100s, 16384/1024 from 160 GiB
  (v0.28), else 2048 (8192 for ``LLM``) and 256; earlier releases by :data:`BATCH_RULES`.
- ``vllm/v1/core/kv_cache_utils.py``, ``_get_kv_cache_config_uniform_page_size`` ("Add %d padding layers"),
  ``get_num_blocks``, ``get_max_concurrency_for_kv_cache_config``; ``vllm/v1/kv_cache_interface.py``,
  ``SlidingWindowSpec.max_memory_usage_bytes``: a hybrid model's layers are grouped by the smallest layer count
  of any attention kind, every group padded to that size; a sliding-window layer admits a request against
  ⌈min(W − 1 + max_num_batched_tokens, max_model_len) / block⌉ + 1 blocks.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from .configs import ModelConfig
from .dtypes import GiB, MiB
from .errors import MemlibError, check_choice

__all__ = ["VllmRelease", "VLLM_RELEASES", "CURRENT_VLLM_VERSION", "VLLM_ENTRY_POINTS", "REPORTED_TOTAL_BYTES",
           "SAMPLER_BYTES_SORT_V1", "SAMPLER_BYTES_TRITON", "NON_TORCH_TP1", "NON_TORCH_TP_MULTI", "NON_TORCH_TP_PCIE", "SAMPLER_BYTES_PER_LOGIT",
           "SAMPLER_BYTES_FLASHINFER", "get_release", "reported_total",
           "batch_defaults", "non_torch_bytes", "forward_peak_bytes", "sampler_peak_bytes",
           "profile_activation_bytes", "cudagraph_capture_sizes", "cuda_graph_bytes", "KVGroups", "kv_groups",
           "blocks_per_request", "BATCH_RULES", "GRAPH_BYTES_PER_LAYER"]


#: Bytes per logit alive at the sampler's peak in the profiling run, V0 (and the estimate memlib counts from the
#: code): the bf16 logits the caller holds (2), their fp32 copy (4), ``logits.sort`` values (4) and int64 indices
#: (8), and the fp32 softmax / scatter result (4) (``apply_top_k_top_p`` with top-k and top-p both set, as the
#: dummy sampler run sets them).
SAMPLER_BYTES_PER_LOGIT: int = 22
#: V1 up to v0.16, the same sort path measured: 38 bytes per logit, fitted to Qwen3-14B on an H100 under v0.15 and
#: v0.16 (5.64 GiB of profiled activations at 8192 tokens and 1024 sequences; a public capacity-planner report,
#: tests/data/vllm_v1_logs.json). The tensors named above account for about 28; the rest is not traced.
SAMPLER_BYTES_SORT_V1: int = 38
#: From v0.17, top-k/top-p runs as a Triton kernel for batches of 8 or more (``apply_top_k_top_p_triton``,
#: ``vllm/v1/sample/ops/topk_topp_sampler.py``; not in 0.16.0): no vocabulary sort. 15 bytes per logit, fitted
#: to vLLM 0.19's profiled activations on an H100 (Llama-3.1-8B 1.89 GiB, Qwen2.5-7B and Qwen3-8B 2.21, phi-4
#: 1.52, gemma-2-9b 3.62; each within 3 %) and to vLLM 0.26 on an RTX 4080 (Qwen2.5-7B, 256 sequences).
SAMPLER_BYTES_TRITON: int = 15
#: FlashInfer's fused top-k/top-p sampling alone (no sort): bf16 logits (2), their fp32 copy (4) and the
#: processed fp32 logits (4). It is the default from v0.21 (``VLLM_USE_FLASHINFER_SAMPLER`` unset means on,
#: ``vllm/envs.py``; opt-in from 0.11.1 to 0.20.2), but the same release's ``_dummy_sampler_run`` also warms the
#: native path ("Also warm forward_native", ``gpu_model_runner.py``), so the profiled peak stays
#: :data:`SAMPLER_BYTES_TRITON`'s.
SAMPLER_BYTES_FLASHINFER: int = 10


#: Batch-default rules of ``EngineArgs`` (``vllm/engine/arg_utils.py``), oldest first; each adds to the one before.
#: ``"v0"``: V0's ``SchedulerConfig``; ``"h100-name"``: 8192 (``LLM`` 16384) tokens on a device named H100/H200,
#: else 2048 (8192), 1024 sequences everywhere; ``"mem70"``: the large tier by memory (≥ 70 GiB) with 1024
#: sequences, 256 on the small tier; ``"not-a100"``: A100s kept on the small tier (PR #17885); ``"mem160"``: 16384
#: tokens for both entry points from 160 GiB (B200/B300).
BATCH_RULES = ("v0", "h100-name", "mem70", "not-a100", "mem160")


@dataclass(frozen=True)
class VllmRelease:
    """The start-up behaviour of one range of vLLM releases (from ``version`` to the next row). Chapter 14.

    Each row is the first release whose source distribution (``vllm-<version>.tar.gz`` on PyPI) has the change,
    the release before it checked not to (bisected over every release from 0.7.3 to 0.34.0).

    Attributes:
        version: the first release with this behaviour (``"0.20.1"``).
        engine: ``"v0"`` (``vllm/worker/worker.py``) or ``"v1"`` (``vllm/v1/worker/gpu_worker.py``).
        batch_rule: how ``max_num_batched_tokens`` / ``max_num_seqs`` defaults are picked, one of
            :data:`BATCH_RULES`.
        cudagraph_estimate: CUDA-graph memory estimated and taken from the KV budget before the cache is sized.
        hybrid_padding: hybrid models' layer groups padded to one page size (else one group per layer kind).
        tokens_from_concurrency: the log's "GPU KV cache size" is concurrency × max_model_len (else
            blocks ÷ groups × block size).
        sampler_bytes_per_logit: bytes per logit alive at the profiling sampler's peak
            (:data:`SAMPLER_BYTES_PER_LOGIT` for V0, :data:`SAMPLER_BYTES_SORT_V1` for V1's sort path up to 0.16,
            :data:`SAMPLER_BYTES_TRITON` from 0.17).
        note: what changed, in words, with the file that shows it.
    """

    version: str
    engine: str
    batch_rule: str
    cudagraph_estimate: bool
    hybrid_padding: bool
    tokens_from_concurrency: bool
    sampler_bytes_per_logit: int
    note: str

    @property
    def batch_defaults_by_gpu(self) -> bool:
        """V1's batch defaults, which depend on the GPU (any rule but V0's)."""
        return self.batch_rule != "v0"


_V0, _SORT, _TRITON = SAMPLER_BYTES_PER_LOGIT, SAMPLER_BYTES_SORT_V1, SAMPLER_BYTES_TRITON

#: The releases whose start-up accounting differs, oldest first. The last is the current one.
VLLM_RELEASES: dict[str, VllmRelease] = {r.version: r for r in [
    VllmRelease("0.6", "v0", "v0", False, False, False, _V0,
                "V0 engine: profile at max(max_model_len, 2048) tokens, CUDA graphs captured after the KV cache "
                "is sized (they come out of the 1 - utilization slack)"),
    VllmRelease("0.8", "v1", "h100-name", False, False, False, _SORT,
                "V1 engine by default (envs.py VLLM_USE_V1 default '1'; '0' in 0.7.3); batch defaults 8192 tokens "
                "(LLM 16384) on devices named H100/H200, else 2048 (8192), 1024 sequences (arg_utils.py)"),
    VllmRelease("0.8.5", "v1", "mem70", False, False, False, _SORT,
                "batch defaults by device memory: >= 70 GiB 8192/1024, else 2048/256 (arg_utils.py; not in 0.8.4)"),
    VllmRelease("0.9", "v1", "not-a100", False, False, False, _SORT,
                "A100s kept on the 2048/256 tier ('a100' not in device_name, PR #17885; not in 0.8.5)"),
    VllmRelease("0.9.1", "v1", "not-a100", False, True, False, _SORT,
                "hybrid allocator: layer groups padded to one page size ('Add N padding layers', "
                "v1/core/kv_cache_utils.py; not in 0.9.0)"),
    VllmRelease("0.17", "v1", "not-a100", False, True, False, _TRITON,
                "top-k/top-p as a Triton kernel for batches >= 8 (v1/sample/ops/topk_topp_sampler.py, "
                "apply_top_k_top_p_triton; not in 0.16.0): no vocabulary sort in the profiled sampler"),
    VllmRelease("0.20", "v1", "not-a100", True, True, False, _TRITON,
                "CUDA-graph memory estimated and subtracted from the KV budget by default "
                "(envs.py VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS default '1'; logged but off, '0', in 0.18.0-0.19.1; "
                "the log line says 'default since v0.21.0')"),
    VllmRelease("0.20.1", "v1", "not-a100", True, True, True, _TRITON,
                "'GPU KV cache size' logged as int(max concurrency x max_model_len) (kv_cache_utils.py; "
                "blocks // groups x block size in 0.20.0)"),
    VllmRelease("0.21", "v1", "not-a100", True, True, True, _TRITON,
                "FlashInfer top-k/top-p sampling on by default (envs.py VLLM_USE_FLASHINFER_SAMPLER unset -> True; "
                "opt-in from 0.11.1 to 0.20.2); the dummy sampler run also warms the native path, so the profiled "
                "peak does not change"),
    VllmRelease("0.28", "v1", "mem160", True, True, True, _TRITON,
                "16384 batched tokens and 1024 sequences for both entry points from 160 GiB (B200/B300; "
                "arg_utils.py, not in 0.27.0)"),
    VllmRelease("0.34", "v1", "mem160", True, True, True, _TRITON,
                "checked: no change in these terms since 0.28 (the page-size padding moved to "
                "v1/core/kv_cache_planning.py in 0.33)"),
]}

#: The newest release memlib models (``memlib serve --vllm-version`` defaults to it).
CURRENT_VLLM_VERSION: str = next(reversed(VLLM_RELEASES))

#: vLLM's entry points, whose batch defaults differ (``UsageContext.OPENAI_API_SERVER`` and ``LLM_CLASS``).
VLLM_ENTRY_POINTS = ("serve", "llm")

#: What ``torch.cuda.mem_get_info()`` reports as a card's total, the figure vLLM multiplies by the utilization.
#: Sources: 79.19 GiB for an H100 SXM ("total_gpu_memory (79.19GiB)" in a vLLM log,
#: github.com/kubernetes-sigs/gateway-api-inference-extension/pull/550, and a public capacity-planner report's
#: "physical 79.19 GiB", tests/data/vllm_v1_logs.json); "total capacity of 79.15 GiB" (PyTorch OOM messages on 80 GB
#: cards, tests/test_oom.py) for the A100 80 GB and H100 PCIe;
#: 39.43 GiB for an A100 40 GB (an OOM message, tests/test_oom.py); 23.58 GiB for an RTX 3090
#: (github.com/vllm-project/vllm/issues/10517); 15.56 GiB for a T4 (vLLM issue log, "total_gpu_memory=15.56GiB");
#: 21.99 GiB for an A10 ("GPU 1 has a total capacity of 21.99 GiB", github.com/QwenLM/Qwen3/issues/1387); 44.42 GiB
#: for an L40S and 139.81 GiB for an H200 (V1's "Free memory on device (43.93/44.42 GiB) on startup" and
#: "(139.21/139.81 GiB)", public logs kept in tests/data/vllm_v1_logs.json).
#: Cards not listed use the nominal size of :data:`memlib.core.hardware.GPUS` (an upper bound).
REPORTED_TOTAL_BYTES: dict[str, int] = {
    "h100-sxm": round(79.19 * GiB), "h100-pcie": round(79.15 * GiB), "a100-80gb": round(79.15 * GiB),
    "a100-40gb": round(39.43 * GiB), "rtx-3090": round(23.58 * GiB), "t4": round(15.56 * GiB),
    "a10": round(21.99 * GiB), "l40s": round(44.42 * GiB), "h200": round(139.81 * GiB)}

#: Non-torch memory vLLM counts at tensor parallelism 1: cuBLAS/cuBLASLt workspaces and attention-backend buffers
#: created after the snapshot (public logs show 0.05-0.35 GiB; V0's "non_torch_memory=0.35GiB" on an RTX 3090,
#: vllm issue 10517). The CUDA context is not in it (it precedes the snapshot).
NON_TORCH_TP1: int = 256 * MiB
#: At tensor parallelism ≥ 2, NCCL communicator buffers and vLLM's custom all-reduce IPC buffers join it: about
#: 2.1 GiB per GPU in public V1 logs on NVLink machines (issue 32's survey of start-up logs; a vLLM 0.10.2 log on
#: 2 × H200 reports 1.38 GiB, tests/data/vllm_v1_logs.json).
NON_TORCH_TP_MULTI: int = round(2.1 * GiB)
#: At tensor parallelism ≥ 2 over PCIe (no NVLink): NCCL's peer buffers are small and vLLM's custom all-reduce is
#: off beyond two GPUs that are not fully connected (``CustomAllreduce.__init__``,
#: ``vllm/distributed/device_communicators/custom_all_reduce.py``): 0.21 GiB on 4 × L40S (a V1 log in
#: tests/data/vllm_v1_logs.json), 0.25 on 2 × RTX 4090 and 0.20 on RTX 3090s (V0 logs, vllm issues 13061, 14447).
NON_TORCH_TP_PCIE: int = round(0.21 * GiB)


_MAX_CAPTURE = 512  # largest CUDA-graph batch: min(2 × max_num_seqs, 512) (vllm/config, cudagraph_capture_sizes)


def _version_key(text: str) -> tuple[int, ...]:
    m = re.fullmatch(r"v?(\d+)\.(\d+)(?:\.(\d+))?(?:[.+-].*)?", text.strip())
    if not m:
        raise MemlibError(f"unknown vLLM version {text!r}; expected a release such as "
                          f"{CURRENT_VLLM_VERSION} (from {next(iter(VLLM_RELEASES))} to {CURRENT_VLLM_VERSION})")
    return tuple(int(g) for g in m.groups(default="0"))


def get_release(version: str | None = None) -> VllmRelease:
    """The behaviour row in effect for a vLLM version (``"0.11.0"`` → the ``"0.9.1"`` row). Chapter 14.

    Args:
        version: ``"0.11"``, ``"v0.11.0"``, ``"0.11.0rc1"``; None for :data:`CURRENT_VLLM_VERSION`.

    Returns:
        The release row.

    Raises:
        MemlibError: text that is not a version, or one older than the first row or newer than the current one.
    """
    if version is None:
        return VLLM_RELEASES[CURRENT_VLLM_VERSION]
    key = _version_key(str(version))
    rows = [r for r in VLLM_RELEASES.values() if _version_key(r.version) <= key]
    if not rows or key[:2] > _version_key(CURRENT_VLLM_VERSION)[:2]:
        raise MemlibError(f"unknown vLLM version {version!r}; expected a release from "
                          f"{next(iter(VLLM_RELEASES))} to {CURRENT_VLLM_VERSION} (rows: {', '.join(VLLM_RELEASES)})")
    return rows[-1]


def reported_total(gpu: str, nominal_bytes: int) -> int:
    """What ``torch.cuda.mem_get_info`` reports as the card's total (:data:`REPORTED_TOTAL_BYTES`), else nominal."""
    return REPORTED_TOTAL_BYTES.get(gpu, nominal_bytes)


def batch_defaults(release: VllmRelease, *, gpu_total_bytes: int, gpu: str | None, max_model_len: int,
                   entry_point: str = "serve") -> tuple[int, int]:
    """``(max_num_batched_tokens, max_num_seqs)`` vLLM picks when the user gives neither. Chapter 14.

    V1 (``EngineArgs``, ``vllm/engine/arg_utils.py``; ``release.batch_rule``, see :data:`BATCH_RULES`): from 0.28,
    ≥ 160 GiB → 16384/1024; ≥ 70 GiB and not an A100 (from 0.9; any ≥ 70 GiB card in 0.8.5) → 8192 (``vllm
    serve``) or 16384 (``LLM``) and 1024; otherwise 2048 (serve) or 8192 (LLM) and 256. 0.8.0-0.8.4 chose by
    device name (H100/H200) and always 1024 sequences. V0 (``SchedulerConfig``, ``vllm/config.py``):
    max(max_model_len, 2048) tokens; beyond 32K tokens chunked prefill is switched on with 512; 256 sequences.
    """
    check_choice("entry point", entry_point, VLLM_ENTRY_POINTS)
    rule = BATCH_RULES.index(release.batch_rule)
    if rule == 0:
        return (512 if max_model_len > 32768 else max(max_model_len, 2048)), 256
    llm = entry_point == "llm"
    large, small = (16384 if llm else 8192), (8192 if llm else 2048)
    name = gpu or ""
    if rule == 1:
        return (large if name.startswith(("h100", "h200")) else small), 1024
    if rule >= 4 and gpu_total_bytes >= 160 * GiB:
        return 16384, 1024
    if gpu_total_bytes >= 70 * GiB and not (rule >= 3 and name.startswith("a100")):
        return large, 1024
    return small, 256


def non_torch_bytes(tensor_parallel: int, nvlink: bool = True) -> int:
    """Non-torch memory vLLM counts per GPU: :data:`NON_TORCH_TP1`; with TP ≥ 2 :data:`NON_TORCH_TP_MULTI` on
    NVLink machines (``nvlink``: the card has ≥ 600 GB/s of NVLink, SXM boards and bridged H100 PCIe pairs), else
    :data:`NON_TORCH_TP_PCIE`."""
    if tensor_parallel == 1:
        return NON_TORCH_TP1
    return NON_TORCH_TP_MULTI if nvlink else NON_TORCH_TP_PCIE


def forward_peak_bytes(cfg: ModelConfig, tokens: int, tensor_parallel: int = 1, act_bytes: int = 2) -> int:
    """Peak transient of one forward pass of ``tokens`` tokens in vLLM's fused layers, per GPU. Chapter 14.

    The MLP is the peak: its input and residual (2 h, replicated on every TP rank), the merged gate-up output
    (2 i / tp) and the ``silu_and_mul`` output (i / tp) alive together, plus one more h for the normed input:
    tokens × (3 i / tp + 3 h) × 2 bytes (V0's "peak_torch_memory" − weights on an RTX 3090, vllm issue 10517:
    2.07 GiB at 20,000 tokens of Llama-3.1-8B, this 2.06). A MoE layer (``fused_moe``'s intermediate caches)
    holds tokens × top_k × (3 i_e / tp + h) + 3 h per token.
    """
    h = cfg.hidden_size
    dense = 3 * cfg.intermediate_size // tensor_parallel + 3 * h
    per_token = dense
    if cfg.moe is not None:
        moe = cfg.moe.top_k * (3 * cfg.moe.expert_intermediate_size // tensor_parallel + h) + 3 * h
        per_token = moe if len(cfg.moe.moe_layers) == cfg.num_layers else max(dense, moe)
    return tokens * per_token * act_bytes


def sampler_peak_bytes(cfg: ModelConfig, rows: int, bytes_per_logit: int = SAMPLER_BYTES_PER_LOGIT) -> int:
    """The profiling run's sampler peak: ``rows`` × vocabulary × ``bytes_per_logit`` (full vocabulary on every TP
    rank: ``LogitsProcessor`` gathers the shards)."""
    return rows * cfg.vocab_size * bytes_per_logit


def profile_activation_bytes(cfg: ModelConfig, *, max_num_batched_tokens: int, max_num_seqs: int,
                             tensor_parallel: int = 1, sampler_bytes_per_logit: int = SAMPLER_BYTES_PER_LOGIT) -> int:
    """The torch peak above the weights in vLLM's profiling run: max(forward, hidden states + sampler). Ch. 14.

    ``profile_run`` runs the model on ``max_num_batched_tokens`` tokens, keeps the hidden states
    (tokens × h × 2 bytes) and runs ``_dummy_sampler_run`` on min(max_num_seqs, tokens) rows; the peak is the
    larger of the two phases. It does not shrink with TP as a sharded activation would (the residual stream and
    the logits are whole on every rank), and it grows with the vocabulary.
    """
    fwd = forward_peak_bytes(cfg, max_num_batched_tokens, tensor_parallel)
    rows = min(max_num_seqs, max_num_batched_tokens)
    return max(fwd, max_num_batched_tokens * cfg.hidden_size * 2
               + sampler_peak_bytes(cfg, rows, sampler_bytes_per_logit))


def cudagraph_capture_sizes(max_num_seqs: int, max_num_batched_tokens: int | None = None) -> tuple[int, ...]:
    """vLLM's default capture sizes: 1, 2, 4, multiples of 8 below 256, then multiples of 16 up to
    min(2 × max_num_seqs, 512, max_num_batched_tokens) (``VllmConfig`` docstring and
    ``_set_cudagraph_sizes``, ``vllm/config/vllm.py``, v0.12 to v0.34)."""
    top = min(2 * max_num_seqs, _MAX_CAPTURE, max_num_batched_tokens or _MAX_CAPTURE)
    sizes = (1, 2, 4) + tuple(range(8, 256, 8)) + tuple(range(256, top + 1, 16))
    return tuple(s for s in sizes if s <= top)


#: Device memory each captured CUDA graph holds of its own, per decoder layer (its kernel nodes and their
#: parameters), beyond the pool the first capture fills. Fit to vLLM's logged "Estimated CUDA graph memory"
#: (0.37 GiB for Qwen2.5-7B with 35 PIECEWISE + 19 FULL graphs, v0.22; 0.52 GiB for Qwen3-8B with 51 + 35, v0.21,
#: LMCache issue 3430): 0.19 MiB per layer per graph, between the two fits (0.23 and 0.16; each log within 19 %).
GRAPH_BYTES_PER_LAYER: int = round(0.19 * MiB)


def cuda_graph_bytes(cfg: ModelConfig, release: VllmRelease, *, max_num_seqs: int, tensor_parallel: int = 1,
                     enforce_eager: bool = False, max_num_batched_tokens: int | None = None) -> int:
    """CUDA-graph memory vLLM takes from the KV budget before sizing it. Chapter 14.

    0 before v0.20 (graphs were captured after the KV cache was allocated, out of the 1 − utilization slack) and
    with ``enforce_eager``. From v0.20 ``GPUModelRunner.profile_cudagraph_memory`` captures the two largest
    sizes of each mode and estimates first capture + (n − 1) × the second capture's memory (at least 1 MiB a
    graph). memlib follows it: the first capture fills the pool with the largest batch's activations
    (:func:`forward_peak_bytes` at max(:func:`cudagraph_capture_sizes`)), and every further graph, PIECEWISE for
    each capture size and FULL for the decode sizes up to ``max_num_seqs`` (``CUDAGraphMode.FULL_AND_PIECEWISE``,
    the V1 default), holds :data:`GRAPH_BYTES_PER_LAYER` per layer. The per-graph constant is fitted to two
    logs (within 19 % of both); pass the logged figure to ``serve(cuda_graph_bytes=...)`` when you have it.
    """
    if enforce_eager or not release.cudagraph_estimate:
        return 0
    sizes = cudagraph_capture_sizes(max_num_seqs, max_num_batched_tokens)
    full = sum(1 for s in sizes if s <= max_num_seqs)
    per_graph = max(MiB, GRAPH_BYTES_PER_LAYER * cfg.num_layers)
    return forward_peak_bytes(cfg, sizes[-1], tensor_parallel) + per_graph * (len(sizes) - 1 + full - 1)


@dataclass(frozen=True)
class KVGroups:
    """How vLLM's KV cache manager groups a model's attention layers. Chapter 14.

    Attributes:
        group_size: layers per group (every group padded to it).
        groups: per group, the sliding window (None for full attention).
        padding_layers: layers added so every kind fills whole groups ("Add N padding layers").
    """

    group_size: int
    groups: tuple[int | None, ...]
    padding_layers: int

    @property
    def stored_layers(self) -> int:
        """Layers' worth of KV each token's page holds: groups × group size."""
        return self.group_size * len(self.groups)


def _window(cfg: ModelConfig) -> int | None:
    w = cfg.sliding_window
    if w is None and cfg.model_type == "mistral":
        w = cfg.raw.get("sliding_window")
    return w if isinstance(w, int) and w > 0 else None


def kv_groups(cfg: ModelConfig, release: VllmRelease, layers: int | None = None) -> KVGroups:
    """The KV cache groups of ``cfg`` (``_get_kv_cache_config_uniform_page_size``): one group when every layer
    attends alike; a hybrid model (Gemma 2/3) gets groups of min(layers per kind) layers, each kind padded up to
    whole groups (Gemma 3 27B: 10 full + 52 sliding → 7 groups of 10, 8 padding layers). Before the hybrid
    allocator (``release.hybrid_padding`` False), every layer of a hybrid model was a full-attention layer."""
    n = layers or cfg.num_layers
    w = _window(cfg)
    kinds = cfg.layer_types[:n] if cfg.layer_types else ()
    sliding = sum(1 for k in kinds if k == "sliding_attention")
    full = len(kinds) - sliding
    if w is None or (kinds and (sliding == 0 or not release.hybrid_padding)):
        return KVGroups(n, (None,), 0)
    if not kinds or full == 0:  # one window for every layer (Mistral)
        return KVGroups(n, (w,), 0)
    size = min(full, sliding)
    nf, ns = -(-full // size), -(-sliding // size)
    return KVGroups(size, (None,) * nf + (w,) * ns, (nf + ns) * size - full - sliding)


def blocks_per_request(groups: KVGroups, *, max_model_len: int, max_num_batched_tokens: int,
                       block_size: int, engine: str = "v1") -> int:
    """Blocks vLLM reserves per request of ``max_model_len`` tokens, summed over the groups. Chapter 14.

    Full attention: ⌈max_model_len / block⌉ (``FullAttentionSpec.max_memory_usage_bytes``); sliding window W:
    ⌈min(W − 1 + max_num_batched_tokens, max_model_len) / block⌉ + 1 (``SlidingWindowSpec``), not ⌈W / block⌉.
    V0 reserved full-length blocks for every layer.
    """
    total = 0
    for w in groups.groups:
        if w is None or engine == "v0":
            total += -(-max_model_len // block_size)
        else:
            total += -(-min(w - 1 + max_num_batched_tokens, max_model_len) // block_size) + 1
    return total
