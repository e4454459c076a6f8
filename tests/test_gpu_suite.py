"""labs/gpu_suite.py: the one GPU script stays runnable (its parts resolve) on a machine without a GPU."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SUITE = Path(__file__).resolve().parent.parent / "labs" / "gpu_suite.py"


def test_dry_run_resolves_every_part() -> None:
    proc = subprocess.run([sys.executable, str(SUITE), "--dry-run"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for part in ("training", "checkpointing", "accumulation", "offload", "paged", "inference", "profiling",
                 "notebook_labs"):
        assert part in proc.stdout
    assert "8 parts ready" in proc.stdout


def test_without_a_gpu_it_measures_nothing_and_says_so() -> None:
    proc = subprocess.run([sys.executable, str(SUITE), "--only", "inference"], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 2
    assert "no CUDA GPU here" in proc.stderr and proc.stderr.count("\n") == 1
