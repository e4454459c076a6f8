"""Smoke test: memlib imports and counts GPT-2 (small) exactly."""
from __future__ import annotations

import memlib


def test_gpt2_param_count() -> None:
    # transformers' GPT2LMHeadModel with tied head: 124,439,808 parameters.
    assert memlib.count_params("gpt2").params == 124_439_808
