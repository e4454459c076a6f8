"""Whiteboard cluster arithmetic interviews ask for: training days, ring all-reduce, prefill time, arithmetic
intensity and the GPUs a model needs to serve (Drills part; Chapters 11, 12, 14, 15).

Pure Python (no torch). Each function is one formula, written once, with its assumptions in the docstring; the
drills' numeric kinds and the model answers call these, never a retyped formula.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .configs import load_config
from .errors import MemlibError, check_choice, check_positive
from .flops import forward_flops
from .hardware import H20, GpuSpec, get_gpu
from .params import count_params
from .serve import serve_kv_bytes_per_token

__all__ = [
    "SECONDS_PER_DAY",
    "SERVE_WEIGHT_BYTES",
    "train_days",
    "ring_allreduce_bytes",
    "allreduce_time_s",
    "PrefillTime",
    "prefill_time",
    "decode_intensity",
    "critical_batch",
    "ServeGpus",
    "min_gpus_serve",
]

SECONDS_PER_DAY = 86_400
#: Bytes per weight of the formats a server stores weights in (fp8: one byte plus per-block scales, ignored).
SERVE_WEIGHT_BYTES: dict[str, float] = {"fp16": 2.0, "bf16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5}


def _spec(gpu: str | GpuSpec) -> GpuSpec:
    """A GpuSpec given itself or a name of the table (``"h20"`` too: :data:`memlib.core.hardware.H20`)."""
    if isinstance(gpu, GpuSpec):
        return gpu
    return H20 if str(gpu).lower() == "h20" else get_gpu(gpu)


def _fraction(name: str, value: float) -> float:
    v = float(value)
    if not 0 < v <= 1:
        raise MemlibError(f"{name} must be in (0, 1], got {value!r}")
    return v


def train_days(params: float, tokens: float, num_gpus: int, gpu: str | GpuSpec = "h100-sxm", mfu: float = 0.4,
               dtype: str = "bf16") -> float:
    """Days to train ``params`` parameters on ``tokens`` tokens: 6·N·D ÷ (GPUs · peak · MFU).

    Introduced in the Drills part (the 6N FLOPs per token of Chapter 12, attention ignored).

    Args:
        params: N, the parameter count.
        tokens: D, training tokens.
        num_gpus: GPUs.
        gpu: a name of the hardware table (dense peak for ``dtype``).
        mfu: model FLOPs utilization, a fraction in (0, 1].
        dtype: the tensor-core format whose dense peak applies.
    """
    if not params > 0 or not tokens > 0:
        raise MemlibError(f"params and tokens must be positive, got {params!r} and {tokens!r}")
    n = check_positive("num_gpus", num_gpus)
    rate = n * _spec(gpu).peak_flops(dtype) * _fraction("mfu", mfu)
    return 6.0 * params * tokens / rate / SECONDS_PER_DAY


def ring_allreduce_bytes(num_bytes: float, num_gpus: int) -> float:
    """Bytes each GPU sends (and receives) in a ring all-reduce of ``num_bytes``: 2(N − 1)/N × bytes.

    Introduced in the Drills part: a reduce-scatter and an all-gather, each (N − 1)/N of the buffer.
    """
    n = check_positive("num_gpus", num_gpus)
    if not num_bytes >= 0:
        raise MemlibError(f"num_bytes must be non-negative, got {num_bytes!r}")
    return 2.0 * (n - 1) / n * num_bytes


def allreduce_time_s(num_bytes: float, num_gpus: int, link_bytes_per_s: float) -> float:
    """Least time of a ring all-reduce: :func:`ring_allreduce_bytes` ÷ the per-GPU (bus) bandwidth, in seconds.

    Latency and the overlap with backward are ignored (a bandwidth bound). 400 Gb/s is 50e9 bytes/s.
    """
    if not link_bytes_per_s > 0:
        raise MemlibError(f"link_bytes_per_s must be positive, got {link_bytes_per_s!r}")
    return ring_allreduce_bytes(num_bytes, num_gpus) / link_bytes_per_s


@dataclass(frozen=True)
class PrefillTime:
    """The two lower bounds of one prefill (time to first token) on one GPU, in seconds.

    Attributes:
        compute_s: forward FLOPs (causal attention) ÷ dense peak.
        memory_s: weight bytes ÷ memory bandwidth (every weight read once).
    """

    compute_s: float
    memory_s: float

    @property
    def seconds(self) -> float:
        """The larger bound: the time to first token at 100 % of the bottleneck."""
        return max(self.compute_s, self.memory_s)

    @property
    def bound(self) -> str:
        """``"compute"`` or ``"memory"``: which bound sets the time."""
        return "compute" if self.compute_s >= self.memory_s else "memory"


def prefill_time(model: str, prompt_len: int, gpu: str | GpuSpec = "h100-sxm", weights: str = "bf16",
                 batch_size: int = 1) -> PrefillTime:
    """Lower bounds of a prefill of ``batch_size`` prompts of ``prompt_len`` tokens (Chapter 14's TTFT).

    Introduced in the Drills part. Compute: :func:`memlib.core.flops.forward_flops` (causal attention) ÷ the
    dense bf16 peak (fp8 peak for fp8 weights); memory: the weights once ÷ bandwidth. KV writes and the
    scheduler are ignored.
    """
    check_choice("weights", weights, SERVE_WEIGHT_BYTES)
    spec = _spec(gpu)
    flops = forward_flops(model, batch_size, prompt_len, attention="causal").model_flops
    peak = spec.peak_flops("fp8" if weights == "fp8" else "bf16")
    w = count_params(model).params * SERVE_WEIGHT_BYTES[weights]
    return PrefillTime(flops / peak, w / spec.bandwidth_bytes_per_s)


def decode_intensity(batch_size: int, weight_bytes: float = 2.0) -> float:
    """Arithmetic intensity of a decode matmul, FLOP per byte: 2·b·k·n FLOPs over k·n weights of
    ``weight_bytes`` each (activations, b·(k + n) values, ignored as small), so 2b ÷ bytes per weight."""
    b = check_positive("batch_size", batch_size)
    if not weight_bytes > 0:
        raise MemlibError(f"weight_bytes must be positive, got {weight_bytes!r}")
    return 2.0 * b / weight_bytes


def critical_batch(gpu: str | GpuSpec = "h100-sxm", dtype: str = "bf16", weight_bytes: float = 2.0) -> int:
    """Smallest batch at which a decode matmul reaches the GPU's ridge point (peak ÷ bandwidth) and becomes
    compute-bound: ⌈ridge × bytes per weight ÷ 2⌉. Introduced in the Drills part (roofline, Chapter 12)."""
    ridge = _spec(gpu).ridge_point(dtype)
    return math.ceil(ridge * weight_bytes / 2.0)


@dataclass(frozen=True)
class ServeGpus:
    """What :func:`min_gpus_serve` counted, in bytes (GB = 10⁹ where shown).

    Attributes:
        num_gpus: fewest GPUs (a power of two, as tensor/expert parallel groups are) that hold it all.
        weight_bytes: all parameters at the chosen precision.
        kv_bytes: KV cache of ``concurrency`` requests of ``context_len`` tokens (MLA's latent for DeepSeek).
        usable_bytes_per_gpu: GPU memory × ``utilization``.
    """

    num_gpus: int
    weight_bytes: float
    kv_bytes: float
    usable_bytes_per_gpu: float


def min_gpus_serve(model: str, gpu: str | GpuSpec = "h100-sxm", weights: str = "fp8", concurrency: int = 1,
                   context_len: int = 4096, kv_dtype: str = "fp16", utilization: float = 0.9) -> ServeGpus:
    """Fewest GPUs (power of two) whose memory × ``utilization`` holds the weights and the KV cache.

    Introduced in the Drills part. Weights: :func:`memlib.core.params.count_params` × bytes per weight
    (:data:`SERVE_WEIGHT_BYTES`); KV: :func:`memlib.core.serve.serve_kv_bytes_per_token` (MLA's compressed
    latent for DeepSeek-V2/V3, GQA heads otherwise) × concurrency × context. Activations, CUDA graphs and the
    replication of MLA's latent across tensor-parallel ranks are ignored: a lower bound.
    """
    check_choice("weights", weights, SERVE_WEIGHT_BYTES)
    spec = _spec(gpu)
    load_config(model)
    w = count_params(model).params * SERVE_WEIGHT_BYTES[weights]
    kv = float(serve_kv_bytes_per_token(model, kv_dtype)) * check_positive("concurrency", concurrency) \
        * check_positive("context_len", context_len)
    usable = spec.memory_bytes * _fraction("utilization", utilization)
    n = 1
    while n * usable < w + kv:
        n *= 2
    return ServeGpus(n, w, kv, usable)
