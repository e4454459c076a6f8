"""The result vocabulary shared by the estimator and the tracer: memory categories, the peak, its phases (Chapter 1).

Pure Python. One definition for both sides of the book's "estimate, then measure" pairs:

* **Categories** (:class:`MemCategory`): ``params``, ``grads``, ``optimizer``, ``activations``, ``temp``,
  ``buffers``. The trace (:class:`memlib.measure.trace.TraceResult`) labels every live tensor with one; the
  estimate (:class:`memlib.core.estimate.TrainingEstimate`) has one ``<category>_bytes`` field per category it
  models (all but ``buffers``: rotary tables and masks are a few MB and not estimated).
* **The peak**: the largest total of live tensor bytes during one steady-state training step (the second
  step, once optimizer states exist; the CUDA context and allocator rounding are not tensors). The trace's
  ``peak_bytes`` is that maximum, observed; the estimate's ``total_bytes`` (alias ``peak_bytes``) predicts it.
* **What is live at the peak** (``by_category``): bytes per category at that moment. The trace records it;
  for the estimate :func:`estimate_by_category` derives it from the fields (:func:`memlib.viz.plots.peak_composition`
  draws it), because the estimate's ``activations_bytes`` and ``grads_bytes`` are the sizes of those states, not
  what is live at the peak.
* **The phase of the peak** (``peak_phase``): one of :data:`PEAK_PHASES`; an estimate from a bare parameter
  count (``params=``) says ``"states"``.
"""
from __future__ import annotations

from enum import Enum
from typing import Protocol

__all__ = ["MemCategory", "PEAK_PHASES", "ESTIMATED_CATEGORIES", "estimate_by_category"]


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


#: Where a training step's peak can fall: the forward pass, the backward pass, the optimizer step.
PEAK_PHASES = ("forward", "backward", "optimizer")

#: The categories :class:`memlib.core.estimate.TrainingEstimate` models (``<value>_bytes`` fields), in order.
ESTIMATED_CATEGORIES = (MemCategory.PARAM, MemCategory.GRAD, MemCategory.OPTIMIZER, MemCategory.ACTIVATION,
                        MemCategory.TEMP)


class _Estimate(Protocol):
    """The fields of a training estimate that :func:`estimate_by_category` reads."""

    @property
    def params_bytes(self) -> int: ...
    @property
    def grads_bytes(self) -> int: ...
    @property
    def optimizer_bytes(self) -> int: ...
    @property
    def activations_bytes(self) -> int | None: ...
    @property
    def total_bytes(self) -> int: ...
    @property
    def peak_phase(self) -> str: ...


def estimate_by_category(estimate: _Estimate) -> dict[str, int]:
    """What is live at an estimate's peak, by :class:`MemCategory` value; the values add up to its peak.

    Introduced in Chapter 1. The estimate's categories are not all live at once: at a peak in the optimizer
    step the activations are gone and every gradient exists; at a peak in the backward pass (usually its
    start, at the loss) the saved activations are live and the gradients are not yet produced. So:

    * ``peak_phase == "optimizer"``: parameters, gradients, optimizer states and the step's temporaries;
      activations 0.
    * ``peak_phase == "backward"``: parameters, optimizer states, the saved activations and, as ``temp``,
      everything else on top of them at that moment (the loss's and the backward's temporaries); gradients 0.
    * ``peak_phase == "states"`` (``params=`` estimates): the model states.

    Known limitation: the estimator reports one backward-phase excess over the states, not its split; when
    the backward peak falls later than the loss (some gradients already produced, some activations freed),
    the gradients produced so far are counted in ``temp`` and ``activations`` is capped at that excess.
    ``buffers`` are not estimated and not in the result.

    Args:
        estimate: a :class:`memlib.core.estimate.TrainingEstimate`.

    Returns:
        Bytes for each of :data:`ESTIMATED_CATEGORIES` (keys ``params``, ``grads``, ``optimizer``,
        ``activations``, ``temp``), summing to ``estimate.total_bytes``.
    """
    p, o = estimate.params_bytes, estimate.optimizer_bytes
    if estimate.peak_phase == "optimizer":
        g, act = estimate.grads_bytes, 0
    elif estimate.peak_phase == "backward":
        g = 0
        act = max(0, min(estimate.activations_bytes or 0, estimate.total_bytes - p - o))
    else:
        g, act = estimate.grads_bytes, 0
    temp = estimate.total_bytes - p - g - o - act
    return {MemCategory.PARAM.value: p, MemCategory.GRAD.value: g, MemCategory.OPTIMIZER.value: o,
            MemCategory.ACTIVATION.value: act, MemCategory.TEMP.value: max(temp, 0)}
