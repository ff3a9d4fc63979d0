"""gRPC servicers of ``ferry.v1.Fleet``, ``Tables`` and ``Admin``: translation only.

Each handler turns wire messages into calls on :class:`Controller` and its
answers into wire messages; a :class:`ferry.errors.FerryError` becomes the
status chosen by :func:`ferry.grpcutil.status_for`, with the message naming
the field. Policy lives in the controller and the pure modules below it.

Bidirectional streams (``Fleet.Connect``, ``Tables.Watch``, ``Admin.Follow``)
read the first message within ``first_message_seconds`` (it must be
``register``, ``subscribe`` or a report: INVALID_ARGUMENT otherwise), then run
a reader task beside a writer loop: the reader applies telemetry, acks or
reports, the writer sends commands or tables as they come. The stream ends OK
when the peer half-closes; with the reader's error when a message is bad;
ABORTED when the same node or proxy opens another stream; UNAVAILABLE when
the control plane stops or, for ``Follow``, when it does not or no longer
leads (the message names the leader it knows).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc

from controlplane.adminrpc import FleetRpcs
from controlplane.admission import Admission
from controlplane.agents import AgentSession
from controlplane.controller import Controller
from controlplane.rolloutrpc import RolloutRpcs
from controlplane.telemetry_check import TelemetryRate
from controlplane.tenantrpc import TenantRpcs
from controlplane.usagerpc import UsageRpcs
from ferry.errors import DeadlineExceeded, FerryError, InvalidArgument, Overloaded, Unauthenticated
from ferry.grpcutil import status_for
from ferry.tasks import cancel_and_wait
from ferry.tls import peer_common_name
from ferry.v1 import admin_pb2, admin_pb2_grpc, fleet_pb2, fleet_pb2_grpc, tables_pb2, tables_pb2_grpc

T = TypeVar("T")
M = TypeVar("M")


async def _first(stream: AsyncIterator[M], expected: str, seconds: float) -> M | None:
    """The stream's first message; None when the peer closed without one."""
    try:
        async with asyncio.timeout(seconds):
            return await anext(stream)
    except StopAsyncIteration:
        return None
    except TimeoutError as exc:
        raise DeadlineExceeded(f"{expected}: no first message within {seconds:g} s") from exc


async def _duplex(
    reader: Awaitable[None], next_out: Callable[[], Awaitable[T | None]], write: Callable[[T], Awaitable[None]],
) -> bool:
    """Run ``reader`` while writing what ``next_out`` gives; True when ``next_out`` ended it (closed)."""
    read_task = asyncio.ensure_future(reader)
    try:
        while not read_task.done():
            out_task = asyncio.ensure_future(next_out())
            await asyncio.wait({read_task, out_task}, return_when=asyncio.FIRST_COMPLETED)
            if not out_task.done():
                out_task.cancel()
                break
            item = out_task.result()
            if item is None:
                return True
            await write(item)
        read_task.result()  # the reader's error, if any
        return False
    finally:
        if not read_task.done():
            await cancel_and_wait([read_task])


def _body_error(kind: str | None, first: str) -> InvalidArgument:
    if kind is None:
        return InvalidArgument("body", "empty message")
    return InvalidArgument(kind, f"only the first message of a stream may be {first}")


class FleetServicer(fleet_pb2_grpc.FleetServicer):
    """``Fleet.Connect``: one stream per agent."""

    def __init__(self, controller: Controller, admission: Admission | None = None) -> None:
        self._c = controller
        self._admission = admission or Admission()

    async def Connect(self, request_iterator: AsyncIterator[fleet_pb2.AgentMessage], context: Any) -> None:
        try:
            self._c.agents.open_stream()
        except Overloaded as exc:
            self._c.reject("agents_limit")
            await context.abort(status_for(exc), str(exc))
            return
        try:
            await self._connect(request_iterator.__aiter__(), context)
        except FerryError as exc:
            await context.abort(status_for(exc), str(exc))
        finally:
            self._c.agents.close_stream()

    async def _connect(self, stream: AsyncIterator[fleet_pb2.AgentMessage], context: Any) -> None:
        first = await _first(stream, "register", self._c.settings.first_message_seconds)
        if first is None:
            return
        if first.WhichOneof("body") != "register":
            self._c.reject("first_message")
            got = first.WhichOneof("body") or "an empty message"
            raise InvalidArgument("register", f"the first message must be register, got {got}")
        try:
            self._admission.check(first.register.join_token, peer_common_name(context))
        except Unauthenticated:
            self._c.reject("register_unauthenticated")
            raise
        session = self._c.register(first.register)
        settings = self._c.settings
        try:
            await context.write(fleet_pb2.ControlMessage(registered=fleet_pb2.Registered(
                control_plane_id=settings.id, telemetry_interval_seconds=settings.telemetry_interval_seconds,
                grace_seconds=settings.grace_seconds,
            )))

            async def write(command: fleet_pb2.Command) -> None:
                await context.write(fleet_pb2.ControlMessage(command=command))

            closed = await _duplex(self._read(stream, session), session.next_command, write)
        finally:
            self._c.disconnect(session)
        if closed:
            code = grpc.StatusCode.UNAVAILABLE if self._c.stopping else grpc.StatusCode.ABORTED
            await context.abort(code, session.closed_reason or "closed")

    async def _read(self, stream: AsyncIterator[fleet_pb2.AgentMessage], session: AgentSession) -> None:
        rate = TelemetryRate(clock=time.monotonic)
        async for message in stream:
            kind = message.WhichOneof("body")
            if kind == "telemetry":
                try:
                    rate.take()
                except Overloaded:
                    self._c.reject("telemetry_rate")
                    raise
                self._c.telemetry(session, message.telemetry)
            elif kind == "result":
                self._c.command_result(session, message.result)
            else:
                self._c.reject("message_body")
                raise _body_error(kind, "register")


class TablesServicer(tables_pb2_grpc.TablesServicer):
    """``Tables.Watch``: one stream per proxy."""

    def __init__(self, controller: Controller) -> None:
        self._c = controller

    async def Watch(self, request_iterator: AsyncIterator[tables_pb2.WatchRequest], context: Any) -> None:
        try:
            await self._watch(request_iterator.__aiter__(), context)
        except FerryError as exc:
            await context.abort(status_for(exc), str(exc))

    async def _watch(self, stream: AsyncIterator[tables_pb2.WatchRequest], context: Any) -> None:
        first = await _first(stream, "subscribe", self._c.settings.first_message_seconds)
        if first is None:
            return
        if first.WhichOneof("body") != "subscribe":
            self._c.reject("first_message")
            got = first.WhichOneof("body") or "an empty message"
            raise InvalidArgument("subscribe", f"the first message must be subscribe, got {got}")
        watcher = self._c.subscribe(first.subscribe)

        async def write(snapshot: tables_pb2.TableSnapshot) -> None:
            await context.write(snapshot)
            self._c.pushed(watcher)

        async def read() -> None:
            async for message in stream:
                kind = message.WhichOneof("body")
                if kind == "report":  # the proxy's usage (controlplane.usage)
                    self._c.proxy_report(watcher, message.report)
                    continue
                if kind != "ack":
                    self._c.reject("message_body")
                    raise _body_error(kind, "subscribe")
                self._c.ack(watcher, message.ack)

        try:
            closed = await _duplex(read(), watcher.next, write)
        finally:
            self._c.unsubscribe(watcher)
        if closed:
            code = grpc.StatusCode.UNAVAILABLE if self._c.stopping else grpc.StatusCode.ABORTED
            await context.abort(code, watcher.closed_reason or "closed")


class AdminServicer(UsageRpcs, FleetRpcs, TenantRpcs, RolloutRpcs, admin_pb2_grpc.AdminServicer):
    """The operator API (nodes, models, allocations: :mod:`controlplane.adminrpc`), and ``Follow``."""

    def __init__(self, controller: Controller) -> None:
        self._c = controller

    async def ListReplicas(
        self, request: admin_pb2.ListReplicasRequest, context: Any,
    ) -> admin_pb2.ListReplicasResponse:
        try:
            return admin_pb2.ListReplicasResponse(replicas=self._c.list_replicas(request.model, request.region))
        except FerryError as exc:
            await context.abort(status_for(exc), str(exc))
            raise  # abort raises; this line is for the type checker

    async def GetTable(self, request: admin_pb2.GetTableRequest, context: Any) -> admin_pb2.GetTableResponse:
        try:
            return self._c.get_table(request.region)
        except FerryError as exc:
            await context.abort(status_for(exc), str(exc))
            raise

    async def Drain(self, request: admin_pb2.DrainRequest, context: Any) -> admin_pb2.DrainResponse:
        return await self._set_drain(request, context, drain=True)

    async def Undrain(self, request: admin_pb2.DrainRequest, context: Any) -> admin_pb2.DrainResponse:
        return await self._set_drain(request, context, drain=False)

    async def _set_drain(
        self, request: admin_pb2.DrainRequest, context: Any, *, drain: bool,
    ) -> admin_pb2.DrainResponse:
        try:
            return admin_pb2.DrainResponse(replica=await self._c.set_drain(request.replica_id, drain))
        except FerryError as exc:
            await context.abort(status_for(exc), str(exc))
            raise

    async def GetStatus(self, request: admin_pb2.GetStatusRequest, context: Any) -> admin_pb2.GetStatusResponse:
        return self._c.status()

    async def Follow(self, request_iterator: AsyncIterator[admin_pb2.FollowerReport], context: Any) -> None:
        try:
            await self._follow(request_iterator.__aiter__(), context)
        except FerryError as exc:
            await context.abort(status_for(exc), str(exc))

    async def _follow(self, stream: AsyncIterator[admin_pb2.FollowerReport], context: Any) -> None:
        first = await _first(stream, "report", self._c.settings.first_message_seconds)
        if first is None:
            return
        session = self._c.follow_open(first)

        async def write(snapshot: tables_pb2.TableSnapshot) -> None:
            await context.write(admin_pb2.LeaderUpdate(leader_id=self._c.settings.id, table=snapshot))

        async def read() -> None:
            async for report in stream:
                self._c.follow_report(session, report)

        try:
            closed = await _duplex(read(), session.next, write)
        finally:
            self._c.follow_close(session)
        if closed:
            await context.abort(grpc.StatusCode.UNAVAILABLE, session.closed_reason or "closed")
