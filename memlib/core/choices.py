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
from .lora import LORA_TARGETS, METHODS

__all__ = ["PRECISIONS", "OPTIMIZERS", "OPTIMIZER_IMPLS", "ZERO_STAGES", "RECOMPUTE", "ATTENTION", "OFFLOAD", "METHODS",
           "LORA_TARGETS", "SCHEDULES", "KV_DTYPES", "WEIGHT_FORMATS", "OneLineParser", "positive_int"]

#: Training precisions: fp32; mixed precision with 16-bit weights/activations and fp32 master weights
#: (the ZeRO paper's 2 + 2 + 12 bytes per parameter); pure bf16 (``model.to(torch.bfloat16)``).
PRECISIONS = ("fp32", "fp16-mixed", "bf16-mixed", "bf16")
#: Optimizers: plain SGD, SGD with momentum, torch.optim.AdamW, bitsandbytes' 8-bit AdamW.
OPTIMIZERS = ("sgd", "sgd-momentum", "adamw", "adamw-8bit")
#: torch.optim.AdamW implementations (``torch/optim/adam.py``): ``foreach`` (``_multi_tensor_adam``, the CUDA
#: default), ``fused`` (``_fused_adam``, the Hugging Face Trainer's ``adamw_torch_fused``), ``for-loop``
#: (``_single_tensor_adam``, ``foreach=False, fused=False``, the CPU default). bitsandbytes' adamw-8bit and SGD
#: ignore it.
OPTIMIZER_IMPLS = ("foreach", "fused", "for-loop")
#: ZeRO stages (Rajbhandari et al. 2020, §5): 0 plain data parallel; 1 optimizer states; 2 + gradients; 3 + weights.
ZERO_STAGES = (0, 1, 2, 3)
#: Activation recomputation: none; selective (the attention core, Korthikanti et al. 2022); full (every layer).
RECOMPUTE = ("none", "selective", "full")
#: Attention implementations: eager (scores materialized) or sdpa (a flash kernel).
ATTENTION = ("eager", "sdpa")
#: What lives in CPU memory: nothing; the optimizer states (ZeRO-Offload); params too (ZeRO-3/FSDP offload).
OFFLOAD = ("none", "optimizer", "params+optimizer")
#: Pipeline schedules (Chapter 15): GPipe (all forwards, then all backwards), 1F1B (PipeDream-Flush),
#: interleaved 1F1B.
SCHEDULES = ("gpipe", "1f1b", "interleaved")
#: KV-cache element types and their bytes.
KV_DTYPES = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1}


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
