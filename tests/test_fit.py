"""The fit verdict of one estimate (memlib.core.fit): exactly the planner's rule, and its margins."""
from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from memlib.core.dtypes import GiB
from memlib.core.errors import MemlibError
from memlib.core.fit import COMMON_GPUS, fits_on, gpu_fit
from memlib.core.hardware import GPUS
from memlib.core.inference import reserve_bytes

sizes = st.integers(min_value=0, max_value=400 * GiB)


@given(estimate=sizes, capacity=st.integers(min_value=2 * GiB, max_value=300 * GiB),
       context=st.integers(min_value=0, max_value=GiB), frag=st.floats(min_value=0.0, max_value=0.5))
def test_fits_is_the_planners_rule_and_spare_is_the_margin(estimate: int, capacity: int, context: int,
                                                            frag: float) -> None:
    fit = gpu_fit(estimate, capacity, cuda_context_bytes=context, fragmentation=frag)
    reserve = reserve_bytes(estimate, cuda_context_bytes=context, fragmentation=frag)
    assert fit.fits == (estimate + reserve <= capacity)
    assert fit.spare_bytes == capacity - estimate - reserve
    assert fit.usable_bytes == capacity - context and fit.needed_bytes == estimate + reserve - context


@given(estimate=sizes)
def test_a_card_with_more_memory_fits_whatever_a_smaller_one_fits(estimate: int) -> None:
    on = fits_on(estimate)
    assert list(on) == list(COMMON_GPUS)
    by_memory = sorted(COMMON_GPUS, key=lambda g: GPUS[g].memory_bytes)
    for small, big in zip(by_memory, by_memory[1:]):
        assert not on[small] or on[big]


def test_named_gpu_and_its_numbers() -> None:
    fit = gpu_fit(60 * GiB, "h100")
    assert fit.gpu == "h100-sxm" and fit.capacity_bytes == 80 * GiB and fit.usable_bytes == 79 * GiB
    assert fit.needed_bytes == 63 * GiB and fit.spare_bytes == 16 * GiB and fit.fits
    assert not gpu_fit(76 * GiB, "h100").fits  # 76 × 1.05 = 79.8 > 79
    with pytest.raises(MemlibError, match="unknown GPU 'h300'; expected one of"):
        gpu_fit(GiB, "h300")
