"""The house rules a reader relies on, checked over the source tree (with ``ast``, nothing imported).

- every package and module says what it is for in a docstring, and so does every class;
- no class is assembled from mixins: at most one of its bases is a class of this project;
- the repository stands alone: no tracked file points to a directory beside it.
"""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("ferry", "ferry_cli", "harness", "controlplane", "dataplane", "agent", "tools")


def _sources() -> list[Path]:
    out: list[Path] = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel.startswith("ferry/v1/") or "__pycache__" in rel:
                continue
            out.append(path)
    return out


SOURCES = _sources()
TREES = {path: ast.parse(path.read_text(), filename=str(path)) for path in SOURCES}


def test_every_package_and_module_has_a_docstring() -> None:
    missing = [
        str(path.relative_to(ROOT)) for path, tree in TREES.items()
        if not ast.get_docstring(tree)
    ]
    assert missing == [], f"modules without a docstring: {missing}"


def test_every_class_has_a_docstring() -> None:
    missing = [
        f"{path.relative_to(ROOT)}:{node.lineno} {node.name}"
        for path, tree in TREES.items()
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef) and not ast.get_docstring(node)
    ]
    assert missing == [], f"classes without a docstring: {missing}"


def _base_name(base: ast.expr) -> str | None:
    if isinstance(base, ast.Subscript):
        base = base.value
    if isinstance(base, ast.Name):
        return base.id
    if isinstance(base, ast.Attribute):
        return base.attr
    return None


def test_no_class_is_assembled_from_mixins() -> None:
    ours = {node.name for tree in TREES.values() for node in ast.walk(tree) if isinstance(node, ast.ClassDef)}
    mixed = []
    for path, tree in TREES.items():
        for node in ast.walk(tree):
            if not isinstance(node, ast.ClassDef):
                continue
            bases = [name for name in map(_base_name, node.bases) if name in ours]
            if len(bases) > 1:
                mixed.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}({', '.join(bases)})")
    assert mixed == [], f"classes assembled from several of this project's classes: {mixed}"


def test_no_tracked_file_points_outside_the_repository() -> None:
    listed = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=False)
    if listed.returncode != 0:  # not a git checkout (an sdist): nothing to check
        return
    needle = "../" + "shared"
    hits = []
    for rel in listed.stdout.splitlines():
        path = ROOT / rel
        if rel.endswith(".lock") or not path.is_file():
            continue
        try:
            text = path.read_text()
        except (UnicodeDecodeError, OSError):
            continue
        hits += [f"{rel}:{n}" for n, line in enumerate(text.splitlines(), 1) if needle in line]
    assert hits == [], f"references outside the repository: {hits}"
