"""etcd away for 10 s under load: traffic untouched, intent refused with UNAVAILABLE, the fleet converges after.

etcd is killed (SIGKILL) and restarted on the same data dir and port, or
paused (SIGSTOP, slow variant): a paused etcd answers nothing, and the leases
whose TTL passed meanwhile expire as soon as it resumes, so every member and
the leader's key must be written again.
"""

from __future__ import annotations

import signal
import time

import grpc
import pytest

from ferry.v1 import admin_pb2
from tests.etcd.harness import TTL, EtcdFleet, Load, etcd_keys, wait_for

OUTAGE = 10.0


def _drain(fleet: EtcdFleet, i: int, replica_id: str, undrain: bool = False) -> admin_pb2.ReplicaView:
    channel, admin = fleet.admin(i)
    with channel:
        method = admin.Undrain if undrain else admin.Drain
        return method(admin_pb2.DrainRequest(replica_id=replica_id), timeout=5).replica


def _converged(fleet: EtcdFleet, etcd) -> str:
    """'' once the fleet is whole again, else what is still missing."""
    roles = sorted(fleet.roles())
    if roles != ["follower", "leader"]:
        return f"roles {roles}"
    statuses = [fleet.status(i) for i in range(2)]
    if not all(s.store.healthy for s in statuses):
        return "a control plane still sees the store unhealthy"
    if [len(s.control_planes) for s in statuses] != [2, 2]:
        return "the control planes do not both see each other"
    if etcd_keys(etcd, "/ferry/members/") != ["/ferry/members/node-a", "/ferry/members/node-b"]:
        return f"members in etcd: {etcd_keys(etcd, '/ferry/members/')}"
    leader = next(s for s in statuses if s.role == "leader")
    version = leader.regions[0].version
    if any(s.regions[0].version != version for s in statuses):
        return "the follower has not the leader's table"
    if leader.regions[0].replicas != 2:
        return f"{leader.regions[0].replicas} routable replicas"
    synced = sorted(p.proxy_id for s in statuses for p in s.proxies if p.connected and p.applied_version == version)
    return "" if synced == ["proxy-1", "proxy-2"] else f"proxies on the latest version: {synced}"


def run_outage(fleet: EtcdFleet, etcd, how: str) -> None:
    with Load(fleet) as load:
        wait_for(lambda: load.ok() > 20, 10, "traffic through both proxies")
        stopped_at = time.monotonic()
        etcd.signal(signal.SIGKILL if how == "kill" else signal.SIGSTOP)
        try:
            refusals = []
            for i in (0, 1):  # intent changes are refused, on every control plane, with a clear message
                with pytest.raises(grpc.RpcError) as err:
                    _drain(fleet, i, "node-a-r0")
                assert err.value.code() == grpc.StatusCode.UNAVAILABLE
                assert "refused" in err.value.details() and etcd.endpoint in err.value.details(), err.value.details()
                refusals.append(err.value.details())
            wait_for(lambda: not any(fleet.status(i).store.healthy for i in (0, 1)), 5, "both to see etcd gone")
            ok_at_stop = load.ok()
            time.sleep(max(0.0, OUTAGE - (time.monotonic() - stopped_at)))
            assert load.ok() > ok_at_stop + 50, "traffic must flow while etcd is away"
            for i in (0, 1):  # the members nobody can see in etcd are not expired
                assert all(r.in_table for r in fleet.replicas(i).values())
        finally:
            if how == "kill":
                etcd.start()  # the same data dir and port
            else:
                etcd.signal(signal.SIGCONT)
        back_at = time.monotonic()
        missing = "not checked"
        while missing and time.monotonic() < back_at + 15:
            missing = _converged(fleet, etcd)
            time.sleep(0.1)
        assert not missing, f"the fleet did not converge within 15 s of etcd's return: {missing}"
        print(f"etcd {how} for {back_at - stopped_at:.1f} s: {load.ok()} requests answered, "
              f"converged {time.monotonic() - back_at:.1f} s after etcd returned; refusal: {refusals[0]!r}")
        view = _drain(fleet, 1, "node-a-r0")  # intent works again
        assert view.drain_requested and not view.in_table
        assert not _drain(fleet, 0, "node-a-r0", undrain=True).drain_requested
        wait_for(lambda: all(r.in_table for r in fleet.replicas(0).values()), 10, "the undrained replica back")
    assert set(load.outcomes) == {"OK"}, (load.outcomes, load.errors[:5])


def test_etcd_killed_for_10_s_under_load(make_fleet, etcd) -> None:
    fleet = make_fleet({"node-a": ["chat:v1"], "node-b": ["chat:v1"]}, control_planes=2, proxies=2)
    run_outage(fleet, etcd, "kill")


@pytest.mark.slow
def test_etcd_paused_for_10_s_under_load(make_fleet, etcd) -> None:
    fleet = make_fleet({"node-a": ["chat:v1"], "node-b": ["chat:v1"]}, control_planes=2, proxies=2)
    assert TTL < OUTAGE  # every lease runs out while etcd sleeps
    run_outage(fleet, etcd, "pause")
