"""Tests of memlib.core.allocator: each rule of c10/cuda/CUDACachingAllocator.cpp, derived by hand (Chapter 16).

Every hand-derived case quotes the line of PyTorch's source whose rule it checks (function named).
"""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memlib.core.allocator import (K_LARGE_BUFFER, K_MIN_BLOCK_SIZE, K_MIN_LARGE_ALLOC, K_ROUND_LARGE,
                                   K_SMALL_BUFFER, K_SMALL_SIZE, AllocatorConfig, CachingAllocator,
                                   _roundup_power2_next_division, events_from_log, get_allocation_size, replay,
                                   round_size)
from memlib.core.errors import MemlibError

MiB = 1 << 20


def test_constants_are_pytorchs() -> None:
    # constexpr size_t kMinBlockSize = 512; kSmallSize = 1048576; kSmallBuffer = 2097152;
    # kMinLargeAlloc = 10485760; kRoundLarge = 2097152; const size_t kLargeBuffer = 20971520;
    assert (K_MIN_BLOCK_SIZE, K_SMALL_SIZE, K_SMALL_BUFFER) == (512, 1048576, 2097152)
    assert (K_MIN_LARGE_ALLOC, K_ROUND_LARGE, K_LARGE_BUFFER) == (10485760, 2097152, 20971520)


def test_round_size() -> None:
    # round_size: "if (size < kMinBlockSize) return kMinBlockSize;"
    assert round_size(1) == round_size(0) == 512
    # "return kMinBlockSize * ((size + kMinBlockSize - 1) / kMinBlockSize);"
    assert round_size(513) == 1024 and round_size(1024) == 1024 and round_size(3 * MiB + 1) == 3 * MiB + 512
    # roundup_power2_divisions: "if (divisions > 1 && size > (kMinBlockSize * divisions))"
    four = AllocatorConfig(roundup_power2_divisions=4)
    assert round_size(1200, four) == 1536  # 1200 <= 512 * 4: plain 512-byte rounding
    assert round_size(5000, four) == 5120  # [4096, 8192) in steps of 1024
    # roundup_power2_next_division's own example: "round-up 1200 and number of divisions is 4 ... return 1280"
    assert _roundup_power2_next_division(1200, 4) == 1280
    assert _roundup_power2_next_division(4096, 4) == 4096  # "if (llvm::isPowerOf2_64(size)) return size;"


def test_get_allocation_size() -> None:
    # get_allocation_size: "if (size <= kSmallSize) return kSmallBuffer;"
    assert get_allocation_size(512) == get_allocation_size(MiB) == 2 * MiB
    # "else if (size < kMinLargeAlloc) return kLargeBuffer;"
    assert get_allocation_size(MiB + 512) == get_allocation_size(10 * MiB - 512) == 20 * MiB
    # "return kRoundLarge * ((size + kRoundLarge - 1) / kRoundLarge);"
    assert get_allocation_size(10 * MiB) == 10 * MiB and get_allocation_size(11 * MiB) == 12 * MiB


def test_small_pool_packs_2mib_segments() -> None:
    # get_pool: "if (size <= kSmallSize) return small_blocks;" small requests share one 2 MiB segment;
    # should_split (small pool): "return remaining >= kMinBlockSize;"
    r = replay([["alloc", 100]] * 4096)  # 4096 blocks of 512 B = 2 MiB: exactly one segment
    assert (r["peak_allocated"], r["peak_reserved"], r["num_segments"]) == (2 * MiB, 2 * MiB, 1)
    r = replay([["alloc", 100]] * 4097)
    assert (r["peak_reserved"], r["num_segments"]) == (4 * MiB, 2)


def test_medium_requests_share_20mib_segments() -> None:
    # 1 MiB < size < 10 MiB: a 20 MiB segment (kLargeBuffer), split (large pool: "remaining > kSmallSize")
    r = replay([["alloc", 3 * MiB]] * 6)  # 6 x 3 MiB = 18 MiB; the 2 MiB remainder stays cached
    assert (r["peak_allocated"], r["peak_reserved"], r["num_segments"]) == (18 * MiB, 20 * MiB, 1)
    assert r["inactive_split_bytes"] == 2 * MiB
    r = replay([["alloc", 3 * MiB]] * 7)
    assert (r["peak_reserved"], r["num_segments"]) == (40 * MiB, 2)


def test_large_remainder_of_one_mib_is_not_split() -> None:
    # should_split (large pool): "return (size < max_split_size) && (remaining > kSmallSize);"
    # 19 MiB rounds to a 20 MiB segment and leaves exactly 1 MiB: not split, the whole block counts as allocated
    r = replay([["alloc", 19 * MiB]])
    assert (r["allocated"], r["reserved"]) == (20 * MiB, 20 * MiB)
    r = replay([["alloc", 19 * MiB - 4096]])  # 1 MiB + 4 KiB left: split
    assert (r["allocated"], r["reserved"]) == (19 * MiB - 4096, 20 * MiB)
    # two 9.5 MiB requests share a 20 MiB segment; the second leaves 1 MiB, which it keeps
    r = replay([["alloc", 19 * MiB // 2]] * 2)
    assert (r["allocated"], r["reserved"]) == (20 * MiB, 20 * MiB)


def test_best_fit_and_merge() -> None:
    # get_free_block: "pool.blocks.lower_bound(&p.search_key)": the smallest cached block that fits
    ev = [["alloc", 40 * MiB], ["alloc", 30 * MiB], ["free", 0], ["free", 1], ["alloc", 30 * MiB]]
    r = replay(ev)
    assert r["reserved"] == 70 * MiB and r["allocated"] == 30 * MiB and r["num_device_alloc"] == 2
    # free_block -> try_merge_blocks: a freed block merges with free neighbours of its segment
    ev = [["alloc", 12 * MiB], ["free", 0], ["alloc", 4 * MiB], ["alloc", 4 * MiB], ["free", 2], ["free", 3],
          ["alloc", 12 * MiB]]  # the two halves merge back into the 12 MiB segment: no new cudaMalloc
    r = replay(ev)
    assert (r["peak_reserved"], r["num_device_alloc"]) == (12 * MiB, 1)


def test_release_and_retry_before_oom() -> None:
    # malloc: "alloc_block(...) || (release_available_cached_blocks(...) && alloc_block(...)) ||
    #          (release_cached_blocks(context) && alloc_block(params, true, ...))"
    ev = [["alloc", 30 * MiB], ["alloc", 30 * MiB], ["free", 0], ["alloc", 40 * MiB]]
    r = replay(ev, capacity=80 * MiB)  # the cached 30 MiB segment is cudaFree'd, then 40 MiB fits
    assert not r["oom"] and r["num_alloc_retries"] == 1 and r["reserved"] == 70 * MiB
    r = replay(ev, capacity=60 * MiB)
    assert r["oom"] and r["oom_event"] == 3


def test_fragmentation_oom_and_expandable_segments() -> None:
    # release_blocks frees only "!block->prev && !block->next" (unsplit) blocks: a split segment stays reserved
    ev = [["alloc", 50 * MiB], ["free", 0], ["alloc", 20 * MiB], ["alloc", 50 * MiB]]
    r = replay(ev, capacity=90 * MiB)
    assert r["oom"] and r["allocated"] == 20 * MiB and r["inactive_split_bytes"] == 30 * MiB
    # expandable_segments: the segment grows by 20 MiB pages (ExpandableSegment, "20MiB pages for our large pool")
    r = replay(ev, capacity=90 * MiB, expandable_segments=True)
    assert not r["oom"] and r["reserved"] == 80 * MiB and r["num_segments"] == 1


def test_max_split_size() -> None:
    # get_free_block: "if ((p.size() < max_split_size()) && ((*it)->size >= max_split_size())) return false;"
    r = replay([["alloc", 30 * MiB], ["free", 0], ["alloc", 12 * MiB]], max_split_size_mb=25)
    assert r["reserved"] == 42 * MiB
    # "if ((p.size() >= max_split_size()) && ((*it)->size >= p.size() + kLargeBuffer)) return false;"
    r = replay([["alloc", 60 * MiB], ["free", 0], ["alloc", 30 * MiB]], max_split_size_mb=25)
    assert r["reserved"] == 90 * MiB
    # ... and within kLargeBuffer it serves, unsplit (should_split: "size < max_split_size")
    r = replay([["alloc", 40 * MiB], ["free", 0], ["alloc", 30 * MiB]], max_split_size_mb=25)
    assert (r["reserved"], r["allocated"]) == (40 * MiB, 40 * MiB)
    # release_available_cached_blocks frees oversize cached blocks before the full release
    r = replay([["alloc", 60 * MiB], ["free", 0], ["alloc", 30 * MiB]], capacity=80 * MiB, max_split_size_mb=25)
    assert not r["oom"] and r["reserved"] == 30 * MiB and r["num_alloc_retries"] == 0
    with pytest.raises(MemlibError, match="max_split_size_mb 20 too small"):
        AllocatorConfig(max_split_size_mb=20)


def test_garbage_collection_threshold() -> None:
    # garbage_collect_cached_blocks: "if (total_allocated_memory <= gc_threshold) return;" then unsplit cached
    # large blocks are released before a new cudaMalloc
    ev = [["alloc", 40 * MiB], ["free", 0], ["alloc", 50 * MiB]]
    assert replay(ev, capacity=100 * MiB)["reserved"] == 90 * MiB
    assert replay(ev, capacity=100 * MiB, garbage_collection_threshold=0.3)["reserved"] == 50 * MiB
    assert replay(ev, capacity=100 * MiB, garbage_collection_threshold=0.5)["reserved"] == 90 * MiB
    with pytest.raises(MemlibError, match="garbage_collection_threshold 1.5"):
        AllocatorConfig(garbage_collection_threshold=1.5)


def test_empty_cache_keeps_split_segments() -> None:
    a = CachingAllocator()
    x = a.malloc(3 * MiB)
    y = a.malloc(3 * MiB)
    a.free(x)
    a.empty_cache()  # one block of the 20 MiB segment is still allocated: nothing is released
    assert a.reserved == 20 * MiB
    a.free(y)
    a.empty_cache()
    assert a.reserved == 0 and a.segments == []


def test_bad_events() -> None:
    with pytest.raises(MemlibError, match="event 1 frees 5"):
        replay([["alloc", 1], ["free", 5]])
    with pytest.raises(MemlibError, match="unknown event 'malloc' at 0; expected one of: alloc, free"):
        replay([["malloc", 1]])


def test_events_from_log() -> None:
    log = [("alloc", 7, 100), ("alloc", 8, 200), ("free", 7, 100), ("alloc", 7, 300), ("free", 9, 5)]
    assert events_from_log(log) == [["alloc", 100], ["alloc", 200], ["free", 0], ["alloc", 300]]


@st.composite
def _events(draw: st.DrawFn) -> list[list[object]]:
    sizes = st.one_of(st.integers(1, 4096), st.integers(1, 2 * MiB), st.integers(MiB, 64 * MiB))
    events: list[list[object]] = []
    live: list[int] = []
    for _ in range(draw(st.integers(1, 40))):
        if live and draw(st.booleans()):
            events.append(["free", live.pop(draw(st.integers(0, len(live) - 1)))])
        else:
            live.append(len(events))
            events.append(["alloc", draw(sizes)])
    return events


@settings(max_examples=60, deadline=None)
@given(_events(), st.booleans())
def test_reserved_covers_allocated_at_every_step(events: list[list[object]], expandable: bool) -> None:
    r = replay(events, expandable_segments=expandable, timeline=True)
    assert all(res >= alloc for alloc, res in r["timeline"])
    assert all(res % K_SMALL_BUFFER == 0 for _, res in r["timeline"])  # segments and pages: 2 MiB multiples
    live = {i: round_size(int(e[1])) for i, e in enumerate(events) if e[0] == "alloc"}
    for e in events:
        if e[0] == "free":
            live.pop(int(e[1]))  # type: ignore[call-overload]
    assert r["allocated"] >= sum(live.values())  # whole blocks: an unsplit remainder counts


@settings(max_examples=40, deadline=None)
@given(_events(), st.booleans())
def test_enough_capacity_changes_nothing(events: list[list[object]], expandable: bool) -> None:
    free = replay(events, expandable_segments=expandable)
    capped = replay(events, capacity=free["peak_reserved"], expandable_segments=expandable)
    assert not capped["oom"] and capped == free


@settings(max_examples=40, deadline=None)
@given(_events(), st.booleans())
def test_everything_freed_is_released_by_empty_cache(events: list[list[object]], expandable: bool) -> None:
    a = CachingAllocator(config=AllocatorConfig(expandable_segments=expandable))
    live = {}
    for i, e in enumerate(events):
        if e[0] == "alloc":
            live[i] = a.malloc(int(e[1]))  # type: ignore[call-overload]
        else:
            a.free(live.pop(int(e[1])))  # type: ignore[call-overload]
    for b in live.values():
        a.free(b)
    a.empty_cache()
    assert a.allocated == 0 and a.reserved == 0


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 64 * MiB), min_size=1, max_size=30))
def test_without_frees_reserved_never_shrinks(sizes: list[int]) -> None:
    r = replay([["alloc", s] for s in sizes], timeline=True)
    reserved = [res for _, res in r["timeline"]]
    assert reserved == sorted(reserved) and r["peak_reserved"] == r["reserved"]
