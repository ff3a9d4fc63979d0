"""No import cycles: the import graph of the project's packages has no strongly connected component of two or more.

Every ``import`` and ``from ... import`` is an edge, at module level or inside
a function or an ``if TYPE_CHECKING:`` block (a cycle hidden there is a cycle
still); ``from pkg import mod`` where ``pkg.mod`` is a module is an edge to
``pkg.mod``, else to ``pkg``. Relative imports are resolved. Only edges
between the project's own modules count.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("ferry", "ferry_cli", "harness", "controlplane", "dataplane", "agent", "tools")

# Cycles found in packages this test's owners do not edit: each is reported to
# their owners and listed here (as its sorted module names) until it is fixed.
# A cycle not listed here fails; a listed one that is gone fails too, so the
# list only shrinks.
KNOWN: set[frozenset[str]] = set()


def modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def imported(name: str, path: Path, known: dict[str, Path]) -> Iterator[str]:
    """The project modules that module ``name`` imports, anywhere in its body."""
    is_package = path.name == "__init__.py"
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:
                candidate = f"{source}.{alias.name}"
                yield candidate if candidate in known else source


def graph() -> dict[str, set[str]]:
    known = modules()
    edges: dict[str, set[str]] = {}
    for name, path in known.items():
        targets = set()
        for target in imported(name, path, known):
            while target and target not in known:  # `import a.b.c` of a non-module tail: its package
                target = target.rpartition(".")[0]
            if target and target != name:
                targets.add(target)
        edges[name] = targets
    return edges


def components(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components (Tarjan, iterative), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for root in sorted(edges):
        if root in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                found.append(sorted(component))
    return found


def cycle_path(component: list[str], edges: dict[str, set[str]]) -> str:
    """One cycle through the component's first module, as ``a -> b -> a``."""
    members = set(component)
    start = component[0]
    parents: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for node in frontier:
            for child in sorted(edges[node] & members):
                if child == start:
                    path = [start]
                    while node != start:
                        path.append(node)
                        node = parents[node]
                    return " -> ".join([start, *reversed(path[1:]), start])
                if child not in parents:
                    parents[child] = node
                    nxt.append(child)
        frontier = nxt
    return " <-> ".join(component)


def test_the_graph_sees_the_project() -> None:
    edges = graph()
    assert "controlplane.server" in edges and "controlplane.mailbox" in edges
    assert "controlplane.config" in edges["controlplane.server"]


def test_cycle_detection_finds_a_planted_cycle() -> None:
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    cycles = [c for c in components(edges) if len(c) > 1]
    assert cycles == [["a", "b", "c"]]
    assert cycle_path(cycles[0], edges) == "a -> b -> c -> a"


def test_no_import_cycles() -> None:
    edges = graph()
    cycles = [c for c in components(edges) if len(c) > 1]
    new = [c for c in cycles if frozenset(c) not in KNOWN]
    assert not new, "import cycles:\n" + "\n".join(cycle_path(c, edges) for c in new)
    gone = KNOWN - {frozenset(c) for c in cycles}
    assert not gone, f"listed as known but no longer a cycle (remove from KNOWN): {sorted(map(sorted, gone))}"
