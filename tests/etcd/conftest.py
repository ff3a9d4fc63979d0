"""Fixtures that start a real etcd on loopback; every test here is marked ``etcd`` (``pytest -m etcd``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.etcd import LocalEtcd, etcd_binary
from tests.etcd.harness import EtcdFleet


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "/etcd/" in str(item.fspath):
            item.add_marker(pytest.mark.etcd)


@pytest.fixture
def etcd() -> Iterator[LocalEtcd]:
    """A fresh etcd on 127.0.0.1 in a temporary data dir, deleted afterwards (readiness: GET /health)."""
    if etcd_binary() is None:
        pytest.fail("no etcd binary on PATH: run tools/ensure_etcd.sh (make test does), or deselect with -m 'not etcd'")
    server = LocalEtcd().start()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def make_fleet(tmp_path: Path, etcd: LocalEtcd) -> Iterator[Callable[..., EtcdFleet]]:
    fleets: list[EtcdFleet] = []

    def make(nodes: dict[str, list[str]], **kwargs: Any) -> EtcdFleet:
        fleet = EtcdFleet(tmp_path, etcd, nodes, **kwargs)
        fleets.append(fleet)
        return fleet.start()

    yield make
    for fleet in fleets:
        fleet.stop()
