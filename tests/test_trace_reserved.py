"""A traced step replayed through the CUDA caching allocator's rules: reserved_peak_bytes (Chapter 16)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from memlib.core.allocator import K_SMALL_BUFFER, replay, steady_state_events
from memlib.core.errors import MemlibError
from memlib.measure.trace import trace_training

SMALL = {"n_layer": 2, "n_embd": 128, "n_head": 4}


def test_reserved_covers_the_traced_peak() -> None:
    res = trace_training("gpt2", batch_size=2, seq_len=64, precision="bf16-mixed", overrides=SMALL,
                         reserved=True, expandable_segments=True)
    assert res.events is not None and res.reserved_peak_bytes is not None
    assert res.reserved_peak_expandable_bytes is not None
    again = replay(res.events)
    # the allocator's allocated peak counts whole rounded blocks: at least the tensors' bytes
    assert again["peak_allocated"] >= res.peak_bytes
    assert res.reserved_peak_bytes == again["peak_reserved"] >= again["peak_allocated"]
    assert res.reserved_peak_bytes % K_SMALL_BUFFER == 0
    assert res.as_dict()["reserved_peak_bytes"] == res.reserved_peak_bytes
    plain = trace_training("gpt2", batch_size=2, seq_len=64, precision="bf16-mixed", overrides=SMALL)
    assert plain.peak_bytes == res.peak_bytes and "reserved_peak_bytes" not in plain.as_dict()


def test_expandable_needs_reserved() -> None:
    with pytest.raises(MemlibError, match="expected reserved=True"):
        trace_training("gpt2", seq_len=64, overrides=SMALL, expandable_segments=True)


def test_steady_state_events_repeat_the_step() -> None:
    setup = [("alloc", 1, 100)]
    step = [("alloc", 2, 10), ("alloc", 3, 20), ("free", 2, 10)]  # key 3 outlives the step
    ev = steady_state_events(setup, step, steps=2)
    assert ev == [["alloc", 100], ["alloc", 10], ["alloc", 20], ["free", 1],
                  ["free", 2], ["alloc", 10], ["alloc", 20], ["free", 5]]
    with pytest.raises(MemlibError, match="steps 0 must be at least 1"):
        steady_state_events(setup, step, steps=0)


def test_cli_trace_json_has_reserved_peak() -> None:
    out = subprocess.run([sys.executable, "-m", "memlib", "trace", "gpt2", "--seq", "128", "--json",
                          "--expandable-segments"], capture_output=True, text=True, check=True).stdout
    data = json.loads(out)
    assert data["reserved_peak_bytes"] >= data["peak_bytes"] > 0
    assert data["reserved_peak_expandable_bytes"] >= data["peak_bytes"]
