"""Megatron-Core and TorchTitan as memlib models them under model parallelism (issue 33, Chapter 15).

What each engine's forward saves, and TorchTitan's TP plan on two gloo ranks (collectives per layer, saved bytes per
rank), are checked against the recorded CPU runs of the engines themselves (``tests/data/engines_on_cpu.json``,
written by ``bench/engines_on_cpu.py``), and the layouts against the rules of
their sources (distributed optimizer over dp·cp, MoE parallel folding, zero-bubble and DualPipe schedules).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from memlib.cli import main
from memlib.core.configs import load_config
from memlib.core.errors import MemlibError
from memlib.core.estimate import estimate_training
from memlib.core.frameworks.megatron import megatron_core_activation_terms
from memlib.core.frameworks.torchtitan import torchtitan_activation_terms
from memlib.core.parallel import bubble_fraction, bubble_ratio, check_layout, column_linears, in_flight, split_terms
from memlib.core.schedules import schedule_weight_copies, zero_bubble_units

FIXTURE = json.loads((Path(__file__).parent / "data" / "engines_on_cpu.json").read_text(encoding="utf-8"))
GIB = 2**30


def _total(terms: list, layers: int) -> int:
    return sum(t.bytes * (layers if t.per_layer else 1) for t in terms)


@pytest.mark.parametrize("engine", ["megatron-core", "torchtitan"])
def test_saved_activations_match_the_engine_run_on_cpu(engine: str) -> None:
    """memlib's terms for each engine's CPU path against the bytes the engine's forward saved (within 3 %)."""
    run = next(r for r in FIXTURE["runs"] if r["engine"] == engine)
    cfg = load_config(FIXTURE["config"])
    b, s = FIXTURE["batch_size"], FIXTURE["seq_len"]
    if engine == "megatron-core":
        terms = megatron_core_activation_terms(cfg, b, s, 2, "eager", "local-cpu")
    else:
        terms = torchtitan_activation_terms(cfg, b, s, 2, device="cpu")
    est = _total(terms, cfg.num_layers)
    assert abs(est - run["saved_bytes"]) / run["saved_bytes"] < 0.03, (engine, est, run["saved_bytes"])


def test_three_implementations_of_llama_70b_side_by_side() -> None:
    """Per layer, in units of sbh: transformers ≈ 48.5, TorchTitan ≈ 40.5, Megatron-Core TE ≈ 33.5; Megatron's
    theoretical_memory_usage.py: 18 + 4f/h = 32."""
    cfg = load_config("llama-3.1-70b")
    s, h = 8192, cfg.hidden_size
    unit = s * h
    te = sum(t.bytes for t in megatron_core_activation_terms(cfg, 1, s) if t.per_layer) / unit
    tt = sum(t.bytes for t in torchtitan_activation_terms(cfg, 1, s) if t.per_layer) / unit
    assert 18 + 4 * cfg.intermediate_size / h == 32  # megatron/training/theoretical_memory_usage.py
    assert 32 < te < 34 < tt < 41


def test_megatron_with_tp_uses_megatron_core_activations() -> None:
    kw = dict(seq_len=4096, num_gpus=8, tp=8, sequence_parallel=True, zero_stage=1)
    mg = estimate_training("llama-3.1-70b", framework="megatron", **kw)
    tt = estimate_training("llama-3.1-70b", framework="fsdp2", **{**kw, "zero_stage": 3})
    assert mg.activations_bytes < tt.activations_bytes


def test_llama3_128k_optimizer_state_shards_over_dp_times_cp() -> None:
    """Llama 3's 128K layout (TP 8, CP 16, PP 16, DP 8): the distributed optimizer over dp·cp = 128 ranks."""
    e = estimate_training("llama-3.1-405b", framework="megatron", zero_stage=1, num_gpus=16384, tp=8, cp=16, pp=16,
                          micro_batches=16, seq_len=131072, batch_size=1, recompute="full")
    assert e.settings["zero_ranks"] == 128
    assert e.optimizer_bytes / GIB == pytest.approx(0.30, abs=0.01)


def test_moe_parallel_folding_accepts_tp8_ep8_on_8_gpus() -> None:
    e = estimate_training("mixtral-8x7b", framework="megatron", num_gpus=8, tp=8, ep=8)
    assert (e.settings["etp"], e.settings["local_experts"], e.settings["expert_data_parallel"]) == (1, 1, 1)
    assert main(["train", "mixtral-8x7b", "--framework", "megatron", "--gpus", "8", "--tp", "8", "--ep", "8"]) == 0


def test_etp_splits_the_experts_and_must_fit_the_gpus() -> None:
    kw = dict(framework="megatron", num_gpus=16, tp=2, ep=8, zero_stage=0)
    one, two = (estimate_training("mixtral-8x7b", etp=k, **kw) for k in (1, 2))
    assert two.params_bytes < one.params_bytes
    with pytest.raises(MemlibError, match=r"gpus 8 is not divisible by etp·ep·pp = 2·8·1 = 16"):
        estimate_training("mixtral-8x7b", etp=2, **{**kw, "num_gpus": 8})


def test_fsdp2_takes_torchtitans_4d_layout(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "llama-3.1-70b", "--framework", "fsdp2", "--zero", "3", "--gpus", "64", "--tp", "8",
                 "--seq", "8192"]) == 0
    assert "framework=fsdp2" in capsys.readouterr().out
    assert main(["train", "llama-3.1-70b", "--framework", "fsdp2", "--zero", "3", "--gpus", "64", "--ep", "2"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_both_bubble_definitions() -> None:
    """Narayanan et al. §2.2.1's t_pb/t_id = (p−1)/m and the idle share of the step (p−1)/(m+p−1)."""
    assert bubble_ratio(8, 16) == pytest.approx(7 / 16)
    assert bubble_fraction(8, 16) == pytest.approx(7 / 23)
    assert bubble_ratio(8, 16, "interleaved", 2) == pytest.approx(7 / 32)


@given(p=st.integers(1, 64), m=st.integers(1, 256),
       schedule=st.sampled_from(["gpipe", "1f1b", "zb-h1", "zb-h2", "zbv", "dualpipe", "dualpipev"]))
def test_bubble_ratio_is_the_fraction_over_its_complement(p: int, m: int, schedule: str) -> None:
    f = bubble_fraction(p, m, schedule)
    assert 0 <= f < 1 and bubble_ratio(p, m, schedule) == pytest.approx(f / (1 - f))
    assert bubble_fraction(p, m, "zb-h1") <= bubble_fraction(p, m, "1f1b")


def test_zero_bubble_and_dualpipe_memory() -> None:
    p, m = 8, 32
    assert in_flight(p, m, "zb-h1") == in_flight(p, m, "1f1b") == in_flight(p, m, "zbv") == p
    assert in_flight(p, m, "zb-h2") == 2 * p - 1
    assert in_flight(p, m, "dualpipe") == in_flight(p, m, "dualpipev") == p + 1
    assert zero_bubble_units(p, "zb-h1") == zero_bubble_units(p, "1f1b") / 3
    assert (schedule_weight_copies("dualpipe"), schedule_weight_copies("dualpipev")) == (2, 1)
    kw = dict(framework="megatron", num_gpus=8, pp=8, micro_batches=32, seq_len=4096, zero_stage=1)
    one, dual = (estimate_training("llama-3-8b", pp_schedule=sch, **kw) for sch in ("1f1b", "dualpipe"))
    assert dual.params_bytes == pytest.approx(2 * one.params_bytes, rel=1e-3)
    assert dual.activations_bytes > one.activations_bytes


def test_check_layout_default_etp() -> None:
    cfg = load_config("mixtral-8x7b")
    assert check_layout(cfg, 8, tp=8, ep=8).etp == 1
    assert check_layout(cfg, 16, tp=2).etp == 2


@given(tp=st.sampled_from([1, 2, 4, 8]), pp=st.sampled_from([1, 2, 4]), cp=st.sampled_from([1, 2, 4, 16]),
       dp=st.sampled_from([1, 2, 8]))
def test_distributed_optimizer_shards_over_dp_times_cp(tp: int, pp: int, cp: int, dp: int) -> None:
    """Megatron's 12 bytes of optimizer state per parameter divide by dp·cp, whatever tp and pp are."""
    n = 7_000_000_000
    e = estimate_training(params=n, num_gpus=tp * pp * cp * dp, tp=tp, pp=pp, cp=cp, zero_stage=1,
                          framework="megatron")
    per_rank = -(-n // (tp * pp))
    assert e.optimizer_bytes == pytest.approx(12 * per_rank / (dp * cp), rel=1e-6)


TP = FIXTURE["tensor_parallel"]


def _tp_run(sp: bool, layers: int) -> dict:
    return next(r for r in TP["runs"] if (r["sequence_parallel"], r["layers"]) == (sp, layers))


def _per_layer(sp: bool, key: str) -> dict:
    one, two = _tp_run(sp, 1)[key], _tp_run(sp, 2)[key]
    return {k: two.get(k, 0) - one.get(k, 0) for k in two if two.get(k, 0) - one.get(k, 0)}


def test_torchtitan_tp_plan_gathers_twice_per_layer_like_megatron() -> None:
    """TorchTitan's plan with SP, two gloo ranks: per layer 2 all-gathers + 2 reduce-scatters forward and as many
    backward (Megatron's count, Korthikanti et al. §4.2.2: memlib's ``backward_collectives=2``), not the naive
    DTensor plan's 5 column-parallel gathers (:func:`memlib.core.parallel.column_linears`)."""
    assert TP["tp"] == 2 and TP["version"] == "0.3.0"
    assert _per_layer(True, "forward_collectives") == {"all_gather": 2, "reduce_scatter": 2}
    assert _per_layer(True, "step_collectives") == {"all_gather": 4, "reduce_scatter": 4}
    assert _per_layer(False, "forward_collectives") == {"all_reduce": 2}
    assert column_linears(load_config(FIXTURE["config"])) == 5


@pytest.mark.parametrize("sp", [True, False])
@pytest.mark.parametrize("layers", [1, 2])
def test_torchtitan_tp_saved_activations_per_rank(sp: bool, layers: int) -> None:
    """memlib's TorchTitan terms split over tp = 2 (:func:`memlib.core.parallel.split_terms`) against rank 0's saved
    bytes: within 3 % (the vocab-parallel loss's int64 local labels and two bool masks, 10·b·s, are not in the
    terms), and one layer's bytes (2 layers less 1) to the byte."""
    b, s = FIXTURE["batch_size"], FIXTURE["seq_len"]
    cfg = load_config({**FIXTURE["config"], "num_hidden_layers": layers})
    per_layer, first, last = split_terms(torchtitan_activation_terms(cfg, b, s, 2, device="cpu"), 2, sp)
    measured = _tp_run(sp, layers)["saved_bytes"]
    assert abs(layers * per_layer + first + last - measured) <= 0.03 * measured
    assert per_layer == _tp_run(sp, 2)["saved_bytes"] - _tp_run(sp, 1)["saved_bytes"]
