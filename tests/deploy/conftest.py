"""Fixtures of the deploy tests; every test here is marked ``deploy`` (``pytest -m deploy``).

The manifests are rendered from a copy of ``deploy/kubernetes/`` with a
``base/tokens.env`` of fresh random tokens, as an operator makes it before
``kubectl apply -k`` (docs/deploy.md); the repository holds no tokens.
"""

from __future__ import annotations

import re
import secrets
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.kube import render

ROOT = Path(__file__).resolve().parents[2]
KUBE = ROOT / "deploy/kubernetes"
OVERLAYS = ("base", "overlays/single-region", "overlays/three-regions")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).resolve().parent
    for item in items:
        if here in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.deploy)


@pytest.fixture(scope="session")
def kube_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of deploy/kubernetes with base/tokens.env written, as docs/deploy.md makes it."""
    directory = tmp_path_factory.mktemp("kube") / "kubernetes"
    shutil.copytree(KUBE, directory, ignore=shutil.ignore_patterns("tokens.env"))
    (directory / "base/tokens.env").write_text(
        f"admin-token=fat_{secrets.token_hex(16)}\njoin-token=fjt_{secrets.token_hex(16)}\n")
    return directory


@pytest.fixture(scope="session")
def rendered(kube_dir: Path) -> dict[str, list[dict[str, Any]]]:
    """Each overlay (and the base) rendered by ``kubectl kustomize`` (:mod:`tests.deploy.kube`)."""
    return {name: render(kube_dir / name) for name in OVERLAYS}


def find(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    """The one object of ``kind`` named ``name`` (a generated name may carry its hash suffix)."""
    hashed = re.compile(rf"{re.escape(name)}(-[a-z0-9]{{10}})?")
    found = [o for o in objects if o["kind"] == kind and hashed.fullmatch(o["metadata"]["name"])]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} objects"
    return found[0]
