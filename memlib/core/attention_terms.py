"""What a Llama-style attention block (rotary, GQA/MQA) saves for backward, shared by the estimators.

Pure Python. :func:`memlib.core.estimate.activation_terms` (Llama, Mistral, Qwen2/3, Gemma, OLMo 2) and
:func:`memlib.core.families_moe.moe_activation_terms` (Mixtral, Qwen-MoE) call :func:`gqa_attention_terms` for their
attention; the family-specific parts (norms, MLP or experts) stay with them.
"""
from __future__ import annotations

from collections.abc import Callable

from .configs import ModelConfig

#: ``add(name, bytes, formula)``: how a caller collects one per-layer term.
AddTerm = Callable[[str, int, str], None]


def gqa_attention_terms(add: AddTerm, cfg: ModelConfig, *, batch_size: int, seq_len: int, act_bytes: int,
                        attention: str, dropout: bool, window: object = None) -> None:
    """Add one layer's attention terms, as transformers' ``LlamaAttention`` and torch's kernels keep them.

    sdpa (the flash kernel): q and k after rotary, v, the output and the fp32 log-sum-exp. A sliding window no
    longer than the sequence makes transformers pass a boolean (b, 1, s, s) mask; torch's SDPA turns it into an
    additive mask in the activation dtype, which every layer's kernel keeps for backward, and with a mask
    transformers also repeats k and v to all heads (GQA). eager: ``repeat_kv`` copies k and v to every head for
    GQA/MQA; the fp32 softmax, its 16-bit cast, the dropout mask and the contiguous output before o_proj.

    Args:
        add: collects ``(name, bytes, formula)``.
        cfg: the model.
        batch_size: b.
        seq_len: s.
        act_bytes: bytes per activation element (4 in fp32, else 2).
        attention: ``"sdpa"`` or ``"eager"``.
        dropout: apply the config's attention dropout (training).
        window: the sliding window of every layer (Mistral, Mixtral), or None.
    """
    b, s, e = batch_size, seq_len, act_bytes
    T, a = b * s, cfg.num_heads
    q, kv = cfg.q_dim, cfg.kv_dim
    rep = cfg.num_heads // cfg.num_kv_heads
    if attention == "sdpa":
        add("q, k after rotary; v", e * T * (q + 2 * kv), f"{e}·bs(a+2·a_kv)·d")
        add("attention output", e * T * q, f"{e}·bs·a·d")
        add("log-sum-exp (fp32)", 4 * b * a * s, "4·bas")
        if isinstance(window, int) and s >= window:
            add("sliding-window additive mask", e * b * s * s, f"{e}·bs²")
            if rep > 1:
                add("k, v repeated to all heads (mask given)", 2 * e * T * (q - kv), f"2·{e}·bs(a − a_kv)·d")
    else:
        kv_saved = q if rep > 1 else kv  # repeat_kv makes full-size copies of k and v for GQA/MQA
        add("q after rotary; k, v (repeated for GQA)", e * T * (q + 2 * kv_saved),
            f"{e}·bs·(a + 2·{'a' if rep > 1 else 'a_kv'})·d")
        eager_softmax_terms(add, b=b, a=a, s=s, e=e, dropout=dropout and cfg.attn_dropout > 0)
        add("attention output (contiguous, o_proj input)", e * T * q, f"{e}·bs·a·d")


def eager_softmax_terms(add: AddTerm, *, b: int, a: int, s: int, e: int, dropout: bool) -> None:
    """Add eager attention's softmax terms: transformers' fp32 softmax probabilities, their cast to the activation
    dtype (none in fp32) and, with ``dropout``, the attention dropout's boolean mask (b·a·s² each, times bytes)."""
    add("softmax probabilities (fp32)", 4 * b * a * s * s, "4·bas²")
    if e != 4:
        add("softmax probabilities cast to 16 bits", e * b * a * s * s, f"{e}·bas²")
    if dropout:
        add("attention dropout mask (bool)", b * a * s * s, "bas²")
