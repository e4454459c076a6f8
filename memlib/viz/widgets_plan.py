"""ipywidgets for the strategy planner (Chapter 13). Only wiring lives here."""
from __future__ import annotations

from typing import Any

from ..core.choices import FRAMEWORKS
from ..core.configs import shipped_models
from ..core.dtypes import GiB
from ..core.hardware import GPU_MEMORY_MENU_GIB
from .live import plan_verdict
from ..core.plan import JOBS, Plan, plan
from .plots_plan import ladder_figure
from .widgets import show_view

__all__ = ["plan_view", "plan_widget"]


def plan_view(model: str = "llama-2-7b", job: str = "train", num_gpus: int = 8, gpu_memory_gib: float = 80.0,
              batch_size: int = 4, seq_len: int = 2048, framework: str = "pytorch") -> tuple[Plan, Any, str]:
    """The widget's callback: the plan, its ladder figure and a one-line verdict. Chapter 13.

    ``gpu_memory_gib`` is binary (GiB): an "80 GB" H100 has 80 GiB. Raises :class:`MemlibError` on bad input,
    e.g. a sequence longer than the model's positions (the widget prints the message). ``framework`` picks the
    ladder's layout and rungs (:func:`memlib.core.plan.plan`).
    """
    result = plan(model, job=job, num_gpus=num_gpus, gpu_memory=int(gpu_memory_gib * GiB), batch_size=batch_size,
                  seq_len=seq_len, framework=framework)
    fig = ladder_figure(result)
    verdict = plan_verdict(result)
    return result, fig, verdict


def plan_widget() -> Any:
    """Pick a model, GPUs and a job: the plan's ladder and verdict."""
    try:
        import ipywidgets as w
        import matplotlib.pyplot as plt
    except ImportError:  # pragma: no cover
        raise ImportError("the widget needs ipywidgets and matplotlib: pip install ipywidgets matplotlib") from None

    def show(model: str, job: str, framework: str, num_gpus: int, gpu_memory_gib: float, batch_size: int,
             seq_len: int) -> None:
        show_view(plan_view, model, job, num_gpus, gpu_memory_gib, batch_size, seq_len, framework)

    return w.interactive(
        show,
        model=w.Dropdown(options=shipped_models(), value="llama-2-7b"),
        job=w.Dropdown(options=list(JOBS), value="train"),
        framework=w.Dropdown(options=list(FRAMEWORKS), value="pytorch"),
        num_gpus=w.Dropdown(options=[1, 2, 4, 8, 16, 32, 64], value=8),
        gpu_memory_gib=w.Dropdown(options=list(GPU_MEMORY_MENU_GIB), value=80.0),
        batch_size=w.Dropdown(options=[1, 2, 4, 8, 16], value=4),
        seq_len=w.Dropdown(options=[512, 1024, 2048, 4096, 8192], value=2048),
    )
