"""Model families only transformers knows: their config objects, ModelConfigs and parameter counts (Chapter 1).

The torch/transformers side of :mod:`memlib.core.configs` and :mod:`memlib.core.params`: memlib's own families
are read and counted by those pure modules; any other causal LM transformers knows is read through its config
class (:func:`load_any_config`) and counted from its class built on the meta device (:func:`count_params_any`).
:func:`build_model` builds the transformers model of any of them (:mod:`memlib.measure.trace` traces it and
re-exports it). transformers and torch are imported lazily.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from ..core.choices import ATTENTION, MODEL_DTYPES
from ..core.configs import SUPPORTED_MODEL_TYPES, ModelConfig, config_source, load_config, unsupported_model_type
from ..core.errors import MemlibError, check_choice
from ..core.params import ParamCount, count_params
from .deps import require_torch

__all__ = ["transformers_config", "config_from_transformers", "load_any_config", "build_model", "count_built",
           "count_params_any"]


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


def build_model(model: str | Path | dict[str, Any] | ModelConfig, *, device: str = "meta",
                dtype: str = "fp32", attention: str = "sdpa", overrides: dict[str, Any] | None = None) -> Any:
    """Build the transformers causal-LM model of a config, without downloading anything.

    Introduced in Chapter 1.

    Args:
        model: shipped name, config.json path, dict or ModelConfig.
        device: ``"meta"`` (no memory), ``"cpu"`` or ``"cuda"``.
        dtype: ``"fp32"``, ``"bf16"`` or ``"fp16"``.
        attention: ``"eager"`` or ``"sdpa"`` (transformers' ``attn_implementation``).
        overrides: config fields to replace (e.g. ``{"num_hidden_layers": 2}``).

    Returns:
        The ``torch.nn.Module`` in train mode.
    """
    torch = require_torch("memlib.measure.trace")
    check_choice("attention", attention, ATTENTION)
    check_choice("dtype", dtype, MODEL_DTYPES)
    cfg = load_any_config(model)
    raw = _with_layers(dict(cfg.raw), overrides)
    load_any_config(raw)  # validate the overridden config
    try:
        import transformers
    except ImportError:  # pragma: no cover
        raise ImportError("building models needs transformers: pip install transformers") from None
    transformers.logging.set_verbosity_error()
    torch_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    native = raw["model_type"] in _CLASSES
    if native:
        config_cls, model_cls = _model_classes(raw["model_type"])
        hf_cfg = config_cls(**raw)
    else:  # any causal LM transformers knows, through its auto classes
        hf_cfg = transformers_config(raw)
        model_cls = None
    hf_cfg._attn_implementation = attention
    hf_cfg.use_cache = False
    try:
        built = _build(native, model_cls if native else None, hf_cfg, attention, device)
    except ValueError as e:  # transformers refuses an attention implementation the family lacks
        msg = " ".join(str(e).split())
        raise MemlibError(f"transformers cannot build model_type {raw['model_type']!r} with attention "
                          f"{attention!r}: {msg[:160]}") from None
    net = built.to(torch_dtype)
    net.train()
    return net


def _build(native: bool, model_cls: Any, hf_cfg: Any, attention: str, device: str) -> Any:
    """Instantiate the causal-LM class (its own class for memlib's families, the auto class otherwise)."""
    torch = require_torch("memlib.measure.trace")
    with torch.device(device):
        if native:
            net = model_cls._from_config(hf_cfg, attn_implementation=attention)
        else:
            from transformers import AutoModelForCausalLM

            net = AutoModelForCausalLM.from_config(hf_cfg, attn_implementation=attention)
    return net


# model_type -> (config class, causal-LM class), imported from their own modules: the auto classes would
# import transformers' whole auto machinery first (a third of a second of `memlib trace`).
_CLASSES = {"gpt2": ("GPT2Config", "GPT2LMHeadModel"), "llama": ("LlamaConfig", "LlamaForCausalLM"),
            "mistral": ("MistralConfig", "MistralForCausalLM"), "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
            "gemma": ("GemmaConfig", "GemmaForCausalLM"), "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
            "olmo2": ("Olmo2Config", "Olmo2ForCausalLM"), "mixtral": ("MixtralConfig", "MixtralForCausalLM"),
            "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM"),
            "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM"),
            "deepseek_v2": ("DeepseekV2Config", "DeepseekV2ForCausalLM"),
            "deepseek_v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM")}


def _with_layers(raw: dict[str, Any], overrides: dict[str, Any] | None) -> dict[str, Any]:
    """``raw`` updated with ``overrides``; a new layer count also cuts per-layer lists (``layer_types``) to it."""
    raw.update(overrides or {})
    n = (overrides or {}).get("num_hidden_layers")
    if isinstance(n, int):
        for key in ("layer_types",):
            value = raw.get(key)
            if isinstance(value, list) and len(value) > n and key not in (overrides or {}):
                raw[key] = value[:n]
    return raw


def _model_classes(model_type: str) -> tuple[Any, Any]:
    import importlib

    config_name, model_name = _CLASSES[model_type]
    configs = importlib.import_module(f"transformers.models.{model_type}.configuration_{model_type}")
    models = importlib.import_module(f"transformers.models.{model_type}.modeling_{model_type}")
    return getattr(configs, config_name), getattr(models, model_name)


def _decoder_layers(net: Any) -> Any:
    """The ModuleList of decoder layers of a transformers causal LM (llama-like, GPT-2, or the longest list)."""
    torch = require_torch("memlib.measure.trace")
    inner: Any = getattr(net, "model", None) or getattr(net, "transformer", None)
    layers = getattr(inner, "layers", None) if inner is not None else None
    if layers is None and inner is not None:
        layers = getattr(inner, "h", None)
    if layers is None:  # other families (gpt_neox.layers, ...): the longest ModuleList of the model
        lists = [m for m in net.modules() if isinstance(m, torch.nn.ModuleList)]
        layers = max(lists, key=len)
    return layers
