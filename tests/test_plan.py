"""memlib plan: the cheapest combination of techniques that fits (Chapter 13)."""
from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memlib import GB, GiB, MemlibError
from memlib.cli import main
from memlib.core.estimate import estimate_inference, estimate_training
from memlib.core.configs import load_config
from memlib.core.hardware import get_gpu
from memlib.core.inference import reserve_bytes, serving_fit
from memlib.core.plan import DEFAULT_RESERVE, PRIORITY, plan

SCENARIOS = [
    ("gpt2", dict(num_gpus=1, batch_size=8, seq_len=1024, framework="deepspeed")),
    ("llama-2-7b", dict(num_gpus=8, batch_size=4, seq_len=4096, framework="deepspeed")),
    ("llama-2-7b", dict(num_gpus=8, batch_size=4, seq_len=4096)),  # pytorch: ZeRO-1, then the switch to DeepSpeed
    # DeepSpeed's stage-0 step (FP16_Optimizer, 24 B/param) outweighs gpt2's activations: checkpointing first here
    ("gpt2", dict(num_gpus=1, batch_size=8, seq_len=1024)),
]


def _ladder(name: str, kw: dict) -> list:
    """Every rung at its smallest (nothing fits in 1 MB, so every rung is taken at its last variant)."""
    p = plan(name, gpu_memory=10**6, reserve=0, fragmentation=0, **kw)
    assert not p.fits
    return p.steps


def _estimate(settings: dict) -> int:
    kw = {k: v for k, v in settings.items() if k != "accumulation_steps"}
    model = kw.pop("model", None)
    return estimate_training(model, **kw).total_bytes


def test_nothing_needed_for_a_small_model() -> None:
    p = plan("gpt2", gpu_memory="80GiB", batch_size=1, seq_len=512)
    assert p.fits and len(p.steps) == 1 and p.steps[0].technique == "baseline"
    assert p.chosen.settings["precision"] == "fp32" and p.chosen.settings["attention"] == "eager"


@pytest.mark.parametrize("name, kw", SCENARIOS, ids=[f"{s[0]}-{s[1].get('framework', 'pytorch')}" for s in SCENARIOS])
def test_each_technique_can_be_the_first_that_fits(name: str, kw: dict) -> None:
    steps = _ladder(name, kw)
    best = steps[0].per_gpu_bytes
    tried = 0
    for j, rung in enumerate(steps[1:], start=1):
        if not rung.applicable:
            continue
        if rung.per_gpu_bytes < best:
            p = plan(name, gpu_memory=rung.per_gpu_bytes, reserve=0, fragmentation=0, **kw)
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
    p = plan("llama-2-7b", num_gpus=8, gpu_memory="80GiB", batch_size=4, seq_len=2048, framework="deepspeed")
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
    assert p.closest.total_bytes > 8 * GB
    # with everything offloaded, each GPU still holds one sequence's activations and the gathered layers:
    # more data-parallel GPUs do not help
    assert p.min_gpus is None


def test_inference_that_does_not_fit_names_the_gpus_needed() -> None:
    kw = dict(job="infer", gpu_memory="24GB", batch_size=8, seq_len=4096)
    p = plan("llama-2-70b", num_gpus=1, **kw)
    assert not p.fits and p.min_gpus is not None and p.min_gpus > 1
    assert plan("llama-2-70b", num_gpus=p.min_gpus, **kw).fits
    assert not plan("llama-2-70b", num_gpus=p.min_gpus - 1, **kw).fits


def test_qlora_65b_class_model_on_one_48gib_gpu() -> None:
    # the QLoRA paper's claim, with Llama-2-70B as the stand-in for LLaMA-65B, on a 48 GiB card (L40S, A6000)
    p = plan("llama-2-70b", job="qlora", num_gpus=1, gpu_memory="48GiB", batch_size=1, seq_len=512)
    assert p.fits and p.chosen.settings["method"] == "qlora" and p.chosen.settings["offload"] == "none"
    assert p.chosen.total_bytes <= 48 * GiB
    assert p.chosen.reserve_bytes == reserve_bytes(p.chosen.per_gpu_bytes)


def test_qlora_llama3_70b_fits_a_48gib_card_without_offload() -> None:
    # issue: the card's capacity is binary; in decimal GB the planner offloaded
    p = plan("llama-3-70b", job="qlora", gpu_memory=get_gpu("l40s").memory_bytes, batch_size=1, seq_len=2048)
    assert p.fits and p.chosen.settings["offload"] == "none" and p.chosen.settings["optimizer"] == "adamw"


def test_one_reserve_policy() -> None:
    # fits ⇔ estimate + 1 GiB + 5 % of the estimate ≤ GPU memory, for every rung
    p = plan("llama-2-7b", gpu_memory="40GiB", batch_size=2, seq_len=4096)
    for st in p.steps:
        assert st.reserve_bytes == DEFAULT_RESERVE + math.ceil(0.05 * st.per_gpu_bytes)
        assert st.fits == (st.total_bytes <= 40 * GiB)


def test_inference_uses_the_serving_fit_of_chapter_11() -> None:
    # issue: 22.07 GB of weights + KV cache "fit" 24 GiB; with prefill activations and the reserve it needs 25.94 GB
    p = plan("llama-7b", job="infer", gpu_memory="24GiB", batch_size=8, seq_len=2048)
    fit = serving_fit("llama-7b", 24 * GiB, batch_size=8, seq_len=2048)
    base = p.steps[0]
    assert not base.fits and not fit.fits and base.total_bytes == fit.total_bytes
    assert round(base.total_bytes / GB, 2) == 25.94
    assert p.fits and p.chosen.technique != "baseline"
    e = estimate_inference("llama-7b", batch_size=8, seq_len=2048)
    assert base.per_gpu_bytes == e.total_bytes + fit.activation_bytes


def test_inference_ladder() -> None:
    p = plan("llama-2-7b", job="infer", gpu_memory="24GiB", batch_size=4, seq_len=2048)
    fit = serving_fit("llama-2-7b", 24 * GiB, batch_size=4, seq_len=2048)
    assert p.fits and p.chosen.technique == "baseline" and p.chosen.total_bytes == fit.total_bytes
    p16 = plan("llama-2-7b", job="infer", gpu_memory="16GiB", batch_size=8, seq_len=2048)
    assert p16.fits and p16.chosen.technique in ("fp8 KV cache", "int8 weights", "int4 weights")


def test_tensor_parallel_must_suit_the_heads() -> None:
    # Llama-3-70B: 64 query heads, 8 KV heads; vLLM refuses tensor parallel 3
    p = plan("llama-3-70b", job="infer", num_gpus=3, batch_size=1, seq_len=2048)
    st = p.steps[0].settings
    assert st["tensor_parallel"] != 3 and st["tensor_parallel"] * st["pipeline_parallel"] == 3
    assert any("not a tensor-parallel degree" in n and "4 GPUs" in n for n in p.notes)
    p4 = plan("llama-3-70b", job="infer", num_gpus=4, batch_size=1, seq_len=2048)
    assert p4.steps[0].settings["tensor_parallel"] == 4 and not p4.notes
    with pytest.raises(MemlibError, match="tensor_parallel 3 does not divide llama-3-70b's 64 attention heads"):
        serving_fit("llama-3-70b", 80 * GiB, tensor_parallel=3)


def test_train_is_not_silently_lora() -> None:
    # issue: full fine-tuning of Llama-3-8B on one H100 at 8k tokens fits with pure bf16 + 8-bit AdamW (49.2 GB)
    # DeepSpeed's ladder (ZeRO-3 before pure bf16); PyTorch's fits at 8-bit AdamW already
    p = plan("llama-3-8b", gpu_memory=get_gpu("h100-sxm").memory_bytes, batch_size=1, seq_len=8192,
             framework="deepspeed")
    assert p.fits and p.chosen.settings["method"] == "full" and not p.notes
    rung = next(s for s in p.steps if s.technique == "pure bf16")
    assert rung.fits and rung.settings["optimizer"] == "adamw-8bit" and round(rung.per_gpu_bytes / GB, 1) == 49.2
    assert p.chosen.settings["precision"] == "bf16" and p.chosen.total_bytes <= 80 * GiB  # 8-bit AdamW pruned
    techniques = [s.technique for s in _ladder("llama-3-8b", dict(seq_len=8192, framework="deepspeed"))]
    assert techniques.index("CPU offload") < techniques.index("LoRA / QLoRA")
    assert techniques.index("pure bf16") < techniques.index("LoRA / QLoRA")


def test_a_change_of_job_is_said() -> None:
    for mem in ("8GiB", "16GiB", "24GiB"):
        p = plan("llama-2-7b", gpu_memory=mem, batch_size=1, seq_len=512)
        if p.fits:
            assert (p.chosen.settings["method"] == "full") == (not any("changes the job" in n for n in p.notes))


def test_sequence_longer_than_the_model_is_refused() -> None:
    with pytest.raises(MemlibError, match="seq_len 2,048 exceeds gpt2's maximum of 1,024 positions"):
        plan("gpt2", seq_len=2048)
    with pytest.raises(MemlibError, match="exceeds llama-7b's maximum of 2,048"):
        plan("llama-7b", job="infer", seq_len=4096)


@settings(max_examples=25, deadline=None)
@given(name=st.sampled_from(["gpt2", "qwen2-0.5b", "llama-2-7b", "llama-3-8b", "llama-2-70b"]),
       job=st.sampled_from(["train", "lora", "qlora"]), gpus=st.sampled_from([1, 2, 8, 64]),
       mem_gb=st.sampled_from([16, 24, 40, 48, 80, 141]), batch=st.sampled_from([1, 2, 4, 8]),
       seq=st.sampled_from([512, 2048, 4096]))
def test_never_says_fits_when_the_estimate_exceeds_memory(name: str, job: str, gpus: int, mem_gb: int, batch: int,
                                                         seq: int) -> None:
    seq = min(seq, load_config(name).max_positions)
    p = plan(name, job=job, num_gpus=gpus, gpu_memory=mem_gb * GiB, batch_size=batch, seq_len=seq)
    for s in p.steps:
        assert s.fits == (s.per_gpu_bytes + reserve_bytes(s.per_gpu_bytes) <= mem_gb * GiB)
    if p.fits:
        assert p.chosen.total_bytes <= mem_gb * GiB
        assert _estimate({**p.chosen.settings, "model": name}) == p.chosen.per_gpu_bytes
        acc = p.chosen.settings["accumulation_steps"]
        assert p.chosen.settings["batch_size"] * acc == batch
    else:
        assert all(not s.fits for s in p.steps)


def test_bad_input() -> None:
    with pytest.raises(MemlibError, match="unknown job 'pretrain'"):
        plan("gpt2", job="pretrain")
    with pytest.raises(MemlibError, match="reserve"):
        plan("gpt2", gpu_memory="1GB", reserve="2GB", seq_len=1024)
    with pytest.raises(MemlibError, match="fragmentation"):
        plan("gpt2", fragmentation=1.5, seq_len=1024)
    with pytest.raises(MemlibError, match="num_gpus"):
        plan("gpt2", num_gpus=0)


def test_cli_plan_json_and_text(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "llama-2-7b", "--gpus", "8", "--gpu-mem", "80GiB", "--batch", "4", "--seq", "2048",
                 "--framework", "deepspeed", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["fits"] and data["chosen"]["settings"]["zero_stage"] == 2
    assert data["chosen"]["settings"]["framework"] == "deepspeed" and data["inputs"]["framework"] == "deepspeed"
    assert main(["plan", "llama-2-70b", "--gpus", "2", "--gpu-mem", "8GB", "--seq", "4096"]) == 0
    out = capsys.readouterr().out
    assert "does not fit: closest is" in out and "more GPUs would not help" in out
    assert main(["plan", "llama-2-70b", "--job", "infer", "--gpu-mem", "24GB", "--batch", "8", "--seq", "4096"]) == 0
    assert "it would need" in capsys.readouterr().out
    assert main(["plan", "llama-3-70b", "--job", "infer", "--gpus", "3"]) == 0
    out = capsys.readouterr().out
    assert "pipeline_parallel=3" in out and "note: 3 GPUs is not a tensor-parallel degree" in out


def test_cli_plan_gpu_from_the_spec_table(capsys: pytest.CaptureFixture[str]) -> None:
    from memlib.core.hardware import get_gpu

    assert main(["plan", "llama-2-7b", "--gpu", "rtx-4090", "--job", "qlora", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["inputs"]["gpu_memory"] == get_gpu("rtx-4090").memory_bytes and data["fits"]


@pytest.mark.parametrize("argv, needle", [
    (["plan", "llama-9b"], "unknown model 'llama-9b'"),
    (["plan", "gpt2", "--gpu", "h100-sxm", "--gpu-mem", "80GB"], "give --gpu or --gpu-mem, not both"),
    (["plan", "gpt2", "--gpu", "b300"], "unknown GPU 'b300'; expected one of: v100"),
    (["plan", "gpt2", "--gpu-mem=-5GB", "--seq", "1024"], "-5GB"),
    (["plan", "gpt2", "--job", "pretrain"], "invalid choice: 'pretrain'"),
    (["plan", "gpt2", "--gpu-mem", "1GB", "--reserve", "4GB", "--seq", "1024"], "reserve"),
    (["plan", "gpt2", "--gpus", "0"], "expected a positive integer"),
    (["plan", "gpt2", "--seq", "2048"], "seq_len 2,048 exceeds gpt2's maximum of 1,024 positions (n_positions)"),
    (["train", "gpt2", "--seq", "2048"], "expected seq_len ≤ 1,024"),
    (["infer", "llama-7b", "--seq", "4096"], "exceeds llama-7b's maximum of 2,048"),
    (["trace", "gpt2", "--seq", "1025"], "exceeds gpt2's maximum of 1,024"),
])
def test_cli_plan_bad_input(argv: list[str], needle: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "memlib", *argv], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert needle in proc.stderr and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr


def test_ladder_figure_and_widget_callback() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from memlib.viz.plots_plan import decision_flow_figure, ladder_figure
    from memlib.viz.widgets_plan import plan_view

    result, fig, verdict = plan_view("llama-2-7b", "train", 8, 80.0, 4, 2048, "deepspeed")
    assert verdict.startswith("fits") and "ZeRO-2" in verdict and result.inputs["gpu_memory"] == 80 * GiB
    assert fig.axes[0].get_ylabel() == "per-GPU memory (GiB)"
    plt.close(fig)
    result, fig, verdict = plan_view("llama-3-70b", "infer", 3, 80.0, 1, 2048)
    assert "pipeline parallel × 3" in verdict
    plt.close(fig)
    with pytest.raises(MemlibError, match="exceeds llama-2-7b's maximum of 4,096"):
        plan_view("llama-2-7b", "train", 8, 80.0, 4, 8192)
    fig = ladder_figure(plan("gpt2", gpu_memory="16GiB", batch_size=8, seq_len=1024))
    plt.close(fig)
    labels = [t.get_text() for t in decision_flow_figure().axes[0].texts]
    assert labels.index("still too big? → CPU offload") < labels.index("still too big? → LoRA / QLoRA")
    plt.close("all")


@pytest.mark.parametrize("framework, rungs, absent", [
    ("pytorch", {"ZeRO-1", "switch to DeepSpeed"}, {"ZeRO-2", "ZeRO-3"}),
    ("megatron", {"ZeRO-2", "ZeRO-3"}, {"ZeRO-1", "switch to DeepSpeed", "CPU offload"}),  # Megatron-FSDP
    ("deepspeed", {"ZeRO-2", "ZeRO-3", "CPU offload"}, {"ZeRO-1", "switch to DeepSpeed"}),
    ("fsdp2", {"ZeRO-3", "CPU offload"}, {"ZeRO-1", "ZeRO-2", "switch to DeepSpeed"}),
])
def test_ladder_follows_the_framework(framework: str, rungs: set, absent: set) -> None:
    """Only the rungs the framework supports are climbed; pytorch switches to DeepSpeed for ZeRO-3 and offload,
    megatron climbs Megatron-FSDP's zero 2 and 3; every rung's setting is a combination its framework has."""
    from memlib.core.choices import FRAMEWORK_SUPPORT

    steps = plan("llama-2-7b", num_gpus=8, gpu_memory=10**6, reserve=0, fragmentation=0, batch_size=4,
                 seq_len=2048, framework=framework).steps
    applied = {s.technique for s in steps if s.applicable}
    assert rungs <= applied and not absent & applied
    for s in steps:
        stages, offloads, _ = FRAMEWORK_SUPPORT[s.settings["framework"]]
        assert s.settings["zero_stage"] in stages and s.settings["offload"] in offloads
    assert steps[0].settings["framework"] == framework


def test_cli_plan_framework(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "llama-2-7b", "--gpus", "8", "--gpu-mem", "80GiB", "--batch", "4", "--seq", "2048"]) == 0
    out = capsys.readouterr().out
    assert "fits: framework=pytorch" in out and "ZeRO-1" in out and "ZeRO-2" not in out
    with pytest.raises(SystemExit) as exit_:
        main(["plan", "gpt2", "--framework", "jax"])
    assert exit_.value.code == 2 and "invalid choice: 'jax'" in capsys.readouterr().err
