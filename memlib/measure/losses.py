"""Chunked cross-entropy in plain PyTorch: the LM head and the loss over checkpointed chunks (Chapter 17).

The forward pass keeps no logits (each chunk runs under ``torch.utils.checkpoint``, which keeps only its inputs);
the backward pass re-makes one chunk's logits at a time. :mod:`memlib.core.losses` models it (``loss="chunked"``).
"""
from __future__ import annotations

from typing import Any

__all__ = ["chunked_cross_entropy"]


def _chunk_loss(x: Any, weight: Any, target: Any) -> Any:
    import torch

    logits = (x @ weight.t()).float()  # (c, V): the only logits alive
    return torch.nn.functional.cross_entropy(logits, target, reduction="sum")


def chunked_cross_entropy(hidden: Any, weight: Any, target: Any, chunk: int = 1024) -> Any:
    """Mean cross-entropy of ``hidden @ weight.T`` against ``target``, ``chunk`` tokens at a time.

    Args:
        hidden: (T, h) final hidden states; weight: (V, h) the LM head; target: (T,) token ids.
        chunk: tokens per chunk.

    Returns:
        The mean loss (a 0-d tensor), equal to ``cross_entropy(hidden @ weight.T, target)``.
    """
    from torch.utils.checkpoint import checkpoint

    total = hidden.new_zeros((), dtype=hidden.dtype).float()
    for start in range(0, hidden.shape[0], chunk):
        sl = slice(start, start + chunk)
        total = total + checkpoint(_chunk_loss, hidden[sl], weight, target[sl], use_reentrant=False)
    return total / hidden.shape[0]
