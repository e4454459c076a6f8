"""Chapter 6's book helpers: the ZeRO paper's formulas and Table 1, DeepSpeed's estimators, the FSDP2 peak.

Book helpers (moved from ``memlib.core.zero`` and ``memlib.measure.distributed``): only Chapter 6 uses them.
Model states come from :func:`memlib.core.estimate.estimate_training` (the ZeRO paper's accounting, §5) and
communication volumes from :func:`memlib.core.zero.comm_volume` (§7); this module adds the paper's formulas
written out, its Table 1 with the paper's rounding, DeepSpeed's estimator formulas restated (and DeepSpeed's
own estimators called, :func:`deepspeed_estimates`), a model of the peak that FSDP2 (``fully_shard``) reaches
on a rank, which :mod:`memlib.measure.distributed` measures, and the one-process loss trajectory the sharded
runs must match (:func:`reference_losses`). The formulas are pure Python; torch and DeepSpeed are imported
lazily, inside the two functions that run them.
"""
from __future__ import annotations

import contextlib
import io
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import ROUND_DOWN, ROUND_HALF_UP, Decimal
from typing import Any

from ..core.dtypes import GB, GiB
from ..core.errors import MemlibError, check_choice, check_positive
from ..core.estimate import estimate_training
from ..core.hardware import GPUS
from ..core.zero import STAGES, comm_volume
from ..measure.distributed import _LR, TINY_LLAMA, _batch, _build, _torch


STAGE_NAMES = {0: "baseline DP", 1: "P_os (ZeRO-1)", 2: "P_os+g (ZeRO-2)", 3: "P_os+g+p (ZeRO-3)"}

TABLE1_PARAMS = (7_500_000_000, 128_000_000_000, 1_000_000_000_000)
TABLE1_DP = (1, 4, 16, 64, 256, 1024)

# Rajbhandari et al. 2020, Table 1: GB per device for (P_os, P_os+g, P_os+g+p), as printed.
TABLE1_PRINTED: dict[int, dict[int, tuple[str, str, str]]] = {
    7_500_000_000: {1: ("120", "120", "120"), 4: ("52.5", "41.3", "30"), 16: ("35.6", "21.6", "7.5"),
                    64: ("31.4", "16.6", "1.88"), 256: ("30.4", "15.4", "0.47"), 1024: ("30.1", "15.1", "0.12")},
    128_000_000_000: {1: ("2048", "2048", "2048"), 4: ("896", "704", "512"), 16: ("608", "368", "128"),
                      64: ("536", "284", "32"), 256: ("518", "263", "8"), 1024: ("513", "257", "2")},
    1_000_000_000_000: {1: ("16000", "16000", "16000"), 4: ("7000", "5500", "4000"),
                        16: ("4750", "2875", "1000"), 64: ("4187", "2218", "250"), 256: ("4046", "2054", "62.5"),
                        1024: ("4011", "2013", "15.6")},
}


V100_BYTES = GPUS["v100"].memory_bytes
"""A 32 GB V100 holds 32 GiB = 34.36 × 10⁹ bytes (HBM2 capacities are powers of two)."""


@dataclass(frozen=True)
class ZeroStates:
    """Model states on one GPU under a ZeRO stage, bytes. Introduced in Chapter 6.

    Attributes:
        stage: 0 (plain data parallel) to 3.
        num_gpus: data-parallel degree N_d.
        params_bytes: parameters held (16-bit in mixed precision; a 1/N shard from stage 3).
        grads_bytes: gradients held (1/N from stage 2).
        optimizer_bytes: optimizer states, fp32 master weights included (1/N from stage 1).
        comm_elements: elements each GPU moves per step (§7: 2Ψ, 2Ψ, 2Ψ, 3Ψ).
    """

    stage: int
    num_gpus: int
    params_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    comm_elements: int

    @property
    def total_bytes(self) -> int:
        """Params + grads + optimizer states."""
        return self.params_bytes + self.grads_bytes + self.optimizer_bytes


@dataclass(frozen=True)
class Table1Cell:
    """One cell of the ZeRO paper's Table 1, recomputed. Introduced in Chapter 6.

    Attributes:
        params: Ψ.
        dp: data-parallel degree.
        stage: 1, 2 or 3 (the table's three columns per model).
        bytes: model states per device, bytes.
        printed: recomputed and rounded as the paper prints it (GB).
        paper: what the paper prints.
        fits_v100: the model states fit in a 32 GB V100 (activations and buffers not counted).
    """

    params: int
    dp: int
    stage: int
    bytes: int
    printed: str
    paper: str
    fits_v100: bool

    @property
    def match(self) -> bool:
        """The recomputed cell prints as the paper's."""
        return self.printed == self.paper


def zero_states(params: int, stage: int, num_gpus: int, *, precision: str = "fp16-mixed",
                optimizer: str = "adamw") -> ZeroStates:
    """Per-GPU model states and communication volume of a ZeRO stage (ZeRO paper §5, §7).

    Introduced in Chapter 6. The bytes are :func:`memlib.core.estimate.estimate_training`'s (``params=`` mode,
    ``framework="deepspeed"``: DeepSpeed is the paper's implementation), so the chapter's numbers and the estimator cannot drift apart.
    Stage 1 is DeepSpeed's ZeRO-1 with gradient accumulation, which keeps all gradients as the paper's P_os does.

    Args:
        params: parameter count Ψ.
        stage: 0, 1, 2 or 3.
        num_gpus: data-parallel degree N_d.
        precision: as in :func:`~memlib.core.estimate.estimate_training` (``fp16-mixed``: the paper's 2 + 2 + 12).
        optimizer: as in :func:`~memlib.core.estimate.estimate_training`.

    Returns:
        The per-GPU states.
    """
    check_choice("zero stage", stage, STAGES)
    # the paper's P_os keeps the gradients whole: DeepSpeed's ZeRO-1 does so between micro-batches (grad_accum > 1);
    # with one micro-batch it frees them as ZeRO-2 does (Chapter 6's erratum)
    est = estimate_training(params=params, zero_stage=stage, num_gpus=num_gpus, precision=precision,
                            optimizer=optimizer, framework="deepspeed", grad_accum=2 if stage == 1 else 1)
    return ZeroStates(stage, num_gpus, est.params_bytes, est.grads_bytes, est.optimizer_bytes,
                      comm_volume(stage, params))


def zero_formula(stage: int, k: int = 12) -> str:
    """The paper's per-GPU formula for a stage in Ψ (parameters) and N (GPUs), mixed-precision Adam (K = 12).

    Introduced in Chapter 6: ``"16Ψ"``, ``"4Ψ + 12Ψ/N"``, ``"2Ψ + 14Ψ/N"``, ``"16Ψ/N"``.
    """
    check_choice("zero stage", stage, STAGES)
    check_positive("k", k, allow_zero=True)
    return {0: f"{4 + k}Ψ", 1: f"4Ψ + {k}Ψ/N", 2: f"2Ψ + {2 + k}Ψ/N", 3: f"{4 + k}Ψ/N"}[stage]


def tips_notes_zero2_bytes(params: int, num_gpus: int) -> int:
    """The Tips notes' ZeRO-2 formula, 4Ψ + 14Ψ/N (it counts the full 2Ψ of 16-bit gradients *and* their shard).

    Introduced in Chapter 6 for the erratum; the paper's (and :func:`zero_states`') is 2Ψ + 14Ψ/N.
    """
    p = check_positive("params", params)
    n = check_positive("num_gpus", num_gpus)
    return 4 * p + 14 * p // n


def paper_round(value_gb: float | Decimal, rounding: str = "half_up") -> str:
    """Round a GB value the way the ZeRO paper's Table 1 prints it.

    Introduced in Chapter 6. Three significant figures, never more than two decimals, never dropping
    integer digits, trailing zeros removed. The paper rounds the 7.5B column half up (41.25 → 41.3) and
    truncates the 128B and 1T columns (513.5 → 513, 4187.5 → 4187, 15.625 → 15.6).

    Args:
        value_gb: the value in GB (10⁹ bytes).
        rounding: ``"half_up"`` or ``"down"``.

    Returns:
        The printed string.
    """
    check_choice("rounding", rounding, ("half_up", "down"))
    v = Decimal(str(value_gb)) if not isinstance(value_gb, Decimal) else value_gb
    if v <= 0:
        raise MemlibError(f"value_gb must be > 0, got {value_gb}")
    decimals = min(2, max(0, 2 - v.adjusted()))  # 3 significant figures; at most 2 decimals; whole integer part
    mode = ROUND_HALF_UP if rounding == "half_up" else ROUND_DOWN
    q = v.quantize(Decimal(1).scaleb(-decimals), rounding=mode)
    text = format(q, "f")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return text


def table1(capacity_bytes: int = V100_BYTES) -> list[Table1Cell]:
    """The ZeRO paper's Table 1 recomputed: 7.5B, 128B, 1T parameters × DP 1 … 1024 × the three stages.

    Introduced in Chapter 6. Each cell is :func:`zero_states` (mixed-precision Adam, 16 bytes per parameter
    in all), in GB, rounded as the paper prints it (:func:`paper_round`), with the paper's value beside it
    and whether the model states fit in ``capacity_bytes`` (a 32 GB V100 by default).

    Returns:
        The 54 cells, model by model, DP degree by DP degree, stage 1 to 3.
    """
    cap = check_positive("capacity_bytes", capacity_bytes)
    cells = []
    for psi in TABLE1_PARAMS:
        rounding = "half_up" if psi == TABLE1_PARAMS[0] else "down"
        for dp in TABLE1_DP:
            for stage in (1, 2, 3):
                b = zero_states(psi, stage, dp).total_bytes
                printed = paper_round(Decimal(b) / Decimal(GB), rounding)
                cells.append(Table1Cell(psi, dp, stage, b, printed, TABLE1_PRINTED[psi][dp][stage - 1], b <= cap))
    return cells


def deepspeed_zero2_bytes(params: int, num_gpus: int) -> int:
    """DeepSpeed's ZeRO-2 GPU estimate without offload, restated: 2Ψ + 18Ψ/N (Chapter 6).

    ``estimate_zero2_model_states_mem_needs``: 2 bytes of 16-bit parameters, and per shard 2 (16-bit
    gradients) + 4 (fp32 gradients) + 4 (fp32 master weights) + 8 (Adam moments) = 18: the paper's 14 plus
    the fp32 gradient partition DeepSpeed keeps for the optimizer.
    """
    p = check_positive("params", params)
    n = check_positive("num_gpus", num_gpus)
    return 2 * p + int(18 * p / n)


def deepspeed_zero2_offload_host_bytes(params: int, num_gpus_per_node: int, num_nodes: int = 1,
                                        buffer_factor: float = 1.5) -> int:
    """DeepSpeed's ZeRO-2 host estimate with ``offload_optimizer``, restated: Ψ·max(4·N, 16)·1.5 (Chapter 6).

    ``estimate_zero2_model_states_mem_needs`` in ``deepspeed/runtime/zero/stage_1_and_2.py`` (DeepSpeed 0.19.8)
    computes ``cpu_mem = total_params * max(4 * total_gpus, 16) * additional_buffer_factor`` with
    ``total_gpus = num_nodes * num_gpus_per_node`` and reports it "per CPU", i.e. per node. Known quirk, kept
    here as DeepSpeed has it: the figure grows with the GPUs of *all* nodes (256Ψ per node at 8 × 8), while the
    states a node's ranks offload shrink with them (:func:`zero2_offload_host_bytes`); the branch without
    offload multiplies by the GPUs of one node only.

    Args:
        params: parameter count Ψ.
        num_gpus_per_node: GPUs per node.
        num_nodes: nodes.
        buffer_factor: DeepSpeed's ``additional_buffer_factor``.

    Returns:
        Host bytes per node, as DeepSpeed's estimator reports them.
    """
    p = check_positive("params", params)
    total_gpus = check_positive("num_gpus_per_node", num_gpus_per_node) * check_positive("num_nodes", num_nodes)
    return int(p * max(4 * total_gpus, 16) * buffer_factor)


def zero2_offload_host_bytes(params: int, num_gpus_per_node: int, num_nodes: int = 1) -> int:
    """Host bytes per node that ZeRO-2 with ``offload_optimizer`` holds: the node's shards of 16Ψ (Chapter 6).

    Each rank offloads its 1/N of the fp32 master weights, Adam's m and v and the fp32 gradients
    (4 + 8 + 4 = 16 bytes per parameter), so a node of g GPUs holds 16Ψ·g/N; pinned staging buffers and
    the fp32 copy each process loads while the model is built come on top. Compare
    :func:`deepspeed_zero2_offload_host_bytes`.

    Args:
        params: parameter count Ψ.
        num_gpus_per_node: GPUs per node.
        num_nodes: nodes.

    Returns:
        Host bytes per node for the offloaded states.
    """
    p = check_positive("params", params)
    g = check_positive("num_gpus_per_node", num_gpus_per_node)
    n = g * check_positive("num_nodes", num_nodes)
    return -(-16 * p * g // n)


def deepspeed_zero3_bytes(params: int, num_gpus: int, largest_layer_params: int) -> int:
    """DeepSpeed's ZeRO-3 GPU estimate without offload, restated: 4·L + 18Ψ/N (Chapter 6).

    ``estimate_zero3_model_states_mem_needs``: 4 bytes per parameter of the largest layer (its gathered
    16-bit parameters and gradients, 2 + 2) plus the same 18 bytes per sharded parameter as ZeRO-2.
    """
    p = check_positive("params", params)
    n = check_positive("num_gpus", num_gpus)
    big = check_positive("largest_layer_params", largest_layer_params)
    return 4 * big + int(18 * p / n)


def fsdp_peak_bytes(unit_params: Sequence[int], root_params: int, world_size: int, *,
                    reshard_after_forward: bool, param_bytes: int = 4, grad_bytes: int = 4,
                    optimizer_bytes: int = 8) -> int:
    """Peak model-state bytes on one rank of FSDP2 (``fully_shard``), swept over the backward pass.

    Introduced in Chapter 6. Every rank keeps its shards (parameters, gradients once reduce-scattered,
    optimizer states). In the backward pass, just after unit j's gradients are computed and before they
    are reduce-scattered, it also holds unit j's full gradients and the gathered parameters: with
    ``reshard_after_forward=False`` every unit not yet through its backward (units 0…j, gathered since the
    forward: ZeRO-2-like); with ``True`` only unit j (ZeRO-3). The root's own parameters stay gathered.
    Shards are taken as exactly 1/N (FSDP2 pads dim 0 to a multiple of N; a few bytes on small tensors).
    Prefetching (on GPUs the next unit is all-gathered early) and all-gather buffers are not counted.

    Args:
        unit_params: parameters of each ``fully_shard`` unit, in forward order (the root excluded).
        root_params: parameters of the root module's own (not in any unit).
        world_size: N.
        reshard_after_forward: FSDP2's flag.
        param_bytes, grad_bytes, optimizer_bytes: bytes per parameter (fp32 AdamW: 4, 4, 8).

    Returns:
        The peak bytes.
    """
    n = check_positive("world_size", world_size)
    units = [check_positive("unit_params", u) for u in unit_params]
    if not units:
        raise MemlibError("unit_params must list at least one fully_shard unit")
    root = check_positive("root_params", root_params, allow_zero=True)
    total = sum(units) + root
    shards = (param_bytes + optimizer_bytes) * total / n
    best = 0.0
    for j in range(len(units) - 1, -1, -1):  # backward runs the units in reverse
        gathered = sum(units[: j + 1]) if not reshard_after_forward else units[j]
        done = sum(units[j + 1:])
        extra = param_bytes * (gathered + root) + grad_bytes * (done / n + units[j])
        best = max(best, extra)
    return int(round(shards + best))


def reference_losses(*, world_size: int, config: dict[str, Any] | None = None, steps: int = 3,
                     batch_size: int = 2, seq_len: int = 32, seed: int = 0) -> list[float]:
    """One process, the global batch (all ranks' sequences): the loss trajectory the sharded runs must match.

    Introduced in Chapter 6. Every rank's batch has the same number of tokens, so the mean of the ranks'
    losses equals the loss of the concatenated batch, and the mean of their gradients its gradient.
    """
    torch = _torch()
    config = dict(config or TINY_LLAMA)
    model = _build(config, seed, torch.device("cpu"))
    opt = torch.optim.AdamW(model.parameters(), lr=_LR, foreach=False)
    out = []
    for step in range(steps):
        x = torch.cat([_batch(step, r, batch_size, seq_len, config["vocab_size"], seed) for r in range(world_size)])
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        out.append(float(loss.detach()))
    return out


def deepspeed_estimates(total_params: int, *, largest_layer_params: int, num_gpus_per_node: int,
                        num_nodes: int = 1) -> dict[str, Any]:
    """DeepSpeed's own ZeRO-2 and ZeRO-3 model-state estimators, numbers and printed tables.

    Introduced in Chapter 6. Calls ``estimate_zero2_model_states_mem_needs`` and
    ``estimate_zero3_model_states_mem_needs`` (without offload: GPU bytes; with offload: CPU bytes) and
    captures what the ``..._all_cold`` functions print. They run on CPU (DeepSpeed falls back to its CPU
    accelerator and logs a warning, which is swallowed here).

    Returns:
        ``{"zero2": {"gpu_bytes", "cpu_bytes", "gpu_bytes_offload", "cpu_bytes_offload"},
        "zero3": {... and "largest_layer_bytes"}, "printed": {"zero2": str, "zero3": str}}``.
    """
    import logging

    sink = io.StringIO()
    with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        logging.getLogger("DeepSpeed").setLevel(logging.ERROR)
        from deepspeed.runtime.zero import stage3
        from deepspeed.runtime.zero import stage_1_and_2 as stage12
    out: dict[str, Any] = {"printed": {}}
    cpu2, gpu2 = stage12.estimate_zero2_model_states_mem_needs(
        total_params, num_gpus_per_node=num_gpus_per_node, num_nodes=num_nodes, cpu_offload=False)
    cpu2o, gpu2o = stage12.estimate_zero2_model_states_mem_needs(
        total_params, num_gpus_per_node=num_gpus_per_node, num_nodes=num_nodes, cpu_offload=True)
    out["zero2"] = {"gpu_bytes": gpu2, "cpu_bytes": cpu2, "gpu_bytes_offload": gpu2o, "cpu_bytes_offload": cpu2o}
    cpu3, gpu3, largest = stage3.estimate_zero3_model_states_mem_needs(
        total_params, largest_layer_params, num_gpus_per_node=num_gpus_per_node, num_nodes=num_nodes,
        cpu_offload=False, cpu_offload_params=False, zero_init=True)
    cpu3o, gpu3o, _ = stage3.estimate_zero3_model_states_mem_needs(
        total_params, largest_layer_params, num_gpus_per_node=num_gpus_per_node, num_nodes=num_nodes,
        cpu_offload=True, cpu_offload_params=True, zero_init=True)
    out["zero3"] = {"gpu_bytes": gpu3, "cpu_bytes": cpu3, "gpu_bytes_offload": gpu3o,
                    "cpu_bytes_offload": cpu3o, "largest_layer_bytes": largest}
    for name, fn, extra in (("zero2", stage12.estimate_zero2_model_states_mem_needs_all_cold, {}),
                            ("zero3", stage3.estimate_zero3_model_states_mem_needs_all_cold,
                             {"largest_layer_params": largest_layer_params})):
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            fn(total_params=total_params, num_gpus_per_node=num_gpus_per_node, num_nodes=num_nodes, **extra)
        out["printed"][name] = buf.getvalue()
    return out
