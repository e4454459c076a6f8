"""Searches over monotone yes/no questions ("does batch b fit?"), shared by the planners (pure Python)."""
from __future__ import annotations

from collections.abc import Callable

__all__ = ["bisect_last", "largest_fitting"]


def bisect_last(fits: Callable[[int], bool], lo: int, hi: int) -> int:
    """Largest n in [lo, hi) with ``fits(n)``, given fits(lo) (or lo a floor) and not fits(hi) (or hi a ceiling).

    ``fits`` must be monotone: True up to some n, False after it. Introduced in Chapter 4 (largest batch).
    """
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo


def largest_fitting(fits: Callable[[int], bool], *, start: int = 1, cap: int = 10**16) -> int:
    """Largest n in [1, cap] with ``fits(n)`` (0 if not even 1 fits), for a monotone ``fits``.

    Gallops from ``start`` by doubling, then bisects: O(log n) calls. Introduced in Chapter 11.
    """
    if not fits(1):
        return 0
    if cap <= 1:
        return 1
    lo, hi = 1, min(max(2, start), cap)
    while fits(hi):
        if hi == cap:
            return cap
        lo, hi = hi, min(2 * hi, cap)
    return bisect_last(fits, lo, hi)
