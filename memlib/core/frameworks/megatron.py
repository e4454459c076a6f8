"""Megatron-LM (Megatron-Core): bf16 params, the fp32 ``main_grad`` buffer, the distributed optimizer (Chapter 1).

Megatron-LM docs "Distributed Optimizer"; ``megatron/core/distributed/param_and_grad_buffer.py``,
``megatron/core/optimizer/distrib_optimizer.py``: bf16 params 2 + the fp32 ``main_grad`` buffer 4 + fp32 main
params, m, v 12 = 18 bytes/param; the distributed optimizer (ZeRO-1 here) shards the 12: 6 + 12/d; the bf16
params and the ``main_grad`` buffer stay whole. ``main_grad`` is one buffer, allocated with the model
(``_ParamAndGradBuffer``); each gradient is added into it as autograd makes it and then freed
(``distributed_data_parallel.py``, ``DistributedDataParallel._make_backward_post_hook``:
``param.main_grad.add_(param.grad.data)``, ``param.grad = None``), so the whole 4 B/param is live through the
backward pass, not only at the step. Its optimizer is fused Adam, whose main params' gradients are views of
``main_grad``: no step temporaries.

The fp32 ``main_grad`` is bf16's: ``megatron/training/arguments.py`` sets ``grad_reduce_in_fp32`` under
``--bf16`` only. Under ``--fp16`` the gradient buffer is 16-bit and the step copies each main parameter's
gradient to fp32 (``optimizer.py``, ``_copy_model_grads_to_main_grads``: ``main_param.grad =
model_param.main_grad.float()``): 2 + 2 + 16 = 20 bytes/param, 4 + 16/d with the distributed optimizer
(Megatron-LM docs, "Distributed Optimizer", its table), the fp32 gradient copies counted with the optimizer's
states as that table does. Gradient accumulation (``grad_accum``) accumulates into ``main_grad``: no change.

Megatron-FSDP (``--use-megatron-fsdp``, ``megatron/core/distributed/fsdp/``) is zero 2 and 3 here: the same buffers
with the gradient buffer (``optim_grads``) and the weight buffer too (``optim_grads_params``) sharded over dp·cp,
plus the gathered layers and the queued unsharded gradients (:func:`megatron_fsdp_working_set`).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

from ..configs import ModelConfig
from ..setup import TrainingSetup
from ..terms import ActivationTerm
from .base import Framework, Saved

__all__ = ["Megatron", "MEGATRON", "megatron_core_activation_terms", "megatron_fsdp_working_set",
           "MEGATRON_FSDP_STRATEGIES", "MFSDP_PREFETCH_ELEMENTS", "MFSDP_RS_QUEUE_ELEMENTS"]

#: memlib's ZeRO stage → Megatron-FSDP's ``--data-parallel-sharding-strategy`` (``--use-megatron-fsdp``;
#: ``megatron/core/distributed/fsdp/src/megatron_fsdp/param_and_grad_buffer.py``,
#: ``ParamAndGradBuffer._init_each_parameter_group_buffers``). Stage 1 is the distributed optimizer (Megatron-FSDP's
#: ``optim`` shards the same fp32 main weights and Adam states: the same bytes).
MEGATRON_FSDP_STRATEGIES = {0: "no_shard", 1: "optim", 2: "optim_grads", 3: "optim_grads_params"}
#: Megatron-FSDP's all-gather prefetch and reduce-scatter queue, in elements, by default
#: (``megatron_fsdp.py``, ``MegatronFSDP.__init__``: ``suggested_communication_unit_size`` is floored at 10⁹
#: elements, ``max(1_000_000_000, ...)``; ``suggested_AG_prefetch_size`` is half of it, ``suggested_RS_queue_capacity``
#: all of it).
MFSDP_PREFETCH_ELEMENTS = 500_000_000
MFSDP_RS_QUEUE_ELEMENTS = 1_000_000_000


def megatron_core_activation_terms(cfg: ModelConfig, batch_size: int, seq_len: int, act_bytes: int = 2,
                                   attention: str = "sdpa", implementation: str = "te") -> list[ActivationTerm]:
    """What Megatron-Core's ``GPTModel`` saves for backward, per GPU before the tp split. Chapter 15.

    ``implementation="te"`` (the GPU default, ``get_gpt_layer_with_transformer_engine_spec``; from the source of
    Megatron-Core 0.16 and TransformerEngine 2.x): ``TELayerNormColumnParallelLinear`` fuses the norm into
    linear_qkv and linear_fc1 and saves the norm input, its fp32 rstd and the normalized output (the GEMM input);
    the fused RoPE kernel saves only the frequencies; ``TEDotProductAttention`` (flash) saves q, k, v, the output
    (also ``linear_proj``'s input, one storage) and the fp32 log-sum-exp; the fused ``bias_swiglu`` saves fc1's
    output (gate and up, 2f); ``linear_fc2`` saves the SwiGLU output; the residual adds and
    ``hidden_dropout = 0`` save nothing. Per layer sbh·(12 + 4·kv/h + 6f/h)·e/2 + the fp32 extras: 33.5·sbh for
    Llama-3.1-70B, where Megatron's own ``megatron/training/theoretical_memory_usage.py``
    (``compute_activation_memory``: sbh(18 + 4f/h), Korthikanti's Table 2 with selective recomputation)
    gives 32 (it counts one MLP matrix of width f and dropout masks). With ``attention="eager"``
    ``FusedScaleMaskSoftmax`` saves the softmax, e·b·a·s², instead of the log-sum-exp.

    ``implementation="local-cpu"``: the local spec (``get_gpt_layer_local_spec``) as it runs on a CPU without
    apex or TransformerEngine, measured to the byte by ``bench/engines_on_cpu.py``: ``torch.nn.RMSNorm``'s
    composite CPU path (fp32 input and normalized copies, the rstd, the 16-bit output), RoPE's cos/sin per
    layer, ``DotProductAttention``'s baddbmm and bmm on k and v repeated to every head, the fp32 softmax of
    ``FusedScaleMaskSoftmax``'s torch fallback and its 16-bit copy, ``glu``'s two halves and product besides
    fc1's output. Dense models; the loss side is Megatron's vocab-parallel cross-entropy (fp32 logits).
    """
    b, s, e = batch_size, seq_len, act_bytes
    T, h, f, q, kv, a = b * s, cfg.hidden_size, cfg.intermediate_size, cfg.q_dim, cfg.kv_dim, cfg.num_heads
    local = implementation == "local-cpu"
    gated = cfg.mlp == "gated"
    if local:
        norm = [ActivationTerm("norm fp32 input and normalized copies, two norms (CPU RMSNorm)", 2 * 8 * T * h,
                               "2·8·b·s·h")]
        core = [ActivationTerm("rotary cos, sin for q and k, per layer", 4 * e * s * cfg.head_dim, "4·e·s·d"),
                ActivationTerm("q after RoPE", e * T * q, "e·b·s·q"),
                ActivationTerm("k, v repeated to every head", 2 * e * T * q, "2·e·b·s·q"),
                ActivationTerm("softmax fp32 output and its 16-bit copy", (4 + e) * b * a * s * s,
                               "(4 + e)·b·a·s²")]
        mlp = [ActivationTerm("MLP fc1 output (gate and up)", e * T * 2 * f, "e·b·s·2f"),
               ActivationTerm("MLP glu halves and product (fc2 input)", 3 * e * T * f, "3·e·b·s·f")]
    else:
        norm = [ActivationTerm("norm input (residual stream), two norms", 2 * e * T * h, "2·e·b·s·h")]
        core = [ActivationTerm("q, k after RoPE and v", e * T * (q + 2 * kv), "e·b·s·(q + 2kv)"),
                ActivationTerm("log-sum-exp (flash attention, fp32)", 4 * b * a * s, "4·b·a·s")
                if attention == "sdpa" else
                ActivationTerm("softmax output (FusedScaleMaskSoftmax)", e * b * a * s * s, "e·b·a·s²")]
        mlp = [ActivationTerm("MLP fc1 output (SwiGLU input)", e * T * (2 * f if gated else f), "e·b·s·2f"),
               ActivationTerm("MLP fc2 input (activation output)", e * T * f, "e·b·s·f")]
    final_norm = (8 if local else 0) * T * h + e * T * h * (1 if local else 2) + 4 * T
    outside = [ActivationTerm("input ids (int64)", 8 * T, "8·b·s", False),
               ActivationTerm("final norm (input, rstd, output)", final_norm, "", False),
               ActivationTerm("log-softmax of the fp32 logits (vocab-parallel cross-entropy)",
                              4 * T * cfg.vocab_size, "4·b·s·V", False),
               ActivationTerm("labels and loss mask", 9 * T, "9·b·s", False)]
    if local:
        outside.append(ActivationTerm("causal mask (bool, cached once)", s * s, "s²", False))
    return norm + [
        ActivationTerm("norm rstd, two norms (fp32)", 2 * 4 * T, "8·b·s"),
        ActivationTerm("linear_qkv and linear_fc1 inputs (norm outputs)", 2 * e * T * h, "2·e·b·s·h"),
        *core,
        ActivationTerm("attention output (linear_proj input)", e * T * q, "e·b·s·q"),
        *mlp] + outside


def megatron_fsdp_working_set(unit_params: int, n: int, zero_stage: int, w_bytes: float,
                              g_bytes: float) -> tuple[int, int]:
    """Megatron-FSDP's unsharded weights and gradients at the backward pass's peak, bytes. Chapter 15.

    Megatron-Core 0.16.1, ``megatron/core/distributed/fsdp/src/megatron_fsdp/``. ``optim_grads_params`` (zero 3):
    each ``TransformerLayer`` is a unit (``mcore_fsdp_adapter.py``: ``fsdp_unit_modules = [TransformerLayer]``)
    whose bf16 weights are all-gathered into a temporary bucket; ``AllGatherPipeline.all_gather_params``
    prefetches further buckets until at least ``suggested_AG_prefetch_size`` (5·10⁸) elements are on their way:
    U·(1 + ⌈5·10⁸/U⌉) elements gathered at once. Both sharded strategies (zero 2 and 3) produce each unit's
    gradient unsharded (``main_grad_alloc``) and queue it for reduce-scatter; ``GradReducePipeline.
    wait_for_previous_grad_reduce`` frees queued buckets only once the queue passes ``suggested_RS_queue_capacity``
    (10⁹ elements): U·(1 + ⌊10⁹/U⌋) elements of gradient in flight. Each is capped at the rank's ``n``
    parameters. With ``optim_grads`` the buckets follow ``--ddp-bucket-size``; memlib takes one layer.
    """
    if zero_stage < 2 or n <= 0:
        return 0, 0
    unit = max(1, unit_params)
    grads = int(g_bytes * min(n, unit * (1 + MFSDP_RS_QUEUE_ELEMENTS // unit)))
    weights = int(w_bytes * min(n, unit * (1 + -(-MFSDP_PREFETCH_ELEMENTS // unit)))) if zero_stage == 3 else 0
    return weights, grads


class Megatron(Framework):
    """Megatron-LM: 2 + 4 + 12 bytes per parameter under mixed precision."""

    name: ClassVar[str] = "megatron"
    mixed_layout: ClassVar[tuple[float, float, float, float]] = (2.0, 4.0, 4.0, 4.0)
    sharded_optimizer: ClassVar[str] = "Megatron's distributed optimizer"

    def parallel_activation_terms(self, cfg: ModelConfig, setup: TrainingSetup) -> list[ActivationTerm]:
        """Megatron-Core's ``GPTModel`` with TransformerEngine (:func:`megatron_core_activation_terms`) for dense
        models; the loss side (vocab-parallel fp32 logits) and MoE models keep the transformers terms."""
        if cfg.moe is not None or cfg.mla is not None or cfg.model_type not in (
                "llama", "mistral", "qwen2", "qwen3", "olmo2"):
            return super().parallel_activation_terms(cfg, setup)
        e = 4 if setup.precision == "fp32" else 2
        return megatron_core_activation_terms(cfg, setup.batch_size, setup.seq_len, e, setup.attention)

    def layout(self, precision: str) -> tuple[float, float, float, float]:
        """bf16-mixed 2 + 4 (fp32 ``main_grad``) + 4 + 2·4; fp16-mixed keeps a 16-bit gradient buffer: 2 + 2 + ..."""
        if precision == "fp16-mixed":
            return 2.0, 2.0, 4.0, 4.0
        return super().layout(precision)

    def state_bytes(self, precision: str, optimizer: str) -> tuple[float, float, float]:
        """:meth:`Framework.state_bytes`, with the fp32 gradient copies of fp16 (4 bytes/param) in the states."""
        w, g, k = super().state_bytes(precision, optimizer)
        return w, g, k + (4.0 if precision == "fp16-mixed" else 0.0)

    def optimizer_state_bytes(self, n_params: int, small_params: int, precision: str, optimizer: str) -> int:
        """:meth:`Framework.optimizer_state_bytes` + fp16's fp32 gradient copies (4 bytes/param)."""
        extra = 4 * n_params if precision == "fp16-mixed" and optimizer == "adamw-8bit" else 0
        return super().optimizer_state_bytes(n_params, small_params, precision, optimizer) + extra

    def backward_extra(self, cfg: ModelConfig, setup: TrainingSetup, saved: Saved, g_bytes: int, n: int,
                       layer_params: int, generic_peak: Callable[[int], int]) -> int:
        """``main_grad`` is one buffer, allocated with the model: all of it is live all along (none accumulates).
        Under Megatron-FSDP (zero 2, 3) that buffer is the shard, and the unsharded gradients queued for
        reduce-scatter (:meth:`working_set`, inside ``g_bytes``) are counted through the backward pass too."""
        return g_bytes + generic_peak(0)

    # --- Megatron-FSDP (``--use-megatron-fsdp``): zero 2 = optim_grads, zero 3 = optim_grads_params ------------
    def working_set(self, cfg: ModelConfig | None, layer_params: int, p_sharded: int, n: int, n_train: int,
                    setup: TrainingSetup) -> tuple[int, int]:
        """Megatron-FSDP's gathered weights and queued unsharded gradients (:func:`megatron_fsdp_working_set`);
        the sharded states themselves are the distributed optimizer's 2 + 4 + 12 bytes with the gradient (zero 2)
        and the weight (zero 3) buffers sharded too (``is_grad_buffer_distributed``,
        ``is_model_weight_buffer_distributed``): 2 + 16/N and 18/N bytes per parameter."""
        if cfg is None or setup.method != "full":
            return 0, 0
        w, g, _, _ = self.layout(setup.precision)
        return megatron_fsdp_working_set(layer_params, n, setup.zero_stage, w, g)

    def working_set_at_step(self, setup: TrainingSetup) -> bool:
        """Megatron-FSDP waits for every reduce-scatter and releases the gathered weights before the optimizer
        step (``MegatronFSDP.finish_grad_sync``): nothing of the working set is live at the step."""
        return setup.zero_stage < 2


#: The Megatron framework object.
MEGATRON = Megatron()
