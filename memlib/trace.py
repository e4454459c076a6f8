"""Measure a real training step: live-tensor tracing on the meta device (or real CPU tensors) (Chapter 1).

The tracer runs one transformers model built from a config through forward + loss + backward +
``optimizer.step()`` + ``zero_grad(set_to_none=True)`` twice, and reports the peak of live tensor bytes
in the second (steady-state) step, by category. On the ``meta`` device no memory is allocated and no
weights exist, so a 70B model traces in seconds on a laptop. torch and transformers are imported lazily.
"""
from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .categories import MemCategory
from .configs import ModelConfig, load_config
from .errors import MemlibError, check_choice, check_positive

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = ["TraceResult", "MemoryTracker", "build_model", "trace_training", "TRACE_PRECISIONS", "TRACE_OPTIMIZERS"]

TRACE_PRECISIONS = ("fp32", "fp16-mixed", "bf16-mixed", "bf16", "fp16")
TRACE_OPTIMIZERS = ("sgd", "sgd-momentum", "adamw", "adamw-8bit")


def _torch() -> Any:
    try:
        import torch
    except ImportError:  # pragma: no cover - exercised only without torch
        raise ImportError("memlib.trace needs PyTorch: pip install torch") from None
    return torch


@dataclass(frozen=True)
class TraceResult:
    """Peak memory of a measured training step. Introduced in Chapter 1.

    Attributes:
        peak_bytes: steady-state peak of live tensor bytes on the traced device.
        by_category: bytes per :class:`MemCategory` value at the moment of the peak.
        peak_phase: ``"forward"``, ``"backward"`` or ``"optimizer"``: where the peak happened.
        device: the device traced (``"meta"``, ``"cpu"``, ``"cuda"``).
        settings: the settings traced (model, batch, seq, precision, optimizer, attention, recompute).
    """

    peak_bytes: int
    by_category: dict[str, int]
    peak_phase: str
    device: str
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def params_bytes(self) -> int:
        """Parameter bytes at the peak."""
        return self.by_category[MemCategory.PARAM.value]

    @property
    def grads_bytes(self) -> int:
        """Gradient bytes at the peak."""
        return self.by_category[MemCategory.GRAD.value]

    @property
    def optimizer_bytes(self) -> int:
        """Optimizer-state bytes (fp32 master weights included) at the peak."""
        return self.by_category[MemCategory.OPTIMIZER.value]

    @property
    def activations_bytes(self) -> int:
        """Bytes of tensors saved by the forward pass still alive at the peak."""
        return self.by_category[MemCategory.ACTIVATION.value]

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready dict: ``peak_bytes``, ``<category>_bytes``, ``peak_phase``, ``device``, settings."""
        out: dict[str, Any] = {"peak_bytes": self.peak_bytes}
        out.update({f"{k}_bytes": v for k, v in self.by_category.items()})
        out["peak_phase"] = self.peak_phase
        out["device"] = self.device
        out.update(self.settings)
        return out


class MemoryTracker:
    """Track live tensor storages on one device type with a TorchDispatchMode and weak references.

    Each op's outputs are registered once per storage (views share their base's storage), under the
    category of the current phase; a weak-reference finalizer removes the bytes when the storage dies.
    ``reclassify`` moves a storage to another category (a gradient that becomes ``param.grad``).
    """

    def __init__(self, device_type: str) -> None:
        self.device_type = device_type
        self.live: dict[int, tuple[int, MemCategory]] = {}
        self.totals: dict[MemCategory, int] = {c: 0 for c in MemCategory}
        self.total = 0
        self.peak = 0
        self.peak_totals: dict[MemCategory, int] = dict(self.totals)
        self.phase = "setup"
        self.peak_phase = "setup"
        self.category = MemCategory.ACTIVATION

    def _release(self, key: int) -> None:
        entry = self.live.pop(key, None)
        if entry is not None:
            self.total -= entry[0]
            self.totals[entry[1]] -= entry[0]

    def register(self, t: Any, category: MemCategory | None = None) -> None:
        """Count the storage of tensor ``t`` (once) under ``category`` (default: the phase's)."""
        torch = _torch()
        if not isinstance(t, torch.Tensor) or t.device.type != self.device_type:
            return
        st = t.untyped_storage()
        key = st._cdata
        if key in self.live:
            return
        nbytes = st.nbytes()
        cat = category or self.category
        self.live[key] = (nbytes, cat)
        self.totals[cat] += nbytes
        self.total += nbytes
        weakref.finalize(st, self._release, key)
        if self.total > self.peak:
            self.peak = self.total
            self.peak_totals = dict(self.totals)
            self.peak_phase = self.phase

    def reclassify(self, t: Any, category: MemCategory) -> None:
        """Move the storage of ``t`` to ``category`` (registering it first if needed)."""
        torch = _torch()
        if not isinstance(t, torch.Tensor) or t.device.type != self.device_type:
            return
        key = t.untyped_storage()._cdata
        if key not in self.live:
            self.register(t, category)
            return
        nbytes, old = self.live[key]
        self.live[key] = (nbytes, category)
        self.totals[old] -= nbytes
        self.totals[category] += nbytes

    def forget(self, t: Any) -> None:
        """Stop counting the storage of ``t`` (e.g. optimizer step counters, which live on the host)."""
        torch = _torch()
        if isinstance(t, torch.Tensor) and t.device.type == self.device_type:
            self._release(t.untyped_storage()._cdata)

    def reset_peak(self) -> None:
        """Start a new peak measurement from the current live bytes."""
        self.peak = self.total
        self.peak_totals = dict(self.totals)
        self.peak_phase = self.phase

    @contextlib.contextmanager
    def phase_of(self, phase: str, category: MemCategory) -> Iterator[None]:
        """Within the block, new storages are counted as ``category`` and peaks are labelled ``phase``."""
        old = (self.phase, self.category)
        self.phase, self.category = phase, category
        try:
            yield
        finally:
            self.phase, self.category = old

    def mode(self) -> Any:
        """The TorchDispatchMode that registers every op's outputs."""
        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.utils._pytree import tree_leaves

        tracker = self

        class _Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
                out = func(*args, **(kwargs or {}))
                for t in tree_leaves(out):
                    tracker.register(t)
                return out

        return _Mode()


def _flash_sdpa(query: Any, key: Any, value: Any, attn_mask: Any = None, dropout_p: float = 0.0,
                is_causal: bool = False, scale: float | None = None, enable_gqa: bool = False) -> Any:
    """scaled_dot_product_attention through the flash kernel's op: saves only output and log-sum-exp.

    On meta tensors PyTorch's SDPA falls back to the math path (it materializes the s×s scores); on CPU
    and CUDA tensors it runs a flash kernel. Routing to ``aten._scaled_dot_product_flash_attention_for_cpu``
    (which has meta and CPU kernels and supports grouped-query attention) makes the trace hold what the
    flash kernels hold.
    """
    torch = _torch()
    if query.device.type == "cpu":
        # The CPU flash kernel has no dropout; CUDA's keeps only an RNG state for it, so the memory held is
        # the same without it. (A memory trace, not a numerics check.)
        dropout_p = 0.0
    out, _lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        query, key, value, dropout_p, is_causal, attn_mask=attn_mask, scale=scale
    )
    return out


def _fused_dropout(input: Any, p: float = 0.5, training: bool = True, inplace: bool = False) -> Any:
    """Dropout as CUDA runs it: ``aten.native_dropout``, which saves a 1-byte boolean mask.

    On CPU and meta, ``F.dropout`` decomposes into ``empty_like(x).bernoulli_()`` and saves a mask in the
    input's dtype (2 or 4 bytes); the fused CUDA kernel keeps one byte per element.
    """
    torch = _torch()
    if not training or p == 0.0:
        return input
    out, _mask = torch.ops.aten.native_dropout(input, p, True)
    return out


@contextlib.contextmanager
def _patched(flash_sdpa: bool) -> Iterator[None]:
    """Route SDPA to the flash op (if asked) and skip transformers' packed-sequence probe.

    The probe (``find_packed_sequence_indices``) calls ``.item()``, which meta tensors cannot answer; our
    inputs are one unpacked sequence per row, for which it returns None.
    """
    torch = _torch()
    import transformers.masking_utils as masking

    original_sdpa = torch.nn.functional.scaled_dot_product_attention
    original_dropout = torch.nn.functional.dropout
    original_probe = masking.find_packed_sequence_indices
    masking.find_packed_sequence_indices = lambda position_ids: None
    torch.nn.functional.dropout = _fused_dropout
    if flash_sdpa:
        torch.nn.functional.scaled_dot_product_attention = _flash_sdpa
    try:
        yield
    finally:
        torch.nn.functional.scaled_dot_product_attention = original_sdpa
        torch.nn.functional.dropout = original_dropout
        masking.find_packed_sequence_indices = original_probe


def build_model(model: str | Path | dict[str, Any] | ModelConfig, *, device: str = "meta",
                dtype: str = "fp32", attention: str = "sdpa", overrides: dict[str, Any] | None = None) -> Any:
    """Build the transformers causal-LM model of a config, without downloading anything.

    Introduced in Chapter 1.

    Args:
        model: shipped name, config.json path, dict or ModelConfig.
        device: ``"meta"`` (no memory), ``"cpu"`` or ``"cuda"``.
        dtype: ``"fp32"``, ``"bf16"`` or ``"fp16"``.
        attention: ``"eager"`` or ``"sdpa"`` (transformers' ``attn_implementation``).
        overrides: config fields to replace (e.g. ``{"num_hidden_layers": 2}``).

    Returns:
        The ``torch.nn.Module`` in train mode.
    """
    torch = _torch()
    check_choice("attention", attention, ("eager", "sdpa"))
    check_choice("dtype", dtype, ("fp32", "bf16", "fp16"))
    cfg = load_config(model)
    raw = dict(cfg.raw)
    raw.update(overrides or {})
    load_config(raw)  # validate the overridden config
    try:
        import transformers
    except ImportError:  # pragma: no cover
        raise ImportError("building models needs transformers: pip install transformers") from None
    transformers.logging.set_verbosity_error()
    hf_cfg = transformers.AutoConfig.for_model(**raw)
    hf_cfg._attn_implementation = attention
    hf_cfg.use_cache = False
    torch_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    with torch.device(device):
        net = transformers.AutoModelForCausalLM.from_config(hf_cfg, attn_implementation=attention)
    net = net.to(torch_dtype)
    net.train()
    return net


def _make_optimizer(name: str, params: list[Any]) -> Any:
    torch = _torch()
    if name == "sgd":
        return torch.optim.SGD(params, lr=1e-3, foreach=True)
    if name == "sgd-momentum":
        return torch.optim.SGD(params, lr=1e-3, momentum=0.9, foreach=True)
    if name == "adamw":
        # foreach=True is PyTorch's default on CUDA; set it explicitly so meta and CPU traces match a GPU.
        return torch.optim.AdamW(params, lr=1e-4, foreach=True)
    try:
        import bitsandbytes as bnb
    except ImportError:  # pragma: no cover
        raise ImportError("adamw-8bit needs bitsandbytes: pip install bitsandbytes") from None
    return bnb.optim.AdamW8bit(params, lr=1e-4)


def trace_training(model: str | Path | dict[str, Any] | ModelConfig, *, batch_size: int = 1, seq_len: int = 512,
                   precision: str = "bf16", optimizer: str = "adamw", attention: str = "sdpa",
                   recompute: str = "none", device: str = "meta", overrides: dict[str, Any] | None = None,
                   seed: int = 0) -> TraceResult:
    """Trace a steady-state training step of the transformers model and return its peak.

    Introduced in Chapter 1. A step is forward + loss (transformers' own causal-LM loss, which upcasts the
    logits to fp32) + backward + ``optimizer.step()`` + ``zero_grad(set_to_none=True)``. Steady state means
    the optimizer states already exist: a warm-up optimizer step on zero gradients creates them exactly as a
    first training step would, then the traced step runs. ``use_cache`` is off, as in training.

    Args:
        model: shipped name, config.json path, dict or ModelConfig.
        batch_size: sequences per step (micro-batch).
        seq_len: tokens per sequence.
        precision: ``fp32``; ``bf16``/``fp16`` (everything in 16 bits, what ``model.to(torch.bfloat16)``
            with ``torch.optim.AdamW`` holds); ``bf16-mixed``/``fp16-mixed`` (16-bit weights and gradients,
            fp32 master weights held by the optimizer, gradients cast to fp32 one tensor at a time).
        optimizer: ``sgd``, ``sgd-momentum``, ``adamw`` (``foreach=True``, the CUDA default) or ``adamw-8bit``
            (bitsandbytes; not on meta).
        attention: ``eager`` (materializes the scores) or ``sdpa`` (flash kernel: output + log-sum-exp).
        recompute: ``none`` or ``full`` (transformers' gradient checkpointing, ``use_reentrant=False``).
        device: ``meta`` (no memory), ``cpu`` (real tensors: small models only) or ``cuda``.
        overrides: config fields to replace, e.g. fewer layers.
        seed: seed for the random inputs and initialization.

    Returns:
        The steady-state peak and its breakdown.

    Limitations:
        Counts tensor storages only: no allocator rounding, CUDA context or library workspaces. With
        ``device="cuda"`` the settings also carry ``cuda_max_memory_allocated`` and ``cuda_max_memory_reserved``
        of the second step, read from the CUDA caching allocator (Chapter 1's lab compares them).
    """
    torch = _torch()
    cfg = load_config(model)
    batch_size = check_positive("batch_size", batch_size)
    seq_len = check_positive("seq_len", seq_len)
    check_choice("precision", precision, TRACE_PRECISIONS)
    check_choice("optimizer", optimizer, TRACE_OPTIMIZERS)
    check_choice("attention", attention, ("eager", "sdpa"))
    check_choice("recompute", recompute, ("none", "full"))
    check_choice("device", device, ("meta", "cpu", "cuda"))
    if optimizer == "adamw-8bit" and device == "meta":
        raise MemlibError("optimizer 'adamw-8bit' cannot be traced on device 'meta'; expected one of: cpu, cuda")
    torch.manual_seed(seed)
    model_dtype = {"fp32": "fp32", "bf16": "bf16", "fp16": "fp16", "bf16-mixed": "bf16", "fp16-mixed": "fp16"}[precision]
    tracker = MemoryTracker(device)
    net = build_model(cfg, device=device, dtype=model_dtype, attention=attention, overrides=overrides)
    if recompute == "full":
        if hasattr(net, "activation_checkpointing_enable"):  # transformers ≥ 5.x name
            net.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:  # pragma: no cover - older transformers
            net.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    params = [p for p in net.parameters() if p.requires_grad]
    for p in params:
        tracker.register(p, MemCategory.PARAM)
    for b in net.buffers():
        tracker.register(b, MemCategory.BUFFER)
    mixed = precision.endswith("-mixed")
    with tracker.mode():
        masters = [p.detach().float().clone() for p in params] if mixed else []
    for m in masters:
        tracker.reclassify(m, MemCategory.OPTIMIZER)
        m.requires_grad_(True)
    # Mixed precision: one optimizer per master tensor, so each step touches only the tensor being updated.
    opts = [_make_optimizer(optimizer, [m]) for m in masters] if mixed else [_make_optimizer(optimizer, params)]
    for p in params:
        p.register_post_accumulate_grad_hook(lambda p: tracker.reclassify(p.grad, MemCategory.GRAD))
    vocab = int(net.config.vocab_size)
    input_ids = torch.randint(0, vocab, (batch_size, seq_len), device=device)  # (B, T)
    tracker.register(input_ids, MemCategory.ACTIVATION)

    def step() -> None:
        with tracker.phase_of("forward", MemCategory.ACTIVATION):
            loss = net(input_ids=input_ids, labels=input_ids).loss
        with tracker.phase_of("backward", MemCategory.TEMP):
            loss.backward()
            del loss
        with tracker.phase_of("optimizer", MemCategory.TEMP):
            if mixed:
                # One tensor at a time: cast its 16-bit gradient to fp32, update the fp32 master, copy back.
                for p, m, opt in zip(params, masters, opts):
                    m.grad = p.grad.float()
                    p.grad = None
                    opt.step()
                    m.grad = None
                    with torch.no_grad():
                        p.copy_(m)
            else:
                opts[0].step()
                opts[0].zero_grad(set_to_none=True)
            net.zero_grad(set_to_none=True)

    # Warm-up: one optimizer step on zero gradients creates the optimizer states exactly as a first training
    # step would (a full first forward/backward would only cost time: nothing else outlives a step).
    for opt in opts:
        for group in opt.param_groups:
            for t in group["params"]:
                t.grad = torch.zeros_like(t)
        opt.step()
        opt.zero_grad(set_to_none=True)
    with _patched(attention == "sdpa"), tracker.mode():
        for state in (st for opt in opts for st in opt.state.values()):
            for name, value in state.items():
                if name == "step":  # a host-side scalar in PyTorch's optimizers, not device memory
                    tracker.forget(value)
                else:
                    tracker.reclassify(value, MemCategory.OPTIMIZER)
        tracker.reset_peak()
        if device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            allocated_before = torch.cuda.memory_allocated()
        step()
    settings = {"model": cfg.name, "batch_size": batch_size, "seq_len": seq_len, "precision": precision,
                "optimizer": optimizer, "attention": attention, "recompute": recompute}
    if device == "cuda":  # the CUDA caching allocator's own view of the same step
        torch.cuda.synchronize()
        settings["cuda_max_memory_allocated"] = int(torch.cuda.max_memory_allocated())
        settings["cuda_max_memory_reserved"] = int(torch.cuda.max_memory_reserved())
        settings["cuda_allocated_before_step"] = int(allocated_before)
        settings["cuda_device_name"] = torch.cuda.get_device_name()
    return TraceResult(peak_bytes=tracker.peak, by_category={c.value: tracker.peak_totals[c] for c in MemCategory},
                       peak_phase=tracker.peak_phase, device=device, settings=settings)
