"""When a fleet of local processes routes: what ``ferry up``, the benchmarks and the tests wait for.

:func:`wait_routable` polls the Admin API (every 50 ms, up to a deadline)
until every expected replica is in the table and the named proxy applied the
region's newest table version, and fails early, with its last log lines, if
a child exits first. :func:`served_models` is the models the tables route
to, those asked for first (:func:`ordered_models`).
"""

from __future__ import annotations

import time

import grpc

from ferry.procs import Child, ChildFailed
from ferry.v1 import admin_pb2
from ferry_cli import clienttls
from ferry_cli.ctl.client import AdminClient


def wait_routable(cp_addr: str, expected: set[str], proxy_id: str, timeout: float, children: list[Child],
                  *, nodes_with_any: set[str] | None = None, admin_token: str | None = None,
                  credentials: grpc.ChannelCredentials | None = None) -> None:
    """Poll the Admin API until every expected replica is in the table and the proxy applied it.

    ``nodes_with_any`` names nodes whose replicas are discovered (adopted endpoints):
    each must have at least one replica in the table.
    """
    deadline = time.monotonic() + timeout
    last = "no answer yet"
    with clienttls.sync_channel(cp_addr, credentials) as channel:
        admin = AdminClient(channel, admin_token)
        while time.monotonic() < deadline:
            for child in children:
                if not child.alive():
                    raise ChildFailed(f"{child.name} exited with {child.returncode()}:\n{child.log_tail()}")
            try:
                reps = admin.ListReplicas(admin_pb2.ListReplicasRequest(), timeout=2)
                routable = {r.replica_id for r in reps.replicas if r.in_table}
                adopted = {r.node for r in reps.replicas if r.in_table}
                table = admin.GetTable(admin_pb2.GetTableRequest(), timeout=2)
                versions = {t.region: t.version for t in table.regions}
                synced = any(p.proxy_id == proxy_id and p.connected and p.applied_version == versions.get(p.region)
                             for p in table.proxies)
                if expected <= routable and (nodes_with_any or set()) <= adopted and synced:
                    return
                last = f"{len(expected & routable)}/{len(expected)} replicas routable, proxy synced: {synced}"
            except grpc.RpcError as exc:
                last = f"{exc.code().name}: {exc.details()}"
            time.sleep(0.05)
    raise ChildFailed(f"fleet not ready after {timeout:.0f} s: {last}")


def ordered_models(asked: list[str], routable: set[str]) -> list[str]:
    """The models of ``routable`` replicas: those ``asked`` for first, in their order, then the others sorted."""
    return [m for m in asked if m in routable] + sorted(routable - set(asked))


def served_models(cp_addr: str, asked: list[str], *, admin_token: str | None = None,
                  credentials: grpc.ChannelCredentials | None = None) -> list[str]:
    """The models the control plane's tables route to (Admin ``ListReplicas``, replicas in a table), ordered
    by :func:`ordered_models`: adopted endpoints bring models ``--models`` never named."""
    with clienttls.sync_channel(cp_addr, credentials) as channel:
        reps = AdminClient(channel, admin_token).ListReplicas(admin_pb2.ListReplicasRequest(), timeout=5)
    return ordered_models(asked, {r.model for r in reps.replicas if r.in_table})
