"""Chapter 18's book helpers: TRL's DPO and GRPO traced on CPU next to memlib rl, and the phase-timeline rows.

Book helpers: only Chapter 18 uses them. torch, transformers, datasets and trl are imported lazily (through
:mod:`memlib.measure.rl_trl`).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..core.rl import RLEstimate, RLSetup, estimate_rl
from ..core.setup import TrainingSetup

#: The trainer layout of the CPU runs: fp32 and TRL's default ``adamw_torch_fused``.
CPU_TRAIN = TrainingSetup(precision="fp32", optimizer="adamw", optimizer_impl="fused")


@dataclass(frozen=True)
class PhaseRow:
    """One phase of one CPU run: TRL traced on CPU against memlib rl, bytes."""

    algo: str
    reference: str
    phase: str
    traced: int
    estimated: int

    @property
    def rel(self) -> float:
        """(estimated − traced) / traced."""
        return (self.estimated - self.traced) / self.traced


def trl_vs_memlib(runs: tuple[tuple[str, str], ...] = (("grpo", "model"), ("grpo", "none"), ("dpo", "model")),
                  *, group: int = 4, prompt_len: int = 16, completion_len: int = 16) -> list[PhaseRow]:
    """Run TRL's trainers on CPU (:func:`memlib.measure.rl_trl.measure_trl`) and estimate the same steps.

    Args:
        runs: (algo, reference) pairs.
        group: GRPO's G.
        prompt_len: prompt tokens.
        completion_len: completion tokens.

    Returns:
        One row per phase of each run.
    """
    from ..measure.rl_trl import TINY_RL_LLAMA, measure_trl

    rows: list[PhaseRow] = []
    for algo, ref in runs:
        g = group if algo == "grpo" else None
        m = measure_trl(algo, group=g, reference=ref, prompt_len=prompt_len, completion_len=completion_len)
        est = estimate_rl(TINY_RL_LLAMA, RLSetup(algo=algo, group=g, reference=ref, prompt_len=prompt_len,
                                                 completion_len=completion_len, engine="hf"), CPU_TRAIN)
        rows.extend(PhaseRow(algo, ref, p.name, m.phases[p.name], p.peak_bytes) for p in est.phases)
    return rows


#: The timeline's rows, bottom to top, and the resident components each gathers.
TIMELINE_GROUPS: dict[str, tuple[str, ...]] = {
    "trained weights": ("policy weights", "critic weights"),
    "optimizer states": ("policy optimizer", "critic optimizer"),
    "frozen models": ("reference weights", "reward weights"),
    "rollout engine": ("rollout weights", "KV cache"),
    "activations, logits, temporaries": ("working", "policy activations"),
}


def timeline_rows(est: RLEstimate) -> tuple[list[str], dict[str, list[int]]]:
    """Phase labels and, per timeline group, the bytes of each phase (what Figure 18.1 stacks).

    Args:
        est: an estimate from :func:`memlib.core.rl.estimate_rl`.

    Returns:
        (labels, group -> bytes per phase); the groups of each phase sum to its peak.
    """
    labels = [p.name if p.gpus == "trainer" else f"{p.name}\n(rollout GPUs)" for p in est.phases]
    stacks = {g: [sum(p.resident.get(k, 0) for k in keys) for p in est.phases] for g, keys in TIMELINE_GROUPS.items()}
    return labels, stacks
