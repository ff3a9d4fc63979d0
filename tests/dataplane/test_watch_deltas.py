"""The Tables.Watch client with deltas: applied to the table held; a gap asks for a resync; a NACK keeps the table."""

from __future__ import annotations

import pytest

from ferry.v1 import tables_pb2
from tests.dataplane.conftest import PAID, request
from tests.dataplane.fakes import Behaviour, route

pytestmark = pytest.mark.timeout(20)


def delta(version: int, base: int, **changes: object) -> tables_pb2.TableSnapshot:
    """A delta message (as the control plane sends it) from ``base`` to ``version``."""
    return tables_pb2.TableSnapshot(version=version, nonce=f"n{version}", region="local", computed_at=2.0,
                                    delta=tables_pb2.TableDelta(base_version=base, **changes))  # type: ignore[arg-type]


def drained(rid: str) -> list[tables_pb2.ModelDelta]:
    return [tables_pb2.ModelDelta(model="m", removed_replicas=[rid])]


async def test_the_proxy_subscribes_for_deltas_and_applies_one_to_the_table_held(rig) -> None:
    r = await rig({"r1": Behaviour(), "r2": Behaviour()})
    sub = await r.cp.subscribes.get()
    assert sub.deltas and sub.have_version == 0
    r.cp.push(delta(2, 1, models=drained("r1")))
    ack = await r.cp.next_ack()
    assert (ack.version, ack.nonce, ack.applied, ack.resync) == (2, "n2", True, False)
    assert r.proxy.holder.version == 2
    for _ in range(3):
        assert (await r.stub.Infer(request(), metadata=PAID, timeout=5)).replica_id == "r2"
    held = r.proxy.holder.snapshot
    assert held is not None and [x.replica_id for x in held.models[0].replicas] == ["r2"]


async def test_a_delta_from_a_version_not_held_asks_for_a_resync_and_the_full_table_follows(rig) -> None:
    r = await rig({"r1": Behaviour(), "r2": Behaviour()})
    r.cp.push(delta(3, 2, models=drained("r1")))  # version 2 never arrived: a gap
    ack = await r.cp.next_ack()
    assert (ack.version, ack.applied, ack.resync) == (3, False, True)
    assert "from version 2, the table held is version 1" in ack.error
    assert r.proxy.holder.version == 1
    assert {(await r.stub.Infer(request(), metadata=PAID, timeout=5)).replica_id for _ in range(8)} <= {"r1", "r2"}
    full = tables_pb2.TableSnapshot(version=3, nonce="n3-full", region="local", computed_at=2.0,
                                    models=[tables_pb2.ModelRoute(model="m", default_version="v1",
                                                                  replicas=[route(r.replicas["r2"])])])
    r.cp.push(full)
    ack = await r.cp.next_ack()
    assert (ack.version, ack.nonce, ack.applied) == (3, "n3-full", True)
    assert (await r.stub.Infer(request(), metadata=PAID, timeout=5)).replica_id == "r2"


async def test_a_delta_naming_a_replica_not_held_asks_for_a_resync(rig) -> None:
    r = await rig({"r1": Behaviour()})
    r.cp.push(delta(2, 1, models=drained("r9")))
    ack = await r.cp.next_ack()
    assert (ack.applied, ack.resync) == (False, True) and "'r9' to remove" in ack.error
    assert r.proxy.holder.version == 1


async def test_a_nacked_delta_leaves_the_proxy_on_its_last_good_table(rig) -> None:
    r = await rig({"r1": Behaviour(), "r2": Behaviour()})
    bad = route("r3", "not-an-address")
    r.cp.push(delta(2, 1, models=[tables_pb2.ModelDelta(model="m", replicas=[bad], removed_replicas=["r1"])]))
    ack = await r.cp.next_ack()
    assert (ack.version, ack.applied, ack.resync) == (2, False, False)
    assert "is not host:port" in ack.error
    assert r.proxy.holder.version == 1
    held = r.proxy.holder.snapshot
    assert held is not None and [x.replica_id for x in held.models[0].replicas] == ["r1", "r2"]
    assert r.proxy.metrics.value("proxy_table_rejections_total") == 1
    assert {(await r.stub.Infer(request(), metadata=PAID, timeout=5)).replica_id for _ in range(8)} <= {"r1", "r2"}
    r.cp.push(delta(3, 1, models=drained("r2")))  # the next delta from the version it holds applies
    ack = await r.cp.next_ack()
    assert (ack.version, ack.applied) == (3, True)
    assert (await r.stub.Infer(request(), metadata=PAID, timeout=5)).replica_id == "r1"


async def test_a_load_update_and_node_ages_reach_the_pick(rig) -> None:
    r = await rig({"r1": Behaviour(), "r2": Behaviour()})
    busy = route(r.replicas["r1"], queued=50, running=4, age=0.3).load
    r.cp.push(delta(2, 1, models=[tables_pb2.ModelDelta(model="m", loads=[tables_pb2.LoadUpdate(
        replica_id="r1", load=busy, telemetry_age_seconds=0.3)])],
        ages=[tables_pb2.NodeAge(node="n1", telemetry_age_seconds=0.4)]))
    ack = await r.cp.next_ack()
    assert ack.applied, ack.error
    table = r.proxy.holder.table
    assert table is not None
    _, pool = table.candidates("m", "")
    by_id = {x.replica_id: x for x in pool.replicas}
    assert (by_id["r1"].queued, by_id["r1"].telemetry_age) == (50, 0.3)
    assert (by_id["r2"].queued, by_id["r2"].telemetry_age) == (0, 0.4)
