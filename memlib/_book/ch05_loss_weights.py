"""Gradient accumulation, the pure half: which weight each token's loss gets in the optimizer step (Chapter 5).

Book helpers (moved from ``memlib.core.accumulation``): only Chapter 5 uses them. No torch. The measurements
(gradients of k micro-batches against one big batch, memory traces, FLOPs, DDP ``no_sync``) are in
:mod:`memlib._book.ch05_gradient_accumulation`, which re-exports this module's names.
"""
from __future__ import annotations

from collections.abc import Sequence

from ..core.errors import MemlibError, check_choice, check_positive

__all__ = ["NORMALIZATIONS", "token_loss_weights", "normalization_error", "last_group_scale"]

#: Loss normalizations for a step of k micro-batches. ``"mean-per-micro-batch"``: each micro-batch's mean token
#: loss divided by k (the two source notes' loop, and Hugging Face's Trainer before transformers 4.46);
#: ``"sum-over-step-tokens"``: each micro-batch's summed token loss divided by the token count of the whole step.
NORMALIZATIONS = ("mean-per-micro-batch", "sum-over-step-tokens")


def _check_tokens(tokens_per_micro_batch: Sequence[int]) -> list[int]:
    if len(tokens_per_micro_batch) == 0:
        raise MemlibError("tokens_per_micro_batch must list at least one micro-batch, got []")
    return [check_positive("tokens in a micro-batch", n) for n in tokens_per_micro_batch]


def token_loss_weights(tokens_per_micro_batch: Sequence[int], normalization: str) -> list[float]:
    """Weight of one token's loss in the optimizer step, for each micro-batch. Introduced in Chapter 5.

    One big batch with a mean-reduced loss gives every token the weight 1/N (N = tokens in the whole step).
    Accumulating k micro-batches with ``loss = mean_over_micro_batch / k`` gives the tokens of micro-batch i
    the weight 1/(k·n_i): equal to 1/N only when every micro-batch holds the same number of tokens.

    Args:
        tokens_per_micro_batch: n_i, the loss-bearing tokens (labels not ignored) of each micro-batch.
        normalization: one of :data:`NORMALIZATIONS`.

    Returns:
        The weight of each token of micro-batch i, one float per micro-batch.
    """
    counts = _check_tokens(tokens_per_micro_batch)
    check_choice("normalization", normalization, NORMALIZATIONS)
    k, total = len(counts), sum(counts)
    if normalization == "mean-per-micro-batch":
        return [1.0 / (k * n) for n in counts]
    return [1.0 / total for _ in counts]


def normalization_error(tokens_per_micro_batch: Sequence[int]) -> float:
    """Largest relative error of a token's weight under ``"mean-per-micro-batch"``. Introduced in Chapter 5.

    Args:
        tokens_per_micro_batch: n_i, the loss-bearing tokens of each micro-batch.

    Returns:
        max_i |N/(k·n_i) − 1|: 0 when all micro-batches hold the same number of tokens; 1.0 means some token
        counts twice as much as it should.
    """
    counts = _check_tokens(tokens_per_micro_batch)
    k, total = len(counts), sum(counts)
    return max(abs(total / (k * n) - 1.0) for n in counts)


def last_group_scale(num_micro_batches: int, accumulation_steps: int) -> float:
    """Gradient scale of the last optimizer step of an epoch in the Strategies notes' loop. Introduced in Chapter 5.

    The loop divides every micro-batch loss by k and also steps on the last batch of the epoch. If the epoch
    holds ``num_micro_batches`` = q·k + r micro-batches with 0 < r < k, the last step sums r losses each divided
    by k: its gradient is r/k of the average it should be (with SGD, a learning rate r/k times too small).

    Args:
        num_micro_batches: micro-batches in the epoch (``len(data_loader)``).
        accumulation_steps: k.

    Returns:
        r/k for a partial last group, 1.0 when k divides the epoch.
    """
    n = check_positive("num_micro_batches", num_micro_batches)
    k = check_positive("accumulation_steps", accumulation_steps)
    r = n % k
    return 1.0 if r == 0 else r / k
