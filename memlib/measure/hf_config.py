"""Model families only transformers knows: their config objects, ModelConfigs and parameter counts (Chapter 1).

The torch/transformers side of :mod:`memlib.core.configs` and :mod:`memlib.core.params`: memlib's own families
are read and counted by those pure modules; any other causal LM transformers knows is read through its config
class (:func:`load_any_config`) and counted from its class built on the meta device (:func:`count_params_any`).
transformers and torch are imported lazily.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from ..core.configs import SUPPORTED_MODEL_TYPES, ModelConfig, config_source, load_config, unsupported_model_type
from ..core.errors import MemlibError
from .deps import require_torch
from ..core.params import ParamCount, count_params

__all__ = ["transformers_config", "config_from_transformers", "load_any_config", "count_built", "count_params_any"]


def transformers_config(d: dict[str, Any]) -> Any:
    """The transformers config object of a config dict whose model_type transformers knows as a causal LM.

    Introduced in Chapter 1 (model families). Imports transformers lazily (it is optional: memlib's own
    families need neither it nor torch).

    Raises:
        MemlibError: transformers is not installed, does not know the model_type as a causal LM, or rejects
            the config; the message names the model type, memlib's families and ``--params``.
    """
    model_type = d.get("model_type")
    try:
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    except ImportError:
        choices = ", ".join(SUPPORTED_MODEL_TYPES)
        raise MemlibError(f"model_type {model_type!r} needs transformers (pip install transformers); memlib "
                          f"itself knows: {choices}; for model states only, give --params N") from None
    if not isinstance(model_type, str) or model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise unsupported_model_type(model_type, True)
    try:
        return CONFIG_MAPPING[model_type](**{k: v for k, v in d.items() if k != "model_type"})
    except Exception as e:  # transformers validates its own fields (e.g. heads that do not divide the width)
        msg = " ".join(str(e).split())
        raise MemlibError(f"transformers rejects the {model_type} config: {msg}") from None


def config_from_transformers(d: dict[str, Any], name: str) -> ModelConfig:
    """A ModelConfig (``native=False``) of a model type only transformers knows, read from its config class."""
    c = transformers_config(d)

    def attr(*names: str, default: Any = None) -> Any:
        for n in names:
            value = getattr(c, n, None)
            if isinstance(value, int) and not isinstance(value, bool):
                return value
        return default

    hidden = attr("hidden_size", "n_embd", "d_model")
    layers = attr("num_hidden_layers", "n_layer", "num_layers")
    heads = attr("num_attention_heads", "n_head", "num_heads")
    if hidden is None or layers is None or heads is None:
        raise MemlibError(f"config of model_type {d.get('model_type')!r} has no hidden_size, num_hidden_layers "
                          f"or num_attention_heads; for model states only, give --params N")
    kv_heads = attr("num_key_value_heads", "num_kv_heads", default=1 if getattr(c, "multi_query", False) else heads)
    head_dim = attr("head_dim", default=hidden // heads)
    inner = attr("intermediate_size", "ffn_hidden_size", "n_inner", default=4 * hidden)
    max_pos = attr("max_position_embeddings", "n_positions", default=2048)
    return ModelConfig(
        name=name, model_type=str(d["model_type"]), hidden_size=hidden, num_layers=layers, num_heads=heads,
        num_kv_heads=kv_heads, head_dim=head_dim, intermediate_size=inner, vocab_size=attr("vocab_size", default=0),
        max_position_embeddings=max_pos, max_positions=max_pos,  # these configs state their scaled length
        tie_word_embeddings=bool(getattr(c, "tie_word_embeddings", False)), mlp="gated", norm="rmsnorm",
        qkv_bias=False, out_bias=False, mlp_bias=False, learned_positions=False, embed_scale=False,
        attn_dropout=0.0, resid_dropout=0.0, embd_dropout=0.0, raw=dict(d), native=False,
    )


def count_built(cfg: ModelConfig) -> ParamCount:
    """Count a family memlib does not derive itself from its transformers class built on the meta device.

    The components are read from the modules: norms (a module class named ``*Norm``), attention (under an
    ``attn``/``attention`` module), embeddings (``nn.Embedding``), the LM head (the output embedding when not
    tied), MLP (everything else in the layers: experts and routers included). ``per_layer`` is the largest
    layer (DeepSeek's dense first layers are smaller than its MoE layers).
    """

    torch = require_torch(f"counting the parameters of model_type {cfg.model_type!r}")
    from .trace import _decoder_layers, build_model

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


def load_any_config(model: str | Path | dict[str, Any] | ModelConfig) -> ModelConfig:
    """:func:`memlib.core.configs.load_config` for any causal LM: memlib's families natively, others through
    transformers' config class (``native=False``). Introduced in Chapter 1.

    Raises:
        MemlibError: as ``load_config``; a model_type neither memlib nor transformers knows as a causal LM.
    """
    if isinstance(model, ModelConfig):
        return model
    data, name = config_source(model)
    if data.get("model_type") in SUPPORTED_MODEL_TYPES:
        return load_config(model, any_family=True)
    return config_from_transformers(data, name)


def count_params_any(model: str | Path | dict[str, Any] | ModelConfig) -> ParamCount:
    """:func:`memlib.core.params.count_params` for any causal LM (others than memlib's families need torch).

    Introduced in Chapter 1.
    """
    cfg = load_any_config(model)
    return count_params(cfg) if cfg.native else count_built(cfg)
