"""Fixtures that start real fleets of processes; every test here is marked ``e2e``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tools.process_fleet import Fleet


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "/e2e/" in str(item.fspath):
            item.add_marker(pytest.mark.e2e)


@pytest.fixture
def make_fleet(tmp_path: Path) -> Iterator[object]:
    fleets: list[Fleet] = []

    def make(nodes: dict[str, list[str]], **kwargs: object) -> Fleet:
        fleet = Fleet(tmp_path, nodes, **kwargs)  # type: ignore[arg-type]
        fleets.append(fleet)
        return fleet.start()

    yield make
    for fleet in fleets:
        fleet.stop()
