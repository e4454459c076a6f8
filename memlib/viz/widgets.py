"""ipywidgets controls wired to the estimators and plots (Chapter 1). Only wiring lives here."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..core.configs import shipped_models
from ..core.dtypes import GiB
from ..core.errors import MemlibError
from ..core.choices import FRAMEWORKS, OPTIMIZERS, PRECISIONS, ZERO_STAGES
from ..core.estimate import TrainingEstimate, estimate_training
from ..core.hardware import GPU_MEMORY_MENU_GIB
from .live import training_verdict
from .plots import training_breakdown_figure

__all__ = ["show_view", "training_view", "training_widget"]


def training_view(model: str = "llama-2-7b", batch_size: int = 4, seq_len: int = 4096,
                  precision: str = "bf16-mixed", optimizer: str = "adamw", zero_stage: int = 0,
                  num_gpus: int = 1, gpu_memory_gib: float = 80.0,
                  framework: str = "pytorch") -> tuple[TrainingEstimate, Any, str]:
    """The widget's callback: the estimate, its stacked-bar figure and a one-line verdict. Chapter 1.

    The verdict is :func:`memlib.viz.live.training_verdict` (the page's live calculator prints the same line).
    ``framework`` picks the layout (:data:`memlib.core.choices.FRAMEWORKS`); a ZeRO stage it lacks raises.
    """
    est = estimate_training(model, batch_size=batch_size, seq_len=seq_len, precision=precision,
                            optimizer=optimizer, zero_stage=zero_stage, num_gpus=num_gpus, framework=framework)
    label = (f"{model}\nb={batch_size} s={seq_len}\n{precision}, {optimizer}, {framework} "
             f"ZeRO-{zero_stage}×{num_gpus}")
    fig = training_breakdown_figure([est], [label], gpu_memory_bytes=int(gpu_memory_gib * GiB))
    return est, fig, training_verdict(est, gpu_memory_gib)


def training_widget() -> Any:
    """An interactive widget: model, batch, seq, precision, optimizer, framework, ZeRO stage, GPUs → memory per GPU."""
    try:
        import ipywidgets as w
        import matplotlib.pyplot as plt
    except ImportError:  # pragma: no cover
        raise ImportError("the widget needs ipywidgets and matplotlib: pip install ipywidgets matplotlib") from None

    def show(model: str, batch_size: int, seq_len: int, precision: str, optimizer: str, framework: str,
             zero_stage: int, num_gpus: int, gpu_memory_gib: float) -> None:
        show_view(training_view, model, batch_size, seq_len, precision, optimizer, zero_stage, num_gpus,
                  gpu_memory_gib, framework)

    return w.interactive(
        show,
        model=w.Dropdown(options=[m for m in shipped_models()], value="llama-2-7b"),
        batch_size=w.IntSlider(value=4, min=1, max=64),
        seq_len=w.Dropdown(options=[512, 1024, 2048, 4096, 8192, 16384], value=4096),
        precision=w.Dropdown(options=list(PRECISIONS), value="bf16-mixed"),
        optimizer=w.Dropdown(options=list(OPTIMIZERS), value="adamw"),
        framework=w.Dropdown(options=list(FRAMEWORKS), value="pytorch"),
        zero_stage=w.Dropdown(options=list(ZERO_STAGES), value=0),
        num_gpus=w.Dropdown(options=[1, 2, 4, 8, 16, 32, 64], value=1),
        gpu_memory_gib=w.Dropdown(options=list(GPU_MEMORY_MENU_GIB), value=80.0),
    )


def show_view(view: Callable[..., tuple[Any, Any, str]], *args: Any) -> None:
    """Draw ``view(*args)``'s figure and print its verdict; bad input (a MemlibError) prints one "refused" line."""
    import matplotlib.pyplot as plt

    try:
        _, fig, verdict = view(*args)
    except MemlibError as err:  # e.g. a sequence longer than the model's positions
        print(f"refused: {err}")
        return
    plt.show()
    print(verdict)
    plt.close(fig)
