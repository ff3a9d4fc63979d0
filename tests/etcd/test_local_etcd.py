"""The local harness's etcd: a port lost between choosing it and etcd binding it is chosen again."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from harness import etcd as harness_etcd
from harness.etcd import EtcdFailed, LocalEtcd, etcd_binary


@pytest.fixture
def taken() -> Iterator[socket.socket]:
    """A port on 127.0.0.1 held by another listener for the test's length."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    try:
        yield sock
    finally:
        sock.close()


def test_a_kernel_chosen_port_taken_before_etcd_binds_it_is_chosen_again(monkeypatch, taken) -> None:
    assert etcd_binary() is not None
    busy = taken.getsockname()[1]
    ports = iter([busy])  # the first choice is a port another process already holds
    free = harness_etcd.free_port
    monkeypatch.setattr(harness_etcd, "free_port", lambda: next(ports, None) or free())
    server = LocalEtcd()
    assert server.client_port == busy
    try:
        server.start()
        assert server.client_port != busy and server.healthy()
    finally:
        server.close()


def test_a_given_port_that_is_taken_fails_naming_it(taken) -> None:
    busy = taken.getsockname()[1]
    server = LocalEtcd(client_port=busy)
    try:
        with pytest.raises(EtcdFailed, match="address already in use"):
            server.start(timeout=10.0)
        assert server.client_port == busy  # a port the caller chose is never moved
    finally:
        server.close()
