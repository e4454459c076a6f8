"""Typed, frozen training and inference setups, validated once where they are made (pure Python, Chapter 1).

A setup holds every setting of :func:`memlib.core.estimate.estimate_training` (or ``estimate_inference``)
except the model; the functions below it trust it. Change one setting with ``dataclasses.replace(setup, ...)``,
which validates the new setup again (the planner's ladder, Chapter 13, is a sequence of such replacements).
"""
from __future__ import annotations

from dataclasses import dataclass

from .choices import (ATTENTION, FP8_RECIPES, GRAD_ACCUM_DTYPES, LOSSES, KV_DTYPES, LORA_TARGETS, METHODS, OFFLOAD,
                      OPTIMIZER_IMPLS, OPTIMIZER_SOURCES, OPTIMIZERS, PRECISIONS, RECOMPUTE, SCHEDULES, ZERO_STAGES,
                      check_framework, check_framework_precision)
from .dtypes import weight_bytes_per_param
from .errors import MemlibError, check_choice, check_positive

__all__ = ["TrainingSetup", "InferenceSetup"]


@dataclass(frozen=True)
class TrainingSetup:
    """How a model is trained: every setting of the training estimate. Introduced in Chapter 1.

    Attributes:
        batch_size: micro-batch size per GPU.
        seq_len: sequence length (checked against the model's maximum positions by the estimator).
        precision: one of :data:`memlib.core.choices.PRECISIONS`.
        optimizer: one of :data:`memlib.core.choices.OPTIMIZERS`.
        optimizer_impl: one of :data:`memlib.core.choices.OPTIMIZER_IMPLS`: which torch.optim.AdamW path runs
            the step (``foreach``, ``fused`` or ``for-loop``); only ``adamw`` uses it.
        zero_stage: 0 (plain data parallel), 1, 2 or 3 (ZeRO paper §5).
        num_gpus: GPUs (data-parallel ones; the total with model parallelism).
        recompute: ``none``, ``selective`` or ``full``.
        attention: ``eager`` or ``sdpa``.
        checkpoint_every: with ``recompute="full"``, decoder layers per checkpointed segment.
        offload: ``none``, ``optimizer`` or ``params+optimizer`` (the last needs ``zero_stage=3``).
        method: ``full`` fine-tuning, ``lora`` or ``qlora``.
        lora_rank: LoRA rank r (``lora``/``qlora``).
        lora_targets: one of :data:`memlib.core.choices.LORA_TARGETS`.
        framework: one of :data:`memlib.core.choices.FRAMEWORKS` (default ``pytorch``): whose memory layout the
            estimate follows (:mod:`memlib.core.frameworks`); each supports the ZeRO stages, offload and
            parallelism listed in :data:`memlib.core.choices.FRAMEWORK_SUPPORT`.
        tp, pp, cp, ep: tensor-, pipeline-, context- and expert-parallel degrees (Chapter 15).
        etp: expert tensor-parallel degree (Megatron-Core's MoE folding); None: 1 with ep > 1, else tp.
        sequence_parallel: Megatron sequence parallelism (with tp).
        micro_batches: pipeline micro-batches per step.
        pp_schedule: one of :data:`memlib.core.choices.SCHEDULES`.
        gradient_as_bucket_view: PyTorch DDP's flag of that name (``framework="pytorch"``, ``num_gpus`` > 1, where
            the estimate is ``DistributedDataParallel``, with ZeroRedundancyOptimizer at ZeRO-1): False (DDP's
            default) keeps the Reducer's flat gradient buckets beside the gradients, one more gradient copy;
            True makes the gradients views of the buckets (:func:`memlib.core.frameworks.ddp_bucket_bytes`).
            Without DDP (one GPU) it changes nothing.
        grad_accum: micro-batches per optimizer step (gradient accumulation, default 1; not the pipeline's
            ``micro_batches``). Each framework object models what it changes
            (:meth:`memlib.core.frameworks.base.Framework.backward_extra`): today only DeepSpeed's ZeRO-1, which
            keeps the full 16-bit gradients between micro-batches where ZeRO-2 reduces them into its partition,
            and the offload traffic (:func:`memlib.core.offload.offload_traffic`); the other frameworks' peaks do
            not depend on it.
        grad_accum_dtype: DeepSpeed's ``data_types.grad_accum_dtype``, one of
            :data:`memlib.core.choices.GRAD_ACCUM_DTYPES`: ``model`` (default) or ``fp32``, which DeepSpeed runs as
            ``BF16_Optimizer`` (an unsharded fp32 gradient buffer); valid with ``framework="deepspeed"``,
            ``zero_stage=1``, ``precision="bf16-mixed"``, full fine-tuning and no offload.
        fp8_recipe: one of :data:`memlib.core.choices.FP8_RECIPES` (Chapter 17, :mod:`memlib.core.fp8`); read only
            with ``precision="fp8-mixed"``.
        loss: one of :data:`memlib.core.choices.LOSSES` (Chapter 17, :mod:`memlib.core.losses`).
        loss_chunk: tokens per chunk of the ``chunked`` loss (the ``fused`` loss takes Liger-Kernel's own chunk).
        optimizer_source: one of :data:`memlib.core.choices.OPTIMIZER_SOURCES` (``framework="deepspeed"`` only):
            ``framework``, DeepSpeed's FusedAdam built from its config (``optimizer_impl`` unused); ``client``, a
            ``torch.optim`` optimizer passed to ``deepspeed.initialize``, stepped with its ``optimizer_impl``'s
            temporaries (:mod:`memlib.core.frameworks.deepspeed_client`).

    Raises:
        MemlibError: on construction, for a bad value (one line naming it and the valid choices) or a
            combination that does not exist (a framework without that ZeRO stage, offload or precision, ``checkpoint_every`` without full recomputation, parameter offload
            below ZeRO-3). Checks that need the model (sequence length, heads dividing tp) are the estimator's.
    """

    batch_size: int = 1
    seq_len: int = 512
    precision: str = "bf16-mixed"
    optimizer: str = "adamw"
    zero_stage: int = 0
    num_gpus: int = 1
    recompute: str = "none"
    attention: str = "sdpa"
    checkpoint_every: int = 1
    offload: str = "none"
    method: str = "full"
    lora_rank: int = 16
    lora_targets: str = "all-linear"
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    sequence_parallel: bool = False
    micro_batches: int = 1
    pp_schedule: str = "1f1b"
    optimizer_impl: str = "foreach"
    framework: str = "pytorch"
    gradient_as_bucket_view: bool = False
    etp: int | None = None
    grad_accum: int = 1
    grad_accum_dtype: str = "model"
    fp8_recipe: str = "tensorwise"
    loss: str = "standard"
    loss_chunk: int = 1024
    optimizer_source: str = "framework"

    def __post_init__(self) -> None:
        check_choice("precision", self.precision, PRECISIONS)
        check_choice("fp8 recipe", self.fp8_recipe, FP8_RECIPES)
        check_choice("loss", self.loss, LOSSES)
        object.__setattr__(self, "loss_chunk", check_positive("loss_chunk", self.loss_chunk))
        if self.precision == "fp8-mixed" and self.method != "full":
            raise MemlibError(f"precision 'fp8-mixed' is estimated for method 'full' (got method={self.method!r}); "
                              "expected precision one of: fp32, fp16-mixed, bf16-mixed, bf16")
        check_choice("optimizer", self.optimizer, OPTIMIZERS)
        check_choice("optimizer impl", self.optimizer_impl, OPTIMIZER_IMPLS)
        check_choice("zero stage", self.zero_stage, ZERO_STAGES)
        check_choice("recompute", self.recompute, RECOMPUTE)
        check_choice("attention", self.attention, ATTENTION)
        check_choice("offload", self.offload, OFFLOAD)
        check_choice("method", self.method, METHODS)
        check_choice("lora targets", self.lora_targets, LORA_TARGETS)
        check_choice("pipeline schedule", self.pp_schedule, SCHEDULES)
        for field, label in (("num_gpus", "num_gpus"), ("batch_size", "batch_size"), ("seq_len", "seq_len"),
                             ("checkpoint_every", "checkpoint_every"), ("lora_rank", "lora rank"), ("tp", "tp"),
                             ("pp", "pp"), ("cp", "cp"), ("ep", "ep"), ("micro_batches", "micro_batches"),
                             ("grad_accum", "grad_accum")):
            object.__setattr__(self, field, check_positive(label, getattr(self, field)))
        if self.etp is not None:
            check_positive("etp", self.etp)
        check_framework(self.framework, self.zero_stage, self.offload, self.parallel_degrees)
        check_framework_precision(self.framework, self.precision)
        check_choice("optimizer source", self.optimizer_source, OPTIMIZER_SOURCES)
        if self.optimizer_source == "client" and self.framework != "deepspeed":
            raise MemlibError(f"optimizer_source 'client' is DeepSpeed's (a torch.optim optimizer passed to "
                              f"deepspeed.initialize; got framework {self.framework!r}); expected framework: deepspeed")
        if not isinstance(self.gradient_as_bucket_view, bool):
            raise MemlibError(f"invalid gradient_as_bucket_view {self.gradient_as_bucket_view!r}; expected one of: "
                              "False, True")
        if self.gradient_as_bucket_view and self.framework != "pytorch":
            raise MemlibError(f"gradient_as_bucket_view=True is PyTorch DDP's setting (got framework "
                              f"{self.framework!r}); expected framework: pytorch")
        check_choice("grad accum dtype", self.grad_accum_dtype, GRAD_ACCUM_DTYPES)
        bf16_opt = (self.framework, self.zero_stage, self.precision, self.method, self.offload, self.model_parallel)
        if self.grad_accum_dtype == "fp32" and bf16_opt != ("deepspeed", 1, "bf16-mixed", "full", "none", False):
            raise MemlibError("grad_accum_dtype 'fp32' is DeepSpeed's BF16_Optimizer: it needs framework 'deepspeed', "
                              "zero_stage 1, precision 'bf16-mixed', method 'full', no offload and no model "
                              f"parallelism (got framework={self.framework!r}, zero_stage={self.zero_stage}, "
                              f"precision={self.precision!r}, method={self.method!r}, offload={self.offload!r})")
        if self.model_parallel:
            return  # memlib.core.parallel.check_layout checks the layout against the model
        if self.checkpoint_every != 1 and self.recompute != "full":
            raise MemlibError(f"checkpoint_every={self.checkpoint_every} needs recompute='full' "
                              f"(got recompute={self.recompute!r})")
        if self.offload == "params+optimizer" and self.zero_stage != 3:
            raise MemlibError(f"offload 'params+optimizer' needs zero_stage 3 (got zero_stage={self.zero_stage}); "
                              "use offload 'optimizer' with stages 0-2")

    @property
    def model_parallel(self) -> bool:
        """True when a tensor/pipeline/context/expert-parallel setting differs from plain data parallelism."""
        return (self.tp, self.pp, self.cp, self.ep, self.sequence_parallel, self.micro_batches,
                self.pp_schedule, self.etp) != (1, 1, 1, 1, False, 1, "1f1b", None)

    @property
    def parallel_degrees(self) -> tuple[str, ...]:
        """The model-parallel degrees set: ``tp`` (with sequence parallelism), ``pp`` (with its micro-batches and
        schedule), ``cp``, ``ep`` (what :func:`memlib.core.choices.check_framework` checks per framework)."""
        return tuple(name for name, on in (
            ("tp", self.tp > 1 or self.sequence_parallel),
            ("pp", self.pp > 1 or self.micro_batches > 1 or self.pp_schedule != "1f1b"),
            ("cp", self.cp > 1), ("ep", self.ep > 1 or self.etp is not None)) if on)

    @property
    def autocast(self) -> bool:
        """True for torch.autocast mixed precision: fp32 weights, 16-bit copies made per op (``pytorch`` only)."""
        return self.framework == "pytorch" and self.precision.endswith("-mixed")

    @property
    def ddp(self) -> bool:
        """True when the estimate is PyTorch ``DistributedDataParallel``: ``pytorch`` on more than one GPU."""
        return self.framework == "pytorch" and self.num_gpus > 1

    @property
    def act_bytes(self) -> int:
        """Bytes of one activation element: 4 in fp32, 2 in the 16-bit precisions."""
        return 4 if self.precision == "fp32" else 2

    @property
    def shards(self) -> int:
        """The ranks the optimizer states are sharded over: ``num_gpus`` with ZeRO, 1 without."""
        return self.num_gpus if self.zero_stage >= 1 else 1


@dataclass(frozen=True)
class InferenceSetup:
    """How a model is served: the settings of :func:`memlib.core.estimate.estimate_inference` (Chapter 1).

    Attributes:
        batch_size: concurrent sequences.
        seq_len: tokens per sequence held in the cache (prompt + generated).
        weights: one of :data:`memlib.core.choices.WEIGHT_FORMATS`.
        kv_dtype: one of :data:`memlib.core.choices.KV_DTYPES`.

    Raises:
        MemlibError: on construction, for a bad value (one line naming it and the valid choices).
    """

    batch_size: int = 1
    seq_len: int = 2048
    weights: str = "fp16"
    kv_dtype: str = "fp16"

    def __post_init__(self) -> None:
        object.__setattr__(self, "batch_size", check_positive("batch_size", self.batch_size))
        weight_bytes_per_param(self.weights)  # validates the format
        check_choice("kv dtype", self.kv_dtype, KV_DTYPES)
        object.__setattr__(self, "seq_len", check_positive("seq_len", self.seq_len))
