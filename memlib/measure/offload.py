"""Measurements for Chapter 7 (offloading): CPU Adam throughput, and FSDP2 ``CPUOffloadPolicy`` on a GPU.

Measurement module: imports torch lazily inside the functions. :func:`cpu_adam_throughput` runs anywhere;
:func:`fsdp2_offload_run` needs a CUDA GPU for a meaningful answer (on the CPU device it still runs, with
gloo, as a smoke test of the code path: everything is on the CPU anyway). :func:`offload_gpu_results` is the
one call a GPU session makes; :mod:`memlib.measure.results` records it as ``labs/results/07_offload.json``.
"""
from __future__ import annotations

import os
import platform
import socket
import statistics
import time
from pathlib import Path
from typing import Any, TypedDict

from ..core.errors import MemlibError, check_choice, check_positive

__all__ = ["ADAM_IMPLEMENTATIONS", "cpu_adam_throughput", "copy_counter",
           "fsdp2_offload_run", "offload_gpu_results", "run_gpu_suite"]

#: CPU Adam implementations :func:`cpu_adam_throughput` can time.
ADAM_IMPLEMENTATIONS = ("torch-foreach", "torch-fused", "torch-for-loop", "deepspeed")


class _AdamWImpl(TypedDict, total=False):
    """The ``torch.optim.AdamW`` keyword that selects its implementation (foreach, fused or a for loop).

    Attributes:
        foreach: use the multi-tensor (foreach) kernels.
        fused: use the fused kernel.
    """

    foreach: bool
    fused: bool


def cpu_adam_throughput(n_params: int = 4_000_000, *, implementation: str = "torch-foreach", tensors: int = 4,
                        steps: int = 5, threads: int | None = None) -> dict[str, Any]:
    """Time AdamW steps on fp32 CPU tensors and return the throughput in parameters per second.

    Introduced in Chapter 7. This is the CPU half of ZeRO-Offload's cost: the step over Ψ parameters takes
    Ψ / throughput seconds. ``deepspeed`` uses ``DeepSpeedCPUAdam`` (AVX-512/AVX2 C++; JIT-compiled on first
    use, which takes minutes: build it before timing).

    Args:
        n_params: parameters in all, split evenly over ``tensors`` tensors.
        implementation: one of :data:`ADAM_IMPLEMENTATIONS`.
        tensors: number of parameter tensors.
        steps: timed steps (after one warm-up step); the median is reported.
        threads: ``torch.set_num_threads`` for the run (restored afterwards); None keeps the current setting.

    Returns:
        ``{"implementation", "n_params", "threads", "median_step_s", "params_per_s"}``.
    """
    import torch

    check_choice("implementation", implementation, ADAM_IMPLEMENTATIONS)
    n = check_positive("n_params", n_params)
    t = check_positive("tensors", tensors)
    s = check_positive("steps", steps)
    old_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(check_positive("threads", threads))
    try:
        gen = torch.Generator().manual_seed(0)
        size = -(-n // t)
        params = [torch.nn.Parameter(torch.randn(size, generator=gen)) for _ in range(t)]
        for p in params:
            p.grad = torch.randn(size, generator=gen) * 1e-3
        if implementation == "deepspeed":
            from deepspeed.ops.adam import DeepSpeedCPUAdam

            opt: Any = DeepSpeedCPUAdam(params, lr=1e-4, adamw_mode=True)
        else:
            impls: dict[str, _AdamWImpl] = {"torch-foreach": {"foreach": True}, "torch-fused": {"fused": True},
                                            "torch-for-loop": {"foreach": False}}
            kwargs = impls[implementation]
            opt = torch.optim.AdamW(params, lr=1e-4, **kwargs)
        opt.step()  # warm-up: allocates m and v
        times = []
        for _ in range(s):
            start = time.perf_counter()
            opt.step()
            times.append(time.perf_counter() - start)
        med = statistics.median(times)
        return {"implementation": implementation, "n_params": size * t, "threads": torch.get_num_threads(),
                "median_step_s": med, "params_per_s": size * t / med}
    finally:
        torch.set_num_threads(old_threads)


def copy_counter() -> Any:
    """A context manager that counts the bytes of every cross-device tensor copy made inside it.

    Introduced in Chapter 7. A ``TorchDispatchMode`` that sees each ``aten._to_copy`` and ``aten.copy_`` whose
    source and result live on different device types and adds the result's bytes to ``counter.bytes[(src,
    dst)]`` (e.g. ``("cpu", "cuda")`` for host-to-device). Autograd's backward threads inherit the mode, so
    the copies FSDP2 makes in backward are counted too.

    Returns:
        The mode; use as ``with copy_counter() as c: ...`` and read ``c.bytes``.
    """
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    copies = {torch.ops.aten._to_copy.default, torch.ops.aten.copy_.default}

    class _CopyCounter(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.bytes: dict[tuple[str, str], int] = {}

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            out = func(*args, **(kwargs or {}))
            if func in copies and isinstance(out, torch.Tensor):
                src = args[1] if func is torch.ops.aten.copy_.default else args[0]
                if isinstance(src, torch.Tensor) and src.device.type != out.device.type:
                    key = (src.device.type, out.device.type)
                    self.bytes[key] = self.bytes.get(key, 0) + out.numel() * out.element_size()
            return out

    return _CopyCounter()


def _tiny_model(hidden: int, layers: int, vocab: int) -> Any:
    import torch

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm = torch.nn.LayerNorm(hidden)
            self.up = torch.nn.Linear(hidden, 4 * hidden)
            self.down = torch.nn.Linear(4 * hidden, hidden)

        def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, C)
            return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(vocab, hidden)
            self.blocks = torch.nn.ModuleList(Block() for _ in range(layers))
            self.head = torch.nn.Linear(hidden, vocab, bias=False)

        def forward(self, idx: torch.Tensor) -> torch.Tensor:  # (B, T) -> (B, T, V)
            x = self.embed(idx)
            for b in self.blocks:
                x = b(x)
            return self.head(x)

    return Net()


def _where(tensors: list[Any]) -> str:
    devices = sorted({str(getattr(t, "_local_tensor", t).device.type) for t in tensors if t is not None})
    return "+".join(devices) if devices else "none"


def fsdp2_offload_run(*, device: str = "cuda", hidden: int = 1024, layers: int = 8, vocab: int = 8192,
                      batch_size: int = 8, seq_len: int = 512, steps: int = 3, offload: bool = True) -> dict[str, Any]:
    """Train a small MLP transformer for a few steps with FSDP2 on one process, with or without CPU offload.

    Introduced in Chapter 7. Starts a one-rank process group (NCCL on CUDA, gloo on CPU) if none exists,
    shards each block and the root with ``fully_shard(..., mp_policy=MixedPrecisionPolicy(bf16),
    offload_policy=CPUOffloadPolicy() if offload)``, and reports where the sharded parameters, their
    gradients and the AdamW states live, the GPU peak (``torch.cuda.max_memory_allocated``) and the median
    step time. On the CPU device the numbers say nothing about offload (everything is host memory); the
    run only checks the code path.

    Args:
        device: ``cuda`` or ``cpu``.
        hidden, layers, vocab: model shape (parameters ≈ layers·8·hidden² + 2·vocab·hidden).
        batch_size, seq_len: micro-batch.
        steps: training steps (the first is not timed).
        offload: use ``CPUOffloadPolicy``.

    Returns:
        A JSON-ready dict.
    """
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    check_choice("device", device, ("cuda", "cpu"))
    if device == "cuda" and not torch.cuda.is_available():
        raise MemlibError("device 'cuda' asked for but torch.cuda.is_available() is False")
    created = False
    if not dist.is_initialized():
        with socket.socket() as sock:  # a free port, so that parallel runs do not collide
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        dist.init_process_group("nccl" if device == "cuda" else "gloo", init_method=f"tcp://127.0.0.1:{port}",
                                rank=0, world_size=1)
        created = True
    try:
        torch.manual_seed(0)
        dev = torch.device(device)
        model = _tiny_model(hidden, layers, vocab).to(dev)
        n_params = sum(p.numel() for p in model.parameters())
        block_params = sum(p.numel() for p in model.blocks.parameters())
        policy = CPUOffloadPolicy(pin_memory=device == "cuda") if offload else OffloadPolicy()
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for block in model.blocks:
            fully_shard(block, mp_policy=mp, offload_policy=policy)
        fully_shard(model, mp_policy=mp, offload_policy=policy)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        idx = torch.randint(0, vocab, (batch_size, seq_len), device=dev)
        if device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        times, losses, traffic = [], [], []
        for _ in range(steps):
            start = time.perf_counter()
            with copy_counter() as counter:
                logits = model(idx)
                loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), idx.flatten())
                loss.backward()
                opt.step()
                opt.zero_grad()
            if device == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
            losses.append(float(loss.detach()))
            traffic.append(counter.bytes)
        params = list(model.parameters())
        states = [v for st in opt.state.values() for v in st.values() if torch.is_tensor(v) and v.dim() > 0]
        out = {
            "offload": offload, "device": device, "n_params": n_params, "batch_size": batch_size,
            "seq_len": seq_len, "params_on": _where(params),
            "param_dtype": str(params[0].dtype).replace("torch.", ""),
            "optimizer_state_on": _where(states), "losses": losses,
            # bytes of cross-device copies in the last step, and what memlib.core.offload predicts for this model:
            # fp32 shards up for each block's forward and backward gathers (the root module, which holds the
            # embedding and head, is not resharded after forward: up once), fp32 gradients down once
            "h2d_bytes_per_step": traffic[-1].get(("cpu", device), 0) if device != "cpu" else 0,
            "d2h_bytes_per_step": traffic[-1].get((device, "cpu"), 0) if device != "cpu" else 0,
            "h2d_bytes_model": 4 * (2 * block_params + (n_params - block_params)) if offload else 0,
            "d2h_bytes_model": 4 * n_params if offload else 0,
            "median_step_s": statistics.median(times[1:]) if len(times) > 1 else times[0],
        }
        if device == "cuda":
            out["gpu_peak_bytes"] = torch.cuda.max_memory_allocated()
            out["gpu_allocated_after_step_bytes"] = torch.cuda.memory_allocated()
        return out
    finally:
        if created:
            dist.destroy_process_group()


def offload_gpu_results() -> dict[str, Any]:
    """The Chapter 7 GPU run: FSDP2 with and without ``CPUOffloadPolicy``, plus CPU Adam throughput.

    Introduced in Chapter 7. Returns the measured values (no provenance: :mod:`memlib.measure.results` adds
    it when the GPU suite or the chapter records them as ``labs/results/07_offload.json``).

    Raises:
        MemlibError: no CUDA GPU.
    """
    import torch

    if not torch.cuda.is_available():
        raise MemlibError("offload_gpu_results needs a CUDA GPU")
    runs = [fsdp2_offload_run(offload=False), fsdp2_offload_run(offload=True)]
    adam = [cpu_adam_throughput(50_000_000, implementation=impl) for impl in ("torch-foreach", "torch-fused")]
    return {"host": platform.processor(), "cpu_count": os.cpu_count(), "fsdp2": runs, "cpu_adam": adam}


def run_gpu_suite(out_path: str | Path = "labs/results/07_offload.json") -> dict[str, Any]:
    """Measure :func:`offload_gpu_results` and record it with its provenance at ``out_path``.

    Introduced in Chapter 7. Returns the data as stored (without the provenance record).
    """
    from .results import Provenance, save_recorded

    path = Path(out_path)
    data = offload_gpu_results()  # raises without a CUDA GPU
    provenance = Provenance.of_this_run("memlib.measure.offload.run_gpu_suite()")
    return save_recorded(path.stem, data, provenance, path.parent).data
