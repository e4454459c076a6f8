"""ZeRO-3's gathered working set as DeepSpeed's coordinator fetches it (issue 42, item 11).

:func:`memlib.core.frameworks.zero3_fetch.gathered_peak` replays ``PartitionedParameterCoordinator``'s fetch,
prefetch and release over a traced pass; the tiny-Llama case is checked against the real engine in
``tests/test_deepspeed_measured.py``.
"""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from memlib.core.configs import load_config
from memlib.core.estimate import estimate_training
from memlib.core.frameworks.zero3_fetch import (MAX_LIVE_PARAMETERS, PREFETCH_BUCKET, gathered_peak,
                                                largest_module, modules)
from memlib.core.params import count_params

CFG = load_config("llama-2-7b")
PSI = count_params("llama-2-7b").params
EMBED = CFG.vocab_size * CFG.hidden_size
LAYER = (PSI - 2 * EMBED - CFG.hidden_size) // CFG.num_layers


def _total(m) -> int:  # noqa: ANN001
    return sum(n for _, n in m[1]) + sum(_total(c) for c in m[2])


def test_the_module_tree_holds_every_parameter() -> None:
    assert _total(modules(CFG, LAYER)) == PSI


def test_the_largest_module_is_the_embedding_not_a_decoder_layer() -> None:
    """``model_to_params`` counts ``parameters(recurse=False)``: the largest single module is V·h, not a layer."""
    assert largest_module(CFG, LAYER) == EMBED < LAYER


def test_without_prefetch_or_reuse_one_module_is_gathered_alone() -> None:
    """Prefetch 0 and reuse distance 0: only the module being computed, plus what persists (the norms, under 10⁵
    elements). Each of Llama's modules has one weight, which ``_all_gather_sequential`` gathers straight into the
    parameter: the largest, the embedding, held once."""
    norms = (2 * CFG.num_layers + 1) * CFG.hidden_size
    assert gathered_peak(CFG, LAYER, prefetch_bucket=0, max_reuse=0) == EMBED + norms


def test_the_defaults_gather_up_to_max_live_parameters_and_beyond_a_prefetch() -> None:
    """With the defaults the prefetch runs ahead to ``max_live_parameters``: several decoder layers of Llama-2-7B
    (each 2·10⁸ elements), more than the two layers the estimate used to take."""
    for recompute in (False, True):
        peak = gathered_peak(CFG, LAYER, recompute)
        assert MAX_LIVE_PARAMETERS <= peak <= MAX_LIVE_PARAMETERS + 2 * (PREFETCH_BUCKET + EMBED)
        assert peak > 5 * LAYER


@settings(max_examples=25, deadline=None)
@given(bucket=st.integers(0, 10**9), live=st.integers(0, 2 * 10**9), reuse=st.integers(0, 2 * 10**9))
def test_gathered_peak_is_bounded_by_the_largest_module_and_the_model_held_twice(bucket: int, live: int, reuse: int) -> None:
    tiny = load_config({"model_type": "llama", "vocab_size": 512, "hidden_size": 128, "intermediate_size": 256,
                        "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
                        "max_position_embeddings": 64, "tie_word_embeddings": True, "rms_norm_eps": 1e-6})
    psi = count_params(tiny).params
    layer = (psi - tiny.vocab_size * tiny.hidden_size - tiny.hidden_size) // tiny.num_layers
    peak = gathered_peak(tiny, layer, prefetch_bucket=bucket, max_live=live, max_reuse=reuse,
                         persistence_threshold=0)
    assert largest_module(tiny, layer) <= peak <= 2 * psi


def test_zero3_estimate_keeps_the_gathered_set_out_of_the_step() -> None:
    e = estimate_training("llama-2-7b", framework="deepspeed", zero_stage=3, num_gpus=8, batch_size=1, seq_len=4096,
                          recompute="full", precision="bf16-mixed")
    assert e.peak_phase == "optimizer" and round(e.total_bytes / 1e9, 2) == 19.53
