"""The layering of memlib (CONVENTIONS.md): core is pure, viz draws without torch, no module over 700 lines."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MEMLIB = ROOT / "memlib"
#: What memlib.core must never import (it runs in the reader's browser under Pyodide).
HEAVY = ("torch", "transformers", "matplotlib", "ipywidgets", "bitsandbytes", "peft", "deepspeed")
#: The layers above core.
UPPER = ("measure", "viz", "drills")
MAX_LINES = 700


def _modules(package: str) -> list[Path]:
    return sorted((MEMLIB / package).rglob("*.py"))


def _imports(path: Path) -> list[tuple[int, str]]:
    """Every import in a file, module-level or inside a function, as (line, absolute dotted name)."""
    rel = path.relative_to(ROOT).with_suffix("")
    package = list(rel.parts[:-1])  # the package a relative import starts from (for __init__: itself)
    out: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            out.extend((node.lineno, a.name) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the file's package
                base = package[:len(package) - node.level + 1]
                name = ".".join([*base, node.module] if node.module else base)
                if node.module is None:  # from . import x, y: each name is a module or an attribute
                    out.extend((node.lineno, f"{name}.{a.name}") for a in node.names)
                    continue
            else:
                name = node.module or ""
            out.append((node.lineno, name))
    return out


def _banned(name: str, heavy: tuple[str, ...], upper: tuple[str, ...]) -> bool:
    top = name.split(".")[0]
    return top in heavy or any(name == f"memlib.{u}" or name.startswith(f"memlib.{u}.") for u in upper)


def test_core_imports_no_heavy_package_and_no_upper_layer() -> None:
    bad = [f"{p.relative_to(ROOT)}:{line}: {name}" for p in _modules("core") for line, name in _imports(p)
           if _banned(name, HEAVY, UPPER)]
    assert not bad, "memlib/core imports what it must not:\n" + "\n".join(bad)


def test_viz_imports_no_torch() -> None:
    bad = [f"{p.relative_to(ROOT)}:{line}: {name}" for p in _modules("viz") for line, name in _imports(p)
           if _banned(name, ("torch",), ())]
    assert not bad, "memlib/viz imports torch:\n" + "\n".join(bad)


def test_every_core_module_imports_with_the_heavy_packages_blocked() -> None:
    names = [".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__") for p in _modules("core")]
    code = "\n".join([
        "import importlib, sys",
        f"for m in {HEAVY!r}:",
        "    sys.modules[m] = None  # any import of it raises ImportError",
        f"for name in {names!r}:",
        "    importlib.import_module(name)",
        f"loaded = sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r} and sys.modules[m] is not None)",
        "assert not loaded, loaded",
        "print(len(" + repr(names) + "))",
    ])
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip() == str(len(names))


def test_no_memlib_module_is_over_700_lines() -> None:
    sizes = {str(p.relative_to(ROOT)): len(p.read_text(encoding="utf-8").splitlines())
             for p in sorted(MEMLIB.rglob("*.py"))}
    assert len(sizes) > 40  # the scan sees the package
    over = {name: n for name, n in sizes.items() if n > MAX_LINES}
    assert not over, f"modules over {MAX_LINES} lines: {over}"


@pytest.mark.parametrize("source, expected", [
    ("import torch.nn as nn\n", "torch.nn"),
    ("def f():\n    from transformers import AutoConfig\n", "transformers"),
    ("def f():\n    from ..measure.trace import build_model\n", "memlib.measure.trace"),
    ("from .. import viz\n", "memlib.viz"),
])
def test_the_scan_sees_lazy_and_relative_imports(source: str, expected: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # a check that cannot fail is a defect: the scan must catch imports inside functions and relative ones
    fake = ROOT / "memlib" / "core" / "_layer_probe.py"
    monkeypatch.setattr(Path, "read_text", lambda self, encoding=None: source)
    found = [name for _, name in _imports(fake)]
    assert expected in found
    assert _banned(expected, HEAVY, UPPER)
