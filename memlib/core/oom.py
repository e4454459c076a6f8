"""Read a PyTorch CUDA out-of-memory message: what was asked, what was there, and why it failed (Chapter 16).

No torch. :func:`parse_oom` reads every format ``DeviceCachingAllocator::malloc`` (``c10/cuda/CUDACachingAllocator.cpp``)
has printed, with sizes as its ``format_size`` writes them (``bytes``, ``KiB``, ``MiB``, ``GiB``):

* PyTorch 1.0 (pull request 13751): ``Tried to allocate 16.00 GiB (GPU 0; 11.93 GiB total capacity; 4.00 GiB
  already allocated; 7.33 GiB free; 179.00 KiB cached)``, "cached" being reserved but unallocated memory;
* PyTorch 1.4 to 1.13: ``... (GPU 0; 15.78 GiB total capacity; 14.56 GiB already allocated; 3.75 MiB free;
  [6.00 GiB allowed;] 14.72 GiB reserved in total by PyTorch)``;
* PyTorch 2.0 and later (pull request 99699): ``Tried to allocate 2.00 GiB. GPU 0 has a total capac[i]ty of 79.15
  GiB of which 1.23 GiB is free. [Process 12345 has 1.2 GiB memory in use.] Including non-PyTorch memory, this
  process has 77.90 GiB memory in use. Of the allocated memory 75.20 GiB is allocated by PyTorch, [with X
  allocated in private pools (e.g., CUDA Graphs),] and 1.50 GiB is reserved by PyTorch but unallocated.`` (the
  first 2.x releases spelled it "capacty"; ROCm builds say "HIP out of memory").

:func:`diagnose` adds a verdict (:data:`VERDICTS`) and what to do about it.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any

from .errors import MemlibError

__all__ = ["OomReport", "VERDICTS", "parse_oom", "diagnose", "advice", "oom_dict", "oom_text", "format_size"]

#: ``too-large``: no GPU of this size can ever serve the request; ``fragmentation``: the memory is there, in
#: cached pieces of PyTorch's segments; ``insufficient``: the job needs more memory than the GPU has free.
VERDICTS = ("too-large", "fragmentation", "insufficient")

_UNITS = {"bytes": 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}
_SIZE = r"(\d+(?:\.\d+)?)\s*(bytes|B|KiB|MiB|GiB|TiB)"


def _bytes(num: str, unit: str) -> int:
    return round(float(num) * _UNITS[unit])


def _find(pattern: str, text: str) -> int | None:
    m = re.search(pattern.replace("SIZE", _SIZE), text)
    return None if m is None else _bytes(m.group(1), m.group(2))


@dataclasses.dataclass(frozen=True)
class OomReport:
    """What an OOM message says, in bytes (None where that PyTorch version does not say it). Chapter 16.

    Attributes:
        format: ``"1.0"`` (cached), ``"1.x"`` (reserved in total) or ``"2.x"`` (this process has ...).
        device: the GPU index.
        requested_bytes: "Tried to allocate": the segment PyTorch asked ``cudaMalloc`` for.
        total_bytes: the GPU's total capacity.
        free_bytes: free memory on the GPU (``cudaMemGetInfo``) after PyTorch released its unused cache.
        allowed_bytes: the cap ``torch.cuda.set_per_process_memory_fraction`` set, if any.
        process_bytes: all memory of this process on the GPU, PyTorch's and the rest (2.x).
        allocated_bytes: allocated by PyTorch's caching allocator (tensors, rounded blocks).
        reserved_bytes: allocated plus reserved but unallocated (the allocator's segments).
        reserved_unallocated_bytes: cached in PyTorch's segments but not allocated.
        other_processes_bytes: the "Process N has ..." lines summed (2.x, when NVML could list them).
    """

    format: str
    device: int
    requested_bytes: int
    total_bytes: int
    free_bytes: int
    allocated_bytes: int
    reserved_bytes: int
    reserved_unallocated_bytes: int
    allowed_bytes: int | None = None
    process_bytes: int | None = None
    other_processes_bytes: int | None = None

    @property
    def non_pytorch_bytes(self) -> int | None:
        """This process's memory outside the caching allocator: CUDA context, cuBLAS/cuDNN workspaces, NCCL."""
        return None if self.process_bytes is None else max(0, self.process_bytes - self.reserved_bytes)

    @property
    def others_bytes(self) -> int:
        """Memory neither free nor this process's PyTorch segments: other processes, the driver and, in the
        1.x formats, this process's CUDA context and libraries (they are not told apart there)."""
        mine = self.process_bytes if self.process_bytes is not None else self.reserved_bytes
        return max(0, self.total_bytes - self.free_bytes - mine)


def format_size(nbytes: int) -> str:
    """Bytes as PyTorch's ``format_size`` (``c10/cuda/CUDACachingAllocator.cpp``) writes them: ``512 bytes``,
    ``3.75 MiB``, ``14.72 GiB`` (binary units, two decimals)."""
    if nbytes <= 1024:
        return f"{nbytes} bytes"
    for unit, scale in (("KiB", 1 << 10), ("MiB", 1 << 20)):
        if nbytes <= scale << 10:
            return f"{nbytes / scale:.2f} {unit}"
    return f"{nbytes / (1 << 30):.2f} GiB"


def parse_oom(text: str) -> OomReport:
    """Parse a CUDA out-of-memory message of any PyTorch version (see the module docstring). Chapter 16.

    Raises:
        MemlibError: the text is not such a message (one line naming what was missing).
    """
    flat = " ".join(text.split())
    if not re.search(r"(CUDA|HIP) out of memory", flat):
        raise MemlibError("not a PyTorch out-of-memory message: expected 'CUDA out of memory. Tried to allocate "
                          f"...' (got {flat[:60]!r})")
    requested = _find(r"Tried to allocate SIZE", flat)
    dev = re.search(r"GPU (\d+)", flat)
    device = int(dev.group(1)) if dev else 0
    allowed = _find(r"SIZE allowed", flat)
    if "total capac" in flat and "already allocated" in flat:  # 1.x: "(GPU 0; X total capacity; ...)"
        total = _find(r"SIZE total capac", flat)
        allocated = _find(r"SIZE already allocated", flat)
        free = _find(r"SIZE free", flat)
        reserved = _find(r"SIZE reserved in total", flat)
        cached = _find(r"SIZE cached", flat)
        if None in (requested, total, allocated, free) or (reserved is None and cached is None):
            raise MemlibError("incomplete PyTorch 1.x out-of-memory message: expected 'Tried to allocate', 'total "
                              "capacity', 'already allocated', 'free' and 'reserved in total' (or 'cached')")
        assert requested is not None and total is not None and allocated is not None and free is not None
        if reserved is None:
            assert cached is not None
            fmt, reserved = "1.0", allocated + cached
        else:
            fmt = "1.x"
        return OomReport(fmt, device, requested, total, free, allocated, reserved, max(0, reserved - allocated),
                         allowed_bytes=allowed)
    total = _find(r"total capac\w* of SIZE", flat)
    free = _find(r"of which SIZE is free", flat)
    process = _find(r"this process has SIZE memory in use", flat)
    allocated = _find(r"SIZE is allocated by PyTorch", flat)
    unalloc = _find(r"SIZE is reserved by PyTorch but unallocated", flat)
    if None in (requested, total, free, allocated, unalloc):
        raise MemlibError("incomplete PyTorch 2.x out-of-memory message: expected 'Tried to allocate', 'total "
                          "capacity of', 'of which ... is free', 'is allocated by PyTorch' and 'is reserved by "
                          "PyTorch but unallocated' (is the message cut?)")
    assert requested is not None and total is not None and free is not None
    assert allocated is not None and unalloc is not None
    others = [_bytes(m.group(1), m.group(2)) for m in re.finditer(r"Process \d+ has " + _SIZE + " memory in use",
                                                                  flat)]
    if others and process is not None and sum(others) > 1.01 * (total - free - process) + (1 << 20):
        # In a container NVML's process ids are not the process's own: this process is listed as "Process N"
        # too. What is used (total - free) cannot hold both; drop the listed process closest to this one.
        others.remove(min(others, key=lambda b: abs(b - process)))
    return OomReport("2.x", device, requested, total, free, allocated, allocated + unalloc, unalloc,
                     allowed_bytes=allowed, process_bytes=process,
                     other_processes_bytes=sum(others) if others else None)


def diagnose(report: OomReport) -> str:
    """The verdict (:data:`VERDICTS`) of an OOM. Chapter 16.

    ``too-large`` when the request exceeds what the GPU could give this process even with nothing else on it:
    its total capacity (or the ``allowed`` cap) less this process's non-PyTorch memory (the CUDA context, which
    cannot go). Under a memory fraction, free is at most ``allowed`` less reserved. ``fragmentation`` when free < request ≤ free + reserved-but-unallocated: the bytes exist, in
    cached pieces of PyTorch's segments that no single block or new segment can use. Otherwise
    ``insufficient``: the job needs less memory.
    """
    limit = report.allowed_bytes if report.allowed_bytes is not None else report.total_bytes
    if report.requested_bytes > limit - (report.non_pytorch_bytes or 0):
        return "too-large"
    free = report.free_bytes
    if report.allowed_bytes is not None:  # under a memory fraction, what PyTorch may still take
        free = min(free, max(0, report.allowed_bytes - report.reserved_bytes))
    if free < report.requested_bytes <= free + report.reserved_unallocated_bytes:
        return "fragmentation"
    return "insufficient"


_ADVICE: dict[str, tuple[str, ...]] = {
    "too-large": (
        "one tensor is larger than the GPU: find it (the traceback's op; often the logits, (batch, seq, vocab) "
        "in fp32, or an attention score matrix) and split it: a smaller micro-batch with gradient accumulation "
        "(Chapter 5, Gradient accumulation), a chunked loss, FlashAttention instead of eager attention "
        "(Chapter 10, FlashAttention)",
        "shard what one GPU holds: ZeRO/FSDP (Chapter 6, ZeRO and FSDP) or tensor/context parallelism "
        "(Chapter 15, Tensor, pipeline, context and expert parallelism)",
        "check the size is meant: a wrong shape (a broadcast, a missing .view) asks for absurd memory"),
    "fragmentation": (
        "set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True before the first CUDA allocation: segments grow "
        "and unmapped pages return, so cached pieces stop blocking a new segment (Chapter 16, Out of memory)",
        "or max_split_size_mb (e.g. 128) so large cached blocks are not split into unusable remainders; "
        "garbage_collection_threshold releases old cached blocks early",
        "keep shapes steady (pad variable sequence lengths to a few buckets): each new size makes new segments",
        "torch.cuda.empty_cache() rarely helps here: it frees only whole unused segments, which the allocator "
        "already released before raising this error (Chapter 16, Out of memory)"),
    "insufficient": (
        "reduce what a step holds: a smaller micro-batch with gradient accumulation (Chapter 5, Gradient "
        "accumulation), activation recomputation (Chapter 4, Activations and gradient checkpointing), mixed "
        "precision (Chapter 3, Mixed precision and loss scaling)",
        "shrink or move the model states: ZeRO/FSDP sharding (Chapter 6, ZeRO and FSDP), an 8-bit optimizer "
        "(Chapter 8, 8-bit optimizers), LoRA/QLoRA (Chapter 9), offloading (Chapter 7, Offloading)",
        "look for leaks: a loss kept with its graph (total += loss instead of loss.item()), outputs kept across "
        "steps, evaluation without torch.no_grad() (Chapter 16, Out of memory); a memory snapshot shows who "
        "holds the bytes (Chapter 12, GPU utilization and profiling)",
        "plan it before running: memlib plan MODEL --gpu-mem SIZE (Chapter 13, Putting it together)"),
}


def advice(verdict: str) -> tuple[str, ...]:
    """What to do for a verdict, each line naming the chapter that explains it. Chapter 16."""
    if verdict not in _ADVICE:
        raise MemlibError(f"unknown verdict {verdict!r}; expected one of: {', '.join(VERDICTS)}")
    return _ADVICE[verdict]


def oom_dict(report: OomReport) -> dict[str, Any]:
    """The JSON of ``memlib oom --json``: the report's fields, the derived ones and the verdict."""
    data = dataclasses.asdict(report)
    data["non_pytorch_bytes"] = report.non_pytorch_bytes
    data["others_bytes"] = report.others_bytes
    data["verdict"] = diagnose(report)
    data["advice"] = list(advice(data["verdict"]))
    return data


def oom_text(report: OomReport) -> str:
    """The text of ``memlib oom``: the figures (GiB), how they add up, the verdict and what to do."""
    def line(name: str, value: int | None, note: str = "") -> str | None:
        return None if value is None else f"  {name:<30} {format_size(value):>12}{note}"

    verdict = diagnose(report)
    rows = [line("requested", report.requested_bytes, "  (the segment PyTorch asked cudaMalloc for)"),
            line("total capacity", report.total_bytes),
            line("allowed (memory fraction)", report.allowed_bytes),
            line("free", report.free_bytes),
            line("this process", report.process_bytes),
            line("  allocated by PyTorch", report.allocated_bytes),
            line("  reserved, unallocated", report.reserved_unallocated_bytes,
                 "  (cached in PyTorch's segments)"),
            line("  non-PyTorch", report.non_pytorch_bytes, "  (CUDA context, cuBLAS/cuDNN, NCCL)"),
            line("other processes", report.other_processes_bytes),
            line("other processes, driver" if report.process_bytes is not None
                 else "neither free nor PyTorch's", report.others_bytes,
                 "  (total - free - this process)" if report.process_bytes is not None
                 else "  (CUDA context, libraries, other processes)")]
    head = f"CUDA out of memory on GPU {report.device} (PyTorch {report.format} message)"
    why = {"too-large": "the request exceeds what this GPU can ever give the process",
           "fragmentation": "free < request <= free + reserved-but-unallocated: the memory is there, in cached "
                            "pieces of PyTorch's segments",
           "insufficient": "free + reserved-but-unallocated < request: the job needs less memory"}[verdict]
    out = [head] + [r for r in rows if r is not None] + [f"verdict: {verdict}: {why}"]
    if report.free_bytes >= report.requested_bytes and report.allowed_bytes is None:
        out.append("note: free memory now covers the request: it was freed after the failure (another process, or "
                   "PyTorch's own cache released at the failure) or the failed request was a whole new segment")
    out += [f"  - {a}" for a in advice(verdict)]
    return "\n".join(out)
