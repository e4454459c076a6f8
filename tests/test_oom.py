"""Tests of memlib.core.oom and ``memlib oom``: real OOM messages of each PyTorch format, and their verdicts."""
from __future__ import annotations

import io
import json

import pytest

from memlib.cli import main
from memlib.core.errors import MemlibError
from memlib.core.oom import advice, diagnose, format_size, oom_dict, parse_oom

MiB, GiB = 1 << 20, 1 << 30

# PyTorch 1.0, pull request 13751 (its description): "cached" = reserved but unallocated
V10 = ("RuntimeError: CUDA out of memory. Tried to allocate 16.00 GiB (GPU 0; 11.93 GiB total capacity; 4.00 GiB "
       "already allocated; 7.33 GiB free; 179.00 KiB cached)")
# PyTorch 1.x, issue 32101 (2020)
V1X = ("RuntimeError: CUDA out of memory. Tried to allocate 152.00 MiB (GPU 0; 31.72 GiB total capacity; 24.89 GiB "
       "already allocated; 6.12 MiB free; 30.70 GiB reserved in total by PyTorch)")
# PyTorch 1.x with torch.cuda.set_per_process_memory_fraction and the max_split_size_mb hint (1.10 to 1.13)
V1X_ALLOWED = ("torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 1; 23.69 GiB total "
               "capacity; 9.10 GiB already allocated; 12.61 GiB free; 10.00 GiB allowed; 9.50 GiB reserved in total "
               "by PyTorch) If reserved memory is >> allocated memory try setting max_split_size_mb to avoid "
               "fragmentation.  See documentation for Memory Management and PYTORCH_CUDA_ALLOC_CONF")
# PyTorch 2.0/2.1, pull request 99699 (its description, line breaks as there): the "capacty" typo
V20 = """torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 138.00 MiB.
GPU 0 has a total capacty of 15.90 GiB of which 8.44 MiB is free.
Process 1246069 has 577.00 MiB memory in use. Including non-PyTorch memory,
this process has 15.32 GiB memory in use. Of the allocated memory
14.12 GiB is allocated by PyTorch, and 410.41 MiB is reserved
by PyTorch but unallocated. If reserved but unallocated memory is large
try setting max_split_size_mb to avoid fragmentation.  See documentation
 for Memory Management and PYTORCH_CUDA_ALLOC_CONF"""
# PyTorch 2.3+, issue 126766 (the expected message)
V23 = ("OutOfMemoryError: CUDA out of memory. Tried to allocate 29.07 GiB. GPU 3 has a total capacity of 39.43 GiB "
       "of which 25.15 GiB is free. Including non-PyTorch memory, this process has 14.27 GiB memory in use. Of the "
       "allocated memory 11.74 GiB is allocated by PyTorch, and 932.02 MiB is reserved by PyTorch but unallocated. "
       "If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "
       "to avoid fragmentation.  See documentation for Memory Management  "
       "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)")
# PyTorch 2.x, a quantization run's log: almost nothing cached
V2X_FULL = ("[ERROR] Quantization failed: CUDA out of memory. Tried to allocate 170.00 MiB. GPU 0 has a total "
            "capacity of 31.37 GiB of which 73.81 MiB is free. Including non-PyTorch memory, this process has 31.29 "
            "GiB memory in use. Of the allocated memory 30.80 GiB is allocated by PyTorch, and 2.80 MiB is reserved "
            "by PyTorch but unallocated. If reserved but unallocated memory is large try setting "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.")
# In a container NVML lists this process under another pid as well
V2X_CONTAINER = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity "
                 "of 79.15 GiB of which 1.23 GiB is free. Process 12345 has 77.9 GiB memory in use. Including "
                 "non-PyTorch memory, this process has 77.90 GiB memory in use. Of the allocated memory 75.20 GiB "
                 "is allocated by PyTorch, and 1.50 GiB is reserved by PyTorch but unallocated.")


def test_pytorch_1_0_cached() -> None:
    r = parse_oom(V10)
    assert (r.format, r.requested_bytes, r.total_bytes) == ("1.0", 16 * GiB, round(11.93 * GiB))
    assert r.reserved_unallocated_bytes == 179 * 1024 and r.reserved_bytes == 4 * GiB + 179 * 1024
    assert diagnose(r) == "too-large"  # 16 GiB on a 11.93 GiB GPU


def test_pytorch_1_x() -> None:
    r = parse_oom(V1X)
    assert (r.format, r.requested_bytes, r.free_bytes) == ("1.x", 152 * MiB, round(6.12 * MiB))
    assert (r.allocated_bytes, r.reserved_bytes) == (round(24.89 * GiB), round(30.70 * GiB))
    assert r.reserved_unallocated_bytes == round(30.70 * GiB) - round(24.89 * GiB)
    assert r.process_bytes is None and r.others_bytes == round(31.72 * GiB) - round(6.12 * MiB) - round(30.70 * GiB)
    assert diagnose(r) == "fragmentation"  # 5.8 GiB cached, 6 MiB free, 152 MiB asked


def test_pytorch_1_x_allowed_fraction() -> None:
    r = parse_oom(V1X_ALLOWED)
    assert (r.device, r.allowed_bytes) == (1, 10 * GiB)
    # 12.61 GiB are free on the device, but under the cap only 10 - 9.5 = 0.5 GiB: 2 GiB > 0.5 + 0.4 cached
    assert diagnose(r) == "insufficient"
    assert oom_dict(r)["verdict"] == "insufficient"


def test_pytorch_2_0_capacty_typo_and_line_breaks() -> None:
    r = parse_oom(V20)
    assert (r.format, r.total_bytes, r.requested_bytes) == ("2.x", round(15.90 * GiB), 138 * MiB)
    assert r.process_bytes == round(15.32 * GiB) and r.other_processes_bytes == 577 * MiB
    assert r.reserved_bytes == round(14.12 * GiB) + round(410.41 * MiB)
    assert r.non_pytorch_bytes == round(15.32 * GiB) - r.reserved_bytes
    assert diagnose(r) == "fragmentation"


def test_pytorch_2_3() -> None:
    r = parse_oom(V23)
    assert (r.device, r.requested_bytes, r.free_bytes) == (3, round(29.07 * GiB), round(25.15 * GiB))
    assert r.other_processes_bytes is None
    assert diagnose(r) == "insufficient"  # 29.07 > 25.15 + 0.91, but < 39.43 - 1.62 (non-PyTorch)


def test_insufficient_and_container_duplicate() -> None:
    assert diagnose(parse_oom(V2X_FULL)) == "insufficient"
    r = parse_oom(V2X_CONTAINER)  # "Process 12345 has 77.9 GiB" is this process: used memory cannot hold both
    assert r.other_processes_bytes is None and r.process_bytes == round(77.90 * GiB)
    assert diagnose(r) == "fragmentation"


def test_hip_and_bytes_units() -> None:
    msg = ("HIP out of memory. Tried to allocate 512 bytes. GPU 0 has a total capacity of 63.98 GiB of which 0 bytes "
           "is free. Of the allocated memory 63.50 GiB is allocated by PyTorch, and 1.00 KiB is reserved by PyTorch "
           "but unallocated.")
    r = parse_oom(msg)
    assert (r.requested_bytes, r.free_bytes, r.reserved_unallocated_bytes) == (512, 0, 1024)
    assert diagnose(r) == "fragmentation"


def test_format_size_is_pytorchs() -> None:
    assert [format_size(n) for n in (512, 1024, 1025, 20 * MiB, round(14.72 * GiB))] == [
        "512 bytes", "1024 bytes", "1.00 KiB", "20.00 MiB", "14.72 GiB"]
    for text in (V1X, V20, V23):  # the sizes round-trip to the printed text
        r = parse_oom(text)
        assert format_size(r.requested_bytes) in " ".join(text.split())


def test_advice_names_chapters() -> None:
    assert any("expandable_segments:True" in a for a in advice("fragmentation"))
    for verdict in ("too-large", "fragmentation", "insufficient"):
        assert all("Chapter" in a for a in advice(verdict)[:1])
    with pytest.raises(MemlibError, match="unknown verdict 'oops'; expected one of: too-large"):
        advice("oops")


def test_not_an_oom_message() -> None:
    with pytest.raises(MemlibError, match="not a PyTorch out-of-memory message"):
        parse_oom("RuntimeError: CUDA error: device-side assert triggered")
    with pytest.raises(MemlibError, match="incomplete PyTorch 2.x out-of-memory message"):
        parse_oom("OutOfMemoryError: CUDA out of memory. Tried to allocate 3725.29 GiB. GPU")  # issue 126766


def test_cli_text_json_and_stdin(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    assert main(["oom", V1X]) == 0
    out = capsys.readouterr().out
    assert "verdict: fragmentation" in out and "152.00 MiB" in out and "expandable_segments:True" in out
    monkeypatch.setattr("sys.stdin", io.StringIO(V23))
    assert main(["oom", "-", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    for key in ("requested_bytes", "total_bytes", "free_bytes", "process_bytes", "allocated_bytes",
                "reserved_bytes", "reserved_unallocated_bytes", "verdict"):
        assert key in data
    assert data["verdict"] == "insufficient" and data["process_bytes"] == round(14.27 * GiB)


def test_cli_bad_input_is_one_line_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["oom", "all good"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("memlib: error: not a PyTorch out-of-memory message")
