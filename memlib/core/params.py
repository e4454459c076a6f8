"""Exact parameter counts of the transformers classes, with a breakdown by component (Chapter 1)."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from . import families_dense

from . import families_moe
from .configs import DENSE_FAMILIES, ModelConfig, load_config

__all__ = ["ParamCount", "count_params"]


@dataclass(frozen=True)
class ParamCount:
    """Parameter count of a model, by component. Introduced in Chapter 1.

    Attributes:
        params: total number of parameters (a tied LM head is counted once).
        embeddings: token (and learned position) embeddings.
        attention: all q/k/v/o projections with their biases, all layers.
        mlp: all MLP matrices with their biases, all layers.
        norms: all LayerNorm/RMSNorm weights (and biases), final norm included.
        lm_head: the output projection (0 when tied to the embeddings).
        per_layer: parameters of one transformer block.
        small_tensor_params: parameters in tensors of fewer than 4096 elements (norms, biases): what
            8-bit optimizers keep in 32-bit.
        num_tensors: number of parameter tensors.
    """

    params: int
    embeddings: int
    attention: int
    mlp: int
    norms: int
    lm_head: int
    per_layer: int
    small_tensor_params: int
    num_tensors: int

    def as_dict(self) -> dict[str, int]:
        """The fields as a plain dict (for JSON)."""
        return asdict(self)


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


def count_params(model: str | Path | dict[str, Any] | ModelConfig) -> ParamCount:
    """Count the parameters of the transformers causal-LM class built from a config.

    Introduced in Chapter 1. Equal to ``sum(p.numel() for p in model.parameters())`` of the transformers
    model (tested for every shipped config). memlib's own families (gpt2, llama, mistral, qwen2, gemma, qwen3,
    olmo2, and gemma2, gemma3_text, phi3, gpt_neox, falcon through :mod:`memlib.core.families_dense`) are counted
    from the config alone, without torch, and so are the MoE and latent-attention families (mixtral,
    qwen2_moe, qwen3_moe, deepseek_v2, deepseek_v3: :func:`memlib.core.families_moe.count_params_moe`; total vs
    active parameters: :func:`memlib.core.families_moe.moe_params`). Any other causal LM transformers knows is
    counted from its class built on the meta device (no memory, no download): that needs torch and
    transformers.

    Args:
        model: shipped name, path to a config.json, config dict or ModelConfig.

    Returns:
        The count with its breakdown.
    """
    cfg = load_config(model, any_family=True)
    if not cfg.native:
        return _count_built(cfg)
    if cfg.model_type in DENSE_FAMILIES:
        return _from_tensors(*families_dense.param_tensors(cfg), cfg.num_layers)
    if cfg.moe is not None or cfg.mla is not None:  # Mixtral, Qwen2/3-MoE, DeepSeek-V2/V3: memlib.core.families_moe
        return families_moe.count_params_moe(cfg)
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


def _count_built(cfg: ModelConfig) -> ParamCount:
    """Count a family memlib does not derive itself from its transformers class built on the meta device.

    The components are read from the modules: norms (a module class named ``*Norm``), attention (under an
    ``attn``/``attention`` module), embeddings (``nn.Embedding``), the LM head (the output embedding when not
    tied), MLP (everything else in the layers: experts and routers included). ``per_layer`` is the largest
    layer (DeepSeek's dense first layers are smaller than its MoE layers).
    """
    from ..measure.deps import require_torch

    torch = require_torch(f"counting the parameters of model_type {cfg.model_type!r}")
    from ..measure.trace import _decoder_layers, build_model

    net = build_model(cfg, device="meta", dtype="bf16", attention="eager")  # every family has eager attention
    head = net.get_output_embeddings()
    head_weight = getattr(head, "weight", None)
    parts = {"embeddings": 0, "attention": 0, "mlp": 0, "norms": 0, "lm_head": 0}
    owner: dict[int, tuple[str, Any]] = {}
    for mod_name, mod in net.named_modules():
        for p_name, p in mod.named_parameters(recurse=False):
            owner.setdefault(id(p), (f"{mod_name}.{p_name}", mod))
    total = small = tensors = 0
    for p in net.parameters():  # each tensor once (a tied head is the embedding)
        name, mod = owner[id(p)]
        n = p.numel()
        total += n
        tensors += 1
        small += n if n < 4096 else 0
        if "norm" in type(mod).__name__.lower():
            parts["norms"] += n
        elif p is head_weight and not isinstance(mod, torch.nn.Embedding):
            parts["lm_head"] += n
        elif isinstance(mod, torch.nn.Embedding):
            parts["embeddings"] += n
        elif any(k in name for k in ("attn", "attention")):
            parts["attention"] += n
        else:
            parts["mlp"] += n
    per_layer = max(sum(p.numel() for p in layer.parameters()) for layer in _decoder_layers(net))
    return ParamCount(params=total, per_layer=per_layer, small_tensor_params=small, num_tensors=tensors, **parts)
