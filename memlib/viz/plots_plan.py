"""Figures for the strategy planner: the memory ladder and the decision flow (Chapter 13)."""
from __future__ import annotations

from typing import Any

from ..core.dtypes import GiB
from ..core.plan import Plan
from .plots import _plt

__all__ = ["ladder_figure", "decision_flow_figure"]


def ladder_figure(result: Plan, *, title: str | None = None) -> Any:
    """Bars: estimated per-GPU memory after each rung of the planner's ladder, in GiB. Chapter 13.

    Each bar is the estimate with the reserve (CUDA context + 5 % fragmentation) stacked on top, lighter; the
    GPU's memory is the line. Rungs that fit are green, the others grey, rungs that do not apply hatched; the
    chosen (pruned) combination is the last bar.
    """
    plt = _plt()
    inp = result.inputs
    steps = list(result.steps)
    labels = [s.technique.replace(" ", "\n", 1) for s in steps]
    values = [s.per_gpu_bytes / GiB for s in steps]
    reserves = [s.reserve_bytes / GiB for s in steps]
    colors = ["#55A868" if s.fits else "#B0B0B0" for s in steps]
    hatches = ["" if s.applicable else "//" for s in steps]
    if result.chosen is not None:
        labels.append("chosen\n(pruned)")
        values.append(result.chosen.per_gpu_bytes / GiB)
        reserves.append(result.chosen.reserve_bytes / GiB)
        colors.append("#2E7D32")
        hatches.append("")
    fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(values) + 2), 4.2))
    bars = ax.bar(range(len(values)), values, color=colors, edgecolor="black", linewidth=0.6)
    ax.bar(range(len(values)), reserves, bottom=values, color=colors, alpha=0.35, edgecolor="black",
           linewidth=0.4, label="reserve (CUDA context + 5 %)")
    for bar, h in zip(bars, hatches):
        bar.set_hatch(h)
    mem = inp["gpu_memory"] / GiB
    ax.axhline(mem, color="black", lw=1.2, label=f"GPU memory {mem:.0f} GiB")
    ax.set_xticks(range(len(values)), labels, fontsize=8)
    ax.set_ylabel("per-GPU memory (GiB)")
    tops = [v + r for v, r in zip(values, reserves)]
    if max(tops) > 8 * mem:
        ax.set_yscale("log")
    for i, v in enumerate(tops):
        ax.text(i, v, f"{v:.0f}" if v >= 10 else f"{v:.1f}", ha="center", va="bottom", fontsize=7)
    ax.set_title(title or f"{inp['model']}: {inp['job']}, {inp['num_gpus']} GPU(s), batch {inp['batch_size']} × "
                          f"{inp['seq_len']} tokens")
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    return fig


def decision_flow_figure() -> Any:
    """The planner's decision flow as a flowchart (Chapter 13), after the two source notes' priority lists.

    Free techniques first, then each rung only if it still does not fit, cheapest cost first; every full
    fine-tuning option before LoRA / QLoRA, which changes the job.
    """
    plt = _plt()
    rungs = [("bf16 mixed precision", "free (faster)"), ("FlashAttention", "free (faster)"),
             ("gradient accumulation", "0 FLOPs; smaller kernels"), ("activation checkpointing",
                                                                     "+≈33 % compute (full)"),
             ("ZeRO-2 (several GPUs)", "same traffic as DDP"), ("8-bit AdamW", "≈ no accuracy cost"),
             ("ZeRO-3 / FSDP", "+50 % traffic"), ("pure bf16", "no fp32 master weights"),
             ("CPU offload", "PCIe-bound: slow"), ("LoRA / QLoRA", "changes the job: say so")]
    fig, ax = plt.subplots(figsize=(7.5, 10.0))
    ax.set_xlim(0, 10)
    ax.set_ylim(-0.5, len(rungs) * 1.25 + 1.0)
    ax.axis("off")
    top = len(rungs) * 1.25 + 0.3
    ax.text(3.2, top, "estimate peak memory per GPU", ha="center", va="center", fontsize=10,
            bbox=dict(boxstyle="round", fc="#E3F2FD", ec="black"))
    for i, (name, cost) in enumerate(rungs):
        y = top - 1.25 * (i + 1)
        ax.annotate("", xy=(3.2, y + 0.3), xytext=(3.2, y + 0.95), arrowprops=dict(arrowstyle="->"))
        ax.text(3.2, y, f"still too big? → {name}", ha="center", va="center", fontsize=9,
                bbox=dict(boxstyle="round", fc="#FFF8E1" if i >= 3 else "#E8F5E9", ec="black"))
        ax.text(6.6, y, cost, ha="left", va="center", fontsize=8, color="#444444")
    ax.text(3.2, top - 1.25 * (len(rungs) + 1) + 0.4, "fits: stop, then drop rungs the fit does not need",
            ha="center", va="center", fontsize=9, bbox=dict(boxstyle="round", fc="#C8E6C9", ec="black"))
    ax.set_title("Which technique next? (cheapest cost first)")
    fig.tight_layout()
    return fig
