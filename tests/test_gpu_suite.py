"""labs/gpu_suite.py: the one GPU script stays runnable (its parts resolve) on a machine without a GPU."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SUITE = Path(__file__).resolve().parent.parent / "labs" / "gpu_suite.py"


def test_dry_run_resolves_every_part() -> None:
    proc = subprocess.run([sys.executable, str(SUITE), "--dry-run"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for part in ("training", "checkpointing", "accumulation", "offload", "paged", "inference", "profiling",
                 "allocator", "notebook_labs"):
        assert part in proc.stdout
    assert "9 parts ready" in proc.stdout


def test_without_a_gpu_it_measures_nothing_and_says_so() -> None:
    proc = subprocess.run([sys.executable, str(SUITE), "--only", "inference"], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 2
    assert "no CUDA GPU here" in proc.stderr and proc.stderr.count("\n") == 1


def test_a_part_records_its_json_with_one_provenance_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every part writes through memlib.measure.results: the measured values plus one provenance record."""
    import importlib.util

    from memlib._book import ch11_inference_memory as inference
    from memlib.measure import results

    spec = importlib.util.spec_from_file_location("gpu_suite", SUITE)
    assert spec is not None and spec.loader is not None
    suite = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(suite)
    fake = results.Provenance(device="NVIDIA H100 80GB HBM3", torch="2.13.0", cuda="12.8",
                              date="2026-12-01T21:33:25Z", command="", memlib="0.1.0", git_commit=None)
    monkeypatch.setattr(results.Provenance, "of_this_run",
                        classmethod(lambda cls, command: cls(**{**fake.as_dict(), "command": command})))
    monkeypatch.setattr(results, "RESULTS_DIR", tmp_path)
    monkeypatch.setattr(inference, "measure_serving",
                        lambda *a, **k: {"device": "NVIDIA H100 80GB HBM3", "torch": "2.13.0", "kv_cache_bytes": 7})
    files = suite.part_inference("python labs/gpu_suite.py --only inference")
    assert files == [tmp_path / "inference_serving.json"]
    stored = json.loads(files[0].read_text())
    assert stored == {"provenance": {**fake.as_dict(), "command": "python labs/gpu_suite.py --only inference"},
                      "kv_cache_bytes": 7}
