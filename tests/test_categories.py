"""One result vocabulary: the estimate and the trace share category names, the peak and its phases."""
from __future__ import annotations

import dataclasses

import pytest

from memlib.core.categories import ESTIMATED_CATEGORIES, PEAK_PHASES, MemCategory, estimate_by_category
from memlib.core.estimate import TrainingEstimate, estimate_training

torch = pytest.importorskip("torch")
from memlib.measure.trace import TraceResult, trace_training  # noqa: E402


def test_estimate_fields_are_the_category_names() -> None:
    fields = {f.name for f in dataclasses.fields(TrainingEstimate)}
    assert {f"{c.value}_bytes" for c in ESTIMATED_CATEGORIES} <= fields
    assert MemCategory.BUFFER not in ESTIMATED_CATEGORIES and "buffers_bytes" not in fields


@pytest.mark.parametrize("kw", [dict(precision="bf16-mixed", seq_len=256),  # PyTorch AMP
                                dict(precision="fp32", seq_len=64),
                                dict(precision="bf16", optimizer="sgd", seq_len=512)])
def test_estimate_and_trace_speak_the_same_words(kw: dict) -> None:
    est = estimate_training("gpt2", batch_size=2, **kw)
    tr = trace_training("gpt2", batch_size=2, **kw)
    assert isinstance(tr, TraceResult)
    # same names: the trace's categories are MemCategory values; the estimate's are those it models
    assert set(tr.by_category) == {c.value for c in MemCategory}
    assert set(est.by_category) == {c.value for c in ESTIMATED_CATEGORIES}
    # same peak: the largest live total of the steady-state step, and its composition adds up to it
    assert est.peak_bytes == est.total_bytes == sum(est.by_category.values())
    assert tr.peak_bytes == sum(tr.by_category.values())
    assert est.peak_phase in PEAK_PHASES and tr.peak_phase in PEAK_PHASES
    assert est.peak_phase == tr.peak_phase
    for c in (MemCategory.PARAM, MemCategory.OPTIMIZER):  # exact states agree category by category
        assert est.by_category[c.value] == tr.by_category[c.value]
    assert abs(est.peak_bytes - tr.peak_bytes) / tr.peak_bytes < 0.03


def test_states_only_estimate_says_states() -> None:
    est = estimate_training(params=10**9)
    assert est.peak_phase == "states" and estimate_by_category(est)["grads"] == est.grads_bytes
    assert sum(est.by_category.values()) == est.total_bytes
