"""Chapter 3's book helpers: the spacing of a format's numbers (ulp) and the fraction of values that overflow it.

Book helpers (moved from ``memlib.core.formats``): only Chapter 3 uses them. Pure Python and numpy, no torch.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..core.formats import FORMAT_NAMES, _emin, _format, _round_unbounded

if TYPE_CHECKING:  # pragma: no cover
    from numpy.typing import ArrayLike


def ulp(x: ArrayLike, fmt: str) -> np.ndarray:
    """Spacing of ``fmt``'s numbers at ``x``: 2**(E − mantissa_bits) in the binade [2**E, 2**(E+1)).

    Introduced in Chapter 3 (update stagnation: ``w + u == w`` in fp16 once ``|u| < ulp(w) / 2``). Below the
    smallest normal number the spacing is the smallest subnormal; at 0 as well.

    Args:
        x: finite values.
        fmt: one of :data:`FORMAT_NAMES`.

    Returns:
        float64 array of spacings.
    """
    f = _format(fmt)
    a = np.abs(np.asarray(x, dtype=np.float64))
    _, e = np.frexp(a)
    e = np.where(a == 0, _emin(f) + 1, e)  # frexp(0) has exponent 0; 0 sits on the subnormal grid
    return np.ldexp(1.0, np.maximum(e - 1, _emin(f)) - f.mantissa_bits)


def overflow_fraction(values: ArrayLike, fmt: str, scale: float = 1.0) -> float:
    """Fraction of the finite ``values`` whose ``values * scale`` rounds beyond ``fmt``'s largest number.

    Introduced in Chapter 3. Such values become ±inf in fp16, bf16, fp32 and fp8_e5m2, and saturate to ±448
    in fp8_e4m3 (PyTorch's conversion).

    Args:
        values: e.g. all gradient entries of a model.
        fmt: one of :data:`FORMAT_NAMES`.
        scale: the loss scale applied before the cast.

    Returns:
        A fraction in [0, 1] (0.0 if there are no finite values).
    """
    f = _format(fmt)
    v = np.asarray(values, dtype=np.float64).ravel()
    v = v[np.isfinite(v)]
    if v.size == 0:
        return 0.0
    with np.errstate(over="ignore"):
        a = np.abs(np.asarray(v * scale, dtype=np.float32).astype(np.float64))
    r = np.where(np.isfinite(a), 0.0, np.inf)
    fin = np.isfinite(a)
    r[fin] = _round_unbounded(a[fin], f)
    return float(np.count_nonzero(r > f.max_normal) / v.size)
