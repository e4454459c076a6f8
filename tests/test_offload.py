"""Offloading (Chapter 7): placement, traffic and time model against the papers, DeepSpeed's estimators, invariants."""
import importlib.util
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memlib import GB, MemlibError
from memlib.core.estimate import estimate_training
from memlib.core.offload import (
    GPU_PEAK_FLOPS,
    LINK_BANDWIDTH,
    hiding_tokens,
    max_params_that_fit,
    offload_step_time,
    offload_traffic,
    placement,
)

PSI = 10**9


# ---- placement: bytes per parameter where they rest ------------------------------------------------------

def test_placement_zero_offload_paper() -> None:
    """ZeRO-Offload §4: only the 16-bit weights stay on the GPU (2 of 16 bytes: GPU memory ÷ 8)."""
    p = placement("optimizer")
    assert p.bytes_per_param("gpu") == 2
    assert p.bytes_per_param("cpu") == 16  # DeepSpeed: fp32 grads 4 + master 4 + m, v 8
    assert p.step_device == "cpu"
    assert placement("none").bytes_per_param("gpu") == 16
    assert placement("none").step_device == "gpu"


def test_placement_param_offload_and_fsdp2() -> None:
    assert placement("params+optimizer").bytes_per_param("gpu") == 0
    assert placement("params+optimizer").bytes_per_param("cpu") == 18  # DeepSpeed's zero3 estimator: 18Ψ
    nv = placement("params+optimizer", tier="nvme")
    assert nv.bytes_per_param("nvme") == 14 and nv.bytes_per_param("cpu") == 4
    f = placement("params+optimizer", "fsdp2")
    assert f.bytes_per_param("cpu") == 16 and f.bytes_per_param("gpu") == 0


def test_placement_bad_input() -> None:
    with pytest.raises(MemlibError, match="no optimizer-only offload"):
        placement("optimizer", "fsdp2")
    with pytest.raises(MemlibError, match="ZeRO-Infinity"):
        placement("params+optimizer", "fsdp2", "nvme")
    with pytest.raises(MemlibError, match="expected one of"):
        placement("gradients")


# ---- agreement with the estimator and with DeepSpeed's own estimators ----------------------------------

def test_estimator_cpu_bytes_match_deepspeed() -> None:
    """Host memory: estimate_training's cpu_bytes = DeepSpeed's estimator without its 1.5 buffer factor, plus the
    buffers its estimator leaves out: ZeRO-Offload's pinned 16-bit partition (2Ψ/N,
    ``param_buffer_of_bit16_for_cpu_offload_groups``), ZeRO-3's gradient partitions' flat buffer (2Ψ/N)."""
    from memlib._book.ch07_offloading import deepspeed_offload_estimators

    if importlib.util.find_spec("deepspeed") is None:
        pytest.skip("DeepSpeed not installed")
    zero2, zero3 = deepspeed_offload_estimators()
    cpu2, gpu2 = zero2(PSI, cpu_offload=True, additional_buffer_factor=1.0)
    est = estimate_training(params=PSI, zero_stage=2, offload="optimizer", framework="deepspeed")
    assert est.cpu_bytes == cpu2 + 2 * PSI == 18 * PSI
    assert est.params_bytes == gpu2 == 2 * PSI and est.optimizer_bytes == 0
    cpu3, gpu3, _ = zero3(PSI, 10**7, cpu_offload=True, cpu_offload_params=True, additional_buffer_factor=1.0)
    est3 = estimate_training(params=PSI, zero_stage=3, offload="params+optimizer", framework="deepspeed")
    assert est3.cpu_bytes == cpu3 + 2 * PSI == 20 * PSI
    assert est3.params_bytes == 0 and gpu3 == 4 * 10**7  # one layer's 16-bit weights + gradients


def test_estimator_matches_placement_where_they_agree() -> None:
    for stage, n in ((0, 1), (1, 4), (2, 8)):
        est = estimate_training(params=PSI, zero_stage=stage, num_gpus=n, offload="optimizer", framework="deepspeed")
        shard = n if stage >= 1 else 1
        assert est.cpu_bytes == placement("optimizer").bytes_per_param("cpu") * PSI // shard + 2 * PSI // shard
        assert est.params_bytes == placement("optimizer").bytes_per_param("gpu") * PSI
    est = estimate_training(params=PSI, zero_stage=3, num_gpus=4, offload="params+optimizer", framework="deepspeed")
    assert est.cpu_bytes == placement("params+optimizer").bytes_per_param("cpu") * PSI // 4 + 2 * PSI // 4


# ---- traffic ----------------------------------------------------------------------------------------------

def test_traffic_zero_offload_is_4psi_in_the_paper_6psi_in_deepspeed() -> None:
    """The paper's minimum: 2Ψ of 16-bit gradients down, 2Ψ of 16-bit weights up per step; DeepSpeed casts the
    gradients to fp32 on the GPU first: 4Ψ down."""
    p = offload_traffic(PSI, "optimizer", implementation="zero-offload-paper")
    assert p.d2h_backward_micro == 2 * PSI and p.h2d_step == 2 * PSI and p.link_bytes == 4 * PSI
    t = offload_traffic(PSI, "optimizer")
    assert t.d2h_backward_micro == 4 * PSI and t.h2d_step == 2 * PSI and t.link_bytes == 6 * PSI
    assert offload_traffic(PSI, "none").link_bytes == 0
    assert offload_traffic(PSI, "params+optimizer").link_bytes == 8 * PSI       # gathers ×2 + fp32 grads
    assert offload_traffic(PSI, "params+optimizer", implementation="fsdp2").link_bytes == 12 * PSI  # fp32
    assert offload_traffic(PSI, "params+optimizer", implementation="fsdp2",
                           reshard_after_forward=False).link_bytes == 8 * PSI
    assert offload_traffic(PSI, "params+optimizer", implementation="fsdp2",
                           fsdp_param_bytes=2).link_bytes == 6 * PSI


def test_traffic_sharding_and_accumulation() -> None:
    t = offload_traffic(PSI, "optimizer", num_gpus=4, grad_accum_steps=4)
    # DeepSpeed 0.19.8 with k > 1: the 16-bit running sum goes down every micro-batch, comes up from the 2nd on,
    # and the fp32 gradients go down once, at the boundary: (4k + 4)Ψ/N
    assert t.d2h_backward_micro == 2 * (PSI // 4) and t.d2h_boundary_step == 4 * (PSI // 4)
    assert t.h2d_backward_micro == 0 and t.h2d_accumulate_step == 3 * (PSI // 2)
    assert t.link_bytes == (4 * 4 + 4) * (PSI // 4)
    assert offload_traffic(PSI, "optimizer", num_gpus=8, grad_accum_steps=8).link_bytes == 36 * (PSI // 8)
    assert offload_traffic(PSI, "optimizer", num_gpus=8).link_bytes == 6 * (PSI // 8)  # k = 1: fp32 down


@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_traffic_zero3_offload_optimizer(k: int) -> None:
    """ZeRO-3 offload_optimizer: the gradient partitions' host buffer, 16-bit down and up every micro-batch,
    fp32 down at the boundary, the 16-bit weights up after the step: (4k + 6)Ψ/N."""
    t = offload_traffic(PSI, "optimizer", num_gpus=8, grad_accum_steps=k, zero_stage=3)
    assert t.link_bytes == (4 * k + 6) * (PSI // 8)
    nv = offload_traffic(PSI, "optimizer", tier="nvme")
    assert nv.nvme_read_step == nv.nvme_write_step == 12 * PSI


# ---- time model -------------------------------------------------------------------------------------------

def test_time_model_by_hand() -> None:
    """One case worked by hand: 10B on a V100, PCIe Gen3, 10 × 1024 tokens (the DeepSpeed tutorial's run)."""
    t = offload_step_time(10 * PSI, 10_240, "optimizer", gpu="v100", mfu=0.4, link="pcie3",
                          cpu_adam_params_per_s=4e9, gpu_adam_bytes_per_s=0.8e12)
    compute = 6 * 10 * PSI * 10_240 / (0.4 * 125e12)
    bw = 0.8 * LINK_BANDWIDTH["pcie3"]
    assert t.compute_s == pytest.approx(compute)
    assert 2 * 10 * PSI / bw < 2 / 3 * compute  # the gradient copy hides under backward
    assert t.step_s == pytest.approx(compute + 10 * PSI / 4e9 + 2 * 10 * PSI / bw)
    assert t.overhead == pytest.approx(t.step_s / (compute + 28 * 10 * PSI / 0.8e12) - 1)
    assert 0.25 < t.overhead < 0.35  # the Tips notes' "~30 %" regime


def test_time_model_modern_gpu_is_cpu_bound() -> None:
    t = offload_step_time(10 * PSI, 10_240, "optimizer", gpu="h100", link="pcie5", cpu_adam_params_per_s=4e9)
    assert t.bound == "cpu-adam" and t.overhead > 1
    # delayed parameter update hides the tail behind compute only up to the compute time
    d = offload_step_time(10 * PSI, 10_240, "optimizer", gpu="h100", link="pcie5", cpu_adam_params_per_s=4e9,
                          delayed_update=True)
    assert d.step_s == pytest.approx(max(t.compute_s, t.cpu_step_s + t.upload_s))


def test_hiding_tokens_closed_form() -> None:
    """Backward (4ΨT FLOPs) hides b·Ψ bytes when T ≥ b·MFU·peak / (4·BW): DeepSpeed's fp32 gradients (b = 4),
    the paper's 16-bit ones (b = 2)."""
    expect = 0.4 * 989.5e12 / (2 * 0.8 * LINK_BANDWIDTH["pcie4"])
    assert hiding_tokens("optimizer", implementation="zero-offload-paper") == math.ceil(expect)
    assert hiding_tokens("optimizer") == math.ceil(2 * expect)
    assert hiding_tokens("none") == 0
    tr = hiding_tokens("optimizer")
    assert offload_step_time(PSI, tr, "optimizer").micro_s == pytest.approx(
        offload_step_time(PSI, tr, "none").micro_s)
    assert offload_step_time(PSI, tr // 2, "optimizer").micro_s > offload_step_time(PSI, tr // 2, "none").micro_s


def test_time_bad_input() -> None:
    with pytest.raises(MemlibError, match="expected one of"):
        offload_step_time(PSI, 1024, "optimizer", link="pcie9")
    with pytest.raises(MemlibError, match="mfu"):
        offload_step_time(PSI, 1024, "optimizer", mfu=1.5)
    with pytest.raises(MemlibError):
        offload_step_time(PSI, 0, "optimizer")


# ---- capacity: the Tips notes' "10x larger model" --------------------------------------------------------

def test_max_params_v100() -> None:
    """32 GB V100 with 8 GB for activations etc.: 1.5B without offload (the paper's PyTorch limit is 1.4B)."""
    none = max_params_that_fit(32 * GB, 1500 * GB, "none", reserve_bytes=8 * GB)
    assert none == 24 * GB // 16
    off = max_params_that_fit(32 * GB, 1500 * GB, "optimizer", reserve_bytes=8 * GB)
    # ZeRO-2 offload: 2 B/param of weights plus one 16-bit gradient bucket (5e8 elements) on the GPU
    assert off == pytest.approx((24 * GB - 2 * 500_000_000) / 2, rel=1e-6)
    # a 64 GB workstation: the host caps the model at 64 GB / 18 B (16 + the pinned 16-bit partition)
    assert max_params_that_fit(32 * GB, 64 * GB, "optimizer", reserve_bytes=8 * GB) == 64 * GB // 18
    assert max_params_that_fit(32 * GB, 64 * GB, "params+optimizer") == 64 * GB // 20


# ---- invariants (hypothesis) ------------------------------------------------------------------------------

MODES_IMPL = [("none", "deepspeed"), ("optimizer", "deepspeed"), ("params+optimizer", "deepspeed"),
              ("params+optimizer", "fsdp2")]


@settings(max_examples=60, deadline=None)
@given(n=st.integers(10**6, 10**12), tokens=st.integers(1, 10**6), k=st.integers(1, 64),
       mi=st.sampled_from(MODES_IMPL), bw=st.floats(1e9, 1e12), factor=st.floats(1.0, 100.0),
       adam=st.floats(1e8, 1e11), overlap=st.booleans())
def test_more_bandwidth_never_slower(n: int, tokens: int, k: int, mi: tuple[str, str], bw: float, factor: float,
                                     adam: float, overlap: bool) -> None:
    mode, impl = mi
    kw = {"implementation": impl, "grad_accum_steps": k, "cpu_adam_params_per_s": adam, "overlap": overlap}
    slow = offload_step_time(n, tokens, mode, link=bw, **kw)
    fast = offload_step_time(n, tokens, mode, link=bw * factor, **kw)
    faster_cpu = offload_step_time(n, tokens, mode, link=bw, **{**kw, "cpu_adam_params_per_s": adam * factor})
    assert fast.step_s <= slow.step_s * (1 + 1e-12)
    assert faster_cpu.step_s <= slow.step_s * (1 + 1e-12)
    assert slow.step_s >= slow.compute_s * (1 - 1e-12)  # offload never makes compute faster
    if overlap:
        no = offload_step_time(n, tokens, mode, link=bw, **{**kw, "overlap": False})
        assert slow.step_s <= no.step_s * (1 + 1e-12)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(10**6, 10**12), gpus=st.sampled_from([1, 2, 4, 8, 64]), stage=st.sampled_from([1, 2]))
def test_offload_never_adds_gpu_bytes(n: int, gpus: int, stage: int) -> None:
    base = estimate_training(params=n, zero_stage=stage, num_gpus=gpus, framework="deepspeed")
    off = estimate_training(params=n, zero_stage=stage, num_gpus=gpus, offload="optimizer", framework="deepspeed")
    assert off.total_bytes <= base.total_bytes
    assert off.cpu_bytes > 0 and base.cpu_bytes == 0
    z3 = estimate_training(params=n, zero_stage=3, num_gpus=gpus, framework="deepspeed")
    z3_off = estimate_training(params=n, zero_stage=3, num_gpus=gpus, offload="params+optimizer", framework="deepspeed")
    assert z3_off.total_bytes <= z3.total_bytes
    # what leaves the GPU arrives on the host: total bytes are conserved or grow (fp32 gradient buffer)
    assert off.total_bytes + off.cpu_bytes >= base.total_bytes


@settings(max_examples=40, deadline=None)
@given(model=st.sampled_from(["gpt2", "llama-2-7b", "qwen2-0.5b"]), b=st.integers(1, 8),
       s=st.sampled_from([128, 512, 1024]))   # GPT-2 takes at most 1,024 positions
def test_offload_never_adds_gpu_bytes_with_activations(model: str, b: int, s: int) -> None:
    kw = {"batch_size": b, "seq_len": s, "framework": "deepspeed"}
    for stage, mode in ((2, "optimizer"), (3, "params+optimizer")):
        base = estimate_training(model, zero_stage=stage, **kw)
        off = estimate_training(model, zero_stage=stage, offload=mode, **kw)
        assert off.total_bytes <= base.total_bytes
        assert off.activations_bytes == base.activations_bytes


@settings(max_examples=40, deadline=None)
@given(n=st.integers(10**6, 10**12), gpus=st.integers(1, 1024), k=st.integers(1, 64),
       mi=st.sampled_from(MODES_IMPL))
def test_traffic_shards_with_gpus(n: int, gpus: int, k: int, mi: tuple[str, str]) -> None:
    mode, impl = mi
    one = offload_traffic(n, mode, implementation=impl, grad_accum_steps=k)
    many = offload_traffic(n, mode, implementation=impl, num_gpus=gpus, grad_accum_steps=k)
    assert many.link_bytes <= one.link_bytes
    assert many.link_bytes * gpus >= one.link_bytes  # shards cover the model (ceil division)


def test_tables_are_sane() -> None:
    assert LINK_BANDWIDTH["pcie3"] * 2 == pytest.approx(LINK_BANDWIDTH["pcie4"])
    assert LINK_BANDWIDTH["pcie5"] == pytest.approx(63.0e9, rel=1e-3)
    assert GPU_PEAK_FLOPS["h100"] / GPU_PEAK_FLOPS["a100"] == pytest.approx(3.17, rel=0.01)


def test_cpu_adam_measurement_runs() -> None:
    """The measurement helper times a real torch AdamW step on the CPU (small, fast)."""
    pytest.importorskip("torch")
    from memlib.measure.offload import cpu_adam_throughput

    r = cpu_adam_throughput(40_000, steps=2, threads=1)
    assert r["n_params"] == 40_000 and r["params_per_s"] > 1e5
    with pytest.raises(MemlibError, match="expected one of"):
        cpu_adam_throughput(1000, implementation="sgd")


def test_fsdp2_offload_code_path_on_cpu() -> None:
    """FSDP2 with CPUOffloadPolicy runs end to end (gloo, one rank); on the CPU it only checks the code path."""
    torch = pytest.importorskip("torch")
    from memlib.measure.offload import fsdp2_offload_run

    kw = {"device": "cpu", "hidden": 32, "layers": 1, "vocab": 64, "batch_size": 2, "seq_len": 8, "steps": 2}
    with_offload = fsdp2_offload_run(offload=True, **kw)
    without = fsdp2_offload_run(offload=False, **kw)
    assert with_offload["params_on"] == "cpu" and with_offload["optimizer_state_on"] == "cpu"
    assert with_offload["param_dtype"] == "float32"  # shards keep the storage dtype (bf16 only when gathered)
    assert with_offload["n_params"] == 32 * 64 * 2 + 2 * 32 + 32 * 128 + 128 + 128 * 32 + 32
    assert with_offload["losses"] == pytest.approx(without["losses"], rel=1e-5)  # same math
    assert not torch.distributed.is_initialized()


def test_copy_counter_counts_cross_device_bytes() -> None:
    """The counter behind the GPU run's PCIe byte counts: cross-device copies only, by direction."""
    torch = pytest.importorskip("torch")
    from memlib.measure.offload import copy_counter

    x = torch.randn(1000)                                   # fp32: 4,000 bytes
    with copy_counter() as c:
        x.to("meta")                                        # cpu -> meta: counted
        torch.empty(10, device="meta").copy_(torch.randn(10))  # copy_ across devices: counted (40 bytes)
        x.to(torch.float16)                                 # same device: not counted
        x.clone()
    assert c.bytes == {("cpu", "meta"): 4040}
