"""Measurement helpers for Chapters 8-9: peft LoRA models, 8-bit optimizer bytes, paged AdamW on a GPU.

torch, transformers, peft and bitsandbytes are imported lazily, inside the functions. Chapter 9's traced LoRA
step and NF4 layers are book helpers (:mod:`memlib._book.ch09_lora_qlora`).
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from ..core.choices import LORA_TARGETS
from ..core.configs import ModelConfig, load_config
from ..core.errors import check_choice, check_positive
from .trace import build_model

__all__ = ["peft_lora_model", "peft_trainable_params", "optimizer_state_bytes", "paged_adamw_gpu_results",
           "gpu_paged_adamw_run"]


def _peft_targets(cfg: ModelConfig, targets: str) -> str | list[str]:
    """peft ``target_modules`` for memlib's target names (see :data:`memlib.core.lora.LORA_TARGETS`)."""
    check_choice("lora targets", targets, LORA_TARGETS)
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
