"""memlib._book.ch09_lora_qlora: the paged-optimizer simulation (moved from memlib.core.paging), its invariants."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memlib.core.errors import MemlibError
from memlib._book.ch09_lora_qlora import UM_PAGE_BYTES, simulate_paging

MiB = 2**20


def test_no_pressure_no_traffic() -> None:
    r = simulate_paging(100 * MiB, 40 * MiB, 20 * MiB, [10 * MiB] * 5)
    assert r.ooms == 0 and r.traffic_bytes == 0
    assert all(s.gpu_peak_bytes == 70 * MiB for s in r.steps)


def test_spike_pages_out_then_in() -> None:
    # 100 MiB GPU, 40 fixed, 20 of states; a 50 MiB activation spike leaves room for 10 MiB of states
    r = simulate_paging(100 * MiB, 40 * MiB, 20 * MiB, [10 * MiB, 50 * MiB, 10 * MiB], page_bytes=2 * MiB)
    assert [s.paged_out_bytes for s in r.steps] == [0, 10 * MiB, 0]
    assert [s.paged_in_bytes for s in r.steps] == [0, 10 * MiB, 0]
    assert r.steps[1].states_on_gpu_bytes == 10 * MiB and r.steps[1].gpu_peak_bytes == 100 * MiB
    assert r.ooms == 0 and r.traffic_bytes == 20 * MiB
    assert r.transfer_seconds(10 * MiB) == pytest.approx(2.0)
    plain = simulate_paging(100 * MiB, 40 * MiB, 20 * MiB, [10 * MiB, 50 * MiB, 10 * MiB], paged=False)
    assert [s.oom for s in plain.steps] == [False, True, False]


def test_pages_round_up() -> None:
    # 3 MiB of states in 2 MiB pages: a 1 MiB squeeze evicts a whole page (the short last one first)
    r = simulate_paging(10 * MiB, 5 * MiB, 3 * MiB, [3 * MiB], page_bytes=2 * MiB)
    assert r.steps[0].paged_out_bytes == 1 * MiB
    r = simulate_paging(10 * MiB, 5 * MiB, 3 * MiB, [3 * MiB + 1], page_bytes=2 * MiB)
    assert r.steps[0].paged_out_bytes == 3 * MiB and r.steps[0].states_on_gpu_bytes == 0


def test_paging_cannot_save_what_never_fits() -> None:
    r = simulate_paging(100 * MiB, 60 * MiB, 20 * MiB, [45 * MiB])  # activations alone overflow
    assert r.ooms == 1
    r = simulate_paging(100 * MiB, 90 * MiB, 20 * MiB, [0])  # the step itself needs all states on the GPU
    assert r.ooms == 1


def test_optimizer_step_temporaries() -> None:
    # the step needs all states plus its own buffer: paging cannot help if that overflows
    r = simulate_paging(100 * MiB, 40 * MiB, 20 * MiB, [10 * MiB], step_bytes=30 * MiB)
    assert r.ooms == 0 and r.steps[0].gpu_peak_bytes == 90 * MiB
    r = simulate_paging(100 * MiB, 40 * MiB, 20 * MiB, [10 * MiB], step_bytes=41 * MiB)
    assert r.ooms == 1
    assert simulate_paging(100 * MiB, 40 * MiB, 20 * MiB, [10 * MiB], step_bytes=41 * MiB, paged=False).ooms == 1


def test_bad_input() -> None:
    with pytest.raises(MemlibError, match="capacity_bytes"):
        simulate_paging(0, 1, 1, [1])
    with pytest.raises(MemlibError, match=r"activation_bytes\[1\]"):
        simulate_paging(10, 1, 1, [1, -1])
    with pytest.raises(MemlibError, match="link_bytes_per_s"):
        simulate_paging(10, 1, 1, [1]).transfer_seconds(0)
    assert UM_PAGE_BYTES == 2 * MiB


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 10_000), st.integers(0, 5_000), st.integers(0, 5_000),
       st.lists(st.integers(0, 8_000), min_size=1, max_size=20), st.integers(1, 700), st.integers(0, 3_000))
def test_invariants(cap: int, fixed: int, states: int, acts: list[int], page: int, step: int) -> None:
    r = simulate_paging(cap, fixed, states, acts, page_bytes=page, step_bytes=step)
    plain = simulate_paging(cap, fixed, states, acts, paged=False, step_bytes=step)
    for s, p in zip(r.steps, plain.steps):
        assert 0 <= s.states_on_gpu_bytes <= states
        if not s.oom:
            assert s.gpu_peak_bytes <= cap                          # paging keeps the step inside the budget
            assert s.paged_in_bytes == states - s.states_on_gpu_bytes
        assert s.oom <= p.oom                                       # paging never adds an OOM
        if not p.oom:
            assert s.paged_out_bytes == 0 and not s.oom             # no pressure, no traffic
    assert sum(s.paged_out_bytes for s in r.steps) >= sum(s.paged_in_bytes for s in r.steps)
