"""How each training framework lays out the model states on a GPU: one place per framework (pure Python, Chapter 1).

:func:`memlib.core.estimate.estimate_training` composes the terms of this module for ``setup.framework``
(:data:`memlib.core.choices.FRAMEWORKS`); every formula names the framework source it follows. Ψ is the
parameter count, N the data-parallel ranks sharing the states (``setup.num_gpus``), K the optimizer's bytes.

* **pytorch** (plain PyTorch: ``torch.autocast`` AMP, ``torch/amp/autocast_mode.py``): the parameters stay
  fp32 and are the optimizer's own (no master copy): fp32 and ``*-mixed`` are 4 + 4 + K (Adam's m and v in
  fp32, K = 8; momentum 4; SGD 0); ``fp16-mixed`` adds ``torch/amp/grad_scaler.py``'s ``GradScaler``
  tensors (``_scale``, ``_growth_tracker``, ``found_inf``: 12 bytes). ``bf16`` is ``model.to(torch.bfloat16)``:
  2 + 2 + 2 per moment. ZeRO-1 is ``torch/distributed/optim/zero_redundancy_optimizer.py``'s
  ``ZeroRedundancyOptimizer``, which hands whole parameters to ranks greedily by size
  (``_partition_parameters``): ⌈O/N⌉ is the estimate, exact up to that packing. On more than one GPU the
  model is ``DistributedDataParallel``, whose Reducer keeps every gradient in flat buckets too
  (:func:`ddp_bucket_bytes`).
* **deepspeed** (``deepspeed/runtime/zero/stage_1_and_2.py``, ``stage3.py``): the ZeRO paper's accounting
  (Rajbhandari et al. 2020, §5, ``rajbhandari2020zero``): 16-bit params 2 + 16-bit grads 2 + fp32 master,
  m, v 12, partitioned by stage (Table 1 stays exact), plus the step's fp32 gradient partition and the
  reduce bucket (:func:`step_temp_bytes`, :func:`bucket_bytes`).
* **fsdp2** (``torch/distributed/fsdp/_fully_shard``: ``fully_shard`` with
  ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``): sharded fp32 params, grads and Adam states,
  (4 + 4 + 8)/N, plus the unsharded working set (:func:`gathered_bytes`), live in the backward pass only
  (:func:`fsdp2_backward_bytes`; checked against real ``fully_shard`` traces on one and two gloo ranks,
  ``tests/test_trace_fsdp2.py``).
* **megatron** (Megatron-LM, docs "Distributed Optimizer"; ``megatron/core/distributed/
  param_and_grad_buffer.py``, ``megatron/core/optimizer/distrib_optimizer.py``): bf16 params 2 + the fp32
  ``main_grad`` buffer 4 + fp32 main params, m, v 12 = 18 bytes/param; the distributed optimizer (ZeRO-1
  here) shards the 12: 6 + 12/d. ``main_grad`` is one buffer, allocated with the model (``_ParamAndGradBuffer``);
  each gradient is added into it as autograd makes it and then freed (``distributed_data_parallel.py``,
  ``DistributedDataParallel._make_backward_post_hook``: ``param.main_grad.add_(param.grad.data)``,
  ``param.grad = None``), so the whole 4 B/param is live through the backward pass, not only at the step.
"""
from __future__ import annotations

from . import families_moe
from .configs import ModelConfig
from .lora import lora_params, lora_small_tensor_params, qlora_base_bytes, targeted_linears
from .setup import TrainingSetup

__all__ = ["layout_bytes", "state_bytes", "optimizer_state_bytes", "model_state_bytes", "shard_states",
           "gathered_bytes", "fsdp2_backward_bytes", "fsdp2_traced_layout", "zero3_gathered_bytes", "offload_split",
           "bucket_bytes", "ddp_bucket_bytes", "optimizer_step_bytes",
           "GRAD_SCALER_BYTES", "DS_REDUCE_BUCKET", "DS_SUB_GROUP_SIZE"]

#: ``torch.amp.GradScaler``'s tensors on the device: ``_scale`` (fp32), ``_growth_tracker`` (int32) and the
#: ``found_inf`` of one device (fp32), one element each (``torch/amp/grad_scaler.py``).
GRAD_SCALER_BYTES = 12
#: DeepSpeed's ``reduce_bucket_size`` default, elements (``deepspeed/runtime/zero/config.py``: ``pp_int(5e8)``).
DS_REDUCE_BUCKET = 500_000_000
#: DeepSpeed ZeRO-3's ``sub_group_size`` default, elements (``deepspeed/runtime/zero/config.py``: ``pp_int(1e9)``).
DS_SUB_GROUP_SIZE = 1_000_000_000

# bitsandbytes 8-bit optimizers: tensors with fewer elements than this keep 32-bit states;
# quantized states carry one fp32 absmax per block of 256 elements.
_BNB_MIN_8BIT_SIZE = 4096
_BNB_BLOCK = 256


def layout_bytes(framework: str, precision: str) -> tuple[float, float, float, float]:
    """(working weights, gradients, master weights, one optimizer moment) bytes per parameter, before sharding.

    pytorch and fsdp2 keep fp32 parameters under mixed precision (the optimizer steps them: no master copy);
    deepspeed keeps 16-bit parameters and gradients with an fp32 master (ZeRO paper §3); megatron keeps bf16
    parameters, an fp32 ``main_grad`` and an fp32 main copy. ``fp32`` is 4/4/0/4 and pure ``bf16``
    (``model.to(torch.bfloat16)``) 2/2/0/2 everywhere.
    """
    if precision == "fp32":
        return 4.0, 4.0, 0.0, 4.0
    if precision == "bf16":
        return 2.0, 2.0, 0.0, 2.0
    return {"pytorch": (4.0, 4.0, 0.0, 4.0), "fsdp2": (4.0, 4.0, 0.0, 4.0), "deepspeed": (2.0, 2.0, 4.0, 4.0),
            "megatron": (2.0, 4.0, 4.0, 4.0)}[framework]


def state_bytes(framework: str, precision: str, optimizer: str) -> tuple[float, float, float]:
    """(weight, gradient, optimizer-state) bytes per parameter before sharding; the master copy counts as state.

    K = master + moments × moment bytes (Adam 2 moments, momentum 1, SGD 0); ``adamw-8bit`` keeps m and v in
    one byte each (bitsandbytes; the absmax and small-tensor details are :func:`optimizer_state_bytes`').
    """
    w, g, master, moment = layout_bytes(framework, precision)
    if optimizer == "adamw-8bit":
        return w, g, master + 2.0
    return w, g, master + {"sgd": 0, "sgd-momentum": 1, "adamw": 2}[optimizer] * moment


def optimizer_state_bytes(n_params: int, small_params: int, precision: str, optimizer: str,
                          framework: str = "deepspeed") -> int:
    """Optimizer-state bytes for ``n_params`` parameters (``small_params`` of them in tensors under 4096 elements).

    8-bit AdamW (Dettmers et al. 2022, ``dettmers2022optimizers``; bitsandbytes ``Optimizer8bit``): m and v in
    1 byte each plus one fp32 absmax per block of 256 elements; tensors under 4096 elements keep fp32 states.
    """
    _, _, per_param = state_bytes(framework, precision, optimizer)
    if optimizer != "adamw-8bit":
        return int(per_param * n_params)
    master = layout_bytes(framework, precision)[2]
    big = n_params - small_params
    return int(master * n_params + 2 * big * (1 + 4 / _BNB_BLOCK) + 2 * small_params * 4.0)


def model_state_bytes(cfg: ModelConfig | None, n: int, small: int, setup: TrainingSetup) -> tuple[int, int, int, int]:
    """Weights, gradients and optimizer states of the whole model on one GPU, before any sharding.

    Full fine-tuning: (w·Ψ, g·Ψ, K·Ψ) from :func:`state_bytes` for ``setup.framework`` (PyTorch AMP 4 + 4 + 8,
    DeepSpeed 2 + 2 + 12, Megatron 2 + 4 + 12, FSDP2 4 + 4 + 8), GradScaler's 12 bytes for PyTorch fp16 AMP.
    LoRA / QLoRA (Hu et al. 2021, ``hu2021lora``; Dettmers et al. 2023, ``dettmers2023qlora``): the frozen
    base in 16 bits whatever the framework (NF4 with double quantization for QLoRA,
    :func:`memlib.core.lora.qlora_base_bytes`) + r·(d_in + d_out) fp32 adapter weights per targeted Linear with
    fp32 gradients and states (peft's default upcast).

    Returns:
        (weight bytes, gradient bytes, optimizer-state bytes, trainable parameters).
    """
    fw, prec = setup.framework, setup.precision
    if setup.method == "full":
        w, g, _ = state_bytes(fw, prec, setup.optimizer)
        scaler = GRAD_SCALER_BYTES if fw == "pytorch" and prec == "fp16-mixed" else 0
        return int(w * n), int(g * n), optimizer_state_bytes(n, small, prec, setup.optimizer, fw) + scaler, n
    assert cfg is not None
    n_train = lora_params(cfg, setup.lora_rank, setup.lora_targets)
    base = qlora_base_bytes(cfg) if setup.method == "qlora" else (4 if prec == "fp32" else 2) * n
    small_train = lora_small_tensor_params(cfg, setup.lora_rank, setup.lora_targets)
    return base + 4 * n_train, 4 * n_train, optimizer_state_bytes(n_train, small_train, "fp32", setup.optimizer,
                                                                  fw), n_train


def shard_states(p_bytes: int, g_bytes: int, o_bytes: int, setup: TrainingSetup) -> tuple[int, int, int]:
    """Each framework's partitioning over N data-parallel GPUs (⌈x/N⌉ per sharded state).

    * deepspeed: ZeRO (Rajbhandari et al. 2020, §5): stage 1 shards the optimizer states (fp32 master
      included), stage 2 also the 16-bit gradients, stage 3 also the 16-bit weights.
    * pytorch: ZeRO-1 is ``ZeroRedundancyOptimizer`` (the optimizer states, whole tensors per rank).
    * megatron: the distributed optimizer (ZeRO-1) shards the fp32 main params and Adam states; the bf16
      params and the fp32 ``main_grad`` buffer stay whole (``distrib_optimizer.py``): 6 + 12/d for bf16.
    * fsdp2: ``fully_shard`` shards parameters, gradients and optimizer states at both stages (2 and 3 differ
      in the working set, :func:`gathered_bytes`).

    Returns:
        (weight bytes, gradient bytes, optimizer-state bytes) per GPU.
    """
    n, z = setup.num_gpus, setup.zero_stage
    if setup.framework == "fsdp2":
        z = 3
    return (-(-p_bytes // n) if z >= 3 else p_bytes, -(-g_bytes // n) if z >= 2 else g_bytes,
            -(-o_bytes // n) if z >= 1 else o_bytes)


def gathered_bytes(cfg: ModelConfig | None, layer_params: int, p_sharded: int, n: int, n_train: int,
                   setup: TrainingSetup) -> tuple[int, int]:
    """The unsharded weights and gradients a sharded framework materializes while computing (its working set).

    U is the largest unit (a decoder layer or the V·h embedding; DeepSpeed's
    ``estimate_zero3_model_states_mem_needs`` takes the largest layer too).

    * deepspeed ZeRO-3 (``deepspeed/runtime/zero/partitioned_param_coordinator.py``): the module being computed
      and the prefetched next, gathered in the base weight dtype w: 2·w·U; one module's 16-bit gradients g·U
      until reduce-scattered (full fine-tuning only: LoRA's frozen base has none).
    * fsdp2 (``torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py``): all-gathered weights in
      ``param_dtype`` (2 bytes under mixed precision or bf16, 4 in fp32): with ``reshard_after_forward=True``
      (zero 3) the layer being computed and the prefetched next, 2·p·U; with ``False`` (zero 2) every layer's
      from the forward to its backward, p·Ψ. Gradients: one layer's unsharded gradient in ``param_dtype`` plus
      its fp32 copy for ``reduce_dtype`` before the reduce-scatter (``_fsdp_collectives.py``:
      ``foreach_reduce``), (p + 4)·U under mixed precision, p·U otherwise. That is the coarse model kept for
      LoRA and ``CPUOffloadPolicy``; full fine-tuning without offload (:func:`fsdp2_traced_layout`) returns the
      working set at its largest as :func:`fsdp2_backward_bytes` follows it, which the estimate counts in the
      backward pass only (FSDP2 reshards every group after its backward: none of it is live at the step):
      weights p·U_r (the root group: embedding, final norm, LM head) + p·U_l for each layer unsharded at once
      (zero 2: all L; zero 3: 1, or 2 with the prefetch of N > 1 ranks); gradients the LM head's and final
      norm's p·(V·h + h) + one layer's unsharded gradients and reduce-scatter input, (p + r)·U_l.

    Returns:
        (gathered weight bytes, gathered gradient bytes); (0, 0) for pytorch, megatron, deepspeed below
        stage 3, or without a model.
    """
    fw, full = setup.framework, setup.method == "full"
    if cfg is None or fw in ("pytorch", "megatron") or (fw == "deepspeed" and setup.zero_stage != 3):
        return 0, 0
    biggest = max(layer_params, cfg.vocab_size * cfg.hidden_size)
    if fw == "fsdp2" and fsdp2_traced_layout(setup):  # freed before the step: fsdp2_backward_bytes' moments
        p, r = (4, 4) if setup.precision == "fp32" else (2, 2) if setup.precision == "bf16" else (2, 4)
        u_root = n - cfg.num_layers * layer_params
        layers = cfg.num_layers if setup.zero_stage == 2 else 1 + (1 if setup.num_gpus > 1 else 0)
        return (p * (u_root + layers * layer_params),
                p * (cfg.vocab_size * cfg.hidden_size + cfg.hidden_size) + (p + r) * layer_params)
    if fw == "fsdp2":
        pb = 4 if setup.precision == "fp32" else 2
        weights = pb * n if setup.zero_stage == 2 else 2 * pb * biggest
        grads = (pb + (4 if setup.precision.endswith("-mixed") else 0)) * biggest
        return int(weights), int(grads) if full else 0
    base_per_param = (p_sharded * setup.num_gpus - 4 * (0 if full else n_train)) / n
    g = state_bytes(fw, setup.precision, setup.optimizer)[1]
    return int(2 * base_per_param * biggest), int(g * biggest) if full else 0


#: Kept under its old name: :func:`gathered_bytes` (ZeRO-3's gathered layers were the first working set).
zero3_gathered_bytes = gathered_bytes


def offload_split(p_bytes: int, g_bytes: int, o_bytes: int, n_train: int,
                  setup: TrainingSetup) -> tuple[int, int, int, int]:
    """What moves to host memory with CPU offload, and what the GPU keeps (Chapter 7).

    * deepspeed ``offload_optimizer`` (ZeRO-Offload, Ren et al. 2021, §4, ``ren2021zerooffload``): the
      optimizer states (fp32 master included) and the fp32 gradient partition, 4·Ψ_train/N, live in CPU memory
      and the step runs there; the GPU keeps the 16-bit weights and gradients. With ZeRO-2 each gradient goes
      to the host through the reduce bucket (``reduce_bucket_size`` = 5·10⁸ elements): the GPU holds at most
      g·5·10⁸ bytes of them. ``offload_param`` (ZeRO-Infinity, ``rajbhandari2021zeroinfinity``) moves the
      16-bit weight shards too; the GPU holds only gathered layers.
    * fsdp2 ``CPUOffloadPolicy``: the sharded fp32 params, grads and optimizer states all live on the host.

    Returns:
        (weight bytes, gradient bytes, optimizer-state bytes) on the GPU and the CPU bytes.
    """
    if setup.offload == "none":
        return p_bytes, g_bytes, o_bytes, 0
    if setup.framework == "fsdp2":
        return 0, 0, 0, p_bytes + g_bytes + o_bytes
    cpu_bytes = o_bytes + -(-4 * n_train // setup.shards)
    if setup.offload == "optimizer" and setup.zero_stage == 2 and setup.method == "full":
        g_bytes = min(g_bytes, int(state_bytes(setup.framework, setup.precision, setup.optimizer)[1]
                                   * DS_REDUCE_BUCKET))
    if setup.offload == "params+optimizer":
        cpu_bytes += p_bytes
        p_bytes = 0
        g_bytes = 0 if setup.method == "full" else g_bytes
    return p_bytes, g_bytes, 0, cpu_bytes


def bucket_bytes(setup: TrainingSetup) -> tuple[int, int]:
    """DeepSpeed's gradient reduce bucket: (bytes live in the backward pass, bytes live at the optimizer step).

    ``deepspeed/runtime/zero/config.py``: ``contiguous_gradients`` True, ``reduce_bucket_size`` 5·10⁸
    elements, ``overlap_comm`` False below stage 3. Stages 1–2 (``stage_1_and_2.py``, ``setup_buckets``)
    allocate one bucket of 5·10⁸ gradient elements (two with ``overlap_comm``) before the backward pass and
    free it at the step (``_release_ipg_buffers``); ZeRO-3 (``stage3.py``, ``_create_fp16_sub_groups``' caller)
    allocates its bucket once, at initialization, so it is live at the step too. The all-gather of the updated
    weights (``allgather_bucket_size``) needs no buffer: ``all_gather_dp_groups`` gathers into the flat 16-bit
    groups with ``all_gather_into_tensor``. With offload the bucket is the gradients' staging area, already
    counted by :func:`offload_split`. Other frameworks: (0, 0) (FSDP2's reduce buffers are the working set).
    """
    if setup.framework != "deepspeed" or setup.zero_stage == 0 or setup.offload != "none":
        return 0, 0
    bucket = int(state_bytes("deepspeed", setup.precision, setup.optimizer)[1] * DS_REDUCE_BUCKET)
    return bucket, bucket if setup.zero_stage == 3 else 0


def ddp_bucket_bytes(setup: TrainingSetup, g_bytes: int) -> tuple[int, int]:
    """PyTorch DDP's gradient buckets: (bytes live through the backward pass, bytes on top of the gradients at the step).

    ``torch/nn/parallel/distributed.py`` (``DistributedDataParallel.__init__`` → ``_ddp_init_helper``) hands the
    trainable parameters (``_build_params_for_reducer``: those with ``requires_grad``) to the C++ Reducer
    (``torch/csrc/distributed/c10d/reducer.cpp``). ``Reducer::initialize_buckets``, run by its constructor,
    allocates one flat ``bucket.gradients = at::empty({offset}, options)`` per bucket in the parameters' dtype;
    the buckets together cover every trainable parameter once, so they hold g_bytes (the gradients' bytes:
    4·Ψ under AMP, whose parameters and gradients are fp32; ZeroRedundancyOptimizer shards only the optimizer
    states, not them). The sizes (``bucket_cap_mb`` 25 MiB, a first bucket of ``_DEFAULT_FIRST_BUCKET_BYTES``
    = 1 MiB, one bucket for the first iteration without ``find_unused_parameters``; ``_rebuild_buckets``
    re-splits them once, before the second forward) change how they are split, not the sum. They live as long
    as the Reducer, through every backward pass and optimizer step.

    * ``gradient_as_bucket_view=False`` (DDP's default): ``mark_variable_ready_dense`` copies each accumulated
      ``param.grad`` into its bucket view (``at::mul_out`` by 1/world size) and, after the all-reduce,
      ``copy_bucket_to_grad`` copies it back: the gradients and the buckets coexist, (g, g).
    * ``gradient_as_bucket_view=True``: ``mark_variable_ready_dense`` points ``grad`` at its bucket view (the
      tensor autograd accumulated is freed), so the gradients live in the buckets: the whole bucket memory is
      there from the start of the backward pass, nothing more at the step, (g, 0). The accumulated tensor of
      one parameter lives until its hook copies it (a transient this estimate leaves out).

    Returns:
        (0, 0) unless ``setup.ddp`` (``pytorch`` on more than one GPU); for one GPU no DDP is built.
    """
    if not setup.ddp or setup.model_parallel:
        return 0, 0
    return g_bytes, 0 if setup.gradient_as_bucket_view else g_bytes


def optimizer_step_bytes(cfg: ModelConfig, setup: TrainingSetup, g_bytes: int, n: int, n_train: int) -> int:
    """Temporaries of the optimizer step on the GPU, on top of the states and all gradients, per framework.

    * pytorch and fsdp2: ``torch.optim.AdamW`` (``torch/optim/adam.py``) steps the fp32 (AMP) or bf16
      parameters directly, in the implementation ``setup.optimizer_impl`` names:

      - ``foreach`` (``_multi_tensor_adam``): ``torch._foreach_sqrt(device_exp_avg_sqs)`` allocates one buffer
        the size of all of v, updated in place until ``_foreach_addcdiv_``: v-bytes·Ψ (4 under AMP and fp32,
        2 in pure bf16), ÷N with ZeRO-1 or FSDP2 (each rank steps its shard), 4·Ψ_train for LoRA's fp32
        adapters;
      - ``for-loop`` (``_single_tensor_adam``): per tensor, ``denom = (exp_avg_sq.sqrt() /
        bias_correction2_sqrt).add_(eps)`` holds the sqrt and the quotient at once, and the previous tensor's
        ``denom`` lives until the name is rebound: max over tensors i of numel(i−1) + 2·numel(i) elements
        (:func:`_for_loop_elements`, ``model.parameters()`` order); ZeroRedundancyOptimizer keeps whole
        tensors (no shrink), FSDP2's are 1/N shards;
      - ``fused`` (``torch._fused_adamw_``): 0.

      SGD (in place) and bitsandbytes' adamw-8bit (its own kernels) have none.
    * deepspeed: its default optimizer is ``FusedAdam`` (``deepspeed/ops/adam/fused_adam.py``, no temporary;
      ``optimizer_impl`` is ignored). Stages 0–2: ``DeepSpeedZeroOptimizer.step`` flattens the rank's gradient
      partition and converts it to fp32 (``single_grad_partition = self.flatten_dense_tensors_aligned(
      self.averaged_gradients[i], ...).to(fp32)``, assigned to ``single_partition_of_fp32_groups[i].grad``, freed
      after the step): the flat 16-bit copy ``torch.cat`` makes and its fp32 conversion coexist, 2·Ψ/N + 4·Ψ/N in
      mixed precision (the flat copy alone when the dtype already matches); the trace's DeepSpeed recipe
      (:mod:`memlib.measure.recipes`) holds the same.
      Stage 3 (``stage3.py``, ``_prepare_fp32_grad_for_sub_group``) does it one sub-group at a time:
      4·min(``sub_group_size`` = 10⁹, ⌈Ψ/N⌉). Stage 0 is ``BF16_Optimizer``/``FP16_Optimizer`` in mixed
      precision (the same fp32 flatten, N = 1) and the bare optimizer in fp32 or pure bf16 (0).
    * megatron: 0 (fused Adam; the main params' gradients are views of ``main_grad``).

    With offload the step runs on the CPU: 0 on the GPU.
    """
    fw, impl, n_gpus = setup.framework, setup.optimizer_impl, setup.num_gpus
    if setup.offload != "none" or fw == "megatron":
        return 0
    n_step = n if setup.method == "full" else n_train
    if fw == "deepspeed":
        if setup.zero_stage == 0 and setup.precision in ("fp32", "bf16"):
            return 0  # no ZeRO optimizer wrapper: the client's optimizer steps the parameters
        part = -(-n_step // setup.shards)
        if setup.zero_stage == 3:
            v_bytes = 2 if setup.precision == "bf16" and setup.method == "full" else 4
            return v_bytes * min(DS_SUB_GROUP_SIZE, part)
        flat = 4 if setup.precision == "fp32" or setup.method != "full" else 2  # torch.cat's flat copy
        return (flat + (4 if setup.precision.endswith("-mixed") else 0)) * part  # + its fp32 conversion
    if setup.optimizer != "adamw" or impl == "fused":
        return 0
    shards = n_gpus if fw == "fsdp2" else setup.shards
    if setup.method != "full":
        if impl == "for-loop":
            return 4 * -(-_lora_for_loop_elements(cfg, setup) // (n_gpus if fw == "fsdp2" else 1))
        return -(-4 * n_train // shards)
    v_bytes = 2 if setup.precision == "bf16" else 4
    if impl == "for-loop":
        return v_bytes * -(-_for_loop_elements(cfg) // (n_gpus if fw == "fsdp2" else 1))
    return -(-v_bytes * n // shards)


#: Bytes per element of one fp32 tensor's AdamW temporaries, per implementation.
_ADAMW_TEMP_BYTES = {"foreach": 4, "fused": 0, "for-loop": 8}


def _for_loop_elements(cfg: ModelConfig) -> int:
    """Elements of ``_single_tensor_adam``'s temporaries at their peak: max_i numel(i−1) + 2·numel(i).

    Exact for the llama-like families (llama, mistral, qwen2, gemma, qwen3, olmo2), whose parameters are listed in
    ``model.parameters()`` order; for the others an upper bound, max(2·embedding, 3·largest other tensor).
    """
    order = _parameter_order(cfg)
    if order is not None:
        return max(prev + 2 * cur for prev, cur in zip([0] + order, order))
    h, f, V = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
    n_max = (families_moe.largest_tensor(cfg) if cfg.moe is not None or cfg.mla is not None
             else max(h * f, 3 * h * h, h * cfg.q_dim, V * h if not cfg.tie_word_embeddings else 0))
    return max(2 * V * h, 3 * n_max)


def _parameter_order(cfg: ModelConfig) -> list[int] | None:
    """Element counts of the parameter tensors in ``model.parameters()`` order, for the llama-like families.

    The order is the modules' ``__init__`` order in transformers (``LlamaDecoderLayer``: self_attn (q, k, v, o
    with their biases, then Qwen3's/OLMo2's q_norm, k_norm), mlp (gate, up, down), then the two norms). None
    for the other families.
    """
    if (cfg.model_type not in ("llama", "mistral", "qwen2", "gemma", "qwen3", "olmo2") or cfg.moe is not None
            or cfg.mla is not None or cfg.learned_positions):
        return None
    h, q, kv, f, V = cfg.hidden_size, cfg.q_dim, cfg.kv_dim, cfg.intermediate_size, cfg.vocab_size
    qkv_b = cfg.qkv_bias
    layer = [h * q] + ([q] if qkv_b else []) + [h * kv] + ([kv] if qkv_b else []) + [h * kv]
    layer += ([kv] if qkv_b else []) + [q * h] + ([h] if cfg.out_bias else [])
    if cfg.model_type == "qwen3":
        layer += [cfg.head_dim, cfg.head_dim]
    if cfg.model_type == "olmo2":
        layer += [q, kv]
    for rows in (f, f):
        layer += [h * rows] + ([rows] if cfg.mlp_bias else [])
    layer += [f * h] + ([h] if cfg.mlp_bias else []) + [h, h]
    return [V * h] + layer * cfg.num_layers + [h] + ([] if cfg.tie_word_embeddings else [V * h])


def _lora_for_loop_elements(cfg: ModelConfig, setup: TrainingSetup) -> int:
    """``_single_tensor_adam``'s peak temporaries over the LoRA adapters (A = r × in, then B = out × r)."""
    r = setup.lora_rank
    order = [x for _, d_in, d_out in targeted_linears(cfg, setup.lora_targets) for x in (r * d_in, d_out * r)]
    order = order * cfg.num_layers
    return max(prev + 2 * cur for prev, cur in zip([0] + order, order))


def fsdp2_traced_layout(setup: TrainingSetup) -> bool:
    """Whether FSDP2's working set is modelled moment by moment (:func:`fsdp2_backward_bytes`, checked against
    real ``fully_shard`` traces): full fine-tuning without offload. LoRA and ``CPUOffloadPolicy`` keep the
    coarser :func:`gathered_bytes` (two gathered units, or every layer at zero 2, live at both peaks)."""
    return setup.framework == "fsdp2" and setup.method == "full" and setup.offload == "none"


def fsdp2_backward_bytes(cfg: ModelConfig, setup: TrainingSetup, acts_bytes: int, layer_acts: int, live_layer: int,
                         n: int, layer_params: int) -> int:
    """FSDP2's bytes on top of its sharded parameters and optimizer states at the backward pass's peak.

    Followed through ``torch/distributed/fsdp/_fully_shard`` (``fully_shard`` on every decoder layer, then the
    root: embedding, final norm and LM head; traced for real by :mod:`memlib.measure.recipes`). A = saved
    activations, ``layer_acts`` one layer's (or one segment input's) share of them, e the activation bytes,
    p the ``param_dtype`` bytes (2 under mixed precision and bf16, 4 in fp32), r the ``reduce_dtype`` bytes (4
    under mixed precision), q the sharded gradient's (the model's own dtype), U_l a layer's and U_r the root's
    parameters, N the ranks:

    * working set (``_fsdp_param_group.py``, ``FSDPParamGroup.unshard``/``wait_for_unshard``/``reshard``): the
      root is unsharded from the loss to the end of the backward (its embedding's gradient comes last), p·U_r;
      a layer from its ``pre_backward`` to its ``post_backward``. With ``reshard_after_forward=True`` (zero 3)
      that is one layer, plus the next one ``_backward_prefetch`` all-gathers when N > 1 (one rank skips the
      all-gather: ``unshard`` returns at once for world size 1 and ``wait_for_unshard`` copies); with ``False``
      (zero 2) every layer not yet through its backward stays unsharded from the forward on.
    * gradients: autograd's unsharded gradients in ``param_dtype``; ``post_backward`` reshards the layer, then
      ``_fsdp_collectives.py``'s ``foreach_reduce`` copies them into a reduce-scatter input in
      ``reduce_dtype`` (r·U_l) and reduces into the sharded gradient (q·U_l/N). The input is kept in
      ``reduce_scatter_states`` until the next group's ``post_backward`` (``reduce_scatter_max_input_buffers``
      1), so one layer's r·U_l lives through the next layer's backward. The root's LM-head and final-norm
      gradients, p·(V·h + h), wait for the root's reduce at the end.

    The peak is the largest of these moments (the activation temporaries as in
    :func:`memlib.core.estimate.backward_peak_bytes`):

    * loss backward: A + 2·4·T·V + p·U_r + the layers unsharded then (zero 2: all; zero 3: the prefetched
      top layer when N > 1);
    * the top layer's backward: A − 4TV + p·(V·h + h) + p·U_r + its unsharded layers + the re-materialized
      segment + the MLP's backward temporaries;
    * layer i's backward, i < L (the peak under full recomputation, low in the stack): the saved activations
      of layers 1..i, i·``layer_acts``, + the sharded gradients of the L − i layers above, q·(L − i)·U_l/N, the
      reduce-scatter input of layer i + 1, r·U_l, p·(V·h + h), p·U_r, the unsharded layers (zero 2: layers
      1..i; zero 3: layer i, and i − 1 prefetched when N > 1), the segment and the MLP temporaries;
    * the root's reduce: q·L·U_l/N + the root's gradients p·U_r and their reduce-scatter input r·U_r.

    Limitations: the re-materialized layer's backward is :func:`memlib.core.estimate.backward_peak_bytes`' bound
    (the whole layer's activations plus the larger of the MLP's and the eager attention's temporaries); the
    traced peak falls inside the attention's backward with the MLP's activations already freed, so full
    recomputation is over-estimated by a few percent on tiny models (see ``bench/accuracy.py --frameworks``).
    N > 1 assumes dim-0 sizes divisible by N (FSDP2 pads each parameter's shard otherwise) and leaves out the
    all-gather's transient copy-in and output buffers (``foreach_all_gather``) beside the prefetched layer.
    """
    b, s, e, N = setup.batch_size, setup.seq_len, setup.act_bytes, setup.num_gpus
    L, h, V, f, T = cfg.num_layers, cfg.hidden_size, cfg.vocab_size, cfg.intermediate_size, b * s
    p = 4 if setup.precision == "fp32" else 2
    q = 2 if setup.precision == "bf16" else 4
    r = 4 if setup.precision != "bf16" else 2
    u_l, u_r = layer_params, n - L * layer_params
    prefetch = 1 if N > 1 else 0
    zero3 = setup.zero_stage == 3
    head_grads = p * (V * h + h)
    logsm = 4 * T * V
    mlp_temp = 3 * e * T * f + 2 * e * T * h
    if setup.attention == "eager" and setup.recompute != "none":
        mlp_temp = max(mlp_temp, (2 * e + 1) * b * cfg.num_heads * s * s)
    at_loss = p * u_l * (prefetch if zero3 else L)
    at_top = p * u_l * (1 + prefetch if zero3 else L)
    candidates = [
        acts_bytes + 2 * logsm + p * u_r + at_loss,
        acts_bytes - logsm + head_grads + p * u_r + at_top + live_layer + mlp_temp,
        -(-q * L * u_l // N) + (p + r) * u_r,
    ]
    for i in range(1, L):  # layer i's backward, below the top one: layers i+1..L are reduced and resharded
        unsharded = p * u_l * (i if not zero3 else 1 + (prefetch if i > 1 else 0))
        candidates.append(i * layer_acts + -(-q * (L - i) * u_l // N) + r * u_l + head_grads + p * u_r + unsharded
                          + live_layer + mlp_temp)
    return max(candidates)
