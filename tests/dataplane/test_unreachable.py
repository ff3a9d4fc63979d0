"""A dead replica costs no tier a request: refusals retried in every tier, the refusing replica out at once."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from dataplane.failover.recover import UNREACHED_EXTRA_ATTEMPTS, retry_reason
from dataplane.forward.clients import ClientPool
from dataplane.forward.failures import unreached, unserved
from dataplane.forward.kserve import ForwardFailed
from dataplane.pick.unreachable import Unreachable, UnreachableParams
from ferry.config import TIERS
from ferry.errors import ConfigError
from ferry.v1 import common_pb2
from tests.dataplane.conftest import PAID, Rig, request
from tests.dataplane.fakes import Behaviour, FakeReplica, route, snapshot

pytestmark = pytest.mark.timeout(20)

REFUSED = ForwardFailed("r1", "unavailable", "UNAVAILABLE: failed to connect to all addresses; last error: "
                        "ipv4:127.0.0.1:1: Connection refused", output_started=False, retryable=True)
LOST = ForwardFailed("r1", "unavailable", "UNAVAILABLE: Socket closed", output_started=False, retryable=True)
ANSWERED = ForwardFailed("r1", "unavailable", "UNAVAILABLE: r1: model loading", output_started=False, retryable=True)
INTERNAL = ForwardFailed("r1", "internal", "INTERNAL: Socket closed", output_started=False, retryable=True)
LOST_LATE = ForwardFailed("r1", "unavailable", "UNAVAILABLE: Socket closed", output_started=True, retryable=False)


@pytest.mark.parametrize(("error", "is_unreached", "is_unserved"), [
    (REFUSED, True, True), (LOST, False, True), (ANSWERED, False, False), (INTERNAL, False, False),
    (LOST_LATE, False, False),
], ids=["refused", "transport-lost", "replica-answered", "not-unavailable", "after-output"])
def test_what_counts_as_never_served(error: ForwardFailed, is_unreached: bool, is_unserved: bool) -> None:
    assert (unreached(error), unserved(error)) == (is_unreached, is_unserved)


@pytest.mark.parametrize("tier", TIERS)
def test_a_request_no_replica_served_is_retried_in_every_tier(tier: str) -> None:
    def reason(error: ForwardFailed, attempts: int) -> str | None:
        return retry_reason(error, tier=tier, attempts=attempts, max_attempts=2, retry_tiers=("interactive",))

    assert reason(REFUSED, 1) == "unreached"
    assert reason(REFUSED, 1 + UNREACHED_EXTRA_ATTEMPTS) == "unreached"  # refusals get extra attempts …
    assert reason(REFUSED, 2 + UNREACHED_EXTRA_ATTEMPTS) is None  # … bounded
    assert reason(LOST, 1) == "transport_lost" and reason(LOST, 2) is None
    assert reason(LOST_LATE, 1) is None  # output reached the client: continuation's business, not a retry
    assert reason(ANSWERED, 1) == ("unavailable" if tier == "interactive" else None)  # retry_tiers still rule


def test_a_refused_replica_is_out_until_newer_telemetry_or_its_probe() -> None:
    u = Unreachable(UnreachableParams(probe_seconds=5.0, max_probe_seconds=12.0))
    assert u.refused("r1", now=100.0) and not u.refused("r1", now=100.5)  # once
    assert u.excluded(101.0) == {"r1"}
    assert u.reported({"r1": 99.0}.get) == [] and u.excluded(101.0) == {"r1"}  # telemetry from before the refusal
    assert u.reported({}.get) == []  # a table without it (it may come back in the next)
    assert u.reported({"r1": 100.2}.get) == ["r1"] and u.excluded(101.0) == frozenset()  # its agent saw it since
    # Probes: 5 s, then doubling per refusal in a row, capped; an answer ends the streak.
    u.refused("r1", now=200.0)
    assert u.excluded(204.9) == {"r1"} and u.excluded(205.0) == frozenset()
    u.refused("r1", now=205.0)
    assert u.excluded(214.9) == {"r1"} and u.excluded(215.0) == frozenset()
    u.refused("r1", now=215.0)
    assert u.excluded(226.9) == {"r1"} and u.excluded(227.0) == frozenset()  # 20 s capped at 12
    u.answered("r1")
    u.refused("r1", now=300.0)
    assert u.excluded(305.0) == frozenset()
    u.refused("r2", now=400.0)
    u.forget({"r1"})
    assert u.excluded(400.0) == frozenset() and len(u) == 0
    with pytest.raises(ConfigError, match="proxy.unreachable_probe_seconds"):
        UnreachableParams(probe_seconds=0)


@pytest.mark.parametrize("tier", [common_pb2.TIER_STANDARD, common_pb2.TIER_BATCH], ids=["standard", "batch"])
@pytest.mark.parametrize("streaming", [False, True], ids=["unary", "stream"])
async def test_a_dead_replica_costs_no_standard_or_batch_request(rig: Any, tier: int, streaming: bool) -> None:
    # r1 looks idle (picked first), on a node of its own; it is gone: its connection is refused.
    r: Rig = await rig({"r1": Behaviour(), "r2": Behaviour(), "r3": Behaviour()},
                       loads={"r1": {"node": "na"}, "r2": {"node": "nb", "queued": 3},
                              "r3": {"node": "nc", "queued": 3}})
    await r.replicas["r1"].stop()
    for i in range(6):
        req = request(tier=tier, prompt=f"hello there world {i}")
        if streaming:
            chunks = [c async for c in r.stub.InferStream(req, metadata=PAID, timeout=5)]
            reply = chunks[-1].summary
        else:
            reply = await r.stub.Infer(req, metadata=PAID, timeout=5)
        assert reply.replica_id in {"r2", "r3"}
        assert reply.attempts == (2 if i == 0 else 1), (i, reply.attempts)  # out of the pick after one refusal
    assert r.proxy is not None
    metrics = r.proxy.metrics
    assert metrics.ejections.labels("m", "unreachable")._value.get() == 1


async def test_a_refused_replica_comes_back_with_telemetry_newer_than_the_refusal(rig: Any) -> None:
    r: Rig = await rig({"r1": Behaviour(), "r2": Behaviour()}, loads={"r1": {"node": "na"},
                                                                      "r2": {"node": "nb", "queued": 3}})
    assert r.proxy is not None
    dead = r.replicas["r1"]
    port = int(dead.address.rpartition(":")[2])
    await dead.stop()
    reply = await r.stub.Infer(request(tier=common_pb2.TIER_BATCH), metadata=PAID, timeout=5)
    assert (reply.replica_id, reply.attempts) == ("r2", 2)
    reply = await r.stub.Infer(request(), metadata=PAID, timeout=5)
    assert (reply.replica_id, reply.attempts) == ("r2", 1)  # out of the pick
    # It restarts on the same port and its agent reports it: a table with telemetry newer than the refusal.
    revived = r.replicas["r1"] = await FakeReplica("r1", Behaviour()).start(port)
    r.cp.push(snapshot(2, [route(revived, node="na"), route(r.replicas["r2"], node="nb", queued=3)]))
    assert (await r.cp.next_ack()).applied
    assert r.proxy is not None and len(r.proxy.router.picker.unreachable) == 0
    replies = [await r.stub.Infer(request(prompt=f"new words {i}"), metadata=PAID, timeout=5) for i in range(8)]
    assert "r1" in {reply.replica_id for reply in replies} and {reply.attempts for reply in replies} == {1}


async def test_a_table_with_only_old_telemetry_keeps_a_refused_replica_out(rig: Any) -> None:
    r: Rig = await rig({"r1": Behaviour(), "r2": Behaviour()}, loads={"r1": {"node": "na"},
                                                                      "r2": {"node": "nb", "queued": 3}})
    await r.replicas["r1"].stop()
    assert (await r.stub.Infer(request(), metadata=PAID, timeout=5)).attempts == 2
    # The node is dead: its agent is silent, the control plane's tables carry its last telemetry, ageing.
    r.cp.push(snapshot(2, [route(r.replicas["r1"], node="na", age=30.0),
                           route(r.replicas["r2"], node="nb", queued=3)]))
    assert (await r.cp.next_ack()).applied
    assert r.proxy is not None and len(r.proxy.router.picker.unreachable) == 1
    replies = [await r.stub.Infer(request(prompt=f"new words {i}"), metadata=PAID, timeout=5) for i in range(8)]
    assert {(reply.replica_id, reply.attempts) for reply in replies} == {("r2", 1)}


async def test_a_discarded_client_closes_when_its_last_call_ends() -> None:
    closed: list[str] = []

    class Client:
        def __init__(self, address: str) -> None:
            self.address = address

        async def close(self) -> None:
            closed.append(self.address)

    pool = ClientPool(Client)
    async with pool.use("a:1") as first:
        pool.discard("a:1")
        assert pool.addresses() == {"a:1"}  # in use: kept until the call ends
    await asyncio.sleep(0)  # the close task runs
    assert closed == ["a:1"] and pool.addresses() == frozenset()
    async with pool.use("a:1") as second:
        assert second is not first  # a fresh client, which connects afresh
    pool.discard("a:1")
    await asyncio.sleep(0)
    assert closed == ["a:1", "a:1"]
