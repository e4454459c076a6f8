"""Chapter 9's book helpers: NF4 and double quantization, a LoRA step traced, paged optimizer states simulated.

Book helpers (moved from ``memlib.core.quant``, ``memlib.core.lora``, ``memlib.core.paging`` and
``memlib.measure.quant``): only Chapter 9 uses them. NF4 (:func:`nf4_levels`, :func:`quantize_nf4`) and double
quantization are numpy; :func:`simulate_paging` replays training steps against a GPU budget with CUDA unified
memory paging optimizer states out and back in (bitsandbytes ``PagedAdamW``, Dettmers et al. 2023, §3);
:func:`trace_lora_step` and :func:`quantize_linears_nf4` run peft and bitsandbytes on a real model (torch imported
lazily, inside the functions).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..core.categories import MemCategory
from ..core.configs import ModelConfig, load_config
from ..core.errors import MemlibError, check_choice, check_positive
from ..core.lora import layer_linears
from ..core.quant import (NF4_OFFSET, DoubleQuantized, QuantizedBlocks, _linspace32, dequantize_blockwise,
                          dynamic_map, quantize_blockwise)
from ..measure.quant import peft_lora_model
from ..measure.trace import MemoryTracker, TraceResult, _patched


def frozen_linear_params(model: str | Path | dict[str, Any] | ModelConfig) -> int:
    """Weights of all decoder-block Linear matrices (biases excluded): what QLoRA stores in NF4.

    Introduced in Chapter 9. Embeddings, the LM head, norms and biases stay in 16 bits (bitsandbytes'
    ``Linear4bit`` replaces the blocks' Linear layers; transformers keeps ``lm_head`` unquantized).
    """
    cfg = load_config(model)
    return cfg.num_layers * sum(i * o for _, i, o in layer_linears(cfg))


#: Granularity of the simulation: 2 MiB, the large-page size the CUDA driver migrates managed memory in.
UM_PAGE_BYTES = 2 * 2**20


@dataclass(frozen=True)
class PagingStep:
    """What one training step did. Introduced in Chapter 9.

    Attributes:
        step: index.
        activation_bytes: activations (and temporaries) of the step's forward/backward.
        paged_out_bytes: optimizer-state bytes evicted to CPU during forward/backward.
        paged_in_bytes: bytes brought back for the optimizer step.
        states_on_gpu_bytes: state bytes resident at the activation peak.
        gpu_peak_bytes: the step's peak GPU use.
        oom: the step cannot run (even with every state page on the CPU, or, without paging, at all).
    """

    step: int
    activation_bytes: int
    paged_out_bytes: int
    paged_in_bytes: int
    states_on_gpu_bytes: int
    gpu_peak_bytes: int
    oom: bool


@dataclass(frozen=True)
class PagingResult:
    """A run of steps against a budget. Introduced in Chapter 9.

    Attributes:
        steps: per step.
        capacity_bytes: the GPU budget.
        paged: whether states were in unified memory.
        page_bytes: the page size.
    """

    steps: tuple[PagingStep, ...]
    capacity_bytes: int
    paged: bool
    page_bytes: int

    @property
    def ooms(self) -> int:
        """Steps that ran out of memory."""
        return sum(s.oom for s in self.steps)

    @property
    def traffic_bytes(self) -> int:
        """Bytes moved over the CPU-GPU link, both directions."""
        return sum(s.paged_out_bytes + s.paged_in_bytes for s in self.steps)

    def transfer_seconds(self, link_bytes_per_s: float = 25e9) -> float:
        """Time to move :attr:`traffic_bytes` at ``link_bytes_per_s`` (PCIe 4.0 x16 ≈ 25 GB/s in practice)."""
        if link_bytes_per_s <= 0:
            raise MemlibError(f"link_bytes_per_s must be > 0, got {link_bytes_per_s!r}")
        return self.traffic_bytes / link_bytes_per_s


def simulate_paging(capacity_bytes: int, fixed_bytes: int, optimizer_bytes: int,
                    activation_bytes: Sequence[int], *, step_bytes: int = 0, paged: bool = True,
                    page_bytes: int = UM_PAGE_BYTES) -> PagingResult:
    """Replay training steps against a GPU budget with (or without) paged optimizer states.

    Introduced in Chapter 9.

    Args:
        capacity_bytes: GPU memory available to the process.
        fixed_bytes: what never moves: weights, gradients, CUDA context, buffers.
        optimizer_bytes: optimizer states (paged if ``paged``).
        activation_bytes: activations at each step's peak (they differ with sequence length).
        step_bytes: temporaries of the optimizer step itself (e.g. ``torch.optim.AdamW``'s foreach buffer).
        paged: states in unified memory (evicted on pressure, prefetched for the step) or plain device memory.
        page_bytes: migration granularity.

    Returns:
        Per-step page traffic, resident states and out-of-memory flags.
    """
    cap = check_positive("capacity_bytes", capacity_bytes)
    fixed = check_positive("fixed_bytes", fixed_bytes, allow_zero=True)
    states = check_positive("optimizer_bytes", optimizer_bytes, allow_zero=True)
    page = check_positive("page_bytes", page_bytes)
    step = check_positive("step_bytes", step_bytes, allow_zero=True)
    n_pages = -(-states // page)
    page_size = [page] * (n_pages - 1) + ([states - page * (n_pages - 1)] if n_pages else [])
    resident = n_pages  # pages on the GPU; the first pages evicted are the last in the list (sizes are equal)
    out: list[PagingStep] = []
    for t, act in enumerate(activation_bytes):
        a = check_positive(f"activation_bytes[{t}]", act, allow_zero=True)
        if not paged:
            peak = fixed + states + max(a, step)
            oom = peak > cap
            out.append(PagingStep(t, a, 0, 0, states, min(peak, cap) if oom else peak, oom))
            continue
        room = cap - fixed - a  # what is left for state pages during forward/backward
        if room < 0:
            out.append(PagingStep(t, a, 0, 0, 0, cap, True))
            continue
        # evict from the end until the resident pages fit
        resident_bytes = sum(page_size[:resident])
        evicted = 0
        while resident > 0 and resident_bytes > room:
            resident -= 1
            resident_bytes -= page_size[resident]
            evicted += page_size[resident]
        peak_fb = fixed + a + resident_bytes
        # optimizer step: activations are freed; all pages must be on the GPU, with the step's temporaries
        if fixed + states + step > cap:
            out.append(PagingStep(t, a, evicted, 0, resident_bytes, max(peak_fb, cap), True))
            continue
        paged_in = states - resident_bytes
        resident = n_pages
        out.append(PagingStep(t, a, evicted, paged_in, resident_bytes, max(peak_fb, fixed + states + step), False))
    return PagingResult(tuple(out), cap, paged, page)


# Acklam's rational approximation of the normal quantile (relative error < 1.2e-9), refined below.
_A = (-3.969683028665376e01, 2.209460984245205e02, -2.759285104469687e02, 1.383577518672690e02,
      -3.066479806614716e01, 2.506628277459239e00)


_B = (-5.447609879822406e01, 1.615858368580409e02, -1.556989798598866e02, 6.680131188771972e01,
      -1.328068155288572e01)


_C = (-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e00, -2.549732539343734e00,
      4.374664141464968e00, 2.938163982698783e00)


_D = (7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e00, 3.754408661907416e00)


def _ppf_scalar(p: float) -> float:
    if not 0.0 < p < 1.0:
        raise MemlibError(f"normal quantile needs 0 < p < 1, got {p!r}")
    lo = 0.02425
    if p < lo:
        q = math.sqrt(-2 * math.log(p))
        x = (((((_C[0] * q + _C[1]) * q + _C[2]) * q + _C[3]) * q + _C[4]) * q + _C[5]) / \
            ((((_D[0] * q + _D[1]) * q + _D[2]) * q + _D[3]) * q + 1)
    elif p <= 1 - lo:
        q = p - 0.5
        r = q * q
        x = (((((_A[0] * r + _A[1]) * r + _A[2]) * r + _A[3]) * r + _A[4]) * r + _A[5]) * q / \
            (((((_B[0] * r + _B[1]) * r + _B[2]) * r + _B[3]) * r + _B[4]) * r + 1)
    else:
        q = math.sqrt(-2 * math.log1p(-p))
        x = -(((((_C[0] * q + _C[1]) * q + _C[2]) * q + _C[3]) * q + _C[4]) * q + _C[5]) / \
            ((((_D[0] * q + _D[1]) * q + _D[2]) * q + _D[3]) * q + 1)
    for _ in range(2):  # Halley steps on Φ(x) - p, with Φ from math.erfc (double precision)
        err = 0.5 * math.erfc(-x / math.sqrt(2)) - p
        u = err * math.sqrt(2 * math.pi) * math.exp(x * x / 2)
        x = x - u / (1 + x * u / 2)
    return x


def normal_ppf(p: float | np.ndarray) -> np.ndarray:
    """Quantile function (inverse CDF) of the standard normal, to double precision, without scipy.

    Introduced in Chapter 9 (NF4 is built from normal quantiles). Acklam's approximation refined by two
    Halley steps against ``math.erfc``; agrees with ``scipy.stats.norm.ppf`` to ~1e-15.
    """
    arr = np.asarray(p, dtype=np.float64)
    return np.vectorize(_ppf_scalar, otypes=[np.float64])(arr)


def nf4_levels(offset: float = NF4_OFFSET, use_extra_value: bool = True) -> np.ndarray:
    """The 16 NF4 levels: normal quantiles, normalized to [-1, 1], with an exact zero (QLoRA §3).

    Introduced in Chapter 9. Asymmetric so that 0 is exactly a level: 8 positive levels are the N(0, 1)
    quantiles at 8 evenly spaced probabilities from ``offset`` down to (not including) 0.5, 7 negative ones
    the mirrored quantiles at 7 evenly spaced probabilities, plus 0; all divided by the largest. Mirrors ``bitsandbytes.functional.create_normal_map`` (probabilities spaced in float32, as
    ``torch.linspace`` does there).

    Args:
        offset: the outermost probability; the QLoRA paper's (1 - δ) with δ chosen so that ±1 are levels.
        use_extra_value: the asymmetric 7 negative + 0 + 8 positive type; False gives 7 + 0 + 7 (15 levels,
            padded with a second zero).

    Returns:
        The 16 levels, sorted, float32.
    """
    if not 0.5 < offset < 1.0:
        raise MemlibError(f"offset must be in (0.5, 1), got {offset!r}")
    if use_extra_value:
        pos = normal_ppf(_linspace32(offset, 0.5, 9)[:-1].astype(np.float64))
        neg = -normal_ppf(_linspace32(offset, 0.5, 8)[:-1].astype(np.float64))
        values = np.concatenate([pos, [0.0], neg])
    else:
        pos = normal_ppf(_linspace32(offset, 0.5, 8)[:-1].astype(np.float64))
        neg = -normal_ppf(_linspace32(offset, 0.5, 8)[:-1].astype(np.float64))
        values = np.concatenate([pos, [0.0, 0.0], neg])
    values = np.sort(values.astype(np.float32))
    return (values / values.max()).astype(np.float32)


def quantize_nf4(x: np.ndarray, block_size: int = 64) -> QuantizedBlocks:
    """Block-wise NF4: absmax per block of ``block_size`` (QLoRA: 64), nearest of the 16 NF4 levels.

    Introduced in Chapter 9. Codes are stored one per uint8 here (bitsandbytes packs two per byte;
    :attr:`QuantizedBlocks.nbytes` counts them packed).
    """
    return quantize_blockwise(x, nf4_levels(), block_size)


def dequantize_nf4(q: QuantizedBlocks) -> np.ndarray:
    """Inverse of :func:`quantize_nf4` (up to the rounding). Introduced in Chapter 9."""
    return dequantize_blockwise(q)


def double_quantize_absmax(absmax: np.ndarray, block_size: int = 256) -> DoubleQuantized:
    """Quantize absmax constants to 8 bits in blocks of 256 after subtracting their mean (QLoRA §3).

    Introduced in Chapter 9. As bitsandbytes' ``quantize_4bit(compress_statistics=True)``: offset = mean,
    signed dynamic map, block 256.
    """
    a = np.asarray(absmax, dtype=np.float32)
    offset = float(a.mean(dtype=np.float32))
    return DoubleQuantized(offset, quantize_blockwise(a - np.float32(offset), dynamic_map(), block_size))


def double_quant_bits_per_param(block_size: int = 64, dq_block_size: int = 256, double_quant: bool = True) -> float:
    """Bits per parameter spent on the quantization constants of block-wise NF4 (QLoRA §3).

    Introduced in Chapter 9. Without double quantization one fp32 absmax per block: 32/64 = 0.5 bits. With it,
    an 8-bit absmax per block plus one fp32 constant per ``dq_block_size`` absmax values:
    8/64 + 32/(64·256) ≈ 0.127 bits.
    """
    bs = check_positive("block_size", block_size)
    dq = check_positive("dq_block_size", dq_block_size)
    if not double_quant:
        return 32 / bs
    return 8 / bs + 32 / (bs * dq)


def trace_lora_step(model: str | Path | dict[str, Any] | ModelConfig, *, rank: int = 16,
                    targets: str = "all-linear", batch_size: int = 1, seq_len: int = 128, dtype: str = "bf16",
                    optimizer: str = "adamw", device: str = "meta", overrides: dict[str, Any] | None = None,
                    seed: int = 0) -> TraceResult:
    """Trace a steady-state LoRA training step (peft) with :class:`memlib.measure.trace.MemoryTracker`.

    Introduced in Chapter 9. Base weights in ``dtype``, frozen; fp32 adapters; ``torch.optim.AdamW``
    (``foreach=True``) or bitsandbytes ``AdamW8bit`` on the adapters only. Like
    :func:`memlib.measure.trace.trace_training`: a warm-up step creates the optimizer states, then one step is traced.

    Returns:
        The peak and its breakdown; ``settings["trainable_params"]`` and ``settings["lora_input_copies_bytes"]``
        (the fp32 copies of the adapters' inputs that peft makes and autograd keeps, at the end of forward).
    """
    import torch

    check_choice("optimizer", optimizer, ("adamw", "adamw-8bit"))
    check_choice("device", device, ("meta", "cpu", "cuda"))
    b = check_positive("batch_size", batch_size)
    s = check_positive("seq_len", seq_len)
    torch.manual_seed(seed)
    cfg = load_config(model)
    net = peft_lora_model(cfg, rank=rank, targets=targets, device=device, dtype=dtype, overrides=overrides)
    net.train()
    tracker = MemoryTracker(device)
    trainable = [p for p in net.parameters() if p.requires_grad]
    tracker.track_model(net)  # frozen base weights and adapters as PARAM; gradient hooks on the adapters
    opt: torch.optim.Optimizer
    if optimizer == "adamw":
        opt = torch.optim.AdamW(trainable, lr=1e-4, foreach=True)
    else:
        import bitsandbytes as bnb

        opt = bnb.optim.AdamW8bit(trainable, lr=1e-4)
    for p in trainable:
        p.grad = torch.zeros_like(p)
    opt.step()
    opt.zero_grad(set_to_none=True)
    vocab = int(net.config.vocab_size)
    input_ids = torch.randint(0, vocab, (b, s), device=device)
    tracker.track_inputs(input_ids)
    end_of_forward: dict[str, int] = {}
    with _patched(True), tracker.mode():  # flash SDPA as on a GPU; skip transformers' .item() probe on meta
        tracker.track_optimizer(opt)
        tracker.reset_peak()
        with tracker.forward():
            loss = net(input_ids=input_ids, labels=input_ids).loss
        end_of_forward = {c.value: tracker.totals[c] for c in MemCategory}
        with tracker.backward():
            loss.backward()
            del loss
        with tracker.optimizer_step():
            opt.step()
            opt.zero_grad(set_to_none=True)
    settings = {"model": cfg.name, "rank": rank, "targets": targets, "batch_size": b, "seq_len": s, "dtype": dtype,
                "optimizer": optimizer, "trainable_params": sum(p.numel() for p in trainable),
                "activations_end_of_forward": end_of_forward.get(MemCategory.ACTIVATION.value, 0)}
    return TraceResult(peak_bytes=tracker.peak, by_category=tracker.peak_by_category(),
                       peak_phase=tracker.peak_phase, device=device, settings=settings)


def quantize_linears_nf4(net: Any, *, double_quant: bool = True, block_size: int = 64) -> Any:
    """Replace every decoder-block ``nn.Linear`` by bitsandbytes ``Linear4bit`` (NF4), in place, on the CPU.

    Introduced in Chapter 9: what ``BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
    bnb_4bit_use_double_quant=True)`` does to a transformers model (embeddings and ``lm_head`` stay 16-bit),
    without downloading a checkpoint.
    """
    import torch

    import bitsandbytes as bnb

    blocks = getattr(getattr(net, "model", None), "layers", None) or net.transformer.h
    for block in blocks:
        for parent in block.modules():
            for name, mod in list(parent.named_children()):
                if type(mod) is not torch.nn.Linear:
                    continue
                q = bnb.nn.Linear4bit(mod.in_features, mod.out_features, bias=mod.bias is not None,
                                      compute_dtype=mod.weight.dtype, compress_statistics=double_quant,
                                      quant_type="nf4")
                q.weight = bnb.nn.Params4bit(mod.weight.data.float(), requires_grad=False, blocksize=block_size,
                                             compress_statistics=double_quant, quant_type="nf4")
                if mod.bias is not None:
                    q.bias = torch.nn.Parameter(mod.bias.data, requires_grad=False)
                setattr(parent, name, q.to(mod.weight.device))
    return net


def nf4_model_bytes(net: Any) -> int:
    """Bytes of a model's parameters with 4-bit weights: packed codes + absmax constants (both levels).

    Introduced in Chapter 9. Counts each ``Params4bit``'s ``quant_state`` (uint8 or fp32 absmax, the
    second-level fp32 absmax and the fp32 offset with double quantization); the 16-entry code is shared.
    """
    total = 0
    for p in net.parameters():
        total += p.numel() * p.element_size()
        qs = getattr(p, "quant_state", None)
        if qs is not None:
            total += qs.absmax.numel() * qs.absmax.element_size()
            if qs.nested:
                total += qs.state2.absmax.numel() * qs.state2.absmax.element_size() + 4
    return total
