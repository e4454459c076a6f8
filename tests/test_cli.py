"""The memlib CLI: JSON output, human tables, bad input (exit 2, one line, no traceback)."""
import json
import subprocess
import sys

import pytest

from memlib.cli import main


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "memlib", *args], capture_output=True, text=True, timeout=300)


def test_params_json(capsys: pytest.CaptureFixture) -> None:
    assert main(["params", "llama-2-7b", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["params"] == 6_738_415_616 and data["lm_head"] == 32000 * 4096


def test_train_json_keys_are_integers(capsys: pytest.CaptureFixture) -> None:
    assert main(["train", "llama-2-7b", "--batch", "4", "--seq", "4096", "--zero", "2", "--gpus", "8",
                 "--framework", "deepspeed", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    for key in ("params_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes", "total_bytes"):
        assert isinstance(data[key], int) and data[key] > 0
    assert data["grads_bytes"] == -(-2 * 6_738_415_616 // 8)


def test_train_params_only(capsys: pytest.CaptureFixture) -> None:
    assert main(["train", "--params", "7500000000", "--zero", "3", "--gpus", "64", "--framework", "deepspeed",
                 "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["activations_bytes"] is None and data["total_bytes"] == 1_875_000_000


def test_train_params_says_model_states_only(capsys: pytest.CaptureFixture) -> None:
    assert main(["train", "--params", "7000000000"]) == 0
    out = capsys.readouterr().out
    assert "note: --params counts model states only (weights, gradients, optimizer states), no activations" in out
    assert main(["train", "llama-2-7b"]) == 0
    assert "model states only" not in capsys.readouterr().out
    res = run("train", "--help")
    assert "model states only" in " ".join(res.stdout.split())


@pytest.mark.parametrize("command", ["train", "infer", "params", "serve"])
def test_help_lists_every_shipped_model(command: str) -> None:
    from memlib.core.configs import shipped_models

    res = run(command, "--help")
    listed = "".join(res.stdout.split())  # argparse wraps the list anywhere between words
    assert res.returncode == 0
    assert all(name in listed for name in shipped_models(all_models=True))


def test_infer_json(capsys: pytest.CaptureFixture) -> None:
    assert main(["infer", "llama-7b", "--batch", "8", "--seq", "2048", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["kv_cache_bytes"] == 8_589_934_592
    assert data["total_bytes"] == data["weights_bytes"] + data["kv_cache_bytes"]


def test_human_table(capsys: pytest.CaptureFixture) -> None:
    assert main(["train", "gpt2"]) == 0
    out = capsys.readouterr().out
    assert "total_bytes" in out and " GB" in out and " GiB" in out


def test_trace_and_module_entry_point() -> None:
    res = run("trace", "gpt2", "--batch", "2", "--seq", "128", "--json")
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert data["peak_bytes"] > data["params_bytes"] > 0 and data["device"] == "meta"


@pytest.mark.parametrize(
    "args, needle",
    [
        (["params", "no-such-model"], "unknown model 'no-such-model'; expected one of:"),
        (["train", "gpt2", "--batch", "-1"], "invalid value -1; expected a positive integer"),
        (["train", "gpt2", "--seq", "0"], "invalid value 0; expected a positive integer"),
        (["train", "gpt2", "--precision", "fp12"], "invalid choice: 'fp12'"),
        (["infer", "gpt2", "--weights", "int3"], "invalid choice: 'int3'"),
        (["train"], "give a model"),
        (["params", "/nonexistent/config.json"], "does not exist"),
    ],
)
def test_bad_input_exit_2_one_line(args: list, needle: str) -> None:
    res = run(*args)
    assert res.returncode == 2
    assert needle in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.stderr
    assert res.stdout == ""


def test_bad_config_files(tmp_path) -> None:  # type: ignore[no-untyped-def]
    bad = tmp_path / "config.json"
    bad.write_text("{oops")
    res = run("train", str(bad))
    assert res.returncode == 2 and "malformed JSON" in res.stderr and "Traceback" not in res.stderr
    heads = tmp_path / "heads.json"
    heads.write_text(json.dumps({"model_type": "llama", "hidden_size": 100, "num_attention_heads": 3,
                                 "num_hidden_layers": 2, "intermediate_size": 10, "vocab_size": 10}))
    res = run("params", str(heads))
    assert res.returncode == 2 and "num_attention_heads 3 does not divide hidden_size 100" in res.stderr
    other = tmp_path / "bert.json"
    other.write_text(json.dumps({"model_type": "bert"}))
    res = run("infer", str(other))
    assert res.returncode == 2 and "unsupported model_type 'bert'; expected one of: gpt2, llama, mistral, qwen2, gemma" in res.stderr


# ------------------------------------------------------------------ issue 39: ids, help, the fit verdict
TRAIN_KEYS = {"params_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes", "temp_bytes", "total_bytes",
              "peak_phase", "settings", "cpu_bytes", "logits_bytes"}  # logits_bytes: Chapter 17
TINY = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
        "num_hidden_layers": 2, "intermediate_size": 128, "vocab_size": 1000, "max_position_embeddings": 4096}


def _json(capsys: pytest.CaptureFixture, *args: str) -> dict:
    assert main([*args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.fixture
def empty_hub(tmp_path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    root = tmp_path / "hub"
    root.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(root))
    return root


@pytest.mark.parametrize("args", [
    ["params"], ["train", "--seq", "4096"], ["infer", "--seq", "4096"], ["plan", "--gpu", "h100"],
    ["serve", "--gpu", "h100", "--max-model-len", "8192"]])
def test_every_subcommand_takes_a_hugging_face_id(args: list, capsys: pytest.CaptureFixture, empty_hub) -> None:
    by_id = _json(capsys, args[0], "meta-llama/Llama-3.1-8B", *args[1:])
    by_name = _json(capsys, args[0], "llama-3.1-8b", *args[1:])
    assert by_id == by_name


def test_trace_takes_a_hugging_face_id(empty_hub, capsys: pytest.CaptureFixture) -> None:  # type: ignore[no-untyped-def]
    from memlib.core.params import count_params

    # In this process (the entry point itself is tested above): a second interpreter would import torch again.
    assert main(["trace", "openai-community/gpt2", "--seq", "64", "--precision", "fp32", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["params_bytes"] == 4 * count_params("gpt2").params


@pytest.mark.parametrize("command", [["params"], ["train"], ["infer"], ["plan", "--gpu-mem", "2GiB"],
                                     ["serve", "--gpu-mem", "2GiB", "--max-model-len", "256"]])
def test_a_model_only_in_the_local_cache_is_found_by_its_id(command: list, tmp_path, monkeypatch,
                                                            capsys: pytest.CaptureFixture) -> None:
    snap = tmp_path / "hub" / "models--someorg--Tiny-1M" / "snapshots" / "c0ffee"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text(json.dumps(TINY))
    (snap.parent.parent / "refs").mkdir()
    (snap.parent.parent / "refs" / "main").write_text("c0ffee")
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    data = _json(capsys, command[0], "someorg/Tiny-1M", *command[1:])
    by_path = _json(capsys, command[0], str(snap / "config.json"), *command[1:])
    # the same numbers; the model is named by its id from the cache, by its folder from a path
    assert json.dumps(data).replace("someorg/Tiny-1M", "M") == json.dumps(by_path).replace("c0ffee", "M")
    if command[0] == "params":
        assert data["params"] == 2 * 1000 * 64 + 2 * (64 * (64 + 2 * 32 + 64) + 3 * 64 * 128 + 2 * 64) + 64


def test_an_unknown_id_is_one_error_line_exit_2(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import os

    env = {**os.environ, "HF_HUB_CACHE": str(tmp_path)}
    for args in (["train", "meta-llama/Llama-3.1-8C"], ["serve", "nobody/nothing", "--gpu", "h100",
                                                        "--max-model-len", "128"]):
        res = subprocess.run([sys.executable, "-m", "memlib", *args], capture_output=True, text=True, timeout=300,
                             env=env)
        assert res.returncode == 2 and res.stdout == "" and "Traceback" not in res.stderr
        line = res.stderr.strip()
        assert len(line.splitlines()) == 1 and f"unknown model '{args[1]}': not shipped with memlib" in line
        assert f"not in the local Hugging Face cache ({tmp_path})" in line and "config.json" in line
    close = run("train", "meta-llama/Llama-3.1-8C").stderr.split("close matches: ")[1].strip().split(", ")
    assert close[:2] == ["meta-llama/Llama-3.1-8B", "llama-3.1-8b"]


def test_memlib_alone_prints_the_help() -> None:
    res = run()
    assert res.returncode == 0 and res.stderr == ""
    assert res.stdout.startswith("usage: memlib") and "examples:" in res.stdout and "train" in res.stdout


@pytest.mark.parametrize("command", ["params", "train", "infer", "plan", "serve", "trace", "oom"])
def test_every_help_ends_with_examples_from_the_readme(command: str) -> None:
    from pathlib import Path

    from memlib.cli import EXAMPLES

    res = run(command, "--help")
    tail = res.stdout.rstrip().split("examples:\n")[-1].splitlines()
    assert 2 <= len(tail) <= 3 and all(line.strip().startswith(f"memlib {command} ") for line in tail)
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    for example in (*EXAMPLES[command], *EXAMPLES["memlib"]):
        assert example.split("#")[0].strip() in readme


def test_train_on_a_gpu_starts_with_the_verdict(capsys: pytest.CaptureFixture) -> None:
    assert main(["train", "llama-3.1-8b", "--gpu", "h100"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("does not fit on 1 x H100 SXM 80 GB: needs ") and " GiB more" in first
    assert main(["train", "gpt2", "--gpu", "rtx-4090"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("fits on 1 x GeForce RTX 4090 with ") and "GiB to spare" in lines[0]
    assert lines[1].startswith("[") and "params" in lines[2] and lines[3].startswith("training memory per GPU")
    assert main(["train", "llama-2-7b", "--framework", "deepspeed", "--zero", "3", "--gpus", "8", "--gpu", "a100"]) == 0
    assert capsys.readouterr().out.startswith("fits on each of 8 x A100 SXM 80 GB")


def test_train_verdict_agrees_with_plan(capsys: pytest.CaptureFixture) -> None:
    verdicts = []
    for model, gpu, seq in (("llama-3.1-8b", "h100", "2048"), ("qwen2-0.5b", "rtx-4090", "4096"),
                            ("llama-2-7b", "h200", "4096"), ("llama-3.1-8b", "h200", "4096")):
        fit = _json(capsys, "train", model, "--seq", seq, "--gpu", gpu)["fit"]
        rung = next(s for s in _json(capsys, "plan", model, "--seq", seq, "--gpu", gpu)["steps"]
                    if s["technique"] == "FlashAttention")  # bf16-mixed, sdpa, AdamW: train's defaults
        assert rung["per_gpu_bytes"] == fit["estimate_bytes"] and rung["fits"] == fit["fits"]
        assert rung["per_gpu_bytes"] + rung["reserve_bytes"] == fit["capacity_bytes"] - fit["spare_bytes"]
        verdicts.append(fit["fits"])
    assert verdicts == [False, True, True, False]


def test_without_gpu_the_common_cards_it_fits(capsys: pytest.CaptureFixture) -> None:
    assert main(["infer", "llama-3.1-8b", "--seq", "8192"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("fits on: GeForce RTX 4090, L40S") and "B200" in first
    data = _json(capsys, "train", "llama-3.1-8b")
    assert data["fits_on"] == {"rtx-4090": False, "l40s": False, "a100-40gb": False, "a100-80gb": False,
                               "h100-sxm": False, "h200": False, "b200": True}


def test_json_only_adds_keys(capsys: pytest.CaptureFixture) -> None:
    plain = _json(capsys, "train", "llama-2-7b")
    on_gpu = _json(capsys, "train", "llama-2-7b", "--gpu", "h100")
    assert set(plain) == TRAIN_KEYS | {"fits_on"} and set(on_gpu) == TRAIN_KEYS | {"fits_on", "fit"}
    assert {k: plain[k] for k in TRAIN_KEYS} == {k: on_gpu[k] for k in TRAIN_KEYS}
    assert set(on_gpu["fit"]) == {"gpu", "capacity_bytes", "usable_bytes", "estimate_bytes", "needed_bytes",
                                  "spare_bytes", "fits"}
    infer = _json(capsys, "infer", "llama-2-7b", "--gpu", "l40s")
    assert {"weights_bytes", "kv_cache_bytes", "total_bytes", "settings", "fit", "fits_on"} == set(infer)
    assert infer["fit"]["estimate_bytes"] == infer["total_bytes"]


def test_the_bar_falls_back_to_ascii() -> None:
    import os

    env = {**os.environ, "PYTHONIOENCODING": "ascii"}
    res = subprocess.run([sys.executable, "-m", "memlib", "train", "llama-3.1-8b", "--gpu", "h200"],
                         capture_output=True, text=True, timeout=300, env=env)
    assert res.returncode == 0, res.stderr
    bar = res.stdout.splitlines()[1]
    assert bar.isascii() and bar.startswith("[#") and "|" in bar  # 157 GiB needed on a 140 GiB usable card


@pytest.mark.parametrize("args, needle", [
    (["train", "gpt2", "--gpu", "h300"], "unknown GPU 'h300'; expected one of: v100"),
    (["infer", "gpt2", "--seq", "512", "--reserve", "lots"], "bad memory size 'lots'"),
])
def test_bad_gpu_flags_one_line(args: list, needle: str) -> None:
    res = run(*args)
    assert res.returncode == 2 and needle in res.stderr and len(res.stderr.strip().splitlines()) == 1
    assert "Traceback" not in res.stderr



def test_output_into_a_closed_pipe_is_quiet(monkeypatch: pytest.MonkeyPatch) -> None:
    """`memlib train ... | head -1`: the reader has left; memlib exits 0 without a traceback."""
    import os
    import sys

    read_end, write_end = os.pipe()
    os.close(read_end)  # nobody reads: every write raises BrokenPipeError (EPIPE)
    out = os.fdopen(write_end, "w")
    monkeypatch.setattr(sys, "stdout", out)
    try:
        assert main(["train", "llama-3.1-8b", "--gpu", "h100"]) == 0
    finally:
        monkeypatch.undo()
        out.close()
