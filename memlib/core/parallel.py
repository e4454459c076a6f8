"""Tensor, sequence, pipeline, context and expert parallelism: per-GPU memory of the worst rank (Chapter 15).

Pure Python, no torch. The degrees compose with ZeRO/FSDP data parallelism: ``num_gpus`` is the total and
dp = num_gpus / (tp·pp·cp). Sources, term by term:

* Tensor parallelism (Megatron, Shoeybi et al. 2019): every attention and MLP linear is split over tp GPUs;
  the activations inside attention and the MLP are split too; norms, the residual stream and its dropout are
  replicated. Korthikanti et al. 2022 (§4.2.1) give the per-layer total sbh(10 + 24/t + 5as/(ht)).
* Sequence parallelism (Korthikanti et al. 2022, §4.2.2): the replicated part is split along the sequence,
  giving sbh/t·(34 + 5as/h).
* Pipeline parallelism (Narayanan et al. 2021, §2.2): the layers are split into pp stages; the first stage
  holds the activations of the micro-batches in flight: m with GPipe, p with 1F1B, p·(1 + (p−1)/(pv)) with the
  interleaved schedule of v chunks per GPU (Korthikanti et al. 2022, §4.2.3). Bubble: (p−1)/(m+p−1), and
  (p−1)/(vm+p−1) interleaved.
* Context parallelism (Ultra-Scale Playbook, Tazi et al. 2025; Llama 3, Dubey et al. 2024, §3.3.2): every
  sequence activation is split over cp GPUs; ring attention keeps two K/V chunks in flight (the one computed
  on and the one being received).
* Expert parallelism (Ultra-Scale Playbook; Lepikhin et al. 2021): the experts are split over ep GPUs and
  tokens travel by all-to-all to their experts and back (dispatch and combine buffers).

The activations per layer are memlib's own derived terms (:func:`memlib.core.estimate.activation_terms`), each
classified as split by tensor parallelism (attention heads, MLP width) or by sequence parallelism (norms,
residual stream): :func:`split_terms`. Korthikanti's closed form is :func:`korthikanti_layer_bytes`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import families_moe
from .choices import ATTENTION, RECOMPUTE, SCHEDULES, check_framework
from .configs import ModelConfig, check_seq_len, load_config
from .errors import MemlibError, check_choice, check_positive
from .frameworks import get_framework
from .schedules import bubble_fraction, bubble_ratio, in_flight, schedule_weight_copies, zero_bubble_units
from .params import count_params
from .setup import TrainingSetup
from .states import states_estimate
from .terms import TrainingEstimate

__all__ = [
    "SCHEDULES",
    "Layout",
    "valid_tp",
    "num_experts",
    "check_layout",
    "bubble_fraction",
    "bubble_ratio",
    "zero_bubble_units",
    "schedule_weight_copies",
    "in_flight",
    "stage_layers",
    "korthikanti_layer_bytes",
    "term_split",
    "split_terms",
    "stage_params",
    "ring_kv_buffer_bytes",
    "column_linears",
    "sp_gathered_extra_bytes",
    "cp_allgather_attention_bytes",
    "tp_buffer_bytes",
    "expert_parallel_bytes",
    "moe_stage_params",
    "comm_bytes_per_layer",
    "estimate_parallel",
]


@dataclass(frozen=True)
class Layout:
    """A validated parallel layout. Introduced in Chapter 15.

    Attributes:
        tp: tensor-parallel degree t.
        pp: pipeline stages p.
        cp: context-parallel degree (sequence split for attention).
        ep: expert-parallel degree (1 for dense models). Megatron-Core's MoE parallel folding: the expert layers
            have their own grid etp·ep·edp·pp over the same GPUs, so EP folds over TP, CP and DP ranks.
        dp: data-parallel degree: num_gpus / (tp·pp·cp); ZeRO/FSDP and Megatron's distributed optimizer shard
            the non-expert states over dp·cp (Megatron's ``dp_cp_group``, TorchTitan's ``dp_shard_cp`` mesh).
        sequence_parallel: norms and the residual stream split along the sequence over the tp GPUs.
        micro_batches: micro-batches m per optimizer step and pipeline.
        schedule: ``gpipe``, ``1f1b`` or ``interleaved``.
        virtual_stages: model chunks v per GPU for the interleaved schedule (1 otherwise).
        etp: expert tensor-parallel degree (``--expert-tensor-parallel-size``): each expert's linears split over
            etp GPUs; the expert-data-parallel group is num_gpus / (etp·ep·pp).
    """

    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    dp: int = 1
    sequence_parallel: bool = False
    micro_batches: int = 1
    schedule: str = "1f1b"
    virtual_stages: int = 1
    etp: int = 1

    @property
    def num_gpus(self) -> int:
        """Total GPUs: tp·pp·cp·dp."""
        return self.tp * self.pp * self.cp * self.dp

    @property
    def zero_ranks(self) -> int:
        """Ranks that shard the non-expert optimizer states (ZeRO, Megatron's distributed optimizer, FSDP): dp·cp.

        Context-parallel ranks hold the same weights and all-reduce their gradients like data-parallel ranks, so
        Megatron-Core builds the distributed optimizer over ``dp_cp_group`` (``megatron/core/parallel_state.py``,
        ``get_data_parallel_group(with_context_parallel=True)``) and TorchTitan's FSDP mesh is ``dp_shard_cp``
        (``torchtitan/distributed/parallel_dims.py``)."""
        return self.dp * self.cp

    @property
    def expert_dp(self) -> int:
        """The expert-data-parallel group: num_gpus / (etp·ep·pp) (Megatron-Core's MoE parallel folding)."""
        return self.num_gpus // (self.etp * self.ep * self.pp)

    @property
    def is_default(self) -> bool:
        """True when no model-parallel degree is used (plain data parallelism)."""
        return (self.tp, self.pp, self.cp, self.ep, self.sequence_parallel) == (1, 1, 1, 1, False)


def valid_tp(cfg: ModelConfig | str, limit: int = 64) -> list[int]:
    """Tensor-parallel degrees up to ``limit`` that divide both the attention heads and the KV heads.

    Introduced in Chapter 15. Megatron-LM's rule for training (``num_query_groups % tp == 0``): each GPU
    computes whole heads and owns whole KV groups. Llama-3.1-70B (64 heads, 8 KV heads): 1, 2, 4, 8.
    """
    cfg = load_config(cfg)
    return [t for t in range(1, check_positive("limit", limit) + 1)
            if cfg.num_heads % t == 0 and cfg.num_kv_heads % t == 0]


def num_experts(cfg: ModelConfig) -> int:
    """Routed experts per MoE layer from the config (``num_local_experts``, ``n_routed_experts``,
    ``num_experts``); 0 for a dense model."""
    for key in ("num_local_experts", "n_routed_experts", "num_experts"):
        v = cfg.raw.get(key)
        if isinstance(v, int) and v > 0:
            return v
    return 0


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def check_layout(cfg: ModelConfig | None, num_gpus: int, *, tp: int = 1, pp: int = 1, cp: int = 1, ep: int = 1,
                 sequence_parallel: bool = False, micro_batches: int = 1, schedule: str = "1f1b",
                 virtual_stages: int = 2, seq_len: int | None = None, etp: int | None = None) -> Layout:
    """Validate the degrees against the model and the GPU count; return the :class:`Layout`.

    Introduced in Chapter 15. Each bad value raises one line naming it and the valid values.

    Args:
        cfg: the model (None: only the GPU arithmetic is checked, for ``params=N`` estimates).
        num_gpus: total GPUs.
        tp, pp, cp, ep: the degrees.
        sequence_parallel: split norms and the residual stream over the tp GPUs.
        micro_batches: micro-batches per step (the pipeline's m).
        schedule: one of :data:`SCHEDULES`.
        virtual_stages: chunks per GPU for ``interleaved`` (ignored otherwise).
        seq_len: checked to divide by 2·cp (load-balanced causal split) when given.
        etp: expert tensor-parallel degree; None: 1 with ep > 1 (EP folded over the TP ranks, the MoE recipes'
            choice) and tp otherwise (Megatron-Core's default ``expert_tensor_parallel_size = tp``).

    Raises:
        MemlibError: tp not dividing the heads, pp above the layers, num_gpus not divisible by tp·pp·cp,
            ep not dividing the experts, num_gpus not divisible by etp·ep·pp (Megatron-Core's MoE parallel
            folding, ``megatron/core/parallel_state.py``, ``initialize_model_parallel``: the expert grid
            etp·ep·edp·pp spans the same GPUs as tp·cp·dp·pp, so EP folds over TP, CP and DP ranks;
            DeepSpeed-MoE's rule is the stricter "ep divides dp"), a bad schedule or micro-batch count.
    """
    n = check_positive("num_gpus", num_gpus)
    t, p, c, e = (check_positive(k, v) for k, v in (("tp", tp), ("pp", pp), ("cp", cp), ("ep", ep)))
    et = check_positive("etp", etp) if etp is not None else (1 if e > 1 else t)
    m = check_positive("micro_batches", micro_batches)
    check_choice("pipeline schedule", schedule, SCHEDULES)
    v = check_positive("virtual_stages", virtual_stages) if schedule == "interleaved" else 1
    if cfg is not None:
        if cfg.num_heads % t or cfg.num_kv_heads % t:
            valid = ", ".join(map(str, valid_tp(cfg, max(cfg.num_heads, t))))
            raise MemlibError(f"tp {t} does not divide {cfg.name}'s {cfg.num_heads} attention heads and "
                              f"{cfg.num_kv_heads} KV heads; expected one of: {valid}")
        if p > cfg.num_layers:
            raise MemlibError(f"pp {p} is more than {cfg.name}'s {cfg.num_layers} layers; expected 1 to "
                              f"{cfg.num_layers}")
        if schedule == "interleaved" and cfg.num_layers % (p * v):
            ok = [q for q in range(1, cfg.num_layers + 1) if cfg.num_layers % (q * v) == 0]
            raise MemlibError(f"interleaved schedule: {cfg.num_layers} layers do not split into pp·v = {p}·{v} "
                              f"chunks; expected pp one of: {', '.join(map(str, ok))}")
        experts = num_experts(cfg)
        if e > 1 and experts == 0:
            raise MemlibError(f"ep {e} needs an MoE model; {cfg.name} has no experts; expected ep 1")
        if experts and experts % e:
            raise MemlibError(f"ep {e} does not divide {cfg.name}'s {experts} experts; expected one of: "
                              f"{', '.join(map(str, _divisors(experts)))}")
    elif e > 1:
        raise MemlibError(f"ep {e} needs an MoE model, not params=N; expected ep 1")
    mp = t * p * c
    if n % mp:
        raise MemlibError(f"gpus {n} is not divisible by tp·pp·cp = {t}·{p}·{c} = {mp}; expected a multiple "
                          f"of {mp}")
    dp = n // mp
    if n % (et * e * p):
        raise MemlibError(f"gpus {n} is not divisible by etp·ep·pp = {et}·{e}·{p} = {et * e * p} (Megatron-Core's "
                          f"MoE folding: the expert grid spans the same GPUs); expected ep one of: "
                          f"{', '.join(str(x) for x in _divisors(n // (et * p)))}")
    if schedule == "interleaved" and p > 1 and m % p:
        raise MemlibError(f"interleaved schedule: micro_batches {m} is not a multiple of pp {p}; expected a "
                          f"multiple of {p}")
    if seq_len is not None and c > 1 and seq_len % (2 * c):
        raise MemlibError(f"cp {c}: seq_len {seq_len} does not split into 2·cp = {2 * c} equal chunks; expected "
                          f"a multiple of {2 * c}")
    return Layout(t, p, c, e, dp, bool(sequence_parallel), m, schedule, v, et)


def stage_layers(num_layers: int, pp: int) -> list[int]:
    """Layers per pipeline stage: an even split, the first L mod p stages one layer more.

    When pp does not divide the layers the first stages are the heavier ones (and the slowest): the
    imbalance is max/min of this list.
    """
    L, p = check_positive("num_layers", num_layers), check_positive("pp", pp)
    if p > L:
        raise MemlibError(f"pp {p} is more than the {L} layers; expected 1 to {L}")
    return [L // p + (1 if i < L % p else 0) for i in range(p)]


def korthikanti_layer_bytes(seq_len: int, batch_size: int, hidden_size: int, num_heads: int, tp: int = 1,
                            sequence_parallel: bool = False, recompute: str = "none") -> int:
    """Activation bytes of one GPT layer per GPU, Korthikanti et al. 2022, Table 2.

    Introduced in Chapter 15. 16-bit activations, 1-byte dropout masks:

    * no parallelism: sbh(34 + 5as/h)
    * tensor parallel: sbh(10 + 24/t + 5as/(ht))
    * tensor + sequence parallel: sbh/t·(34 + 5as/h)
    * selective recomputation drops the 5as/h term; full recomputation keeps the layer input, 2sbh
      (2sbh/t with sequence parallelism).
    """
    s, b, h, a = (check_positive(k, v) for k, v in (("seq_len", seq_len), ("batch_size", batch_size),
                                                      ("hidden_size", hidden_size), ("num_heads", num_heads)))
    t = check_positive("tp", tp)
    check_choice("recompute", recompute, RECOMPUTE)
    core = 0 if recompute == "selective" else 5 * a * s / h
    if recompute == "full":
        return int(2 * s * b * h / (t if sequence_parallel else 1))
    if sequence_parallel:
        return int(s * b * h / t * (34 + core))
    return int(s * b * h * (10 + 24 / t + core / t))


# What the tensor-parallel split divides: the attention heads (q, k, v, scores, the output before o_proj,
# the log-sum-exp) and the MLP width (gate/up/activation, GPT-2's c_fc); per-head q_norm/k_norm too. The rest
# of a layer (norms, the residual stream, residual dropout) is replicated, and split by sequence parallelism.
_TP_KEYS = ("q, k", "q after", "q_norm", "attention output", "log-sum-exp", "softmax", "attention dropout",
            "k, v repeated", "MLP")


def term_split(name: str) -> str:
    """``"tp"`` if tensor parallelism divides the activation term ``name``, ``"sp"`` if only sequence
    parallelism does, ``"none"`` for what stays whole (the sliding-window mask, the ids, rotary tables, and the
    inputs a DTensor plan all-gathers before a column-parallel linear, which autograd saves gathered)."""
    if "sliding-window" in name or "input ids" in name or "rotary cos" in name or "all-gathered" in name:
        return "none"
    if "residual stream" in name:
        return "sp"
    if any(k in name for k in _TP_KEYS):
        return "tp"
    return "sp"


def split_terms(terms: list[Any], tp: int, sequence_parallel: bool, cp: int = 1) -> tuple[int, int, int]:
    """Per-GPU activation bytes (per layer, before the layers, after the layers) from memlib's terms.

    ``terms`` come from :func:`memlib.core.estimate.activation_terms` at the per-GPU sequence s/cp. Tensor-split
    terms are divided by tp; sequence-split ones by tp with sequence parallelism. Outside the layers, the
    embedding side (ids, rotary tables, embedding dropout) stays whole; the final norm follows sequence
    parallelism and the fp32 log-softmax of the logits is vocab-parallel (divided by tp, Megatron's
    parallel cross-entropy and PyTorch's ``loss_parallel``).

    Returns:
        (per-layer bytes, first-stage outside bytes, last-stage outside bytes).
    """
    per_layer = first = last = 0
    for term in terms:
        kind = term_split(term.name)
        div = tp if kind == "tp" or (kind == "sp" and sequence_parallel) else 1
        if "log-softmax" in term.name:
            div = tp
        nbytes = -(-term.bytes // div)
        if term.per_layer:
            per_layer += nbytes
        elif "input ids" in term.name or "rotary cos" in term.name or "embedding" in term.name:
            first += nbytes
        else:
            last += nbytes
    return per_layer, first, last


def stage_params(cfg: ModelConfig, tp: int, pp: int) -> list[int]:
    """Parameters each pipeline stage holds per tensor-parallel GPU (dense models).

    The attention and MLP linears of a layer are split over tp (Megatron's column/row-parallel linears, bias
    of row-parallel linears whole); norms are replicated. The embedding (first stage) and the LM head (last
    stage) are vocab-parallel (split over tp); a tied matrix is held by both end stages when pp > 1.
    """
    pc = count_params(cfg)
    L = cfg.num_layers
    h = cfg.hidden_size
    norms_per_layer = 2 * h * (2 if cfg.norm == "layernorm" else 1)
    linears = pc.per_layer - norms_per_layer
    if cfg.model_type == "qwen3":  # q_norm, k_norm (per head, replicated)
        linears -= 2 * cfg.head_dim
        norms_per_layer += 2 * cfg.head_dim
    layer = -(-linears // tp) + norms_per_layer
    final_norm = h * (2 if cfg.norm == "layernorm" else 1)
    embed = -(-pc.embeddings // tp)
    head = -(-(pc.lm_head or cfg.vocab_size * h) // tp)
    layers = stage_layers(L, pp)
    out = [n * layer for n in layers]
    out[0] += embed
    if pp == 1:
        out[0] += final_norm + (head if pc.lm_head else 0)
    else:
        out[-1] += final_norm + head
    return out


def column_linears(cfg: ModelConfig) -> int:
    """Column-parallel linears per layer as transformers writes them (unfused): q, k, v and gate, up (5 for a
    gated MLP, 4 without: q, k, v, up); GPT-2's fused c_attn and c_fc: 2. Megatron fuses them into 2."""
    if cfg.model_type == "gpt2":
        return 2
    return 5 if cfg.mlp == "gated" else 4


def sp_gathered_extra_bytes(cfg: ModelConfig, batch_size: int, seq_len: int, tp: int, act_bytes: int = 2) -> int:
    """What PyTorch DTensor sequence parallelism saves per layer beyond Megatron's: every column-parallel linear
    keeps its own all-gathered input, n_col·e·bsh, where Megatron keeps the two norm outputs sharded, 2·e·bsh/t.

    Introduced in Chapter 15 and measured there (``ColwiseParallel(input_layouts=Shard(1))``, torch 2.13).
    """
    act = act_bytes * batch_size * seq_len * cfg.hidden_size
    return column_linears(cfg) * act - 2 * act // tp


def cp_allgather_attention_bytes(cfg: ModelConfig, batch_size: int, seq_len: int, cp: int,
                                 act_bytes: int = 2) -> int:
    """Bytes one attention block saves per GPU under all-gather context parallelism (Llama 3, §3.3.2), as plain
    autograd saves them.

    Each GPU keeps s/cp tokens: its input x, q, and the attention output (which is also the o_proj input: the
    CPU flash kernel returns it in (b, t, a, d) layout), e·b·(s/cp)·(h + 2·a·d); the log-sum-exp, 4·b·a·(s/cp);
    the all-gathered K and V of the whole sequence, 2·e·b·s·a_kv·d (autograd keeps the gathered copy); and the
    causal mask of its block of rows, which SDPA turns into an additive mask, e·(s/cp)·s (flash kernels on GPU
    compute it from the offsets instead). Measured in Chapter 15 on a naive autograd all-gather. TransformerEngine
    does better: ``AttnFuncWithCPAndKVAllGather`` (``transformer_engine/pytorch/attention/dot_product_attention/
    context_parallel.py``) saves only the local K/V and all-gathers them again in the backward, so the gathered
    2·e·b·s·a_kv·d is a temporary there, not a saved activation.
    """
    s_loc = seq_len // cp
    b, h, q, kv = batch_size, cfg.hidden_size, cfg.q_dim, cfg.kv_dim
    return (act_bytes * b * s_loc * (h + 2 * q) + 4 * b * cfg.num_heads * s_loc
            + 2 * act_bytes * b * seq_len * kv + act_bytes * s_loc * seq_len)


def ring_kv_buffer_bytes(cfg: ModelConfig, batch_size: int, seq_len: int, cp: int, tp: int = 1,
                         act_bytes: int = 2) -> int:
    """Ring attention's K/V buffers per GPU: two chunks of K and V in flight (the one attended to and the one
    being received), each b·(s/cp)·(kv heads/tp)·d elements: 2·2·e·b·(s/cp)·a_kv·d/tp. 0 when cp = 1.

    The Ultra-Scale Playbook (ring attention) and PyTorch's ``context_parallel`` (ring of ``send``/``recv``
    of the K/V shards). The all-gather variant of Llama 3 instead gathers the whole K/V: 2·e·b·s·a_kv·d/tp.
    """
    if cp == 1:
        return 0
    return 2 * 2 * act_bytes * batch_size * (seq_len // cp) * cfg.kv_dim // tp


def tp_buffer_bytes(cfg: ModelConfig, batch_size: int, seq_len: int, tp: int, act_bytes: int = 2) -> int:
    """The tensor-parallel communication buffer: one full b·s·h activation (the all-reduce output, or the
    all-gather output with sequence parallelism) live while a layer computes; 0 when tp = 1."""
    return 0 if tp == 1 else act_bytes * batch_size * seq_len * cfg.hidden_size


def expert_parallel_bytes(*, num_experts: int, expert_params: int, ep: int, tokens: int, hidden_size: int,
                          top_k: int = 2, param_bytes: int = 2, act_bytes: int = 2,
                          capacity_factor: float = 1.0) -> dict[str, int]:
    """Per-GPU expert weights and all-to-all buffers of one MoE layer under expert parallelism.

    Introduced in Chapter 15 (Ultra-Scale Playbook, expert parallelism; Lepikhin et al. 2021). Each GPU holds
    num_experts/ep experts. Dispatch sends each of its tokens to top_k experts: a send buffer and a receive
    buffer of capacity·top_k·tokens·h elements each (the receive buffer holds what the other GPUs route to
    this GPU's experts: the same size on average); combine sends the expert outputs back through the same
    two buffer sizes.

    Returns:
        ``expert_weights_bytes``, ``a2a_buffer_bytes`` (send + receive of one all-to-all) and
        ``a2a_bytes_sent`` (what one all-to-all sends to other GPUs: (ep−1)/ep of the send buffer).
    """
    E, P, k = (check_positive(n, v) for n, v in (("num_experts", num_experts), ("expert_params", expert_params),
                                                 ("top_k", top_k)))
    e = check_positive("ep", ep)
    if E % e:
        raise MemlibError(f"ep {e} does not divide {E} experts; expected one of: {', '.join(map(str, _divisors(E)))}")
    buf = int(math.ceil(capacity_factor * k * check_positive("tokens", tokens))) * hidden_size * act_bytes
    return {"expert_weights_bytes": E // e * P * param_bytes, "a2a_buffer_bytes": 2 * buf,
            "a2a_bytes_sent": buf * (e - 1) // e}


def moe_stage_params(cfg: ModelConfig, tp: int, pp: int) -> list[tuple[int, int]]:
    """(non-expert, routed-expert) parameters each pipeline stage holds per tensor-parallel GPU of a MoE model.

    Introduced in Chapter 15. Layer by layer (DeepSeek's first dense layers and Qwen's dense layers counted as
    what they are): the attention and MLP linears, the router and the shared experts are split over tp as in
    :func:`stage_params`, norms replicated, the embedding and LM head vocab-parallel; the routed experts of the
    stage's MoE layers are returned apart, split over tp, for expert parallelism to divide by ep.
    """
    moe = cfg.moe
    if moe is None:
        raise MemlibError(f"{cfg.name} has no experts; expected a MoE model (mixtral, qwen2_moe, qwen3_moe, "
                          "deepseek_v2, deepseek_v3)")
    h = cfg.hidden_size
    routed_layer = moe.num_experts * 3 * h * moe.expert_intermediate_size
    attn, norms = sum(families_moe._attention_tensors(cfg)), sum(families_moe._norm_tensors(cfg))
    pc = count_params(cfg)
    embed = -(-pc.embeddings // tp)
    head = -(-(pc.lm_head or cfg.vocab_size * h) // tp)
    out: list[tuple[int, int]] = []
    first = 0
    for i, n_layers in enumerate(stage_layers(cfg.num_layers, pp)):
        dense = routed = 0
        for j in range(first, first + n_layers):
            is_moe = j in moe.moe_layers
            linears = attn + sum(families_moe._mlp_tensors(cfg, is_moe)) - (routed_layer if is_moe else 0)
            dense += -(-linears // tp) + norms
            routed += -(-routed_layer // tp) if is_moe else 0
        first += n_layers
        if i == 0:
            dense += embed
        if i == pp - 1:
            dense += h + (head if pc.lm_head or pp > 1 else 0)
        out.append((dense, routed))
    return out


def comm_bytes_per_layer(cfg: ModelConfig, batch_size: int, seq_len: int, layout: Layout,
                         act_bytes: int = 2, backward_collectives: int = 2) -> dict[str, int]:
    """Bytes one GPU sends per layer and micro-batch, forward + backward, per parallelism.

    * tp: 2 all-reduces forward + 2 backward of the b·s·h activation, each 2(t−1)/t·e·bsh in a ring; with
      sequence parallelism the same volume as all-gathers + reduce-scatters, (t−1)/t·e·bsh each, 8 of them
      (Korthikanti et al. 2022, §4.2.2). ``backward_collectives`` = 2 is Megatron (q/k/v and gate/up fused);
      PyTorch DTensor on transformers' unfused linears all-reduces each column-parallel linear's input
      gradient: :func:`column_linears` (5 for Llama).
    * cp: the ring passes K and V on cp − 1 times forward, and K, V and their gradients backward.
    * pp: the stage boundary's activation forward and its gradient backward (point-to-point), per stage.
    """
    b, s, h, e = batch_size, seq_len // layout.cp, cfg.hidden_size, act_bytes
    t = layout.tp
    act = e * b * s * h
    tp = 0 if t == 1 else (2 + backward_collectives) * 2 * act * (t - 1) // t
    kv = 2 * e * b * s * cfg.kv_dim // t
    cp = 0 if layout.cp == 1 else (layout.cp - 1) * (kv + 2 * kv)
    pp = 0 if layout.pp == 1 else 2 * act // (t if layout.sequence_parallel else 1)
    return {"tp": tp, "cp": cp, "pp_per_stage_boundary": pp}


def estimate_parallel(model: str | Path | dict[str, Any] | ModelConfig | None, layout: Layout, *,
                      params: int | None, batch_size: int, seq_len: int, precision: str, optimizer: str,
                      zero_stage: int, recompute: str, attention: str, offload: str, method: str,
                      sp_keeps_gathered: bool = False, framework: str = "megatron") -> Any:
    """Per-GPU training memory of the worst rank under a parallel layout (called by
    :func:`memlib.core.estimate.estimate_training` when a model-parallel degree is set). Introduced in Chapter 15.

    Model states: the worst stage's parameters per tp GPU (:func:`stage_params`) in the framework's layout
    (:mod:`memlib.core.frameworks`; Megatron: bf16 params 2 + fp32 ``main_grad`` 4 + fp32 main params and Adam 12
    bytes per parameter, ``megatron/core/distributed/param_and_grad_buffer.py``, the distributed optimizer
    (``zero_stage=1``, ``megatron/core/optimizer/distrib_optimizer.py``) sharding the 12 over dp·cp: 6 + 12/(dp·cp);
    FSDP2 as TorchTitan composes it: (4 + 4 + 8)/(dp·cp) plus its unsharded working set of tp-split units)
    (:func:`memlib.core.estimate.estimate_training` with ``params=``). Activations of
    stage i: in_flight(i) × (its layers × per-layer bytes + its outside bytes), the per-layer bytes from
    :func:`split_terms` at s/cp over the framework's own model (:meth:`memlib.core.frameworks.base.Framework.
    parallel_activation_terms`: Megatron-Core with TransformerEngine, TorchTitan's Llama 3); DualPipe doubles the
    stage's states (:func:`memlib.core.schedules.schedule_weight_copies`); plus the TP buffer, the ring-attention
    K/V buffers and the largest temporary (the loss's fp32 logits gradient on the last stage, vocab-parallel).

    Expert parallelism (``layout.ep`` > 1, MoE models; GShard, Lepikhin et al. 2021, ``lepikhin2021gshard``;
    DeepSpeed-MoE, Rajbhandari et al. 2022): Megatron-Core's MoE parallel folding, the expert layers on their own
    grid etp·ep·edp·pp over the same GPUs (EP folds over TP, CP and DP ranks; DeepSpeed-MoE's ep-divides-dp is
    the special case tp = cp = etp = 1). Each GPU holds num_experts/ep of the routed experts of every MoE layer
    of its stage, each split over etp (:func:`moe_stage_params`); attention, dense MLPs, shared experts, the
    router, norms and embeddings stay replicated (split by tp as without EP). ZeRO shards the non-expert states
    over dp·cp and the expert states over the expert-data-parallel group of edp = gpus/(etp·ep·pp) ranks.
    The temporaries add one MoE layer's
    all-to-all dispatch buffers in flight, send + receive of top_k·b·(s/cp)·h elements
    (:func:`expert_parallel_bytes`, capacity factor 1). Activations assume balanced routing: each of the ep
    GPUs sends its b·s·k routed token copies out and, holding E/ep of the experts, receives on average
    b·s·k back: the expert activations per GPU are those without EP (the same token count), so they are
    unchanged. Real routers are imbalanced: the busiest GPU holds more (a capacity factor c bounds it at c×).

    Args:
        framework: whose layout the states follow and whose model saves the activations: ``megatron``
            (tp/pp/cp/ep), ``fsdp2`` (tp/pp/cp, TorchTitan's composition), ``deepspeed`` (ep)
            (:data:`memlib.core.choices.FRAMEWORK_SUPPORT`).
        sp_keeps_gathered: PyTorch DTensor's ``SequenceParallel`` + ``ColwiseParallel``: each column-parallel
            linear all-gathers its input and saves the gathered copy for backward (Megatron re-gathers it
            instead): :func:`sp_gathered_extra_bytes` per layer. False follows Megatron (Korthikanti et al. 2022).

    Limitations:
        Balanced routing for MoE (above); full fine-tuning only; no ZeRO-3 gathered layers
        or optimizer-step temporaries (the step runs one stage's shard; its temporaries are below the
        activations' peak for the models of Chapter 15).
    """
    check_choice("recompute", recompute, RECOMPUTE)
    check_choice("attention", attention, ATTENTION)
    batch_size = check_positive("batch_size", batch_size)
    seq_len = check_positive("seq_len", seq_len)
    if model is not None and params is not None:
        raise MemlibError("give either a model or params=N, not both")
    if method != "full":
        raise MemlibError(f"method {method!r} with model parallelism is not estimated; expected method 'full'")
    if offload != "none":
        raise MemlibError(f"offload {offload!r} with model parallelism is not estimated; expected offload 'none'")
    fw = get_framework(framework)
    check_framework(framework, zero_stage, offload, tuple(name for name, d in (("tp", layout.tp), ("pp", layout.pp),
                                                                             ("cp", layout.cp), ("ep", layout.ep))
                                                       if d > 1))
    if layout.cp > 1 and attention != "sdpa":
        raise MemlibError(f"cp {layout.cp} needs attention 'sdpa' (ring attention is a flash kernel); got "
                          f"{attention!r}")

    def rank_states(n: int, dp: int) -> TrainingEstimate:  # model states of n parameters, ZeRO over dp ranks
        setup = TrainingSetup(precision=precision, optimizer=optimizer, zero_stage=zero_stage, num_gpus=dp,
                              framework=framework)
        return states_estimate(check_positive("params", n), setup)

    p = layout.pp
    if model is None:
        n = check_positive("params", params)
        per_rank = -(-n // (layout.tp * p))
        st = rank_states(per_rank, layout.zero_ranks)
        return TrainingEstimate(st.params_bytes, st.grads_bytes, st.optimizer_bytes, None, 0, st.total_bytes,
                                "states", {**st.settings, **_layout_settings(layout), "params": n,
                                           "trainable_params": n, "num_gpus": layout.num_gpus,
                                           "rank_params": per_rank})
    cfg = load_config(model)
    check_seq_len(cfg, seq_len)
    e = 4 if precision == "fp32" else 2
    s_local = seq_len // layout.cp
    # what the framework's own model saves (Megatron-Core's GPTModel, TorchTitan's Llama 3), at the local s/cp
    terms = fw.parallel_activation_terms(cfg, TrainingSetup(
        batch_size=batch_size, seq_len=s_local, precision=precision, optimizer=optimizer, attention=attention,
        zero_stage=zero_stage, framework=framework))
    per_layer, first_out, last_out = split_terms(terms, layout.tp, layout.sequence_parallel, layout.cp)
    t = layout.tp
    T = batch_size * s_local
    if sp_keeps_gathered and layout.sequence_parallel and t > 1:
        per_layer += sp_gathered_extra_bytes(cfg, batch_size, s_local, t, e)
    core = sum(-(-x.bytes // t) for x in terms if x.per_layer and ("softmax" in x.name or "log-sum-exp" in x.name
                                                                    or "attention dropout" in x.name))
    layer_input = -(-e * T * cfg.hidden_size // (t if layout.sequence_parallel else 1))
    if recompute == "selective":
        saved_per_layer, live = per_layer - core, core
    elif recompute == "full":
        saved_per_layer, live = layer_input, per_layer
    else:
        saved_per_layer, live = per_layer, 0
    layers = stage_layers(cfg.num_layers, p)
    params_per_stage = stage_params(cfg, t, p)
    buffers = tp_buffer_bytes(cfg, batch_size, s_local, t, e) + ring_kv_buffer_bytes(
        cfg, batch_size, seq_len, layout.cp, t, e)
    ep_settings: dict[str, Any] = {}
    moe = cfg.moe
    if moe is not None and layout.ep == 1:  # count MoE stages layer by layer (DeepSeek's first layers are dense)
        params_per_stage = [dense + routed for dense, routed in moe_stage_params(cfg, t, p)]
    if layout.ep > 1 and moe is not None:  # expert parallelism: the routed experts over etp·ep ranks (folded)
        split = [(dense, routed_e) for (dense, _), (_, routed_e) in zip(moe_stage_params(cfg, t, p),
                                                                        moe_stage_params(cfg, layout.etp, p))]
        params_per_stage = [dense + routed // layout.ep for dense, routed in split]
        a2a = expert_parallel_bytes(num_experts=moe.num_experts, expert_params=3 * cfg.hidden_size
                                    * moe.expert_intermediate_size, ep=layout.ep, tokens=T,
                                    hidden_size=cfg.hidden_size, top_k=moe.top_k, act_bytes=e)["a2a_buffer_bytes"]
        buffers += a2a
        ep_settings = {"local_experts": moe.num_experts // layout.ep, "etp": layout.etp,
                       "expert_data_parallel": layout.expert_dp, "a2a_buffer_bytes": a2a}
    copies = schedule_weight_copies(layout.schedule)  # DualPipe: two stages' weights per rank

    def states(i: int) -> Any:
        if not ep_settings:
            return rank_states(copies * params_per_stage[i], layout.zero_ranks)
        # ZeRO shards the non-expert states over dp·cp and each expert's over the expert-data-parallel ranks
        # that hold a copy of it, num_gpus/(etp·ep·pp) (Megatron-Core's folding; DeepSpeed-MoE's dp/ep)
        dense, routed = split[i]
        a = rank_states(copies * dense, layout.zero_ranks)
        if routed == 0:
            return a
        x = rank_states(copies * routed // layout.ep, layout.expert_dp)
        return TrainingEstimate(a.params_bytes + x.params_bytes, a.grads_bytes + x.grads_bytes,
                                a.optimizer_bytes + x.optimizer_bytes, None, 0, a.total_bytes + x.total_bytes,
                                "states", a.settings)
    # a sharded framework's unsharded working set (TorchTitan's FSDP2 units, tp-split), in the backward pass
    pc = count_params(cfg)
    buffers += sum(fw.working_set(cfg, -(-pc.per_layer // t), 0, -(-pc.params // t), -(-pc.params // t),
                                  TrainingSetup(precision=precision, optimizer=optimizer, zero_stage=zero_stage,
                                                num_gpus=layout.zero_ranks, framework=framework)))
    loss_temp = 4 * T * cfg.vocab_size // t  # fp32 gradient of the logits, vocab-parallel
    best: tuple[int, int, Any, int] | None = None
    for i in range(p):
        flight = in_flight(p, layout.micro_batches, layout.schedule, i, layout.virtual_stages)
        outside = (first_out if i == 0 else 0) + (last_out if i == p - 1 else 0)
        acts = int(flight * (layers[i] * saved_per_layer + outside))
        temp = buffers + live + (loss_temp if i == p - 1 else 0)
        st = states(i)
        total = st.total_bytes + acts + temp
        if best is None or total > best[0]:
            best = (total, acts, st, temp)
            worst = i
    assert best is not None
    total, acts, st, temp = best
    settings = {"model": cfg.name, "batch_size": batch_size, "seq_len": seq_len, "precision": precision,
                "optimizer": optimizer, "zero_stage": zero_stage, "num_gpus": layout.num_gpus,
                "recompute": recompute, "attention": attention, "offload": offload, "method": method,
                "framework": framework, "params": _count_all(cfg), "trainable_params": _count_all(cfg),
                **_layout_settings(layout),
                "worst_stage": worst, "stage_params": params_per_stage[worst],
                "bubble_fraction": bubble_fraction(p, layout.micro_batches, layout.schedule, layout.virtual_stages),
                **ep_settings}
    return TrainingEstimate(st.params_bytes, st.grads_bytes, st.optimizer_bytes, acts, temp, total, "backward",
                            settings)


def _count_all(cfg: ModelConfig) -> int:
    """All parameters of the model (for the echoed settings)."""
    return count_params(cfg).params


def _layout_settings(layout: Layout) -> dict[str, Any]:
    return {"tp": layout.tp, "pp": layout.pp, "cp": layout.cp, "ep": layout.ep, "dp": layout.dp,
            "sequence_parallel": layout.sequence_parallel, "micro_batches": layout.micro_batches,
            "pp_schedule": layout.schedule, "virtual_stages": layout.virtual_stages, "zero_ranks": layout.zero_ranks}
