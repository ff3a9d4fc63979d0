"""Tenants managed with ``ferryctl tenants`` reach the proxy through the table push (``ferry up``).

``ferry up`` hands its control plane the config file with the made-up
tenants, which seed the empty store; a tenant added, changed or removed with
ferryctl then takes effect at the proxy within a table push, and the seeded
tenants keep working throughout.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from ferry.config import hash_api_key
from ferry.procs import Child
from ferry.v1 import common_pb2, inference_pb2, inference_pb2_grpc
from tests.e2e.harness import wait_for

ENV = {k: v for k, v in os.environ.items() if k not in ("FERRY_ADMIN_TOKEN", "FERRY_CONTROL_PLANE")}
PUSH = 2.0  # a change must reach the proxy within this


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    work = tmp_path_factory.mktemp("tenants")
    child = Child("up", ["up", "--replicas", "2", "--models", "chat-small", "--workdir", str(work / "fleet")],
                  work).start()
    try:
        ready = child.wait_ready(90)
        yield {**ready, "ready_file": str(child.ready_path)}
    finally:
        child.stop()


def ctl(up: dict[str, Any], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ferry_cli.ctl.main", "--ready-file", up["ready_file"], *args],
                          capture_output=True, text=True, timeout=60, env=ENV)


def ok(up: dict[str, Any], *args: str) -> str:
    result = ctl(up, *args)
    assert result.returncode == 0, result.stderr
    return result.stdout


def infer(up: dict[str, Any], key: str, tier: int = common_pb2.TIER_INTERACTIVE) -> grpc.StatusCode:
    request = inference_pb2.InferRequest(model="chat-small", prompt="a b c", max_tokens=2, tier=tier)
    with grpc.insecure_channel(up["data_plane"]) as channel:
        try:
            inference_pb2_grpc.InferenceStub(channel).Infer(request, metadata=(("x-api-key", key),), timeout=10)
        except grpc.RpcError as exc:
            return exc.code()  # type: ignore[no-any-return]
    return grpc.StatusCode.OK


def becomes(up: dict[str, Any], key: str, code: grpc.StatusCode, tier: int = common_pb2.TIER_INTERACTIVE) -> None:
    wait_for(lambda: infer(up, key, tier) == code, PUSH, f"{code.name} for the key", interval=0.05)


def test_the_config_file_seeds_the_store_and_both_outputs_list_it(up: dict[str, Any]) -> None:
    listing = json.loads(ok(up, "tenants", "--json"))
    assert listing["managed"] is True
    names = {t["name"]: t for t in listing["tenants"]}
    assert set(names) == set(up["api_keys"])
    for name, key in up["api_keys"].items():
        assert names[name]["api_key_sha256"] == hash_api_key(key)
    human = ok(up, "tenants")
    assert human.splitlines()[0].split()[:3] == ["NAME", "PLAN", "TIERS"]
    assert all(name in human for name in up["api_keys"])
    assert not any(key in human for key in up["api_keys"].values())  # never a key, only a hash prefix


def test_add_change_remove_reach_the_proxy_within_a_push(up: dict[str, Any]) -> None:
    paid = up["api_keys"]["paid-1"]
    assert infer(up, paid) == grpc.StatusCode.OK

    added = json.loads(ok(up, "tenants", "add", "newco", "--plan", "paid", "--tiers", "interactive,standard",
                          "--rps", "100", "--generate-key", "--json"))
    key = added["api_key"]
    assert added["created"] and added["tenant"]["api_key_sha256"] == hash_api_key(key)
    becomes(up, key, grpc.StatusCode.OK)
    assert key not in ok(up, "tenants", "--json")  # shown once, never again

    changed = ok(up, "tenants", "set", "newco", "--tiers", "batch", "--plan", "free")
    assert "newco updated: plan free, tiers batch" in changed
    becomes(up, key, grpc.StatusCode.PERMISSION_DENIED)  # interactive is no longer its tier
    assert infer(up, paid) == grpc.StatusCode.OK  # the others are untouched

    removed = ok(up, "tenants", "remove", "newco")
    assert "newco removed" in removed
    becomes(up, key, grpc.StatusCode.UNAUTHENTICATED)
    assert infer(up, paid) == grpc.StatusCode.OK
    assert "newco" not in ok(up, "tenants")


def test_refusals_name_the_field_and_usage_errors_exit_2(up: dict[str, Any]) -> None:
    bad = ctl(up, "tenants", "add", "odd", "--plan", "gold", "--generate-key")
    assert bad.returncode == 1 and "INVALID_ARGUMENT" in bad.stderr and "tenant.plan" in bad.stderr
    again = ctl(up, "tenants", "add", "paid-1", "--api-key", "another-key-0123456789")
    assert again.returncode == 1 and "ALREADY_EXISTS" in again.stderr
    taken = ctl(up, "tenants", "add", "copycat", "--api-key", up["api_keys"]["paid-1"])
    assert taken.returncode == 1 and "ALREADY_EXISTS" in taken.stderr and up["api_keys"]["paid-1"] not in taken.stderr
    missing = ctl(up, "tenants", "set", "ghost", "--plan", "free")
    assert missing.returncode == 1 and "NOT_FOUND" in missing.stderr
    for args in (("tenants", "add", "nokey"), ("tenants", "set", "paid-1"), ("tenants", "remove")):
        usage = ctl(up, *args)
        assert usage.returncode == 2 and usage.stderr.startswith("ferryctl: tenants"), usage.stderr


def test_completion_knows_the_tenants_actions() -> None:
    script = subprocess.run([sys.executable, "-m", "ferry_cli.ctl.main", "completion", "bash"], capture_output=True,
                            text=True, timeout=60, env=ENV)
    line = next(w for w in script.stdout.splitlines() if w.strip().startswith("tenants)"))
    words = set(line.replace("'", " ").split())
    assert {"list", "add", "set", "remove", "--generate-key", "--api-key-sha256"} <= words
