"""Static typing: mypy, configured in pyproject.toml ([tool.mypy]), finds no errors in memlib."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_mypy_memlib_clean() -> None:
    # Run from the repository root so mypy reads pyproject.toml's [tool.mypy] (files = ["memlib"]). The cache
    # (.mypy_cache/) makes reruns take seconds; the first run analyses torch and transformers (about a minute).
    proc = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"mypy failed (exit {proc.returncode}):\n{proc.stdout}{proc.stderr}"
