"""The wire contract: fresh stubs, a handler for every RPC, and the planes apart."""

from __future__ import annotations

import ast
import fnmatch
import importlib
import tomllib
from pathlib import Path

import pytest
from tritonclient.grpc import service_pb2

from ferry.v1 import admin_pb2, fleet_pb2, inference_pb2, tables_pb2
from tools import genproto

ROOT = Path(__file__).resolve().parent.parent


def test_generated_stubs_are_fresh():
    assert genproto.stale_files() == []


SERVICERS = [
    (fleet_pb2.DESCRIPTOR.services_by_name["Fleet"], "controlplane.api.servicers", "FleetServicer"),
    (tables_pb2.DESCRIPTOR.services_by_name["Tables"], "controlplane.api.servicers", "TablesServicer"),
    (inference_pb2.DESCRIPTOR.services_by_name["Inference"], "dataplane.api.service", "InferenceServicer"),
    (service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"], "agent.replica.server", "ReplicaServicer"),
]


@pytest.mark.parametrize(("service", "module", "cls"), SERVICERS, ids=[s[2] for s in SERVICERS])
def test_every_rpc_has_a_handler(service, module, cls):
    servicer = getattr(importlib.import_module(module), cls)
    missing = []
    for method in service.methods:
        owner = next((k for k in servicer.__mro__ if method.name in vars(k)), None)
        # A handler defined only by the generated base class answers UNIMPLEMENTED: that is missing.
        if owner is None or owner.__module__.endswith("_pb2_grpc"):
            missing.append(method.name)
    assert missing == [], f"{cls} has no handler for {missing}"


def test_every_admin_rpc_has_exactly_one_handler():
    """``Admin`` is composed from the concerns' handler classes (``controlplane.api.*``, named ``...Rpcs``)."""
    import pkgutil

    import controlplane.api

    owners: dict[str, list[str]] = {}
    for info in pkgutil.iter_modules(controlplane.api.__path__):
        module = importlib.import_module(f"controlplane.api.{info.name}")
        for name, cls in vars(module).items():
            if isinstance(cls, type) and name.endswith("Rpcs") and cls.__module__ == module.__name__:
                for method in admin_pb2.DESCRIPTOR.services_by_name["Admin"].methods:
                    if method.name in vars(cls):
                        owners.setdefault(method.name, []).append(name)
    names = [m.name for m in admin_pb2.DESCRIPTOR.services_by_name["Admin"].methods]
    assert [n for n in names if n not in owners] == [], "Admin RPCs without a handler"
    assert {n: o for n, o in owners.items() if len(o) > 1} == {}, "Admin RPCs with two handlers"


PLANES = ("controlplane", "dataplane", "agent")


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


@pytest.mark.parametrize("plane", PLANES)
def test_planes_meet_only_on_the_wire(plane):
    forbidden = (*(p for p in PLANES if p != plane), "ferry_cli", "harness", "tools", "tests")
    offenders = {}
    for path in sorted((ROOT / plane).rglob("*.py")):
        bad = sorted(n for n in _imports(path) if n.split(".")[0] in forbidden or n.startswith(forbidden))
        if bad:
            offenders[str(path.relative_to(ROOT))] = bad
    assert offenders == {}


def test_shared_helpers_import_no_plane():
    for path in sorted((ROOT / "ferry").glob("*.py")):
        if path.name == "__main__.py":  # the `python -m ferry` entry point sits above the planes
            continue
        bad = [n for n in _imports(path) if n.split(".")[0] in (*PLANES, "tools", "ferry_cli", "harness")]
        assert bad == [], f"{path.name} imports {bad}"


# Who may import whom among the top-level packages, lowest first (docs/design.md, rule 5 and the top level in
# "Where each concern lives"). Nothing but the tests imports ``tests``.
MAY_IMPORT: dict[str, tuple[str, ...]] = {
    "ferry": (),
    **{plane: ("ferry",) for plane in PLANES},
    "harness": ("ferry",),
    "ferry_cli": ("ferry", *PLANES, "harness", "tools"),
    "tools": ("ferry", *PLANES, "harness", "ferry_cli"),
}
ENTRY_POINTS = {"ferry/__main__.py": ("ferry_cli",)}  # ``python -m ferry`` is the ``ferry`` command


def test_every_top_level_package_has_a_rule_and_is_installed():
    found = {path.parent.name for path in ROOT.glob("*/__init__.py")}
    assert found == {*MAY_IMPORT, "tests"}
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert set(project["tool"]["mypy"]["packages"]) == set(MAY_IMPORT)
    include = project["tool"]["setuptools"]["packages"]["find"]["include"]
    assert all(any(fnmatch.fnmatchcase(name, pattern) for pattern in include) for name in MAY_IMPORT)
    assert not any(fnmatch.fnmatchcase("tests", pattern) for pattern in include)


@pytest.mark.parametrize("package", sorted(MAY_IMPORT))
def test_top_level_packages_import_only_the_layers_they_may(package):
    ours = {*MAY_IMPORT, "tests"}
    offenders = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        allowed = {package, *MAY_IMPORT[package], *ENTRY_POINTS.get(rel, ())}
        bad = sorted(n for n in _imports(path) if n.split(".")[0] in ours - allowed)
        if bad:
            offenders[rel] = bad
    assert offenders == {}


def test_no_tool_imports_a_commands_main_module():
    """Helpers the tools share with the commands live in modules named for them, not in a command's ``main``."""
    offenders = {}
    for path in sorted((ROOT / "tools").rglob("*.py")):
        bad = sorted(n for n in _imports(path) if n.startswith("ferry_cli") and n.rsplit(".", 1)[-1] == "main")
        tree = ast.parse(path.read_text())
        bad += sorted(f"{node.module}.{a.name}" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                      and (node.module or "").startswith("ferry_cli") for a in node.names if a.name == "main")
        if bad:
            offenders[str(path.relative_to(ROOT))] = bad
    assert offenders == {}
