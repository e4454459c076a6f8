"""Mixture-of-experts and latent-attention families: exact parameters, activations and KV cache, pure Python.

Covers Mixtral, Qwen2-MoE, Qwen3-MoE, DeepSeek-V2 and DeepSeek-V3 (Chapter 1's model families; issue 20). Every
formula follows the transformers implementation it names (``transformers/models/<family>/modeling_<family>.py``
and the experts kernel ``transformers/integrations/moe.py:grouped_mm_experts_forward``) and is checked against
the class built on the meta device (parameters) and against :func:`memlib.measure.trace.trace_training` (activations).

Routing assumption: an expert layer's activations do not depend on how the router splits the tokens. transformers
runs the experts as grouped matrix products over all b·s·k (token, expert) pairs sorted by expert, so the saved
tensors have b·s·k rows whatever the routing; the estimates state **balanced routing** (each of the E experts gets
b·s·k/E tokens), which is also what a meta-device trace holds. Real routing changes the per-expert split, not the
sizes (checked on CPU tensors in bench/accuracy.py --families).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .attention_terms import eager_softmax_terms, gqa_attention_terms
from .configs import ModelConfig, load_config
from .errors import MemlibError
from .families_dense import count_params_dense
from .terms import ActivationTerm, ParamCount


__all__ = ["MoEParams", "moe_params", "count_params_moe", "activation_terms_moe", "kv_elements_per_token",
           "largest_tensor"]


@dataclass(frozen=True)
class MoEParams:
    """Total and active-per-token parameters of a model. Introduced in Chapter 1 (model families).

    Attributes:
        total: every parameter (all experts): what training holds weights, gradients and optimizer states for.
        active: parameters one token passes through: everything except the routed experts it is not sent to
            (top-k of E routed experts per MoE layer; shared experts, attention, embeddings and LM head included).
        routed_experts: parameters of all routed experts together.
        moe_layers: layers with a MoE block.
        num_experts: routed experts per MoE layer (0 for a dense model).
        top_k: experts per token (0 for a dense model).
    """

    total: int
    active: int
    routed_experts: int
    moe_layers: int
    num_experts: int
    top_k: int

    def as_dict(self) -> dict[str, int]:
        """The fields as a plain dict (for JSON)."""
        return asdict(self)


def _attention_tensors(cfg: ModelConfig) -> list[int]:
    """Element counts of one layer's attention parameters (projections, biases, q/k norms)."""
    h, a = cfg.hidden_size, cfg.num_heads
    mla = cfg.mla
    if mla is None:  # Mixtral, Qwen2-MoE (q/k/v biases), Qwen3-MoE (q_norm, k_norm over each head)
        q, kv = cfg.q_dim, cfg.kv_dim
        tensors = [h * q, h * kv, h * kv, q * h]
        tensors += [q, kv, kv] if cfg.qkv_bias else []
        tensors += [h] if cfg.out_bias else []
        return tensors
    # DeepseekV3Attention.__init__ (and V2's): q through a low-rank pair (q_a_proj, an RMSNorm counted with the
    # norms, q_b_proj) or one q_proj, the compressed latent plus the shared rotary key (kv_a_proj_with_mqa), the
    # up-projection to per-head k_nope and v (kv_b_proj), and o_proj; attention_bias adds biases to q_a, kv_a, o.
    bias = bool(cfg.raw.get("attention_bias", False))
    dqk, r, dr = mla.qk_head_dim, mla.kv_lora_rank, mla.qk_rope_head_dim
    if mla.q_lora_rank is None:
        tensors = [h * a * dqk]
    else:
        qr = mla.q_lora_rank
        tensors = [h * qr] + ([qr] if bias else []) + [qr * a * dqk]
    tensors += [h * (r + dr)] + ([r + dr] if bias else []) + [r * a * (mla.qk_nope_head_dim + mla.v_head_dim)]
    tensors += [a * mla.v_head_dim * h] + ([h] if bias else [])
    return tensors


def _norm_tensors(cfg: ModelConfig) -> list[int]:
    """Element counts of one layer's norm weights: the two RMSNorms, MLA's kv_a/q_a norms, Qwen3-MoE's q/k norms."""
    h, mla = cfg.hidden_size, cfg.mla
    tensors = [h, h]
    if mla is not None:
        tensors += [mla.kv_lora_rank] + ([mla.q_lora_rank] if mla.q_lora_rank is not None else [])
    if cfg.model_type == "qwen3_moe":
        tensors += [cfg.head_dim, cfg.head_dim]
    return tensors


def _mlp_tensors(cfg: ModelConfig, moe_layer: bool) -> list[int]:
    """Element counts of one layer's MLP parameters: a dense gated MLP, or router + experts + shared expert."""
    h = cfg.hidden_size
    moe = cfg.moe
    if moe is None or not moe_layer:
        return [h * cfg.intermediate_size] * 3  # gate_proj, up_proj, down_proj
    fe, fs, E = moe.expert_intermediate_size, moe.shared_intermediate_size, moe.num_experts
    tensors = [E * h, E * 2 * fe * h, E * h * fe]  # router weight; experts' gate_up_proj and down_proj (3-D)
    if fs:
        tensors += [h * fs] * 3
        tensors += [h] if moe.shared_gate else []  # Qwen2MoeSparseMoeBlock.shared_expert_gate
    return tensors


def _is_moe_layer(cfg: ModelConfig, i: int) -> bool:
    return cfg.moe is not None and i in cfg.moe.moe_layers


def count_params_moe(cfg: ModelConfig) -> ParamCount:
    """Exact parameter count of a MoE or MLA model, without torch (``memlib.core.params.count_params`` calls it).

    Equal to ``sum(p.numel() for p in model.parameters())`` of the transformers class (tested for every shipped
    config of these families and the tiny bench configs): the MoE blocks (``MixtralSparseMoeBlock``,
    ``Qwen2MoeSparseMoeBlock``, ``DeepseekV3MoE``) hold a router weight (E, h), the experts as two 3-D tensors
    (E, 2f, h) and (E, h, f), and the shared expert MLP; DeepSeek-V3's ``e_score_correction_bias`` is a buffer.
    ``per_layer`` is the largest layer (a MoE layer).
    """
    h, L, V = cfg.hidden_size, cfg.num_layers, cfg.vocab_size
    attn = _attention_tensors(cfg)
    norms = _norm_tensors(cfg)
    mlp_total = small = tensors = per_layer = 0
    for i in range(L):
        mlp = _mlp_tensors(cfg, _is_moe_layer(cfg, i))
        layer = attn + mlp + norms
        mlp_total += sum(mlp)
        small += sum(n for n in layer if n < 4096)
        tensors += len(layer)
        per_layer = max(per_layer, sum(layer))
    lm_head = 0 if cfg.tie_word_embeddings else V * h
    outside = [V * h, h] + ([] if cfg.tie_word_embeddings else [V * h])
    embed = V * h
    total = embed + L * (sum(attn) + sum(norms)) + mlp_total + h + lm_head
    return ParamCount(params=total, embeddings=embed, attention=L * sum(attn), mlp=mlp_total,
                      norms=L * sum(norms) + h, lm_head=lm_head, per_layer=per_layer,
                      small_tensor_params=small + sum(n for n in outside if n < 4096),
                      num_tensors=tensors + len(outside))


def moe_params(model: str | Path | dict[str, Any] | ModelConfig) -> MoEParams:
    """Total and active-per-token parameters (the key MoE fact: memory scales with total, compute with active).

    Introduced in Chapter 1 (model families). Active = total − (E − k) routed experts in every MoE layer: a
    token passes through k of the E routed experts, the shared experts, attention, norms, its embedding row
    and the LM head (conventionally counted whole, as the Mixtral paper, Jiang et al. 2024, and the DeepSeek-V3
    report, DeepSeek-AI 2024, do: 47B/13B and 671B/37B; ``jiang2024mixtral``, ``deepseekai2024v3`` in
    references.bib). A dense model has active == total.

    Args:
        model: shipped name, config.json path, dict or ModelConfig.

    Returns:
        The counts.
    """
    cfg = load_config(model)
    counted = count_params_moe(cfg) if cfg.moe is not None or cfg.mla is not None else count_params_dense(cfg)
    total = counted.params
    moe = cfg.moe
    if moe is None:
        return MoEParams(total=total, active=total, routed_experts=0, moe_layers=0, num_experts=0, top_k=0)
    per_expert = 3 * cfg.hidden_size * moe.expert_intermediate_size
    n_moe = len(moe.moe_layers)
    routed = n_moe * moe.num_experts * per_expert
    active = total - n_moe * (moe.num_experts - moe.top_k) * per_expert
    return MoEParams(total=total, active=active, routed_experts=routed, moe_layers=n_moe,
                     num_experts=moe.num_experts, top_k=moe.top_k)


def largest_tensor(cfg: ModelConfig) -> int:
    """Elements of the largest parameter tensor other than the input embedding (a MoE layer's 3-D
    ``gate_up_proj``; the LM head when untied), for the optimizer step's one-tensor-at-a-time peak."""
    h = cfg.vocab_size * cfg.hidden_size
    sizes = [0 if cfg.tie_word_embeddings else h] + _attention_tensors(cfg) + _mlp_tensors(cfg, True)
    if cfg.moe is None or len(cfg.moe.moe_layers) < cfg.num_layers:
        sizes += _mlp_tensors(cfg, False)
    return max(sizes)


def kv_elements_per_token(cfg: ModelConfig) -> int | None:
    """Elements one token adds to an MLA model's KV cache (all layers), or None for a K/V-head model.

    DeepSeek-V2 (DeepSeek-AI 2024, arXiv:2405.04434, §2.1; ``deepseekai2024v2`` in references.bib) caches the
    compressed latent c_KV (``kv_lora_rank`` values) and the shared rotary key (``qk_rope_head_dim``) per layer:
    L·(d_c + d_R) elements per token instead of 2·L·a·d_h. transformers (``DeepseekV3Attention.forward`` and
    ``DeepseekV2Attention.forward``: "Cache read / write is performed while latent KV is still compressed") and
    vLLM's MLA backends store exactly that latent; memlib reports it. (Older transformers releases cached the decompressed per-head k and v.)
    """
    mla = cfg.mla
    if mla is None:
        return None
    return cfg.num_layers * (mla.kv_lora_rank + mla.qk_rope_head_dim)


def activation_terms_moe(cfg: ModelConfig, *, b: int, s: int, e: int, attention: str,
                         dropout: bool) -> list[ActivationTerm]:
    """What the forward pass of a MoE / MLA transformers model saves for backward, term by term.

    Called by :func:`memlib.core.estimate.activation_terms` (which validates the inputs). Derived from
    ``modeling_mixtral.py`` (``MixtralTopKRouter.forward``, ``MixtralSparseMoeBlock.forward``),
    ``modeling_qwen2_moe.py`` / ``modeling_qwen3_moe.py`` (``Qwen2MoeTopKRouter``, ``Qwen2MoeSparseMoeBlock``),
    ``modeling_deepseek_v2.py`` / ``modeling_deepseek_v3.py`` (``DeepseekV3TopkRouter.forward``, ``DeepseekV3MoE``,
    ``DeepseekV3Attention.forward``) and ``integrations/moe.py:grouped_mm_experts_forward`` (the experts).

    Assumes **balanced routing**: each of the E experts gets b·s·k/E tokens. The grouped experts kernel keeps
    b·s·k rows whatever the split, so the sizes hold for any routing (per-expert loops would not change them
    either: they save the same rows expert by expert).

    Args:
        cfg: a config with ``moe`` or ``mla`` set.
        b: batch size.
        s: sequence length.
        e: activation bytes (4 for fp32, 2 otherwise).
        attention: ``eager`` or ``sdpa``.
        dropout: apply the config's attention dropout.

    Returns:
        The terms; ``per_layer`` ones are per MoE layer (the largest); one model-level term corrects the dense
        layers (DeepSeek's first layers, Qwen's ``mlp_only_layers``).
    """
    T = b * s
    h, a, V, d = cfg.hidden_size, cfg.num_heads, cfg.vocab_size, cfg.head_dim
    q, kv = cfg.q_dim, cfg.kv_dim
    terms: list[ActivationTerm] = []

    def add(name: str, nbytes: int, formula: str, per_layer: bool = True) -> None:
        terms.append(ActivationTerm(name, int(nbytes), formula, per_layer))

    add("RMSNorm fp32 inputs ×2", 2 * 4 * T * h, "2·4·bsh")
    add("RMSNorm normalized and weighted outputs ×2", 2 * 2 * e * T * h, f"2·2·{e}·bsh")
    add("RMSNorm rsqrt (fp32) ×2", 2 * 4 * T, "2·4·bs")
    mla = cfg.mla
    if mla is None:
        window = cfg.raw.get("sliding_window") if cfg.model_type == "mixtral" else None
        gqa_attention_terms(add, cfg, batch_size=b, seq_len=s, act_bytes=e, attention=attention, dropout=dropout,
                            window=window)
        if cfg.model_type == "qwen3_moe":  # q_norm, k_norm over each head, as Qwen3
            a_kv = cfg.num_kv_heads
            add("q_norm, k_norm: fp32 inputs, normalized, rsqrt", (4 + e) * T * (q + kv) + 4 * T * (a + a_kv),
                f"(4 + {e})·bs(a + a_kv)·d + 4·bs(a + a_kv)")
        rope_dim = d
    else:
        # MLA (DeepseekV3Attention.forward): the latent's RMSNorm (and the query's, with q_lora_rank) keep the fp32
        # input, rsqrt, normalized and weighted outputs; q is the concatenation of q_nope and the rotated q_rope,
        # k a new tensor (k_nope and the shared rotated k_rope broadcast over the heads), v a view of kv_b_proj's
        # output (k_nope and v for all heads).
        r, dqk, dv = mla.kv_lora_rank, mla.qk_head_dim, mla.v_head_dim
        add("kv_a_layernorm: fp32 input, normalized, weighted; rsqrt", (4 + 2 * e) * T * r + 4 * T,
            f"(4 + 2·{e})·bs·d_c + 4·bs")
        if mla.q_lora_rank is not None:
            qr = mla.q_lora_rank
            add("q_a_layernorm: fp32 input, normalized, weighted; rsqrt", (4 + 2 * e) * T * qr + 4 * T,
                f"(4 + 2·{e})·bs·d_q + 4·bs")
        add("q (nope ‖ rotated rope), k (k_nope ‖ shared k_rope), decompressed", 2 * e * T * a * dqk,
            f"2·{e}·bs·a·(d_nope + d_rope)")
        if attention == "sdpa":
            if dv == dqk:
                add("v (a view of kv_b_proj's output: k_nope and v)", e * T * a * (mla.qk_nope_head_dim + dv),
                    f"{e}·bs·a·(d_nope + d_v)")
            else:  # the flash kernel wants one head width: v is zero-padded to the q/k width (memlib.measure.trace)
                add("v zero-padded to the q/k head width", e * T * a * dqk, f"{e}·bs·a·(d_nope + d_rope)")
            add("attention output (q/k head width)", e * T * a * dqk, f"{e}·bs·a·(d_nope + d_rope)")
            add("log-sum-exp (fp32)", 4 * b * a * s, "4·bas")
        else:
            eager_softmax_terms(add, b=b, a=a, s=s, e=e, dropout=dropout and cfg.attn_dropout > 0)
            add("v (contiguous copy for the matmul)", e * T * a * dv, f"{e}·bs·a·d_v")
        add("attention output (contiguous, o_proj input)", e * T * a * dv, f"{e}·bs·a·d_v")
        rope_dim = mla.qk_rope_head_dim
    terms.extend(_moe_block_terms(cfg, T, e))
    add("final RMSNorm", 4 * T * h + 2 * e * T * h + 4 * T, f"(4 + 2·{e})·bsh + 4·bs", per_layer=False)
    add("rotary cos, sin", 2 * e * s * rope_dim, f"2·{e}·s·d_rope", per_layer=False)
    add("log-softmax of the fp32 logits", 4 * T * V, "4·bsV", per_layer=False)
    add("input ids and labels", 16 * T, "16·bs", per_layer=False)
    return terms


def _moe_block_terms(cfg: ModelConfig, T: int, e: int) -> list[ActivationTerm]:
    """The MLP part of a layer: the MoE block per layer, and a model-level correction for the dense layers."""
    moe = cfg.moe
    h, f = cfg.hidden_size, cfg.intermediate_size
    dense_bytes = 4 * e * T * f
    if moe is None:
        return [ActivationTerm("MLP gate, up, activation, product", dense_bytes, f"4·{e}·bsf")]
    E, k, fe, fs = moe.num_experts, moe.top_k, moe.expert_intermediate_size, moe.shared_intermediate_size
    S = T * k  # (token, expert) pairs: balanced routing gives each expert S/E of them
    terms: list[ActivationTerm] = []

    def add(name: str, nbytes: int, formula: str, per_layer: bool = True) -> None:
        terms.append(ActivationTerm(name, int(nbytes), formula, per_layer))

    # Router. Mixtral/Qwen: logits in the model dtype, softmax in fp32 (saves its output), top-k (saves indices),
    # Mixtral always and Qwen with norm_topk_prob renormalize (sum and values kept). DeepSeek: the linear in fp32
    # (fp32 copies of its input and weight), softmax (V2) or sigmoid (V3) scores, group-limited top-k (V3: the
    # group top-2 indices, the chosen groups, the boolean mask), the gathered weights renormalized (V3).
    if moe.router_fp32 and e != 4:
        add("router fp32 copies of input and weight", 4 * T * h + 4 * E * h, "4·bsh + 4·E·h")
    add(f"router {'sigmoid' if moe.router == 'sigmoid' else 'softmax'} scores (fp32)", 4 * T * E, "4·bs·E")
    group = 0
    if moe.router == "sigmoid":
        group = 8 * T * moe.n_group * 2 + 8 * T * moe.topk_group + T * E
        formula = "8·bs·G·2 + 8·bs·G_k + bs·E"
    elif moe.topk_method == "group_limited_greedy":
        group = 8 * T * moe.n_group + T * E
        formula = "8·bs·G + bs·E"
    if group:
        add("group-limited top-k: group indices, boolean expert mask", group, formula)
    add("top-k expert indices (int64)", 8 * T * k, "8·bs·k")
    if moe.norm_topk_prob:
        add("top-k weights renormalized: values and sum (fp32)", 4 * T * k + 4 * T, "4·bs·k + 4·bs")
    w = e if cfg.model_type in ("qwen2_moe", "qwen3_moe") else 4  # Qwen casts the weights to the model dtype
    # Experts (grouped_mm_experts_forward): the pairs sorted by expert (permutation, token index, inverse
    # permutation: int64), the offsets per expert, the gathered inputs, gate_up output, act(gate), the product
    # (down_proj's input), down_proj's output and the routing weights (for the weighting product).
    add("experts: sort permutation, token index, inverse (int64)", 3 * 8 * S + 4 * E, "3·8·bs·k + 4·E")
    add("experts: gathered inputs and down_proj outputs", 2 * e * S * h, f"2·{e}·bs·k·h")
    add("experts: gate_up output, act(gate), product", 4 * e * S * fe, f"4·{e}·bs·k·f_e")
    add("experts: routing weights", w * S, f"{w}·bs·k")
    if fs:
        add("shared expert: gate, up, activation, product", 4 * e * T * fs, f"4·{e}·bs·f_s")
        if moe.shared_gate:
            add("shared expert sigmoid gate and output", e * T + e * T * h, f"{e}·bs + {e}·bsh")
    n_dense = cfg.num_layers - len(moe.moe_layers)
    if n_dense:
        moe_bytes = sum(t.bytes for t in terms)
        add(f"dense-MLP layers ({n_dense}): dense MLP in place of the MoE block", n_dense * (dense_bytes - moe_bytes),
            f"{n_dense}·(4·{e}·bsf − MoE block)", per_layer=False)
    return terms


def bottom_backward_bytes(cfg: ModelConfig, terms: list[ActivationTerm], grad_total: int, grad_per_param: float, *,
                          b: int, s: int, attention: str) -> int:
    """Bytes above the states late in the backward pass of a MoE model (no recomputation): a peak candidate.

    A MoE layer's gradients (all experts) outweigh its activations, so the peak comes at the bottom of the
    backward sweep: the gradients of every MoE layer and the LM head exist, the dense first layers (DeepSeek)
    still hold their activations and have no gradients yet, and the lowest layer's attention backward runs:
    its saved core (q, k, v, probabilities or log-sum-exp) plus, in eager attention, two fp32 b·a·s²
    temporaries (the probabilities' gradient and the softmax backward). Found in the meta traces of DeepSeek-V3
    (the full model and 6-layer variants); the input embedding's gradient comes after.
    """
    moe = cfg.moe
    per_layer = sum(t.bytes for t in terms if t.per_layer)
    n_dense = cfg.num_layers - len(moe.moe_layers) if moe is not None else 0
    dense_fix = sum(t.bytes for t in terms if not t.per_layer and t.name.startswith("dense-MLP layers"))
    dense_act = per_layer + dense_fix // n_dense if n_dense else 0
    dense_params = sum(_attention_tensors(cfg)) + sum(_norm_tensors(cfg)) + sum(_mlp_tensors(cfg, False))
    core = sum(t.bytes for t in terms if t.per_layer and t.name.startswith(("q", "softmax", "log-sum-exp", "v ")))
    temps = 2 * 4 * b * cfg.num_heads * s * s if attention == "eager" else 0
    embed_grad = 0 if cfg.tie_word_embeddings else int(grad_per_param * cfg.vocab_size * cfg.hidden_size)
    return (grad_total - embed_grad - int(grad_per_param * n_dense * dense_params) + n_dense * dense_act + core
            + temps)


def check_lora(cfg: ModelConfig, method: str) -> None:
    """Refuse LoRA/QLoRA estimates for the MoE/MLA families (their adapters are not derived)."""
    if method != "full":
        raise MemlibError(f"method {method!r} is estimated for gpt2, llama, mistral, qwen2, gemma and qwen3, not "
                          f"{cfg.model_type}; expected method 'full' (or trace a LoRA step: memlib.core.lora)")
