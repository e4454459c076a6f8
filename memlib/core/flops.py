"""FLOPs of a training step (PaLM, architecture-exact), MFU/HFU and roofline arithmetic (Chapter 12).

Pure Python: no torch. Every count is in FLOPs (one multiply or one add is one FLOP, so a multiply-accumulate
is two), for **one training step** of ``batch_size`` sequences of ``seq_len`` tokens unless the name says
"per token". A training step is forward + backward; the backward pass of a matmul costs two matmuls of the
same size (gradient with respect to the input and to the weight), hence the factor 3 = 1 + 2 in all formulas.

The architecture-exact count (:func:`training_flops`) counts what ``torch.utils.flop_counter.FlopCounterMode``
counts on the transformers models built from our configs: the matmuls (``mm``, ``addmm``, ``bmm``, attention),
nothing element-wise. ``memlib.measure.profiling.count_training_flops`` measures it; the tests pin the two together.
Kaplan's, Megatron's and Narayanan's formulas, throughput utilization and the intensities of a layer's
operations, which only Chapter 12 uses, are book helpers (:mod:`memlib._book.ch12_profiling`).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .configs import ModelConfig, load_config
from .errors import MemlibError, check_choice, check_positive
from .params import count_params

__all__ = [
    "FlopBreakdown",
    "OpIntensity",
    "ATTENTION_COUNTS",
    "matmul_params",
    "palm_flops",
    "training_flops",
    "forward_flops",
    "utilization",
    "mfu",
    "hfu",
    "attainable_flops",
    "ridge_point",
]

ModelLike = str | Path | dict[str, Any] | ModelConfig

#: How attention's two matmuls (QKᵀ and PV) are counted: ``"full"`` all T×T scores, what a math/eager
#: implementation computes and what FlopCounterMode and PaLM count; ``"causal"`` only the T(T+1)/2 scores a
#: causal kernel (FlashAttention) needs to compute.
ATTENTION_COUNTS = ("full", "causal", "none")


def _positive_float(name: str, value: float) -> float:
    if isinstance(value, bool):
        raise MemlibError(f"{name} must be a positive number, got {value!r}")
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise MemlibError(f"{name} must be a positive number, got {value!r}") from None
    if not v > 0 or v != v or v == float("inf"):
        raise MemlibError(f"{name} must be a positive number, got {value!r}")
    return v


@dataclass(frozen=True)
class FlopBreakdown:
    """FLOPs of one training step of a transformers causal LM, by component. Introduced in Chapter 12.

    Attributes:
        dense: projections and MLP matrices of all layers (forward + backward).
        attention: the QKᵀ and PV matmuls of all layers (forward + backward).
        lm_head: the output projection to the vocabulary (forward + backward).
        recompute: the extra forward of the layers under full activation recomputation (hardware FLOPs only).
        tokens: tokens in the step (batch_size × seq_len).
    """

    dense: int
    attention: int
    lm_head: int
    recompute: int
    tokens: int

    @property
    def model_flops(self) -> int:
        """FLOPs the model needs: what MFU counts (recomputation excluded)."""
        return self.dense + self.attention + self.lm_head

    @property
    def hardware_flops(self) -> int:
        """FLOPs the hardware executes: what HFU counts (recomputation included)."""
        return self.model_flops + self.recompute

    @property
    def per_token(self) -> float:
        """Model FLOPs per token."""
        return self.model_flops / self.tokens

    def as_dict(self) -> dict[str, int]:
        """JSON-ready dict of the components and both totals."""
        return {"dense": self.dense, "attention": self.attention, "lm_head": self.lm_head,
                "recompute": self.recompute, "tokens": self.tokens, "model_flops": self.model_flops,
                "hardware_flops": self.hardware_flops}


def matmul_params(model: ModelLike, *, include_lm_head: bool = True) -> int:
    """Number of parameters that take part in a matmul: N for the 6N rule.

    Introduced in Chapter 12. The projection and MLP matrices of every layer, plus the LM head (tied or not:
    a tied head still does a V×h matmul). Excluded: the embedding lookup (an index, no FLOPs), learned
    position embeddings, norms and biases (element-wise).

    Args:
        model: shipped name, config.json path, dict or ModelConfig.
        include_lm_head: count the V×h output projection.

    Returns:
        The parameter count.
    """
    cfg = load_config(model)
    h, f = cfg.hidden_size, cfg.intermediate_size
    per_layer = 2 * h * cfg.q_dim + 2 * h * cfg.kv_dim + (3 if cfg.mlp == "gated" else 2) * h * f
    head = cfg.vocab_size * h if include_lm_head else 0
    return cfg.num_layers * per_layer + head


def palm_flops(model: ModelLike, batch_size: int, seq_len: int, *, n_params: int | None = None) -> float:
    """PaLM's 6N + 12·L·H·Q·T FLOPs per token (Chowdhery et al. 2022, Appendix B), times the tokens.

    Introduced in Chapter 12. L layers, H query heads of dimension Q, sequence length T. The attention term
    counts all T×T scores (forward 4·L·H·Q·T, ×3 for training).

    Args:
        model: shipped name, config.json path, dict or ModelConfig.
        batch_size: sequences per step.
        seq_len: T.
        n_params: N. Default :func:`matmul_params` (LM head in, embedding lookup out), with which the formula
            is exact for our models; pass ``count_params(model).params`` for the headline parameter count.

    Returns:
        FLOPs of the step.
    """
    cfg = load_config(model)
    tokens = check_positive("batch_size", batch_size) * check_positive("seq_len", seq_len)
    n = matmul_params(cfg) if n_params is None else check_positive("n_params", n_params)
    return (6.0 * n + 12.0 * cfg.num_layers * cfg.num_heads * cfg.head_dim * seq_len) * tokens


def _attention_forward(cfg: ModelConfig, batch_size: int, seq_len: int, attention: str) -> int:
    """QKᵀ and PV of all heads of one layer, forward: 2 matmuls × 2·T·T·Q FLOPs per head."""
    if attention == "none":
        return 0
    pairs = seq_len * seq_len if attention == "full" else seq_len * (seq_len + 1) // 2
    return 4 * batch_size * pairs * cfg.q_dim


def forward_flops(model: ModelLike, batch_size: int, seq_len: int, *, attention: str = "full") -> FlopBreakdown:
    """Architecture-exact FLOPs of one **forward** pass (what DeepSpeed's profiler reports, minus its
    element-wise ops). Introduced in Chapter 12. See :func:`training_flops` for the arguments."""
    check_choice("attention", attention, ATTENTION_COUNTS)
    cfg = load_config(model)
    b, s = check_positive("batch_size", batch_size), check_positive("seq_len", seq_len)
    tokens = b * s
    dense = 2 * tokens * matmul_params(cfg, include_lm_head=False)
    attn = cfg.num_layers * _attention_forward(cfg, b, s, attention)
    head = 2 * tokens * cfg.vocab_size * cfg.hidden_size
    return FlopBreakdown(dense=dense, attention=attn, lm_head=head, recompute=0, tokens=tokens)


def training_flops(model: ModelLike, batch_size: int, seq_len: int, *, attention: str = "full",
                   recompute: str = "none") -> FlopBreakdown:
    """Architecture-exact matmul FLOPs of one training step (forward + backward) of our transformers models.

    Introduced in Chapter 12. Per token and layer, forward: 2 FLOPs per weight of the q, k, v, o projections
    (k and v are ``num_kv_heads × head_dim`` wide: GQA) and of the MLP matrices (three for SwiGLU/GeGLU, two
    for GPT-2); attention 4·T·Q·H per token for all scores (``"full"``) or the causal T(T+1)/2 pairs; the LM
    head 2·h·V. The backward pass costs twice the forward. Equal to FlopCounterMode's count on the transformers
    model with the math/eager attention (tested for every shipped config).

    Args:
        model: shipped name, config.json path, dict or ModelConfig.
        batch_size: sequences per step (B).
        seq_len: tokens per sequence (T).
        attention: ``"full"``, ``"causal"`` or ``"none"`` (see :data:`ATTENTION_COUNTS`).
        recompute: ``"none"`` or ``"full"`` (one extra forward of every layer, not of the LM head).

    Returns:
        The breakdown; ``model_flops`` for MFU, ``hardware_flops`` for HFU.
    """
    check_choice("recompute", recompute, ("none", "full"))
    fwd = forward_flops(model, batch_size, seq_len, attention=attention)
    extra = fwd.dense + fwd.attention if recompute == "full" else 0
    return FlopBreakdown(dense=3 * fwd.dense, attention=3 * fwd.attention, lm_head=3 * fwd.lm_head,
                         recompute=extra, tokens=fwd.tokens)


# ----------------------------------------------------------------------------------------------------------
# Utilization
# ----------------------------------------------------------------------------------------------------------


def utilization(achieved_flops_per_s: float, peak_flops_per_s: float) -> float:
    """Achieved FLOP/s over the peak FLOP/s: the Strategies notes' "GPU utilization" (100 / 312 = 0.32).

    Introduced in Chapter 12.

    Args:
        achieved_flops_per_s: measured FLOP/s (per GPU).
        peak_flops_per_s: the GPU's dense peak for the dtype used (per GPU).

    Returns:
        A fraction (0.32 for 32 %).
    """
    return _positive_float("achieved_flops_per_s", achieved_flops_per_s) / _positive_float(
        "peak_flops_per_s", peak_flops_per_s)


def mfu(model_flops_per_step: float, step_time_s: float, peak_flops_per_s: float, num_gpus: int = 1) -> float:
    """Model FLOPs utilization: the FLOPs the model needs per step, over step time × peak × GPUs.

    Introduced in Chapter 12 (PaLM's definition). Recomputation does not count: it is not needed by the model.

    Args:
        model_flops_per_step: e.g. ``training_flops(...).model_flops`` for the global batch.
        step_time_s: seconds per step.
        peak_flops_per_s: dense peak of one GPU.
        num_gpus: GPUs that share the step.

    Returns:
        A fraction.
    """
    achieved = _positive_float("model_flops_per_step", model_flops_per_step) / _positive_float(
        "step_time_s", step_time_s)
    return utilization(achieved / check_positive("num_gpus", num_gpus), peak_flops_per_s)


def hfu(hardware_flops_per_step: float, step_time_s: float, peak_flops_per_s: float, num_gpus: int = 1) -> float:
    """Hardware FLOPs utilization: like :func:`mfu`, but with the FLOPs executed (recomputation included).

    Introduced in Chapter 12. HFU ≥ MFU; they are equal without recomputation.
    """
    return mfu(hardware_flops_per_step, step_time_s, peak_flops_per_s, num_gpus)


# ----------------------------------------------------------------------------------------------------------
# Roofline
# ----------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class OpIntensity:
    """FLOPs and memory traffic of one operation. Introduced in Chapter 12.

    Attributes:
        name: operation.
        kind: ``"matmul"``, ``"attention"``, ``"elementwise"`` or ``"norm"``.
        flops: FLOPs of the operation (forward).
        bytes: bytes read from and written to GPU memory (each operand once: the best case).
    """

    name: str
    kind: str
    flops: float
    bytes: float

    @property
    def intensity(self) -> float:
        """Arithmetic intensity, FLOPs per byte."""
        return self.flops / self.bytes


def ridge_point(peak_flops_per_s: float, bandwidth_bytes_per_s: float) -> float:
    """The roofline's ridge: the intensity (FLOP/byte) above which a kernel can reach the peak.

    Introduced in Chapter 12 (Williams et al. 2009).
    """
    return _positive_float("peak_flops_per_s", peak_flops_per_s) / _positive_float("bandwidth_bytes_per_s",
                                                                                   bandwidth_bytes_per_s)


def attainable_flops(intensity: float, peak_flops_per_s: float, bandwidth_bytes_per_s: float) -> float:
    """The roofline: min(peak, intensity × bandwidth) FLOP/s. Introduced in Chapter 12."""
    return min(_positive_float("peak_flops_per_s", peak_flops_per_s),
               _positive_float("intensity", intensity) * _positive_float("bandwidth_bytes_per_s",
                                                                         bandwidth_bytes_per_s))


