"""Block-wise quantization from scratch: 8-bit maps, absmax blocks, NF4 and double quantization (Chapters 8-9).

Pure numpy. The maps follow bitsandbytes (``create_linear_map``, ``create_dynamic_map``, ``create_normal_map``)
and the papers: 8-bit optimizers quantize Adam's states block by block with a *dynamic* (dynamic-tree) map
(Dettmers et al. 2022); QLoRA stores frozen weights in 4-bit NormalFloat (NF4) with one absmax per block of
64 and quantizes those absmax constants again to 8 bits (double quantization, Dettmers et al. 2023).
Quantizing a value means scaling it by its block's absmax into [-1, 1] and storing the index of the nearest
map value; dequantizing is ``code[index] * absmax``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .errors import MemlibError, check_choice, check_positive

__all__ = [
    "NF4_OFFSET",
    "QuantizedBlocks",
    "DoubleQuantized",
    "linear_map",
    "dynamic_map",
    "normal_ppf",
    "nf4_levels",
    "quantize_blockwise",
    "dequantize_blockwise",
    "quantize_nf4",
    "dequantize_nf4",
    "double_quantize_absmax",
    "dequantize_absmax",
    "nearest_code",
    "code_neighbours",
    "bits_per_param",
    "double_quant_bits_per_param",
    "quant_state_bytes",
]

#: The outermost quantile of NF4: norm.ppf(0.9677083) ≈ 1.848 standard deviations maps to ±1 (bitsandbytes).
NF4_OFFSET = 0.9677083


def _linspace32(start: float, end: float, steps: int) -> np.ndarray:
    """``torch.linspace(start, end, steps)`` in float32, as bitsandbytes builds its maps.

    torch rounds the step (end - start) / (steps - 1) to float32, fills the first half forward from the start
    and the second half back from the end; reproducing that keeps our maps bit-identical to theirs.
    """
    start32, end32 = np.float32(start), np.float32(end)
    if steps == 1:
        return np.array([start32], dtype=np.float32)
    step = np.float64(np.float32((end32 - start32) / np.float32(steps - 1)))
    idx = np.arange(steps, dtype=np.float64)
    out = np.where(idx < steps // 2, np.float64(start32) + step * idx, np.float64(end32) - step * (steps - 1 - idx))
    return out.astype(np.float32)


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


def dynamic_map(signed: bool = True, max_exponent_bits: int = 7, total_bits: int = 8) -> np.ndarray:
    """The dynamic (dynamic-tree) quantization map of 8-bit optimizers, 256 sorted float32 values.

    Introduced in Chapter 8. After the sign bit, a run of zeros gives the decimal exponent (10^-6 … 10^0) and an
    indicator bit ends it; the remaining bits are a linear fraction in [0.1, 1]. Small magnitudes thus get
    few fraction bits but a wide range, large ones many fraction bits (Dettmers et al. 2022, §2; Dettmers 2016).
    Mirrors ``bitsandbytes.functional.create_dynamic_map``: signed for Adam's m, unsigned for v.

    Args:
        signed: a sign bit (m) or not (v, which is never negative).
        max_exponent_bits: largest exponent run.
        total_bits: bits per code.

    Returns:
        A float32 array of 2^total_bits (padded with zeros to 256) sorted values, with 0 and 1.
    """
    e_bits = check_positive("max_exponent_bits", max_exponent_bits)
    bits = check_positive("total_bits", total_bits)
    data: list[float] = []
    non_sign_bits = bits - 1
    additional_items = 2 ** (non_sign_bits - e_bits) - 1
    i = 0
    for i in range(e_bits):
        n_fraction = 2 ** (i + non_sign_bits - e_bits) + 1 if signed else 2 ** (i + non_sign_bits - e_bits + 1) + 1
        bounds = _linspace32(0.1, 1.0, int(n_fraction))
        means = (bounds[:-1] + bounds[1:]) / np.float32(2.0)
        scale = np.float32(10.0 ** (-(e_bits - 1) + i))  # float32 arithmetic, as torch does it
        data += (scale * means).tolist()
        if signed:
            data += (-scale * means).tolist()
    if additional_items > 0:
        bounds = _linspace32(0.1, 1.0, additional_items + 1)
        means = (bounds[:-1] + bounds[1:]) / np.float32(2.0)
        scale = np.float32(10.0 ** (-(e_bits - 1) + i))  # float32 arithmetic, as torch does it
        data += (scale * means).tolist()
        if signed:
            data += (-scale * means).tolist()
    data += [0.0, 1.0]
    if len(data) != 2**bits:
        raise MemlibError(f"dynamic map with max_exponent_bits={e_bits}, total_bits={bits} has {len(data)} values")
    data += [0.0] * (256 - len(data))
    return np.sort(np.array(data, dtype=np.float32))


# Acklam's rational approximation of the normal quantile (relative error < 1.2e-9), refined below.
_A = (-3.969683028665376e01, 2.209460984245205e02, -2.759285104469687e02, 1.383577518672690e02,
      -3.066479806614716e01, 2.506628277459239e00)
_B = (-5.447609879822406e01, 1.615858368580409e02, -1.556989798598866e02, 6.680131188771972e01,
      -1.328068155288572e01)
_C = (-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e00, -2.549732539343734e00,
      4.374664141464968e00, 2.938163982698783e00)
_D = (7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e00, 3.754408661907416e00)


def _ppf_scalar(p: float) -> float:
    if not 0.0 < p < 1.0:
        raise MemlibError(f"normal quantile needs 0 < p < 1, got {p!r}")
    lo = 0.02425
    if p < lo:
        q = math.sqrt(-2 * math.log(p))
        x = (((((_C[0] * q + _C[1]) * q + _C[2]) * q + _C[3]) * q + _C[4]) * q + _C[5]) / \
            ((((_D[0] * q + _D[1]) * q + _D[2]) * q + _D[3]) * q + 1)
    elif p <= 1 - lo:
        q = p - 0.5
        r = q * q
        x = (((((_A[0] * r + _A[1]) * r + _A[2]) * r + _A[3]) * r + _A[4]) * r + _A[5]) * q / \
            (((((_B[0] * r + _B[1]) * r + _B[2]) * r + _B[3]) * r + _B[4]) * r + 1)
    else:
        q = math.sqrt(-2 * math.log1p(-p))
        x = -(((((_C[0] * q + _C[1]) * q + _C[2]) * q + _C[3]) * q + _C[4]) * q + _C[5]) / \
            ((((_D[0] * q + _D[1]) * q + _D[2]) * q + _D[3]) * q + 1)
    for _ in range(2):  # Halley steps on Φ(x) - p, with Φ from math.erfc (double precision)
        err = 0.5 * math.erfc(-x / math.sqrt(2)) - p
        u = err * math.sqrt(2 * math.pi) * math.exp(x * x / 2)
        x = x - u / (1 + x * u / 2)
    return x


def normal_ppf(p: float | np.ndarray) -> np.ndarray:
    """Quantile function (inverse CDF) of the standard normal, to double precision, without scipy.

    Introduced in Chapter 9 (NF4 is built from normal quantiles). Acklam's approximation refined by two
    Halley steps against ``math.erfc``; agrees with ``scipy.stats.norm.ppf`` to ~1e-15.
    """
    arr = np.asarray(p, dtype=np.float64)
    return np.vectorize(_ppf_scalar, otypes=[np.float64])(arr)


def nf4_levels(offset: float = NF4_OFFSET, use_extra_value: bool = True) -> np.ndarray:
    """The 16 NF4 levels: normal quantiles, normalized to [-1, 1], with an exact zero (QLoRA §3).

    Introduced in Chapter 9. Asymmetric so that 0 is exactly a level: 8 positive levels are the N(0, 1)
    quantiles at 8 evenly spaced probabilities from ``offset`` down to (not including) 0.5, 7 negative ones
    the mirrored quantiles at 7 evenly spaced probabilities, plus 0; all divided by the largest. Mirrors ``bitsandbytes.functional.create_normal_map`` (probabilities spaced in float32, as
    ``torch.linspace`` does there).

    Args:
        offset: the outermost probability; the QLoRA paper's (1 - δ) with δ chosen so that ±1 are levels.
        use_extra_value: the asymmetric 7 negative + 0 + 8 positive type; False gives 7 + 0 + 7 (15 levels,
            padded with a second zero).

    Returns:
        The 16 levels, sorted, float32.
    """
    if not 0.5 < offset < 1.0:
        raise MemlibError(f"offset must be in (0.5, 1), got {offset!r}")
    if use_extra_value:
        pos = normal_ppf(_linspace32(offset, 0.5, 9)[:-1].astype(np.float64))
        neg = -normal_ppf(_linspace32(offset, 0.5, 8)[:-1].astype(np.float64))
        values = np.concatenate([pos, [0.0], neg])
    else:
        pos = normal_ppf(_linspace32(offset, 0.5, 8)[:-1].astype(np.float64))
        neg = -normal_ppf(_linspace32(offset, 0.5, 8)[:-1].astype(np.float64))
        values = np.concatenate([pos, [0.0, 0.0], neg])
    values = np.sort(values.astype(np.float32))
    return (values / values.max()).astype(np.float32)


def code_neighbours(code: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted code values and, for each code index, its rank in that order (for 'one step apart' checks).

    Introduced in Chapter 8.

    Returns:
        (sorted values, rank of code[i] among the distinct sorted values).
    """
    c = np.asarray(code, dtype=np.float32)
    distinct = np.unique(c)
    return distinct, np.searchsorted(distinct, c)


def nearest_code(scaled: np.ndarray, code: np.ndarray) -> np.ndarray:
    """Index into ``code`` of the value nearest to each of ``scaled`` (ties go to the smaller value).

    Introduced in Chapter 8. Uses the midpoints between sorted code values, so it is O(n log 256).
    """
    c = np.asarray(code, dtype=np.float32)
    order = np.argsort(c, kind="stable")
    srt = c[order].astype(np.float64)
    mids = (srt[:-1] + srt[1:]) / 2
    pos = np.searchsorted(mids, np.asarray(scaled, dtype=np.float64), side="left")
    return order[pos].astype(np.uint8 if c.size <= 256 else np.int64)


@dataclass(frozen=True)
class QuantizedBlocks:
    """A tensor quantized block by block: one code index per element, one absmax per block.

    Introduced in Chapter 8.

    Attributes:
        codes: uint8 indices into ``code``, same shape as the input.
        absmax: float32, one per block of ``block_size`` consecutive elements (last block may be short).
        code: the map (256 values for 8-bit, 16 for NF4).
        block_size: elements per block.
        shape: the input's shape.
    """

    codes: np.ndarray
    absmax: np.ndarray
    code: np.ndarray
    block_size: int
    shape: tuple[int, ...]

    @property
    def bits(self) -> int:
        """Bits per stored code: 8 for a 256-entry map, 4 for 16."""
        return int(math.ceil(math.log2(self.code.size)))

    @property
    def nbytes(self) -> int:
        """Storage bytes: packed codes + fp32 absmax (the map itself is shared and not counted)."""
        return int(math.ceil(self.codes.size * self.bits / 8)) + 4 * self.absmax.size


def _absmax_blocks(x: np.ndarray, block_size: int) -> tuple[np.ndarray, np.ndarray]:
    flat = np.asarray(x, dtype=np.float32).reshape(-1)
    n = flat.size
    blocks = -(-n // block_size)
    padded = np.zeros(blocks * block_size, dtype=np.float32)
    padded[:n] = flat
    absmax = np.abs(padded.reshape(blocks, block_size)).max(axis=1).astype(np.float32)
    return flat, absmax


def quantize_blockwise(x: np.ndarray, code: np.ndarray | None = None, block_size: int = 4096) -> QuantizedBlocks:
    """Block-wise absmax quantization: ``x / absmax(block)`` rounded to the nearest value of ``code``.

    Introduced in Chapter 8. Same arithmetic as ``bitsandbytes.functional.quantize_blockwise`` (default
    block 4096 and the signed dynamic map there too); an all-zero block gets absmax 0 and code of 0.

    Args:
        x: any-shape float array.
        code: the map (default :func:`dynamic_map`).
        block_size: consecutive elements sharing one absmax (any positive int).

    Returns:
        The codes, absmax and metadata.
    """
    bs = check_positive("block_size", block_size)
    c = dynamic_map() if code is None else np.asarray(code, dtype=np.float32)
    arr = np.asarray(x, dtype=np.float32)
    flat, absmax = _absmax_blocks(arr, bs)
    scale = np.repeat(absmax, bs)[: flat.size]
    with np.errstate(divide="ignore", invalid="ignore"):
        scaled = np.where(scale > 0, flat * (np.float32(1.0) / np.where(scale > 0, scale, 1)), 0).astype(np.float32)
    scaled = np.clip(scaled, -1, 1)
    codes = nearest_code(scaled, c).astype(np.uint8).reshape(arr.shape)
    return QuantizedBlocks(codes, absmax, c, bs, tuple(arr.shape))


def dequantize_blockwise(q: QuantizedBlocks) -> np.ndarray:
    """``code[index] * absmax(block)``, float32, in the original shape. Introduced in Chapter 8."""
    flat = q.code[q.codes.reshape(-1).astype(np.int64)]
    scale = np.repeat(q.absmax, q.block_size)[: flat.size]
    return (flat * scale).astype(np.float32).reshape(q.shape)


def quantize_nf4(x: np.ndarray, block_size: int = 64) -> QuantizedBlocks:
    """Block-wise NF4: absmax per block of ``block_size`` (QLoRA: 64), nearest of the 16 NF4 levels.

    Introduced in Chapter 9. Codes are stored one per uint8 here (bitsandbytes packs two per byte;
    :attr:`QuantizedBlocks.nbytes` counts them packed).
    """
    return quantize_blockwise(x, nf4_levels(), block_size)


def dequantize_nf4(q: QuantizedBlocks) -> np.ndarray:
    """Inverse of :func:`quantize_nf4` (up to the rounding). Introduced in Chapter 9."""
    return dequantize_blockwise(q)


@dataclass(frozen=True)
class DoubleQuantized:
    """First-level absmax constants quantized to 8 bits (QLoRA's double quantization).

    Introduced in Chapter 9.

    Attributes:
        offset: the mean subtracted from the absmax values before quantizing (they are all positive).
        blocks: the 8-bit quantized (absmax - offset), one fp32 second-level absmax per ``block_size``.
    """

    offset: float
    blocks: QuantizedBlocks

    @property
    def nbytes(self) -> int:
        """Bytes: one byte per constant, 4 per second-level block, 4 for the offset."""
        return self.blocks.nbytes + 4


def double_quantize_absmax(absmax: np.ndarray, block_size: int = 256) -> DoubleQuantized:
    """Quantize absmax constants to 8 bits in blocks of 256 after subtracting their mean (QLoRA §3).

    Introduced in Chapter 9. As bitsandbytes' ``quantize_4bit(compress_statistics=True)``: offset = mean,
    signed dynamic map, block 256.
    """
    a = np.asarray(absmax, dtype=np.float32)
    offset = float(a.mean(dtype=np.float32))
    return DoubleQuantized(offset, quantize_blockwise(a - np.float32(offset), dynamic_map(), block_size))


def dequantize_absmax(dq: DoubleQuantized) -> np.ndarray:
    """The absmax constants back from their 8-bit form. Introduced in Chapter 9."""
    return (dequantize_blockwise(dq.blocks) + np.float32(dq.offset)).astype(np.float32)


def bits_per_param(bits: int, block_size: int, absmax_bits: int = 32) -> float:
    """Storage bits per parameter of block-wise quantization: the code plus the block's share of its absmax.

    Introduced in Chapter 8: 8-bit states with fp32 absmax per 256 → 8 + 32/256 = 8.125 bits.
    """
    check_positive("bits", bits)
    bs = check_positive("block_size", block_size)
    check_positive("absmax_bits", absmax_bits)
    return bits + absmax_bits / bs


def double_quant_bits_per_param(block_size: int = 64, dq_block_size: int = 256, double_quant: bool = True) -> float:
    """Bits per parameter spent on the quantization constants of block-wise NF4 (QLoRA §3).

    Introduced in Chapter 9. Without double quantization one fp32 absmax per block: 32/64 = 0.5 bits. With it,
    an 8-bit absmax per block plus one fp32 constant per ``dq_block_size`` absmax values:
    8/64 + 32/(64·256) ≈ 0.127 bits.
    """
    bs = check_positive("block_size", block_size)
    dq = check_positive("dq_block_size", dq_block_size)
    if not double_quant:
        return 32 / bs
    return 8 / bs + 32 / (bs * dq)


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
