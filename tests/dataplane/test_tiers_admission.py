"""Admission edge and idempotency: waiting, timeouts, preemption and requeue, join/replay/mismatch."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from prometheus_client import CollectorRegistry

from dataplane.admission.gate import Admission, Preempted
from dataplane.admission.queues import QueueParams, Shed, Ticket, TierQueues
from dataplane.intake.idempotency import Idempotency, body_digest
from dataplane.table.local import TableRejected, build_table
from ferry.errors import InvalidArgument
from ferry.metrics import BoundedLabel
from ferry.v1 import inference_pb2, tables_pb2


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _admission(capacity: int, clock: Clock, **kw: object) -> Admission:
    adm = Admission(QueueParams(**kw), clock=clock, registry=CollectorRegistry())  # type: ignore[arg-type]
    adm.models["chat"] = TierQueues(adm.params, capacity)
    return adm


def _t(tier: str, deadline: float = 1e9, tenant: str = "a") -> Ticket:
    return Ticket(tenant=tenant, plan="paid", tier=tier, cost=10, deadline=deadline)


async def test_waits_for_headroom_then_runs() -> None:
    clock = Clock()
    adm = _admission(1, clock)
    first, second = _t("standard"), _t("standard")
    await adm.acquire("chat", first)
    waiting = asyncio.ensure_future(adm.acquire("chat", second))
    await asyncio.sleep(0)
    assert not waiting.done() and adm.models["chat"].depth("standard") == 1
    adm.release("chat", first)
    await asyncio.wait_for(waiting, 1)
    assert second.state == "running"


@pytest.mark.parametrize(("deadline", "reason"), [(0.05, "timeout"), (1e9, "timeout")], ids=["deadline", "tier"])
async def test_no_wait_past_deadline_or_timeout(deadline: float, reason: str) -> None:
    clock = Clock()
    adm = _admission(1, clock, timeouts={"interactive": 0.05, "standard": 0.05, "batch": 0.05})
    await adm.acquire("chat", _t("interactive"))
    with pytest.raises(Shed) as info:
        await asyncio.wait_for(adm.acquire("chat", _t("interactive", deadline=deadline)), 2)
    assert info.value.reason == reason and info.value.retry_after > 0
    assert adm.models["chat"].depth("interactive") == 0


async def test_batch_preempted_requeued_at_head_and_answered_once() -> None:
    clock = Clock()
    adm = _admission(2, clock, reserved={"interactive": 0.5, "standard": 0.0, "batch": 0.5})
    calls: list[str] = []
    gate = asyncio.Event()

    async def forward(name: str) -> str:
        calls.append(name)
        await gate.wait()
        return name

    async def run(ticket: Ticket, name: str) -> str:
        while True:
            await adm.acquire("chat", ticket)
            try:
                return await adm.preemptible("chat", ticket, lambda: forward(name))
            except Preempted:
                continue

    b1, b2, i1 = _t("batch"), _t("batch"), _t("interactive")
    t1 = asyncio.ensure_future(run(b1, "b1"))
    t2 = asyncio.ensure_future(run(b2, "b2"))
    await asyncio.sleep(0.01)
    assert calls == ["b1", "b2"]  # batch fills idle capacity
    ti = asyncio.ensure_future(run(i1, "i1"))
    await asyncio.sleep(0.01)
    assert calls == ["b1", "b2", "i1"]  # the newest batch was preempted for interactive
    assert b2.preempted == 1 and adm.models["chat"].depth("batch") == 1
    gate.set()
    assert await ti == "i1"
    adm.release("chat", i1)
    assert await t1 == "b1"
    adm.release("chat", b1)
    assert await asyncio.wait_for(t2, 1) == "b2"
    assert calls.count("b2") == 2 and adm.metrics.preempted.labels("chat", "reclaim")._value.get() == 1


def _req(prompt: str, key: str = "k1") -> inference_pb2.InferRequest:
    return inference_pb2.InferRequest(model="chat", prompt=prompt, max_tokens=4, idempotency_key=key)


async def test_idempotency_join_replay_mismatch_and_tenants() -> None:
    clock = Clock()
    idem: Idempotency[str] = Idempotency(clock=clock, max_entries=2, ttl=10.0)
    runs: list[str] = []
    gate = asyncio.Event()

    async def call() -> str:
        runs.append("x")
        await gate.wait()
        return f"answer{len(runs)}"

    digest = body_digest(_req("hi"))
    assert digest == body_digest(_req("hi", key="other"))  # the key is not part of the body
    first = asyncio.ensure_future(idem.run("t1", "k1", digest, call))
    joined = asyncio.ensure_future(idem.run("t1", "k1", digest, call))
    await asyncio.sleep(0)
    gate.set()
    assert await first == await joined == "answer1" and len(runs) == 1 and idem.joined == 1
    assert await idem.run("t1", "k1", digest, call) == "answer1" and idem.replayed == 1
    with pytest.raises(InvalidArgument) as info:
        await idem.run("t1", "k1", body_digest(_req("other body")), call)
    assert info.value.field == "idempotency_key"
    assert await idem.run("t2", "k1", digest, call) == "answer2"  # another tenant: its own entry
    clock.now = 11.0
    assert await idem.run("t1", "k1", digest, call) == "answer3"  # expired: runs again
    assert len(idem) <= 2


async def test_idempotency_error_not_kept() -> None:
    idem: Idempotency[str] = Idempotency(clock=Clock())

    async def fail() -> str:
        raise InvalidArgument("prompt", "bad")

    async def ok() -> str:
        return "fine"

    with pytest.raises(InvalidArgument):
        await idem.run("t", "k", b"d", fail)
    assert await idem.run("t", "k", b"d", ok) == "fine"


def _snapshot(quotas: list[tuple[str, float]]) -> tables_pb2.TableSnapshot:
    replicas = [tables_pb2.ReplicaRoute(replica_id=f"r{i}", node="n", region="local", version="v1",
                                        address=f"127.0.0.1:{9000 + i}", max_concurrency=10) for i in range(2)]
    return tables_pb2.TableSnapshot(version=1, region="local", models=[
        tables_pb2.ModelRoute(model="chat", default_version="v1", replicas=replicas)],
        tier_quotas=[tables_pb2.TierQuota(tier=t, reserved_share=s) for t, s in quotas])


@pytest.mark.parametrize(("quotas", "error"), [
    ([("interactive", 0.6), ("standard", 0.3), ("batch", 0.1)], None),
    ([], None),
    ([("gold", 0.5)], "unknown or repeated tier"),
    ([("batch", 0.1), ("batch", 0.2)], "unknown or repeated tier"),
    ([("batch", 1.5)], "reserved_share"),
    ([("batch", float("nan"))], "reserved_share"),
], ids=["valid", "absent", "unknown-tier", "repeated", "over-one", "nan"])
def test_table_tier_quotas_are_validated_and_applied(quotas: list[tuple[str, float]], error: str | None) -> None:
    if error is not None:
        with pytest.raises(TableRejected, match=error):
            build_table(_snapshot(quotas), region="local", applied_at=0.0)
        return
    table = build_table(_snapshot(quotas), region="local", applied_at=0.0)
    adm = Admission(QueueParams(), clock=Clock(), registry=CollectorRegistry())
    adm.apply(table)
    assert adm.models["chat"].capacity == 20
    expect = dict(quotas) if quotas else dict(QueueParams().reserved)
    assert adm.models["chat"].reserved == expect


def _sized(concurrency: int) -> tables_pb2.TableSnapshot:
    snapshot = _snapshot([])
    for replica in snapshot.models[0].replicas:
        replica.max_concurrency = concurrency
    return snapshot


def test_the_admit_step_without_a_loop_offer_release_a_grown_table_and_expiry() -> None:
    """The gate driven as the fleet simulator drives it, no asyncio: what starts is returned by offer, release
    and apply (a capacity that grew), a wait's limit is the tier's timeout or the deadline less the margin, and an
    expired wait is refused once, counted shed with reason timeout."""
    clock, registry = Clock(), CollectorRegistry()
    adm = Admission(QueueParams(timeouts={"interactive": 2.0, "standard": 10.0, "batch": 60.0}), clock=clock,
                    registry=registry)
    assert adm.apply(build_table(_sized(1), region="local", applied_at=0.0)) == []  # two replicas: two slots
    first, second = _t("standard"), _t("standard")
    assert adm.offer("chat", first) == ([first], []) and adm.offer("chat", second) == ([second], [])
    third, fourth = _t("standard"), _t("interactive", deadline=0.5)
    assert adm.offer("chat", third).started == [] and adm.offer("chat", fourth).started == []
    assert third.state == fourth.state == "queued"
    assert adm.wait_limit(third) == 10.0 and adm.wait_limit(fourth) == pytest.approx(0.45)
    assert adm.release("chat", first) == [fourth]  # interactive first
    assert adm.apply(build_table(_sized(2), region="local", applied_at=1.0)) == [third]  # four slots now
    assert third.state == "running"
    waiting = [_t("batch") for _ in range(4)]
    for ticket in waiting:
        adm.offer("chat", ticket)
    late = next(t for t in waiting if t.state == "queued")
    depth = adm.models["chat"].depth("batch")
    clock.now = 60.0
    assert adm.expire("chat", late) and late.state == "done" and adm.models["chat"].depth("batch") == depth - 1
    assert not adm.expire("chat", late) and not adm.expire("chat", third)  # once; never a running ticket
    assert registry.get_sample_value("ferry_proxy_shed_total", {"model": "chat", "tier": "batch",
                                                                "reason": "timeout"}) == 1


async def test_an_evicted_waiter_is_refused_at_once_and_the_offer_says_whom_it_evicted() -> None:
    """A full tier (bound 2) where tenant a waits twice: b's offer evicts a's newest; a's wait ends with Shed
    (evicted) at once, not at its timeout, counted once; the total queued does not grow."""
    clock, registry = Clock(), CollectorRegistry()
    adm = Admission(QueueParams(bounds={"interactive": 2, "standard": 2, "batch": 2}), clock=clock,
                    registry=registry)
    adm.models["chat"] = TierQueues(adm.params, 1)
    await adm.acquire("chat", _t("standard", tenant="a"))
    older, newest = _t("standard", tenant="a"), _t("standard", tenant="a")
    waits = [asyncio.ensure_future(adm.acquire("chat", t)) for t in (older, newest)]
    await asyncio.sleep(0)
    newcomer = _t("standard", tenant="b")
    assert adm.offer("chat", newcomer) == ([], [newest])
    with pytest.raises(Shed) as info:
        await asyncio.wait_for(waits[1], 1)
    assert info.value.reason == "evicted" and not waits[0].done()
    assert adm.models["chat"].depth("standard") == 2 and newest.state == "done"
    assert registry.get_sample_value("ferry_proxy_shed_total", {"model": "chat", "tier": "standard",
                                                                "reason": "evicted"}) == 1
    waits[0].cancel()


def test_a_full_proxy_that_evicts_for_a_newcomer_never_loses_the_evicted_one() -> None:
    """Over its total bound (possible after a lowered ``queue_max_total``), a tier whose heaviest tenant gave way:
    the newcomer takes the evicted one's place and the offer returns it, rather than refusing after evicting."""
    adm = Admission(QueueParams(bounds={"interactive": 2, "standard": 2, "batch": 2}, max_queued=4), clock=Clock(),
                    registry=CollectorRegistry())
    adm.models["chat"] = TierQueues(adm.params, 0)
    queued = [_t("standard", tenant="a"), _t("standard", tenant="a"), _t("batch"), _t("batch")]
    for ticket in queued:
        adm.offer("chat", ticket)
    adm.models["chat"].params = adm.params = dataclasses.replace(adm.params, max_queued=3)  # lowered
    offered = adm.offer("chat", _t("standard", tenant="b"))
    assert offered.evicted == [queued[1]] and queued[1].state == "done"
    assert adm.models["chat"].queued() == 4


@pytest.mark.parametrize(
    ("limit", "seen", "expected"),
    [
        (2, ["a", "b", "c", "a", "d"], ["a", "b", "_other", "a", "_other"]),
        (0, ["a", "b"], ["_other", "_other"]),
        (5, ["x", "x"], ["x", "x"]),
    ],
    ids=["first-kept", "none-named", "repeat"],
)
def test_tenant_label_values_are_bounded(limit: int, seen: list[str], expected: list[str]) -> None:
    label = BoundedLabel(limit)
    assert [label(t) for t in seen] == expected


async def test_admission_counts_per_tier_and_tenant_with_a_bounded_label() -> None:
    clock = Clock()
    registry = CollectorRegistry()
    adm = Admission(QueueParams(timeouts={"interactive": 0.05, "standard": 0.05, "batch": 0.05}), clock=clock,
                    registry=registry, tenant_labels=1)
    adm.models["chat"] = TierQueues(adm.params, 1)
    first = _t("standard", tenant="acme")
    await adm.acquire("chat", first)  # dispatched at once
    with pytest.raises(Shed):  # waits, then its queue timeout passes: shed, counted for the second tenant
        await asyncio.wait_for(adm.acquire("chat", _t("standard", tenant="zeta")), 2)

    def value(metric: str, **labels: str) -> float:
        return registry.get_sample_value(f"ferry_proxy_tenant_{metric}", labels) or 0.0

    assert value("queued_total", tier="standard", tenant="acme") == 1
    assert value("admitted_total", tier="standard", tenant="acme") == 1
    assert value("queue_wait_seconds_total", tier="standard", tenant="acme") == 0
    assert value("queued_total", tier="standard", tenant="_other") == 1  # "zeta": past the bound of one name
    assert value("shed_total", tier="standard", tenant="_other", reason="timeout") == 1
    assert value("admitted_total", tier="standard", tenant="zeta") == 0


async def test_reclaimed_counts_the_reserve_taken_back() -> None:
    """Ten slots, interactive reserves 7: idle, all 7 are lent to batch; three interactive requests take 3 back."""
    clock = Clock()
    adm = _admission(10, clock, reserved={"interactive": 0.7, "standard": 0.2, "batch": 0.1}, headroom_max_share=0.0)
    metrics = adm.metrics
    batch = [_t("batch") for _ in range(10)]
    for ticket in batch:
        await adm.acquire("chat", ticket)
    assert metrics.lent.labels("chat", "interactive")._value.get() == 7
    assert metrics.reclaimed.labels("chat", "interactive")._value.get() == 0
    interactive = [_t("interactive") for _ in range(3)]
    waiting = [asyncio.ensure_future(adm.acquire("chat", ticket)) for ticket in interactive]
    await asyncio.sleep(0)
    assert metrics.lent.labels("chat", "interactive")._value.get() == 4
    assert metrics.reclaimed.labels("chat", "interactive")._value.get() == 3
    for ticket in batch[:3]:  # batch over its quota ends (it is not preemptible here: not forwarding)
        adm.release("chat", ticket)
    await asyncio.wait_for(asyncio.gather(*waiting), 1)
    for ticket in batch[3:]:
        adm.release("chat", ticket)
    assert metrics.lent.labels("chat", "interactive")._value.get() == 4  # three interactive still run
    for ticket in interactive:
        adm.release("chat", ticket)
    assert metrics.lent.labels("chat", "interactive")._value.get() == 7
    assert metrics.reclaimed.labels("chat", "interactive")._value.get() == 3  # lending again is not a reclaim


async def test_preempted_to_make_room_on_the_chosen_replica_is_labelled_room() -> None:
    """Four slots, two batch requests on r0 (its target: 2); an interactive one sent there preempts one."""
    clock = Clock()
    adm = _admission(4, clock, reserved={"interactive": 0.5, "standard": 0.5, "batch": 0.0}, headroom_max_share=0.0)
    gate = asyncio.Event()

    async def run(ticket: Ticket) -> str:
        while True:
            await adm.acquire("chat", ticket)
            adm.placed("chat", ticket, "r0", 1, 2)
            try:
                return await adm.preemptible("chat", ticket, gate.wait)  # type: ignore[arg-type, return-value]
            except Preempted:
                await asyncio.sleep(1)  # stays requeued while the test looks

    batch = [_t("batch") for _ in range(2)]
    tasks = [asyncio.ensure_future(run(t)) for t in batch]
    await asyncio.sleep(0.01)
    interactive = _t("interactive")
    await adm.acquire("chat", interactive)  # the model has room: no reclaim
    adm.placed("chat", interactive, "r0", 3, 2)  # but r0 is full of ours
    await asyncio.sleep(0.01)
    assert [t.preempted for t in batch] == [0, 1]  # the newest, on r0
    assert adm.metrics.preempted.labels("chat", "room")._value.get() == 1
    assert adm.metrics.preempted.labels("chat", "reclaim")._value.get() == 0
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
