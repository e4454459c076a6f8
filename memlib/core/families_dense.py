"""Dense families of issue 20 — Gemma 2, Gemma 3, Phi-3, GPT-NeoX, Falcon: parameters and saved activations.

Pure Python (no torch): :func:`memlib.core.params.count_params` and :func:`memlib.core.estimate.activation_terms` dispatch
here for :data:`memlib.core.configs.DENSE_FAMILIES`. Every term is read off the transformers 5 implementation named
beside it (``transformers/models/<family>/modeling_<family>.py``) and checked against :mod:`memlib.measure.trace`
(``tests/test_families.py``, ``bench/accuracy.py --families``). Introduced with Chapter 1's model families.
"""
from __future__ import annotations

from collections.abc import Callable

from .attention_terms import eager_softmax_terms
from .configs import DENSE_FAMILIES, ModelConfig
from .errors import MemlibError
from .terms import ParamCount

__all__ = ["param_tensors", "dense_activation_terms", "check_estimable", "count_params_dense"]

#: One term: (name, bytes, formula, per_layer) — :class:`memlib.core.estimate.ActivationTerm`'s fields.
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


def check_estimable(cfg: ModelConfig, attention: str) -> None:
    """Raise :class:`MemlibError` for the settings whose activations memlib has not derived.

    Gemma 2 has no SDPA path in transformers 5 (``Gemma2ForCausalLM`` refuses ``attn_implementation="sdpa"``:
    its attention logits are soft-capped); Falcon with ALiBi runs its own attention path, not derived.
    """
    if cfg.model_type == "gemma2" and attention == "sdpa":
        raise MemlibError("attention 'sdpa' does not exist for gemma2 in transformers (its attention logits are "
                          "soft-capped: Gemma2ForCausalLM runs eager only); expected attention: eager")
    if cfg.alibi:
        raise MemlibError("falcon with alibi=true is not derived (FalconAttention's ALiBi path); expected a config "
                          "with alibi false (rotary), or trace it: memlib trace")


def _attention_terms(cfg: ModelConfig, add: Add, *, b: int, s: int, e: int, attention: str, dropout: bool,
                     kind: str, share: float) -> None:
    """Attention core of one layer (``share``: the fraction of layers of this ``kind``).

    eager (``eager_attention_forward`` in the Gemma/Phi-3/GPT-NeoX modules, ``FalconAttention.forward``): the
    products ``q @ kᵀ`` and ``p @ v`` save q and contiguous copies of k and v repeated to every head (repeat_kv,
    Falcon's broadcast), soft-capping saves its tanh output, the fp32 softmax (bf16 in Falcon: ``dtype=
    hidden_states.dtype``) its output, the cast probabilities feed ``p @ v``; the output projection keeps a
    contiguous copy of the merged heads. sdpa: the flash kernel keeps q, k, v, the output and the fp32
    log-sum-exp; a materialized mask (a sliding-window layer at s ≥ window, Falcon always: ``create_causal_mask(
    allow_is_causal_skip=False)``) is made additive per layer and kept, and transformers then repeats k and v
    to all heads (GQA). A fused qkv projection (Phi-3 ``qkv_proj``, GPT-NeoX ``query_key_value``) keeps its whole
    output alive through v, a view of it.
    """
    t = cfg.model_type
    T = b * s
    q, kv, a = cfg.q_dim, cfg.kv_dim, cfg.num_heads
    rep = cfg.num_heads // cfg.num_kv_heads
    tag = "" if share == 1 else f" [{kind.split('_')[0]} layers]"
    falcon = _falcon_layout(cfg) if t == "falcon" else ""
    fused_v = t in ("phi3", "gpt_neox") or falcon == "mha"  # v is a view of the fused qkv projection output
    fused = e * T * (q + 2 * kv)

    def part(name: str, nbytes: float, formula: str) -> None:
        add(name + tag, int(share * nbytes), formula if share == 1 else f"{share:.4g}·({formula})")

    if attention == "eager":
        # k and v as the two products keep them: copies repeated to all heads (repeat_kv; Falcon's q @ kᵀ
        # broadcasts); at b = 1 torch.matmul folds the batch into the heads without a copy, so k is kept
        # itself and v as the fused projection output it is a view of.
        if t == "falcon":
            k_v = {"mqa": (kv, kv) if b == 1 else (q, q), "mha": (q, q) if b > 1 else (q, q + 2 * kv),
                   "new": (q, q)}[falcon]
        elif rep > 1:
            k_v = (q, q)
        else:
            k_v = (kv, q + 2 * kv if b == 1 and fused_v else kv)
        part("q; k, v as the products keep them", e * T * (q + sum(k_v)), f"{e}·bs·(a·d + k + v)")
        if cfg.attn_softcap is not None:
            part("scores soft-capped before the softmax: tanh output", e * b * a * s * s, f"{e}·bas²")
        if t == "falcon":
            part("softmax probabilities (activation dtype)", e * b * a * s * s, f"{e}·bas²")
        else:
            drop = dropout and cfg.attn_dropout > 0
            eager_softmax_terms(part, b=b, a=a, s=s, e=e, dropout=drop)
            if drop and e == 4:  # no 16-bit cast for the dropout output to stand in for
                part("attention dropout output", 4 * b * a * s * s, "4·bas²")
        part("attention output (contiguous, output projection input)", e * T * q, f"{e}·bs·a·d")
        return
    window = cfg.sliding_window
    masked = t == "falcon" or (kind == "sliding_attention" and window is not None and s >= window)
    if masked:
        part("additive attention mask", e * b * s * s, f"{e}·bs²")
    if (masked and rep > 1 and t != "falcon") or falcon == "new":
        part("q, k, v (k and v repeated to all heads)", e * T * 3 * q, f"{e}·3·bs·a·d")
    elif fused_v:
        part("q, k after rotary", e * T * (q + kv), f"{e}·bs(a + a_kv)·d")
        part("fused qkv projection output (v is a view)", fused, f"{e}·bs(a + 2·a_kv)·d")
    else:
        part("q, k after rotary; v", e * T * (q + 2 * kv), f"{e}·bs(a + 2·a_kv)·d")
    part("attention output", e * T * q, f"{e}·bs·a·d")
    part("log-sum-exp (fp32)", 4 * b * a * s, "4·bas")
    if t in ("phi3", "gpt_neox"):
        # q comes out of rotary contiguous in (b, a, s, d) (its input was a slice of the fused projection), and so
        # does the kernel's output: merging the heads for the output projection copies it
        part("attention output merged (copy, output projection input)", e * T * q, f"{e}·bs·a·d")


def _falcon_layout(cfg: ModelConfig) -> str:
    """Falcon's attention layout: ``new`` (new_decoder_architecture: KV groups broadcast to every head before
    rotary, ``FalconAttention._split_heads``), ``mqa`` (multi_query: one KV head) or ``mha``."""
    if cfg.raw.get("new_decoder_architecture"):
        return "new"
    return "mqa" if cfg.num_kv_heads == 1 and cfg.raw.get("multi_query", True) else "mha"


def dense_activation_terms(cfg: ModelConfig, add: Add, *, batch_size: int, seq_len: int, act_bytes: int,
                           attention: str, dropout: bool) -> None:
    """Add, through ``add(name, bytes, formula, per_layer=True)``, what the forward of ``cfg`` saves for backward.

    Args:
        cfg: a config of :data:`memlib.core.configs.DENSE_FAMILIES`.
        add: :func:`memlib.core.estimate.activation_terms`' collector.
        batch_size: b.
        seq_len: s.
        act_bytes: bytes of an activation (2 in 16-bit training, 4 in fp32).
        attention: ``eager`` or ``sdpa``.
        dropout: apply the config's dropout probabilities (training).

    Layers of two kinds (Gemma 2's alternation, Gemma 3's 5 local : 1 global) add their attention terms
    weighted by their share of the layers, so that per-layer terms × L is the model's total.
    """
    check_estimable(cfg, attention)
    b, s, e, t = batch_size, seq_len, act_bytes, cfg.model_type
    T = b * s
    h, f, a, V, d = cfg.hidden_size, cfg.intermediate_size, cfg.num_heads, cfg.vocab_size, cfg.head_dim
    q, kv = cfg.q_dim, cfg.kv_dim
    p_resid = cfg.resid_dropout if dropout else 0.0
    if cfg.post_norms:
        # Gemma2RMSNorm / Gemma3RMSNorm: output = norm(x.float()) * (1.0 + weight.float()), cast back: each of
        # the four norms (input, post_attention, pre_feedforward, post_feedforward) keeps its fp32 input, the
        # rsqrt, the fp32 normalized tensor and the fp32 (1 + w); the input and pre-feedforward outputs feed
        # q/k/v and the MLP (the post-norms' outputs are only added to the residual stream).
        add("Gemma RMSNorms: fp32 inputs and normalized ×4", 4 * 8 * T * h, "4·8·bsh")
        add("Gemma RMSNorms: rsqrt and (1 + w) (fp32) ×4", 4 * (4 * T + 4 * h), "4·(4·bs + 4h)")
        add("pre-attention and pre-MLP norm outputs (linear inputs) ×2", 2 * e * T * h, f"2·{e}·bsh")
        if cfg.qk_norm:  # Gemma3Attention.q_norm/k_norm: the same RMSNorm over each head, before rotary
            add("q_norm, k_norm: fp32 inputs, normalized, rsqrt, (1 + w)",
                8 * T * (q + kv) + 4 * T * (a + cfg.num_kv_heads) + 2 * 4 * d,
                "8·bs(a + a_kv)·d + 4·bs(a + a_kv) + 8d")
    elif cfg.norm == "rmsnorm":  # Phi3RMSNorm, as LlamaRMSNorm
        add("RMSNorm fp32 inputs ×2", 2 * 4 * T * h, "2·4·bsh")
        add("RMSNorm normalized and weighted outputs ×2", 2 * 2 * e * T * h, f"2·2·{e}·bsh")
        add("RMSNorm rsqrt (fp32) ×2", 2 * 4 * T, "2·4·bs")
    else:
        # nn.LayerNorm keeps its input, mean and rstd (fp32); its output is kept by the Linear it feeds. With a
        # parallel residual (GPTNeoXLayer use_parallel_residual, FalconDecoderLayer parallel_attn) both branches
        # read the layer input; GPT-NeoX normalizes it twice, Falcon once (twice: ln_attn, ln_mlp in the new
        # decoder architecture); a sequential block also keeps x + attention, the second norm's input.
        n_ln = 2 if t == "gpt_neox" or not cfg.parallel_residual else cfg.num_norms_in
        add("layer input (residual stream)", e * T * h, f"{e}·bsh")
        if not cfg.parallel_residual:
            add("x + attention output (second LayerNorm input)", e * T * h, f"{e}·bsh")
        add(f"LayerNorm mean and rstd (fp32) ×{n_ln}", n_ln * 8 * T, f"{n_ln}·8·bs")
        add(f"LayerNorm outputs (linear inputs) ×{n_ln}", n_ln * e * T * h, f"{n_ln}·{e}·bsh")
    kinds = {k: cfg.layer_types.count(k) / cfg.num_layers for k in sorted(set(cfg.layer_types))} or {
        "sliding_attention" if cfg.sliding_window else "full_attention": 1.0}  # Phi-3's window: every layer
    for kind, share in kinds.items():
        _attention_terms(cfg, add, b=b, s=s, e=e, attention=attention, dropout=dropout, kind=kind, share=share)
    if cfg.mlp == "gated":  # gate (Phi-3: the fused gate_up output), activation, up, product
        add("MLP gate, up, activation, product", 4 * e * T * f, f"4·{e}·bsf")
    else:  # GPTNeoXMLP / FalconMLP: the activation's input and output
        add("MLP up-projection and activation outputs", 2 * e * T * f, f"2·{e}·bsf")
    if p_resid > 0:  # Phi-3 resid_attn/mlp_dropout, GPT-NeoX post_attention/mlp_dropout, Falcon dropout_add
        n_drop = 1 if t == "falcon" else 2  # Falcon: dropout_add once, on mlp (+ attention) output
        add(f"residual dropout masks (bool) ×{n_drop}", n_drop * T * h, f"{n_drop}·bsh")
    if t == "falcon" and not cfg.parallel_residual and dropout and cfg.attn_dropout > 0:
        add("attention-residual dropout mask (bool)", T * h, "bsh")  # dropout_add(attention_output, ...)
    if t == "gpt_neox" and dropout and cfg.embd_dropout > 0:
        add("embedding dropout mask (bool)", T * h, "bsh", per_layer=False)
    # outside the layers
    if cfg.post_norms:
        add("final Gemma RMSNorm: fp32 input, normalized, rsqrt, (1 + w); output", 8 * T * h + 4 * T + 4 * h + e * T * h,
            f"(8 + {e})·bsh + 4·bs + 4h", per_layer=False)
    elif cfg.norm == "rmsnorm":
        add("final RMSNorm", 4 * T * h + 2 * e * T * h + 4 * T, f"(4 + 2·{e})·bsh + 4·bs", per_layer=False)
    else:
        add("final LayerNorm input, output; mean, rstd", 2 * e * T * h + 8 * T, f"2·{e}·bsh + 8·bs", per_layer=False)
    if cfg.rotary_dim:
        # one cos/sin pair per rotary embedding: Gemma 3 has a local and a global one (rope_local_base_freq)
        n_rope = len(kinds) if t == "gemma3_text" else 1
        add("rotary cos, sin" + (f" ×{n_rope}" if n_rope > 1 else ""), n_rope * 2 * e * s * cfg.rotary_dim,
            f"{n_rope}·2·{e}·s·d_rot", per_layer=False)
    if cfg.final_softcap is not None:  # Gemma2ForCausalLM: logits = c·tanh(logits / c)
        add("soft-capped logits: tanh output", e * T * V, f"{e}·bsV", per_layer=False)
    add("log-softmax of the fp32 logits", 4 * T * V, "4·bsV", per_layer=False)
    add("input ids and labels", 16 * T, "16·bs", per_layer=False)


def _layer_tensors(cfg: ModelConfig) -> list[int]:
    """Element counts of the parameter tensors of one transformer block."""
    h, q, kv, f = cfg.hidden_size, cfg.q_dim, cfg.kv_dim, cfg.intermediate_size
    if cfg.model_type == "gpt2":  # fused c_attn (h, 3h) Conv1D, c_proj, c_fc, c_proj; two LayerNorms
        return [h, h, h * 3 * h, 3 * h, h * h, h, h, h, h * f, f, f * h, h]
    tensors = [h * q, h * kv, h * kv, q * h]
    if cfg.qkv_bias:
        tensors += [q, kv, kv]
    if cfg.out_bias:
        tensors += [h]
    tensors += [h * f, h * f, f * h]
    if cfg.mlp_bias:
        tensors += [f, f, h]
    tensors += [h, h]  # input and post-attention RMSNorm weights
    if cfg.model_type == "qwen3":
        tensors += [cfg.head_dim, cfg.head_dim]  # q_norm, k_norm: RMSNorm over each head
    if cfg.model_type == "olmo2":
        tensors += [q, kv]  # q_norm, k_norm: RMSNorm over all heads together (the h, h above are post-norms)
    return tensors


def count_params_dense(cfg: ModelConfig) -> ParamCount:
    """Exact parameter count of a dense model (the families above and memlib's own gpt2, llama, mistral, qwen2,
    gemma, qwen3, olmo2), without torch (:func:`memlib.core.params.count_params` calls it)."""
    if cfg.model_type in DENSE_FAMILIES:
        return _from_tensors(*param_tensors(cfg), cfg.num_layers)
    h, L, V = cfg.hidden_size, cfg.num_layers, cfg.vocab_size
    layer = _layer_tensors(cfg)
    embed = V * h + (cfg.max_position_embeddings * h if cfg.learned_positions else 0)
    if cfg.model_type == "gpt2":
        attn_layer = 3 * h * h + 3 * h + h * h + h
        mlp_layer = 2 * h * cfg.intermediate_size + cfg.intermediate_size + h
        norm_layer = 4 * h
        final_norm = 2 * h
    else:
        q, kv, f = cfg.q_dim, cfg.kv_dim, cfg.intermediate_size
        attn_layer = 2 * h * q + 2 * h * kv + (q + 2 * kv if cfg.qkv_bias else 0) + (h if cfg.out_bias else 0)
        mlp_layer = 3 * h * f + (2 * f + h if cfg.mlp_bias else 0)
        norm_layer = 2 * h + (2 * cfg.head_dim if cfg.model_type == "qwen3" else 0) + (
            q + kv if cfg.model_type == "olmo2" else 0)
        final_norm = h
    lm_head = 0 if cfg.tie_word_embeddings else V * h
    per_layer = sum(layer)
    total = embed + L * per_layer + final_norm + lm_head
    assert per_layer == attn_layer + mlp_layer + norm_layer
    other_tensors = [V * h] + ([cfg.max_position_embeddings * h] if cfg.learned_positions else [])
    other_tensors += [h, h] if cfg.norm == "layernorm" else [h]
    other_tensors += [] if cfg.tie_word_embeddings else [V * h]
    small = L * sum(n for n in layer if n < 4096) + sum(n for n in other_tensors if n < 4096)
    return ParamCount(
        params=total,
        embeddings=embed,
        attention=L * attn_layer,
        mlp=L * mlp_layer,
        norms=L * norm_layer + final_norm,
        lm_head=lm_head,
        per_layer=per_layer,
        small_tensor_params=small,
        num_tensors=L * len(layer) + len(other_tensors),
    )


def _from_tensors(layer: list[tuple[str, int]], outside: list[tuple[str, int]], num_layers: int) -> ParamCount:
    """A ParamCount from (component, numel) lists of one layer's tensors and the tensors outside the layers."""
    parts = {"embeddings": 0, "attention": 0, "mlp": 0, "norms": 0, "lm_head": 0}
    for part, n in layer:
        parts[part] += num_layers * n
    for part, n in outside:
        parts[part] += n
    per_layer = sum(n for _, n in layer)
    small = num_layers * sum(n for _, n in layer if n < 4096) + sum(n for _, n in outside if n < 4096)
    return ParamCount(params=num_layers * per_layer + sum(n for _, n in outside), per_layer=per_layer,
                      small_tensor_params=small, num_tensors=num_layers * len(layer) + len(outside), **parts)
