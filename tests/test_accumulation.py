"""memlib._book.ch05_gradient_accumulation (Chapter 5): equivalence, loss normalization, memory, FLOPs, DDP no_sync."""
from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memlib._book import ch05_gradient_accumulation as acc
from memlib.core.errors import MemlibError

torch = pytest.importorskip("torch")

SMALL_GPT2 = {"n_layer": 2}


@pytest.fixture(autouse=True, scope="module")
def _one_thread():  # type: ignore[no-untyped-def]
    """One intra-op thread: these models are tiny, and spinning OpenMP threads only slow a shared CI box."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# ---------------------------------------------------------------- pure part
@given(st.lists(st.integers(1, 10_000), min_size=1, max_size=16))
def test_step_token_weights_are_uniform_and_sum_to_one(counts: list[int]) -> None:
    w = acc.token_loss_weights(counts, "sum-over-step-tokens")
    assert all(x == w[0] for x in w)
    assert math.isclose(sum(x * n for x, n in zip(w, counts)), 1.0, rel_tol=1e-12)


@given(st.lists(st.integers(1, 10_000), min_size=1, max_size=16))
def test_mean_per_micro_batch_gives_each_micro_batch_one_kth(counts: list[int]) -> None:
    w = acc.token_loss_weights(counts, "mean-per-micro-batch")
    k = len(counts)
    for x, n in zip(w, counts):  # every micro-batch weighs 1/k in total, however many tokens it holds
        assert math.isclose(x * n, 1 / k, rel_tol=1e-12)
    right = acc.token_loss_weights(counts, "sum-over-step-tokens")
    error = acc.normalization_error(counts)
    assert math.isclose(error, max(abs(a / b - 1) for a, b in zip(w, right)), rel_tol=1e-9, abs_tol=1e-12)
    assert (error < 1e-12) == (len(set(counts)) == 1)


def test_normalization_error_example() -> None:
    # 300 and 100 tokens: mean-per-micro-batch gives the short micro-batch's tokens 1/(2·100) instead of 1/400
    assert acc.normalization_error([300, 100]) == pytest.approx(1.0)
    assert acc.token_loss_weights([300, 100], "mean-per-micro-batch") == pytest.approx([1 / 600, 1 / 200])


@given(st.integers(1, 1000), st.integers(1, 64))
def test_last_group_scale(n: int, k: int) -> None:
    s = acc.last_group_scale(n, k)
    assert 0 < s <= 1
    assert (s == 1.0) == (n % k == 0)
    assert s == pytest.approx((n % k or k) / k)


def test_bad_input() -> None:
    with pytest.raises(MemlibError, match="normalization"):
        acc.token_loss_weights([1, 2], "mean")
    with pytest.raises(MemlibError):
        acc.token_loss_weights([], "mean-per-micro-batch")
    with pytest.raises(MemlibError):
        acc.normalization_error([3, 0])
    with pytest.raises(MemlibError, match="divisible"):
        acc.grad_equivalence(batch_size=6, accumulation_steps=4)
    with pytest.raises(MemlibError, match="≥ 2"):
        acc.normalization_comparison([[1, 5]])
    with pytest.raises(MemlibError, match="world_size"):
        acc.ddp_allreduce_counts(world_size=1)


# ---------------------------------------------------------------- exactness (fp32)
@pytest.mark.parametrize("k", [2, 8])
def test_accumulated_gradients_equal_big_batch(k: int) -> None:
    r = acc.grad_equivalence(batch_size=8, seq_len=16, accumulation_steps=k)
    assert r.num_params > 100_000
    assert r.rel_error < 1e-5  # fp32 rounding only
    assert r.max_abs_diff < 1e-6 * max(1.0, r.grad_norm)


def test_variable_length_pitfall() -> None:
    r = acc.normalization_comparison([[60, 50], [12, 6]], seq_len=64)
    assert r.tokens_per_micro_batch == (108, 16)  # a causal LM predicts length − 1 tokens per sequence
    assert r.rel_error["sum-over-step-tokens"] < 1e-5
    assert r.rel_error["hf-num_items_in_batch"] < 1e-5
    assert r.loss["sum-over-step-tokens"] == pytest.approx(r.loss_big, rel=1e-6)
    assert r.rel_error["mean-per-micro-batch"] > 0.3  # wrong by far more than rounding
    assert abs(r.loss["mean-per-micro-batch"] - r.loss_big) > 1e-3


def test_equal_lengths_make_both_normalizations_right() -> None:
    r = acc.normalization_comparison([[20, 20], [20, 20]], seq_len=24)
    assert r.tokens_per_micro_batch == (38, 38)
    assert max(r.rel_error.values()) < 1e-5


def test_batchnorm_breaks_equivalence_layernorm_does_not() -> None:
    bn = acc.batchnorm_equivalence("batchnorm")
    ln = acc.batchnorm_equivalence("layernorm")
    assert bn.rel_error > 0.05 and bn.running_mean_diff > 1e-3
    assert ln.rel_error < 1e-5 and ln.running_mean_diff == 0.0
    assert acc.batchnorm_equivalence("batchnorm", accumulation_steps=1).rel_error < 1e-6


@pytest.mark.parametrize(("n", "k"), [(10, 4), (9, 4), (8, 4), (7, 3)])
def test_seed_004_last_partial_group_is_scaled_by_r_over_k(n: int, k: int) -> None:
    assert acc.partial_group_grad_ratio(n, k) == pytest.approx(acc.last_group_scale(n, k), rel=1e-5)


def test_gradient_noise_falls_like_one_over_k() -> None:
    noise = acc.gradient_noise((1, 4), draws=12, seq_len=16)
    assert 2.0 < noise[1] / noise[4] < 8.0  # 4 in expectation


# ---------------------------------------------------------------- memory, FLOPs
def test_peak_depends_on_micro_batch_not_on_k() -> None:
    peaks = {k: acc.trace_accumulation("gpt2", micro_batch_size=2, accumulation_steps=k, seq_len=128,
                                       overrides=SMALL_GPT2) for k in (1, 2, 4)}
    assert peaks[2].peak_bytes == peaks[4].peak_bytes
    # k = 1 with zero_grad(set_to_none=True): no gradients exist during the forward pass; from k = 2 on they do,
    # so k = 2 costs at most one more copy of the gradients, and nothing more from there on.
    assert 0 < peaks[2].peak_bytes - peaks[1].peak_bytes <= peaks[2].by_category["grads"]
    keep = acc.trace_accumulation("gpt2", micro_batch_size=2, accumulation_steps=1, seq_len=128,
                                  overrides=SMALL_GPT2, set_to_none=False)
    assert keep.peak_bytes == peaks[2].peak_bytes
    bigger = acc.trace_accumulation("gpt2", micro_batch_size=4, accumulation_steps=2, seq_len=128, overrides=SMALL_GPT2)
    assert bigger.peak_bytes > peaks[2].peak_bytes


def test_k1_trace_equals_trace_training() -> None:
    from memlib.measure.trace import trace_training

    a = acc.trace_accumulation("gpt2", micro_batch_size=2, accumulation_steps=1, seq_len=128, overrides=SMALL_GPT2)
    t = trace_training("gpt2", batch_size=2, seq_len=128, precision="bf16", optimizer="adamw", overrides=SMALL_GPT2)
    assert a.peak_bytes == t.peak_bytes


def test_accumulation_adds_no_matmul_flops() -> None:
    f = acc.accumulation_flops("gpt2", micro_batch_size=1, accumulation_steps=4, seq_len=64, overrides=SMALL_GPT2)
    assert f.accumulated == f.big_batch > 0
    assert f.accumulate_adds == 3 * f.num_params
    assert f.accumulate_adds / f.big_batch < 0.01


# ---------------------------------------------------------------- DDP (2 gloo processes)
def test_ddp_no_sync_cuts_allreduce_to_one_per_step() -> None:
    r = acc.ddp_allreduce_counts(accumulation_steps=4, timeout_s=300)  # a guard against a hang, not a timing
    k, b = 4, r.param_bytes
    assert b == 53_697 * 4
    assert r.bytes["sync-every-micro-step"] == k * b
    assert r.bytes["no_sync"] == b
    assert r.bytes["no_sync-backward-only"] == k * b  # the forward pass decides: no_sync must wrap it
    assert r.calls["sync-every-micro-step"] == k * r.calls["no_sync"] > 0
    assert r.max_rank_diff == 0.0  # ranks stay identical
    assert max(r.max_param_diff.values()) < 1e-6  # the same update, only fewer all-reduces


def test_ddp_run_times_out_instead_of_hanging(monkeypatch, expired_deadline) -> None:
    # the deadline itself is tested with blocked workers in test_distributed; here: a timeout reaches the caller
    # as TimeoutError and leaves no process behind
    import multiprocessing

    from memlib._book import ch05_gradient_accumulation_ddp as accumulation_ddp

    monkeypatch.setattr(accumulation_ddp, "join_with_deadline", expired_deadline)
    with pytest.raises(TimeoutError, match="DDP run did not finish within 5 s"):
        acc.ddp_allreduce_counts(timeout_s=5)
    assert not multiprocessing.active_children()


def test_memory_sweep_rows_are_json_ready() -> None:
    import json

    rows = acc.memory_sweep("gpt2", settings=((2, 1), (1, 2)), seq_len=64, overrides={"n_layer": 1})
    assert [(r["micro_batch_size"], r["accumulation_steps"]) for r in rows] == [(2, 1), (1, 2)]
    for r in rows:
        assert r["peak_bytes"] >= r["params_bytes"] + r["optimizer_bytes"] > 0
        assert r["peak_bytes"] == sum(v for key, v in r.items() if key.endswith("_bytes") and key != "peak_bytes")
    json.dumps(rows)


def test_find_free_port_is_bindable() -> None:
    import socket

    port = acc.find_free_port()
    assert 1024 <= port <= 65535
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", port))
