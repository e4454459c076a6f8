"""TrainingSetup / InferenceSetup: validated once, against choice lists defined once; the CLIs build one setup."""
from __future__ import annotations

import contextlib
import dataclasses
import io
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import memlib.core.choices as choices
from memlib.core.errors import MemlibError
from memlib.core.estimate import (estimate_inference, estimate_training, model_state_bytes, offload_split,
                                  shard_states)
from memlib.core.setup import InferenceSetup, TrainingSetup


@pytest.mark.parametrize("field, value, message", [
    ("precision", "fp12", "unknown precision 'fp12'; expected one of: fp32, fp16-mixed, bf16-mixed, bf16, fp8-mixed"),
    ("optimizer", "adam", "unknown optimizer 'adam'; expected one of: sgd, sgd-momentum, adamw, adamw-8bit"),
    ("zero_stage", 4, "unknown zero stage 4; expected one of: 0, 1, 2, 3"),
    ("recompute", "sac", "unknown recompute 'sac'; expected one of: none, selective, full"),
    ("attention", "flash", "unknown attention 'flash'; expected one of: eager, sdpa"),
    ("offload", "all", "unknown offload 'all'; expected one of: none, optimizer, params+optimizer"),
    ("method", "dora", "unknown method 'dora'; expected one of: full, lora, qlora"),
    ("lora_targets", "mlp", "unknown lora targets 'mlp'; expected one of: all-linear, attention, qv"),
    ("pp_schedule", "zb", "unknown pipeline schedule 'zb'; expected one of: gpipe, 1f1b, interleaved, zb-h1, zb-h2, zbv, dualpipe,"
                    " dualpipev"),
    ("batch_size", 0, "batch_size must be an integer ≥ 1, got 0"),
    ("lora_rank", -2, "lora rank must be an integer ≥ 1, got -2"),
    ("tp", 0, "tp must be an integer ≥ 1, got 0"),
])
def test_bad_value_one_line_with_choices(field: str, value: Any, message: str) -> None:
    with pytest.raises(MemlibError) as err:
        TrainingSetup(**{field: value})
    assert str(err.value) == message and "\n" not in str(err.value)


def test_combinations_checked_once() -> None:
    with pytest.raises(MemlibError, match="checkpoint_every=2 needs recompute='full'"):
        TrainingSetup(checkpoint_every=2)
    with pytest.raises(MemlibError, match="offload 'params\\+optimizer' needs zero_stage 3"):
        TrainingSetup(offload="params+optimizer", zero_stage=2, framework="deepspeed")
    assert TrainingSetup(offload="params+optimizer", zero_stage=3, framework="deepspeed").offload == "params+optimizer"
    with pytest.raises(MemlibError, match="framework 'pytorch' does not support zero 2; valid combinations: "):
        TrainingSetup(zero_stage=2)


def test_frozen_and_replace_validates() -> None:
    s = TrainingSetup(batch_size=4, framework="deepspeed")
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.batch_size = 8  # type: ignore[misc]
    assert dataclasses.replace(s, zero_stage=3).zero_stage == 3 and s.zero_stage == 0
    with pytest.raises(MemlibError, match="does not support zero 3"):
        dataclasses.replace(s, framework="pytorch", zero_stage=3)
    with pytest.raises(MemlibError, match="unknown precision 'fp8'"):
        dataclasses.replace(s, precision="fp8")
    assert TrainingSetup(batch_size=2.0).batch_size == 2 and type(TrainingSetup(batch_size=2.0).batch_size) is int  # type: ignore[arg-type]


def test_setup_and_keywords_agree() -> None:
    s = TrainingSetup(batch_size=2, seq_len=1024, zero_stage=3, num_gpus=8, recompute="full", framework="deepspeed")
    assert estimate_training("llama-2-7b", s) == estimate_training(
        "llama-2-7b", batch_size=2, seq_len=1024, zero_stage=3, num_gpus=8, recompute="full", framework="deepspeed")
    with pytest.raises(MemlibError, match="not both"):
        estimate_training("llama-2-7b", s, batch_size=2)
    i = InferenceSetup(batch_size=4, seq_len=4096, weights="nf4", kv_dtype="fp8")
    assert estimate_inference("llama-2-7b", i) == estimate_inference("llama-2-7b", batch_size=4, seq_len=4096,
                                                                     weights="nf4", kv_dtype="fp8")
    with pytest.raises(MemlibError, match="unknown kv dtype 'int2'"):
        InferenceSetup(kv_dtype="int2")
    with pytest.raises(MemlibError, match="not both"):
        estimate_inference("gpt2", i, seq_len=8)


@settings(max_examples=40, deadline=None)
@given(p=st.integers(1, 10**12), g=st.integers(1, 10**12), o=st.integers(1, 10**12),
       zero=st.sampled_from(choices.ZERO_STAGES), n=st.integers(1, 4096))
def test_sharding_never_loses_a_byte(p: int, g: int, o: int, zero: int, n: int) -> None:
    ps, gs, os_ = shard_states(p, g, o, TrainingSetup(zero_stage=zero, num_gpus=n, framework="deepspeed"))
    # DeepSpeed's ZeRO-1 with one micro-batch per step frees the gradients outside its partition as ZeRO-2
    for full, shard, stage in ((p, ps, 3), (g, gs, 1), (o, os_, 1)):
        assert shard == (full if zero < stage else -(-full // n)) and shard * n >= full
    ps, gs, os_ = shard_states(p, g, o, TrainingSetup(zero_stage=zero, num_gpus=n, framework="deepspeed",
                                                      grad_accum=2))
    for full, shard, stage in ((p, ps, 3), (g, gs, 2), (o, os_, 1)):  # accumulating: ZeRO-1 keeps them all
        assert shard == (full if zero < stage else -(-full // n)) and shard * n >= full


def test_offload_moves_the_optimizer_to_the_host() -> None:
    s = TrainingSetup(offload="optimizer", zero_stage=1, num_gpus=4, framework="deepspeed")
    p, g, o, n = model_state_bytes(None, 10**9, 0, s)
    p, g, o = shard_states(p, g, o, s)
    gp, gg, go, cpu = offload_split(p, g, o, n, s)
    assert (gp, gg, go) == (p, min(g, 2 * 500_000_000), 0)  # stage 1 streams the gradients out as stage 2
    assert cpu == o + 4 * 10**9 // 4 + 2 * 10**9 // 4  # + fp32 gradients + the pinned 16-bit partition


def test_choice_lists_are_defined_once() -> None:
    import memlib.core.estimate as est
    import memlib.core.lora as lora
    import memlib.core.parallel as par
    import memlib.viz.live as live

    assert est.PRECISIONS is choices.PRECISIONS and est.OPTIMIZERS is choices.OPTIMIZERS
    assert est.RECOMPUTE is choices.RECOMPUTE and est.ATTENTION is choices.ATTENTION
    assert est.OFFLOAD is choices.OFFLOAD and est.KV_DTYPES is choices.KV_DTYPES
    assert lora.METHODS is choices.METHODS and lora.LORA_TARGETS is choices.LORA_TARGETS
    assert par.SCHEDULES is choices.SCHEDULES and live.PRECISIONS is choices.PRECISIONS
    from memlib.cli import build_parser

    train = build_parser()._subparsers._group_actions[0].choices["train"]  # type: ignore[union-attr]
    by_flag = {a.option_strings[0]: a.choices for a in train._actions if a.option_strings}
    assert by_flag["--precision"] is choices.PRECISIONS and by_flag["--zero"] is choices.ZERO_STAGES
    assert by_flag["--pp-schedule"] is choices.SCHEDULES and by_flag["--offload"] is choices.OFFLOAD


@contextlib.contextmanager
def _counting() -> Iterator[Counter[str]]:
    """Count load_config calls that read a config (not a ModelConfig passed through) and precision checks."""
    import importlib
    import pkgutil

    import memlib.cli
    import memlib.core
    import memlib.core.configs as configs
    import memlib.core.errors as errors

    counts: Counter[str] = Counter()
    load, check = configs.load_config, errors.check_choice

    def counting_load(model: Any, **kw: Any) -> Any:
        counts["loads"] += not isinstance(model, configs.ModelConfig)
        return load(model, **kw)

    def counting_check(name: str, value: object, options: Any) -> None:
        counts["precision checks"] += name == "precision"
        check(name, value, options)

    modules = [importlib.import_module(f"memlib.core.{m.name}") for m in pkgutil.iter_modules(memlib.core.__path__)]
    patched = []
    for mod in modules + [memlib.cli]:
        for name, orig, new in (("load_config", load, counting_load), ("check_choice", check, counting_check)):
            if getattr(mod, name, None) is orig:
                setattr(mod, name, new)
                patched.append((mod, name, orig))
    try:
        yield counts
    finally:
        for mod, name, orig in patched:
            setattr(mod, name, orig)


@pytest.mark.parametrize("argv", [["train", "llama-2-7b"], ["train", "llama-2-7b", "--method", "qlora", "--zero", "3",
                                                                  "--framework", "deepspeed"],
                                  ["train", "gemma-2-9b", "--recompute", "full", "--checkpoint-every", "2"]])
def test_cli_loads_the_config_once_and_validates_once(argv: list[str]) -> None:
    from memlib.cli import main

    with _counting() as counts, contextlib.redirect_stdout(io.StringIO()):
        assert main(argv) == 0
    assert counts["loads"] == 1  # was 2: the CLI and estimate_training each read the config
    assert counts["precision checks"] == 1  # was 4: TrainingSetup validates, the functions below trust it


def test_core_setup_needs_no_torch() -> None:
    code = ("import sys, memlib.core.setup, memlib.core.choices, memlib.core.estimate, memlib.core.plan; "
            "from memlib.core.estimate import estimate_training; estimate_training('gpt2'); "
            "assert not {'torch', 'transformers', 'matplotlib', 'ipywidgets'} & set(sys.modules), 'heavy import'")
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("argv, message", [
    (["--zero", "4"], "argument --zero: invalid choice: 4 (choose from 0, 1, 2, 3)"),
    (["--gpus", "0"], "argument --gpus: invalid value 0; expected a positive integer"),
    (["--batch-size", "x"], "argument --batch/--batch-size: invalid integer 'x'; expected a positive integer"),
    (["--seq-len", "100"], "seq_len 100 exceeds llama's maximum of 64 positions"),
    (["--steps", "1"], "steps must be ≥ 2"),
    (["--zero", "1", "--strategies", "zero1"], "give --zero or --strategies, not both"),
])
def test_distributed_cli_flags_and_errors(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    from memlib.measure.distributed import main

    try:
        rc = main(argv)
    except SystemExit as e:  # argparse errors exit from parse_args
        rc = int(e.code or 0)
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("memlib.measure.distributed: error: ") and message in err
    assert err.count("\n") == 1 and "Traceback" not in err
