"""``Admin.GetStatus`` and ``Admin.Follow``: the control planes beside each other, translation only.

:class:`ClusterRpcs` holds the :class:`controlplane.services.status.StatusService`
(``GetStatus``: this control plane, the leader, the store, the proxies) and
the :class:`controlplane.services.peers.PeerService` (``Follow``: the leader's
side of a follower's stream). ``Follow`` reads the first report within
``first_message_seconds``, then a reader beside a writer
(:mod:`controlplane.api.streams`): the follower's reports in, the leader's
tables out. UNAVAILABLE when this control plane does not or no longer leads
(the message names the leader it knows); errors become their status in
:mod:`controlplane.api.status`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from controlplane.api.status import serve
from controlplane.api.streams import duplex, first_message
from controlplane.services.peers import PeerService
from controlplane.services.status import StatusService
from ferry.errors import Unavailable
from ferry.v1 import admin_pb2, tables_pb2


class ClusterRpcs:
    """``Admin.GetStatus`` and ``Admin.Follow``."""

    def __init__(self, status: StatusService, peers: PeerService) -> None:
        self._status = status
        self._peers = peers

    async def GetStatus(self, request: admin_pb2.GetStatusRequest, context: Any) -> admin_pb2.GetStatusResponse:
        return self._status.status()

    async def Follow(self, request_iterator: AsyncIterator[admin_pb2.FollowerReport], context: Any) -> None:
        await serve(context, self._follow(request_iterator.__aiter__(), context))

    async def _follow(self, stream: AsyncIterator[admin_pb2.FollowerReport], context: Any) -> None:
        peers = self._peers
        first = await first_message(stream, "report", peers.settings.first_message_seconds)
        if first is None:
            return
        session = peers.follow_open(first)

        async def write(snapshot: tables_pb2.TableSnapshot) -> None:
            await context.write(admin_pb2.LeaderUpdate(leader_id=peers.settings.id, table=snapshot))

        async def read() -> None:
            async for report in stream:
                peers.follow_report(session, report)

        try:
            closed = await duplex(read(), session.next, write)
        finally:
            peers.follow_close(session)
        if closed:
            raise Unavailable(session.closed_reason or "closed")
