"""Fixtures that run real Triton Inference Servers (``tools/triton``) for the ``triton`` tests.

The servers need ``.venv-triton`` (``tools/triton/setup_env.sh``). Without it the
tests are skipped with that instruction, unless ``CI`` or ``FERRY_REQUIRE_TRITON``
is set, where they fail: CI must install the environment, not skip it quietly.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

from tools.triton.launch import TritonEnvironmentMissing, TritonProcess, start_triton


def _missing(exc: TritonEnvironmentMissing) -> None:
    if os.environ.get("CI") or os.environ.get("FERRY_REQUIRE_TRITON"):
        pytest.fail(str(exc), pytrace=False)
    pytest.skip(str(exc))


@pytest.fixture(scope="session")
def triton_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonProcess]:
    """One real Triton server shared by the session; stopped at the end by SIGTERM, which must exit 0."""
    try:
        server = start_triton(tmp_path_factory.mktemp("triton"))
    except TritonEnvironmentMissing as exc:
        _missing(exc)
        raise
    try:
        yield server
    finally:
        code = server.stop()
    assert code == 0, f"serve.py did not stop cleanly on SIGTERM (exit {code}); log {server.log_path}"


@pytest.fixture
def triton_factory(tmp_path: Path) -> Iterator[Callable[[], TritonProcess]]:
    """Start more servers inside one test; every one is stopped when the test ends."""
    started: list[TritonProcess] = []

    def start() -> TritonProcess:
        try:
            server = start_triton(tmp_path)
        except TritonEnvironmentMissing as exc:
            _missing(exc)
            raise
        started.append(server)
        return server

    try:
        yield start
    finally:
        for server in started:
            server.stop()
