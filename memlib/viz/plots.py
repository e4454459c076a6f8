"""Matplotlib figures drawn from estimator and tracer results (Chapter 1)."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..core.categories import estimate_by_category
from ..core.dtypes import GB, GiB
from ..core.estimate import TrainingEstimate

__all__ = ["CATEGORY_COLORS", "peak_composition", "training_breakdown_figure", "estimate_vs_trace_figure"]

CATEGORY_COLORS = {
    "params": "#4C72B0",
    "grads": "#DD8452",
    "optimizer": "#55A868",
    "activations": "#C44E52",
    "temp": "#8172B3",
}


def _plt() -> Any:
    try:
        import matplotlib.pyplot as plt
    except ImportError:  # pragma: no cover
        raise ImportError("memlib.viz.plots needs matplotlib: pip install matplotlib") from None
    return plt


_PHASE_NAMES = {"backward": "backward", "optimizer": "optimizer step", "states": "states only"}


def peak_composition(estimate: TrainingEstimate) -> dict[str, int]:
    """What is live at the estimated peak moment, by category; the values add up to ``total_bytes``.

    Introduced in Chapter 1. The same as ``estimate.by_category``: :func:`memlib.core.categories.estimate_by_category`
    (the one definition, shared with the trace's ``by_category``), keyed like :data:`CATEGORY_COLORS`.
    """
    return estimate_by_category(estimate)


def training_breakdown_figure(estimates: Sequence[TrainingEstimate], labels: Sequence[str], *,
                              gpu_memory_bytes: int | None = None, title: str = "Training memory per GPU") -> Any:
    """Stacked bars of what is live at each estimate's peak (GB = 10⁹ bytes). Introduced in Chapter 1.

    Each bar is :func:`peak_composition`: the composition at the peak moment, so its height is the peak
    printed on top, with the phase the peak falls in (backward pass or optimizer step).

    Args:
        estimates: results of :func:`memlib.core.estimate.estimate_training`.
        labels: one label per bar.
        gpu_memory_bytes: draw a horizontal line at this capacity (e.g. ``80 * GiB``: GPU memory is binary).
        title: figure title.

    Returns:
        The matplotlib Figure.
    """
    plt = _plt()
    fig, ax = plt.subplots(figsize=(max(6.0, 1.2 * len(estimates) + 2), 4.2))
    parts = [peak_composition(e) for e in estimates]
    bottoms = [0.0] * len(estimates)
    for cat, color in CATEGORY_COLORS.items():
        values = [part[cat] / GB for part in parts]
        ax.bar(range(len(estimates)), values, bottom=bottoms, color=color, label=cat)
        bottoms = [b + v for b, v in zip(bottoms, values)]
    for i, e in enumerate(estimates):
        phase = _PHASE_NAMES.get(e.peak_phase, e.peak_phase)
        ax.text(i, bottoms[i], f"{e.total_bytes / GB:.1f}\n({phase})", ha="center", va="bottom", fontsize=7)
    if gpu_memory_bytes:
        ax.axhline(gpu_memory_bytes / GB, color="black", linestyle="--", linewidth=1,
                   label=f"{gpu_memory_bytes / GiB:.0f} GiB GPU ({gpu_memory_bytes / GB:.1f} GB)")
    ax.set_xticks(range(len(estimates)))
    ax.set_xticklabels(labels, rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("GB (10⁹ bytes) live at the peak")
    ax.set_title(title)
    ax.legend(fontsize=8, ncol=6, loc="upper left")
    ax.set_ylim(0, max(bottoms + [gpu_memory_bytes / GB if gpu_memory_bytes else 0]) * 1.3)
    fig.tight_layout()
    return fig


def estimate_vs_trace_figure(labels: Sequence[str], estimated: Sequence[int], measured: Sequence[int], *,
                             title: str = "Estimate vs traced peak") -> Any:
    """Grouped bars of estimated vs traced (or measured) peaks with the relative error on top. Chapter 1."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(max(6.0, 1.0 * len(labels) + 2), 4.0))
    xs = range(len(labels))
    ax.bar([x - 0.2 for x in xs], [e / GB for e in estimated], width=0.4, label="estimate", color="#4C72B0")
    ax.bar([x + 0.2 for x in xs], [m / GB for m in measured], width=0.4, label="meta trace", color="#C44E52")
    for x, e, m in zip(xs, estimated, measured):
        ax.text(x, max(e, m) / GB, f"{100 * (e - m) / m:+.1f}%", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(list(xs))
    ax.set_xticklabels(labels, rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("GB (10⁹ bytes)")
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
