"""One KServe v2 client per replica address, created on demand, closed when its replica leaves the table.

:class:`ClientPool` hands out :class:`ReplicaClient` objects (one
``grpc.aio`` channel with Ferry's options and tritonclient's
``GRPCInferenceServiceStub`` on it, the channel and stub that
``tritonclient.grpc.aio.InferenceServerClient`` wraps, without its per-call
conversions) by address inside :meth:`ClientPool.use` (a reference count).
:meth:`ClientPool.retain` is called with the address set of every new table:
clients of addresses that left it are closed as soon as no call uses them, so
a draining replica's running streams are never cut. An address outside the
current table (a request picked just before a table change) still gets a
client, closed again when its last call ends. The pool is thus bounded by
the table's addresses plus the proxy's in-flight requests.
:meth:`ClientPool.discard` closes an address's client once its calls end
(the forwarder calls it when a connection was refused), so that the next
call connects afresh rather than failing fast through the old channel's
reconnect backoff when the replica is back. With ``tls`` read from files,
each address's client is a :class:`ferry.tls.Renewing`: the first call after
the certificate was renewed gets a new channel with it, while calls already on
the old channel finish there.

Cost: a dict lookup per call; a channel (lazy connect) per new address.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator, Callable, Collection
from typing import Any

import grpc
from tritonclient.grpc import service_pb2_grpc

from ferry.grpcutil import channel_options
from ferry.tls import Renewing, TLSConfig

ClientFactory = Callable[[str], Any]


class ReplicaClient:
    """A replica's channel and KServe v2 stub (``stub.ModelInfer``, ``stub.ModelStreamInfer``)."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.channel = channel
        self.stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)

    async def close(self) -> None:
        await self.channel.close()


def default_factory(max_message_bytes: int, tls: TLSConfig | None = None) -> ClientFactory:
    """Build clients with Ferry's channel options (message size limits, keepalive); mutual TLS with ``tls``.

    Each channel has its own subchannel pool (``grpc.use_local_subchannel_pool``): a channel made after
    :meth:`ClientPool.discard` connects afresh instead of sharing the old one's connection in backoff. No
    BDP probing (``grpc.http2.bdp_probe`` 0): each stream's receive window stays at gRPC's default (64 KiB),
    so a stream the proxy stops reading (its client does not read, :mod:`dataplane.api.service`) stops its
    replica after that much instead of a window grown to megabytes; token streams need no more.
    """
    options = [*channel_options(max_message_bytes), ("grpc.use_local_subchannel_pool", 1),
               ("grpc.http2.bdp_probe", 0)]

    def make(address: str) -> ReplicaClient:
        if tls is None:
            return ReplicaClient(grpc.aio.insecure_channel(address, options=options))
        return ReplicaClient(grpc.aio.secure_channel(address, tls.channel_credentials(), options=options))

    return make


class ClientPool:
    """Clients by replica address, reference-counted and pruned to the current table."""

    def __init__(self, factory: ClientFactory, *, tls: TLSConfig | None = None) -> None:
        self._factory = factory
        self._tls = tls  # the certificates the factory's channels present (None: never renewed)
        self._clients: dict[str, Renewing[Any]] = {}
        self._uses: dict[str, int] = {}
        self._wanted: frozenset[str] | None = None  # None: no table yet, keep everything
        self._closing: set[asyncio.Task[None]] = set()
        self._discarded: set[str] = set()  # addresses whose client closes when its last call ends

    def __len__(self) -> int:
        return len(self._clients)

    def addresses(self) -> frozenset[str]:
        """Addresses that have an open client."""
        return frozenset(self._clients)

    @contextlib.asynccontextmanager
    async def use(self, address: str) -> AsyncIterator[Any]:
        """The client of ``address`` for the duration of one call."""
        renewing = self._clients.get(address)
        if renewing is None:
            renewing = self._clients[address] = Renewing(functools.partial(self._factory, address), self._tls)
        self._uses[address] = self._uses.get(address, 0) + 1
        try:
            async with renewing.use() as client:
                yield client
        finally:
            left = self._uses[address] - 1
            if left:
                self._uses[address] = left
            else:
                del self._uses[address]
                if address in self._discarded or (self._wanted is not None and address not in self._wanted):
                    self._close(address)

    def retain(self, addresses: Collection[str]) -> None:
        """Keep the clients of ``addresses``; close the others once idle."""
        self._wanted = frozenset(addresses)
        for address in list(self._clients):
            if address not in self._wanted and address not in self._uses:
                self._close(address)

    def discard(self, address: str) -> None:
        """Close the client of ``address`` as soon as no call uses it (the next call gets a new one)."""
        if address not in self._clients:
            return
        if address in self._uses:
            self._discarded.add(address)
        else:
            self._close(address)

    def _close(self, address: str) -> None:
        self._discarded.discard(address)
        client = self._clients.pop(address, None)
        if client is None:
            return
        task = asyncio.get_running_loop().create_task(client.close())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def close(self) -> None:
        """Close every client (at proxy stop)."""
        self._wanted = frozenset()
        for address in list(self._clients):
            self._close(address)
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)
