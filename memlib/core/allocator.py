"""PyTorch's CUDA caching allocator in pure Python: reserved memory from an alloc/free sequence (Chapter 16).

No torch. :class:`CachingAllocator` follows the rules of ``c10/cuda/CUDACachingAllocator.cpp``
(``DeviceCachingAllocator``, PyTorch 2.x; the function named in each docstring is the one whose rule it copies)
for one device and one stream: sizes rounded (``round_size``), the small and large pools (``get_pool``), the
segment a ``cudaMalloc`` asks for (``get_allocation_size``), best fit among cached free blocks
(``get_free_block``), splitting (``should_split``, ``alloc_found_block``), freeing and merging with free
neighbours (``free_block``, ``try_merge_blocks``), releasing cached segments and retrying before an
out-of-memory error (``malloc``: ``release_available_cached_blocks``, ``release_cached_blocks``),
``garbage_collection_threshold`` (``garbage_collect_cached_blocks``) and ``expandable_segments``
(``ExpandableSegment``, ``try_allocate_expandable_block``). The options are those of ``PYTORCH_CUDA_ALLOC_CONF``
(``c10/cuda/CUDAAllocatorConfig.cpp``).

:func:`replay` runs a list of events ``["alloc", nbytes]`` / ``["free", i]`` (``i``: the index of the alloc event
freed) and returns the peaks of allocated and reserved bytes, as ``torch.cuda.max_memory_allocated()`` and
``torch.cuda.max_memory_reserved()`` would report them.

Limitations: one stream (no cross-stream events, ``record_stream``), no CUDA graph private pools, no
``release_lock_on_cudamalloc`` races; the device's capacity is the only other user of memory (``capacity``:
what ``cudaMalloc`` can still get, i.e. the GPU's memory less the CUDA context and other processes); an
expandable segment grows and shrinks at its end only (PyTorch also unmaps free pages inside it and maps into
such holes first, ``find_expandable_block``).
"""
from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Iterable, Sequence
from typing import Any

from .errors import MemlibError

__all__ = ["K_MIN_BLOCK_SIZE", "K_SMALL_SIZE", "K_SMALL_BUFFER", "K_LARGE_BUFFER", "K_MIN_LARGE_ALLOC",
           "K_ROUND_LARGE", "AllocatorConfig", "CachingAllocator", "Segment", "round_size",
           "get_allocation_size", "replay", "events_from_log", "steady_state_events",
           "reserved_peaks"]

MiB = 1 << 20
#: ``kMinBlockSize``: all sizes are rounded to at least 512 bytes.
K_MIN_BLOCK_SIZE = 512
#: ``kSmallSize``: the largest "small" allocation is 1 MiB.
K_SMALL_SIZE = 1 * MiB
#: ``kSmallBuffer``: "small" allocations are packed in 2 MiB segments.
K_SMALL_BUFFER = 2 * MiB
#: ``kLargeBuffer``: allocations between 1 and 10 MiB may use a 20 MiB segment.
K_LARGE_BUFFER = 20 * MiB
#: ``kMinLargeAlloc``: allocations between 1 and 10 MiB use ``kLargeBuffer``.
K_MIN_LARGE_ALLOC = 10 * MiB
#: ``kRoundLarge``: larger segments are rounded up to 2 MiB.
K_ROUND_LARGE = 2 * MiB
_NO_LIMIT = 1 << 62  # max_split_size's default: std::numeric_limits<size_t>::max()
_ADDRESS_SPACE = 1 << 50  # an expandable segment's virtual address range: more than any GPU's memory


@dataclasses.dataclass(frozen=True)
class AllocatorConfig:
    """The ``PYTORCH_CUDA_ALLOC_CONF`` options the simulator follows (``CUDAAllocatorConfig``). Chapter 16.

    Attributes:
        expandable_segments: one segment per pool that grows by pages (2 MiB small, 20 MiB large).
        max_split_size_mb: blocks of this size or larger are never split (None: no limit).
        garbage_collection_threshold: fraction of ``capacity`` above which cached, unsplit large blocks are
            released before a new ``cudaMalloc`` (0: off; needs a capacity, as PyTorch needs a memory fraction).
        roundup_power2_divisions: round requests up to one of this many steps between powers of two (0 or 1:
            off; one value for every size, the option's single-number form).
    """

    expandable_segments: bool = False
    max_split_size_mb: int | None = None
    garbage_collection_threshold: float = 0.0
    roundup_power2_divisions: int = 0

    def __post_init__(self) -> None:
        if self.max_split_size_mb is not None and self.max_split_size_mb * MiB <= K_LARGE_BUFFER:
            # CUDAAllocatorConfig::parseMaxSplitSize: "CachingAllocator option max_split_size_mb too small"
            raise MemlibError(f"max_split_size_mb {self.max_split_size_mb!r} too small; expected more than "
                              f"{K_LARGE_BUFFER // MiB}")
        if not 0.0 <= self.garbage_collection_threshold < 1.0:
            raise MemlibError(f"garbage_collection_threshold {self.garbage_collection_threshold!r} out of range; "
                              "expected 0.0 <= value < 1.0")
        d = self.roundup_power2_divisions
        if d < 0 or (d > 1 and d & (d - 1)):
            raise MemlibError(f"roundup_power2_divisions {d!r} is not a power of 2; expected one of: 0, 1, 2, 4, 8, ...")

    @property
    def max_split_size(self) -> int:
        """``CUDAAllocatorConfig::max_split_size()`` in bytes."""
        return _NO_LIMIT if self.max_split_size_mb is None else self.max_split_size_mb * MiB


def _roundup_power2_next_division(size: int, divisions: int) -> int:
    """``roundup_power2_next_division``: 1200 B with 4 divisions of [1024, 2048) rounds up to 1280 B."""
    if size & (size - 1) == 0:
        return size
    floor = 1 << (size.bit_length() - 1)
    step = floor >> (divisions.bit_length() - 1)
    if step == 0:
        return floor << 1
    low = size & ~(step - 1)
    return size if low == size else low + step


def round_size(size: int, config: AllocatorConfig = AllocatorConfig()) -> int:
    """``round_size``: at least ``kMinBlockSize`` (512 B), then a multiple of 512 B (or a power-2 division)."""
    if size < K_MIN_BLOCK_SIZE:
        return K_MIN_BLOCK_SIZE
    d = config.roundup_power2_divisions
    if d > 1 and size > K_MIN_BLOCK_SIZE * d:
        return _roundup_power2_next_division(size, d)
    return K_MIN_BLOCK_SIZE * ((size + K_MIN_BLOCK_SIZE - 1) // K_MIN_BLOCK_SIZE)


def get_allocation_size(size: int) -> int:
    """``get_allocation_size``: the segment a new ``cudaMalloc`` asks for a (rounded) request of ``size`` bytes.

    ≤ 1 MiB (``kSmallSize``): a 2 MiB segment (``kSmallBuffer``); < 10 MiB (``kMinLargeAlloc``): 20 MiB
    (``kLargeBuffer``); larger: the size rounded up to 2 MiB (``kRoundLarge``).
    """
    if size <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if size < K_MIN_LARGE_ALLOC:
        return K_LARGE_BUFFER
    return K_ROUND_LARGE * ((size + K_ROUND_LARGE - 1) // K_ROUND_LARGE)


@dataclasses.dataclass(eq=False)
class _Block:
    """``Block``: a piece of a segment, free or allocated, linked to its neighbours (``prev``, ``next``)."""

    addr: int
    size: int
    small: bool
    segment: Segment
    allocated: bool = False
    mapped: bool = True
    requested: int = 0  # requested_size: the bytes asked for (size is the rounded block)
    prev: _Block | None = None
    next: _Block | None = None
    gc_base: int = 0  # pool's get_free_blocks_call_count when cached (gc_count_base)

    def is_split(self) -> bool:
        return self.prev is not None or self.next is not None


@dataclasses.dataclass(eq=False)
class Segment:
    """One ``cudaMalloc`` (or one expandable segment): its address, size (mapped bytes) and pool."""

    addr: int
    size: int
    small: bool
    expandable: bool = False


def _neighbours(blocks: list[_Block], b: _Block) -> tuple[_Block | None, _Block | None]:
    """The blocks before and after ``b`` in an expandable segment's address-ordered list."""
    i = blocks.index(b)
    return (blocks[i - 1] if i > 0 else None), (blocks[i + 1] if i + 1 < len(blocks) else None)


class CachingAllocator:
    """One device's ``DeviceCachingAllocator`` with one stream. Chapter 16.

    Args:
        capacity: bytes ``cudaMalloc`` can get in all (None: unlimited). With it, a request that no cached block
            serves and no new segment fits raises ``MemoryError`` after the releases PyTorch tries.
        config: the ``PYTORCH_CUDA_ALLOC_CONF`` options.

    Attributes:
        allocated, reserved: ``memory_allocated()`` and ``memory_reserved()``: bytes of allocated blocks and of
            segments; ``peak_allocated``, ``peak_reserved`` their maxima.
        segments: live segments, in the order they were made.
        num_alloc_retries, num_device_alloc, num_device_free: the counters of ``memory_stats()``.
    """

    def __init__(self, capacity: int | None = None, config: AllocatorConfig = AllocatorConfig(),
                 record: bool = False) -> None:
        if capacity is not None and capacity <= 0:
            raise MemlibError(f"capacity {capacity!r} must be positive bytes")
        self.capacity = capacity
        self.config = config
        # pools of cached free blocks, sorted as BlockComparatorSize: (size, address)
        self._free: dict[bool, list[tuple[int, int, _Block]]] = {True: [], False: []}
        self._calls: dict[bool, int] = {True: 0, False: 0}  # get_free_blocks_call_count
        self._es: dict[bool, Segment | None] = {True: None, False: None}  # expandable segment per pool
        self._es_blocks: dict[bool, list[_Block]] = {True: [], False: []}
        self._next_addr = 0
        self.segments: list[Segment] = []
        self.allocated = self.reserved = 0
        self.peak_allocated = self.peak_reserved = 0
        self.num_alloc_retries = self.num_device_alloc = self.num_device_free = 0
        self._active: dict[int, _Block] = {}  # allocated blocks by address
        #: with ``record``, the history as ``torch.cuda.memory._snapshot()["device_traces"][0]`` holds it
        self.trace: list[dict[str, Any]] | None = [] if record else None

    def _record(self, action: str, addr: int, size: int) -> None:
        """``record_trace``: one ``TraceEntry`` (``alloc``, ``free_completed``, ``segment_alloc``, ...)."""
        if self.trace is not None:
            self.trace.append({"action": action, "addr": addr, "size": size, "stream": 0, "frames": [],
                               "time_us": len(self.trace)})

    # ------------------------------------------------------------------------------------------ free pools
    def _insert(self, b: _Block) -> None:
        """``BlockPool::insert_into_blocks``: cache a free block (and note when, for garbage collection)."""
        b.gc_base = self._calls[b.small]
        bisect.insort(self._free[b.small], (b.size, b.addr, b))

    def _remove(self, b: _Block) -> None:
        pool = self._free[b.small]
        i = bisect.bisect_left(pool, (b.size, b.addr), key=lambda e: (e[0], e[1]))
        assert pool[i][2] is b
        del pool[i]

    def _get_free_block(self, size: int, small: bool) -> _Block | None:
        """``get_free_block``: the smallest cached block ≥ ``size`` (ties: lowest address), within the
        ``max_split_size`` rules: an oversize block (≥ max_split_size) never serves a smaller request, and
        serves an oversize one only if it is less than ``kLargeBuffer`` (20 MiB) larger."""
        if self.config.garbage_collection_threshold > 0 and self.capacity is not None:
            self._calls[small] += 1
        pool = self._free[small]
        i = bisect.bisect_left(pool, (size, -1), key=lambda e: (e[0], e[1]))
        if i == len(pool):
            return None
        if self.config.expandable_segments and pool[i][2].segment.expandable:
            # best fit counts an expandable block's unmapped tail (expandable_size)
            blocks = self._es_blocks[small]

            def grow(b: _Block) -> int:  # expandable_size: a free block may grow into unmapped space after it
                nxt = _neighbours(blocks, b)[1]
                return b.size + (nxt.size if nxt is not None and not nxt.mapped else 0)
            while i + 1 < len(pool) and grow(pool[i + 1][2]) < grow(pool[i][2]):
                i += 1
        b = pool[i][2]
        mss = self.config.max_split_size
        if size < mss and b.size >= mss:
            return None
        if size >= mss and b.size >= size + K_LARGE_BUFFER:
            return None
        del pool[i]
        return b

    def _should_split(self, b: _Block, size: int) -> bool:
        """``should_split``: small pool or expandable: remainder ≥ 512 B; large pool: request below
        ``max_split_size`` and remainder > 1 MiB (``kSmallSize``)."""
        remaining = b.size - size
        if b.small or self.config.expandable_segments:
            return remaining >= K_MIN_BLOCK_SIZE
        return size < self.config.max_split_size and remaining > K_SMALL_SIZE

    # --------------------------------------------------------------------------------------- segments
    def _fits(self, nbytes: int) -> bool:
        return self.capacity is None or self.reserved + nbytes <= self.capacity

    def _grow(self, nbytes: int) -> None:
        self.reserved += nbytes
        self.peak_reserved = max(self.peak_reserved, self.reserved)
        self.num_device_alloc += 1

    def _alloc_block(self, size: int, small: bool) -> _Block | None:
        """``alloc_block``: a new segment of ``get_allocation_size`` bytes, or None if ``cudaMalloc`` fails."""
        if self.config.expandable_segments:
            return self._alloc_expandable(size, small)
        nbytes = get_allocation_size(size)
        if not self._fits(nbytes):
            return None
        seg = Segment(self._next_addr, nbytes, small)
        self._next_addr += nbytes
        self.segments.append(seg)
        self._grow(nbytes)
        self._record("segment_alloc", seg.addr, nbytes)
        return _Block(seg.addr, nbytes, small, seg)

    def _alloc_expandable(self, size: int, small: bool) -> _Block | None:
        """``try_allocate_expandable_block``: in the pool's one segment, take the lowest address where free and
        unmapped blocks together hold ``size`` (``find_expandable_block``) and map pages there (2 MiB in the
        small pool, 20 MiB in the large one), merging them with free neighbours (``map_block``)."""
        if self._es[small] is None:
            seg = Segment(self._next_addr, 0, small, expandable=True)
            self._next_addr += _ADDRESS_SPACE  # cuMemAddressReserve: address space for the whole GPU
            self._es[small] = seg
            self.segments.append(seg)
            self._es_blocks[small] = [_Block(seg.addr, _ADDRESS_SPACE, small, seg, mapped=False)]
        blocks = self._es_blocks[small]
        start = None
        for i, u in enumerate(blocks):
            if u.mapped:
                continue
            j = i - 1 if i > 0 and not blocks[i - 1].allocated else i
            room, k = 0, j
            while room < size and k < len(blocks) and not blocks[k].allocated:
                room += blocks[k].size
                k += 1
            if room >= size:
                start = j
                break
        assert start is not None  # the last unmapped block spans the rest of the address space
        c = blocks[start]
        if not c.mapped:
            m = self._map(small, start, min(c.size, size))
            if m is None:
                return None
            c = m
        while c.size < size:
            i = blocks.index(c)
            m = self._map(small, i + 1, min(size - c.size, blocks[i + 1].size))
            if m is None:
                return None
            c = m
        self._remove(c)
        return c

    def _map(self, small: bool, i: int, nbytes: int) -> _Block | None:
        """``map_block``: map the first ``nbytes`` (rounded up to pages) of unmapped block ``i``; the new free
        block merges with free neighbours (``try_merge_blocks``) and is cached. None if the memory is not there."""
        blocks, seg = self._es_blocks[small], self._es[small]
        assert seg is not None
        page = K_SMALL_BUFFER if small else K_LARGE_BUFFER
        u = blocks[i]
        n = min(u.size, -(-nbytes // page) * page)
        if not self._fits(n):
            return None
        b = _Block(u.addr, n, small, seg)
        u.addr += n
        u.size -= n
        blocks.insert(i, b)
        if u.size == 0:
            blocks.remove(u)
        seg.size += n
        self._grow(n)
        self._record("segment_map", b.addr, n)
        self._merge_free(b, blocks)
        self._insert(b)
        return b

    def _merge_free(self, b: _Block, blocks: list[_Block] | None) -> None:
        """``try_merge_blocks``: absorb free neighbours with the same mapping into ``b`` (not cached)."""
        for other in (b.prev, b.next) if blocks is None else _neighbours(blocks, b):
            if other is None or other.allocated or other.mapped != b.mapped:
                continue
            if other.mapped:
                self._remove(other)
            if blocks is not None:
                if other.addr < b.addr:
                    b.addr = other.addr
                b.size += other.size
                blocks.remove(other)
                continue
            if other is b.prev:
                b.addr, b.prev = other.addr, other.prev
                if b.prev is not None:
                    b.prev.next = b
            else:
                b.next = other.next
                if b.next is not None:
                    b.next.prev = b
            b.size += other.size

    def _release_segment(self, b: _Block) -> None:
        """``release_block``: ``cudaFree`` an unsplit cached block (a whole segment)."""
        self._remove(b)
        self.segments.remove(b.segment)
        self.reserved -= b.size
        self._record("segment_free", b.addr, b.size)
        self.num_device_free += 1

    def _unmap(self, b: _Block) -> None:
        """``unmap_block``: unmap the whole pages inside the free block ``b`` of an expandable segment; what is
        left before and after them stays cached, the unmapped range merges with unmapped neighbours."""
        blocks, seg = self._es_blocks[b.small], b.segment
        page = K_SMALL_BUFFER if b.small else K_LARGE_BUFFER
        base = seg.addr  # pages are aligned to the segment's start
        begin = base + -(-(b.addr - base) // page) * page
        end = base + (b.addr + b.size - base) // page * page
        if end <= begin:
            return
        self._remove(b)
        i = blocks.index(b)
        pieces = [_Block(b.addr, begin - b.addr, b.small, seg), _Block(begin, end - begin, b.small, seg, mapped=False),
                  _Block(end, b.addr + b.size - end, b.small, seg)]
        pieces = [x for x in pieces if x.size]
        blocks[i:i + 1] = pieces
        for x in pieces:
            if x.mapped:
                self._insert(x)
        gap = next(x for x in pieces if not x.mapped)
        self._merge_free(gap, blocks)
        seg.size -= end - begin
        self.reserved -= end - begin
        self._record("segment_unmap", begin, end - begin)
        self.num_device_free += 1

    def release_cached_blocks(self) -> None:
        """``release_cached_blocks`` (what ``torch.cuda.empty_cache()`` runs): ``cudaFree`` every cached block
        that is a whole segment (unsplit), and unmap the free pages of expandable segments."""
        for small in (False, True):
            for _, _, b in list(self._free[small]):
                if b.segment.expandable:
                    self._unmap(b)
                elif not b.is_split():
                    self._release_segment(b)

    def _release_available_cached_blocks(self, size: int, small: bool) -> bool:
        """``release_available_cached_blocks``: with ``max_split_size``, free oversize cached blocks (the
        smallest one ≥ the request, else the largest ones until enough is freed)."""
        mss = self.config.max_split_size
        if mss == _NO_LIMIT:
            return False
        key = max(size, mss)
        pool = [e[2] for e in self._free[small] if not e[2].segment.expandable]
        fit = [b for b in pool if b.size >= key]
        if fit:  # oversize blocks are never split (should_split), so each is a whole segment
            self._release_segment(fit[0])
            return True
        released = 0
        for b in reversed(pool):
            if released >= key or b.size < mss:
                break
            if not b.is_split():
                released += b.size
                self._release_segment(b)
        return released >= key

    def _garbage_collect(self) -> None:
        """``garbage_collect_cached_blocks``: above ``threshold × capacity`` reserved, release unsplit cached large
        blocks of at least the average age (calls to ``get_free_block`` since cached), oldest first rounds."""
        assert self.capacity is not None
        threshold = int(self.config.garbage_collection_threshold * self.capacity)
        if self.reserved <= threshold:
            return
        target = self.reserved - threshold
        cands = [e[2] for e in self._free[False] if not e[2].is_split() and not e[2].segment.expandable]
        reclaimed = 0
        while cands and reclaimed < target:
            ages = {id(b): self._calls[False] - b.gc_base for b in cands}
            avg = sum(ages.values()) / len(cands)
            old = [b for b in cands if ages[id(b)] >= avg]
            for b in old:
                reclaimed += b.size
                self._release_segment(b)
            cands = [b for b in cands if b not in old]

    # -------------------------------------------------------------------------------------- public API
    def malloc(self, nbytes: int) -> _Block:
        """``DeviceCachingAllocator::malloc``: serve ``nbytes``; raise ``MemoryError`` when nothing can.

        Order, as PyTorch: a cached block (``get_free_block``); else garbage collection (if configured), a new
        segment (``alloc_block``); on failure, free oversize cached blocks and retry
        (``release_available_cached_blocks``), then free every unsplit cached block and retry
        (``release_cached_blocks``); then out of memory.
        """
        if nbytes < 0:
            raise MemlibError(f"allocation of {nbytes!r} bytes; expected a non-negative size")
        size = round_size(nbytes, self.config)
        small = size <= K_SMALL_SIZE
        b = self._get_free_block(size, small)
        if b is None:
            if self.config.garbage_collection_threshold > 0 and self.capacity is not None:
                self._garbage_collect()
            b = self._alloc_block(size, small)
            if b is None and self._release_available_cached_blocks(size, small):
                b = self._alloc_block(size, small)
            if b is None:
                self.num_alloc_retries += 1
                self.release_cached_blocks()
                b = self._alloc_block(size, small)
            if b is None:
                raise MemoryError(f"out of memory: tried to allocate {get_allocation_size(size)} bytes with "
                                  f"{self.reserved} reserved of {self.capacity}")
        if self._should_split(b, size):  # alloc_found_block: the remainder goes back to the pool
            rest = _Block(b.addr + size, b.size - size, small, b.segment)
            if b.segment.expandable:  # an expandable segment's blocks are its address-ordered list
                blocks = self._es_blocks[small]
                blocks.insert(blocks.index(b) + 1, rest)
            else:
                rest.prev, rest.next = b, b.next
                if b.next is not None:
                    b.next.prev = rest
                b.next = rest
            b.size = size
            self._insert(rest)
        b.allocated = True
        b.requested = nbytes
        self._active[b.addr] = b
        self._record("alloc", b.addr, nbytes)
        self.allocated += b.size
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        return b

    def free(self, b: _Block) -> None:
        """``free`` → ``free_block``: back to its pool, merged with free neighbours (``try_merge_blocks``)."""
        if not b.allocated:
            raise MemlibError("block freed twice")
        b.allocated = False
        self.allocated -= b.size
        del self._active[b.addr]
        self._record("free_requested", b.addr, b.requested)
        self._record("free_completed", b.addr, b.requested)
        self._merge_free(b, self._es_blocks[b.small] if b.segment.expandable else None)
        self._insert(b)

    def snapshot(self) -> dict[str, Any]:
        """The state as ``torch.cuda.memory._snapshot()`` returns it: ``segments`` (each with its ``blocks``,
        ``active_allocated`` or ``inactive``) and ``device_traces`` (with ``record=True``), so that
        ``torch.cuda._memory_viz`` (``segsum``, ``trace_plot``, ``segment_plot``) reads it. Chapter 16."""
        by_seg: dict[int, list[_Block]] = {id(seg): [] for seg in self.segments}
        for b in [*self._active.values(), *(e[2] for pool in self._free.values() for e in pool)]:
            by_seg[id(b.segment)].append(b)
        segments: list[dict[str, Any]] = []
        for seg in sorted(self.segments, key=lambda x: x.addr):
            blocks = sorted(by_seg[id(seg)], key=lambda x: x.addr)
            rows: list[dict[str, Any]] = [{"address": b.addr, "size": b.size, "requested_size": b.requested if b.allocated else b.size,
                     "state": "active_allocated" if b.allocated else "inactive", "frames": []} for b in blocks]
            allocated = sum(b.size for b in blocks if b.allocated)
            segments.append({"device": 0, "address": blocks[0].addr if blocks else seg.addr,
                             "total_size": sum(b.size for b in blocks), "stream": 0,
                             "segment_type": "small" if seg.small else "large", "segment_pool_id": (0, 0),
                             "allocated_size": allocated, "active_size": allocated,
                             "requested_size": sum(b.requested for b in blocks if b.allocated),
                             "expandable": seg.expandable, "frames": [], "blocks": rows})
        return {"segments": segments, "device_traces": [list(self.trace or [])],
                "allocator_settings": {"expandable_segments": self.config.expandable_segments}}

    def empty_cache(self) -> None:
        """``torch.cuda.empty_cache()``: :meth:`release_cached_blocks`."""
        self.release_cached_blocks()

    def inactive_split_bytes(self) -> int:
        """``inactive_split_bytes``: cached free bytes in segments that are partly allocated (fragmentation);
        as PyTorch's statistic, blocks of expandable segments are left out (their free pages can be unmapped)."""
        return sum(e[0] for pool in self._free.values() for e in pool
                   if e[2].is_split() and not e[2].segment.expandable)


def replay(events: Sequence[Sequence[Any]], capacity: int | None = None, expandable_segments: bool = False,
           max_split_size_mb: int | None = None, garbage_collection_threshold: float = 0.0,
           roundup_power2_divisions: int = 0, timeline: bool = False) -> dict[str, Any]:
    """Replay an alloc/free sequence through :class:`CachingAllocator`. Chapter 16.

    Args:
        events: ``["alloc", nbytes]`` and ``["free", i]``, ``i`` the index (in ``events``) of the alloc freed.
        capacity: bytes ``cudaMalloc`` can get (None: unlimited).
        expandable_segments, max_split_size_mb, garbage_collection_threshold, roundup_power2_divisions: the
            ``PYTORCH_CUDA_ALLOC_CONF`` options (:class:`AllocatorConfig`).
        timeline: also return ``timeline``: ``(allocated, reserved)`` after every event.

    Returns:
        ``peak_allocated``, ``peak_reserved``, ``allocated`` and ``reserved`` (at the end), ``num_segments``
        (live at the end), ``num_alloc_retries``, ``num_device_alloc``, ``inactive_split_bytes`` (at the end),
        ``oom`` (True if an allocation failed: the replay stops there), ``oom_event`` (its index or None) and
        ``oom_request_bytes`` (what PyTorch's message says it "Tried to allocate": ``get_allocation_size``).
        Allocated bytes count whole blocks, as ``torch.cuda.memory_allocated()`` does.
    """
    config = AllocatorConfig(expandable_segments, max_split_size_mb, garbage_collection_threshold,
                             roundup_power2_divisions)
    alloc = CachingAllocator(capacity, config)
    live: dict[int, _Block] = {}
    steps: list[tuple[int, int]] = []
    oom_event: int | None = None
    for n, ev in enumerate(events):
        kind = ev[0]
        if kind == "alloc":
            try:
                live[n] = alloc.malloc(int(ev[1]))
            except MemoryError:
                oom_event = n
                break
        elif kind == "free":
            i = int(ev[1])
            if i not in live:
                raise MemlibError(f"event {n} frees {i!r}, which is not a live alloc event")
            alloc.free(live.pop(i))
        else:
            raise MemlibError(f"unknown event {kind!r} at {n}; expected one of: alloc, free")
        if timeline:
            steps.append((alloc.allocated, alloc.reserved))
    out: dict[str, Any] = {
        "peak_allocated": alloc.peak_allocated, "peak_reserved": alloc.peak_reserved,
        "allocated": alloc.allocated, "reserved": alloc.reserved, "num_segments": len(alloc.segments),
        "num_alloc_retries": alloc.num_alloc_retries, "num_device_alloc": alloc.num_device_alloc,
        "inactive_split_bytes": alloc.inactive_split_bytes(), "oom": oom_event is not None,
        "oom_event": oom_event,
        "oom_request_bytes": None if oom_event is None else get_allocation_size(round_size(int(events[oom_event][1]),
                                                                                          config))}
    if timeline:
        out["timeline"] = steps
    return out


def events_from_log(log: Iterable[tuple[str, int, int]]) -> list[list[Any]]:
    """Turn a tracker log ``(action, key, nbytes)`` (``MemoryTracker(on_event=...)``) into :func:`replay` events.

    Keys are storage identities that may be reused after a free; a free of a key never allocated in the log
    (a storage made before the log began) is dropped. Chapter 16.
    """
    out: list[list[Any]] = []
    open_: dict[int, int] = {}
    for action, key, nbytes in log:
        if action == "alloc":
            open_[key] = len(out)
            out.append(["alloc", int(nbytes)])
        elif action == "free" and key in open_:
            out.append(["free", open_.pop(key)])
    return out


def steady_state_events(setup: Iterable[tuple[str, int, int]], step: Iterable[tuple[str, int, int]],
                        steps: int = 2) -> list[list[Any]]:
    """:func:`replay` events of ``steps`` training steps from a tracker log of the setup and of one step.

    ``setup`` holds what exists before the step (parameters, optimizer states, inputs: its allocations stay live);
    ``step`` is the log of one step (a free there of a setup storage is dropped: that storage stays counted). Each repetition of the step allocates anew; what a step leaves alive (a
    tensor the next step's assignment would drop) is freed when the next step begins. A real GPU measures the
    second step (``torch.cuda.max_memory_reserved`` after ``reset_peak_memory_stats``) on a cache the first left
    behind: the default ``steps=2`` replays that. Without a capacity reserved memory never shrinks, so the
    replay's ``peak_reserved`` is the second step's. Chapter 16.
    """
    if steps < 1:
        raise MemlibError(f"steps {steps!r} must be at least 1")
    events = events_from_log(setup)
    base = events_from_log(step)
    left: list[int] = []
    for _ in range(steps):
        for i in left:
            events.append(["free", i])
        offset = len(events)
        freed: set[int] = set()
        for e in base:
            if e[0] == "alloc":
                events.append(e)
            else:
                events.append(["free", int(e[1]) + offset])
                freed.add(int(e[1]))
        left = [i + offset for i, e in enumerate(base) if e[0] == "alloc" and i not in freed]
    return events


def reserved_peaks(log: Sequence[tuple[str, int, int]],
                   expandable_segments: bool = False) -> tuple[list[list[Any]], int, int | None]:
    """The events, reserved peak and (with ``expandable_segments``) expandable reserved peak of a traced step.

    ``log``: a tracker log in which ``("step", 0, 0)`` marks where the step begins (what
    ``memlib.measure.trace.trace_training(reserved=True)`` records); :func:`steady_state_events` makes two steps
    of it. Chapter 16.
    """
    split = list(log).index(("step", 0, 0))
    events = steady_state_events(log[:split], log[split + 1:])
    expandable = replay(events, expandable_segments=True)["peak_reserved"] if expandable_segments else None
    return events, replay(events)["peak_reserved"], expandable
