"""Measurement helpers for Chapters 8-9: LoRA steps traced with peft, 8-bit optimizer bytes, paged AdamW on a GPU.

torch, transformers, peft and bitsandbytes are imported lazily, inside the functions.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from ..core.categories import MemCategory
from ..core.configs import ModelConfig, load_config
from ..core.errors import check_choice, check_positive
from .trace import MemoryTracker, TraceResult, _patched, build_model

__all__ = ["quantize_linears_nf4", "nf4_model_bytes", "peft_lora_model", "peft_trainable_params", "trace_lora_step",
           "optimizer_state_bytes", "paged_adamw_gpu_results", "gpu_paged_adamw_run"]


def _peft_targets(cfg: ModelConfig, targets: str) -> str | list[str]:
    """peft ``target_modules`` for memlib's target names (see :data:`memlib.core.lora.LORA_TARGETS`)."""
    check_choice("lora targets", targets, ("all-linear", "attention", "qv"))
    if targets == "all-linear":
        return "all-linear"
    if cfg.model_type == "gpt2":
        return ["c_attn", "attn.c_proj"] if targets == "attention" else ["c_attn"]
    return ["q_proj", "k_proj", "v_proj", "o_proj"] if targets == "attention" else ["q_proj", "v_proj"]


def peft_lora_model(model: str | Path | dict[str, Any] | ModelConfig, *, rank: int = 16,
                    targets: str = "all-linear", device: str = "meta", dtype: str = "bf16",
                    overrides: dict[str, Any] | None = None) -> Any:
    """A transformers model with peft LoRA adapters (``lora_dropout=0``, ``lora_alpha=2r``), no download.

    Introduced in Chapter 9. peft keeps the base weights in ``dtype`` and frozen, and (its default
    ``autocast_adapter_dtype=True``) creates the adapters in fp32.
    """
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError:  # pragma: no cover
        raise ImportError("LoRA measurement needs peft: pip install peft") from None
    logging.getLogger("bitsandbytes").setLevel(logging.ERROR)
    cfg = load_config(model)
    r = check_positive("lora rank", rank)
    net = build_model(cfg, device=device, dtype=dtype, overrides=overrides)
    lcfg = LoraConfig(r=r, lora_alpha=2 * r, lora_dropout=0.0, target_modules=_peft_targets(cfg, targets),
                      task_type="CAUSAL_LM")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return get_peft_model(net, lcfg)


def peft_trainable_params(model: str | Path | dict[str, Any] | ModelConfig, *, rank: int = 16,
                          targets: str = "all-linear") -> int:
    """peft's own count of trainable parameters, ``get_nb_trainable_parameters()[0]``, built on meta.

    Introduced in Chapter 9.
    """
    return int(peft_lora_model(model, rank=rank, targets=targets).get_nb_trainable_parameters()[0])


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


def optimizer_state_bytes(optimizer: Any) -> tuple[int, dict[str, int]]:
    """Bytes of an optimizer's tensor states (shared quantization maps ``qmap*`` counted once).

    Introduced in Chapter 8.

    Returns:
        (total bytes, bytes by ``"<state name>:<dtype>"``).
    """
    import torch

    total = 0
    by_kind: dict[str, int] = {}
    seen: set[int] = set()
    for st in optimizer.state.values():
        for name, value in st.items():
            if not isinstance(value, torch.Tensor):
                continue
            key = value.untyped_storage().data_ptr() if name.startswith("qmap") else None
            if key is not None:
                if key in seen:
                    continue
                seen.add(key)
            nbytes = value.numel() * value.element_size()
            kind = f"{name}:{str(value.dtype).replace('torch.', '')}"
            by_kind[kind] = by_kind.get(kind, 0) + nbytes
            total += nbytes
    return total, by_kind


def paged_adamw_gpu_results(*, hidden: int = 4096, layers: int = 8, spike_gib: float = 0.0,
                            steps: int = 6) -> dict[str, Any]:
    """On a CUDA GPU: bitsandbytes ``PagedAdamW`` vs ``AdamW`` on a stack of Linear layers.

    Introduced in Chapter 9 (run by the GPU suite; the chapter shows the recorded JSON). Returns, per
    optimizer, the state bytes, ``torch.cuda.max_memory_allocated`` (paged states live in unified memory,
    outside PyTorch's allocator, so they do not show there) and the step time, plus the bitsandbytes version
    (:mod:`memlib.measure.results` adds the device, torch version and date when it records them).

    Args:
        hidden: width of each square Linear layer.
        layers: number of layers.
        spike_gib: an extra allocation held during forward/backward, to put the GPU under pressure.
        steps: training steps per optimizer.
    """
    import time

    import torch

    import bitsandbytes as bnb

    if not torch.cuda.is_available():  # pragma: no cover - GPU suite only
        raise RuntimeError("paged_adamw_gpu_results needs a CUDA GPU")
    result: dict[str, Any] = {"bitsandbytes": bnb.__version__, "hidden": hidden, "layers": layers,
                              "spike_gib": spike_gib, "runs": {}}
    for name, cls in (("AdamW", torch.optim.AdamW), ("PagedAdamW", bnb.optim.PagedAdamW),
                      ("PagedAdamW8bit", bnb.optim.PagedAdamW8bit)):
        torch.manual_seed(0)
        net = torch.nn.Sequential(*[torch.nn.Linear(hidden, hidden) for _ in range(layers)]).cuda()
        opt = cls(net.parameters(), lr=1e-4)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        for _ in range(steps):
            spike = torch.empty(int(spike_gib * 2**30), dtype=torch.uint8, device="cuda") if spike_gib else None
            loss = net(torch.randn(64, hidden, device="cuda")).square().mean()
            loss.backward()
            del spike
            opt.step()
            opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        state_bytes, kinds = optimizer_state_bytes(opt)
        result["runs"][name] = {"state_bytes": state_bytes, "state_kinds": kinds,
                                "max_memory_allocated": int(torch.cuda.max_memory_allocated()),
                                "seconds_per_step": (time.perf_counter() - t0) / steps,
                                "params": sum(p.numel() for p in net.parameters())}
        del net, opt
        torch.cuda.empty_cache()
    return result


def gpu_paged_adamw_run(out_path: str | Path = "labs/results/09_paged_adamw.json", *, hidden: int = 4096,
                        layers: int = 8, spike_gib: float = 0.0, steps: int = 6) -> dict[str, Any]:
    """Measure :func:`paged_adamw_gpu_results` and record it with its provenance at ``out_path``.

    Introduced in Chapter 9. Returns the data as stored (without the provenance record).
    """
    from .results import Provenance, save_recorded

    path = Path(out_path)
    data = paged_adamw_gpu_results(hidden=hidden, layers=layers, spike_gib=spike_gib, steps=steps)
    provenance = Provenance.of_this_run("memlib.measure.quant.gpu_paged_adamw_run()")
    return save_recorded(path.stem, data, provenance, path.parent).data
