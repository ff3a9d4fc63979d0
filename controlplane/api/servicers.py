"""gRPC servicers of ``ferry.v1.Fleet``, ``Tables`` and ``Admin``: translation only.

Each servicer holds the services it calls (:mod:`controlplane.services.fleet`,
:mod:`controlplane.services.tables`, :mod:`controlplane.services.peers`, ...) and
turns wire messages into calls on them and their answers into wire messages;
a :class:`ferry.errors.FerryError` becomes the status chosen by
:func:`ferry.grpcutil.status_for`, with the message naming the field. Policy
lives in the services and the pure modules below them. ``Admin`` routes
nodes, models and allocations to :class:`controlplane.api.fleet.FleetRpcs`,
usage to :class:`controlplane.api.usage.UsageRpcs`, tenants to
:class:`controlplane.api.tenants.TenantRpcs`, rollouts to
:class:`controlplane.api.rollout.RolloutRpcs` and engine fits to
:class:`controlplane.api.engines.EngineRpcs`. ``Fleet.Connect`` hands each
telemetry message's engine samples to :class:`controlplane.services.engines.EngineService`.

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

from controlplane.api.engines import EngineRpcs
from controlplane.api.fleet import FleetRpcs
from controlplane.api.join import Admission
from controlplane.api.rollout import RolloutRpcs
from controlplane.api.router import RouterRpcs
from controlplane.api.tenants import TenantRpcs
from controlplane.api.traffic import TrafficRpcs
from controlplane.api.usage import UsageRpcs
from controlplane.fleet.agents import AgentSession
from controlplane.fleet.telemetry import TelemetryRate
from controlplane.metrics import Metrics
from controlplane.services.engines import EngineService
from controlplane.services.fleet import FleetService
from controlplane.services.peers import PeerService
from controlplane.services.status import StatusService
from controlplane.services.tables import TableService
from controlplane.tables.watchers import Send
from ferry.errors import DeadlineExceeded, FerryError, InvalidArgument, Overloaded, Unauthenticated, Unavailable
from ferry.grpcutil import answer, status_for
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

    def __init__(self, fleet: FleetService, metrics: Metrics, admission: Admission | None = None, *,
                 engines: EngineService | None = None) -> None:
        self._fleet = fleet
        self._metrics = metrics
        self._admission = admission or Admission()
        self._engines = engines

    async def Connect(self, request_iterator: AsyncIterator[fleet_pb2.AgentMessage], context: Any) -> None:
        try:
            self._fleet.open_stream()
        except Overloaded as exc:
            await context.abort(status_for(exc), str(exc))
            return
        try:
            await self._connect(request_iterator.__aiter__(), context)
        except FerryError as exc:
            await context.abort(status_for(exc), str(exc))
        finally:
            self._fleet.close_stream()

    async def _connect(self, stream: AsyncIterator[fleet_pb2.AgentMessage], context: Any) -> None:
        settings = self._fleet.settings
        first = await _first(stream, "register", settings.first_message_seconds)
        if first is None:
            return
        if first.WhichOneof("body") != "register":
            self._metrics.reject("first_message")
            got = first.WhichOneof("body") or "an empty message"
            raise InvalidArgument("register", f"the first message must be register, got {got}")
        try:
            self._admission.check(first.register.join_token, peer_common_name(context))
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

            closed = await _duplex(self._read(stream, session), session.next_command, write)
        finally:
            self._fleet.disconnect(session)
        if closed:
            code = grpc.StatusCode.UNAVAILABLE if self._fleet.stopping else grpc.StatusCode.ABORTED
            await context.abort(code, session.closed_reason or "closed")

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
                raise _body_error(kind, "register")


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
        try:
            await self._watch(request_iterator.__aiter__(), context)
        except FerryError as exc:
            await context.abort(status_for(exc), str(exc))

    async def _watch(self, stream: AsyncIterator[tables_pb2.WatchRequest], context: Any) -> None:
        tables = self._tables
        first = await _first(stream, "subscribe", tables.settings.first_message_seconds)
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
                    raise _body_error(kind, "subscribe")
                tables.ack(watcher, message.ack)

        try:
            closed = await _duplex(read(), watcher.next, write)
        finally:
            tables.unsubscribe(watcher)
        if closed:
            code = grpc.StatusCode.UNAVAILABLE if tables.stopping else grpc.StatusCode.ABORTED
            await context.abort(code, watcher.closed_reason or "closed")


class AdminServicer(admin_pb2_grpc.AdminServicer):
    """The operator API: replicas, drains, tables, status and ``Follow`` here; the rest routed to its handlers."""

    def __init__(
        self,
        *,
        fleet: FleetService,
        tables: TableService,
        peers: PeerService,
        status: StatusService,
        fleet_rpcs: FleetRpcs,
        usage_rpcs: UsageRpcs,
        tenant_rpcs: TenantRpcs,
        rollout_rpcs: RolloutRpcs,
        scale: Callable[[admin_pb2.GetScaleRequest], admin_pb2.GetScaleResponse] | None = None,
        traffic_rpcs: TrafficRpcs | None = None,
        router_rpcs: RouterRpcs | None = None,
        engine_rpcs: EngineRpcs | None = None,
    ) -> None:
        self._traffic_rpcs = traffic_rpcs  # ExportTraffic (controlplane.api.traffic)
        self._router_rpcs = router_rpcs  # router config rollouts (controlplane.api.router)
        self._fleet = fleet
        self._tables = tables
        self._peers = peers
        self._status = status
        self._fleet_rpcs = fleet_rpcs
        self._usage_rpcs = usage_rpcs
        self._tenant_rpcs = tenant_rpcs
        self._rollout_rpcs = rollout_rpcs
        self._scale = scale
        self._engine_rpcs = engine_rpcs

    async def ListReplicas(
        self, request: admin_pb2.ListReplicasRequest, context: Any,
    ) -> admin_pb2.ListReplicasResponse:
        try:
            return admin_pb2.ListReplicasResponse(replicas=self._fleet.list_replicas(request.model, request.region))
        except FerryError as exc:
            await context.abort(status_for(exc), str(exc))
            raise  # abort raises; this line is for the type checker

    async def GetTable(self, request: admin_pb2.GetTableRequest, context: Any) -> admin_pb2.GetTableResponse:
        try:
            return self._tables.get_table(request.region)
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
            return admin_pb2.DrainResponse(replica=await self._fleet.set_drain(request.replica_id, drain))
        except FerryError as exc:
            await context.abort(status_for(exc), str(exc))
            raise

    async def GetStatus(self, request: admin_pb2.GetStatusRequest, context: Any) -> admin_pb2.GetStatusResponse:
        return self._status.status()

    async def Follow(self, request_iterator: AsyncIterator[admin_pb2.FollowerReport], context: Any) -> None:
        try:
            await self._follow(request_iterator.__aiter__(), context)
        except FerryError as exc:
            await context.abort(status_for(exc), str(exc))

    async def _follow(self, stream: AsyncIterator[admin_pb2.FollowerReport], context: Any) -> None:
        peers = self._peers
        first = await _first(stream, "report", peers.settings.first_message_seconds)
        if first is None:
            return
        session = peers.follow_open(first)

        async def write(snapshot: tables_pb2.TableSnapshot) -> None:
            await context.write(admin_pb2.LeaderUpdate(leader_id=peers.settings.id, table=snapshot))

        async def read() -> None:
            async for report in stream:
                peers.follow_report(session, report)

        try:
            closed = await _duplex(read(), session.next, write)
        finally:
            peers.follow_close(session)
        if closed:
            await context.abort(grpc.StatusCode.UNAVAILABLE, session.closed_reason or "closed")

    # -- routed: nodes, models, diffs, allocations (controlplane.api.fleet)

    async def ListNodes(self, request: admin_pb2.ListNodesRequest, context: Any) -> admin_pb2.ListNodesResponse:
        return await self._fleet_rpcs.ListNodes(request, context)

    async def Cordon(self, request: admin_pb2.CordonRequest, context: Any) -> admin_pb2.CordonResponse:
        return await self._fleet_rpcs.Cordon(request, context)

    async def Uncordon(self, request: admin_pb2.CordonRequest, context: Any) -> admin_pb2.CordonResponse:
        return await self._fleet_rpcs.Uncordon(request, context)

    async def ListModels(self, request: admin_pb2.ListModelsRequest, context: Any) -> admin_pb2.ListModelsResponse:
        return await self._fleet_rpcs.ListModels(request, context)

    async def DiffTable(self, request: admin_pb2.DiffTableRequest, context: Any) -> admin_pb2.DiffTableResponse:
        return await self._fleet_rpcs.DiffTable(request, context)

    async def Allocate(self, request: admin_pb2.AllocateRequest, context: Any) -> admin_pb2.AllocateResponse:
        return await self._fleet_rpcs.Allocate(request, context)

    async def ListAllocations(
        self, request: admin_pb2.ListAllocationsRequest, context: Any,
    ) -> admin_pb2.ListAllocationsResponse:
        return await self._fleet_rpcs.ListAllocations(request, context)

    async def Release(self, request: admin_pb2.ReleaseRequest, context: Any) -> admin_pb2.ReleaseResponse:
        return await self._fleet_rpcs.Release(request, context)

    # -- routed: usage, tiers, spill (controlplane.api.usage)

    async def GetUsage(self, request: admin_pb2.GetUsageRequest, context: Any) -> admin_pb2.GetUsageResponse:
        return await self._usage_rpcs.GetUsage(request, context)

    async def GetTiers(self, request: admin_pb2.GetTiersRequest, context: Any) -> admin_pb2.GetTiersResponse:
        return await self._usage_rpcs.GetTiers(request, context)

    async def GetSpill(self, request: admin_pb2.GetSpillRequest, context: Any) -> admin_pb2.GetSpillResponse:
        return await self._usage_rpcs.GetSpill(request, context)

    async def GetCache(self, request: admin_pb2.GetCacheRequest, context: Any) -> admin_pb2.GetCacheResponse:
        return await self._usage_rpcs.GetCache(request, context)

    # -- routed: tenants (controlplane.api.tenants)

    async def ListTenants(
        self, request: admin_pb2.ListTenantsRequest, context: Any,
    ) -> admin_pb2.ListTenantsResponse:
        return await self._tenant_rpcs.ListTenants(request, context)

    async def PutTenant(self, request: admin_pb2.PutTenantRequest, context: Any) -> admin_pb2.PutTenantResponse:
        return await self._tenant_rpcs.PutTenant(request, context)

    async def DeleteTenant(
        self, request: admin_pb2.DeleteTenantRequest, context: Any,
    ) -> admin_pb2.DeleteTenantResponse:
        return await self._tenant_rpcs.DeleteTenant(request, context)

    # -- routed: rollouts (controlplane.api.rollout)

    async def Rollout(self, request: admin_pb2.RolloutRequest, context: Any) -> admin_pb2.RolloutResponse:
        return await self._rollout_rpcs.Rollout(request, context)

    async def ListRollouts(
        self, request: admin_pb2.ListRolloutsRequest, context: Any,
    ) -> admin_pb2.ListRolloutsResponse:
        return await self._rollout_rpcs.ListRollouts(request, context)

    async def GetScale(self, request: admin_pb2.GetScaleRequest, context: Any) -> admin_pb2.GetScaleResponse:
        """The scaling plan (controlplane.services.scaling): translation only."""
        def call() -> admin_pb2.GetScaleResponse:
            if self._scale is None:
                raise Unavailable("no scaling plan on this control plane")
            return self._scale(request)
        return await answer(context, call)

    async def ExportTraffic(self, request: admin_pb2.ExportTrafficRequest, context: Any) -> None:
        """The recorded traffic, in batches (controlplane.api.traffic)."""
        if self._traffic_rpcs is None:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "no traffic store on this control plane")
            return
        await self._traffic_rpcs.ExportTraffic(request, context)

    # -- routed: router config rollouts (controlplane.api.router)

    async def RouterRollout(self, request: admin_pb2.RouterRolloutRequest,
                            context: Any) -> admin_pb2.RouterRolloutResponse:
        assert self._router_rpcs is not None
        return await self._router_rpcs.RouterRollout(request, context)

    async def GetRouter(self, request: admin_pb2.GetRouterRequest, context: Any) -> admin_pb2.GetRouterResponse:
        assert self._router_rpcs is not None
        return await self._router_rpcs.GetRouter(request, context)

    async def RouterDecide(self, request: admin_pb2.RouterDecideRequest,
                           context: Any) -> admin_pb2.RouterDecideResponse:
        assert self._router_rpcs is not None
        return await self._router_rpcs.RouterDecide(request, context)

    async def GetEngines(self, request: admin_pb2.GetEnginesRequest, context: Any) -> admin_pb2.GetEnginesResponse:
        """Engine fits (controlplane.api.engines)."""
        if self._engine_rpcs is None:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "no engine fits on this control plane")
        assert self._engine_rpcs is not None
        return await self._engine_rpcs.GetEngines(request, context)
