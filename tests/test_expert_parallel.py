"""Expert parallelism in the estimator, the planner and the CLI (issue 21, Chapter 15)."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memlib.cli import main
from memlib.core.configs import load_config
from memlib.core.errors import MemlibError
from memlib.core.estimate import estimate_training
from memlib.core.families_moe import moe_params
from memlib.core.params import count_params
from memlib.core.parallel import check_layout, expert_parallel_bytes, moe_stage_params
from memlib.core.plan import plan_parallel
from memlib.core.dtypes import GiB

MOE = ("mixtral-8x7b", "deepseek-v2-lite", "qwen3-30b-a3b")


@pytest.mark.parametrize("model", MOE)
def test_moe_stage_params_sum_to_the_model(model: str) -> None:
    """tp=pp=1: the non-expert and routed parts add up to every parameter; the routed part is moe_params'."""
    cfg = load_config(model)
    [(dense, routed)] = moe_stage_params(cfg, 1, 1)
    assert dense + routed == count_params(cfg).params
    assert routed == moe_params(cfg).routed_experts
    stages = moe_stage_params(cfg, 1, 4)
    assert sum(r for _, r in stages) == routed


@pytest.mark.parametrize("ep", [2, 4, 8])
def test_expert_states_divide_by_ep_without_zero(ep: int) -> None:
    """ZeRO-0: each GPU holds E/ep routed experts: their weights, gradients and AdamW states divide by ep."""
    cfg = load_config("mixtral-8x7b")
    mp = moe_params(cfg)
    dense = mp.total - mp.routed_experts
    r = estimate_training(cfg, num_gpus=8, ep=ep, zero_stage=0, framework="deepspeed")  # DeepSpeed-MoE
    local = mp.routed_experts // ep
    assert mp.routed_experts % ep == 0
    assert r.params_bytes == 2 * (dense + local)  # bf16 weights
    assert r.grads_bytes == 2 * (dense + local)
    assert r.optimizer_bytes == 12 * (dense + local)  # fp32 master + m + v
    assert r.settings["local_experts"] == 8 // ep and r.settings["ep"] == ep


def test_zero_shards_experts_over_the_expert_data_parallel_group() -> None:
    """ZeRO-1 with ep=8 on 16 GPUs: expert optimizer states over dp/ep = 2 ranks, the rest over dp = 16."""
    mp = moe_params("mixtral-8x7b")
    dense, local = mp.total - mp.routed_experts, mp.routed_experts // 8
    r = estimate_training("mixtral-8x7b", num_gpus=16, ep=8, zero_stage=1, framework="deepspeed")
    assert r.optimizer_bytes == -(-12 * dense // 16) + -(-12 * local // 2)
    assert r.params_bytes == 2 * (dense + local) and r.settings["expert_data_parallel"] == 2


def test_a2a_buffers_in_temporaries() -> None:
    cfg = load_config("mixtral-8x7b")
    r = estimate_training(cfg, num_gpus=8, ep=4, zero_stage=1, batch_size=2, seq_len=1024, framework="megatron")
    a2a = expert_parallel_bytes(num_experts=8, expert_params=3 * cfg.hidden_size * 14336, ep=4, tokens=2048,
                                hidden_size=cfg.hidden_size, top_k=2)["a2a_buffer_bytes"]
    assert r.settings["a2a_buffer_bytes"] == a2a == 2 * 2 * 2048 * 2 * cfg.hidden_size
    assert r.temp_bytes >= a2a


def test_ep1_unchanged() -> None:
    """ep=1 takes today's path: the same numbers as not passing it, for a MoE model with and without tp."""
    for kw in ({}, {"tp": 2}):
        a = estimate_training("mixtral-8x7b", num_gpus=8, zero_stage=1, framework="megatron", **kw)
        b = estimate_training("mixtral-8x7b", num_gpus=8, zero_stage=1, ep=1, framework="megatron", **kw)
        assert a == b


def test_balanced_routing_leaves_activations() -> None:
    """Each GPU processes b·s·k routed tokens with or without EP: the activations do not change with ep."""
    acts = {ep: estimate_training("deepseek-v2-lite", num_gpus=8, ep=ep, zero_stage=1, tp=2,
                               framework="megatron").activations_bytes
            for ep in (1, 2, 4)}
    assert len(set(acts.values())) == 1


def _states(r: object) -> int:
    return r.params_bytes + r.grads_bytes + r.optimizer_bytes  # type: ignore[attr-defined]


@settings(max_examples=25, deadline=None)
@given(model=st.sampled_from(MOE), zero=st.sampled_from([0, 1, 2, 3]), gpus=st.sampled_from([8, 16, 32]),
       tp=st.sampled_from([1, 2]), pp=st.sampled_from([1, 2]))
def test_more_ep_never_more_state_memory(model: str, zero: int, gpus: int, tp: int, pp: int) -> None:
    cfg = load_config(model)
    dp = gpus // (tp * pp)
    eps = [e for e in range(1, cfg.moe.num_experts + 1) if cfg.moe.num_experts % e == 0 and dp % e == 0]
    # Megatron with tp/pp (ZeRO 0-1), DeepSpeed-MoE with ep alone (ZeRO 0-2)
    fw, zero = ("megatron", min(zero, 1)) if tp > 1 or pp > 1 else ("deepspeed", min(zero, 2))
    kw = dict(num_gpus=gpus, zero_stage=zero, tp=tp, pp=pp, seq_len=256, micro_batches=4 if pp > 1 else 1,
              framework=fw)
    states = [_states(estimate_training(cfg, ep=e, **kw)) for e in eps]
    assert states[1:] == sorted(states[1:], reverse=True)  # ep > 1: the layer-by-layer count of moe_stage_params
    # ep = 1 keeps today's count (memlib.core.parallel.stage_params for tp or pp > 1, which splits Qwen3-MoE's
    # per-head q/k norms over tp: a few KB below the layer-by-layer count)
    assert len(states) == 1 or states[1] <= states[0] * (1 + 1e-6)


@pytest.mark.parametrize("kw, msg", [
    (dict(ep=3, num_gpus=24), "ep 3 does not divide mixtral-8x7b's 8 experts; expected one of: 1, 2, 4, 8"),
    (dict(ep=8, num_gpus=8, tp=2, etp=2), "gpus 8 is not divisible by etp·ep·pp = 2·8·1 = 16 (Megatron-Core's MoE "
                                          "folding: the expert grid spans the same GPUs); expected ep one of: 1, 2, 4"),
    (dict(ep=0, num_gpus=8), "ep"),
])
def test_bad_ep_one_line(kw: dict, msg: str) -> None:
    with pytest.raises(MemlibError) as err:
        estimate_training("mixtral-8x7b", framework="megatron", **kw)
    assert msg in str(err.value) and "\n" not in str(err.value)


def test_ep_on_a_dense_model() -> None:
    with pytest.raises(MemlibError, match="needs an MoE model"):
        check_layout(load_config("llama-3.1-8b"), 8, ep=2)


def test_planner_picks_ep() -> None:
    h100 = 80 * GiB
    d = plan_parallel("deepseek-v2-lite", num_gpus=8, gpu_memory=h100, seq_len=2048)
    # Megatron's layout (fp32 main_grad: 18 B/param) needs ep 4 where the ZeRO paper's 16 B/param fit ep 2
    assert d.fits and d.chosen.technique.startswith("expert parallel") and d.chosen.settings["ep"] == 4
    assert d.chosen.settings["framework"] == "megatron"
    m = plan_parallel("mixtral-8x7b", num_gpus=16, gpu_memory=h100, seq_len=2048)
    assert m.fits and m.chosen.technique == "expert parallel + ZeRO-2" and m.chosen.settings["ep"] == 8
    assert m.chosen.settings["framework"] == "deepspeed"  # DeepSpeed-MoE: EP with ZeRO-2
    # EP is tried before ZeRO-3 and TP; every rung of a MoE plan says its ep
    names = [s.technique for s in m.steps]
    assert names.index("expert parallel + ZeRO-1") < names.index("expert parallel + ZeRO-2")
    assert all("ep" in s.settings for s in m.steps)
    assert not plan_parallel("mixtral-8x7b", num_gpus=8, gpu_memory=h100, seq_len=2048).fits


def test_planner_fixed_ep_and_dense_unchanged() -> None:
    p = plan_parallel("mixtral-8x7b", num_gpus=16, gpu_memory=80 * GiB, seq_len=2048, ep=4)
    assert {s.settings["ep"] for s in p.steps} == {4}
    assert p.steps[0].technique == "expert parallel + ZeRO-1"
    dense = plan_parallel("llama-3.1-8b", num_gpus=8, gpu_memory=80 * GiB, seq_len=2048)
    assert all("ep" not in s.settings and not s.technique.startswith("expert") for s in dense.steps)
    with pytest.raises(MemlibError, match="ep 3 does not divide mixtral-8x7b's 8 experts"):
        plan_parallel("mixtral-8x7b", num_gpus=16, ep=3)


def test_cli_train_ep(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "mixtral-8x7b", "--gpus", "8", "--ep", "8", "--zero", "1", "--framework", "deepspeed",
                 "--json"]) == 0
    out = capsys.readouterr().out
    assert '"ep": 8' in out and '"local_experts": 1' in out


@pytest.mark.parametrize("argv, msg", [
    (["train", "mixtral-8x7b", "--gpus", "8", "--ep", "3", "--framework", "megatron"], "ep 3 does not divide mixtral-8x7b's 8 experts; "
                                                            "expected one of: 1, 2, 4, 8"),
    (["train", "mixtral-8x7b", "--gpus", "2", "--ep", "4", "--framework", "megatron"], "gpus 2 is not divisible by etp·ep·pp = 1·4·1"),
    (["plan", "mixtral-8x7b", "--gpus", "16", "--gpu-mem", "80GiB", "--parallel", "--ep", "3"], "ep 3 does not"),
])
def test_cli_bad_ep_exit_2(argv: list[str], msg: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert msg in err and "\n" not in err


def test_cli_plan_parallel_moe(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "deepseek-v2-lite", "--gpus", "8", "--gpu-mem", "80GiB", "--parallel"]) == 0
    out = capsys.readouterr().out
    assert " ep " in out and "ep=4 (experts split over ep of the dp ranks)" in out
