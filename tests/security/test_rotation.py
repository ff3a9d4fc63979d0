"""Certificates rotated without a restart, with a real proxy process: after its files are replaced, a new
connection to the gRPC port (at once) and to the HTTPS front door (within the reload period) is shown the new
certificate, while a connection opened before keeps working; a half-written rotation (a key that does not match
its certificate) keeps the last good pair."""

from __future__ import annotations

import os
import shutil
import socket
import ssl
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from ferry.procs import Child
from harness import tlsgen
from tests.e2e.harness import wait_for


def _served_certificate(address: str, alpn: str) -> bytes:
    """The DER certificate a new TLS connection to ``address`` is shown (verification off: only the bytes matter)."""
    host, _, port = address.rpartition(":")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.set_alpn_protocols([alpn])
    with socket.create_connection((host, int(port)), timeout=5) as raw, \
            context.wrap_socket(raw, server_hostname="localhost") as conn:
        der = conn.getpeercert(binary_form=True)
    assert der is not None
    return der


def _der(pem_path: Path) -> bytes:
    return ssl.PEM_cert_to_DER_cert(pem_path.read_text())


def _replace(source: Path, target: Path) -> None:
    """Write ``target`` as ``source``'s copy, atomically (a rename), as a secret mounter does."""
    tmp = target.with_name(f".{target.name}.tmp")
    shutil.copyfile(source, tmp)
    os.replace(tmp, target)


def test_a_rotated_certificate_is_served_to_new_connections_without_a_restart(tmp_path: Path) -> None:
    old, new, live = tmp_path / "old", tmp_path / "new", tmp_path / "live"
    tlsgen.generate(old, ("proxy",))
    tlsgen.generate(new, ("proxy",))  # another CA, another key
    live.mkdir()
    for name in ("ca.pem", "proxy.pem", "proxy.key"):
        shutil.copyfile(old / name, live / name)
    proxy = Child("proxy", ["proxy", "--workers", "1", "--control-plane", "127.0.0.1:1", "--http-listen",
                            "127.0.0.1:0", *tlsgen.paths(live, "proxy")], tmp_path).start()
    try:
        ready = proxy.wait_ready()
        grpc_address, http_address = ready["grpc"], ready["http"]
        assert _served_certificate(grpc_address, "h2") == _der(old / "proxy.pem")
        assert _served_certificate(http_address, "http/1.1") == _der(old / "proxy.pem")
        before = grpc.secure_channel(grpc_address, grpc.ssl_channel_credentials((old / "ca.pem").read_bytes()))
        health = health_pb2_grpc.HealthStub(before)
        health.Check(health_pb2.HealthCheckRequest(), timeout=5)  # the connection is open

        _replace(new / "proxy.key", live / "proxy.key")  # half-way: the new key beside the old certificate
        assert _served_certificate(grpc_address, "h2") == _der(old / "proxy.pem")
        _replace(new / "proxy.pem", live / "proxy.pem")
        _replace(new / "ca.pem", live / "ca.pem")
        assert _served_certificate(grpc_address, "h2") == _der(new / "proxy.pem")
        wait_for(lambda: _served_certificate(http_address, "http/1.1") == _der(new / "proxy.pem"), 30,
                 "the HTTPS front door to serve the new certificate")
        health.Check(health_pb2.HealthCheckRequest(), timeout=5)  # the old connection still serves
        with grpc.secure_channel(grpc_address, grpc.ssl_channel_credentials((new / "ca.pem").read_bytes())) as ch:
            health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)  # verified: new CA
        before.close()
        assert proxy.alive()
        assert "certificate reloaded" in proxy.log_path.read_text()
    finally:
        proxy.stop()
