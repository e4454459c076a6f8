"""Set up a Google Colab session for a notebook of The GPU Memory Book (imported by each notebook's first cell).

The first cell of every notebook (written by ``tools/colab_cell.py``) clones the book's repository on Colab
and calls :func:`setup`. It installs ``memlib`` and the pinned requirements of ``requirements.txt`` that a
notebook needs at run time, with two exceptions:

* **torch is never reinstalled**: Colab's CUDA build stays; pip gets the constraint ``torch==<installed>`` so
  that no other package (bitsandbytes, deepspeed, peft, ...) can pull in another torch;
* the book's build and test tooling (Jupyter Book, Sphinx, nbval, pytest, Playwright, ipykernel, ...) is not
  installed: Colab does not need it, and replacing Colab's kernel packages would break the session.

Standard library only: it runs before anything is installed.
"""
from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path

__all__ = ["KEEP_COLABS", "TOOLING", "runtime_requirements", "setup"]

KEEP_COLABS = frozenset({"torch", "torchvision", "torchaudio", "triton"})
TOOLING = frozenset({
    "jupyter-book", "myst-nb", "myst-parser", "jupyter-cache", "sphinx", "sphinx-book-theme",
    "sphinxcontrib-bibtex", "nbclient", "nbconvert", "nbformat", "nbval", "pytest", "pytest-xdist",
    "hypothesis", "ipykernel", "ipython", "jupyter-client", "jupyter-core", "notebook", "playwright", "greenlet",
})
_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def runtime_requirements(requirements: str) -> list[str]:
    """The requirement lines (pins kept) a notebook needs on Colab: all but torch and the build/test tooling."""
    keep = []
    for line in requirements.splitlines():
        line = line.split("#", 1)[0].strip()
        match = _NAME.match(line)
        if not match:
            continue
        name = _canonical(match.group(1))
        if name not in KEEP_COLABS and name not in TOOLING:
            keep.append(line)
    return keep


def _installed(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def setup(book: str, notebook_dir: str) -> None:
    """Install memlib and the runtime pins from the clone at ``book``; chdir to the notebook's folder."""
    root = Path(book)
    pins = runtime_requirements((root / "requirements.txt").read_text(encoding="utf-8"))
    torch = _installed("torch")
    with tempfile.TemporaryDirectory() as tmp:
        req, con = Path(tmp, "requirements.txt"), Path(tmp, "constraints.txt")
        req.write_text("\n".join(pins) + "\n", encoding="utf-8")
        con.write_text(f"torch=={torch}\n" if torch else "", encoding="utf-8")
        pip = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
        try:
            subprocess.run([*pip, "-r", str(req), "-c", str(con)], check=True)
        except subprocess.CalledProcessError as err:
            raise RuntimeError(
                f"pip could not install the book's pins next to Colab's torch {torch} (see pip's message above); "
                "torch is kept on purpose. Pick a runtime with a newer torch, or install older pins by hand."
            ) from err
        subprocess.run([*pip, "--no-deps", "-e", str(root)], check=True)
    if str(root) not in sys.path:  # the editable install's .pth is read only by new processes
        sys.path.insert(0, str(root))
    importlib.invalidate_caches()
    os.chdir(root / notebook_dir)
    stale = []
    for line in pins:
        name = _NAME.match(line).group(1)  # type: ignore[union-attr]
        module = sys.modules.get(_canonical(name).replace("-", "_"))
        loaded = getattr(module, "__version__", None)
        if loaded is not None and loaded != _installed(name):
            stale.append(f"{name} {loaded} -> {_installed(name)}")
    print(f"memlib installed from {root}; torch {torch or 'not installed'} (Colab's, kept)")
    if stale:
        print("Packages already imported were upgraded (" + ", ".join(stale) + "): choose Runtime > Restart "
              "session, then run the notebook again from the top.")
