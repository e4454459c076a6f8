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
