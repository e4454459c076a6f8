"""Real sharded training on gloo (memlib.measure.distributed): memory per rank vs memlib, identical losses, traffic."""
import json
import multiprocessing

import pytest

from memlib import MemlibError
from memlib.measure import distributed
from memlib.measure.distributed import STRATEGIES, STRATEGY_STAGE, TINY_LLAMA, bus_bytes, main, run_sharded
from memlib._book.ch06_zero_fsdp import deepspeed_estimates, reference_losses
from memlib.core.estimate import estimate_training
from memlib.core.params import count_params
from memlib.measure.procs import idle_worker, join_with_deadline
from memlib.core.zero import comm_volume
from memlib._book.ch06_zero_fsdp import deepspeed_zero2_bytes, deepspeed_zero3_bytes, fsdp_peak_bytes

PC = count_params(TINY_LLAMA)
PSI = PC.params
UNITS = [PC.embeddings, PC.per_layer, PC.per_layer, PC.lm_head]  # fully_shard units in forward order
ROOT = PSI - sum(UNITS)  # the final norm, on the root


@pytest.fixture(scope="module", params=[2, 4], ids=lambda n: f"{n}ranks")
def runs(request):
    return request.param, run_sharded(request.param, STRATEGIES, steps=2, timeout_s=120)


def _memlib_states(strategy: str, n: int):
    # FSDP2 reshards after the backward whatever reshard_after_forward says: at rest both are ZeRO-3
    stage = 3 if strategy in ("zero2", "zero3") else STRATEGY_STAGE[strategy]
    # run_sharded builds DDP with gradient_as_bucket_view=True: the gradients are views of DDP's buckets
    return estimate_training(params=PSI, precision="fp32", optimizer="adamw", zero_stage=stage, num_gpus=n,
                             framework="fsdp2" if stage >= 2 else "pytorch", gradient_as_bucket_view=stage < 2)


def test_model_states_per_rank_match_memlib(runs) -> None:
    n, res = runs
    for strategy, run in res.items():
        est = _memlib_states(strategy, n)
        for r in run.ranks:
            assert r.num_params == PSI and r.world_size == n and r.backend == "gloo"
            for measured, expected in ((r.params_bytes, est.params_bytes), (r.grads_bytes, est.grads_bytes),
                                       (r.optimizer_bytes, est.optimizer_bytes), (r.states_bytes, est.total_bytes)):
                assert abs(measured - expected) <= 0.10 * expected, (strategy, r.rank, measured, expected)


def test_peak_per_rank_matches_memlib(runs) -> None:
    n, res = runs
    for strategy, run in res.items():
        if strategy in ("ddp", "zero1"):
            expected = _memlib_states(strategy, n).total_bytes
        else:
            expected = fsdp_peak_bytes(UNITS, ROOT, n, reshard_after_forward=strategy == "zero3")
        for r in run.ranks:
            assert abs(r.peak_bytes - expected) <= 0.10 * expected, (strategy, r.rank, r.peak_bytes, expected)
            assert r.peak_bytes >= r.states_bytes
    # sharding orders the peaks: DDP > ZeRO-1 > FSDP ZeRO-2-like > ZeRO-3
    peaks = [res[s].ranks[0].peak_bytes for s in STRATEGIES]
    assert peaks == sorted(peaks, reverse=True) and len(set(peaks)) == 4
    # ZeRO-2-like FSDP gathers the whole model during forward/backward; ZeRO-3 one unit at a time
    assert res["zero2"].ranks[0].peak_by_category["params"] >= 4 * (PSI - PC.lm_head)
    assert res["zero3"].ranks[0].peak_by_category["params"] <= 4 * (PSI / n + PC.per_layer + ROOT) + 64


def test_losses_identical_across_strategies(runs) -> None:
    n, res = runs
    ref = reference_losses(world_size=n, steps=2)
    for strategy, run in res.items():
        assert run.mean_losses == pytest.approx(ref, rel=1e-5), strategy
        for r, r_ddp in zip(run.ranks, res["ddp"].ranks):
            assert r.losses == pytest.approx(r_ddp.losses, rel=1e-5), (strategy, r.rank)
    # the ranks saw different data: sharded, not replicated, batches
    assert len({round(r.losses[0], 6) for r in res["ddp"].ranks}) == n


def test_collective_bytes_vs_paper(runs) -> None:
    n, res = runs
    unit = 4 * (n - 1) / n  # fp32 bytes per element, ring factor
    measured = {s: res[s].ranks[0].comm_bus_bytes / unit for s in STRATEGIES}
    assert measured["ddp"] == pytest.approx(comm_volume(0, PSI), rel=0.01)   # all-reduce: 2Ψ
    assert measured["zero2"] == pytest.approx(comm_volume(2, PSI), rel=0.01)  # gather once + reduce-scatter
    assert measured["zero3"] == pytest.approx(comm_volume(3, PSI), rel=0.01)  # gather twice + reduce-scatter
    # torch's ZeroRedundancyOptimizer sits on DDP: all-reduce (2Ψ) + broadcast of updated shards (Ψ)
    assert measured["zero1"] == pytest.approx(comm_volume(1, PSI) + PSI, rel=0.01)
    assert set(res["zero3"].ranks[0].comm) == {"all_gather_single", "reduce_scatter_single"}
    assert res["zero3"].ranks[0].comm["all_gather_single"][0] == 2 * res["zero2"].ranks[0].comm["all_gather_single"][0]


def test_bus_bytes() -> None:
    assert bus_bytes("all_reduce", 1000, 4) == 1500
    assert bus_bytes("all_gather", 1000, 4) == bus_bytes("reduce_scatter", 1000, 4) == 750
    assert bus_bytes("broadcast", 1000, 1) == 0
    with pytest.raises(MemlibError, match="unknown collective 'alltoall'"):
        bus_bytes("alltoall", 1, 2)


def test_deadline_kills_blocked_workers() -> None:
    # workers that block far past the deadline: the run must stop at the deadline, never race it
    import torch.multiprocessing as mp

    ctx = mp.start_processes(idle_worker, args=(600.0,), nprocs=2, join=False, start_method="spawn")
    with pytest.raises(TimeoutError, match="idle run did not finish within 1.0 s"):
        join_with_deadline(ctx, 1.0, "idle run")
    assert all(not p.is_alive() for p in ctx.processes)
    assert not multiprocessing.active_children()  # the workers were killed and reaped


def test_run_sharded_timeout_is_a_memlib_error(monkeypatch, expired_deadline) -> None:
    monkeypatch.setattr(distributed, "join_with_deadline", expired_deadline)
    with pytest.raises(MemlibError, match="distributed run with 2 processes did not finish within 7 s"):
        run_sharded(2, ["ddp"], steps=2, timeout_s=7)
    assert not multiprocessing.active_children()


def test_bad_strategy() -> None:
    with pytest.raises(MemlibError, match="unknown strategy 'zero4'"):
        run_sharded(2, ["zero4"])


def test_main_writes_json(tmp_path) -> None:
    out = tmp_path / "run.json"
    assert main(["--world-size", "2", "--strategies", "zero3", "--steps", "2", "--out", str(out)]) == 0
    payload = json.loads(out.read_text())
    assert payload["device"] == "cpu" and set(payload["runs"]) == {"zero3"}
    ranks = payload["runs"]["zero3"]["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1]
    assert ranks[0]["params_bytes"] == 4 * PSI // 2 and ranks[0]["cuda_peak_bytes"] is None


def test_deepspeed_estimators_vs_memlib() -> None:
    psi, big = 7_500_000_000, 100_000_000
    ds = deepspeed_estimates(psi, largest_layer_params=big, num_gpus_per_node=8, num_nodes=8)
    assert ds["zero2"]["gpu_bytes"] == deepspeed_zero2_bytes(psi, 64)
    assert ds["zero3"]["gpu_bytes"] == deepspeed_zero3_bytes(psi, 64, big)
    assert ds["zero3"]["largest_layer_bytes"] == 4 * big
    assert ds["zero2"]["cpu_bytes"] == int(psi * 4 * 8 * 1.5)  # fp32 copy per process on the node × 1.5
    assert ds["zero2"]["gpu_bytes_offload"] == 2 * psi  # only the 16-bit parameters stay on the GPU
    # printed "GB" are GiB: DeepSpeed's table shows (2Ψ + 18Ψ/64) / 2^30 to two decimals
    assert f"{deepspeed_zero2_bytes(psi, 64) / 2**30:.2f}GB" in ds["printed"]["zero2"]
