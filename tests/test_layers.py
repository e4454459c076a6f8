"""The layering of memlib (CONVENTIONS.md): core is pure, viz draws without torch, no module over 700 lines."""
from __future__ import annotations

import ast
import json
import re
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


# ---------------------------------------------------------------------------------------------------------------
# memlib._book: code one chapter or lab uses lives outside the public API (issue 16)
# ---------------------------------------------------------------------------------------------------------------

BOOK = MEMLIB / "_book"
#: The public layers, none of which may import the book helpers (only notebooks, tests and lab scripts may).
PUBLIC = ("core", "measure", "viz", "drills")
NOTEBOOK_DIRS = ("chapters", "labs", "drills")
_OFFLOAD_API = "the offload model's public questions (where states rest, tokens that hide the traffic, largest model)"
_VIZ = "the chapter's figure or widget, drawn by the viz layer (which may not import memlib._book)"
#: Public names one notebook uses and nothing else in memlib, kept public on purpose; each entry says why.
SINGLE_NOTEBOOK_ALLOWED: dict[str, str] = {
    # the offload model answers three questions an engineer asks outside the book too (tests/test_offload.py checks
    # them against the ZeRO-Offload/Infinity papers and DeepSpeed's estimators); Chapter 7 is where they are taught
    "memlib.core.offload.hiding_tokens": _OFFLOAD_API,
    "memlib.core.offload.max_params_that_fit": _OFFLOAD_API,
    # the planner's rung order is part of plan()'s contract (tests/test_plan.py checks every ladder follows it)
    "memlib.core.plan.PRIORITY": "the planner's rung order, part of plan()'s documented contract",
    # the chapters' figures and calculators: viz's own product, one per chapter by design
    "memlib.viz.plots.estimate_vs_trace_figure": _VIZ,
    "memlib.viz.plots_inference.serving_breakdown_figure": _VIZ,
    "memlib.viz.plots_plan.decision_flow_figure": _VIZ,
    "memlib.viz.plots_profiling.memory_timeline_figure": _VIZ,
    "memlib.viz.plots_profiling.roofline_figure": _VIZ,
    "memlib.viz.widgets.training_widget": _VIZ,
    "memlib.viz.widgets_inference.inference_widget": _VIZ,
    "memlib.viz.widgets_plan.plan_widget": _VIZ,
    # the drill cards run in the reader's browser from the live zip (memlib.viz.live.LIVE_MODULES), which ships
    # memlib.drills and never memlib._book
    "memlib.drills.widgets.flashcard_widget": "the numeric drills' flashcards, shipped to the browser with drills",
    # the per-term functions of the first memlib.core.frameworks, kept by name (Chapter 6 calls them); each one
    # dispatches to the setup's framework object, which is what the estimator composes
    "memlib.core.frameworks.__init__.bucket_bytes": "a kept per-term name over the framework objects (Chapter 6)",
    "memlib.core.frameworks.__init__.ddp_bucket_bytes": "a kept per-term name over the framework objects (Chapter 6)",
    # the recorder labs/gpu_suite.py runs on a lent GPU (its registry names it), beside the lab that loads its JSON
    "memlib.measure.checkpointing.gpu_checkpointing_results": "the GPU suite's checkpointing recorder (labs/gpu_suite.py)",
}


def _public_names() -> list[tuple[Path, str]]:
    """(module, name) for every name in a public module's ``__all__`` that the module itself defines."""
    out = []
    for path in sorted(MEMLIB.rglob("*.py")):
        if BOOK in path.parents:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        defined: set[str] = set()
        exported: list[str] = []
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                defined.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names = [t.id for t in targets if isinstance(t, ast.Name)]
                if names == ["__all__"] and isinstance(node.value, (ast.List, ast.Tuple)):
                    exported = [e.value for e in node.value.elts if isinstance(e, ast.Constant)]
                defined.update(names)
        # a name in __all__ the module does not define is a re-export, or an attribute built lazily by the
        # module's __getattr__ (memlib.measure.flash.FlashAttentionFn): its own module is where it is used
        out.extend((path, name) for name in exported if name in defined)
    return out


def _uses(path: Path, skip: str | None = None) -> set[str]:
    """Names a module's code uses (names, attributes, imported names), outside the definition of ``skip``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: set[str] = set()
    for top in tree.body:
        if skip is not None and getattr(top, "name", None) == skip:
            continue
        if isinstance(top, (ast.Assign, ast.AnnAssign)):
            targets = top.targets if isinstance(top, ast.Assign) else [top.target]
            if any(isinstance(t, ast.Name) and t.id in (skip, "__all__") for t in targets):
                continue
        for node in ast.walk(top):
            if isinstance(node, ast.Name):
                found.add(node.id)
            elif isinstance(node, ast.Attribute):
                found.add(node.attr)
            elif isinstance(node, ast.ImportFrom):
                found.update(a.name for a in node.names)
    return found


def single_notebook_names() -> dict[str, str]:
    """``{"memlib.pkg.module.name": notebook}`` for public names one notebook's code uses and no other memlib code.

    A name counts as used by memlib when another public memlib module or its own module, outside its definition,
    refers to it (the book helpers do not count: what only a chapter and its helpers use is the chapter's code); a
    notebook uses it when one of its code cells holds it as a word.
    """
    code = {}
    for folder in NOTEBOOK_DIRS:
        for nb in sorted((ROOT / folder).glob("*.ipynb")):
            cells = json.loads(nb.read_text(encoding="utf-8"))["cells"]
            code[nb.relative_to(ROOT).as_posix()] = "\n".join(
                "".join(c["source"]) for c in cells if c["cell_type"] == "code")
    modules = [p for p in sorted(MEMLIB.rglob("*.py")) if BOOK not in p.parents]
    uses = {p: _uses(p) for p in modules}
    out = {}
    for path, name in _public_names():
        if any(name in names for p, names in uses.items() if p != path) or name in _uses(path, skip=name):
            continue
        word = re.compile(rf"\b{re.escape(name)}\b")
        users = [nb for nb, text in code.items() if word.search(text)]
        if len(users) == 1:
            dotted = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            out[dotted + "." + name] = users[0]
    return out


def test_no_public_layer_imports_the_book_helpers() -> None:
    files = [p for layer in PUBLIC for p in _modules(layer)] + [MEMLIB / "cli.py", MEMLIB / "__init__.py",
                                                               MEMLIB / "__main__.py"]
    bad = [f"{p.relative_to(ROOT)}:{line}: {name}" for p in files for line, name in _imports(p)
           if name == "memlib._book" or name.startswith("memlib._book.")]
    assert len(files) > 40
    assert not bad, "public memlib modules import the book helpers:\n" + "\n".join(bad)


def test_the_book_helpers_are_per_chapter_modules_within_the_size_limit() -> None:
    modules = [p for p in _modules("_book") if p.name != "__init__.py"]
    assert modules, "memlib/_book holds no module"
    for p in modules:
        assert re.fullmatch(r"(ch|lab)\d\d_[a-z0-9_]+\.py", p.name), p.name
        assert len(p.read_text(encoding="utf-8").splitlines()) <= MAX_LINES, p.name


def test_code_only_one_notebook_uses_is_not_public_api() -> None:
    found = single_notebook_names()
    left = {k: v for k, v in found.items() if k not in SINGLE_NOTEBOOK_ALLOWED}
    assert not left, ("public names only one notebook uses (move them to memlib/_book/<chapter>.py or into the "
                      "notebook):\n" + "\n".join(f"{k}: {v}" for k, v in sorted(left.items())))
    # the scan sees what it must (every allow-listed name is such a name), and the list holds no stale entry
    stale = sorted(set(SINGLE_NOTEBOOK_ALLOWED) - set(found))
    assert not stale, f"allow-listed names that no longer need it: {stale}"
