"""Floating-point formats bit by bit: encode, decode and round like PyTorch does (Chapter 2).

Pure numpy (the one-number functions :func:`encode`, :func:`decode` and :func:`format_properties` also run
without it, in the book's live calculator). Five formats, the keys of :data:`memlib.core.dtypes.FLOAT_FORMATS`: ``fp32``, ``fp16``, ``bf16``,
``fp8_e4m3`` (PyTorch's ``float8_e4m3fn``: no infinities, NaN only at ``S.1111.111``, max 448) and
``fp8_e5m2`` (IEEE-like, max 57344). Decoding raw bit patterns and the properties table (Chapter 2),
the ulp and the overflow fraction (Chapter 3) are book helpers (:mod:`memlib._book.ch02_number_formats`,
:mod:`memlib._book.ch03_mixed_precision`).

How PyTorch 2.13 converts a float64 tensor (``tensor.to(dtype)`` on the CPU), which
:func:`round_to_format` reproduces bit for bit:

* **Two roundings.** ``c10::Half``, ``c10::BFloat16`` and the float8 types are built from a C++ ``float``,
  so float64 is first rounded to float32 (round to nearest, ties to even), then the float32 is rounded to
  the target (ties to even again). Double rounding differs from one correct rounding only for values within
  half a float32 ulp of a tie of the target: ``1 + 2**-11 + 2**-40`` goes to fp16 1.0 (one rounding gives
  ``1 + 2**-10``). For random inputs that happens to about one value in 2**(24 − mantissa_bits) (fp16: 1 in
  16,384; bf16: 1 in 131,072). ``via_fp32=False`` gives the correctly rounded result instead.
* **Overflow.** fp32, fp16, bf16 and fp8_e5m2 overflow to ±inf as IEEE 754 says: a value whose rounding
  exceeds the largest finite number (fp16: from 65520 up, the tie above 65504 rounds to even = 2**16).
  fp8_e4m3 has no infinity; PyTorch 2.13 **saturates**: every finite value beyond 448 and ±inf convert to
  ±448 (the OCP spec's "saturating" mode). NaN stays NaN. Older PyTorch releases and ml_dtypes return NaN
  for ``|x| > 464`` (the non-saturating mode).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

try:
    import numpy as np
except ImportError:  # pragma: no cover (the browser: Pyodide without numpy; encode/decode/properties still work)
    np = None  # type: ignore[assignment]

from .dtypes import FLOAT_FORMATS, FloatFormat
from .errors import MemlibError, check_choice

__all__ = [
    "FORMAT_NAMES",
    "Bits",
    "FormatProperties",
    "encode",
    "decode",
    "round_to_format",
    "to_bits",
    "underflow_fraction",
    "format_properties",
    "BlockFormat",
    "BLOCK_FORMATS",
    "block_bytes_per_element",
]

#: The formats this module knows, in table order.
FORMAT_NAMES: tuple[str, ...] = tuple(FLOAT_FORMATS)

if TYPE_CHECKING:
    from numpy.typing import ArrayLike

_UINT: dict[int, type[np.unsignedinteger[Any]]] = {} if np is None else {8: np.uint8, 16: np.uint16, 32: np.uint32}
_INTEGERS: tuple[type, ...] = (int,) if np is None else (int, np.integer)


def _format(fmt: str) -> FloatFormat:
    """The :class:`FloatFormat` named ``fmt``, or a MemlibError listing the valid names."""
    check_choice("format", fmt, FORMAT_NAMES)
    return FLOAT_FORMATS[fmt]


def _emin(f: FloatFormat) -> int:
    """Unbiased exponent of the smallest normal number (also the exponent of the subnormals)."""
    return 1 - f.bias


def _nan_mantissa(f: FloatFormat) -> int:
    """Mantissa field of the NaN this module writes: the quiet NaN, or all ones for e4m3fn."""
    return (1 << (f.mantissa_bits - 1)) if f.has_inf else (1 << f.mantissa_bits) - 1


# --------------------------------------------------------------------------------------------- rounding
def _round_unbounded(a: np.ndarray, f: FloatFormat) -> np.ndarray:
    """Round finite non-negative float64 values ``a`` to ``f``'s grid, ties to even, ignoring the top.

    The grid spacing in the binade [2**E, 2**(E+1)) is 2**(E - mantissa_bits); below the smallest normal
    it stays 2**(emin - mantissa_bits) (subnormals). Scaling by a power of two is exact in float64, so
    ``rint(a / q) * q`` is the exactly rounded value; ``np.rint`` rounds halves to even.
    """
    out = np.zeros_like(a)
    nz = a > 0
    if np.any(nz):
        _, e = np.frexp(a[nz])  # a = m * 2**e, m in [0.5, 1)
        q_exp = np.maximum(e - 1, _emin(f)) - f.mantissa_bits  # exponent of the grid spacing
        with np.errstate(over="ignore"):
            out[nz] = np.ldexp(np.rint(np.ldexp(a[nz], -q_exp)), q_exp)
    return out


def _round_single(x: np.ndarray, f: FloatFormat) -> np.ndarray:
    """Correctly round float64 ``x`` to ``f`` once, with PyTorch's overflow rule for ``f``."""
    a = np.abs(x)
    finite = np.isfinite(a)
    r = np.where(finite, 0.0, a)  # ±inf → inf, NaN → NaN (sign restored below)
    r[finite] = _round_unbounded(a[finite], f)
    too_big = r > f.max_normal  # includes inf inputs
    r[too_big] = np.inf if f.has_inf else f.max_normal  # e4m3fn: saturate, as PyTorch 2.13 does
    return np.copysign(r, x)


def _round_scalar(x: float, f: FloatFormat) -> float:
    """:func:`_round_single` for one Python float, without numpy (the browser runs :func:`encode` through it).

    The same steps: the grid spacing 2**(max(E, emin) − mantissa_bits), ``round`` (ties to even) on the scaled
    value, then PyTorch's overflow rule; ``tests/test_formats.py`` checks it bit for bit against the array path.
    """
    if math.isnan(x):
        return x
    a = abs(x)
    if math.isinf(a):
        r = math.inf if f.has_inf else f.max_normal
    elif a == 0:
        r = 0.0
    else:
        _, e = math.frexp(a)  # a = m * 2**e, m in [0.5, 1)
        q_exp = max(e - 1, _emin(f)) - f.mantissa_bits
        try:
            r = math.ldexp(round(math.ldexp(a, -q_exp)), q_exp)
        except OverflowError:  # rounded up past float64's largest number
            r = math.inf
        if r > f.max_normal:
            r = math.inf if f.has_inf else f.max_normal
    return math.copysign(r, x)


def _pattern_scalar(value: float, fmt: str, via_fp32: bool) -> int:
    """:func:`to_bits` of one Python float, as an int, without numpy."""
    f = _format(fmt)
    r = _round_scalar(value, FLOAT_FORMATS["fp32"]) if via_fp32 else value
    if not (via_fp32 and fmt == "fp32"):
        r = _round_scalar(r, f)
    m, top = f.mantissa_bits, (1 << f.exponent_bits) - 1
    sign = 1 if math.copysign(1.0, r) < 0 else 0
    a = abs(r)
    if math.isnan(a):
        exp, man = top, _nan_mantissa(f)
    elif math.isinf(a):
        exp, man = top, 0
    elif a == 0:
        exp, man = 0, 0
    elif a < f.min_normal:
        exp, man = 0, int(math.ldexp(a, m - _emin(f)))
    else:
        _, e = math.frexp(a)
        exp, man = e - 1 + f.bias, int(math.ldexp(a, m - (e - 1))) - (1 << m)
    return (sign << (f.bits - 1)) | (exp << m) | man


def round_to_format(x: ArrayLike, fmt: str, *, via_fp32: bool = True) -> np.ndarray:
    """Round float64 values to ``fmt`` and return them as float64, bit-exact with PyTorch.

    Introduced in Chapter 2. ``round_to_format(x, "fp16")`` equals
    ``torch.tensor(x, dtype=torch.float64).to(torch.float16).double()`` for every float64 ``x`` (checked on
    10⁶ values per format in ``tests/test_formats.py``): round to nearest, ties to even, with subnormals,
    signed zeros, IEEE overflow to ±inf, saturation to ±448 for ``fp8_e4m3`` and NaN kept.

    Args:
        x: values (anything numpy turns into float64).
        fmt: one of :data:`FORMAT_NAMES`.
        via_fp32: round to float32 first, then to ``fmt`` (what PyTorch's CPU conversion does). With
            ``False`` the value is rounded once, correctly; the two differ only near ties of ``fmt``.

    Returns:
        float64 array of the same shape holding values representable in ``fmt``.

    Raises:
        MemlibError: for an unknown format.
    """
    f = _format(fmt)
    v = np.array(x, dtype=np.float64)
    if via_fp32:
        with np.errstate(over="ignore"):
            v = v.astype(np.float32).astype(np.float64)
        if fmt == "fp32":
            return v
    return _round_single(v, f)


def underflow_fraction(values: ArrayLike, fmt: str, scale: float = 1.0) -> float:
    """Fraction of the nonzero finite ``values`` that become zero when ``values * scale`` is cast to ``fmt``.

    Introduced in Chapter 3: gradients that flush to zero in fp16, without and with loss scaling. The
    product is taken in float64, then rounded as :func:`round_to_format` does.

    Args:
        values: e.g. all gradient entries of a model, in fp32.
        fmt: one of :data:`FORMAT_NAMES`.
        scale: the loss scale applied before the cast.

    Returns:
        A fraction in [0, 1] (0.0 if there are no nonzero finite values).
    """
    _format(fmt)
    v = np.asarray(values, dtype=np.float64).ravel()
    v = v[np.isfinite(v) & (v != 0)]
    if v.size == 0:
        return 0.0
    with np.errstate(over="ignore"):
        r = round_to_format(v * scale, fmt)
    return float(np.count_nonzero(r == 0) / v.size)


# ------------------------------------------------------------------------------------------------ bits
def to_bits(x: ArrayLike, fmt: str, *, via_fp32: bool = True) -> np.ndarray:
    """Round ``x`` to ``fmt`` and return the bit patterns as unsigned integers (uint8/uint16/uint32).

    Introduced in Chapter 2. Equal to ``tensor.to(dtype).view(torch.uint8 / int16 / int32)`` (as unsigned)
    for every non-NaN value. NaN is written as the quiet NaN with the input's sign (fp32 ``0x7FC00000``,
    fp16 ``0x7E00``, bf16 ``0x7FC0``, fp8_e5m2 ``0x7F``) and as ``S.1111.111`` in fp8_e4m3; PyTorch's NaN bit
    patterns vary with the code path, so compare NaNs as NaN.

    Args:
        x: values.
        fmt: one of :data:`FORMAT_NAMES`.
        via_fp32: as in :func:`round_to_format`.

    Returns:
        Unsigned integer array of the same shape.
    """
    f = _format(fmt)
    r = np.asarray(round_to_format(x, fmt, via_fp32=via_fp32))
    m = f.mantissa_bits
    sign = np.signbit(r).astype(np.uint64)
    a = np.abs(r)
    exp = np.zeros(a.shape, dtype=np.uint64)
    man = np.zeros(a.shape, dtype=np.uint64)
    sub = (a > 0) & (a < f.min_normal)
    man[sub] = np.ldexp(a[sub], m - _emin(f)).astype(np.uint64)
    norm = np.isfinite(a) & (a >= f.min_normal)
    _, e = np.frexp(a[norm])
    exp[norm] = (e - 1 + f.bias).astype(np.uint64)
    man[norm] = (np.ldexp(a[norm], m - (e - 1)) - (1 << m)).astype(np.uint64)
    special = ~np.isfinite(a)
    exp[special] = (1 << f.exponent_bits) - 1
    man[np.isnan(a)] = _nan_mantissa(f)
    out = (sign << np.uint64(f.bits - 1)) | (exp << np.uint64(m)) | man
    return out.astype(_UINT[f.bits])


# --------------------------------------------------------------------------------------- one number
@dataclass(frozen=True)
class Bits:
    """The encoding of one number in one format. Introduced in Chapter 2.

    Attributes:
        fmt: the format name.
        input: the value asked for.
        sign: sign bit (0 or 1).
        exponent: the biased exponent field, as stored.
        mantissa: the stored fraction field (without the implicit leading 1).
        bits: the bit pattern as a string of 0/1, sign first.
        value: the number the pattern decodes to (``input`` after rounding).
        kind: ``"normal"``, ``"subnormal"``, ``"zero"``, ``"inf"`` or ``"nan"``.
    """

    fmt: str
    input: float
    sign: int
    exponent: int
    mantissa: int
    bits: str
    value: float
    kind: str

    @property
    def grouped(self) -> str:
        """The bit string with spaces between sign, exponent and mantissa: ``"0 01111 0000000000"``."""
        f = FLOAT_FORMATS[self.fmt]
        return f"{self.bits[0]} {self.bits[1:1 + f.exponent_bits]} {self.bits[1 + f.exponent_bits:]}"

    @property
    def unbiased_exponent(self) -> int | None:
        """Exponent E with value = ±1.m × 2**E (normal) or ±0.m × 2**emin (subnormal); None for zero/inf/NaN."""
        f = FLOAT_FORMATS[self.fmt]
        if self.kind == "normal":
            return self.exponent - f.bias
        if self.kind == "subnormal":
            return _emin(f)
        return None

    @property
    def error(self) -> float:
        """Rounding error ``value − input`` (NaN if either is not finite)."""
        if not (math.isfinite(self.value) and math.isfinite(self.input)):
            return math.nan
        return self.value - self.input

    @property
    def relative_error(self) -> float:
        """``|value − input| / |input|`` (NaN for a zero or non-finite input)."""
        if self.input == 0 or not math.isfinite(self.error):
            return math.nan
        return abs(self.error) / abs(self.input)


def _kind(exponent: int, mantissa: int, f: FloatFormat) -> str:
    top = (1 << f.exponent_bits) - 1
    if exponent == 0:
        return "zero" if mantissa == 0 else "subnormal"
    if exponent == top:
        if f.has_inf:
            return "inf" if mantissa == 0 else "nan"
        if mantissa == (1 << f.mantissa_bits) - 1:
            return "nan"
    return "normal"


def encode(value: float, fmt: str, *, via_fp32: bool = True) -> Bits:
    """Round ``value`` to ``fmt`` and return its sign, exponent and mantissa fields.

    Introduced in Chapter 2. ``encode(0.1, "fp16").grouped == "0 01011 1001100110"``.

    Args:
        value: a number.
        fmt: one of :data:`FORMAT_NAMES`.
        via_fp32: as in :func:`round_to_format`.

    Returns:
        The :class:`Bits` of the rounded value.

    Raises:
        MemlibError: for an unknown format or a value that is not a real number.
    """
    f = _format(fmt)
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise MemlibError(f"cannot encode {value!r}; expected a real number") from None
    pattern = _pattern_scalar(v, fmt, via_fp32)  # = int(to_bits(v, fmt, via_fp32=via_fp32)), numpy-free
    m = f.mantissa_bits
    sign = pattern >> (f.bits - 1)
    exponent = (pattern >> m) & ((1 << f.exponent_bits) - 1)
    mantissa = pattern & ((1 << m) - 1)
    return Bits(fmt=fmt, input=v, sign=sign, exponent=exponent, mantissa=mantissa,
                bits=format(pattern, f"0{f.bits}b"), value=decode(sign, exponent, mantissa, fmt),
                kind=_kind(exponent, mantissa, f))


def decode(sign: int, exponent: int, mantissa: int, fmt: str) -> float:
    """The number with these fields: (−1)**sign × 1.mantissa × 2**(exponent − bias), or subnormal/special.

    Introduced in Chapter 2.

    Args:
        sign: 0 or 1.
        exponent: biased exponent field, 0 … 2**exponent_bits − 1.
        mantissa: fraction field, 0 … 2**mantissa_bits − 1.
        fmt: one of :data:`FORMAT_NAMES`.

    Returns:
        The value as a Python float (inf/NaN for the special patterns).

    Raises:
        MemlibError: for an unknown format or a field out of range.
    """
    f = _format(fmt)
    for name, val, hi in (("sign", sign, 1), ("exponent", exponent, (1 << f.exponent_bits) - 1),
                          ("mantissa", mantissa, (1 << f.mantissa_bits) - 1)):
        if isinstance(val, bool) or not isinstance(val, _INTEGERS) or not 0 <= int(val) <= hi:
            raise MemlibError(f"{name} field {val!r} out of range for {fmt}; expected an integer in 0..{hi}")
    kind = _kind(int(exponent), int(mantissa), f)
    s = -1.0 if sign else 1.0
    if kind == "nan":
        return math.nan
    if kind == "inf":
        return s * math.inf
    m = f.mantissa_bits
    if kind in ("zero", "subnormal"):
        return s * math.ldexp(int(mantissa), _emin(f) - m)
    return s * math.ldexp(int(mantissa) + (1 << m), int(exponent) - f.bias - m)


# ----------------------------------------------------------------------------------------- properties
@dataclass(frozen=True)
class FormatProperties:
    """Range and precision of a format, derived from its bit layout. Introduced in Chapter 2.

    Attributes:
        name: format name.
        bits: total width.
        exponent_bits: exponent field width.
        mantissa_bits: stored fraction width.
        bias: exponent bias.
        emin: exponent of the smallest normal number (1 − bias).
        emax: exponent of the largest finite number.
        max_normal: largest finite value (``torch.finfo(dtype).max``).
        min_normal: smallest positive normal value (``torch.finfo(dtype).tiny`` / ``smallest_normal``).
        min_subnormal: smallest positive value, 2**(emin − mantissa_bits).
        eps: spacing above 1.0, 2**−mantissa_bits (``torch.finfo(dtype).eps``).
        decimal_digits: (mantissa_bits + 1) × log10(2): significant decimal digits the significand carries.
        precision: ⌊−log10(eps)⌋, numpy's and torch's ``finfo`` "precision".
        resolution: 10**−precision (``torch.finfo(dtype).resolution``).
        has_inf: whether the format has infinities.
    """

    name: str
    bits: int
    exponent_bits: int
    mantissa_bits: int
    bias: int
    emin: int
    emax: int
    max_normal: float
    min_normal: float
    min_subnormal: float
    eps: float
    decimal_digits: float
    precision: int
    resolution: float
    has_inf: bool

    def as_dict(self) -> dict[str, Any]:
        """The fields as a dict (a table row)."""
        return asdict(self)


def format_properties(fmt: str) -> FormatProperties:
    """Range and precision of ``fmt``, computed from exponent width, mantissa width and bias.

    Introduced in Chapter 2. Without infinities (fp8_e4m3) the all-ones exponent holds finite numbers and
    only the all-ones mantissa there is NaN, so the largest value is 1.110₂ × 2**8 = 448.

    Args:
        fmt: one of :data:`FORMAT_NAMES`.

    Returns:
        The :class:`FormatProperties`; they agree with :data:`memlib.core.dtypes.FLOAT_FORMATS` and ``torch.finfo``.
    """
    f = _format(fmt)
    m, e = f.mantissa_bits, f.exponent_bits
    emin = 1 - f.bias
    if f.has_inf:
        emax = (1 << e) - 2 - f.bias
        max_normal = math.ldexp(2.0 - 2.0**-m, emax)
    else:
        emax = (1 << e) - 1 - f.bias
        max_normal = math.ldexp(2.0 - 2.0 ** -(m - 1), emax)
    eps = 2.0**-m
    precision = int(math.floor(-math.log10(eps)))
    return FormatProperties(
        name=fmt, bits=f.bits, exponent_bits=e, mantissa_bits=m, bias=f.bias, emin=emin, emax=emax,
        max_normal=max_normal, min_normal=math.ldexp(1.0, emin), min_subnormal=math.ldexp(1.0, emin - m),
        eps=eps, decimal_digits=(m + 1) * math.log10(2), precision=precision, resolution=10.0**-precision,
        has_inf=f.has_inf,
    )




# --- Block-scaled formats (Chapter 17): elements of a small float plus one shared scale per block -------------------

@dataclass(frozen=True)
class BlockFormat:
    """A block-scaled format: ``block`` elements of ``element_bits`` share one ``scale_bits`` scale.

    Attributes:
        name: the format's name (``mxfp8``).
        element: the element type (``fp8_e4m3``, ``fp4_e2m1``).
        element_bits: bits of one element.
        block: elements sharing one scale.
        scale: the scale's type (``e8m0``: a power of two, 8 bits; ``fp8_e4m3``; ``fp32``).
        scale_bits: bits of one scale.
        tensor_scale_bits: bits of one extra scale for the whole tensor (NVFP4's fp32), 0 if none.
        source: where the layout is defined.
    """

    name: str
    element: str
    element_bits: int
    block: int
    scale: str
    scale_bits: int
    tensor_scale_bits: int
    source: str

    def bytes_per_element(self, numel: int | None = None) -> float:
        """Bytes per element, the block scales included (and the tensor scale, for ``numel`` elements)."""
        per = (self.element_bits + self.scale_bits / self.block) / 8
        if numel and self.tensor_scale_bits:
            per += self.tensor_scale_bits / 8 / numel
        return per


#: The block formats of FP8/FP4 training and serving: the OCP Microscaling (MX) spec v1.0 (``ocp2023mx``: 32-element
#: blocks, an E8M0 scale), NVIDIA's NVFP4 (16-element blocks of E2M1 with an E4M3 scale and one fp32 scale per
#: tensor; the issue's "32-element blocks" holds for MXFP4, not NVFP4), and DeepSeek-V3's FP8 recipe (1×128 tiles of
#: activations and 128×128 blocks of weights, each with an fp32 scale; ``deepseekai2024v3``, §3.3).
BLOCK_FORMATS: dict[str, BlockFormat] = {
    "mxfp8": BlockFormat("mxfp8", "fp8_e4m3", 8, 32, "e8m0", 8, 0, "OCP MX v1.0"),
    "mxfp4": BlockFormat("mxfp4", "fp4_e2m1", 4, 32, "e8m0", 8, 0, "OCP MX v1.0"),
    "nvfp4": BlockFormat("nvfp4", "fp4_e2m1", 4, 16, "fp8_e4m3", 8, 32, "NVIDIA Blackwell NVFP4"),
    "fp8-1x128": BlockFormat("fp8-1x128", "fp8_e4m3", 8, 128, "fp32", 32, 0, "DeepSeek-V3 §3.3 (activations)"),
    "fp8-128x128": BlockFormat("fp8-128x128", "fp8_e4m3", 8, 128 * 128, "fp32", 32, 0, "DeepSeek-V3 §3.3 (weights)"),
}


def block_bytes_per_element(fmt: str, numel: int | None = None) -> float:
    """Bytes per element of a block format of :data:`BLOCK_FORMATS`, scales included (Chapter 17).

    ``mxfp8`` is (8 + 8/32)/8 = 1.03125 bytes, ``nvfp4`` (4 + 8/16)/8 = 0.5625 bytes (+ 4 bytes per tensor).

    Raises:
        MemlibError: an unknown format (one line naming it and the valid ones).
    """
    check_choice("block format", fmt, tuple(BLOCK_FORMATS))
    return BLOCK_FORMATS[fmt].bytes_per_element(numel)
