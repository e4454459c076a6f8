"""LoRA / QLoRA accounting: adapter parameters and frozen-weight bytes (pure Python). Introduced in Chapter 9."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from .choices import LORA_TARGETS, METHODS  # defined with the other choices; re-exported
from .configs import ModelConfig, load_config
from .dtypes import WEIGHT_FORMATS
from .errors import check_choice, check_positive
from .params import count_params

__all__ = ["LORA_TARGETS", "METHODS", "layer_linears", "targeted_linears", "lora_params", "lora_small_tensor_params",
           "linear_bias_params", "quantized_weight_bytes", "qlora_base_bytes"]


def layer_linears(cfg: ModelConfig) -> list[tuple[str, int, int]]:
    """The Linear (or GPT-2 Conv1D) layers of one decoder block as (name, in_features, out_features).

    Introduced in Chapter 9. GPT-2 fuses q, k, v into one ``c_attn`` matrix (h → 3h).
    """
    h, f = cfg.hidden_size, cfg.intermediate_size
    if cfg.model_type == "gpt2":
        return [("c_attn", h, 3 * h), ("attn.c_proj", h, h), ("c_fc", h, f), ("mlp.c_proj", f, h)]
    out = [("q_proj", h, cfg.q_dim), ("k_proj", h, cfg.kv_dim), ("v_proj", h, cfg.kv_dim), ("o_proj", cfg.q_dim, h)]
    if cfg.mlp == "gated":
        out += [("gate_proj", h, f), ("up_proj", h, f), ("down_proj", f, h)]
    else:
        out += [("up_proj", h, f), ("down_proj", f, h)]
    return out


def targeted_linears(cfg: ModelConfig, targets: str) -> list[tuple[str, int, int]]:
    """The (name, in, out) Linear layers of one block that get an adapter for ``targets``. Chapter 9."""
    check_choice("lora targets", targets, LORA_TARGETS)
    linears = layer_linears(cfg)
    if targets == "all-linear":
        return linears
    if cfg.model_type == "gpt2":
        attn = [x for x in linears if x[0] in ("c_attn", "attn.c_proj")]
        # GPT-2's fused c_attn cannot take W_q and W_v alone: "qv" adapts the fused matrix, as peft does.
        return attn if targets == "attention" else attn[:1]
    names = ("q_proj", "k_proj", "v_proj", "o_proj") if targets == "attention" else ("q_proj", "v_proj")
    return [x for x in linears if x[0] in names]


def lora_params(model: str | Path | dict[str, Any] | ModelConfig, rank: int = 16,
                targets: str = "all-linear") -> int:
    """Trainable LoRA parameters: rank × (in + out) for every targeted Linear of every layer.

    Introduced in Chapter 9. A = (r, in), B = (out, r); no bias (peft's default ``bias="none"``).

    Args:
        model: shipped name, config.json path, dict or ModelConfig.
        rank: the LoRA rank r.
        targets: ``all-linear``, ``attention`` or ``qv`` (see :data:`LORA_TARGETS`).

    Returns:
        The number of adapter parameters.
    """
    cfg = load_config(model)
    r = check_positive("lora rank", rank)
    return cfg.num_layers * sum(r * (i + o) for _, i, o in targeted_linears(cfg, targets))


def lora_small_tensor_params(model: str | Path | dict[str, Any] | ModelConfig, rank: int = 16,
                             targets: str = "all-linear", threshold: int = 4096) -> int:
    """Adapter parameters in tensors of fewer than ``threshold`` elements (bitsandbytes' 8-bit optimizers keep
    32-bit states for those). Introduced in Chapter 9."""
    cfg = load_config(model)
    r = check_positive("lora rank", rank)
    small = sum((r * i if r * i < threshold else 0) + (o * r if o * r < threshold else 0)
                for _, i, o in targeted_linears(cfg, targets))
    return cfg.num_layers * small


def linear_bias_params(model: str | Path | dict[str, Any] | ModelConfig) -> int:
    """Bias elements of all decoder-block Linear (GPT-2: Conv1D) layers. Introduced in Chapter 9.

    Per layer: q/k/v biases (``qkv_bias``: GPT-2, Qwen2, Pythia), the attention output bias (``out_bias``) and the
    MLP biases (``mlp_bias``: up and down, plus gate in a gated MLP). LayerNorm biases are norms, not these.
    """
    cfg = load_config(model)
    h, f = cfg.hidden_size, cfg.intermediate_size
    per_layer = (cfg.q_dim + 2 * cfg.kv_dim if cfg.qkv_bias else 0) + (h if cfg.out_bias else 0)
    if cfg.mlp_bias:
        per_layer += (2 * f if cfg.mlp == "gated" else f) + h
    return cfg.num_layers * per_layer


def quantized_weight_bytes(model: str | Path | dict[str, Any] | ModelConfig, weights: str = "nf4", *,
                           double_quant: bool = True) -> int:
    """Bytes of a model's weights with its Linear matrices stored in ``weights`` (int8, int4, nf4). Chapter 9.

    The one quantized-weights function: :func:`memlib.core.estimate.estimate_inference` (int8/int4/nf4
    weights) and :func:`qlora_base_bytes` (QLoRA's frozen base) both call it. The policy is what transformers
    + bitsandbytes do (``transformers/integrations/bitsandbytes.py``, ``replace_with_bnb_linear``): every
    ``nn.Linear`` (and GPT-2's ``Conv1D``) becomes a ``Linear4bit``/``Linear8bitLt`` except the output embedding
    ``lm_head``, tied weights and the modules in ``llm_int8_skip_modules`` (``quantizers/base.py``,
    ``get_keys_to_not_convert``). Only the weight matrix is quantized: a ``Linear4bit``'s **bias stays a 16-bit
    parameter**, and the embeddings, the LM head and every norm are not Linear layers that get replaced, so
    they stay 16-bit too. GPTQ/AWQ ``QuantLinear`` layers likewise keep a 16-bit bias. So: quantized elements
    = parameters − embeddings − LM head − norms − Linear biases (:func:`linear_bias_params`); everything else 2
    bytes. The traced check is Chapter 9's (``memlib._book.ch09_lora_qlora.nf4_model_bytes`` on a model quantized by
    bitsandbytes, within an fp32 offset and a partial block per matrix) and tests/test_lora.py's biased model.

    Known limitation: MoE experts are counted as quantized (as GPTQ/AWQ/vLLM quantize them and as bitsandbytes
    does when experts are ``nn.Linear``); transformers 5 stores some families' experts as fused 3-D parameters,
    which ``replace_with_bnb_linear`` leaves in 16 bits.

    Args:
        model: shipped name, config.json path, dict or ModelConfig.
        weights: ``int8``, ``int4`` or ``nf4`` (:data:`memlib.core.dtypes.WEIGHT_FORMATS`; 16-bit formats are
            plain ``bytes × params``).
        double_quant: for ``nf4``, QLoRA's double quantization of the block constants (8/64 + 32/(64·256)
            ≈ 0.127 bits per weight) rather than one fp32 absmax per block of 64 (0.5 bits).

    Returns:
        Bytes.
    """
    cfg = load_config(model)
    check_choice("weight format", weights, ("int8", "int4", "nf4"))
    pc = count_params(cfg)
    sixteen_bit = pc.embeddings + pc.lm_head + pc.norms + linear_bias_params(cfg)
    per_param = WEIGHT_FORMATS[weights] if weights != "nf4" or double_quant else 0.5 + (32 / 64) / 8
    return int(per_param * (pc.params - sixteen_bit)) + 2 * sixteen_bit


def qlora_base_bytes(model: str | Path | dict[str, Any] | ModelConfig, *, double_quant: bool = True) -> int:
    """Bytes of the frozen base model in QLoRA: NF4 block-64 matrices + 16-bit everything else.

    Introduced in Chapter 9. With double quantization the per-block absmax costs 8/64 bits plus 32/(64·256)
    bits per parameter (≈ 0.127 bits), without it 32/64 = 0.5 bits (the QLoRA paper, §3). Which tensors stay
    16-bit (biases, embeddings, norms, the LM head): :func:`quantized_weight_bytes`.
    """
    return quantized_weight_bytes(model, "nf4", double_quant=double_quant)
