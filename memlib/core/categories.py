"""Memory categories shared by the estimator and the tracer (Chapter 1)."""
from __future__ import annotations

from enum import Enum

__all__ = ["MemCategory"]


class MemCategory(str, Enum):
    """Where a byte of training memory belongs.

    PARAM: the weights the forward pass uses. GRAD: parameter gradients. OPTIMIZER: optimizer states,
    fp32 master weights included (the ZeRO paper's K). ACTIVATION: tensors the forward pass saves for
    the backward pass (and the inputs). TEMP: short-lived buffers: activation gradients in the backward
    pass, optimizer-step temporaries. BUFFER: non-trainable model buffers (rotary tables, masks).
    """

    PARAM = "params"
    GRAD = "grads"
    OPTIMIZER = "optimizer"
    ACTIVATION = "activations"
    TEMP = "temp"
    BUFFER = "buffers"
