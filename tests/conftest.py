"""Fixtures shared by the unit tests."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest


@pytest.fixture
def expired_deadline() -> Callable[[Any, float, str], None]:
    """A stand-in for ``memlib.measure.procs.join_with_deadline`` whose deadline passes at once.

    It kills and reaps the workers as the real one does on timeout, then raises its TimeoutError, so a test can
    check what a caller does with a timeout without racing the clock.
    """
    def expire(ctx: Any, timeout_s: float, what: str) -> None:
        for p in ctx.processes:
            p.kill()
            p.join()
        raise TimeoutError(f"{what} did not finish within {timeout_s} s")

    return expire
