"""memlib plan: the cheapest combination of techniques that fits (Chapter 13)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memlib import GB, GiB, MemlibError
from memlib.cli import main
from memlib.estimate import estimate_inference, estimate_training
from memlib.plan import PRIORITY, plan

SCENARIOS = [
    ("gpt2", dict(num_gpus=1, batch_size=8, seq_len=1024)),
    ("llama-2-7b", dict(num_gpus=8, batch_size=4, seq_len=4096)),
]


def _ladder(name: str, kw: dict) -> list:
    """Every rung at its smallest (nothing fits in 1 MB, so every rung is taken at its last variant)."""
    p = plan(name, gpu_memory=10**6, reserve=0, **kw)
    assert not p.fits
    return p.steps


def _estimate(settings: dict) -> int:
    kw = {k: v for k, v in settings.items() if k != "accumulation_steps"}
    model = kw.pop("model", None)
    return estimate_training(model, **kw).total_bytes


def test_nothing_needed_for_a_small_model() -> None:
    p = plan("gpt2", gpu_memory="80GB", batch_size=1, seq_len=512)
    assert p.fits and len(p.steps) == 1 and p.steps[0].technique == "baseline"
    assert p.chosen.settings["precision"] == "fp32" and p.chosen.settings["attention"] == "eager"


@pytest.mark.parametrize("name, kw", SCENARIOS, ids=[s[0] for s in SCENARIOS])
def test_each_technique_can_be_the_first_that_fits(name: str, kw: dict) -> None:
    steps = _ladder(name, kw)
    best = steps[0].per_gpu_bytes
    tried = 0
    for j, rung in enumerate(steps[1:], start=1):
        if not rung.applicable:
            continue
        if rung.per_gpu_bytes < best:
            p = plan(name, gpu_memory=rung.per_gpu_bytes, reserve=0, **kw)
            assert p.fits
            assert p.steps[-1].technique == rung.technique, (rung.technique, [s.technique for s in p.steps])
            assert all(not s.fits for s in p.steps[:-1] if s.applicable)
            assert p.chosen.per_gpu_bytes <= rung.per_gpu_bytes
            tried += 1
        best = min(best, rung.per_gpu_bytes)
    assert tried >= 6


def test_every_priority_technique_is_first_somewhere() -> None:
    firsts = set()
    for name, kw in SCENARIOS:
        steps = _ladder(name, kw)
        best = steps[0].per_gpu_bytes
        for rung in steps[1:]:
            if rung.applicable and rung.per_gpu_bytes < best:
                firsts.add(rung.technique)
            best = min(best, rung.per_gpu_bytes)
    assert firsts == set(PRIORITY)


def test_pruning_drops_rungs_the_fit_does_not_need() -> None:
    # 7B on 8 × 80 GB, batch 4 × 2048: ZeRO-2 makes it fit; checkpointing and accumulation are not needed
    p = plan("llama-2-7b", num_gpus=8, gpu_memory="80GB", batch_size=4, seq_len=2048)
    assert p.fits and p.steps[-1].technique == "ZeRO-2"
    needed = {s.technique: s.needed for s in p.steps}
    assert needed["activation checkpointing"] is False and needed["gradient accumulation"] is False
    assert p.chosen.settings["recompute"] == "none" and p.chosen.settings["accumulation_steps"] == 1
    assert p.chosen.settings["zero_stage"] == 2 and p.chosen.settings["precision"] == "bf16-mixed"
    assert p.chosen.per_gpu_bytes == _estimate({**p.chosen.settings, "model": "llama-2-7b"})


def test_nothing_fits_names_the_closest_option() -> None:
    p = plan("llama-2-70b", job="train", num_gpus=2, gpu_memory="8GB", batch_size=1, seq_len=4096)
    assert not p.fits and p.chosen is None
    assert p.closest.per_gpu_bytes == min(s.per_gpu_bytes for s in p.steps)
    assert p.closest.per_gpu_bytes > 8 * GB - 2 * GiB
    # with everything offloaded, each GPU still holds one sequence's activations and the gathered layers:
    # more data-parallel GPUs do not help
    assert p.min_gpus is None


def test_inference_that_does_not_fit_names_the_gpus_needed() -> None:
    kw = dict(job="infer", gpu_memory="24GB", batch_size=8, seq_len=4096)
    p = plan("llama-2-70b", num_gpus=1, **kw)
    assert not p.fits and p.min_gpus is not None and p.min_gpus > 1
    assert plan("llama-2-70b", num_gpus=p.min_gpus, **kw).fits
    assert not plan("llama-2-70b", num_gpus=p.min_gpus - 1, **kw).fits


def test_qlora_65b_class_model_on_one_48gb_gpu() -> None:
    # the QLoRA paper's claim, with Llama-2-70B as the stand-in for LLaMA-65B
    p = plan("llama-2-70b", job="qlora", num_gpus=1, gpu_memory="48GB", batch_size=1, seq_len=512)
    assert p.fits and p.chosen.settings["method"] == "qlora"
    assert p.chosen.per_gpu_bytes <= 48 * GB - 2 * GiB


def test_inference_ladder() -> None:
    p = plan("llama-2-7b", job="infer", gpu_memory="24GiB", batch_size=8, seq_len=2048)
    e = estimate_inference("llama-2-7b", batch_size=8, seq_len=2048)
    assert p.fits and p.chosen.technique == "baseline" and p.chosen.per_gpu_bytes == e.total_bytes
    p16 = plan("llama-2-7b", job="infer", gpu_memory="16GiB", batch_size=8, seq_len=2048)
    assert p16.fits and p16.chosen.technique in ("fp8 KV cache", "int8 weights")


@settings(max_examples=25, deadline=None)
@given(name=st.sampled_from(["gpt2", "qwen2-0.5b", "llama-2-7b", "llama-3-8b", "llama-2-70b"]),
       job=st.sampled_from(["train", "lora", "qlora"]), gpus=st.sampled_from([1, 2, 8, 64]),
       mem_gb=st.sampled_from([16, 24, 40, 48, 80, 141]), batch=st.sampled_from([1, 2, 4, 8]),
       seq=st.sampled_from([512, 2048, 4096]))
def test_never_says_fits_when_the_estimate_exceeds_memory(name: str, job: str, gpus: int, mem_gb: int, batch: int,
                                                         seq: int) -> None:
    p = plan(name, job=job, num_gpus=gpus, gpu_memory=mem_gb * GB, batch_size=batch, seq_len=seq)
    budget = mem_gb * GB - 2 * GiB
    for s in p.steps:
        assert s.fits == (s.per_gpu_bytes <= budget)
    if p.fits:
        assert p.chosen.per_gpu_bytes <= budget
        assert _estimate({**p.chosen.settings, "model": name}) == p.chosen.per_gpu_bytes
        acc = p.chosen.settings["accumulation_steps"]
        assert p.chosen.settings["batch_size"] * acc == batch
    else:
        assert all(not s.fits for s in p.steps)


def test_bad_input() -> None:
    with pytest.raises(MemlibError, match="unknown job 'pretrain'"):
        plan("gpt2", job="pretrain")
    with pytest.raises(MemlibError, match="reserve"):
        plan("gpt2", gpu_memory="1GB", reserve="2GB")
    with pytest.raises(MemlibError, match="num_gpus"):
        plan("gpt2", num_gpus=0)


def test_cli_plan_json_and_text(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "llama-2-7b", "--gpus", "8", "--gpu-mem", "80GB", "--batch", "4", "--seq", "2048",
                 "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["fits"] and data["chosen"]["settings"]["zero_stage"] == 2
    assert main(["plan", "llama-2-70b", "--gpus", "2", "--gpu-mem", "8GB", "--seq", "4096"]) == 0
    out = capsys.readouterr().out
    assert "does not fit: closest is" in out and "more GPUs would not help" in out
    assert main(["plan", "llama-2-70b", "--job", "infer", "--gpu-mem", "24GB", "--batch", "8", "--seq", "4096"]) == 0
    assert "it would need" in capsys.readouterr().out


def test_cli_plan_gpu_from_the_spec_table(capsys: pytest.CaptureFixture[str]) -> None:
    from memlib.gpus import get_gpu

    assert main(["plan", "llama-2-7b", "--gpu", "rtx-4090", "--job", "qlora", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["inputs"]["gpu_memory"] == get_gpu("rtx-4090").memory_bytes and data["fits"]


@pytest.mark.parametrize("argv, needle", [
    (["plan", "llama-9b"], "unknown model 'llama-9b'"),
    (["plan", "gpt2", "--gpu", "h100-sxm", "--gpu-mem", "80GB"], "give --gpu or --gpu-mem, not both"),
    (["plan", "gpt2", "--gpu", "b200"], "invalid choice: 'b200'"),
    (["plan", "gpt2", "--gpu-mem=-5GB"], "-5GB"),
    (["plan", "gpt2", "--job", "pretrain"], "invalid choice: 'pretrain'"),
    (["plan", "gpt2", "--gpu-mem", "1GB", "--reserve", "4GB"], "reserve"),
    (["plan", "gpt2", "--gpus", "0"], "expected a positive integer"),
])
def test_cli_plan_bad_input(argv: list[str], needle: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "memlib", *argv], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert needle in proc.stderr and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
