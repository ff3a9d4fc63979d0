"""A follower's stream to the leader: reports up every tick, tables down as they are published.

:class:`LeaderLink` runs while this control plane follows: it opens
``Admin.Follow`` on the leader named by the election key, sends a
``FollowerReport`` at once and then every ``interval`` seconds (the tick:
one message per follower per tick, whatever the number of replicas), and
hands every ``LeaderUpdate`` table to ``adopt``. It closes the stream as soon
as the leader changes or this control plane leads (checked at each report and
on :meth:`wake`), presents the admin token (``metadata``), and after a failure waits a
:class:`ferry.backoff.Backoff` (0.1 s doubling to ``backoff_max_seconds``, 1 s, jittered) before it tries
again. Reports travel over gRPC, not through the store: the store's write
rate does not grow with the fleet, and telemetry keeps flowing while the
store is away.

Cost: one report of O(replicas held here) per tick; O(1) per table received
besides ``adopt``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable

import grpc

from controlplane.cluster.election import PlaneInfo
from ferry.backoff import Backoff
from ferry.grpcutil import StreamWriter, channel_options
from ferry.tls import TLSConfig
from ferry.tls import channel as tls_channel
from ferry.v1 import admin_pb2, admin_pb2_grpc, tables_pb2

log = logging.getLogger(__name__)


class LeaderLink:
    """Follows the leader ``leader()`` names, unless it is this control plane (``cp_id``)."""

    def __init__(
        self,
        *,
        cp_id: str,
        leader: Callable[[], PlaneInfo | None],
        report: Callable[[], admin_pb2.FollowerReport],
        adopt: Callable[[tables_pb2.TableSnapshot], None],
        interval: float,
        backoff_max_seconds: float = 1.0,
        metadata: tuple[tuple[str, str], ...] = (),
        tls: TLSConfig | None = None,
        tls_name: str = "",
        rng: random.Random | None = None,
    ) -> None:
        self._tls = tls
        self._tls_name = tls_name  # under TLS, the name the leader's certificate is checked against ("": its host)
        self._id = cp_id
        self._leader = leader
        self._report = report
        self._adopt = adopt
        self._interval = interval
        self._backoff = Backoff(0.1, backoff_max_seconds, rng=rng)
        self._metadata = metadata  # the admin token: Follow is an Admin call
        self._wake = asyncio.Event()
        self.following: PlaneInfo | None = None  # the leader a stream is open to

    def wake(self) -> None:
        """The leader may have changed: look again now."""
        self._wake.set()

    def _target(self) -> PlaneInfo | None:
        leader = self._leader()
        return leader if leader is not None and leader.id != self._id and leader.address else None

    async def run(self) -> None:
        failed: PlaneInfo | None = None  # the target of the last failure, logged once at INFO
        while True:
            target = self._target()
            if target is None:
                await self._sleep(self._interval)
                continue
            try:
                await self._follow(target)
                failed = None
                self._backoff.reset()
            except grpc.aio.AioRpcError as exc:
                level = logging.DEBUG if failed == target else logging.INFO
                log.log(level, "follow %s at %s: %s %s", target.id, target.address, exc.code().name, exc.details())
                failed = target
            finally:
                self.following = None
            if self._target() == target:  # still the same leader: back off before trying again
                await self._sleep(self._backoff.next_delay())

    async def _sleep(self, seconds: float) -> None:
        self._wake.clear()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._wake.wait()

    async def _follow(self, target: PlaneInfo) -> None:
        options = channel_options()
        if self._tls is not None and self._tls_name:  # the leader's certificate names this, not its pod IP
            options.append(("grpc.ssl_target_name_override", self._tls_name))
        async with tls_channel(target.address, self._tls, options=options) as channel:
            call = admin_pb2_grpc.AdminStub(channel).Follow(metadata=self._metadata)
            reader = asyncio.ensure_future(self._read(call))
            writer = StreamWriter(call, reader)
            try:
                while self._target() == target and not reader.done():
                    if not await writer.write(self._report()):
                        await asyncio.wait({reader}, timeout=1.0)  # the call ended: its reader says why
                        break
                    self.following = target
                    self._wake.clear()
                    waker = asyncio.ensure_future(self._wake.wait())
                    await asyncio.wait({reader, waker}, timeout=self._interval, return_when=asyncio.FIRST_COMPLETED)
                    waker.cancel()
                if reader.done():
                    reader.result()  # the stream's error, if any
            finally:
                reader.cancel()
                await asyncio.wait({reader})  # waited, not awaited: this task's own cancellation is not swallowed
                if not reader.cancelled():
                    reader.exception()  # retrieved; raised above when it ended the stream
                call.cancel()

    async def _read(self, call: grpc.aio.StreamStreamCall) -> None:
        while True:
            update = await call.read()
            if update is grpc.aio.EOF:
                return
            self._adopt(update.table)
