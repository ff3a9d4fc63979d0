"""Settings for the whole suite: quiet gRPC core logs, a fresh event-log rate limit per test."""

import os
from collections.abc import Iterator

import pytest

from ferry import logs

os.environ.setdefault("GRPC_VERBOSITY", "ERROR")


@pytest.fixture(autouse=True)
def _fresh_event_limiter(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test starts with a full event-log bucket, whatever the tests before it logged."""
    monkeypatch.setattr(logs, "LIMITER", logs.EventLimiter())
    yield
