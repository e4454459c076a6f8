"""Gradient accumulation under DDP: all-reduce calls and bytes with and without ``no_sync`` (Chapter 5).

Two ``gloo`` processes on the CPU run three accumulation loops on a small MLP and count the buckets DDP
all-reduces with a communication hook. torch is imported lazily. Re-exported by
:mod:`memlib._book.ch05_gradient_accumulation`; a book helper (moved from ``memlib.measure.accumulation_ddp``).
"""
from __future__ import annotations

import contextlib
import os
import socket
import sys
import tempfile
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from ..core.errors import MemlibError, check_positive
from ..measure.deps import require_torch
from ..measure.procs import join_with_deadline

__all__ = ["DDP_VARIANTS", "DDPCommResult", "find_free_port", "ddp_allreduce_counts"]

#: The DDP loops :func:`ddp_allreduce_counts` runs: ``"sync-every-micro-step"`` (the Tips notes' wrong loop),
#: ``"no_sync"`` (forward and backward of the first k-1 micro-batches inside ``model.no_sync()``, the Tips notes'
#: right loop) and ``"no_sync-backward-only"`` (forward outside the context, only ``backward()`` inside).
DDP_VARIANTS = ("sync-every-micro-step", "no_sync", "no_sync-backward-only")



def _torch() -> Any:
    return require_torch("memlib._book.ch05_gradient_accumulation_ddp")


@dataclass(frozen=True)
class DDPCommResult:
    """All-reduce traffic of DDP per optimizer step, per loop variant. Introduced in Chapter 5.

    Attributes:
        world_size: processes.
        accumulation_steps: k.
        param_bytes: bytes of the gradients (= parameters, fp32) of the model.
        calls: all-reduce calls (DDP buckets sent) per optimizer step, per variant of :data:`DDP_VARIANTS`.
        bytes: payload bytes all-reduced per optimizer step, per variant.
        max_param_diff: max |parameter after the steps − the ``"sync-every-micro-step"`` run's|, per variant.
        max_rank_diff: max |rank 1's parameters − rank 0's| after the steps, over all variants.
        steps: optimizer steps run per variant (the counts are those of the last, steady-state step).
    """

    world_size: int
    accumulation_steps: int
    param_bytes: int
    calls: dict[str, int]
    bytes: dict[str, int]
    max_param_diff: dict[str, float]
    max_rank_diff: float
    steps: int


def find_free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (bind to port 0). Introduced in Chapter 5."""
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ddp_mlp() -> Any:
    torch = _torch()
    torch.manual_seed(0)
    # 4 Linear layers, 53,697 parameters (214,788 bytes of fp32 gradients).
    return torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 128), torch.nn.ReLU(),
                               torch.nn.Linear(128, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))


def _ddp_worker(rank: int, world_size: int, port: int, k: int, steps: int, bucket_cap_mb: float,
                out_dir: str, timeout_s: float) -> None:
    """One DDP rank: run each loop of :data:`DDP_VARIANTS`, count all-reduces with a comm hook, save results."""
    torch = _torch()
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size, timeout=timedelta(seconds=timeout_s))
    try:
        results: dict[str, Any] = {}
        for variant in DDP_VARIANTS:
            model = DDP(_ddp_mlp(), bucket_cap_mb=bucket_cap_mb)
            counter = {"calls": 0, "bytes": 0}

            def hook(state, bucket):  # type: ignore[no-untyped-def]  # DDP rejects string annotations
                buf = bucket.buffer()                      # the flattened gradients of one bucket
                state["calls"] += 1
                state["bytes"] += buf.numel() * buf.element_size()
                return default_hooks.allreduce_hook(None, bucket)   # all_reduce(buf / world_size)

            model.register_comm_hook(counter, hook)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            gen = torch.Generator().manual_seed(100 + rank)         # each rank sees its own data
            loader = [(torch.randn(8, 64, generator=gen), torch.randn(8, 1, generator=gen)) for _ in range(k * steps)]
            per_step = []
            for i, (x, y) in enumerate(loader):
                last = (i + 1) % k == 0
                if variant == "sync-every-micro-step":        # the Tips notes' wrong loop: all-reduce every backward
                    loss = torch.nn.functional.mse_loss(model(x), y) / k
                    loss.backward()
                elif variant == "no_sync":                    # the Tips notes' right loop: forward and backward inside
                    ctx = contextlib.nullcontext() if last else model.no_sync()
                    with ctx:
                        loss = torch.nn.functional.mse_loss(model(x), y) / k
                        loss.backward()
                else:                                         # forward outside, only backward inside no_sync
                    loss = torch.nn.functional.mse_loss(model(x), y) / k
                    ctx = contextlib.nullcontext() if last else model.no_sync()
                    with ctx:
                        loss.backward()
                if last:
                    opt.step()
                    opt.zero_grad(set_to_none=True)
                    per_step.append(dict(counter))
                    counter["calls"], counter["bytes"] = 0, 0
            params = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
            results[variant] = {"per_step": per_step, "params": params.clone()}
            del model
        torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _run_ddp(mp: Any, world_size: int, k: int, steps: int, bucket_cap_mb: float, timeout_s: float) -> list[Any]:
    """Spawn the ranks, wait with a deadline, kill leftovers, and load each rank's results."""
    torch = _torch()
    with tempfile.TemporaryDirectory(prefix="memlib_ddp_") as out_dir:
        for attempt in range(3):  # the free port can be taken between the probe and the bind: retry
            port = find_free_port()
            ctx = mp.start_processes(_ddp_worker, args=(world_size, port, k, steps, bucket_cap_mb, out_dir, timeout_s),
                                     nprocs=world_size, join=False, start_method="spawn")
            try:
                join_with_deadline(ctx, timeout_s, "DDP run")
                break
            except mp.ProcessRaisedException as err:
                if "EADDRINUSE" in str(err) or "address already in use" in str(err).lower():
                    if attempt < 2:
                        continue
                raise
        ranks = [torch.load(os.path.join(out_dir, f"rank{r}.pt")) for r in range(world_size)]
    return ranks


def ddp_allreduce_counts(*, accumulation_steps: int = 4, steps: int = 2, world_size: int = 2,
                         bucket_cap_mb: float = 0.1, timeout_s: float = 60.0) -> DDPCommResult:
    """Run DDP on ``world_size`` CPU processes (gloo) and count all-reduces per optimizer step. Introduced in Chapter 5.

    Each process runs the three loops of :data:`DDP_VARIANTS` on a 4-layer MLP (53,697 parameters) with an
    SGD step every k micro-batches, and a communication hook (``DDP.register_comm_hook``) that counts the
    buckets DDP all-reduces and their bytes before handing them to PyTorch's default all-reduce hook. Processes
    are spawned (``torch.multiprocessing``) with ``MASTER_ADDR=127.0.0.1`` and a free port; the gloo timeout and
    an overall deadline stop the run if a process fails or hangs.

    Args:
        accumulation_steps: k.
        steps: optimizer steps per loop (the counts returned are the last step's: DDP rebuilds its buckets
            after the first iteration).
        world_size: processes.
        bucket_cap_mb: DDP's bucket size in MB (small here so that the small model fills several buckets).
        timeout_s: deadline for the whole run, in seconds.

    Returns:
        Calls and bytes per optimizer step per variant, and parameter agreement.

    Raises:
        TimeoutError: the processes did not finish within ``timeout_s`` (they are killed).
        torch.multiprocessing.ProcessRaisedException: a process raised (the others are terminated).
    """
    _torch()  # a clear ImportError without PyTorch
    import torch.multiprocessing as mp

    k = check_positive("accumulation_steps", accumulation_steps)
    steps = check_positive("steps", steps)
    world_size = check_positive("world_size", world_size)
    if world_size < 2:
        raise MemlibError(f"world_size must be ≥ 2 for data parallelism, got {world_size}")
    # gloo picks its network interface from the hostname, which in containers may not resolve to a reachable
    # address; on Linux point it at the loopback device for the children (restored afterwards).
    saved_ifname = os.environ.get("GLOO_SOCKET_IFNAME")
    if saved_ifname is None and sys.platform.startswith("linux"):
        os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    try:
        ranks = _run_ddp(mp, world_size, k, steps, bucket_cap_mb, timeout_s)
    finally:
        if saved_ifname is None:
            os.environ.pop("GLOO_SOCKET_IFNAME", None)
    base = ranks[0]["sync-every-micro-step"]["params"]
    last = {v: ranks[0][v]["per_step"][-1] for v in DDP_VARIANTS}
    rank_diff = max(float((rk[v]["params"] - ranks[0][v]["params"]).abs().max()) for rk in ranks for v in DDP_VARIANTS)
    return DDPCommResult(world_size=world_size, accumulation_steps=k, param_bytes=int(base.numel()) * 4,
                         calls={v: int(last[v]["calls"]) for v in DDP_VARIANTS},
                         bytes={v: int(last[v]["bytes"]) for v in DDP_VARIANTS},
                         max_param_diff={v: float((ranks[0][v]["params"] - base).abs().max()) for v in DDP_VARIANTS},
                         max_rank_diff=rank_diff, steps=steps)
