"""ZeRO communication volume per stage (Chapter 6 and Lab 6).

Pure Python (no torch). Model states per ZeRO stage come from :func:`memlib.core.estimate.estimate_training`
(the ZeRO paper's accounting, §5); this module adds the paper's communication volumes (§7). The paper's
formulas written out, its Table 1 with the paper's rounding, DeepSpeed's estimator formulas restated and the
FSDP2 peak model, which only Chapter 6 uses, live in the book helpers :mod:`memlib._book.ch06_zero_fsdp`.
"""
from __future__ import annotations

from .choices import ZERO_STAGES
from .errors import check_choice, check_positive

__all__ = [
    "STAGES",
    "comm_volume",
]

STAGES = ZERO_STAGES


def comm_volume(stage: int, params: int) -> int:
    """Elements each GPU sends per training step (ZeRO paper §7), ring algorithms, the (N−1)/N factor dropped.

    Introduced in Chapter 6. Baseline DP: all-reduce of the gradients = reduce-scatter + all-gather, 2Ψ.
    P_os and P_os+g: reduce-scatter the gradients (Ψ), all-gather the updated parameters (Ψ): 2Ψ. P_os+g+p:
    all-gather the parameters in the forward (Ψ) and again in the backward (Ψ), reduce-scatter the
    gradients (Ψ): 3Ψ, 1.5× the baseline.
    """
    check_choice("zero stage", stage, STAGES)
    p = check_positive("params", params)
    return 3 * p if stage == 3 else 2 * p
