"""Megatron-FSDP in the estimator (issue 33): ``--framework megatron --zero 2/3`` is ``--use-megatron-fsdp`` with
``--data-parallel-sharding-strategy optim_grads`` / ``optim_grads_params`` (Megatron-Core 0.16.1,
``megatron/core/distributed/fsdp/``)."""
from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from memlib.cli import main
from memlib.core.errors import MemlibError
from memlib.core.estimate import estimate_training
from memlib.core.frameworks.megatron import (MEGATRON_FSDP_STRATEGIES, MFSDP_PREFETCH_ELEMENTS,
                                             MFSDP_RS_QUEUE_ELEMENTS, megatron_fsdp_working_set)

N = 7_000_000_000


@given(dp=st.sampled_from([1, 2, 8, 64, 1024]), tp=st.sampled_from([1, 2, 8]), cp=st.sampled_from([1, 4]))
def test_states_are_the_distributed_optimizers_with_grads_then_weights_sharded(dp: int, tp: int, cp: int) -> None:
    """2 + 4 + 12 bytes per parameter: zero 1 shards the 12 over dp·cp, zero 2 also the fp32 ``main_grad``
    (``is_grad_buffer_distributed``), zero 3 also the bf16 weights (``is_model_weight_buffer_distributed``)."""
    kw = dict(params=N, num_gpus=tp * cp * dp, tp=tp, cp=cp, framework="megatron")
    per_rank, shards = -(-N // tp), dp * cp
    one, two, three = (estimate_training(zero_stage=z, **kw) for z in (1, 2, 3))
    assert (one.params_bytes, one.grads_bytes) == (2 * per_rank, 4 * per_rank)
    assert two.params_bytes == 2 * per_rank and two.grads_bytes == -(-4 * per_rank // shards)
    assert three.params_bytes == -(-2 * per_rank // shards)
    assert one.optimizer_bytes == two.optimizer_bytes == three.optimizer_bytes
    assert three.total_bytes <= two.total_bytes <= one.total_bytes


def test_strategies_and_source_defaults() -> None:
    assert MEGATRON_FSDP_STRATEGIES == {0: "no_shard", 1: "optim", 2: "optim_grads", 3: "optim_grads_params"}
    assert (MFSDP_PREFETCH_ELEMENTS, MFSDP_RS_QUEUE_ELEMENTS) == (500_000_000, 1_000_000_000)


def test_working_set_prefetch_and_reduce_scatter_queue() -> None:
    """A 70B layer over tp 8 (≈ 1.07·10⁸ elements): the layer and 5 prefetched layers gathered in bf16 (5 ≥
    5·10⁸ elements), the layer's gradient and 9 queued ones in fp32 (queue ≤ 10⁹ elements)."""
    unit = 107_000_000
    w, g = megatron_fsdp_working_set(unit, 80 * unit, 3, 2, 4)
    assert (w, g) == (2 * 6 * unit, 4 * 10 * unit)
    assert megatron_fsdp_working_set(unit, 80 * unit, 2, 2, 4) == (0, g)
    assert megatron_fsdp_working_set(unit, 80 * unit, 1, 2, 4) == (0, 0)
    assert megatron_fsdp_working_set(unit, 3 * unit, 3, 2, 4) == (2 * 3 * unit, 4 * 3 * unit)  # capped at n


def test_zero3_layout_for_llama_70b_and_the_working_set_is_gone_at_the_step() -> None:
    kw = dict(framework="megatron", num_gpus=64, tp=8, seq_len=8192, sequence_parallel=True)
    one, three = (estimate_training("llama-3.1-70b", zero_stage=z, **kw) for z in (1, 3))
    assert three.total_bytes < one.total_bytes
    assert three.temp_bytes > one.temp_bytes  # the gathered layers and the reduce-scatter queue
    dp = estimate_training("llama-3-8b", framework="megatron", zero_stage=3, num_gpus=8, seq_len=4096)
    assert dp.peak_phase == "backward" and dp.params_bytes == pytest.approx(2 * dp.settings["params"] / 8, rel=1e-3)


def test_cli_accepts_megatron_fsdp_and_refuses_offload(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "llama-3.1-70b", "--framework", "megatron", "--zero", "3", "--gpus", "64", "--tp", "8",
                 "--seq", "8192"]) == 0
    assert "framework=megatron" in capsys.readouterr().out
    assert main(["train", "llama-3-8b", "--framework", "megatron", "--zero", "3", "--gpus", "8", "--offload",
                 "optimizer"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "megatron: zero 0-3, offload none" in err


def test_megatron_fsdp_with_lora_is_refused() -> None:
    with pytest.raises(MemlibError, match="method 'lora' with model parallelism is not estimated"):
        estimate_training("llama-3-8b", framework="megatron", zero_stage=3, num_gpus=16, tp=2, method="lora")
