"""A follower reaches a leader whose certificate does not name its address, by ``peer_tls_name``.

In a cluster a leader is advertised by its pod IP, which no certificate
names ahead of time. Here the leader's certificate names only
``DNS:controlplane`` and it is reached at 127.0.0.1: without the setting the
TLS check fails and the follower never follows; with ``peer_tls_name =
"controlplane"`` it follows (its report reaches the leader).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import grpc
import pytest

from controlplane.cluster.election import PlaneInfo
from controlplane.cluster.leaderlink import LeaderLink
from ferry.v1 import admin_pb2, admin_pb2_grpc
from harness.tlsgen import generate

pytestmark = pytest.mark.timeout(30)


class Leader(admin_pb2_grpc.AdminServicer):
    """An Admin server that takes follower streams and notes each report."""

    def __init__(self) -> None:
        self.reports: asyncio.Queue[admin_pb2.FollowerReport] = asyncio.Queue()

    async def Follow(self, request_iterator: Any, context: Any) -> Any:
        async for report in request_iterator:
            await self.reports.put(report)
        if False:  # a stream of tables, none sent here
            yield


@pytest.mark.parametrize("name", ["", "controlplane"])
async def test_a_follower_checks_its_leader_against_peer_tls_name(tmp_path: Path, name: str) -> None:
    tls = generate(tmp_path, ("controlplane",), san="DNS:controlplane")["controlplane"]
    leader = Leader()
    server = grpc.aio.server()
    admin_pb2_grpc.add_AdminServicer_to_server(leader, server)
    port = server.add_secure_port("127.0.0.1:0", tls.server_credentials())
    await server.start()
    target = PlaneInfo(id="cp-a", address=f"127.0.0.1:{port}")
    link = LeaderLink(cp_id="cp-b", leader=lambda: target,
                      report=lambda: admin_pb2.FollowerReport(control_plane_id="cp-b"),
                      adopt=lambda table: None, interval=0.05, tls=tls, tls_name=name)
    task = asyncio.ensure_future(link.run())
    try:
        if name:
            report = await asyncio.wait_for(leader.reports.get(), 10)
            assert report.control_plane_id == "cp-b"
        else:
            with pytest.raises(TimeoutError):  # the handshake fails: 127.0.0.1 is not in the certificate
                await asyncio.wait_for(leader.reports.get(), 1.5)
            assert link.following is None
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await server.stop(0)
