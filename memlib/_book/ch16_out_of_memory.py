"""Chapter 16's helpers: the allocator replay stopped at an event, its figures, and the usual leaks on CPU.

Book code (not public API): :func:`allocator_at` replays events through :class:`memlib.core.allocator.CachingAllocator`
up to one event (to draw or snapshot its segments there), :func:`timeline_figure` and :func:`segments_figure` draw
the replay, :func:`leak_run` runs three training steps of a small model on CPU with one of the usual leaks and
returns the live tensor bytes the tracker counts after each. torch and matplotlib are imported lazily.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..core.allocator import AllocatorConfig, CachingAllocator
from ..core.errors import MemlibError, check_choice

__all__ = ["allocator_at", "peak_event", "oom_message", "timeline_figure", "segments_figure", "LEAKS", "leak_run"]

MiB = 1 << 20


def allocator_at(events: Sequence[Sequence[Any]], stop: int | None = None, *, expandable_segments: bool = False,
                 record: bool = False) -> CachingAllocator:
    """The allocator after replaying ``events[:stop + 1]`` (all of them when ``stop`` is None)."""
    alloc = CachingAllocator(config=AllocatorConfig(expandable_segments=expandable_segments), record=record)
    live = {}
    for n, ev in enumerate(events if stop is None else events[:stop + 1]):
        if ev[0] == "alloc":
            live[n] = alloc.malloc(int(ev[1]))
        else:
            alloc.free(live.pop(int(ev[1])))
    return alloc


def peak_event(timeline: Sequence[tuple[int, int]]) -> int:
    """The first event at which the allocated bytes of a replay's ``timeline`` peak."""
    return max(range(len(timeline)), key=lambda i: (timeline[i][0], -i))


def oom_message(result: dict[str, Any], *, total: int, context: int) -> str:
    """The message PyTorch 2.x would raise for a :func:`memlib.core.allocator.replay` that ran out of memory.

    ``total``: the GPU's memory; ``context``: this process's memory outside the allocator (CUDA context,
    libraries), so the allocator's capacity was ``total - context``. Sizes as ``format_size`` writes them.
    """
    from ..core.oom import format_size

    if not result["oom"]:
        raise MemlibError("the replay did not run out of memory: no message to write")
    free = total - context - result["reserved"]
    return (f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {format_size(result['oom_request_bytes'])}."
            f" GPU 0 has a total capacity of {format_size(total)} of which {format_size(free)} is free. Including "
            f"non-PyTorch memory, this process has {format_size(context + result['reserved'])} memory in use. Of "
            f"the allocated memory {format_size(result['allocated'])} is allocated by PyTorch, and "
            f"{format_size(result['reserved'] - result['allocated'])} is reserved by PyTorch but unallocated.")


def timeline_figure(timelines: dict[str, Sequence[tuple[int, int]]], *, start: int = 0) -> Any:
    """Allocated and reserved GiB over the events of each replay in ``timelines`` (label → timeline)."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.6))
    colors = ("#4e79a7", "#e15759", "#59a14f")
    first = next(iter(timelines.values()))
    xs = range(start, len(first))
    ax.plot(xs, [first[i][0] / 2**30 for i in xs], color="black", lw=1, label="allocated (blocks)")
    for color, (label, tl) in zip(colors, timelines.items()):
        ax.step(xs, [tl[i][1] / 2**30 for i in xs], where="post", color=color, lw=1.5, label=f"reserved, {label}")
    ax.set_xlabel("allocator event (alloc or free)")
    ax.set_ylabel("GiB")
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(True, alpha=0.25)
    fig.tight_layout()
    return fig


def segments_figure(snapshots: dict[str, dict[str, Any]]) -> Any:
    """Each replay's segments as bars (one row per segment, MiB), allocated blocks filled, cached blocks hatched."""
    import matplotlib.pyplot as plt

    if not snapshots:
        raise MemlibError("snapshots={}: give at least one labelled snapshot")
    fig, axes = plt.subplots(1, len(snapshots), figsize=(8, 3.8), squeeze=False)
    for ax, (label, snap) in zip(axes[0], snapshots.items()):
        segs = sorted(snap["segments"], key=lambda s: -s["total_size"])[:24]
        for row, seg in enumerate(segs):
            for b in seg["blocks"]:
                x0 = (b["address"] - seg["address"]) / MiB
                used = b["state"] == "active_allocated"
                ax.barh(row, b["size"] / MiB, left=x0, height=0.8, color="#4e79a7" if used else "white",
                        edgecolor="#4e79a7", hatch=None if used else "////", lw=0.5)
        ax.set_yticks([])
        ax.set_ylim(24 - 0.5, -0.5)  # the same row height in every panel, first segment on top
        ax.set_xlabel("MiB from the segment's start")
        n = len(snap["segments"])
        ax.set_title(f"{label}: {n} segment{'s' if n != 1 else ''}", fontsize=9)
    fig.tight_layout()
    return fig


#: The usual leaks :func:`leak_run` reproduces, with the fixed version of each.
LEAKS = ("none", "loss-with-graph", "outputs-kept", "eval-with-grad", "hook-keeps-outputs")


def leak_run(kind: str, steps: int = 3, *, width: int = 256, batch_size: int = 64) -> list[int]:
    """Live tensor bytes on CPU (:class:`memlib.measure.tracker.MemoryTracker`) after each of ``steps`` steps.

    A four-layer MLP trained with SGD, seeded. ``kind``: ``none`` (the fixed loop: ``total += loss.item()``),
    ``loss-with-graph`` (``total = total + loss``: every step's loss and graph nodes stay reachable through
    ``total``; backward already freed the tensors they saved),
    ``outputs-kept`` (the outputs appended to a list with their graph), ``eval-with-grad`` (an evaluation
    forward per step without ``torch.no_grad()``, its output kept: its graph and saved activations stay) or
    ``hook-keeps-outputs`` (a forward hook appending every layer's output to a list).
    """
    import torch

    from ..measure.tracker import MemoryTracker

    check_choice("leak", kind, LEAKS)
    torch.manual_seed(0)
    net = torch.nn.Sequential(*[m for _ in range(4) for m in (torch.nn.Linear(width, width), torch.nn.ReLU())])
    opt = torch.optim.SGD(net.parameters(), lr=1e-3)
    x, y = torch.randn(batch_size, width), torch.randn(batch_size, width)
    tracker = MemoryTracker("cpu")
    tracker.track_model(net)
    kept: list[Any] = []
    if kind == "hook-keeps-outputs":
        for layer in net:
            layer.register_forward_hook(lambda mod, inp, out: kept.append(out))
    total: Any = 0.0
    after = []
    with tracker.mode():
        tracker.track_inputs(x, y)
        for _ in range(steps):
            out = net(x)
            loss = torch.nn.functional.mse_loss(out, y)
            if kind == "loss-with-graph":
                total = total + loss
            else:
                total += loss.item()
            if kind == "outputs-kept":
                kept.append(out)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if kind == "eval-with-grad":
                kept.append(net(x))  # an evaluation pass that forgot torch.no_grad()
            del out, loss
            after.append(tracker.total)
    return after
