"""The node agent: registers the node's replicas with a control plane, streams telemetry, runs commands.

Two tasks, both I/O; every decision is in :mod:`agent.states` (replica
states), :mod:`ferry.backoff` (reconnection delays) and
:mod:`agent.inventory` (what to report):

- **poller**: every telemetry interval (or at once after a command, or
  when :meth:`Agent.poll_now` is called) polls
  each endpoint through :class:`agent.triton.TritonEndpoint` (KServe v2) or
  :class:`agent.openai.OpenAIEndpoint` (an engine's own OpenAI HTTP), feeds the
  observations to the state machine and, when a state changed, wakes the
  sender. Endpoints adopted whole (a real Triton, an OpenAI-HTTP engine) are listed again every
  ``discovery_interval_seconds``.
- **connection**: opens ``ferry.v1.Fleet/Connect`` to a control plane (the
  next address of the list after each failure), sends ``Register``, then
  ``Telemetry`` every interval and at once on a state change, and answers
  each ``Command`` with a ``CommandResult``. When the stream breaks it waits
  a jittered exponential backoff (0.1 s doubling to 5 s, reset once a
  control plane answers ``Registered``) and registers again.

Replicas keep serving while no control plane is reachable: the agent is not
on the request path. Metrics: ``ferry_agent_connected``,
``ferry_agent_telemetry_messages_total``, ``ferry_agent_reconnects_total``,
``ferry_agent_replicas{state}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import random
from collections import deque
from collections.abc import Sequence

import grpc
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge
from tritonclient.utils import InferenceServerException

from agent.config import AgentSettings, clamp_interval
from agent.inventory import Inventory, ReplicaSpec, merge_discovered
from agent.openai import OpenAIEndpoint
from agent.scrape import HttpError
from agent.states import Command, Observed, State, command, observe
from agent.triton import TritonEndpoint
from ferry import __version__
from ferry.backoff import Backoff
from ferry.grpcutil import StreamWriter, channel_options
from ferry.metrics import name
from ferry.tls import TLSConfig
from ferry.tls import channel as tls_channel
from ferry.v1 import fleet_pb2, fleet_pb2_grpc

log = logging.getLogger(__name__)

_COMMANDS = {fleet_pb2.Command.KIND_DRAIN: Command.DRAIN, fleet_pb2.Command.KIND_UNDRAIN: Command.UNDRAIN}


REFUSALS = (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.ALREADY_EXISTS)  # admission: fix the token or names


class StreamLost(Exception):
    """The control plane ended the stream, or the agent gave it up."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class NodeInfo:
    """The node as it registers."""

    node: str
    region: str = "local"
    gpus: int = 8
    standby: bool = False  # warm hardware with no replica (ferry node --standby): the region's warm pool


@dataclasses.dataclass(frozen=True, kw_only=True)
class Endpoint:
    """An endpoint of the node: its fixed replicas, or (``adopt``) every LLM model it serves.

    A KServe v2 endpoint at ``address`` (with ``http_address``, the same server's OpenAI-compatible front end,
    ``host:port``, registered as each adopted replica's: a Triton server with its OpenAI front end); or, with
    ``openai_url``, an engine serving OpenAI HTTP itself (:mod:`agent.openai`, ``engine`` one of its
    ``ENGINES``, ``address`` unused), whose models (``openai_models``, else its ``/v1/models``) are adopted as
    replicas reached over HTTP only.
    """

    address: str = ""
    metrics_url: str | None = None
    replicas: tuple[ReplicaSpec, ...] = ()
    adopt: bool = False
    gpus: int = 1
    tls: bool = False  # the endpoint serves mutual TLS with the node's certificate
    openai_url: str | None = None  # http://host:port of an engine's OpenAI API
    engine: str = ""  # that engine: vllm | sglang | trtllm
    openai_models: tuple[str, ...] = ()  # the model names it serves (empty: read from its /v1/models)
    http_address: str = ""  # with a KServe address: host:port of the same server's OpenAI front end


class AgentMetrics:
    """The agent's Prometheus metrics, in ``registry`` (a fresh one per agent in tests)."""

    def __init__(self, registry: CollectorRegistry = REGISTRY) -> None:
        self.registry = registry
        self.connected = Gauge(name("agent_connected"), "1 while registered with a control plane",
                               registry=registry)
        self.telemetry = Counter(name("agent_telemetry_messages"), "Telemetry messages sent", registry=registry)
        self.reconnects = Counter(name("agent_reconnects"), "Connections to a control plane lost or refused",
                                  registry=registry)
        self.replicas = Gauge(name("agent_replicas"), "Replicas of this node per state", ["state"],
                              registry=registry)


class Agent:
    """One node's agent; :meth:`run` until cancelled (or :meth:`start` / :meth:`stop`)."""

    def __init__(self, *, node: NodeInfo, control_planes: Sequence[str], endpoints: Sequence[Endpoint],
                 settings: AgentSettings | None = None, rng: random.Random | None = None,
                 metrics: AgentMetrics | None = None, tls: TLSConfig | None = None, join_token: str = "") -> None:
        if not control_planes:
            raise ValueError("at least one control plane address is needed")
        self.node, self.control_planes = node, list(control_planes)
        self.settings = settings or AgentSettings()
        self.metrics = metrics or AgentMetrics()
        self.interval = clamp_interval(self.settings.telemetry_interval_seconds)
        self.inventory = Inventory(self.settings.max_replicas)
        self.connected = False
        self.telemetry_sent = self.reconnects = 0
        self._sources = list(endpoints)
        self._tls = tls  # mutual TLS to the control planes and to endpoints with ``tls``
        self._join_token = join_token
        self._clients = [self._client(e) for e in endpoints]
        for i, source in enumerate(self._sources):
            for spec in source.replicas:
                if not self.inventory.upsert(dataclasses.replace(spec, endpoint=i)):
                    log.warning("replica %s ignored: at most %d per agent", spec.replica_id, self.settings.max_replicas)
        self._backoff = Backoff(self.settings.backoff_initial_seconds, self.settings.backoff_max_seconds, rng=rng)
        self._outbox: deque[fleet_pb2.CommandResult] = deque()
        self._send_now = asyncio.Event()
        self._poll_now = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    def _client(self, e: Endpoint) -> TritonEndpoint | OpenAIEndpoint:
        timeout = self.settings.probe_timeout_seconds
        if e.openai_url:
            return OpenAIEndpoint(e.openai_url, e.metrics_url, engine=e.engine, timeout_seconds=timeout,
                                  models=e.openai_models)
        return TritonEndpoint(e.address, e.metrics_url, timeout_seconds=timeout, tls=self._tls if e.tls else None)

    def states(self) -> dict[str, State]:
        """Each replica's current state."""
        return {rid: t.status.state for rid, t in self.inventory.replicas.items()}

    async def start(self) -> None:
        """Start polling and connecting in the background."""
        self._tasks = [asyncio.create_task(self._poll_loop(), name="agent-poll"),
                       asyncio.create_task(self._connection_loop(), name="agent-connection")]

    async def stop(self) -> None:
        """Stop both tasks and close the endpoint clients."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        for client in self._clients:
            await client.close()
        self._set_connected(False)

    async def run(self) -> None:
        await self.start()
        try:
            await asyncio.gather(*self._tasks)
        finally:
            await self.stop()

    # -- polling ---------------------------------------------------------------------------------------------------

    async def _poll_loop(self) -> None:
        loop = asyncio.get_running_loop()
        next_discovery = loop.time()
        while True:
            if loop.time() >= next_discovery:
                await self._discover()
                next_discovery = loop.time() + self.settings.discovery_interval_seconds
            try:
                await self.poll_once()
            except Exception:  # a poll must never stop the agent: the next one may work
                log.exception("polling the replicas failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._poll_now.wait(), self.interval)
            self._poll_now.clear()

    async def _discover(self) -> None:
        for i, (source, client) in enumerate(zip(self._sources, self._clients, strict=True)):
            if not source.adopt:
                continue
            try:
                entries = await client.discover()
            except (InferenceServerException, HttpError) as exc:
                log.info("endpoint %s not listed: %s", source.openai_url or source.address, exc)
                continue
            if isinstance(client, OpenAIEndpoint):  # reached over OpenAI HTTP only: no KServe address
                refused = merge_discovered(self.inventory, node=self.node.node, endpoint=i, address="",
                                           gpus=source.gpus, entries=entries, http_address=client.address,
                                           engine=client.engine, tag=f"-o{i}",
                                           default_max_concurrency=self.settings.default_max_concurrency)
            else:
                refused = merge_discovered(self.inventory, node=self.node.node, endpoint=i, address=source.address,
                                           gpus=source.gpus, entries=entries, http_address=source.http_address,
                                           default_max_concurrency=self.settings.default_max_concurrency)
            if refused:
                log.warning("replicas %s ignored: at most %d per agent", refused, self.settings.max_replicas)

    async def poll_once(self) -> None:
        """Poll every endpoint once and apply what was seen."""
        groups: dict[int, list[str]] = {}
        for rid, replica in self.inventory.replicas.items():
            groups.setdefault(replica.spec.endpoint, []).append(rid)
        polls = await asyncio.gather(*(
            self._clients[i].poll([self.inventory.replicas[rid].spec.key for rid in rids])
            for i, rids in groups.items()))
        changed = False
        for (_, rids), result in zip(groups.items(), polls, strict=True):
            for rid in rids:
                tracked = self.inventory.replicas.get(rid)
                if tracked is None:  # removed by a discovery while polling
                    continue
                load = result.models.get(tracked.spec.key)
                seen = Observed(reachable=result.reachable, ready=bool(load and load.ready),
                                queued=load.queued if load else 0, running=load.running if load else 0)
                before = tracked.status.state
                tracked.status = observe(tracked.status, seen)
                tracked.observe(load)  # its load, and its step counters' delta (agent.stepcounters)
                changed |= tracked.status.state is not before
                if load and load.kv_block_tokens and not tracked.spec.kv_block_tokens:
                    self.inventory.upsert(dataclasses.replace(tracked.spec, kv_block_tokens=load.kv_block_tokens))
                if load and load.max_concurrency and load.max_concurrency != tracked.spec.max_concurrency:
                    # a batch runtime's slots shrink when a GPU fails and grow back when it is restored
                    self.inventory.upsert(dataclasses.replace(tracked.spec, max_concurrency=load.max_concurrency))
        self._count_states()
        if changed:
            self._send_now.set()

    def poll_now(self) -> None:
        """Poll the replicas at once rather than at the next interval (a replica's state just changed)."""
        self._poll_now.set()

    def _count_states(self) -> None:
        for state, count in self.inventory.counts().items():
            self.metrics.replicas.labels(state=state.value).set(count)

    def execute(self, cmd: fleet_pb2.Command) -> fleet_pb2.CommandResult:
        """Carry out a command; unknown replica or kind -> ok = false with a message."""
        tracked = self.inventory.replicas.get(cmd.replica_id)
        if tracked is None:
            return fleet_pb2.CommandResult(command_id=cmd.command_id, ok=False,
                                           message=f"unknown replica {cmd.replica_id!r} on node {self.node.node}")
        kind = _COMMANDS.get(cmd.kind)
        if kind is None:
            return fleet_pb2.CommandResult(command_id=cmd.command_id, ok=False,
                                           message=f"unknown command kind {cmd.kind}")
        tracked.status = command(tracked.status, kind)
        self._count_states()
        self._poll_now.set()  # a drained replica is seen at once
        return fleet_pb2.CommandResult(command_id=cmd.command_id, ok=True,
                                       message=f"replica {cmd.replica_id} {tracked.status.state.value}")

    # -- the control-plane stream ----------------------------------------------------------------------------------

    async def _connection_loop(self) -> None:
        attempt = 0
        while True:
            address = self.control_planes[attempt % len(self.control_planes)]
            try:
                await self._session(address)
            except (grpc.aio.AioRpcError, StreamLost) as exc:
                detail = exc.details() if isinstance(exc, grpc.aio.AioRpcError) else str(exc)
                refused = isinstance(exc, grpc.aio.AioRpcError) and exc.code() in REFUSALS
                log.log(logging.WARNING if refused else logging.INFO, "control plane %s: %s", address, detail)
            except Exception:
                log.exception("control plane %s: session failed", address)
            self._set_connected(False)
            attempt += 1
            self.reconnects += 1
            self.metrics.reconnects.inc()
            await asyncio.sleep(self._backoff.next_delay())

    async def _session(self, address: str) -> None:
        async with tls_channel(address, self._tls, options=channel_options()) as channel:
            call = fleet_pb2_grpc.FleetStub(channel).Connect()
            reader = asyncio.create_task(self._read(call))
            try:
                n = self.node
                self._outbox.clear()  # results of an earlier stream mean nothing to this one
                hello = self.inventory.register(node=n.node, region=n.region, gpus=n.gpus, agent_version=__version__)
                hello.register.join_token = self._join_token
                hello.register.standby = n.standby
                writer = StreamWriter(call, reader)
                try:
                    if await writer.write(hello):
                        await self._send(writer, reader)
                except asyncio.InvalidStateError:  # the call ended under a write: the reader knows why
                    pass
                # The call ended under a write (or before one): the reader says why.
                await asyncio.wait({reader}, timeout=1.0)
                error = reader.exception() if reader.done() and not reader.cancelled() else None
                raise error or StreamLost("the control plane ended the stream")
            finally:
                call.cancel()
                reader.cancel()
                # Waited, not awaited: a stop() cancelling this task while it waits must not be swallowed
                # (suppressing CancelledError here kept the agent reconnecting after stop()).
                await asyncio.wait({reader})
                if not reader.cancelled():
                    reader.exception()  # retrieved; why the stream ended is raised above

    async def _read(self, call: grpc.aio.StreamStreamCall) -> None:
        while True:
            message = await call.read()
            if message is grpc.aio.EOF:
                raise StreamLost("the control plane closed the stream")
            body = message.WhichOneof("body")
            if body == "registered":
                given = message.registered.telemetry_interval_seconds
                self.interval = clamp_interval(given if given > 0 else self.settings.telemetry_interval_seconds)
                self._backoff.reset()
                self._set_connected(True)
            elif body == "command":
                if len(self._outbox) >= self.settings.max_pending_results:
                    raise StreamLost(f"more than {self.settings.max_pending_results} command results pending")
                self._outbox.append(self.execute(message.command))
                self._send_now.set()

    async def _send(self, writer: StreamWriter, reader: asyncio.Task[None]) -> None:
        """Telemetry every interval and command results as they come, until a write finds the call ended."""
        loop = asyncio.get_running_loop()
        due = loop.time()
        while True:
            wake = asyncio.create_task(self._send_now.wait())
            await asyncio.wait({reader, wake}, timeout=max(0.0, due - loop.time()),
                               return_when=asyncio.FIRST_COMPLETED)
            wake.cancel()
            if reader.done():
                return
            self._send_now.clear()
            while self._outbox:
                if not await writer.write(fleet_pb2.AgentMessage(result=self._outbox.popleft())):
                    return
            if not await writer.write(self.inventory.telemetry()):
                return
            self.telemetry_sent += 1
            self.metrics.telemetry.inc()
            due = loop.time() + self.interval

    def _set_connected(self, connected: bool) -> None:
        self.connected = connected
        self.metrics.connected.set(1 if connected else 0)
