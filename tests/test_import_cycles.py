"""No import cycles anywhere in memlib: the import graph of its modules (module- and function-level imports,
relative and absolute; those under ``if TYPE_CHECKING:`` left out) has no strongly connected component of more
than one module, so each package's dependency direction (written at the top of its ``__init__``) holds."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MEMLIB = ROOT / "memlib"


def _module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _import_nodes(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement in a tree, at any depth, except the bodies of ``if TYPE_CHECKING:``."""
    found: list[ast.Import | ast.ImportFrom] = []
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))
    return found


def import_graph(modules: set[str] | None = None) -> dict[str, set[str]]:
    """module -> the memlib modules it imports (``from pkg import name`` counts ``pkg.name`` when that is a
    module, else ``pkg``; importing ``a.b.c`` also runs ``a`` and ``a.b``, whose edges are their own)."""
    paths = {_module_name(p): p for p in MEMLIB.rglob("*.py")}
    names = set(paths) if modules is None else modules
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        is_pkg = path.name == "__init__.py"
        package = name.split(".") if is_pkg else name.split(".")[:-1]
        edges: set[str] = set()
        for node in _import_nodes(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                if node.level:
                    base = package[:len(package) - node.level + 1]
                    mod = ".".join([*base, node.module] if node.module else base)
                else:
                    mod = node.module or ""
                targets = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in names else mod for a in node.names]
            edges.update(t for t in targets if t in names and t != name)
        graph[name] = edges
    return graph


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components (iterative), each sorted; only those of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return out


def _cycle(graph: dict[str, set[str]], comp: list[str]) -> list[str]:
    """One concrete cycle inside a component (for the message): a path back to its first module."""
    members, start = set(comp), comp[0]
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & members):
                if w == start:
                    return paths[v] + [start]
                if w not in paths:
                    paths[w] = paths[v] + [w]
                    nxt.append(w)
        frontier = nxt
    return comp


def test_the_graph_sees_relative_function_level_and_package_imports() -> None:
    graph = import_graph()
    assert "memlib.core.configs" in graph["memlib.core.estimate"]  # from .configs import ... (module level)
    assert "memlib.core" not in graph["memlib.core.estimate"]  # from . import x counts the module x
    assert any(e.startswith("memlib.core.") for e in graph["memlib.cli"])


def test_function_level_imports_count_and_type_checking_ones_do_not() -> None:
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import A\nelse:\n"
                     "    from .b import B\ndef f():\n    from .c import C\n    import d\n")
    found = sorted(n.module if isinstance(n, ast.ImportFrom) else n.names[0].name for n in _import_nodes(tree))
    assert found == ["b", "c", "d", "typing"]


def test_the_cycle_finder_finds_a_cycle_and_names_it() -> None:
    toy = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    comps = strongly_connected(toy)
    assert comps == [["a", "b", "c"]]
    assert _cycle(toy, comps[0]) == ["a", "b", "c", "a"]


def test_memlib_has_no_import_cycle() -> None:
    graph = import_graph()
    comps = strongly_connected(graph)
    lines = [f"{len(c)} modules: " + " -> ".join(_cycle(graph, c)) + f"  (all: {', '.join(c)})" for c in comps]
    assert not comps, "import cycles in memlib:\n" + "\n".join(lines)
