"""API key from metadata to tenant."""

from __future__ import annotations

import pytest

from dataplane.intake.auth import ANONYMOUS, Authenticator, api_key_from
from ferry.config import TenantConfig, hash_api_key
from ferry.errors import ConfigError, Unauthenticated

ACME = TenantConfig(name="acme", api_key_sha256=hash_api_key("k-acme"), plan="paid")
HOBBY = TenantConfig(name="hobby", api_key_sha256=hash_api_key("k-hobby"), plan="free", tiers=("batch",))
AUTH = Authenticator([ACME, HOBBY])

CASES = [
    ("x-api-key", [("x-api-key", "k-acme")], "acme"),
    ("x-api-key-bytes", [("x-api-key", b"k-hobby")], "hobby"),
    ("bearer", [("authorization", "Bearer k-hobby")], "hobby"),
    ("bearer-lowercase-scheme", [("authorization", "bearer k-acme")], "acme"),
    ("x-api-key-wins-over-bearer", [("authorization", "Bearer k-hobby"), ("x-api-key", "k-acme")], "acme"),
    ("other-metadata-ignored", [("user-agent", "grpc"), ("x-api-key", " k-acme ")], "acme"),
]


@pytest.mark.parametrize(("metadata", "tenant"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_tenant_found(metadata, tenant: str) -> None:
    assert AUTH.authenticate(metadata).name == tenant


REFUSED = [
    ("none", [], "missing"),
    ("empty-key", [("x-api-key", "")], "missing"),
    ("basic-scheme", [("authorization", "Basic abc")], "missing"),
    ("bearer-without-key", [("authorization", "Bearer ")], "missing"),
    ("unknown-key", [("x-api-key", "k-wrong")], "unknown"),
    ("unknown-bearer", [("authorization", "Bearer k-wrong")], "unknown"),
    ("huge-key", [("x-api-key", "k" * 10_000)], "x-api-key: the API key is longer"),
]


@pytest.mark.parametrize(("metadata", "word"), [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED])
def test_refused_with_how_to_pass_the_key(metadata, word: str) -> None:
    with pytest.raises(Unauthenticated) as info:
        AUTH.authenticate(metadata)
    message = str(info.value)
    assert word in message and "x-api-key" in message and "Bearer" in message
    for _, value in metadata:  # the key itself never appears in the message
        text = value.decode() if isinstance(value, bytes) else value
        if text.strip() and text.strip() not in ("Bearer", "Basic abc"):
            assert text.strip().split()[-1] not in message


def test_anonymous_only_without_a_key() -> None:
    auth = Authenticator([ACME], allow_anonymous=True)
    assert auth.authenticate([]) is ANONYMOUS
    with pytest.raises(Unauthenticated):
        auth.authenticate([("x-api-key", "k-wrong")])


def test_duplicate_key_hash_is_a_config_error() -> None:
    twin = TenantConfig(name="twin", api_key_sha256=ACME.api_key_sha256)
    with pytest.raises(ConfigError, match="twin"):
        Authenticator([ACME, twin])


def test_key_extraction_prefers_x_api_key() -> None:
    assert api_key_from([("authorization", "Bearer a"), ("x-api-key", "b")]) == "b"
    assert api_key_from([]) is None
