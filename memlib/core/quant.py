"""Block-wise quantization from scratch: the dynamic 8-bit map, absmax blocks (Chapters 8-9).

Pure numpy. The maps follow bitsandbytes (``create_linear_map``, ``create_dynamic_map``, ``create_normal_map``)
and the papers: 8-bit optimizers quantize Adam's states block by block with a *dynamic* (dynamic-tree) map
(Dettmers et al. 2022); QLoRA stores frozen weights in 4-bit NormalFloat (NF4) with one absmax per block of
64 and quantizes those absmax constants again to 8 bits (double quantization, Dettmers et al. 2023).
Quantizing a value means scaling it by its block's absmax into [-1, 1] and storing the index of the nearest
map value; dequantizing is ``code[index] * absmax``. The linear map and the bytes of 8-bit optimizer states
(Chapter 8), NF4 and double quantization (Chapter 9) are book helpers (:mod:`memlib._book.ch08_8bit_optimizers`,
:mod:`memlib._book.ch09_lora_qlora`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .errors import MemlibError, check_positive

__all__ = [
    "NF4_OFFSET",
    "QuantizedBlocks",
    "DoubleQuantized",
    "dynamic_map",
    "quantize_blockwise",
    "dequantize_blockwise",
    "dequantize_absmax",
    "nearest_code",
    "code_neighbours",
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


def dequantize_absmax(dq: DoubleQuantized) -> np.ndarray:
    """The absmax constants back from their 8-bit form. Introduced in Chapter 9."""
    return (dequantize_blockwise(dq.blocks) + np.float32(dq.offset)).astype(np.float32)


