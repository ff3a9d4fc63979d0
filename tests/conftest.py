"""Settings for the whole suite: quiet gRPC core logs, a fresh event-log rate limit per test, repeatable properties.

Property tests draw their examples from a fixed seed (the ``repeatable``
profile), so a run of the suite cannot fail on an example the last one did
not try; ``HYPOTHESIS_PROFILE=explore`` draws fresh ones, to look for new
failures on purpose (a failure found that way becomes an explicit test).
"""

import os
from collections.abc import Iterator

import pytest
from hypothesis import settings

from ferry import logs

os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

settings.register_profile("repeatable", derandomize=True, print_blob=True)
settings.register_profile("explore", derandomize=False, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "repeatable"))


@pytest.fixture(autouse=True)
def _fresh_event_limiter(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test starts with a full event-log bucket, whatever the tests before it logged."""
    monkeypatch.setattr(logs, "LIMITER", logs.EventLimiter())
    yield
