"""memlib.core.rl and memlib rl: which models are resident in each post-training phase (pure, Chapter 18)."""
import json
import subprocess
import sys
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memlib.cli import main
from memlib.core.errors import MemlibError
from memlib.core.estimate import estimate_inference, estimate_training
from memlib.core.rl import RLSetup, estimate_rl, logprob_head_bytes, plan_rl
from memlib.core.setup import TrainingSetup

QWEN = "qwen2.5-7b"
Z3 = TrainingSetup(precision="bf16-mixed", framework="deepspeed", zero_stage=3, num_gpus=8)
GRPO = RLSetup(algo="grpo", group=8, prompt_len=512, completion_len=1024)


def test_done_when_command_prints_phases_and_a_peak(capsys: pytest.CaptureFixture) -> None:
    args = ["rl", QWEN, "--algo", "grpo", "--gpus", "8", "--group", "8", "--prompt-len", "512",
            "--completion-len", "1024"]
    assert main([*args, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    names = [p["name"] for p in data["phases"]]
    assert names == ["rollout", "reference", "training"]
    assert data["peak_bytes"] == max(p["peak_bytes"] for p in data["phases"])
    assert main(args) == 0
    assert "peak per GPU" in capsys.readouterr().out


def test_ppo_trains_one_more_model_than_grpo(capsys: pytest.CaptureFixture) -> None:
    out = {}
    for algo in ("grpo", "ppo"):
        assert main(["rl", QWEN, "--algo", algo, "--gpus", "8", "--zero", "3", "--framework", "deepspeed",
                     "--json"]) == 0
        out[algo] = json.loads(capsys.readouterr().out)
    assert out["grpo"]["trained_models"] == ["policy"]
    assert out["ppo"]["trained_models"] == ["policy", "critic"]
    assert set(out["ppo"]["frozen_models"]) == {"reference", "reward"}
    assert "critic training" in [p["name"] for p in out["ppo"]["phases"]]


def test_resident_sets_add_up_and_the_peak_is_the_largest_phase() -> None:
    for algo in ("grpo", "ppo", "dpo"):
        est = estimate_rl(QWEN, RLSetup(algo=algo), Z3)
        for ph in est.phases:
            assert ph.peak_bytes == sum(ph.resident.values())
        assert est.peak_bytes == max(p.peak_bytes for p in est.phases)


def test_beta_zero_drops_the_reference_weights_from_every_phase() -> None:
    with_ref = estimate_rl(QWEN, GRPO, Z3)
    without = estimate_rl(QWEN, replace(GRPO, reference="none"), Z3)
    ref = -(-estimate_inference(QWEN, weights="bf16").weights_bytes // 8)  # ZeRO-3: sharded over 8 GPUs
    assert [p.name for p in without.phases] == ["rollout", "training"]
    for name in ("rollout", "training"):
        assert with_ref.phase(name).peak_bytes - without.phase(name).peak_bytes == ref
    assert without.frozen_models == ()


def test_zero3_shards_the_reference_and_plain_dp_does_not() -> None:
    dp = estimate_rl(QWEN, GRPO, replace(Z3, zero_stage=0))
    z3 = estimate_rl(QWEN, GRPO, Z3)
    assert dp.phase("rollout").resident["reference weights"] == 8 * z3.phase("rollout").resident["reference weights"]


def test_sleep_levels() -> None:
    awake, one, two = (estimate_rl(QWEN, replace(GRPO, sleep_level=lv), Z3) for lv in (0, 1, 2))
    engine = awake.phase("rollout").resident
    held = engine["rollout weights"] + engine["KV cache"]
    assert awake.phase("training").peak_bytes - one.phase("training").peak_bytes == held
    assert one.phase("training").peak_bytes == two.phase("training").peak_bytes
    assert one.cpu_bytes - two.cpu_bytes == engine["rollout weights"]  # level 1 keeps the weights in host memory
    assert awake.cpu_bytes == two.cpu_bytes == 0


def test_separate_rollout_has_its_own_gpus() -> None:
    sep = estimate_rl(QWEN, replace(GRPO, rollout="separate", sleep_level=0), Z3)
    roll = sep.phase("rollout")
    assert roll.gpus == "rollout" and "policy optimizer" not in roll.resident
    assert all("rollout weights" not in p.resident for p in sep.phases if p.gpus == "trainer")


def test_rollout_kv_cache_is_group_times_prompts_times_tokens() -> None:
    hf = estimate_rl(QWEN, replace(GRPO, engine="hf", sleep_level=0), Z3)
    kv = hf.phase("rollout").resident["KV cache"]
    per_token = 2 * 28 * 4 * 128 * 2  # K and V, 28 layers, 4 KV heads, head_dim 128, bf16
    assert kv == 8 * 1536 * per_token


def test_offload_idle_empties_the_rollout_of_optimizer_states() -> None:
    off = estimate_rl(QWEN, replace(GRPO, offload_idle=True), Z3)
    assert "policy optimizer" not in off.phase("rollout").resident
    assert "policy optimizer" in off.phase("training").resident
    assert off.cpu_bytes > 0


def test_dpo_doubles_the_batch_and_its_reference_sees_the_policy_activations() -> None:
    dpo = estimate_rl(QWEN, RLSetup(algo="dpo", prompts=2, prompt_len=512, completion_len=512), Z3)
    assert dpo.settings["completions"] == 4
    assert dpo.phase("reference").resident["policy activations"] > 0
    precomputed = estimate_rl(QWEN, RLSetup(algo="dpo", prompts=2, prompt_len=512, completion_len=512,
                                            reference="none"), Z3)
    assert [p.name for p in precomputed.phases] == ["training"]
    lora = estimate_rl(QWEN, RLSetup(algo="dpo", prompts=2, reference="lora"), replace(Z3, method="lora"))
    assert lora.frozen_models == ()


def test_training_phase_is_estimate_training_plus_residents() -> None:
    est = estimate_rl(QWEN, GRPO, Z3)
    t = estimate_training(QWEN, replace(Z3, batch_size=8, seq_len=1536))
    head = logprob_head_bytes(QWEN, 8 * 1535, 2, backward=True)
    res = est.phase("training").resident
    assert res["working"] == t.total_bytes - t.params_bytes - t.optimizer_bytes + head


def test_trl_head_buffer_is_32768_columns_whatever_the_vocabulary() -> None:
    tiny = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1,
            "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 128}
    assert logprob_head_bytes(tiny, 100, 4) == 100 * 32768 * 4 + 7 * 4 * 100
    assert logprob_head_bytes(QWEN, 10_000, 2) == 4096 * 32768 * 2 + 7 * 4 * 10_000


@settings(max_examples=25, deadline=None)
@given(group=st.integers(2, 16), prompts=st.integers(1, 4), completion=st.integers(16, 2048))
def test_more_completions_never_need_less_memory(group: int, prompts: int, completion: int) -> None:
    rl = RLSetup(algo="grpo", group=group, prompts=prompts, prompt_len=256, completion_len=completion)
    a = estimate_rl("qwen2-0.5b", rl, Z3)
    b = estimate_rl("qwen2-0.5b", replace(rl, group=group + 1), Z3)
    for x, y in zip(a.phases, b.phases):
        assert y.peak_bytes >= x.peak_bytes
    assert b.peak_bytes >= a.peak_bytes


@pytest.mark.parametrize("kw, message", [
    (dict(algo="grpo", critic=QWEN), "a critic is PPO's value model; algo 'grpo' has none"),
    (dict(algo="grpo", rollout="separate", sleep_level=1), "sleep level 1 applies to a colocated engine"),
    (dict(algo="grpo", group=1), "group must be ≥ 2 for GRPO"),
    (dict(algo="grpo", group=0), "group must be an integer ≥ 1, got 0"),
    (dict(algo="dpo", group=4), "DPO generates nothing"),
    (dict(algo="dpo", sleep_level=2), "sleep level 2 is a rollout engine's"),
    (dict(algo="grpo", engine="hf", rollout="separate"), "rollout 'separate' needs a rollout engine"),
    (dict(algo="rloo"), "unknown algo 'rloo'; expected one of: dpo, ppo, grpo"),
    (dict(algo="grpo", sleep_level=3), "unknown sleep level 3; expected one of: 0, 1, 2"),
])
def test_bad_combinations_name_the_value(kw: dict, message: str) -> None:
    with pytest.raises(MemlibError, match=message):
        RLSetup(**kw)


def test_lora_reference_needs_a_lora_policy() -> None:
    with pytest.raises(MemlibError, match="reference 'lora' disables the policy's adapter"):
        estimate_rl(QWEN, RLSetup(algo="grpo", reference="lora"), Z3)


@pytest.mark.parametrize("args, message", [
    (["--algo", "grpo", "--critic", QWEN], "memlib: error: a critic is PPO's value model"),
    (["--algo", "grpo", "--rollout", "separate", "--sleep-level", "2"], "memlib: error: sleep level 2 applies"),
    (["--algo", "grpo", "--group", "0"], "memlib: error:"),
])
def test_cli_bad_combination_is_one_line_exit_2(args: list, message: str) -> None:
    r = subprocess.run([sys.executable, "-m", "memlib", "rl", QWEN, *args], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and r.stderr.startswith(message)
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


def test_plan_job_grpo(capsys: pytest.CaptureFixture) -> None:
    assert main(["plan", QWEN, "--job", "grpo", "--gpus", "8", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["fits"] and data["chosen"]["technique"] in [s["technique"] for s in data["steps"]]
    first = next(s for s in data["steps"] if s["fits"])
    assert first == data["chosen"] and first["per_gpu_bytes"] + first["reserve_bytes"] <= 80 * 2**30
    res = plan_rl(QWEN, RLSetup(algo="grpo"), num_gpus=1, gpu_memory="24GiB")
    assert not res.fits and res.chosen is None
