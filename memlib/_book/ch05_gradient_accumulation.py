"""Gradient accumulation measured: equivalence, loss normalization, memory, FLOPs, time and DDP ``no_sync`` (Chapter 5).

Book helpers (moved from ``memlib.measure.accumulation``): only Chapter 5 uses them. The pure half
(:func:`token_loss_weights`, :func:`normalization_error`, :func:`last_group_scale`: the weight each token's loss
gets in the optimizer step) is :mod:`memlib._book.ch05_loss_weights`, and the two-process ``gloo`` DDP run is
:mod:`memlib._book.ch05_gradient_accumulation_ddp`; both are re-exported here, so that the chapter imports one
module. This module runs PyTorch (imported lazily, inside the functions): gradients of k micro-batches against one
big batch, a BatchNorm counter-example, memory traces of an accumulation step
(:class:`memlib.measure.tracker.MemoryTracker`), FLOPs with ``torch.utils.flop_counter.FlopCounterMode`` and CPU
timings.
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .ch05_loss_weights import NORMALIZATIONS, last_group_scale, normalization_error, token_loss_weights
from ..core.choices import MODEL_DTYPES
from ..core.configs import ModelConfig, load_config
from ..core.errors import MemlibError, check_choice, check_positive
from ..measure.deps import require_torch
from .ch05_gradient_accumulation_ddp import DDP_VARIANTS, DDPCommResult, ddp_allreduce_counts, find_free_port

__all__ = [
    "NORMALIZATIONS",
    "TINY_GPT2",
    "DDP_VARIANTS",
    "token_loss_weights",
    "normalization_error",
    "last_group_scale",
    "GradComparison",
    "NormalizationResult",
    "BatchNormResult",
    "AccumulationTrace",
    "FlopsResult",
    "DDPCommResult",
    "tiny_gpt2",
    "grad_equivalence",
    "normalization_comparison",
    "batchnorm_equivalence",
    "trace_accumulation",
    "memory_sweep",
    "accumulation_flops",
    "time_accumulation",
    "gradient_noise",
    "partial_group_grad_ratio",
    "find_free_port",
    "ddp_allreduce_counts",
]

#: A tiny GPT-2 (about 0.1 M parameters, no dropout) for the exact CPU experiments of Chapter 5.
TINY_GPT2: dict[str, Any] = {"n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 256, "n_positions": 64,
                             "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}


def _torch() -> Any:
    return require_torch("memlib._book.ch05_gradient_accumulation")


# --------------------------------------------------------------------------------------------------------------
# Results
# --------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GradComparison:
    """Accumulated gradients against one big batch. Introduced in Chapter 5.

    Attributes:
        accumulation_steps: k.
        micro_batch_size: sequences per micro-batch.
        num_params: number of parameter values compared.
        max_abs_diff: max |g_accumulated − g_big| over all parameter values.
        rel_error: ‖g_accumulated − g_big‖ / ‖g_big‖ (all parameters flattened).
        grad_norm: ‖g_big‖.
    """

    accumulation_steps: int
    micro_batch_size: int
    num_params: int
    max_abs_diff: float
    rel_error: float
    grad_norm: float


@dataclass(frozen=True)
class NormalizationResult:
    """Gradients of the two loss normalizations against one big batch. Introduced in Chapter 5.

    Attributes:
        tokens_per_micro_batch: loss-bearing tokens n_i of each micro-batch.
        loss_big: the big batch's mean token loss (the reference).
        loss: the accumulated loss value per normalization (plus ``"hf-num_items_in_batch"``).
        rel_error: ‖g − g_big‖ / ‖g_big‖ per normalization (plus ``"hf-num_items_in_batch"``: transformers'
            ``num_items_in_batch`` argument, which implements the right normalization).
    """

    tokens_per_micro_batch: tuple[int, ...]
    loss_big: float
    loss: dict[str, float]
    rel_error: dict[str, float]


@dataclass(frozen=True)
class BatchNormResult:
    """Accumulation with a normalization layer against one big batch. Introduced in Chapter 5.

    Attributes:
        norm: ``"batchnorm"`` or ``"layernorm"``.
        rel_error: ‖g_accumulated − g_big‖ / ‖g_big‖.
        running_mean_diff: max |running mean after k micro-batches − after the big batch| (0 for LayerNorm,
            which keeps no running statistics).
    """

    norm: str
    rel_error: float
    running_mean_diff: float


@dataclass(frozen=True)
class AccumulationTrace:
    """Peak memory of one optimizer step made of k micro-batches. Introduced in Chapter 5.

    Attributes:
        peak_bytes: steady-state peak of live tensor bytes during the step.
        by_category: bytes per :class:`MemCategory` value at the peak.
        peak_phase: ``"forward"``, ``"backward"`` or ``"optimizer"``.
        peak_micro_step: which micro-batch (0-based) the peak fell in (k for the optimizer step).
        settings: model, micro_batch_size, accumulation_steps, seq_len, precision, optimizer, set_to_none,
            device (and the CUDA allocator's ``cuda_max_memory_allocated`` when traced on CUDA).
    """

    peak_bytes: int
    by_category: dict[str, int]
    peak_phase: str
    peak_micro_step: int
    settings: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class FlopsResult:
    """FLOPs of one optimizer step, accumulated or not. Introduced in Chapter 5.

    Attributes:
        accumulated: FLOPs of k forward+backward passes on micro-batches of b sequences
            (``FlopCounterMode``: matrix multiplies and attention).
        big_batch: FLOPs of one forward+backward pass on k·b sequences.
        accumulate_adds: the extra element-wise additions accumulation makes, (k − 1) × parameters
            (``param.grad += new``; FlopCounterMode does not count element-wise ops).
        num_params: parameters of the model.
    """

    accumulated: int
    big_batch: int
    accumulate_adds: int
    num_params: int


# --------------------------------------------------------------------------------------------------------------
# Exact CPU experiments on a tiny GPT-2
# --------------------------------------------------------------------------------------------------------------
def tiny_gpt2(seed: int = 0) -> Any:
    """The tiny GPT-2 of :data:`TINY_GPT2`, fp32 on the CPU, in train mode. Introduced in Chapter 5."""
    torch = _torch()
    from ..measure.trace import build_model

    torch.manual_seed(seed)
    return build_model("gpt2", device="cpu", dtype="fp32", attention="sdpa", overrides=TINY_GPT2)


def _flat_grad(model: Any) -> Any:
    torch = _torch()
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()])


def _rel(a: Any, b: Any) -> float:
    return float((a - b).norm() / b.norm())


def grad_equivalence(*, batch_size: int = 8, seq_len: int = 32, accumulation_steps: int = 4,
                     seed: int = 0) -> GradComparison:
    """Gradient of one batch vs the sum of k micro-batch gradients, each loss divided by k. Introduced in Chapter 5.

    All sequences have the same length, so the mean loss of the big batch equals the average of the micro-batch
    means and the gradients agree up to fp32 rounding (the sums run in a different order).

    Args:
        batch_size: sequences in the big batch; must be divisible by ``accumulation_steps``.
        seq_len: tokens per sequence (≤ 64 for :data:`TINY_GPT2`).
        accumulation_steps: k.
        seed: seed for weights and data.

    Returns:
        The comparison.
    """
    torch = _torch()
    batch_size = check_positive("batch_size", batch_size)
    seq_len = check_positive("seq_len", seq_len)
    k = check_positive("accumulation_steps", accumulation_steps)
    if batch_size % k:
        raise MemlibError(f"batch_size {batch_size} is not divisible by accumulation_steps {k}")
    model = tiny_gpt2(seed)
    x = torch.randint(0, TINY_GPT2["vocab_size"], (batch_size, seq_len),
                      generator=torch.Generator().manual_seed(seed + 1))  # (B, T)
    model(input_ids=x, labels=x).loss.backward()
    big = _flat_grad(model).clone()
    model.zero_grad(set_to_none=True)
    for chunk in x.chunk(k):                                            # (B/k, T) each
        (model(input_ids=chunk, labels=chunk).loss / k).backward()      # grads accumulate in p.grad
    acc = _flat_grad(model)
    return GradComparison(accumulation_steps=k, micro_batch_size=batch_size // k, num_params=big.numel(),
                          max_abs_diff=float((acc - big).abs().max()), rel_error=_rel(acc, big),
                          grad_norm=float(big.norm()))


def normalization_comparison(lengths: Sequence[Sequence[int]], *, seq_len: int | None = None,
                             seed: int = 0) -> NormalizationResult:
    """Variable-length micro-batches: the two loss normalizations against one big batch. Introduced in Chapter 5.

    Each micro-batch holds sequences of the given lengths, right-padded to ``seq_len`` with labels -100 on the
    padding. The big batch is all sequences at once with transformers' mean token loss (the reference).
    ``"mean-per-micro-batch"`` backpropagates ``loss_i / k``; ``"sum-over-step-tokens"`` backpropagates
    ``sum_of_token_losses_i / N``; ``"hf-num_items_in_batch"`` passes ``num_items_in_batch=N`` to the model,
    which makes transformers compute the second.

    Args:
        lengths: for each micro-batch, the lengths (tokens, ≥ 2) of its sequences. A causal LM predicts
            length − 1 tokens per sequence.
        seq_len: padded length (default: the longest sequence; ≤ 64 for :data:`TINY_GPT2`).
        seed: seed for weights and data.

    Returns:
        Losses and gradient errors per normalization.
    """
    torch = _torch()
    import torch.nn.functional as F

    if len(lengths) == 0 or any(len(mb) == 0 for mb in lengths):
        raise MemlibError(f"lengths must list at least one non-empty micro-batch, got {lengths!r}")
    flat = [check_positive("sequence length", n) for mb in lengths for n in mb]
    if min(flat) < 2:
        raise MemlibError(f"sequence lengths must be ≥ 2 (a causal LM predicts length − 1 tokens), got {min(flat)}")
    T = check_positive("seq_len", seq_len) if seq_len is not None else max(flat)
    if max(flat) > T:
        raise MemlibError(f"a sequence of {max(flat)} tokens does not fit seq_len {T}")
    gen = torch.Generator().manual_seed(seed + 1)
    model = tiny_gpt2(seed)
    V = TINY_GPT2["vocab_size"]

    def make(mb: Sequence[int]) -> tuple[Any, Any, Any]:
        ids = torch.randint(0, V, (len(mb), T), generator=gen)          # (b, T)
        mask = torch.zeros(len(mb), T, dtype=torch.long)
        for row, n in enumerate(mb):
            mask[row, :n] = 1
        labels = ids.masked_fill(mask == 0, -100)
        return ids, mask, labels

    micro = [make(mb) for mb in lengths]
    tokens = tuple(int((lab[:, 1:] != -100).sum()) for _, _, lab in micro)
    total, k = sum(tokens), len(micro)
    ids = torch.cat([m[0] for m in micro])
    mask = torch.cat([m[1] for m in micro])
    labels = torch.cat([m[2] for m in micro])
    loss_big = model(input_ids=ids, attention_mask=mask, labels=labels).loss
    loss_big.backward()
    ref = _flat_grad(model).clone()
    losses: dict[str, float] = {}
    errors: dict[str, float] = {}
    for name in (*NORMALIZATIONS, "hf-num_items_in_batch"):
        model.zero_grad(set_to_none=True)
        value = 0.0
        for x, m, lab in micro:
            if name == "hf-num_items_in_batch":
                loss = model(input_ids=x, attention_mask=m, labels=lab, num_items_in_batch=total).loss
            else:
                logits = model(input_ids=x, attention_mask=m).logits.float()           # (b, T, V)
                token_losses = F.cross_entropy(logits[:, :-1].reshape(-1, V), lab[:, 1:].reshape(-1),
                                               ignore_index=-100, reduction="sum")
                n_i = int((lab[:, 1:] != -100).sum())
                loss = token_losses / (k * n_i) if name == "mean-per-micro-batch" else token_losses / total
            loss.backward()
            value += float(loss.detach())
        losses[name] = value
        errors[name] = _rel(_flat_grad(model), ref)
    return NormalizationResult(tokens_per_micro_batch=tokens, loss_big=float(loss_big.detach()), loss=losses,
                               rel_error=errors)


def batchnorm_equivalence(norm: str = "batchnorm", *, batch_size: int = 32, accumulation_steps: int = 4,
                          features: int = 16, seed: int = 0) -> BatchNormResult:
    """Accumulation through a normalization layer: a small MLP, k micro-batches vs one batch. Introduced in Chapter 5.

    BatchNorm normalizes with the statistics of the batch it sees, so micro-batches of b normalize with other
    means and variances than one batch of k·b: the gradients differ, and the running statistics are updated k
    times instead of once. LayerNorm normalizes each sample on its own and accumulates exactly.

    Args:
        norm: ``"batchnorm"`` or ``"layernorm"``.
        batch_size: samples in the big batch; divisible by ``accumulation_steps``.
        accumulation_steps: k.
        features: input width.
        seed: seed for weights and data.

    Returns:
        Gradient error and running-mean difference.
    """
    torch = _torch()
    check_choice("norm", norm, ("batchnorm", "layernorm"))
    batch_size = check_positive("batch_size", batch_size)
    k = check_positive("accumulation_steps", accumulation_steps)
    features = check_positive("features", features)
    if batch_size % k:
        raise MemlibError(f"batch_size {batch_size} is not divisible by accumulation_steps {k}")
    gen = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(batch_size, features, generator=gen) * 2 + 1               # (B, F)
    y = torch.randn(batch_size, 1, generator=gen)                              # (B, 1)

    def build() -> Any:
        torch.manual_seed(seed)
        layer = torch.nn.BatchNorm1d(32) if norm == "batchnorm" else torch.nn.LayerNorm(32)
        return torch.nn.Sequential(torch.nn.Linear(features, 32), layer, torch.nn.ReLU(), torch.nn.Linear(32, 1))

    big_net, acc_net = build(), build()
    torch.nn.functional.mse_loss(big_net(x), y).backward()
    for xc, yc in zip(x.chunk(k), y.chunk(k)):
        (torch.nn.functional.mse_loss(acc_net(xc), yc) / k).backward()
    g_big = torch.cat([p.grad.reshape(-1) for p in big_net.parameters()])
    g_acc = torch.cat([p.grad.reshape(-1) for p in acc_net.parameters()])
    diff = 0.0
    if norm == "batchnorm":
        diff = float((big_net[1].running_mean - acc_net[1].running_mean).abs().max())
    return BatchNormResult(norm=norm, rel_error=_rel(g_acc, g_big), running_mean_diff=diff)


def gradient_noise(accumulation_steps: Sequence[int] = (1, 4), *, micro_batch_size: int = 1, seq_len: int = 32,
                   draws: int = 16, seed: int = 0) -> dict[int, float]:
    """Variance of the step's gradient around the full-data gradient, for several k. Introduced in Chapter 5.

    Each draw averages k micro-batch gradients of fresh random sequences from a fixed pool; the mean squared
    distance from the pool's average gradient falls like 1/k — the same as a k times larger batch, no better.

    Args:
        accumulation_steps: the k values to measure.
        micro_batch_size: sequences per micro-batch.
        seq_len: tokens per sequence.
        draws: optimizer-step gradients drawn per k.
        seed: seed.

    Returns:
        k → mean ‖g_step − g_full‖² over the draws.
    """
    torch = _torch()
    ks = [check_positive("accumulation_steps", k) for k in accumulation_steps]
    b = check_positive("micro_batch_size", micro_batch_size)
    draws = check_positive("draws", draws)
    model = tiny_gpt2(seed)
    gen = torch.Generator().manual_seed(seed + 1)
    pool = torch.randint(0, TINY_GPT2["vocab_size"], (64, seq_len), generator=gen)   # (64, T): "the data set"
    model(input_ids=pool, labels=pool).loss.backward()
    full = _flat_grad(model).clone()
    out: dict[int, float] = {}
    for k in ks:
        sq = []
        for _ in range(draws):
            model.zero_grad(set_to_none=True)
            for _ in range(k):
                rows = torch.randint(0, pool.shape[0], (b,), generator=gen)
                (model(input_ids=pool[rows], labels=pool[rows]).loss / k).backward()
            sq.append(float((_flat_grad(model) - full).pow(2).sum()))
        out[k] = statistics.fmean(sq)
    return out


def partial_group_grad_ratio(num_micro_batches: int = 10, accumulation_steps: int = 4, *, seed: int = 0) -> float:
    """Run the Strategies notes' accumulation loop on a linear model and measure its last step's gradient. Introduced in Chapter 5.

    The loop divides each micro-batch loss by k and steps every k micro-batches *or on the last batch*. The
    function returns the last step's gradient divided by the correct one (the mean of that group's
    micro-batch gradients): :func:`last_group_scale` predicts r/k.

    Args:
        num_micro_batches: ``len(data_loader)``.
        accumulation_steps: k.
        seed: seed.

    Returns:
        ‖g_last‖ / ‖mean of the last group's micro-batch gradients‖ (the two are parallel).
    """
    torch = _torch()
    n = check_positive("num_micro_batches", num_micro_batches)
    k = check_positive("accumulation_steps", accumulation_steps)
    gen = torch.Generator().manual_seed(seed)
    data = [(torch.randn(4, 8, generator=gen), torch.randn(4, 1, generator=gen)) for _ in range(n)]
    torch.manual_seed(seed)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)   # lr 0: the weights stay put, so gradients compare exactly
    last_grad = None
    for batch_idx, (inputs, labels) in enumerate(data):  # the Strategies notes, lines 2-13
        loss = torch.nn.functional.mse_loss(model(inputs), labels)
        loss /= k
        loss.backward()
        if ((batch_idx + 1) % k == 0) or ((batch_idx + 1) == len(data)):
            last_grad = model.weight.grad.clone()
            opt.step()
            opt.zero_grad()
    group = data[(n - 1) // k * k:]
    model.zero_grad()
    for inputs, labels in group:
        (torch.nn.functional.mse_loss(model(inputs), labels) / len(group)).backward()
    assert last_grad is not None
    return float(last_grad.norm() / model.weight.grad.norm())


# --------------------------------------------------------------------------------------------------------------
# Memory, FLOPs, time
# --------------------------------------------------------------------------------------------------------------
def trace_accumulation(model: str | Path | dict[str, Any] | ModelConfig, *, micro_batch_size: int = 1,
                       accumulation_steps: int = 1, seq_len: int = 512, precision: str = "bf16",
                       optimizer: str = "adamw", set_to_none: bool = True, device: str = "meta",
                       overrides: dict[str, Any] | None = None, seed: int = 0) -> AccumulationTrace:
    """Trace one steady-state optimizer step made of k micro-batches and return its peak. Introduced in Chapter 5.

    The step is k × (forward, ``loss / k``, backward) with gradients accumulating in ``param.grad``, then
    ``optimizer.step()`` and ``zero_grad(set_to_none=...)``, after a warm-up step that creates the optimizer
    states (as :func:`memlib.measure.trace.trace_training` does; with k = 1 the two functions trace the same step).
    SDPA runs through the flash kernel's op and dropout through the fused op, as on CUDA.

    Args:
        model: shipped name, config.json path, dict or ModelConfig.
        micro_batch_size: sequences per micro-batch.
        accumulation_steps: k, micro-batches per optimizer step.
        seq_len: tokens per sequence.
        precision: ``fp32``, ``bf16`` or ``fp16`` (everything in that dtype; mixed precision is Chapter 3's).
        optimizer: ``sgd``, ``sgd-momentum`` or ``adamw``.
        set_to_none: ``zero_grad(set_to_none=True)`` (PyTorch's default since 2.0) frees the gradients between
            optimizer steps; ``False`` keeps zero-filled gradient tensors alive.
        device: ``meta`` (no memory), ``cpu`` or ``cuda``.
        overrides: config fields to replace, e.g. fewer layers.
        seed: seed for the inputs and initialization.

    Returns:
        The peak, its breakdown, and the micro-step it fell in.

    Limitations:
        Counts tensor storages only (no allocator rounding, CUDA context or workspaces).
    """
    torch = _torch()
    from ..measure.trace import _make_optimizer, _patched, build_model
    from ..measure.tracker import MemoryTracker

    cfg = load_config(model)
    b = check_positive("micro_batch_size", micro_batch_size)
    k = check_positive("accumulation_steps", accumulation_steps)
    seq_len = check_positive("seq_len", seq_len)
    check_choice("precision", precision, MODEL_DTYPES)
    check_choice("optimizer", optimizer, ("sgd", "sgd-momentum", "adamw"))
    check_choice("device", device, ("meta", "cpu", "cuda"))
    torch.manual_seed(seed)
    tracker = MemoryTracker(device)
    net = build_model(cfg, device=device, dtype=precision, attention="sdpa", overrides=overrides)
    params = [p for p in net.parameters() if p.requires_grad]
    tracker.track_model(net)
    opt = _make_optimizer(optimizer, params)
    vocab = int(net.config.vocab_size)
    for p in params:  # warm-up: create the optimizer states as a first step would
        p.grad = torch.zeros_like(p)
    opt.step()
    opt.zero_grad(set_to_none=set_to_none)
    peak_micro = {"step": 0}
    with _patched(True), tracker.mode():
        tracker.track_optimizer(opt)  # states, and the zero-filled gradients kept by set_to_none=False
        tracker.reset_peak()
        if device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        for i in range(k):
            before = tracker.peak
            with tracker.forward():
                x = torch.randint(0, vocab, (b, seq_len), device=device)  # (b, T): one micro-batch at a time
                loss = net(input_ids=x, labels=x).loss / k
            with tracker.backward():
                loss.backward()
                del loss, x
            if tracker.peak > before:
                peak_micro["step"] = i
        before = tracker.peak
        with tracker.optimizer_step():
            opt.step()
            opt.zero_grad(set_to_none=set_to_none)
        if tracker.peak > before:
            peak_micro["step"] = k
    settings: dict[str, Any] = {"model": cfg.name, "micro_batch_size": b, "accumulation_steps": k,
                                "seq_len": seq_len, "precision": precision, "optimizer": optimizer,
                                "set_to_none": set_to_none, "device": device}
    if device == "cuda":
        torch.cuda.synchronize()
        settings["cuda_max_memory_allocated"] = int(torch.cuda.max_memory_allocated())
        settings["cuda_device_name"] = torch.cuda.get_device_name()
        settings["torch_version"] = torch.__version__
    return AccumulationTrace(peak_bytes=tracker.peak, by_category=tracker.peak_by_category(),
                             peak_phase=tracker.peak_phase, peak_micro_step=peak_micro["step"], settings=settings)


def memory_sweep(model: str | Path | dict[str, Any] | ModelConfig = "gpt2", *,
                 settings: Sequence[tuple[int, int]] = ((8, 1), (4, 2), (2, 4), (1, 8), (2, 1), (2, 2), (2, 8)),
                 seq_len: int = 512, precision: str = "bf16", device: str = "meta",
                 overrides: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Peak memory of an accumulation step for several (micro-batch, k) pairs. Introduced in Chapter 5.

    The default pairs are Chapter 5's: an effective batch of 8 sequences split four ways, and k = 1, 2, 4, 8 at
    a micro-batch of 2. With ``device="cuda"`` each row also carries the CUDA allocator's peak
    (``cuda_max_memory_allocated``): a GPU suite writes ``{"device": name, "torch": version, "date": ISO date,
    "rows": rows}`` to ``labs/results/05_accumulation_memory.json``, which Chapter 5 shows when it has no GPU.

    Args:
        model: shipped name, config.json path, dict or ModelConfig.
        settings: (micro_batch_size, accumulation_steps) pairs.
        seq_len: tokens per sequence.
        precision: ``fp32``, ``bf16`` or ``fp16``.
        device: ``meta``, ``cpu`` or ``cuda``.
        overrides: config fields to replace.

    Returns:
        One JSON-ready dict per pair: the settings, ``peak_bytes``, ``<category>_bytes``, ``peak_phase``.
    """
    rows = []
    for b, k in settings:
        r = trace_accumulation(model, micro_batch_size=b, accumulation_steps=k, seq_len=seq_len,
                               precision=precision, device=device, overrides=overrides)
        row: dict[str, Any] = dict(r.settings)
        row["peak_bytes"] = r.peak_bytes
        row.update({f"{c}_bytes": v for c, v in r.by_category.items()})
        row["peak_phase"] = r.peak_phase
        rows.append(row)
    return rows


def accumulation_flops(model: str | Path | dict[str, Any] | ModelConfig = "gpt2", *, micro_batch_size: int = 1,
                       accumulation_steps: int = 4, seq_len: int = 128,
                       overrides: dict[str, Any] | None = None) -> FlopsResult:
    """Count forward+backward FLOPs of k micro-batches vs one batch of k·b, on the meta device. Introduced in Chapter 5.

    Args:
        model: shipped name, config.json path, dict or ModelConfig.
        micro_batch_size: b.
        accumulation_steps: k.
        seq_len: tokens per sequence.
        overrides: config fields to replace.

    Returns:
        Both FLOP counts and the extra additions of accumulation.
    """
    torch = _torch()
    from torch.utils.flop_counter import FlopCounterMode

    from ..measure.trace import _patched, build_model

    b = check_positive("micro_batch_size", micro_batch_size)
    k = check_positive("accumulation_steps", accumulation_steps)
    seq_len = check_positive("seq_len", seq_len)
    net = build_model(model, device="meta", dtype="bf16", attention="sdpa", overrides=overrides)
    vocab = int(net.config.vocab_size)

    def count(batch: int, times: int) -> int:
        x = torch.randint(0, vocab, (batch, seq_len), device="meta")   # (batch, T)
        with _patched(True), FlopCounterMode(display=False) as counter:
            for _ in range(times):
                (net(input_ids=x, labels=x).loss / times).backward()
        net.zero_grad(set_to_none=True)
        return int(counter.get_total_flops())

    num_params = sum(p.numel() for p in net.parameters())
    return FlopsResult(accumulated=count(b, k), big_batch=count(b * k, 1), accumulate_adds=(k - 1) * num_params,
                       num_params=num_params)


def time_accumulation(micro_batch_sizes: Sequence[int] = (1, 2, 4, 8), *, effective_batch: int = 8,
                      seq_len: int = 64, repeats: int = 3, seed: int = 0) -> dict[int, float]:
    """Seconds per optimizer step (AdamW) of the tiny GPT-2 on the CPU, same effective batch. Introduced in Chapter 5.

    Args:
        micro_batch_sizes: b values; each must divide ``effective_batch`` (k = effective_batch / b).
        effective_batch: sequences per optimizer step.
        seq_len: tokens per sequence (≤ 64).
        repeats: timed steps per setting (after one warm-up step); the median is returned.
        seed: seed.

    Returns:
        b → median seconds per optimizer step. A wall-clock measurement: noisy, machine dependent.
    """
    torch = _torch()
    effective_batch = check_positive("effective_batch", effective_batch)
    repeats = check_positive("repeats", repeats)
    model = tiny_gpt2(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randint(0, TINY_GPT2["vocab_size"], (effective_batch, seq_len),
                      generator=torch.Generator().manual_seed(seed + 1))   # (B, T)
    out: dict[int, float] = {}
    for b in micro_batch_sizes:
        b = check_positive("micro_batch_size", b)
        if effective_batch % b:
            raise MemlibError(f"micro_batch_size {b} does not divide effective_batch {effective_batch}")
        k = effective_batch // b
        times = []
        for rep in range(repeats + 1):
            start = time.perf_counter()
            for chunk in x.split(b):
                (model(input_ids=chunk, labels=chunk).loss / k).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if rep:  # the first run warms up
                times.append(time.perf_counter() - start)
        out[b] = statistics.median(times)
    return out
