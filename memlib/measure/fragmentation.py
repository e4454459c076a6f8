"""The planner's fragmentation figure from a traced step replayed through the caching allocator (Chapter 16).

:func:`traced_fragmentation` traces the step a plan chose on the meta device (:func:`memlib.measure.trace.trace_training`
with ``reserved=True``) and returns reserved peak ÷ traced peak − 1: what PyTorch's CUDA caching allocator
(:mod:`memlib.core.allocator`) adds on top of the tensors, in place of the planner's 5 % allowance. Settings the
trace cannot run (ZeRO across GPUs, offload, LoRA/QLoRA, selective recomputation, 8-bit AdamW, FSDP2) keep the
allowance, and the note says so.
"""
from __future__ import annotations

from typing import Any

__all__ = ["traced_fragmentation"]


def traced_fragmentation(model: Any, settings: dict[str, Any]) -> tuple[float | None, str]:
    """Reserved ÷ allocated − 1 of the traced step a plan chose, or None with the reason. Chapter 16.

    Args:
        model: what :func:`memlib.core.plan.plan` planned (shipped name, config path, dict or config).
        settings: the chosen rung's settings (:attr:`memlib.core.plan.PlanStep.settings`).

    Returns:
        ``(fraction, note)``: the simulated fraction and a note for the plan, or ``(None, note)`` saying why the
        5 % allowance stays.
    """
    from .trace import TRACE_OPTIMIZERS, trace_training

    s = settings
    framework = s.get("framework", "pytorch")
    why = None
    if s["method"] != "full" or s["offload"] != "none":
        why = f"method {s['method']!r} with offload {s['offload']!r}"
    elif s["zero_stage"] and s["num_gpus"] > 1:
        why = f"ZeRO-{s['zero_stage']} over {s['num_gpus']} GPUs"
    elif s["recompute"] not in ("none", "full") or s["optimizer"] not in TRACE_OPTIMIZERS \
            or s["optimizer"] == "adamw-8bit":
        why = f"recompute {s['recompute']!r} with optimizer {s['optimizer']!r}"
    elif framework not in ("pytorch", "deepspeed", "megatron") or (
            framework != "pytorch" and not s["precision"].endswith("-mixed")):
        why = f"framework {framework!r} with precision {s['precision']!r}"
    if why is not None:
        return None, f"fragmentation: the 5 % allowance is kept ({why} is not traced)"
    res = trace_training(model, batch_size=s["batch_size"], seq_len=s["seq_len"], precision=s["precision"],
                         optimizer=s["optimizer"], attention=s["attention"], recompute=s["recompute"],
                         framework=framework, reserved=True)
    assert res.reserved_peak_bytes is not None
    frac = round(res.reserved_peak_bytes / res.peak_bytes - 1, 4)
    return frac, (f"fragmentation: {100 * frac:.2f} % simulated (the chosen step traced on the meta device and "
                  "replayed through PyTorch's caching-allocator rules, Chapter 16) instead of the 5 % allowance")
