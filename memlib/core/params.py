"""Exact parameter counts of the transformers classes, with a breakdown by component (Chapter 1)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from . import families_moe
from .configs import ModelConfig, load_config
from .errors import MemlibError
from .families_dense import count_params_dense
from .terms import ParamCount

__all__ = ["ParamCount", "count_params"]


def count_params(model: str | Path | dict[str, Any] | ModelConfig) -> ParamCount:
    """Count the parameters of the transformers causal-LM class built from a config.

    Introduced in Chapter 1. Equal to ``sum(p.numel() for p in model.parameters())`` of the transformers
    model (tested for every shipped config). memlib's own families (gpt2, llama, mistral, qwen2, gemma, qwen3,
    olmo2, and gemma2, gemma3_text, phi3, gpt_neox, falcon through :mod:`memlib.core.families_dense`) are counted
    from the config alone, without torch, and so are the MoE and latent-attention families (mixtral,
    qwen2_moe, qwen3_moe, deepseek_v2, deepseek_v3: :func:`memlib.core.families_moe.count_params_moe`; total vs
    active parameters: :func:`memlib.core.families_moe.moe_params`). Any other causal LM transformers knows is
    counted from its class built on the meta device (no memory, no download) by
    :func:`memlib.measure.hf_config.count_params_any`, which needs torch and transformers.

    Args:
        model: shipped name, path to a config.json, config dict or ModelConfig.

    Returns:
        The count with its breakdown.
    """
    cfg = load_config(model, any_family=True)
    if not cfg.native:
        raise MemlibError(f"model_type {cfg.model_type!r} is counted from its transformers class: use "
                          f"memlib.measure.hf_config.count_params_any (needs torch and transformers)")
    if cfg.moe is not None or cfg.mla is not None:  # Mixtral, Qwen2/3-MoE, DeepSeek-V2/V3: memlib.core.families_moe
        return families_moe.count_params_moe(cfg)
    return count_params_dense(cfg)
