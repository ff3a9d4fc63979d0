"""Fakes for the control plane tests: a clock, message builders, agents and proxies on real streams, a flaky store."""

from __future__ import annotations

import asyncio
import inspect
import sys
import time
import zlib
from collections.abc import Callable
from typing import Any

import grpc

from controlplane.api.auth import AdminAuth
from controlplane.config import ControlPlaneSettings
from controlplane.fleet.view import FleetView, Member
from controlplane.server import ControlPlane
from controlplane.store.base import StoreHealth
from controlplane.store.memory import MemoryStore
from ferry.config import ModelConfig
from ferry.errors import Unavailable
from ferry.v1 import admin_pb2, admin_pb2_grpc, common_pb2, fleet_pb2, fleet_pb2_grpc, tables_pb2, tables_pb2_grpc
from ferry_cli.ctl.client import AdminClient

READY = common_pb2.REPLICA_STATE_READY
TOKEN = "test-admin-token"  # the Admin API's, in every in-process control plane here
WAIT = 5.0  # bound on every wait for a message: a failing test fails, it does not hang
GRACE = 3.0


class FakeClock:
    """Monotonic seconds that move only when told."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def replica(
    rid: str, model: str = "chat", *, version: str = "v1", state: int = READY, **kw: Any,
) -> fleet_pb2.ReplicaInfo:
    # one address per replica id: a replica address held by another live node is refused
    fields: dict[str, Any] = {"address": f"127.0.0.1:{9000 + zlib.crc32(rid.encode()) % 50000}",
                              "max_concurrency": 60, "gpus": 1}
    fields.update(kw)
    return fleet_pb2.ReplicaInfo(replica_id=rid, model=model, version=version, state=state, **fields)  # type: ignore[arg-type]


def register(node: str = "n1", *replicas: fleet_pb2.ReplicaInfo, region: str = "local") -> fleet_pb2.Register:
    return fleet_pb2.Register(node=node, region=region, gpus=8, replicas=list(replicas), agent_version="test")


def load(rid: str, *, state: int = READY, queued: int = 0, running: int = 0) -> common_pb2.ReplicaLoad:
    return common_pb2.ReplicaLoad(replica_id=rid, state=state, queued=queued, running=running)  # type: ignore[arg-type]


def fleet_with(clock: FakeClock, *regs: fleet_pb2.Register, grace: float = GRACE) -> tuple[FleetView, list[Member]]:
    fleet = FleetView(clock=clock, grace_seconds=grace)
    return fleet, [fleet.register(r) for r in regs]


def routed(snapshot: tables_pb2.TableSnapshot, model: str | None = None) -> list[str]:
    """Replica ids in a table, of one model or all."""
    return [r.replica_id for m in snapshot.models if model in (None, m.model) for r in m.replicas]


class FakeAgent:
    """One ``Fleet.Connect`` stream driven by the test."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.call = fleet_pb2_grpc.FleetStub(channel).Connect()
        self.seq = 0

    async def send(self, **body: Any) -> None:
        await self.call.write(fleet_pb2.AgentMessage(**body))

    async def register(self, reg: fleet_pb2.Register) -> fleet_pb2.Registered:
        await self.send(register=reg)
        message = await self.read()
        assert message.WhichOneof("body") == "registered", message
        return message.registered

    async def telemetry(self, *loads: common_pb2.ReplicaLoad, **kw: Any) -> None:
        self.seq += 1
        await self.send(telemetry=fleet_pb2.Telemetry(seq=self.seq, replicas=list(loads), **kw))

    async def read(self) -> fleet_pb2.ControlMessage:
        message = await asyncio.wait_for(self.call.read(), WAIT)
        assert isinstance(message, fleet_pb2.ControlMessage), message
        return message

    async def command(self) -> fleet_pb2.Command:
        message = await self.read()
        assert message.WhichOneof("body") == "command", message
        return message.command

    async def status(self) -> tuple[grpc.StatusCode, str]:
        """The status the stream ended with (reads and drops anything before it)."""
        try:
            while await asyncio.wait_for(self.call.read(), WAIT) is not grpc.aio.EOF:
                pass
        except grpc.aio.AioRpcError as exc:
            return exc.code(), exc.details() or ""
        return await self.call.code(), await self.call.details()


class FakeProxy:
    """One ``Tables.Watch`` stream driven by the test."""

    def __init__(self, channel: grpc.aio.Channel, proxy_id: str = "p1", region: str = "local") -> None:
        self.call = tables_pb2_grpc.TablesStub(channel).Watch()
        self.proxy_id = proxy_id
        self.region = region

    async def subscribe(self, have_version: int = 0) -> tables_pb2.TableSnapshot:
        await self.send_subscribe(have_version)
        return await self.read()

    async def send_subscribe(self, have_version: int = 0) -> None:
        sub = tables_pb2.Subscribe(proxy_id=self.proxy_id, region=self.region, have_version=have_version)
        await self.call.write(tables_pb2.WatchRequest(subscribe=sub))

    async def read(self) -> tables_pb2.TableSnapshot:
        snapshot = await asyncio.wait_for(self.call.read(), WAIT)
        assert isinstance(snapshot, tables_pb2.TableSnapshot), snapshot
        return snapshot

    async def until(self, predicate: Callable[[tables_pb2.TableSnapshot], bool]) -> tables_pb2.TableSnapshot:
        """Read snapshots until one satisfies ``predicate`` (bounded by WAIT)."""
        async with asyncio.timeout(WAIT):
            while True:
                snapshot = await self.read()
                if predicate(snapshot):
                    return snapshot

    async def ack(self, snapshot: tables_pb2.TableSnapshot, *, applied: bool = True, error: str = "") -> None:
        ack = tables_pb2.Ack(version=snapshot.version, nonce=snapshot.nonce, applied=applied, error=error)
        await self.call.write(tables_pb2.WatchRequest(ack=ack))


class Harness:
    """An in-process control plane on 127.0.0.1 port 0, with a channel and stubs."""

    def __init__(self, cp: ControlPlane, channel: grpc.aio.Channel) -> None:
        self.cp = cp
        self.channel = channel
        self.admin = AdminClient(channel, TOKEN)
        self.anonymous = admin_pb2_grpc.AdminStub(channel)  # no token

    @classmethod
    async def start(cls, clock: FakeClock, **settings: Any) -> Harness:
        merged: dict[str, Any] = {"grace_seconds": GRACE, "tick_seconds": 0.1, "debounce_seconds": 0.001}
        merged.update(settings)
        catalog = (ModelConfig(name="chat", default_version="v1"), ModelConfig(name="empty-model"))
        cp = ControlPlane(ControlPlaneSettings(**merged), catalog=catalog, clock=clock, wall=time.time,
                          admin_auth=AdminAuth.with_token(TOKEN))
        port = await cp.start("127.0.0.1:0")
        return cls(cp, grpc.aio.insecure_channel(f"127.0.0.1:{port}"))

    async def stop(self) -> None:
        await self.cp.stop(grace=0.2)
        await self.channel.close()

    def agent(self) -> FakeAgent:
        return FakeAgent(self.channel)

    def proxy(self, proxy_id: str = "p1", region: str = "local") -> FakeProxy:
        return FakeProxy(self.channel, proxy_id, region)

    async def replicas(self, **filters: str) -> dict[str, admin_pb2.ReplicaView]:
        response = await self.admin.ListReplicas(admin_pb2.ListReplicasRequest(**filters), timeout=WAIT)
        return {r.replica_id: r for r in response.replicas}

    async def poll(self, predicate: Callable[[], bool], what: str) -> None:
        """Wait until ``predicate()`` holds, checking at each turn of the loop, bounded by WAIT."""
        deadline = time.monotonic() + WAIT
        while not predicate():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            await asyncio.sleep(0.005)


class FlakyStore:
    """A client of a shared store that can be cut off: calls raise Unavailable and health says so."""

    def __init__(self, inner: MemoryStore) -> None:
        self.inner = inner
        self.down = False

    def health(self) -> StoreHealth:
        return StoreHealth("memory", "", ok=not self.down, error="cut off" if self.down else "")

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if not inspect.iscoroutinefunction(attr):  # what answers without I/O (lease_confirmed) is not cut off
            return attr

        async def call(*args: Any, **kwargs: Any) -> Any:
            if self.down:
                raise Unavailable("the store is cut off")
            return await attr(*args, **kwargs)

        return call


TICK = 0.25  # Pair's control-plane tick
LEASE = 1.0  # ... and leader lease


class Pair:
    """cp1 (started first: the leader) and cp2 on one store, each with a channel and an Admin stub."""

    def __init__(self) -> None:
        self.store = MemoryStore()
        self.links = [FlakyStore(self.store), FlakyStore(self.store)]
        self.cps: list[ControlPlane] = []
        self.channels: list[grpc.aio.Channel] = []

    async def start(self) -> Pair:
        for i, link in enumerate(self.links):
            settings = ControlPlaneSettings(id=f"cp{i + 1}", tick_seconds=TICK, debounce_seconds=0.005,
                                            grace_seconds=2.0, leader_lease_seconds=LEASE, store_timeout_seconds=1.0)
            cp = ControlPlane(settings, catalog=(ModelConfig(name="chat"),), store=link, elect=True,  # type: ignore[arg-type]
                              admin_auth=AdminAuth.with_token(TOKEN))
            port = await cp.start("127.0.0.1:0")
            self.cps.append(cp)
            self.channels.append(grpc.aio.insecure_channel(f"127.0.0.1:{port}"))
        return self

    def admin(self, i: int) -> Any:
        return AdminClient(self.channels[i], TOKEN)

    async def status(self, i: int) -> admin_pb2.GetStatusResponse:
        return await self.admin(i).GetStatus(admin_pb2.GetStatusRequest(), timeout=WAIT)

    async def stop(self) -> None:
        for what, closing in [*((f"cp{i + 1}", cp.stop(grace=0.2)) for i, cp in enumerate(self.cps)),
                              *((f"channel {i}", c.close()) for i, c in enumerate(self.channels))]:
            try:
                await asyncio.wait_for(closing, WAIT)
            except TimeoutError:
                for task in asyncio.all_tasks():
                    task.print_stack(file=sys.stderr)
                raise AssertionError(f"{what} did not stop within {WAIT} s (task stacks on stderr)") from None
