"""Training and inference memory estimates from a config: pure Python, no torch (Chapter 1).

Model states follow the ZeRO paper's accounting (Rajbhandari et al. 2020, §3 and §5). Activations are
derived for the architecture configured — what each op of the transformers implementation saves for the
backward pass (gated MLP, RMSNorm with its fp32 upcast, grouped-query attention, fp32 softmax in eager
attention, the fp32 upcast of the logits in the loss) — and checked against :mod:`memlib.measure.trace`.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from . import families_dense

from . import families_moe
from .attention_terms import gqa_attention_terms
from .categories import estimate_by_category
from .configs import DENSE_FAMILIES, ModelConfig, check_seq_len, load_config
from .dtypes import weight_bytes_per_param
from .errors import MemlibError, check_choice, check_positive
from .lora import (LORA_TARGETS, METHODS, lora_params, lora_small_tensor_params, qlora_base_bytes,
                   quantized_weight_bytes, targeted_linears)
from .params import count_params

__all__ = [
    "PRECISIONS",
    "OPTIMIZERS",
    "RECOMPUTE",
    "ATTENTION",
    "OFFLOAD",
    "METHODS",
    "LORA_TARGETS",
    "KV_DTYPES",
    "ActivationTerm",
    "TrainingEstimate",
    "InferenceEstimate",
    "state_bytes_per_param",
    "activation_terms",
    "estimate_training",
    "estimate_inference",
    "korthikanti_activation_bytes",
]

PRECISIONS = ("fp32", "fp16-mixed", "bf16-mixed", "bf16")
OPTIMIZERS = ("sgd", "sgd-momentum", "adamw", "adamw-8bit")
RECOMPUTE = ("none", "selective", "full")
ATTENTION = ("eager", "sdpa")
#: What lives in CPU memory: nothing; the optimizer states (ZeRO-Offload); params too (ZeRO-3/FSDP offload).
OFFLOAD = ("none", "optimizer", "params+optimizer")
KV_DTYPES = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1}

# bitsandbytes 8-bit optimizers: tensors with fewer elements than this keep 32-bit states;
# quantized states carry one fp32 absmax per block of 256 elements.
_BNB_MIN_8BIT_SIZE = 4096
_BNB_BLOCK = 256


@dataclass(frozen=True)
class ActivationTerm:
    """One tensor kind that the forward pass saves for backward, in one transformer layer (or outside).

    Attributes:
        name: what it is (``"MLP gate output"``).
        bytes: its size in bytes for the batch and sequence asked for.
        formula: the size as a formula in b (batch), s (sequence), h, f, a, V...
        per_layer: True if every layer saves one; False for a tensor saved once per model.
    """

    name: str
    bytes: int
    formula: str
    per_layer: bool = True


@dataclass(frozen=True)
class TrainingEstimate:
    """Estimated training memory per GPU, in bytes. Introduced in Chapter 1.

    Attributes:
        params_bytes: working weights (16-bit in mixed precision).
        grads_bytes: gradients.
        optimizer_bytes: optimizer states, fp32 master weights included (the ZeRO paper's KΨ).
        activations_bytes: bytes saved for backward at the end of the forward pass (None with ``params=``).
        temp_bytes: the transient buffers on top of the states at the peak moment (loss and backward
            temporaries, or the optimizer step's temporaries), 0 with ``params=``.
        total_bytes: the estimated peak: max(forward/backward peak, optimizer-step peak).
        peak_phase: ``"backward"`` or ``"optimizer"``: where the peak is expected; ``"states"`` with ``params=``.
        settings: the inputs, echoed (with ``params`` and ``trainable_params``).
        cpu_bytes: host memory for offloaded states (Chapter 7); 0 without offload.
    """

    params_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    activations_bytes: int | None
    temp_bytes: int
    total_bytes: int
    peak_phase: str
    settings: dict[str, Any]
    cpu_bytes: int = 0

    @property
    def model_states_bytes(self) -> int:
        """Parameters + gradients + optimizer states."""
        return self.params_bytes + self.grads_bytes + self.optimizer_bytes

    @property
    def peak_bytes(self) -> int:
        """The estimated peak, named as the trace names it (:mod:`memlib.core.categories`): ``total_bytes``."""
        return self.total_bytes

    @property
    def by_category(self) -> dict[str, int]:
        """Bytes live at the peak per :class:`~memlib.core.categories.MemCategory` value, as the trace reports."""
        return estimate_by_category(self)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready dict (all byte values are ints)."""
        return asdict(self)


@dataclass(frozen=True)
class InferenceEstimate:
    """Estimated inference memory: weights + KV cache, in bytes. Introduced in Chapter 1.

    Attributes:
        weights_bytes: weights in the chosen format, quantization constants included.
        kv_cache_bytes: 2 (K and V) × layers × kv_heads × head_dim × tokens × bytes; for MLA (DeepSeek)
            layers × (kv_lora_rank + qk_rope_head_dim) × tokens × bytes.
        total_bytes: weights + KV cache (activations of a forward pass and the CUDA context not included).
        settings: the inputs, echoed.
    """

    weights_bytes: int
    kv_cache_bytes: int
    total_bytes: int
    settings: dict[str, Any]

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready dict (all byte values are ints)."""
        return asdict(self)


def state_bytes_per_param(precision: str, optimizer: str) -> tuple[float, float, float]:
    """Bytes per parameter of (weights, gradients, optimizer states) before sharding.

    Introduced in Chapter 1. ``fp16-mixed``/``bf16-mixed`` follow the ZeRO paper: 2 + 2 + K with K = 12
    for Adam (fp32 master weights, m, v); the master copy counts as optimizer state. ``bf16`` keeps
    everything in 16 bits (``model.to(torch.bfloat16)`` with ``torch.optim.AdamW``). ``adamw-8bit`` keeps
    m and v in 8 bits (small-tensor and block-absmax details are added by :func:`estimate_training`).

    Returns:
        (weight bytes, gradient bytes, optimizer-state bytes) per parameter.
    """
    check_choice("precision", precision, PRECISIONS)
    check_choice("optimizer", optimizer, OPTIMIZERS)
    if precision == "fp32":
        w = g = 4.0
        state = 4.0
        master = 0.0
    elif precision == "bf16":
        w = g = 2.0
        state = 2.0
        master = 0.0
    else:
        w = g = 2.0
        state = 4.0
        master = 4.0
    moments = {"sgd": 0, "sgd-momentum": 1, "adamw": 2, "adamw-8bit": 2}[optimizer]
    if optimizer == "adamw-8bit":
        return w, g, master + 2.0
    return w, g, master + moments * state


def _optimizer_state_bytes(n_params: int, small_params: int, precision: str, optimizer: str) -> int:
    """Optimizer-state bytes for ``n_params`` parameters (``small_params`` of them in small tensors)."""
    _, _, per_param = state_bytes_per_param(precision, optimizer)
    if optimizer != "adamw-8bit":
        return int(per_param * n_params)
    master = 0.0 if precision in ("fp32", "bf16") else 4.0
    big = n_params - small_params
    small_state = 4.0  # bitsandbytes keeps fp32 states for tensors < 4096 elements, whatever the param dtype
    return int(master * n_params + 2 * big * (1 + 4 / _BNB_BLOCK) + 2 * small_params * small_state)


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
                     dropout: bool = True) -> list[ActivationTerm]:
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

    Returns:
        The terms; ``per_layer`` ones are multiplied by the number of layers.
    """
    cfg = load_config(model)
    check_choice("precision", precision, PRECISIONS)
    check_choice("attention", attention, ATTENTION)
    b = check_positive("batch_size", batch_size)
    s = check_seq_len(cfg, check_positive("seq_len", seq_len))
    e = 4 if precision == "fp32" else 2  # activation bytes
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


def _sum_terms(terms: list[ActivationTerm]) -> tuple[int, int]:
    per_layer = sum(t.bytes for t in terms if t.per_layer)
    outside = sum(t.bytes for t in terms if not t.per_layer)
    return per_layer, outside


def estimate_training(model: str | Path | dict[str, Any] | ModelConfig | None = None, *,
                      params: int | None = None, batch_size: int = 1, seq_len: int = 512,
                      precision: str = "bf16-mixed", optimizer: str = "adamw", zero_stage: int = 0,
                      num_gpus: int = 1, recompute: str = "none", attention: str = "sdpa",
                      checkpoint_every: int = 1, offload: str = "none", method: str = "full",
                      lora_rank: int = 16, lora_targets: str = "all-linear", tp: int = 1, pp: int = 1,
                      cp: int = 1, ep: int = 1, sequence_parallel: bool = False, micro_batches: int = 1,
                      pp_schedule: str = "1f1b") -> TrainingEstimate:
    """Estimate the peak training memory per GPU.

    Introduced in Chapter 1. Model states follow the ZeRO paper (§5): stage 1 shards optimizer states,
    stage 2 also gradients, stage 3 also parameters, each over ``num_gpus`` data-parallel ranks.
    The peak is the larger of (a) the backward pass — states + saved activations + the loss and backward
    temporaries, with gradients accumulating while activations are freed — and (b) the optimizer step —
    states + all gradients + the step's temporaries (``torch.optim.AdamW``'s foreach path allocates one
    full-size buffer for sqrt(v)).

    Args:
        model: shipped name, config.json path, dict or ModelConfig; or None with ``params``.
        params: parameter count, for model states only (activations are then None).
        batch_size: micro-batch size per GPU.
        seq_len: sequence length.
        precision: ``fp32``, ``fp16-mixed``, ``bf16-mixed`` or ``bf16``.
        optimizer: ``sgd``, ``sgd-momentum``, ``adamw`` or ``adamw-8bit``.
        zero_stage: 0 (plain data parallel), 1, 2 or 3.
        num_gpus: data-parallel GPUs sharing the states.
        recompute: ``none``, ``selective`` (attention core recomputed, Megatron-style) or ``full``
            (every layer's input kept; one layer's activations re-materialized at a time).
        attention: ``eager`` or ``sdpa``.
        checkpoint_every: with ``recompute="full"``, decoder layers per checkpointed segment (Chapter 4):
            the forward keeps ceil(L/k) segment inputs and the backward re-materializes k layers at a time;
            1 is what transformers' ``gradient_checkpointing_enable()`` does.
        offload: ``none``; ``optimizer`` (ZeRO-Offload, Chapter 7: fp32 master weights, optimizer states and
            fp32 gradients in CPU memory, the step on the CPU; the GPU keeps 16-bit weights and gradients);
            ``params+optimizer`` (ZeRO-3 parameter offload / FSDP2 ``CPUOffloadPolicy``: the sharded weights
            live in CPU memory too and the GPU holds the layers being computed; needs ``zero_stage=3``).
        method: ``full`` fine-tuning, ``lora`` (16-bit frozen base, Chapter 9) or ``qlora`` (NF4 base with
            double quantization). Adapters are fp32 (peft's default upcast) with fp32 grads and states.
        lora_rank: LoRA rank r (``lora``/``qlora``).
        lora_targets: ``all-linear``, ``attention`` or ``qv`` (see :data:`memlib.core.lora.LORA_TARGETS`).
        tp, pp, cp, ep, sequence_parallel, micro_batches, pp_schedule: model parallelism (Chapter 15):
            ``num_gpus`` is then the total and ZeRO shards over dp = num_gpus / (tp·pp·cp); the estimate is
            the worst rank's (:func:`memlib.core.parallel.estimate_parallel`). The defaults give plain data
            parallelism. ``ep`` (MoE models; GShard, Lepikhin et al. 2021; DeepSpeed-MoE) splits the routed
            experts over ep of the dp ranks (ep divides dp and the experts), ZeRO sharding the expert states
            over dp/ep, and adds the all-to-all buffers; balanced routing leaves the activations unchanged.

    Returns:
        The estimate, bytes per GPU (and ``cpu_bytes`` of host memory with offload).

    Raises:
        MemlibError: for bad input (message names the value and the choices), including a ``seq_len`` above
            the model's maximum positions (:func:`memlib.core.configs.check_seq_len`).

    Limitations:
        No CUDA context, allocator rounding or library workspaces (see Chapter 1's GPU comparison);
        ZeRO-3 adds two gathered layers of weights and one of gradients (the largest of a decoder layer and
        the embedding); DeepSpeed's communication buckets are not counted. LoRA activations are taken
        full fine-tuning's for GPT-2 (derived and measured for the llama family, ``lora_dropout=0``); the CPU
        side of offload omits DeepSpeed's pinned buffers.
    """
    check_choice("precision", precision, PRECISIONS)
    check_choice("optimizer", optimizer, OPTIMIZERS)
    check_choice("zero stage", zero_stage, (0, 1, 2, 3))
    if (tp, pp, cp, ep, sequence_parallel, micro_batches, pp_schedule) != (1, 1, 1, 1, False, 1, "1f1b"):
        from .parallel import check_layout, estimate_parallel

        pcfg = None if model is None else load_config(model)
        layout = check_layout(pcfg, num_gpus, tp=tp, pp=pp, cp=cp, ep=ep, sequence_parallel=sequence_parallel,
                              micro_batches=micro_batches, schedule=pp_schedule, seq_len=seq_len)
        return estimate_parallel(pcfg, layout, params=params, batch_size=batch_size, seq_len=seq_len,
                                 precision=precision, optimizer=optimizer, zero_stage=zero_stage,
                                 recompute=recompute, attention=attention, offload=offload, method=method)
    check_choice("recompute", recompute, RECOMPUTE)
    check_choice("attention", attention, ATTENTION)
    check_choice("offload", offload, OFFLOAD)
    check_choice("method", method, METHODS)
    check_choice("lora targets", lora_targets, LORA_TARGETS)
    n_gpus = check_positive("num_gpus", num_gpus)
    b = check_positive("batch_size", batch_size)
    s = check_positive("seq_len", seq_len)
    k_seg = check_positive("checkpoint_every", checkpoint_every)
    rank = check_positive("lora rank", lora_rank)
    if k_seg != 1 and recompute != "full":
        raise MemlibError(f"checkpoint_every={k_seg} needs recompute='full' (got recompute={recompute!r})")
    if offload == "params+optimizer" and zero_stage != 3:
        raise MemlibError(f"offload 'params+optimizer' needs zero_stage 3 (got zero_stage={zero_stage}); "
                          "use offload 'optimizer' with stages 0-2")
    settings: dict[str, Any] = {"batch_size": b, "seq_len": s, "precision": precision, "optimizer": optimizer,
                                "zero_stage": zero_stage, "num_gpus": n_gpus, "recompute": recompute,
                                "attention": attention, "checkpoint_every": k_seg, "offload": offload,
                                "method": method}
    if method != "full":
        settings.update(lora_rank=rank, lora_targets=lora_targets)
    if model is None:
        if params is None:
            raise MemlibError("give a model (shipped name or config.json) or params=N")
        if method != "full":
            raise MemlibError(f"method {method!r} needs a model (shipped name or config.json), not params=N")
        n = check_positive("params", params)
        small = 0
        cfg = None
    else:
        if params is not None:
            raise MemlibError("give either a model or params=N, not both")
        cfg = load_config(model)
        check_seq_len(cfg, s)
        if cfg.moe is not None or cfg.mla is not None:
            families_moe.check_lora(cfg, method)
        pc = count_params(cfg)
        n, small = pc.params, pc.small_tensor_params
        settings["model"] = cfg.name
    settings["params"] = n
    w, g, _ = state_bytes_per_param(precision, optimizer)
    if method == "full":
        n_train = n
        p_bytes = int(w * n)
        g_bytes = int(g * n)
        o_bytes = _optimizer_state_bytes(n, small, precision, optimizer)
    else:
        assert cfg is not None
        n_train = lora_params(cfg, rank, lora_targets)
        base = qlora_base_bytes(cfg) if method == "qlora" else int(w * n)
        p_bytes = base + 4 * n_train  # fp32 adapters
        g_bytes = 4 * n_train
        o_bytes = _optimizer_state_bytes(n_train, lora_small_tensor_params(cfg, rank, lora_targets), "fp32",
                                         optimizer)
    settings["trainable_params"] = n_train
    if zero_stage >= 1:
        o_bytes = -(-o_bytes // n_gpus)
    if zero_stage >= 2:
        g_bytes = -(-g_bytes // n_gpus)
    if zero_stage >= 3:
        p_bytes = -(-p_bytes // n_gpus)

    # ZeRO-3 gathers each layer's full weights to compute it: the layer being computed and the next one
    # (prefetch) are whole on every GPU, and one layer's gradients are whole until reduce-scattered.
    gathered_p = gathered_g = 0
    if zero_stage == 3 and cfg is not None:
        biggest = max(count_params(cfg).per_layer, cfg.vocab_size * cfg.hidden_size)
        base_per_param = (p_bytes * n_gpus - 4 * (n_train if method != "full" else 0)) / n
        gathered_p = int(2 * base_per_param * biggest)
        gathered_g = int(g * biggest) if method == "full" else 0

    # Offload: what moves to host memory, and what the GPU keeps.
    cpu_bytes = 0
    if offload != "none":
        fp32_grads = -(-4 * n_train // (n_gpus if zero_stage >= 1 else 1))
        cpu_bytes = o_bytes + fp32_grads
        o_bytes = 0
        if offload == "optimizer" and zero_stage == 2 and method == "full":
            # DeepSpeed's ZeRO-2 offload streams each gradient into the host's fp32 buffer as the backward pass
            # produces it, through one reduce bucket (reduce_bucket_size = 5e8 elements by default): the GPU never
            # holds the gradient shard (ZeRO-Offload §4; DeepSpeed's estimator counts 2Ψ on the GPU).
            g_bytes = min(g_bytes, int(g * 500_000_000))
        if offload == "params+optimizer":
            cpu_bytes += p_bytes
            p_bytes = 0  # the shards live in CPU memory; only the gathered layers are on the GPU
            g_bytes = 0 if method == "full" else g_bytes
    p_bytes += gathered_p
    g_bytes += gathered_g
    states = p_bytes + g_bytes + o_bytes
    if cfg is None:
        return TrainingEstimate(p_bytes, g_bytes, o_bytes, None, 0, states, "states", settings, cpu_bytes)

    terms = activation_terms(cfg, batch_size=b, seq_len=s, precision=precision, attention=attention)
    per_layer, outside = _sum_terms(terms)
    L, h, V, f = cfg.num_layers, cfg.hidden_size, cfg.vocab_size, cfg.intermediate_size
    e = 4 if precision == "fp32" else 2
    T = b * s
    if method != "full" and (cfg.model_type == "olmo2" or cfg.model_type in DENSE_FAMILIES):
        raise MemlibError(f"method {method!r} is estimated for gpt2, llama, mistral, qwen2, gemma and qwen3, not "
                          f"{cfg.model_type}; expected method 'full' (or trace a LoRA step: memlib.core.lora)")
    if method != "full" and cfg.model_type != "gpt2":
        # LoRA (peft, lora_dropout=0; measured in Chapter 9): frozen weights drop what only their weight
        # gradients needed — the RMSNorms' normalized and weighted outputs, the MLP product feeding down_proj,
        # the final RMSNorm's tensors — and every adapted Linear adds an fp32 copy of its input (peft casts x
        # to the adapter's dtype) and lora_A's rank-r output.
        by_name = {t.name: t.bytes for t in terms}
        adapters = sum(4 * T * i + 4 * T * rank for _, i, _ in targeted_linears(cfg, lora_targets))
        per_layer += adapters - by_name["RMSNorm normalized and weighted outputs ×2"] - e * T * f
        outside -= by_name["final RMSNorm"]
    layer_input = e * T * h  # what full recomputation keeps per layer
    if recompute == "full":
        k_seg = min(k_seg, L)
        saved_layers = -(-L // k_seg) * layer_input
        live_layer = k_seg * per_layer  # one segment re-materialized during backward
    elif recompute == "selective":
        core = sum(t.bytes for t in terms if t.per_layer and ("softmax" in t.name or "attention dropout" in t.name
                                                             or "log-sum-exp" in t.name))
        saved_layers = L * (per_layer - core)
        live_layer = core
    else:
        saved_layers = L * per_layer
        live_layer = 0
    activations = saved_layers + outside

    # Backward: starts with the loss temporaries (grad of log-softmax and of the logits in fp32, the
    # 16-bit logits gradient), then sweeps the layers: gradients accumulate, activations are freed.
    # With LoRA the embeddings and LM head are frozen: no gradient for them.
    full = method == "full"
    grad_total = g_bytes
    g_per_param = g_bytes / n_train
    layer_params = count_params(cfg).per_layer
    grad_per_layer = int(g_per_param * layer_params) if full else g_bytes // L
    head_grad = int(g_per_param * (n - L * layer_params)) if full else 0
    vh_grad = int(g_per_param * V * h) if full else 0
    mlp_temp = 3 * e * T * f + 2 * e * T * h
    if attention == "eager" and recompute != "none":
        # the backward of a re-materialized eager attention core holds s²-sized temporaries (the probabilities'
        # gradient and the softmax backward): ≈ 5·b·a·s² bytes in 16-bit training, measured in Chapter 4
        mlp_temp = max(mlp_temp, (2 * e + 1) * b * cfg.num_heads * s * s)
    logsm = 4 * T * V
    candidates = [
        activations + 2 * logsm,  # loss backward: grad of log-softmax + fp32 logits gradient
        activations - logsm + e * T * V + e * T * h + vh_grad,  # LM-head backward
        activations - logsm + head_grad + live_layer + mlp_temp,  # first layer's backward
        # embedding backward, the end; a tied matrix adds its embedding gradient out of place (old + new + sum)
        # (with k-layer segments, the bottom segment's other k - 1 layers have no gradients yet)
        grad_total - (k_seg - 1) * grad_per_layer + (2 * vh_grad if cfg.tie_word_embeddings else 0) + live_layer,
    ]
    if (cfg.moe is not None or cfg.mla is not None) and recompute == "none" and full:
        candidates.append(families_moe.bottom_backward_bytes(cfg, terms, grad_total, g_per_param, b=b, s=s,
                                                             attention=attention))
    backward_extra = max(candidates)
    backward_peak = p_bytes + o_bytes + backward_extra

    # Optimizer step: all gradients exist. torch.optim.AdamW's foreach path allocates one buffer the size
    # of all of v (for sqrt(v)). The mixed-precision step goes one tensor at a time: a tensor's 16-bit
    # gradient becomes an fp32 gradient (plus an fp32 sqrt buffer for AdamW) and is then freed; the
    # embedding comes first, so the peak is at it or at the largest tensor after it. With offload the
    # step runs on the CPU; LoRA adapters are fp32 and take the plain foreach path.
    step_temp = 0
    if offload != "none":
        step_temp = 0
    elif not full:
        step_temp = 4 * n_train if optimizer == "adamw" else 0
        if zero_stage >= 1:
            step_temp = -(-step_temp // n_gpus)
    elif precision.endswith("-mixed"):
        per_elem = 8 if optimizer == "adamw" else 4
        n_embed = V * h
        n_max = (families_moe.largest_tensor(cfg) if cfg.moe is not None or cfg.mla is not None
                 else max(h * f, h * cfg.q_dim, V * h if not cfg.tie_word_embeddings else 0))
        g_elem = grad_total / n
        step_temp = int(max((per_elem - g_elem) * n_embed, (per_elem - g_elem) * n_max - g_elem * n_embed))
    elif optimizer == "adamw":
        step_temp = int((4 if precision == "fp32" else 2) * n)
        if zero_stage >= 1:
            step_temp = -(-step_temp // n_gpus)
    optimizer_peak = p_bytes + o_bytes + grad_total + step_temp
    if optimizer_peak > backward_peak:
        total, phase, temp = optimizer_peak, "optimizer", step_temp
    else:
        total, phase, temp = backward_peak, "backward", backward_extra - activations
    return TrainingEstimate(p_bytes, g_bytes, o_bytes, activations, max(temp, 0), total, phase, settings,
                            cpu_bytes)


def estimate_inference(model: str | Path | dict[str, Any] | ModelConfig, *, batch_size: int = 1,
                       seq_len: int = 2048, weights: str = "fp16", kv_dtype: str = "fp16") -> InferenceEstimate:
    """Estimate inference memory: weights + KV cache for ``batch_size`` sequences of ``seq_len`` tokens.

    Introduced in Chapter 1. KV cache = 2 × layers × kv_heads × head_dim × seq_len × batch × bytes: GQA and
    MQA shrink it by num_heads / num_kv_heads; Gemma 2/3's sliding-window layers cache at most their window
    (:func:`memlib.core.inference.kv_cache_bytes`).

    Args:
        model: shipped name, config.json path, dict or ModelConfig.
        batch_size: concurrent sequences.
        seq_len: tokens per sequence held in the cache (prompt + generated).
        weights: ``fp32``, ``fp16``, ``bf16``, ``int8``, ``int4`` or ``nf4``.
        kv_dtype: ``fp32``, ``fp16``, ``bf16`` or ``fp8``.

    Returns:
        The estimate in bytes.
    """
    cfg = load_config(model)
    b = check_positive("batch_size", batch_size)
    per_param = weight_bytes_per_param(weights)
    check_choice("kv dtype", kv_dtype, KV_DTYPES)
    s = check_seq_len(cfg, check_positive("seq_len", seq_len))
    pc = count_params(cfg)
    if weights in ("fp32", "fp16", "bf16"):
        w_bytes = int(per_param * pc.params)
    else:  # quantized Linear matrices; biases, embeddings, LM head and norms stay 16-bit (the one policy)
        w_bytes = quantized_weight_bytes(cfg, weights)
    from .inference import kv_cache_bytes  # inference builds on this module

    kv = kv_cache_bytes(cfg, s, b, kv_dtype)  # sliding windows capped; MLA's latent
    settings = {"model": cfg.name, "batch_size": b, "seq_len": s, "weights": weights, "kv_dtype": kv_dtype,
                "params": pc.params}
    return InferenceEstimate(w_bytes, kv, w_bytes + kv, settings)
