"""Chapter 4's book helpers: recomputation and offload measured, FLOPs of a checkpointed step.

Book helpers (moved from ``memlib.measure.checkpointing``): only Chapter 4 uses them. :func:`measure_recompute`
and :func:`measure_offload` trace one training step of a real model with
:class:`memlib.measure.tracker.MemoryTracker` under each recomputation mode or with saved activations offloaded to
the CPU; :func:`step_flops` and :func:`stack_flops` count what recomputation adds with
``torch.utils.flop_counter``. torch is imported lazily, inside the functions.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..core.categories import MemCategory
from ..core.configs import ModelConfig, load_config
from ..core.errors import check_positive
from ..measure.checkpointing import (RECOMPUTE_MODES, ModelLike, RecomputeMeasurement, _maybe, _prepare, _run_stack,
                                     _stack, _torch, measure_stack, selective_attention_core)
from ..measure.tracker import MemoryTracker


def measure_recompute(model: ModelLike, *, batch_size: int = 1, seq_len: int = 512, precision: str = "bf16",
                      attention: str = "sdpa", recompute: str = "none", checkpoint_every: int = 1,
                      device: str = "meta", overrides: dict[str, Any] | None = None,
                      seed: int = 0, extrapolate: bool = True) -> RecomputeMeasurement:
    """Trace one forward + loss + backward of a transformers model under a recomputation mode.

    Introduced in Chapter 4. No optimizer step: this isolates what recomputation changes (the saved tensors
    and the backward pass's peak). Use :func:`trace_recompute` for a whole training step.

    Args:
        model: shipped name, config.json path, dict or ModelConfig.
        batch_size: sequences per step.
        seq_len: tokens per sequence.
        precision: model dtype, ``fp32``, ``bf16`` or ``fp16`` (activations have the same dtype).
        attention: ``eager`` or ``sdpa`` (flash kernel, as in :func:`memlib.measure.trace.trace_training`).
        recompute: one of :data:`RECOMPUTE_MODES`.
        checkpoint_every: layers per checkpointed segment with ``recompute="full"``.
        device: ``meta``, ``cpu`` or ``cuda``.
        overrides: config fields to replace (e.g. ``{"num_hidden_layers": 4}``).
        seed: seed for the inputs and initialization.
        extrapolate: on the meta device, for more than 4 layers (and segments of one layer), trace 2, 3 and 4
            layers and extrapolate linearly when the three are exactly affine in the depth (identical layers);
            otherwise trace every layer. The tests compare the two.

    Returns:
        The measurement (bytes).
    """
    from ..measure.trace import _patched

    cfg = load_config(model)
    layer_key = "n_layer" if cfg.model_type == "gpt2" else "num_hidden_layers"
    num_layers = int((overrides or {}).get(layer_key, cfg.num_layers))
    if extrapolate and device == "meta" and num_layers > 4 and (recompute != "full" or checkpoint_every == 1):
        runs = {n: measure_recompute(cfg, batch_size=batch_size, seq_len=seq_len, precision=precision,
                                     attention=attention, recompute=recompute, overrides={**(overrides or {}),
                                                                                          layer_key: n},
                                     seed=seed, extrapolate=False) for n in (2, 3, 4)}
        fields = ("saved_bytes", "activation_peak_bytes", "peak_bytes", "params_bytes")
        vals = {f: [getattr(runs[n], f) for n in (2, 3, 4)] for f in fields}
        if all(v[2] - v[1] == v[1] - v[0] for v in vals.values()):  # exactly affine in the depth
            out = {f: v[0] + (num_layers - 2) * (v[1] - v[0]) for f, v in vals.items()}
            settings = dict(runs[2].settings, overrides=dict(overrides or {}), method="extrapolated")
            return RecomputeMeasurement(settings=settings, **out)
    cfg, net, input_ids = _prepare(model, batch_size, seq_len, precision, attention, recompute, checkpoint_every,
                                   device, overrides, seed)
    tracker = MemoryTracker(device, activation_peak=True)
    params = tracker.track_model(net)
    tracker.track_inputs(input_ids)
    with _patched(attention == "sdpa"), _maybe(recompute == "selective", selective_attention_core), tracker.mode():
        saved = _forward_backward(net, input_ids, tracker, params, contextlib.nullcontext())
    settings = {"model": cfg.name, "batch_size": batch_size, "seq_len": seq_len, "precision": precision,
                "attention": attention, "recompute": recompute, "checkpoint_every": checkpoint_every,
                "device": device, "overrides": dict(overrides or {}), "method": "full"}
    return RecomputeMeasurement(saved_bytes=int(saved), activation_peak_bytes=int(tracker.act_peak),
                                peak_bytes=int(tracker.peak), params_bytes=int(params), settings=settings)


# -------------------------------------------------------------------------------------------------- FLOPs
@dataclass(frozen=True)
class StepFlops:
    """FLOPs of one forward + backward pass, counted by ``FlopCounterMode``. Introduced in Chapter 4.

    Attributes:
        forward: FLOPs of the forward pass (loss included).
        backward: FLOPs of the backward pass, recomputation included.
        settings: the settings counted.
    """

    forward: int
    backward: int
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def total(self) -> int:
        """forward + backward."""
        return self.forward + self.backward



def _forward_backward(net: Any, input_ids: Any, tracker: MemoryTracker, params: int,
                      forward_context: contextlib.AbstractContextManager[Any]) -> int:
    """One traced forward (inside ``forward_context``) and backward of ``net`` on ``input_ids``: the bytes saved for
    backward at the end of the forward pass (the parameters and buffers left out)."""
    tracker.reset_peak()
    with tracker.forward(), forward_context:
        loss = net(input_ids=input_ids, labels=input_ids).loss
    saved = tracker.total - params - tracker.totals[MemCategory.BUFFER]
    with tracker.backward():
        loss.backward()
        del loss
    return int(saved)


def _flop_mapping() -> dict[Any, Any]:
    """FLOP formulas for the CPU flash-attention op the tracer routes SDPA to (FlopCounterMode lacks them)."""
    torch = _torch()
    from torch.utils.flop_counter import sdpa_backward_flop_count, sdpa_flop_count

    aten = torch.ops.aten

    # FlopCounterMode hands custom formulas the shapes of the tensor arguments.
    def fwd(query: Any, key: Any, value: Any, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
        return sdpa_flop_count(query, key, value)

    def bwd(grad_out: Any, query: Any, key: Any, value: Any, *args: Any, out_shape: Any = None,
            **kwargs: Any) -> int:
        return sdpa_backward_flop_count(grad_out, query, key, value)

    return {aten._scaled_dot_product_flash_attention_for_cpu: fwd,
            aten._scaled_dot_product_flash_attention_for_cpu_backward: bwd}


def _count(fn: Callable[[], Any]) -> tuple[Any, int]:
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False, custom_mapping=_flop_mapping())
    with counter:
        out = fn()
    return out, int(counter.get_total_flops())


def step_flops(model: ModelLike, *, batch_size: int = 1, seq_len: int = 512, precision: str = "bf16",
               attention: str = "sdpa", recompute: str = "none", checkpoint_every: int = 1,
               overrides: dict[str, Any] | None = None) -> StepFlops:
    """Count the matmul FLOPs of one forward + backward pass on the meta device. Introduced in Chapter 4.

    ``FlopCounterMode`` counts matmuls and attention kernels (elementwise ops are not counted; they are a few
    percent of a transformer's FLOPs). Recomputation happens inside the backward pass, so it shows up in
    ``backward``.

    Args:
        model: shipped name, config.json path, dict or ModelConfig.
        batch_size: sequences per step.
        seq_len: tokens per sequence.
        precision: model dtype.
        attention: ``eager`` or ``sdpa``.
        recompute: one of :data:`RECOMPUTE_MODES`.
        checkpoint_every: layers per segment with ``recompute="full"``.
        overrides: config fields to replace.

    Returns:
        Forward and backward FLOPs.
    """
    from ..measure.trace import _patched

    cfg, net, input_ids = _prepare(model, batch_size, seq_len, precision, attention, recompute, checkpoint_every,
                                   "meta", overrides, 0)
    with _patched(attention == "sdpa"), _maybe(recompute == "selective", selective_attention_core):
        loss, fwd = _count(lambda: net(input_ids=input_ids, labels=input_ids).loss)
        _, bwd = _count(loss.backward)
    settings = {"model": cfg.name, "batch_size": batch_size, "seq_len": seq_len, "attention": attention,
                "recompute": recompute, "checkpoint_every": checkpoint_every, "overrides": dict(overrides or {})}
    return StepFlops(fwd, bwd, settings)


def stack_flops(num_layers: int, checkpoint_every: int | None, *, width: int = 1024,
                batch_size: int = 64) -> StepFlops:
    """FLOPs of forward + backward of :func:`measure_stack`'s chain. Introduced in Chapter 4."""
    torch = _torch()
    n = check_positive("num_layers", num_layers)
    net = _stack(n, width, "meta", torch.float32)
    x = torch.randn(batch_size, width, device="meta")
    loss, fwd = _count(lambda: _run_stack(net, x, checkpoint_every).square().sum())
    _, bwd = _count(loss.backward)
    return StepFlops(fwd, bwd, {"num_layers": n, "checkpoint_every": checkpoint_every})


# ----------------------------------------------------------------------------------------------- offload
@dataclass(frozen=True)
class OffloadMeasurement:
    """Activation offloading with ``torch.autograd.graph.save_on_cpu`` semantics. Introduced in Chapter 4.

    Attributes:
        memory: the device-memory measurement with offloading on.
        to_host_bytes: bytes copied device → host in the forward pass (and back in the backward pass).
        param_bytes_moved: the part of ``to_host_bytes`` that is parameters (``save_on_cpu`` moves every saved
            tensor, weights included; an offloader that skips parameters moves only the rest).
    """

    memory: RecomputeMeasurement
    to_host_bytes: int
    param_bytes_moved: int

    @property
    def activation_bytes_moved(self) -> int:
        """Bytes moved that are not parameters."""
        return self.to_host_bytes - self.param_bytes_moved


def measure_offload(model: ModelLike, *, batch_size: int = 1, seq_len: int = 512, precision: str = "bf16",
                    attention: str = "sdpa", device: str = "meta", overrides: dict[str, Any] | None = None,
                    seed: int = 0, skip_params: bool = False) -> OffloadMeasurement:
    """Forward + backward with every saved tensor moved to host memory, as ``save_on_cpu`` does.

    Introduced in Chapter 4. ``torch.autograd.graph.save_on_cpu`` packs each tensor autograd saves into a CPU
    copy and unpacks it to the device when the backward pass needs it. The meta device cannot copy to the
    host, so the same hooks are emulated: the pack hook counts the bytes and hands autograd a host stand-in
    that the device tracker does not count; the unpack hook allocates the device copy the backward pass
    reads. A tensor is copied once per op that saves it, and a view copies only its own elements (as
    ``save_on_cpu`` does).

    Args:
        model, batch_size, seq_len, precision, attention: as :func:`step_flops`'s.
        device: ``meta`` or ``cpu``.
        overrides: config fields to replace.
        seed: seed for the inputs and initialization.
        skip_params: leave parameters on the device (``save_on_cpu`` does not: it copies each matmul's weight
            to the host and back every step).

    Returns:
        Device memory with offloading, and the transfer volume.
    """
    torch = _torch()
    from ..measure.trace import _patched

    cfg, net, input_ids = _prepare(model, batch_size, seq_len, precision, attention, "none", 1, device,
                                   overrides, seed)
    tracker = MemoryTracker(device, activation_peak=True)
    params = tracker.track_model(net)
    tracker.track_inputs(input_ids)
    param_keys = {p.untyped_storage()._cdata for p in net.parameters()}
    moved = {"all": 0, "params": 0}

    def pack(t: Any) -> Any:
        if skip_params and t.untyped_storage()._cdata in param_keys:
            return t
        nbytes = t.numel() * t.element_size() if t.device.type == device else 0  # .cpu() copies the view only
        moved["all"] += nbytes
        if t.untyped_storage()._cdata in param_keys:
            moved["params"] += nbytes
        from torch.utils._python_dispatch import _disable_current_modes

        with _disable_current_modes():  # the stand-in for the CPU copy is not device memory: not traced
            host = t.detach().clone()
        return host

    def unpack(host: Any) -> Any:
        if skip_params and host.untyped_storage()._cdata in param_keys:
            return host
        return host.clone()  # the host → device copy the backward pass reads

    with _patched(attention == "sdpa"), tracker.mode():
        hooks = torch.autograd.graph.saved_tensors_hooks(pack, unpack)  # every saved tensor to the host and back
        saved = _forward_backward(net, input_ids, tracker, params, hooks)
    settings = {"model": cfg.name, "batch_size": batch_size, "seq_len": seq_len, "precision": precision,
                "attention": attention, "recompute": "offload", "device": device, "skip_params": skip_params,
                "overrides": dict(overrides or {})}
    mem = RecomputeMeasurement(int(saved), int(tracker.act_peak), int(tracker.peak), int(params), settings)
    return OffloadMeasurement(mem, int(moved["all"]), int(moved["params"]))
