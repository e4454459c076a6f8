"""ZeRO arithmetic (memlib.core.zero): the paper's Table 1 cell by cell, §5 formulas, §7 volumes, the erratum."""
from decimal import ROUND_DOWN, Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memlib import GB, MemlibError
from memlib.core.estimate import estimate_training
from memlib.core.zero import comm_volume
from memlib._book.ch06_zero_fsdp import (TABLE1_DP, TABLE1_PARAMS, TABLE1_PRINTED, V100_BYTES, deepspeed_zero2_bytes,
                                         deepspeed_zero3_bytes, fsdp_peak_bytes, paper_round, tips_notes_zero2_bytes,
                                         deepspeed_zero2_offload_host_bytes, zero2_offload_host_bytes, table1,
                                         zero_formula, zero_states)

CELLS = table1()


@pytest.mark.parametrize("cell", CELLS, ids=lambda c: f"{c.params / 1e9:g}B-dp{c.dp}-stage{c.stage}")
def test_table1_cell_as_printed(cell) -> None:
    assert cell.paper == TABLE1_PRINTED[cell.params][cell.dp][cell.stage - 1]
    assert cell.printed == cell.paper


def test_table1_shape_and_v100_cells() -> None:
    assert len(CELLS) == len(TABLE1_PARAMS) * len(TABLE1_DP) * 3 == 54
    fits = {(c.params // 10**9, c.dp, c.stage) for c in CELLS if c.fits_v100}
    # 7.5B: P_os from DP 64, P_os+g from 16, P_os+g+p from 4; 128B only with P_os+g+p from 64; 1T at 1024.
    assert (7, 64, 1) in fits and (7, 16, 1) not in fits
    assert (7, 16, 2) in fits and (7, 4, 2) not in fits
    assert (7, 4, 3) in fits and (7, 1, 3) not in fits
    assert {c for c in fits if c[0] == 128} == {(128, 64, 3), (128, 256, 3), (128, 1024, 3)}
    assert {c for c in fits if c[0] == 1000} == {(1000, 1024, 3)}
    # the 128B × 64 cell (32 GB) fits only because a "32 GB" V100 holds 32 GiB = 34.4e9 bytes
    cell = next(c for c in CELLS if c.params == 128 * 10**9 and c.dp == 64 and c.stage == 3)
    assert cell.bytes == 32 * GB < V100_BYTES


def test_formulas_section5() -> None:
    psi, n = 7_500_000_000, 64
    assert [zero_states(psi, s, n).total_bytes for s in range(4)] == [
        16 * psi, 4 * psi + 12 * psi // n, 2 * psi + 14 * psi // n, 16 * psi // n]
    assert [zero_formula(s) for s in range(4)] == ["16Ψ", "4Ψ + 12Ψ/N", "2Ψ + 14Ψ/N", "16Ψ/N"]
    # Figure 1: 120 GB → 31.4 → 16.6 → 1.9
    assert [round(zero_states(psi, s, n).total_bytes / GB, 1) for s in range(4)] == [120.0, 31.4, 16.6, 1.9]
    # the bytes are the estimator's, not a second copy of the arithmetic
    for s in range(4):
        assert zero_states(psi, s, n).total_bytes == estimate_training(
            params=psi, zero_stage=s, num_gpus=n, framework="deepspeed", grad_accum=2 if s == 1 else 1).total_bytes
    # with one micro-batch per step DeepSpeed's ZeRO-1 frees the gradients outside its partition, as ZeRO-2 does
    assert estimate_training(params=psi, zero_stage=1, num_gpus=n, framework="deepspeed").total_bytes == (
        zero_states(psi, 2, n).total_bytes)


def test_comm_volume_section7() -> None:
    psi = 1000
    assert [comm_volume(s, psi) for s in range(4)] == [2000, 2000, 2000, 3000]
    assert comm_volume(3, psi) / comm_volume(0, psi) == 1.5


def test_tips_notes_erratum_zero2() -> None:
    psi = 7_500_000_000
    for n in (1, 4, 64):
        paper = zero_states(psi, 2, n).total_bytes
        notes = tips_notes_zero2_bytes(psi, n)
        assert notes - paper == 2 * psi  # the Tips notes add the full 16-bit gradients back
        assert notes >= zero_states(psi, 1, n).total_bytes  # ...making ZeRO-2 no better than ZeRO-1
    assert round(tips_notes_zero2_bytes(psi, 64) / GB, 1) == 31.6


def test_deepspeed_formulas_vs_paper() -> None:
    psi, n, big = 7_500_000_000, 64, 100_000_000
    assert deepspeed_zero2_bytes(psi, n) - zero_states(psi, 2, n).total_bytes == 4 * psi // n
    assert deepspeed_zero3_bytes(psi, n, big) - zero_states(psi, 3, n).total_bytes == 4 * big + 2 * psi // n


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 10**15), st.integers(1, 10**6))
def test_paper_round_properties(num: int, den: int) -> None:
    v = Decimal(num) / Decimal(den)
    down = Decimal(paper_round(v, "down"))
    up = Decimal(paper_round(v, "half_up"))
    assert down <= v
    step = Decimal(1).scaleb(-min(2, max(0, 2 - v.adjusted())))
    assert v - down < step
    assert abs(up - v) <= step / 2
    if v >= 100:
        assert down == v.quantize(Decimal(1), rounding=ROUND_DOWN)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(1, 10**6), min_size=1, max_size=8), st.integers(0, 10**4), st.integers(1, 64))
def test_fsdp_peak_invariants(units: list[int], root: int, n: int) -> None:
    z2 = fsdp_peak_bytes(units, root, n, reshard_after_forward=False)
    z3 = fsdp_peak_bytes(units, root, n, reshard_after_forward=True)
    total = sum(units) + root
    assert z3 <= z2
    assert z2 <= 4 * total + 16 * total / n + 4 * max(units) + 1  # shards + whole model + one unit's grads
    assert z3 >= 12 * total / n + 4 * max(units) + 4 * root - 1  # shards + one gathered unit + its gradients
    assert z2 >= 12 * total / n + 4 * (sum(units) + root) - 1  # ZeRO-2-like: the whole model is gathered


def test_bad_input() -> None:
    with pytest.raises(MemlibError, match="unknown zero stage 4; expected one of: 0, 1, 2, 3"):
        zero_states(10, 4, 2)
    with pytest.raises(MemlibError, match="num_gpus must be an integer ≥ 1"):
        zero_states(10, 1, 0)
    with pytest.raises(MemlibError, match="unknown rounding 'up'"):
        paper_round(1.0, "up")
    with pytest.raises(MemlibError, match="value_gb must be > 0"):
        paper_round(0)
    with pytest.raises(MemlibError, match="at least one"):
        fsdp_peak_bytes([], 0, 2, reshard_after_forward=True)


def test_deepspeed_zero2_offload_host_quirk() -> None:
    psi = 7_500_000_000
    # one GPU: max(4, 16) = 16 bytes per parameter, x1.5 -- the states do move to the host
    assert deepspeed_zero2_offload_host_bytes(psi, 1) == int(16 * psi * 1.5)
    assert zero2_offload_host_bytes(psi, 1) == 16 * psi
    # 8 nodes x 8 GPUs: DeepSpeed multiplies by all 64 GPUs (256 psi per node), the node holds 16 psi / 8
    assert deepspeed_zero2_offload_host_bytes(psi, 8, 8) == int(256 * psi * 1.5)
    assert zero2_offload_host_bytes(psi, 8, 8) == 2 * psi
    # more nodes: DeepSpeed's per-node figure grows, the real one shrinks
    assert deepspeed_zero2_offload_host_bytes(psi, 8, 16) > deepspeed_zero2_offload_host_bytes(psi, 8, 8)
    assert zero2_offload_host_bytes(psi, 8, 16) < zero2_offload_host_bytes(psi, 8, 8)


def test_deepspeed_zero2_offload_host_matches_deepspeed() -> None:
    from memlib._book.ch07_offloading import deepspeed_offload_estimators
    try:
        zero2, _ = deepspeed_offload_estimators()
    except MemlibError:
        pytest.skip("deepspeed not installed")
    for gpus, nodes in ((1, 1), (8, 1), (8, 8)):
        cpu, _ = zero2(7_500_000_000, num_gpus_per_node=gpus, num_nodes=nodes, cpu_offload=True)
        assert cpu == deepspeed_zero2_offload_host_bytes(7_500_000_000, gpus, nodes)
