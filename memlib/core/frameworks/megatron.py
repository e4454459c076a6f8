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
"""
from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

from ..configs import ModelConfig
from ..setup import TrainingSetup
from .base import Framework, Saved

__all__ = ["Megatron", "MEGATRON"]


class Megatron(Framework):
    """Megatron-LM: 2 + 4 + 12 bytes per parameter under mixed precision."""

    name: ClassVar[str] = "megatron"
    mixed_layout: ClassVar[tuple[float, float, float, float]] = (2.0, 4.0, 4.0, 4.0)
    sharded_optimizer: ClassVar[str] = "Megatron's distributed optimizer"

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
        """``main_grad`` is one buffer, allocated with the model: all of it is live all along (none accumulates)."""
        return g_bytes + generic_peak(0)


#: The Megatron framework object.
MEGATRON = Megatron()
