"""Chapter 10's book helpers: FlashAttention's HBM traffic counted on real tensors, attention memory traced.

Book helpers (moved from ``memlib.measure.flash``): only Chapter 10 uses them. :func:`flash_forward_counted` and
:func:`standard_forward_counted` run Algorithm 1 and Algorithm 0 of the FlashAttention paper on real tensors and
count every load and store (the formulas are :mod:`memlib.core.flash`); :func:`attention_peak_bytes` traces one
forward + backward with :class:`memlib.measure.tracker.MemoryTracker` on the meta device, on CPU or on CUDA.
torch is imported lazily, inside the functions.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from ..core.choices import MODEL_DTYPES
from ..core.errors import MemlibError, check_choice, check_positive
from ..core.flash import AttentionIO, flash_block_sizes, flash_io_bytes, standard_io_bytes
from ..measure.flash import _acc_dtype, _check_qkv, _scale, _torch, flash_attention, naive_attention

if TYPE_CHECKING:  # pragma: no cover
    import torch


#: Implementations :func:`attention_peak_bytes` can trace. ``naive``: :func:`naive_attention` under autograd;
#: ``flash``: :data:`FlashAttentionFn`; ``sdpa-math``/``sdpa-flash``/``sdpa-efficient``: PyTorch's
#: ``scaled_dot_product_attention`` restricted to one backend (``sdpa-efficient`` exists on CUDA only).
ATTENTION_IMPLS = ("naive", "flash", "sdpa-math", "sdpa-flash", "sdpa-efficient")
_DEVICES = ("meta", "cpu", "cuda")
_DTYPES = MODEL_DTYPES


class _HBM:
    """Counts the bytes moved between "HBM" (full tensors) and "SRAM" (tile copies)."""

    def __init__(self) -> None:
        self.read = 0
        self.written = 0

    def load(self, t: torch.Tensor, elem_bytes: int | None = None) -> torch.Tensor:
        self.read += t.numel() * (elem_bytes or t.element_size())
        return t.clone()

    def store(self, dst: torch.Tensor, src: torch.Tensor, elem_bytes: int | None = None) -> None:
        self.written += src.numel() * (elem_bytes or dst.element_size())
        dst.copy_(src)


def flash_forward_counted(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sram_elems: int,
                          causal: bool = False, scale: float | None = None, stats_bytes: int = 4
                          ) -> tuple[torch.Tensor, torch.Tensor, AttentionIO]:
    """Algorithm 1 of the FlashAttention paper, line by line, counting every HBM load and store.

    Introduced in Chapter 10. Outer loop over key/value tiles, inner loop over query tiles; O, ℓ and m live in
    "HBM" (full tensors) and each tile is copied to "SRAM" (a clone) and back, counted in bytes: Q, K, V, O at the
    element size of ``q``, ℓ and m at ``stats_bytes``. Slow (a Python double loop): for small N only. The count
    equals :func:`flash_io_bytes` with ``dtype_bytes=q.element_size()``.

    Args:
        q: queries, shape (B, H, N, d).
        k: keys, shape (B, H, N, d).
        v: values, shape (B, H, N, d).
        sram_elems: SRAM size M in elements (sets B_r and B_c).
        causal: mask key j > query i and skip fully masked tiles.
        scale: multiplier of the scores; default 1/√d.
        stats_bytes: bytes counted per element of ℓ and m.

    Returns:
        ``(out, lse, io)``: output (B, H, N, d), log-sum-exp (B, H, N) and the counted traffic.
    """
    torch = _torch()
    b, h, n, d = _check_qkv(q, k, v)
    b_r, b_c = flash_block_sizes(sram_elems, d)
    sb = check_positive("stats_bytes", stats_bytes)
    sc = _scale(scale, d)
    acc = _acc_dtype(q.dtype)
    hbm = _HBM()
    o = torch.empty(b, h, n, d, dtype=q.dtype, device=q.device)  # (B, H, N, d) in HBM
    ell = torch.empty(b, h, n, dtype=acc, device=q.device)  # (B, H, N) in HBM
    m = torch.empty(b, h, n, dtype=acc, device=q.device)  # (B, H, N) in HBM
    hbm.store(o, torch.zeros_like(o))
    hbm.store(ell, torch.zeros_like(ell), sb)
    hbm.store(m, torch.full_like(m, float("-inf")), sb)
    for j0 in range(0, n, b_c):
        j1 = min(j0 + b_c, n)
        kj = hbm.load(k[:, :, j0:j1]).to(acc)  # (B, H, B_c, d)
        vj = hbm.load(v[:, :, j0:j1]).to(acc)  # (B, H, B_c, d)
        for i0 in range(0, n, b_r):
            i1 = min(i0 + b_r, n)
            if causal and i1 - 1 < j0:
                continue  # every key of this tile lies after every query of this tile
            qi = hbm.load(q[:, :, i0:i1]).to(acc)  # (B, H, B_r, d)
            oi = hbm.load(o[:, :, i0:i1]).to(acc)  # (B, H, B_r, d)
            li = hbm.load(ell[:, :, i0:i1], sb)  # (B, H, B_r)
            mi = hbm.load(m[:, :, i0:i1], sb)  # (B, H, B_r)
            s = (qi @ kj.transpose(-2, -1)) * sc  # (B, H, B_r, B_c)
            if causal:
                mask = torch.arange(j0, j1, device=q.device) > torch.arange(i0, i1, device=q.device)[:, None]
                s = s.masked_fill(mask, float("-inf"))
            m_tile = s.amax(dim=-1)  # (B, H, B_r); −inf where a row sees no key of this tile
            p = torch.exp(s - torch.where(torch.isinf(m_tile), 0.0, m_tile)[..., None])  # (B, H, B_r, B_c)
            l_tile = p.sum(dim=-1)  # (B, H, B_r)
            m_new = torch.maximum(mi, m_tile)  # (B, H, B_r)
            a_old, a_tile = torch.exp(mi - m_new), torch.exp(m_tile - m_new)  # (B, H, B_r)
            l_new = a_old * li + a_tile * l_tile
            o_new = ((li * a_old)[..., None] * oi + a_tile[..., None] * (p @ vj)) / l_new[..., None]
            hbm.store(o[:, :, i0:i1], o_new.to(q.dtype))
            hbm.store(ell[:, :, i0:i1], l_new, sb)
            hbm.store(m[:, :, i0:i1], m_new, sb)
    lse = m + torch.log(ell)  # (B, H, N)
    return o, lse, AttentionIO(read_bytes=hbm.read, write_bytes=hbm.written, block_rows=b_r, block_cols=b_c)


def standard_forward_counted(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                             scale: float | None = None) -> tuple[torch.Tensor, AttentionIO]:
    """Algorithm 0 (standard attention) with S and P stored to "HBM", counting every load and store.

    Introduced in Chapter 10. The count equals :func:`standard_io_bytes` with ``dtype_bytes=q.element_size()``.

    Args:
        q: queries, shape (B, H, N, d).
        k: keys, shape (B, H, N, d).
        v: values, shape (B, H, N, d).
        causal: mask key j > query i (in the softmax pass; no traffic saved).
        scale: multiplier of the scores; default 1/√d.

    Returns:
        ``(out, io)``: output (B, H, N, d) and the counted traffic.
    """
    torch = _torch()
    b, h, n, d = _check_qkv(q, k, v)
    hbm = _HBM()
    s_hbm = torch.empty(b, h, n, n, dtype=q.dtype, device=q.device)  # (B, H, N, N)
    p_hbm = torch.empty_like(s_hbm)  # (B, H, N, N)
    o = torch.empty_like(q)  # (B, H, N, d)
    hbm.store(s_hbm, (hbm.load(q) @ hbm.load(k).transpose(-2, -1)) * _scale(scale, d))
    s = hbm.load(s_hbm)
    if causal:
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    hbm.store(p_hbm, torch.softmax(s, dim=-1))
    hbm.store(o, hbm.load(p_hbm) @ hbm.load(v))
    return o, AttentionIO(read_bytes=hbm.read, write_bytes=hbm.written)


def _sdpa(impl: str, device: str, q: Any, k: Any, v: Any, causal: bool) -> Any:
    """PyTorch SDPA restricted to one backend. On meta, dispatch always picks the math path, so ``sdpa-flash``
    calls the flash op directly (it has meta kernels): the trace then holds what the flash kernels hold."""
    torch = _torch()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if impl == "sdpa-flash" and device == "meta":
        out, _lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal)
        return out
    backend = {"sdpa-math": SDPBackend.MATH, "sdpa-flash": SDPBackend.FLASH_ATTENTION,
               "sdpa-efficient": SDPBackend.EFFICIENT_ATTENTION}[impl]
    with sdpa_kernel(backend):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)


def attention_peak_bytes(seq_len: int, impl: str, head_dim: int = 64, num_heads: int = 1, batch_size: int = 1,
                         dtype: str = "fp16", causal: bool = False, device: str = "meta", block_q: int = 64,
                         block_k: int = 64, seed: int = 0) -> int:
    """Peak live tensor bytes of one attention forward + backward, measured with MemoryTracker.

    Introduced in Chapter 10. Counts the inputs q, k, v and the output gradient (4·B·H·N·d elements), every
    tensor the forward saves or creates, and the backward's temporaries and gradients. On ``meta`` nothing is
    allocated, so N = 16k traces in a fraction of a second.

    Args:
        seq_len: N.
        impl: one of :data:`ATTENTION_IMPLS`.
        head_dim: d.
        num_heads: H.
        batch_size: B.
        dtype: ``fp32``, ``bf16`` or ``fp16``.
        causal: causal masking.
        device: ``meta``, ``cpu`` or ``cuda``.
        block_q: query tile size of ``flash``.
        block_k: key/value tile size of ``flash``.
        seed: seed of the random inputs (CPU and CUDA).

    Returns:
        Peak bytes.

    Limitations:
        The tracker sees tensors returned by operators. Workspace a fused kernel allocates inside itself is
        invisible: PyTorch's CPU flash kernel keeps per-thread tiles (q_split × kv_split scores and a
        q_split × d accumulator per thread) whose size does not grow with N. On CUDA compare with
        ``torch.cuda.max_memory_allocated``.
    """
    torch = _torch()
    from ..measure.tracker import MemoryTracker

    n = check_positive("seq_len", seq_len)
    d = check_positive("head_dim", head_dim)
    h = check_positive("num_heads", num_heads)
    b = check_positive("batch_size", batch_size)
    check_choice("impl", impl, ATTENTION_IMPLS)
    check_choice("dtype", dtype, _DTYPES)
    check_choice("device", device, _DEVICES)
    if impl == "sdpa-efficient" and device != "cuda":
        raise MemlibError(f"impl 'sdpa-efficient' needs device 'cuda', got {device!r}; on {device} expected one of: "
                          + ", ".join(i for i in ATTENTION_IMPLS if i != "sdpa-efficient"))
    torch_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    torch.manual_seed(seed)
    tracker = MemoryTracker(device)
    with tracker.mode(), tracker.forward():
        q, k, v = (torch.randn(b, h, n, d, dtype=torch_dtype, device=device).requires_grad_() for _ in range(3))
        dout = torch.randn(b, h, n, d, dtype=torch_dtype, device=device)  # (B, H, N, d)
        if impl == "naive":
            out = naive_attention(q, k, v, causal)
        elif impl == "flash":
            out = flash_attention(q, k, v, causal, block_q, block_k)
        else:
            out = _sdpa(impl, device, q, k, v, causal)
        with tracker.backward():
            grads = torch.autograd.grad(out, (q, k, v), dout)
        del out, grads
    return tracker.peak
