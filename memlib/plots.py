"""Matplotlib figures drawn from estimator and tracer results (Chapter 1)."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .dtypes import GB
from .estimate import TrainingEstimate

__all__ = ["CATEGORY_COLORS", "training_breakdown_figure", "estimate_vs_trace_figure"]

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
        raise ImportError("memlib.plots needs matplotlib: pip install matplotlib") from None
    return plt


def training_breakdown_figure(estimates: Sequence[TrainingEstimate], labels: Sequence[str], *,
                              gpu_memory_bytes: int | None = None, title: str = "Training memory per GPU") -> Any:
    """Stacked bars, one per estimate, by category (GB = 10⁹ bytes). Introduced in Chapter 1.

    Args:
        estimates: results of :func:`memlib.estimate.estimate_training`.
        labels: one label per bar.
        gpu_memory_bytes: draw a horizontal line at this capacity (e.g. 80 GB).
        title: figure title.

    Returns:
        The matplotlib Figure.
    """
    plt = _plt()
    fig, ax = plt.subplots(figsize=(max(6.0, 1.2 * len(estimates) + 2), 4.2))
    bottoms = [0.0] * len(estimates)
    for cat, color in CATEGORY_COLORS.items():
        values = [(getattr(e, f"{cat}_bytes") or 0) / GB for e in estimates]
        ax.bar(range(len(estimates)), values, bottom=bottoms, color=color, label=cat)
        bottoms = [b + v for b, v in zip(bottoms, values)]
    for i, e in enumerate(estimates):
        ax.text(i, bottoms[i], f"{e.total_bytes / GB:.1f}", ha="center", va="bottom", fontsize=8)
    if gpu_memory_bytes:
        ax.axhline(gpu_memory_bytes / GB, color="black", linestyle="--", linewidth=1)
        ax.text(len(estimates) - 0.5, gpu_memory_bytes / GB, f" {gpu_memory_bytes / GB:.0f} GB GPU", va="bottom",
                ha="right", fontsize=8)
    ax.set_xticks(range(len(estimates)))
    ax.set_xticklabels(labels, rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("GB (10⁹ bytes)")
    ax.set_title(title)
    ax.legend(fontsize=8, ncol=5, loc="upper left")
    ax.set_ylim(0, max(bottoms + [gpu_memory_bytes / GB if gpu_memory_bytes else 0]) * 1.25)
    fig.tight_layout()
    return fig


def estimate_vs_trace_figure(labels: Sequence[str], estimated: Sequence[int], measured: Sequence[int], *,
                             title: str = "Estimate vs measured peak") -> Any:
    """Grouped bars of estimated vs measured peaks with the relative error on top. Introduced in Chapter 1."""
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
