"""memlib plan --trace-fragmentation: the simulated allocator figure replaces the 5 % allowance (Chapter 16)."""
from __future__ import annotations

import json

import pytest

from memlib.cli import main
from memlib.core.inference import DEFAULT_FRAGMENTATION
from memlib.measure.fragmentation import traced_fragmentation
from memlib.measure.trace import trace_training


def test_traced_plan_uses_the_simulated_fraction(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "gpt2", "--gpu-mem", "24GiB", "--batch", "2", "--seq", "128", "--trace-fragmentation",
                 "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    s = data["chosen"]["settings"]
    t = trace_training("gpt2", batch_size=s["batch_size"], seq_len=s["seq_len"], precision=s["precision"],
                       optimizer=s["optimizer"], attention=s["attention"], recompute=s["recompute"], reserved=True)
    assert t.reserved_peak_bytes is not None
    expected = round(t.reserved_peak_bytes / t.peak_bytes - 1, 4)
    assert data["inputs"]["fragmentation"] == expected != DEFAULT_FRAGMENTATION and expected >= 0
    assert any("simulated" in n for n in data["notes"])


def test_untraceable_settings_keep_the_allowance_and_say_so() -> None:
    settings = {"method": "lora", "offload": "none", "zero_stage": 0, "num_gpus": 1, "recompute": "none",
                "optimizer": "adamw", "framework": "pytorch", "precision": "bf16-mixed"}
    frac, note = traced_fragmentation("gpt2", settings)
    assert frac is None and "5 % allowance is kept" in note and "'lora'" in note
    frac, note = traced_fragmentation("gpt2", {**settings, "method": "full", "zero_stage": 3, "num_gpus": 8})
    assert frac is None and "ZeRO-3 over 8 GPUs" in note


def test_inference_plans_are_refused_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "gpt2", "--job", "infer", "--seq", "512", "--trace-fragmentation"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "expected --job train, lora or qlora" in err
