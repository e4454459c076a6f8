"""Chapter 7's book helper: DeepSpeed's offload estimators, compiled from its source without importing DeepSpeed.

Book helper (moved from ``memlib.measure.offload``): only Chapter 7 uses it.
"""
from __future__ import annotations

import ast
import importlib.util
from pathlib import Path
from typing import Any

from ..core.errors import MemlibError


def deepspeed_offload_estimators() -> tuple[Any, Any]:
    """DeepSpeed's own model-state estimators for ZeRO-2 and ZeRO-3, taken from the installed source.

    Introduced in Chapter 7. Returns ``(estimate_zero2_model_states_mem_needs,
    estimate_zero3_model_states_mem_needs)`` — the pure functions behind DeepSpeed's
    ``estimate_zero{2,3}_model_states_mem_needs_all_cold`` — compiled from ``deepspeed/runtime/zero/
    stage_1_and_2.py`` and ``stage3.py`` without importing the package (``import deepspeed`` takes tens of
    seconds on a small CPU machine). Both return host and GPU bytes: ``(cpu, gpu)`` and
    ``(cpu, gpu, largest_layer_memory)``.

    Raises:
        MemlibError: if DeepSpeed is not installed.
    """
    spec = importlib.util.find_spec("deepspeed")
    if spec is None or not spec.submodule_search_locations:
        raise MemlibError("DeepSpeed is not installed (pip install deepspeed)")
    root = Path(list(spec.submodule_search_locations)[0]) / "runtime" / "zero"
    found = []
    for fname, func in (("stage_1_and_2.py", "estimate_zero2_model_states_mem_needs"),
                        ("stage3.py", "estimate_zero3_model_states_mem_needs")):
        tree = ast.parse((root / fname).read_text())
        node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == func)
        namespace: dict[str, Any] = {}
        exec(compile(ast.Module(body=[node], type_ignores=[]), str(root / fname), "exec"), namespace)
        found.append(namespace[func])
    return found[0], found[1]
