"""The one interface every training framework implements, and the accounting they share (pure Python, Chapter 1).

A framework is one object (:class:`Framework`) whose methods answer, for a validated
:class:`~memlib.core.setup.TrainingSetup`: its states per parameter (:meth:`Framework.layout`), how it shards them
(:meth:`Framework.shard`), the unsharded working set it materializes (:meth:`Framework.working_set`), what it
moves to the host (:meth:`Framework.offload`), its gradient buffers (:meth:`Framework.gradient_buffers`), its
backward moments (:meth:`Framework.backward_extra`), its step temporaries (:meth:`Framework.step_temp_bytes`) and
what it supports (:attr:`Framework.supports`). :func:`memlib.core.estimate.estimate_training` composes these
without naming a framework; the defaults here are plain data parallelism with the ZeRO paper's sharding
(Rajbhandari et al. 2020, §5, ``rajbhandari2020zero``), and each framework module overrides what differs.
Ψ is the parameter count, N the data-parallel ranks sharing the states (``setup.num_gpus``), K the optimizer's bytes.

Where coming work goes: a new layout (TorchTitan, Megatron-FSDP) is a subclass in its own module; what a
framework's kernels save for backward (Megatron's fused softmax, TorchTitan's compiled blocks) overrides
:meth:`Framework.activation_terms`; gradient accumulation's extra buffers (DeepSpeed ZeRO-1's and ZeRO-2's
differ) belong in :meth:`Framework.gradient_buffers` and :meth:`Framework.backward_extra`; a precision-dependent
layout (DeepSpeed's ``FP16_Optimizer`` at stage 0, Megatron's 16-bit gradient buffer under fp16) in
:meth:`Framework.layout` and :meth:`Framework.optimizer_step_bytes`, all reading the setup they are given.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from .. import families_moe
from ..choices import FRAMEWORK_SUPPORT, check_framework
from ..configs import ModelConfig
from ..autocast import setup_activation_terms
from ..lora import lora_params, lora_small_tensor_params, qlora_base_bytes, targeted_linears
from ..setup import TrainingSetup
from ..terms import ActivationTerm

__all__ = ["Framework", "Support", "Saved", "layout_for_precision", "for_loop_elements", "lora_for_loop_elements",
           "parameter_order", "torch_adamw_step_bytes", "BNB_MIN_8BIT_SIZE", "BNB_BLOCK"]

# bitsandbytes 8-bit optimizers: tensors with fewer elements than this keep 32-bit states;
# quantized states carry one fp32 absmax per block of 256 elements.
BNB_MIN_8BIT_SIZE = 4096
BNB_BLOCK = 256


@dataclass(frozen=True)
class Support:
    """What a framework supports: ZeRO stages, offload choices, model-parallel degrees
    (:data:`memlib.core.choices.FRAMEWORK_SUPPORT`, the one table the setup validates against)."""

    zero_stages: tuple[int, ...]
    offload: tuple[str, ...]
    parallelism: tuple[str, ...]


@dataclass(frozen=True)
class Saved:
    """What the forward pass left for the backward pass, as a framework's backward moments need it."""

    bytes: int
    live_layer: int
    terms: list[ActivationTerm]


def layout_for_precision(precision: str, mixed: tuple[float, float, float, float]) -> tuple[float, float, float, float]:
    """(working weights, gradients, master weights, one optimizer moment) bytes per parameter: fp32 is 4/4/0/4 and
    pure bf16 (``model.to(torch.bfloat16)``) 2/2/0/2 in every framework; ``mixed`` is the framework's own."""
    if precision == "fp32":
        return 4.0, 4.0, 0.0, 4.0
    if precision == "bf16":
        return 2.0, 2.0, 0.0, 2.0
    return mixed


class Framework:
    """One training framework's memory layout. Subclasses set :attr:`name` and :attr:`mixed_layout` and override
    the methods where the framework differs from plain data parallelism with ZeRO sharding."""

    #: The name in :data:`memlib.core.choices.FRAMEWORKS`.
    name: ClassVar[str] = ""
    #: (working weights, gradients, master, one moment) bytes per parameter under ``*-mixed`` precision.
    mixed_layout: ClassVar[tuple[float, float, float, float]] = (2.0, 2.0, 4.0, 4.0)
    #: What shards the optimizer states at its ZeRO-1 (the planner's words for that rung).
    sharded_optimizer: ClassVar[str] = "ZeRO-1"
    #: Whose CPU-offload traffic model applies (:func:`memlib.core.offload.offload_traffic`'s ``implementation``):
    #: DeepSpeed's ZeRO-Offload by default.
    offload_traffic: ClassVar[str] = "deepspeed"

    @property
    def supports(self) -> Support:
        """The ZeRO stages, offload choices and parallelism the framework supports."""
        return Support(*FRAMEWORK_SUPPORT[self.name])

    def check(self, zero_stage: int, offload: str, parallel: bool | tuple[str, ...]) -> None:
        """Raise one line naming the valid combinations for a ZeRO stage, offload or parallelism the framework
        lacks (:func:`memlib.core.choices.check_framework`, which every setup runs)."""
        check_framework(self.name, zero_stage, offload, parallel)

    # --- states per parameter -------------------------------------------------------------------------------
    def layout(self, precision: str) -> tuple[float, float, float, float]:
        """(working weights, gradients, master weights, one optimizer moment) bytes per parameter, before sharding."""
        return layout_for_precision(precision, self.mixed_layout)

    def state_bytes(self, precision: str, optimizer: str) -> tuple[float, float, float]:
        """(weight, gradient, optimizer-state) bytes per parameter before sharding; the master copy counts as state.

        K = master + moments × moment bytes (Adam 2 moments, momentum 1, SGD 0); ``adamw-8bit`` keeps m and v in
        one byte each (bitsandbytes; the absmax and small-tensor details are :meth:`optimizer_state_bytes`').
        """
        w, g, master, moment = self.layout(precision)
        if optimizer == "adamw-8bit":
            return w, g, master + 2.0
        return w, g, master + {"sgd": 0, "sgd-momentum": 1, "adamw": 2}[optimizer] * moment

    def optimizer_state_bytes(self, n_params: int, small_params: int, precision: str, optimizer: str) -> int:
        """Optimizer-state bytes for ``n_params`` parameters (``small_params`` of them in tensors under 4096 elements).

        8-bit AdamW (Dettmers et al. 2022, ``dettmers2022optimizers``; bitsandbytes ``Optimizer8bit``): m and v in
        1 byte each plus one fp32 absmax per block of 256 elements; tensors under 4096 elements keep fp32 states.
        """
        _, _, per_param = self.state_bytes(precision, optimizer)
        if optimizer != "adamw-8bit":
            return int(per_param * n_params)
        master = self.layout(precision)[2]
        big = n_params - small_params
        return int(master * n_params + 2 * big * (1 + 4 / BNB_BLOCK) + 2 * small_params * 4.0)

    def extra_state_bytes(self, setup: TrainingSetup) -> int:
        """Framework state outside the per-parameter layout (PyTorch's GradScaler); 0 by default."""
        return 0

    def model_state_bytes(self, cfg: ModelConfig | None, n: int, small: int,
                          setup: TrainingSetup) -> tuple[int, int, int, int]:
        """Weights, gradients and optimizer states of the whole model on one GPU, before any sharding.

        Full fine-tuning: (w·Ψ, g·Ψ, K·Ψ) from :meth:`state_bytes` (+ :meth:`extra_state_bytes`).
        LoRA / QLoRA (Hu et al. 2021, ``hu2021lora``; Dettmers et al. 2023, ``dettmers2023qlora``): the frozen
        base in 16 bits whatever the framework (NF4 with double quantization for QLoRA,
        :func:`memlib.core.lora.qlora_base_bytes`) + r·(d_in + d_out) fp32 adapter weights per targeted Linear
        with fp32 gradients and states (peft's default upcast).

        Returns:
            (weight bytes, gradient bytes, optimizer-state bytes, trainable parameters).
        """
        prec = setup.precision
        if setup.method == "full":
            w, g, _ = self.state_bytes(prec, setup.optimizer)
            return (int(w * n), int(g * n), self.optimizer_state_bytes(n, small, prec, setup.optimizer)
                    + self.extra_state_bytes(setup), n)
        assert cfg is not None
        n_train = lora_params(cfg, setup.lora_rank, setup.lora_targets)
        base = qlora_base_bytes(cfg) if setup.method == "qlora" else (4 if prec == "fp32" else 2) * n
        small_train = lora_small_tensor_params(cfg, setup.lora_rank, setup.lora_targets)
        return (base + 4 * n_train, 4 * n_train,
                self.optimizer_state_bytes(n_train, small_train, "fp32", setup.optimizer), n_train)

    # --- what the forward pass saves ---------------------------------------------------------------------------
    def activation_terms(self, cfg: ModelConfig, setup: TrainingSetup) -> list[ActivationTerm]:
        """What the forward pass saves for backward under this framework's implementation of the model: by
        default the transformers model's terms in the setup's dtype (torch.autocast's under PyTorch AMP,
        :func:`memlib.core.autocast.setup_activation_terms`)."""
        return setup_activation_terms(cfg, setup)

    def parallel_activation_terms(self, cfg: ModelConfig, setup: TrainingSetup) -> list[ActivationTerm]:
        """What the forward pass saves under tensor/pipeline/context parallelism, where the framework runs its own
        model (Megatron-Core's ``GPTModel``, TorchTitan's Llama 3), one GPU's whole layer before the tp split
        (:func:`memlib.core.parallel.split_terms` divides it). By default the transformers model's terms in the
        activation dtype (16-bit under mixed precision): TorchTitan's ``torchtitan/models/llama3/model/model.py``
        is written as transformers writes Llama (``nn.RMSNorm``, ``F.scaled_dot_product_attention``,
        ``w2(F.silu(w1(x)) * w3(x))``)."""
        from ..activations import activation_terms

        return activation_terms(cfg, batch_size=setup.batch_size, seq_len=setup.seq_len,
                                precision=setup.precision, attention=setup.attention)

    # --- sharding, working set, offload ---------------------------------------------------------------------
    def shard_stage(self, setup: TrainingSetup) -> int:
        """The ZeRO stage whose sharding rule applies (the setup's by default)."""
        return setup.zero_stage

    def shard(self, p_bytes: int, g_bytes: int, o_bytes: int, setup: TrainingSetup) -> tuple[int, int, int]:
        """The partitioning over N data-parallel GPUs (⌈x/N⌉ per sharded state): ZeRO stage 1 shards the optimizer
        states (fp32 master included), stage 2 also the gradients, stage 3 also the weights.

        Returns:
            (weight bytes, gradient bytes, optimizer-state bytes) per GPU.
        """
        n, z = setup.num_gpus, self.shard_stage(setup)
        return (-(-p_bytes // n) if z >= 3 else p_bytes, -(-g_bytes // n) if z >= 2 else g_bytes,
                -(-o_bytes // n) if z >= 1 else o_bytes)

    def working_set(self, cfg: ModelConfig | None, layer_params: int, p_sharded: int, n: int, n_train: int,
                    setup: TrainingSetup) -> tuple[int, int]:
        """The unsharded weights and gradients the framework materializes while computing; (0, 0) by default."""
        return 0, 0

    def working_set_at_step(self, setup: TrainingSetup) -> bool:
        """Whether the working set is still live at the optimizer step (True by default)."""
        return True

    def offload(self, p_bytes: int, g_bytes: int, o_bytes: int, n_train: int,
                setup: TrainingSetup) -> tuple[int, int, int, int]:
        """What moves to host memory with CPU offload: (GPU weight, gradient, optimizer-state bytes, CPU bytes).
        Nothing by default (the setup only allows offload where :attr:`supports` lists it)."""
        return p_bytes, g_bytes, o_bytes, 0

    # --- buffers, backward moments, the step ----------------------------------------------------------------
    def gradient_buffers(self, setup: TrainingSetup, g_bytes: int) -> tuple[int, int]:
        """Buffers that hold gradients besides the gradients themselves: (bytes live through the backward pass,
        bytes on top of the gradients at the step), reported as gradients. (0, 0) by default."""
        return 0, 0

    def comm_buffers(self, setup: TrainingSetup) -> tuple[int, int]:
        """Communication buffers counted as temporaries: (bytes live in the backward pass, at the step); (0, 0)."""
        return 0, 0

    def backward_extra(self, cfg: ModelConfig, setup: TrainingSetup, saved: Saved, g_bytes: int, n: int,
                       layer_params: int, generic_peak: Callable[[int], int]) -> int:
        """Bytes on top of the weights and optimizer states at the backward pass's peak.

        ``generic_peak(accumulating)`` is the activation moments of
        :func:`memlib.core.estimate.backward_peak_bytes` with ``accumulating`` gradient bytes building up while
        the activations are freed. By default all gradients accumulate, except where the gradient buffers are
        the gradients (live from the start: DDP's ``gradient_as_bucket_view``); the buffers and the
        communication buckets of the backward pass come on top.
        """
        buf_backward, buf_step = self.gradient_buffers(setup, g_bytes)
        accumulating = 0 if buf_backward and not buf_step else g_bytes
        return generic_peak(accumulating) + buf_backward + self.comm_buffers(setup)[0]

    def optimizer_step_bytes(self, cfg: ModelConfig, setup: TrainingSetup, n: int, n_train: int) -> int:
        """Temporaries of the optimizer step on the GPU, on top of the states and all gradients (0 by default;
        with offload the step runs on the CPU)."""
        return 0

    def step_temp_bytes(self, cfg: ModelConfig, setup: TrainingSetup, n: int, n_train: int) -> int:
        """Everything transient at the optimizer step: :meth:`optimizer_step_bytes` + the step's buckets."""
        return self.optimizer_step_bytes(cfg, setup, n, n_train) + self.comm_buffers(setup)[1]


def torch_adamw_step_bytes(cfg: ModelConfig, setup: TrainingSetup, n: int, n_train: int, shards: int,
                           loop_shards: int) -> int:
    """``torch.optim.AdamW``'s step temporaries (``torch/optim/adam.py``), in ``setup.optimizer_impl``:

    - ``foreach`` (``_multi_tensor_adam``): ``torch._foreach_sqrt(device_exp_avg_sqs)`` allocates one buffer
      the size of all of v: v-bytes·Ψ (4 under AMP and fp32, 2 in pure bf16) ÷ ``shards`` (the ranks stepping a
      shard each), 4·Ψ_train for LoRA's fp32 adapters. One buffer since PyTorch 2.1 (pull request 104898,
      "[foreach][AdamW] Minimize intermediates"); up to 2.0 ``denom = torch._foreach_add(exp_avg_sq_sqrt, eps)``
      allocated a second, twice this (not modelled);
    - ``for-loop`` (``_single_tensor_adam``): per tensor, ``denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt)
      .add_(eps)`` holds the sqrt and the quotient at once, and the previous tensor's ``denom`` lives until the
      name is rebound: max over tensors i of numel(i−1) + 2·numel(i) elements (:func:`for_loop_elements`),
      ÷ ``loop_shards`` where each tensor is itself sharded;
    - ``fused`` (``torch._fused_adamw_``): 0. SGD (in place) and bitsandbytes' adamw-8bit have none.
    """
    impl = setup.optimizer_impl
    if setup.offload != "none" or setup.optimizer != "adamw" or impl == "fused":
        return 0
    if setup.method != "full":
        if impl == "for-loop":
            return 4 * -(-lora_for_loop_elements(cfg, setup) // loop_shards)
        return -(-4 * n_train // shards)
    v_bytes = 2 if setup.precision == "bf16" else 4
    if impl == "for-loop":
        return v_bytes * -(-for_loop_elements(cfg) // loop_shards)
    return -(-v_bytes * n // shards)


def for_loop_elements(cfg: ModelConfig) -> int:
    """Elements of ``_single_tensor_adam``'s temporaries at their peak: max_i numel(i−1) + 2·numel(i).

    Exact for the llama-like families (llama, mistral, qwen2, gemma, qwen3, olmo2), whose parameters are listed in
    ``model.parameters()`` order; for the others an upper bound, max(2·embedding, 3·largest other tensor).
    """
    order = parameter_order(cfg)
    if order is not None:
        return max(prev + 2 * cur for prev, cur in zip([0] + order, order))
    h, f, V = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
    n_max = (families_moe.largest_tensor(cfg) if cfg.moe is not None or cfg.mla is not None
             else max(h * f, 3 * h * h, h * cfg.q_dim, V * h if not cfg.tie_word_embeddings else 0))
    return max(2 * V * h, 3 * n_max)


def parameter_order(cfg: ModelConfig) -> list[int] | None:
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


def lora_for_loop_elements(cfg: ModelConfig, setup: TrainingSetup) -> int:
    """``_single_tensor_adam``'s peak temporaries over the LoRA adapters (A = r × in, then B = out × r)."""
    r = setup.lora_rank
    order = [x for _, d_in, d_out in targeted_linears(cfg, setup.lora_targets) for x in (r * d_in, d_out * r)]
    order = order * cfg.num_layers
    return max(prev + 2 * cur for prev, cur in zip([0] + order, order))
