"""A strategy planner: the cheapest combination of memory techniques that fits the GPUs (Chapter 13)."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from .choices import FRAMEWORK_PRECISIONS, FRAMEWORK_SUPPORT, FRAMEWORKS, PRECISIONS
from .configs import ModelConfig, load_config
from .dtypes import GB, GiB, parse_size
from .errors import MemlibError, check_choice, check_positive
from .configs import check_seq_len
from .estimate import estimate_training
from .frameworks import framework_for
from .inference import (DEFAULT_CUDA_CONTEXT, DEFAULT_FRAGMENTATION, reserve_bytes, serving_fit,
                        valid_tensor_parallel)
from .lora import lora_params, qlora_base_bytes
from .params import count_params
from .search import bisect_last
from .checkpointing import recompute_overhead
from .setup import TrainingSetup

__all__ = ["JOBS", "PRIORITY", "PlanStep", "Plan", "plan", "recompute_overhead", "DEFAULT_RESERVE",
           "DEFAULT_FRAGMENTATION", "ParallelPlan", "plan_parallel"]

#: What the planner can be asked to make fit.
JOBS = ("train", "lora", "qlora", "infer")

#: The priority order for training (cheapest first), after the two source notes' lists: every full
#: fine-tuning technique comes before LoRA / QLoRA, which changes the job. Inference has its own ladder.
PRIORITY = ("bf16 mixed precision", "FlashAttention", "gradient accumulation", "activation checkpointing",
            "DDP bucket views", "ZeRO-1", "ZeRO-2", "8-bit AdamW", "ZeRO-3", "pure bf16", "switch to DeepSpeed", "CPU offload",
            "LoRA / QLoRA")

#: Memory kept free on every GPU for the CUDA context and library workspaces; the planner adds
#: :data:`DEFAULT_FRAGMENTATION` of the estimate on top: the one reserve policy of
#: :func:`memlib.core.inference.reserve_bytes` (1 GiB + 5 %), the same in Chapters 9, 11 and 13.
DEFAULT_RESERVE = DEFAULT_CUDA_CONTEXT

# Effective host-device bandwidth used to turn offload traffic into time (PCIe Gen4 x16 ≈ 25 GB/s measured).
_PCIE_BYTES_PER_S = 25 * GB


@dataclass(frozen=True)
class PlanStep:
    """One rung of the ladder: a technique switched on, on top of the rungs before it.

    Attributes:
        technique: the technique this rung adds (``"baseline"`` for the first).
        settings: the estimator keyword arguments of the whole combination at this rung.
        per_gpu_bytes: estimated peak per GPU (bytes): the tensors the estimators count.
        cpu_bytes: host memory for offloaded states (bytes).
        fits: per_gpu_bytes + reserve_bytes ≤ GPU memory.
        cost: what the rung costs (extra compute, extra communication, notes), as text.
        applicable: False when the technique does not apply (one GPU for ZeRO, batch 1 for accumulation).
        needed: in the final plan, whether removing this rung breaks the fit (None before pruning).
        reserve_bytes: the reserve beside the estimate: CUDA context + fragmentation × per_gpu_bytes
            (:func:`memlib.core.inference.reserve_bytes`).
    """

    technique: str
    settings: dict[str, Any]
    per_gpu_bytes: int
    cpu_bytes: int
    fits: bool
    cost: str
    applicable: bool = True
    needed: bool | None = None
    reserve_bytes: int = 0

    @property
    def total_bytes(self) -> int:
        """What must fit the GPU: the estimate plus the reserve."""
        return self.per_gpu_bytes + self.reserve_bytes


@dataclass(frozen=True)
class Plan:
    """The planner's answer. Introduced in Chapter 13.

    Attributes:
        fits: whether some combination fits.
        chosen: the cheapest combination that fits (the ladder up to the first rung that fits, with the rungs
            it does not need removed), or None.
        closest: when nothing fits, the lowest-memory combination tried (else the chosen one).
        steps: every rung tried, in order.
        min_gpus: when nothing fits, the fewest GPUs of this memory with which some plan fits (None if more
            than 4096, e.g. when one sequence's activations alone do not fit).
        inputs: the question asked, echoed.
        notes: what the reader must know about the answer: the plan changed the job (full fine-tuning became
            LoRA/QLoRA), or the GPU count was not a valid tensor-parallel degree and pipeline parallelism
            was used.
    """

    fits: bool
    chosen: PlanStep | None
    closest: PlanStep
    steps: list[PlanStep]
    min_gpus: int | None
    inputs: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready dict (bytes as ints)."""
        return asdict(self)


def _cost(technique: str, cfg: ModelConfig, setup: TrainingSetup, accumulation: int, n_gpus: int) -> str:
    n = count_params(cfg).params
    if technique == "baseline":
        return "fp32 weights and activations, eager attention (scores materialized)"
    if technique == "bf16 mixed precision":
        return "none: faster on tensor cores (fp16 also needs loss scaling)"
    if technique == "FlashAttention":
        return "none: faster (no s×s scores in memory)"
    if technique == "gradient accumulation":
        return (f"0 extra FLOPs; micro-batch {setup.batch_size} × {accumulation} steps (smaller kernels, lower "
                "utilization)")
    if technique == "activation checkpointing":
        extra = recompute_overhead(cfg, setup.seq_len, setup.recompute)
        return f"{setup.recompute} recomputation: +{100 * extra:.1f} % compute"
    if technique == "DDP bucket views":
        return ("none: DistributedDataParallel(gradient_as_bucket_view=True), the gradients become views of DDP's "
                "buckets (one fp32 gradient copy less); they can no longer be detach_()-ed")
    if technique == "ZeRO-1":
        how = framework_for(setup).sharded_optimizer
        return f"{how}: optimizer states sharded over {n_gpus} GPUs, communication unchanged (2Ψ per step)"
    if technique == "ZeRO-2":
        return f"communication unchanged (2Ψ per step, reduce-scatter + all-gather) over {n_gpus} GPUs"
    if technique == "switch to DeepSpeed":
        return ("a change of framework: DeepSpeed ZeRO (16-bit params and grads, fp32 master and Adam states "
                "partitioned), which has ZeRO-3 and CPU offload" + (": ZeRO-3, 3Ψ per step" if n_gpus > 1 else ""))
    if technique == "8-bit AdamW":
        return "optimizer states 8 → 2 bytes/param; matches 32-bit Adam in the paper's benchmarks"
    if technique == "ZeRO-3":
        return "communication 3Ψ instead of 2Ψ per step: +50 %"
    if technique == "pure bf16":
        return ("no fp32 master weights (2 + 2 bytes/param for weights and grads): updates below bf16's "
                "resolution are lost; Kahan summation or stochastic rounding recovers them")
    if technique == "LoRA / QLoRA":
        t = lora_params(cfg, setup.lora_rank, setup.lora_targets)
        kind = "QLoRA (NF4 base)" if setup.method == "qlora" else "LoRA"
        return (f"changes the job: {kind} trains {t / 1e6:,.1f} M adapter params ({100 * t / n:.2f} %), "
                "not full fine-tuning")
    if technique == "CPU offload":
        shard = n_gpus if setup.zero_stage >= 1 else 1
        if setup.method == "full":  # the framework's own traffic (DeepSpeed sends fp32 gradients: 6Ψ at k = 1)
            from .offload import offload_traffic

            traffic = float(offload_traffic(n, setup.offload, implementation=framework_for(setup).offload_traffic,
                                            num_gpus=shard, grad_accum_steps=accumulation,
                                            zero_stage=setup.zero_stage).link_bytes)  # every micro-batch
        else:
            traffic = 2 * 4 * lora_params(cfg, setup.lora_rank)
            if setup.offload == "params+optimizer":  # the weights come up for forward and again for backward
                base = qlora_base_bytes(cfg) if setup.method == "qlora" else 2 * n
                traffic += 2 * base / n_gpus
        return (f"{setup.offload} in CPU memory; ≈ {traffic / GB:,.1f} GB over PCIe per step "
                f"(≈ {traffic / _PCIE_BYTES_PER_S:.1f} s at 25 GB/s) and the optimizer step on the CPU")
    raise AssertionError(technique)  # pragma: no cover


def plan(model: str | Path | dict[str, Any] | ModelConfig, *, job: str = "train", num_gpus: int = 1,
         gpu_memory: int | str = 80 * GiB, batch_size: int = 1, seq_len: int = 2048,
         reserve: int | str = DEFAULT_RESERVE, fragmentation: float = DEFAULT_FRAGMENTATION, lora_rank: int = 16,
         search_gpus: bool = True, framework: str = "pytorch", grad_accum: int = 1) -> Plan:
    """Find the cheapest combination of techniques, in the priority order of the two source notes, that fits.

    Introduced in Chapter 13. Training jobs climb the ladder bf16 mixed precision → FlashAttention →
    gradient accumulation → activation checkpointing (selective, then full) → DDP bucket views (``pytorch``,
    ``gradient_as_bucket_view=True``: :func:`memlib.core.frameworks.ddp_bucket_bytes`) → ZeRO-1 or ZeRO-2 → 8-bit AdamW →
    ZeRO-3 → pure bf16 → switch to DeepSpeed → CPU offload (optimizer, then parameters) → LoRA/QLoRA,
    estimating per-GPU memory at each rung in the layout of ``framework`` with
    :func:`memlib.core.estimate.estimate_training`. Only the rungs the framework supports are climbed
    (:data:`memlib.core.choices.FRAMEWORK_SUPPORT`): ``pytorch`` gets ZeRO-1
    (``ZeroRedundancyOptimizer``) and, having no ZeRO-3 or offload, a "switch to DeepSpeed" rung (ZeRO-3 on
    several GPUs) after which DeepSpeed's offload rungs apply; ``megatron`` gets Megatron-FSDP's zero 2 and 3
    (``optim_grads``, ``optim_grads_params``) and no offload; ``deepspeed`` gets
    ZeRO-2, ZeRO-3 and both offloads; ``fsdp2`` starts at its zero 2 (``reshard_after_forward=False``) and
    gets ZeRO-3 and ``CPUOffloadPolicy``; the first rung that fits is pruned of rungs it does not
    need (the free ones, mixed precision and FlashAttention, are kept). Every full fine-tuning option comes
    before LoRA/QLoRA; when the plan changes the job it says so in :attr:`Plan.notes`. ``lora`` and ``qlora``
    jobs start with that method. ``infer`` climbs fp16 → fp8 KV cache → int8 → int4 (NF4) weights, each rung
    checked with :func:`memlib.core.inference.serving_fit`, the static-batch question to the book's one serving fit
    :func:`memlib.core.serve.serve` (weights, KV cache, prefill activations and the reserve), split over the GPUs by tensor parallelism where the heads allow the degree and by pipeline
    parallelism otherwise.

    A rung fits when its estimate plus the reserve, ``reserve`` + ``fragmentation`` × estimate (the policy of
    :func:`memlib.core.inference.reserve_bytes`), is at most the GPU's memory.

    Args:
        model: shipped name, config.json path, dict or ModelConfig.
        job: ``train``, ``lora``, ``qlora`` or ``infer``.
        num_gpus: data-parallel GPUs (tensor- or pipeline-parallel for ``infer``).
        gpu_memory: memory of one GPU, bytes or a size such as ``"80GiB"`` (GPU capacities are binary).
        batch_size: sequences per GPU per optimizer step (training) or concurrent sequences (inference).
        seq_len: tokens per sequence; at most the model's maximum positions.
        reserve: CUDA context and workspaces kept free per GPU (default 1 GiB).
        fragmentation: fraction of the estimate added for allocator fragmentation (default 0.05).
        lora_rank: LoRA rank for the LoRA rungs.
        framework: the training framework (:data:`memlib.core.choices.FRAMEWORKS`, default ``pytorch``).
        grad_accum: micro-batches per optimizer step to start from (default 1; it divides ``batch_size``); the
            gradient-accumulation rung may raise it. Every estimate and the offload traffic use the rung's value.
        search_gpus: when nothing fits, find the fewest GPUs (up to 4096) with which a plan fits. For training
            that is often none: with everything offloaded, each GPU still holds one micro-batch's activations
            and the gathered layers, which more data-parallel GPUs do not shrink.

    Returns:
        The plan. It never reports ``fits`` for a combination whose estimate plus reserve exceeds the memory.

    Raises:
        MemlibError: bad input (the message names the value and the choices), including a ``seq_len`` above
            the model's maximum positions.
    """
    check_choice("job", job, JOBS)
    cfg = load_config(model)
    n_gpus = check_positive("num_gpus", num_gpus)
    b = check_positive("batch_size", batch_size)
    s = check_seq_len(cfg, check_positive("seq_len", seq_len))
    mem = parse_size(gpu_memory) if isinstance(gpu_memory, str) else check_positive("gpu_memory", gpu_memory)
    res = parse_size(reserve) if isinstance(reserve, str) else int(reserve)
    if res < 0:
        raise MemlibError(f"invalid reserve {res}; expected a size ≥ 0")
    if res >= mem:
        raise MemlibError(f"reserve {res:,} B leaves nothing of gpu memory {mem:,} B; expected reserve < gpu memory")
    frag = float(fragmentation)
    reserve_bytes(0, cuda_context_bytes=res, fragmentation=frag)  # validates the fragmentation
    check_positive("lora rank", lora_rank)
    check_choice("framework", framework, FRAMEWORKS)
    inputs = {"model": cfg.name, "job": job, "num_gpus": n_gpus, "gpu_memory": mem, "batch_size": b,
              "seq_len": s, "reserve": res, "fragmentation": frag, "lora_rank": lora_rank, "framework": framework}
    inputs.update({"grad_accum": grad_accum} if grad_accum != 1 else {})  # shown when set: default JSON as it was
    if job == "infer":
        return _plan_inference(cfg, n_gpus, mem, b, s, res, frag, inputs, search_gpus)

    def reserve_for(total: int) -> int:
        return reserve_bytes(total, cuda_context_bytes=res, fragmentation=frag)

    def fits_mem(total: int) -> bool:
        return total + reserve_for(total) <= mem

    method = {"train": "full", "lora": "lora", "qlora": "qlora"}[job]
    if b % check_positive("grad_accum", grad_accum):
        raise MemlibError(f"invalid grad_accum {grad_accum}; expected a divisor of batch_size {b}")
    setup = TrainingSetup(batch_size=b // grad_accum, seq_len=s, precision="fp32", optimizer="adamw",
                          zero_stage=FRAMEWORK_SUPPORT[framework][0][0], num_gpus=n_gpus, recompute="none",
                          attention="eager", offload="none", method=method, lora_rank=lora_rank, framework=framework,
                          grad_accum=grad_accum)
    accumulation = grad_accum  # micro-batches per optimizer step: setup.batch_size × accumulation = b
    accumulate = False  # whether the gradient accumulation rung has been climbed

    def est(st: TrainingSetup) -> tuple[int, int]:
        e = estimate_training(cfg, st)
        return e.total_bytes, e.cpu_bytes

    def runs(st: TrainingSetup) -> bool:  # the estimator refuses what no framework runs (bitsandbytes' 8-bit
        try:                               # AdamW on a DeepSpeed ZeRO-1/2 partition above 2³¹ − 1 elements)
            return est(st) is not None
        except MemlibError:
            return False

    def best_micro(st: TrainingSetup, acc: int) -> tuple[TrainingSetup, int]:
        """With accumulation on: the largest micro-batch dividing the batch that fits (1 if none does)."""
        if not accumulate:
            return st, acc
        for m in sorted((d for d in range(1, b // grad_accum + 1) if b % d == 0), reverse=True):
            trial = replace(st, batch_size=m, grad_accum=b // m)
            if fits_mem(est(trial)[0]):
                return trial, b // m
        return replace(st, batch_size=1, grad_accum=b), b

    steps: list[PlanStep] = []

    def add(technique: str, st: TrainingSetup, acc: int, applicable: bool = True) -> bool:
        total, cpu = est(st)
        fits = fits_mem(total)
        steps.append(PlanStep(technique, _public(st, acc), total, cpu, fits, _cost(technique, cfg, st, acc, n_gpus),
                              applicable, reserve_bytes=reserve_for(total)))
        return fits

    chosen_idx = None
    if add("baseline", setup, accumulation):
        chosen_idx = 0
    else:
        for technique, changes in _ladder(job, n_gpus, b, cfg.model_type):
            variants = [v for v in (change(setup) for change in changes) if v is not None and runs(v)]
            if not variants:
                last = steps[-1]
                steps.append(PlanStep(technique, _public(setup, accumulation), last.per_gpu_bytes, last.cpu_bytes,
                                      last.fits, "not applicable here", applicable=False,
                                      reserve_bytes=last.reserve_bytes))
                continue
            accumulate = accumulate or technique == "gradient accumulation"
            for i, variant in enumerate(variants):
                trial, trial_acc = best_micro(variant, accumulation)
                if fits_mem(est(trial)[0]) or i == len(variants) - 1:
                    setup, accumulation = trial, trial_acc
                    break
            if add(technique, setup, accumulation):
                chosen_idx = len(steps) - 1
                break

    if chosen_idx is None:
        closest = min(steps, key=lambda st: st.per_gpu_bytes)
        more = None
        if search_gpus:
            more = _min_gpus(lambda n: plan(cfg, job=job, num_gpus=n, gpu_memory=mem, batch_size=b, seq_len=s,
                                            reserve=res, fragmentation=frag, lora_rank=lora_rank,
                                            search_gpus=False, framework=framework,
                                            grad_accum=grad_accum).fits, n_gpus)
        return Plan(False, None, closest, steps, more, inputs)
    chosen = _prune(steps, chosen_idx, setup, accumulation, est, fits_mem, reserve_for, method, framework)
    notes = []
    if chosen.settings["method"] != method:
        names = {"full": "full fine-tuning", "lora": "LoRA", "qlora": "QLoRA"}
        notes.append(f"the plan changes the job: {names[method]} does not fit, {names[chosen.settings['method']]} "
                     f"does (it trains adapters only, with a {'4-bit' if chosen.settings['method'] == 'qlora' else '16-bit'} "
                     "frozen base)")
    return Plan(True, chosen, chosen, steps, None, inputs, notes)


def _public(setup: TrainingSetup, accumulation: int) -> dict[str, Any]:
    """A rung's settings, as :attr:`PlanStep.settings` shows them."""
    return {"batch_size": setup.batch_size, "seq_len": setup.seq_len, "precision": setup.precision,
            "optimizer": setup.optimizer, "zero_stage": setup.zero_stage, "num_gpus": setup.num_gpus,
            "recompute": setup.recompute, "attention": setup.attention, "offload": setup.offload,
            "method": setup.method, "lora_rank": setup.lora_rank, "accumulation_steps": accumulation,
            "framework": setup.framework,
            **({"gradient_as_bucket_view": True} if setup.gradient_as_bucket_view else {})}  # shown when set


#: One variant of a rung: the setup with the technique switched on, or None where the setup's framework lacks it.
Change = Callable[[TrainingSetup], TrainingSetup | None]


def _set(**change: Any) -> Change:
    """The variant ``dataclasses.replace(setup, **change)`` (validated again by :class:`TrainingSetup`)."""
    return lambda setup: replace(setup, **change)


def _zero(stage: int, **change: Any) -> Change:
    """ZeRO stage ``stage`` (with ``change``), where the setup's framework has it and the stage is higher."""
    def apply(setup: TrainingSetup) -> TrainingSetup | None:
        stages, offloads, _ = FRAMEWORK_SUPPORT[setup.framework]
        if stage not in stages or stage <= setup.zero_stage or change.get("offload", "none") not in offloads:
            return None
        return replace(setup, zero_stage=stage, **change)
    return apply


def _offload(mode: str) -> Change:
    """Offload ``mode`` (parameter offload with ZeRO-3), where the setup's framework has it."""
    def apply(setup: TrainingSetup) -> TrainingSetup | None:
        stages, offloads, _ = FRAMEWORK_SUPPORT[setup.framework]
        if mode not in offloads:
            return None
        # offload steps on the CPU with DeepSpeedCPUAdam (bitsandbytes' 8-bit kernels are GPU-only): no framework
        # runs 8-bit AdamW with offload, so the rung goes back to AdamW
        optimizer = "adamw" if setup.optimizer == "adamw-8bit" else setup.optimizer
        return replace(setup, offload=mode, optimizer=optimizer,
                       zero_stage=3 if mode == "params+optimizer" else setup.zero_stage)
    return apply


def _switch(multi: bool) -> Change:
    """Switch a framework without ZeRO-3 or offload (PyTorch) to DeepSpeed (ZeRO-3 on several GPUs)."""
    def apply(setup: TrainingSetup) -> TrainingSetup | None:
        stages, offloads, _ = FRAMEWORK_SUPPORT[setup.framework]
        if 3 in stages or offloads != ("none",):
            return None
        return replace(setup, framework="deepspeed", zero_stage=3 if multi else setup.zero_stage, gradient_as_bucket_view=False)
    return apply


def _ladder(job: str, n_gpus: int, b: int, model_type: str = "llama") -> list[tuple[str, list[Change]]]:
    """Each rung and the setup changes it tries, cheapest first (none that apply: not applicable).

    Gradient accumulation changes no setting itself: from its rung on, every rung picks the largest
    micro-batch that fits (``best_micro`` in :func:`plan`). transformers runs Gemma 2 with eager attention only
    (no FlashAttention rung), and LoRA is estimated for gpt2, llama, mistral, qwen2, gemma and qwen3 only (no
    LoRA rung for the others). The ZeRO, switch and offload rungs apply where the setup's framework at that
    rung supports them (:data:`memlib.core.choices.FRAMEWORK_SUPPORT`)."""
    multi = n_gpus > 1
    lora_ok = model_type in ("gpt2", "llama", "mistral", "qwen2", "gemma", "qwen3")
    return [
        ("bf16 mixed precision", [_set(precision="bf16-mixed")]),
        ("FlashAttention", [_set(attention="sdpa")] if model_type != "gemma2" else []),
        ("gradient accumulation", [_set()] if b > 1 else []),
        ("activation checkpointing", [_set(recompute="selective"), _set(recompute="full")]),
        ("DDP bucket views", [lambda st: replace(st, gradient_as_bucket_view=True) if st.ddp else None]
         if multi else []),
        ("ZeRO-1", [lambda st: _zero(1)(st) if 2 not in FRAMEWORK_SUPPORT[st.framework][0] else None]
         if multi else []),
        ("ZeRO-2", [_zero(2)] if multi else []),
        ("8-bit AdamW", [_set(optimizer="adamw-8bit")]),
        ("ZeRO-3", [_zero(3)] if multi else []),
        ("pure bf16", [lambda st: replace(st, precision="bf16")  # where the framework runs it (not Megatron-LM)
                       if "bf16" in FRAMEWORK_PRECISIONS.get(st.framework, (PRECISIONS,))[0] else None]
         if job == "train" else []),
        ("switch to DeepSpeed", [_switch(multi)]),
        ("CPU offload", [_offload("optimizer"), _offload("params+optimizer")]),
        ("LoRA / QLoRA", [_set(method="lora", offload="none"), _set(method="qlora", offload="none"),
                          _set(method="qlora")] if job == "train" and lora_ok
         else [_set(method="qlora", offload="none"), _set(method="qlora")] if job == "lora" and lora_ok else []),
    ]


# What switching a rung off restores (for pruning): dataclasses.replace keywords. Gradient accumulation off
# restores the whole batch as one micro-batch, the framework switch the framework (both in _prune).
_OFF: dict[str, dict[str, Any]] = {
    "gradient accumulation": {}, "activation checkpointing": {"recompute": "none"},
    "DDP bucket views": {"gradient_as_bucket_view": False}, "ZeRO-1": {"zero_stage": 0},
    "ZeRO-2": {"zero_stage": 0}, "8-bit AdamW": {"optimizer": "adamw"}, "ZeRO-3": {"zero_stage": 2},
    "pure bf16": {"precision": "bf16-mixed"}, "switch to DeepSpeed": {}, "CPU offload": {"offload": "none"}}


def _prune(steps: list[PlanStep], idx: int, setup: TrainingSetup, accumulation: int,
           est: Callable[[TrainingSetup], tuple[int, int]], fits_mem: Callable[[int], bool],
           reserve_for: Callable[[int], int], method: str, framework: str) -> PlanStep:
    """Drop rungs below ``idx`` that the fit does not need; mark each rung needed or not.

    A rung whose removal would leave a combination the framework does not support (ZeRO-1 under ZeRO-3,
    the switch to DeepSpeed under DeepSpeed's offload) stays."""
    final, final_acc = setup, accumulation
    b0, acc0 = steps[0].settings["batch_size"], steps[0].settings["accumulation_steps"]  # the baseline's
    for i in range(idx - 1, 0, -1):
        st = steps[i]
        if not st.applicable or (st.technique not in _OFF and st.technique != "LoRA / QLoRA"):
            continue
        off = _OFF.get(st.technique, {"method": method})
        if st.technique == "ZeRO-3" and (final.zero_stage != 3 or final.offload == "params+optimizer"):
            continue  # parameter offload needs ZeRO-3
        if st.technique == "ZeRO-2" and final.zero_stage == 3:
            continue  # subsumed by ZeRO-3
        if st.technique == "CPU offload" and final.offload == "none":
            continue  # already switched off by a later rung (LoRA / QLoRA)
        if st.technique == "ZeRO-1" and final.zero_stage != 1:
            continue  # subsumed by the switch to DeepSpeed's ZeRO-3
        if st.technique == "switch to DeepSpeed":
            off = {"framework": framework, "zero_stage": min(final.zero_stage, 1 if _steps_have(steps, "ZeRO-1")
                                                             else 0)}
        try:
            trial, trial_acc = replace(final, **off), final_acc
            if st.technique == "gradient accumulation":
                trial, trial_acc = replace(trial, batch_size=b0, grad_accum=acc0), acc0
            needed = not fits_mem(est(trial)[0])
        except MemlibError:
            continue  # the framework needs this rung for the rungs above it (or runs nothing without it)
        steps[i] = PlanStep(st.technique, st.settings, st.per_gpu_bytes, st.cpu_bytes, st.fits, st.cost, True, needed,
                            st.reserve_bytes)
        if not needed:
            final, final_acc = trial, trial_acc
    top = steps[idx]
    if top.technique == "LoRA / QLoRA" and final.method == "qlora" and method == "full":
        lora_trial = replace(final, method="lora")  # the lighter change of job first: LoRA before QLoRA
        if fits_mem(est(lora_trial)[0]):
            final = lora_trial
    total, cpu = est(final)
    steps[idx] = PlanStep(top.technique, top.settings, top.per_gpu_bytes, top.cpu_bytes, top.fits, top.cost,
                          top.applicable, True, top.reserve_bytes)
    return PlanStep("plan", _public(final, final_acc), total, cpu, True, "the cheapest combination found", True,
                    True, reserve_for(total))


def _steps_have(steps: list[PlanStep], technique: str) -> bool:
    """Whether the ladder climbed (applied) ``technique``."""
    return any(st.technique == technique and st.applicable for st in steps)


def _min_gpus(fits: Any, n_gpus: int) -> int | None:
    """Fewest GPUs above ``n_gpus`` (up to 4096) for which ``fits(n)`` holds, by doubling then bisection."""
    lo, n = n_gpus, max(2, 2 * n_gpus)
    while n <= 4096:
        if fits(n):  # not fits(lo): the first that fits is one past the last that does not
            return bisect_last(lambda m: not fits(m), lo, n) + 1
        lo, n = n, 2 * n
    return None


def _layout(cfg: ModelConfig, n_gpus: int) -> tuple[int, int]:
    """(tensor-parallel, pipeline-parallel) degrees for ``n_gpus`` inference GPUs.

    Tensor parallelism over all of them where the heads allow it (:func:`memlib.core.inference.valid_tensor_parallel`);
    otherwise the largest allowed degree dividing ``n_gpus``, times pipeline stages for the rest.
    """
    valid = valid_tensor_parallel(cfg, n_gpus)
    tp = max(t for t in valid if n_gpus % t == 0)
    return tp, min(n_gpus // tp, cfg.num_layers)


def _plan_inference(cfg: ModelConfig, n_gpus: int, mem: int, b: int, s: int, res: int, frag: float,
                    inputs: dict[str, Any], search_gpus: bool) -> Plan:
    rungs = [("baseline", {"weights": "fp16", "kv_dtype": "fp16"}, "fp16 weights and KV cache"),
             ("fp8 KV cache", {"weights": "fp16", "kv_dtype": "fp8"}, "KV cache halved; small accuracy cost"),
             ("int8 weights", {"weights": "int8", "kv_dtype": "fp8"}, "weights halved (LLM.int8 / weight-only int8)"),
             ("int4 weights", {"weights": "nf4", "kv_dtype": "fp8"}, "weights ≈ quartered (NF4/GPTQ/AWQ); "
                                                                      "some accuracy cost")]
    tp, pp = _layout(cfg, n_gpus)
    notes = []
    if n_gpus > 1:
        split = f"tensor parallel × {tp}" + (f", pipeline parallel × {pp}" if pp > 1 else "")
        if tp != n_gpus:
            valid = [t for t in valid_tensor_parallel(cfg, max(64, n_gpus))]
            nxt = min((t for t in valid if t > n_gpus), default=None)
            notes.append(f"{n_gpus} GPUs is not a tensor-parallel degree for {cfg.num_heads} attention heads and "
                         f"{cfg.num_kv_heads} KV heads (allowed: {', '.join(map(str, valid[:8]))}); the plan uses "
                         f"{split} (vLLM: --tensor-parallel-size {tp} --pipeline-parallel-size {pp})"
                         + (f", or use {nxt} GPUs with tensor parallel × {nxt}" if nxt else ""))
        used = tp * pp
        if used < n_gpus:
            notes.append(f"only {used} of the {n_gpus} GPUs hold layers ({cfg.num_layers} layers)")
    else:
        split = ""
    steps: list[PlanStep] = []
    for name, k, cost in rungs:
        fit = serving_fit(cfg, mem, batch_size=b, seq_len=s, cuda_context_bytes=res, fragmentation=frag,
                          tensor_parallel=tp, pipeline_parallel=pp, weights=k["weights"], kv_dtype=k["kv_dtype"])
        per_gpu = fit.weights_bytes + fit.kv_cache_bytes + fit.activation_bytes
        settings = {**k, "batch_size": b, "seq_len": s, "num_gpus": n_gpus, "tensor_parallel": tp,
                    "pipeline_parallel": pp}
        steps.append(PlanStep(name, settings, per_gpu, 0, fit.fits,
                              cost + "; prefill activations and the reserve counted" + (f"; {split}" if split else ""),
                              reserve_bytes=fit.total_bytes - per_gpu))
        if fit.fits:
            return Plan(True, steps[-1], steps[-1], steps, None, inputs, notes)
    closest = steps[-1]
    more = None
    if search_gpus:
        more = _min_gpus(lambda n: _plan_inference(cfg, n, mem, b, s, res, frag, inputs, False).fits, n_gpus)
    return Plan(False, None, closest, steps, more, inputs, notes)


# --- 3D/4D parallelism (Chapter 15) ---

@dataclass(frozen=True)
class ParallelPlan:
    """The 3D/4D ladder's answer. Introduced in Chapter 15.

    Attributes:
        fits: whether some layout fits.
        chosen: the first rung that fits (None if none does).
        steps: every rung tried, in order (settings hold tp, pp, cp, dp, zero_stage, recompute, micro_batches).
        inputs: the question asked, echoed.
        notes: what the reader must know (pipeline imbalance, the bubble, fixed degrees).
        min_gpus: when nothing fits, the fewest GPUs (a power of two times the node, up to 16384) with which a
            layout fits (None if none does or the search was off).
    """

    fits: bool
    chosen: PlanStep | None
    steps: list[PlanStep]
    inputs: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    min_gpus: int | None = None

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready dict (bytes as ints)."""
        return asdict(self)


def plan_parallel(model: str | Path | dict[str, Any] | ModelConfig, *, num_gpus: int, gpu_memory: int | str = 80 * GiB,
                  seq_len: int = 8192, batch_size: int = 1, gpus_per_node: int = 8, micro_batches: int | None = None,
                  pp_schedule: str = "1f1b", reserve: int | str = DEFAULT_RESERVE,
                  fragmentation: float = DEFAULT_FRAGMENTATION, tp: int | None = None, pp: int | None = None,
                  cp: int | None = None, search_gpus: bool = True, ep: int | None = None) -> ParallelPlan:
    """Full fine-tuning / pre-training layout over data, tensor, pipeline, context and expert parallelism.

    Introduced in Chapter 15. bf16 mixed precision, AdamW, FlashAttention, micro-batch ``batch_size``, in
    Megatron-LM's layout (``zero_stage=1`` is its distributed optimizer), the ZeRO-2/3 rungs in DeepSpeed's
    (DeepSpeed-MoE's for expert parallelism; :mod:`memlib.core.frameworks`; settings name the framework); the
    rungs, cheapest communication first (the Ultra-Scale Playbook's order; Narayanan et al. 2021, §3):

    1. data parallel with ZeRO-1 (the distributed optimizer);
    2. ZeRO-3 / FSDP: shards the weights too, but not the activations;
    3. tensor parallelism with sequence parallelism inside a node (tp ≤ ``gpus_per_node``, a divisor of the
       attention and KV heads: :func:`memlib.core.parallel.valid_tp`), ZeRO-1 over the rest; TP beats ZeRO-3 when the
       activations, not the states, overflow, since only TP/SP split them;
    4. + pipeline parallelism across nodes (pp dividing the layers where possible, the imbalance stated
       otherwise), 1F1B with m = ``micro_batches`` (default 4·pp);
    5. + context parallelism for long sequences (cp a power of two dividing the GPUs left);
    6. + full activation recomputation.

    MoE models (``cfg.moe``) add expert parallelism (GShard, Lepikhin et al. 2021; DeepSpeed-MoE): after
    rung 1, "expert parallel + ZeRO-1" tries each ep > 1 dividing both the experts and dp, smallest first (the
    all-to-all grows with ep), then "expert parallel + ZeRO-2" (the gradients sharded too: over dp for the
    non-expert ones, over dp/ep for the experts') at the largest such ep. ZeRO-3 stays at ep 1 (the estimate
    of EP + ZeRO-3 would omit the gathered layers); every later rung uses the largest ep for its dp (the
    experts are most of a MoE model's states, and EP splits them without TP's per-layer collectives).
    Settings then hold ``ep``. Dense models get exactly the rungs above.

    Degrees given (``tp``, ``pp``, ``cp``, ``ep``) are kept fixed on every rung. When nothing fits and ``search_gpus``,
    :attr:`ParallelPlan.min_gpus` says how many GPUs would do (``num_gpus`` doubled until a layout fits). A rung fits when estimate +
    :func:`memlib.core.inference.reserve_bytes` ≤ GPU memory.

    Raises:
        MemlibError: bad input, including fixed degrees the model or GPU count does not allow.
    """
    from .parallel import check_layout, stage_layers, valid_tp

    cfg = load_config(model)
    n = check_positive("num_gpus", num_gpus)
    node = check_positive("gpus_per_node", gpus_per_node)
    s = check_seq_len(cfg, check_positive("seq_len", seq_len))
    b = check_positive("batch_size", batch_size)
    mem = parse_size(gpu_memory) if isinstance(gpu_memory, str) else check_positive("gpu_memory", gpu_memory)
    res = parse_size(reserve) if isinstance(reserve, str) else int(reserve)
    for name, v in (("tp", tp), ("pp", pp), ("cp", cp), ("ep", ep)):
        if v is not None:
            check_positive(name, v)
    check_layout(cfg, n, tp=tp or 1, pp=pp or 1, cp=cp or 1, ep=ep or 1, schedule=pp_schedule,
                 micro_batches=micro_batches or 4 * (pp or 1), seq_len=s if cp else None)
    experts = cfg.moe.num_experts if cfg.moe is not None else 0

    def ep_for(dp: int) -> int:
        """The largest ep dividing the experts and dp (1 for a dense model)."""
        return max((d for d in range(1, experts + 1) if experts % d == 0 and dp % d == 0), default=1)
    inputs = {"model": cfg.name, "num_gpus": n, "gpu_memory": mem, "seq_len": s, "batch_size": b,
              "gpus_per_node": node, "pp_schedule": pp_schedule, "reserve": res, "fragmentation": fragmentation}

    def reserve_for(total: int) -> int:
        return reserve_bytes(total, cuda_context_bytes=res, fragmentation=fragmentation)

    steps: list[PlanStep] = []

    def attempt(technique: str, t: int, p: int, c: int, zero: int, recompute: str, cost: str,
                x: int | None = None) -> PlanStep | None:
        if (tp and t != tp) or (pp and p != pp) or (cp and c != cp):
            return None
        if n % (t * p * c) or p > cfg.num_layers or (c > 1 and s % (2 * c)):
            return None
        if ep and x is not None and x != ep:  # a fixed ep: rungs of another ep are skipped, as for tp
            return None
        x = ep or (ep_for(n // (t * p * c)) if x is None else x)
        if (n // (t * p * c)) % x:
            return None
        m = micro_batches or (4 * p if p > 1 else 1)
        if pp_schedule == "interleaved" and (p == 1 or m % p or cfg.num_layers % (2 * p)):
            return None
        framework = "deepspeed" if zero >= 2 else "megatron"  # ZeRO-2/3 rungs: DeepSpeed (and DeepSpeed-MoE)
        e = estimate_training(cfg, TrainingSetup(
            batch_size=b, seq_len=s, precision="bf16-mixed", optimizer="adamw", zero_stage=zero, num_gpus=n,
            recompute=recompute, attention="sdpa", tp=t, pp=p, cp=c, ep=x, sequence_parallel=t > 1,
            micro_batches=m, pp_schedule=pp_schedule if p > 1 else "1f1b", framework=framework))
        total = e.total_bytes
        r = reserve_for(total)
        settings = {"tp": t, "pp": p, "cp": c, "dp": n // (t * p * c), "sequence_parallel": t > 1,
                    "zero_stage": zero, "recompute": recompute, "micro_batches": m, "pp_schedule": pp_schedule,
                    "batch_size": b, "seq_len": s, "precision": "bf16-mixed", "attention": "sdpa",
                    "bubble_fraction": e.settings.get("bubble_fraction", 0.0), "framework": framework}
        if experts:
            settings["ep"] = x
        st = PlanStep(technique, settings, total, 0, total + r <= mem, cost, True, None, r)
        steps.append(st)
        return st

    tps = [t for t in valid_tp(cfg, min(node, n)) if n % t == 0]
    t_max = tp or max(tps)
    pps = [p for p in range(2, min(cfg.num_layers, n // t_max) + 1) if (n // t_max) % p == 0]
    rungs: list[tuple[str, int, int, int, int, str, str, int | None]] = [
        ("data parallel + ZeRO-1", 1, 1, 1, 1, "none", "2Ψ all-reduce-equivalent per step", 1)]
    rungs += [("expert parallel + ZeRO-1", 1, 1, 1, 1, "none", f"EP {x}: 2 all-to-alls of k·b·s·h per MoE layer "
               "forward, 2 backward", x) for x in range(2, experts + 1) if experts % x == 0 and n % x == 0]
    if experts:
        rungs.append(("expert parallel + ZeRO-2", 1, 1, 1, 2, "none", "as ZeRO-1 (reduce-scatter the gradients, "
                      "all-gather the weights), gradients sharded too", None))
    rungs += [("ZeRO-3 / FSDP", 1, 1, 1, 3, "none", "3Ψ per step; activations unchanged", 1)]
    rungs += [("tensor + sequence parallel", t, 1, 1, 1, "none",
               f"TP {t} in a node: 4 all-gather/reduce-scatter pairs of b·s·h per layer", None)
              for t in tps if t > 1]
    rungs += [("+ pipeline parallel", t_max, p, 1, 1, "none", f"PP {p}: bubble (p−1)/(m+p−1)", None) for p in pps]
    for c in (2, 4, 8, 16, 32):
        for p in [1] + pps:
            rungs.append(("+ context parallel", t_max, p, c, 1, "none", f"CP {c}: K/V passed around a ring", None))
    for p in [1] + pps:
        rungs.append(("+ full recomputation", t_max, p, 1, 1, "full", "+33 % compute", None))
    chosen = None
    for name, t, p, c, z, rc, cost, x in rungs:
        st = attempt(name, t, p, c, z, rc, cost, x)
        if st is not None and st.fits:
            chosen = st
            break
    notes = []
    if chosen is not None and chosen.settings["pp"] > 1:
        layers = stage_layers(cfg.num_layers, chosen.settings["pp"])
        if max(layers) != min(layers):
            notes.append(f"{cfg.num_layers} layers do not split evenly over pp {chosen.settings['pp']}: stages hold "
                         f"{max(layers)} or {min(layers)} layers (the first ones are slower)")
        notes.append(f"pipeline bubble {100 * chosen.settings['bubble_fraction']:.1f} % with m = "
                     f"{chosen.settings['micro_batches']} micro-batches")
    more = None
    if chosen is None and search_gpus:
        k = 2 * n
        while k <= 16384 and more is None:
            if plan_parallel(cfg, num_gpus=k, gpu_memory=mem, seq_len=s, batch_size=b, gpus_per_node=node,
                             micro_batches=micro_batches, pp_schedule=pp_schedule, reserve=res,
                             fragmentation=fragmentation, tp=tp, pp=pp, cp=cp, search_gpus=False, ep=ep).fits:
                more = k
            k *= 2
    return ParallelPlan(chosen is not None, chosen, steps, inputs, notes, more)
