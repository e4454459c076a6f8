"""The pure parallelism model (memlib.core.parallel): Korthikanti's formulas, bubbles, layouts, bad input (Chapter 15)."""
from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memlib.cli import main
from memlib.core.configs import load_config
from memlib.core.errors import MemlibError
from memlib.core.estimate import activation_terms, estimate_training, korthikanti_activation_bytes
from memlib.core.parallel import (Layout, bubble_fraction, check_layout, comm_bytes_per_layer, expert_parallel_bytes,
                             in_flight, korthikanti_layer_bytes, split_terms, stage_layers, stage_params, term_split,
                             valid_tp)
from memlib.core.params import count_params


def test_korthikanti_table2() -> None:
    """Korthikanti et al. 2022, Table 2, for GPT-3 175B's layer (s=2048, h=12288, a=96), b=1, t=8."""
    s, b, h, a, t = 2048, 1, 12288, 96, 8
    assert korthikanti_layer_bytes(s, b, h, a) == int(s * b * h * (34 + 5 * a * s / h))
    assert korthikanti_layer_bytes(s, b, h, a, tp=t) == int(s * b * h * (10 + 24 / t + 5 * a * s / (h * t)))
    assert korthikanti_layer_bytes(s, b, h, a, tp=t, sequence_parallel=True) == int(s * b * h / t * (34 + 5 * a * s / h))
    assert korthikanti_layer_bytes(s, b, h, a, tp=t, sequence_parallel=True, recompute="selective") == int(
        s * b * h * 34 / t)
    assert korthikanti_layer_bytes(s, b, h, a, tp=t, recompute="full") == 2 * s * b * h
    # t = 1 is the book's Chapter 1 reference formula
    assert korthikanti_layer_bytes(512, 2, 768, 12) == korthikanti_activation_bytes("gpt2", 2, 512)


def test_sequence_parallel_divides_every_term() -> None:
    """With TP + SP, every per-layer term of a Llama layer is divided by t (nothing replicated)."""
    terms = activation_terms("llama-3-8b", batch_size=1, seq_len=4096)
    full, _, _ = split_terms(terms, 1, False)
    sp, _, _ = split_terms(terms, 8, True)
    tp, _, _ = split_terms(terms, 8, False)
    assert sp == pytest.approx(full / 8, rel=1e-6)
    assert sp < tp < full
    assert {term_split(t.name) for t in terms if t.per_layer} == {"tp", "sp"}


def test_gpt2_tp_split_matches_korthikanti_shape() -> None:
    """GPT-2's derived terms: the replicated (SP) part is ≈ 10 sbh-equivalents, the TP part ≈ 24 (fp16, eager)."""
    terms = activation_terms("gpt2", batch_size=1, seq_len=1024, precision="fp16-mixed", attention="eager")
    sbh = 1024 * 768
    rep = sum(t.bytes for t in terms if t.per_layer and term_split(t.name) == "sp") / sbh
    assert 9 < rep < 11  # Korthikanti's 10 (2 LayerNorm inputs 4, residual dropout masks 2, ...)


def test_bubble_and_in_flight() -> None:
    assert bubble_fraction(4, 8) == pytest.approx(3 / 11)
    assert bubble_fraction(4, 8, "gpipe") == bubble_fraction(4, 8, "1f1b")
    assert bubble_fraction(4, 8, "interleaved", 2) == pytest.approx(3 / 19)
    assert in_flight(4, 8, "gpipe") == 8
    assert in_flight(4, 8, "1f1b") == 4
    assert in_flight(4, 8, "1f1b", stage=3) == 1
    assert in_flight(4, 2, "1f1b") == 2
    # Korthikanti §4.2.3: p·(1 + (p−1)/(pv)) stage-equivalents on the first stage
    assert in_flight(4, 8, "interleaved", 0, 2) == pytest.approx(4 * (1 + 3 / 8))


@settings(max_examples=60, deadline=None)
@given(p=st.integers(1, 16), m=st.integers(1, 64), v=st.integers(1, 4))
def test_bubble_invariants(p: int, m: int, v: int) -> None:
    b = bubble_fraction(p, m)
    assert 0 <= b < 1
    assert bubble_fraction(p, m + 1) <= b  # more micro-batches, smaller bubble
    assert bubble_fraction(p, m, "interleaved", v) <= b
    assert in_flight(p, m, "1f1b") <= in_flight(p, m, "gpipe")
    assert all(in_flight(p, m, "1f1b", i) >= in_flight(p, m, "1f1b", i + 1) for i in range(p - 1))


@settings(max_examples=60, deadline=None)
@given(L=st.integers(1, 200), p=st.integers(1, 200))
def test_stage_layers(L: int, p: int) -> None:
    if p > L:
        with pytest.raises(MemlibError, match="expected 1 to"):
            stage_layers(L, p)
        return
    layers = stage_layers(L, p)
    assert sum(layers) == L and len(layers) == p and max(layers) - min(layers) <= 1
    assert layers == sorted(layers, reverse=True)


def test_stage_params_sum_to_model() -> None:
    """Over the tp × pp grid, the stages hold the model once (the replicated norms t times)."""
    cfg = load_config("llama-3-8b")
    n = count_params(cfg).params
    assert sum(stage_params(cfg, 1, 4)) == n
    per_gpu = sum(stage_params(cfg, 8, 4))
    norms = (2 * cfg.num_layers + 1) * cfg.hidden_size
    assert per_gpu * 8 == pytest.approx(n + 7 * norms, abs=8 * 4)


def test_defaults_unchanged() -> None:
    """tp=pp=cp=ep=1 gives today's numbers exactly."""
    a = estimate_training("llama-2-7b", batch_size=2, seq_len=1024, zero_stage=3, num_gpus=8, framework="deepspeed")
    b = estimate_training("llama-2-7b", batch_size=2, seq_len=1024, zero_stage=3, num_gpus=8, tp=1, pp=1, cp=1, ep=1,
                          framework="deepspeed")
    assert a == b


@settings(max_examples=25, deadline=None)
@given(tp=st.sampled_from([1, 2, 4, 8]), pp=st.sampled_from([1, 2, 4]), cp=st.sampled_from([1, 2]),
       sp=st.booleans())
def test_more_parallelism_never_more_memory(tp: int, pp: int, cp: int, sp: bool) -> None:
    """Splitting further (same total GPUs, ZeRO-1 over dp) never raises the worst rank's activations per layer,
    and the worst rank's parameters shrink with tp·pp."""
    kw = dict(batch_size=1, seq_len=4096, zero_stage=0, num_gpus=64, micro_batches=8, framework="megatron")
    e = estimate_training("llama-3-8b", tp=tp, pp=pp, cp=cp, sequence_parallel=sp, **kw)
    e2 = estimate_training("llama-3-8b", tp=2 * tp if tp < 8 else tp, pp=pp, cp=cp, sequence_parallel=sp, **kw)
    assert e2.params_bytes <= e.params_bytes
    assert e2.activations_bytes <= e.activations_bytes
    assert e.settings["dp"] * tp * pp * cp == 64


def test_pipeline_first_stage_is_worst_with_1f1b() -> None:
    e = estimate_training("llama-3-8b", seq_len=4096, num_gpus=8, pp=8, micro_batches=16, framework="megatron")
    g = estimate_training("llama-3-8b", seq_len=4096, num_gpus=8, pp=8, micro_batches=16, pp_schedule="gpipe",
                          framework="megatron")
    assert e.settings["worst_stage"] == 0
    # GPipe holds all 16 micro-batches on every stage: twice 1F1B's first stage at least, and the last stage,
    # with 16 micro-batches of fp32 logits, becomes the worst
    assert g.activations_bytes >= 2 * e.activations_bytes
    assert g.settings["worst_stage"] == 7


def test_expert_parallel() -> None:
    r = expert_parallel_bytes(num_experts=8, expert_params=1000, ep=4, tokens=64, hidden_size=16, top_k=2,
                              param_bytes=4, act_bytes=4)
    assert r["expert_weights_bytes"] == 2 * 1000 * 4
    assert r["a2a_buffer_bytes"] == 2 * 2 * 64 * 16 * 4
    assert r["a2a_bytes_sent"] == 2 * 64 * 16 * 4 * 3 // 4


def test_comm_bytes() -> None:
    cfg = load_config("llama-3-8b")
    c = comm_bytes_per_layer(cfg, 1, 4096, Layout(tp=8, sequence_parallel=True))
    act = 2 * 4096 * cfg.hidden_size
    assert c["tp"] == 8 * act * 7 // 8  # the same volume as 4 all-reduces
    assert comm_bytes_per_layer(cfg, 1, 4096, Layout())["tp"] == 0


def test_valid_tp() -> None:
    assert valid_tp("llama-3.1-70b") == [1, 2, 4, 8]
    assert 3 not in valid_tp("llama-2-7b")


@pytest.mark.parametrize("kw, msg", [
    (dict(tp=3, num_gpus=3), "tp 3 does not divide llama-3.1-70b's 64 attention heads and 8 KV heads; expected one "
                             "of: 1, 2, 4, 8"),
    (dict(pp=81, num_gpus=81), "pp 81 is more than llama-3.1-70b's 80 layers; expected 1 to 80"),
    (dict(tp=8, num_gpus=12), "gpus 12 is not divisible by tp·pp·cp = 8·1·1 = 8; expected a multiple of 8"),
    (dict(ep=2, num_gpus=2), "ep 2 needs an MoE model; llama-3.1-70b has no experts; expected ep 1"),
    (dict(pp=4, num_gpus=4, micro_batches=6, pp_schedule="interleaved"), "not a multiple of pp 4"),
    (dict(cp=2, num_gpus=2, attention="eager"), "needs attention 'sdpa'"),
    (dict(pp=3, num_gpus=3, micro_batches=6, pp_schedule="interleaved"),
     "80 layers do not split into pp·v = 3·2 chunks; expected pp one of: 1, 2, 4, 5, 8, 10, 20, 40"),
])
def test_bad_input_one_line(kw: dict, msg: str) -> None:
    with pytest.raises(MemlibError) as err:
        estimate_training("llama-3.1-70b", seq_len=1024, framework="megatron", **kw)
    assert msg in str(err.value) and "\n" not in str(err.value)


def test_ep_must_divide_experts() -> None:
    cfg = load_config("mixtral-8x7b", any_family=True)
    with pytest.raises(MemlibError, match="ep 3 does not divide mixtral-8x7b's 8 experts; expected one of: 1, 2, 4, 8"):
        check_layout(cfg, 24, ep=3)
    assert check_layout(cfg, 8, ep=8).ep == 8


def test_cli(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "llama-3.1-70b", "--tp", "8", "--sequence-parallel", "--pp", "2", "--micro-batches", "8",
                 "--gpus", "16", "--seq", "4096", "--framework", "megatron", "--json"]) == 0
    assert '"worst_stage": 0' in capsys.readouterr().out
    assert main(["train", "llama-3.1-70b", "--tp", "3", "--gpus", "3", "--framework", "megatron"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "expected one of: 1, 2, 4, 8" in err


def test_cli_exit_2_no_traceback() -> None:
    r = subprocess.run([sys.executable, "-m", "memlib", "train", "llama-3.1-70b", "--pp", "100", "--gpus", "100",
                        "--framework", "megatron"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr and "expected 1 to 80" in r.stderr


def test_parallel_does_not_import_torch() -> None:
    code = "import sys, memlib.core.parallel, memlib.core.estimate; assert 'torch' not in sys.modules"
    assert subprocess.run([sys.executable, "-c", code], timeout=120).returncode == 0


def test_plan_parallel_uses_valid_degrees_only() -> None:
    from memlib.core.plan import plan_parallel

    for model, n in (("llama-3.1-70b", 64), ("llama-3.1-405b", 128), ("llama-3.1-8b", 8)):
        p = plan_parallel(model, num_gpus=n, seq_len=8192)
        cfg = load_config(model)
        assert p.fits
        for st in p.steps:
            x = st.settings
            assert cfg.num_heads % x["tp"] == 0 and cfg.num_kv_heads % x["tp"] == 0 and x["tp"] <= 8
            assert x["tp"] * x["pp"] * x["cp"] * x["dp"] == n and x["pp"] <= cfg.num_layers
        assert p.chosen is not None and p.chosen.per_gpu_bytes + p.chosen.reserve_bytes <= 80 * 2**30


def test_plan_parallel_llama3_recipes() -> None:
    """Llama 3 (Dubey et al. 2024, Table 4): 405B at 8K tokens uses TP 8 inside a node and PP across nodes;
    long context (128K) adds CP 16 on thousands of GPUs."""
    from memlib.core.plan import plan_parallel

    p = plan_parallel("llama-3.1-405b", num_gpus=128, seq_len=8192)
    assert p.chosen is not None and p.chosen.settings["tp"] == 8 and p.chosen.settings["pp"] > 1
    long = plan_parallel("llama-3.1-405b", num_gpus=128, seq_len=131072)
    assert not long.fits and long.min_gpus is not None and long.min_gpus >= 2048
    small = plan_parallel("llama-3.1-70b", num_gpus=8, seq_len=8192)
    # Megatron's 18 bytes/param (bf16 params, fp32 main_grad, fp32 main params and Adam): 8 × 80 GiB hold no layout,
    # and at 16 GPUs tp 8 × pp 2 leaves dp 1 (the distributed optimizer shards nothing): 4.4B × 18 B > 80 GiB
    assert not small.fits and small.min_gpus == 32


def test_plan_parallel_tp_beats_zero3_when_activations_overflow() -> None:
    from memlib.core.plan import plan_parallel

    p = plan_parallel("llama-3.1-8b", num_gpus=8, seq_len=8192)
    assert [s.technique for s in p.steps][:2] == ["data parallel + ZeRO-1", "ZeRO-3 / FSDP"]
    assert not p.steps[1].fits and p.chosen is not None and p.chosen.settings["tp"] > 1


def test_plan_cli_parallel(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "llama-3.1-70b", "--parallel", "--gpus", "64", "--seq", "8192"]) == 0
    assert "fits: tp=8" in capsys.readouterr().out
    assert main(["plan", "llama-3.1-70b", "--parallel", "--gpus", "6", "--tp", "3"]) == 2
    assert "expected one of: 1, 2, 4, 8" in capsys.readouterr().err
    assert main(["plan", "llama-3.1-70b", "--tp", "2", "--gpus", "2"]) == 2
    assert "need --parallel" in capsys.readouterr().err
    assert main(["plan", "llama-3.1-70b", "--parallel", "--gpus", "12", "--tp", "8"]) == 2
    assert "gpus 12 is not divisible by tp·pp·cp" in capsys.readouterr().err


def test_parallel_drills_graded_by_memlib() -> None:
    from memlib.drills import DRILL_KINDS, QUESTIONS, generate, grade

    assert {"pp_bubble", "tp_activations", "pp_first_stage", "dp_degree"} <= set(DRILL_KINDS)
    assert sum(q.chapter == 15 for q in QUESTIONS) >= 10
    for seed in range(20):
        d = generate("pp_bubble", seed)
        p, m = d.settings["pp"], d.settings["micro_batches"]
        v = 2 if d.settings["schedule"] == "interleaved" else 1
        assert d.answer == pytest.approx(100 * (p - 1) / (v * m + p - 1))
        assert grade(d, d.answer) and not grade(d, d.answer + 5)
        f = generate("pp_first_stage", seed)
        if f.settings["schedule"] == "1f1b":
            assert f.answer == min(f.settings["pp"], f.settings["micro_batches"])
        g = generate("dp_degree", seed)
        s = g.settings
        assert g.answer * s["tp"] * s["pp"] * s["cp"] == s["num_gpus"]


def test_params_only_estimate_echoes_the_layout() -> None:
    e = estimate_training(params=7_000_000_000, num_gpus=16, tp=2, pp=2, zero_stage=1, framework="megatron")
    assert e.settings["num_gpus"] == 16 and e.settings["dp"] == 4 and e.activations_bytes is None
    assert e.params_bytes == 2 * 7_000_000_000 // 4  # 16-bit weights of one tp × pp shard
    assert e.grads_bytes == 4 * 7_000_000_000 // 4  # Megatron's fp32 main_grad buffer
    assert e.optimizer_bytes == 12 * 7_000_000_000 // 4 // 4  # ZeRO-1 over dp = 4
