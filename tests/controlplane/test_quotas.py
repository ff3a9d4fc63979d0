"""Tier quotas: lending idle reserve, reclaiming it, and the table field (controlplane.tables.quotas, ferry.quotas)."""

from __future__ import annotations

import pytest

from controlplane.tables.quotas import attach_quotas, region_quotas
from ferry.quotas import allowance, compute_quotas
from ferry.v1 import tables_pb2

I, S, B = "interactive", "standard", "batch"  # noqa: E741
SHARES = {I: 0.5, S: 0.3, B: 0.2}


@pytest.mark.parametrize(("capacity", "demand", "quota", "lent"), [
    (100, {I: 0, S: 0, B: 300}, {I: 0, S: 0, B: 100}, {I: 50, S: 30, B: 0}),      # all idle reserve lent to batch
    (100, {I: 20, S: 0, B: 300}, {I: 20, S: 0, B: 80}, {I: 30, S: 30, B: 0}),     # interactive at 20 %
    (100, {I: 80, S: 0, B: 300}, {I: 80, S: 0, B: 20}, {I: 0, S: 30, B: 0}),      # reclaim: batch to its reserve
    (100, {I: 200, S: 200, B: 200}, {I: 50, S: 30, B: 20}, {I: 0, S: 0, B: 0}),   # everyone busy: the reserves
    (100, {I: 10, S: 10, B: 10}, {I: 10, S: 10, B: 80}, {I: 40, S: 20, B: 0}),    # idle capacity fills batch
    (100, {I: 0, S: 90, B: 0}, {I: 0, S: 90, B: 10}, {I: 50, S: 0, B: 10}),       # standard borrows
    (0, {I: 5}, {I: 0, S: 0, B: 0}, {I: 0, S: 0, B: 0}),                          # no capacity
], ids=["lend-all", "step-20", "step-80", "saturated", "fill-idle", "standard-borrows", "empty"])
def test_quotas_lend_and_reclaim(capacity: int, demand: dict[str, int], quota: dict[str, int],
                                 lent: dict[str, int]) -> None:
    q = compute_quotas(capacity, demand, SHARES)
    assert dict(q.quota) == quota
    assert dict(q.lent) == lent
    assert sum(q.quota.values()) == capacity


def test_a_tier_may_always_use_its_reserve() -> None:
    q = compute_quotas(100, {B: 500}, SHARES)
    assert q.quota[I] == 0 and allowance(q, I) == 50


def test_reclaim_lowers_batch_at_the_next_computation() -> None:
    before = compute_quotas(100, {I: 20, B: 300}, SHARES)
    after = compute_quotas(100, {I: 80, B: 300}, SHARES)
    assert before.quota[B] - after.quota[B] == 60


def _snapshot(slots: list[int]) -> tables_pb2.TableSnapshot:
    route = tables_pb2.ModelRoute(model="chat", replicas=[
        tables_pb2.ReplicaRoute(replica_id=f"r{i}", max_concurrency=n) for i, n in enumerate(slots)])
    return tables_pb2.TableSnapshot(region="local", models=[route])


@pytest.mark.parametrize(("slots", "demand", "batch_quota"), [
    ([60, 60], None, 24),                                # unknown demand: the reserves
    ([60, 60], {I: 10, S: 0, B: 500}, 110),              # idle reserve lent to batch
    ([], None, 0),
], ids=["reserves", "lend", "no-replicas"])
def test_table_carries_quotas(slots: list[int], demand: dict[str, int] | None, batch_quota: int) -> None:
    snapshot = _snapshot(slots)
    attach_quotas({"local": snapshot}, {"local": demand} if demand else None, SHARES)
    by_tier = {q.tier: q for q in snapshot.tier_quotas}
    assert [q.tier for q in snapshot.tier_quotas] == [I, S, B]
    assert by_tier[B].quota_slots == batch_quota
    assert sum(q.quota_slots for q in snapshot.tier_quotas) == sum(slots)
    assert by_tier[I].reserved_share == pytest.approx(0.5)
    assert region_quotas(snapshot, demand, SHARES).quota[B] == batch_quota
