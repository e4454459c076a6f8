"""Static checks of the published book's sources (no build, no browser): Colab cell, static figures before
widgets, self-hosted JavaScript, launch buttons and the bibliography (issues 10 and 19); no plumbing in the shown
code (issue 41)."""
from __future__ import annotations

import contextlib
import io
import json
import os
import re
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))

import colab_cell  # noqa: E402
import colab_install  # noqa: E402
import fetch_vendor  # noqa: E402
import tidy_cells  # noqa: E402

WIDGET = "application/vnd.jupyter.widget-view+json"
CONFIG = yaml.safe_load((REPO / "_config.yml").read_text(encoding="utf-8"))


def _toc_files() -> list[str]:
    toc = yaml.safe_load((REPO / "_toc.yml").read_text(encoding="utf-8"))

    def walk(node):
        if isinstance(node, dict):
            if "file" in node:
                yield node["file"]
            for value in node.values():
                yield from walk(value)
        elif isinstance(node, list):
            for value in node:
                yield from walk(value)

    return [toc["root"], *walk(toc.get("parts", toc.get("chapters", [])))]


def _toc_sources() -> list[Path]:
    out = []
    for f in _toc_files():
        hits = [REPO / f"{f}{ext}" for ext in (".ipynb", ".md") if (REPO / f"{f}{ext}").exists()]
        assert hits, f"_toc.yml lists {f!r} but there is no {f}.ipynb or {f}.md"
        out.append(hits[0])
    return out


TOC_NOTEBOOKS = [p for p in _toc_sources() if p.suffix == ".ipynb"]
IDS = [p.relative_to(REPO).as_posix() for p in TOC_NOTEBOOKS]


def _cells(path: Path) -> list[dict]:
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


def _mimes(cell: dict) -> set[str]:
    return {m for out in cell.get("outputs", []) for m in out.get("data", {})}


@pytest.mark.parametrize("path", TOC_NOTEBOOKS, ids=IDS)
def test_colab_cell_is_first_code_cell_and_current(path: Path) -> None:
    cells = _cells(path)
    code = [c for c in cells if c["cell_type"] == "code"]
    assert code, f"{path.name}: no code cell"
    first = code[0]
    tags = first.get("metadata", {}).get("tags", [])
    assert colab_cell.TAG in tags, (
        f"{path.relative_to(REPO)}: first code cell is not the Colab setup cell; run python tools/colab_cell.py")
    url, branch = colab_cell.repository()
    folder = path.parent.relative_to(REPO).as_posix()
    assert "".join(first["source"]) == colab_cell.cell_source(folder, url, branch), (
        f"{path.relative_to(REPO)}: Colab cell is outdated (e.g. repository.url changed); run tools/colab_cell.py")
    assert "remove-cell" in tags and first.get("outputs", []) == [], "setup cell: hidden in the book, no output"
    assert sum(colab_cell.TAG in c.get("metadata", {}).get("tags", []) for c in cells) == 1


def widget_violations(cells: list[dict]) -> list[str]:
    """Widget cells whose nearest earlier code cell with output shows no PNG (one line per offending cell)."""
    violations = []
    previous: dict | None = None
    for index, cell in enumerate(cells):
        if cell["cell_type"] != "code":
            continue
        if WIDGET in _mimes(cell) and (previous is None or "image/png" not in _mimes(previous)):
            shown = "".join(cell["source"]).strip().splitlines()
            before = sorted(_mimes(previous)) if previous else "nothing"
            violations.append(f"cell {index} ({shown[-1][:60] if shown else ''!r}): the code cell with output "
                              f"before it shows {before}, no image/png")
        if cell.get("outputs"):
            previous = cell
    return violations


@pytest.mark.parametrize("path", TOC_NOTEBOOKS, ids=IDS)
def test_every_widget_follows_a_static_figure(path: Path) -> None:
    """Readers without a kernel must see a picture: a static figure (default values) before every widget."""
    violations = widget_violations(_cells(path))
    assert not violations, f"{path.relative_to(REPO)}: widget without a static figure before it:\n  " + \
        "\n  ".join(violations)


def test_widget_rule_flags_a_bare_widget_and_accepts_figure_then_widget() -> None:
    def code(*mimes: str) -> dict:
        return {"cell_type": "code", "source": ["x"], "metadata": {},
                "outputs": [{"output_type": "display_data", "data": {m: "" for m in mimes}, "metadata": {}}]}

    silent = {"cell_type": "code", "source": ["import x"], "metadata": {}, "outputs": []}
    text = {"cell_type": "markdown", "source": ["text"], "metadata": {}}
    assert widget_violations([code("image/png", "text/plain"), text, silent, code(WIDGET)]) == []
    assert len(widget_violations([code(WIDGET)])) == 1
    assert len(widget_violations([code("image/png"), code("text/plain"), code(WIDGET)])) == 1
    assert len(widget_violations([code("image/png"), code(WIDGET), code(WIDGET)])) == 1


ALL_NOTEBOOKS = sorted(set(tidy_cells.find_notebooks()) | set(TOC_NOTEBOOKS))


def test_every_notebook_is_checked_for_plumbing() -> None:
    """The page rules below run over every notebook of chapters/, labs/ and drills/, the _toc.yml ones included."""
    assert set(TOC_NOTEBOOKS) <= set(ALL_NOTEBOOKS)
    assert {p.parent.name for p in ALL_NOTEBOOKS} == {"chapters", "labs", "drills"}


@pytest.mark.parametrize("path", ALL_NOTEBOOKS, ids=[p.relative_to(REPO).as_posix() for p in ALL_NOTEBOOKS])
def test_shown_code_has_no_glue_and_at_most_30_lines(path: Path) -> None:
    """The page shows teaching code: glue calls live in remove-cell cells, a shown cell is at most 30 lines
    (hide-input cells, whose output is the point, may be longer; they may not glue). Fix: tools/tidy_cells.py."""
    problems = tidy_cells.check_notebook(path)
    assert not problems, "\n".join(map(str, problems))


def _code(source: str, *tags: str, outputs: list | None = None) -> dict:
    return {"cell_type": "code", "source": source, "metadata": {"tags": list(tags)} if tags else {},
            "outputs": outputs or [], "execution_count": 1}


def test_page_rules_flag_shown_glue_and_long_cells() -> None:
    glue = 'print(x)\nglue("k", x, display=False)'
    long = "\n".join(f"x{i} = {i}" for i in range(31))
    rules = lambda *cells: [p.rule for p in tidy_cells.check_cells(list(cells))]
    assert rules(_code(glue)) == ["glue"]
    assert rules(_code(glue, "hide-input")) == ["glue"]            # folded code is still shown when opened
    assert rules(_code(glue, "remove-cell"), _code(glue, "remove-input")) == []
    assert rules(_code(long)) == ["long"]
    assert rules(_code(long, "hide-input"), _code(long, "remove-cell")) == []
    assert rules(_code("\n".join(long.splitlines()[:30]) + "\n")) == []   # 30 lines, a trailing newline
    assert rules({"cell_type": "markdown", "source": glue + "\n" + long, "metadata": {}}) == []


def _glue_output(value: str) -> dict:
    return {"output_type": "display_data", "data": {"application/papermill.record/text/plain": value},
            "metadata": {"scrapbook": {"name": value}}}


def test_tidy_moves_glue_with_its_outputs_and_refuses_unsafe_moves(tmp_path: Path) -> None:
    import nbformat

    stream = {"output_type": "stream", "name": "stdout", "text": "7\n"}
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.from_dict(_code('x = 7\nprint(x)\nglue("a", x, display=False)', outputs=[stream,
                                                                                            _glue_output("a")])),
                nbformat.from_dict(_code('y = 1\nglue("b", y, display=False)\ny = 2\nprint(y)',
                                         outputs=[_glue_output("b")]))]
    for cell in nb.cells:
        cell["id"] = f"c{len(cell.source)}"
    path = tmp_path / "nb.ipynb"
    nbformat.write(nb, path)
    moved, manual = tidy_cells.tidy_notebook(path)
    assert moved == 1 and len(manual) == 1 and "change ['y']" in manual[0]   # glue("b") reads y, rebound later
    cells = nbformat.read(path, as_version=4).cells
    assert [c.source for c in cells[:2]] == ["x = 7\nprint(x)", 'glue("a", x, display=False)']
    assert cells[1].metadata["tags"] == ["remove-cell"]
    assert cells[0].outputs == [stream] and [o["data"] for o in cells[1].outputs] == [_glue_output("a")["data"]]
    assert [c.execution_count for c in cells] == [1, 2, 3]
    assert [p.index for p in tidy_cells.check_notebook(path)] == [2]          # the unsafe cell is left as it was


def test_split_cell_puts_prose_between_and_outputs_with_the_second_part() -> None:
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.from_dict(_code("def f():\n    return 1\n\nprint(f())", outputs=[
        {"output_type": "stream", "name": "stdout", "text": "1\n"}]))]
    nb.cells[0]["id"] = "a"
    tidy_cells.split_cell(nb, 0, 3, prose="Then call it:")
    assert [c.cell_type for c in nb.cells] == ["code", "markdown", "code"]
    assert [c.source for c in nb.cells] == ["def f():\n    return 1", "Then call it:", "print(f())"]
    assert nb.cells[0].outputs == [] and nb.cells[2].outputs[0]["text"] == "1\n"
    assert len({c.id for c in nb.cells}) == 3 and [nb.cells[0].execution_count, nb.cells[2].execution_count] == [1, 2]


def test_colab_cell_is_silent_and_inert_outside_colab() -> None:
    url, branch = colab_cell.repository()
    source = colab_cell.cell_source("chapters", url, branch)
    assert "google.colab" not in sys.modules
    namespace: dict = {}
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        exec(compile(source, "<colab-cell>", "exec"), namespace)  # noqa: S102 (our own generated cell)
    assert out.getvalue() == ""
    assert set(namespace) - {"__builtins__"} == {"sys"}, "outside Colab the cell must only import sys"
    assert url in source and f'"{branch}"' in source and url == CONFIG["repository"]["url"].rstrip("/")


def test_colab_cell_script_is_idempotent(tmp_path: Path) -> None:
    nb = {"cells": [
        {"cell_type": "markdown", "id": "t", "metadata": {}, "source": ["# Title"]},
        {"cell_type": "code", "id": "a", "metadata": {}, "execution_count": 1, "outputs": [], "source": ["x = 1"]},
    ], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    path = tmp_path / "chapters" / "nb.ipynb"
    path.parent.mkdir()
    path.write_text(json.dumps(nb), encoding="utf-8")
    assert colab_cell.update_notebook(path, "https://example.org/o/book", "main") is True
    once = path.read_text(encoding="utf-8")
    assert colab_cell.update_notebook(path, "https://example.org/o/book", "main") is False
    assert path.read_text(encoding="utf-8") == once
    cells = json.loads(once)["cells"]
    assert [c["cell_type"] for c in cells] == ["markdown", "code", "code"]
    assert cells[1]["id"] == colab_cell.CELL_ID and '"https://example.org/o/book", _book' in "".join(cells[1]["source"])
    assert colab_cell.update_notebook(path, "https://example.org/o/moved", "dev") is True  # updated in place
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    assert len(cells) == 3 and '"dev"' in "".join(cells[1]["source"]) and "/content/moved" in "".join(cells[1]["source"])


def test_colab_cell_update_keeps_the_executed_cell(tmp_path: Path) -> None:
    """A new URL rewrites the cell's text only: its id, execution count and metadata stay (nbval's outputs too)."""
    path = tmp_path / "labs" / "nb.ipynb"
    path.parent.mkdir()
    cell = {"cell_type": "code", "id": "colab-setup", "execution_count": 1, "outputs": [],
            "metadata": {"tags": list(colab_cell.TAGS), "execution": {"iopub.status.idle": "2026-01-01T00:00:00Z"}},
            "source": colab_cell.cell_source("labs", "https://example.org/o/book", "main")}
    path.write_text(json.dumps({"cells": [cell], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}), encoding="utf-8")
    assert colab_cell.update_notebook(path, "https://example.org/o/moved", "main") is True
    (after,) = json.loads(path.read_text(encoding="utf-8"))["cells"]
    assert after["execution_count"] == 1
    assert after["metadata"]["execution"] == {"iopub.status.idle": "2026-01-01T00:00:00Z"}
    assert "".join(after["source"]) == colab_cell.cell_source("labs", "https://example.org/o/moved", "main")


def test_colab_cell_stops_with_one_message_when_the_clone_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    """On Colab, a repository that cannot be cloned stops the cell with one line naming the URL and git's error."""
    import subprocess
    import types

    url = "https://example.org/nobody/missing-book"
    source = colab_cell.cell_source("chapters", url, "main")
    calls: list[list[str]] = []

    def failing_clone(cmd: list[str], **kwargs: object) -> subprocess.CompletedProcess:
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 128, "", "Cloning...\nfatal: repository '" + url + "/' not found\n")

    monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    monkeypatch.setattr(subprocess, "run", failing_clone)
    monkeypatch.setattr(os.path, "isdir", lambda p: False)
    with pytest.raises(SystemExit) as stop:
        exec(compile(source, "<colab-cell>", "exec"), {})  # noqa: S102 (our own generated cell)
    message = str(stop.value)
    assert calls and calls[0][:2] == ["git", "clone"] and url in calls[0]
    assert url in message and "fatal: repository" in message and "repository.url" in message
    assert "\n" not in message


def test_colab_installs_runtime_pins_but_never_torch() -> None:
    pins = colab_install.runtime_requirements((REPO / "requirements.txt").read_text(encoding="utf-8"))
    names = {re.split(r"[=<>!~ ]", p)[0].lower() for p in pins}
    assert "torch" not in names and not names & colab_install.TOOLING
    assert {"transformers", "numpy", "matplotlib", "ipywidgets"} <= names
    assert all("==" in p for p in pins), pins
    assert colab_install.runtime_requirements("torch==2.13.0\nJupyter_Book==1\n# c\nnumpy==2 # x\n") == ["numpy==2"]


def test_colab_setup_constrains_torch_to_colabs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "chapters").mkdir()
    (tmp_path / "requirements.txt").write_text("torch==9.9.9\nnumpy==2.4.6\npytest==9\n", encoding="utf-8")
    calls: list[tuple[list[str], str, str]] = []

    def fake_run(cmd, check):
        req = next((Path(cmd[i + 1]).read_text() for i, a in enumerate(cmd) if a == "-r"), "")
        con = next((Path(cmd[i + 1]).read_text() for i, a in enumerate(cmd) if a == "-c"), "")
        calls.append((cmd, req, con))

    monkeypatch.setattr(colab_install.subprocess, "run", fake_run)
    monkeypatch.setattr(colab_install, "_installed", lambda name: {"torch": "2.5.1+cu121"}.get(name, "2.4.6"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    colab_install.setup(str(tmp_path), "chapters")
    assert Path(os.getcwd()) == tmp_path / "chapters" and sys.path[0] == str(tmp_path)
    (pip_reqs, req, con), (pip_e, _, _) = calls
    assert req == "numpy==2.4.6\n" and con == "torch==2.5.1+cu121\n"
    assert pip_e[-3:] == ["--no-deps", "-e", str(tmp_path)]


def test_vendored_javascript_matches_manifest() -> None:
    problems = fetch_vendor.check()
    assert not problems, "vendor/ differs from vendor/manifest.json:\n" + "\n".join(problems)


def test_config_loads_javascript_from_the_book_itself() -> None:
    sphinx = CONFIG["sphinx"]["config"]
    extra = [REPO / p for p in sphinx["html_extra_path"]]
    assert REPO / "vendor" / "site" in extra
    assets = [sphinx["mathjax_path"], *sphinx["nb_ipywidgets_js"]]
    for asset in assets:
        assert "://" not in asset and asset.startswith("../"), f"{asset}: must be a relative, self-hosted path"
        assert (REPO / "vendor" / "site" / asset.removeprefix("../")).is_file(), f"{asset}: file missing"
    names = [Path(a).name for a in sphinx["nb_ipywidgets_js"]]
    assert names.index("require.js") < names.index("widgets-offline.js") < names.index("embed-amd.js")
    assert not any((REPO / "_static").glob("**/*.js")), "JS under _static/ is injected into every page by JB1"


def test_launch_buttons_and_repository() -> None:
    assert CONFIG["repository"]["url"].startswith("https://github.com/")
    launch = CONFIG["launch_buttons"]
    assert launch["colab_url"] == "https://colab.research.google.com"
    assert launch["binderhub_url"] == "https://mybinder.org"
    text = (REPO / "_config.yml").read_text(encoding="utf-8")
    assert text.count(CONFIG["repository"]["url"]) == 1, "the repository URL lives in one place"


ISSUE_PAPERS = {  # issue 10: every paper the book cites, with the key it has in references.bib
    "ZeRO": "rajbhandari2020zero", "Korthikanti et al.": "korthikanti2022reducing",
    "Chen et al. 2016": "chen2016training", "FlashAttention": "dao2022flashattention",
    "FlashAttention-2": "dao2023flashattention2", "8-bit optimizers": "dettmers2022optimizers",
    "QLoRA": "dettmers2023qlora", "mixed-precision training": "micikevicius2018mixed",
    "FP8 formats": "micikevicius2022fp8", "PaLM": "chowdhery2022palm", "Kaplan et al.": "kaplan2020scaling",
    "FSDP": "zhao2023fsdp",
}
_CITE = re.compile(r"\{cite(?::[a-z]+)?\}`([^`]+)`")


def _cited_keys() -> dict[str, set[str]]:
    cited: dict[str, set[str]] = {}
    for path in _toc_sources():
        if path.suffix == ".ipynb":
            text = "\n".join("".join(c["source"]) for c in _cells(path) if c["cell_type"] == "markdown")
        else:
            text = path.read_text(encoding="utf-8")
        for group in _CITE.findall(text):
            for key in group.split(","):
                cited.setdefault(key.strip(), set()).add(path.relative_to(REPO).as_posix())
    return cited


def test_bibliography_has_and_cites_the_issue_papers() -> None:
    bib = set(re.findall(r"^@\w+\{([^,]+),", (REPO / "references.bib").read_text(encoding="utf-8"), re.M))
    cited = _cited_keys()
    missing = {paper: key for paper, key in ISSUE_PAPERS.items() if key not in bib}
    uncited = {paper: key for paper, key in ISSUE_PAPERS.items() if key not in cited}
    unknown = {key: sorted(pages) for key, pages in cited.items() if key not in bib}
    assert not (missing or uncited or unknown), (
        f"not in references.bib: {missing}; cited on no page of the toc: {uncited}; "
        f"cited but not in references.bib: {unknown}")


def _bib_entries() -> dict[str, str]:
    """key -> the entry's text, from references.bib."""
    text = (REPO / "references.bib").read_text(encoding="utf-8")
    starts = [(m.start(), m.group(1)) for m in re.finditer(r"^@\w+\{([^,]+),", text, re.M)] + [(len(text), "")]
    return {key: text[a:b] for (a, key), (b, _) in zip(starts, starts[1:])}


def test_every_bibliography_entry_has_exactly_one_link() -> None:
    """An arXiv id (eprint), else a DOI, else a URL; never an arXiv URL beside the eprint (it would print twice)."""
    entries = _bib_entries()
    assert len(entries) >= 41 and "tazi2025ultrascale" in entries  # the Ultra-Scale Playbook, quoted in Chapter 1
    for key, entry in entries.items():
        links = [f for f in ("eprint", "doi", "url") if re.search(rf"^\s*{f}\s*=", entry, re.M)]
        assert links, f"{key}: no eprint, doi or url"
        assert not re.search(r"url\s*=\s*\{https://arxiv\.org", entry), f"{key}: arXiv URL beside eprint"
        assert "note" not in entry or not re.search(r"note\s*=\s*\{arXiv:", entry), f"{key}: arXiv id in a note"
        assert "\\'" not in entry and "\\`" not in entry, f"{key}: LaTeX accents (write the UTF-8 letter)"


def test_bibliography_labels_read_like_the_citations() -> None:
    """The label style (_ext/bib_style.py) gives author-year labels; equal ones get a, b; one link per entry."""
    sys.path.insert(0, str(REPO / "_ext"))
    import bib_style
    from pybtex.database import parse_file
    from pybtex.plugin import find_plugin

    bib_style._register()
    style = find_plugin("pybtex.style.formatting", "book")()
    entries = {e.key: e for e in style.format_bibliography(parse_file(str(REPO / "references.bib")))}
    labels = {key: e.label for key, e in entries.items()}
    assert labels["rajbhandari2020zero"] == "Rajbhandari et al., 2020"
    assert labels["ioffe2015batch"] == "Ioffe and Szegedy, 2015"
    assert labels["dao2023flashattention2"] == "Dao, 2023"
    assert labels["goyal2017accurate"] == "Goyal et al., 2017"  # was [GDollarG+17]
    assert labels["hf2023trainingsanatomy"] == "Hugging Face, 2023"
    assert sorted([labels["touvron2023llama"], labels["touvron2023llama2"]]) == [
        "Touvron et al., 2023a", "Touvron et al., 2023b"]
    assert len(set(labels.values())) == len(labels)
    order = list(labels.values())  # the bibliography's order: by name as printed, then year and title
    assert order.index("Hu et al., 2021") < order.index("Hugging Face, 2023") < order.index("Ioffe and Szegedy, 2015")
    for key, entry in entries.items():
        text = entry.text.render_as("text")
        links = re.findall(r"arXiv:\d{4}\.\d{4,5}|doi:10\.\S+|URL: \S+", text)
        assert len(links) == 1, f"{key}: {links}"
    assert "Dollár" in entries["goyal2017accurate"].text.render_as("text")


_QUESTION = re.compile(r"^\*\*Question \d+", re.M)
_ANSWER = re.compile(r"^(`{3,}|:{3,})\{dropdown\}", re.M)


@pytest.mark.parametrize("path", TOC_NOTEBOOKS, ids=IDS)
def test_every_question_has_a_dropdown_answer(path: Path) -> None:
    """Questions are answered the same way everywhere: `**Question N [topic].**` then a {dropdown} block."""
    md = "\n\n".join("".join(c["source"]) for c in _cells(path) if c["cell_type"] == "markdown")
    starts = [m.start() for m in _QUESTION.finditer(md)] + [len(md)]
    bare = [md[a:b].splitlines()[0][:70] for a, b in zip(starts, starts[1:]) if not _ANSWER.search(md[a:b])]
    assert not bare, f"{path.relative_to(REPO)}: questions without a dropdown answer: {bare}"
    assert not re.search(r"\{(exercise|solution|toggle)\}", md), "use {dropdown} answers, as the rest of the book"


def test_offline_extension_drops_thebe_and_flags_remote_assets(monkeypatch: pytest.MonkeyPatch) -> None:
    sys.path.insert(0, str(REPO / "_ext"))
    import offline_book
    from sphinx.builders.html._assets import _JavaScript

    class App:
        class config:  # noqa: N801 (mimics sphinx.config.Config)
            html_theme_options = {"launch_buttons": {"thebe": False}}

    warnings: list[tuple] = []
    monkeypatch.setattr(offline_book.logger, "warning", lambda *a, **k: warnings.append(a))
    thebe = [_JavaScript(None, body='const THEBE_JS_URL = "https://unpkg.com/thebe@0.8.2/lib/index.js"'),
             _JavaScript("_static/sphinx-thebe.js")]
    local = [_JavaScript("_static/../vendor/requirejs/require.js")]
    context = {"script_files": thebe + local, "css_files": []}
    offline_book._offline_assets(App, "page", "page.html", context, None)
    assert context["script_files"] == local and warnings == []
    context = {"script_files": [_JavaScript("https://cdn.jsdelivr.net/npm/x.js")], "css_files": []}
    offline_book._offline_assets(App, "page", "page.html", context, None)
    assert len(warnings) == 1 and "cdn.jsdelivr.net" in str(warnings[0])


def test_colab_setup_refuses_to_replace_torch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "chapters").mkdir()
    (tmp_path / "requirements.txt").write_text("torch==9.9.9\ntransformers==99\n", encoding="utf-8")

    def pip_cannot_resolve(cmd, check):
        raise colab_install.subprocess.CalledProcessError(1, cmd)

    monkeypatch.setattr(colab_install.subprocess, "run", pip_cannot_resolve)
    monkeypatch.setattr(colab_install, "_installed", lambda name: "2.1.0+cu118" if name == "torch" else None)
    with pytest.raises(RuntimeError, match=r"Colab's torch 2\.1\.0\+cu118"):
        colab_install.setup(str(tmp_path), "chapters")


def test_pdf_button_links_the_whole_book_pdf() -> None:
    """The theme's per-page ".pdf" (window.print() of one page) becomes a link to book.pdf at the site's root."""
    sys.path.insert(0, str(REPO / "_ext"))
    import book_pdf

    pdf = {"type": "javascript", "javascript": "window.print()", "label": "download-pdf-button", "text": ".pdf"}
    source = {"type": "link", "url": "../_sources/x.ipynb", "label": "download-source-button"}
    context = {"pathto": lambda name, resource: f"../{name}",
               "header_buttons": [{"type": "group", "label": "download-buttons", "buttons": [source, pdf]}]}
    book_pdf._link_whole_book_pdf(None, "chapters/x", "page.html", context, None)  # type: ignore[arg-type]
    buttons = context["header_buttons"][0]["buttons"]
    assert buttons[0] is source
    assert buttons[1]["type"] == "link" and buttons[1]["url"] == "../book.pdf" and "javascript" not in buttons[1]
    assert "book.pdf" in (REPO / "intro.md").read_text(encoding="utf-8")
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert re.search(r"^python3 -m venv .* && jupyter-book build \. -W -n --keep-going && python tools/build_pdf\.py$",
                     readme, re.M), "README's build command also writes _build/pdf/book.pdf"
