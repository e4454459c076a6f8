"""Training and inference memory estimates from a config: pure Python, no torch (Chapter 1).

Model states follow the layout of the framework chosen (:mod:`memlib.core.frameworks`: PyTorch AMP,
DeepSpeed, whose is the ZeRO paper's accounting, Rajbhandari et al. 2020, §3 and §5, FSDP2, Megatron). Activations are
derived for the architecture configured (:mod:`memlib.core.activations`, re-exported here) and checked
against :mod:`memlib.measure.trace`.

:func:`estimate_training` composes the setup's framework object (:func:`memlib.core.frameworks.framework_for`)
without naming a framework: its model states (:func:`memlib.core.states.model_states`: states per parameter,
sharding, working set, offload, gradient buffers), :func:`saved_activations`, its backward moments around
:func:`backward_peak_bytes` and its step temporaries. The per-term functions of the first version
(:func:`model_state_bytes`, :func:`shard_states`, :func:`gathered_bytes`, :func:`offload_split`,
:func:`optimizer_step_bytes`) are re-exported here. They trust their :class:`memlib.core.setup.TrainingSetup`,
which validated the settings once.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import families_moe
from .activations import ActivationTerm, _sum_terms, activation_terms, korthikanti_activation_bytes
from .autocast import autocast_backward_peak, segment_input_bytes
from .checkpointing import segment_layers
from .choices import (ATTENTION, FRAMEWORKS, KV_DTYPES, LORA_TARGETS, METHODS, OFFLOAD, OPTIMIZER_IMPLS, OPTIMIZERS,
                      PRECISIONS, RECOMPUTE)
from .configs import DENSE_FAMILIES, ModelConfig, check_seq_len, load_config
from .dtypes import weight_bytes_per_param
from .errors import MemlibError, check_choice, check_positive
from .frameworks import (Saved, _parameter_order, framework_for, gathered_bytes, model_state_bytes, offload_split,
                         optimizer_state_bytes, optimizer_step_bytes, shard_states, state_bytes, zero3_gathered_bytes)
from .fp8 import fp8_terms
from .lora import quantized_weight_bytes, targeted_linears
from .losses import loss_logits, loss_terms
from .parallel import check_layout, estimate_parallel
from .params import count_params
from .serving_terms import kv_cache_bytes
from .setup import InferenceSetup, TrainingSetup
from .states import echo_settings, model_states, states_estimate
from .terms import InferenceEstimate, TrainingEstimate

__all__ = [
    "PRECISIONS",
    "OPTIMIZERS",
    "OPTIMIZER_IMPLS",
    "RECOMPUTE",
    "ATTENTION",
    "OFFLOAD",
    "METHODS",
    "LORA_TARGETS",
    "KV_DTYPES",
    "TrainingSetup",
    "InferenceSetup",
    "ActivationTerm",
    "TrainingEstimate",
    "InferenceEstimate",
    "state_bytes_per_param",
    "activation_terms",
    "model_state_bytes",
    "shard_states",
    "zero3_gathered_bytes",
    "gathered_bytes",
    "offload_split",
    "SavedActivations",
    "saved_activations",
    "backward_peak_bytes",
    "optimizer_step_bytes",
    "estimate_training",
    "compose_training",
    "estimate_inference",
    "korthikanti_activation_bytes",
]

#: Kept for callers of the old private name (``tests/test_quant.py``): DeepSpeed's (the ZeRO paper's) accounting.
_optimizer_state_bytes = optimizer_state_bytes

def state_bytes_per_param(precision: str, optimizer: str, framework: str = "deepspeed") -> tuple[float, float, float]:
    """Bytes per parameter of (weights, gradients, optimizer states) before sharding.

    Introduced in Chapter 1. The default, ``framework="deepspeed"``, is the ZeRO paper's accounting:
    ``fp16-mixed``/``bf16-mixed`` are 2 + 2 + K with K = 12 for Adam (fp32 master weights, m, v); the master
    copy counts as optimizer state. ``framework="pytorch"`` is torch.autocast AMP: 4 + 4 + 8 (fp32 params are
    the master), ``"megatron"`` 2 + 4 + 12 (fp32 ``main_grad``) (:func:`memlib.core.frameworks.state_bytes`).
    ``bf16`` keeps everything in 16 bits (``model.to(torch.bfloat16)`` with ``torch.optim.AdamW``).
    ``adamw-8bit`` keeps m and v in 8 bits (small-tensor and block-absmax details are added by
    :func:`estimate_training`).

    Returns:
        (weight bytes, gradient bytes, optimizer-state bytes) per parameter.
    """
    check_choice("precision", precision, PRECISIONS)
    check_choice("optimizer", optimizer, OPTIMIZERS)
    check_choice("framework", framework, FRAMEWORKS)
    return state_bytes(framework, precision, optimizer)


@dataclass(frozen=True)
class SavedActivations:
    """What the forward pass leaves for the backward pass (see :func:`saved_activations`).

    Attributes:
        terms: the per-tensor terms (:func:`activation_terms`).
        bytes: saved at the end of the forward pass, all layers and the tensors outside them.
        live_layer: re-materialized during backward by recomputation (one segment, or the attention core).
        segment: layers per checkpointed segment (``checkpoint_every`` capped at the layer count).
    """

    terms: list[ActivationTerm]
    bytes: int
    live_layer: int
    segment: int


def saved_activations(cfg: ModelConfig, setup: TrainingSetup,
                      terms: list[ActivationTerm] | None = None) -> SavedActivations:
    """Bytes saved for backward, under the recomputation chosen (Korthikanti et al. 2022, ``korthikanti2022reducing``).

    Without recomputation: L × (one layer's terms) + the terms outside the layers (:func:`activation_terms`;
    under torch.autocast :func:`memlib.core.autocast.autocast_activation_terms`). Selective recomputation drops
    the attention core (Korthikanti's 5as/h term) and recomputes it one layer at a time. Full recomputation keeps
    each segment's input, ⌈L/k⌉ · e·b·s·h (fp32 under autocast), and re-materializes k layers during backward
    (Chen et al. 2016's segments; k = 1 is transformers' ``gradient_checkpointing_enable()``).
    LoRA (peft, ``lora_dropout=0``; measured in Chapter 9): frozen weights drop what only their weight
    gradients needed (the RMSNorms' outputs, the MLP product, the final RMSNorm), and every adapted Linear
    adds an fp32 copy of its input and lora_A's rank-r output.

    ``terms``: another implementation's (an engine's own model, :mod:`memlib.core.engines`); default the
    framework's :meth:`memlib.core.frameworks.base.Framework.activation_terms`.

    Raises:
        MemlibError: LoRA/QLoRA for a family whose LoRA terms memlib has not derived.
    """
    b, s, e = setup.batch_size, setup.seq_len, setup.act_bytes
    if terms is None:
        terms = framework_for(setup).activation_terms(cfg, setup)  # as the framework's kernels save them
    terms = loss_terms(cfg, setup, terms) + fp8_terms(cfg, setup, terms)  # Chapter 17: the loss, FP8 Linears
    per_layer, outside = _sum_terms(terms)
    L, h, f, T, method = cfg.num_layers, cfg.hidden_size, cfg.intermediate_size, b * s, setup.method
    if method != "full" and (cfg.model_type == "olmo2" or cfg.model_type in DENSE_FAMILIES):
        raise MemlibError(f"method {method!r} is estimated for gpt2, llama, mistral, qwen2, gemma and qwen3, not "
                          f"{cfg.model_type}; expected method 'full' (or trace a LoRA step: memlib.core.lora)")
    if method != "full" and cfg.model_type != "gpt2":
        by_name = {t.name: t.bytes for t in terms}
        adapters = sum(4 * T * i + 4 * T * setup.lora_rank for _, i, _ in targeted_linears(cfg, setup.lora_targets))
        per_layer += adapters - by_name["RMSNorm normalized and weighted outputs ×2"] - e * T * f
        outside -= by_name["final RMSNorm"]
    k_seg, saved_layers, live_layer = setup.checkpoint_every, L * per_layer, 0
    if setup.recompute == "full":
        n_kept, k_seg = segment_layers(L, k_seg, clamp=True)  # Chapter 4's one segment formula, k capped at L
        saved_layers = segment_input_bytes(cfg, setup, n_kept)  # each segment's input (fp32 under autocast)
        live_layer = k_seg * per_layer  # one segment re-materialized during backward
    elif setup.recompute == "selective":
        core = sum(t.bytes for t in terms if t.per_layer and ("softmax" in t.name or "attention dropout" in t.name
                                                             or "log-sum-exp" in t.name))
        saved_layers = L * (per_layer - core)
        live_layer = core
    return SavedActivations(terms, saved_layers + outside, live_layer, k_seg)


def backward_peak_bytes(cfg: ModelConfig, setup: TrainingSetup, acts: SavedActivations, g_bytes: int, n: int,
                        n_train: int, layer_params: int) -> int:
    """Bytes on top of the weights and optimizer states at the backward pass's peak (Chapters 1 and 4).

    The backward pass starts with the loss temporaries and sweeps the layers, gradients accumulating while
    activations are freed; the peak is the largest of four moments (A = saved activations, e = activation
    bytes, T = b·s tokens, G = all gradients):

    * loss backward: A + 2·4·T·V (the log-softmax's gradient and the fp32 logits' gradient);
    * LM-head backward: A − 4TV + e·T·V + e·T·h + the V·h weight gradient;
    * the top layer's backward: A − 4TV + the embedding/head gradients + the re-materialized segment + the
      MLP's backward temporaries, 3·e·T·f + 2·e·T·h (≈ (2e + 1)·b·a·s² for a recomputed eager attention core,
      measured in Chapter 4);
    * without full recomputation, the end: G (less the k − 1 layers of the bottom segment without gradients yet)
      + a tied embedding's out-of-place gradient sum + the live layer;
    * with full recomputation (checked against CPU and meta traces of pure fp32/bf16 steps), the bottom segment's
      backward: what the forward left for it (its saved input, the rotary tables, the ids) + G less the bottom
      segment's and (untied) the embedding's gradients + the re-materialized segment + down_proj's weight
      gradient and two T·f gradients; with eager attention also the bottom layer's attention-core backward: the
      MLP's, o_proj's and norm's gradients made, q/k/v and one norm's tensors kept, the fp32 probabilities with
      their fp32 gradient and the softmax's (3 × the fp32 probabilities) and the attention output's gradient;
      and the end: G + a tied embedding's out-of-place gradient sum + the small tensors left.

    MoE models without recomputation add the expert backward (:func:`memlib.core.families_moe.bottom_backward_bytes`).
    LoRA freezes the embedding and the head. torch.autocast: :func:`memlib.core.autocast.autocast_backward_peak`.
    """
    b, s, e, full = setup.batch_size, setup.seq_len, setup.act_bytes, setup.method == "full"
    L, h, V, f, T = cfg.num_layers, cfg.hidden_size, cfg.vocab_size, cfg.intermediate_size, b * s
    if setup.autocast and full:  # fp32 gradients, the end of the forward pass: memlib.core.autocast
        return autocast_backward_peak(cfg, setup, acts, g_bytes, n, layer_params)
    activations, live_layer, k_seg = acts.bytes, acts.live_layer, acts.segment
    g_per_param = g_bytes / n_train
    grad_per_layer = int(g_per_param * layer_params) if full else g_bytes // L
    head_grad = int(g_per_param * (n - L * layer_params)) if full else 0
    vh_grad = int(g_per_param * V * h) if full else 0
    mlp_temp = 3 * e * T * f + 2 * e * T * h
    if setup.attention == "eager" and setup.recompute != "none":
        mlp_temp = max(mlp_temp, (2 * e + 1) * b * cfg.num_heads * s * s)
    saved_logits, logsm, rows = loss_logits(cfg, setup)  # Chapter 17: standard, chunked or fused loss
    tied_sum = 2 * vh_grad if cfg.tie_word_embeddings else 0
    candidates = [
        activations - saved_logits + 3 * logsm,  # the log-softmax (kept or re-made) and two gradients
        activations - saved_logits + e * rows * V + e * T * h + vh_grad,
        activations - saved_logits + head_grad + live_layer + mlp_temp,
    ]
    if setup.recompute == "full" and full:
        outside = sum(t.bytes for t in acts.terms if not t.per_layer)
        small = outside - sum(t.bytes for t in acts.terms if not t.per_layer and (
            "final" in t.name or t.name.startswith("log-softmax")))
        untied = 0 if cfg.tie_word_embeddings else vh_grad  # the embedding's gradient comes last
        below = small + segment_input_bytes(cfg, setup, 1) + g_bytes - untied
        above = small + segment_input_bytes(cfg, setup, -(-L // k_seg)) + head_grad - untied
        mlp_start = int(g_per_param * f * h) + 2 * e * T * f  # down_proj's weight gradient, 2 T·f gradients
        candidates[2] = above + live_layer + mlp_start  # the top segment's backward
        candidates += [below - k_seg * grad_per_layer + live_layer + mlp_start, g_bytes + tied_sum + small]
        layer = {t.name: t.bytes for t in acts.terms if t.per_layer}
        probs = layer.get("softmax probabilities (fp32)")
        if setup.attention == "eager" and probs is not None:  # a layer's attention-core backward, top and bottom
            made = int(g_per_param * (3 * h * f + cfg.q_dim * h + h))  # its MLP's, o_proj's, norm's gradients
            kept = sum(v for k, v in layer.items() if k.startswith("q")) + sum(
                v for k, v in layer.items() if "RMSNorm" in k) // 2
            core = made + kept + 3 * probs + e * T * h
            candidates += [above + core, below - grad_per_layer + core]
    else:
        candidates.append(g_bytes - (k_seg - 1) * grad_per_layer + tied_sum + live_layer)
    if (cfg.moe is not None or cfg.mla is not None) and setup.recompute == "none" and full:
        candidates.append(families_moe.bottom_backward_bytes(cfg, acts.terms, g_bytes, g_per_param, b=b, s=s,
                                                             attention=setup.attention))
    return max(candidates)


def estimate_training(model: str | Path | dict[str, Any] | ModelConfig | None = None,
                      setup: TrainingSetup | None = None, *, params: int | None = None,
                      batch_size: int | None = None, seq_len: int | None = None, precision: str | None = None,
                      optimizer: str | None = None, zero_stage: int | None = None, num_gpus: int | None = None,
                      recompute: str | None = None, attention: str | None = None,
                      checkpoint_every: int | None = None, offload: str | None = None, method: str | None = None,
                      lora_rank: int | None = None, lora_targets: str | None = None, tp: int | None = None,
                      pp: int | None = None, cp: int | None = None, ep: int | None = None,
                      sequence_parallel: bool | None = None, micro_batches: int | None = None,
                      pp_schedule: str | None = None, optimizer_impl: str | None = None,
                      framework: str | None = None,
                      gradient_as_bucket_view: bool | None = None, etp: int | None = None,
                      grad_accum: int | None = None, fp8_recipe: str | None = None,
                      loss: str | None = None, loss_chunk: int | None = None,
                      optimizer_source: str | None = None,
                      grad_accum_dtype: str | None = None) -> TrainingEstimate:
    """Estimate the peak training memory per GPU.

    Introduced in Chapter 1. Model states follow the layout of ``framework`` (:mod:`memlib.core.frameworks`:
    PyTorch AMP 4 + 4 + 8 bytes/param, DeepSpeed the ZeRO paper's 2 + 2 + 12 partitioned by stage, FSDP2
    sharded fp32 states plus its working set, Megatron 2 + 4 + 12 with the distributed optimizer as ZeRO-1),
    sharded over ``num_gpus`` data-parallel ranks.
    The peak is the larger of (a) the backward pass — states + saved activations + the loss and backward
    temporaries, with gradients accumulating while activations are freed — and (b) the optimizer step —
    states + all gradients + the step's temporaries (``torch.optim.AdamW``'s foreach path allocates one
    full-size buffer for sqrt(v), the for-loop path two of the largest tensor, the fused path none;
    DeepSpeed's fp32 gradient partition: :func:`optimizer_step_bytes`), DeepSpeed's reduce bucket on top
    (:func:`memlib.core.frameworks.bucket_bytes`).

    Call it with a setup, ``estimate_training("llama-2-7b", TrainingSetup(batch_size=4, zero_stage=3,
    num_gpus=8))``, or with the setup's fields as keywords (``estimate_training("llama-2-7b", batch_size=4)``),
    which build the :class:`memlib.core.setup.TrainingSetup` (a keyword left out takes the setup's default).
    The peak is composed from the per-term functions of this module, in this order: model states, ZeRO
    sharding, ZeRO-3's gathered layers, the offload split, saved activations, the backward peak and the
    optimizer-step peak.

    Args:
        model: shipped name, config.json path, dict or ModelConfig; or None with ``params``.
        setup: the settings; None to build them from the keywords below (not both).
        params: parameter count, for model states only (activations are then None).
        batch_size: micro-batch size per GPU.
        seq_len: sequence length.
        precision: ``fp32``, ``fp16-mixed``, ``bf16-mixed`` or ``bf16``.
        optimizer: ``sgd``, ``sgd-momentum``, ``adamw`` or ``adamw-8bit``.
        optimizer_impl: ``foreach`` (default), ``fused`` or ``for-loop``: the torch.optim.AdamW implementation
            (``adamw`` only; :data:`memlib.core.choices.OPTIMIZER_IMPLS`). Under DeepSpeed it applies with
            ``optimizer_source="client"`` only.
        optimizer_source: ``framework`` (default) or ``client``, DeepSpeed only: its FusedAdam built from the
            config, or the script's ``torch.optim`` optimizer (:data:`memlib.core.choices.OPTIMIZER_SOURCES`).
        zero_stage: 0 (plain data parallel), 1, 2 or 3 (the stages ``framework`` supports).
        gradient_as_bucket_view: PyTorch DDP's flag (``framework="pytorch"`` with ``num_gpus`` > 1, which is
            ``DistributedDataParallel``): False (DDP's default) adds the Reducer's flat gradient buckets, one more
            gradient copy live at the step; True makes the gradients views of them
            (:func:`memlib.core.frameworks.ddp_bucket_bytes`).
        grad_accum: micro-batches per optimizer step (gradient accumulation; default 1). Only DeepSpeed's ZeRO-1
            peak and the offload traffic depend on it (:class:`memlib.core.setup.TrainingSetup`).
        grad_accum_dtype: DeepSpeed's ``data_types.grad_accum_dtype``: ``model`` (default) or ``fp32``, which
            with ZeRO-1 in bf16-mixed runs ``BF16_Optimizer`` (an unsharded fp32 gradient buffer,
            :meth:`memlib.core.frameworks.deepspeed.DeepSpeed.bf16_optimizer`).
        framework: ``pytorch`` (default), ``deepspeed``, ``fsdp2`` or ``megatron``
            (:data:`memlib.core.choices.FRAMEWORK_SUPPORT` lists the ZeRO stages, offload and parallelism each
            supports; fsdp2's zero 2/3 are ``reshard_after_forward`` False/True).
        fp8_recipe: with ``precision="fp8-mixed"`` (Chapter 17): ``tensorwise`` (default), ``rowwise`` or
            ``blockwise``: what the FP8 Linears save (:func:`memlib.core.fp8.fp8_terms`).
        loss: ``standard`` (default), ``chunked`` or ``fused`` (Chapter 17, :mod:`memlib.core.losses`); the fp32
            logits live at the loss are ``logits_bytes`` of the estimate. loss_chunk: tokens per chunk (chunked).
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
            experts over ep ranks folded over the tp·cp·dp grid (Megatron-Core's MoE folding: gpus divisible by
            etp·ep·pp, ep dividing the experts), ZeRO sharding the non-expert states over dp·cp and the expert
            states over gpus/(etp·ep·pp), and adds the all-to-all buffers; balanced routing leaves the
            activations unchanged.
        etp: expert tensor-parallel degree (Megatron-Core's MoE parallel folding: gpus divisible by etp·ep·pp);
            None: 1 with ep > 1, else tp (:func:`memlib.core.parallel.check_layout`).

    Returns:
        The estimate, bytes per GPU (and ``cpu_bytes`` of host memory with offload).

    Raises:
        MemlibError: a setup and keyword settings both given; for bad input (message names the value and the
            choices), including a ``seq_len`` above
            the model's maximum positions (:func:`memlib.core.configs.check_seq_len`).

    Limitations:
        No CUDA context, allocator rounding or library workspaces (see Chapter 1's GPU comparison);
        DeepSpeed ZeRO-3 adds the most weights its coordinator holds gathered over a pass (prefetch, reuse
        distance and live-parameter cap at their defaults, :mod:`memlib.core.frameworks.zero3_fetch`) and one
        module's gradients to the backward pass, whatever the moment; DeepSpeed's reduce bucket is counted at its default size, PyTorch DDP's buckets in full
        (they cover every gradient); FSDP2's and Megatron's are not. LoRA activations are taken
        full fine-tuning's for GPT-2 (derived and measured for the llama family, ``lora_dropout=0``); the CPU
        side of offload omits DeepSpeed's pinned buffers. Under model parallelism (``tp``, ``pp``, ...) the
        estimate takes ``fp8-mixed`` as bf16-mixed and the loss as standard.
    """
    setup = _training_setup(setup, dict(
        batch_size=batch_size, seq_len=seq_len, precision=precision, optimizer=optimizer, zero_stage=zero_stage,
        num_gpus=num_gpus, recompute=recompute, attention=attention, checkpoint_every=checkpoint_every,
        offload=offload, method=method, lora_rank=lora_rank, lora_targets=lora_targets, tp=tp, pp=pp, cp=cp, ep=ep,
        sequence_parallel=sequence_parallel, micro_batches=micro_batches, pp_schedule=pp_schedule,
        optimizer_impl=optimizer_impl, framework=framework, gradient_as_bucket_view=gradient_as_bucket_view,
        etp=etp, grad_accum=grad_accum, fp8_recipe=fp8_recipe, loss=loss, loss_chunk=loss_chunk,
        optimizer_source=optimizer_source, grad_accum_dtype=grad_accum_dtype))
    if setup.model_parallel:
        return _estimate_model_parallel(model, params, setup)
    cfg, n, small, layer_params = _model_size(model, params, setup)
    if cfg is None:  # params=N: the model states only
        return states_estimate(n, setup)
    return compose_training(cfg, n, small, layer_params, setup, saved_activations(cfg, setup))


def compose_training(cfg: ModelConfig, n: int, small: int, layer_params: int, setup: TrainingSetup,
                     acts: SavedActivations) -> TrainingEstimate:
    """The peak of one data-parallel step from its parts (:func:`estimate_training`'s composition, Chapter 1): the
    framework's model states, the saved activations ``acts``, the backward pass's moments and the optimizer step.
    :mod:`memlib.core.engines` calls it with an engine's own model's activations."""
    fw = framework_for(setup)  # the framework's object: its states, buffers, backward moments and step temporaries
    st = model_states(cfg, n, small, layer_params, setup)
    p_bytes, g_bytes, o_bytes, n_train = st.params_bytes, st.grads_bytes, st.optimizer_bytes, st.trainable_params
    settings = echo_settings(setup, cfg, n, n_train)
    backward_extra = fw.backward_extra(cfg, setup, Saved(acts.bytes, acts.live_layer, acts.terms), g_bytes, n,
                                       layer_params, lambda grads: backward_peak_bytes(cfg, setup, acts, grads, n,
                                                                                       n_train, layer_params))
    if not fw.working_set_at_step(setup):  # resharded after the backward pass: gone by the step
        p_bytes, g_bytes = p_bytes - st.gathered_params_bytes, g_bytes - st.gathered_grads_bytes
    step_temp = fw.step_temp_bytes(cfg, setup, n, n_train)
    g_bytes += st.buffer_step
    backward_peak = p_bytes + o_bytes + backward_extra
    optimizer_peak = p_bytes + o_bytes + g_bytes + step_temp
    if optimizer_peak > backward_peak:
        total, phase, temp = optimizer_peak, "optimizer", step_temp
    else:
        total, phase, temp = backward_peak, "backward", backward_extra - acts.bytes
    return TrainingEstimate(p_bytes, g_bytes, o_bytes, acts.bytes, max(temp, 0), total, phase, settings,
                            st.cpu_bytes, loss_logits(cfg, setup)[1])


def _training_setup(setup: TrainingSetup | None, given: dict[str, Any]) -> TrainingSetup:
    """The setup passed, or one built from the keyword settings that were given (not None)."""
    kw = {k: v for k, v in given.items() if v is not None}
    if setup is None:
        return TrainingSetup(**kw)
    if not isinstance(setup, TrainingSetup):
        raise MemlibError(f"invalid setup {setup!r}; expected a TrainingSetup")
    if kw:
        raise MemlibError(f"give a TrainingSetup or keyword settings, not both (got {', '.join(kw)})")
    return setup


def _model_size(model: str | Path | dict[str, Any] | ModelConfig | None, params: int | None,
                setup: TrainingSetup) -> tuple[ModelConfig | None, int, int, int]:
    """(config or None, parameters, those in tensors under 4096 elements, one layer's); checks the model and setup."""
    if model is None:
        if params is None:
            raise MemlibError("give a model (shipped name or config.json) or params=N")
        if setup.method != "full":
            raise MemlibError(f"method {setup.method!r} needs a model (shipped name or config.json), not params=N")
        return None, check_positive("params", params), 0, 0
    if params is not None:
        raise MemlibError("give either a model or params=N, not both")
    cfg = load_config(model)
    check_seq_len(cfg, setup.seq_len)
    if cfg.moe is not None or cfg.mla is not None:
        families_moe.check_lora(cfg, setup.method)
    pc = count_params(cfg)
    return cfg, pc.params, pc.small_tensor_params, pc.per_layer


def _estimate_model_parallel(model: str | Path | dict[str, Any] | ModelConfig | None, params: int | None,
                             setup: TrainingSetup) -> TrainingEstimate:
    """The worst rank under tensor/pipeline/context/expert parallelism (:func:`memlib.core.parallel.estimate_parallel`)."""
    cfg = None if model is None else load_config(model)
    layout = check_layout(cfg, setup.num_gpus, tp=setup.tp, pp=setup.pp, cp=setup.cp, ep=setup.ep,
                          sequence_parallel=setup.sequence_parallel, micro_batches=setup.micro_batches,
                          schedule=setup.pp_schedule, seq_len=setup.seq_len, etp=setup.etp)
    result: TrainingEstimate = estimate_parallel(
        cfg, layout, params=params, batch_size=setup.batch_size, seq_len=setup.seq_len, precision=setup.precision,
        optimizer=setup.optimizer, zero_stage=setup.zero_stage, recompute=setup.recompute,
        attention=setup.attention, offload=setup.offload, method=setup.method, framework=setup.framework)
    return result


def estimate_inference(model: str | Path | dict[str, Any] | ModelConfig, setup: InferenceSetup | None = None, *,
                       batch_size: int | None = None, seq_len: int | None = None, weights: str | None = None,
                       kv_dtype: str | None = None) -> InferenceEstimate:
    """Estimate inference memory: weights + KV cache for ``batch_size`` sequences of ``seq_len`` tokens.

    Introduced in Chapter 1. KV cache = 2 × layers × kv_heads × head_dim × seq_len × batch × bytes: GQA and
    MQA shrink it by num_heads / num_kv_heads; Gemma 2/3's sliding-window layers cache at most their window
    (:func:`memlib.core.inference.kv_cache_bytes`).

    Args:
        model: shipped name, config.json path, dict or ModelConfig.
        setup: the settings (:class:`memlib.core.setup.InferenceSetup`); None to build them from the keywords
            below (a keyword left out takes the setup's default: batch 1, 2048 tokens, fp16, fp16).
        batch_size: concurrent sequences.
        seq_len: tokens per sequence held in the cache (prompt + generated).
        weights: ``fp32``, ``fp16``, ``bf16``, ``int8``, ``int4`` or ``nf4``.
        kv_dtype: ``fp32``, ``fp16``, ``bf16`` or ``fp8``.

    Returns:
        The estimate in bytes.
    """
    cfg = load_config(model)
    given: dict[str, Any] = {k: v for k, v in dict(batch_size=batch_size, seq_len=seq_len, weights=weights,
                                                   kv_dtype=kv_dtype).items() if v is not None}
    if setup is not None and given:
        raise MemlibError(f"give an InferenceSetup or keyword settings, not both (got {', '.join(given)})")
    setup = setup if setup is not None else InferenceSetup(**given)
    b, weights, kv_dtype = setup.batch_size, setup.weights, setup.kv_dtype
    per_param = weight_bytes_per_param(weights)
    s = check_seq_len(cfg, setup.seq_len)
    pc = count_params(cfg)
    if weights in ("fp32", "fp16", "bf16"):
        w_bytes = int(per_param * pc.params)
    else:  # quantized Linear matrices; biases, embeddings, LM head and norms stay 16-bit (the one policy)
        w_bytes = quantized_weight_bytes(cfg, weights)
    kv = kv_cache_bytes(cfg, s, b, kv_dtype)  # sliding windows capped; MLA's latent
    settings = {"model": cfg.name, "batch_size": b, "seq_len": s, "weights": weights, "kv_dtype": kv_dtype,
                "params": pc.params}
    return InferenceEstimate(w_bytes, kv, w_bytes + kv, settings)
