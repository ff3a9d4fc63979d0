"""The etcd backend of :class:`controlplane.store.base.Store`, over etcd's v3 gRPC API.

It speaks etcd v3 through the generated stubs that ship with aetcd 1.0
(``aetcd.rpc``) on a ``grpc.aio`` channel of its own, rather than through
``aetcd.Client``: that client opens a new stream for every lease refresh and
feeds watches through unbounded queues. Here:

- ``put``, ``get``, ``delete``, ``list`` (one sorted range read) and lease
  grant and revoke are unary calls, each with a deadline of ``timeout``
  seconds (default 2 s);
- ``put_if`` is one ``Txn``: ``mod_revision(key) == revision`` (0 for an
  absent key) then ``Put``: the atomic create-if-absent of leader election
  and the compare-and-put of GPU allocations; ``put_all_if`` is one ``Txn``
  with a compare and a put per key (a registration's claims);
- lease refreshes share one keep-alive stream on a thread of their own, with
  their own event loop and channel (:mod:`controlplane.store.etcdkeeper`),
  which also refreshes the leases in the caller's stead while the caller's
  loop is stalled; each watch has its own bounded stream
  (:mod:`controlplane.store.etcdstreams`);
- TTLs are whole seconds in etcd: a TTL is rounded up (at least 1 s).

Access (:mod:`controlplane.store.etcdaccess`): ``endpoint`` may list
several ``host:port`` joined by commas; the channel goes to one, and a call
that fails for connectivity moves the next call to the next one. Client TLS
and a user's token ride on every channel the store and its keeper make
(``access``, one helper for both).

Errors: an unreachable or silent etcd raises ``Unavailable`` naming the
endpoint; a refused user or key (``UNAUTHENTICATED``, ``PERMISSION_DENIED``)
raises ``Unavailable`` saying so, and both mark the store unhealthy; a TLS
handshake etcd refuses is named as such; "lease not found" raises ``LeaseNotFound``; etcd's space quota or a
request over its size limit raises ``Overloaded``. :meth:`EtcdStore.health`
reports the last outcome without I/O, from either thread. A busy process is
not a silent etcd: a call that ran out of time while the caller's loop was
late (by more than ``late_share``, a fifth, of ``timeout``, measured by the
loop's :class:`controlplane.store.loopclock.LoopClock`) still raises
``Unavailable``, saying so, but leaves the verdict as it was (a read, ``get``
or ``list``, is sent once more first: it changes nothing); the watch's
creation waits in the loop's counted time. The channel reconnects by itself with
a backoff capped at ``reconnect_max_seconds`` (1 s), so calls succeed again
within about a second of etcd's return. At most ``max_watches`` (64) watches
at once. Cost: one round trip per call (a refresh: plus a hand-off to the keeper's
thread); no call holds a lock but the verdict's own, for its update.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import grpc
from aetcd import rpc as etcd
from aetcd.utils import prefix_range_end

from controlplane.store.base import KeyValue, LeaseNotFound, Listing, StoreHealth, check_writes
from controlplane.store.etcdaccess import Endpoints, EtcdAccess, open_channel, parse_endpoints
from controlplane.store.etcdkeeper import LeaseKeeper
from controlplane.store.etcdstreams import EtcdWatch
from controlplane.store.loopclock import LoopClock
from ferry.errors import FerryError, Overloaded, Unavailable

_CONNECTIVITY = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED,
                 grpc.StatusCode.UNKNOWN)


def _explain(details: str, access: EtcdAccess) -> str:
    """gRPC's failure details, with what a TLS handshake failure means for the store's settings."""
    lowered = details.lower()
    # under TLS 1.3 a client certificate etcd refuses shows as the first read failing ("Unwrap failed (TSI_...)")
    if access.tls is not None and any(word in lowered for word in ("ssl", "handshake", "certificate", "tsi_")):
        return (f"TLS handshake failed (check controlplane.store_tls_ca, store_tls_cert, store_tls_key "
                f"against etcd's certificates): {details}")
    return details


class LoopLate(Unavailable):
    """A call ran out of time while this process's loop was late: not etcd's silence (the verdict stays)."""


def parse_endpoint(url: str) -> str:
    """``etcd://h1:p1[,h2:p2...]`` (or without the scheme) to ``h1:p1,h2:p2``; ValueError naming a bad one."""
    return ",".join(parse_endpoints(url))


class EtcdStore:
    """The store in etcd at ``endpoint`` (``host:port``, or several joined by commas), reached with ``access``
    (client TLS, user: :mod:`controlplane.store.etcdaccess`); the channel opens on the first call and moves to
    the next endpoint after a connectivity failure."""

    def __init__(
        self,
        endpoint: str,
        *,
        timeout: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
        max_watches: int = 64,
        watch_queue: int = 4096,
        reconnect_max_seconds: float = 1.0,
        stand_in_seconds: float = 10.0,
        late_share: float = 0.2,
        access: EtcdAccess | None = None,
    ) -> None:
        self.endpoint = parse_endpoint(endpoint)
        self.endpoints = Endpoints(parse_endpoints(endpoint))
        self.access = access or EtcdAccess()
        self.timeout = timeout
        self._clock = clock
        self._max_watches = max_watches
        self._watch_queue = watch_queue
        self._reconnect_ms = int(reconnect_max_seconds * 1000)
        self._channel: grpc.aio.Channel | None = None
        self._kv: Any = None
        self._lease: Any = None
        self._watch_stub: Any = None
        self._late_share = late_share
        self._health_lock = threading.Lock()  # the keeper reports from its thread
        self._watches: list[EtcdWatch] = []
        self._closing: set[asyncio.Task[None]] = set()  # channels of endpoints left behind, being closed
        self._health = StoreHealth("etcd", self.endpoint, ok=True)
        self.loop_clock = LoopClock(clock=clock)  # the caller's loop, started with the channel
        self._options: list[tuple[str, Any]] = [
            ("grpc.max_receive_message_length", 64 * 1024 * 1024),
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.min_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", self._reconnect_ms),
            ("grpc.keepalive_time_ms", 10_000),  # etcd refuses pings more often than every 5 s
            ("grpc.keepalive_timeout_ms", 5_000),
        ]
        # the keeper's errors name every endpoint: its channel follows the store's at its next failure
        self.keeper = LeaseKeeper(self._open, lambda: self.endpoints.current, where=f"etcd at {self.endpoint}",
                                  timeout=timeout, owner=self.loop_clock, on_outcome=self._outcome,
                                  stand_in_seconds=stand_in_seconds, clock=clock)

    @property
    def _where(self) -> str:
        return f"etcd at {self.endpoints.current}"

    def _open(self) -> grpc.aio.Channel:
        """A new channel to the current endpoint (this store's and, on its thread, the keeper's)."""
        return open_channel(self.endpoints.current, self.access, self._options, timeout=self.timeout)

    def _rotate(self, channel: grpc.aio.Channel | None) -> None:
        """After a connectivity failure on ``channel``: the next call goes to the next endpoint (when there is
        one). A failure on a channel already left behind (a call cancelled by its closing) moves nothing."""
        if channel is None or channel is not self._channel or not self.endpoints.rotate():
            return
        old, self._channel = self._channel, None
        closing = asyncio.get_running_loop().create_task(old.close())
        self._closing.add(closing)
        closing.add_done_callback(self._closing.discard)

    def _stubs(self) -> tuple[Any, Any, Any]:
        if self._channel is None:
            self.loop_clock.start()
            self._channel = self._open()
            self._kv = etcd.KVStub(self._channel)
            self._lease = etcd.LeaseStub(self._channel)
            self._watch_stub = etcd.WatchStub(self._channel)
        return self._kv, self._lease, self._watch_stub

    def health(self) -> StoreHealth:
        return self._health

    def _ok(self) -> None:
        if not self._health.ok or self._clock() - self._health.last_ok > 0.05:
            with self._health_lock:
                self._health = StoreHealth("etcd", self.endpoint, ok=True, last_ok=self._clock())

    def _unreachable(self, error: str) -> None:
        with self._health_lock:
            self._health = StoreHealth("etcd", self.endpoint, ok=False, error=error, last_ok=self._health.last_ok)

    def _outcome(self, error: str) -> None:
        """The keeper's verdict on a refresh ("" answered), from its thread."""
        if error:
            self._unreachable(error)
        else:
            self._ok()

    def lease_confirmed(self, lease: int) -> float:
        return self.keeper.confirmed_at(lease)

    def _failed(self, exc: grpc.aio.AioRpcError, what: str, started: tuple[float, float],
                channel: grpc.aio.Channel | None) -> FerryError:
        code, details = exc.code(), exc.details() or ""
        late = self.loop_clock.late_between(*started)
        if code == grpc.StatusCode.DEADLINE_EXCEEDED and late > self.timeout * self._late_share:
            return LoopLate(f"{self._where}: {what} got no answer within {self.timeout:g} s while this process's "
                            f"loop was {late:.1f} s late (not counted against etcd)")
        if "lease not found" in details:
            self._ok()
            return LeaseNotFound(0)
        if code == grpc.StatusCode.RESOURCE_EXHAUSTED or "too large" in details or "space exceeded" in details:
            self._ok()
            return Overloaded(f"{self._where} refused {what}: {details}", retry_after=1.0)
        if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
            error = Unavailable(f"{self._where} refused {what}: {details}")
            self._unreachable(str(error))
            return error
        error = Unavailable(f"{self._where} unreachable ({what}: {code.name} {_explain(details, self.access)})")
        if code in _CONNECTIVITY:
            self._unreachable(str(error))
            self._rotate(channel)
        return error

    async def _unary(self, what: str, method: Any, request: Any, *, read: bool = False) -> Any:
        channel = self._channel  # the stub's (the caller just took it from _stubs)
        for again in (False, True):
            started = self.loop_clock.mark()
            try:
                response = await method(request, timeout=self.timeout)
                break
            except grpc.aio.AioRpcError as exc:
                error = self._failed(exc, what, started, channel)
                if not read or again or not isinstance(error, LoopLate):
                    raise error from exc  # a read that ran out of time only because this loop was late: once more
        self._ok()
        return response

    async def put(self, key: str, value: bytes, *, lease: int = 0) -> int:
        kv = self._stubs()[0]
        try:
            response = await self._unary("put", kv.Put, etcd.PutRequest(key=key.encode(), value=value, lease=lease))
        except LeaseNotFound as exc:
            raise LeaseNotFound(lease) from exc
        return int(response.header.revision)

    async def put_if(self, key: str, value: bytes, *, revision: int, lease: int = 0) -> int:
        kv = self._stubs()[0]
        compare = etcd.Compare(result=etcd.Compare.EQUAL, target=etcd.Compare.MOD, key=key.encode(),
                               mod_revision=revision)
        put = etcd.RequestOp(request_put=etcd.PutRequest(key=key.encode(), value=value, lease=lease))
        try:
            response = await self._unary("put_if", kv.Txn, etcd.TxnRequest(compare=[compare], success=[put]))
        except LeaseNotFound as exc:
            raise LeaseNotFound(lease) from exc
        return int(response.header.revision) if response.succeeded else 0

    async def put_all_if(self, writes: Sequence[tuple[str, bytes, int]], *, lease: int = 0) -> int:
        check_writes(writes)
        kv = self._stubs()[0]
        compares = [etcd.Compare(result=etcd.Compare.EQUAL, target=etcd.Compare.MOD, key=key.encode(),
                                 mod_revision=revision) for key, _, revision in writes]
        puts = [etcd.RequestOp(request_put=etcd.PutRequest(key=key.encode(), value=value, lease=lease))
                for key, value, _ in writes]
        try:
            response = await self._unary("put_all_if", kv.Txn, etcd.TxnRequest(compare=compares, success=puts))
        except LeaseNotFound as exc:
            raise LeaseNotFound(lease) from exc
        return int(response.header.revision) if response.succeeded else 0

    async def get(self, key: str) -> KeyValue | None:
        kv = self._stubs()[0]
        response = await self._unary("get", kv.Range, etcd.RangeRequest(key=key.encode()), read=True)
        if not response.kvs:
            return None
        item = response.kvs[0]
        return KeyValue(key, bytes(item.value), int(item.mod_revision), int(item.lease))

    async def delete(self, key: str) -> int:
        kv = self._stubs()[0]
        response = await self._unary("delete", kv.DeleteRange, etcd.DeleteRangeRequest(key=key.encode()))
        return int(response.header.revision) if response.deleted else 0

    async def list(self, prefix: str) -> Listing:
        kv = self._stubs()[0]
        start = prefix.encode()
        request = etcd.RangeRequest(key=start, range_end=prefix_range_end(start),
                                    sort_order=etcd.RangeRequest.ASCEND, sort_target=etcd.RangeRequest.KEY)
        response = await self._unary("list", kv.Range, request, read=True)
        items = tuple(KeyValue(i.key.decode(), bytes(i.value), int(i.mod_revision), int(i.lease))
                      for i in response.kvs)
        return Listing(items, int(response.header.revision))

    async def grant_lease(self, ttl_seconds: float) -> int:
        if ttl_seconds <= 0:
            raise ValueError("ttl_seconds must be > 0")
        lease = self._stubs()[1]
        ttl = max(1, math.ceil(ttl_seconds))
        sent = self._clock()
        response = await self._unary("grant_lease", lease.LeaseGrant, etcd.LeaseGrantRequest(TTL=ttl))
        if response.error:
            raise Unavailable(f"{self._where} refused a lease: {response.error}")
        self.keeper.granted(int(response.ID), float(response.TTL or ttl), sent)
        return int(response.ID)

    async def refresh_lease(self, lease: int) -> None:
        self._stubs()  # the caller's loop clock runs: the keeper stands in while it stalls
        await self.keeper.refresh(lease)  # the keeper reports the verdict

    async def refresh_leases(self, leases: Sequence[int]) -> Sequence[FerryError | None]:
        self._stubs()
        return await self.keeper.refresh_all(leases)  # one hand-off to the keeper's thread for all of them

    async def revoke_lease(self, lease: int) -> None:
        stub = self._stubs()[1]
        try:
            await self._unary("revoke_lease", stub.LeaseRevoke, etcd.LeaseRevokeRequest(ID=lease))
        except LeaseNotFound:
            pass
        finally:
            self.keeper.forget(lease)

    async def watch(self, prefix: str) -> EtcdWatch:
        if len(self._watches) >= self._max_watches:
            raise Overloaded(f"{self._max_watches} watches are open on {self._where}", retry_after=1.0)
        stub, channel = self._stubs()[2], self._channel
        watch = EtcdWatch(stub, prefix, where=self._where, limit=self._watch_queue, on_close=self._forget)
        self._watches.append(watch)
        try:
            await watch.start(self.timeout, self.loop_clock.wait)
        except Unavailable as exc:
            self._forget(watch)
            self._unreachable(str(exc))
            self._rotate(channel)
            raise
        self._ok()
        return watch

    def _forget(self, watch: EtcdWatch) -> None:
        if watch in self._watches:
            self._watches.remove(watch)

    async def close(self) -> None:
        for watch in list(self._watches):
            await watch.close()
        await self.keeper.close()
        for closing in list(self._closing):
            await closing
        if self._channel is not None:
            await self._channel.close()
            self._channel = None
        await self.loop_clock.stop()
