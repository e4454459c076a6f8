"""Tests for memlib.measure.checkpointing (Chapter 4): the √N chain, recompute modes, FLOPs, offload, estimator agreement."""
from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memlib.measure.checkpointing import (apply_checkpointing, best_checkpoint_every, largest_batch, measure_stack,
                                          segment_peak_bytes, trace_recompute)
from memlib._book.ch04_activations_checkpointing import measure_offload, measure_recompute, stack_flops, step_flops
from memlib.core.configs import load_config
from memlib.core.errors import MemlibError
from memlib.core.estimate import estimate_training
from memlib.measure.trace import trace_training

TOL = 0.03  # estimate vs trace, the foundation's agreement


def _llama(layers: int) -> dict:
    return {**load_config("llama-7b").raw, "num_hidden_layers": layers}


# ------------------------------------------------------------------------------------------ pure model
@given(L=st.integers(1, 200), k=st.integers(1, 200), i=st.integers(1, 10**9), p=st.integers(1, 10**9))
def test_segment_peak_formula(L: int, k: int, i: int, p: int) -> None:
    if k > L:
        with pytest.raises(MemlibError, match="checkpoint_every"):
            segment_peak_bytes(L, k, i, p)
        return
    assert segment_peak_bytes(L, k, i, p) == math.ceil(L / k) * i + k * p


@given(L=st.integers(1, 300), i=st.integers(1, 10**6), p=st.integers(1, 10**6))
@settings(max_examples=60)
def test_best_interval_is_the_argmin_and_near_sqrt(L: int, i: int, p: int) -> None:
    k = best_checkpoint_every(L, i, p)
    costs = [segment_peak_bytes(L, j, i, p) for j in range(1, L + 1)]
    assert costs[k - 1] == min(costs)
    # Chen et al.'s optimum: the cost at k is within one segment input + one layer of the continuous minimum.
    assert costs[k - 1] <= 2 * math.sqrt(L * i * p) + i + p


def test_transformer_layers_make_k1_optimal() -> None:
    # A LLaMA-7B layer saves ~23× its input (b·s·h·2 bytes): k* = √(L·I/P) ≈ 1.2, so every layer is best.
    assert best_checkpoint_every(32, 1, 23) == 1
    assert best_checkpoint_every(64, 1, 1) == 8  # equal sizes: k = √L


@given(t=st.integers(0, 5000), m=st.integers(1, 3000), guess=st.none() | st.integers(-5, 4000))
def test_largest_batch_search(t: int, m: int, guess: int | None) -> None:
    calls: list[int] = []

    def fits(b: int) -> bool:
        assert 1 <= b <= m
        calls.append(b)
        return b <= t

    assert largest_batch(fits, max_batch=m, guess=guess) == min(t, m)
    assert len(calls) <= 2 * math.ceil(math.log2(m + 1)) + 3
    if guess is not None and 1 <= guess == t < m:
        assert len(calls) == 2  # a right guess costs two calls


# ---------------------------------------------------------------------------------- the √N chain
W, B = 64, 16384
I = W * B * 4  # one fp32 activation of the chain


@pytest.mark.parametrize("L,k,saved,peak", [
    (16, None, 17, 20), (16, 1, 17, 20), (16, 2, 9, 12), (16, 4, 5, 10), (16, 16, 2, 19),
    (64, None, 65, 68), (64, 8, 9, 18),
])
def test_chain_memory_is_pinned(L: int, k: int | None, saved: int, peak: int) -> None:
    m = measure_stack(L, k, width=W, batch_size=B)
    # Weights are 64×64: their gradients are < 0.01 I; the rest is whole activations.
    assert round(m.saved_bytes / I) == saved
    assert round(m.activation_peak_bytes / I) == peak


def test_chain_peak_follows_sqrt_n() -> None:
    # O(N) → O(√N): without checkpointing the peak is ~N activations; at k = √N it is ~2√N + 2.
    for L in (16, 64):
        k = math.isqrt(L)
        assert round(measure_stack(L, k, width=W, batch_size=B).activation_peak_bytes / I) == 2 * k + 2
        assert round(measure_stack(L, None, width=W, batch_size=B).activation_peak_bytes / I) == L + 4


@pytest.mark.parametrize("L,k", [(16, 1), (16, 4), (9, 3)])
def test_chain_flops_one_extra_forward(L: int, k: int) -> None:
    none, ckpt = stack_flops(L, None, width=W, batch_size=B), stack_flops(L, k, width=W, batch_size=B)
    layer = 2 * B * W * W
    assert none.forward == L * layer and none.backward == (2 * L - 1) * layer  # no grad for the input
    assert ckpt.backward - none.backward == none.forward  # one extra forward
    assert ckpt.total / none.total == pytest.approx((4 * L - 1) / (3 * L - 1))


# ------------------------------------------------------------------------------------ transformers
def test_interval_one_equals_transformers_gradient_checkpointing() -> None:
    for model, ov, attention in (("llama-7b", {"num_hidden_layers": 2}, "sdpa"), ("gpt2", {"n_layer": 2}, "eager")):
        kw = dict(batch_size=2, seq_len=512, attention=attention, optimizer="sgd", overrides=ov)
        hf = trace_training(model, recompute="full", **kw)
        # our segments of one layer, not transformers' checkpointing
        ours = trace_training(model, recompute="none", extrapolate=False,
                              model_hook=lambda net: apply_checkpointing(net, recompute="full", checkpoint_every=1),
                              **kw)
        assert ours.peak_bytes == hf.peak_bytes and ours.by_category == hf.by_category


def test_selective_saves_exactly_the_attention_core() -> None:
    L, b, s = 2, 2, 256
    cfg = load_config("llama-7b")
    kw = dict(batch_size=b, seq_len=s, overrides={"num_hidden_layers": L})
    none, sel = measure_recompute("llama-7b", **kw), measure_recompute("llama-7b", recompute="selective", **kw)
    # SDPA (flash) keeps only the fp32 log-sum-exp inside the core: 4·b·a·s bytes per layer.
    lse = L * 4 * b * cfg.num_heads * s
    assert 0 <= lse - (none.saved_bytes - sel.saved_bytes) <= 8 * s  # (less one int64 position vector)
    none_e = measure_recompute("llama-7b", attention="eager", **kw)
    sel_e = measure_recompute("llama-7b", attention="eager", recompute="selective", **kw)
    # Eager: the fp32 softmax output and its bf16 copy, (4 + 2)·b·a·s² per layer (LLaMA has no attention dropout).
    core = L * 6 * b * cfg.num_heads * s * s
    assert abs(core - (none_e.saved_bytes - sel_e.saved_bytes)) / core < 0.01
    assert abs(sel_e.saved_bytes - sel.saved_bytes) / sel.saved_bytes < 0.001  # the rest: same for both kinds


def test_segment_recompute_costs_one_layer_per_k() -> None:
    kw = dict(batch_size=2, seq_len=256, overrides={"num_hidden_layers": 4})
    peaks = [measure_recompute("llama-7b", recompute="full", checkpoint_every=k, **kw).activation_peak_bytes
             for k in (2, 3, 4)]
    from memlib.core.estimate import activation_terms
    per_layer = sum(t.bytes for t in activation_terms("llama-7b", batch_size=2, seq_len=256, precision="bf16")
                    if t.per_layer)
    # Going from k to k+1 re-materializes one more layer (less one segment input, b·s·h·2 bytes, for 3 → 4).
    assert abs((peaks[2] - peaks[1]) - per_layer) / per_layer < 0.05
    assert peaks[0] < peaks[1] < peaks[2]


def test_transformer_flops_full_recompute_adds_the_layers_forward() -> None:
    kw = dict(batch_size=1, seq_len=256)
    one = step_flops("llama-7b", overrides={"num_hidden_layers": 1}, **kw)
    two = step_flops("llama-7b", overrides={"num_hidden_layers": 2}, **kw)
    cfg = load_config("llama-7b")
    full = step_flops("llama-7b", recompute="full", overrides={"num_hidden_layers": 2}, **kw)
    layer = two.forward - one.forward
    down_proj = 2 * 256 * cfg.intermediate_size * cfg.hidden_size  # the layer's last matmul
    assert full.forward == two.forward
    # Each layer's forward once more, except its last matmul: non-reentrant checkpoint stops recomputing
    # once every saved tensor is back (early_stop), and nothing saves down_proj's output.
    assert full.backward - two.backward == 2 * (layer - down_proj)
    assert two.backward == pytest.approx(2 * two.forward, rel=0.02)  # backward ≈ 2 × forward
    sel = step_flops("llama-7b", recompute="selective", overrides={"num_hidden_layers": 2}, **kw)
    # SDPA forward FLOPs (FlopCounterMode's formula, no causal discount): 4·b·s²·h per layer.
    assert sel.backward - two.backward == 2 * 4 * 1 * 256 * 256 * cfg.hidden_size


def test_offload_moves_activations_and_weights() -> None:
    kw = dict(batch_size=1, seq_len=256, overrides={"num_hidden_layers": 2})
    none = measure_recompute("llama-7b", **kw)
    off = measure_offload("llama-7b", **kw)
    assert off.memory.saved_bytes < 0.01 * none.saved_bytes  # nothing saved stays on the device
    assert off.activation_bytes_moved >= none.saved_bytes  # each save is a copy: shared tensors move twice
    # save_on_cpu moves every weight an op saves: all but the embedding table (a lookup saves only the indices)
    assert off.param_bytes_moved == none.params_bytes - 32000 * 4096 * 2
    lean = measure_offload("llama-7b", skip_params=True, **kw)
    assert lean.param_bytes_moved == 0 and lean.to_host_bytes == off.activation_bytes_moved
    assert lean.memory.activation_peak_bytes < none.activation_peak_bytes < off.memory.activation_peak_bytes


def test_bad_input() -> None:
    with pytest.raises(MemlibError, match="recompute"):
        measure_recompute("gpt2", recompute="some")
    with pytest.raises(MemlibError, match="checkpoint_every"):
        measure_recompute("gpt2", recompute="full", checkpoint_every=13, seq_len=8)
    with pytest.raises(MemlibError, match="checkpoint_every"):
        measure_stack(4, 5)


@given(st.integers(1, 200), st.integers(1, 300))
def test_segment_layers_one_formula_two_policies(L: int, k: int) -> None:
    # one pure function for the segment arithmetic: Chapter 4's model raises for k > L, the estimator clamps
    from memlib.core.checkpointing import segment_layers

    kept, live = segment_layers(L, k, clamp=True)
    assert (kept, live) == (math.ceil(L / min(k, L)), min(k, L))
    if k > L:
        with pytest.raises(MemlibError, match=f"checkpoint_every {k} is larger than num_layers {L}"):
            segment_layers(L, k)
    else:
        assert segment_layers(L, k) == (kept, live)
        assert segment_peak_bytes(L, k, 3, 7) == 3 * kept + 7 * live


def test_estimator_clamps_segments_longer_than_the_model() -> None:
    kw = dict(batch_size=1, seq_len=128, recompute="full")
    long, whole = (estimate_training("gpt2", checkpoint_every=k, **kw) for k in (100, 12))  # GPT-2: 12 layers
    assert (long.total_bytes, long.activations_bytes) == (whole.total_bytes, whole.activations_bytes)


# ------------------------------------------------------------------------------ estimator agreement
def _agree(model: dict | str, **kw: object) -> tuple[int, int]:
    # pure bf16 (16-bit weights, as the recomputation terms were derived); under PyTorch AMP
    # tests/test_autocast_estimate.py checks them against real CPU autocast traces
    kw = {**dict(precision="bf16", optimizer="adamw", batch_size=4, seq_len=2048), **kw}
    tr = trace_recompute(model, **kw)  # type: ignore[arg-type]
    est = estimate_training(model, **kw)  # type: ignore[arg-type]
    assert tr.peak_phase == est.peak_phase  # the same moment peaks (the backward, or the step when k = 1)
    return est.total_bytes, tr.peak_bytes


@pytest.mark.parametrize("recompute,k,attention", [
    ("none", 1, "sdpa"), ("selective", 1, "sdpa"),
    ("full", 1, "sdpa"), ("full", 2, "sdpa"),
    ("none", 1, "eager"),
])
def test_estimator_agrees_with_trace(recompute: str, k: int, attention: str) -> None:
    est, measured = _agree(_llama(4), recompute=recompute, checkpoint_every=k, attention=attention)
    assert abs(est - measured) / measured < TOL


def test_estimator_agrees_full_size_eager() -> None:
    est, measured = _agree("llama-7b", recompute="full", attention="eager")
    assert abs(est - measured) / measured < TOL


def test_estimator_long_segments() -> None:
    est, measured = _agree(_llama(8), recompute="full", checkpoint_every=8)
    assert abs(est - measured) / measured < TOL


def test_estimator_selective_with_attention_dropout() -> None:
    gpt2 = {**load_config("gpt2").raw, "n_layer": 4}
    est, measured = _agree(gpt2, recompute="selective", attention="eager", seq_len=1024)
    assert abs(est - measured) / measured < TOL


def test_estimator_eager_recompute_small_states() -> None:
    est, measured = _agree(_llama(4), recompute="full", attention="eager")
    assert abs(est - measured) / measured < TOL


def test_trace_recompute_passes_the_optimizer_impl_and_framework() -> None:
    # Chapter 4: with fused AdamW (the HF Trainer's adamw_torch_fused) the step makes no full-size temporary,
    # so under PyTorch AMP the segment length shows in the step's peak; with foreach the step is the peak
    kw = dict(batch_size=2, seq_len=2048, precision="bf16-mixed", recompute="full")
    model = _llama(4)
    fused = {k: trace_recompute(model, checkpoint_every=k, optimizer_impl="fused", **kw) for k in (1, 4)}  # type: ignore[arg-type]
    foreach = trace_recompute(model, checkpoint_every=1, **kw)  # type: ignore[arg-type]
    assert all(t.settings["optimizer_impl"] == "fused" for t in fused.values())
    assert "optimizer_impl" not in foreach.settings and foreach.peak_phase == "optimizer"  # foreach: the default
    assert fused[1].peak_phase == fused[4].peak_phase == "backward"
    assert fused[1].peak_bytes < fused[4].peak_bytes and fused[1].peak_bytes < foreach.peak_bytes
    assert fused[4].settings["checkpoint_every"] == 4
    ds = trace_recompute(model, framework="deepspeed", **kw)  # type: ignore[arg-type]
    assert ds.settings["framework"] == "deepspeed" and ds.peak_bytes != foreach.peak_bytes
