"""What the forward pass saves for backward, term by term, per model family: pure Python, no torch (Chapters 1, 4).

Derived from what each op of the transformers implementation saves (gated MLP, RMSNorm with its fp32 upcast,
grouped-query attention, fp32 softmax in eager attention, the fp32 upcast of the logits in the loss) and
checked against :mod:`memlib.measure.trace`; :func:`memlib.core.estimate.saved_activations` sums the terms. The
terms of an fp32 model under torch.autocast (PyTorch AMP; :mod:`memlib.core.autocast` explains them and holds
their backward moments) are built here too, at the end, beside the terms they start from.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from . import families_dense, families_moe
from .attention_terms import gqa_attention_terms
from .choices import ATTENTION, PRECISIONS
from .configs import DENSE_FAMILIES, ModelConfig, check_seq_len, load_config
from .errors import MemlibError, check_choice, check_positive
from .params import count_params
from .terms import ActivationTerm, sum_terms

__all__ = ["ActivationTerm", "activation_terms", "korthikanti_activation_bytes", "AUTOCAST_FAMILIES", "WEIGHT_COPIES",
           "autocast_activation_terms", "linear_weight_params"]


def korthikanti_activation_bytes(cfg: ModelConfig | str, batch_size: int, seq_len: int) -> int:
    """The classic GPT formula for one layer: s·b·h·(34 + 5·a·s/h) bytes (Korthikanti et al. 2022).

    Introduced in Chapter 1: 16-bit activations, 1-byte dropout masks, LayerNorm, a 4h GELU MLP, and the
    attention scores and probabilities materialized. Shown as the reference that modern models depart from.
    """
    cfg = load_config(cfg)
    s, b, h, a = seq_len, batch_size, cfg.hidden_size, cfg.num_heads
    return int(s * b * h * 34 + 5 * a * s * s * b)

def activation_terms(model: str | Path | dict[str, Any] | ModelConfig, *, batch_size: int = 1,
                     seq_len: int = 512, precision: str = "bf16-mixed", attention: str = "sdpa",
                     dropout: bool = True, autocast: bool = False) -> list[ActivationTerm]:
    """What the forward pass of the transformers model saves for backward, term by term.

    Introduced in Chapter 1 (and taken apart in Chapter 4). Derived from the transformers implementation
    of each family and checked against :func:`memlib.measure.trace.trace_training` in the tests.

    Args:
        model: shipped name, config.json path, dict or ModelConfig.
        batch_size: micro-batch size b.
        seq_len: sequence length s.
        precision: sets the activation dtype (4 bytes for fp32, 2 otherwise).
        attention: ``"eager"`` (scores materialized) or ``"sdpa"`` (flash kernel: output + log-sum-exp).
        dropout: apply the config's dropout probabilities (training); False as in evaluation.
        autocast: an fp32 model under 16-bit torch.autocast (PyTorch AMP, ``bf16-mixed``/``fp16-mixed``):
            :func:`memlib.core.autocast.autocast_activation_terms`, the 16-bit weight copies included.

    Returns:
        The terms; ``per_layer`` ones are multiplied by the number of layers.
    """
    cfg = load_config(model)
    check_choice("precision", precision, PRECISIONS)
    check_choice("attention", attention, ATTENTION)
    b = check_positive("batch_size", batch_size)
    s = check_seq_len(cfg, check_positive("seq_len", seq_len))
    if autocast:
        if not precision.endswith("-mixed"):
            raise MemlibError(f"autocast needs precision bf16-mixed or fp16-mixed (got precision={precision!r})")
        return autocast_activation_terms(cfg, b, s, attention, dropout)
    return _activation_terms(cfg, b, s, 4 if precision == "fp32" else 2, attention, dropout)


def _activation_terms(cfg: ModelConfig, b: int, s: int, e: int, attention: str, dropout: bool) -> list[ActivationTerm]:
    """:func:`activation_terms` for validated values: b sequences of s tokens, e bytes per activation element."""
    if cfg.moe is not None or cfg.mla is not None:  # Mixtral, Qwen2/3-MoE, DeepSeek-V2/V3: memlib.core.families_moe
        return families_moe.activation_terms_moe(cfg, b=b, s=s, e=e, attention=attention, dropout=dropout)
    T = b * s
    h, f, a, V = cfg.hidden_size, cfg.intermediate_size, cfg.num_heads, cfg.vocab_size
    q, kv, d = cfg.q_dim, cfg.kv_dim, cfg.head_dim
    terms: list[ActivationTerm] = []

    def add(name: str, nbytes: int, formula: str, per_layer: bool = True) -> None:
        terms.append(ActivationTerm(name, int(nbytes), formula, per_layer))

    if cfg.model_type in DENSE_FAMILIES:  # Gemma 2/3, Phi-3, GPT-NeoX, Falcon: memlib/core/families_dense.py
        families_dense.dense_activation_terms(cfg, add, batch_size=b, seq_len=s, act_bytes=e, attention=attention,
                                              dropout=dropout)
        return terms

    if cfg.model_type == "gpt2":
        p_attn = cfg.attn_dropout if dropout else 0.0
        p_resid = cfg.resid_dropout if dropout else 0.0
        add("LayerNorm inputs (residual stream) ×2", 2 * e * T * h, f"2·{e}·bsh")
        add("LayerNorm outputs ×2", 2 * e * T * h, f"2·{e}·bsh")
        add("LayerNorm mean and rstd (fp32) ×2", 2 * 8 * T, "2·8·bs")
        if attention == "sdpa":
            add("q, k, v (fused c_attn output)", e * T * 3 * h, f"{e}·3bsh")
            add("attention output", e * T * h, f"{e}·bsh")
            add("log-sum-exp (fp32)", 4 * b * a * s, "4·bas")
        else:
            add("q, k, v contiguous copies", 3 * e * T * h, f"3·{e}·bsh")
            add("softmax probabilities", e * b * a * s * s, f"{e}·bas²")
            if p_attn > 0:
                add("attention dropout mask (bool)", b * a * s * s, "bas²")
                add("attention dropout output", e * b * a * s * s, f"{e}·bas²")
            add("attention output (contiguous, c_proj input)", e * T * h, f"{e}·bsh")
        if p_resid > 0:
            add("residual dropout masks (bool) ×2", 2 * T * h, "2·bsh")
        add("MLP c_fc output and gelu_new intermediates ×5", 5 * e * T * f, f"5·{e}·bsf")
        if dropout and cfg.embd_dropout > 0:
            add("embedding dropout mask (bool)", T * h, "bsh", per_layer=False)
        add("final LayerNorm input, output", 2 * e * T * h, f"2·{e}·bsh", per_layer=False)
        add("final LayerNorm mean and rstd", 8 * T, "8·bs", per_layer=False)
    elif cfg.model_type == "olmo2":
        # OLMo 2 normalizes after attention and after the MLP (the residual stream itself feeds q/k/v and the MLP),
        # and its RMSNorms multiply by the weight in fp32: each keeps its fp32 input, the fp32 normalized tensor
        # and the rsqrt. q_norm and k_norm normalize all heads together before rotary.
        add("q/k/v and MLP inputs (residual stream) ×2", 2 * e * T * h, f"2·{e}·bsh")
        add("post-norms: fp32 inputs and normalized ×2", 2 * 8 * T * h, "2·8·bsh")
        add("post-norms: rsqrt (fp32) ×2", 2 * 4 * T, "2·4·bs")
        add("q_norm, k_norm: fp32 inputs and normalized, rsqrt", 8 * T * (q + kv) + 2 * 4 * T,
            "8·bs(a + a_kv)·d + 2·4·bs")
    else:
        add("RMSNorm fp32 inputs ×2", 2 * 4 * T * h, "2·4·bsh")
        add("RMSNorm normalized and weighted outputs ×2", 2 * 2 * e * T * h, f"2·2·{e}·bsh")
        add("RMSNorm rsqrt (fp32) ×2", 2 * 4 * T, "2·4·bs")
    if cfg.model_type != "gpt2":
        window = cfg.raw.get("sliding_window") if cfg.model_type == "mistral" else None
        gqa_attention_terms(add, cfg, batch_size=b, seq_len=s, act_bytes=e, attention=attention, dropout=dropout,
                            window=window)
        add("MLP gate, up, activation, product", 4 * e * T * f, f"4·{e}·bsf")
        if cfg.model_type == "olmo2":  # fp32 input and normalized, rsqrt; the cast output feeds the LM head
            add("final RMSNorm", 8 * T * h + e * T * h + 4 * T, f"(8 + {e})·bsh + 4·bs", per_layer=False)
        else:
            add("final RMSNorm", 4 * T * h + 2 * e * T * h + 4 * T, f"(4 + 2·{e})·bsh + 4·bs", per_layer=False)
        if cfg.model_type == "qwen3":
            # Qwen3's q_norm and k_norm (RMSNorm over each head, before rotary) keep, like every RMSNorm, their fp32
            # input, the rsqrt per head and the normalized 16-bit tensor (for the weight's gradient); their output
            # feeds rotary, which keeps nothing of it.
            a_kv = cfg.num_kv_heads
            add("q_norm, k_norm: fp32 inputs, normalized, rsqrt", (4 + e) * T * (q + kv) + 4 * T * (a + a_kv),
                f"(4 + {e})·bs(a + a_kv)·d + 4·bs(a + a_kv)")
        if cfg.model_type == "gemma":
            # GemmaRMSNorm multiplies in fp32: output = norm(x.float()) * (1.0 + weight.float()); the product's
            # backward keeps the fp32 normalized tensor (4 bytes, not the 16-bit copy counted above) and the fp32
            # (1 + w); the output is cast back to the activation dtype.
            extra = (4 - e) * T * h + 4 * h
            add("Gemma RMSNorm fp32 normalized and (1 + w) ×2", 2 * extra, f"2·((4 − {e})·bsh + 4h)")
            add("Gemma final RMSNorm fp32 normalized and (1 + w)", extra, f"(4 − {e})·bsh + 4h", per_layer=False)
        add("rotary cos, sin", 2 * e * s * d, f"2·{e}·s·d", per_layer=False)
    add("log-softmax of the fp32 logits", 4 * T * V, "4·bsV", per_layer=False)
    add("input ids and labels", 16 * T, "16·bs", per_layer=False)
    return terms

_sum_terms = sum_terms  # the old private name (tests and notebooks import it)


#: The families whose autocast terms are derived (and checked against CPU or meta traces); the others get an
#: approximation.
AUTOCAST_FAMILIES = ("gpt2", "llama", "mistral", "qwen2", "gemma", "qwen3", "olmo2")

#: Name of the term with the 16-bit weight copies of one layer's Linears (and of the LM head, outside the layers).
WEIGHT_COPIES = "autocast 16-bit weight copies"


def _derived(cfg: ModelConfig) -> bool:
    if cfg.model_type == "gpt2":
        return cfg.moe is None and cfg.mla is None
    return (cfg.model_type in AUTOCAST_FAMILIES and cfg.moe is None and cfg.mla is None
            and not cfg.learned_positions)


def linear_weight_params(cfg: ModelConfig) -> int:
    """Weights of one decoder layer's Linears (q, k, v, o, gate, up, down; GPT-2's four Conv1D), biases excluded:
    what autocast copies.

    For the families outside :data:`AUTOCAST_FAMILIES`, the layer's parameters (an upper bound).
    """
    if not _derived(cfg):
        return count_params(cfg).per_layer
    h, q, kv, f = cfg.hidden_size, cfg.q_dim, cfg.kv_dim, cfg.intermediate_size
    if cfg.model_type == "gpt2":  # Conv1D c_attn (h × 3h), attention c_proj (h × h), c_fc (h × f), c_proj (f × h)
        return 4 * h * h + 2 * h * f
    return h * q + 2 * h * kv + q * h + 3 * h * f


def autocast_activation_terms(cfg: ModelConfig, b: int, s: int, attention: str,
                              dropout: bool) -> list[ActivationTerm]:
    """What the forward pass saves for backward under 16-bit torch.autocast of an fp32 model, term by term.

    Introduced in Chapter 1 (PyTorch AMP). Derived for :data:`AUTOCAST_FAMILIES` (see the module docstring); each
    term names its dtype. Other families: an approximation, their fp32 terms (every saved tensor at 4 bytes) plus
    the 16-bit copies of the layer's parameters and of the LM head.

    Args:
        cfg: the model; b: batch size; s: sequence length.
        attention: ``"eager"`` or ``"sdpa"``; dropout: apply the config's dropout probabilities.

    Returns:
        The terms; ``per_layer`` ones are multiplied by the number of layers.
    """
    T = b * s
    h, f, a, V = cfg.hidden_size, cfg.intermediate_size, cfg.num_heads, cfg.vocab_size
    q, kv, d = cfg.q_dim, cfg.kv_dim, cfg.head_dim
    head = ActivationTerm(f"{WEIGHT_COPIES} (LM head)", 2 * V * h, "2·Vh", per_layer=False)
    copies = ActivationTerm(WEIGHT_COPIES, 2 * linear_weight_params(cfg), "2·(Linear weights of a layer)")
    if not _derived(cfg):
        return _activation_terms(cfg, b, s, 4, attention, dropout) + [copies, head]
    if cfg.model_type == "gpt2":
        return _gpt2_terms(cfg, b, s, attention, dropout) + [copies, head]
    terms: list[ActivationTerm] = []

    def add(name: str, nbytes: int, formula: str, per_layer: bool = True) -> None:
        terms.append(ActivationTerm(name, int(nbytes), formula, per_layer))

    if cfg.model_type == "olmo2":  # norms after attention and MLP: their inputs are the 16-bit o/down outputs
        add("post-norms: fp32 copies of the 16-bit inputs ×2", 2 * 4 * T * h, "2·4·bsh")
    else:
        add("RMSNorm inputs: the fp32 residual stream ×2", 2 * 4 * T * h, "2·4·bsh")
    add("RMSNorm normalized (fp32) ×2", 2 * 4 * T * h, "2·4·bsh")
    add("RMSNorm rsqrt (fp32) ×2", 2 * 4 * T, "2·4·bs")
    if cfg.model_type == "gemma":  # output = norm(x) * (1.0 + weight.float()): the fp32 (1 + w) is saved
        add("Gemma RMSNorm (1 + w) (fp32) ×2", 2 * 4 * h, "2·4h")
    add("16-bit casts of the Linear inputs (q, k, v; gate, up)", 5 * 2 * T * h, "5·2·bsh")
    if cfg.model_type == "qwen3":  # q_norm, k_norm over each head of the 16-bit q, k: fp32 copy, rsqrt, normalized
        add("q_norm, k_norm: fp32 inputs, 16-bit normalized, rsqrt", 6 * T * (q + kv) + 4 * T * (a + cfg.num_kv_heads),
            "6·bs(a + a_kv)·d + 4·bs(a + a_kv)")
    if cfg.model_type == "olmo2":  # q_norm, k_norm over all heads, multiplied by the weight in fp32
        add("q_norm, k_norm: fp32 inputs and normalized, rsqrt", 8 * T * (q + kv) + 2 * 4 * T,
            "8·bs(a + a_kv)·d + 2·4·bs")
    window = cfg.raw.get("sliding_window") if cfg.model_type == "mistral" else None
    gqa_attention_terms(add, cfg, batch_size=b, seq_len=s, act_bytes=2, attention=attention, dropout=dropout,
                        window=window)
    if attention == "eager" and cfg.num_kv_heads == 1 < a and b == 1:
        # MQA, one sequence: repeat_kv of one head is a stride-0 view and so is matmul's (b·a, s, d) reshape of it;
        # the 16-bit v is saved at its own size (k, fp32 after rotary, is cast to a full 16-bit copy)
        add("v not repeated (MQA view, batch 1)", -2 * T * (q - kv), "−2·bs(a − 1)·d")
    add("MLP gate, up, activation, product (16-bit)", 4 * 2 * T * f, "4·2·bsf")
    terms.append(copies)
    gemma_w = 4 * h if cfg.model_type == "gemma" else 0
    add("final RMSNorm: fp32 input, normalized, rsqrt; 16-bit cast", 10 * T * h + 4 * T + gemma_w,
        "(4 + 4 + 2)·bsh + 4·bs" + (" + 4h" if gemma_w else ""), per_layer=False)
    terms.append(head)
    add("rotary cos, sin (fp32)", 2 * 4 * s * d, "2·4·s·d", per_layer=False)
    add("log-softmax of the fp32 logits", 4 * T * V, "4·bsV", per_layer=False)
    add("input ids and labels", 16 * T, "16·bs", per_layer=False)
    return terms


def _gpt2_terms(cfg: ModelConfig, b: int, s: int, attention: str, dropout: bool) -> list[ActivationTerm]:
    """GPT-2's terms under autocast with CUDA's op lists (transformers' ``modeling_gpt2.py``), weight copies aside.

    ``Conv1D`` is ``torch.addmm(bias, x, weight)``: autocast casts its input (saved, 16-bit) and its cached weight
    copy; its output is 16-bit. ``nn.LayerNorm`` runs in fp32 (CUDA's fp32 list): it keeps its fp32 input (the
    residual stream: the fp32 embeddings plus the 16-bit branches promote to fp32), mean and rstd, and its fp32
    output is cast for the next Conv1D. ``gelu_new`` is ``0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·pow(x, 3))))``:
    CUDA runs ``pow`` in fp32, so pow keeps an fp32 copy of the 16-bit c_fc output, tanh its fp32 output, the
    product the 16-bit 0.5·x and the fp32 (1 + tanh); its fp32 output is cast for c_proj. Eager attention's
    ``softmax`` gets an fp32 input (16-bit scores plus the fp32 additive mask) and ``attn_weights.type(value.dtype)``
    makes the 16-bit probabilities that dropout (``aten.native_dropout``: a 1-byte mask, as on CUDA) and the second
    matmul keep; ``torch.matmul`` copies the strided q, k, v views. SDPA (the flash kernel) keeps the c_attn output
    that q, k, v view, its output and the log-sum-exp. The word and position embeddings keep their int64 ids.
    """
    T = b * s
    h, f, a, V = cfg.hidden_size, cfg.intermediate_size, cfg.num_heads, cfg.vocab_size
    p_attn = cfg.attn_dropout if dropout else 0.0
    p_resid = cfg.resid_dropout if dropout else 0.0
    terms: list[ActivationTerm] = []

    def add(name: str, nbytes: int, formula: str, per_layer: bool = True) -> None:
        terms.append(ActivationTerm(name, int(nbytes), formula, per_layer))

    add("LayerNorm inputs: the fp32 residual stream ×2", 2 * 4 * T * h, "2·4·bsh")
    add("LayerNorm mean and rstd (fp32) ×2", 2 * 8 * T, "2·8·bs")
    add("16-bit casts of the LayerNorm outputs (c_attn, c_fc inputs)", 2 * 2 * T * h, "2·2·bsh")
    if attention == "sdpa":
        add("q, k, v (the 16-bit c_attn output)", 2 * 3 * T * h, "2·3bsh")
        add("attention output (16-bit, c_proj input)", 2 * T * h, "2·bsh")
        add("log-sum-exp (fp32)", 4 * b * a * s, "4·bas")
    else:
        add("q, k, v contiguous 16-bit copies", 3 * 2 * T * h, "3·2·bsh")
        add("softmax probabilities (fp32)", 4 * b * a * s * s, "4·bas²")
        if p_attn > 0:
            add("attention dropout mask (bool)", b * a * s * s, "bas²")
        add("softmax probabilities cast to 16 bits" + (" and dropped out" if p_attn > 0 else ""),
            2 * b * a * s * s, "2·bas²")
        add("attention output (contiguous 16-bit, c_proj input)", 2 * T * h, "2·bsh")
    if p_resid > 0:
        add("residual dropout masks (bool) ×2", 2 * T * h, "2·bsh")
    add("gelu_new: fp32 pow input, tanh and 1 + tanh", 3 * 4 * T * f, "3·4·bsf")
    add("gelu_new: 16-bit 0.5·x; 16-bit cast of the c_proj input", 2 * 2 * T * f, "2·2·bsf")
    if dropout and cfg.embd_dropout > 0:
        add("embedding dropout mask (bool)", T * h, "bsh", per_layer=False)
    add("final LayerNorm: fp32 input, mean and rstd; 16-bit cast", 6 * T * h + 8 * T, "(4 + 2)·bsh + 8·bs",
        per_layer=False)
    add("position ids (int64)", 8 * s, "8·s", per_layer=False)
    add("log-softmax of the fp32 logits", 4 * T * V, "4·bsV", per_layer=False)
    add("input ids and labels", 16 * T, "16·bs", per_layer=False)
    return terms
