"""FlashAttention from scratch: exact tiled attention with online softmax, its backward, IO counts, memory (Chapter 10).

Three layers live here, all introduced in Chapter 10:

* **Reference and from-scratch kernels** (PyTorch, imported lazily): :func:`naive_attention` materializes the
  N×N scores and probabilities; :func:`flash_attention_forward` tiles queries and keys/values and keeps only a
  running max ``m`` and normalizer ``l`` per query row (online softmax), returning the output and the
  log-sum-exp; :func:`flash_attention_backward` recomputes the probabilities block by block from that
  log-sum-exp; :data:`FlashAttentionFn` wraps both as a ``torch.autograd.Function`` that saves only
  ``q, k, v, out, lse``.
* **IO accounting**: the pure half, :func:`flash_io_bytes` and :func:`standard_io_bytes` (HBM bytes read and
  written by Algorithm 1 and Algorithm 0 of the FlashAttention paper), lives in :mod:`memlib.core.flash` and is
  re-exported here; :func:`flash_forward_counted`
  and :func:`standard_forward_counted` run those algorithms on real tensors and count every load and store.
* **Memory measurement**: :func:`attention_peak_bytes` traces one forward + backward with
  :class:`memlib.measure.tracker.MemoryTracker` on the meta device (no memory used), on CPU or on CUDA.

``import memlib`` does not import this module; importing it does not import torch.
"""
from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING, Any

from ..core.errors import MemlibError, check_choice, check_positive
from ..core.flash import (AttentionIO, _first_row, attention_flops, flash_block_sizes, flash_io_bytes,
                          standard_io_bytes)
from .deps import require_torch

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = [
    "ATTENTION_IMPLS",
    "AttentionIO",
    "FlashAttentionFn",
    "attention_flops",
    "attention_peak_bytes",
    "flash_attention",
    "flash_attention_backward",
    "flash_attention_forward",
    "flash_block_sizes",
    "flash_forward_counted",
    "flash_io_bytes",
    "naive_attention",
    "standard_forward_counted",
    "standard_io_bytes",
]

#: Implementations :func:`attention_peak_bytes` can trace. ``naive``: :func:`naive_attention` under autograd;
#: ``flash``: :data:`FlashAttentionFn`; ``sdpa-math``/``sdpa-flash``/``sdpa-efficient``: PyTorch's
#: ``scaled_dot_product_attention`` restricted to one backend (``sdpa-efficient`` exists on CUDA only).
ATTENTION_IMPLS = ("naive", "flash", "sdpa-math", "sdpa-flash", "sdpa-efficient")
_DEVICES = ("meta", "cpu", "cuda")
_DTYPES = ("fp32", "bf16", "fp16")


def _torch() -> Any:
    return require_torch("memlib.measure.flash", " for this function")


# --------------------------------------------------------------------------------------------------------------
# Reference and from-scratch kernels
# --------------------------------------------------------------------------------------------------------------


def _check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[int, int, int, int]:
    """Validate (B, H, N, d) inputs of one shape, dtype and device; return (B, H, N, d)."""
    shapes = (tuple(q.shape), tuple(k.shape), tuple(v.shape))
    if q.dim() != 4 or shapes[0] != shapes[1] or shapes[0] != shapes[2]:
        raise MemlibError(
            f"q, k, v must share one shape (batch, heads, seq_len, head_dim); got q {shapes[0]}, k {shapes[1]}, "
            f"v {shapes[2]}"
        )
    if q.dtype != k.dtype or q.dtype != v.dtype:
        raise MemlibError(f"q, k, v must share one dtype; got {q.dtype}, {k.dtype}, {v.dtype}")
    if q.device != k.device or q.device != v.device:
        raise MemlibError(f"q, k, v must be on one device; got {q.device}, {k.device}, {v.device}")
    b, h, n, d = shapes[0]
    return b, h, n, d


def _scale(scale: float | None, head_dim: int) -> float:
    return 1.0 / math.sqrt(head_dim) if scale is None else float(scale)


def _acc_dtype(dtype: Any) -> Any:
    """Accumulation dtype: float32 for 16-bit inputs (as real kernels do), else the input dtype."""
    torch = _torch()
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def naive_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                    scale: float | None = None) -> torch.Tensor:
    """Standard attention: softmax(Q Kᵀ · scale) V, materializing the N×N scores and probabilities.

    Introduced in Chapter 10 as the reference. Under autograd it saves the N×N probabilities for the
    backward pass: memory O(N²) per head.

    Args:
        q: queries, shape (B, H, N, d).
        k: keys, shape (B, H, N, d).
        v: values, shape (B, H, N, d).
        causal: mask key j > query i (top-left aligned, as ``is_causal`` in PyTorch SDPA).
        scale: multiplier of the scores; default 1/√d.

    Returns:
        The output, shape (B, H, N, d), dtype of ``q``.
    """
    torch = _torch()
    _b, _h, n, d = _check_qkv(q, k, v)
    s = (q @ k.transpose(-2, -1)) * _scale(scale, d)  # (B, H, N, N) scores
    if causal:
        mask = torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1)  # (N, N) True above the diagonal
        s = s.masked_fill(mask, float("-inf"))
    p = torch.softmax(s, dim=-1)  # (B, H, N, N) probabilities
    return p @ v  # (B, H, N, d)


def _causal_mask(r0: int, n: int, j0: int, j1: int, device: Any) -> torch.Tensor:
    """(N − r0, B_c) mask, True where key column j (j0 ≤ j < j1) lies after query row i (r0 ≤ i < N)."""
    torch = _torch()
    return torch.arange(j0, j1, device=device) > torch.arange(r0, n, device=device)[:, None]


def flash_attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                            block_q: int = 64, block_k: int = 64,
                            scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """FlashAttention forward from scratch: tiles, online softmax, output and log-sum-exp only.

    Introduced in Chapter 10. Keys/values are split into T_c = ⌈N/B_c⌉ tiles and queries into T_r = ⌈N/B_r⌉
    tiles. The loop walks over key/value tiles; for each it computes the (B_r × B_c) score tile of every query
    tile, updates the running row max ``m`` and normalizer ``l`` and rescales the partial output by
    exp(m_old − m_new) (online softmax). The division by ``l`` happens once at the end (as FlashAttention-2
    does). Query tiles are independent of each other: a GPU runs them as parallel thread blocks, and here they
    run as one batched matmul over the rows, so the live temporaries are O(N·B_c), never N×N. ``block_q`` sets
    the granularity of causal skipping: a key tile visits only the query tiles that can see it. 16-bit inputs
    are accumulated in float32, as real kernels do.

    Args:
        q: queries, shape (B, H, N, d).
        k: keys, shape (B, H, N, d).
        v: values, shape (B, H, N, d).
        causal: mask key j > query i (top-left aligned, as ``is_causal`` in PyTorch SDPA).
        block_q: query tile size B_r.
        block_k: key/value tile size B_c.
        scale: multiplier of the scores; default 1/√d.

    Returns:
        ``(out, lse)``: output (B, H, N, d) in the dtype of ``q`` and the log-sum-exp of each row's scaled
        scores, (B, H, N), in the accumulation dtype (float32 for 16-bit inputs).
    """
    torch = _torch()
    b, h, n, d = _check_qkv(q, k, v)
    block_q = check_positive("block_q", block_q)
    block_k = check_positive("block_k", block_k)
    sc = _scale(scale, d)
    acc = _acc_dtype(q.dtype)
    qa = q.to(acc)  # (B, H, N, d)
    o = torch.zeros(b, h, n, d, dtype=acc, device=q.device)  # (B, H, N, d) unnormalized output
    m = torch.full((b, h, n), float("-inf"), dtype=acc, device=q.device)  # (B, H, N) running row max
    ell = torch.zeros(b, h, n, dtype=acc, device=q.device)  # (B, H, N) running row normalizer
    for j0 in range(0, n, block_k):
        j1 = min(j0 + block_k, n)
        kj, vj = k[:, :, j0:j1].to(acc), v[:, :, j0:j1].to(acc)  # (B, H, B_c, d)
        r0 = _first_row(j0, block_q, causal)  # query rows r0..N: the tiles that see this key tile
        s = (qa[:, :, r0:] @ kj.transpose(-2, -1)) * sc  # (B, H, N − r0, B_c): T_r − i0 score tiles
        if causal:
            s = s.masked_fill(_causal_mask(r0, n, j0, j1, q.device), float("-inf"))
        m_old = m[:, :, r0:]  # (B, H, N − r0)
        m_new = torch.maximum(m_old, s.amax(dim=-1))  # finite: key 0 is seen by every row in the first tile
        p = torch.exp(s - m_new[..., None])  # (B, H, N − r0, B_c) unnormalized probabilities
        alpha = torch.exp(m_old - m_new)  # (B, H, N − r0) rescales what was accumulated so far
        ell[:, :, r0:] = alpha * ell[:, :, r0:] + p.sum(dim=-1)
        o[:, :, r0:] = alpha[..., None] * o[:, :, r0:] + p @ vj
        m[:, :, r0:] = m_new
    out = o / ell[..., None]  # (B, H, N, d)
    lse = m + torch.log(ell)  # (B, H, N)
    return out.to(q.dtype), lse


def flash_attention_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                             lse: torch.Tensor, dout: torch.Tensor, causal: bool = False, block_q: int = 64,
                             block_k: int = 64, scale: float | None = None
                             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """FlashAttention backward from scratch: recompute the probabilities tile by tile from the log-sum-exp.

    Introduced in Chapter 10. With D = rowsum(dO ∘ O), for each key/value tile j and all query tiles that see
    it: P = exp(S − lse), dV_j = Pᵀ dO, dP = dO V_jᵀ, dS = P ∘ (dP − D), dQ += dS K_j · scale,
    dK_j = dSᵀ Q · scale. Nothing N×N is stored: live temporaries are O(N·B_c).

    Args:
        q: queries, shape (B, H, N, d).
        k: keys, shape (B, H, N, d).
        v: values, shape (B, H, N, d).
        out: forward output, shape (B, H, N, d).
        lse: forward log-sum-exp, shape (B, H, N).
        dout: gradient of the loss with respect to ``out``, shape (B, H, N, d).
        causal: mask key j > query i (as in the forward).
        block_q: query tile size B_r.
        block_k: key/value tile size B_c.
        scale: multiplier of the scores; default 1/√d.

    Returns:
        ``(dq, dk, dv)``, each (B, H, N, d) in the dtype of ``q``.
    """
    torch = _torch()
    b, h, n, d = _check_qkv(q, k, v)
    for name, t in (("out", out), ("dout", dout)):
        if tuple(t.shape) != (b, h, n, d):
            raise MemlibError(f"{name} must have shape {(b, h, n, d)} like q; got {tuple(t.shape)}")
    if tuple(lse.shape) != (b, h, n):
        raise MemlibError(f"lse must have shape {(b, h, n)}; got {tuple(lse.shape)}")
    block_q = check_positive("block_q", block_q)
    block_k = check_positive("block_k", block_k)
    sc = _scale(scale, d)
    acc = _acc_dtype(q.dtype)
    qa, doa, lsea = q.to(acc), dout.to(acc), lse.to(acc)  # (B, H, N, d), (B, H, N, d), (B, H, N)
    delta = (doa * out.to(acc)).sum(dim=-1)  # (B, H, N) D = rowsum(dO ∘ O)
    dq = torch.zeros(b, h, n, d, dtype=acc, device=q.device)  # (B, H, N, d)
    dk = torch.empty(b, h, n, d, dtype=acc, device=q.device)  # (B, H, N, d)
    dv = torch.empty(b, h, n, d, dtype=acc, device=q.device)  # (B, H, N, d)
    for j0 in range(0, n, block_k):
        j1 = min(j0 + block_k, n)
        kj, vj = k[:, :, j0:j1].to(acc), v[:, :, j0:j1].to(acc)  # (B, H, B_c, d)
        r0 = _first_row(j0, block_q, causal)
        qi, doi = qa[:, :, r0:], doa[:, :, r0:]  # (B, H, N − r0, d)
        s = (qi @ kj.transpose(-2, -1)) * sc  # (B, H, N − r0, B_c) recomputed scores
        p = torch.exp(s - lsea[:, :, r0:, None])  # (B, H, N − r0, B_c) recomputed probabilities
        if causal:
            p = p.masked_fill(_causal_mask(r0, n, j0, j1, q.device), 0.0)
        dv[:, :, j0:j1] = p.transpose(-2, -1) @ doi  # (B, H, B_c, d) Pᵀ dO
        dp = doi @ vj.transpose(-2, -1)  # (B, H, N − r0, B_c) dO Vᵀ
        ds = p * (dp - delta[:, :, r0:, None])  # (B, H, N − r0, B_c) P ∘ (dP − D)
        dq[:, :, r0:] += (ds @ kj) * sc  # (B, H, N − r0, d)
        dk[:, :, j0:j1] = (ds.transpose(-2, -1) @ qi) * sc  # (B, H, B_c, d)
    return dq.to(q.dtype), dk.to(q.dtype), dv.to(q.dtype)


@functools.cache
def _flash_fn_class() -> type[torch.autograd.Function]:
    _torch()
    from torch.autograd import Function

    class FlashAttentionFn(Function):
        """FlashAttention as an autograd Function: saves only q, k, v, out and the log-sum-exp.

        Introduced in Chapter 10. Call ``FlashAttentionFn.apply(q, k, v, causal, block_q, block_k, scale)``
        or :func:`flash_attention`. Gradients flow to q, k and v only (first order).
        """

        @staticmethod
        def forward(ctx: Any, q: Any, k: Any, v: Any, causal: bool = False, block_q: int = 64,
                    block_k: int = 64, scale: float | None = None) -> Any:
            out, lse = flash_attention_forward(q, k, v, causal, block_q, block_k, scale)
            ctx.save_for_backward(q, k, v, out, lse)
            ctx.settings = (causal, block_q, block_k, scale)
            return out

        @staticmethod
        def backward(ctx: Any, dout: Any) -> tuple[Any, ...]:
            q, k, v, out, lse = ctx.saved_tensors
            causal, block_q, block_k, scale = ctx.settings
            dq, dk, dv = flash_attention_backward(q, k, v, out, lse, dout.contiguous(), causal, block_q,
                                                  block_k, scale)
            return dq, dk, dv, None, None, None, None

    return FlashAttentionFn


def __getattr__(name: str) -> Any:
    # FlashAttentionFn subclasses torch.autograd.Function, so it is built on first access: the pure-Python
    # IO functions of this module stay usable without torch.
    if name == "FlashAttentionFn":
        return _flash_fn_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False, block_q: int = 64,
                    block_k: int = 64, scale: float | None = None) -> torch.Tensor:
    """Differentiable from-scratch FlashAttention: ``FlashAttentionFn.apply`` with keyword arguments.

    Introduced in Chapter 10.

    Args:
        q: queries, shape (B, H, N, d).
        k: keys, shape (B, H, N, d).
        v: values, shape (B, H, N, d).
        causal: mask key j > query i.
        block_q: query tile size B_r.
        block_k: key/value tile size B_c.
        scale: multiplier of the scores; default 1/√d.

    Returns:
        The output, shape (B, H, N, d).
    """
    return _flash_fn_class().apply(q, k, v, causal, block_q, block_k, scale)


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


# --------------------------------------------------------------------------------------------------------------
# Memory measurement
# --------------------------------------------------------------------------------------------------------------


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
    from .tracker import MemoryTracker

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
