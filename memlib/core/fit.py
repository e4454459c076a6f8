"""Does an estimate fit a GPU, and by how much: the planner's fit rule for one estimate (Chapter 1).

Pure Python. The rule is the one of :func:`memlib.core.plan.plan` and :func:`memlib.core.inference.serving_fit`:
an estimate fits when it plus :func:`memlib.core.inference.reserve_bytes` (the CUDA context, default 1 GiB, plus
5 % of the estimate for fragmentation) is within the GPU's memory. ``memlib train/infer --gpu`` print it first.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from .hardware import GPUS, get_gpu
from .inference import DEFAULT_CUDA_CONTEXT, DEFAULT_FRAGMENTATION, reserve_bytes

__all__ = ["COMMON_GPUS", "GpuFit", "gpu_fit", "fits_on"]

#: The cards a reader most often asks about, smallest first (keys of :data:`memlib.core.hardware.GPUS`).
COMMON_GPUS: tuple[str, ...] = ("rtx-4090", "l40s", "a100-40gb", "a100-80gb", "h100-sxm", "h200", "b200")


@dataclass(frozen=True)
class GpuFit:
    """One estimate against one GPU's memory. Introduced in Chapter 1.

    Attributes:
        gpu: the GPU's short name (:data:`memlib.core.hardware.GPUS`), or ``"custom"`` for a bare size.
        capacity_bytes: the GPU's memory (binary: 80 GiB for an "80 GB" card).
        usable_bytes: capacity less the CUDA context and workspaces (``--reserve``).
        estimate_bytes: the estimate per GPU (what memlib counts: states, activations, KV cache).
        needed_bytes: the estimate plus the fragmentation share (5 % by default).
        spare_bytes: usable − needed; negative when it does not fit (then −spare is what is missing).
        fits: needed ≤ usable, i.e. estimate + reserve ≤ capacity, as the planner decides.
    """

    gpu: str
    capacity_bytes: int
    usable_bytes: int
    estimate_bytes: int
    needed_bytes: int
    spare_bytes: int
    fits: bool

    def as_dict(self) -> dict[str, Any]:
        """The fields as a JSON-ready dict."""
        return asdict(self)


def gpu_fit(estimate_bytes: int, gpu: str | int, *, cuda_context_bytes: int = DEFAULT_CUDA_CONTEXT,
            fragmentation: float = DEFAULT_FRAGMENTATION) -> GpuFit:
    """Whether ``estimate_bytes`` fits ``gpu`` under the book's one reserve policy. Introduced in Chapter 1.

    Args:
        estimate_bytes: bytes per GPU the estimator counts.
        gpu: a name :func:`memlib.core.hardware.get_gpu` knows (``"h100"``), or a capacity in bytes.
        cuda_context_bytes: CUDA context and workspaces kept free (default 1 GiB).
        fragmentation: share of the estimate added for the allocator's fragmentation (default 0.05).

    Returns:
        The :class:`GpuFit`; ``fits`` is exactly the planner's ``estimate + reserve_bytes(estimate) <= memory``.

    Raises:
        MemlibError: an unknown GPU name, a negative size or a fragmentation outside [0, 1).
    """
    if isinstance(gpu, int):
        name, capacity = "custom", gpu
    else:
        spec = get_gpu(gpu)
        name, capacity = spec.name, spec.memory_bytes
    reserve = reserve_bytes(estimate_bytes, cuda_context_bytes=cuda_context_bytes, fragmentation=fragmentation)
    usable = capacity - cuda_context_bytes
    needed = estimate_bytes + reserve - cuda_context_bytes
    return GpuFit(gpu=name, capacity_bytes=capacity, usable_bytes=usable, estimate_bytes=estimate_bytes,
                  needed_bytes=needed, spare_bytes=usable - needed, fits=needed <= usable)


def fits_on(estimate_bytes: int, gpus: tuple[str, ...] = COMMON_GPUS, *,
            cuda_context_bytes: int = DEFAULT_CUDA_CONTEXT,
            fragmentation: float = DEFAULT_FRAGMENTATION) -> dict[str, bool]:
    """For each GPU of ``gpus`` (default :data:`COMMON_GPUS`), whether the estimate fits it. Chapter 1."""
    return {g: gpu_fit(estimate_bytes, g, cuda_context_bytes=cuda_context_bytes, fragmentation=fragmentation).fits
            for g in gpus if g in GPUS}
