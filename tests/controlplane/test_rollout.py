"""Version rollout: the pure record and weights (table by table), the intent mirror, the tables and the Admin RPCs."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
from typing import Any

import grpc
import pytest

from controlplane.intent.cache import IntentCache
from controlplane.rollout.plan import (
    CANARY,
    PROMOTED,
    ROLLED_BACK,
    Action,
    Rollout,
    canary_share,
    check_percent,
    route_weights,
    transition,
)
from controlplane.store.base import rollout_key
from controlplane.store.memory import MemoryStore
from controlplane.tables.compute import compute_tables
from ferry.config import ModelConfig
from ferry.errors import InvalidArgument, NotFound
from ferry.v1 import admin_pb2, common_pb2
from ferry_cli.ctl.main import main
from tests.controlplane.fakes import TOKEN, WAIT, FakeClock, FlakyStore, Harness, fleet_with, register, replica, routed

A = admin_pb2.RolloutRequest
R1 = Rollout("chat", "v1", "v2", 0.05, CANARY, 10.0)

# -- the transition


TRANSITIONS: list[tuple[str, Rollout | None, Action, str, float, tuple[str, str, float, str] | None, str]] = [
    # id, current, action, version, percent, expected (stable, canary, weight, state), or the error's field
    ("first-canary-from-the-catalog-default", None, Action.CANARY, "v2", 5.0, ("v1", "v2", 0.05, CANARY), ""),
    ("canary-share-changes", R1, Action.CANARY, "v2", 50.0, ("v1", "v2", 0.5, CANARY), ""),
    ("new-canary-keeps-the-stable", R1, Action.CANARY, "v3", 1.0, ("v1", "v3", 0.01, CANARY), ""),
    ("after-promote-the-canary-is-stable", Rollout("chat", "v1", "v2", 0.05, PROMOTED, 1.0), Action.CANARY, "v3",
     5.0, ("v2", "v3", 0.05, CANARY), ""),
    ("after-rollback-the-stable-stays", Rollout("chat", "v1", "v2", 0.05, ROLLED_BACK, 1.0), Action.CANARY, "v3",
     5.0, ("v1", "v3", 0.05, CANARY), ""),
    ("zero-percent", None, Action.CANARY, "v2", 0.0, ("v1", "v2", 0.0, CANARY), ""),
    ("hundred-percent", None, Action.CANARY, "v2", 100.0, ("v1", "v2", 1.0, CANARY), ""),
    ("promote", R1, Action.PROMOTE, "", 0.0, ("v1", "v2", 0.05, PROMOTED), ""),
    ("promote-naming-its-version", R1, Action.PROMOTE, "v2", 0.0, ("v1", "v2", 0.05, PROMOTED), ""),
    ("rollback", R1, Action.ROLLBACK, "", 0.0, ("v1", "v2", 0.05, ROLLED_BACK), ""),
    ("rollback-after-promote", Rollout("chat", "v1", "v2", 0.05, PROMOTED, 1.0), Action.ROLLBACK, "", 0.0,
     ("v1", "v2", 0.05, ROLLED_BACK), ""),
    ("canary-of-the-stable-version", R1, Action.CANARY, "v1", 5.0, None, "version"),
    ("canary-without-version", None, Action.CANARY, "", 5.0, None, "version"),
    ("canary-version-with-space", None, Action.CANARY, "v 2", 5.0, None, "version"),
    ("percent-over-100", None, Action.CANARY, "v2", 100.5, None, "canary_percent"),
    ("percent-negative", None, Action.CANARY, "v2", -1.0, None, "canary_percent"),
    ("percent-nan", None, Action.CANARY, "v2", math.nan, None, "canary_percent"),
    ("promote-another-version", R1, Action.PROMOTE, "v3", 0.0, None, "version"),
    ("promote-without-rollout", None, Action.PROMOTE, "", 0.0, None, "rollout"),
    ("rollback-without-rollout", None, Action.ROLLBACK, "", 0.0, None, "rollout"),
]


@pytest.mark.parametrize(("current", "action", "version", "percent", "expected", "field"),
                         [c[1:] for c in TRANSITIONS], ids=[c[0] for c in TRANSITIONS])
def test_transition(current: Rollout | None, action: Action, version: str, percent: float,
                    expected: tuple[str, str, float, str] | None, field: str) -> None:
    def step() -> Rollout:
        return transition(current, model="chat", action=action, version=version, percent=percent,
                          catalog_default="v1", now=20.0)
    if expected is None:
        with pytest.raises((InvalidArgument, NotFound)) as err:
            step()
        assert (err.value.field if isinstance(err.value, InvalidArgument) else err.value.kind) == field
        return
    got = step()
    assert (got.stable, got.canary, got.weight, got.state) == expected
    assert got.model == "chat"


def test_the_model_is_named_and_repeats_change_nothing() -> None:
    with pytest.raises(InvalidArgument, match="model"):
        transition(None, model="", action=Action.CANARY, version="v2", percent=5, catalog_default="v1", now=0)
    promoted = transition(R1, model="chat", action=Action.PROMOTE, version="", percent=0, catalog_default="v1",
                          now=30.0)
    again = transition(promoted, model="chat", action=Action.PROMOTE, version="", percent=0, catalog_default="v1",
                       now=40.0)
    assert again is promoted and again.updated_at == 30.0


@pytest.mark.parametrize(("percent", "share"), [(0, 0.0), (5, 0.05), (100, 1.0)])
def test_check_percent(percent: float, share: float) -> None:
    assert check_percent(percent) == pytest.approx(share)


# -- the weights

WEIGHTS: list[tuple[str, Rollout, set[str], str, list[tuple[str, float]]]] = [
    # id, record, versions routable in the region, default version, weights
    ("canary-ready", R1, {"v1", "v2"}, "v1", [("v1", 0.95), ("v2", 0.05)]),
    ("canary-not-ready-costs-nothing", R1, {"v1"}, "v1", [("v1", 1.0)]),
    ("canary-zero", Rollout("chat", "v1", "v2", 0.0, CANARY, 0), {"v1", "v2"}, "v1", [("v1", 1.0)]),
    ("canary-all", Rollout("chat", "v1", "v2", 1.0, CANARY, 0), {"v1", "v2"}, "v1", [("v2", 1.0)]),
    ("canary-only-canary-ready", R1, {"v2"}, "v1", [("v1", 0.95), ("v2", 0.05)]),
    ("promoted", Rollout("chat", "v1", "v2", 0.05, PROMOTED, 0), {"v1", "v2"}, "v2", [("v2", 1.0)]),
    ("promoted-canary-not-ready-here", Rollout("chat", "v1", "v2", 0.05, PROMOTED, 0), {"v1"}, "v2",
     [("v1", 1.0)]),
    ("promoted-nothing-ready", Rollout("chat", "v1", "v2", 0.05, PROMOTED, 0), set(), "v2", [("v2", 1.0)]),
    ("rolled-back", Rollout("chat", "v1", "v2", 0.05, ROLLED_BACK, 0), {"v1", "v2"}, "v1", [("v1", 1.0)]),
    ("rolled-back-never-the-canary", Rollout("chat", "v1", "v2", 0.05, ROLLED_BACK, 0), {"v2"}, "v1",
     [("v1", 1.0)]),
]


@pytest.mark.parametrize(("record", "routable", "default", "weights"), [c[1:] for c in WEIGHTS],
                         ids=[c[0] for c in WEIGHTS])
def test_route_weights(record: Rollout, routable: set[str], default: str, weights: list[tuple[str, float]]) -> None:
    got_default, got = route_weights(record, routable)
    assert got_default == default
    assert [(v, pytest.approx(w)) for v, w in got] == weights


SHARES: list[tuple[str, list[tuple[str, float]], str, set[str], float]] = [
    ("split", [("v1", 0.95), ("v2", 0.05)], "v1", {"v1", "v2"}, 0.05),
    ("canary-gone", [("v1", 0.95), ("v2", 0.05)], "v1", {"v1"}, 0.0),
    ("stable-gone", [("v1", 0.95), ("v2", 0.05)], "v1", {"v2"}, 1.0),
    ("no-weights-default-canary", [], "v2", {"v2"}, 1.0),
    ("no-weights-default-stable", [], "v1", {"v1", "v2"}, 0.0),
]


@pytest.mark.parametrize(("weights", "default", "routable", "share"), [c[1:] for c in SHARES],
                         ids=[c[0] for c in SHARES])
def test_canary_share(weights: list[tuple[str, float]], default: str, routable: set[str], share: float) -> None:
    assert canary_share(weights, default, routable, "v2") == pytest.approx(share)


# -- the record in the store

def test_the_record_round_trips() -> None:
    assert Rollout.decode("chat", R1.encode()) == R1


BAD_RECORDS = [
    ("not-json", b"{", "not JSON"),
    ("not-an-object", b"[]", "object"),
    ("no-canary", b'{"model": "chat", "stable": "v1", "state": "canary", "weight": 0.1}', "canary"),
    ("other-model", b'{"model": "x", "stable": "v1", "canary": "v2", "state": "canary", "weight": 0.1}', "model"),
    ("bad-state", b'{"model": "chat", "stable": "v1", "canary": "v2", "state": "half", "weight": 0.1}', "state"),
    ("weight-over-1", b'{"model": "chat", "stable": "v1", "canary": "v2", "state": "canary", "weight": 2}', "weight"),
]


@pytest.mark.parametrize(("data", "named"), [c[1:] for c in BAD_RECORDS], ids=[c[0] for c in BAD_RECORDS])
def test_a_bad_record_is_refused_naming_the_field(data: bytes, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        Rollout.decode("chat", data)


async def test_the_intent_cache_mirrors_rollouts() -> None:
    store = MemoryStore()
    changes: list[int] = []
    cache = IntentCache(store, on_change=lambda: changes.append(1), retry_seconds=0.01)
    await store.put(rollout_key("chat"), R1.encode())
    await store.put(rollout_key("bad"), b"{")
    task = asyncio.create_task(cache.run())
    try:
        async with asyncio.timeout(WAIT):
            await cache.synced.wait()
        assert cache.rollouts == {"chat": R1}
        promoted = Rollout("chat", "v1", "v2", 0.05, PROMOTED, 11.0)
        await cache.wait(await store.put(rollout_key("chat"), promoted.encode()), WAIT)
        assert cache.rollouts["chat"] == promoted
        await cache.wait(await store.delete(rollout_key("chat")), WAIT)
        assert cache.rollouts == {} and len(changes) == 3
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


# -- the tables

WARMING = common_pb2.REPLICA_STATE_WARMING


def _tables(rollouts: dict[str, Rollout], *replicas: Any) -> Any:
    clock = FakeClock()
    _, members = fleet_with(clock, register("n1", *replicas))
    catalog = [ModelConfig(name="chat", default_version="v1")]
    return compute_tables(members, catalog, set(), now=clock(), grace_seconds=3.0, rollouts=rollouts)["local"]


def test_tables_carry_the_rollout_weights_and_warming_versions() -> None:
    table = _tables({"chat": R1}, replica("a", version="v1"), replica("b", version="v2"),
                    replica("c", version="v3", state=WARMING), replica("d", version="v3", state=WARMING))
    route = table.models[0]
    assert routed(table) == ["a", "b"]  # warming replicas are never routed to
    assert route.default_version == "v1"
    assert [(w.version, pytest.approx(w.weight)) for w in route.version_weights] == [("v1", 0.95), ("v2", 0.05)]
    assert [(w.version, w.replicas) for w in route.warming] == [("v3", 2)]


def test_a_canary_that_only_warms_gets_no_weight() -> None:
    table = _tables({"chat": R1}, replica("a", version="v1"), replica("b", version="v2", state=WARMING))
    route = table.models[0]
    assert [(w.version, w.weight) for w in route.version_weights] == [("v1", 1.0)]
    assert [(w.version, w.replicas) for w in route.warming] == [("v2", 1)]


def test_without_a_rollout_the_route_is_unchanged() -> None:
    route = _tables({}, replica("a", version="v1"), replica("b", version="v2")).models[0]
    assert route.default_version == "v1" and not route.version_weights and not route.warming


# -- the Admin RPCs


async def test_rollout_rpcs_move_the_weights_in_the_pushed_table(harness: Harness) -> None:
    proxy = harness.proxy()
    await proxy.subscribe()
    agent = harness.agent()
    await agent.register(register("n1", replica("n1/r0", version="v1"), replica("n1/r1", version="v2")))
    await proxy.until(lambda t: len(routed(t, "chat")) == 2)

    def weights(t: Any) -> list[tuple[str, float]]:
        return [(w.version, round(w.weight, 6)) for w in t.models[0].version_weights]

    reply = await harness.admin.Rollout(A(model="chat", version="v2", canary_percent=5, action=A.ACTION_CANARY),
                                        timeout=WAIT)
    view = reply.rollout
    assert (view.stable_version, view.canary_version, view.state, view.default_version) == ("v1", "v2", CANARY, "v1")
    assert [(r.region, r.stable_ready, r.canary_ready, round(r.canary_share, 6)) for r in view.regions] == [
        ("local", 1, 1, 0.05)]
    await proxy.until(lambda t: weights(t) == [("v1", 0.95), ("v2", 0.05)])

    reply = await harness.admin.Rollout(A(model="chat", action=A.ACTION_PROMOTE), timeout=WAIT)
    assert (reply.rollout.state, reply.rollout.default_version, reply.rollout.regions[0].canary_share) == (
        PROMOTED, "v2", 1.0)
    table = await proxy.until(lambda t: weights(t) == [("v2", 1.0)])
    assert table.models[0].default_version == "v2" and len(routed(table, "chat")) == 2  # v1 stays routable
    models = await harness.admin.ListModels(admin_pb2.ListModelsRequest(), timeout=WAIT)
    assert {m.model: m.default_version for m in models.models}["chat"] == "v2"

    reply = await harness.admin.Rollout(A(model="chat", action=A.ACTION_ROLLBACK), timeout=WAIT)
    assert (reply.rollout.state, reply.rollout.default_version) == (ROLLED_BACK, "v1")
    await proxy.until(lambda t: weights(t) == [("v1", 1.0)] and t.models[0].default_version == "v1")

    listed = await harness.admin.ListRollouts(admin_pb2.ListRolloutsRequest(), timeout=WAIT)
    assert [(r.model, r.state) for r in listed.rollouts] == [("chat", ROLLED_BACK)]
    none = await harness.admin.ListRollouts(admin_pb2.ListRolloutsRequest(model="empty-model"), timeout=WAIT)
    assert list(none.rollouts) == []
    stored = await harness.cp.store.get(rollout_key("chat"))
    assert stored is not None and Rollout.decode("chat", stored.value).state == ROLLED_BACK


ERRORS = [
    ("no-action", A(model="chat", version="v2"), grpc.StatusCode.INVALID_ARGUMENT, "action"),
    ("no-model", A(version="v2", action=A.ACTION_CANARY), grpc.StatusCode.INVALID_ARGUMENT, "model"),
    ("no-version", A(model="chat", canary_percent=5, action=A.ACTION_CANARY), grpc.StatusCode.INVALID_ARGUMENT,
     "version"),
    ("percent", A(model="chat", version="v2", canary_percent=101, action=A.ACTION_CANARY),
     grpc.StatusCode.INVALID_ARGUMENT, "canary_percent"),
    ("stable-version", A(model="chat", version="v1", canary_percent=5, action=A.ACTION_CANARY),
     grpc.StatusCode.INVALID_ARGUMENT, "version"),
    ("unknown-model", A(model="nope", version="v2", canary_percent=5, action=A.ACTION_CANARY),
     grpc.StatusCode.NOT_FOUND, "model"),
    ("promote-nothing", A(model="chat", action=A.ACTION_PROMOTE), grpc.StatusCode.NOT_FOUND, "rollout"),
]


@pytest.mark.parametrize(("request_", "code", "named"), [c[1:] for c in ERRORS], ids=[c[0] for c in ERRORS])
async def test_rollout_errors_name_the_field(harness: Harness, request_: Any, code: grpc.StatusCode,
                                             named: str) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await harness.admin.Rollout(request_, timeout=WAIT)
    assert err.value.code() == code and named in (err.value.details() or "")


async def test_rollout_is_refused_while_the_store_is_away(harness: Harness) -> None:
    controller = harness.cp.controller
    flaky = FlakyStore(harness.cp.store)  # type: ignore[arg-type]
    controller.writer.store = flaky  # type: ignore[assignment]
    flaky.down = True
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await harness.admin.Rollout(A(model="chat", version="v2", canary_percent=5, action=A.ACTION_CANARY),
                                    timeout=WAIT)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE and "rollout of chat refused" in (err.value.details() or "")
    assert await harness.cp.store.get(rollout_key("chat")) is None


# -- ferryctl rollout

USAGE = [
    ("canary-without-model", ["rollout", "--version", "v2", "--canary", "5"], "name the MODEL"),
    ("canary-without-version", ["rollout", "chat", "--canary", "5"], "--canary needs --version"),
    ("canary-and-promote", ["rollout", "chat", "--version", "v2", "--canary", "5", "--promote"], "does not go"),
    ("version-alone", ["rollout", "chat", "--version", "v2"], "--version goes with --canary"),
]


@pytest.mark.parametrize(("argv", "message"), [c[1:] for c in USAGE], ids=[c[0] for c in USAGE])
def test_ferryctl_rollout_usage_errors(capsys: pytest.CaptureFixture[str], argv: list[str], message: str) -> None:
    assert main(["--control-plane", "127.0.0.1:1", *argv]) == 2
    assert message in capsys.readouterr().err


async def test_ferryctl_rollout_prints_tables_and_json(harness: Harness, capsys: pytest.CaptureFixture[str]) -> None:
    agent = harness.agent()
    await agent.register(register("n1", replica("n1/r0", version="v1"), replica("n1/r1", version="v2")))
    base = ["--control-plane", f"127.0.0.1:{harness.cp.port}", "--admin-token", TOKEN]

    async def ctl(*argv: str) -> tuple[int, str, str]:
        code = await asyncio.to_thread(main, [*base, *argv])
        out = capsys.readouterr()
        return code, out.out, out.err

    code, out, _ = await ctl("rollout")
    assert code == 0 and "no rollout" in out
    code, out, _ = await ctl("rollout", "chat", "--version", "v2", "--canary", "5")
    assert code == 0 and "rollout: 5 % of chat to v2, the rest to v1" in out and "local=5.0%" in out
    code, out, _ = await ctl("rollout", "chat", "--promote")
    assert code == 0 and "promoted v2, now the default (was v1)" in out
    code, out, _ = await ctl("--json", "rollout")
    rows = json.loads(out)
    assert [(r["model"], r["state"], r["default"], r["regions"][0]["canary_share"]) for r in rows] == [
        ("chat", "promoted", "v2", 1.0)]
    code, out, _ = await ctl("rollout", "chat")
    assert code == 0 and out.splitlines()[0].split()[:4] == ["MODEL", "STATE", "STABLE", "CANARY"]
    code, _, err = await ctl("rollout", "nope", "--rollback")
    assert code == 1 and "NOT_FOUND" in err
