"""Claims at scale: a burst of registrations is bounded and completes; a member written again takes its claims
in one transaction and names the one held elsewhere."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import pytest

from controlplane.fleet.claims import REPLICA, Holder, claim_key, host_of, register_claims
from controlplane.fleet.members import MemberLeases
from controlplane.fleet.view import FleetView
from controlplane.store.memory import MemoryStore
from tests.controlplane.fakes import FakeClock, register, replica


class SlowStore:
    """The embedded store with every conditional write taking a turn of the loop, and their overlap counted."""

    def __init__(self) -> None:
        self.inner = MemoryStore()
        self.in_flight = 0
        self.most = 0

    async def put_all_if(self, *args: Any, **kwargs: Any) -> int:
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        try:
            await asyncio.sleep(0.001)
            return await self.inner.put_all_if(*args, **kwargs)
        finally:
            self.in_flight -= 1

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def claims_of(node: str) -> tuple[Any, frozenset[str]]:
    reg = register(node, *(replica(f"{node}/r{i}") for i in range(4)))
    return register_claims(reg), frozenset(host_of(info.address) for info in reg.replicas)


async def test_a_burst_of_claims_is_bounded_and_every_one_completes() -> None:
    store = SlowStore()
    leases = MemberLeases(store, clock=FakeClock(), ttl_seconds=3.0, claim_concurrency=4)  # type: ignore[arg-type]
    nodes = [f"n{i}" for i in range(40)]

    await asyncio.gather(*(leases.claim(node, *claims_of(node)) for node in nodes))

    assert 1 < store.most <= 4
    for node in nodes:
        for claim in claims_of(node)[0]:
            assert await store.inner.get(claim.key) is not None, claim.key


async def test_a_claim_that_waits_past_its_callers_timeout_writes_nothing() -> None:
    store = SlowStore()
    leases = MemberLeases(store, clock=FakeClock(), ttl_seconds=3.0, claim_concurrency=1)  # type: ignore[arg-type]
    first = asyncio.ensure_future(leases.claim("n0", *claims_of("n0")))
    await asyncio.sleep(0)
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0):
            await leases.claim("n1", *claims_of("n1"))
    await first
    for claim in claims_of("n1")[0]:
        assert await store.inner.get(claim.key) is None


def test_the_bound_is_checked() -> None:
    with pytest.raises(ValueError, match="claim_concurrency"):
        MemberLeases(MemoryStore(), clock=FakeClock(), ttl_seconds=3.0, claim_concurrency=0)


async def test_a_member_written_again_takes_its_claims_and_names_the_one_held_elsewhere(
        caplog: pytest.LogCaptureFixture) -> None:
    store = MemoryStore()
    clock = FakeClock()
    leases = MemberLeases(store, clock=clock, ttl_seconds=3.0, control_plane="cp1")
    reg = register("n1", *(replica(f"n1/r{i}") for i in range(3)))
    member = FleetView(clock=clock).register(reg)
    claims, hosts = claims_of_reg(reg)
    await leases.claim("n1", claims, hosts)
    await leases.sync([member])
    first = (await store.get(claim_key(REPLICA, "n1/r0")))
    assert first is not None
    await store.revoke_lease(first.lease)  # the lease is lost: every claim goes with it
    other = await store.grant_lease(30.0)
    await store.put(claim_key(REPLICA, "n1/r0"), Holder("n2", "cp2").encode(), lease=other)  # taken meanwhile
    clock.advance(1.5)  # the member's refresh is due

    await leases.sync([member])

    held = await store.get(claim_key(REPLICA, "n1/r0"))
    assert held is not None and Holder.decode(held.value).node == "n2"
    for claim in claims:
        if claim.key != claim_key(REPLICA, "n1/r0"):
            kv = await store.get(claim.key)
            assert kv is not None and kv.lease not in (0, first.lease, other), claim.key
    assert await store.get("/ferry/members/n1") is not None
    assert [r for r in caplog.records if "claim_lost" in r.getMessage() or getattr(r, "event", "") == "claim_lost"]


def claims_of_reg(reg: Any) -> tuple[Any, frozenset[str]]:
    return register_claims(reg), frozenset(host_of(info.address) for info in reg.replicas)


class CountingStore:
    """The embedded store, counting lease refresh calls: one call for many leases, or one per lease."""

    def __init__(self, clock: FakeClock) -> None:
        self.inner = MemoryStore(clock=clock)
        self.batch_calls: list[int] = []
        self.single_calls = 0

    async def refresh_leases(self, leases: Any) -> Any:
        self.batch_calls.append(len(leases))
        return await self.inner.refresh_leases(leases)

    async def refresh_lease(self, lease: int) -> None:
        self.single_calls += 1
        await self.inner.refresh_lease(lease)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


HOSTS = itertools.count(1)  # one host per registered node


async def registered(leases: MemberLeases, fleet: FleetView, node: str, replicas: int = 4) -> Any:
    """``node`` claimed and in the view, with ``replicas`` replicas on addresses of its own."""
    n = next(HOSTS)
    reg = register(node, *(replica(f"{node}/r{i}", address=f"10.{n // 250 % 250}.{n % 250}.1:{9000 + i}")
                           for i in range(replicas)))
    await leases.claim(node, register_claims(reg), frozenset(host_of(info.address) for info in reg.replicas))
    return fleet.register(reg)


async def test_a_lease_is_due_from_its_grant_not_from_the_members_write() -> None:
    """Registrations that waited: the member written 2.5 s after its claim took the lease (TTL 3 s). A put
    does not extend a lease, so the write refreshes it too (before, the next refresh was due a third of a
    TTL after the write, and the lease ran out first, then the member was written again, and again)."""
    clock = FakeClock()
    store = CountingStore(clock)
    leases = MemberLeases(store, clock=clock, ttl_seconds=3.0)  # type: ignore[arg-type]
    fleet = FleetView(clock=clock)
    member = await registered(leases, fleet, "n1")
    clock.advance(2.5)
    await leases.sync([member])  # the member's first write; its lease, due, refreshed with it
    assert store.batch_calls == [1]
    clock.advance(0.6)  # 3.1 s after the grant
    assert await store.inner.get("/ferry/members/n1") is not None
    await leases.sync([member])  # due a third of a TTL after that refresh: not yet
    assert store.batch_calls == [1]
    clock.advance(0.5)
    await leases.sync([member])
    assert store.batch_calls == [1, 1]


class SlowWrites(CountingStore):
    """Member writes that take time (a burst of registrations): each put advances the clock."""

    def __init__(self, clock: FakeClock, seconds: float) -> None:
        super().__init__(clock)
        self.clock = clock
        self.seconds = seconds

    async def put(self, *args: Any, **kwargs: Any) -> int:
        self.clock.advance(self.seconds)
        return await self.inner.put(*args, **kwargs)


async def test_leases_are_refreshed_between_batches_of_a_long_pass_of_writes() -> None:
    """200 members to write at 0.03 s each (6 s, twice the TTL) while 64 others only need refreshing: the
    others' leases are refreshed between the batches, not after the whole pass (they ran out before)."""
    clock = FakeClock()
    store = SlowWrites(clock, 0.0)
    leases = MemberLeases(store, clock=clock, ttl_seconds=3.0, batch=64)  # type: ignore[arg-type]
    fleet = FleetView(clock=clock)
    steady = [await registered(leases, fleet, f"s{i}", 1) for i in range(64)]
    await leases.sync(steady)
    clock.advance(1.0)
    burst = [await registered(leases, fleet, f"b{i}", 1) for i in range(200)]
    store.seconds = 0.03
    await leases.sync([*steady, *burst])
    store.seconds = 0.0
    stored = [await store.inner.get(f"/ferry/members/{m.node}") for m in [*steady, *burst]]
    assert all(kv is not None for kv in stored)
    assert len(store.batch_calls) >= 3  # refreshed again between the batches


async def test_due_refreshes_go_to_the_store_in_one_call() -> None:
    clock = FakeClock()
    store = CountingStore(clock)
    leases = MemberLeases(store, clock=clock, ttl_seconds=3.0)  # type: ignore[arg-type]
    fleet = FleetView(clock=clock)
    members = [await registered(leases, fleet, f"n{i}") for i in range(30)]
    await leases.sync(members)  # written
    clock.advance(1.0)
    await leases.sync(members)
    assert store.batch_calls == [30] and store.single_calls == 0
    await store.inner.revoke_lease(leases._records["n3"].lease)  # lost: written again under a new lease
    clock.advance(1.0)
    await leases.sync(members)
    assert store.batch_calls == [30, 30]
    assert await store.inner.get("/ferry/members/n3") is not None
    assert all(leases._records[m.node].lease for m in members)
