"""Tests of memlib.measure.flash: exactness, backward, autograd wrapper, IO counts and measured memory slopes (Chapter 10)."""
from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from memlib.core.errors import MemlibError
from memlib.measure.flash import (AttentionIO, FlashAttentionFn, attention_flops, flash_attention,
                                  flash_attention_backward, flash_attention_forward, flash_block_sizes, flash_io_bytes,
                                  naive_attention, standard_io_bytes)
from memlib._book.ch10_flash_attention import attention_peak_bytes, flash_forward_counted, standard_forward_counted

TOL = {torch.float64: 1e-6, torch.float32: 1e-5}


@pytest.fixture(autouse=True, scope="module")
def _one_thread():  # type: ignore[no-untyped-def]
    """Tiny tensors gain nothing from threads, and on a shared 2-core machine threads contend."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """Relative error ‖a − b‖ / ‖b‖ (0 when both are exactly zero, as dq and dk are for N = 1)."""
    err, size = float((a - b).norm()), float(b.norm())
    return err / size if size else err


def _qkv(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, dtype=dtype, generator=g) for _ in range(3)]


shapes = st.tuples(st.integers(1, 2), st.integers(1, 2), st.integers(1, 70), st.integers(1, 16))  # (B, H, N, d)


@settings(max_examples=40, deadline=None)
@given(shape=shapes, block_q=st.integers(1, 32), block_k=st.integers(1, 32), causal=st.booleans(),
       dtype=st.sampled_from([torch.float64, torch.float32]), seed=st.integers(0, 2**16))
def test_forward_is_exact(shape: tuple[int, int, int, int], block_q: int, block_k: int, causal: bool,
                          dtype: torch.dtype, seed: int) -> None:
    q, k, v = _qkv(shape, dtype, seed)
    ref = naive_attention(q, k, v, causal)
    out, lse = flash_attention_forward(q, k, v, causal, block_q, block_k)
    assert out.shape == q.shape and out.dtype == dtype and lse.shape == shape[:3]
    assert _rel(out, ref) <= TOL[dtype]
    s = (q @ k.transpose(-2, -1)) / math.sqrt(shape[3])  # (B, H, N, N)
    if causal:
        s = s.masked_fill(torch.ones(shape[2], shape[2], dtype=torch.bool).triu(1), float("-inf"))
    assert _rel(lse, torch.logsumexp(s, dim=-1)) <= TOL[dtype]


@settings(max_examples=20, deadline=None)
@given(shape=st.tuples(st.integers(1, 2), st.integers(1, 2), st.integers(1, 48), st.integers(1, 16)),
       block_q=st.integers(1, 24), block_k=st.integers(2, 24), causal=st.booleans(),
       seed=st.integers(0, 2**16))
def test_backward_matches_autograd_of_reference(shape: tuple[int, int, int, int], block_q: int, block_k: int,
                                                causal: bool, seed: int) -> None:
    q, k, v = _qkv(shape, torch.float64, seed)
    dout = torch.randn(shape, dtype=torch.float64, generator=torch.Generator().manual_seed(seed + 1))
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    ref = torch.autograd.grad(naive_attention(*leaves, causal=causal), leaves, dout)
    out, lse = flash_attention_forward(q, k, v, causal, block_q, block_k)
    grads = flash_attention_backward(q, k, v, out, lse, dout, causal, block_q, block_k)
    for g, r in zip(grads, ref):
        assert _rel(g, r) <= 1e-6


def test_float32_tolerance_at_a_realistic_size() -> None:
    q, k, v = _qkv((1, 2, 300, 64), torch.float32, 0)
    for causal in (False, True):
        out, _ = flash_attention_forward(q, k, v, causal, block_q=64, block_k=48)
        assert _rel(out, naive_attention(q, k, v, causal)) <= 1e-5


@pytest.mark.parametrize("causal", [False, True])
def test_gradcheck_flash_attention_fn(causal: bool) -> None:
    q, k, v = (t.requires_grad_() for t in _qkv((1, 2, 7, 3), torch.float64, 1))
    assert torch.autograd.gradcheck(lambda a, b, c: FlashAttentionFn.apply(a, b, c, causal, 3, 2), (q, k, v))


def test_fn_saves_only_q_k_v_out_lse() -> None:
    saved: list[tuple[int, ...]] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(tuple(t.shape))
        return t

    q, k, v = (t.requires_grad_() for t in _qkv((2, 3, 40, 8), torch.float32, 2))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = flash_attention(q, k, v, causal=True, block_q=16, block_k=16)
    assert sorted(saved) == sorted([(2, 3, 40, 8)] * 4 + [(2, 3, 40)])
    out.sum().backward()
    assert q.grad is not None and q.grad.shape == q.shape


def test_half_precision_accumulates_in_float32() -> None:
    q, k, v = _qkv((1, 2, 96, 32), torch.float32, 3)
    out, lse = flash_attention_forward(q.half(), k.half(), v.half(), True, 32, 32)
    assert out.dtype == torch.float16 and lse.dtype == torch.float32
    assert _rel(out.float(), naive_attention(q, k, v, True)) < 2e-3


def test_bad_inputs_raise_memlib_error() -> None:
    q, k, v = _qkv((1, 1, 8, 4), torch.float32, 0)
    with pytest.raises(MemlibError, match=r"\(1, 1, 9, 4\)"):
        flash_attention_forward(q, k, torch.zeros(1, 1, 9, 4))
    with pytest.raises(MemlibError, match="block_k"):
        flash_attention_forward(q, k, v, block_k=0)
    with pytest.raises(MemlibError, match="expected one of: naive, flash"):
        attention_peak_bytes(64, "xformers")
    with pytest.raises(MemlibError, match="'sdpa-efficient' needs device 'cuda'"):
        attention_peak_bytes(64, "sdpa-efficient", device="cpu")


# ---- IO accounting -------------------------------------------------------------------------------------------


def test_block_sizes_follow_algorithm_1() -> None:
    assert flash_block_sizes(65536, 64) == (64, 256)  # B_c = ⌈M/4d⌉, B_r = min(B_c, d)
    assert flash_block_sizes(1000, 64) == (4, 4)
    with pytest.raises(MemlibError, match="sram_elems"):
        flash_block_sizes(0, 64)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("n", "d", "m"), [(64, 8, 256), (61, 16, 512), (50, 4, 2000)])
def test_counted_forward_equals_formula_and_is_exact(n: int, d: int, m: int, causal: bool) -> None:
    q, k, v = _qkv((1, 2, n, d), torch.float64, 4)
    out, lse, io = flash_forward_counted(q, k, v, m, causal)
    assert io == flash_io_bytes(n, d, m, dtype_bytes=8, stats_bytes=4, causal=causal, num_heads=2)
    assert _rel(out, naive_attention(q, k, v, causal)) <= 1e-12
    assert _rel(lse, flash_attention_forward(q, k, v, causal)[1]) <= 1e-12
    ref, io0 = standard_forward_counted(q, k, v, causal)
    assert io0 == standard_io_bytes(n, d, dtype_bytes=8, num_heads=2)
    assert _rel(ref, naive_attention(q, k, v, causal)) <= 1e-12


def test_standard_io_is_4nd_plus_4n2() -> None:
    n, d = 1024, 64
    assert standard_io_bytes(n, d, 2).total_bytes == 2 * (4 * n * d + 4 * n * n)
    assert standard_io_bytes(n, d, 2, batch_size=3, num_heads=5).total_bytes == 15 * 2 * (4 * n * d + 4 * n * n)


def test_flash_io_theorem_2_scaling() -> None:
    n, d = 8192, 64

    def dominant(m: int) -> int:  # the T_c·(3Nd·2 + 4N·4) term: total minus K, V reads and O, ℓ, m initialization
        return flash_io_bytes(n, d, m).total_bytes - (3 * n * d * 2 + 2 * n * 4)

    for m in (2**14, 2**15, 2**16):
        assert dominant(m) == 2 * dominant(2 * m)  # doubling M halves it
        approx = 12 * n**2 * d**2 / m * 2  # 12 N² d² / M elements of 2 bytes
        assert abs(dominant(m) - approx) / approx < 0.06  # the 4N·4 statistics term adds 16/(3d·2) ≈ 4 %
    assert flash_io_bytes(2 * n, d, 2**16).total_bytes / flash_io_bytes(n, d, 2**16).total_bytes == pytest.approx(
        4, rel=0.02)  # Θ(N²) in N, like standard attention, with a constant d²/M smaller
    ratio = standard_io_bytes(n, d).total_bytes / flash_io_bytes(n, d, 2**16).total_bytes
    assert 4 < ratio < 6  # ≈ M / (3d²) = 65536 / 12288 ≈ 5.3
    causal = flash_io_bytes(n, d, 2**16, causal=True).total_bytes
    assert 0.45 < causal / flash_io_bytes(n, d, 2**16).total_bytes < 0.55  # skipping masked tiles halves it


def test_attention_flops() -> None:
    assert attention_flops(2048, 64, 16) == 4 * 2048**2 * 64 * 16
    assert attention_flops(2048, 64, 16, causal=True) == 2 * 2048**2 * 64 * 16
    assert attention_flops(2048, 64, 16, batch_size=2, backward=True) == 2.5 * 2 * 4 * 2048**2 * 64 * 16


def test_attention_io_total() -> None:
    assert AttentionIO(3, 4).total_bytes == 7


# ---- measured memory -----------------------------------------------------------------------------------------


def test_memory_slopes_on_meta() -> None:
    ns = [512, 1024, 2048, 4096, 8192, 16384]

    def slope(impl: str) -> float:
        peaks = [attention_peak_bytes(n, impl, block_q=256, block_k=256) for n in ns]
        return float(np.polyfit(np.log(ns), np.log(peaks), 1)[0])

    assert abs(slope("naive") - 2) < 0.15
    assert abs(slope("flash") - 1) < 0.15
    assert abs(slope("sdpa-math") - 2) < 0.15
    assert abs(slope("sdpa-flash") - 1) < 0.15


def test_naive_holds_n_by_n_and_the_saving_grows_with_n() -> None:
    h = 4
    ratios = []
    for n in (2048, 4096):
        naive = attention_peak_bytes(n, "naive", num_heads=h)
        assert naive >= 2 * h * n * n * 2  # scores and probabilities of 2 bytes each, alive together
        ratios.append(naive / attention_peak_bytes(n, "flash", num_heads=h))
    assert ratios[0] > 3 and 1.8 < ratios[1] / ratios[0] < 2.1  # the saving is ∝ N


def test_meta_trace_equals_cpu_trace() -> None:
    for impl in ("naive", "flash", "sdpa-math", "sdpa-flash"):
        meta = attention_peak_bytes(128, impl, num_heads=2, dtype="fp32", causal=True, device="meta")
        cpu = attention_peak_bytes(128, impl, num_heads=2, dtype="fp32", causal=True, device="cpu")
        assert meta == cpu, impl


def test_imports_stay_light() -> None:
    code = ("import sys, memlib; assert 'memlib.measure.flash' not in sys.modules; import memlib.measure.flash; "
            "assert 'torch' not in sys.modules; memlib.measure.flash.flash_io_bytes(1024, 64, 4096)")
    subprocess.run([sys.executable, "-c", code], check=True)
