"""memlib.core.search: the monotone searches the planners share."""
from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from memlib.core.search import bisect_last, largest_fitting


@given(k=st.integers(0, 10**12), start=st.integers(1, 4096))
def test_largest_fitting_finds_the_threshold(k: int, start: int) -> None:
    calls = []

    def fits(n: int) -> bool:
        calls.append(n)
        return n <= k

    assert largest_fitting(fits, start=start) == k
    assert len(calls) <= 2 * 42 + 4  # logarithmic


@given(k=st.integers(0, 5000), cap=st.integers(1, 5000))
def test_largest_fitting_stops_at_the_cap(k: int, cap: int) -> None:
    assert largest_fitting(lambda n: n <= k, cap=cap) == min(k, cap)


@given(lo=st.integers(0, 1000), span=st.integers(1, 1000), data=st.data())
def test_bisect_last(lo: int, span: int, data: st.DataObject) -> None:
    hi = lo + span
    k = data.draw(st.integers(lo, hi - 1))
    assert bisect_last(lambda n: n <= k, lo, hi) == k
