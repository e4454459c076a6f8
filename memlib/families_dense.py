"""Dense families of issue 20 — Gemma 2, Gemma 3, Phi-3, GPT-NeoX, Falcon: parameters and saved activations.

Pure Python (no torch): :func:`memlib.params.count_params` and :func:`memlib.estimate.activation_terms` dispatch
here for :data:`memlib.configs.DENSE_FAMILIES`. Every term is read off the transformers 5 implementation named
beside it (``transformers/models/<family>/modeling_<family>.py``) and checked against :mod:`memlib.trace`
(``tests/test_families.py``, ``bench/accuracy.py --families``). Introduced with Chapter 1's model families.
"""
from __future__ import annotations

from collections.abc import Callable

from .configs import ModelConfig
from .errors import MemlibError

__all__ = ["param_tensors", "dense_activation_terms", "check_estimable"]

#: One term: (name, bytes, formula, per_layer) — :class:`memlib.estimate.ActivationTerm`'s fields.
Add = Callable[..., None]


def param_tensors(cfg: ModelConfig) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
    """Element counts of the parameter tensors: (one decoder layer, everything outside the layers).

    Each entry is (component, numel) with component one of ``attention``, ``mlp``, ``norms`` (in a layer) or
    ``embeddings``, ``norms``, ``lm_head`` (outside). The layouts are the modules' ``__init__``:
    ``Gemma2DecoderLayer`` (four RMSNorms: input, post_attention, pre_feedforward, post_feedforward),
    ``Gemma3Attention`` (``q_norm``/``k_norm`` over head_dim), ``Phi3Attention.qkv_proj`` and
    ``Phi3MLP.gate_up_proj`` (fused), ``GPTNeoXAttention.query_key_value`` (fused, biased), ``GPTNeoXLayer``
    (two LayerNorms with biases), ``FalconAttention.query_key_value`` (q + 2 KV heads for multi-query) and
    ``FalconDecoderLayer`` (one LayerNorm with ``parallel_attn``, ``ln_attn`` + ``ln_mlp`` in the new
    decoder architecture, input + post-attention LayerNorms otherwise).
    """
    h, q, kv, f, V = cfg.hidden_size, cfg.q_dim, cfg.kv_dim, cfg.intermediate_size, cfg.vocab_size
    t = cfg.model_type
    layer: list[tuple[str, int]] = []
    if t in ("gemma2", "gemma3_text"):
        layer += [("attention", h * q), ("attention", h * kv), ("attention", h * kv), ("attention", q * h)]
        if cfg.qkv_bias:
            layer += [("attention", q), ("attention", kv), ("attention", kv), ("attention", h)]
        if cfg.qk_norm:
            layer += [("norms", cfg.head_dim), ("norms", cfg.head_dim)]
        layer += [("mlp", h * f), ("mlp", h * f), ("mlp", f * h)]
        layer += [("norms", h)] * 4
    elif t == "phi3":
        layer += [("attention", h * (q + 2 * kv)), ("attention", q * h), ("mlp", h * 2 * f), ("mlp", f * h)]
        layer += [("norms", h)] * 2
    else:  # gpt_neox, falcon: fused query_key_value, dense, two-matrix MLP, LayerNorms with biases
        layer += [("attention", h * (q + 2 * kv))] + ([("attention", q + 2 * kv)] if cfg.qkv_bias else [])
        layer += [("attention", q * h)] + ([("attention", h)] if cfg.out_bias else [])
        layer += [("mlp", h * f)] + ([("mlp", f)] if cfg.mlp_bias else [])
        layer += [("mlp", f * h)] + ([("mlp", h)] if cfg.mlp_bias else [])
        n_norms = 2 if (t == "gpt_neox" or not cfg.parallel_residual) else cfg.num_norms_in
        layer += [("norms", h)] * (2 * n_norms)  # weight and bias each
    outside: list[tuple[str, int]] = [("embeddings", V * h)]
    outside += [("norms", h)] * (2 if cfg.norm == "layernorm" else 1)
    if not cfg.tie_word_embeddings:
        outside += [("lm_head", V * h)]
    return layer, outside
