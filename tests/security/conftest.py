"""Fixtures of the security tests: one throw-away CA for the module, certificates per role."""

from __future__ import annotations

import pytest

from ferry import tls
from harness import tlsgen

ROLES = ("controlplane", "proxy", "agent", "admin", "node")


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, tls.TLSConfig]]:
    """The directory of a throw-away CA and each role's TLS config (``node``: a signed peer that is no agent)."""
    directory = tmp_path_factory.mktemp("pki")
    return str(directory), tlsgen.generate(directory, ROLES)
