"""The valid values of every training and inference setting, defined once (pure Python, Chapter 1).

:class:`memlib.core.setup.TrainingSetup`, the estimators, the planner, the CLIs (``memlib`` and
``python -m memlib.measure.distributed``), the widgets and the live calculators all take their choices from
here, so a message such as ``unknown precision 'fp12'; expected one of: fp32, fp16-mixed, bf16-mixed, bf16``
lists the same values everywhere. The command-line helpers at the end give both CLIs the same one-line errors.
"""
from __future__ import annotations

import argparse
from typing import NoReturn

from .dtypes import WEIGHT_FORMATS

__all__ = ["PRECISIONS", "FP8_RECIPES", "LOSSES", "OPTIMIZERS", "OPTIMIZER_IMPLS", "OPTIMIZER_SOURCES", "FRAMEWORKS",
           "FRAMEWORK_PRECISIONS", "check_framework_precision", "FRAMEWORK_SUPPORT", "WITH_PARALLELISM",
           "framework_combinations", "check_framework", "PARALLEL_DEGREES", "ZERO_STAGES", "RECOMPUTE", "ATTENTION", "OFFLOAD", "METHODS",
           "LORA_TARGETS", "SCHEDULES", "MODEL_DTYPES", "KV_DTYPES", "WEIGHT_FORMATS", "OneLineParser", "positive_int"]

#: Training precisions: fp32; mixed precision with 16-bit weights/activations and fp32 master weights
#: (the ZeRO paper's 2 + 2 + 12 bytes per parameter); pure bf16 (``model.to(torch.bfloat16)``).
#: ``fp8-mixed`` is bf16 mixed precision whose Linear layers run their matmuls in FP8 (Chapter 17): the recipe
#: (:data:`FP8_RECIPES`) decides what the Linears save for backward; the model states are bf16-mixed's.
PRECISIONS = ("fp32", "fp16-mixed", "bf16-mixed", "bf16", "fp8-mixed")
#: FP8 training recipes (Chapter 17, :mod:`memlib.core.fp8`): torchao's per-tensor (``tensorwise``) and per-row
#: (``rowwise``) dynamic scaling, DeepSeek-V3's ``blockwise`` (1×128 activation tiles, 128×128 weight blocks).
FP8_RECIPES = ("tensorwise", "rowwise", "blockwise")
#: How the loss meets the logits (Chapter 17, :mod:`memlib.core.losses`): ``standard`` (the fp32 log-softmax of
#: all logits saved), ``chunked`` (the book's plain-PyTorch cross-entropy over checkpointed chunks of tokens),
#: ``fused`` (Liger-Kernel's fused linear cross-entropy: the logits never materialized beyond one chunk).
LOSSES = ("standard", "chunked", "fused")
#: Optimizers: plain SGD, SGD with momentum, torch.optim.AdamW, bitsandbytes' 8-bit AdamW.
OPTIMIZERS = ("sgd", "sgd-momentum", "adamw", "adamw-8bit")
#: torch.optim.AdamW implementations (``torch/optim/adam.py``): ``foreach`` (``_multi_tensor_adam``, the CUDA
#: default), ``fused`` (``_fused_adam``, the Hugging Face Trainer's ``adamw_torch_fused``), ``for-loop``
#: (``_single_tensor_adam``, ``foreach=False, fused=False``, the CPU default). bitsandbytes' adamw-8bit and SGD
#: ignore it.
OPTIMIZER_IMPLS = ("foreach", "fused", "for-loop")
#: Who builds the optimizer DeepSpeed steps (``deepspeed.initialize``): ``framework``, DeepSpeed from its config's
#: ``optimizer`` block (``{"type": "AdamW"}``: its FusedAdam, no temporary of its own, ``optimizer_impl`` unused);
#: ``client``, the training script's ``torch.optim`` optimizer passed as ``optimizer=`` (the Hugging Face Trainer
#: without an optimizer block), which keeps its ``optimizer_impl``'s step temporaries
#: (:mod:`memlib.core.frameworks.deepspeed_client`). bitsandbytes' adamw-8bit is always the client's.
OPTIMIZER_SOURCES = ("framework", "client")
#: DeepSpeed's ``data_types.grad_accum_dtype``: ``model`` (its default, the model's dtype) or ``fp32``, which with
#: ZeRO-1 in bf16 runs ``BF16_Optimizer`` (``deepspeed/runtime/engine.py``, ``_do_optimizer_sanity_check``).
GRAD_ACCUM_DTYPES = ("model", "fp32")
#: Training frameworks whose memory layout the estimator follows (Chapter 1; :mod:`memlib.core.frameworks`):
#: ``pytorch`` (torch.autocast AMP, fp32 params and grads; ZeRO-1 is ``ZeroRedundancyOptimizer``), ``deepspeed``
#: (16-bit params and grads, fp32 master and states partitioned by ZeRO stage), ``fsdp2`` (``fully_shard`` with
#: ``MixedPrecisionPolicy``), ``megatron`` (Megatron-LM: fp32 ``main_grad``, the distributed optimizer as ZeRO-1,
#: Megatron-FSDP's ``optim_grads`` and ``optim_grads_params`` as 2 and 3).
FRAMEWORKS = ("pytorch", "deepspeed", "fsdp2", "megatron")
#: The model-parallel degrees (``TrainingSetup.parallel_degrees`` names those set).
PARALLEL_DEGREES = ("tp", "pp", "cp", "ep")
#: What lives in CPU memory: nothing; the optimizer states (ZeRO-Offload); params too (ZeRO-3/FSDP offload).
OFFLOAD = ("none", "optimizer", "params+optimizer")
#: What each framework supports: (ZeRO stages, offload choices, model-parallel degrees allowed). DeepSpeed's
#: only model parallelism here is DeepSpeed-MoE's expert parallelism (``deepspeed/moe/layer.py``, ``ep_size``),
#: which runs with ZeRO 0-2 and no offload in memlib's model.
FRAMEWORK_SUPPORT: dict[str, tuple[tuple[int, ...], tuple[str, ...], tuple[str, ...]]] = {
    "pytorch": ((0, 1), ("none",), ()),
    "deepspeed": ((0, 1, 2, 3), OFFLOAD, ("ep",)),
    "fsdp2": ((2, 3), ("none", "params+optimizer"), ("tp", "pp", "cp")),  # TorchTitan's FSDP2 + TP + PP + CP
    "megatron": ((0, 1, 2, 3), ("none",), PARALLEL_DEGREES),  # zero 2/3: Megatron-FSDP optim_grads(_params)
}
#: The precisions a framework runs, where fewer than :data:`PRECISIONS`, and why: Megatron-LM has no pure bf16
#: (``megatron/training/arguments.py``: ``--bf16`` keeps fp32 main params and, via ``grad_reduce_in_fp32``, an
#: fp32 ``main_grad``: that is ``bf16-mixed``).
FRAMEWORK_PRECISIONS: dict[str, tuple[tuple[str, ...], str]] = {
    "megatron": (("fp32", "fp16-mixed", "bf16-mixed", "fp8-mixed"),
                 "Megatron-LM's --bf16 keeps fp32 main params and gradients: that is bf16-mixed"),
}
#: The ZeRO stages and offload choices left with model parallelism, where fewer than without it: DeepSpeed-MoE's
#: expert parallelism runs with ZeRO 0-2 and no offload in memlib's model.
WITH_PARALLELISM: dict[str, tuple[tuple[int, ...], tuple[str, ...]]] = {"deepspeed": ((0, 1, 2), ("none",))}
#: ZeRO stages (Rajbhandari et al. 2020, §5): 0 plain data parallel; 1 optimizer states; 2 + gradients; 3 + weights.
ZERO_STAGES = (0, 1, 2, 3)
#: Activation recomputation: none; selective (the attention core, Korthikanti et al. 2022); full (every layer).
RECOMPUTE = ("none", "selective", "full")
#: Attention implementations: eager (scores materialized) or sdpa (a flash kernel).
ATTENTION = ("eager", "sdpa")
#: Pipeline schedules (Chapter 15): GPipe (all forwards, then all backwards), 1F1B (PipeDream-Flush),
#: interleaved 1F1B; zero-bubble ZB-H1 and ZB-H2 (Qi et al. 2024), ZB-V (torch's ``ScheduleZBVZeroBubble``),
#: DeepSeek's DualPipe and DualPipeV (DeepSeek-AI 2024, Table 2).
SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb-h1", "zb-h2", "zbv", "dualpipe", "dualpipev")
#: Which Linear layers of every decoder block get an adapter. ``all-linear`` is peft's name for every Linear
#: (Conv1D in GPT-2) except the output layer, the QLoRA paper's choice; ``attention`` the four attention
#: projections; ``qv`` the original LoRA paper's W_q and W_v.
LORA_TARGETS = ("all-linear", "attention", "qv")

#: Fine-tuning methods the estimator knows: all weights trained, LoRA on 16-bit frozen weights, QLoRA on
#: NF4 (double-quantized) frozen weights.
METHODS = ("full", "lora", "qlora")
#: The dtypes a model is built and traced in (``memlib.measure.trace.build_model``'s ``dtype``).
MODEL_DTYPES = ("fp32", "bf16", "fp16")
#: KV-cache element types and their bytes.
KV_DTYPES = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1}


def framework_combinations() -> str:
    """The valid framework combinations, in one line (the tail of every combination error)."""
    parts = []
    for name, (stages, offloads, mp) in FRAMEWORK_SUPPORT.items():
        zero = "-".join(str(z) for z in (stages[0], stages[-1])) if len(stages) > 1 else str(stages[0])
        parts.append(f"{name}: zero {zero}, offload {'/'.join(offloads)}" + (f", {'/'.join(mp)}" if mp else ""))
    return "; ".join(parts)


def check_framework_precision(framework: str, precision: str) -> None:
    """Raise :class:`~memlib.core.errors.MemlibError` (one line naming the framework's precisions) for a precision
    the framework does not run (:data:`FRAMEWORK_PRECISIONS`), e.g. ``megatron`` with pure ``bf16``."""
    from .errors import MemlibError

    if framework in FRAMEWORK_PRECISIONS and precision not in FRAMEWORK_PRECISIONS[framework][0]:
        valid, why = FRAMEWORK_PRECISIONS[framework]
        raise MemlibError(f"framework {framework!r} does not run precision {precision!r} ({why}); expected one of: "
                          f"{', '.join(valid)}")


def check_framework(framework: str, zero_stage: int, offload: str, parallel: bool | tuple[str, ...]) -> None:
    """Raise :class:`~memlib.core.errors.MemlibError` (one line naming the valid combinations) for a combination
    the framework does not support, e.g. ``pytorch`` with ZeRO-2 (torch has no ZeRO-2; use deepspeed or fsdp2).

    ``parallel`` names the model-parallel degrees set (:data:`PARALLEL_DEGREES`); True means all of them.
    With model parallelism a framework may support fewer stages and offloads (:data:`WITH_PARALLELISM`: DeepSpeed
    with expert parallelism supports ZeRO 0-2 without offload)."""
    from .errors import MemlibError, check_choice

    check_choice("framework", framework, FRAMEWORKS)
    stages, offloads, mp = FRAMEWORK_SUPPORT[framework]
    bad = []
    if zero_stage not in stages:
        bad.append(f"zero {zero_stage}")
    if offload not in offloads:
        bad.append(f"offload {offload!r}")
    degrees = PARALLEL_DEGREES if parallel is True else tuple(parallel or ())
    if any(d not in mp for d in degrees):
        bad.append(f"{'/'.join(d for d in degrees if d not in mp)} parallelism")
    elif degrees and framework in WITH_PARALLELISM:
        mp_stages, mp_offloads = WITH_PARALLELISM[framework]
        if zero_stage not in mp_stages or offload not in mp_offloads:
            bad.append(f"{'/'.join(degrees)} parallelism" + (f" with zero {zero_stage}" if zero_stage not in mp_stages
                                                             else f" with offload {offload!r}"))
    if bad:
        raise MemlibError(f"framework {framework!r} does not support {' with '.join(bad)}; valid combinations: "
                          f"{framework_combinations()}")


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line on stderr and exit status 2 (no usage block, no traceback)."""

    def error(self, message: str) -> NoReturn:
        prog = self.prog.removeprefix("python -m ").split()[0]  # "memlib train" -> "memlib"
        self.exit(2, f"{prog}: error: {message}\n")


def positive_int(text: str) -> int:
    """argparse ``type=`` for a positive integer, with a one-line message naming the bad value."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid integer {text!r}; expected a positive integer") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"invalid value {value}; expected a positive integer")
    return value
