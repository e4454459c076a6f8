"""Chapter 1's book helper: one row of "the same step in four frameworks" (states, what the peak adds, the peak).

Book helper: only Chapter 1 uses it. Pure Python over a :class:`~memlib.core.terms.TrainingEstimate`.
"""
from __future__ import annotations

from ..core.dtypes import GB
from ..core.terms import TrainingEstimate

__all__ = ["FRAMEWORK_COLUMNS", "framework_row"]

#: The columns of Chapter 1's framework table (the traced peak is the chapter's, from ``trace_training``).
FRAMEWORK_COLUMNS = ["framework", "states (B/param)", "model states (GB)", "on top of the states at the peak (GB)",
                     "estimated peak (GB)", "peak in", "traced peak (GB)"]


def framework_row(label: str, e: TrainingEstimate, n_params: int, traced_peak_bytes: int) -> list[str]:
    """One row of Chapter 1's framework table: the states per parameter, the model states, what the peak holds on
    top of them (:attr:`~memlib.core.terms.TrainingEstimate.beyond_states_bytes`: at a backward peak the gradients
    accumulated by then are in the states already, so they are not counted again), the peak and its phase."""
    per = f"{e.params_bytes / n_params:g} + {e.grads_bytes / n_params:g} + {e.optimizer_bytes / n_params:g}"
    return [label, per, f"{e.model_states_bytes / GB:.1f}", f"{e.beyond_states_bytes / GB:.1f}",
            f"{e.total_bytes / GB:.1f}", e.peak_phase, f"{traced_peak_bytes / GB:.1f}"]
