"""memlib.core.quant against bitsandbytes 0.50 on CPU: maps, block-wise 8-bit, NF4, double quantization, 8-bit Adam bytes."""
from __future__ import annotations

import logging

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memlib._book import ch08_8bit_optimizers as Q8
from memlib._book import ch09_lora_qlora as Q9
from memlib.core import quant as Q
from memlib.core.errors import MemlibError

torch = pytest.importorskip("torch")
logging.getLogger("bitsandbytes").setLevel(logging.ERROR)
bnb = pytest.importorskip("bitsandbytes")
F = pytest.importorskip("bitsandbytes.functional")

#: bitsandbytes' CPU kernel (0.50.2) does not resolve the dynamic maps' finest codes: below |x|/absmax ≈ 1e-4
#: it maps 0 and tiny values to ±2.125e-5 (signed map) or 1.5625e-5 (unsigned), never to 0 (measured in
#: test_bnb_cpu_kernel_floor). Our kernel rounds to the nearest code everywhere; there the two differ by at
#: most 2.25e-5 · absmax, which we take as the step below 1e-4.
BNB_CPU_FLOOR = 2.3e-5


def _real_adam_states() -> dict[str, np.ndarray]:
    """Adam's m and v and the weights of a small MLP after 20 AdamW steps on a regression (seeded)."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64))
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    x, y = torch.randn(128, 64), torch.randn(128, 64)
    for _ in range(20):
        loss = torch.nn.functional.mse_loss(net(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
    w = net[0].weight
    return {"m": opt.state[w]["exp_avg"].numpy().copy(), "v": opt.state[w]["exp_avg_sq"].numpy().copy(),
            "weight": w.detach().numpy().copy()}


REAL = _real_adam_states()


def _within_one_step(x: np.ndarray, ours: np.ndarray, theirs: np.ndarray, absmax: np.ndarray, block: int,
                     code: np.ndarray, floor: float = 0.0) -> float:
    """Largest |ours - theirs| in units of the local quantization step (the code gap around x / absmax)."""
    flat = x.reshape(-1)
    am = np.repeat(absmax, block)[: flat.size]
    distinct = np.unique(code)
    s = np.clip(np.divide(flat, am, out=np.zeros_like(flat), where=am > 0), -1, 1)
    k = np.clip(np.searchsorted(distinct, s), 1, distinct.size - 1)
    step = np.maximum(distinct[k] - distinct[k - 1], floor) * am
    diff = np.abs(ours.reshape(-1) - theirs.reshape(-1))
    return float(np.max(np.divide(diff, step, out=np.zeros_like(diff), where=step > 0)))


# --- maps -------------------------------------------------------------------------------------------------

def test_nf4_table_equals_bitsandbytes() -> None:
    ours = Q9.nf4_levels()
    theirs = F.get_4bit_type("nf4", device="cpu").numpy()
    assert ours.shape == (16,)
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-7)
    assert ours[7] == 0.0 and ours[0] == -1.0 and ours[-1] == 1.0
    assert (ours[8:] > 0).sum() == 8 and (ours[:7] < 0).sum() == 7  # asymmetric: 7 negative, 0, 8 positive


def test_nf4_matches_qlora_paper_appendix_values() -> None:
    paper = [-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
             -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
             0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
             0.7229568362236023, 1.0]
    np.testing.assert_allclose(Q9.nf4_levels(), paper, rtol=0, atol=1e-7)


def test_normal_ppf_against_known_quantiles() -> None:
    # Φ⁻¹ values to 1e-12 from the standard tables (and erf identities).
    known = {0.5: 0.0, 0.975: 1.959963984540054, 0.8413447460685429: 1.0, 0.001: -3.090232306167813}
    for p, x in known.items():
        assert abs(float(Q9.normal_ppf(p)) - x) < 1e-9, p
    import math
    for p in np.linspace(1e-6, 1 - 1e-6, 101):  # Φ(Φ⁻¹(p)) = p
        assert abs(0.5 * math.erfc(-float(Q9.normal_ppf(p)) / math.sqrt(2)) - p) < 1e-14
    with pytest.raises(MemlibError, match="0 < p < 1"):
        Q9.normal_ppf(1.0)


def _torch_linspace_is_ours(*steps: int) -> bool:
    """bitsandbytes builds its maps with torch.linspace, whose last bit depends on the CPU kernel (vectorized or
    ATEN_CPU_CAPABILITY=default); memlib follows the vectorized kernels."""
    return all(np.array_equal(Q._linspace32(0.1, 1.0, n), torch.linspace(0.1, 1.0, n).numpy()) for n in steps)


def _assert_same_map(ours: np.ndarray, theirs: np.ndarray, *linspace_steps: int) -> None:
    # relative error within 2^-22 (two float32 ulps) everywhere; to the bit where torch.linspace runs the kernel
    # memlib mirrors
    assert np.all(np.abs(ours - theirs) <= 2.0**-22 * np.abs(theirs))
    if _torch_linspace_is_ours(*linspace_steps):
        assert np.array_equal(ours, theirs)


@pytest.mark.parametrize("signed", [True, False])
def test_dynamic_map_equals_bitsandbytes(signed: bool) -> None:
    ours = Q.dynamic_map(signed)
    theirs = F.create_dynamic_map(signed).numpy()
    _assert_same_map(ours, theirs, *(2**i + 1 for i in range(1, 9)))
    assert ours.size == 256 and ours.max() == 1.0 and np.all(np.diff(ours) >= 0)


@pytest.mark.parametrize("signed,bits,add_zero", [(True, 8, True), (False, 8, False), (True, 4, True), (True, 2, False)])
def test_linear_map_equals_bitsandbytes(signed: bool, bits: int, add_zero: bool) -> None:
    theirs = F.create_linear_map(signed, bits, add_zero).numpy()
    ours = Q8.linear_map(signed, bits, add_zero)
    assert np.max(np.abs(ours - theirs)) <= 2.0**-23  # one float32 ulp of the map's end point 1.0
    if _torch_linspace_is_ours(2**bits - 1, 2**bits):
        assert np.array_equal(ours, theirs)


def test_linspace32_is_torchs_vectorized_kernel() -> None:
    # where torch runs its vectorized linspace (AVX2/AVX-512/NEON builds), memlib's maps are bit-identical
    if torch.backends.cpu.get_cpu_capability() in ("DEFAULT", "NO AVX"):
        pytest.skip("torch runs its portable linspace kernel here (ATEN_CPU_CAPABILITY=default)")
    assert _torch_linspace_is_ours(2, 3, 5, 9, 17, 33, 65, 129, 255, 256)
    assert np.array_equal(Q.dynamic_map(True), F.create_dynamic_map(True).numpy())


def test_bad_input_raises() -> None:
    with pytest.raises(MemlibError, match="block_size"):
        Q.quantize_blockwise(np.ones(4), block_size=0)
    with pytest.raises(MemlibError, match="total_bits"):
        Q8.linear_map(total_bits=9)
    with pytest.raises(MemlibError, match="offset"):
        Q9.nf4_levels(offset=0.4)


# --- block-wise 8-bit ---------------------------------------------------------------------------------------

def _random(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(n) * rng.lognormal(0, 2, n)).astype(np.float32)  # heavy-tailed, like Adam's m


@pytest.mark.parametrize("block", [64, 256, 2048, 4096, 100])
@pytest.mark.parametrize("data", ["random", "m", "v", "weight"])
def test_blockwise_dequantization_within_one_step_of_bitsandbytes(block: int, data: str) -> None:
    x = _random(20_003) if data == "random" else REAL[data]
    code = Q.dynamic_map(signed=data != "v")
    ours = Q.quantize_blockwise(x, code, block)
    qb, sb = F.quantize_blockwise(torch.from_numpy(x), code=torch.from_numpy(code), blocksize=block)
    np.testing.assert_array_equal(ours.absmax, sb.absmax.numpy())
    theirs = F.dequantize_blockwise(qb, sb).numpy()
    mine = Q.dequantize_blockwise(ours)
    assert mine.shape == x.shape
    s = np.abs(x.reshape(-1)) / np.repeat(ours.absmax, block)[: x.size]
    resolved = s >= 1e-4  # where bitsandbytes' CPU kernel resolves the map
    flat = x.reshape(-1)
    assert _within_one_step(flat[resolved], mine.reshape(-1)[resolved], theirs.reshape(-1)[resolved],
                            np.repeat(ours.absmax, block)[: x.size][resolved], 1, code) <= 1 + 1e-5
    assert _within_one_step(x, mine, theirs, ours.absmax, block, code, floor=BNB_CPU_FLOOR) <= 1 + 1e-5
    # and ours is the nearest code: error at most half a step everywhere
    assert _within_one_step(x, mine, x, ours.absmax, block, code) <= 0.5 + 1e-5
    assert (qb.numpy() == ours.codes).mean() > 0.8


def test_bnb_cpu_kernel_floor() -> None:
    """The documented departure: bitsandbytes' CPU kernel never emits codes below 2.125e-5 (not even 0)."""
    s = np.array([1.0, 0.0, 1e-7, 5e-6, -5e-6, 1e-4], dtype=np.float32)
    qb, sb = F.quantize_blockwise(torch.from_numpy(s), blocksize=64)
    theirs = F.dequantize_blockwise(qb, sb).numpy()
    mine = Q.dequantize_blockwise(Q.quantize_blockwise(s, block_size=64))
    assert mine[1] == 0.0 and abs(theirs[1]) == pytest.approx(2.125e-5, rel=1e-3)
    assert np.all(np.abs(theirs[1:5]) == np.float32(2.1249998e-05))
    assert np.all(np.abs(mine[1:5] - s[1:5]) < np.abs(theirs[1:5] - s[1:5]))
    assert theirs[5] == mine[5]


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 3000), st.integers(1, 600), st.integers(0, 2**31 - 1), st.booleans())
def test_roundtrip_error_at_most_half_a_step(n: int, block: int, seed: int, nf4: bool) -> None:
    x = _random(n, seed)
    q = Q9.quantize_nf4(x, block) if nf4 else Q.quantize_blockwise(x, block_size=block)
    back = Q.dequantize_blockwise(q)
    assert q.absmax.size == -(-n // block)
    assert _within_one_step(x, back, x, q.absmax, block, q.code) <= 0.5 + 1e-5
    # the absmax element of every block survives exactly when the map holds its sign's ±1
    assert np.all(np.abs(back) <= np.repeat(q.absmax, block)[:n] * (1 + 1e-6))


def test_all_zero_block() -> None:
    x = np.zeros(300, np.float32)
    x[:10] = 1.0
    q = Q.quantize_blockwise(x, block_size=256)
    assert q.absmax.tolist() == [1.0, 0.0]
    assert np.array_equal(Q.dequantize_blockwise(q), x)


# --- NF4 and double quantization ----------------------------------------------------------------------------

def _unpack(packed: np.ndarray, n: int) -> np.ndarray:
    u = packed.reshape(-1)
    codes = np.empty(u.size * 2, np.uint8)
    codes[::2], codes[1::2] = u >> 4, u & 15
    return codes[:n]


@pytest.mark.parametrize("block", [64, 128, 256])
@pytest.mark.parametrize("data", ["random", "weight", "gaussian"])
def test_nf4_equals_bitsandbytes_quantize_4bit(block: int, data: str) -> None:
    rng = np.random.default_rng(1)
    x = {"random": _random(40_000).reshape(200, 200), "weight": REAL["weight"],
         "gaussian": (0.02 * rng.standard_normal((256, 512))).astype(np.float32)}[data]
    q4, s4 = F.quantize_4bit(torch.from_numpy(x), blocksize=block, quant_type="nf4")
    ours = Q9.quantize_nf4(x, block)
    np.testing.assert_array_equal(ours.absmax, s4.absmax.numpy())
    theirs_codes = _unpack(q4.numpy(), x.size)
    # same level except at exact midpoints (ties); dequantized values within one step
    assert (theirs_codes == ours.codes.reshape(-1)).mean() > 0.999
    theirs = F.dequantize_4bit(q4, s4).numpy()
    assert _within_one_step(x, Q9.dequantize_nf4(ours), theirs, ours.absmax, block, Q9.nf4_levels()) <= 1 + 1e-6
    assert ours.nbytes == x.size // 2 + 4 * ours.absmax.size


def test_double_quantization_equals_bitsandbytes() -> None:
    x = (0.02 * np.random.default_rng(2).standard_normal((512, 512))).astype(np.float32)
    q4, s4 = F.quantize_4bit(torch.from_numpy(x), blocksize=64, quant_type="nf4", compress_statistics=True)
    first = Q9.quantize_nf4(x, 64)
    dq = Q9.double_quantize_absmax(first.absmax)
    assert s4.nested and s4.state2.blocksize == 256 and s4.absmax.dtype == torch.uint8
    assert dq.offset == pytest.approx(float(s4.offset), rel=1e-6)
    # same second-level absmax up to the float32 rounding of the mean (numpy and torch sum in different orders)
    np.testing.assert_allclose(dq.blocks.absmax, s4.state2.absmax.numpy(), rtol=1e-6)
    ours_absmax = Q.dequantize_absmax(dq)
    theirs_absmax = F.dequantize_blockwise(s4.absmax, s4.state2).numpy() + float(s4.offset)
    am2 = np.repeat(dq.blocks.absmax, 256)[: ours_absmax.size]
    assert np.max(np.abs(ours_absmax - theirs_absmax) / am2) <= 0.04  # one dynamic-map step near |s| ~ 0.5
    # what the 8-bit constants cost in weight accuracy: tiny next to NF4's own rounding
    w_dq = (Q9.nf4_levels()[first.codes.reshape(-1)] * np.repeat(ours_absmax, 64)).reshape(x.shape)
    w_single = Q9.dequantize_nf4(first)
    assert np.abs(w_dq - w_single).mean() < 0.05 * np.abs(w_single - x).mean()
    # same NF4 codes; the weights then differ only through the (one-step) difference of the constants
    assert np.array_equal(_unpack(q4.numpy(), x.size), first.codes.reshape(-1))
    gap = np.repeat(np.abs(ours_absmax - theirs_absmax), 64).reshape(x.shape)
    assert np.all(np.abs(F.dequantize_4bit(q4, s4).numpy() - w_dq) <= gap + 1e-7)


def test_bits_per_param() -> None:
    assert Q9.double_quant_bits_per_param(double_quant=False) == 0.5
    assert Q9.double_quant_bits_per_param() == pytest.approx(8 / 64 + 32 / (64 * 256))
    assert round(Q9.double_quant_bits_per_param(), 3) == 0.127
    assert Q8.bits_per_param(8, 256) == 8.125
    assert Q8.bits_per_param(4, 64) == 4.5
    from memlib.core.dtypes import WEIGHT_FORMATS
    assert WEIGHT_FORMATS["nf4"] * 8 == pytest.approx(4 + Q9.double_quant_bits_per_param())


# --- 8-bit Adam state bytes ---------------------------------------------------------------------------------

def _bnb_state_bytes(params: list, **kwargs: object) -> tuple[int, set[tuple[str, str]]]:
    opt = bnb.optim.AdamW8bit(params, **kwargs)
    for p in params:
        p.grad = torch.zeros_like(p)
    opt.step()
    total, kinds = 0, set()
    for p in params:
        for k, v in opt.state[p].items():
            if torch.is_tensor(v) and not k.startswith("qmap"):  # the two 256-entry maps are shared
                total += v.numel() * v.element_size()
                kinds.add((k, str(v.dtype).replace("torch.", "")))
    return total, kinds


@pytest.mark.parametrize("numel", [1, 255, 4095, 4096, 4097, 10_000, 65_536, 300_001])
def test_quant_state_bytes_equals_bitsandbytes(numel: int) -> None:
    p = torch.nn.Parameter(torch.zeros(numel))
    measured, kinds = _bnb_state_bytes([p])
    assert measured == Q8.quant_state_bytes(numel)
    if numel < 4096:
        assert kinds == {("state1", "float32"), ("state2", "float32")}
    else:
        assert kinds == {("state1", "uint8"), ("state2", "uint8"), ("absmax1", "float32"), ("absmax2", "float32")}


def test_bitsandbytes_block_size_today_is_256() -> None:
    p = torch.nn.Parameter(torch.zeros(2048 * 4))
    opt = bnb.optim.AdamW8bit([p])
    p.grad = torch.zeros_like(p)
    opt.step()
    assert opt.state[p]["absmax1"].numel() == 2048 * 4 // 256  # not the paper's 2048


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_adamw8bit_measured_vs_estimator(dtype: str) -> None:
    from memlib.core.configs import load_config
    from memlib.core.estimate import _optimizer_state_bytes
    from memlib.core.params import count_params
    from memlib.measure.trace import build_model

    tiny = {"n_layer": 2, "n_embd": 128, "n_head": 4, "vocab_size": 512, "n_positions": 128}
    net = build_model("gpt2", device="cpu", dtype=dtype, overrides=tiny)
    params = list(net.parameters())
    measured, kinds = _bnb_state_bytes(params)
    assert ("state1", "float32") in kinds  # small tensors keep fp32 states, whatever the parameter dtype
    assert measured == sum(Q8.quant_state_bytes(p.numel()) for p in params)
    pc = count_params(load_config({**load_config("gpt2").raw, **tiny}))
    precision = "fp32" if dtype == "fp32" else "bf16"
    estimated = _optimizer_state_bytes(pc.params, pc.small_tensor_params, precision, "adamw-8bit")
    if dtype == "fp32":
        assert estimated == measured
    else:
        # memlib.core.estimate counts 2-byte states for small tensors with bf16 weights; bitsandbytes keeps fp32.
        assert measured - estimated == 2 * 2 * pc.small_tensor_params or estimated == measured
