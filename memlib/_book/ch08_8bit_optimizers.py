"""Chapter 8's book helpers: bitsandbytes' linear quantization map and the bytes of 8-bit optimizer states.

Book helpers (moved from ``memlib.core.quant``): only Chapter 8 uses them. Pure Python and numpy, no torch; the
block-wise quantization they build on is :mod:`memlib.core.quant`.
"""
from __future__ import annotations

import numpy as np

from ..core.errors import MemlibError, check_choice, check_positive
from ..core.quant import _linspace32


def linear_map(signed: bool = True, total_bits: int = 8, add_zero: bool = True) -> np.ndarray:
    """The linear quantization map: evenly spaced values in [-1, 1] (or [0, 1]), 256 entries.

    Introduced in Chapter 8. Mirrors ``bitsandbytes.functional.create_linear_map``: with fewer than 8 bits,
    the unused entries are zeros in the middle of the table.

    Args:
        signed: values in [-1, 1] (else [0, 1]).
        total_bits: bits per code (1..8).
        add_zero: signed maps use 2^bits - 1 values so that 0 is exactly representable.

    Returns:
        A float32 array of 256 values.
    """
    bits = check_positive("total_bits", total_bits)
    if bits > 8:
        raise MemlibError(f"total_bits must be ≤ 8, got {bits}")
    total = 2**bits
    if add_zero or bits < 8:
        total = 2**bits if not signed else 2**bits - 1
    values = _linspace32(-1.0 if signed else 0.0, 1.0, total)
    gap = 256 - values.size
    if gap == 0:
        return values
    half = values.size // 2
    return np.concatenate([values[:half], np.zeros(gap, np.float32), values[half:]]).astype(np.float32)


def bits_per_param(bits: int, block_size: int, absmax_bits: int = 32) -> float:
    """Storage bits per parameter of block-wise quantization: the code plus the block's share of its absmax.

    Introduced in Chapter 8: 8-bit states with fp32 absmax per 256 → 8 + 32/256 = 8.125 bits.
    """
    check_positive("bits", bits)
    bs = check_positive("block_size", block_size)
    check_positive("absmax_bits", absmax_bits)
    return bits + absmax_bits / bs


def quant_state_bytes(numel: int, block_size: int = 256, states: int = 2, min_8bit_size: int = 4096) -> int:
    """Bytes of bitsandbytes 8-bit optimizer states for one parameter tensor of ``numel`` elements.

    Introduced in Chapter 8. Tensors with fewer than ``min_8bit_size`` elements keep fp32 states (4 bytes
    each); others keep 1 byte per element per state plus one fp32 absmax per block of ``block_size``
    (bitsandbytes 0.50: 256). The two 256-entry maps are shared by all tensors and not counted.

    Args:
        numel: elements of the parameter.
        block_size: the optimizer's block size.
        states: 2 for Adam (m, v), 1 for momentum.
        min_8bit_size: bitsandbytes' ``min_8bit_size`` (default 4096).

    Returns:
        Bytes.
    """
    n = check_positive("numel", numel)
    bs = check_positive("block_size", block_size)
    check_choice("states", states, (1, 2))
    if n < min_8bit_size:
        return 4 * n * states
    return states * (n + 4 * -(-n // bs))
