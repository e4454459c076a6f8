"""Figures for Chapter 12: the roofline with our models' ops, and a memory timeline from a snapshot."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..core.errors import MemlibError
from ..core.flops import OpIntensity, attainable_flops
from ..core.hardware import GpuSpec

__all__ = ["roofline_figure", "memory_timeline_figure"]

_KIND_MARKERS = {"matmul": "o", "attention": "s", "elementwise": "^", "norm": "v"}


def _plt() -> Any:
    try:
        import matplotlib.pyplot as plt
    except ImportError:  # pragma: no cover
        raise ImportError("memlib plots need matplotlib: pip install matplotlib") from None
    return plt


def roofline_figure(gpus: Sequence[GpuSpec], ops: Sequence[OpIntensity] = (), *, dtype: str = "bf16",
                    title: str = "Roofline", label_ops: bool = True) -> Any:
    """Roofline (Williams et al. 2009): attainable TFLOP/s against arithmetic intensity, log-log.

    Introduced in Chapter 12. One roof per GPU (dense ``dtype`` peak; slope = memory bandwidth), its ridge point
    marked; each op drawn at its intensity on the first GPU's roof (the best it can do there).

    Args:
        gpus: GPUs to draw (at least one).
        ops: operations from ``memlib._book.ch12_profiling.op_intensities``.
        dtype: peak to use (``bf16``, ``fp16``, ``tf32``, ``fp32``).
        title: axes title.
        label_ops: write each op's name next to its point.

    Returns:
        The matplotlib Figure.
    """
    if not gpus:
        raise MemlibError("roofline_figure needs at least one GPU")
    plt = _plt()
    import numpy as np

    fig, ax = plt.subplots(figsize=(8, 5))
    intensities = [o.intensity for o in ops] + [g.ridge_point(dtype) for g in gpus]
    lo = min(0.1, min(intensities) / 2)
    hi = max(1e4, max(intensities) * 2)
    x = np.logspace(np.log10(lo), np.log10(hi), 200)
    for g in gpus:
        peak, bw = g.peak_flops(dtype), g.bandwidth_bytes_per_s
        y = np.minimum(peak, x * bw) / 1e12
        (line,) = ax.loglog(x, y, label=f"{g.full_name}: {peak / 1e12:,.0f} TFLOP/s, {bw / 1e9:,.0f} GB/s")
        ridge = g.ridge_point(dtype)
        ax.plot([ridge], [peak / 1e12], "o", color=line.get_color(), mfc="white")
        ax.annotate(f"ridge {ridge:.0f}", (ridge, peak / 1e12), textcoords="offset points", xytext=(4, 6),
                    fontsize=8, color=line.get_color())
    if ops:
        g0 = gpus[0]
        matmul_labelled = False
        for i, o in enumerate(ops):
            y0 = attainable_flops(o.intensity, g0.peak_flops(dtype), g0.bandwidth_bytes_per_s) / 1e12
            ax.plot([o.intensity], [y0], _KIND_MARKERS.get(o.kind, "x"), color="black", ms=6)
            if not label_ops:
                continue
            if o.kind == "matmul":  # the matmuls sit together on the flat roof: one label for all
                if not matmul_labelled:
                    ax.annotate("matmuls", (o.intensity, y0), textcoords="offset points", xytext=(0, -14),
                                fontsize=7)
                    matmul_labelled = True
                continue
            ax.annotate(o.name, (o.intensity, y0), textcoords="offset points", xytext=(6, -12 - 8 * (i % 2)),
                        fontsize=7)
    ax.set_xlabel("arithmetic intensity (FLOP per byte of memory traffic)")
    ax.set_ylabel(f"attainable {dtype} TFLOP/s (dense)")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    return fig


def memory_timeline_figure(times: Sequence[float], allocated_bytes: Sequence[int], *,
                           phases: Sequence[tuple[str, int]] = (), unit: str = "GiB", xlabel: str = "event",
                           title: str = "Allocated memory over a training run") -> Any:
    """Allocated bytes over time (or over allocator events), with the training phases shaded.

    Introduced in Chapter 12. Draws a ``memlib.measure.profiling.MemoryTimeline`` (from a CUDA snapshot pickle or a
    meta-device trace).

    Args:
        times: x values (event times or indices).
        allocated_bytes: bytes allocated after each event.
        phases: (name, index into ``times``) where each phase starts; the last entry ends the previous phase.
        unit: ``"GiB"`` (2³⁰, as torch and nvidia-smi) or ``"GB"`` (10⁹).
        xlabel: label of the x axis.
        title: axes title.

    Returns:
        The matplotlib Figure.
    """
    if unit not in ("GiB", "GB"):
        raise MemlibError(f"unknown unit {unit!r}; expected one of: GiB, GB")
    if len(times) != len(allocated_bytes):
        raise MemlibError(f"times ({len(times)}) and allocated_bytes ({len(allocated_bytes)}) differ in length")
    plt = _plt()
    scale = 2**30 if unit == "GiB" else 1e9
    fig, ax = plt.subplots(figsize=(9, 4))
    ax.step(list(times), [b / scale for b in allocated_bytes], where="post", color="black", lw=1)
    colors = {"forward": "tab:blue", "backward": "tab:orange", "optimizer": "tab:green"}
    seen: set[str] = set()
    for (name, start), (_, end) in zip(phases, list(phases)[1:]):
        if name not in colors or start >= len(times):
            continue
        x0, x1 = times[start], times[min(end, len(times) - 1)]
        ax.axvspan(x0, x1, color=colors[name], alpha=0.15, label=None if name in seen else name)
        seen.add(name)
    if allocated_bytes:
        i = max(range(len(allocated_bytes)), key=allocated_bytes.__getitem__)
        ax.annotate(f"peak {allocated_bytes[i] / scale:.2f} {unit}", (times[i], allocated_bytes[i] / scale),
                    textcoords="offset points", xytext=(6, -4), fontsize=8)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(f"allocated ({unit})")
    ax.set_title(title)
    if seen:
        ax.legend(fontsize=8, loc="upper left")
    ax.grid(True, alpha=0.25)
    fig.tight_layout()
    return fig
