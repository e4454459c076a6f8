"""Bytes per dtype, number-format facts and memory units: the one place these live (Chapters 1–2)."""
from __future__ import annotations

import re
from dataclasses import dataclass

from .errors import MemlibError, check_choice

__all__ = [
    "DTYPE_BYTES",
    "WEIGHT_FORMATS",
    "FloatFormat",
    "FLOAT_FORMATS",
    "GB",
    "GiB",
    "MB",
    "MiB",
    "dtype_bytes",
    "weight_bytes_per_param",
    "parse_size",
    "format_bytes",
]

GB = 10**9  #: decimal gigabyte (papers, the two source notes, datasheets)
GiB = 2**30  #: binary gibibyte (torch, nvidia-smi)
MB = 10**6
MiB = 2**20

#: Storage bytes per element for the dtypes the book uses. int4/nf4 pack two values per byte.
DTYPE_BYTES: dict[str, float] = {
    "fp32": 4,
    "tf32": 4,
    "fp16": 2,
    "bf16": 2,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "int8": 1,
    "int4": 0.5,
    "nf4": 0.5,
}

#: Weight formats for inference and the quantization overhead they carry, in bytes per parameter.
#: int8: one fp32 scale per output row is ignored here (≪ 1 %); int4/nf4: 4-bit values in blocks of 64
#: with one scale per block — fp32 absmax for plain int4 (0.5 bits/param), and for nf4 the QLoRA double
#: quantization (8-bit scales per block of 64, one fp32 per 256 blocks: 8/64 + 32/(64·256) bits/param).
WEIGHT_FORMATS: dict[str, float] = {
    "fp32": 4.0,
    "fp16": 2.0,
    "bf16": 2.0,
    "int8": 1.0,
    "int4": 0.5 + 4 / 64,
    "nf4": 0.5 + (8 / 64 + 32 / (64 * 256)) / 8,
}


@dataclass(frozen=True)
class FloatFormat:
    """Bit layout and range of a floating-point format (the table of Chapter 2).

    Attributes:
        name: short name (``"bf16"``).
        exponent_bits: bits of exponent.
        mantissa_bits: bits of stored mantissa (fraction).
        bias: exponent bias.
        max_normal: largest finite value.
        min_normal: smallest positive normal value.
        min_subnormal: smallest positive subnormal value.
        eps: machine epsilon, 2**-mantissa_bits.
        has_inf: whether the format encodes infinities (fp8 E4M3 does not).
    """

    name: str
    exponent_bits: int
    mantissa_bits: int
    bias: int
    max_normal: float
    min_normal: float
    min_subnormal: float
    eps: float
    has_inf: bool = True

    @property
    def bits(self) -> int:
        """Total width in bits (sign + exponent + mantissa)."""
        return 1 + self.exponent_bits + self.mantissa_bits


FLOAT_FORMATS: dict[str, FloatFormat] = {
    "fp32": FloatFormat("fp32", 8, 23, 127, 3.4028234663852886e38, 2.0**-126, 2.0**-149, 2.0**-23),
    "fp16": FloatFormat("fp16", 5, 10, 15, 65504.0, 2.0**-14, 2.0**-24, 2.0**-10),
    "bf16": FloatFormat("bf16", 8, 7, 127, 3.3895313892515355e38, 2.0**-126, 2.0**-133, 2.0**-7),
    "fp8_e4m3": FloatFormat("fp8_e4m3", 4, 3, 7, 448.0, 2.0**-6, 2.0**-9, 2.0**-3, has_inf=False),
    "fp8_e5m2": FloatFormat("fp8_e5m2", 5, 2, 15, 57344.0, 2.0**-14, 2.0**-16, 2.0**-2),
}


def dtype_bytes(dtype: str) -> float:
    """Bytes per element of ``dtype`` (``"bf16"`` → 2; ``"nf4"`` → 0.5).

    Raises:
        MemlibError: for an unknown dtype, listing the valid ones.
    """
    check_choice("dtype", dtype, DTYPE_BYTES)
    return DTYPE_BYTES[dtype]


def weight_bytes_per_param(fmt: str) -> float:
    """Bytes per parameter of weights stored in ``fmt``, quantization constants included (Chapter 1)."""
    check_choice("weight format", fmt, WEIGHT_FORMATS)
    return WEIGHT_FORMATS[fmt]


_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": MB, "gb": GB, "tb": 10**12, "kib": 2**10, "mib": MiB, "gib": GiB, "tib": 2**40}


def parse_size(text: str) -> int:
    """Parse a memory size such as ``"80GB"``, ``"24 GiB"`` or ``"1e9"`` into bytes.

    Raises:
        MemlibError: if the text is not a positive number with an optional unit.
    """
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][0-9]+)?)\s*([A-Za-z]*)\s*", str(text))
    unit = m.group(2).lower() if m else ""
    if not m or unit not in _UNITS:
        raise MemlibError(f"bad memory size {text!r}; expected a number with one of the units: B, GB, GiB, MB, MiB, TB")
    value = float(m.group(1)) * _UNITS[unit]
    if value <= 0:
        raise MemlibError(f"memory size must be positive, got {text!r}")
    return int(value)


def format_bytes(n: int | float, unit: str = "GB", digits: int = 2) -> str:
    """Format a byte count in one unit: ``format_bytes(112e9) == "112.00 GB"``."""
    scale = {"B": 1, "MB": MB, "MiB": MiB, "GB": GB, "GiB": GiB}
    if unit not in scale:
        raise MemlibError(f"unknown unit {unit!r}; expected one of: {', '.join(scale)}")
    return f"{n / scale[unit]:.{digits}f} {unit}"
