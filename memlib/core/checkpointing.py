"""Gradient checkpointing, the pure half: Chen et al. (2016)'s segment model and the largest-batch search (Chapter 4).

No torch. The measurements (recompute modes traced on the meta device, FLOPs, activation offloading, the
Chapter 4 lab's GPU run) are in :mod:`memlib.measure.checkpointing`.
The estimator (:func:`memlib.core.estimate.estimate_training`, ``checkpoint_every``) uses
:func:`segment_layers` with ``clamp=True``.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from .choices import RECOMPUTE
from .configs import ModelConfig, load_config
from .errors import MemlibError, check_choice, check_positive
from .params import count_params
from .search import bisect_last

__all__ = ["segment_layers", "segment_peak_bytes", "best_checkpoint_every", "largest_batch", "recompute_overhead"]


def segment_layers(num_layers: int, checkpoint_every: int, *, clamp: bool = False) -> tuple[int, int]:
    """Checkpointing L layers in segments of k: (segment inputs kept by the forward, layers live in backward).

    Introduced in Chapter 4 (Chen et al. 2016). The forward pass keeps the input of each of the ⌈L/k⌉
    segments; the backward pass re-materializes one segment, k layers' saved tensors, at a time. This is the
    one place the segment arithmetic lives: :func:`segment_peak_bytes` and the estimator's
    ``checkpoint_every`` both call it.

    Policy for k > L: with ``clamp=False`` (the Chapter 4 model, a direct question about one chain) it is an
    error; with ``clamp=True`` (the estimator, where k is a setting shared by models of any depth) k becomes L,
    one segment holding the whole model, which is what wrapping all layers in one checkpoint does.

    Args:
        num_layers: L ≥ 1.
        checkpoint_every: k ≥ 1.
        clamp: replace k > L by L instead of raising.

    Returns:
        (⌈L/k⌉, k): how many segment inputs the forward pass keeps, how many layers backward re-materializes.

    Raises:
        MemlibError: L or k < 1, or k > L without ``clamp``.
    """
    n = check_positive("num_layers", num_layers)
    k = check_positive("checkpoint_every", checkpoint_every)
    if k > n:
        if not clamp:
            raise MemlibError(f"checkpoint_every {k} is larger than num_layers {n}; "
                              f"expected 1 ≤ checkpoint_every ≤ {n}")
        k = n
    return -(-n // k), k


def segment_peak_bytes(num_layers: int, checkpoint_every: int, input_bytes: int, layer_bytes: int) -> int:
    """Chen et al. (2016)'s cost model of checkpointing a chain in segments of k layers.

    Introduced in Chapter 4. The forward pass keeps the input of each of the ⌈L/k⌉ segments; the backward pass
    re-materializes one segment (k layers' saved tensors) at a time: ``⌈L/k⌉·input + k·layer``.

    Args:
        num_layers: L, layers in the chain.
        checkpoint_every: k, layers per checkpointed segment (1 ≤ k ≤ L).
        input_bytes: bytes of one segment input (a layer's input, b·s·h·bytes in a transformer).
        layer_bytes: bytes one layer saves for backward.

    Returns:
        Bytes of activations at the backward pass's peak, by the model (temporaries not included).
    """
    kept, live = segment_layers(num_layers, checkpoint_every)
    return kept * int(input_bytes) + live * int(layer_bytes)


def best_checkpoint_every(num_layers: int, input_bytes: int, layer_bytes: int) -> int:
    """The k that minimizes :func:`segment_peak_bytes` (the smallest such k). Introduced in Chapter 4.

    The continuous optimum of (L/k)·I + k·P is k* = √(L·I/P): √L layers per segment when a layer saves about as
    much as its input (Chen et al. 2016's chain), but k = 1 for a transformer, whose layer saves ~20× its input.
    """
    n = check_positive("num_layers", num_layers)
    return min(range(1, n + 1), key=lambda k: (segment_peak_bytes(n, k, input_bytes, layer_bytes), k))


def largest_batch(fits: Callable[[int], bool], *, max_batch: int = 1 << 16, guess: int | None = None) -> int:
    """The largest batch size b ≤ ``max_batch`` with ``fits(b)``, by galloping then bisection.

    Introduced in Chapter 4's lab. Assumes ``fits`` is monotone (true up to some b, false after). Without a
    guess the search doubles from 1; with one (e.g. the estimator's prediction) it gallops up or down from the
    guess, so a good guess costs two calls. O(log b) calls either way. Returns 0 if batch 1 does not fit.

    Args:
        fits: predicate, e.g. ``lambda b: trace_recompute(..., batch_size=b).peak_bytes <= budget`` or a GPU
            step that catches ``torch.cuda.OutOfMemoryError``.
        max_batch: upper bound to search.
        guess: where to start.
    """
    hi_limit = check_positive("max_batch", max_batch)
    if guess is None:
        if not fits(1):
            return 0
        lo, step = 1, 1
    else:
        g = min(max(int(guess), 1), hi_limit)
        if fits(g):
            lo, step = g, 1
        else:
            hi, step = g, 1
            while True:  # gallop down: fits(hi) is False
                nxt = hi - step
                if nxt < 1:
                    lo = 0
                    break
                if fits(nxt):
                    lo = nxt
                    break
                hi, step = nxt, step * 2
            return bisect_last(fits, lo, hi)
    while True:  # gallop up: fits(lo) is True
        nxt = lo + step
        if nxt > hi_limit:
            hi = hi_limit + 1
            break
        if not fits(nxt):
            hi = nxt
            break
        lo, step = nxt, step * 2
    return bisect_last(fits, lo, hi)


def recompute_overhead(model: str | Path | dict[str, Any] | ModelConfig, seq_len: int, recompute: str) -> float:
    """Extra training FLOPs of recomputation, as a fraction of a step without it. Introduced in Chapter 13.

    A step is forward (F) + backward (2F). Full recomputation runs the forward again: F / 3F = 1/3.
    Selective recomputation (Korthikanti et al. 2022) re-runs only the attention core, QKᵀ and PV:
    4·s·a·d FLOPs per token and layer (causal kernels skip about half of it; not counted here).
    """
    cfg = load_config(model)
    check_choice("recompute", recompute, RECOMPUTE)
    if recompute == "none":
        return 0.0
    if recompute == "full":
        return 1 / 3
    n = count_params(cfg).params
    core = 4 * seq_len * cfg.q_dim * cfg.num_layers  # per token, forward
    forward = 2 * n + core
    return core / (3 * forward)
