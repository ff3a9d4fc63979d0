"""Mutual TLS between Ferry components: certificates from the throw-away CA, refusals without them."""

from __future__ import annotations

import argparse

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from ferry import grpcutil, tls
from ferry.errors import ConfigError
from harness import tlsgen


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tls.TLSConfig]:
    return tlsgen.generate(tmp_path_factory.mktemp("pki"), ("controlplane", "agent"))


async def _check(address: str, creds: grpc.ChannelCredentials | None) -> str:
    ch = grpc.aio.secure_channel(address, creds) if creds else grpc.aio.insecure_channel(address)
    try:
        reply = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=3)
        return str(health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))
    except grpc.aio.AioRpcError as exc:
        return str(exc.code().name)
    finally:
        await ch.close()


async def test_mutual_tls_admits_a_signed_client_and_refuses_others(certs, tmp_path) -> None:
    server, port = await grpcutil.start_server(
        [], "127.0.0.1:0", credentials=certs["controlplane"].server_credentials(require_client_cert=True))
    address = f"127.0.0.1:{port}"
    try:
        assert await _check(address, certs["agent"].channel_credentials()) == "SERVING"
        no_cert = grpc.ssl_channel_credentials(root_certificates=certs["agent"].ca)
        assert await _check(address, no_cert) == "UNAVAILABLE"  # handshake refused: no client certificate
        assert await _check(address, None) == "UNAVAILABLE"  # plain text to a TLS port
        stranger = tlsgen.generate(tmp_path / "other", ("agent",))["agent"]  # signed by another CA
        assert await _check(address, stranger.channel_credentials()) == "UNAVAILABLE"
    finally:
        await server.stop(0)


async def test_public_tls_needs_no_client_certificate(certs) -> None:
    server, port = await grpcutil.start_server(
        [], "127.0.0.1:0", credentials=certs["controlplane"].server_credentials(require_client_cert=False))
    try:
        creds = grpc.ssl_channel_credentials(root_certificates=certs["agent"].ca)
        assert await _check(f"127.0.0.1:{port}", creds) == "SERVING"
    finally:
        await server.stop(0)


@pytest.mark.parametrize(("argv", "outcome"), [
    (["--insecure"], None),
    ([], "--tls-cert"),
    (["--tls-ca", "x"], "--tls-cert"),
    (["--insecure", "--tls-ca", "x"], "--insecure"),
    (["--tls-ca", "/nonexistent", "--tls-cert", "/nonexistent", "--tls-key", "/nonexistent"], "--tls-ca"),
], ids=["insecure", "nothing", "partial", "both", "unreadable"])
def test_flags_require_tls_or_an_explicit_insecure(argv: list[str], outcome: str | None) -> None:
    parser = argparse.ArgumentParser()
    tls.add_arguments(parser)
    args = parser.parse_args(argv)
    if outcome is None:
        assert tls.from_args(args) is None
    else:
        with pytest.raises(ConfigError) as info:
            tls.from_args(args)
        assert info.value.key == outcome
