"""Chapter 4's lab: the largest batch that trains on a GPU, step times, and the GPU run that records them.

Measurement module (torch imported lazily). The memory models and traces it compares against are in
:mod:`memlib.core.checkpointing` and :mod:`memlib.measure.checkpointing`, which re-exports these functions.
"""
from __future__ import annotations

import statistics
import time
from typing import Any

from ..core.checkpointing import largest_batch
from ..core.configs import load_config
from ..core.errors import MemlibError, check_choice, check_positive
from .deps import require_torch
from .results import DATE_FORMAT

__all__ = ["largest_batch_cuda", "time_step", "time_stack", "gpu_checkpointing_results"]

ModelLike = Any  # str | Path | dict | ModelConfig, as in memlib.measure.checkpointing


def _torch() -> Any:
    return require_torch("memlib.measure.checkpointing_lab")


def _cuda_step_fits(model: ModelLike, batch_size: int, seq_len: int, recompute: str, checkpoint_every: int,
                    overrides: dict[str, Any] | None, state: dict[str, Any]) -> bool:
    torch = _torch()
    from .checkpointing import _maybe, apply_checkpointing, selective_attention_core
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
    from .checkpointing import RECOMPUTE_MODES

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
    from .checkpointing import _maybe, _prepare, selective_attention_core
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
    from .checkpointing import _run_stack, _stack

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

    from .checkpointing import measure_stack, trace_recompute

    if not torch.cuda.is_available():
        raise MemlibError("gpu_checkpointing_results needs a CUDA GPU; torch.cuda.is_available() is False")
    total = int(torch.cuda.get_device_properties(0).total_memory)
    free, _ = torch.cuda.mem_get_info()
    rows = []
    for recompute in ("none", "selective", "full"):
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
