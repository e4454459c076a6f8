"""memlib.core.formats against PyTorch: bit-exact rounding, bit patterns, finfo, and property tests (Chapter 2)."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from memlib.core.dtypes import FLOAT_FORMATS
from memlib.core.errors import MemlibError
from memlib.core.formats import (FORMAT_NAMES, decode, encode, format_properties, round_to_format, to_bits,
                                 underflow_fraction)
from memlib._book.ch02_number_formats import from_bits, properties_table
from memlib._book.ch03_mixed_precision import overflow_fraction, ulp

TORCH_DTYPE = {
    "fp32": torch.float32,
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
    "fp8_e4m3": torch.float8_e4m3fn,
    "fp8_e5m2": torch.float8_e5m2,
}
VIEW = {32: torch.int32, 16: torch.int16, 8: torch.uint8}
UNSIGNED = {32: np.uint32, 16: np.uint16, 8: np.uint8}
N_RANDOM = 1_000_000


def torch_bits(x: np.ndarray, fmt: str) -> np.ndarray:
    """Bit patterns of ``torch.from_numpy(x).to(dtype)`` as unsigned integers."""
    bits = FLOAT_FORMATS[fmt].bits
    t = torch.from_numpy(x).to(TORCH_DTYPE[fmt])
    return t.view(VIEW[bits]).numpy().view(UNSIGNED[bits]) if bits > 8 else t.view(torch.uint8).numpy()


def torch_round(x: np.ndarray, fmt: str) -> np.ndarray:
    return torch.from_numpy(x).to(TORCH_DTYPE[fmt]).double().numpy()


def sample(fmt: str, n: int, seed: int) -> np.ndarray:
    """float64 test values for ``fmt``: normals, subnormals, near-max, ties (± tiny), specials, any doubles."""
    rng = np.random.default_rng(seed)
    p = format_properties(fmt)
    k = n // 8
    sign = rng.choice([-1.0, 1.0], size=n)
    parts = []
    # 1. normals, log-uniform over (and a little beyond) the normal range
    parts.append(np.ldexp(rng.uniform(1, 2, k), rng.integers(p.emin - 2, p.emax + 2, k)))
    # 2. subnormals and the underflow threshold
    parts.append(rng.uniform(0, 1, k) * p.min_normal)
    parts.append(rng.uniform(0, 1, k // 4) * p.min_subnormal * 2)
    # 3. around the largest value: rounding to max, the overflow tie, overflow
    top_ulp = math.ldexp(1.0, p.emax - p.mantissa_bits)
    parts.append(p.max_normal + rng.uniform(-2, 2, k) * top_ulp)
    parts.append(p.max_normal + top_ulp / 2 * (1 + rng.choice([0.0, 2.0**-30, -(2.0**-30), 2.0**-52, -(2.0**-52)], k)))
    # 4. halfway ties between neighbours of fmt, exactly and off by tiny amounts (float32 and float64 ulps)
    rep = from_bits(rng.integers(0, 2 ** (p.bits - 1), k).astype(np.int64), fmt)
    rep = np.abs(rep[np.isfinite(rep)])
    tie = rep + ulp(rep, fmt) / 2
    nudge = rng.choice([0.0, 1.0, -1.0, 0.5, -0.5, 1e-3, -1e-3, 2.0**-29, -(2.0**-29)], tie.size)
    parts.append(tie + nudge * np.spacing(tie.astype(np.float32)).astype(np.float64))
    # 5. arbitrary float64 bit patterns (huge, tiny, NaN payloads, inf)
    parts.append(rng.integers(0, 2**63, k, dtype=np.int64).view(np.float64))
    body = np.concatenate(parts)
    body = body[: n - 16]
    body = np.concatenate([body, rng.uniform(0, 1, n - 16 - body.size)])
    specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, p.max_normal, p.min_normal, p.min_subnormal,
                         p.min_subnormal / 2, p.min_subnormal * 0.5000001, p.max_normal + top_ulp / 2, 1.0, 1e300,
                         5e-324, 1e-45])
    with np.errstate(invalid="ignore"):
        body = body * sign[: body.size]
    return np.concatenate([body, specials])


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_round_and_bits_match_torch(fmt: str) -> None:
    x = sample(fmt, N_RANDOM, seed=FORMAT_NAMES.index(fmt))
    assert x.size >= N_RANDOM
    mine, theirs = round_to_format(x, fmt), torch_round(x, fmt)
    nan = np.isnan(theirs)
    np.testing.assert_array_equal(np.isnan(mine), nan)
    # bit patterns (catch signed zeros), NaNs compared as NaN
    b_mine, b_torch = to_bits(x, fmt), torch_bits(x, fmt)
    assert b_mine.dtype == b_torch.dtype
    bad = np.flatnonzero((b_mine != b_torch) & ~nan)
    assert bad.size == 0, f"{fmt}: {bad.size} mismatches, e.g. x={x[bad[:3]]!r} mine={mine[bad[:3]]} torch={theirs[bad[:3]]}"
    np.testing.assert_array_equal(mine[~nan], theirs[~nan])
    # the sample really covers the cases the docstring promises
    a = np.abs(x[np.isfinite(x)])
    p = format_properties(fmt)
    assert np.count_nonzero((a > 0) & (a < p.min_normal)) > 10_000
    assert np.count_nonzero(a > p.max_normal) > 10_000


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_from_bits_matches_torch_view(fmt: str) -> None:
    nbits = FLOAT_FORMATS[fmt].bits
    if nbits == 32:
        patterns = np.random.default_rng(0).integers(0, 2**32, 1_000_000, dtype=np.int64).astype(np.uint32)
        patterns[:4] = [0, 0x80000000, 0x7F800000, 0x00000001]
    else:
        patterns = np.arange(2**nbits, dtype=np.int64).astype(UNSIGNED[nbits])
    as_torch = torch.from_numpy(patterns.view({32: np.int32, 16: np.int16, 8: np.uint8}[nbits]).copy())
    theirs = as_torch.view(TORCH_DTYPE[fmt]).double().numpy()
    mine = from_bits(patterns, fmt)
    np.testing.assert_array_equal(mine, theirs)  # NaNs in the same places count as equal
    np.testing.assert_array_equal(np.signbit(mine[mine == 0]), np.signbit(theirs[theirs == 0]))
    # signed views decode the same
    np.testing.assert_array_equal(from_bits(as_torch.numpy(), fmt), mine)
    # and the round trip: re-encoding every non-NaN value gives back its pattern
    ok = ~np.isnan(mine)
    np.testing.assert_array_equal(to_bits(mine[ok], fmt), patterns[ok])


def test_double_rounding_is_what_torch_does() -> None:
    x = np.array([1 + 2**-11 + 2**-40])  # just above the fp16 tie between 1 and 1 + 2**-10
    assert round_to_format(x, "fp16", via_fp32=False)[0] == 1 + 2**-10  # one correct rounding
    assert round_to_format(x, "fp16")[0] == 1.0 == torch_round(x, "fp16")[0]  # float32 first, then tie → even
    for fmt in ("bf16", "fp8_e4m3", "fp8_e5m2"):
        m = FLOAT_FORMATS[fmt].mantissa_bits
        y = np.array([1 + 2.0 ** -(m + 1) + 2**-40])
        assert round_to_format(y, fmt, via_fp32=False)[0] == 1 + 2.0**-m
        assert round_to_format(y, fmt)[0] == 1.0 == torch_round(y, fmt)[0]


def test_e4m3_saturates_and_e5m2_overflows() -> None:
    x = np.array([448.0, 464.0, 464.5, 479.0, 480.0, 1e30, np.inf, -np.inf, -1e30])
    np.testing.assert_array_equal(round_to_format(x, "fp8_e4m3"), [448, 448, 448, 448, 448, 448, 448, -448, -448])
    np.testing.assert_array_equal(torch_round(x, "fp8_e4m3"), round_to_format(x, "fp8_e4m3"))
    assert np.isnan(round_to_format(np.nan, "fp8_e4m3"))
    y = np.array([57344.0, 61439.0, 61440.0, 65504.0, 65520.0])
    np.testing.assert_array_equal(round_to_format(y, "fp8_e5m2"), [57344, 57344, np.inf, np.inf, np.inf])
    np.testing.assert_array_equal(round_to_format(y, "fp16"), [57344, 61440, 61440, 65504, np.inf])


def test_both_paths_differ_only_at_float32_ties() -> None:
    x = sample("fp32", 100_000, seed=9)
    np.testing.assert_array_equal(round_to_format(x, "fp32", via_fp32=False), round_to_format(x, "fp32"))
    z = np.random.default_rng(1).uniform(-100, 100, 1_000_000)
    for fmt in ("fp16", "bf16", "fp8_e4m3", "fp8_e5m2"):
        once, twice = round_to_format(z, fmt, via_fp32=False), round_to_format(z, fmt)
        differ = once != twice
        # where they differ, the float32 value lies exactly halfway between the two results
        z32 = z[differ].astype(np.float32).astype(np.float64)
        np.testing.assert_array_equal(z32, (once[differ] + twice[differ]) / 2)
        m = FLOAT_FORMATS[fmt].mantissa_bits
        assert differ.mean() < 2.0 ** -(23 - m)  # expected about 2**-(24 - m)


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_properties_equal_torch_finfo(fmt: str) -> None:
    p, fi, ff = format_properties(fmt), torch.finfo(TORCH_DTYPE[fmt]), FLOAT_FORMATS[fmt]
    assert (p.max_normal, p.min_normal, p.eps, p.bits) == (fi.max, fi.tiny, fi.eps, fi.bits)
    assert p.min_normal == fi.smallest_normal
    assert -p.max_normal == fi.min
    assert p.resolution == fi.resolution
    # smallest subnormal: the pattern 0...01 read as the dtype by torch
    one = torch.tensor([1], dtype=VIEW[p.bits]).view(TORCH_DTYPE[fmt]).item()
    assert one == p.min_subnormal == from_bits(np.array([1]), fmt)[0]
    # the dtypes table agrees with the layout
    assert (ff.max_normal, ff.min_normal, ff.min_subnormal, ff.eps, ff.bias) == (
        p.max_normal, p.min_normal, p.min_subnormal, p.eps, p.bias)
    assert p.decimal_digits == pytest.approx((p.mantissa_bits + 1) * math.log10(2))


def test_properties_table_rows() -> None:
    rows = properties_table()
    assert [r.name for r in rows] == list(FORMAT_NAMES)
    fp16, bf16 = rows[1], rows[2]
    assert fp16.min_subnormal == 2.0**-24 and round(fp16.min_subnormal, 9) == 6e-8  # the Tips notes' "6e-8"
    assert fp16.max_normal == 65504
    assert round(fp16.decimal_digits, 1) == 3.3 and round(bf16.decimal_digits, 1) == 2.4
    assert bf16.min_normal == 2.0**-126 and bf16.min_subnormal == 2.0**-133
    assert rows[0].as_dict()["mantissa_bits"] == 23


def test_encode_examples() -> None:
    b = encode(0.1, "fp16")
    assert (b.sign, b.exponent, b.mantissa, b.kind) == (0, 11, 614, "normal")
    assert b.grouped == "0 01011 1001100110" and b.bits == "0010111001100110"
    assert b.value == 0.0999755859375 and b.unbiased_exponent == -4
    assert abs(b.relative_error - 2.44e-4) < 1e-6
    assert encode(-2.0, "bf16").grouped == "1 10000000 0000000"
    assert encode(2.0**-24, "fp16").kind == "subnormal" and encode(2.0**-24, "fp16").mantissa == 1
    assert encode(2.0**-26, "fp16").kind == "zero"
    assert encode(1e5, "fp16").kind == "inf" and encode(1e5, "fp8_e4m3").value == 448
    assert encode(float("nan"), "fp8_e4m3").bits == "01111111"
    assert encode(float("nan"), "fp16").kind == "nan" and math.isnan(encode(float("nan"), "fp16").error)
    assert encode(0.0, "fp32").unbiased_exponent is None


finite64 = st.floats(allow_nan=False, allow_infinity=False, width=64)
fmts = st.sampled_from(FORMAT_NAMES)


@settings(max_examples=300, deadline=None)
@given(x=st.floats(width=64), fmt=fmts)
def test_encode_decode_round_trip(x: float, fmt: str) -> None:
    b = encode(x, fmt)
    r = float(round_to_format(x, fmt))
    v = decode(b.sign, b.exponent, b.mantissa, fmt)
    assert (math.isnan(v) and math.isnan(r)) or (v == r and math.copysign(1, v) == math.copysign(1, r))
    assert b.value == v or math.isnan(v)
    assert int(b.bits, 2) == int(to_bits(x, fmt))
    np.testing.assert_array_equal(from_bits(to_bits(x, fmt), fmt), r)


@settings(max_examples=300, deadline=None)
@given(x=st.floats(width=64), fmt=fmts, via=st.booleans())
def test_rounding_is_idempotent(x: float, fmt: str, via: bool) -> None:
    once = round_to_format(x, fmt, via_fp32=via)
    np.testing.assert_array_equal(round_to_format(once, fmt, via_fp32=via), once)


@settings(max_examples=300, deadline=None)
@given(x=st.floats(allow_nan=False, width=64), y=st.floats(allow_nan=False, width=64), fmt=fmts,
       via=st.booleans())
def test_rounding_is_monotone(x: float, y: float, fmt: str, via: bool) -> None:
    lo, hi = min(x, y), max(x, y)
    assert round_to_format(lo, fmt, via_fp32=via) <= round_to_format(hi, fmt, via_fp32=via)


@settings(max_examples=300, deadline=None)
@given(x=finite64, fmt=fmts)
def test_error_at_most_half_ulp_in_range(x: float, fmt: str) -> None:
    p = format_properties(fmt)
    if abs(x) > p.max_normal:
        return
    half = float(ulp(x, fmt)) / 2
    assert abs(float(round_to_format(x, fmt, via_fp32=False)) - x) <= half
    # PyTorch's path rounds twice: it can be off by up to half a float32 ulp more
    extra = float(ulp(x, "fp32")) / 2 if fmt != "fp32" else 0.0
    assert abs(float(round_to_format(x, fmt)) - x) <= half + extra


@settings(max_examples=200, deadline=None)
@given(x=st.floats(min_value=-65504, max_value=65504), frac=st.floats(min_value=0, max_value=1))
def test_update_below_half_ulp_is_lost_in_fp16(x: float, frac: float) -> None:
    w = float(round_to_format(x, "fp16"))
    # an update away from zero smaller than half the spacing there (room left for the float32 step)
    u = math.copysign(frac * (1 - 2.0**-12) * float(ulp(w, "fp16")) / 2, w)
    assert float(round_to_format(w + u, "fp16")) == w


def test_underflow_and_overflow_fractions() -> None:
    g = np.array([1e-9, 1e-7, 1e-3, 1.0, 0.0, np.nan, 1e5])
    assert underflow_fraction(g, "fp16") == 0.2  # 1e-9 flushes; 1e-7 is a subnormal; 0 and NaN not counted
    assert underflow_fraction(g, "fp16", scale=2.0**10) == 0.0
    assert underflow_fraction(g, "bf16") == 0.0
    assert overflow_fraction(g, "fp16") == pytest.approx(1 / 6)  # 1e5 > 65504
    assert overflow_fraction(g, "fp16", scale=2.0**16) == pytest.approx(2 / 6)  # and 1.0 × 65536
    assert overflow_fraction([500.0], "fp8_e4m3") == 1.0 and overflow_fraction([464.0], "fp8_e4m3") == 0.0
    assert underflow_fraction([], "fp16") == 0.0 and overflow_fraction([], "fp16") == 0.0


def test_ulp() -> None:
    np.testing.assert_array_equal(ulp([1.0, 1.5, 2.0, 0.0, 1e-9, 65504], "fp16"),
                                  [2.0**-10, 2.0**-10, 2.0**-9, 2.0**-24, 2.0**-24, 32.0])


@pytest.mark.parametrize("call", [
    lambda: round_to_format(1.0, "fp12"),
    lambda: to_bits(1.0, "fp12"),
    lambda: from_bits([1], "fp12"),
    lambda: encode(1.0, "fp12"),
    lambda: decode(0, 0, 0, "fp12"),
    lambda: format_properties("fp12"),
    lambda: ulp(1.0, "fp12"),
    lambda: underflow_fraction([1.0], "fp12"),
])
def test_unknown_format_message(call) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(MemlibError, match=r"^unknown format 'fp12'; expected one of: fp32, fp16, bf16, fp8_e4m3, fp8_e5m2$"):
        call()


def test_other_errors() -> None:
    with pytest.raises(MemlibError, match=r"exponent field 32 out of range for fp16; expected an integer in 0\.\.31"):
        decode(0, 32, 0, "fp16")
    with pytest.raises(MemlibError, match=r"sign field 2 .*0\.\.1"):
        decode(2, 0, 0, "fp16")
    with pytest.raises(MemlibError, match=r"mantissa field -1 .*0\.\.7"):
        decode(0, 0, -1, "fp8_e4m3")
    with pytest.raises(MemlibError, match=r"bit pattern 256 does not fit fp8_e4m3; expected integers in -128\.\.255"):
        from_bits([256], "fp8_e4m3")
    with pytest.raises(MemlibError, match=r"bits must be an integer array, got dtype float64"):
        from_bits([1.0], "fp16")
    with pytest.raises(MemlibError, match=r"cannot encode 'abc'; expected a real number"):
        encode("abc", "fp16")  # type: ignore[arg-type]
