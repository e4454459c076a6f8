"""Fetch the book's browser-side JavaScript (require.js, ipywidgets' html-manager, MathJax 3, Pyodide) from npm.

The built book must render with no network: widget state is rendered by @jupyter-widgets/html-manager (loaded
with require.js) and formulas by MathJax 3, which Jupyter Book 1 would otherwise pull from CDNs. This script
downloads exact, pinned npm tarballs, checks each against the registry's sha512 ``integrity`` recorded below,
and copies only the files a page needs into ``vendor/site/vendor/<name>/`` together with their licences
(``vendor/site/vendor/widgets-offline.js`` is the book's own glue, not fetched).
``_config.yml`` ships ``vendor/site`` with the book (``html_extra_path``), so the files land in
``_build/html/vendor/`` and pages load them by relative URL. ``vendor/manifest.json`` records each file's sha256.

require.js, html-manager and MathJax (6 MB) are committed, so rendering them needs no network. Pyodide (the
live calculators' Python, 13.4 MB: a 9.6 MB WebAssembly binary and a 2.5 MB standard library) is not: a
binary that size would double the repository and add as much again with every upgrade. The book build fetches
it (``--build``, in README.md's build command) into the ignored ``vendor/site/vendor/pyodide/``, checks the
tarball's sha512 against the pin below and every file's sha256 against the committed manifest, and skips the
download when the files there already match (a cache).

Usage::

    python tools/fetch_vendor.py           # (re)fetch every package and rewrite vendor/manifest.json
    python tools/fetch_vendor.py --build   # fetch only the uncommitted packages (Pyodide) unless already there
    python tools/fetch_vendor.py --check   # offline: committed files match the manifest and the pins below

To upgrade a package, change its version and integrity (``npm view <pkg>@<version> dist.integrity``), run the
script, rebuild the book and run ``pytest browser_tests -c browser_tests/pytest.ini``.
"""
from __future__ import annotations

import argparse
import base64
import fnmatch
import hashlib
import io
import json
import shutil
import sys
import tarfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SITE = REPO / "vendor" / "site"  # html_extra_path root: its content is copied to the root of the built site
DEST = SITE / "vendor"  # -> _build/html/vendor/<name>/
MANIFEST = REPO / "vendor" / "manifest.json"
REGISTRY = "https://registry.npmjs.org"
LICENSES = REPO / "vendor" / "licenses"  # full licence texts for packages whose tarball carries none

_BSD3_JUPYTER = """Copyright (c) 2015 Project Jupyter Contributors
All rights reserved.

Redistribution and use in source and binary forms, with or without
modification, are permitted provided that the following conditions are met:

1. Redistributions of source code must retain the above copyright notice, this
   list of conditions and the following disclaimer.

2. Redistributions in binary form must reproduce the above copyright notice,
   this list of conditions and the following disclaimer in the documentation
   and/or other materials provided with the distribution.

3. Neither the name of the copyright holder nor the names of its
   contributors may be used to endorse or promote products derived from
   this software without specific prior written permission.

THIS SOFTWARE IS PROVIDED BY THE COPYRIGHT HOLDERS AND CONTRIBUTORS "AS IS"
AND ANY EXPRESS OR IMPLIED WARRANTIES, INCLUDING, BUT NOT LIMITED TO, THE
IMPLIED WARRANTIES OF MERCHANTABILITY AND FITNESS FOR A PARTICULAR PURPOSE ARE
DISCLAIMED. IN NO EVENT SHALL THE COPYRIGHT HOLDER OR CONTRIBUTORS BE LIABLE
FOR ANY DIRECT, INDIRECT, INCIDENTAL, SPECIAL, EXEMPLARY, OR CONSEQUENTIAL
DAMAGES (INCLUDING, BUT NOT LIMITED TO, PROCUREMENT OF SUBSTITUTE GOODS OR
SERVICES; LOSS OF USE, DATA, OR PROFITS; OR BUSINESS INTERRUPTION) HOWEVER
CAUSED AND ON ANY THEORY OF LIABILITY, WHETHER IN CONTRACT, STRICT LIABILITY,
OR TORT (INCLUDING NEGLIGENCE OR OTHERWISE) ARISING IN ANY WAY OUT OF THE USE
OF THIS SOFTWARE, EVEN IF ADVISED OF THE POSSIBILITY OF SUCH DAMAGE.
"""

_MIT_REQUIREJS = """RequireJS 2.3.8
Copyright jQuery Foundation and other contributors, https://jquery.org/

Permission is hereby granted, free of charge, to any person obtaining a copy
of this software and associated documentation files (the "Software"), to deal
in the Software without restriction, including without limitation the rights
to use, copy, modify, merge, publish, distribute, sublicense, and/or sell
copies of the Software, and to permit persons to whom the Software is
furnished to do so, subject to the following conditions:

The above copyright notice and this permission notice shall be included in
all copies or substantial portions of the Software.

THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR
IMPLIED, INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY,
FITNESS FOR A PARTICULAR PURPOSE AND NONINFRINGEMENT. IN NO EVENT SHALL THE
AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM, DAMAGES OR OTHER
LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM,
OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN
THE SOFTWARE.
"""


@dataclass(frozen=True)
class Package:
    """One pinned npm package and the files of its tarball the book ships."""

    name: str  # folder under vendor/site/vendor/
    npm: str  # npm package name
    version: str
    integrity: str  # npm registry dist.integrity (sha512, base64) of the tarball
    license: str  # SPDX id
    files: tuple[tuple[str, str], ...]  # (glob inside the tarball's package/, destination folder or file)
    license_text: str | None = None  # written to LICENSE when the tarball carries none
    committed: bool = True  # False: fetched by the book build (--build) into an ignored folder, never committed

    @property
    def tarball(self) -> str:
        base = self.npm.rsplit("/", 1)[-1]
        return f"{REGISTRY}/{self.npm}/-/{base}-{self.version}.tgz"


PACKAGES: tuple[Package, ...] = (
    Package(
        name="requirejs",
        npm="requirejs",
        version="2.3.8",
        integrity="sha512-7/cTSLOdYkNBNJcDMWf+luFvMriVm7eYxp4BcFCsAX0wF421Vyce5SXP17c+Jd5otXKGNehIonFlyQXSowL6Mw==",
        license="MIT",
        files=(("require.js", "require.js"),),
        license_text=_MIT_REQUIREJS,
    ),
    # ipywidgets 8.1.9 = jupyterlab_widgets 3.0.17 = @jupyter-widgets/base ^6.0.12, controls ^5.0.13,
    # exactly the dependencies of html-manager 1.0.15 (the newest 1.0.x, the line that renders ipywidgets 8 state).
    Package(
        name="html-manager",
        npm="@jupyter-widgets/html-manager",
        version="1.0.15",
        integrity="sha512-5thBIV6ymNgmPVOHvzx+gGy8ZSKmSazhtGw4/c4xJDVzRhG9PTeQsRjF3FUTopvFi//SABeNz1yp47bCrJ3CQA==",
        license="BSD-3-Clause",
        files=(
            ("dist/embed-amd.js", "embed-amd.js"),
            # Font Awesome glyphs used by some controls; the bundle resolves them next to embed-amd.js.
            # Browsers take the first format they support (woff2), woff is the fallback; eot/ttf/svg omitted.
            ("dist/*.woff2", "."),
            ("dist/*.woff", "."),
            ("dist/embed.js.LICENSE.txt", "THIRD-PARTY-NOTICES.txt"),
        ),
        license_text=_BSD3_JUPYTER,
    ),
    # MathJax 3, as Sphinx 7.4 and MyST use it. Only the TeX-input/CommonHTML-output combined component,
    # its web fonts and the TeX extensions it autoloads on demand (\color, \cancel, \boldsymbol, ...).
    Package(
        name="mathjax",
        npm="mathjax",
        version="3.2.2",
        integrity="sha512-Bt+SSVU8eBG27zChVewOicYs7Xsdt40qm4+UpHyX7k0/O9NliPc+x77k1/FEsPsjKPZGJvtRZM1vO+geW0OhGw==",
        license="Apache-2.0",
        files=(
            ("LICENSE", "LICENSE"),
            ("es5/tex-chtml.js", "tex-chtml.js"),
            ("es5/output/chtml/fonts/woff-v2/*.woff", "output/chtml/fonts/woff-v2"),
            ("es5/input/tex/extensions/*.js", "input/tex/extensions"),
        ),
    ),
    # Pyodide: CPython compiled to WebAssembly; runs memlib's pure modules in the reader's browser (the live
    # calculators, _static/memlib-live.js). Only the core runtime: no packages from its repository (memlib
    # needs only the standard library). 314.0.x = Python 3.14.
    Package(
        name="pyodide",
        npm="pyodide",
        version="314.0.8",
        integrity="sha512-74Wq1kXOC+CCEzAfxuRAO701nAcCMLjf8NrwvWpu8S41dVMXwXmLQ05dYB+F4e46AdnGo0oq7YHSVUpHsoarLQ==",
        license="MPL-2.0",
        files=(
            ("pyodide.js", "pyodide.js"),
            ("pyodide.mjs", "pyodide.mjs"),
            ("pyodide.asm.mjs", "pyodide.asm.mjs"),
            ("pyodide.asm.wasm", "pyodide.asm.wasm"),
            ("python_stdlib.zip", "python_stdlib.zip"),
            ("pyodide-lock.json", "pyodide-lock.json"),
            ("package.json", "package.json"),
        ),
        license_text=("Pyodide (https://github.com/pyodide/pyodide) is licensed under the Mozilla Public License 2.0,\n"
                      "whose full text follows. Its source code: https://github.com/pyodide/pyodide (tag 314.0.8).\n"
                      "pyodide.asm.wasm and python_stdlib.zip contain CPython, licensed under the Python Software\n"
                      "Foundation License Version 2 (https://docs.python.org/3/license.html).\n\n"),
        committed=False,
    ),
)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _check_integrity(pkg: Package, data: bytes) -> None:
    algo, _, expected = pkg.integrity.partition("-")
    got = base64.b64encode(hashlib.new(algo, data).digest()).decode()
    if got != expected:
        raise SystemExit(f"{pkg.npm}@{pkg.version}: tarball integrity mismatch (got {algo}-{got})")


def _select(pkg: Package, tar: tarfile.TarFile) -> dict[str, bytes]:
    """Map destination path (relative to vendor/site/vendor/<name>/) -> file bytes."""
    members = {m.name.removeprefix("package/"): m for m in tar.getmembers() if m.isfile()}
    out: dict[str, bytes] = {}
    for pattern, dest in pkg.files:
        hits = sorted(p for p in members if fnmatch.fnmatchcase(p, pattern) and p.count("/") == pattern.count("/"))
        if not hits:
            raise SystemExit(f"{pkg.npm}@{pkg.version}: nothing matches {pattern!r}")
        for src in hits:
            data = tar.extractfile(members[src]).read()  # type: ignore[union-attr]
            if "*" not in pattern:
                target = dest
            else:
                target = f"{dest}/{src.rsplit('/', 1)[-1]}".removeprefix("./")
            out[target] = data
    if pkg.license_text is not None:
        text = pkg.license_text
        if pkg.license == "MPL-2.0":
            text += (LICENSES / "MPL-2.0.txt").read_text(encoding="utf-8")
        out.setdefault("LICENSE", text.encode())
    return out


def _matches(root: Path, files: dict[str, str]) -> bool:
    """True when ``root`` holds exactly ``files`` (relative path -> sha256)."""
    if not root.is_dir():
        return False
    on_disk = {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}
    return on_disk == set(files) and all(_sha256((root / rel).read_bytes()) == d for rel, d in files.items())


def fetch(packages: tuple[Package, ...] = PACKAGES) -> dict:
    """Download, verify and unpack ``packages``; return the manifest (entries of other packages kept)."""
    manifest: dict = {"registry": REGISTRY, "packages": {}}
    if MANIFEST.is_file() and packages != PACKAGES:
        manifest = json.loads(MANIFEST.read_text(encoding="utf-8"))
    for pkg in packages:
        print(f"fetch {pkg.tarball}", flush=True)
        with urllib.request.urlopen(pkg.tarball, timeout=120) as resp:  # noqa: S310 (fixed https URL)
            data = resp.read()
        _check_integrity(pkg, data)
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            files = _select(pkg, tar)
        root = DEST / pkg.name
        if root.exists():
            shutil.rmtree(root)
        for rel, blob in sorted(files.items()):
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_bytes(blob)
        manifest["packages"][pkg.name] = {
            "npm": pkg.npm,
            "version": pkg.version,
            "tarball": pkg.tarball,
            "integrity": pkg.integrity,
            "license": pkg.license,
            "bytes": sum(len(b) for b in files.values()),
            "files": {rel: _sha256(blob) for rel, blob in sorted(files.items())},
        }
        print(f"  {len(files)} files, {manifest['packages'][pkg.name]['bytes'] / 1e6:.2f} MB -> {root.relative_to(REPO)}")
    MANIFEST.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return manifest


def fetch_for_build() -> list[str]:
    """Put the uncommitted packages (Pyodide) in place for the book build; return what was done, per package.

    A package whose files already match the committed manifest is left alone (no network). Otherwise its pinned
    tarball is downloaded, checked against the pinned sha512, unpacked, and every file checked against the
    manifest's sha256; any mismatch raises SystemExit and leaves no partial folder behind.
    """
    manifest = json.loads(MANIFEST.read_text(encoding="utf-8"))
    done = []
    for pkg in (p for p in PACKAGES if not p.committed):
        entry = manifest["packages"].get(pkg.name)
        if entry is None or (entry["version"], entry["integrity"]) != (pkg.version, pkg.integrity):
            raise SystemExit(f"{pkg.name}: vendor/manifest.json does not pin {pkg.version}; run tools/fetch_vendor.py")
        root = DEST / pkg.name
        if _matches(root, entry["files"]):
            done.append(f"{pkg.name} {pkg.version}: already in place ({entry['bytes'] / 1e6:.1f} MB)")
            continue
        print(f"fetch {pkg.tarball}", flush=True)
        with urllib.request.urlopen(pkg.tarball, timeout=300) as resp:  # noqa: S310 (fixed https URL)
            data = resp.read()
        _check_integrity(pkg, data)
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            files = _select(pkg, tar)
        wrong = sorted(set(files) ^ set(entry["files"])) + sorted(
            rel for rel, blob in files.items() if entry["files"].get(rel) not in (None, _sha256(blob)))
        if wrong:
            raise SystemExit(f"{pkg.name}: files differ from vendor/manifest.json: {wrong}")
        if root.exists():
            shutil.rmtree(root)
        for rel, blob in sorted(files.items()):
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_bytes(blob)
        done.append(f"{pkg.name} {pkg.version}: fetched and verified ({entry['bytes'] / 1e6:.1f} MB)")
    return done


def check() -> list[str]:
    """Offline check: the committed vendor files are exactly those of the manifest, which matches the pins."""
    problems: list[str] = []
    manifest = json.loads(MANIFEST.read_text(encoding="utf-8"))
    pinned = {p.name: p for p in PACKAGES}
    committed = {p.name for p in PACKAGES if p.committed}
    on_disk = {p.name for p in DEST.iterdir() if p.is_dir()}  # loose files there are the book's own
    if set(manifest["packages"]) != set(pinned) or not committed <= on_disk <= set(pinned):
        problems.append(f"packages: manifest {sorted(manifest['packages'])}, on disk {sorted(on_disk)}, "
                        f"pinned {sorted(pinned)}")
    for name, entry in manifest["packages"].items():
        pkg = pinned.get(name)
        if pkg is not None and (entry["version"], entry["integrity"]) != (pkg.version, pkg.integrity):
            problems.append(f"{name}: manifest has {entry['version']}, script pins {pkg.version}; run the script")
        root = DEST / name
        if name not in committed and not root.exists():
            continue  # fetched by the book build (--build); checked there

        on_disk = {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}
        for rel in sorted(on_disk - set(entry["files"])):
            problems.append(f"{name}/{rel}: not in the manifest")
        for rel, digest in entry["files"].items():
            path = root / rel
            if not path.is_file():
                problems.append(f"{name}/{rel}: missing")
            elif _sha256(path.read_bytes()) != digest:
                problems.append(f"{name}/{rel}: sha256 differs from the manifest")
        if "LICENSE" not in entry["files"]:
            problems.append(f"{name}: no LICENSE")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--check", action="store_true", help="verify committed files against the manifest (offline)")
    parser.add_argument("--build", action="store_true",
                        help="fetch the uncommitted packages (Pyodide) for the book build unless already in place")
    args = parser.parse_args(argv)
    if args.build:
        print("\n".join(fetch_for_build()))
        return 0
    if args.check:
        problems = check()
        print("\n".join(problems) or "vendor files match vendor/manifest.json")
        return 1 if problems else 0
    fetch()
    return 0


if __name__ == "__main__":
    sys.exit(main())
