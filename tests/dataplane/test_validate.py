"""Validation of every InferRequest field against Limits, tier permission, and model/version resolution."""

from __future__ import annotations

from typing import Any

import pytest

from dataplane.intake.validate import ValidRequest, check_tier, resolve, validate_request
from dataplane.table.local import build_table
from ferry.config import Limits, TenantConfig
from ferry.errors import InvalidArgument, NotFound, PermissionDenied
from ferry.v1 import common_pb2, inference_pb2
from tests.dataplane.fakes import route, snapshot

LIMITS = Limits(max_prompt_bytes=16, max_tokens=100, max_model_bytes=8, max_version_bytes=4,
                max_prefix_key_bytes=6, max_idempotency_key_bytes=5)


def req(**fields: Any) -> inference_pb2.InferRequest:
    base: dict[str, Any] = {"model": "m", "prompt": "hi there", "max_tokens": 10}
    return inference_pb2.InferRequest(**{**base, **fields})


BAD = [
    ("model-missing", {"model": ""}, "model", "required"),
    ("model-over-limit", {"model": "m" * 9}, "model", "longer than 8"),
    ("model-multibyte-over-limit", {"model": "é" * 5}, "model", "longer than 8"),
    ("model-control-char", {"model": "m\n"}, "model", "control"),
    ("model-edge-space", {"model": " m"}, "model", "whitespace"),
    ("version-over-limit", {"version": "v1234"}, "version", "longer than 4"),
    ("version-control-char", {"version": "v\t"}, "version", "control"),
    ("tier-unknown", {"tier": 4}, "tier", "unknown tier value 4"),
    ("tier-negative", {"tier": -1}, "tier", "unknown tier"),
    ("prompt-missing", {"prompt": ""}, "prompt", "required"),
    ("prompt-over-limit", {"prompt": "x" * 17}, "prompt", "longer than 16"),
    ("prompt-multibyte-over-limit", {"prompt": "é" * 9}, "prompt", "longer than 16"),
    ("max-tokens-over-limit", {"max_tokens": 101}, "max_tokens", "over the limit of 100"),
    ("prefix-key-over-limit", {"prefix_key": "p" * 7}, "prefix_key", "longer than 6"),
    ("idempotency-key-over-limit", {"idempotency_key": "k" * 6}, "idempotency_key", "longer than 5"),
]


@pytest.mark.parametrize(("fields", "field", "reason"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_field_is_named(fields: dict[str, Any], field: str, reason: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        validate_request(req(**fields), LIMITS)
    assert info.value.field == field
    assert reason in info.value.reason
    assert str(info.value).startswith(f"{field}: ")


GOOD = [
    ("tier-unspecified-is-standard", {}, {"tier": "standard"}),
    ("tier-interactive", {"tier": common_pb2.TIER_INTERACTIVE}, {"tier": "interactive"}),
    ("tier-batch", {"tier": common_pb2.TIER_BATCH}, {"tier": "batch"}),
    ("limits-inclusive", {"model": "m" * 8, "version": "v123", "prompt": "é" * 8, "max_tokens": 100,
                          "prefix_key": "p" * 6, "idempotency_key": "k" * 5}, {"max_tokens": 100}),
    ("max-tokens-one", {"max_tokens": 1}, {"max_tokens": 1}),
    ("max-tokens-unset", {"max_tokens": 0}, {"max_tokens": 0}),  # filled by Router.begin from the context
    ("prompt-kept-as-bytes", {"prompt": "a b  c"}, {"prompt": b"a b  c", "prompt_tokens": 3}),
]


@pytest.mark.parametrize(("fields", "expect"), [g[1:] for g in GOOD], ids=[g[0] for g in GOOD])
def test_good_request_normalised(fields: dict[str, Any], expect: dict[str, Any]) -> None:
    valid = validate_request(req(**fields), LIMITS)
    assert isinstance(valid, ValidRequest)
    for key, value in expect.items():
        assert getattr(valid, key) == value


PLANS = [
    ("free-interactive-denied", ("standard", "batch"), "interactive", True),
    ("free-standard-allowed", ("standard", "batch"), "standard", False),
    ("paid-interactive-allowed", ("interactive", "standard", "batch"), "interactive", False),
    ("batch-only-standard-denied", ("batch",), "standard", True),
]


@pytest.mark.parametrize(("tiers", "tier", "denied"), [p[1:] for p in PLANS], ids=[p[0] for p in PLANS])
def test_tier_against_plan(tiers: tuple[str, ...], tier: str, denied: bool) -> None:
    tenant = TenantConfig(name="t", api_key_sha256="a" * 64, plan="free", tiers=tiers)
    if denied:
        with pytest.raises(PermissionDenied, match=f"tier '{tier}'"):
            check_tier(tier, tenant)
    else:
        check_tier(tier, tenant)


TABLE = build_table(snapshot(3, [route("r1"), route("r2", version="v2")], extra_models=("empty",)),
                    region="local", applied_at=0.0)

RESOLVE = [
    ("default-version", "m", "", "v1", ["r1"]),
    ("named-version", "m", "v2", "v2", ["r2"]),
    ("model-without-replicas", "empty", "", "v1", []),
]


@pytest.mark.parametrize(("model", "version", "served", "ids"), [r[1:] for r in RESOLVE], ids=[r[0] for r in RESOLVE])
def test_resolve(model: str, version: str, served: str, ids: list[str]) -> None:
    valid = validate_request(req(model=model, version=version), Limits())
    got_version, replicas = resolve(TABLE, valid)
    assert got_version == served and [r.replica_id for r in replicas] == ids


UNKNOWN = [
    ("unknown-model", {"model": "nope"}, "model", "nope"),
    ("unknown-version", {"version": "v9"}, "version", "v9"),
]


@pytest.mark.parametrize(("fields", "kind", "named"), [u[1:] for u in UNKNOWN], ids=[u[0] for u in UNKNOWN])
def test_resolve_unknown(fields: dict[str, Any], kind: str, named: str) -> None:
    with pytest.raises(NotFound) as info:
        resolve(TABLE, validate_request(req(**fields), Limits()))
    assert info.value.kind == kind and named in str(info.value)
