"""Tests for Chapter 11's serving-memory core (memlib.core.inference), its figure/widget and its CPU measurements."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memlib import GB, GiB, MemlibError, load_config
from memlib.core.estimate import estimate_inference
from memlib.core.inference import (DEFAULT_CUDA_CONTEXT, GPU_MEMORY, KV_LAYOUTS, batch_context_frontier,
                                   forward_activation_bytes, kv_bytes_per_token, max_batch_size, max_seq_len,
                                   paged_kv_tokens, reserve_bytes, serving_fit)
from memlib._book.ch11_inference_memory import group_quant_bits

MODELS = ["llama-7b", "llama-2-70b", "llama-3-8b", "mistral-7b", "qwen2-0.5b", "gpt2", "gemma-2b"]
QUANTIZED = ["int8", "int4", "nf4"]


# --- KV cache per token -------------------------------------------------------------------------------------

def test_kv_per_token_tips_notes_example() -> None:
    # LLaMA-7B: 2 × 32 layers × 32 heads × 128 × 2 bytes = 0.5 MiB per token; × 2048 × 8 = the Tips notes' 8.6 GB
    assert kv_bytes_per_token("llama-7b") == 2 * 32 * 32 * 128 * 2 == 2**19
    est = estimate_inference("llama-7b", batch_size=8, seq_len=2048)
    assert est.kv_cache_bytes == kv_bytes_per_token("llama-7b") * 2048 * 8
    assert round(est.kv_cache_bytes / GB, 1) == 8.6


def test_kv_layouts() -> None:
    # Llama-2-70B: 64 query heads, 8 KV heads, 80 layers, head_dim 128
    mha, gqa, mqa = (kv_bytes_per_token("llama-2-70b", layout=x) for x in KV_LAYOUTS)
    assert (mha, gqa, mqa) == (2 * 80 * 64 * 128 * 2, 2 * 80 * 8 * 128 * 2, 2 * 80 * 1 * 128 * 2)
    assert kv_bytes_per_token("llama-2-70b") == gqa
    assert kv_bytes_per_token("llama-7b", layout="gqa", num_kv_heads=8) * 4 == kv_bytes_per_token("llama-7b")
    assert kv_bytes_per_token("llama-7b", "fp8") * 2 == kv_bytes_per_token("llama-7b", "fp16")


def test_kv_bad_input() -> None:
    with pytest.raises(MemlibError, match="num_kv_heads 5 must divide num_heads 32"):
        kv_bytes_per_token("llama-7b", layout="gqa", num_kv_heads=5)
    with pytest.raises(MemlibError, match="unknown KV layout 'mla'; expected one of: mha, gqa, mqa"):
        kv_bytes_per_token("llama-7b", layout="mla")
    with pytest.raises(MemlibError, match="unknown kv dtype 'int3'"):
        kv_bytes_per_token("llama-7b", "int3")


@settings(max_examples=40, deadline=None)
@given(model=st.sampled_from(MODELS), dtype=st.sampled_from(["fp32", "fp16", "bf16", "fp8"]),
       groups_exp=st.integers(0, 6))
def test_gqa_never_increases_kv(model: str, dtype: str, groups_exp: int) -> None:
    cfg = load_config(model)
    groups = 2**groups_exp
    if cfg.num_heads % groups:
        groups = 1
    mha = kv_bytes_per_token(cfg, dtype, layout="mha")
    gqa = kv_bytes_per_token(cfg, dtype, layout="gqa", num_kv_heads=groups)
    mqa = kv_bytes_per_token(cfg, dtype, layout="mqa")
    assert mqa <= gqa <= mha
    assert gqa * cfg.num_heads == mha * groups


# --- serving fit -------------------------------------------------------------------------------------------

def test_tips_notes_example_on_the_edge_of_24_gib() -> None:
    """The Tips notes §一: LLaMA-7B fp16, batch 8 × 2048 on a 24 GiB card (RTX 3090 = RTX 4090 = 25.77 GB)."""
    assert GPU_MEMORY["rtx-3090"] == GPU_MEMORY["rtx-4090"] == 24 * GiB
    whole = serving_fit("llama-7b", 24 * GiB, batch_size=8, seq_len=2048)  # all 16384 prompt tokens in one pass
    assert whole.total_bytes == (whole.weights_bytes + whole.kv_cache_bytes + whole.activation_bytes
                                 + whole.fragmentation_bytes + whole.cuda_context_bytes)
    assert whole.cuda_context_bytes == DEFAULT_CUDA_CONTEXT
    assert not whole.fits and -0.3 * GB < whole.headroom_bytes < 0
    assert max_batch_size("llama-7b", 24 * GiB, seq_len=2048) == 7
    chunked = serving_fit("llama-7b", 24 * GiB, batch_size=8, seq_len=2048, prefill_tokens=2048)
    assert chunked.fits and 1 * GB < chunked.headroom_bytes < 1.5 * GB
    assert max_batch_size("llama-7b", 24 * GiB, seq_len=2048, prefill_tokens=2048) == 9
    # the weights + KV of the Tips notes' example: 13.48 + 8.59 GB
    assert (round(whole.weights_bytes / GB, 2), round(whole.kv_cache_bytes / GB, 2)) == (13.48, 8.59)


def test_quantization_shrinks_weights_not_kv() -> None:
    ref = serving_fit("llama-7b", 24 * GiB, batch_size=8, seq_len=2048)
    for fmt in QUANTIZED:
        q = serving_fit("llama-7b", 24 * GiB, batch_size=8, seq_len=2048, weights=fmt)
        assert q.weights_bytes < ref.weights_bytes
        assert q.kv_cache_bytes == ref.kv_cache_bytes and q.activation_bytes == ref.activation_bytes
    w8 = serving_fit("llama-7b", 24 * GiB, weights="int8").weights_bytes
    w4 = serving_fit("llama-7b", 24 * GiB, weights="nf4").weights_bytes
    # int8 is half of fp16 on the matrices; embeddings/LM head stay 16-bit, so the whole model is a bit more
    assert 0.5 < w8 / ref.weights_bytes < 0.53
    assert 0.25 < w4 / ref.weights_bytes < 0.30


def test_max_seq_len_and_zero() -> None:
    s = max_seq_len("llama-7b", 24 * GiB, batch_size=8)
    assert serving_fit("llama-7b", 24 * GiB, batch_size=8, seq_len=s).fits
    assert not serving_fit("llama-7b", 24 * GiB, batch_size=8, seq_len=s + 1).fits
    assert max_seq_len("llama-2-70b", 24 * GiB) == 0  # 70B fp16 weights alone are 138 GB
    assert max_batch_size("llama-2-70b", 80 * GiB, seq_len=4096) == 0


def test_max_batch_limit() -> None:
    assert max_batch_size("gpt2", 80 * GiB, seq_len=16, limit=100) == 100


def test_frontier_monotone_in_context() -> None:
    pts = batch_context_frontier("llama-3-8b", 24 * GiB, [512, 1024, 2048, 4096, 8192], weights="int4")
    batches = [b for _, b in pts]
    assert batches == sorted(batches, reverse=True) and batches[0] > 0
    for s, b in pts:
        assert serving_fit("llama-3-8b", 24 * GiB, batch_size=b, seq_len=s, weights="int4").fits
        assert not serving_fit("llama-3-8b", 24 * GiB, batch_size=b + 1, seq_len=s, weights="int4").fits


@settings(max_examples=30, deadline=None)
@given(model=st.sampled_from(MODELS), mem_gib=st.integers(4, 160), extra_gib=st.integers(1, 80),
       seq_len=st.sampled_from([128, 1024, 4096, 32768]), weights=st.sampled_from(["fp16", "int8", "nf4"]),
       chunk=st.sampled_from([None, 2048]))
def test_more_memory_never_lowers_max_batch(model: str, mem_gib: int, extra_gib: int, seq_len: int,
                                            weights: str, chunk: int | None) -> None:
    kw = dict(seq_len=min(seq_len, load_config(model).max_positions), weights=weights, prefill_tokens=chunk)
    assert max_batch_size(model, (mem_gib + extra_gib) * GiB, **kw) >= max_batch_size(model, mem_gib * GiB, **kw)


@settings(max_examples=30, deadline=None)
@given(model=st.sampled_from(MODELS), mem_gib=st.integers(2, 160), seq_len=st.sampled_from([256, 2048, 8192]),
       fmt=st.sampled_from(QUANTIZED), ref=st.sampled_from(["fp32", "fp16", "bf16"]),
       kv=st.sampled_from(["fp16", "fp8"]))
def test_quantized_never_exceeds_unquantized(model: str, mem_gib: int, seq_len: int, fmt: str, ref: str,
                                             kv: str) -> None:
    seq_len = min(seq_len, load_config(model).max_positions)
    q = serving_fit(model, mem_gib * GiB, seq_len=seq_len, weights=fmt, kv_dtype=kv)
    u = serving_fit(model, mem_gib * GiB, seq_len=seq_len, weights=ref, kv_dtype=kv)
    assert q.weights_bytes <= u.weights_bytes and q.total_bytes <= u.total_bytes
    assert (max_batch_size(model, mem_gib * GiB, seq_len=seq_len, weights=fmt, kv_dtype=kv)
            >= max_batch_size(model, mem_gib * GiB, seq_len=seq_len, weights=ref, kv_dtype=kv))


def test_reserve_terms() -> None:
    # gated MLP: 3·T·f + 2·T·h elements in 16 bits, plus last-position logits in 16 bits and fp32
    cfg = load_config("llama-7b")
    assert forward_activation_bytes(cfg, 2048, 1) == 2048 * (3 * 11008 + 4 * 4096) * 2
    gpt2 = load_config("gpt2")  # tanh GELU: five T·f temporaries, counted beside two T·h
    assert forward_activation_bytes(gpt2, 1024, 2) == 1024 * (5 * 3072 + 2 * 768) * 2
    # few tokens and a large vocabulary: the last-position logits (after the layers) are the peak
    assert forward_activation_bytes("qwen2-0.5b", 4, 4) == 4 * 2 * 896 * 2 + 4 * 151936 * 6
    chunked = serving_fit("llama-7b", 24 * GiB, batch_size=8, seq_len=2048, prefill_tokens=2048)
    whole = serving_fit("llama-7b", 24 * GiB, batch_size=8, seq_len=2048)
    assert chunked.activation_bytes * 7 < whole.activation_bytes
    no_reserve = serving_fit("llama-7b", 24 * GiB, batch_size=8, seq_len=2048, cuda_context_bytes=0,
                             fragmentation=0.0)
    assert no_reserve.total_bytes == no_reserve.weights_bytes + no_reserve.kv_cache_bytes + no_reserve.activation_bytes
    with pytest.raises(MemlibError, match="fragmentation must be in"):
        serving_fit("llama-7b", 24 * GiB, fragmentation=1.5)
    with pytest.raises(MemlibError, match="gpu_memory_bytes must be an integer"):
        serving_fit("llama-7b", -1)


# --- quantization bits, paged KV ---------------------------------------------------------------------------

def test_group_quant_bits_match_memlib_formats() -> None:
    from memlib.core.dtypes import WEIGHT_FORMATS

    assert group_quant_bits(4, 64, 32) / 8 == WEIGHT_FORMATS["int4"]
    assert group_quant_bits(4, 128, 16, 4) == 4 + 20 / 128
    nf4_dq = 4 + 8 / 64 + 32 / (64 * 256)
    assert abs(nf4_dq / 8 - WEIGHT_FORMATS["nf4"]) < 1e-12


def test_paged_kv_tokens() -> None:
    assert paged_kv_tokens([1, 16, 17, 0], block_size=16) == 16 + 16 + 32 + 0
    assert paged_kv_tokens([], 16) == 0


@settings(max_examples=50, deadline=None)
@given(lens=st.lists(st.integers(0, 5000), max_size=50), block=st.sampled_from([1, 8, 16, 32]))
def test_paged_waste_below_one_block(lens: list[int], block: int) -> None:
    slots = paged_kv_tokens(lens, block)
    assert sum(lens) <= slots < sum(lens) + block * max(1, len(lens))


# --- figure and widget ---------------------------------------------------------------------------------------

def test_frontier_figure_and_widget_callback() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from memlib.viz.plots_inference import frontier_figure, serving_breakdown_figure
    from memlib.viz.widgets_inference import inference_view

    fig = frontier_figure("llama-2-7b", 24 * GiB, seq_lens=[1024, 2048, 4096, 8192], point=(2048, 8))
    ax = fig.axes[0]
    fp16 = next(line for line in ax.get_lines() if line.get_label() == "fp16 weights")
    assert list(fp16.get_xdata()) == [1024, 2048, 4096]  # 8192 is past Llama-2's 4,096 positions: left out
    assert list(fp16.get_ydata()) == [max_batch_size("llama-2-7b", 24 * GiB, seq_len=s) for s in (1024, 2048, 4096)]
    assert list(fp16.get_ydata()) == [15, 7, 3]
    assert any(line.get_label() == "max positions (4,096)" for line in ax.get_lines())
    plt.close(fig)
    fig = frontier_figure("llama-2-70b", 24 * GiB, formats=("fp16",), seq_lens=[2048])
    assert [t.get_text() for t in fig.axes[0].get_legend().get_texts()] == ["fp16 weights: do not fit",
                                                                           "max positions (4,096)"]
    plt.close(fig)
    fit = serving_fit("llama-7b", 24 * GiB, batch_size=8, seq_len=2048)
    fig = serving_breakdown_figure([fit], ["fp16"])
    heights = [p.get_height() for p in fig.axes[0].patches]
    assert abs(sum(heights) - fit.total_bytes / GB) < 1e-9
    plt.close(fig)
    limits, fig, verdict = inference_view("llama-7b", 24.0, "nf4", "fp8", 2048, 8)
    assert limits["max_batch"] == max_batch_size("llama-7b", 24 * GiB, seq_len=2048, weights="nf4", kv_dtype="fp8")
    assert f"largest batch is {limits['max_batch']}" in verdict
    plt.close(fig)
    with pytest.raises(MemlibError, match="unknown weight format"):
        inference_view("llama-7b", 24.0, "int3")
    limits, fig, verdict = inference_view("llama-7b", 24.0, "nf4", "fp8", 4096, 8)  # past LLaMA-1's 2,048
    assert limits["max_batch"] == 0 and "takes at most 2,048 tokens per sequence" in verdict
    plt.close(fig)


# --- measurements on CPU (torch, transformers, bitsandbytes) ------------------------------------------------

def test_dynamic_cache_bytes_equal_formula() -> None:
    pytest.importorskip("transformers")
    from memlib._book.ch11_inference_memory import measure_kv_cache

    rows = measure_kv_cache(kv_heads=(4, 1), batch_size=3, prompt_len=5, new_tokens=2, dtype="fp32")
    for r in rows:
        assert r["tokens"] == 7
        assert r["measured_bytes"] == r["formula_bytes"] == 2 * 2 * r["kv_heads"] * 32 * 7 * 3 * 4
    assert rows[0]["measured_bytes"] == 4 * rows[1]["measured_bytes"]


def test_bnb_int8_weights_measured() -> None:
    pytest.importorskip("bitsandbytes")
    from memlib._book.ch11_inference_memory import measure_int8_weights, tiny_llama_config

    cfg = tiny_llama_config(hidden_size=128, num_layers=1, num_heads=4, num_kv_heads=2, intermediate_size=256,
                            vocab_size=256)
    r = measure_int8_weights(cfg, batch_size=1, seq_len=8)
    # int8 codes: one byte per quantized weight, plus one fp32 absmax per output row
    rows = (128 + 64 + 64 + 128) + (256 + 256 + 128)  # output rows of q, k, v, o and gate, up, down
    assert r["int8_layer_weight_bytes"] == r["quantized_params"]
    assert r["int8_layer_scale_bytes"] == 4 * rows
    assert r["int8_model_bytes"] == r["estimate_int8_bytes"] + r["int8_layer_scale_bytes"]
    assert r["fp16_model_bytes"] == r["estimate_fp16_bytes"] < r["int8_model_bytes"] * 2
    assert r["max_code_diff"] <= 1 and r["codes_equal_fraction"] > 0.95
    assert 0 < r["relative_error"] < 0.05


def test_measure_serving_on_cpu() -> None:
    pytest.importorskip("transformers")
    from memlib._book.ch11_inference_memory import measure_serving, tiny_llama_config

    cfg = tiny_llama_config(num_kv_heads=2)
    r = measure_serving(cfg, device="cpu", batch_size=2, prompt_len=6, new_tokens=3, dtype="fp32")
    assert r["tokens"] == 9 and r["max_memory_allocated"] is None
    assert r["weights_allocated_bytes"] == r["estimate_weights_bytes"]
    assert r["kv_cache_bytes"] == r["formula_kv_bytes"] == 2 * 2 * 2 * 32 * 9 * 2 * 4
    with pytest.raises(MemlibError, match="unknown device 'tpu'"):
        measure_serving(cfg, device="tpu")


@pytest.mark.parametrize("model,batch,seq", [("llama-7b", 2, 512), ("llama-3-8b", 1, 1024), ("gpt2", 4, 256),
                                             ("qwen2-0.5b", 2, 512), ("qwen2-0.5b", 4, 128), ("gemma-2b", 1, 512)])
def test_activation_formula_vs_trace(model: str, batch: int, seq: int) -> None:
    pytest.importorskip("transformers")
    from memlib._book.ch11_inference_memory import measure_forward_peak

    traced = measure_forward_peak(model, batch_size=batch, seq_len=seq)
    est = forward_activation_bytes(model, batch * seq, batch)
    if model.startswith("gpt2"):
        assert 0 <= est / traced - 1 < 0.05
    else:
        assert abs(est / traced - 1) < 0.02


def test_sequence_limit_and_tensor_parallel() -> None:
    # memory would allow far more than 2,048 tokens of LLaMA-1 with int4 weights; the model allows 2,048
    assert max_seq_len("llama-7b", 80 * GiB, weights="nf4") == 2048
    with pytest.raises(MemlibError, match="seq_len 4,096 exceeds llama-7b's maximum of 2,048 positions"):
        serving_fit("llama-7b", 80 * GiB, seq_len=4096)
    with pytest.raises(MemlibError, match="exceeds llama-7b's maximum"):
        batch_context_frontier("llama-7b", 80 * GiB, [4096])
    one = serving_fit("llama-2-70b", 80 * GiB, batch_size=4, seq_len=4096)
    four = serving_fit("llama-2-70b", 80 * GiB, batch_size=4, seq_len=4096, tensor_parallel=4)
    assert four.weights_bytes == -(-one.weights_bytes // 4) and four.kv_cache_bytes == one.kv_cache_bytes // 4
    sixteen = serving_fit("llama-2-70b", 80 * GiB, batch_size=4, seq_len=4096, tensor_parallel=16)
    assert sixteen.kv_cache_bytes == one.kv_cache_bytes // 8  # 8 KV heads: replicated beyond 8 GPUs
    pp = serving_fit("llama-2-70b", 80 * GiB, batch_size=4, seq_len=4096, pipeline_parallel=3)
    assert pp.kv_cache_bytes == -(-one.kv_cache_bytes * 27 // 80)  # ceil(80 / 3) = 27 layers on a stage
    with pytest.raises(MemlibError, match="tensor_parallel 3 does not divide"):
        serving_fit("llama-2-70b", 80 * GiB, tensor_parallel=3)
    assert reserve_bytes(100 * GiB) == GiB + 5 * GiB
