"""The proxy process in one object: :class:`Proxy` wires config, table, watcher, router and servicer.

``await Proxy(...).start(listen) -> port`` serves ``ferry.v1.Inference``
(with gRPC health and reflection, :func:`ferry.grpcutil.start_server`) and
starts the table watcher when control-plane addresses are given;
with ``tls`` the public port is TLS (no client certificate asked: tenants
authenticate by API key) and the proxy uses mutual TLS to the control planes
and, unless ``replica_tls`` is false, to the replicas;
with TLS from files, a rotated certificate is served to new connections without a
restart (:mod:`ferry.tls`: at once on gRPC, within ``--tls-reload-seconds`` on HTTP);
``await proxy.start_http(listen) -> port`` adds the OpenAI-compatible HTTP
front door (:mod:`dataplane.api.http`) on the same loop and router, with each
model's chat template from ``models`` (:mod:`dataplane.api.chat`); a task
trims the allocator after bursts of large requests (:mod:`dataplane.memory`);
``await proxy.stop(grace)`` stops accepting on both front doors, lets calls
finish for ``grace`` seconds, then stops the watcher and closes the replica
clients. With ``[proxy] trace_endpoint`` set, a task exports request traces
(:mod:`dataplane.tracing`; the picker's as service ``ferry-picker``). Tests
run it in process; :mod:`dataplane.main` runs it as ``ferry proxy``.

Readiness (:mod:`ferry.readiness`): the gRPC health of every service is
NOT_SERVING until the first table is applied (a proxy without a table can
only refuse), then SERVING; it does not go back when the control plane is
gone, since the proxy serves its last table (static stability).
``await proxy.drain()`` is the stop on SIGTERM: NOT_SERVING at once, serving
on for ``drain_delay_seconds``, then :meth:`Proxy.stop` with
``drain_grace_seconds`` (``[proxy]``, :class:`dataplane.config.ServerSettings`).

Collaborators can be injected (clock, rng, metrics registry, replica client
factory) so that tests control them; defaults are the monotonic clock, a
fresh ``random.Random()`` and the default Prometheus registry (which holds
one proxy's metrics: give each further proxy in a process its own
``CollectorRegistry``).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Callable, Sequence
from typing import Any

import grpc
from envoy.service.accesslog.v3 import als_pb2_grpc as als_grpc
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_grpc
from prometheus_client import CollectorRegistry

from dataplane.api.chat import ChatTemplates, load_template
from dataplane.api.http import HttpFront
from dataplane.api.service import InferenceServicer
from dataplane.config import ProxySettings
from dataplane.epp.servicer import LIVENESS, READINESS, PickerServicer
from dataplane.epp.servicer import SERVICE_NAME as PICKER_SERVICE
from dataplane.forward.clients import ClientFactory, ClientPool, default_factory
from dataplane.forward.kserve import Forwarder
from dataplane.guard.hooks import Guards
from dataplane.intake.auth import Authenticator
from dataplane.intake.tokenwork import TokenWork
from dataplane.memory import MIB, MemoryTrim
from dataplane.metrics import ProxyMetrics
from dataplane.router import Router
from dataplane.routerconfig import RouterConfigs
from dataplane.table.local import Table, TableHolder
from dataplane.table.tenants import TenantSet
from dataplane.table.watch import TableWatcher
from dataplane.tracing import Tracer, resource
from ferry.backoff import Backoff
from ferry.config import TIERS, GuardrailConfig, Limits, ModelConfig, TenantConfig
from ferry.grpcutil import start_server
from ferry.readiness import SERVING, DrainTimes, Readiness
from ferry.tls import TLSConfig
from ferry.tokens import Tokenizers
from ferry.v1 import inference_pb2_grpc, tables_pb2

SERVICE_NAME = "ferry.v1.Inference"
REPORTS_SERVICE = "envoy.service.accesslog.v3.AccessLogService"  # the picker hears how requests ended


class Proxy:
    """One data-plane proxy; see the module docstring."""

    def __init__(
        self,
        *,
        settings: ProxySettings | None = None,
        tenants: Sequence[TenantConfig] = (),
        limits: Limits | None = None,
        control_planes: Sequence[str] = (),
        registry: CollectorRegistry | None = None,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.monotonic,
        client_factory: ClientFactory | None = None,
        tls: TLSConfig | None = None,
        replica_tls: bool = True,
        tokenizers: Tokenizers | None = None,
        models: Sequence[ModelConfig] = (),
        guardrails: Sequence[GuardrailConfig] = (),
    ) -> None:
        self.tls = tls  # TLS on the public port; mutual TLS to control planes (and replicas, with replica_tls)
        self.settings = (settings or ProxySettings()).resolved()
        self.limits = limits or Limits()
        self.control_planes = tuple(control_planes)
        self.metrics = ProxyMetrics(registry)
        self._rng = rng or random.Random()
        self._clock = clock
        self.holder = TableHolder(
            self.settings.region,
            clock=clock,
            params=self.settings.table.table_params(),
        )
        to_replicas = tls if replica_tls else None  # its channels are rebuilt when the certificate is renewed
        self.pool = ClientPool(client_factory or default_factory(self.limits.max_message_bytes, to_replicas),
                               tls=to_replicas)
        self.authenticator = Authenticator(tenants, allow_anonymous=self.settings.server.allow_anonymous)
        tracing = self.settings.tracing  # request traces over OTLP (dataplane.tracing): none unless an endpoint is set
        self.tracer = Tracer(tracing, counter=self.metrics.trace_spans) if tracing.trace_endpoint else None
        self.router = Router(
            settings=self.settings,
            limits=self.limits,
            authenticator=self.authenticator,
            holder=self.holder,
            forwarder=Forwarder(self.pool, clock=clock),
            metrics=self.metrics,
            rng=self._rng,
            clock=clock,
            tokens=TokenWork(tokenizers),  # each model's tokenizer, from the catalog (dataplane.intake.tokenwork)
            guards=Guards(guardrails, self.metrics, clock=clock, tls=tls),  # safety hooks (dataplane.guard.hooks)
            tracer=self.tracer,
            max_output={m.name: m.max_output_tokens for m in models if m.max_output_tokens},
        )
        self.router.picker.steps = self.metrics.pick_steps  # each decision step's time (ferry_proxy_pick_step_seconds)
        server = self.settings.server
        self.servicer = InferenceServicer(self.router, self.metrics, region=self.settings.region, clock=clock,
                                          unread_timeout=server.stream_unread_timeout_seconds,
                                          retry_after=server.retry_after_seconds,
                                          strict_fields=self.settings.http.http_strict_fields)
        self.templates = ChatTemplates(  # raises ConfigError naming a model whose template does not load
            {m.name: load_template(m.chat_template, f"models.{m.name}.chat_template") for m in models},
            max_bytes=self.limits.max_prompt_bytes,
            tool_parsers={m.name: m.tool_parser for m in models})
        self.http: HttpFront | None = None
        self.picker: PickerServicer | None = None  # the endpoint picker, when start(picker=True)
        self.http_port = 0
        self.watcher: TableWatcher | None = None
        # The router config the table assigns this proxy, swapped in live (dataplane.routerconfig).
        self.router_configs = RouterConfigs(self.settings, self.router.reconfigure, on_version=self.router.usage.router)
        if self.control_planes:
            watch = self.settings.watch
            self.watcher = TableWatcher(
                self.control_planes,
                self.holder,
                proxy_id=self.settings.proxy_id,
                region=self.settings.region,
                backoff=Backoff(watch.reconnect_initial_seconds, watch.reconnect_max_seconds, rng=self._rng),
                metrics=self.metrics,
                stale_warn_seconds=watch.table_stale_warn_seconds,
                clock=clock,
                tls=tls,
                usage=self._usage_report,
                usage_seconds=watch.usage_report_seconds,
                router=lambda snapshot: self.router_configs.follow(snapshot, self.settings.proxy_id),
            )
        # The tenants served: the config file's, or the set the table carries (dataplane.table.tenants).
        self.tenants = TenantSet(tenants, self.authenticator, self.router.tenant_limits)
        self.holder.on_applied(self._on_table)
        self.metrics.watch_table_age(self.holder.age)
        self.port = 0
        self.readiness = Readiness(ready=False)  # SERVING once a table is applied (_on_table)
        self._server: grpc.aio.Server | None = None
        self._stop = asyncio.Event()
        self._watch_task: asyncio.Task[None] | None = None
        # Memory back to the system after bursts of large requests (dataplane.memory).
        self.memory = MemoryTrim(self.settings.server.memory_trim_growth_mib * MIB)
        self._trim_task: asyncio.Task[None] | None = None
        self._reload_task: asyncio.Task[None] | None = None  # the HTTP front door's certificate (ferry.tls)
        self._ends_task: asyncio.Task[None] | None = None  # the picker's sweep of requests never reported
        self._trace_task: asyncio.Task[None] | None = None  # the traces' export (dataplane.tracing)

    def _on_table(self, table: Table) -> None:
        self.pool.retain(table.addresses)
        self.tenants.apply(table.tenants)
        self.readiness.set(True)

    def _usage_report(self) -> tables_pb2.Report:
        """The usage window since the last report, with each tier queue's depth (dataplane.usage)."""
        depths = {(model, tier): queues.depth(tier) for model, queues in self.router.admission.models.items()
                  for tier in TIERS}
        report = self.router.usage.report(self._clock(), depths)
        report.cache.extend(self.router.cache.samples())  # -- response cache: the duplicate measurement
        self.router.recorder.fill(report)  # the traffic recorder's rows (dataplane.record)
        return report

    async def start(self, listen: str = "127.0.0.1:0", *, picker: bool = False) -> int:
        """Serve on ``listen`` (port 0: any free port) and start watching; returns the bound port.

        ``picker``: also serve Envoy's ``ExternalProcessor`` (:mod:`dataplane.epp`: the endpoint picker on the
        same router), with the health services the endpoint-picker protocol names (``liveness``: SERVING while
        the process answers; ``readiness`` and the processor's name: SERVING once a table is applied)."""
        services: list[tuple[Callable[[Any, grpc.aio.Server], None], Any, str]] = [
            (inference_pb2_grpc.add_InferenceServicer_to_server, self.servicer, SERVICE_NAME)]
        if picker:
            self.picker = PickerServicer(self.router, self.servicer, self.authenticator, self.templates,
                                         self.settings.picker,
                                         default_deadline=self.settings.server.default_deadline_seconds,
                                         clock=self._clock, registry=self.metrics.registry,
                                         max_pending=self.settings.server.max_inflight,
                                         serving=lambda: self.readiness.status == SERVING)
            services.append((ext_grpc.add_ExternalProcessorServicer_to_server, self.picker, PICKER_SERVICE))
            services.append((als_grpc.add_AccessLogServiceServicer_to_server, self.picker.ends, REPORTS_SERVICE))
            self._ends_task = asyncio.create_task(self.picker.ends.run(self._stop), name="picker-ends")
            self.readiness.add_names([READINESS])
            self.readiness.add_names([LIVENESS], live=True)
        self._server, self.port = await start_server(
            services,
            listen,
            max_message_bytes=self.limits.max_message_bytes,
            max_streams=self.limits.max_streams_per_connection,
            credentials=self.tls.server_credentials(require_client_cert=False) if self.tls else None,
            readiness=self.readiness,
        )
        if self.watcher is not None:
            self._watch_task = asyncio.create_task(self.watcher.run(self._stop), name="table-watch")
        if self.tracer is not None:
            where = resource("ferry-picker" if picker else "ferry-proxy", self.settings.proxy_id, self.settings.region)
            self._trace_task = asyncio.create_task(self.tracer.exporter.run(where), name="trace-export")
        self._trim_task = asyncio.create_task(self.memory.run(self._stop), name="memory-trim")
        return self.port

    async def start_http(self, listen: str = "127.0.0.1:0") -> int:
        """Serve the HTTP front door on ``listen`` (port 0: any free port; HTTPS with ``tls``); returns the port."""
        self.http = HttpFront(self.router, self.servicer, self.authenticator, self.holder, self.templates,
                              self.settings.http, default_deadline=self.settings.server.default_deadline_seconds,
                              clock=self._clock, serving=lambda: self.readiness.status == SERVING)
        loaded = self.tls.generation() if self.tls else 0
        context = self.tls.server_ssl_context() if self.tls else None
        self.http_port = await self.http.start(listen, context)
        if context is not None and self.tls is not None and self.tls.watch is not None:
            self._reload_task = asyncio.create_task(self.tls.watch.follow(context, loaded, self._stop),
                                                    name="tls-reload")
        return self.http_port

    async def drain(self, times: DrainTimes | None = None) -> None:
        """Stop as on SIGTERM: NOT_SERVING, serve ``times.delay`` seconds more, then :meth:`stop` with
        ``times.grace`` (default: the ``drain_*`` settings)."""
        times = times or self.settings.server.drain()
        await self.readiness.drain(times.delay)
        await self.stop(times.grace)

    async def stop(self, grace: float = 1.0) -> None:
        """Take no new request on either front door, give those in flight ``grace`` seconds (both at once),
        then stop watching and close the replica clients (the table still updates while calls finish)."""
        await self.readiness.drain()  # NOT_SERVING for good; health Watch streams end
        stopping = []
        if self.http is not None:
            stopping.append(self.http.stop(grace))
        if self._server is not None:
            stopping.append(self._server.stop(grace))
        await asyncio.gather(*stopping)
        self.http = None
        self._server = None
        self._stop.set()
        if self._reload_task is not None:
            self._reload_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reload_task
            self._reload_task = None
        if self._ends_task is not None:
            await self._ends_task  # _stop is set: it ends at once
            self._ends_task = None
        if self._trace_task is not None and self.tracer is not None:  # what is queued is sent, within its timeout
            self.tracer.exporter.close()
            await self._trace_task
            self._trace_task = None
        if self._trim_task is not None:
            self._trim_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._trim_task
            self._trim_task = None
        if self._watch_task is not None:
            self._watch_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch_task
            self._watch_task = None
        await self.pool.close()
        await self.router.guards.close()
        self.router.tokens.close()
