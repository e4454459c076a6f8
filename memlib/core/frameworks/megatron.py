"""Megatron-LM (Megatron-Core): bf16 params, the fp32 ``main_grad`` buffer, the distributed optimizer (Chapter 1).

Megatron-LM docs "Distributed Optimizer"; ``megatron/core/distributed/param_and_grad_buffer.py``,
``megatron/core/optimizer/distrib_optimizer.py``: bf16 params 2 + the fp32 ``main_grad`` buffer 4 + fp32 main
params, m, v 12 = 18 bytes/param; the distributed optimizer (ZeRO-1 here) shards the 12: 6 + 12/d; the bf16
params and the ``main_grad`` buffer stay whole. ``main_grad`` is one buffer, allocated with the model
(``_ParamAndGradBuffer``); each gradient is added into it as autograd makes it and then freed
(``distributed_data_parallel.py``, ``DistributedDataParallel._make_backward_post_hook``:
``param.main_grad.add_(param.grad.data)``, ``param.grad = None``), so the whole 4 B/param is live through the
backward pass, not only at the step. Its optimizer is fused Adam, whose main params' gradients are views of
``main_grad``: no step temporaries.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

from ..configs import ModelConfig
from ..setup import TrainingSetup
from ..terms import ActivationTerm
from .base import Framework, Saved

__all__ = ["Megatron", "MEGATRON", "megatron_core_activation_terms", "theoretical_layer_bytes"]


def theoretical_layer_bytes(seq_len: int, batch_size: int, hidden_size: int, ffn_hidden_size: int) -> int:
    """Megatron-LM's own activation bytes per layer: sbh(18 + 4f/h) (``megatron/training/
    theoretical_memory_usage.py``, ``compute_activation_memory``; Korthikanti et al. 2022's Table 2 with
    selective recomputation and a general MLP width f, counted before the tp split). Chapter 15."""
    return int(seq_len * batch_size * hidden_size * (18 + 4 * ffn_hidden_size / hidden_size))


def megatron_core_activation_terms(cfg: ModelConfig, batch_size: int, seq_len: int, act_bytes: int = 2,
                                   attention: str = "sdpa") -> list[ActivationTerm]:
    """What one Megatron-Core ``TransformerLayer`` saves for backward with TransformerEngine's fused kernels
    (``get_gpt_layer_with_transformer_engine_spec``), per GPU before the tp split. Chapter 15.

    From the source (Megatron-Core 0.12, TransformerEngine 2.x): ``TELayerNormColumnParallelLinear`` fuses the
    norm into linear_qkv and linear_fc1 and saves the norm input, its fp32 rstd and the normalized output (the
    GEMM input); the fused RoPE kernel saves only the frequencies; ``TEDotProductAttention`` (flash) saves q, k,
    v, the output (also ``linear_proj``'s input, one storage) and the fp32 log-sum-exp; the fused
    ``bias_swiglu`` saves fc1's output (gate and up, 2f); ``linear_fc2`` saves the SwiGLU output; the residual
    adds and ``hidden_dropout = 0`` save nothing. With ``attention="eager"`` (the local spec's unfused
    ``DotProductAttention``) ``FusedScaleMaskSoftmax`` saves the 16-bit softmax output, b·a·s², instead of the
    log-sum-exp. Per layer: sbh·(12 + 4·kv/h + 6f/h)·e/2 + the fp32 extras: 33.5·sbh for Llama-3.1-70B, where
    :func:`theoretical_layer_bytes`' 18 + 4f/h gives 32 (it counts one MLP matrix of width f and dropout masks).
    Dense models only (MoE layers keep transformers' terms).
    """
    b, s, e = batch_size, seq_len, act_bytes
    T, h, f, q, kv = b * s, cfg.hidden_size, cfg.intermediate_size, cfg.q_dim, cfg.kv_dim
    gated = cfg.mlp == "gated"
    core = (ActivationTerm("log-sum-exp (flash attention, fp32)", 4 * b * cfg.num_heads * s, "4·b·a·s")
            if attention == "sdpa" else
            ActivationTerm("softmax output (FusedScaleMaskSoftmax)", e * b * cfg.num_heads * s * s, "e·b·a·s²"))
    return [
        ActivationTerm("input norm input (residual stream)", e * T * h, "e·b·s·h"),
        ActivationTerm("norm rstd, two norms (fp32)", 2 * 4 * T, "8·b·s"),
        ActivationTerm("linear_qkv input (norm output)", e * T * h, "e·b·s·h"),
        ActivationTerm("q, k after RoPE and v", e * T * (q + 2 * kv), "e·b·s·(q + 2kv)"),
        ActivationTerm("attention output (linear_proj input)", e * T * q, "e·b·s·q"),
        core,
        ActivationTerm("pre-norm input (residual stream)", e * T * h, "e·b·s·h"),
        ActivationTerm("linear_fc1 input (norm output)", e * T * h, "e·b·s·h"),
        ActivationTerm("MLP fc1 output (SwiGLU input)", e * T * (2 * f if gated else f), "e·b·s·2f"),
        ActivationTerm("MLP fc2 input (activation output)", e * T * f, "e·b·s·f"),
    ]


class Megatron(Framework):
    """Megatron-LM: 2 + 4 + 12 bytes per parameter under mixed precision."""

    name: ClassVar[str] = "megatron"
    mixed_layout: ClassVar[tuple[float, float, float, float]] = (2.0, 4.0, 4.0, 4.0)
    sharded_optimizer: ClassVar[str] = "Megatron's distributed optimizer"

    def parallel_activation_terms(self, cfg: ModelConfig, setup: TrainingSetup) -> list[ActivationTerm]:
        """Megatron-Core's ``GPTModel`` with TransformerEngine (:func:`megatron_core_activation_terms`) for dense
        models; the loss side (vocab-parallel fp32 logits) and MoE models keep the transformers terms."""
        base = super().parallel_activation_terms(cfg, setup)
        if cfg.moe is not None or cfg.mla is not None or cfg.model_type not in (
                "llama", "mistral", "qwen2", "qwen3", "olmo2", "gemma"):
            return base
        e = 4 if setup.precision == "fp32" else 2
        return [t for t in base if not t.per_layer] + megatron_core_activation_terms(
            cfg, setup.batch_size, setup.seq_len, e, setup.attention)

    def backward_extra(self, cfg: ModelConfig, setup: TrainingSetup, saved: Saved, g_bytes: int, n: int,
                       layer_params: int, generic_peak: Callable[[int], int]) -> int:
        """``main_grad`` is one buffer, allocated with the model: all of it is live all along (none accumulates)."""
        return g_bytes + generic_peak(0)


#: The Megatron framework object.
MEGATRON = Megatron()
