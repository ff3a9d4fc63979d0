"""The import check of the planes' layers: no loop between a plane's subpackages, no import from a layer up.

A plane's *subpackage* is a direct child of it, package or module (``dataplane.pick``,
``dataplane.router``). For each plane in :data:`PLANES` the check reads every module of it with
:mod:`ast` (the imports of the whole file: top-level, inside functions, under ``TYPE_CHECKING``) and
builds the graph of imports between its subpackages, then fails on:

1. a loop: two subpackages that import each other, or any longer cycle (a strongly connected
   component of the graph with more than one subpackage; each import inside it is printed);
2. an import from a lower layer to a higher one, the layers being :data:`LAYERS` (per plane, the
   layers bottom first, each a set of subpackages; a subpackage may import its own layer and those
   below);
3. a subpackage the table does not declare (so that the table stays the whole plane; a declared
   name with no subpackage is let be).

Each offence is printed with its file and line. ``python -m tools.layers`` prints the offences and
exits 1 when there are any; ``--draw`` prints each plane's layers (the drawing in docs/design.md).
Imports of other planes and of the shared packages are not this check's concern.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import sys
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# The planes checked.
PLANES = ("controlplane", "dataplane", "agent")

# Per plane, its layers bottom first: a subpackage imports only its own layer and those below.
LAYERS: dict[str, list[set[str]]] = {
    "dataplane": [
        {"metrics", "memory", "tracing", "usage"},  # process helpers: nothing of the plane below them
        {"table"},  # the local fleet view: the table holder, pools and rings, tenants, warming versions
        {"regions", "forward", "guard", "cache"},  # the remote view and spill; the calls out
        {"admission", "failover", "pick"},  # queues and their gates, retries, the decision
        {"intake"},  # a request taken in: API key, validation, idempotency, tokenizers off the loop
        {"record"},  # the traffic recorder: a row per sampled request
        {"config"},  # the [proxy] section: the components' settings composed
        {"routerconfig"},  # the router config versions a table assigns
        {"router", "attempt"},  # the attempt loop and the request path that drives it
        {"api", "epp"},  # the public gRPC and HTTP APIs, the endpoint picker
        {"server", "envoy"},
        {"main", "workers"},
    ],
    "controlplane": [
        {"errors", "store", "tasks", "mailbox"},  # domain errors, the store (keys and bytes), task helpers
        {"config"},  # the [controlplane] section
        {"validate"},  # domain values checked, the field named
        {"allocation", "engines", "fleet", "regions", "rollout", "routerconfig", "tenants", "traffic"},  # records
        {"intent"},  # intent mirrored from the store, each record decoded by its own module; the intent writer
        {"tables"},  # the tables: computation, versions, deltas, watchers, usage
        {"metrics", "scaling", "cluster"},
        {"services"},  # one concern's operations each: <Concern>Service
        {"api"},  # the gRPC edge: handlers per concern, errors to status in one place
        {"controller"},
        {"server"},
        {"main"},
    ],
    "agent": [
        {"config", "scrape", "stepcounters", "states"},
        {"replica", "triton", "batch"},  # what the agent runs or adopts
        {"openai", "inventory"},
        {"agent"},
        {"main"},
    ],
}


@dataclasses.dataclass(frozen=True)
class Import:
    """One import of subpackage ``target`` by subpackage ``source`` (a file and line of ``source``)."""

    source: str
    target: str
    path: str
    line: int
    text: str

    def where(self) -> str:
        return f"{self.path}:{self.line}: {self.text}"


def subpackages(plane: str, root: Path = ROOT) -> set[str]:
    """The direct children of ``plane``: its packages and its modules but ``__init__``."""
    base = root / plane
    out = {p.name for p in base.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    out |= {p.stem for p in base.glob("*.py") if p.stem != "__init__"}
    return out


def _module(path: Path, root: Path) -> list[str]:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return parts[:-1] if parts[-1] == "__init__" else parts


def imports(plane: str, root: Path = ROOT) -> Iterator[Import]:
    """Every import of one subpackage of ``plane`` by another (the whole file's import statements)."""
    for path in sorted((root / plane).rglob("*.py")):
        module = _module(path, root)
        if len(module) < 2:
            continue  # the plane's __init__
        source = module[1]
        package = module if path.name == "__init__.py" else module[:-1]
        lines = path.read_text(encoding="utf-8").splitlines()
        for node in ast.walk(ast.parse("\n".join(lines), filename=str(path))):
            targets: list[list[str]] = []
            if isinstance(node, ast.Import):
                targets = [alias.name.split(".") for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = (package[:len(package) - node.level + 1] if node.level else [])
                named = base + (node.module.split(".") if node.module else [])
                targets = [[*named, alias.name] for alias in node.names] if len(named) == 1 else [named]
            else:
                continue
            for target in targets:
                if len(target) >= 2 and target[0] == plane and target[1] != source:
                    yield Import(source, target[1], str(path.relative_to(root)), node.lineno,
                                 lines[node.lineno - 1].strip())


def _loops(edges: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one node (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on.add(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component: set[str] = set()
            while True:
                top = stack.pop()
                on.discard(top)
                component.add(top)
                if top == node:
                    break
            if len(component) > 1:
                out.append(component)

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return out


def check(plane: str, root: Path = ROOT, layers: list[set[str]] | None = None) -> list[str]:
    """The offences of ``plane`` (empty: its layers hold), each naming the file and line.

    ``layers``: bottom first (default: the plane's row of :data:`LAYERS`).
    """
    found = list(imports(plane, root))
    layers = LAYERS[plane] if layers is None else layers
    level = {name: i for i, layer in enumerate(layers) for name in layer}
    problems = [f"{plane}.{name}: not in tools/layers.py's LAYERS[{plane!r}]"
                for name in sorted(subpackages(plane, root) - set(level))]
    edges: dict[str, set[str]] = defaultdict(set)
    for imp in found:
        edges[imp.source].add(imp.target)
    for loop in _loops(edges):
        names = ", ".join(sorted(loop))
        problems += [f"loop between {names}: {imp.where()}" for imp in found
                     if imp.source in loop and imp.target in loop]
    for imp in found:
        if imp.source in level and imp.target in level and level[imp.source] < level[imp.target]:
            problems.append(f"{plane}.{imp.source} (layer {level[imp.source]}) imports {plane}.{imp.target} "
                            f"(layer {level[imp.target]}), a higher layer: {imp.where()}")
    return problems


def draw(plane: str) -> str:
    """The layers of ``plane`` top first, as docs/design.md shows them."""
    layers = LAYERS[plane]
    width = max(len(", ".join(sorted(layer))) for layer in layers) + 4
    digits = len(str(len(layers) - 1))
    rows = [f"{plane}: each layer imports only its own and those below"]
    for i, layer in reversed(list(enumerate(layers))):
        rows.append(f"  {i:>{digits}} | {', '.join(sorted(layer)):<{width}}|")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="tools.layers", description=__doc__.splitlines()[0] if __doc__ else "")
    p.add_argument("planes", nargs="*", default=list(PLANES), help=f"planes to check (default: {' '.join(PLANES)})")
    p.add_argument("--draw", action="store_true", help="print the layers instead of checking them")
    args = p.parse_args(argv)
    if args.draw:
        print("\n\n".join(draw(plane) for plane in args.planes))
        return 0
    problems = [problem for plane in args.planes for problem in check(plane)]
    for problem in problems:
        print(problem)
    planes = ", ".join(args.planes)
    print(f"{len(problems)} offences in {planes}" if problems else f"layers hold: {planes}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
