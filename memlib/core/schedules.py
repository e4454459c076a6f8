"""Pipeline schedules: the bubble (both definitions), micro-batches in flight, weight copies (Chapter 15).

Pure Python. GPipe, 1F1B and interleaved 1F1B (Narayanan et al. 2021, ``narayanan2021efficient``); zero-bubble
ZB-H1, ZB-H2 and ZB-V (Qi et al. 2024, ``qi2024zerobubble``; torch's ``ScheduleZBVZeroBubble``); DeepSeek's
DualPipe and DualPipeV (DeepSeek-AI 2024, Table 2, ``deepseekai2024v3``). :mod:`memlib.core.parallel` composes
them into the worst rank's memory.
"""
from __future__ import annotations

from .choices import SCHEDULES
from .errors import MemlibError, check_choice, check_positive

__all__ = ["bubble_fraction", "bubble_ratio", "zero_bubble_units", "schedule_weight_copies", "in_flight"]


def bubble_fraction(pp: int, micro_batches: int, schedule: str = "1f1b", virtual_stages: int = 2) -> float:
    """Fraction of a pipelined step that each GPU idles: (p−1)/(m+p−1); interleaved (p−1)/(vm+p−1).

    Introduced in Chapter 15. The idle share of the step, bubble / (bubble + ideal), from Narayanan et al. 2021,
    §2.2.1 (bubble time (p−1)·(t_f+t_b) against the ideal m·(t_f+t_b)) and §2.2.2 (the interleaved schedule
    divides the bubble by v). The paper's own "bubble time fraction" is the ratio bubble / ideal,
    :func:`bubble_ratio`. GPipe and 1F1B have the same bubble; 1F1B only holds fewer micro-batches in flight.
    The zero-bubble schedules take their bubble from :func:`zero_bubble_units` (T_F = T_B = T_W).
    """
    p, m = check_positive("pp", pp), check_positive("micro_batches", micro_batches)
    check_choice("pipeline schedule", schedule, SCHEDULES)
    v = check_positive("virtual_stages", virtual_stages) if schedule == "interleaved" else 1
    if schedule in _ZERO_BUBBLE:
        bubble = zero_bubble_units(p, schedule)
        return bubble / (bubble + 3 * m)
    return (p - 1) / (v * m + p - 1)


def bubble_ratio(pp: int, micro_batches: int, schedule: str = "1f1b", virtual_stages: int = 2) -> float:
    """Narayanan et al. 2021's bubble time fraction t_pb / t_id = (p−1)/m; (1/v)·(p−1)/m interleaved.

    Introduced in Chapter 15. The paper (§2.2.1, §2.2.2) divides the bubble by the ideal time of the m
    micro-batches, not by the step: p = 8, m = 16 gives 7/16 = 0.44, where the idle share of the step
    (:func:`bubble_fraction`) is 7/23 = 0.30. Both name the same bubble.
    """
    f = bubble_fraction(pp, micro_batches, schedule, virtual_stages)
    return f / (1 - f)


# Zero-bubble schedules in units of one micro-batch's forward T_F, with T_F = T_B = T_W (backward for inputs,
# backward for weights), Qi et al. 2024 (``qi2024zerobubble``) §3 and DeepSeek-V3's Table 2 (``deepseekai2024v3``).
_ZERO_BUBBLE = ("zb-h1", "zb-h2", "zbv", "dualpipe", "dualpipev")


def zero_bubble_units(pp: int, schedule: str) -> float:
    """The pipeline bubble of one step in units of T_F, with T_F = T_B = T_W (the papers' simplification).

    Introduced in Chapter 15. 1F1B: (p−1)(T_F + T_B + T_W) = 3(p−1). ZB-H1 (Qi et al. 2024, Fig. 3): splitting
    the backward into B (input gradient) and W (weight gradient) and filling the tail with W's:
    (p−1)(T_F + T_B − T_W) = p−1, a third, at 1F1B's memory. ZB-H2, ZB-V (torch's ``ScheduleZBVZeroBubble``):
    0. DualPipe and DualPipeV (DeepSeek-AI 2024, Table 2): (p/2 − 1)(T_F&B + T_B − 3T_W) = 0 when the
    overlapped F&B chunk takes T_F + T_B. Real T_W < T_B leaves a small bubble.
    """
    p = check_positive("pp", pp)
    check_choice("pipeline schedule", schedule, SCHEDULES)
    if schedule == "zb-h1":
        return float(p - 1)
    if schedule in _ZERO_BUBBLE:
        return 0.0
    return 3.0 * (p - 1)


def schedule_weight_copies(schedule: str) -> int:
    """Copies of its stage's parameters (and their gradients and optimizer states) a pipeline rank holds: 2 for
    DualPipe (each rank runs a stage from both ends of the pipeline, DeepSeek-AI 2024, Table 2: "Parameter 2×"),
    1 for every other schedule (DualPipeV folds the two directions onto one set of stages)."""
    check_choice("pipeline schedule", schedule, SCHEDULES)
    return 2 if schedule == "dualpipe" else 1


def in_flight(pp: int, micro_batches: int, schedule: str = "1f1b", stage: int = 0,
              virtual_stages: int = 2) -> float:
    """Micro-batches whose activations stage ``stage`` holds at its peak, in units of the stage's layers.

    Introduced in Chapter 15. GPipe runs all m forwards first: m. 1F1B (PipeDream-Flush, Narayanan et al.
    2021 §2.2.1) starts p − stage forwards before its first backward: min(p − stage, m). The interleaved
    schedule (Megatron's warm-up of 2(p−1) + (v−1)p chunk forwards on the first stage) holds
    p·(1 + (p−1)/(pv)) stage-equivalents (Korthikanti et al. 2022, §4.2.3), at most m. ZB-H1 and ZB-V keep
    1F1B's p − stage; ZB-H2 2(p − stage) − 1 (Qi et al. 2024, ``qi2024zerobubble``); DualPipe and DualPipeV
    p + 1 on every rank (DeepSeek-AI 2024, Table 2, ``deepseekai2024v3``).
    """
    p, m = check_positive("pp", pp), check_positive("micro_batches", micro_batches)
    check_choice("pipeline schedule", schedule, SCHEDULES)
    if not 0 <= stage < p:
        raise MemlibError(f"invalid stage {stage}; expected 0 to {p - 1}")
    if schedule == "gpipe":
        return float(m)
    if schedule in ("1f1b", "zb-h1", "zbv") or p == 1:  # ZB-H1, ZB-V: 1F1B's memory (Qi et al. 2024)
        return float(min(p - stage, m))
    if schedule == "zb-h2":  # ZB-H2: up to 2p − 1 micro-batches in flight on the first stage (Qi et al. 2024)
        return float(min(2 * (p - stage) - 1, m))
    if schedule in ("dualpipe", "dualpipev"):  # DeepSeek-AI 2024, Table 2: PP + 1 micro-batches' activations
        return float(min(p + 1, m))
    v = check_positive("virtual_stages", virtual_stages)
    chunks = min(2 * (p - stage - 1) + (v - 1) * p + 1, m * v)  # chunk forwards before the first backward
    return chunks / v
