"""FlashAttention, the pure half: HBM traffic of standard and tiled attention, tile sizes, FLOPs (Chapter 10).

No torch. :func:`flash_io_bytes` and :func:`standard_io_bytes` count the HBM bytes read and written by
Algorithm 1 and Algorithm 0 of the FlashAttention paper (Dao et al. 2022); :mod:`memlib.measure.flash` runs
the kernels from scratch and counts every load and store (``memlib._book.ch10_flash_attention.flash_forward_counted``), which agrees exactly.
"""
from __future__ import annotations

from dataclasses import dataclass

from .errors import check_positive

__all__ = ["AttentionIO", "attention_flops", "flash_block_sizes", "flash_io_bytes", "standard_io_bytes"]


def _first_row(j0: int, block_q: int, causal: bool) -> int:
    """First query row whose tile sees key column ``j0``: tiles above the diagonal are skipped when causal."""
    return (j0 // block_q) * block_q if causal else 0


@dataclass(frozen=True)
class AttentionIO:
    """HBM traffic of one attention forward pass. Introduced in Chapter 10.

    Attributes:
        read_bytes: bytes loaded from HBM.
        write_bytes: bytes stored to HBM.
        block_rows: query tile size B_r (0 for standard attention, which does not tile).
        block_cols: key/value tile size B_c (0 for standard attention).
    """

    read_bytes: int
    write_bytes: int
    block_rows: int = 0
    block_cols: int = 0

    @property
    def total_bytes(self) -> int:
        """Bytes read plus bytes written."""
        return self.read_bytes + self.write_bytes


def flash_block_sizes(sram_elems: int, head_dim: int) -> tuple[int, int]:
    """Tile sizes of Algorithm 1 of the FlashAttention paper for an SRAM of ``sram_elems`` elements.

    Introduced in Chapter 10. B_c = ⌈M / 4d⌉ (a K and a V tile fill half of the SRAM), B_r = min(B_c, d).

    Args:
        sram_elems: on-chip memory M, in elements.
        head_dim: head dimension d.

    Returns:
        ``(block_rows, block_cols)`` = (B_r, B_c).
    """
    m = check_positive("sram_elems", sram_elems)
    d = check_positive("head_dim", head_dim)
    b_c = -(-m // (4 * d))
    return min(b_c, d), b_c


def _visited_rows(seq_len: int, block_rows: int, block_cols: int, causal: bool) -> list[int]:
    """Query rows each key/value tile visits in Algorithm 1 (fully masked causal tiles skipped)."""
    return [seq_len - _first_row(j0, block_rows, causal) for j0 in range(0, seq_len, block_cols)]


def flash_io_bytes(seq_len: int, head_dim: int, sram_elems: int, dtype_bytes: int = 2, stats_bytes: int = 4,
                   causal: bool = False, batch_size: int = 1, num_heads: int = 1) -> AttentionIO:
    """HBM bytes read and written by Algorithm 1 of the FlashAttention paper (forward pass).

    Introduced in Chapter 10. Algorithm 1 initializes O, ℓ, m in HBM (writes Nd + 2N elements); for each of the
    T_c = ⌈N/B_c⌉ key/value tiles it loads K_j and V_j once, and for every query tile it loads Q_i, O_i, ℓ_i, m_i
    and stores O_i, ℓ_i, m_i. Non-causal total: 2Nd + T_c(3Nd + 4N) elements + the initialization, i.e.
    ≈ 12 N² d² / M for large N: Θ(N² d² M⁻¹) (Theorem 2). With ``causal``, fully masked tiles are skipped.
    Exactly what ``memlib._book.ch10_flash_attention.flash_forward_counted`` counts.

    Args:
        seq_len: N.
        head_dim: d.
        sram_elems: SRAM size M in elements; sets the tile sizes (:func:`flash_block_sizes`).
        dtype_bytes: bytes per element of Q, K, V, O (2 for fp16/bf16).
        stats_bytes: bytes per element of the row statistics ℓ and m (4: kernels keep them in fp32).
        causal: skip fully masked tiles.
        batch_size: B; the count is per (batch, head) times B·H.
        num_heads: H.

    Returns:
        The bytes read and written and the tile sizes.
    """
    n = check_positive("seq_len", seq_len)
    d = check_positive("head_dim", head_dim)
    heads = check_positive("batch_size", batch_size) * check_positive("num_heads", num_heads)
    b_r, b_c = flash_block_sizes(sram_elems, d)
    db, sb = check_positive("dtype_bytes", dtype_bytes), check_positive("stats_bytes", stats_bytes)
    rows = _visited_rows(n, b_r, b_c, causal)
    reads = 2 * n * d * db + sum(r * (2 * d * db + 2 * sb) for r in rows)  # K, V once; Q_i, O_i, ℓ_i, m_i
    writes = n * d * db + 2 * n * sb + sum(r * (d * db + 2 * sb) for r in rows)  # init; O_i, ℓ_i, m_i
    return AttentionIO(read_bytes=heads * reads, write_bytes=heads * writes, block_rows=b_r, block_cols=b_c)


def standard_io_bytes(seq_len: int, head_dim: int, dtype_bytes: int = 2, batch_size: int = 1,
                      num_heads: int = 1) -> AttentionIO:
    """HBM bytes read and written by standard attention (Algorithm 0 of the FlashAttention paper).

    Introduced in Chapter 10. S = QKᵀ (read Q, K; write S), P = softmax(S) (read S; write P), O = PV (read P, V;
    write O): reads 3Nd + 2N², writes Nd + 2N² elements: Θ(Nd + N²). A causal mask applied with the softmax
    changes nothing: the full S and P still go through HBM.

    Args:
        seq_len: N.
        head_dim: d.
        dtype_bytes: bytes per element (2 for fp16/bf16).
        batch_size: B.
        num_heads: H.

    Returns:
        The bytes read and written.
    """
    n = check_positive("seq_len", seq_len)
    d = check_positive("head_dim", head_dim)
    heads = check_positive("batch_size", batch_size) * check_positive("num_heads", num_heads)
    db = check_positive("dtype_bytes", dtype_bytes)
    reads = (3 * n * d + 2 * n * n) * db
    writes = (n * d + 2 * n * n) * db
    return AttentionIO(read_bytes=heads * reads, write_bytes=heads * writes)


def attention_flops(seq_len: int, head_dim: int, num_heads: int = 1, batch_size: int = 1, causal: bool = False,
                    backward: bool = False) -> float:
    """Matmul FLOPs of attention as the FlashAttention benchmarks count them.

    Introduced in Chapter 10. Forward: 4·N²·d·H·B (two N×N×d matmuls), halved if causal. Backward: 2.5× the
    forward (five matmuls instead of two; the recomputation of S is not counted as useful work).

    Args:
        seq_len: N.
        head_dim: d.
        num_heads: H.
        batch_size: B.
        causal: halve the count (half of the score matrix is masked).
        backward: return the backward FLOPs instead of the forward's.

    Returns:
        FLOPs as a float.
    """
    n = check_positive("seq_len", seq_len)
    fwd = 4.0 * n * n * check_positive("head_dim", head_dim) * check_positive("num_heads", num_heads)
    fwd *= check_positive("batch_size", batch_size)
    if causal:
        fwd /= 2
    return 2.5 * fwd if backward else fwd
