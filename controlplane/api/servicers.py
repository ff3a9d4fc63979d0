"""gRPC servicers of ``ferry.v1.Fleet``, ``Tables`` and ``Admin``: translation only.

Each servicer holds the services it calls (:mod:`controlplane.services.fleet`,
:mod:`controlplane.services.tables`, ...) and turns wire messages into calls
on them and their answers into wire messages; a
:class:`ferry.errors.FerryError` becomes its status in one place,
:mod:`controlplane.api.status`. Policy lives in the services and the pure
modules below them. ``Fleet.Connect`` hands each telemetry message's engine
samples to :class:`controlplane.services.engines.EngineService`.

``Admin`` has no RPC of its own: :class:`AdminServicer` is composed from the
handlers of each concern (:mod:`controlplane.api.fleet`, ``.tables``,
``.cluster``, ``.usage``, ``.tenants``, ``.rollout``, ``.router``,
``.scaling``, ``.engines``, ``.traffic``), each defining the RPCs of its
concern under their ``Admin`` names.

Bidirectional streams (``Fleet.Connect``, ``Tables.Watch``, and
``Admin.Follow`` in :mod:`controlplane.api.cluster`) read the first message
within ``first_message_seconds`` (it must be ``register``, ``subscribe`` or a
report: INVALID_ARGUMENT otherwise), then run a reader task beside a writer
loop (:mod:`controlplane.api.streams`): the reader applies telemetry, acks or
reports, the writer sends commands or tables as they come. The stream ends OK
when the peer half-closes; with the reader's error when a message is bad;
ABORTED when the same node or proxy opens another stream; UNAVAILABLE when
the control plane stops or, for ``Follow``, when it does not or no longer
leads (the message names the leader it knows).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import grpc

from controlplane.api.join import JoinCheck
from controlplane.api.status import abort, serve
from controlplane.api.streams import body_error, duplex, first_message
from controlplane.errors import Aborted
from controlplane.fleet.agents import AgentSession
from controlplane.fleet.telemetry import TelemetryRate
from controlplane.metrics import Metrics
from controlplane.services.engines import EngineService
from controlplane.services.fleet import FleetService
from controlplane.services.tables import TableService
from controlplane.tables.watchers import Send
from ferry.errors import InvalidArgument, Overloaded, Unauthenticated, Unavailable
from ferry.tls import peer_common_name
from ferry.v1 import admin_pb2, admin_pb2_grpc, fleet_pb2, fleet_pb2_grpc, tables_pb2, tables_pb2_grpc


class FleetServicer(fleet_pb2_grpc.FleetServicer):
    """``Fleet.Connect``: one stream per agent."""

    def __init__(self, fleet: FleetService, metrics: Metrics, join_check: JoinCheck | None = None, *,
                 engines: EngineService | None = None) -> None:
        self._fleet = fleet
        self._metrics = metrics
        self._join_check = join_check or JoinCheck()
        self._engines = engines

    async def Connect(self, request_iterator: AsyncIterator[fleet_pb2.AgentMessage], context: Any) -> None:
        try:
            self._fleet.open_stream()
        except Overloaded as exc:
            await abort(context, exc)
        try:
            await serve(context, self._connect(request_iterator.__aiter__(), context))
        finally:
            self._fleet.close_stream()

    async def _connect(self, stream: AsyncIterator[fleet_pb2.AgentMessage], context: Any) -> None:
        settings = self._fleet.settings
        first = await first_message(stream, "register", settings.first_message_seconds)
        if first is None:
            return
        if first.WhichOneof("body") != "register":
            self._metrics.reject("first_message")
            got = first.WhichOneof("body") or "an empty message"
            raise InvalidArgument("register", f"the first message must be register, got {got}")
        try:
            self._join_check.check(first.register.join_token, peer_common_name(context))
        except Unauthenticated:
            self._metrics.reject("register_unauthenticated")
            raise
        session = await self._fleet.register(first.register)
        try:
            await context.write(fleet_pb2.ControlMessage(registered=fleet_pb2.Registered(
                control_plane_id=settings.id, telemetry_interval_seconds=settings.telemetry_interval_seconds,
                grace_seconds=settings.grace_seconds,
            )))

            async def write(command: fleet_pb2.Command) -> None:
                await context.write(fleet_pb2.ControlMessage(command=command))

            closed = await duplex(self._read(stream, session), session.next_command, write)
        finally:
            self._fleet.disconnect(session)
        if closed:
            raise (Unavailable if self._fleet.stopping else Aborted)(session.closed_reason or "closed")

    async def _read(self, stream: AsyncIterator[fleet_pb2.AgentMessage], session: AgentSession) -> None:
        rate = TelemetryRate(clock=time.monotonic)
        async for message in stream:
            kind = message.WhichOneof("body")
            if kind == "telemetry":
                try:
                    rate.take()
                except Overloaded:
                    self._metrics.reject("telemetry_rate")
                    raise
                if self._engines is None:
                    await self._fleet.telemetry(session, message.telemetry)
                    continue
                samples = self._engines.take(message.telemetry)  # checked, out of the loads
                await self._fleet.telemetry(session, message.telemetry)
                self._engines.record(session.node, session.member.replicas, samples)
            elif kind == "result":
                self._fleet.command_result(session, message.result)
            else:
                self._metrics.reject("message_body")
                raise body_error(kind, "register")


def add_tables_servicer(servicer: TablesServicer, server: grpc.aio.Server) -> None:
    """Register ``Tables`` with a Watch handler that writes bytes as they are (the tables are serialized once
    for every proxy, :mod:`controlplane.tables.feed`); the wire is the generated service's."""
    handler = grpc.stream_stream_rpc_method_handler(
        servicer.Watch, request_deserializer=tables_pb2.WatchRequest.FromString, response_serializer=None)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("ferry.v1.Tables", {"Watch": handler}),))


class TablesServicer(tables_pb2_grpc.TablesServicer):
    """``Tables.Watch``: one stream per proxy; it writes the bytes of :class:`controlplane.tables.watchers.Send`
    (register it with :func:`add_tables_servicer`)."""

    def __init__(self, tables: TableService, metrics: Metrics) -> None:
        self._tables = tables
        self._metrics = metrics

    async def Watch(self, request_iterator: AsyncIterator[tables_pb2.WatchRequest], context: Any) -> None:
        await serve(context, self._watch(request_iterator.__aiter__(), context))

    async def _watch(self, stream: AsyncIterator[tables_pb2.WatchRequest], context: Any) -> None:
        tables = self._tables
        first = await first_message(stream, "subscribe", tables.settings.first_message_seconds)
        if first is None:
            return
        if first.WhichOneof("body") != "subscribe":
            self._metrics.reject("first_message")
            got = first.WhichOneof("body") or "an empty message"
            raise InvalidArgument("subscribe", f"the first message must be subscribe, got {got}")
        watcher = tables.subscribe(first.subscribe)

        async def write(send: Send) -> None:
            await context.write(send.data)  # a serialized TableSnapshot, its nonce included
            tables.pushed(watcher)

        async def read() -> None:
            async for message in stream:
                kind = message.WhichOneof("body")
                if kind == "report":  # the proxy's usage (controlplane.tables.usage)
                    tables.proxy_report(watcher, message.report)
                    continue
                if kind != "ack":
                    self._metrics.reject("message_body")
                    raise body_error(kind, "subscribe")
                tables.ack(watcher, message.ack)

        try:
            closed = await duplex(read(), watcher.next, write)
        finally:
            tables.unsubscribe(watcher)
        if closed:
            raise (Unavailable if tables.stopping else Aborted)(watcher.closed_reason or "closed")


class AdminServicer(admin_pb2_grpc.AdminServicer):
    """The operator API, composed from the handlers of each concern (no RPC of its own).

    Every ``Admin`` RPC of the service descriptor is served by the one handler that defines a method of its
    name, bound here as it is: a handler missing or two handlers for one RPC is a ``ValueError`` at start.
    """

    def __init__(self, *handlers: object) -> None:
        names = admin_pb2.DESCRIPTOR.services_by_name["Admin"].methods_by_name
        owners: dict[str, str] = {}
        for handler in handlers:
            for name in names:
                method = getattr(handler, name, None)
                if not callable(method):
                    continue
                if name in owners:
                    raise ValueError(f"Admin.{name}: served by both {owners[name]} and {type(handler).__name__}")
                owners[name] = type(handler).__name__
                setattr(self, name, method)
        missing = sorted(set(names) - set(owners))
        if missing:
            raise ValueError(f"Admin RPCs without a handler: {', '.join(missing)}")
        self.owners = owners  # RPC name -> the handler class that serves it
