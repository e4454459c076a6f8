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
  re-exported here; ``flash_forward_counted`` and ``standard_forward_counted``, which run those algorithms on
  real tensors and count every load and store, are Chapter 10's book helpers
  (:mod:`memlib._book.ch10_flash_attention`).
* **Memory measurement**: ``attention_peak_bytes`` (also in :mod:`memlib._book.ch10_flash_attention`) traces one
  forward + backward with :class:`memlib.measure.tracker.MemoryTracker` on the meta device, on CPU or on CUDA.

``import memlib`` does not import this module; importing it does not import torch.
"""
from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING, Any

from ..core.errors import MemlibError, check_positive
from ..core.flash import (AttentionIO, _first_row, attention_flops, flash_block_sizes, flash_io_bytes,
                          standard_io_bytes)
from .deps import require_torch

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = [
    "AttentionIO",
    "FlashAttentionFn",
    "attention_flops",
    "flash_attention",
    "flash_attention_backward",
    "flash_attention_forward",
    "flash_block_sizes",
    "flash_io_bytes",
    "naive_attention",
    "standard_io_bytes",
]


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


# --------------------------------------------------------------------------------------------------------------
# Memory measurement
# --------------------------------------------------------------------------------------------------------------


