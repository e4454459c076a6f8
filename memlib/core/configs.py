"""Model configurations: read a Hugging Face ``config.json`` (or a shipped one) into a typed ModelConfig (Chapter 1)."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from .errors import MemlibError
from .hub import cached_config, close_matches, hf_cache_dir, looks_like_hub_id, shipped_for_id

__all__ = ["ModelConfig", "MoESpec", "MLASpec", "SUPPORTED_MODEL_TYPES", "shipped_models", "load_config", "check_seq_len",
           "config_source", "unsupported_model_type"]

#: model_type values memlib understands, and the transformers class each one builds.
SUPPORTED_MODEL_TYPES: dict[str, str] = {
    "gpt2": "GPT2LMHeadModel",
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "gemma": "GemmaForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "olmo2": "Olmo2ForCausalLM",
    # issue 20: dense families read by _dense_family_config (memlib/core/families_dense.py), then the MoE/MLA ones
    "gemma2": "Gemma2ForCausalLM",
    "gemma3_text": "Gemma3ForCausalLM",
    "phi3": "Phi3ForCausalLM",
    "gpt_neox": "GPTNeoXForCausalLM",
    "falcon": "FalconForCausalLM",
    "mixtral": "MixtralForCausalLM",
    "qwen2_moe": "Qwen2MoeForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "deepseek_v2": "DeepseekV2ForCausalLM",
    "deepseek_v3": "DeepseekV3ForCausalLM",
}

#: The families whose config :func:`_dense_family_config` reads (their own field names and defaults).
DENSE_FAMILIES = ("gemma2", "gemma3_text", "phi3", "gpt_neox", "falcon")

#: The mixture-of-experts families (:mod:`memlib.core.families_moe` derives their parameters and activations).
MOE_MODEL_TYPES = ("mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v2", "deepseek_v3")

_GATED_ACTS = {"silu", "swish", "gelu", "gelu_pytorch_tanh", "gelu_new"}


@dataclass(frozen=True)
class MoESpec:
    """The mixture-of-experts facts of a config (Mixtral, Qwen2-MoE, Qwen3-MoE, DeepSeek-V2/V3).

    Attributes:
        num_experts: routed experts E per MoE layer (``num_local_experts``, ``num_experts``, ``n_routed_experts``).
        top_k: experts each token is routed to (``num_experts_per_tok``).
        expert_intermediate_size: inner width of one routed expert (Mixtral: ``intermediate_size``; the others:
            ``moe_intermediate_size``).
        shared_intermediate_size: inner width of the always-on shared expert MLP (Qwen2-MoE:
            ``shared_expert_intermediate_size``; DeepSeek: ``n_shared_experts × moe_intermediate_size``); 0 if none.
        shared_gate: the shared expert's output is scaled by a sigmoid gate (Qwen2-MoE's ``shared_expert_gate``).
        moe_layers: indices of the layers with a MoE block; the others have a dense MLP of ``intermediate_size``
            (DeepSeek's ``first_k_dense_replace``; Qwen's ``decoder_sparse_step`` and ``mlp_only_layers``).
        router: ``"softmax"`` (softmax over the experts, then top-k: Mixtral, Qwen, DeepSeek-V2) or ``"sigmoid"``
            (DeepSeek-V3: sigmoid scores, group-limited top-k).
        norm_topk_prob: the top-k weights are renormalized to sum to one (always for Mixtral).
        router_fp32: the router runs in fp32 (DeepSeek: fp32 copies of its input and weight).
        topk_method: DeepSeek-V2's ``greedy`` or ``group_limited_greedy``; ``noaux_tc`` for DeepSeek-V3.
        n_group: expert groups for group-limited routing (DeepSeek), 1 otherwise.
        topk_group: groups each token may choose from.
    """

    num_experts: int
    top_k: int
    expert_intermediate_size: int
    shared_intermediate_size: int
    shared_gate: bool
    moe_layers: tuple[int, ...]
    router: str
    norm_topk_prob: bool
    router_fp32: bool
    topk_method: str
    n_group: int
    topk_group: int


@dataclass(frozen=True)
class MLASpec:
    """Multi-head latent attention (DeepSeek-V2 §2.1): keys and values come from a compressed latent.

    Attributes:
        q_lora_rank: rank of the query's low-rank projection (None: a full ``q_proj``, DeepSeek-V2-Lite).
        kv_lora_rank: width d_c of the compressed key/value latent (what an MLA KV cache keeps per token).
        qk_nope_head_dim: per-head query/key width without rotary.
        qk_rope_head_dim: width of the rotary part (one key part shared by all heads, cached with the latent).
        v_head_dim: per-head value width.
    """

    q_lora_rank: int | None
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int

    @property
    def qk_head_dim(self) -> int:
        """Query/key head width: qk_nope_head_dim + qk_rope_head_dim."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim


@dataclass(frozen=True)
class ModelConfig:
    """The architecture facts memory depends on, normalized across model families.

    Introduced in Chapter 1. Build one with :func:`load_config`.

    Attributes:
        name: shipped name or file stem.
        model_type: Hugging Face ``model_type`` (gpt2, llama, mistral, qwen2, gemma, qwen3, olmo2, gemma2,
            gemma3_text, phi3, gpt_neox, falcon; any other with ``native=False``).
        hidden_size: model width h.
        num_layers: number of transformer blocks L.
        num_heads: query heads a.
        num_kv_heads: key/value heads (== num_heads for MHA, 1 for MQA, in between for GQA).
        head_dim: width of one head (explicit in gemma; hidden_size // num_heads otherwise).
        intermediate_size: MLP inner width (4h for GPT-2).
        vocab_size: vocabulary size V.
        max_position_embeddings: the config's ``max_position_embeddings`` (``n_positions`` for GPT-2).
        max_positions: longest sequence the model accepts: ``max_position_embeddings``, or longer where the
            config scales its rotary embeddings (see :func:`load_config`); memlib refuses longer sequences.
        tie_word_embeddings: whether the LM head shares the embedding matrix.
        mlp: ``"gelu"`` (two matrices: GPT-2, GPT-NeoX, Falcon) or ``"gated"`` (gate/up/down: SwiGLU, GeGLU).
        norm: ``"layernorm"`` (weight and bias) or ``"rmsnorm"`` (weight only).
        qkv_bias: biases on the q/k/v projections (gpt2, qwen2).
        out_bias: bias on the attention output projection (gpt2).
        mlp_bias: biases on the MLP matrices (gpt2).
        learned_positions: a learned position-embedding table (gpt2) rather than rotary.
        embed_scale: embeddings multiplied by sqrt(h) (gemma).
        attn_dropout: dropout probability on attention probabilities (training).
        resid_dropout: dropout on the residual branches.
        embd_dropout: dropout after the embeddings.
        raw: the config dictionary as read, used to build the transformers model.
        native: True for the families memlib derives itself (:data:`SUPPORTED_MODEL_TYPES`); False for a
            model type only transformers knows (``load_config(..., any_family=True)``): its sizes are read
            from the transformers config class, and only :mod:`memlib.measure.trace` and :func:`memlib.core.params.count_params`
            (which builds it on the meta device) accept it.
        layer_types: per layer ``"sliding_attention"`` or ``"full_attention"`` (Gemma 2 alternates, Gemma 3 has
            five local layers to one global); empty when every layer attends alike (Mistral's window applies to
            all of its layers, read from ``raw``).
        sliding_window: tokens a sliding-window layer attends to (Gemma 2/3, Phi-3); None without one.
        attn_softcap: Gemma 2's ``attn_logit_softcapping`` (scores = c·tanh(scores/c)); None without.
        final_softcap: Gemma 2's ``final_logit_softcapping`` on the logits; None without.
        parallel_residual: attention and MLP read the same layer input (GPT-NeoX ``use_parallel_residual``,
            Falcon ``parallel_attn`` or ``new_decoder_architecture``).
        rotary_dim: rotary width per head, read for the families of :data:`DENSE_FAMILIES` (GPT-NeoX:
            ``rotary_pct`` × head_dim; 0 with Falcon's ALiBi); 0 (unused) for the others.
        post_norms: a norm after attention and after the MLP as well as before (Gemma 2/3).
        qk_norm: RMSNorm of each query and key head before rotary (Gemma 3).
        num_norms_in: LayerNorms that read the layer input (Falcon's ``new_decoder_architecture``: 2).
        alibi: Falcon's ALiBi position bias instead of rotary.
        moe: the mixture-of-experts facts (:class:`MoESpec`) of a MoE family; None for a dense model.
        mla: the latent-attention facts (:class:`MLASpec`) of DeepSeek-V2/V3; None otherwise.
    """

    name: str
    model_type: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    max_positions: int
    tie_word_embeddings: bool
    mlp: str
    norm: str
    qkv_bias: bool
    out_bias: bool
    mlp_bias: bool
    learned_positions: bool
    embed_scale: bool
    attn_dropout: float
    resid_dropout: float
    embd_dropout: float
    raw: dict[str, Any] = field(repr=False, compare=False, hash=False)
    native: bool = field(default=True, compare=False)
    layer_types: tuple[str, ...] = ()
    sliding_window: int | None = None
    attn_softcap: float | None = None
    final_softcap: float | None = None
    parallel_residual: bool = False
    rotary_dim: int = 0
    post_norms: bool = False
    qk_norm: bool = False
    num_norms_in: int = 1
    alibi: bool = False
    moe: MoESpec | None = None
    mla: MLASpec | None = None

    @property
    def q_dim(self) -> int:
        """Width of all query heads together (num_heads × head_dim)."""
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        """Width of all key (or value) heads together (num_kv_heads × head_dim)."""
        return self.num_kv_heads * self.head_dim


#: The shipped configs the book's chapters, widgets and tests iterate over (:func:`shipped_models`' default).
BOOK_MODELS = ("gemma-2b", "gpt2", "gpt2-large", "gpt2-medium", "gpt2-xl", "llama-2-13b", "llama-2-70b",
               "llama-2-7b", "llama-3-70b", "llama-3-8b", "llama-7b", "mistral-7b", "qwen2-0.5b")


def shipped_models(all_models: bool = False) -> list[str]:
    """Names of the configs shipped with memlib (``memlib/configs/*.json``), sorted.

    Args:
        all_models: every shipped config, the current families only transformers builds (qwen3, gemma2, mixtral,
            deepseek, ...) included; by default the book's set (:data:`BOOK_MODELS`), all of memlib's own families.
    """
    folder = resources.files("memlib.core") / "configs"
    names = sorted(p.name[: -len(".json")] for p in folder.iterdir() if p.name.endswith(".json"))
    return names if all_models else [n for n in names if n in BOOK_MODELS]


def _read_json(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except OSError as e:
        raise MemlibError(f"cannot read config file {str(path)!r}: {e.strerror}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise MemlibError(f"malformed JSON in {str(path)!r}: {e.msg} at line {e.lineno} column {e.colno}") from None
    if not isinstance(data, dict):
        raise MemlibError(f"malformed config {str(path)!r}: expected a JSON object, got {type(data).__name__}")
    return data


def _get(d: dict[str, Any], keys: tuple[str, ...], default: Any = None, *, required: bool = True) -> Any:
    for k in keys:
        if d.get(k) is not None:
            return d[k]
    if required and default is None:
        raise MemlibError(f"config is missing {keys[0]!r} (model_type {d.get('model_type')!r})")
    return default


def _positive(d: dict[str, Any], keys: tuple[str, ...], default: Any = None) -> int:
    value = _get(d, keys, default)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise MemlibError(f"config field {keys[0]!r} must be a positive integer, got {value!r}")
    return value


def _scaled_positions(d: dict[str, Any], max_pos: int) -> int:
    """The longest sequence a rotary model accepts, rope scaling included.

    The rule, from the config's own fields: with a ``rope_scaling`` (or transformers 5's ``rope_parameters``)
    entry carrying a ``factor``, the limit is ``max(max_position_embeddings, original × factor)``, where
    ``original`` is the entry's (or the config's) ``original_max_position_embeddings`` and otherwise
    ``max_position_embeddings`` itself. So linear/dynamic scaling of a 4,096-position model by 2 allows
    8,192; Llama-3.1 (``llama3`` type, factor 8 over 8,192, ``max_position_embeddings`` 131,072 already
    stated) allows 131,072; YaRN with factor 4 over 32,768 allows 131,072. Without a factor, or with
    ``rope_type`` ``default``, the limit is ``max_position_embeddings``.
    """
    entries: list[Any] = []
    for key in ("rope_scaling", "rope_parameters"):
        value = d.get(key)
        if isinstance(value, dict):
            nested = [v for v in value.values() if isinstance(v, dict)]  # per-layer-type parameters
            entries.extend(nested or [value])
    limit = max_pos
    for entry in entries:
        factor = entry.get("factor")
        if factor is None or entry.get("rope_type", entry.get("type")) == "default":
            continue
        if isinstance(factor, bool) or not isinstance(factor, (int, float)) or factor < 1:
            raise MemlibError(f"rope scaling factor must be a number ≥ 1, got {factor!r}")
        original = entry.get("original_max_position_embeddings") or d.get("original_max_position_embeddings")
        if original is None:
            original = max_pos
        if isinstance(original, bool) or not isinstance(original, int) or original <= 0:
            raise MemlibError(f"config field 'original_max_position_embeddings' must be a positive integer, "
                              f"got {original!r}")
        limit = max(limit, int(original * factor))
    return limit


def check_seq_len(model: ModelConfig, seq_len: int) -> int:
    """Return ``seq_len``, or raise :class:`MemlibError` if the model cannot take sequences that long.

    Introduced in Chapter 1. A model has ``max_positions`` positions (GPT-2: ``n_positions`` = 1024; a rotary
    model: ``max_position_embeddings``, longer with rope scaling); transformers fails on longer inputs (GPT-2's
    position table raises IndexError), so memlib refuses to estimate, trace or plan them.

    Args:
        model: the loaded config.
        seq_len: tokens per sequence.

    Returns:
        ``seq_len``.

    Raises:
        MemlibError: ``seq_len`` above the limit; the message names both.
    """
    if seq_len > model.max_positions:
        field_name = "n_positions" if model.model_type == "gpt2" else "max_position_embeddings"
        how = (field_name if model.max_positions == model.max_position_embeddings
               else f"{field_name} {model.max_position_embeddings:,} with rope scaling")
        raise MemlibError(f"seq_len {seq_len:,} exceeds {model.name}'s maximum of {model.max_positions:,} positions "
                          f"({how}); expected seq_len ≤ {model.max_positions:,}")
    return seq_len


def unsupported_model_type(model_type: Any, any_family: bool) -> MemlibError:
    """The error for a model_type memlib does not derive (``any_family``: the wording for the trace's loader)."""
    choices = ", ".join(SUPPORTED_MODEL_TYPES)
    if any_family:
        return MemlibError(f"unsupported model_type {model_type!r}; expected one of: {choices}, or a causal-LM "
                           f"model_type transformers knows; for model states only, give --params N")
    return MemlibError(f"unsupported model_type {model_type!r}; expected one of: {choices} (memlib trace and "
                       f"memlib params also take any causal LM transformers knows; --params N for model states only)")


def _flag(d: dict[str, Any], key: str, default: bool) -> bool:
    value = d.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise MemlibError(f"config field {key!r} must be true or false, got {value!r}")
    return value


def _probability(d: dict[str, Any], key: str) -> float:
    value = d.get(key)
    if value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
        raise MemlibError(f"config field {key!r} must be a probability in [0, 1), got {value!r}")
    return float(value)


def _softcap(d: dict[str, Any], key: str, default: float | None) -> float | None:
    value = d.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise MemlibError(f"config field {key!r} must be a positive number or null, got {value!r}")
    return float(value)


def _layer_types(d: dict[str, Any], layers: int, pattern: int) -> tuple[str, ...]:
    """Gemma 2/3 layer kinds: the config's ``layer_types``, else every ``pattern``-th layer global.

    As ``Gemma2Config``/``Gemma3TextConfig.__post_init__`` decide: layer i is ``"sliding_attention"`` when
    ``(i + 1) % pattern`` is nonzero (Gemma 2: pattern 2, local first; Gemma 3: ``sliding_window_pattern``,
    6 by default: five local layers, then one global).
    """
    given = d.get("layer_types")
    kinds = ("sliding_attention", "full_attention")
    if given is None:
        return tuple("sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(layers))
    if not isinstance(given, list) or len(given) != layers or any(k not in kinds for k in given):
        raise MemlibError(f"config field 'layer_types' must list {layers} entries, each one of: {', '.join(kinds)}; "
                          f"got {given!r}")
    return tuple(given)


def _dense_family_config(d: dict[str, Any], name: str) -> ModelConfig:
    """A ModelConfig of gemma2, gemma3_text, phi3, gpt_neox or falcon, with transformers' defaults.

    The defaults are those of ``Gemma2Config``, ``Gemma3TextConfig``, ``Phi3Config``, ``GPTNeoXConfig`` and
    ``FalconConfig`` (transformers 5): a field missing from the config.json takes the class's value.
    """
    model_type = str(d["model_type"])
    hidden = _positive(d, ("hidden_size",))
    layers = _positive(d, ("num_hidden_layers",))
    heads = _positive(d, ("num_attention_heads",))
    vocab = _positive(d, ("vocab_size",))
    gemma = model_type in ("gemma2", "gemma3_text")
    if gemma:
        head_dim = _positive(d, ("head_dim",), 256)
    else:
        if hidden % heads != 0:
            raise MemlibError(f"num_attention_heads {heads} does not divide hidden_size {hidden}; "
                              f"choose heads among the divisors of {hidden}")
        head_dim = hidden // heads
    if model_type == "falcon":
        new_arch = _flag(d, "new_decoder_architecture", False)
        multi_query = _flag(d, "multi_query", True)
        groups = _positive(d, ("num_kv_heads",), heads)
        kv_heads = groups if (new_arch or not multi_query) else 1
        inner = _positive(d, ("ffn_hidden_size",), 4 * hidden)
        act = d.get("activation") or "gelu"
        parallel = new_arch or _flag(d, "parallel_attn", True)
        n_in = (d.get("num_ln_in_parallel_attn") or 2) if new_arch else 1
        if n_in not in (1, 2):
            raise MemlibError(f"config field 'num_ln_in_parallel_attn' must be 1 or 2, got {n_in!r}")
        alibi = _flag(d, "alibi", False)
        bias = _flag(d, "bias", False)
        qkv_bias = out_bias = mlp_bias = bias
        attn_p, resid_p, embd_p = _probability(d, "attention_dropout"), _probability(d, "hidden_dropout"), 0.0
        tie = _flag(d, "tie_word_embeddings", True)
        max_pos = _positive(d, ("max_position_embeddings",), 2048)
    elif model_type == "gpt_neox":
        kv_heads = heads
        inner = _positive(d, ("intermediate_size",), 24576)
        act = d.get("hidden_act") or "gelu"
        parallel, n_in, alibi = _flag(d, "use_parallel_residual", True), 1, False
        qkv_bias = out_bias = _flag(d, "attention_bias", True)
        mlp_bias = True
        attn_p, resid_p = _probability(d, "attention_dropout"), _probability(d, "hidden_dropout")
        embd_p = resid_p  # GPTNeoXModel.emb_dropout uses hidden_dropout
        tie = _flag(d, "tie_word_embeddings", False)
        max_pos = _positive(d, ("max_position_embeddings",), 2048)
    else:  # gemma2, gemma3_text, phi3: llama-like blocks
        kv_heads = _positive(d, ("num_key_value_heads",), 4 if gemma else heads)
        inner = _positive(d, ("intermediate_size",), 9216 if gemma else 8192)
        act = d.get("hidden_activation") or d.get("hidden_act") or ("gelu_pytorch_tanh" if gemma else "silu")
        if act not in _GATED_ACTS:
            raise MemlibError(f"unsupported hidden_act {act!r}; expected one of: {', '.join(sorted(_GATED_ACTS))}")
        parallel, n_in, alibi = False, 1, False
        qkv_bias = out_bias = _flag(d, "attention_bias", False)
        mlp_bias = False
        attn_p = _probability(d, "attention_dropout")
        resid_p = _probability(d, "resid_pdrop") if model_type == "phi3" else 0.0
        embd_p = 0.0  # Phi3Model reads embd_pdrop but applies no embedding dropout
        tie = _flag(d, "tie_word_embeddings", gemma)
        max_pos = _positive(d, ("max_position_embeddings",), {"gemma2": 8192, "gemma3_text": 131072}.get(model_type, 4096))
    if model_type in ("gpt_neox", "falcon") and act not in ("gelu",):
        raise MemlibError(f"unsupported activation {act!r} for {model_type}; expected one of: gelu")
    if heads % kv_heads != 0:
        raise MemlibError(f"{'num_kv_heads' if model_type == 'falcon' else 'num_key_value_heads'} {kv_heads} does not "
                          f"divide num_attention_heads {heads}")
    window: int | None = None
    layer_types: tuple[str, ...] = ()
    if gemma:
        window = _positive(d, ("sliding_window",), 4096)
        scalar = d.get("query_pre_attn_scalar", 256)  # scores scale by scalar^-0.5 instead of head_dim^-0.5: no memory
        if isinstance(scalar, bool) or not isinstance(scalar, (int, float)) or scalar <= 0:
            raise MemlibError(f"config field 'query_pre_attn_scalar' must be a positive number, got {scalar!r}")
        pattern = 2 if model_type == "gemma2" else _positive(d, ("sliding_window_pattern",), 6)
        layer_types = _layer_types(d, layers, pattern)
    elif model_type == "phi3" and d.get("sliding_window") is not None:
        window = _positive(d, ("sliding_window",))
    rope_value = d.get("rope_parameters")
    rope: dict[str, Any] = rope_value if isinstance(rope_value, dict) else {}
    if model_type == "gpt_neox":
        factor = rope.get("partial_rotary_factor", d.get("rotary_pct", 0.25))
    elif model_type == "phi3":
        factor = rope.get("partial_rotary_factor", d.get("partial_rotary_factor", 1.0))
    else:
        factor = 1.0
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not 0 < factor <= 1:
        raise MemlibError(f"rotary fraction (rotary_pct / partial_rotary_factor) must be in (0, 1], got {factor!r}")
    return ModelConfig(
        name=name, model_type=model_type, hidden_size=hidden, num_layers=layers, num_heads=heads,
        num_kv_heads=kv_heads, head_dim=head_dim, intermediate_size=inner, vocab_size=vocab,
        max_position_embeddings=max_pos, max_positions=max_pos,  # these configs state their scaled length
        tie_word_embeddings=tie, mlp="gated" if act in _GATED_ACTS and model_type not in ("gpt_neox", "falcon")
        else "gelu", norm="layernorm" if model_type in ("gpt_neox", "falcon") else "rmsnorm",
        qkv_bias=qkv_bias, out_bias=out_bias, mlp_bias=mlp_bias, learned_positions=False, embed_scale=gemma,
        attn_dropout=attn_p, resid_dropout=resid_p, embd_dropout=embd_p, raw=dict(d),
        layer_types=layer_types, sliding_window=window,
        attn_softcap=_softcap(d, "attn_logit_softcapping", 50.0 if model_type == "gemma2" else None) if gemma else None,
        final_softcap=_softcap(d, "final_logit_softcapping", 30.0 if model_type == "gemma2" else None) if gemma
        else None,
        parallel_residual=parallel, rotary_dim=0 if alibi else int(head_dim * factor), post_norms=gemma,
        qk_norm=model_type == "gemma3_text", num_norms_in=n_in, alibi=alibi,
    )


def _int_field(d: dict[str, Any], key: str, default: int | None, *, minimum: int = 1) -> int:
    """A config integer field (transformers' default where absent), checked to be ≥ ``minimum``."""
    value = d.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        what = "a positive integer" if minimum == 1 else f"an integer ≥ {minimum}"
        raise MemlibError(f"config field {key!r} must be {what}, got {value!r} (model_type {d.get('model_type')!r})")
    return value


def _moe_spec(d: dict[str, Any], model_type: str, layers: int) -> MoESpec:
    """The MoE fields of a Mixtral, Qwen2-MoE, Qwen3-MoE or DeepSeek-V2/V3 config, with the transformers
    config classes' defaults (``configuration_<family>.py``) for absent fields."""
    experts_key, experts_default = {"mixtral": ("num_local_experts", 8), "qwen2_moe": ("num_experts", 60),
                                    "qwen3_moe": ("num_experts", 128), "deepseek_v2": ("n_routed_experts", 64),
                                    "deepseek_v3": ("n_routed_experts", 256)}[model_type]
    num_experts = _int_field(d, experts_key, experts_default)
    top_k = _int_field(d, "num_experts_per_tok", {"mixtral": 2, "qwen2_moe": 4, "qwen3_moe": 8,
                                                  "deepseek_v2": None, "deepseek_v3": 8}[model_type])
    if top_k > num_experts:
        raise MemlibError(f"num_experts_per_tok {top_k} exceeds the {num_experts} experts ({experts_key}); "
                          f"expected 1 to {num_experts}")
    if model_type == "mixtral":
        inner = _int_field(d, "intermediate_size", 14336)
    else:
        inner = _int_field(d, "moe_intermediate_size", {"qwen2_moe": 1408, "qwen3_moe": 768, "deepseek_v2": 1407,
                                                        "deepseek_v3": 2048}[model_type])
    shared, gate = 0, False
    if model_type == "qwen2_moe":
        shared, gate = _int_field(d, "shared_expert_intermediate_size", 5632, minimum=0), True
    elif model_type.startswith("deepseek"):
        shared = inner * _int_field(d, "n_shared_experts", 2 if model_type == "deepseek_v2" else 1, minimum=0)
    if model_type.startswith("qwen"):
        step = _int_field(d, "decoder_sparse_step", 1)
        dense = d.get("mlp_only_layers") or []
        if not isinstance(dense, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in dense):
            raise MemlibError(f"config field 'mlp_only_layers' must be a list of layer indices, got {dense!r}")
        moe_layers = tuple(i for i in range(layers) if i not in dense and (i + 1) % step == 0)
    elif model_type.startswith("deepseek"):
        first = _int_field(d, "first_k_dense_replace", 0 if model_type == "deepseek_v2" else 3, minimum=0)
        moe_layers = tuple(range(first, layers))
    else:
        moe_layers = tuple(range(layers))
    v3 = model_type == "deepseek_v3"
    method = d.get("topk_method") or ("noaux_tc" if v3 else "greedy")
    n_group = d.get("n_group") if model_type.startswith("deepseek") else None
    topk_group = d.get("topk_group") if model_type.startswith("deepseek") else None
    if v3 or method == "group_limited_greedy":
        n_group = _int_field(d, "n_group", 8 if v3 else None)
        topk_group = _int_field(d, "topk_group", 4 if v3 else None)
        if num_experts % n_group or topk_group > n_group:
            raise MemlibError(f"n_group {n_group} must divide the {num_experts} routed experts and topk_group "
                              f"{topk_group} must be at most n_group")
    if model_type == "deepseek_v2" and method not in ("greedy", "group_limited_greedy"):
        raise MemlibError(f"unsupported topk_method {method!r}; expected one of: greedy, group_limited_greedy")
    norm = {"mixtral": True, "deepseek_v2": False}.get(model_type, bool(d.get("norm_topk_prob", v3)))
    return MoESpec(num_experts=num_experts, top_k=top_k, expert_intermediate_size=inner,
                   shared_intermediate_size=shared, shared_gate=gate, moe_layers=moe_layers,
                   router="sigmoid" if v3 else "softmax", norm_topk_prob=norm,
                   router_fp32=model_type.startswith("deepseek"), topk_method=str(method),
                   n_group=int(n_group or 1), topk_group=int(topk_group or 1))


def _mla_spec(d: dict[str, Any]) -> MLASpec:
    """The latent-attention fields of a DeepSeek-V2/V3 config (``q_lora_rank: null`` means a full q_proj)."""
    q_rank = d["q_lora_rank"] if "q_lora_rank" in d else 1536
    if q_rank is not None:
        q_rank = _int_field({"q_lora_rank": q_rank, "model_type": d.get("model_type")}, "q_lora_rank", None)
    return MLASpec(q_lora_rank=q_rank, kv_lora_rank=_int_field(d, "kv_lora_rank", 512),
                   qk_nope_head_dim=_int_field(d, "qk_nope_head_dim", 128),
                   qk_rope_head_dim=_int_field(d, "qk_rope_head_dim", 64),
                   v_head_dim=_int_field(d, "v_head_dim", 128))


def _from_dict(d: dict[str, Any], name: str, any_family: bool = False) -> ModelConfig:
    model_type = d.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:  # families only transformers knows: memlib.measure.hf_config
        raise unsupported_model_type(model_type, any_family)
    if model_type in DENSE_FAMILIES:
        return _dense_family_config(d, name)
    hidden = _positive(d, ("hidden_size", "n_embd"))
    layers = _positive(d, ("num_hidden_layers", "n_layer"))
    heads = _positive(d, ("num_attention_heads", "n_head"))
    kv_heads = _positive(d, ("num_key_value_heads",), heads)
    explicit_head_dim = d.get("head_dim")
    if explicit_head_dim is None and hidden % heads != 0 and model_type not in ("qwen3", "deepseek_v2", "deepseek_v3"):
        raise MemlibError(
            f"num_attention_heads {heads} does not divide hidden_size {hidden}; "
            f"choose heads among the divisors of {hidden} or give head_dim"
        )
    head_dim = _positive(d, ("head_dim",), 128 if model_type == "qwen3" else hidden // heads)  # Qwen3Config: 128
    mla = _mla_spec(d) if model_type in ("deepseek_v2", "deepseek_v3") else None
    if mla is not None:
        head_dim = mla.qk_head_dim  # the query/key head width; values are v_head_dim wide
    if heads % kv_heads != 0:
        raise MemlibError(f"num_key_value_heads {kv_heads} does not divide num_attention_heads {heads}")
    vocab = _positive(d, ("vocab_size",))
    if model_type == "gpt2":
        inner = d.get("n_inner") or 4 * hidden
        if isinstance(inner, bool) or not isinstance(inner, int) or inner <= 0:
            raise MemlibError(f"config field 'n_inner' must be a positive integer, got {inner!r}")
        return ModelConfig(
            name=name, model_type="gpt2", hidden_size=hidden, num_layers=layers, num_heads=heads,
            num_kv_heads=heads, head_dim=hidden // heads, intermediate_size=inner, vocab_size=vocab,
            max_position_embeddings=(n_pos := _positive(d, ("n_positions", "max_position_embeddings"), 1024)),
            max_positions=n_pos,
            tie_word_embeddings=bool(d.get("tie_word_embeddings", True)), mlp="gelu", norm="layernorm",
            qkv_bias=True, out_bias=True, mlp_bias=True, learned_positions=True, embed_scale=False,
            attn_dropout=float(d.get("attn_pdrop", 0.1)), resid_dropout=float(d.get("resid_pdrop", 0.1)),
            embd_dropout=float(d.get("embd_pdrop", 0.1)), raw=dict(d),
        )
    act = d.get("hidden_activation") or d.get("hidden_act") or "silu"
    if act not in _GATED_ACTS:
        raise MemlibError(f"unsupported hidden_act {act!r}; expected one of: {', '.join(sorted(_GATED_ACTS))}")
    default_tie = model_type == "gemma"
    moe = _moe_spec(d, model_type, layers) if model_type in MOE_MODEL_TYPES else None
    inner_default = {"mixtral": 14336, "qwen2_moe": 5632, "qwen3_moe": 6144, "deepseek_v2": 11008,
                     "deepseek_v3": 18432}.get(model_type)
    max_pos_default = {"qwen3": 32768, "qwen3_moe": 32768, "qwen2_moe": 32768, "mixtral": 131072,
                       "deepseek_v3": 4096}.get(model_type, 2048)
    return ModelConfig(
        name=name, model_type=model_type, hidden_size=hidden, num_layers=layers, num_heads=heads,
        num_kv_heads=kv_heads, head_dim=head_dim, intermediate_size=_positive(d, ("intermediate_size",), inner_default),
        vocab_size=vocab,
        max_position_embeddings=(n_pos := _positive(d, ("max_position_embeddings",), max_pos_default)),
        max_positions=_scaled_positions(d, n_pos),
        tie_word_embeddings=bool(d.get("tie_word_embeddings", default_tie)), mlp="gated", norm="rmsnorm",
        qkv_bias=(model_type == "qwen2" or (model_type == "qwen2_moe" and bool(d.get("qkv_bias", True)))
                  or (model_type != "qwen2_moe" and bool(d.get("attention_bias", False)))),
        out_bias=model_type not in ("qwen2", "qwen2_moe") and bool(d.get("attention_bias", False)),
        mlp_bias=bool(d.get("mlp_bias", False)), learned_positions=False, embed_scale=model_type == "gemma",
        attn_dropout=float(d.get("attention_dropout", 0.0)), resid_dropout=0.0, embd_dropout=0.0, raw=dict(d),
        moe=moe, mla=mla,
    )


def load_config(model: str | Path | dict[str, Any] | ModelConfig, *, any_family: bool = False) -> ModelConfig:
    """Load a model configuration.

    Introduced in Chapter 1.

    Args:
        model: a shipped name (``"llama-2-7b"``; see :func:`shipped_models`), its Hugging Face id
            (``"meta-llama/Llama-2-7b-hf"``) or any id in the local Hugging Face cache (:func:`config_source`), a
            path to a Hugging Face ``config.json``, a dict with its contents, or a ModelConfig (returned as is).
        any_family: also accept a ``native=False`` ModelConfig (a model_type only transformers knows, read by
            :func:`memlib.measure.hf_config.load_any_config`, which needs transformers; this pure module never
            imports it). The estimators leave it False: they refuse families whose terms memlib has not derived.

    Returns:
        The normalized ModelConfig.

    Raises:
        MemlibError: unknown name or missing file, malformed JSON, unsupported model_type, heads that do
            not divide the hidden size, non-positive sizes.
    """
    if isinstance(model, ModelConfig):
        if not model.native and not any_family:
            raise unsupported_model_type(model.model_type, False)
        return model
    data, name = config_source(model)
    return _from_dict(data, name, any_family)


def config_source(model: str | Path | dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The raw config dict and the model's name, from a shipped name, a Hugging Face id, a config.json path or a dict.

    Introduced in Chapter 1 (what :func:`load_config` reads before it normalizes). A path that exists is read as
    given; an id memlib ships (``meta-llama/Llama-3.1-8B``, case-insensitive; :data:`memlib.core.hub.HF_IDS`)
    is its shipped config (named by the shipped name); any other ``ORG/NAME`` is read from the local Hugging
    Face cache (:func:`memlib.core.hub.cached_config`, never the network) and named by the id.

    Raises:
        MemlibError: unknown name or id (one line: not shipped, not in the local cache, which cache, the close
            matches), missing file or malformed JSON.
    """
    if isinstance(model, dict):
        return model, str(model.get("_name_or_path") or model.get("model_type") or "config")
    text = str(model)
    path = Path(text)
    names = shipped_models(all_models=True)
    if text.endswith(".json") or path.is_file() or ("/" in text and (path.exists() or not looks_like_hub_id(text))):
        if path.is_dir():
            path = path / "config.json"
        if not path.exists():
            raise MemlibError(f"config file {text!r} does not exist")
        return _read_json(path), path.parent.name if path.name == "config.json" else path.stem
    if text in names:
        return _shipped(text), text
    hit = shipped_for_id(text)
    if hit is not None:
        return {**_shipped(hit[0]), **hit[1]}, hit[0]
    cached = cached_config(text)
    if cached is not None:
        return _read_json(cached), text
    raise MemlibError(_unknown_model(text, names))


def _shipped(name: str) -> dict[str, Any]:
    folder = resources.files("memlib.core") / "configs"
    data: dict[str, Any] = json.loads((folder / f"{name}.json").read_text())
    return data


def _unknown_model(text: str, names: list[str]) -> str:
    """The one error line for a name that is neither shipped nor in the local cache."""
    close = close_matches(text, names)
    near = f"; close matches: {', '.join(close)}" if close else ""
    where = f"not in the local Hugging Face cache ({hf_cache_dir()})"
    if looks_like_hub_id(text):
        return (f"unknown model {text!r}: not shipped with memlib and {where}; download it, or pass a path to its "
                f"config.json{near}")
    return (f"unknown model {text!r}; expected one of: {', '.join(names)}, a Hugging Face id (ORG/NAME) or a path "
            f"to a config.json; {where}{near}")
