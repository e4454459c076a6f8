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

    def backward_extra(self, cfg: ModelConfig, setup: TrainingSetup, saved: Saved, g_bytes: int, n: int,
                       layer_params: int, generic_peak: Callable[[int], int]) -> int:
        """``main_grad`` is one buffer, allocated with the model: all of it is live all along (none accumulates)."""
        return g_bytes + generic_peak(0)


#: The Megatron framework object.
MEGATRON = Megatron()
