"""``Admin.ExportTraffic``: the recorded traffic (:mod:`controlplane.traffic`), streamed in batches.

The leader keeps every proxy's rows (followers relay theirs), so a follower
answers FAILED_PRECONDITION naming the leader it knows (ferryctl asks the
leader: :func:`ferry_cli.ctl.flow.leader`). The request's ``since_seconds``
must be positive and finite, ``model`` empty or a valid name; ``max_rows``
is capped by ``traffic_export_max_rows`` (0: that cap). Rows go out oldest
first, ``BATCH_ROWS`` a message, read from the store a chunk at a time in a
worker thread (:class:`controlplane.traffic.store.Reader`); the last message
carries the rows dropped within the span and whether ``max_rows`` cut it.
Translation only.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from typing import Any

from controlplane import validate
from controlplane.api.status import abort
from controlplane.errors import FailedPrecondition
from controlplane.services.peers import PeerService
from controlplane.services.traffic import TrafficService
from ferry.errors import FerryError, InvalidArgument
from ferry.grpcutil import chunks_within
from ferry.v1 import admin_pb2

BATCH_ROWS = 1000
BATCH_BYTES = 1 << 20  # and at most this many serialized bytes of rows a message (at least one row)


class TrafficRpcs:
    """``ExportTraffic`` over the leader's traffic store."""

    def __init__(self, traffic: TrafficService, peers: PeerService, *, wall: Callable[[], float]) -> None:
        self._traffic = traffic
        self._peers = peers
        self._wall = wall

    def _not_leading(self) -> str:
        cluster = self._peers.cluster
        leader = cluster.election.leader if cluster is not None else None
        known = f"; ask the leader {leader.id} at {leader.address}" if leader is not None else "; no leader is known"
        return f"control plane {self._peers.settings.id!r} does not lead: the recorded traffic is the leader's{known}"

    async def ExportTraffic(self, request: admin_pb2.ExportTrafficRequest, context: Any) -> None:
        settings = self._traffic.settings
        try:
            if not self._peers.leading:
                raise FailedPrecondition(self._not_leading())
            if not (math.isfinite(request.since_seconds) and request.since_seconds > 0):
                raise InvalidArgument("since_seconds", "must be a positive number of seconds")
            validate.check_filter(request.model, "model", settings.max_name_bytes)
        except FerryError as exc:
            await abort(context, exc)
        limit = min(request.max_rows or settings.traffic_export_max_rows, settings.traffic_export_max_rows)
        reader = self._traffic.store.reader(self._wall() - request.since_seconds, request.model)
        sent, dropped, truncated = 0, 0, False
        while not truncated:
            chunk = await asyncio.to_thread(reader.next_chunk)
            if chunk is None:
                break
            dropped += chunk.dropped
            rows = chunk.rows
            if sent + len(rows) > limit:
                rows, truncated = rows[:limit - sent], True
            for batch in chunks_within(rows, max_rows=BATCH_ROWS, max_bytes=BATCH_BYTES):
                await context.write(admin_pb2.ExportTrafficBatch(rows=batch))
            sent += len(rows)
        await context.write(admin_pb2.ExportTrafficBatch(dropped=dropped, truncated=truncated))
