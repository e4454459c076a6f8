"""Chapter 12's book helpers: the FLOP formulas of Kaplan, Megatron and Narayanan, operation intensities, profilers.

Book helpers (moved from ``memlib.core.flops`` and ``memlib.measure.profiling``): only Chapter 12 uses them. The
FLOP formulas and intensities are pure Python; :func:`count_training_flops_by_depth`, :func:`deepspeed_profile`
and :func:`meta_memory_snapshot` run torch (and DeepSpeed's flops profiler), imported lazily, inside the
functions.
"""
from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.configs import ModelConfig, load_config
from ..core.errors import check_positive
from ..core.flops import ModelLike, OpIntensity, _positive_float, matmul_params, training_flops, utilization
from ..core.params import count_params
from ..measure.profiling import MeasuredFlops, _torch, count_training_flops


def _non_embedding_params(cfg: ModelConfig) -> int:
    """Kaplan's N: all parameters except the token and position embeddings (and an untied LM head)."""
    pc = count_params(cfg)
    return pc.params - pc.embeddings - pc.lm_head


def kaplan_flops(model: ModelLike, batch_size: int, seq_len: int, *, corrected: bool = False) -> float:
    """Kaplan et al.'s C ≈ 6N FLOPs per training token, times the tokens of the step.

    Introduced in Chapter 12. Kaplan et al. (2020, Table 1) take N as the **non-embedding** parameters and
    C_forward = 2N + 2·n_layer·n_ctx·d_attn, then drop the attention term: C ≈ 6N per token.

    Args:
        model: shipped name, config.json path, dict or ModelConfig.
        batch_size: sequences per step.
        seq_len: tokens per sequence (n_ctx).
        corrected: use N = :func:`matmul_params` (the LM head's matmul included, norms and biases out) and
            keep Kaplan's own attention term 6·n_layer·n_ctx·d_attn per token. That term counts half of the
            T×T scores (the causal half), so the corrected formula matches ``training_flops(...,
            attention="causal")`` to within 1/T, and a full (math-path) count after adding the other half.

    Returns:
        FLOPs of the step.
    """
    cfg = load_config(model)
    tokens = check_positive("batch_size", batch_size) * check_positive("seq_len", seq_len)
    if not corrected:
        return 6.0 * _non_embedding_params(cfg) * tokens
    return (6.0 * matmul_params(cfg) + 6.0 * cfg.num_layers * seq_len * cfg.q_dim) * tokens


def megatron_flops(model: ModelLike, batch_size: int, seq_len: int) -> float:
    """Model FLOPs per iteration, 72·B·L·s·h²·(1 + s/6h + V/12hL) (Korthikanti et al. 2022).

    Introduced in Chapter 12. Assumes GPT-style layers: multi-head attention with four h×h projections, a
    4h-wide two-matrix MLP, all scores counted, and the V×h LM head. Exact for GPT-2; for GQA/SwiGLU models
    it counts the wrong per-layer matrices (see :func:`training_flops`).

    Args:
        model: shipped name, config.json path, dict or ModelConfig.
        batch_size: B.
        seq_len: s.

    Returns:
        FLOPs of the step.
    """
    cfg = load_config(model)
    b, s = check_positive("batch_size", batch_size), check_positive("seq_len", seq_len)
    h, L, V = cfg.hidden_size, cfg.num_layers, cfg.vocab_size
    return 72.0 * b * L * s * h * h * (1 + s / (6 * h) + V / (12 * h * L))


def narayanan_flops(model: ModelLike, batch_size: int, seq_len: int) -> float:
    """Narayanan et al.'s 96·B·s·l·h²·(1 + s/6h + V/16lh): FLOPs per iteration **with full recomputation**.

    Introduced in Chapter 12. Narayanan et al. (2021) count the extra forward of the layers that activation
    recomputation runs (4 passes instead of 3), so this is a hardware count (HFU), not a model count (MFU).
    Arguments and result as :func:`megatron_flops`'s.
    """
    cfg = load_config(model)
    b, s = check_positive("batch_size", batch_size), check_positive("seq_len", seq_len)
    h, L, V = cfg.hidden_size, cfg.num_layers, cfg.vocab_size
    return 96.0 * b * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h))


def throughput_utilization(samples_per_s_per_gpu: float, seq_len: int, flops_per_token: float,
                           peak_flops_per_s: float) -> float:
    """The Strategies notes' second method: throughput (samples/s/GPU × max_length) over the throughput at peak.

    Introduced in Chapter 12. Algebraically the same as MFU: tokens/s × FLOPs/token ÷ peak.

    Args:
        samples_per_s_per_gpu: measured training samples per second per GPU.
        seq_len: tokens per sample (max_length).
        flops_per_token: training FLOPs per token.
        peak_flops_per_s: the GPU's dense peak.

    Returns:
        A fraction.
    """
    tokens_per_s = _positive_float("samples_per_s_per_gpu", samples_per_s_per_gpu) * check_positive(
        "seq_len", seq_len)
    return tokens_per_s / tokens_per_second_at_peak(flops_per_token, peak_flops_per_s)


def tokens_per_second_at_peak(flops_per_token: float, peak_flops_per_s: float) -> float:
    """Tokens per second one GPU would train at 100 % utilization (the Strategies notes' "paper throughput").

    Introduced in Chapter 12.

    Args:
        flops_per_token: training FLOPs per token (≈ 6N, or ``training_flops(...).per_token``).
        peak_flops_per_s: the GPU's dense peak.

    Returns:
        Tokens per second per GPU.
    """
    return _positive_float("peak_flops_per_s", peak_flops_per_s) / _positive_float("flops_per_token",
                                                                                   flops_per_token)


def matmul_intensity(m: int, k: int, n: int, dtype_bytes: float = 2) -> float:
    """Arithmetic intensity of an (m×k)·(k×n) matmul: 2mkn / (bytes of A, B and C).

    Introduced in Chapter 12. For m = k = n it is n/3 in 16-bit: large square matmuls are compute-bound.
    """
    m, k, n = (check_positive(x, v) for x, v in (("m", m), ("k", k), ("n", n)))
    return 2.0 * m * k * n / (_positive_float("dtype_bytes", dtype_bytes) * (m * k + k * n + m * n))


def op_intensities(model: ModelLike, batch_size: int = 1, seq_len: int = 2048,
                   dtype_bytes: int = 2) -> list[OpIntensity]:
    """FLOPs, bytes and arithmetic intensity of the main forward ops of one layer (plus the LM head).

    Introduced in Chapter 12. Best case: every operand read once, every result written once (what a perfect
    kernel moves). Attention is given twice: standard (the T×T scores and probabilities written and read in
    ``dtype_bytes``) and fused (FlashAttention: only Q, K, V and the output move). Element-wise FLOPs are
    nominal (SiLU ≈ 4 per element, RMSNorm ≈ 4, softmax ≈ 5); only their order of magnitude matters here.

    Args:
        model: shipped name, config.json path, dict or ModelConfig.
        batch_size: B.
        seq_len: T (tokens per sequence; the matmuls see B·T rows).
        dtype_bytes: bytes per element (2 for bf16).

    Returns:
        One entry per op.
    """
    cfg = load_config(model)
    b, s = check_positive("batch_size", batch_size), check_positive("seq_len", seq_len)
    e = _positive_float("dtype_bytes", dtype_bytes)
    t = b * s
    h, f, q, kv, V = cfg.hidden_size, cfg.intermediate_size, cfg.q_dim, cfg.kv_dim, cfg.vocab_size

    def mm(name: str, k: int, n: int) -> OpIntensity:
        return OpIntensity(name, "matmul", 2.0 * t * k * n, e * (t * k + k * n + t * n))

    ops = [mm("q projection", h, q), mm("k/v projection", h, kv), mm("o projection", q, h),
           mm("MLP up", h, f), mm("MLP down", f, h), mm("LM head", h, V)]
    heads, d, kvh = cfg.num_heads, cfg.head_dim, cfg.num_kv_heads
    attn_flops = 4.0 * b * heads * s * s * d
    qkvo = e * b * s * d * (2 * heads + 2 * kvh)
    ops.append(OpIntensity("attention (standard)", "attention", attn_flops, qkvo + 2 * 2 * e * b * heads * s * s))
    ops.append(OpIntensity("attention (fused)", "attention", attn_flops, qkvo))
    ops.append(OpIntensity("softmax", "elementwise", 5.0 * b * heads * s * s, 2 * e * b * heads * s * s))
    if cfg.mlp == "gated":
        ops.append(OpIntensity("SiLU(gate) × up", "elementwise", 5.0 * t * f, 3 * e * t * f))
    else:
        ops.append(OpIntensity("GELU", "elementwise", 8.0 * t * f, 2 * e * t * f))
    ops.append(OpIntensity("residual add", "elementwise", 1.0 * t * h, 3 * e * t * h))
    ops.append(OpIntensity("RMSNorm" if cfg.norm == "rmsnorm" else "LayerNorm", "norm", 4.0 * t * h,
                           2 * e * t * h + e * h))
    return ops


def _layer_key(cfg: ModelConfig) -> str:
    return "n_layer" if cfg.model_type == "gpt2" else "num_hidden_layers"


def count_training_flops_by_depth(model: ModelLike, *, batch_size: int = 1, seq_len: int = 512,
                                  recompute: str = "none") -> tuple[int, MeasuredFlops, MeasuredFlops]:
    """FLOPs of the full-depth model, measured at 1 and 2 layers and extrapolated exactly.

    Introduced in Chapter 12. All layers of a transformer are identical and their FLOPs do not depend on their
    position, so the step's FLOPs are affine in the depth: F(L) = F(1) + (L − 1)·(F(2) − F(1)). Two small
    measurements give the 70B model's count in a fraction of a second (Chapter 12 checks one full-depth model
    directly).

    Returns:
        (extrapolated total at the config's depth, measurement at 1 layer, measurement at 2 layers).
    """
    cfg = load_config(model)
    key = _layer_key(cfg)
    one, two = (count_training_flops(cfg, batch_size=batch_size, seq_len=seq_len, recompute=recompute,
                                     overrides={key: n}) for n in (1, 2))
    return one.total + (cfg.num_layers - 1) * (two.total - one.total), one, two


@dataclass(frozen=True)
class DeepSpeedProfile:
    """What ``deepspeed.profiling.flops_profiler.get_model_profile`` returns for one forward pass. Chapter 12.

    Attributes:
        flops: FLOPs of one forward pass (matmuls and the element-wise functionals it patches).
        macs: multiply-accumulates of one forward pass.
        params: parameters it counted.
        text: the profiler's printed report, when asked for (``text=True``); holds timings.
    """

    flops: int
    macs: int
    params: int
    text: str = ""


def deepspeed_profile(model: ModelLike, *, batch_size: int = 2, seq_len: int = 64,
                      overrides: dict[str, Any] | None = None, text: bool = False,
                      seed: int = 0) -> DeepSpeedProfile:
    """Run DeepSpeed's flops profiler on the model (real CPU tensors: keep it small).

    Introduced in Chapter 12. ``get_model_profile`` patches ``torch.nn.functional`` and tensor methods, runs
    one warm-up and one profiled **forward** pass, and reports FLOPs (2 per multiply-accumulate, plus
    element-wise ops such as softmax, SiLU and norms), MACs and parameters. A training step is about 3× the
    forward FLOPs.

    Args:
        model: shipped name, config.json path, dict or ModelConfig.
        batch_size: sequences.
        seq_len: tokens per sequence.
        overrides: config fields to replace.
        text: also return the printed per-module report (it contains timings).
        seed: seed for weights and inputs.

    Returns:
        FLOPs, MACs, parameters (and the report).
    """
    torch = _torch()
    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")  # silences DeepSpeed's "setting accelerator" warning
    try:
        from deepspeed.profiling.flops_profiler import get_model_profile
    except ImportError:  # pragma: no cover
        raise ImportError("deepspeed_profile needs DeepSpeed: pip install deepspeed") from None
    from ..measure.trace import build_model

    torch.manual_seed(seed)
    net = build_model(model, device="cpu", dtype="fp32", attention="eager", overrides=overrides)
    ids = torch.randint(0, int(net.config.vocab_size), (check_positive("batch_size", batch_size),
                                                        check_positive("seq_len", seq_len)))
    report = ""
    with tempfile.TemporaryDirectory() as tmp:
        out_file = str(Path(tmp) / "ds_profile.txt") if text else None
        flops, macs, params = get_model_profile(net, kwargs={"input_ids": ids}, print_profile=text,
                                                detailed=text, module_depth=2, top_modules=3, warm_up=1,
                                                as_string=False, output_file=out_file)
        if out_file is not None:
            report = Path(out_file).read_text()
    return DeepSpeedProfile(flops=int(flops), macs=int(macs), params=int(params), text=report)


def meta_memory_snapshot(model: ModelLike, *, batch_size: int = 1, seq_len: int = 512, dtype: str = "bf16",
                         steps: int = 2, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """A snapshot-format dict of a training run on the ``meta`` device: what a CUDA recording would hold.

    Introduced in Chapter 12. A :class:`memlib.measure.tracker.MemoryTracker` logs every tensor storage created
    (``alloc``) and freed (``free_completed``), from model construction on, in the layout of
    ``torch.cuda.memory._snapshot()`` (``device_traces[0]`` events with ``action``, ``addr``, ``size``,
    ``time_us``; ``segments`` with the blocks alive at the end). ``time_us`` is an event counter, not time. No
    allocator: no rounding, no caching, no fragmentation, no CUDA context. Phase boundaries (event index where
    each forward, backward and optimizer step starts) are in ``"phases"``.
    """
    torch = _torch()
    from ..measure.trace import _patched, build_model
    from ..measure.tracker import MemoryTracker

    events: list[dict[str, Any]] = []

    def log(action: str, key: int, size: int) -> None:
        events.append({"action": "alloc" if action == "alloc" else "free_completed", "addr": key, "size": size,
                       "time_us": len(events), "stream": 0, "frames": []})

    tracker = MemoryTracker("meta", on_event=log)
    phases: list[tuple[str, int]] = []
    with tracker.mode(cache=False):
        net = build_model(model, device="meta", dtype=dtype, attention="sdpa", overrides=overrides)
    tracker.track_model(net, grad_hooks=False)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-4, foreach=True)
    with _patched(True), tracker.mode(cache=False):
        ids = torch.randint(0, int(net.config.vocab_size), (batch_size, seq_len), device="meta")  # (B, T)
        for _ in range(check_positive("steps", steps)):
            phases.append(("forward", len(events)))
            loss = net(input_ids=ids, labels=ids).loss
            phases.append(("backward", len(events)))
            loss.backward()
            del loss
            phases.append(("optimizer", len(events)))
            opt.step()
            opt.zero_grad(set_to_none=True)
        phases.append(("end", len(events)))
        for state in opt.state.values():  # step counters live on the host on a GPU
            tracker.forget(state.get("step"))
    tracker.on_event = None  # finalizers that fire after the return (model and optimizer dying) must not log
    sizes = [nbytes for nbytes, _ in tracker.live.values()]
    blocks = [{"size": s, "state": "active_allocated"} for s in sizes]
    return {"segments": [{"device": 0, "blocks": blocks, "total_size": sum(sizes)}],
            "device_traces": [list(events)], "phases": list(phases),
            "source": "meta-device trace (memlib), not CUDA"}
