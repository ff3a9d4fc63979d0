"""Client certificates renewed without a restart, over real mutual TLS (certificates from :mod:`harness.tlsgen`).

The client's files live in a directory laid out as the kubelet mounts a Secret (:class:`SecretMount`:
``ca.crt``, ``tls.crt``, ``tls.key`` are symlinks into ``..data``, a symlink to a timestamped directory
swapped atomically on each update). A KServe v2 server (:class:`Gate`) requires a client certificate signed by
the CA and, per call, admits only the certificates it is told to (as a server that trusts only the renewed one):
after a renewal, the proxy's replica pool and the agent's replica client present the new certificate on their
next call, while a call already running on the old channel finishes there; a half-written or corrupt pair is
refused and the old one keeps working. The agent's control-plane stream moves to a control plane that trusts only
a new CA once its files hold a certificate from that CA. The files are looked at per ``--tls-reload-seconds``
on an injected clock, so no test waits for an interval.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import random
import shutil
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from prometheus_client import REGISTRY, CollectorRegistry
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from agent.agent import Agent, AgentMetrics, NodeInfo
from agent.config import AgentSettings
from agent.triton import TritonEndpoint
from controlplane.api.join import JoinCheck
from controlplane.config import ControlPlaneSettings
from controlplane.server import ControlPlane
from dataplane.forward.clients import ClientPool, default_factory
from ferry import tls
from ferry.errors import ConfigError
from ferry.grpcutil import start_server
from ferry.v1 import fleet_pb2_grpc
from harness import tlsgen
from tests.agent.helpers import until
from tests.controlplane.fakes import FakeClock

INTERVAL = 30.0  # --tls-reload-seconds of the clients under test; their clock moves only when told
SERVICE = "inference.GRPCInferenceService"


class SecretMount:
    """A directory as the kubelet's atomic writer keeps a mounted Secret: each :meth:`write` makes a new
    ``..<timestamp>`` directory, points ``..data`` at it by renaming a new symlink over the old one, then
    removes the old directory; ``ca.crt``, ``tls.crt`` and ``tls.key`` are symlinks through ``..data``."""

    NAMES = ("ca.crt", "tls.crt", "tls.key")

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir()
        self._writes = 0

    @property
    def paths(self) -> tuple[Path, Path, Path]:
        ca, cert, key = (self.root / n for n in self.NAMES)
        return ca, cert, key

    def write(self, ca: bytes, cert: bytes, key: bytes) -> None:
        self._writes += 1
        data = self.root / f"..{time.strftime('%Y_%m_%d_%H_%M_%S')}.{self._writes}"
        data.mkdir()
        for name, content in zip(self.NAMES, (ca, cert, key), strict=True):
            (data / name).write_bytes(content)
        link, old = self.root / "..data_tmp", self.root / "..data"
        previous = old.resolve() if old.is_symlink() else None
        link.symlink_to(data.name)
        link.replace(old)  # rename(2): the atomic swap
        for name in self.NAMES:
            if not (self.root / name).is_symlink():
                (self.root / name).symlink_to(Path("..data") / name)
        if previous is not None:
            shutil.rmtree(previous)

    def write_files(self, directory: Path, name: str) -> None:
        """The CA of ``directory`` and ``name``'s certificate and key there (as :mod:`harness.tlsgen` wrote them)."""
        self.write((directory / "ca.pem").read_bytes(), (directory / f"{name}.pem").read_bytes(),
                   (directory / f"{name}.key").read_bytes())


class Gate(service_pb2_grpc.GRPCInferenceServiceServicer):  # type: ignore[misc]
    """KServe v2 liveness and a held stream that admit only the client certificates in ``admitted`` (PEM)."""

    def __init__(self) -> None:
        self.admitted: set[bytes] = set()
        self.release = asyncio.Event()  # a stream's answer waits for it
        self.streaming = asyncio.Event()  # set once a stream's request arrived

    async def _admit(self, context: Any) -> None:
        presented = (context.auth_context().get("x509_pem_cert") or [b""])[0]
        if presented.strip() not in {pem.strip() for pem in self.admitted}:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, "this client certificate is not admitted")

    async def ServerLive(self, request: pb.ServerLiveRequest, context: Any) -> pb.ServerLiveResponse:
        await self._admit(context)
        return pb.ServerLiveResponse(live=True)

    async def ModelReady(self, request: pb.ModelReadyRequest, context: Any) -> pb.ModelReadyResponse:
        await self._admit(context)
        return pb.ModelReadyResponse(ready=True)

    async def ModelStreamInfer(self, request_iterator: Any, context: Any) -> AsyncIterator[pb.ModelStreamInferResponse]:
        await self._admit(context)
        async for request in request_iterator:
            self.streaming.set()
            await self.release.wait()
            yield pb.ModelStreamInferResponse(infer_response=pb.ModelInferResponse(id=request.id))


@pytest.fixture
async def gate(tmp_path: Path) -> AsyncIterator[tuple[Gate, str, Path]]:
    """The gate on 127.0.0.1 with mutual TLS (client certificate required) and the directory of its CA."""
    pki = tmp_path / "pki"
    certs = tlsgen.generate(pki, ("replica", "client"))
    servicer = Gate()
    servicer.admitted.add(certs["client"].cert)
    credentials = grpc.ssl_server_credentials([(certs["replica"].key, certs["replica"].cert)],
                                              root_certificates=certs["replica"].ca, require_client_auth=True)
    server, port = await start_server([(service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server, servicer,
                                        SERVICE)], "127.0.0.1:0", credentials=credentials)
    try:
        yield servicer, f"127.0.0.1:{port}", pki
    finally:
        await server.stop(None)


def reloads(outcome: str) -> float:
    return REGISTRY.get_sample_value("ferry_tls_reload_total", {"outcome": outcome}) or 0.0


def mounted(tmp_path: Path, pki: Path, clock: FakeClock) -> tuple[SecretMount, tls.TLSConfig]:
    mount = SecretMount(tmp_path / "secret")
    mount.write_files(pki, "client")
    return mount, tls.TLSConfig.load(*mount.paths, reload_seconds=INTERVAL, clock=clock)


@dataclasses.dataclass
class Proxy:
    """The proxy's replica pool with the client files of :class:`SecretMount`, looked at by ``clock``."""

    mount: SecretMount
    config: tls.TLSConfig
    clock: FakeClock
    pool: ClientPool


@pytest.fixture
async def proxy(gate: tuple[Gate, str, Path], tmp_path: Path) -> AsyncIterator[Proxy]:
    clock = FakeClock()
    mount, config = mounted(tmp_path, gate[2], clock)
    pool = ClientPool(default_factory(1 << 20, config), tls=config)
    try:
        yield Proxy(mount, config, clock, pool)
    finally:
        await pool.close()


async def live(pool: ClientPool, address: str) -> Any:
    async with pool.use(address) as client:
        await client.stub.ServerLive(pb.ServerLiveRequest(), timeout=5)
        return client


async def test_the_proxys_replica_pool_presents_a_renewed_certificate_on_its_next_call(
        gate: tuple[Gate, str, Path], proxy: Proxy) -> None:
    servicer, address, pki = gate
    mount, config, clock, pool = proxy.mount, proxy.config, proxy.clock, proxy.pool
    first = await live(pool, address)
    # A call in flight on the first channel: it must finish there after the renewal.
    async with pool.use(address) as held:
        assert held is first
        stream = held.stub.ModelStreamInfer()
        await stream.write(pb.ModelInferRequest(id="in-flight", model_name="m"))
        await asyncio.wait_for(servicer.streaming.wait(), 5)

        renewed = tlsgen.issue(pki, "client")  # same CA, new key and serial
        mount.write_files(pki, "client")
        servicer.admitted = {renewed.cert}  # the server now refuses the old certificate
        with pytest.raises(grpc.aio.AioRpcError) as refused:  # within the interval: the files not looked at
            await live(pool, address)
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
        before = reloads("reloaded")

        clock.advance(INTERVAL)
        second = await live(pool, address)  # the next call: a new channel with the renewed certificate
        assert second is not first and reloads("reloaded") == before + 1 and config.generation() == 1
        assert await live(pool, address) is second

        servicer.release.set()
        answer = await asyncio.wait_for(stream.read(), 5)  # the old channel's call ends normally
        assert answer.infer_response.id == "in-flight"
        await stream.done_writing()
    assert first.channel.get_state() == grpc.ChannelConnectivity.SHUTDOWN  # closed after its last call


BAD_PAIRS = [
    ("key-of-another-certificate", lambda cur, other: (cur.ca, cur.cert, other.key)),
    ("half-written-certificate", lambda cur, other: (cur.ca, other.cert[: len(other.cert) // 2], other.key)),
    ("empty-key", lambda cur, other: (cur.ca, other.cert, b"")),
    ("unparsable-ca", lambda cur, other: (b"-----BEGIN CERTIFICATE-----\nnot base64\n", other.cert, other.key)),
]


@pytest.mark.parametrize("bad", [b[1] for b in BAD_PAIRS], ids=[b[0] for b in BAD_PAIRS])
async def test_a_corrupt_pair_is_refused_and_the_old_one_keeps_working(
        gate: tuple[Gate, str, Path], proxy: Proxy, tmp_path: Path, bad: Any,
        caplog: pytest.LogCaptureFixture) -> None:
    servicer, address, pki = gate
    mount, config, clock, pool = proxy.mount, proxy.config, proxy.clock, proxy.pool
    first = await live(pool, address)
    current = config.current()
    other = tlsgen.generate(tmp_path / "other", ("client",))["client"]
    rejected = reloads("rejected")
    mount.write(*bad(current, other))
    for _ in range(2):  # counted and logged once: the same files are not read again
        clock.advance(INTERVAL)
        assert await live(pool, address) is first  # the old pair, the old channel
    assert config.generation() == 0 and config.current() == current
    assert reloads("rejected") == rejected + 1
    assert [r.levelname for r in caplog.records if "do not load" in r.getMessage()] == ["WARNING"]

    renewed = tlsgen.issue(pki, "client")  # the rotation completes: the next look takes it
    mount.write_files(pki, "client")
    servicer.admitted = {renewed.cert}
    clock.advance(INTERVAL)
    assert await live(pool, address) is not first and config.generation() == 1
    assert first.channel.get_state() == grpc.ChannelConnectivity.SHUTDOWN  # idle: closed at once


async def test_files_rewritten_with_the_same_bytes_keep_the_channel(gate: tuple[Gate, str, Path],
                                                                    proxy: Proxy) -> None:
    _, address, pki = gate
    first = await live(proxy.pool, address)
    proxy.mount.write_files(pki, "client")  # a new directory and inodes, the same certificate
    proxy.clock.advance(INTERVAL)
    assert await live(proxy.pool, address) is first and proxy.config.generation() == 0


async def test_the_agents_replica_client_presents_a_renewed_certificate(gate: tuple[Gate, str, Path],
                                                                        tmp_path: Path) -> None:
    servicer, address, pki = gate
    clock = FakeClock()
    mount, config = mounted(tmp_path, pki, clock)
    endpoint = TritonEndpoint(address, timeout_seconds=5.0, tls=config)
    try:
        assert await endpoint.live()
        other = tlsgen.generate(tmp_path / "other", ("client",))["client"]
        mount.write(config.current().ca, config.current().cert, other.key)  # half-written: refused
        clock.advance(INTERVAL)
        assert await endpoint.live()

        renewed = tlsgen.issue(pki, "client")
        mount.write_files(pki, "client")
        servicer.admitted = {renewed.cert}
        assert not await endpoint.live()  # not looked at yet: the old certificate, now refused
        clock.advance(INTERVAL)
        assert await endpoint.live()
        assert (await endpoint.poll([("m", "1")])).reachable
    finally:
        await endpoint.close()


def control_plane(config: tls.TLSConfig) -> ControlPlane:
    return ControlPlane(ControlPlaneSettings(tick_seconds=0.1, debounce_seconds=0.001), tls=config,
                        join_check=JoinCheck("", mutual_tls=True))


async def test_the_agents_control_plane_stream_reconnects_with_a_certificate_of_a_new_ca(tmp_path: Path) -> None:
    old = tlsgen.generate(tmp_path / "old", ("controlplane", "agent"))
    new = tlsgen.generate(tmp_path / "new", ("controlplane", "agent"))  # another CA: trusted only by cp2
    clock = FakeClock()
    mount = SecretMount(tmp_path / "secret")
    mount.write_files(tmp_path / "old", "agent")
    config = tls.TLSConfig.load(*mount.paths, reload_seconds=INTERVAL, clock=clock)
    cp1, cp2 = control_plane(old["controlplane"]), control_plane(new["controlplane"])
    ports = [await cp1.start("127.0.0.1:0"), await cp2.start("127.0.0.1:0")]
    agent = Agent(node=NodeInfo(node="n1", standby=True), control_planes=[f"127.0.0.1:{p}" for p in ports],
                  endpoints=[], tls=config, rng=random.Random(7), metrics=AgentMetrics(CollectorRegistry()),
                  settings=AgentSettings(telemetry_interval_seconds=0.25, backoff_initial_seconds=0.05,
                                         backoff_max_seconds=0.2))
    stopped = False
    try:
        await agent.start()
        await until(lambda: "n1" in nodes(cp1), within=20)
        async with tls.channel(f"127.0.0.1:{ports[1]}", config) as channel:  # cp2 refuses the old pair
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await fleet_pb2_grpc.FleetStub(channel).Connect().read()
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE

        mount.write_files(tmp_path / "new", "agent")  # cert-manager renews with the new CA
        clock.advance(INTERVAL)
        await cp1.stop(grace=0.1)  # the stream breaks: the agent goes to the next address
        stopped = True
        await until(lambda: "n1" in nodes(cp2), within=20)  # with the renewed certificate
        assert config.generation() == 1
    finally:
        await agent.stop()
        if not stopped:
            await cp1.stop(grace=0.1)
        await cp2.stop(grace=0.1)


def nodes(cp: ControlPlane) -> set[str]:
    return {m.node for m in cp.controller.fleet.members()}


@pytest.mark.parametrize("seconds", ["0", "-1", "3601", "nan"])
def test_the_reload_interval_is_bounded(tmp_path: Path, seconds: str) -> None:
    parser = argparse.ArgumentParser()
    tls.add_arguments(parser)
    tlsgen.generate(tmp_path, ("agent",))
    args = parser.parse_args([*tlsgen.paths(tmp_path, "agent"), "--tls-reload-seconds", seconds])
    with pytest.raises(ConfigError, match="--tls-reload-seconds"):
        tls.from_args(args)
