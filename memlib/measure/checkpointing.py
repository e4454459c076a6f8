"""Gradient checkpointing measured: k-layer segments and selective recomputation (Chapter 4, Lab 4).

Measurement module: it runs real PyTorch (imported lazily inside the functions) on the ``meta`` device, where
7B-size shapes cost no memory, or on real CPU/CUDA tensors. Every memory number comes from
:class:`memlib.measure.tracker.MemoryTracker`, every FLOP count from ``torch.utils.flop_counter.FlopCounterMode``.

Recomputation modes (``recompute=``):

* ``none`` — every op's saved tensors are kept for the backward pass.
* ``full`` — ``torch.utils.checkpoint.checkpoint(use_reentrant=False)`` around each run of ``checkpoint_every``
  consecutive decoder layers: the forward pass keeps only each segment's input; the backward pass re-runs one
  segment's forward at a time. ``checkpoint_every=1`` is what transformers' ``gradient_checkpointing_enable()``
  does.
* ``selective`` — Megatron-LM's choice (Korthikanti et al. 2022): only the attention core (QKᵀ, softmax,
  dropout, ·V — or the fused SDPA kernel) runs under a checkpoint; everything else keeps its activations.
* ``sac`` — PyTorch's selective activation checkpoint API
  (``torch.utils.checkpoint.create_selective_checkpoint_contexts``) on each whole layer with an op policy:
  keep the outputs of the projection matmuls, recompute everything else (norms, rotary, activation function,
  the attention core).

The recomputation and offload measurements and the FLOP counts of a checkpointed step, which only Chapter 4 uses,
are book helpers (:mod:`memlib._book.ch04_activations_checkpointing`).
"""
from __future__ import annotations

import contextlib
import functools
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypedDict

from ..core.checkpointing import best_checkpoint_every, largest_batch, segment_layers, segment_peak_bytes
from ..core.choices import MODEL_DTYPES, RECOMPUTE
from ..core.configs import ModelConfig, load_config
from ..core.errors import MemlibError, check_choice, check_positive
from .deps import require_torch
from .results import DATE_FORMAT
from .tracker import MemoryTracker

__all__ = [
    "RECOMPUTE_MODES",
    "RecomputeMeasurement",
    "segment_peak_bytes",
    "best_checkpoint_every",
    "decoder_layers",
    "apply_checkpointing",
    "selective_attention_core",
    "measure_stack",
    "trace_recompute",
    "largest_batch",
    "largest_batch_cuda",
    "time_step",
    "time_stack",
    "gpu_checkpointing_results",
]

RECOMPUTE_MODES = ("none", "full", "selective", "sac")

ModelLike = str | Path | dict[str, Any] | ModelConfig


def _torch() -> Any:
    return require_torch("memlib.measure.checkpointing")


# ------------------------------------------------------------------------------------------ model surgery
def decoder_layers(net: Any) -> Any:
    """The ``nn.ModuleList`` of decoder layers of a transformers causal LM (``model.layers``, ``transformer.h``).

    Introduced in Chapter 4.
    """
    torch = _torch()
    n = int(net.config.num_hidden_layers)
    best = None
    for module in net.modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) == n:
            if best is None:
                best = module
    if best is None:
        raise MemlibError(f"no ModuleList of {n} decoder layers found in {type(net).__name__}")
    return best


def _sac_policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> Any:
    """Keep the outputs of the projection matmuls (``mm``, ``addmm``); recompute everything else.

    The attention core's matmuls run as ``bmm`` (eager) or inside the fused SDPA kernel, so they are
    recomputed along with norms, rotary embeddings and the activation function.
    """
    torch = _torch()
    from torch.utils.checkpoint import CheckpointPolicy

    if op in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default):
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


class _CheckpointOptions(TypedDict, total=False):
    """Optional keyword arguments of ``torch.utils.checkpoint.checkpoint`` that :func:`apply_checkpointing` sets.

    Attributes:
        context_fn: returns the two context managers the forward pass and the recomputation run under.
    """

    context_fn: Callable[[], tuple[contextlib.AbstractContextManager[Any], contextlib.AbstractContextManager[Any]]]


def apply_checkpointing(net: Any, *, recompute: str = "full", checkpoint_every: int = 1) -> Any:
    """Wrap the decoder layers of a transformers model in ``torch.utils.checkpoint`` (``use_reentrant=False``).

    Introduced in Chapter 4. ``recompute="full"``: the first layer of each run of ``checkpoint_every`` layers
    becomes a segment that runs the whole run under one checkpoint; the others pass their input through.
    ``recompute="sac"``: each layer runs under a checkpoint with PyTorch's selective-checkpoint context and
    an op policy that keeps the projection matmuls' outputs and recomputes the rest. ``none`` and
    ``selective`` leave the layers alone (``selective`` acts on the attention function: see
    :func:`selective_attention_core`).

    Args:
        net: a transformers causal LM (from :func:`memlib.measure.trace.build_model`).
        recompute: one of :data:`RECOMPUTE_MODES`.
        checkpoint_every: layers per checkpointed segment (``full`` only).

    Returns:
        ``net``, changed in place.
    """
    _torch()
    from torch import nn
    from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts

    check_choice("recompute", recompute, RECOMPUTE_MODES)
    layers = decoder_layers(net)
    n = len(layers)
    _, k = segment_layers(n, checkpoint_every)
    if recompute in ("none", "selective"):
        return net
    context_fn = (functools.partial(create_selective_checkpoint_contexts, _sac_policy) if recompute == "sac"
                  else None)
    if recompute == "sac":
        k = 1

    class Segment(nn.Module):
        def __init__(self, run: list[Any]) -> None:
            super().__init__()
            self.run = nn.ModuleList(run)

        def _forward(self, hidden_states: Any, *args: Any, **kwargs: Any) -> Any:
            for layer in self.run:
                hidden_states = layer(hidden_states, *args, **kwargs)
            return hidden_states

        def forward(self, hidden_states: Any, *args: Any, **kwargs: Any) -> Any:
            extra: _CheckpointOptions = {"context_fn": context_fn} if context_fn is not None else {}
            return checkpoint(self._forward, hidden_states, *args, use_reentrant=False, **extra, **kwargs)

    class PassThrough(nn.Module):
        def forward(self, hidden_states: Any, *args: Any, **kwargs: Any) -> Any:
            return hidden_states

    new: list[Any] = []
    old = list(layers)
    for start in range(0, n, k):
        new.append(Segment(old[start:start + k]))
        new.extend(PassThrough() for _ in old[start + 1:start + k])
    for i, module in enumerate(new):
        layers[i] = module
    return net


@contextlib.contextmanager
def selective_attention_core() -> Iterator[None]:
    """Within the block, transformers' attention functions run under ``checkpoint(use_reentrant=False)``.

    Introduced in Chapter 4. This is Megatron-LM's selective recomputation: the attention core (QKᵀ, softmax,
    dropout, ·V, or the fused SDPA kernel) keeps only its inputs q, k, v; its internals are recomputed in the
    backward pass. The attention weights are not returned (training never reads them).
    """
    from torch.utils.checkpoint import checkpoint
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    original = ALL_ATTENTION_FUNCTIONS.get_interface

    def get_interface(attn_implementation: str, default: Callable[..., Any]) -> Callable[..., Any]:
        core = original(attn_implementation, default)

        def checkpointed(module: Any, query: Any, key: Any, value: Any, attention_mask: Any, **kwargs: Any) -> Any:
            def run(q: Any, k: Any, v: Any, mask: Any) -> Any:
                return core(module, q, k, v, mask, **kwargs)[0]

            return checkpoint(run, query, key, value, attention_mask, use_reentrant=False), None

        return checkpointed

    ALL_ATTENTION_FUNCTIONS.get_interface = get_interface  # type: ignore[method-assign]
    try:
        yield
    finally:
        del ALL_ATTENTION_FUNCTIONS.get_interface


# ------------------------------------------------------------------------------------------- measurement
@dataclass(frozen=True)
class RecomputeMeasurement:
    """Memory of one forward + backward pass (no optimizer), measured by the tracer. Introduced in Chapter 4.

    Attributes:
        saved_bytes: bytes alive at the end of the forward pass besides parameters and buffers: what the
            backward pass will read (saved activations, segment inputs, the loss's fp32 log-softmax, inputs).
        activation_peak_bytes: peak over forward + backward of all bytes that are not parameters, buffers or
            accumulated parameter gradients (saved activations + recomputed ones + backward temporaries).
        peak_bytes: peak of all live bytes over forward + backward (parameters and gradients included).
        params_bytes: parameter bytes.
        settings: the settings measured.
    """

    saved_bytes: int
    activation_peak_bytes: int
    peak_bytes: int
    params_bytes: int
    settings: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return asdict(self)


def _model_dtype(precision: str) -> str:
    check_choice("precision", precision, MODEL_DTYPES)
    return precision


@contextlib.contextmanager
def _maybe(flag: bool, cm: Callable[[], Any]) -> Iterator[None]:
    if flag:
        with cm():
            yield
    else:
        yield


def _prepare(model: ModelLike, batch_size: int, seq_len: int, precision: str, attention: str, recompute: str,
             checkpoint_every: int, device: str, overrides: dict[str, Any] | None, seed: int) -> tuple[Any, Any, Any]:
    torch = _torch()
    from ..measure.trace import build_model

    check_positive("batch_size", batch_size)
    check_positive("seq_len", seq_len)
    check_choice("recompute", recompute, RECOMPUTE_MODES)
    check_choice("device", device, ("meta", "cpu", "cuda"))
    cfg = load_config(model)
    torch.manual_seed(seed)
    net = build_model(cfg, device=device, dtype=_model_dtype(precision), attention=attention, overrides=overrides)
    apply_checkpointing(net, recompute=recompute, checkpoint_every=checkpoint_every)
    input_ids = torch.randint(0, int(net.config.vocab_size), (batch_size, seq_len), device=device)  # (B, T)
    return cfg, net, input_ids


class _TraceOptions(TypedDict):
    """The settings :func:`trace_recompute` hands :func:`memlib.measure.trace.trace_training` whatever the mode."""

    batch_size: int
    seq_len: int
    precision: str
    optimizer: str
    attention: str
    device: str
    overrides: dict[str, Any] | None
    seed: int
    optimizer_impl: str
    framework: str


def trace_recompute(model: ModelLike, *, batch_size: int = 1, seq_len: int = 512, precision: str = "bf16",
                    optimizer: str = "adamw", attention: str = "sdpa", recompute: str = "none",
                    checkpoint_every: int = 1, device: str = "meta", overrides: dict[str, Any] | None = None,
                    seed: int = 0, optimizer_impl: str = "foreach", framework: str = "pytorch") -> Any:
    """:func:`memlib.measure.trace.trace_training` of a whole step under any recomputation mode and interval.

    Introduced in Chapter 4 (to check ``estimate_training(recompute=..., checkpoint_every=...)``). The model
    that ``trace_training`` builds is wrapped by :func:`apply_checkpointing` (its ``model_hook``); ``selective`` runs under
    :func:`selective_attention_core`. ``optimizer_impl`` and ``framework`` go to ``trace_training`` as they are
    (``optimizer_impl="fused"``: ``torch.optim.AdamW(fused=True)``, whose step makes no full-size temporary, so
    the recomputation's trade-off, not the optimizer step, sets the peak).

    Returns:
        A :class:`memlib.measure.trace.TraceResult` whose settings also carry ``checkpoint_every``.
    """
    from .trace import TraceResult, trace_training

    check_choice("recompute", recompute, RECOMPUTE_MODES)
    kw: _TraceOptions = dict(batch_size=batch_size, seq_len=seq_len, precision=precision, optimizer=optimizer,
                             attention=attention, device=device, overrides=overrides, seed=seed,
                             optimizer_impl=optimizer_impl, framework=framework)
    if recompute == "none" or (recompute == "full" and checkpoint_every == 1):
        # transformers' own gradient checkpointing is our k = 1 (byte for byte, see the tests); trace_training
        # may then extrapolate from 2-4 traced layers, which segments of k > 1 layers would break.
        res = trace_training(model, recompute=recompute, **kw)
    else:
        def wrap(net: Any) -> Any:
            return apply_checkpointing(net, recompute=recompute, checkpoint_every=checkpoint_every)

        with _maybe(recompute == "selective", selective_attention_core):
            res = trace_training(model, recompute="none", extrapolate=False, model_hook=wrap, **kw)
    settings = dict(res.settings, recompute=recompute, checkpoint_every=checkpoint_every)
    return TraceResult(res.peak_bytes, res.by_category, res.peak_phase, res.device, settings, res.method)


# ------------------------------------------------------------------------------------------------ a chain
def _stack(num_layers: int, width: int, device: str, dtype: Any) -> Any:
    torch = _torch()
    layers = []
    for _ in range(num_layers):
        layers += [torch.nn.Linear(width, width, bias=False, device=device, dtype=dtype), torch.nn.Tanh()]
    return torch.nn.Sequential(*layers)


def _run_stack(net: Any, x: Any, checkpoint_every: int | None) -> Any:
    from torch.utils.checkpoint import checkpoint

    blocks = [net[i:i + 2] for i in range(0, len(net), 2)]
    if checkpoint_every is None:
        for blk in blocks:
            x = blk(x)
        return x
    k = checkpoint_every
    for start in range(0, len(blocks), k):
        seg = blocks[start:start + k]

        def run(h: Any, seg: list[Any] = seg) -> Any:
            for blk in seg:
                h = blk(h)
            return h

        x = checkpoint(run, x, use_reentrant=False)
    return x


def measure_stack(num_layers: int, checkpoint_every: int | None, *, width: int = 1024, batch_size: int = 64,
                  device: str = "meta", seed: int = 0) -> RecomputeMeasurement:
    """Forward + backward of a chain of ``Linear → tanh`` layers, checkpointed every k layers (None: never).

    Introduced in Chapter 4: Chen et al. (2016)'s setting, where each layer saves one tensor the size of its
    input (the tanh output, which is also the next Linear's input), so k = √L minimizes memory.

    Args:
        num_layers: L.
        checkpoint_every: k, layers per checkpointed segment, or None for no checkpointing.
        width: features per layer.
        batch_size: rows of the input; one layer's activation is batch_size·width·4 bytes (fp32).
        device: ``meta`` or ``cpu``.
        seed: seed for the weights and input.

    Returns:
        The measurement; ``saved_bytes`` and ``activation_peak_bytes`` include the input.
    """
    torch = _torch()
    n = check_positive("num_layers", num_layers)
    if checkpoint_every is not None:
        segment_layers(n, checkpoint_every)  # 1 ≤ k ≤ L
    torch.manual_seed(seed)
    net = _stack(n, width, device, torch.float32)
    x = torch.randn(batch_size, width, device=device)  # (B, C)
    tracker = MemoryTracker(device, activation_peak=True)
    params = tracker.track_model(net)
    tracker.track_inputs(x)
    with tracker.mode():
        tracker.reset_peak()
        with tracker.forward():
            loss = _run_stack(net, x, checkpoint_every).square().sum()
        saved = tracker.total - params
        with tracker.backward():
            loss.backward()
            del loss
    settings = {"num_layers": n, "checkpoint_every": checkpoint_every, "width": width, "batch_size": batch_size}
    return RecomputeMeasurement(int(saved), int(tracker.act_peak), int(tracker.peak), int(params), settings)


# --- the GPU lab's measurements (were memlib.measure.checkpointing_lab) ---
def _cuda_step_fits(model: ModelLike, batch_size: int, seq_len: int, recompute: str, checkpoint_every: int,
                    overrides: dict[str, Any] | None, state: dict[str, Any]) -> bool:
    torch = _torch()
    from .trace import build_model

    if "net" not in state:
        net = build_model(model, device="cuda", dtype="bf16", attention="sdpa", overrides=overrides)
        apply_checkpointing(net, recompute=recompute, checkpoint_every=checkpoint_every)
        state["net"] = net
        state["opt"] = torch.optim.AdamW(net.parameters(), lr=1e-5, foreach=True)
    net, opt = state["net"], state["opt"]
    ids = None
    try:
        ids = torch.randint(0, int(net.config.vocab_size), (batch_size, seq_len), device="cuda")
        with _maybe(recompute == "selective", selective_attention_core):
            for _ in range(2):  # the second step runs with the optimizer states in place
                loss = net(input_ids=ids, labels=ids).loss
                loss.backward()
                del loss
                opt.step()
                opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        return True
    except torch.cuda.OutOfMemoryError:
        return False
    finally:
        del ids
        opt.zero_grad(set_to_none=True)
        torch.cuda.empty_cache()


def largest_batch_cuda(model: ModelLike, *, seq_len: int = 1024, recompute: str = "none",
                       checkpoint_every: int = 1, overrides: dict[str, Any] | None = None,
                       max_batch: int = 1024) -> int:
    """The largest batch that trains (two bf16 AdamW steps) on the current GPU without running out of memory.

    Introduced in Chapter 4's lab. Binary search on real steps, catching ``torch.cuda.OutOfMemoryError``;
    needs CUDA. Weights are bf16 with ``torch.optim.AdamW`` states in bf16 (``precision="bf16"`` in the
    estimator).
    """
    torch = _torch()
    if not torch.cuda.is_available():
        raise MemlibError("largest_batch_cuda needs a CUDA GPU; torch.cuda.is_available() is False")
    check_choice("recompute", recompute, RECOMPUTE_MODES)
    state: dict[str, Any] = {}
    try:
        return largest_batch(lambda b: _cuda_step_fits(model, b, seq_len, recompute, checkpoint_every, overrides,
                                                       state), max_batch=max_batch)
    finally:
        state.clear()
        torch.cuda.empty_cache()


def time_step(model: ModelLike, *, batch_size: int = 1, seq_len: int = 128, precision: str = "fp32",
              attention: str = "sdpa", recompute: str = "none", checkpoint_every: int = 1,
              overrides: dict[str, Any] | None = None, device: str = "cpu", repeats: int = 3) -> float:
    """Median wall-clock seconds of a forward + backward pass on real tensors. Introduced in Chapter 4.

    Timings are noisy (shared CPUs); compare ratios measured in one run, not absolute seconds.
    """
    torch = _torch()
    from .trace import _patched

    check_choice("device", device, ("cpu", "cuda"))
    _, net, input_ids = _prepare(model, batch_size, seq_len, precision, attention, recompute, checkpoint_every,
                                 device, overrides, 0)
    with _patched(attention == "sdpa"), _maybe(recompute == "selective", selective_attention_core):
        return _median_seconds(lambda: net(input_ids=input_ids, labels=input_ids).loss.backward(), net, device,
                               repeats)


def _median_seconds(step: Any, net: Any, device: str, repeats: int) -> float:
    """Median seconds of ``step()`` (then the gradients are dropped) over ``repeats`` runs after one warm-up."""
    torch = _torch()
    times = []
    for i in range(check_positive("repeats", repeats) + 1):
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        net.zero_grad(set_to_none=True)
        if device == "cuda":
            torch.cuda.synchronize()
        if i:  # the first run warms up
            times.append(time.perf_counter() - t0)
    return float(statistics.median(times))


def time_stack(num_layers: int, checkpoint_every: int | None, *, width: int = 256, batch_size: int = 1024,
               device: str = "cpu", repeats: int = 3, seed: int = 0) -> float:
    """Median seconds of forward + backward of :func:`measure_stack`'s chain on real tensors. Chapter 4's lab.

    Timings are noisy (shared CPUs); compare ratios measured in one run, not absolute seconds.
    """
    torch = _torch()
    check_choice("device", device, ("cpu", "cuda"))
    n = check_positive("num_layers", num_layers)
    torch.manual_seed(seed)
    net = _stack(n, width, device, torch.float32)
    x = torch.randn(batch_size, width, device=device)
    return _median_seconds(lambda: _run_stack(net, x, checkpoint_every).square().sum().backward(), net, device,
                           repeats)


def gpu_checkpointing_results(model: ModelLike = "gpt2-medium", *, seq_len: int = 1024,
                              max_batch: int = 512) -> dict[str, Any]:
    """Chapter 4 lab's GPU run: largest batch with and without recomputation, measured and predicted.

    Introduced in Chapter 4's lab. For each of ``none``, ``selective``, ``full``: the largest batch that trains
    on this GPU (binary search catching ``torch.cuda.OutOfMemoryError``), the largest batch whose traced step
    fits in the GPU's total memory, and step times at a fixed batch. Returns a JSON-ready dict with the device
    name, torch version and date; the lab writes it to ``labs/results/checkpointing.json``.
    """
    torch = _torch()

    if not torch.cuda.is_available():
        raise MemlibError("gpu_checkpointing_results needs a CUDA GPU; torch.cuda.is_available() is False")
    total = int(torch.cuda.get_device_properties(0).total_memory)
    free, _ = torch.cuda.mem_get_info()
    rows = []
    for recompute in RECOMPUTE:
        measured = largest_batch_cuda(model, seq_len=seq_len, recompute=recompute, max_batch=max_batch)
        budget = int(free)
        traced = largest_batch(lambda b: trace_recompute(model, batch_size=b, seq_len=seq_len, precision="bf16",
                                                         recompute=recompute).peak_bytes <= budget,
                               max_batch=max_batch, guess=measured)
        step_s = time_step(model, batch_size=max(1, min(measured, 8)), seq_len=seq_len, precision="bf16",
                           recompute=recompute, device="cuda")
        rows.append({"recompute": recompute, "largest_batch_measured": measured,
                     "largest_batch_traced": traced, "step_time_s": step_s,
                     "step_time_batch": max(1, min(measured, 8))})
    chain = []
    for k in (None, 1, 2, 4, 8, 16, 32, 64):
        m = measure_stack(64, k, width=1024, batch_size=8192, device="meta")
        chain.append({"checkpoint_every": k, "activation_peak_bytes": m.activation_peak_bytes,
                      "step_time_s": time_stack(64, k, width=1024, batch_size=8192, device="cuda", repeats=5)})
    return {"model": load_config(model).name, "seq_len": seq_len, "device": torch.cuda.get_device_name(),
            "chain_64_layers": chain,
            "total_memory_bytes": total, "free_memory_bytes": int(free), "torch": torch.__version__,
            "date": time.strftime(DATE_FORMAT, time.gmtime()), "rows": rows}
