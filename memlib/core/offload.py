"""Offloading: what lives where, what crosses the host link each step, and what that costs in time (Chapter 7).

Pure Python, no torch. Memory per GPU and host memory come from :func:`memlib.core.estimate.estimate_training`
(``offload="optimizer"`` or ``"params+optimizer"``); this module adds the other half of the trade: the bytes
that cross PCIe (or NVLink-C2C, or reach NVMe) per micro-step and per optimizer step, and a time model that
sets them against the GPU compute of the same step (6·N FLOPs per token, Kaplan et al. 2020) at an assumed
MFU, with the optimizer step on the CPU at a given Adam throughput (parameters per second).

Three implementations are described, each from its source:

* **ZeRO-Offload** (Ren et al. 2021; DeepSpeed ``offload_optimizer``, ZeRO stage 1/2): fp32 master weights,
  Adam m and v and the gradients live in CPU memory and the Adam step runs there (DeepSpeedCPUAdam); the GPU
  keeps the 16-bit weights. The paper's design (implementation ``zero-offload-paper``) sends 16-bit gradients
  down (2 bytes/param) and updated 16-bit weights up (2 bytes/param): 4Ψ bytes, the minimum for any offload
  of the step, as the paper shows. DeepSpeed (implementation ``deepspeed``) casts each gradient to fp32 on the
  GPU before the copy (``deepspeed/runtime/zero/stage_1_and_2.py``, ``async_inplace_copy_grad_to_fp32_buffer_
  from_gpu``: ``src_tensor.to(self.master_weights_and_grads_dtype)``; ``stage3.py``,
  ``_offload_grad_partition_at_boundary``): 4 bytes/param down, 6Ψ per step.
* **ZeRO-3 parameter offload / ZeRO-Infinity** (Rajbhandari et al. 2021; DeepSpeed ``offload_param``):
  the 16-bit weight shards also live on the host (or on NVMe); every gather copies them up, once for the
  forward pass and again for the backward pass.
* **FSDP2** ``fully_shard(..., offload_policy=CPUOffloadPolicy())`` (PyTorch): sharded parameters, sharded
  gradients and optimizer states on the CPU, the step on the CPU. The shards keep the parameters' storage
  dtype (fp32 under ``MixedPrecisionPolicy(param_dtype=bf16)``), so 4 bytes/param cross the link per
  gather and per gradient (``torch/distributed/fsdp/_fully_shard/_fsdp_param.py`` and
  ``_fsdp_collectives.py``: ``.to(device, non_blocking=True)`` before the cast; the reduced gradient is cast
  back to the original dtype before ``.to("cpu")``).

Inter-GPU collectives (all-gather, reduce-scatter) are Chapter 6's subject and are not timed here.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from .choices import OFFLOAD
from .errors import MemlibError, check_choice, check_positive
from .estimate import estimate_training
from .hardware import GPUS
from .hardware import LINK_BANDWIDTH as _LINK_BANDWIDTH
from .search import largest_fitting

__all__ = [
    "MODES",
    "IMPLEMENTATIONS",
    "TIERS",
    "LINK_BANDWIDTH",
    "GPU_PEAK_FLOPS",
    "DEFAULT_LINK_EFFICIENCY",
    "StatePlacement",
    "Placement",
    "placement",
    "OffloadTraffic",
    "offload_traffic",
    "OffloadTime",
    "offload_step_time",
    "hiding_tokens",
    "max_params_that_fit",
]

#: Offload modes, as in :data:`memlib.core.estimate.OFFLOAD`.
MODES = OFFLOAD
#: Who implements it: DeepSpeed (ZeRO-Offload / ZeRO-3 offload / ZeRO-Infinity), PyTorch FSDP2, or the
#: ZeRO-Offload paper's design (16-bit gradients down: the 4Ψ minimum DeepSpeed does not reach).
IMPLEMENTATIONS = ("deepspeed", "fsdp2", "zero-offload-paper")
#: Where the offloaded states rest: host memory, or NVMe (ZeRO-Infinity; DeepSpeed only).
TIERS = ("cpu", "nvme")

#: The host links (bytes/s, one direction), from the one hardware table: :data:`memlib.core.hardware.LINK_BANDWIDTH`.
LINK_BANDWIDTH: dict[str, float] = _LINK_BANDWIDTH

#: The GPUs the offload model names, and their dense 16-bit tensor-core peaks in FLOP/s, read from
#: :data:`memlib.core.hardware.GPUS` (fp16: the V100 has no bf16; bf16 = fp16 on the others).
_OFFLOAD_GPUS: dict[str, str] = {"v100": "v100", "a100": "a100-80gb", "h100": "h100-sxm", "h200": "h200",
                                "rtx4090": "rtx-4090"}
GPU_PEAK_FLOPS: dict[str, float] = {key: GPUS[name].peak_flops("fp16") for key, name in _OFFLOAD_GPUS.items()}

#: Share of a link's theoretical bandwidth that pinned-memory copies reach (an assumption; measure yours
#: with a large pinned ``tensor.to("cuda", non_blocking=True)``).
DEFAULT_LINK_EFFICIENCY = 0.8


@dataclass(frozen=True)
class StatePlacement:
    """One kind of training state: its bytes per parameter, where it rests, and a note.

    Attributes:
        state: what it is (``"fp32 master weights"``).
        bytes_per_param: bytes per parameter before sharding.
        location: ``"gpu"``, ``"cpu"``, ``"nvme"`` or ``"streamed"`` (produced on the GPU and copied out
            in buckets as the backward pass runs: only a bucket is resident).
    """

    state: str
    bytes_per_param: float
    location: str


@dataclass(frozen=True)
class Placement:
    """Where each state of mixed-precision Adam lives under one offload setting. Introduced in Chapter 7.

    Attributes:
        mode: ``none``, ``optimizer`` or ``params+optimizer``.
        implementation: ``deepspeed``, ``fsdp2`` or ``zero-offload-paper`` (the paper's 4Ψ design).
        tier: ``cpu`` or ``nvme``.
        states: the states, one row each.
        step_device: where the optimizer step runs (``"gpu"`` or ``"cpu"``).
    """

    mode: str
    implementation: str
    tier: str
    states: tuple[StatePlacement, ...]
    step_device: str

    def bytes_per_param(self, location: str) -> float:
        """Resident bytes per parameter (unsharded) at ``location``."""
        return sum(s.bytes_per_param for s in self.states if s.location == location)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return asdict(self)


def _check(mode: str, implementation: str, tier: str) -> None:
    check_choice("offload mode", mode, MODES)
    check_choice("implementation", implementation, IMPLEMENTATIONS)
    check_choice("offload tier", tier, TIERS)
    if implementation == "fsdp2" and mode == "optimizer":
        raise MemlibError("FSDP2 has no optimizer-only offload: CPUOffloadPolicy moves parameters, gradients "
                          "and optimizer states together; use mode 'params+optimizer' or implementation "
                          "'deepspeed'")
    if implementation == "zero-offload-paper" and mode != "optimizer":
        raise MemlibError(f"implementation 'zero-offload-paper' is the paper's optimizer offload; expected mode "
                          f"'optimizer' (got {mode!r})")
    if tier == "nvme" and (implementation != "deepspeed" or mode == "none"):
        raise MemlibError(f"offload tier 'nvme' is ZeRO-Infinity (implementation 'deepspeed' with an offload "
                          f"mode); got implementation {implementation!r}, mode {mode!r}")


def placement(mode: str, implementation: str = "deepspeed", tier: str = "cpu") -> Placement:
    """Where each state of mixed-precision (bf16/fp16) Adam lives, and where the step runs.

    Introduced in Chapter 7. ``deepspeed`` follows the ZeRO-Offload paper (§4: 16-bit weights on the GPU;
    gradients, fp32 weights, m and v on the CPU) as DeepSpeed implements it: the 16-bit gradients are
    copied into an fp32 gradient buffer on the host (4 bytes/param there, where the paper counts 2), and
    with ZeRO-2 they leave the GPU bucket by bucket during backward. ``params+optimizer`` adds the 16-bit
    weight shards to the host (ZeRO-3 ``offload_param``); with ``tier="nvme"`` (ZeRO-Infinity) the offloaded
    states rest on NVMe and pass through host buffers. ``fsdp2`` is ``CPUOffloadPolicy``: the sharded
    parameters keep their storage dtype (fp32 here; they are the master copy), their gradients are fp32, and
    ``torch.optim.AdamW`` keeps fp32 m and v beside them, all on the CPU.

    Args:
        mode: ``none``, ``optimizer`` or ``params+optimizer``.
        implementation: ``deepspeed``, ``fsdp2`` or ``zero-offload-paper`` (the paper's 4Ψ design).
        tier: ``cpu`` or ``nvme``.

    Returns:
        The placement table.

    Raises:
        MemlibError: for unknown values, FSDP2 with ``optimizer`` (it has no such mode) or NVMe without
            DeepSpeed offload.
    """
    _check(mode, implementation, tier)
    off = tier
    states: tuple[StatePlacement, ...]
    if mode == "none":
        states = (StatePlacement("16-bit weights", 2, "gpu"), StatePlacement("16-bit gradients", 2, "gpu"),
                  StatePlacement("fp32 master weights", 4, "gpu"), StatePlacement("Adam m and v (fp32)", 8, "gpu"))
        return Placement(mode, implementation, tier, states, "gpu")
    if implementation == "fsdp2":
        states = (StatePlacement("fp32 sharded weights (the master copy)", 4, "cpu"),
                  StatePlacement("fp32 sharded gradients", 4, "cpu"),
                  StatePlacement("Adam m and v (fp32)", 8, "cpu"),
                  StatePlacement("bf16 gathered weights, a layer at a time", 2, "streamed"),
                  StatePlacement("bf16 unsharded gradients, a layer at a time", 2, "streamed"))
        return Placement(mode, implementation, tier, states, "cpu")
    weights = "gpu" if mode == "optimizer" else off
    if implementation == "zero-offload-paper":
        states = (StatePlacement("16-bit weights", 2, "gpu"), StatePlacement("16-bit gradients", 2, "cpu"),
                  StatePlacement("fp32 master weights", 4, off), StatePlacement("Adam m and v (fp32)", 8, off))
        return Placement(mode, implementation, tier, states, "cpu")
    states = (StatePlacement("16-bit weights", 2, weights),
              StatePlacement("16-bit gradients", 2, "streamed"),
              StatePlacement("fp32 gradient buffer", 4, "cpu"),
              StatePlacement("fp32 master weights", 4, off),
              StatePlacement("Adam m and v (fp32)", 8, off))
    return Placement(mode, implementation, tier, states, "cpu")


@dataclass(frozen=True)
class OffloadTraffic:
    """Bytes one GPU moves over its host link (and its node's NVMe) for one optimizer step.

    Introduced in Chapter 7. ``*_micro`` happen on every micro-batch (forward + backward), the others once
    per optimizer step. Host-to-device (H2D) and device-to-host (D2H) are the two directions of a full-duplex
    link.

    Attributes:
        h2d_forward_micro: weights copied up for the forward pass.
        h2d_backward_micro: weights copied up again for the backward pass.
        d2h_backward_micro: gradients copied down during the backward pass.
        h2d_accumulate_step: DeepSpeed ZeRO-Offload with gradient accumulation: the running gradient sum
            copied up to be added to, once per micro-batch after the first (this field is the step's total;
            it moves during the backward passes).
        h2d_step: updated 16-bit weights copied up after the CPU step (ZeRO-Offload).
        d2h_boundary_step: DeepSpeed with accumulation (or ZeRO-3's offload_optimizer): the fp32 gradients
            copied down once, in the backward pass of the micro-batch that ends the accumulation.
        nvme_read_step: bytes read from NVMe by the optimizer step (ZeRO-Infinity).
        nvme_write_step: bytes written to NVMe by the optimizer step.
        nvme_read_micro: weight bytes read from NVMe per micro-batch (parameters on NVMe).
        grad_accum_steps: micro-batches per optimizer step.
        settings: the inputs, echoed.
    """

    h2d_forward_micro: int
    h2d_backward_micro: int
    d2h_backward_micro: int
    h2d_accumulate_step: int
    h2d_step: int
    nvme_read_step: int
    nvme_write_step: int
    nvme_read_micro: int
    grad_accum_steps: int
    settings: dict[str, Any] = field(default_factory=dict)
    d2h_boundary_step: int = 0

    @property
    def link_bytes(self) -> int:
        """All bytes over the host link (both directions) per optimizer step."""
        k = self.grad_accum_steps
        micro = self.h2d_forward_micro + self.h2d_backward_micro + self.d2h_backward_micro
        return micro * k + self.h2d_accumulate_step + self.d2h_boundary_step + self.h2d_step

    @property
    def nvme_bytes(self) -> int:
        """All NVMe bytes (read + write) per optimizer step."""
        return self.nvme_read_step + self.nvme_write_step + self.nvme_read_micro * self.grad_accum_steps

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return asdict(self)


def offload_traffic(params: int, mode: str, *, implementation: str = "deepspeed", tier: str = "cpu",
                    num_gpus: int = 1, grad_accum_steps: int = 1, reshard_after_forward: bool = True,
                    fsdp_param_bytes: int = 4, zero_stage: int = 2) -> OffloadTraffic:
    """Bytes over the host link per optimizer step, per GPU, for mixed-precision Adam.

    Introduced in Chapter 7. Ψ = ``params``, N = ``num_gpus`` (each GPU moves only its shard, Ψ/N):

    * ``optimizer``, ``zero-offload-paper`` (Ren et al. 2021, §4): D2H 2Ψ/N of 16-bit gradients per
      micro-batch; H2D 2Ψ/N of updated 16-bit weights per step — 4Ψ for one GPU without accumulation.
    * ``optimizer``, DeepSpeed (ZeRO-Offload, stage 1/2): the gradients go down in fp32, cast on the GPU
      (``stage_1_and_2.py``, ``async_inplace_copy_grad_to_fp32_buffer_from_gpu``): D2H 4Ψ/N per micro-batch,
      H2D 2Ψ/N of 16-bit weights per step — 6Ψ for one GPU without accumulation. With k > 1 micro-batches
      DeepSpeed 0.19.8 keeps a 16-bit running sum on the host (``copy_grads_in_partition``: ``if
      self.micro_step_id > 0 or not self.is_gradient_accumulation_boundary():
      self.async_accumulate_grad_in_cpu_via_gpu(param)``): every micro-batch copies its 16-bit sum down (2Ψ/N),
      every one after the first first copies the sum up to add to it (2Ψ/N), and only the boundary sends the fp32
      gradients (4Ψ/N): (4k + 4)Ψ/N per step, 36Ψ/N at k = 8.
    * ``optimizer`` at ZeRO-3 (``zero_stage=3``; ``stage3.py``, ``partition_grads``): the gradient partitions'
      flat buffer is on the host: the first micro-batch copies its 16-bit partition down and back up
      (``grad_buffer.copy_(grad_partition)``, ``grad_buffer.to(grad_partition.device)``), each later one up, adds,
      and down; the boundary sends fp32 (``_offload_grad_partition_at_boundary``, 4Ψ/N) and the step's 16-bit
      weights come up (2Ψ/N): (4k + 6)Ψ/N, 10Ψ/N at k = 1.
    * ``params+optimizer``, DeepSpeed (ZeRO-3 ``offload_param``): H2D 2Ψ/N for the forward gathers and again
      for the backward gathers, D2H 4Ψ/N of fp32 gradients (``stage3.py``,
      ``_offload_grad_partition_at_boundary``), per micro-batch; the step writes the 16-bit weights
      on the host, so nothing comes up after it.
    * ``params+optimizer``, FSDP2 ``CPUOffloadPolicy``: as DeepSpeed but with ``fsdp_param_bytes`` per
      element (the shards' storage dtype: 4 for fp32 parameters); without ``reshard_after_forward`` the
      backward pass reuses the forward's gathered weights (no second copy up).
    * ``tier="nvme"`` (ZeRO-Infinity): the step reads fp32 weights, m and v (12Ψ/N) from NVMe and writes them
      back; with parameters there too, each micro-batch reads the 16-bit weights twice (forward, backward)
      and the step writes them once.

    Args:
        params: Ψ, the model's parameter count.
        mode: ``none``, ``optimizer`` or ``params+optimizer``.
        implementation: ``deepspeed``, ``fsdp2`` or ``zero-offload-paper`` (the paper's 4Ψ design).
        tier: ``cpu`` or ``nvme``.
        num_gpus: data-parallel GPUs sharing the states (ZeRO/FSDP sharding).
        grad_accum_steps: micro-batches per optimizer step.
        reshard_after_forward: FSDP2's option (ZeRO-3 behaviour when True). DeepSpeed ZeRO-3 always re-gathers.
        fsdp_param_bytes: bytes per element of FSDP2's sharded parameters (4 for fp32, 2 for a bf16 model).
        zero_stage: DeepSpeed's ZeRO stage with ``mode="optimizer"`` (3 moves the gradient partitions' host
            buffer every micro-batch; 0-2 are ZeRO-Offload's stage 1/2 path).

    Returns:
        The traffic, bytes per GPU.
    """
    _check(mode, implementation, tier)
    n = check_positive("params", params)
    g = check_positive("num_gpus", num_gpus)
    k = check_positive("grad_accum_steps", grad_accum_steps)
    e = check_positive("fsdp_param_bytes", fsdp_param_bytes)
    settings = {"params": n, "mode": mode, "implementation": implementation, "tier": tier, "num_gpus": g,
                "grad_accum_steps": k, "reshard_after_forward": reshard_after_forward}
    shard = -(-n // g)
    if mode == "none":
        return OffloadTraffic(0, 0, 0, 0, 0, 0, 0, 0, k, settings)
    if implementation == "fsdp2":
        up = e * shard
        return OffloadTraffic(up, up if reshard_after_forward else 0, e * shard, 0, 0, 0, 0, 0, k, settings)
    if implementation == "zero-offload-paper":
        return OffloadTraffic(0, 0, 2 * shard, 2 * shard * (k - 1), 2 * shard, 0, 0, 0, k, settings)
    # DeepSpeed: gradients cast to fp32 on the GPU, then copied down at the boundary
    accumulate_up = 2 * shard * (k - 1) if mode == "optimizer" else 0
    nvme_read_step = nvme_write_step = nvme_read_micro = 0
    if tier == "nvme":
        nvme_read_step = nvme_write_step = 12 * shard
        if mode == "params+optimizer":
            nvme_write_step += 2 * shard
            nvme_read_micro = 2 * 2 * shard
    if mode == "optimizer" and zero_stage == 3:  # 16-bit partition down and back up each micro-batch, fp32 at the end
        return OffloadTraffic(0, 0, 2 * shard, 2 * shard * k, 2 * shard, nvme_read_step, nvme_write_step,
                              nvme_read_micro, k, settings, d2h_boundary_step=4 * shard)
    if mode == "optimizer" and k > 1:  # a 16-bit running sum down each micro-batch, fp32 once at the boundary
        return OffloadTraffic(0, 0, 2 * shard, accumulate_up, 2 * shard, nvme_read_step, nvme_write_step,
                              nvme_read_micro, k, settings, d2h_boundary_step=4 * shard)
    if mode == "optimizer":
        return OffloadTraffic(0, 0, 4 * shard, 0, 2 * shard, nvme_read_step, nvme_write_step, nvme_read_micro, k,
                              settings)
    return OffloadTraffic(2 * shard, 2 * shard, 4 * shard, 0, 0, nvme_read_step, nvme_write_step, nvme_read_micro,
                          k, settings)


@dataclass(frozen=True)
class OffloadTime:
    """Modelled time of one optimizer step with offload, in seconds. Introduced in Chapter 7.

    Attributes:
        compute_s: GPU compute of all micro-batches (forward + backward), no offload.
        micro_s: one micro-batch with its copies (overlapped or not).
        cpu_step_s: the optimizer step on the CPU (0 when it runs on the GPU).
        nvme_s: the step's NVMe reads and writes (pipelined with the CPU step).
        upload_s: copying the updated weights up after the step.
        exposed_s: offload time not hidden behind GPU compute.
        step_s: the modelled step time.
        overhead: step_s / baseline_s − 1, where the baseline is the same step with everything on the GPU
            (compute plus a GPU Adam step).
        bound: which term is the largest of ``compute``, ``link``, ``cpu-adam``, ``nvme``.
        settings: the inputs, echoed.
    """

    compute_s: float
    micro_s: float
    cpu_step_s: float
    nvme_s: float
    upload_s: float
    exposed_s: float
    step_s: float
    overhead: float
    bound: str
    settings: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return asdict(self)


def _bandwidth(link: str | float, efficiency: float) -> float:
    if isinstance(link, str):
        check_choice("link", link, LINK_BANDWIDTH)
        bw = LINK_BANDWIDTH[link]
    else:
        bw = float(link)
    if not bw > 0 or not 0 < efficiency <= 1:
        raise MemlibError(f"bandwidth must be > 0 and efficiency in (0, 1]; got {bw!r}, {efficiency!r}")
    return bw * efficiency


def offload_step_time(params: int, tokens_per_micro_batch: int, mode: str, *, implementation: str = "deepspeed",
                      tier: str = "cpu", grad_accum_steps: int = 1, num_gpus: int = 1,
                      link: str | float = "pcie4", link_efficiency: float = DEFAULT_LINK_EFFICIENCY,
                      gpu: str | float = "h100", mfu: float = 0.4, cpu_adam_params_per_s: float = 4e9,
                      gpu_adam_bytes_per_s: float = 2e12, nvme: str | float = "nvme-gen4", nvme_drives: int = 1,
                      overlap: bool = True, delayed_update: bool = False, flops_per_token: float = 6.0,
                      reshard_after_forward: bool = True, fsdp_param_bytes: int = 4) -> OffloadTime:
    """Model the time of one optimizer step with offload, and its overhead over no offload.

    Introduced in Chapter 7. GPU compute per micro-batch is ``flops_per_token``·Ψ·tokens / (MFU · peak)
    (6 without recomputation, 8 with full recomputation), one third forward and two thirds backward. With
    ``overlap`` each direction of the link runs beside compute (DeepSpeed's ``overlap_comm``, FSDP2's
    pinned non-blocking copies and prefetch): a phase takes the longer of its compute and its copies. The
    CPU step takes Ψ/N / ``cpu_adam_params_per_s`` and then, for ZeRO-Offload, the updated 16-bit weights
    go up; these are exposed unless ``delayed_update`` (the paper's one-step delayed parameter update, DPU)
    overlaps them with the next step's compute. The baseline is the same step with everything on the GPU:
    the compute plus a GPU Adam step that moves 28 bytes/param of HBM traffic (reads fp32 w, m, v and the
    16-bit gradient, writes fp32 w, m, v and the 16-bit weights) at ``gpu_adam_bytes_per_s``.

    Args:
        params: Ψ, the model's parameter count.
        tokens_per_micro_batch: tokens per GPU per micro-batch (batch_size × seq_len).
        mode: ``none``, ``optimizer`` or ``params+optimizer``.
        implementation: ``deepspeed``, ``fsdp2`` or ``zero-offload-paper`` (the paper's 4Ψ design).
        tier: ``cpu`` or ``nvme``.
        grad_accum_steps: micro-batches per optimizer step.
        num_gpus: data-parallel GPUs sharing the states (each steps its shard Ψ/N on the CPU).
        link: a :data:`LINK_BANDWIDTH` key or bytes/s per direction.
        link_efficiency: achieved share of the link's theoretical bandwidth.
        gpu: a :data:`GPU_PEAK_FLOPS` key or a peak in FLOP/s.
        mfu: model FLOPs utilization assumed for the GPU compute.
        cpu_adam_params_per_s: parameters per second the CPU Adam step processes for this GPU. The default,
            4·10⁹, is about one server socket's memory bandwidth (~120 GB/s at ~30 bytes/param) for one GPU:
            generous when several GPUs share a socket.
        gpu_adam_bytes_per_s: HBM bandwidth achieved by the GPU Adam step of the baseline.
        nvme: a :data:`LINK_BANDWIDTH` NVMe key or bytes/s of one drive.
        nvme_drives: drives striped together (this GPU's share).
        overlap: overlap copies with compute.
        delayed_update: DeepSpeed's one-step delayed parameter update (DPU).
        flops_per_token: FLOPs per parameter per token (6; 8 with full recomputation).
        reshard_after_forward: FSDP2 option (see :func:`offload_traffic`).
        fsdp_param_bytes: FSDP2 shard dtype bytes (see :func:`offload_traffic`).

    Returns:
        The modelled times.

    Limitations:
        Collectives between GPUs, kernel-launch gaps, host-memory contention between GPUs and DeepSpeed's
        gradient-norm pass over the host buffer are not modelled; the copies are assumed to be large
        (bucketed) transfers from pinned memory.
    """
    n = check_positive("params", params)
    tokens = check_positive("tokens_per_micro_batch", tokens_per_micro_batch)
    k = check_positive("grad_accum_steps", grad_accum_steps)
    g = check_positive("num_gpus", num_gpus)
    drives = check_positive("nvme_drives", nvme_drives)
    traffic = offload_traffic(n, mode, implementation=implementation, tier=tier, num_gpus=g,
                              grad_accum_steps=k, reshard_after_forward=reshard_after_forward,
                              fsdp_param_bytes=fsdp_param_bytes)
    bw = _bandwidth(link, link_efficiency)
    if isinstance(gpu, str):
        check_choice("gpu", gpu, GPU_PEAK_FLOPS)
        peak = GPU_PEAK_FLOPS[gpu]
    else:
        peak = float(gpu)
    if not (peak > 0 and 0 < mfu <= 1 and cpu_adam_params_per_s > 0 and gpu_adam_bytes_per_s > 0
            and flops_per_token > 0):
        raise MemlibError(f"peak, cpu_adam_params_per_s, gpu_adam_bytes_per_s, flops_per_token must be > 0 and "
                          f"mfu in (0, 1]; got {peak!r}, {cpu_adam_params_per_s!r}, {gpu_adam_bytes_per_s!r}, "
                          f"{flops_per_token!r}, {mfu!r}")
    rate = mfu * peak
    compute_micro = flops_per_token * n * tokens / rate
    fwd, bwd = compute_micro / 3, 2 * compute_micro / 3
    shard = -(-n // g)
    settings = {**traffic.settings, "tokens_per_micro_batch": tokens, "link_bytes_per_s": bw, "peak_flops": peak,
                "mfu": mfu, "cpu_adam_params_per_s": cpu_adam_params_per_s, "overlap": overlap,
                "delayed_update": delayed_update, "flops_per_token": flops_per_token}

    nvme_bw = _bandwidth(nvme, 1.0) * drives if tier == "nvme" else 0.0
    nvme_micro = traffic.nvme_read_micro / nvme_bw if nvme_bw else 0.0
    h2d_f = traffic.h2d_forward_micro / bw
    h2d_b = (traffic.h2d_backward_micro + traffic.h2d_accumulate_step / k) / bw
    d2h_b = (traffic.d2h_backward_micro + traffic.d2h_boundary_step / k) / bw
    if overlap:
        # NVMe reads for the weights feed the H2D copies: the slower of the two paces each phase.
        micro = max(fwd, h2d_f, nvme_micro / 2) + max(bwd, h2d_b, d2h_b, nvme_micro / 2)
    else:
        micro = compute_micro + h2d_f + h2d_b + d2h_b + nvme_micro
    gpu_adam = 28 * shard / gpu_adam_bytes_per_s
    if mode == "none":
        cpu_step = nvme_s = upload = 0.0
        tail = gpu_adam
    else:
        cpu_step = shard / cpu_adam_params_per_s
        nvme_s = (traffic.nvme_read_step + traffic.nvme_write_step) / nvme_bw if nvme_bw else 0.0
        upload = traffic.h2d_step / bw
        tail = max(cpu_step, nvme_s) + upload
    compute = k * compute_micro
    work = k * micro
    if delayed_update and mode != "none":
        step = max(work, tail)
    else:
        step = work + tail
    baseline = compute + gpu_adam
    terms = {"compute": compute, "link": (traffic.link_bytes / bw), "cpu-adam": cpu_step, "nvme": nvme_s}
    bound = max(terms, key=lambda t: terms[t])
    return OffloadTime(compute, micro, cpu_step, nvme_s, upload, max(step - compute, 0.0), step,
                       step / baseline - 1, bound, settings)


def hiding_tokens(mode: str, *, implementation: str = "deepspeed", num_gpus: int = 1, link: str | float = "pcie4",
                  link_efficiency: float = DEFAULT_LINK_EFFICIENCY, gpu: str | float = "h100", mfu: float = 0.4,
                  flops_per_token: float = 6.0, reshard_after_forward: bool = True,
                  fsdp_param_bytes: int = 4) -> int:
    """Tokens per micro-batch (per GPU) from which the per-micro-batch copies hide behind compute.

    Introduced in Chapter 7. Compute and copies both grow with Ψ, so the answer does not depend on the
    model size: the backward pass (4Ψ·T FLOPs at ``flops_per_token`` = 6) hides b bytes/param of copies when
    T ≥ b·MFU·peak / (4·BW) (divided by N when N GPUs each move only their shard Ψ/N); for the ZeRO-Offload
    paper's 2-byte gradients that is MFU·peak / (2·BW): about 7,800 tokens for an H100 at 40 % MFU on PCIe Gen4
    (80 % of 31.5 GB/s); DeepSpeed's fp32 gradients (4 bytes) need twice as many. The CPU step and the weight upload, once per optimizer step, are not included: they
    are amortized by gradient accumulation (or hidden by the delayed update), not by the micro-batch.

    Returns:
        The smallest such token count (rounded up); 0 with ``mode="none"``.
    """
    n = 10**9
    tr = offload_traffic(n, mode, implementation=implementation, num_gpus=num_gpus,
                         reshard_after_forward=reshard_after_forward, fsdp_param_bytes=fsdp_param_bytes)
    if mode == "none":
        return 0
    bw = _bandwidth(link, link_efficiency)
    if isinstance(gpu, str):
        check_choice("gpu", gpu, GPU_PEAK_FLOPS)
    peak = GPU_PEAK_FLOPS[gpu] if isinstance(gpu, str) else float(gpu)
    if not (peak > 0 and 0 < mfu <= 1 and flops_per_token > 0):
        raise MemlibError(f"peak and flops_per_token must be > 0 and mfu in (0, 1]; got {peak!r}, "
                          f"{flops_per_token!r}, {mfu!r}")
    rate = mfu * peak
    # forward: flops_per_token/3 · Ψ·T / rate ≥ h2d_f / bw ; backward: 2/3 of it ≥ max(h2d_b, d2h_b) / bw
    t_fwd = tr.h2d_forward_micro * rate * 3 / (flops_per_token * n * bw)
    t_bwd = max(tr.h2d_backward_micro, tr.d2h_backward_micro) * rate * 3 / (2 * flops_per_token * n * bw)
    return math.ceil(max(t_fwd, t_bwd) - 1e-9)


def max_params_that_fit(gpu_bytes: int, host_bytes: int, offload: str, *, reserve_bytes: int = 0,
                        gpus_per_node: int = 1, precision: str = "bf16-mixed", host_buffer_factor: float = 1.0,
                        ) -> int:
    """Largest parameter count whose model states fit one GPU and its host, by :func:`estimate_training`.

    Introduced in Chapter 7. Bisects Ψ on ``estimate_training(params=Ψ, offload=...)`` (AdamW, one GPU; ZeRO
    stage 2 for ``optimizer``, as DeepSpeed's ZeRO-Offload, and stage 3 for ``params+optimizer``): GPU model states + ``reserve_bytes`` (activations, CUDA context,
    fragmentation) must fit ``gpu_bytes``, and ``cpu_bytes`` × ``gpus_per_node`` × ``host_buffer_factor``
    (DeepSpeed's estimators use 1.5 for pinned and staging buffers) must fit ``host_bytes``.

    Args:
        gpu_bytes: memory of one GPU.
        host_bytes: host memory of the node available to training.
        offload: ``none``, ``optimizer`` or ``params+optimizer``.
        reserve_bytes: GPU bytes that are not model states.
        gpus_per_node: GPUs sharing the host (each runs its own process with its own offloaded states).
        precision: ``fp16-mixed`` or ``bf16-mixed`` (or another of :data:`memlib.core.estimate.PRECISIONS`).
        host_buffer_factor: multiplier on host memory for pinned/staging buffers.

    Returns:
        The largest Ψ that fits (0 if none does). With ``params+optimizer`` the GPU holds no per-parameter
        state in this count (a layer at a time, which needs a model config), so only the host limits Ψ.
    """
    check_choice("offload mode", offload, MODES)
    gpu_b = check_positive("gpu_bytes", gpu_bytes)
    host_b = check_positive("host_bytes", host_bytes, allow_zero=True)
    per_node = check_positive("gpus_per_node", gpus_per_node)
    reserve = check_positive("reserve_bytes", reserve_bytes, allow_zero=True)
    if not host_buffer_factor >= 1:
        raise MemlibError(f"host_buffer_factor must be ≥ 1, got {host_buffer_factor!r}")
    stage = {"none": 0, "optimizer": 2, "params+optimizer": 3}[offload]  # ZeRO-Offload is DeepSpeed stage 2

    def fits(n: int) -> bool:
        est = estimate_training(params=n, precision=precision, optimizer="adamw", zero_stage=stage,
                                offload=offload, framework="deepspeed")
        return (est.total_bytes + reserve <= gpu_b
                and est.cpu_bytes * per_node * host_buffer_factor <= host_b)

    return largest_fitting(fits, start=2, cap=10**16)
