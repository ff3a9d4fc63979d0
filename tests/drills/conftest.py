"""Every test here is a drill: marked ``drills`` and ``slow`` (out of the default suite; ``pytest -m drills``)."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "/drills/" in str(item.fspath):
            item.add_marker(pytest.mark.drills)
            item.add_marker(pytest.mark.slow)
