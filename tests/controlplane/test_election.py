"""Leader election on a shared store, driven pass by pass on a fake clock: win, follow, fence, fail over."""

from __future__ import annotations

from typing import Any

from controlplane.cluster.election import Election, PlaneInfo
from controlplane.store.base import ELECTION_KEY, controlplane_key
from controlplane.store.memory import MemoryStore
from tests.controlplane.fakes import FakeClock, FlakyStore

TTL = 3.0


def pair(clock: FakeClock) -> tuple[MemoryStore, list[FlakyStore], list[Election], list[int]]:
    store = MemoryStore(clock=clock)
    links = [FlakyStore(store), FlakyStore(store)]
    changes = [0, 0]

    def changed(i: int) -> Any:
        return lambda: changes.__setitem__(i, changes[i] + 1)

    elections = [Election(link, cp_id=f"cp{i + 1}", address=f"127.0.0.1:{4001 + i}", ttl_seconds=TTL,  # type: ignore[arg-type]
                          clock=clock, wall=lambda: 1.0e9, on_change=changed(i)) for i, link in enumerate(links)]
    return store, links, elections, changes


async def test_the_first_to_campaign_leads_and_the_other_follows() -> None:
    clock = FakeClock()
    store, _, (a, b), changes = pair(clock)
    await a.step()
    await b.step()
    assert (a.role(), b.role()) == ("leader", "follower") and (a.term, b.term) == (1, 0)
    assert a.leader == b.leader and b.leader is not None
    assert (b.leader.id, b.leader.address) == ("cp1", "127.0.0.1:4001")
    stored = await store.get(ELECTION_KEY)
    assert stored is not None and stored.lease == a.lease and PlaneInfo.decode(stored.value) == a.leader
    assert await store.get(controlplane_key("cp2")) is not None
    assert changes == [1, 1]
    await b.step()  # nothing new: no change reported
    assert changes == [1, 1]


async def test_a_leader_cut_off_from_the_store_stops_leading_in_time_and_resumes_on_the_same_lease() -> None:
    clock = FakeClock()
    _, (link_a, _), (a, b), _ = pair(clock)
    await a.step()
    await b.step()
    link_a.down = True
    clock.advance(TTL / 3)
    await a.step()  # the refresh fails: still leading until its last confirmed refresh + 5/6 TTL
    assert a.is_leader()
    clock.advance(TTL / 2 + 0.01)
    assert not a.is_leader() and a.role() == "leader-unconfirmed"
    link_a.down = False
    await a.step()  # the lease is still alive in the store: the key is still ours
    assert a.is_leader() and a.term == 1


async def test_when_the_leader_dies_its_lease_runs_out_and_the_follower_takes_over() -> None:
    clock = FakeClock()
    _, _, (a, b), _ = pair(clock)
    await a.step()
    await b.step()
    for _ in range(4):  # b keeps its lease; a (dead) does not refresh
        clock.advance(TTL / 3)
        await b.step()
    assert b.is_leader() and b.term == 1 and b.leader is not None and b.leader.id == "cp2"
    await a.step()  # a comes back: its lease is gone, it takes a new one and follows
    assert a.role() == "follower" and a.lease and not a.is_leader()


async def test_a_leader_that_resigns_hands_over_at_once() -> None:
    clock = FakeClock()
    store, _, (a, b), _ = pair(clock)
    await a.step()
    await b.step()
    await a.resign()
    assert await store.get(ELECTION_KEY) is None and await store.get(controlplane_key("cp1")) is None
    await b.step()
    assert b.is_leader() and [p.id for p in b.members()] == []  # members come from the mirror (not running here)


async def test_a_control_plane_restarted_on_its_address_takes_its_key_back_at_once() -> None:
    clock = FakeClock()
    store, _, (a, b), _ = pair(clock)
    await a.step()
    await b.step()
    again = Election(store, cp_id="cp1", address="127.0.0.1:4001", ttl_seconds=TTL, clock=clock, wall=lambda: 2.0e9)
    await again.step()  # cp1's earlier run (same address: it is dead, we hold its port) leads on a live lease
    assert again.is_leader() and again.term == 1
    await b.step()
    assert b.leader is not None and b.leader.lease == again.lease
    elsewhere = Election(store, cp_id="cp1", address="127.0.0.1:5001", ttl_seconds=TTL, clock=clock, wall=lambda: 3.0)
    await elsewhere.step()  # same id, another address: it cannot know the holder is dead, so it waits
    assert elsewhere.role() == "follower" and again.is_leader()
