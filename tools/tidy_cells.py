"""Keep the book's plumbing out of the reader's view: glue calls in hidden cells, no shown code cell over 30 lines.

A code cell is *shown* when the book prints its input: it has neither the ``remove-cell`` nor the ``remove-input``
tag. A ``hide-input`` cell is folded, not removed: the reader can open it, so it may be long (its output is the
point) but it may not hold ``glue(`` either. The rules (checked by ``tests/test_book_static.py`` over every
notebook of the book):

* no shown code cell contains ``glue(``: the calls that feed numbers into the prose go into a cell tagged
  ``remove-cell`` next to the cell whose code teaches (nbval still runs it and compares its outputs);
* no shown, unfolded code cell is longer than ``MAX_LINES`` source lines (blank lines count).

The fixing mode moves, in each shown cell, the top-level statements that exist only for the prose into a new
``remove-cell`` cell right after it, together with the glue outputs they produced (so nothing is re-executed):
``glue(...)`` calls, ``for`` loops made only of glue calls, the ``try: from myst_nb import glue`` fallback, and
assignments just before them whose names no later shown cell reads. A statement is moved only when that is
safe: the statements left after it in the cell neither rebind nor mutate a name it reads, and the cell's new last
statement is not an expression that Jupyter would now display. Any other cell is listed for a hand edit.

Usage::

    python tools/tidy_cells.py --check              # list offending cells of every notebook; exit 1 if any
    python tools/tidy_cells.py                      # fix what can be fixed safely, list the rest
    python tools/tidy_cells.py chapters/05_x.ipynb  # only these notebooks
"""
from __future__ import annotations

import argparse
import ast
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import nbformat

__all__ = ["MAX_LINES", "Problem", "check_cells", "check_notebook", "find_notebooks", "is_folded", "is_shown",
           "line_count", "move_glue", "renumber", "split_cell", "tidy_notebook"]

REPO = Path(__file__).resolve().parents[1]
NOTEBOOK_DIRS = ("chapters", "labs", "drills")
MAX_LINES = 30
HIDDEN_TAGS = ("remove-cell", "remove-input")
FOLDED_TAG = "hide-input"


@dataclass(frozen=True)
class Problem:
    """One shown code cell that breaks a rule."""

    path: str
    index: int           # position of the cell in the notebook (all cells, from 0)
    rule: str            # "glue" or "long"
    detail: str

    def __str__(self) -> str:
        return f"{self.path} cell {self.index}: {self.detail}"


def _tags(cell) -> list[str]:
    return list(cell.get("metadata", {}).get("tags", []))


def _source(cell) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def is_shown(cell) -> bool:
    """True for a code cell whose input the book prints (possibly folded)."""
    return cell.get("cell_type") == "code" and not set(_tags(cell)) & set(HIDDEN_TAGS)


def is_folded(cell) -> bool:
    """True for a shown cell whose input is folded (``hide-input``): the reader opens it on demand."""
    return is_shown(cell) and FOLDED_TAG in _tags(cell)


def line_count(source: str) -> int:
    """Source lines of a cell, blank lines included (a trailing newline does not add a line)."""
    return len(source.splitlines())


def check_cells(cells, path: str = "<notebook>") -> list[Problem]:
    """The rule breaks of a list of cells (dicts or nbformat nodes)."""
    problems = []
    for i, cell in enumerate(cells):
        if not is_shown(cell):
            continue
        src = _source(cell)
        if "glue(" in src:
            n = sum("glue(" in line for line in src.splitlines())
            problems.append(Problem(path, i, "glue", f"shown code cell has {n} line(s) with glue( "
                                                      "(move them to a remove-cell cell)"))
        if not is_folded(cell) and line_count(src) > MAX_LINES:
            problems.append(Problem(path, i, "long", f"shown code cell has {line_count(src)} lines (at most "
                                                      f"{MAX_LINES}: split it, move code to memlib or fold it)"))
    return problems


def check_notebook(path: Path) -> list[Problem]:
    nb = nbformat.read(path, as_version=4)
    return check_cells(nb.cells, _rel(path))


def find_notebooks(root: Path = REPO) -> list[Path]:
    return sorted(p for d in NOTEBOOK_DIRS for p in (root / d).glob("*.ipynb"))


def _rel(path: Path) -> str:
    try:
        return path.resolve().relative_to(REPO).as_posix()
    except ValueError:
        return str(path)


# --- fixing -------------------------------------------------------------------------------------------------

def _is_glue_call(node: ast.AST) -> bool:
    return (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
            and isinstance(node.value.func, ast.Name) and node.value.func.id == "glue")


def _is_glue_import(node: ast.AST) -> bool:
    """``from myst_nb import glue`` alone, or the ``try: ... except ImportError: def glue`` fallback."""
    if isinstance(node, ast.ImportFrom):
        return node.module == "myst_nb" and [a.name for a in node.names] == ["glue"]
    if isinstance(node, ast.Try):
        return (len(node.body) == 1 and _is_glue_import(node.body[0]) and not node.orelse and not node.finalbody
                and all(isinstance(s, (ast.FunctionDef, ast.Pass)) for h in node.handlers for s in h.body))
    return False


def _is_glue_stmt(node: ast.AST) -> bool:
    if _is_glue_call(node) or _is_glue_import(node):
        return True
    return (isinstance(node, ast.For) and not node.orelse and all(_is_glue_call(s) for s in node.body))


def _loaded(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def _written(node: ast.AST) -> set[str]:
    """Names a statement binds, or mutates through an attribute/subscript store or a method call."""
    out = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del)):
            out.add(n.id)
        elif isinstance(n, (ast.Attribute, ast.Subscript)) and isinstance(n.ctx, (ast.Store, ast.Del)):
            base = n.value
            while isinstance(base, (ast.Attribute, ast.Subscript)):
                base = base.value
            if isinstance(base, ast.Name):
                out.add(base.id)
        elif isinstance(n, (ast.FunctionDef, ast.ClassDef)):
            out.add(n.name)
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            out.update((a.asname or a.name).split(".")[0] for a in n.names)
        elif isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and isinstance(n.func.value, ast.Name):
            out.add(n.func.value.id)          # x.append(...), d.update(...): may mutate x
    return out


def _assigned(node: ast.AST) -> set[str] | None:
    """Targets of a plain assignment of names, else None."""
    if not isinstance(node, ast.Assign):
        return None
    names = set()
    for t in node.targets:
        for n in ast.walk(t):
            if isinstance(n, ast.Name):
                names.add(n.id)
            elif isinstance(n, (ast.Attribute, ast.Subscript)):
                return None
    return names


def _displays(node: ast.AST) -> bool:
    """Would this statement, last in a cell, make Jupyter display a value?"""
    if not isinstance(node, ast.Expr):
        return False
    v = node.value
    return not (isinstance(v, ast.Call) and isinstance(v.func, ast.Name) and v.func.id in ("print", "display"))


def _plan(source: str, later_reads: set[str]) -> list[int] | None:
    """Indices of the top-level statements to move out of ``source``, or None with nothing to do.

    Raises ValueError naming why the cell needs a hand edit.
    """
    tree = ast.parse(source)
    body = tree.body
    glue = [i for i, s in enumerate(body) if _is_glue_stmt(s)]
    if not glue:
        if "glue(" in source:
            raise ValueError("glue( inside a block (not a top-level statement)")
        return None
    move = set(glue)
    # assignments right before a run of glue statements, read only by what is moved
    for i in sorted(glue, reverse=True):
        j = i - 1
        while j >= 0 and j not in move:
            names = _assigned(body[j])
            used_later_kept = set().union(*(_loaded(body[k]) for k in range(j + 1, len(body)) if k not in move))
            if not names or names & (later_reads | used_later_kept) or "glue(" in ast.get_source_segment(
                    source, body[j]) or not names & set().union(*(_loaded(body[k]) for k in move)):
                break
            move.add(j)
            j -= 1
    for i in sorted(move):
        reads = _loaded(body[i])
        after = [body[k] for k in range(i + 1, len(body)) if k not in move]
        clash = reads & set().union(*(_written(s) for s in after)) if after else set()
        if clash:
            raise ValueError(f"line {body[i].lineno}: later statements change {sorted(clash)}")
    kept = [k for k in range(len(body)) if k not in move]
    if any("glue" in ast.get_source_segment(source, body[k]) for k in kept):
        raise ValueError("glue( inside a block (not a top-level statement)")
    if not kept:
        raise ValueError("the whole cell is glue: tag it remove-cell by hand")
    if _displays(body[kept[-1]]) and kept[-1] < max(move):
        raise ValueError(f"line {body[kept[-1]].lineno}: would become the cell's displayed last expression")
    return sorted(move)


def _split_source(source: str, move: list[int]) -> tuple[str, str]:
    """(kept, moved) source text; comment lines directly above a moved statement go with it."""
    tree = ast.parse(source)
    lines = source.splitlines()
    owner = [None] * len(lines)                 # line -> "move" / "keep"
    for i, stmt in enumerate(tree.body):
        start = stmt.lineno - 1
        if getattr(stmt, "decorator_list", None):
            start = min(d.lineno for d in stmt.decorator_list) - 1
        tag = "move" if i in move else "keep"
        for k in range(start, stmt.end_lineno):
            owner[k] = tag
        k = start - 1
        while k >= 0 and owner[k] is None and lines[k].lstrip().startswith("#"):
            owner[k] = tag
            k -= 1
    kept = [ln for ln, o in zip(lines, owner) if o != "move"]
    moved = [ln for ln, o in zip(lines, owner) if o == "move"]
    strip = lambda ls: "\n".join(ls).strip("\n")
    return strip(kept), strip(moved)


def _coalesce(outputs: list) -> list:
    out = []
    for o in outputs:
        if (out and o.get("output_type") == "stream" and out[-1].get("output_type") == "stream"
                and out[-1].get("name") == o.get("name")):
            prev = out[-1]
            prev["text"] = _source({"source": prev["text"]}) + _source({"source": o["text"]})
        else:
            out.append(o)
    return out


def tidy_notebook(path: Path, write: bool = True) -> tuple[int, list[str]]:
    """Move the glue statements of every shown cell of ``path`` into new remove-cell cells.

    Returns (number of cells split, messages for the cells that need a hand edit).
    """
    nb = nbformat.read(path, as_version=4)
    cells = list(nb.cells)
    reads_from = [set() for _ in cells]       # names read by shown cells at or after i
    acc: set[str] = set()
    for i in range(len(cells) - 1, -1, -1):
        if is_shown(cells[i]):
            try:
                acc = acc | _loaded(ast.parse(_source(cells[i])))
            except SyntaxError:
                pass
        reads_from[i] = set(acc)
    new_cells, split, manual = [], 0, []
    ids = {c.get("id") for c in cells}
    for i, cell in enumerate(cells):
        new_cells.append(cell)
        if not is_shown(cell) or "glue" not in _source(cell):
            continue
        later = reads_from[i + 1] if i + 1 < len(cells) else set()
        try:
            plan = _plan(_source(cell), later)
        except (ValueError, SyntaxError) as err:
            manual.append(f"{_rel(path)} cell {i}: {err}")
            continue
        if plan is None:
            continue
        kept, moved = _split_source(_source(cell), plan)
        new_cells.append(_glue_cell(cell, kept, moved, ids, i))
        split += 1
    if split and write:
        nb.cells = new_cells
        renumber(nb)
        nbformat.write(nb, path)
    return split, manual


def split_cell(nb, index: int, line: int, prose: str | None = None, first_outputs: int = 0,
               first_tags: tuple[str, ...] = (), second_tags: tuple[str, ...] = ()) -> None:
    """Split code cell ``index`` of ``nb`` before source line ``line`` (from 0), for a hand edit.

    The first part keeps the first ``first_outputs`` outputs, the second gets the rest; ``prose`` (markdown)
    goes between them. nbval, run afterwards, tells whether the outputs went to the cell that prints them.
    """
    cell = nb.cells[index]
    lines = _source(cell).splitlines()
    head, tail = "\n".join(lines[:line]).strip("\n"), "\n".join(lines[line:]).strip("\n")
    outputs = list(cell.get("outputs", []))
    second = nbformat.v4.new_code_cell(tail, metadata={"tags": list(second_tags)} if second_tags else {})
    second["outputs"], second["execution_count"] = outputs[first_outputs:], cell.get("execution_count")
    ids = {c.get("id") for c in nb.cells}
    second["id"] = _fresh_id(ids, str(cell.get("id") or f"cell{index}"), "b")
    cell["source"], cell["outputs"] = head, outputs[:first_outputs]
    if first_tags:
        cell.setdefault("metadata", {})["tags"] = [*_tags(cell), *[t for t in first_tags if t not in _tags(cell)]]
    add = [second]
    if prose:
        md = nbformat.v4.new_markdown_cell(textwrap.fill(prose, 115, break_long_words=False,
                                                          break_on_hyphens=False))
        md["id"] = _fresh_id(ids, str(cell.get("id") or f"cell{index}"), "m")
        add = [md, second]
    nb.cells[index + 1:index + 1] = add
    renumber(nb)


def _fresh_id(ids: set, base: str, suffix: str) -> str:
    """``base-suffix`` (or ``base-suffix2``, ...), not yet in ``ids``; added to it."""
    new_id, k = f"{base}-{suffix}", 2
    while new_id in ids:
        new_id, k = f"{base}-{suffix}{k}", k + 1
    ids.add(new_id)
    return new_id


def _glue_cell(cell, kept: str, moved: str, ids: set, index: int):
    """Give ``cell`` the source ``kept``; return the remove-cell cell running ``moved``, with the glue outputs."""
    outputs = list(cell.get("outputs", []))
    cell["source"] = kept
    cell["outputs"] = _coalesce([o for o in outputs if "scrapbook" not in o.get("metadata", {})])
    nbval = [t for t in _tags(cell) if t.startswith("nbval-")]      # e.g. timings: not compared, here too
    new = nbformat.v4.new_code_cell(moved, metadata={"tags": ["remove-cell", *nbval]})
    new["outputs"] = [o for o in outputs if "scrapbook" in o.get("metadata", {})]
    new["execution_count"] = cell.get("execution_count")
    new["id"] = _fresh_id(ids, str(cell.get("id") or f"cell{index}"), "glue")
    return new


def move_glue(nb, index: int, kept: str, moved: str) -> None:
    """Hand edit: code cell ``index`` becomes ``kept``; a remove-cell cell running ``moved`` follows it.

    The glue outputs move with ``moved``, in their order: ``moved`` must glue in the order the cell did.
    """
    ids = {c.get("id") for c in nb.cells}
    nb.cells.insert(index + 1, _glue_cell(nb.cells[index], kept, moved, ids, index))
    renumber(nb)


def renumber(nb) -> None:
    """Execution counts 1, 2, ... in cell order, as a top-to-bottom run gives them."""
    n = 0
    for cell in nb.cells:
        if cell.get("cell_type") == "code" and cell.get("execution_count") is not None:
            n += 1
            cell["execution_count"] = n
            for o in cell.get("outputs", []):
                if "execution_count" in o:
                    o["execution_count"] = n


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", type=Path, help="notebooks (default: every notebook of the book)")
    parser.add_argument("--check", action="store_true", help="only list offending cells; exit 1 if any")
    args = parser.parse_args(argv)
    paths = args.paths or find_notebooks()
    if not args.check:
        for path in paths:
            split, manual = tidy_notebook(path)
            if split:
                print(f"{_rel(path)}: moved the glue of {split} cell(s) into remove-cell cells")
            for line in manual:
                print(f"hand edit: {line}")
    problems = [p for path in paths for p in check_notebook(path)]
    for p in problems:
        print(p)
    if args.check:
        print(f"{len(problems)} cell(s) break the rules" if problems else "every shown code cell follows the rules")
    return 1 if problems and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
