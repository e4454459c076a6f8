"""Matplotlib figures for Chapter 11: the batch × context frontier per weight format, and a serving breakdown."""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..core.configs import ModelConfig, load_config
from ..core.dtypes import GB, GiB
from ..core.inference import ServingFit, batch_context_frontier

__all__ = ["FORMAT_COLORS", "FORMAT_STYLES", "SERVING_COLORS", "DEFAULT_SEQ_LENS", "frontier_figure", "serving_breakdown_figure"]

FORMAT_COLORS = {"fp32": "#8C8C8C", "fp16": "#4C72B0", "bf16": "#64B5CD", "int8": "#DD8452", "int4": "#55A868",
                 "nf4": "#C44E52"}
FORMAT_STYLES = {"int4": (0, (4, 2)), "nf4": (0, (1, 1))}
SERVING_COLORS = {"weights": "#4C72B0", "kv_cache": "#DD8452", "activation": "#C44E52", "fragmentation": "#8172B3",
                  "cuda_context": "#937860"}
#: context lengths of the frontier: 256 … 131072 tokens, powers of two
DEFAULT_SEQ_LENS = tuple(2**k for k in range(8, 18))


def _plt() -> Any:
    try:
        import matplotlib.pyplot as plt
    except ImportError:  # pragma: no cover
        raise ImportError("memlib.viz.plots_inference needs matplotlib: pip install matplotlib") from None
    return plt


def frontier_figure(model: str | Path | dict[str, Any] | ModelConfig, gpu_memory_bytes: int, *,
                    formats: Sequence[str] = ("fp16", "int8", "int4", "nf4"), kv_dtype: str = "fp16",
                    seq_lens: Sequence[int] = DEFAULT_SEQ_LENS, highlight: str | None = None,
                    point: tuple[int, int] | None = None, prefill_tokens: int | None = None,
                    title: str | None = None) -> Any:
    """Largest batch vs context length, one step line per weight format, for one GPU. Introduced in Chapter 11.

    Points at the context lengths given (powers of two by default), joined by lines. Every (context, batch) on
    or under a point fits the GPU with that weight format, with the reserve of
    :func:`memlib.core.inference.serving_fit` (1 GiB CUDA context, the largest forward pass's activations, 5 %
    fragmentation). Axes are logarithmic (base 2); a format whose weights alone do not fit draws nothing and
    says so in the legend. Context lengths above the model's maximum positions are left out, and the limit is
    drawn as a dashed vertical line.

    Args:
        model: shipped name, config.json path, dict or ModelConfig.
        gpu_memory_bytes: the GPU's memory in bytes.
        formats: weight formats to draw.
        kv_dtype: KV-cache dtype for all lines.
        seq_lens: context lengths (x values).
        highlight: a format drawn thicker (the widget's choice).
        point: a (seq_len, batch_size) to mark (e.g. the Tips notes' (2048, 8)).
        prefill_tokens: see :func:`memlib.core.inference.serving_reserve`.
        title: figure title (default: model, GPU memory, KV dtype).

    Returns:
        The matplotlib Figure.
    """
    plt = _plt()
    cfg = load_config(model)
    fig, ax = plt.subplots(figsize=(7.0, 4.2))
    top = 1
    seq_lens = [s for s in seq_lens if s <= cfg.max_positions]
    for fmt in formats:
        pts = batch_context_frontier(cfg, gpu_memory_bytes, seq_lens, weights=fmt, kv_dtype=kv_dtype,
                                     prefill_tokens=prefill_tokens)
        xs = [s for s, b in pts if b > 0]
        ys = [b for s, b in pts if b > 0]
        width = 3.0 if fmt == highlight else 1.6
        if xs:
            ax.plot(xs, ys, marker="o", markersize=4, linewidth=width, linestyle=FORMAT_STYLES.get(fmt, "-"),
                    color=FORMAT_COLORS.get(fmt), label=f"{fmt} weights")
            top = max(top, max(ys))
        else:
            ax.plot([], [], color=FORMAT_COLORS.get(fmt), label=f"{fmt} weights: do not fit")
    if point is not None:
        ax.plot([point[0]], [point[1]], marker="*", markersize=12, color="black", linestyle="none",
                label=f"batch {point[1]} × {point[0]} tokens")
    ax.axvline(cfg.max_positions, color="gray", linestyle="--", linewidth=1,
               label=f"max positions ({cfg.max_positions:,})")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    ax.set_ylim(0.8, top * 1.6)
    ax.set_xlabel("context length (tokens per sequence)")
    ax.set_ylabel("largest batch that fits")
    ax.set_title(title or f"{cfg.name} on {gpu_memory_bytes / GiB:.0f} GiB, {kv_dtype} KV cache")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    return fig


def serving_breakdown_figure(fits: Sequence[ServingFit], labels: Sequence[str], *,
                             title: str = "Serving memory") -> Any:
    """Stacked bars of weights, KV cache, activations, fragmentation and CUDA context (GB = 10⁹ bytes). Chapter 11.

    Draws each fit's GPU capacity as a dashed tick over its bar.

    Args:
        fits: results of :func:`memlib.core.inference.serving_fit`.
        labels: one label per bar.
        title: figure title.

    Returns:
        The matplotlib Figure.
    """
    plt = _plt()
    fig, ax = plt.subplots(figsize=(max(6.0, 1.3 * len(fits) + 2), 4.2))
    bottoms = [0.0] * len(fits)
    for cat, color in SERVING_COLORS.items():
        values = [getattr(f, f"{cat}_bytes") / GB for f in fits]
        ax.bar(range(len(fits)), values, bottom=bottoms, color=color, label=cat.replace("_", " "))
        bottoms = [b + v for b, v in zip(bottoms, values)]
    for i, f in enumerate(fits):
        ax.hlines(f.gpu_memory_bytes / GB, i - 0.45, i + 0.45, colors="black", linestyles="--", linewidth=1)
        ax.text(i, bottoms[i], f"{f.total_bytes / GB:.1f}", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(fits)))
    ax.set_xticklabels(labels, rotation=15, ha="right", fontsize=8)
    ax.set_ylabel("GB (10⁹ bytes)")
    ax.set_title(title + " (dashed: GPU memory)")
    ax.legend(fontsize=8, ncol=3, loc="upper left")
    ax.set_ylim(0, max(bottoms + [f.gpu_memory_bytes / GB for f in fits]) * 1.3)
    fig.tight_layout()
    return fig
