"""DeepSpeed without ZeRO traced as its code steps: ``FP16_Optimizer`` (issue 42), traced = estimated.

``trace_training(framework="deepspeed", zero_stage=0)`` replays ``FP16_Optimizer.step``
(:func:`memlib.measure.recipes._fp16_optimizer_step`): per-parameter fp32 gradient copies and their flattened copy
beside the 16-bit gradients, 8 B/param of step temporaries, as the estimate's ``zero_stage=0`` counts them.
"""
from __future__ import annotations

import pytest

from memlib import MemlibError
from memlib.core.configs import load_config
from memlib.core.estimate import estimate_training
from memlib.measure.trace import trace_training

TINY = {**load_config("llama-2-7b").raw, "num_hidden_layers": 2, "hidden_size": 128, "intermediate_size": 344,
        "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 512}


@pytest.mark.parametrize("precision, recompute", [("bf16-mixed", "full"), ("fp16-mixed", "none")])
def test_stage0_trace_is_fp16_optimizer_and_equals_the_estimate(precision: str, recompute: str) -> None:
    kw = dict(batch_size=1, seq_len=16, precision=precision, recompute=recompute, framework="deepspeed")
    meta = trace_training(TINY, zero_stage=0, **kw)
    cpu = trace_training(TINY, device="cpu", zero_stage=0, **kw)
    est = estimate_training(TINY, zero_stage=0, **kw)
    n = est.settings["params"]
    assert (meta.peak_bytes, meta.by_category) == (cpu.peak_bytes, cpu.by_category)
    assert meta.peak_phase == est.peak_phase == "optimizer"
    assert meta.by_category["temp"] == est.temp_bytes == 8 * n  # fp32 copies + their flattened copy
    assert (meta.by_category["params"], meta.by_category["grads"], meta.by_category["optimizer"]) == (
        2 * n, 2 * n, 12 * n)
    assert abs(meta.peak_bytes - est.total_bytes) <= 1e-3 * meta.peak_bytes
    assert meta.settings["zero_stage"] == 0
    zero = trace_training(TINY, **kw)  # DeepSpeedZeroOptimizer of one rank: its 2 + 4 B/param flatten
    assert zero.by_category["temp"] == 6 * n and zero.peak_bytes == meta.peak_bytes - 2 * n


def test_deepspeed_zero_stage_choices() -> None:
    with pytest.raises(MemlibError, match="unknown zero stage 3; expected one of: 0, 1, 2"):
        trace_training(TINY, framework="deepspeed", precision="bf16-mixed", zero_stage=3)
