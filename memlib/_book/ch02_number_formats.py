"""Chapter 2's book helpers: decoding raw bit patterns and the table of format properties.

Book helpers (moved from ``memlib.core.formats``): only Chapter 2 uses them. Pure Python and numpy, no torch.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..core.errors import MemlibError
from ..core.formats import FORMAT_NAMES, FormatProperties, _emin, _format, format_properties

if TYPE_CHECKING:  # pragma: no cover
    from numpy.typing import ArrayLike


def from_bits(bits: ArrayLike, fmt: str) -> np.ndarray:
    """Decode bit patterns of ``fmt`` (unsigned or two's-complement signed integers) into float64.

    Introduced in Chapter 2. Every pattern decodes: in fp8_e4m3 only ``S.1111.111`` is NaN (``S.1111.000`` to
    ``S.1111.110`` are 256 … 448); in the other formats an all-ones exponent means ±inf (mantissa 0) or NaN.

    Args:
        bits: integer array; signed values are read as their two's-complement pattern of ``fmt``'s width
            (what ``tensor.view(torch.int16)`` gives).
        fmt: one of :data:`FORMAT_NAMES`.

    Returns:
        float64 array of the same shape.

    Raises:
        MemlibError: for a non-integer array or a value outside the format's width.
    """
    f = _format(fmt)
    b = np.asarray(bits)
    if b.dtype.kind not in "iu":
        raise MemlibError(f"bits must be an integer array, got dtype {b.dtype}; expected one of: uint8, uint16, uint32, int8, int16, int32")
    width = f.bits
    b64 = b.astype(np.int64)
    lo, hi = -(1 << (width - 1)), (1 << width) - 1
    if b64.size and (b64.min() < lo or b64.max() > hi):
        raise MemlibError(f"bit pattern {int(b64.min()) if b64.min() < lo else int(b64.max())} does not fit {fmt}; "
                          f"expected integers in {lo}..{hi}")
    u = (b64 & hi).astype(np.uint64)
    m, ne = f.mantissa_bits, f.exponent_bits
    sign = (u >> np.uint64(width - 1)) & np.uint64(1)
    exp = ((u >> np.uint64(m)) & np.uint64((1 << ne) - 1)).astype(np.int64)
    man = (u & np.uint64((1 << m) - 1)).astype(np.int64)
    val = np.where(exp == 0,
                   np.ldexp(man.astype(np.float64), _emin(f) - m),
                   np.ldexp((man + (1 << m)).astype(np.float64), exp - f.bias - m))
    top = exp == (1 << ne) - 1
    if f.has_inf:
        val = np.where(top, np.where(man == 0, np.inf, np.nan), val)
    else:
        val = np.where(top & (man == (1 << m) - 1), np.nan, val)
    return np.where(sign == 1, -val, val)


def properties_table() -> list[FormatProperties]:
    """:func:`format_properties` of every format, in the order of :data:`FORMAT_NAMES` (Chapter 2's table)."""
    return [format_properties(name) for name in FORMAT_NAMES]
