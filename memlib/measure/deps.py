"""Optional dependencies of the measurement layer: torch imported on demand, with an error that says what to install."""
from __future__ import annotations

from typing import Any

__all__ = ["require_torch"]


def require_torch(who: str, detail: str = "") -> Any:
    """Import torch for a measurement module, or raise an ImportError that says what to install.

    Args:
        who: the module that needs it (``"memlib.measure.trace"``), named in the message.
        detail: words after "needs PyTorch" (e.g. ``" for this function"``).
    """
    try:
        import torch
    except ImportError:  # pragma: no cover - exercised only without torch
        raise ImportError(f"{who} needs PyTorch{detail}: pip install torch") from None
    return torch
