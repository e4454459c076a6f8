"""A strategy planner: the cheapest combination of memory techniques that fits the GPUs (Chapter 13)."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .configs import ModelConfig, load_config
from .dtypes import GB, GiB, parse_size
from .errors import MemlibError, check_choice, check_positive
from .estimate import estimate_inference, estimate_training
from .lora import lora_params, qlora_base_bytes
from .params import count_params
from .search import bisect_last

__all__ = ["JOBS", "PRIORITY", "PlanStep", "Plan", "plan", "recompute_overhead", "DEFAULT_RESERVE"]

#: What the planner can be asked to make fit.
JOBS = ("train", "lora", "qlora", "infer")

#: The seeds' priority order for training (cheapest first). Inference has its own ladder.
PRIORITY = ("bf16 mixed precision", "FlashAttention", "gradient accumulation", "activation checkpointing",
            "ZeRO-2", "8-bit AdamW", "ZeRO-3", "LoRA / QLoRA", "CPU offload")

#: Memory kept free on every GPU for the CUDA context, library workspaces and allocator fragmentation.
DEFAULT_RESERVE = 2 * GiB

# Effective host-device bandwidth used to turn offload traffic into time (PCIe Gen4 x16 ≈ 25 GB/s measured).
_PCIE_BYTES_PER_S = 25 * GB


@dataclass(frozen=True)
class PlanStep:
    """One rung of the ladder: a technique switched on, on top of the rungs before it.

    Attributes:
        technique: the technique this rung adds (``"baseline"`` for the first).
        settings: the estimator keyword arguments of the whole combination at this rung.
        per_gpu_bytes: estimated peak per GPU (bytes).
        cpu_bytes: host memory for offloaded states (bytes).
        fits: per_gpu_bytes + reserve ≤ GPU memory.
        cost: what the rung costs (extra compute, extra communication, notes), as text.
        applicable: False when the technique does not apply (one GPU for ZeRO, batch 1 for accumulation).
        needed: in the final plan, whether removing this rung breaks the fit (None before pruning).
    """

    technique: str
    settings: dict[str, Any]
    per_gpu_bytes: int
    cpu_bytes: int
    fits: bool
    cost: str
    applicable: bool = True
    needed: bool | None = None


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
    """

    fits: bool
    chosen: PlanStep | None
    closest: PlanStep
    steps: list[PlanStep]
    min_gpus: int | None
    inputs: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready dict (bytes as ints)."""
        return asdict(self)


def recompute_overhead(model: str | Path | dict[str, Any] | ModelConfig, seq_len: int, recompute: str) -> float:
    """Extra training FLOPs of recomputation, as a fraction of a step without it. Introduced in Chapter 13.

    A step is forward (F) + backward (2F). Full recomputation runs the forward again: F / 3F = 1/3.
    Selective recomputation (Korthikanti et al. 2022) re-runs only the attention core, QKᵀ and PV:
    4·s·a·d FLOPs per token and layer (causal kernels skip about half of it; not counted here).
    """
    cfg = load_config(model)
    check_choice("recompute", recompute, ("none", "selective", "full"))
    if recompute == "none":
        return 0.0
    if recompute == "full":
        return 1 / 3
    n = count_params(cfg).params
    core = 4 * seq_len * cfg.q_dim * cfg.num_layers  # per token, forward
    forward = 2 * n + core
    return core / (3 * forward)


def _cost(technique: str, cfg: ModelConfig, kw: dict[str, Any], n_gpus: int) -> str:
    n = count_params(cfg).params
    if technique == "baseline":
        return "fp32 weights and activations, eager attention (scores materialized)"
    if technique == "bf16 mixed precision":
        return "none: faster on tensor cores (fp16 also needs loss scaling)"
    if technique == "FlashAttention":
        return "none: faster (no s×s scores in memory)"
    if technique == "gradient accumulation":
        k = kw["_accumulation"]
        return f"0 extra FLOPs; micro-batch {kw['batch_size']} × {k} steps (smaller kernels, lower utilization)"
    if technique == "activation checkpointing":
        extra = recompute_overhead(cfg, kw["seq_len"], kw["recompute"])
        return f"{kw['recompute']} recomputation: +{100 * extra:.1f} % compute"
    if technique == "ZeRO-2":
        return f"communication unchanged (2Ψ per step, reduce-scatter + all-gather) over {n_gpus} GPUs"
    if technique == "8-bit AdamW":
        return "optimizer states 8 → 2 bytes/param; matches 32-bit Adam in the paper's benchmarks"
    if technique == "ZeRO-3":
        return "communication 3Ψ instead of 2Ψ per step: +50 %"
    if technique == "LoRA / QLoRA":
        t = lora_params(cfg, kw.get("lora_rank", 16), kw.get("lora_targets", "all-linear"))
        kind = "QLoRA (NF4 base)" if kw["method"] == "qlora" else "LoRA"
        return f"{kind}: trains {t / 1e6:,.1f} M adapter params ({100 * t / n:.2f} %), not full fine-tuning"
    if technique == "CPU offload":
        shard = n_gpus if kw["zero_stage"] >= 1 else 1
        traffic = 2 * 2 * n / shard if kw["method"] == "full" else 2 * 4 * lora_params(cfg, kw["lora_rank"])
        if kw["offload"] == "params+optimizer":  # the weights come up for forward and again for backward
            base = qlora_base_bytes(cfg) if kw["method"] == "qlora" else 2 * n
            traffic += 2 * base / n_gpus
        return (f"{kw['offload']} in CPU memory; ≈ {traffic / GB:,.1f} GB over PCIe per step "
                f"(≈ {traffic / _PCIE_BYTES_PER_S:.1f} s at 25 GB/s) and the optimizer step on the CPU")
    raise AssertionError(technique)  # pragma: no cover


def plan(model: str | Path | dict[str, Any] | ModelConfig, *, job: str = "train", num_gpus: int = 1,
         gpu_memory: int | str = 80 * GB, batch_size: int = 1, seq_len: int = 2048,
         reserve: int | str = DEFAULT_RESERVE, lora_rank: int = 16, search_gpus: bool = True) -> Plan:
    """Find the cheapest combination of techniques, in the seeds' priority order, that fits.

    Introduced in Chapter 13. Training jobs climb the ladder bf16 mixed precision → FlashAttention →
    gradient accumulation → activation checkpointing (selective, then full) → ZeRO-2 → 8-bit AdamW → ZeRO-3 →
    LoRA/QLoRA → CPU offload, estimating per-GPU memory at each rung with
    :func:`memlib.estimate.estimate_training`; the first rung that fits is pruned of rungs it does not need
    (the free ones, mixed precision and FlashAttention, are kept). ``lora`` and ``qlora`` jobs start with that
    method. ``infer`` climbs fp16 → fp8 KV cache → int8 → int4 (NF4) weights, with weights and KV cache split
    over the GPUs (tensor parallelism).

    Args:
        model: shipped name, config.json path, dict or ModelConfig.
        job: ``train``, ``lora``, ``qlora`` or ``infer``.
        num_gpus: data-parallel GPUs (tensor-parallel for ``infer``).
        gpu_memory: memory of one GPU, bytes or a size such as ``"80GB"``.
        batch_size: sequences per GPU per optimizer step (training) or concurrent sequences (inference).
        seq_len: tokens per sequence.
        reserve: memory kept free per GPU (CUDA context, workspaces, fragmentation).
        lora_rank: LoRA rank for the LoRA rungs.
        search_gpus: when nothing fits, find the fewest GPUs (up to 4096) with which a plan fits. For training
            that is often none: with everything offloaded, each GPU still holds one micro-batch's activations
            and the gathered layers, which more data-parallel GPUs do not shrink.

    Returns:
        The plan. It never reports ``fits`` for a combination whose estimate plus reserve exceeds the memory.

    Raises:
        MemlibError: bad input (the message names the value and the choices).
    """
    check_choice("job", job, JOBS)
    cfg = load_config(model)
    n_gpus = check_positive("num_gpus", num_gpus)
    b = check_positive("batch_size", batch_size)
    s = check_positive("seq_len", seq_len)
    mem = parse_size(gpu_memory) if isinstance(gpu_memory, str) else check_positive("gpu_memory", gpu_memory)
    res = parse_size(reserve) if isinstance(reserve, str) else int(reserve)
    if res < 0:
        raise MemlibError(f"invalid reserve {res}; expected a size ≥ 0")
    if res >= mem:
        raise MemlibError(f"reserve {res:,} B leaves nothing of gpu memory {mem:,} B; expected reserve < gpu memory")
    check_positive("lora rank", lora_rank)
    budget = mem - res
    inputs = {"model": cfg.name, "job": job, "num_gpus": n_gpus, "gpu_memory": mem, "batch_size": b,
              "seq_len": s, "reserve": res, "lora_rank": lora_rank}
    if job == "infer":
        return _plan_inference(cfg, n_gpus, budget, b, s, inputs)

    method = {"train": "full", "lora": "lora", "qlora": "qlora"}[job]
    kw: dict[str, Any] = dict(batch_size=b, seq_len=s, precision="fp32", optimizer="adamw", zero_stage=0,
                              num_gpus=n_gpus, recompute="none", attention="eager", offload="none", method=method,
                              lora_rank=lora_rank, _accumulation=1)

    def est(k: dict[str, Any]) -> tuple[int, int]:
        e = estimate_training(cfg, **{x: v for x, v in k.items() if not x.startswith("_")})
        return e.total_bytes, e.cpu_bytes

    def best_micro(k: dict[str, Any]) -> dict[str, Any]:
        """The largest micro-batch dividing the batch that fits (1 if none does)."""
        if not k["_accumulation_on"]:
            return k
        for m in sorted((d for d in range(1, b + 1) if b % d == 0), reverse=True):
            trial = {**k, "batch_size": m, "_accumulation": b // m}
            if est(trial)[0] <= budget:
                return trial
        return {**k, "batch_size": 1, "_accumulation": b}

    kw["_accumulation_on"] = False
    steps: list[PlanStep] = []

    def add(technique: str, k: dict[str, Any], applicable: bool = True) -> bool:
        total, cpu = est(k)
        fits = total <= budget
        steps.append(PlanStep(technique, _public(k), total, cpu, fits, _cost(technique, cfg, k, n_gpus), applicable))
        return fits

    ladder = _ladder(kw, job, n_gpus, b)
    chosen_idx = None
    if add("baseline", kw):
        chosen_idx = 0
    else:
        for technique, variants in ladder:
            applicable = bool(variants)
            if not applicable:
                steps.append(PlanStep(technique, _public(kw), steps[-1].per_gpu_bytes, steps[-1].cpu_bytes,
                                      steps[-1].fits, "not applicable here", applicable=False))
                continue
            for i, change in enumerate(variants):
                trial = best_micro({**kw, **change})
                total, _ = est(trial)
                if total <= budget or i == len(variants) - 1:
                    kw = trial
                    break
            if add(technique, kw):
                chosen_idx = len(steps) - 1
                break

    if chosen_idx is None:
        closest = min(steps, key=lambda st: st.per_gpu_bytes)
        more = None
        if search_gpus:
            more = _min_gpus(lambda n: plan(cfg, job=job, num_gpus=n, gpu_memory=mem, batch_size=b, seq_len=s,
                                            reserve=res, lora_rank=lora_rank, search_gpus=False).fits, n_gpus)
        return Plan(False, None, closest, steps, more, inputs)
    chosen = _prune(steps, chosen_idx, kw, est, budget, method)
    return Plan(True, chosen, chosen, steps, None, inputs)


def _public(k: dict[str, Any]) -> dict[str, Any]:
    out = {x: v for x, v in k.items() if not x.startswith("_")}
    out["accumulation_steps"] = k.get("_accumulation", 1)
    return out


def _ladder(kw: dict[str, Any], job: str, n_gpus: int, b: int) -> list[tuple[str, list[dict[str, Any]]]]:
    """Each rung and the setting changes it tries, cheapest first (empty: not applicable)."""
    multi = n_gpus > 1
    return [
        ("bf16 mixed precision", [{"precision": "bf16-mixed"}]),
        ("FlashAttention", [{"attention": "sdpa"}]),
        ("gradient accumulation", [{"_accumulation_on": True}] if b > 1 else []),
        ("activation checkpointing", [{"recompute": "selective"}, {"recompute": "full"}]),
        ("ZeRO-2", [{"zero_stage": 2}] if multi else []),
        ("8-bit AdamW", [{"optimizer": "adamw-8bit"}]),
        ("ZeRO-3", [{"zero_stage": 3}] if multi else []),
        ("LoRA / QLoRA", [{"method": "lora"}, {"method": "qlora"}] if job == "train"
         else [{"method": "qlora"}] if job == "lora" else []),
        ("CPU offload", [{"offload": "optimizer"}, {"offload": "params+optimizer", "zero_stage": 3}]),
    ]


# What switching a rung off restores (for pruning).
_OFF: dict[str, dict[str, Any]] = {
    "gradient accumulation": {"_accumulation_on": False}, "activation checkpointing": {"recompute": "none"},
    "ZeRO-2": {"zero_stage": 0}, "8-bit AdamW": {"optimizer": "adamw"}, "ZeRO-3": {"zero_stage": 2},
    "CPU offload": {"offload": "none"}}


def _prune(steps: list[PlanStep], idx: int, kw: dict[str, Any], est: Any, budget: int, method: str) -> PlanStep:
    """Drop rungs below ``idx`` that the fit does not need; mark each rung needed or not."""
    final = dict(kw)
    b = steps[0].settings["batch_size"]
    for i in range(idx - 1, 0, -1):
        st = steps[i]
        if not st.applicable or (st.technique not in _OFF and st.technique != "LoRA / QLoRA"):
            continue
        off = dict(_OFF.get(st.technique, {"method": method}))
        if st.technique == "ZeRO-3" and (final.get("zero_stage") != 3 or final.get("offload") == "params+optimizer"):
            continue  # parameter offload needs ZeRO-3
        if st.technique == "ZeRO-2" and final.get("zero_stage", 0) == 3:
            continue  # subsumed by ZeRO-3
        if st.technique == "CPU offload":
            continue  # the last rung; it is the one that made it fit
        trial = {**final, **off}
        if st.technique == "gradient accumulation":
            trial = {**trial, "batch_size": b, "_accumulation": 1}
        if st.technique == "LoRA / QLoRA" and final["method"] == "qlora" and method == "full":
            lora_trial = {**final, "method": "lora"}  # QLoRA → LoRA first, then full fine-tuning
            if est(lora_trial)[0] <= budget:
                final = lora_trial
        needed = est(trial)[0] > budget
        steps[i] = PlanStep(st.technique, st.settings, st.per_gpu_bytes, st.cpu_bytes, st.fits, st.cost, True, needed)
        if not needed:
            final = trial
    top = steps[idx]
    total, cpu = est(final)
    steps[idx] = PlanStep(top.technique, top.settings, top.per_gpu_bytes, top.cpu_bytes, top.fits, top.cost,
                          top.applicable, True)
    return PlanStep("plan", _public(final), total, cpu, True, "the cheapest combination found", True, True)


def _min_gpus(fits: Any, n_gpus: int) -> int | None:
    """Fewest GPUs above ``n_gpus`` (up to 4096) for which ``fits(n)`` holds, by doubling then bisection."""
    lo, n = n_gpus, max(2, 2 * n_gpus)
    while n <= 4096:
        if fits(n):  # not fits(lo): the first that fits is one past the last that does not
            return bisect_last(lambda m: not fits(m), lo, n) + 1
        lo, n = n, 2 * n
    return None


def _plan_inference(cfg: ModelConfig, n_gpus: int, budget: int, b: int, s: int, inputs: dict[str, Any]) -> Plan:
    rungs = [("baseline", {"weights": "fp16", "kv_dtype": "fp16"}, "fp16 weights and KV cache"),
             ("fp8 KV cache", {"weights": "fp16", "kv_dtype": "fp8"}, "KV cache halved; small accuracy cost"),
             ("int8 weights", {"weights": "int8", "kv_dtype": "fp8"}, "weights halved (LLM.int8 / weight-only int8)"),
             ("int4 weights", {"weights": "nf4", "kv_dtype": "fp8"}, "weights ≈ quartered (NF4/GPTQ/AWQ); "
                                                                      "some accuracy cost")]
    steps: list[PlanStep] = []
    for name, k, cost in rungs:
        e = estimate_inference(cfg, batch_size=b, seq_len=s, **k)
        per_gpu = -(-e.total_bytes // n_gpus)
        settings = {**k, "batch_size": b, "seq_len": s, "num_gpus": n_gpus}
        steps.append(PlanStep(name, settings, per_gpu, 0, per_gpu <= budget,
                              cost + (f"; split over {n_gpus} GPUs (tensor parallel)" if n_gpus > 1 else "")))
        if per_gpu <= budget:
            return Plan(True, steps[-1], steps[-1], steps, None, inputs)
    closest = steps[-1]
    need = -(-closest.per_gpu_bytes * n_gpus // budget)
    return Plan(False, None, closest, steps, need, inputs)
