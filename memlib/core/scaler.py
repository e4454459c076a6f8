"""Dynamic loss scaling from scratch, step for step the rule of torch.amp.GradScaler (Chapter 3).

Pure Python. The rule (Micikevicius et al. 2018; PyTorch's ``_amp_update_scale_``):

* a step whose unscaled gradients hold an inf or NaN is **skipped** (the optimizer does not run), the scale
  is multiplied by ``backoff_factor`` and the count of finite steps restarts at 0;
* after ``growth_interval`` finite steps in a row the scale is multiplied by ``growth_factor`` (only if the
  result is finite) and the count restarts.

PyTorch keeps the scale in a float32 tensor and computes ``float(scale) * factor`` in double before storing
it back as float32; :class:`DynamicLossScaler` rounds the same way, so its scales equal
``GradScaler.get_scale()`` exactly, also for factors that are not powers of two.
"""
from __future__ import annotations

import math
import struct
from collections.abc import Iterable

from .errors import MemlibError, check_positive

__all__ = ["DynamicLossScaler", "scale_history", "has_inf_or_nan"]


def _f32(x: float) -> float:
    """Round a Python float to the nearest float32 (ties to even), ±inf on overflow, as C's (float)x."""
    try:
        return float(struct.unpack("f", struct.pack("f", x))[0])
    except OverflowError:  # struct refuses values that round to ±inf
        return math.copysign(math.inf, x)


def has_inf_or_nan(values: Iterable[float]) -> bool:
    """True if any value is inf or NaN: GradScaler's ``found_inf`` test. Introduced in Chapter 3."""
    return any(not math.isfinite(float(v)) for v in values)


class DynamicLossScaler:
    """Loss scale that backs off on overflow and grows after a run of finite steps. Introduced in Chapter 3.

    Usage per training step: multiply the loss by :attr:`scale`, backpropagate, divide the gradients by the
    same scale, then call ``update(found_inf)``; apply the optimizer step only if it returns True.

    Args:
        init_scale: first scale (GradScaler: 2**16).
        growth_factor: factor applied after ``growth_interval`` finite steps (> 1; GradScaler: 2.0).
        backoff_factor: factor applied on an overflow (in (0, 1); GradScaler: 0.5).
        growth_interval: finite steps in a row before growing (GradScaler: 2000).

    Raises:
        MemlibError: for a non-positive scale or interval, or factors on the wrong side of 1.
    """

    def __init__(self, init_scale: float = 2.0**16, growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000) -> None:
        if not (isinstance(init_scale, (int, float)) and math.isfinite(init_scale) and init_scale > 0):
            raise MemlibError(f"init_scale must be a finite number > 0, got {init_scale!r}")
        if not (isinstance(growth_factor, (int, float)) and math.isfinite(growth_factor) and growth_factor > 1):
            raise MemlibError(f"growth_factor must be a finite number > 1, got {growth_factor!r}")
        if not (isinstance(backoff_factor, (int, float)) and 0 < backoff_factor < 1):
            raise MemlibError(f"backoff_factor must be a number in (0, 1), got {backoff_factor!r}")
        self.growth_interval = check_positive("growth_interval", growth_interval)
        self.growth_factor = float(growth_factor)
        self.backoff_factor = float(backoff_factor)
        self._scale = _f32(float(init_scale))
        self._growth_tracker = 0
        self.steps = 0
        self.skipped_steps = 0

    @property
    def scale(self) -> float:
        """The current loss scale (a float32 value, as ``GradScaler.get_scale()``)."""
        return self._scale

    @property
    def growth_tracker(self) -> int:
        """Finite steps since the last growth or overflow."""
        return self._growth_tracker

    def scale_loss(self, loss: float) -> float:
        """``loss × scale``: what to backpropagate."""
        return loss * self._scale

    def unscale(self, grads: Iterable[float]) -> tuple[list[float], bool]:
        """Divide gradients by the scale as GradScaler does for fp32 gradients: ``g × float32(1 / scale)``.

        Like GradScaler, ``found_inf`` tests the *scaled* gradients, the values the backward pass produced.

        Args:
            grads: scaled gradient values.

        Returns:
            The unscaled gradients and ``found_inf``.
        """
        scaled = [float(g) for g in grads]
        inv = _f32(1.0 / self._scale)
        out = [_f32(g * inv) for g in scaled]  # float32 product
        return out, has_inf_or_nan(scaled)

    def update(self, found_inf: bool) -> bool:
        """Apply the growth/backoff rule for one step.

        Args:
            found_inf: whether this step's gradients held an inf or NaN.

        Returns:
            True if the optimizer step should be applied, False if it is skipped.
        """
        self.steps += 1
        if found_inf:
            self._scale = _f32(self._scale * self.backoff_factor)
            self._growth_tracker = 0
            self.skipped_steps += 1
            return False
        successful = self._growth_tracker + 1
        if successful == self.growth_interval:
            grown = _f32(self._scale * self.growth_factor)
            if math.isfinite(grown):
                self._scale = grown
            self._growth_tracker = 0
        else:
            self._growth_tracker = successful
        return True

    def state_dict(self) -> dict[str, float | int]:
        """The state under the keys of ``GradScaler.state_dict()``."""
        return {"scale": self._scale, "growth_factor": self.growth_factor, "backoff_factor": self.backoff_factor,
                "growth_interval": self.growth_interval, "_growth_tracker": self._growth_tracker}


def scale_history(found_inf_sequence: Iterable[bool], init_scale: float = 2.0**16, growth_factor: float = 2.0,
                  backoff_factor: float = 0.5, growth_interval: int = 2000) -> list[float]:
    """The loss scale after each step, for a sequence of overflow flags. Introduced in Chapter 3.

    Args:
        found_inf_sequence: one bool per step, True where the gradients overflowed.
        init_scale: as in :class:`DynamicLossScaler`.
        growth_factor: as in :class:`DynamicLossScaler`.
        backoff_factor: as in :class:`DynamicLossScaler`.
        growth_interval: as in :class:`DynamicLossScaler`.

    Returns:
        ``scales[i]`` = the scale after step ``i``'s update (``GradScaler.get_scale()`` after ``update()``).
    """
    scaler = DynamicLossScaler(init_scale, growth_factor, backoff_factor, growth_interval)
    out = []
    for found_inf in found_inf_sequence:
        scaler.update(bool(found_inf))
        out.append(scaler.scale)
    return out
