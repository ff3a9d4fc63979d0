"""Pure pieces behind the operator commands: the admin token, table diffs and history, node and usage views."""

from __future__ import annotations

import pytest

from controlplane.allocation.records import Allocation, NodeAllocations
from controlplane.api.auth import AdminAuth, load, sha256_hex
from controlplane.tables.compute import TableVersions, compute_tables
from controlplane.tables.diff import diff_tables, pick_versions
from controlplane.tables.views import node_view, slot_state, usage_rows
from ferry.config import ModelConfig
from ferry.errors import ConfigError, NotFound
from ferry.v1 import common_pb2, tables_pb2
from tests.controlplane.fakes import FakeClock, fleet_with, register, replica

TOKEN = "s3cret"

LOADS = [
    # id, config sha256, token file content (None: no flag), env, expected sha256 or error naming
    ("nothing", "", None, {}, ""),
    ("file", "", "s3cret\n", {}, sha256_hex(TOKEN)),
    ("env", "", None, {"FERRY_ADMIN_TOKEN": TOKEN}, sha256_hex(TOKEN)),
    ("file-beats-env", "", "s3cret", {"FERRY_ADMIN_TOKEN": "other"}, sha256_hex(TOKEN)),
    ("hash-only", sha256_hex(TOKEN), None, {}, sha256_hex(TOKEN)),
    ("hash-and-token-agree", sha256_hex(TOKEN), None, {"FERRY_ADMIN_TOKEN": TOKEN}, sha256_hex(TOKEN)),
    ("hash-and-token-disagree", sha256_hex("x"), None, {"FERRY_ADMIN_TOKEN": TOKEN},
     ConfigError("controlplane.admin_token_sha256", "")),
    ("hash-malformed", "abc", None, {}, ConfigError("controlplane.admin_token_sha256", "")),
    ("empty-file", "", "  \n", {}, ConfigError("--admin-token-file", "")),
]


@pytest.mark.parametrize(("config", "content", "env", "expected"), [c[1:] for c in LOADS], ids=[c[0] for c in LOADS])
def test_load_the_token(tmp_path, config: str, content: str | None, env: dict[str, str],  # type: ignore[no-untyped-def]
                        expected: str | ConfigError) -> None:
    path = None
    if content is not None:
        path = tmp_path / "token"
        path.write_text(content)
    if isinstance(expected, ConfigError):
        with pytest.raises(ConfigError, match=expected.key):
            load(config, str(path) if path else None, env)
        return
    auth = load(config, str(path) if path else None, env)
    assert auth.sha256 == expected
    assert (auth.token is not None) == (content is not None or "FERRY_ADMIN_TOKEN" in env)
    assert TOKEN not in repr(auth)


REFUSALS = [
    ("ok", [("authorization", f"Bearer {TOKEN}")], None),
    ("lowercase-scheme", [("authorization", f"bearer {TOKEN}")], None),
    ("missing", [], "admin token required"),
    ("other-metadata", [("x-api-key", TOKEN)], "admin token required"),
    ("wrong-scheme", [("authorization", f"Basic {TOKEN}")], "Bearer TOKEN"),
    ("wrong-token", [("authorization", "Bearer nope")], "not accepted"),
]


@pytest.mark.parametrize(("metadata", "words"), [c[1:] for c in REFUSALS], ids=[c[0] for c in REFUSALS])
def test_refusal(metadata: list[tuple[str, str]], words: str | None) -> None:
    reason = AdminAuth.with_token(TOKEN).refusal(metadata)
    if words is None:
        assert reason is None
    else:
        assert reason is not None and words in reason and "FERRY_ADMIN_TOKEN" in reason
    assert AdminAuth().refusal([("authorization", f"Bearer {TOKEN}")]) is not None  # no token: closed


def route(rid: str, node: str = "n1", queued: int = 0, address: str = "127.0.0.1:1",
          http_address: str = "") -> tables_pb2.ReplicaRoute:
    return tables_pb2.ReplicaRoute(replica_id=rid, node=node, address=address, http_address=http_address,
                                   load=common_pb2.ReplicaLoad(queued=queued))


def snapshot(version: int, *routes: tables_pb2.ReplicaRoute, default: str = "v1",
             models: tuple[str, ...] = ("chat",)) -> tables_pb2.TableSnapshot:
    return tables_pb2.TableSnapshot(region="local", version=version, models=[
        tables_pb2.ModelRoute(model=m, default_version=default, replicas=list(routes) if m == "chat" else [])
        for m in models])


def tenant(name: str, plan: str = "paid", tiers: tuple[str, ...] = ("interactive",),
           key: str = "a" * 64) -> tables_pb2.TenantRoute:
    return tables_pb2.TenantRoute(name=name, api_key_sha256=key, plan=plan, tiers=list(tiers))


def managed(version: int, *tenants: tables_pb2.TenantRoute) -> tables_pb2.TableSnapshot:
    snap = snapshot(version)
    snap.tenants.extend(tenants)
    snap.tenants_managed = True
    return snap


def weighted(version: int, **weights: float) -> tables_pb2.TableSnapshot:
    snap = snapshot(version)
    snap.models[0].version_weights.extend(tables_pb2.VersionWeight(version=v, weight=w) for v, w in weights.items())
    return snap


def spilling(version: int, **weights: float) -> tables_pb2.TableSnapshot:
    snap = snapshot(version)
    snap.spill.extend(tables_pb2.SpillRoute(region=r, weight=w) for r, w in weights.items())
    return snap


DIFFS = [
    ("same", snapshot(1, route("a")), snapshot(2, route("a")), []),
    ("added-removed", snapshot(1, route("a")), snapshot(2, route("b")),
     [("removed", "a", "node n1"), ("added", "b", "node n1")]),
    ("moved", snapshot(1, route("a")), snapshot(2, route("a", address="127.0.0.1:2")),
     [("changed", "a", "address 127.0.0.1:1->127.0.0.1:2")]),
    ("http-moved", snapshot(1, route("a", http_address="127.0.0.1:8")), snapshot(2, route("a", http_address="h:9")),
     [("changed", "a", "http_address 127.0.0.1:8->h:9")]),
    ("load", snapshot(1, route("a")), snapshot(2, route("a", queued=3)), [("load", "a", "queued 0->3")]),
    ("default-version", snapshot(1), snapshot(2, default="v2"), [("model", "", "default_version v1->v2")]),
    ("model-added", snapshot(1), snapshot(2, models=("chat", "new")), [("model", "", "added to the catalog")]),
    ("canary", weighted(1), weighted(2, v1=0.95, v2=0.05), [("model", "", "version_weights none->v1 0.95, v2 0.05")]),
    ("tenants-managed", snapshot(1), managed(2, tenant("acme")),
     [("tenant", "", "the table carries the tenant set"), ("tenant", "acme", "added (plan paid)")]),
    ("tenant-changed", managed(1, tenant("acme"), tenant("gone")),
     managed(2, tenant("acme", plan="free", tiers=("batch",), key="b" * 64)),
     [("tenant", "acme", "plan paid->free, tiers interactive->batch, a new key"), ("tenant", "gone", "removed")]),
    ("tenant-same", managed(1, tenant("acme")), managed(2, tenant("acme")), []),
    ("spill", spilling(1, b=0.4), spilling(2, b=0.45, c=0.0),
     [("spill", "b", "weight 0.4->0.45, batch 0->0"), ("spill", "c", "route added")]),
]


@pytest.mark.parametrize(("old", "new", "expected"), [c[1:] for c in DIFFS], ids=[c[0] for c in DIFFS])
def test_diff_tables(old: tables_pb2.TableSnapshot, new: tables_pb2.TableSnapshot,
                     expected: list[tuple[str, str, str]]) -> None:
    assert [(c.change, c.replica_id, c.detail) for c in diff_tables(old, new)] == expected


PICKS = [
    ("last-change", 0, 0, (3, 4)),
    ("to-given", 0, 3, (2, 3)),
    ("both-given", 2, 4, (2, 4)),
    ("first-alone", 0, 2, (2, 2)),
    ("unknown-to", 0, 9, NotFound),
    ("unknown-from", 1, 0, NotFound),
]


@pytest.mark.parametrize(("start", "to", "expected"), [c[1:] for c in PICKS], ids=[c[0] for c in PICKS])
def test_pick_versions(start: int, to: int, expected: tuple[int, int] | type) -> None:
    kept = [snapshot(v) for v in (2, 3, 4)]
    if expected is NotFound:
        with pytest.raises(NotFound, match="kept: 2, 3, 4"):
            pick_versions(kept, "local", start, to)
        return
    old, new = pick_versions(kept, "local", start, to)
    assert (old.version, new.version) == expected


def test_table_history_is_bounded_and_cordons_leave_the_table() -> None:
    clock = FakeClock()
    _fleet, members = fleet_with(clock, register("n1", replica("n1/r0")), register("n2", replica("n2/r0")))
    versions = TableVersions(100, history=3)
    catalog = (ModelConfig(name="chat"),)
    for i in range(5):
        tables = compute_tables(members, catalog, {"n1/r0"} if i % 2 else set(), now=clock(), grace_seconds=3)
        versions.publish(tables, float(i))
    assert [s.version for s in versions.history("local")] == [103, 104, 105]
    cordoned = compute_tables(members, catalog, set(), now=clock(), grace_seconds=3, cordons={"n2"})
    assert [r.replica_id for m in cordoned["local"].models for r in m.replicas] == ["n1/r0"]


def test_node_and_slot_views_count_what_the_planner_counts() -> None:
    clock = FakeClock()
    _fleet, [member] = fleet_with(clock, register("n1", replica("n1/r0", gpus=4), replica("n1/r1", gpus=2)))
    record = NodeAllocations("n1", (Allocation("big", "m", "v1", tuple(range(8)), displaces=("n1/r0", "n1/r1")),))
    view = node_view(member, None, now=clock(), grace=3, cordoned=False, control_plane="cp1")
    assert (view.gpus_allocated, view.gpus_free, view.control_plane) == (6, 2, "cp1")
    view = node_view(member, record, now=clock(), grace=3, cordoned=True, control_plane="cp1")
    assert (view.gpus_allocated, view.gpus_free, view.slots, view.cordoned) == (8, 0, 1, True)
    assert slot_state(record.slots[0], member, now=clock(), grace=3) == "draining"
    member.loads = {r: common_pb2.ReplicaLoad(replica_id=r, state=common_pb2.REPLICA_STATE_DRAINED)
                    for r in ("n1/r0", "n1/r1")}
    assert slot_state(record.slots[0], member, now=clock(), grace=3) == "placed"
    assert slot_state(record.slots[0], None, now=clock(), grace=3) == "placed"
    clock.advance(10)
    view = node_view(member, record, now=clock(), grace=3, cordoned=False, control_plane="cp1")
    assert (view.live, view.agent_connected, view.control_plane) == (False, False, "")


def test_usage_rows_only_count_routable_load() -> None:
    clock = FakeClock()
    _fleet, members = fleet_with(clock, register("n1", replica("n1/r0"), replica("n1/r1")))
    members[0].loads = {
        "n1/r0": common_pb2.ReplicaLoad(replica_id="n1/r0", state=common_pb2.REPLICA_STATE_READY, queued=4,
                                        kv_blocks_free=10, kv_blocks_total=40, gpu_utilization=0.8, requests_total=5),
        "n1/r1": common_pb2.ReplicaLoad(replica_id="n1/r1", state=common_pb2.REPLICA_STATE_DRAINING, queued=9,
                                        kv_blocks_free=0, kv_blocks_total=40, requests_total=6),
    }
    versions = TableVersions(1)
    versions.publish(compute_tables(members, (), set(), now=clock(), grace_seconds=3), 0.0)
    [row] = usage_rows(members, versions, now=clock())
    assert (row.replicas, row.replicas_ready, row.queued, row.requests_total) == (2, 1, 4, 11)
    assert row.kv_utilisation == pytest.approx(0.75) and row.gpu_utilisation == pytest.approx(0.8)
