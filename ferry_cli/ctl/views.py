"""What ``ferryctl`` prints: rows built from Admin answers, and an aligned text table.

Each ``*_rows`` function turns one Admin answer into plain dicts (the
``--json`` output, with the same keys the human table shows as columns);
:func:`print_table` aligns them. :func:`merge_status` merges the
``GetStatus`` answers of every control plane into one view.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ferry.v1 import common_pb2


def state_name(value: int) -> str:
    return str(common_pb2.ReplicaState.Name(value)).removeprefix("REPLICA_STATE_").lower()


def print_table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> None:
    """Print ``rows`` as an aligned text table with the given columns (lists joined by commas)."""
    def cell(value: Any) -> str:
        if isinstance(value, list | tuple):
            return ",".join(str(v) for v in value) or "-"
        return "" if value is None else str(value)

    cells = [[cell(row.get(c)) for c in columns] for row in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    print("  ".join(c.upper().ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip())
    for r in cells:
        print("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip())


def replica_row(r: Any) -> dict[str, Any]:
    """One replica for display; a dead one has no load (None: empty cells, ``null`` in JSON)."""
    dead = r.state == common_pb2.REPLICA_STATE_DEAD
    return {
        "id": r.replica_id, "node": r.node, "region": r.region, "model": r.model, "version": r.version,
        "address": r.address, "state": state_name(r.state), "drain_requested": r.drain_requested,
        "cordoned": r.cordoned, "in_table": r.in_table, "queue": None if dead else r.load.queued,
        "running": None if dead else r.load.running, "free_kv": None if dead else r.load.kv_blocks_free,
        "total_kv": None if dead else r.load.kv_blocks_total,
        "telemetry_age_s": round(r.telemetry_age_seconds, 3),
    }


def node_row(n: Any) -> dict[str, Any]:
    return {
        "node": n.node, "region": n.region, "gpus": n.gpus, "gpus_allocated": n.gpus_allocated,
        "gpus_free": n.gpus_free, "replicas": len(n.replica_ids), "replica_ids": list(n.replica_ids),
        "slots": n.slots, "agent_connected": n.agent_connected, "control_plane": n.control_plane,
        "cordoned": n.cordoned, "live": n.live, "heard_s": round(n.heard_seconds_ago, 3),
    }


def model_row(m: Any) -> dict[str, Any]:
    return {
        "model": m.model, "default_version": m.default_version, "versions": list(m.versions),
        "ready": m.replicas_ready, "total": m.replicas_total, "gpus_each": m.gpus_each, "slots": m.slots,
        "pending": m.pending, "tokenizer": m.tokenizer,
    }


def slot_row(s: Any) -> dict[str, Any]:
    return {
        "replica_id": s.replica_id, "node": s.node, "region": s.region, "model": s.model, "version": s.version,
        "gpus": list(s.gpus), "state": s.state, "displaces": list(s.displaces), "drain_cost": round(s.drain_cost, 3),
        "requested_at": s.requested_at, "placed_at": s.placed_at,
    }


def pending_row(p: Any) -> dict[str, Any]:
    return {
        "request_id": p.request_id, "model": p.model, "version": p.version, "gpus": p.gpus, "region": p.region,
        "age_s": round(p.age_seconds, 1), "reason": p.reason,
    }


def change_row(c: Any) -> dict[str, Any]:
    return {"change": c.change, "model": c.model, "replica_id": c.replica_id, "detail": c.detail}


def merge_status(first: Any, answers: dict[str, Any], unreachable: dict[str, str],
                 missing: dict[str, str] | None = None) -> dict[str, Any]:
    """One view of the control side from each control plane's GetStatus (``first`` answered the call).

    Tables and counts come from the leader's answer when it answered; proxies from the control plane
    each one watches from, with ``leader_version`` and ``synced`` (applied the leader's version).
    ``missing``: control planes the operator named (address -> why) that the store no longer lists:
    shown unreachable, with no id, so that a dead control plane does not vanish from the view.
    """
    leader = answers.get(first.leader_id) if first.leader_id else None
    main = leader if leader is not None else first
    versions = {t.region: t.version for t in main.regions}
    planes = []
    for view in first.control_planes:
        answer = answers.get(view.id)
        planes.append({
            "id": view.id, "address": view.address, "leader": view.id == first.leader_id,
            "role": answer.role if answer is not None else "", "reachable": answer is not None,
            "error": unreachable.get(view.id, ""), "agents": answer.agents if answer is not None else 0,
            "store_healthy": answer.store.healthy if answer is not None else None,
        })
    for address, why in sorted((missing or {}).items()):
        planes.append({"id": "", "address": address, "leader": False, "role": "", "reachable": False,
                       "error": why, "agents": 0, "store_healthy": None})
    proxies = []
    for cp_id, answer in sorted(answers.items()):
        for p in answer.proxies:
            proxies.append({
                "proxy_id": p.proxy_id, "region": p.region, "control_plane": cp_id,
                "applied_version": p.applied_version, "lag_versions": p.lag_versions,
                "leader_version": versions.get(p.region, 0),
                "synced": p.applied_version == versions.get(p.region, -1), "connected": p.connected,
                "last_ack_age_s": round(p.last_ack_age_seconds, 3), "last_error": p.last_error,
            })
    store = first.store
    return {
        "answered_by": first.control_plane_id,
        "leader": {"id": first.leader_id, "address": first.leader_address, "term": main.term}
        if first.leader_id else None,
        "store": {"backend": store.backend, "endpoint": store.endpoint, "healthy": store.healthy,
                  "error": store.error, "revision": store.revision,
                  "last_ok_age_s": round(store.last_ok_age_seconds, 3)},
        "control_planes": planes,
        "regions": [{"region": t.region, "version": t.version, "replicas": t.replicas, "models": list(t.models),
                     "computed_at": t.computed_at} for t in main.regions],
        "proxies": sorted(proxies, key=lambda p: (p["proxy_id"], not p["connected"])),
        "members": main.members, "drains": main.drains, "allocations": main.allocations,
    }


def supervision_rows(ready: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per child ``ferry up`` supervises (``component``, ``pid``, ``restarts``, ``given_up``), from its
    ready file's ``pids``, ``restarts`` and ``given_up``; empty when it has no ``restarts`` (not supervised)."""
    restarts = ready.get("restarts")
    if not isinstance(restarts, dict):
        return []
    pids = ready.get("pids") or {}
    given_up = set(ready.get("given_up") or [])
    return [{"component": name, "pid": pids.get(name), "restarts": int(count), "given_up": name in given_up}
            for name, count in sorted(restarts.items())]
