"""Profiling, the pure half: memory snapshots read as a timeline of allocated bytes (Chapter 12).

No torch. A snapshot is the dict ``torch.cuda.memory._snapshot()`` returns (or the pickle
``torch.cuda.memory._dump_snapshot`` writes, or :func:`memlib._book.ch12_profiling.meta_memory_snapshot`'s dict in
the same layout); :func:`snapshot_timeline` adds up its ``alloc`` and ``free_completed`` events and
:func:`downsample_timeline` shrinks the result to a JSON-sized record.
"""
from __future__ import annotations

import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import MemlibError, check_positive

__all__ = ["MemoryTimeline", "load_snapshot", "snapshot_timeline", "downsample_timeline"]


@dataclass(frozen=True)
class MemoryTimeline:
    """Allocated bytes after every allocator event of a snapshot. Chapter 12.

    Attributes:
        times_us: event times (microseconds on CUDA; an event counter for meta traces).
        allocated_bytes: bytes allocated after each event.
        baseline_bytes: bytes already allocated when recording started (before the first event kept).
        peak_bytes: the maximum of ``allocated_bytes``.
        num_events: alloc and free events used.
    """

    times_us: list[float]
    allocated_bytes: list[int]
    baseline_bytes: int
    peak_bytes: int
    num_events: int


def load_snapshot(path: str | Path) -> dict[str, Any]:
    """Read a snapshot pickle written by ``torch.cuda.memory._dump_snapshot``. Chapter 12.

    Raises:
        MemlibError: the file is missing or is not a snapshot.
    """
    try:
        with open(path, "rb") as fh:
            data = pickle.load(fh)  # noqa: S301 - snapshots are pickles by design; read only your own
    except OSError as e:
        raise MemlibError(f"cannot read snapshot {str(path)!r}: {e.strerror}") from None
    if not isinstance(data, dict) or "device_traces" not in data:
        raise MemlibError(f"{str(path)!r} is not a memory snapshot (no 'device_traces')")
    return data


def snapshot_timeline(snapshot: dict[str, Any] | str | Path, device: int = 0) -> MemoryTimeline:
    """Turn a memory snapshot (CUDA pickle or :func:`meta_memory_snapshot` dict) into a timeline of bytes.

    Introduced in Chapter 12. Adds ``size`` at every ``alloc`` and subtracts it at every ``free_completed``
    of ``device_traces[device]``. The bytes already allocated before the first recorded event (when the ring
    buffer dropped older events, or recording started late) are recovered from the blocks alive at the end
    (``segments``): baseline = final − net change.

    Args:
        snapshot: the dict, or the path of a pickle.
        device: CUDA device index.

    Returns:
        The timeline.
    """
    data = load_snapshot(snapshot) if isinstance(snapshot, (str, Path)) else snapshot
    traces = data.get("device_traces")
    if not isinstance(traces, list) or not 0 <= device < len(traces):
        n = len(traces) if isinstance(traces, list) else 0
        valid = ", ".join(map(str, range(n)))
        raise MemlibError(f"snapshot has no trace for device {device}; expected one of: {valid}")
    times: list[float] = []
    deltas: list[int] = []
    for ev in traces[device]:
        action = ev.get("action")
        if action == "alloc":
            deltas.append(int(ev["size"]))
        elif action == "free_completed":
            deltas.append(-int(ev["size"]))
        else:
            continue
        times.append(float(ev.get("time_us", len(times))))
    final = sum(int(b["size"]) for seg in data.get("segments", []) if seg.get("device", device) == device
                for b in seg.get("blocks", []) if b.get("state") == "active_allocated")
    baseline = final - sum(deltas)
    alloc = []
    cur = baseline
    for d in deltas:
        cur += d
        alloc.append(cur)
    return MemoryTimeline(times_us=times, allocated_bytes=alloc, baseline_bytes=baseline,
                          peak_bytes=max(alloc, default=baseline), num_events=len(deltas))


def downsample_timeline(timeline: MemoryTimeline, max_points: int = 2000) -> dict[str, Any]:
    """A JSON-sized version of a timeline: at most ``max_points`` points, keeping each bucket's maximum.

    Introduced in Chapter 12 (the GPU suite stores CUDA timelines this way, the snapshot pickle being large).
    """
    n = len(timeline.allocated_bytes)
    step = max(1, -(-n // check_positive("max_points", max_points)))
    times, values = [], []
    for i in range(0, n, step):
        chunk = timeline.allocated_bytes[i:i + step]
        j = i + max(range(len(chunk)), key=chunk.__getitem__)
        times.append(timeline.times_us[j])
        values.append(timeline.allocated_bytes[j])
    return {"times_us": times, "allocated_bytes": values, "baseline_bytes": timeline.baseline_bytes,
            "peak_bytes": timeline.peak_bytes, "num_events": timeline.num_events}
