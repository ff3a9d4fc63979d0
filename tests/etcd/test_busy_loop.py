"""A control plane whose loop is busy for longer than a lease's TTL, against a real etcd.

The loop is held by pure-Python CPU work (as a large table computation holds it) for 3 s: longer
than the keep-alive timeout (2 s) and the leases' TTL (2 s). The leases survive, the store is not
reported unreachable, and a leader stays leader; an etcd that stops answering while the loop is
busy is still reported unreachable, and a loop stalled past the keeper's bound loses its leases.
"""

from __future__ import annotations

import asyncio
import signal
import time

import pytest

from controlplane.cluster.election import Election
from controlplane.store.etcd import EtcdStore, LoopLate
from ferry.errors import Unavailable
from harness.etcd import LocalEtcd

BLOCK = 3.0  # seconds the loop is held
TTL = 2.0


def hold_the_loop(seconds: float) -> None:
    """CPU work on the loop's thread (holding the GIL but for the interpreter's switches), no await."""
    end = time.monotonic() + seconds
    n = 0
    while time.monotonic() < end:
        n += sum(range(200))


async def test_a_busy_loop_keeps_its_lease_and_the_store_is_not_reported_unreachable(etcd: LocalEtcd) -> None:
    store = EtcdStore(etcd.endpoint, timeout=2.0)
    try:
        lease = await store.grant_lease(TTL)
        await store.put("/ferry/members/n1", b"x", lease=lease)
        await store.refresh_lease(lease)
        in_flight = asyncio.ensure_future(store.get("/ferry/members/n1"))
        refreshing = asyncio.ensure_future(store.refresh_lease(lease))
        await asyncio.sleep(0)  # both sent, then the loop is held
        before = time.monotonic()
        hold_the_loop(BLOCK)

        assert store.health().ok, store.health().error
        assert store.keeper.stood_in >= 1
        assert store.lease_confirmed(lease) > before  # refreshed while the loop was held
        await refreshing  # answered on the keeper's loop, in time
        assert await in_flight is not None  # a read that ran out of time on the held loop is sent once more
        assert store.health().ok
        assert await store.get("/ferry/members/n1") is not None
        await store.refresh_lease(lease)
        assert store.health().ok
    finally:
        await store.close()


async def test_a_leader_whose_loop_is_busy_stays_leader(etcd: LocalEtcd) -> None:
    stores = [EtcdStore(etcd.endpoint, timeout=2.0) for _ in range(2)]
    elections = [Election(s, cp_id=f"cp{i + 1}", address=f"127.0.0.1:{4001 + i}", ttl_seconds=TTL,
                          clock=time.monotonic, wall=time.time) for i, s in enumerate(stores)]
    try:
        await elections[0].step()
        await elections[1].step()
        assert elections[0].is_leader() and not elections[1].is_leader()
        hold_the_loop(BLOCK)
        assert elections[0].is_leader()  # confirmed by the keeper's refreshes, before any step of its own
        await elections[1].step()
        assert elections[1].leader is not None and elections[1].leader.id == "cp1"
        await elections[0].step()
        assert elections[0].is_leader() and elections[0].term == 1
    finally:
        for e in elections:
            await e.resign()
        for s in stores:
            await s.close()


async def test_a_write_that_runs_out_of_time_on_a_busy_loop_says_so_and_leaves_the_verdict(etcd: LocalEtcd) -> None:
    store = EtcdStore(etcd.endpoint, timeout=1.0)
    try:
        await store.put("/ferry/intent/drain/r0", b"{}")
        writing = asyncio.ensure_future(store.put("/ferry/intent/drain/r1", b"{}"))
        await asyncio.sleep(0)
        hold_the_loop(BLOCK)
        try:
            await writing  # it may have been read in time after all
        except LoopLate as exc:  # not sent again (a write): the caller is told, etcd is not blamed
            assert "not counted against etcd" in str(exc) and etcd.endpoint in str(exc)
        assert store.health().ok
    finally:
        await store.close()


async def test_an_etcd_that_stops_while_the_loop_is_busy_is_reported_unreachable(etcd: LocalEtcd) -> None:
    store = EtcdStore(etcd.endpoint, timeout=1.0)
    try:
        lease = await store.grant_lease(TTL)
        await store.refresh_lease(lease)
        etcd.signal(signal.SIGSTOP)
        try:
            hold_the_loop(BLOCK)  # the keeper stands in, etcd does not answer: that is etcd's silence
            health = store.health()
            assert not health.ok and etcd.endpoint in health.error
            with pytest.raises(Unavailable):
                await store.refresh_lease(lease)
        finally:
            etcd.signal(signal.SIGCONT)
    finally:
        await store.close()


async def test_a_loop_stalled_past_the_keepers_bound_loses_its_leases(etcd: LocalEtcd) -> None:
    store = EtcdStore(etcd.endpoint, timeout=1.0, stand_in_seconds=0.5)
    other = EtcdStore(etcd.endpoint, timeout=1.0)
    try:
        lease = await store.grant_lease(1.0)
        await store.put("/ferry/members/n1", b"x", lease=lease)
        await store.refresh_lease(lease)
        hold_the_loop(BLOCK)  # wedged for longer than the keeper stands in: the lease runs out
        for _ in range(40):  # etcd sweeps expired leases every 0.5 s
            if await other.get("/ferry/members/n1") is None:
                break
            await asyncio.sleep(0.1)
        assert await other.get("/ferry/members/n1") is None
    finally:
        await store.close()
        await other.close()
