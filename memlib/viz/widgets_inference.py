"""ipywidgets for Chapter 11: model, GPU memory, weight format, KV dtype → frontier figure and verdict."""
from __future__ import annotations

from typing import Any

from ..core.configs import load_config, shipped_models
from ..core.dtypes import GiB, WEIGHT_FORMATS
from ..core.estimate import KV_DTYPES
from ..core.inference import max_batch_size, max_seq_len
from .plots_inference import frontier_figure

__all__ = ["inference_view", "inference_widget"]


def inference_view(model: str = "llama-7b", gpu_memory_gib: float = 24.0, weights: str = "fp16",
                   kv_dtype: str = "fp16", seq_len: int = 2048, batch_size: int = 8) -> tuple[dict[str, int], Any, str]:
    """The widget's callback: the two limits, the frontier figure and a one-line verdict. Chapter 11.

    Args:
        model: shipped model name.
        gpu_memory_gib: GPU memory in GiB (2³⁰ bytes; "24 GB" consumer cards have 24 GiB).
        weights: weight format, highlighted in the figure.
        kv_dtype: KV-cache dtype.
        seq_len: context length for the largest-batch question.
        batch_size: batch for the longest-context question.

    Returns:
        ``({"max_batch": …, "max_seq_len": …}, figure, verdict)``.
    """
    gpu = int(gpu_memory_gib * GiB)
    limit = load_config(model).max_positions
    too_long = seq_len > limit
    limits = {"max_batch": 0 if too_long else max_batch_size(model, gpu, seq_len=seq_len, weights=weights,
                                                             kv_dtype=kv_dtype),
              "max_seq_len": max_seq_len(model, gpu, batch_size=batch_size, weights=weights, kv_dtype=kv_dtype)}
    fig = frontier_figure(model, gpu, kv_dtype=kv_dtype, highlight=weights,
                          point=None if too_long else (seq_len, batch_size),
                          formats=("fp16", "int8", "int4", "nf4") if weights in ("fp16", "int8", "int4", "nf4")
                          else (weights, "fp16", "int8", "int4", "nf4"))
    if too_long:
        verdict = (f"{model} takes at most {limit:,} tokens per sequence (its maximum positions), not {seq_len:,}; "
                   f"at batch {batch_size} the longest context that fits is {limits['max_seq_len']} tokens")
    elif limits["max_batch"] == 0 and limits["max_seq_len"] == 0:
        verdict = f"{model} with {weights} weights does not fit in {gpu_memory_gib:g} GiB at all"
    else:
        verdict = (f"{model}, {weights} weights, {kv_dtype} KV on {gpu_memory_gib:g} GiB: "
                   f"at {seq_len} tokens the largest batch is {limits['max_batch']}; "
                   f"at batch {batch_size} the longest context is {limits['max_seq_len']} tokens")
    return limits, fig, verdict


def inference_widget() -> Any:
    """An interactive widget: model, GPU memory, weights, KV dtype, context, batch → frontier and verdict."""
    try:
        import ipywidgets as w
        import matplotlib.pyplot as plt
    except ImportError:  # pragma: no cover
        raise ImportError("the widget needs ipywidgets and matplotlib: pip install ipywidgets matplotlib") from None

    def show(model: str, gpu_memory_gib: float, weights: str, kv_dtype: str, seq_len: int, batch_size: int) -> None:
        _, fig, verdict = inference_view(model, gpu_memory_gib, weights, kv_dtype, seq_len, batch_size)
        plt.show()
        print(verdict)
        plt.close(fig)

    return w.interactive(
        show,
        model=w.Dropdown(options=shipped_models(), value="llama-7b"),
        gpu_memory_gib=w.Dropdown(options=[16.0, 24.0, 32.0, 40.0, 48.0, 80.0, 96.0, 140.0], value=24.0),
        weights=w.Dropdown(options=list(WEIGHT_FORMATS), value="fp16"),
        kv_dtype=w.Dropdown(options=list(KV_DTYPES), value="fp16"),
        seq_len=w.Dropdown(options=[512, 1024, 2048, 4096, 8192, 16384, 32768], value=2048),
        batch_size=w.IntSlider(value=8, min=1, max=128),
    )
