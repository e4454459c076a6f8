"""Spawned worker processes with a deadline: wait, and kill and reap every worker on timeout or error.

One helper for the two multi-process measurements (DDP all-reduce counts in Chapter 5, sharded training in
Chapter 6). torch is not imported here: the caller passes the context that ``torch.multiprocessing.
start_processes(..., join=False)`` returned.
"""
from __future__ import annotations

import os
import time
from datetime import timedelta
from typing import Any

__all__ = ["join_with_deadline", "idle_worker", "join_gloo_group"]


def join_with_deadline(ctx: Any, timeout_s: float, what: str) -> None:
    """Wait for the processes of ``ctx`` to finish; past ``timeout_s`` kill them all and raise TimeoutError.

    Whatever happens (success, timeout, an exception raised in a worker and re-raised here by ``ctx.join``),
    every worker still alive when this returns or raises has been killed and reaped, so no process outlives
    the call.

    Args:
        ctx: the ``ProcessContext`` from ``torch.multiprocessing.start_processes(..., join=False)``.
        timeout_s: wall-clock limit for the whole run, in seconds.
        what: the run's name, for the error message.

    Raises:
        TimeoutError: the processes had not finished within ``timeout_s``.
        torch.multiprocessing.ProcessRaisedException: a worker raised (re-raised from ``ctx.join``).
    """
    deadline = time.monotonic() + timeout_s
    try:
        while not ctx.join(timeout=0.2):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what} did not finish within {timeout_s} s")
    finally:
        for proc in ctx.processes:
            if proc.is_alive():
                proc.kill()
                proc.join(5)


def idle_worker(rank: int, seconds: float) -> None:
    """A worker that only waits ``seconds``: lets a test check the deadline without racing a real run."""
    del rank
    time.sleep(seconds)


def join_gloo_group(torch: Any, rank: int, world_size: int, init_file: str, out_dir: str, timeout_s: float) -> Any:
    """In a spawned worker: send its output to ``out_dir/rank<r>.log``, use one thread, join the gloo group.

    The workers' own prints and library warnings go to the log file, not into the parent's output (a notebook
    cell would show them); an exception still reaches the parent with its traceback.

    Args:
        torch: the torch module (the caller imports it; this module does not).
        rank: this worker's rank.
        world_size: the number of workers.
        init_file: the file the group rendezvous through (``file://`` init method).
        out_dir: where the rank's log goes.
        timeout_s: the group's collective timeout.

    Returns:
        ``torch.distributed``, joined.
    """
    log = os.open(os.path.join(out_dir, f"rank{rank}.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(log, 1)
    os.dup2(log, 2)
    torch.set_num_threads(1)
    dist = torch.distributed
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=timeout_s))
    return dist
