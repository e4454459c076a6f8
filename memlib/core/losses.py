"""The loss and the logits: standard, chunked and fused cross-entropy, and what each keeps (Chapter 17).

Pure Python. The standard loss (transformers' ``ForCausalLMLoss``) upcasts the logits to fp32 and saves the fp32
log-softmax for backward, 4·b·s·V bytes: for Llama 3's 128,256-token vocabulary and one 8,192-token sequence,
4.2 GB (GB = 10⁹). Its backward holds the log-softmax and its gradient, 2·4·b·s·V.

* ``chunked``: the book's plain-PyTorch cross-entropy (:mod:`memlib._book.ch17_kernels_and_compilers`) runs the LM head and the loss
  over chunks of ``loss_chunk`` tokens, each under ``torch.utils.checkpoint``: the forward keeps no logits, the
  backward re-makes one chunk's at a time.
* ``fused``: Liger-Kernel's fused linear cross-entropy (``liger_kernel/ops/fused_linear_cross_entropy.py``,
  ``fused_linear_cross_entropy_forward``; ``hsu2024liger``) computes the loss *and the gradients* in the forward
  pass, chunk by chunk, the logits of one chunk written over by their gradient; it saves the gradient of the
  hidden states (16-bit, b·s·h) and of the head's weight (V·h, counted with the gradients: memlib does not move
  it earlier). Chunk rows:
  next_power_of_2(⌈b·s / ⌈V/h⌉⌉). Its kernels are Triton (GPU only).

:func:`loss_logits` gives (saved, live at the loss, rows of one chunk); :func:`loss_terms` the terms that replace the
standard log-softmax term.
"""
from __future__ import annotations

from .configs import ModelConfig
from .setup import TrainingSetup
from .terms import ActivationTerm

__all__ = ["LOGITS_TERM", "loss_rows", "loss_logits", "loss_terms"]

#: The name every family gives the standard loss's saved term.
LOGITS_TERM = "log-softmax of the fp32 logits"


def _next_pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def loss_rows(cfg: ModelConfig, setup: TrainingSetup) -> int:
    """Tokens whose logits are live at once: b·s (standard), ``loss_chunk`` (chunked), Liger's chunk (fused)."""
    T = setup.batch_size * setup.seq_len
    if setup.loss == "standard":
        return T
    if setup.loss == "chunked":
        return min(T, setup.loss_chunk)
    inc = -(-cfg.vocab_size // cfg.hidden_size)  # Liger: inc_factor = cdiv(V, H)
    return min(T, _next_pow2(-(-T // inc)))


def loss_logits(cfg: ModelConfig, setup: TrainingSetup) -> tuple[int, int, int]:
    """(bytes the loss saves for backward, fp32 logits bytes live at the loss, chunk rows) (Chapter 17).

    Standard: 4·b·s·V saved and live. Chunked: nothing saved, 4·c·V live (one chunk). Fused: the hidden states'
    gradient saved (e·b·s·h, freed by the loss's backward), 4·c·V live.
    """
    rows = loss_rows(cfg, setup)
    live = 4 * rows * cfg.vocab_size
    saved = {"standard": live, "chunked": 0, "fused": setup.act_bytes * setup.batch_size * setup.seq_len * cfg.hidden_size}
    return saved[setup.loss], live, rows


def loss_terms(cfg: ModelConfig, setup: TrainingSetup, terms: list[ActivationTerm]) -> list[ActivationTerm]:
    """``terms`` with the standard log-softmax term replaced by what the chosen loss saves (Chapter 17)."""
    if setup.loss == "standard":
        return terms
    T, h = setup.batch_size * setup.seq_len, cfg.hidden_size
    out = [t for t in terms if t.name != LOGITS_TERM]
    if setup.loss == "chunked":
        out.append(ActivationTerm(f"{LOGITS_TERM} (chunked: none kept)", 0, "0", per_layer=False))
    else:
        out.append(ActivationTerm(f"{LOGITS_TERM} (fused: none kept; hidden-state gradient)", setup.act_bytes * T * h,
                                  f"{setup.act_bytes}·bsh", per_layer=False))
    return out
