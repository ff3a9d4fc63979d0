"""One control plane in a process: store, controller (its services), servicers and a gRPC server, wired.

:class:`ControlPlane` is what ``ferry controlplane`` runs and what tests start
in-process: ``await cp.start("127.0.0.1:0")`` returns the bound port once the
intent is synced from the store and the first tables are computed; ``await
cp.stop()`` closes every agent and proxy stream (UNAVAILABLE), stops the loop
and the server. Nothing is global: the store (default: a fresh
:class:`MemoryStore` on the same clock), the clocks and the metrics registry
(default: a fresh one) are injected, so several control planes can share a
process and a store. With ``elect=True`` (every etcd-backed control plane) it
joins the election once its server is bound, advertising ``advertise``
(default: the bound ``host:port``) to the other control planes. Every call of
the ``Admin`` service must carry the admin token of ``admin_auth``
(:mod:`controlplane.api.auth`; default: none, so the Admin API refuses
everything); a follower presents it to the leader on ``Admin.Follow``.
With ``tls`` (:mod:`ferry.tls`) the port is mutual TLS and a client
certificate with common name ``admin`` also opens the Admin API; agents are
admitted by ``join_check`` (:mod:`controlplane.api.join`: join token or
certificate common name ``agent``).

Readiness (:mod:`ferry.readiness`): the gRPC health is SERVING only while
:func:`ready` holds (the store's last calls succeeded and a leader is known:
itself when alone), looked at every ``tick_seconds``; so it turns
NOT_SERVING when the store becomes unreachable, and back.
``await cp.drain()`` is the stop on SIGTERM: NOT_SERVING, serving on for
``drain_delay_seconds``, then :meth:`ControlPlane.stop` with ``drain_grace_seconds``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence

import grpc
from prometheus_client import CollectorRegistry

from controlplane.api.auth import AdminAuth, AdminAuthInterceptor
from controlplane.api.cluster import ClusterRpcs
from controlplane.api.engines import EngineRpcs
from controlplane.api.fleet import FleetRpcs
from controlplane.api.join import JoinCheck
from controlplane.api.rollout import RolloutRpcs
from controlplane.api.router import RouterRpcs
from controlplane.api.scaling import ScaleRpcs
from controlplane.api.servicers import AdminServicer, FleetServicer, TablesServicer, add_tables_servicer
from controlplane.api.tables import TableRpcs
from controlplane.api.tenants import TenantRpcs
from controlplane.api.traffic import TrafficRpcs
from controlplane.api.usage import UsageRpcs
from controlplane.config import ControlPlaneSettings
from controlplane.controller import Controller
from controlplane.metrics import Metrics
from controlplane.services.scaling import ScalingSettings
from controlplane.store.base import Store, StoreHealth
from controlplane.store.memory import MemoryStore
from ferry.config import ModelConfig, TenantConfig
from ferry.grpcutil import split_address, start_server
from ferry.readiness import DrainTimes, Readiness
from ferry.tls import TLSConfig
from ferry.v1 import admin_pb2_grpc, fleet_pb2_grpc

SERVICE_NAMES = ("ferry.v1.Fleet", "ferry.v1.Tables", "ferry.v1.Admin")


def ready(health: StoreHealth, leader_known: bool) -> bool:
    """Whether a control plane can do its job: its store's last calls succeeded and a leader is known."""
    return health.ok and leader_known


class ControlPlane:
    """A control plane: call :meth:`start`, then :meth:`stop`."""

    def __init__(
        self,
        settings: ControlPlaneSettings | None = None,
        *,
        catalog: Sequence[ModelConfig] = (),
        store: Store | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        registry: CollectorRegistry | None = None,
        elect: bool = False,
        admin_auth: AdminAuth | None = None,
        tls: TLSConfig | None = None,
        join_check: JoinCheck | None = None,
        tenants: Sequence[TenantConfig] = (),
        scaling: ScalingSettings | None = None,
    ) -> None:
        self.settings = settings or ControlPlaneSettings()
        self.tls = tls  # mutual TLS on the port (every peer shows a certificate of the CA) and to the leader
        self.join_check = join_check if join_check is not None else JoinCheck(
            self.settings.join_token_sha256, mutual_tls=tls is not None)
        self.admin_auth = admin_auth if admin_auth is not None else AdminAuth(self.settings.admin_token_sha256)
        self.store: Store = store if store is not None else MemoryStore(clock=clock)
        self._owns_store = store is None
        self.registry = registry if registry is not None else CollectorRegistry()
        self._wall = wall
        self.controller = Controller(
            self.settings, store=self.store, catalog=catalog, clock=clock, wall=wall,
            metrics=Metrics(self.registry), elect=elect, admin_metadata=self.admin_auth.metadata(), tls=tls,
            tenants=tenants, scaling=scaling,
        )
        self._server: grpc.aio.Server | None = None
        self.port = 0
        self.readiness = Readiness(ready=False)  # follows ready() every tick (_follow)
        self._follow_task: asyncio.Task[None] | None = None
        self._stopped = False

    def ready(self) -> bool:
        """:func:`ready` of this control plane now (no I/O)."""
        peers = self.controller.peers
        leader_known = peers.cluster is None or peers.cluster.election.leader is not None
        return ready(self.store.health(), leader_known)

    async def _follow(self) -> None:
        """Set the health from :meth:`ready` every tick."""
        while True:
            self.readiness.set(self.ready())
            await asyncio.sleep(self.settings.tick_seconds)

    async def start(self, listen: str = "127.0.0.1:0", *, advertise: str = "") -> int:
        """Sync, compute, serve on ``listen``, join the election; returns the bound port."""
        await self.controller.start()
        c = self.controller
        admin = AdminServicer(  # the Admin RPCs, each concern's handlers registering their own
            FleetRpcs(c.fleet_service, c.allocation_service),
            TableRpcs(c.table_service),
            ClusterRpcs(c.status_service, c.peers),
            UsageRpcs(c.fleet_service, c.table_service, wall=self._wall),
            TenantRpcs(c.tenant_service),
            RolloutRpcs(c.rollout_service),
            RouterRpcs(c.router_service),
            ScaleRpcs(c.scaling_service.scale),
            EngineRpcs(c.engines, leading=lambda: c.peers.leading, max_name_bytes=self.settings.max_name_bytes),
            TrafficRpcs(c.traffic, c.peers, wall=self._wall),
        )
        services = [
            (fleet_pb2_grpc.add_FleetServicer_to_server,
             FleetServicer(c.fleet_service, c.metrics, self.join_check, engines=c.engines), SERVICE_NAMES[0]),
            (add_tables_servicer, TablesServicer(c.table_service, c.metrics),
             SERVICE_NAMES[1]),
            (admin_pb2_grpc.add_AdminServicer_to_server, admin, SERVICE_NAMES[2]),
        ]
        try:
            guard = AdminAuthInterceptor(self.admin_auth, lambda: c.metrics.reject("admin_unauthenticated"))
            credentials = self.tls.server_credentials(require_client_cert=True) if self.tls else None
            self._server, self.port = await start_server(services, listen, interceptors=[guard],
                                                         credentials=credentials, readiness=self.readiness)
            await self.controller.join(advertise or f"{split_address(listen)[0]}:{self.port}")
        except BaseException:
            await self.stop(grace=0)
            raise
        self._follow_task = asyncio.create_task(self._follow(), name="controlplane-readiness")
        return self.port

    async def drain(self, times: DrainTimes | None = None) -> None:
        """Stop as on SIGTERM: NOT_SERVING, serve ``times.delay`` s more, then :meth:`stop` with ``times.grace``."""
        times = times or self.settings.drain()
        await self.readiness.drain(times.delay)
        await self.stop(times.grace)

    async def stop(self, grace: float = 1.0) -> None:
        """Close the streams, stop the loop, then the server (waiting up to ``grace`` s for calls); once."""
        if self._stopped:
            return
        self._stopped = True
        await self.readiness.drain()  # NOT_SERVING for good; health Watch streams end
        if self._follow_task is not None:
            self._follow_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._follow_task
            self._follow_task = None
        await self.controller.stop()
        if self._server is not None:
            await self._server.stop(grace)
            self._server = None
        if self._owns_store:
            await self.store.close()
