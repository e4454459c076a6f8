"""Measure a real training step: live-tensor tracing on the meta device (or real CPU tensors) (Chapter 1).

The tracer runs one transformers model built from a config through forward + loss + backward +
``optimizer.step()`` + ``zero_grad(set_to_none=True)`` twice, and reports the peak of live tensor bytes
in the second (steady-state) step, by category. On the ``meta`` device no memory is allocated and no
weights exist, so a 70B model traces in seconds on a laptop. Mixed precision runs a framework's recipe
(``framework``): PyTorch AMP (``torch.autocast``, emulated on meta by :mod:`memlib.measure.autocast`),
DeepSpeed's ZeRO-1/2 optimizer on one rank, or PyTorch's FSDP2 (``fully_shard``, real tensors only)
(:mod:`memlib.measure.recipes`). torch and transformers are imported lazily.
"""
from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from ..core.categories import MemCategory
from ..core.choices import ATTENTION, FRAMEWORKS, OPTIMIZER_IMPLS, OPTIMIZERS
from ..core.configs import ModelConfig, check_seq_len, load_config
from ..core.errors import MemlibError, check_choice, check_positive
from ..core.tracing import TraceResult
from ..core.tracing import extrapolate_segments as _extrapolate
from .deps import require_torch
from .hf_config import _CLASSES, _decoder_layers, build_model, load_any_config  # re-exported: build_model
from . import tracker as _tracker
from .autocast import AUTOCAST_DEVICES, cast_like_autocast, emulated
from .recipes import (_ddp_group, _ddp_wrap, _deepspeed_setup, _deepspeed_step, _fp16_optimizer_step,
                      _fsdp2_group, _fsdp2_shard, _fsdp2_storage_hooks, _grad_scaler, _init_fused_state, _make_optimizer, _megatron_setup,
                      _megatron_step)
from .tracker import MemoryTracker, _cached_meta_mode

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = ["TraceResult", "MemoryTracker", "build_model", "trace_training", "TRACE_PRECISIONS", "TRACE_OPTIMIZERS",
           "TRACE_FRAMEWORKS", "TRACE_DATA_PARALLEL"]

TRACE_PRECISIONS = ("fp32", "fp16-mixed", "bf16-mixed", "bf16", "fp16")
TRACE_OPTIMIZERS = OPTIMIZERS
#: The frameworks whose training recipe :func:`trace_training` runs (of :data:`memlib.core.choices.FRAMEWORKS`).
TRACE_FRAMEWORKS = FRAMEWORKS
#: The precisions FSDP2 is traced in (:func:`memlib.measure.recipes._fsdp2_shard`).
FSDP2_PRECISIONS = ("bf16-mixed", "fp32", "bf16")
#: The data-parallel wrappers :func:`trace_training` runs: none, or PyTorch's DistributedDataParallel (one rank).
TRACE_DATA_PARALLEL = ("none", "ddp")


def _torch() -> Any:
    return require_torch("memlib.measure.trace")


def _flash_sdpa(query: Any, key: Any, value: Any, attn_mask: Any = None, dropout_p: float = 0.0,
                is_causal: bool = False, scale: float | None = None, enable_gqa: bool = False) -> Any:
    """scaled_dot_product_attention through the flash kernel's op: saves only output and log-sum-exp.

    On meta tensors PyTorch's SDPA falls back to the math path (it materializes the s×s scores); on CPU
    and CUDA tensors it runs a flash kernel. Routing to ``aten._scaled_dot_product_flash_attention_for_cpu``
    (which has meta and CPU kernels and supports grouped-query attention) makes the trace hold what the
    flash kernels hold.
    """
    torch = _torch()
    if query.device.type not in ("cpu", "meta"):  # CUDA: PyTorch's own SDPA picks its flash kernel
        return _ORIGINAL_SDPA(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                              scale=scale, enable_gqa=enable_gqa)
    # Under autocast (real on CPU, emulated on meta) the inputs are cast as autocast casts them for
    # scaled_dot_product_attention, a lower-precision op on CPU and CUDA alike; the flash op is on no list.
    query, key, value, attn_mask = cast_like_autocast(query, key, value, attn_mask)
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        # As torch's own SDPA does before any kernel (convert_boolean_attn_mask): a boolean mask (sliding-window
        # layers, padding) becomes an additive mask in the query's dtype, made per call and saved for backward;
        # the CPU flash op refuses a boolean one.
        additive = torch.zeros_like(attn_mask, dtype=query.dtype)
        attn_mask = additive.masked_fill_(attn_mask.logical_not(), float("-inf"))
    if query.device.type == "cpu":
        # The CPU flash kernel has no dropout; CUDA's keeps only an RNG state for it, so the memory held is
        # the same without it. (A memory trace, not a numerics check.)
        dropout_p = 0.0
    dv = value.shape[-1]
    if dv != query.shape[-1]:
        # MLA (DeepSeek) has value heads narrower than query/key heads; the flash op wants one head width, so v
        # is zero-padded and the output cut back (a limitation: v and the output are kept at the q/k width).
        value = torch.nn.functional.pad(value, (0, query.shape[-1] - dv))
    out, _lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        query, key, value, dropout_p, is_causal, attn_mask=attn_mask, scale=scale
    )
    return out if out.shape[-1] == dv else out[..., :dv]


_ORIGINAL_SDPA: Any = None  # torch's scaled_dot_product_attention, set while _patched is active
_ORIGINAL_GROUPED_MM: Any = None  # torch's grouped_mm, set while _patched is active


def _meta_grouped_mm(mat_a: Any, mat_b: Any, *, offs: Any = None, bias: Any = None, out_dtype: Any = None) -> Any:
    """``torch.nn.functional.grouped_mm`` (MoE experts) on meta tensors of any dtype.

    transformers runs a MoE layer's experts as grouped matrix products over all b·s·k (token, expert) pairs
    sorted by expert: the tensors' sizes do not depend on how the router splits the tokens, so a meta trace
    (no values, no routing) holds what any routing holds, balanced routing (b·s·k/E tokens per expert)
    included. PyTorch's meta kernel accepts only bf16; for fp32/fp16 this autograd function makes outputs and
    gradients of the same shapes as the real op, saving its two inputs as the real op does.
    """
    torch = _torch()
    if mat_a.device.type != "meta" or (mat_a.dtype == torch.bfloat16 and mat_b.dtype == torch.bfloat16):
        return _ORIGINAL_GROUPED_MM(mat_a, mat_b, offs=offs, bias=bias, out_dtype=out_dtype)

    function: Any = torch.autograd.Function

    class _GroupedMM(function):
        @staticmethod
        def forward(ctx: Any, a: Any, b: Any) -> Any:
            ctx.save_for_backward(a, b)
            return a.new_empty((a.shape[0], b.shape[-1]), dtype=out_dtype or a.dtype)

        @staticmethod
        def backward(ctx: Any, grad: Any) -> Any:
            a, b = ctx.saved_tensors
            return grad.new_empty(a.shape, dtype=a.dtype), grad.new_empty(b.shape, dtype=b.dtype)

    out = _GroupedMM.apply(mat_a, mat_b)
    return out if bias is None else out + bias


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

    global _ORIGINAL_SDPA, _ORIGINAL_GROUPED_MM
    original_sdpa = _ORIGINAL_SDPA = torch.nn.functional.scaled_dot_product_attention
    original_grouped_mm = _ORIGINAL_GROUPED_MM = getattr(torch.nn.functional, "grouped_mm", None)
    if original_grouped_mm is not None:
        torch.nn.functional.grouped_mm = _meta_grouped_mm
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
        if original_grouped_mm is not None:
            torch.nn.functional.grouped_mm = original_grouped_mm
        torch.nn.functional.dropout = original_dropout
        masking.find_packed_sequence_indices = original_probe


def trace_training(model: str | Path | dict[str, Any] | ModelConfig, *, batch_size: int = 1, seq_len: int = 512,
                   precision: str = "bf16", optimizer: str = "adamw", attention: str = "sdpa",
                   recompute: str = "none", device: str = "meta", overrides: dict[str, Any] | None = None,
                   seed: int = 0, extrapolate: bool = True,
                   model_hook: Callable[[Any], Any] | None = None, optimizer_impl: str = "foreach",
                   framework: str = "pytorch", autocast_lists: str = "cuda",
                   zero_stage: int | None = None, data_parallel: str = "none",
                   gradient_as_bucket_view: bool = False, reserved: bool = False,
                   expandable_segments: bool = False) -> TraceResult:
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
            with ``torch.optim.AdamW`` holds); ``bf16-mixed``/``fp16-mixed``: mixed precision as
            ``framework`` runs it (below).
        optimizer: ``sgd``, ``sgd-momentum``, ``adamw`` (``foreach=True``, the CUDA default) or ``adamw-8bit``
            (bitsandbytes; not on meta).
        attention: ``eager`` (materializes the scores) or ``sdpa`` (flash kernel: output + log-sum-exp).
        recompute: ``none`` or ``full`` (transformers' gradient checkpointing, ``use_reentrant=False``).
        device: ``meta`` (no memory), ``cpu`` (real tensors: small models only) or ``cuda``.
        overrides: config fields to replace, e.g. fewer layers.
        seed: seed for the random inputs and initialization.
        extrapolate: on the meta device, for models of more than 5 layers, trace the same model with 3, 4
            and 5 layers and extrapolate to all of them. The decoder layers are identical, so every
            segment's maximum (a layer's forward, its backward, its optimizer step, the rest) is an affine
            function of the layer index and the depth; the fit is checked exactly (integers) on all traced
            points and the full trace runs instead if any point disagrees. The tests compare the two.
        model_hook: called with the freshly built model; returns the model to trace (Chapter 4 wraps runs
            of decoder layers in ``torch.utils.checkpoint`` this way).
        optimizer_impl: torch.optim.AdamW's implementation: ``foreach`` (``foreach=True``), ``fused``
            (``fused=True``; on meta its states are made as ``Adam._init_group`` makes them, so torch's device
            check, which refuses meta, is skipped and ``aten._fused_adamw_``'s meta kernel runs) or ``for-loop``
            (``foreach=False, fused=False``). SGD and adamw-8bit ignore it.
        framework: whose mixed-precision recipe runs (:data:`TRACE_FRAMEWORKS`; fp32 and pure 16-bit steps
            are the same in both):

            * ``pytorch``: ``torch.autocast`` AMP. The model stays fp32; forward and loss run under
              ``torch.autocast(device, dtype)`` (on meta, :mod:`memlib.measure.autocast`'s emulation), backward
              outside it; gradients are fp32 and the optimizer steps the fp32 parameters directly, so the step
              holds 4 B/param weights, 4 B/param gradients and the optimizer's states plus the chosen
              implementation's temporaries; autograd saves the 16-bit copies of the weights autocast made.
              ``fp16-mixed`` adds ``torch.amp.GradScaler`` (scale, growth tracker, found-inf flags; ``step``
              unscales the gradients in place with ``_amp_foreach_non_finite_check_and_unscale_``, or hands
              scale and flag to the fused kernel). On meta, where no value says whether a gradient overflowed,
              the scaler always steps.
            * ``deepspeed``: the ZeRO stage 1/2 optimizer of one rank (``DeepSpeedZeroOptimizer``,
              ``deepspeed/runtime/zero/stage_1_and_2.py``); see :func:`memlib.measure.recipes._deepspeed_setup` and
              :func:`memlib.measure.recipes._deepspeed_step`. Only mixed precisions; ``optimizer_impl`` is ignored for AdamW (DeepSpeed's
              ``FusedAdam`` steps the flat fp32 master without temporaries, as ``fused=True`` does).
            * ``megatron``: Megatron-LM's mixed-precision optimizer of one data-parallel rank: the 16-bit model,
              the fp32 ``main_grad`` buffer every gradient is added into, fp32 main parameters stepped by a fused
              Adam (:func:`memlib.measure.recipes._megatron_setup`, :func:`memlib.measure.recipes._megatron_step`).
              Only mixed precisions; ``optimizer_impl`` is ignored for AdamW.
            * ``fsdp2``: PyTorch's FSDP2 for real (:func:`memlib.measure.recipes._fsdp2_shard`):
              ``fully_shard`` on every decoder layer and then the root, ``MixedPrecisionPolicy(param_dtype=bf16,
              reduce_dtype=fp32)`` on the fp32 model for ``bf16-mixed`` (``fp32`` and ``bf16`` shard the model
              in its own dtype), over the caller's process group or else a one-rank gloo group made and
              destroyed here. ``torch.optim.AdamW`` steps the sharded ``DTensor`` parameters. Real tensors only
              (``cpu``, ``cuda``): FSDP2 refuses meta parameters.
        autocast_lists: on meta, whose autocast op lists the emulation mirrors: ``cuda`` (default: the GPUs
            the estimates are for) or ``cpu`` (to compare with a real CPU trace). Real devices use their own.
        zero_stage: ``fsdp2``: 3 (default; ``reshard_after_forward=True``) or 2 (``False``: the
            unsharded parameters stay from the forward to the backward), as ``estimate_training``'s ``zero``.
            ``deepspeed``: None or 1/2 (default: ``DeepSpeedZeroOptimizer`` of one rank) or 0 (no ZeRO: in mixed
            precision DeepSpeed's ``FP16_Optimizer``, :func:`memlib.measure.recipes._fp16_optimizer_step`, as the
            estimate's ``zero_stage=0``).
        data_parallel: ``none`` or ``ddp`` (``framework="pytorch"``, device ``cpu`` or ``meta``): the model runs
            wrapped in ``torch.nn.parallel.DistributedDataParallel`` of a one-rank process group made and destroyed
            inside the call (gloo on cpu, PyTorch's fake backend on meta; :func:`memlib.measure.recipes._ddp_group`).
            Its Reducer's flat gradient buckets, allocated when DDP is built, count as gradients
            (:func:`memlib.measure.recipes._ddp_wrap`). The traced step is DDP's first iteration: its one bucket
            holds what the 25 MiB buckets rebuilt before the second forward hold in total.
        gradient_as_bucket_view: DDP's flag (``data_parallel="ddp"`` only): True makes the gradients views of the
            buckets.
        reserved: record the allocations and frees in order and replay setup + two steps through the CUDA caching
            allocator's rules (:func:`memlib.core.allocator.reserved_peaks`, Chapter 16): ``reserved_peak_bytes``,
            ``events``. Traces the whole model. ``expandable_segments``: also ``reserved_peak_expandable_bytes``.

    Returns:
        The steady-state peak and its breakdown.

    Limitations:
        Counts tensor storages only: no allocator rounding, CUDA context or library workspaces. With
        ``device="cuda"`` the settings also carry ``cuda_max_memory_allocated`` and ``cuda_max_memory_reserved``
        of the second step, read from the CUDA caching allocator (Chapter 1's lab compares them).
    """
    torch = _torch()
    cfg = load_any_config(model)
    batch_size = check_positive("batch_size", batch_size)
    seq_len = check_positive("seq_len", seq_len)
    limits = (dataclasses.replace(load_any_config({**cfg.raw, **overrides}), name=cfg.name)
              if overrides else cfg)
    check_seq_len(limits, seq_len)  # transformers would fail on longer inputs (GPT-2: IndexError)
    check_choice("precision", precision, TRACE_PRECISIONS)
    check_choice("optimizer", optimizer, TRACE_OPTIMIZERS)
    check_choice("optimizer impl", optimizer_impl, OPTIMIZER_IMPLS)
    check_choice("attention", attention, ATTENTION)
    check_choice("recompute", recompute, ("none", "full"))
    check_choice("device", device, ("meta", "cpu", "cuda"))
    check_choice("framework", framework, FRAMEWORKS)
    if framework not in TRACE_FRAMEWORKS:
        raise MemlibError(f"framework {framework!r} cannot be traced; expected one of: {', '.join(TRACE_FRAMEWORKS)}")
    check_choice("autocast lists", autocast_lists, AUTOCAST_DEVICES)
    check_choice("data parallel", data_parallel, TRACE_DATA_PARALLEL)
    if data_parallel == "ddp" and (framework != "pytorch" or device == "cuda"):
        raise MemlibError(f"data_parallel 'ddp' traces framework 'pytorch' on device cpu or meta (got framework "
                          f"{framework!r}, device {device!r}); expected framework: pytorch, device one of: cpu, meta")
    if gradient_as_bucket_view and data_parallel != "ddp":
        raise MemlibError("gradient_as_bucket_view=True is DDP's flag; expected data_parallel: ddp "
                          f"(got {data_parallel!r})")
    if framework in ("deepspeed", "megatron") and not precision.endswith("-mixed"):
        raise MemlibError(f"framework {framework!r} traces mixed precision, not precision {precision!r}; "
                          "expected one of: bf16-mixed, fp16-mixed")
    if framework == "fsdp2":
        zero_stage = 3 if zero_stage is None else zero_stage
        check_choice("zero stage", zero_stage, (2, 3))
        for name, value, valid in (("precision", precision, FSDP2_PRECISIONS), ("device", device, ("cpu", "cuda")),
                                   ("optimizer", optimizer, ("sgd", "sgd-momentum", "adamw"))):
            if value not in valid:  # device: FSDP2's lazy init refuses meta parameters (_validate_no_meta_params)
                raise MemlibError(f"framework 'fsdp2' is not traced with {name} {value!r}; expected one of: "
                                  f"{', '.join(valid)}")
    elif framework == "deepspeed" and zero_stage is not None:
        check_choice("zero stage", zero_stage, (0, 1, 2))  # one rank: 1 and 2 are the same step
    elif zero_stage is not None:
        raise MemlibError(f"zero_stage {zero_stage!r} is traced for frameworks 'fsdp2' and 'deepspeed' only; "
                          f"expected None for framework {framework!r}")
    if optimizer == "adamw-8bit" and device == "meta":
        raise MemlibError("optimizer 'adamw-8bit' cannot be traced on device 'meta'; expected one of: cpu, cuda")
    layer_key = "n_layer" if cfg.model_type == "gpt2" else "num_hidden_layers"
    num_layers = int((overrides or {}).get(layer_key, cfg.num_layers))
    kw: _StepOptions = dict(batch_size=batch_size, seq_len=seq_len, precision=precision, optimizer=optimizer,
                            attention=attention, recompute=recompute, device=device, seed=seed,
                            optimizer_impl=optimizer_impl, framework=framework, autocast_lists=autocast_lists,
                            zero_stage=zero_stage, data_parallel=data_parallel,
                            gradient_as_bucket_view=gradient_as_bucket_view)
    lead = _leading_layers(cfg, overrides) if cfg.native and cfg.moe is not None else 0
    if expandable_segments and not reserved:
        raise MemlibError("expandable_segments=True replays the reserved memory; expected reserved=True with it")
    if (extrapolate and not reserved and device == "meta" and lead is not None and num_layers > lead + 5
            and (cfg.model_type in _CLASSES or cfg.moe is not None or _identical_layers(cfg, overrides, attention))):
        runs = {}
        for n in (lead + 3, lead + 4, lead + 5):
            tracker, _ = _trace_once(cfg, model_hook=model_hook, overrides={**(overrides or {}), layer_key: n}, segments=True, **kw)
            runs[n] = tracker.seg_peaks
        fit = _extrapolate(runs, num_layers, lead)
        if fit is not None:
            peak, totals, phase = fit
            settings = _settings(cfg, kw)
            return TraceResult(peak_bytes=peak, by_category={c.value: totals[c] for c in MemCategory},
                               peak_phase=phase, device=device, settings=settings, method="extrapolated")
    with _fsdp2_group(device) if framework == "fsdp2" else contextlib.nullcontext() as mesh:
        log: list[tuple[str, int, int]] | None = [] if reserved else None
        tracker, settings = _trace_once(cfg, model_hook=model_hook, overrides=overrides, segments=False, mesh=mesh,
                                        log=log, **kw)
    result = TraceResult(peak_bytes=tracker.peak, by_category=tracker.peak_by_category(),
                         peak_phase=tracker.peak_phase, device=device, settings=settings)
    if log is None:
        return result
    from ..core.allocator import reserved_peaks

    events, peak, peak_expandable = reserved_peaks(log, expandable_segments)
    return dataclasses.replace(result, reserved_peak_bytes=peak, reserved_peak_expandable_bytes=peak_expandable,
                               events=events)


def _leading_layers(cfg: ModelConfig, overrides: dict[str, Any] | None) -> int | None:
    """Layers before the run of identical layers of a MoE family memlib derives (from the config, no build).

    DeepSeek's ``first_k_dense_replace`` dense layers come first, then identical MoE layers: that many. Every
    layer a MoE layer (Mixtral, Qwen with ``decoder_sparse_step`` 1): 0. MoE every n-th layer, ``mlp_only_layers``
    in between or Qwen's sliding-window layers: None (the full model is traced).
    """
    if overrides:
        cfg = load_config({**cfg.raw, **overrides})
    moe = cfg.moe
    assert moe is not None
    first = moe.moe_layers[0] if moe.moe_layers else cfg.num_layers
    if moe.moe_layers != tuple(range(first, cfg.num_layers)) or cfg.raw.get("use_sliding_window"):
        return None
    return first


def _identical_layers(cfg: ModelConfig, overrides: dict[str, Any] | None, attention: str) -> bool:
    """Whether every decoder layer of the model is built alike (same modules, shapes and settings).

    Extrapolating from 3 to 5 layers assumes it; a model with dense first layers (DeepSeek), MoE every n-th
    layer or alternating sliding-window and global layers (Gemma 2/3) is traced in full instead. Checked on
    the full-depth model built on the meta device.
    """
    net = build_model(cfg, device="meta", attention=attention, overrides=overrides)

    def signature(layer: Any) -> Any:
        parts: list[Any] = []
        for name, mod in layer.named_modules():
            simple = sorted((k, v) for k, v in vars(mod).items() if not k.startswith("_") and k != "layer_idx"
                            and isinstance(v, (int, float, str, bool, type(None))))
            parts.append((name, type(mod).__name__, tuple(simple)))
        parts.extend((name, tuple(p.shape)) for name, p in layer.named_parameters())
        return tuple(parts)

    return len({signature(layer) for layer in _decoder_layers(net)}) == 1


class _StepOptions(TypedDict):
    """The settings :func:`trace_training` hands :func:`_trace_once` for every depth it traces."""

    batch_size: int
    seq_len: int
    precision: str
    optimizer: str
    attention: str
    recompute: str
    device: str
    seed: int
    optimizer_impl: str
    framework: str
    autocast_lists: str
    zero_stage: int | None
    data_parallel: str
    gradient_as_bucket_view: bool


def _settings(cfg: ModelConfig, kw: _StepOptions) -> dict[str, Any]:
    """The settings a :class:`TraceResult` echoes."""
    settings: dict[str, Any] = {"model": cfg.name, "batch_size": kw["batch_size"], "seq_len": kw["seq_len"],
                                "precision": kw["precision"], "optimizer": kw["optimizer"],
                                "attention": kw["attention"], "recompute": kw["recompute"],
                                "framework": kw["framework"]}
    impl = "fused" if kw["framework"] == "deepspeed" and kw["optimizer"] == "adamw" else kw["optimizer_impl"]
    if impl != "foreach":
        settings["optimizer_impl"] = impl
    if kw["device"] == "meta" and kw["framework"] == "pytorch" and kw["precision"].endswith("-mixed"):
        settings["autocast_lists"] = kw["autocast_lists"]
    if kw["zero_stage"] is not None:
        settings["zero_stage"] = kw["zero_stage"]
    if kw["data_parallel"] != "none":  # the defaults are not echoed, so default JSON stays as it was
        settings["data_parallel"] = kw["data_parallel"]
        settings["gradient_as_bucket_view"] = kw["gradient_as_bucket_view"]
    return settings


def _trace_once(cfg: ModelConfig, **kw: Any) -> tuple[MemoryTracker, dict[str, Any]]:
    """One traced steady-state step (:func:`_trace_step`), in a one-rank process group of its own with DDP."""
    with _ddp_group(kw["device"]) if kw.get("data_parallel") == "ddp" else contextlib.nullcontext():
        return _trace_step(cfg, **kw)


def _trace_step(cfg: ModelConfig, *, batch_size: int, seq_len: int, precision: str, optimizer: str, attention: str,
                recompute: str, device: str, overrides: dict[str, Any] | None, seed: int, segments: bool,
                model_hook: Callable[[Any], Any] | None = None, optimizer_impl: str = "foreach",
                framework: str = "pytorch", autocast_lists: str = "cuda", zero_stage: int | None = None,
                mesh: Any = None, data_parallel: str = "none", gradient_as_bucket_view: bool = False,
                log: list[tuple[str, int, int]] | None = None) -> tuple[MemoryTracker, dict[str, Any]]:
    """One traced steady-state step (see :func:`trace_training`); with ``segments``, per-segment maxima too.

    FSDP2 (``framework="fsdp2"``) shards over ``mesh`` (:func:`memlib.measure.recipes._fsdp2_group`). ``log``
    gets ``(action, key, nbytes)`` per counted alloc/free; ``("step", 0, 0)`` marks where the step begins."""
    torch = _torch()
    torch.manual_seed(seed)
    mixed = precision.endswith("-mixed")
    amp = mixed and framework == "pytorch"  # torch.autocast: fp32 model
    deepspeed = mixed and framework == "deepspeed"
    megatron = mixed and framework == "megatron"
    fsdp2 = framework == "fsdp2"
    low = torch.float16 if precision.startswith("fp16") else torch.bfloat16
    model_dtype = "fp32" if amp or (fsdp2 and mixed) else {"fp32": "fp32", "bf16": "bf16", "fp16": "fp16",
                                                           "bf16-mixed": "bf16", "fp16-mixed": "fp16"}[precision]
    tracker = MemoryTracker(device, on_event=None if log is None else (lambda a, k, n: log.append((a, k, n))))
    net = build_model(cfg, device=device, dtype=model_dtype, attention=attention, overrides=overrides)
    if model_hook is not None:
        net = model_hook(net)
    if recompute == "full":
        if hasattr(net, "activation_checkpointing_enable"):  # transformers ≥ 5.x name
            net.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:  # pragma: no cover - older transformers
            net.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if fsdp2:
        _fsdp2_shard(net, _decoder_layers(net), mesh, precision, zero_stage or 3)
    params = [p for p in net.parameters() if p.requires_grad]
    if segments:
        _segment_hooks(net, tracker)
    flat16 = _deepspeed_setup(params) if deepspeed else None
    tracker.track_model(net)
    # PyTorch DDP: the Reducer's buckets are made (and counted as GRAD) when the wrapper is built.
    runner = _ddp_wrap(net, tracker, gradient_as_bucket_view) if data_parallel == "ddp" else net
    master = None
    if flat16 is not None:
        with tracker.mode():
            master = flat16.detach().clone().float()  # single_partition_of_fp32_groups[i]
        tracker.reclassify(master, MemCategory.OPTIMIZER)
        master.requires_grad_(True)
    grad_data, mains = _megatron_setup(params, tracker) if megatron else (None, None)
    if master is not None:
        opt = _make_optimizer(optimizer, [master], "fused")
    elif mains is not None:
        opt = _make_optimizer(optimizer, mains, "fused")
    else:
        opt = _make_optimizer(optimizer, params, optimizer_impl)
    if device == "meta":
        _init_fused_state(opt)
    scaler = _grad_scaler(device, tracker) if amp and precision == "fp16-mixed" else None
    # DeepSpeed's and Megatron's dynamic loss scale
    loss_scale = 2.0 ** 16 if (deepspeed or megatron) and precision == "fp16-mixed" else None
    vocab = int(net.config.vocab_size)
    input_ids = torch.randint(0, vocab, (batch_size, seq_len), device=device)  # (B, T)
    tracker.track_inputs(input_ids)
    # torch.autocast: real on CPU and CUDA; on meta the CPU autocast flags carry the emulation's state.
    autocast = (torch.autocast("cuda" if device == "cuda" else "cpu", dtype=low) if amp
                else contextlib.nullcontext())

    def step() -> None:
        with tracker.forward():
            with autocast:
                loss = runner(input_ids=input_ids, labels=input_ids).loss
        with tracker.backward():
            if segments:
                tracker.set_segment("loss-backward")
            if scaler is not None:
                loss = scaler.scale(loss)
            elif loss_scale is not None:
                loss = loss * loss_scale  # DeepSpeed's fp16 optimizer: backward(loss.float() * cur_scale)
            loss.backward()
            del loss
        with tracker.optimizer_step():
            if segments:
                tracker.set_segment("optimizer")
            if master is not None and flat16 is not None and zero_stage == 0:
                _fp16_optimizer_step(params, master, flat16, opt, loss_scale)
            elif master is not None and flat16 is not None:
                _deepspeed_step(params, master, flat16, opt, loss_scale)
            elif mains is not None and grad_data is not None:
                _megatron_step(params, mains, grad_data, opt, loss_scale)
            elif scaler is not None:
                scaler.step(opt)
                scaler.update()
                opt.zero_grad(set_to_none=True)
            else:
                opt.step()
                opt.zero_grad(set_to_none=True)
            net.zero_grad(set_to_none=True)

    # Warm-up: one optimizer step on zero gradients creates the optimizer states exactly as a first training
    # step would (a full first forward/backward would only cost time: nothing else outlives a step).
    warm = _cached_meta_mode(None) if device == "meta" and _tracker.META_CACHE else contextlib.nullcontext()
    if fsdp2:  # FSDP2's lazy initialization and its all-gather outputs come with the first forward: a whole step
        with _patched(attention == "sdpa"):
            net(input_ids=input_ids, labels=input_ids).loss.backward()
    with warm:
        for group in opt.param_groups:
            for t in group["params"]:
                t.grad = torch.zeros_like(t)
        opt.step()
        opt.zero_grad(set_to_none=True)
    if segments:
        tracker.segment = "start"
    emulation = emulated(autocast_lists) if amp and device == "meta" else contextlib.nullcontext()
    storage_hooks = _fsdp2_storage_hooks(tracker) if fsdp2 else contextlib.nullcontext()
    with _patched(attention == "sdpa"), tracker.mode(), emulation, storage_hooks:
        tracker.track_optimizer(opt)
        tracker.reset_peak()
        if device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            allocated_before = torch.cuda.memory_allocated()
        if log is not None:
            log.append(("step", 0, 0))
        step()
        tracker.on_event = None  # what dies after the step (the model, on return) is not the step's
    settings = _settings(cfg, dict(batch_size=batch_size, seq_len=seq_len, precision=precision, optimizer=optimizer,
                                   attention=attention, recompute=recompute, device=device, seed=seed,
                                   optimizer_impl=optimizer_impl, framework=framework,
                                   autocast_lists=autocast_lists, zero_stage=zero_stage,
                                   data_parallel=data_parallel, gradient_as_bucket_view=gradient_as_bucket_view))
    if device == "cuda":  # the CUDA caching allocator's own view of the same step
        torch.cuda.synchronize()
        settings["cuda_max_memory_allocated"] = int(torch.cuda.max_memory_allocated())
        settings["cuda_max_memory_reserved"] = int(torch.cuda.max_memory_reserved())
        settings["cuda_allocated_before_step"] = int(allocated_before)
        settings["cuda_device_name"] = torch.cuda.get_device_name()
    return tracker, settings


def _segment_hooks(net: Any, tracker: MemoryTracker) -> dict[int, Any]:
    """Label the step's segments: ("F", k) layer k's forward, ("B", k) its backward, ("Q", k) its update.

    Returns the optimizer-segment label of every parameter (by ``id``).
    """
    torch = _torch()
    layers = _decoder_layers(net)
    n = len(layers)

    def forwarding() -> bool:
        return tracker.phase == "forward"

    for k, layer in enumerate(layers, start=1):
        def pre(mod: Any, args: Any, kwargs: Any, k: int = k) -> None:
            if forwarding():
                tracker.set_segment(("F", k))
                x = args[0] if args else kwargs.get("hidden_states")
                if k == 1 and isinstance(x, torch.Tensor) and x.requires_grad:
                    x.register_hook(lambda g: tracker.set_segment("embedding-backward"))

        def post(mod: Any, args: Any, out: Any, k: int = k) -> None:
            if forwarding():
                y = out[0] if isinstance(out, (tuple, list)) else out
                if isinstance(y, torch.Tensor) and y.requires_grad:
                    y.register_hook(lambda g, k=k: tracker.set_segment(("B", k)))
                if k == n:
                    tracker.set_segment("head")

        layer.register_forward_pre_hook(pre, with_kwargs=True)
        layer.register_forward_hook(post)
    owner: dict[int, Any] = {}
    in_layers = {id(p): k for k, layer in enumerate(layers, start=1) for p in layer.parameters()}
    seen_layer = False
    for p in net.parameters():
        if id(p) in in_layers:
            owner[id(p)] = ("Q", in_layers[id(p)])
            seen_layer = True
        else:
            owner[id(p)] = "optimizer-after" if seen_layer else "optimizer-before"
    return owner
