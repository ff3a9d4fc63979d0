"""Fleets of real processes for the fuzz tests; every test here is marked ``fuzz``."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from tools.process_fleet import Fleet

ROOT = Path(__file__).resolve().parents[2]
STATUSES: dict[str, Counter[str]] = {}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "/fuzz/" in str(item.fspath):
            item.add_marker(pytest.mark.fuzz)


@pytest.fixture(scope="session")
def fuzz_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    fleet = Fleet(tmp_path_factory.mktemp("fuzz"), {"node-a": ["chat:v1"], "node-b": ["chat:v1"]},
                  config={"limits": {"max_tokens": 16, "max_prompt_bytes": 4096}})
    try:
        yield fleet.start()
    finally:
        fleet.stop()


@pytest.fixture(scope="session")
def statuses() -> Iterator[dict[str, Counter[str]]]:
    """Status counts per target; written to bench-results/fuzz.json at the end of the session."""
    yield STATUSES
    out = ROOT / "bench-results" / "fuzz.json"
    out.parent.mkdir(exist_ok=True)
    summary = {target: {"cases": sum(c.values()), "statuses": dict(c)} for target, c in STATUSES.items()}
    summary["total_cases"] = sum(v["cases"] for v in summary.values() if isinstance(v, dict))  # type: ignore[index]
    out.write_text(json.dumps(summary, indent=2) + "\n")
