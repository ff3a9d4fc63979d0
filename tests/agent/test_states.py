"""The pure pieces of the agent: replica state machine, interval clamp, inventory messages."""

from __future__ import annotations

import dataclasses

import pytest

from agent.config import AgentSettings, clamp_interval
from agent.inventory import Inventory, ReplicaSpec, discovered_id, merge_discovered
from agent.states import Command, Observed, ReplicaStatus, State, command, observe
from agent.triton import ModelEntry, ModelLoad
from ferry.config import parse
from ferry.errors import ConfigError
from ferry.v1 import common_pb2

W, R, DG, DD, X = State.WARMING, State.READY, State.DRAINING, State.DRAINED, State.DEAD
UP_IDLE = Observed(reachable=True, ready=True)
UP_BUSY = Observed(reachable=True, ready=True, queued=1, running=2)
UP_LOADING = Observed(reachable=True, ready=False)
DOWN = Observed(reachable=False)


@pytest.mark.parametrize(
    ("status", "seen", "expected"),
    [
        (ReplicaStatus(W), UP_LOADING, ReplicaStatus(W)),
        (ReplicaStatus(W), UP_IDLE, ReplicaStatus(R)),
        (ReplicaStatus(R), UP_BUSY, ReplicaStatus(R)),
        (ReplicaStatus(DG, drain=True), UP_BUSY, ReplicaStatus(DG, drain=True)),
        (ReplicaStatus(DG, drain=True), UP_IDLE, ReplicaStatus(DD, drain=True)),
        (ReplicaStatus(DD, drain=True), UP_BUSY, ReplicaStatus(DG, drain=True)),
        (ReplicaStatus(R), DOWN, ReplicaStatus(X)),
        (ReplicaStatus(DG, drain=True), DOWN, ReplicaStatus(X, drain=True)),
        (ReplicaStatus(X), UP_IDLE, ReplicaStatus(R)),
        (ReplicaStatus(X, drain=True), UP_IDLE, ReplicaStatus(DD, drain=True)),
        (ReplicaStatus(X), UP_LOADING, ReplicaStatus(W)),
        (ReplicaStatus(W, drain=True), UP_BUSY, ReplicaStatus(DG, drain=True)),
    ],
    ids=["warming-stays", "warming-ready", "ready-busy", "draining-busy", "draining-idle-drained",
         "drained-busy-again", "ready-dies", "draining-dies-keeps-intent", "dead-back-ready",
         "dead-back-drained", "dead-back-loading", "drained-before-ready"],
)
def test_observe(status, seen, expected):
    assert observe(status, seen) == expected


@pytest.mark.parametrize(
    ("status", "cmd", "expected"),
    [
        (ReplicaStatus(R), Command.DRAIN, ReplicaStatus(DG, drain=True)),
        (ReplicaStatus(W), Command.DRAIN, ReplicaStatus(W, drain=True)),
        (ReplicaStatus(X), Command.DRAIN, ReplicaStatus(X, drain=True)),
        (ReplicaStatus(DD, drain=True), Command.DRAIN, ReplicaStatus(DD, drain=True)),
        (ReplicaStatus(DG, drain=True), Command.UNDRAIN, ReplicaStatus(R)),
        (ReplicaStatus(DD, drain=True), Command.UNDRAIN, ReplicaStatus(R)),
        (ReplicaStatus(X, drain=True), Command.UNDRAIN, ReplicaStatus(X)),
        (ReplicaStatus(R), Command.UNDRAIN, ReplicaStatus(R)),
    ],
    ids=["ready-drain", "warming-drain", "dead-drain", "drained-drain", "draining-undrain", "drained-undrain",
         "dead-undrain", "ready-undrain"],
)
def test_command(status, cmd, expected):
    assert command(status, cmd) == expected


@pytest.mark.parametrize(("given", "used"), [(0.1, 0.25), (0.5, 0.5), (5.0, 1.0)], ids=["low", "inside", "high"])
def test_telemetry_interval_is_clamped(given, used):
    assert clamp_interval(given) == used


def test_agent_settings_from_the_agent_section():
    assert parse({"agent": {"telemetry_interval_seconds": 0.3}}).section(AgentSettings, "agent").max_replicas == 256
    with pytest.raises(ConfigError, match="agent.backoff_max_seconds"):
        parse({"agent": {"backoff_max_seconds": 0.01}}).section(AgentSettings, "agent")


def spec(rid: str, **kw) -> ReplicaSpec:
    return ReplicaSpec(replica_id=rid, model="m", version="v1", address="127.0.0.1:1", **kw)


def test_inventory_reports_changes_once_and_is_bounded():
    inv = Inventory(max_replicas=2)
    assert inv.upsert(spec("a")) and inv.upsert(spec("b")) and not inv.upsert(spec("c"))
    register = inv.register(node="n", region="r", gpus=8, agent_version="x").register
    assert [r.replica_id for r in register.replicas] == ["a", "b"]
    assert not inv.telemetry().telemetry.changed
    inv.upsert(spec("a", max_concurrency=9))
    inv.remove("b")
    inv.replicas["a"].load = ModelLoad(ready=True, queued=3, running=4, kv_blocks_free=5, kv_blocks_total=6)
    t = inv.telemetry().telemetry
    assert [c.max_concurrency for c in t.changed] == [9] and list(t.removed) == ["b"] and t.seq == 2
    assert (t.replicas[0].queued, t.replicas[0].running, t.replicas[0].kv_blocks_free) == (3, 4, 5)
    t = inv.telemetry().telemetry
    assert not t.changed and not t.removed and t.seq == 3
    inv.replicas["a"].status = ReplicaStatus(X)
    assert inv.telemetry().telemetry.replicas[0] == common_pb2.ReplicaLoad(
        replica_id="a", state=common_pb2.REPLICA_STATE_DEAD)


def test_merge_discovered_adds_updates_and_removes():
    inv = Inventory(max_replicas=8)
    inv.upsert(spec("fixed"))
    entries = [ModelEntry(name="llm", version="1", ready=True, max_batch_size=64),
               ModelEntry(name="other/x", version="2", ready=True)]
    assert merge_discovered(inv, node="n", endpoint=1, address="h:1", gpus=8, entries=entries) == []
    assert set(inv.replicas) == {"fixed", "n-llm-1", "n-other_x-2"}
    assert inv.replicas["n-llm-1"].spec.max_concurrency == 64 and discovered_id("n", "a b", "1") == "n-a_b-1"
    assert inv.replicas["n-other_x-2"].spec.max_concurrency == 16, "no batch size stated: the default target"
    assert inv.replicas["n-llm-1"].spec.gpus == 8, "no GPU pinned: the endpoint's"
    inv.telemetry()
    merge_discovered(inv, node="n", endpoint=1, address="h:1", gpus=8, entries=entries[:1])
    t = inv.telemetry().telemetry
    assert list(t.removed) == ["n-other_x-2"] and not t.changed and "fixed" in inv.replicas
    pinned = [dataclasses.replace(entries[0], gpus=1)]  # its instance groups now pin one GPU: the spec changes
    merge_discovered(inv, node="n", endpoint=1, address="h:1", gpus=8, entries=pinned)
    assert inv.replicas["n-llm-1"].spec.gpus == 1 and [c.gpus for c in inv.telemetry().telemetry.changed] == [1]
