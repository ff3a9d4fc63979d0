"""The two long-lived etcd streams behind :class:`controlplane.store.etcd.EtcdStore`: keep-alives and watches.

:class:`KeepAlives` multiplexes every lease refresh of a control plane onto
one ``Lease.LeaseKeepAlive`` stream (aetcd opens a new stream per refresh):
:meth:`KeepAlives.refresh` queues a request and waits for the answer naming
that lease; etcd answers requests in order, and a TTL of 0 means the lease is
gone. At most ``max_pending`` (4,096) refreshes wait at once (a further one
raises ``Overloaded``); each waits at most ``timeout`` seconds (then
``Unavailable``), measured by ``wait``: the lease keeper
(:mod:`controlplane.store.etcdkeeper`) passes its loop's
:meth:`controlplane.store.loopclock.LoopClock.wait`, so that its own loop
being late is not counted as etcd's silence. When the stream breaks, every waiting refresh fails with
``Unavailable`` and the next one opens a new stream. Cost: one small message
each way per refresh; no raft write on etcd 3.4 (renewal is leader-local).

:class:`EtcdWatch` is one ``Watch`` stream per watched prefix. Events go to a
bounded queue (``limit``, 4,096): a consumer that falls that far behind, a
stream that breaks or ends, a compaction past the watch, or a cancel from the
server all end the iteration with :class:`controlplane.store.base.WatchLost`.
Creation waits at most ``timeout`` seconds for etcd's ``created`` (measured
by ``wait``, as for keep-alives).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc
from aetcd import rpc as etcd
from aetcd.utils import prefix_range_end

from controlplane.store.base import EventKind, LeaseNotFound, WatchEvent, WatchLost
from ferry.errors import Overloaded, Unavailable

T = TypeVar("T")


async def plain_wait(future: asyncio.Future[T], seconds: float) -> T:
    """``future``'s result within ``seconds`` of the plain clock (TimeoutError; the future is not cancelled)."""
    return await asyncio.wait_for(asyncio.shield(future), seconds)


Wait = Callable[[asyncio.Future[Any], float], Awaitable[Any]]


class KeepAlives:
    """Lease refreshes over one shared ``LeaseKeepAlive`` stream."""

    def __init__(self, stub: Callable[[], Any], *, where: str, timeout: float, max_pending: int = 4096,
                 wait: Wait = plain_wait) -> None:
        self._stub = stub
        self._wait = wait
        self._where = where
        self._timeout = timeout
        self._max_pending = max_pending
        self._requests: asyncio.Queue[Any] | None = None
        self._reader: asyncio.Task[None] | None = None
        self._call: Any = None
        self._waiting: dict[int, deque[asyncio.Future[int]]] = {}
        self._pending = 0

    async def refresh(self, lease: int) -> int:
        """Refresh ``lease``; its TTL in seconds as etcd answered; LeaseNotFound when etcd no longer has it."""
        if self._pending >= self._max_pending:
            raise Overloaded(f"{self._max_pending} lease refreshes are waiting on {self._where}", retry_after=1.0)
        self._open()
        assert self._requests is not None
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(lease, deque()).append(future)
        self._pending += 1
        try:
            self._requests.put_nowait(etcd.LeaseKeepAliveRequest(ID=lease))
            ttl = await self._wait(future, self._timeout)
        except TimeoutError as exc:
            raise Unavailable(f"{self._where}: no keep-alive answer within {self._timeout:g} s") from exc
        finally:
            self._pending -= 1
            queue = self._waiting.get(lease)
            if queue is not None and future in queue:
                queue.remove(future)
            if queue is not None and not queue:
                del self._waiting[lease]
        if ttl <= 0:
            raise LeaseNotFound(lease)
        return int(ttl)

    def _open(self) -> None:
        if self._reader is not None and not self._reader.done():
            return
        self._requests = requests = asyncio.Queue[Any]()

        async def send() -> AsyncIterator[Any]:
            while True:
                yield await requests.get()

        self._call = self._stub().LeaseKeepAlive(send())
        self._reader = asyncio.ensure_future(self._read(self._call))

    async def _read(self, call: Any) -> None:
        error: BaseException = Unavailable(f"{self._where}: keep-alive stream ended")
        try:
            async for response in call:
                queue = self._waiting.get(response.ID)
                while queue:
                    future = queue.popleft()
                    if not future.done():
                        future.set_result(int(response.TTL))
                        break
        except grpc.aio.AioRpcError as exc:
            error = Unavailable(f"{self._where}: keep-alive stream failed: {exc.code().name} {exc.details()}")
        except asyncio.CancelledError:
            error = Unavailable(f"{self._where}: keep-alive stream closed")
            raise
        finally:
            for queue in self._waiting.values():
                for future in queue:
                    if not future.done():
                        future.set_exception(error)

    async def close(self) -> None:
        if self._call is not None:
            self._call.cancel()
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reader
        self._reader = None


class EtcdWatch:
    """The events under one prefix from one etcd ``Watch`` stream, through a bounded queue."""

    def __init__(
        self, stub: Any, prefix: str, *, where: str, limit: int, on_close: Callable[[EtcdWatch], None],
    ) -> None:
        self.prefix = prefix
        self._where = where
        self._limit = limit
        self._on_close = on_close
        self._queue: asyncio.Queue[WatchEvent | None] = asyncio.Queue(maxsize=limit + 1)
        self._requests: asyncio.Queue[Any] = asyncio.Queue()
        self._call: Any = stub.Watch(self._send())
        self._reader: asyncio.Task[None] | None = None
        self.lost = ""

    async def _send(self) -> AsyncIterator[Any]:
        while True:
            yield await self._requests.get()

    async def start(self, wait_seconds: float, wait: Wait = plain_wait) -> EtcdWatch:
        """Create the watch; returns once etcd confirmed it (Unavailable after ``wait_seconds``, by ``wait``)."""
        key = self.prefix.encode()
        create = etcd.WatchCreateRequest(key=key, range_end=prefix_range_end(key))
        self._requests.put_nowait(etcd.WatchRequest(create_request=create))
        read = asyncio.ensure_future(self._call.read())
        try:
            first = await wait(read, wait_seconds)
        except (TimeoutError, grpc.aio.AioRpcError) as exc:
            read.cancel()
            self._call.cancel()
            detail = exc.details() if isinstance(exc, grpc.aio.AioRpcError) else f"no answer within {wait_seconds:g} s"
            raise Unavailable(f"{self._where}: cannot watch {self.prefix!r}: {detail}") from exc
        if first is grpc.aio.EOF or not first.created or first.canceled:
            self._call.cancel()
            raise Unavailable(f"{self._where}: watch of {self.prefix!r} refused")
        self._reader = asyncio.ensure_future(self._read())
        return self

    async def _read(self) -> None:
        reason = "the stream ended"
        try:
            while True:
                response = await self._call.read()
                if response is grpc.aio.EOF:
                    break
                if response.canceled or response.compact_revision:
                    reason = f"etcd cancelled it (compacted at {response.compact_revision})"
                    break
                for event in response.events:
                    kind = EventKind.DELETE if event.type == etcd.Event.DELETE else EventKind.PUT
                    value = b"" if kind is EventKind.DELETE else bytes(event.kv.value)
                    if not self._offer(WatchEvent(kind, event.kv.key.decode(), value, int(event.kv.mod_revision))):
                        return
        except grpc.aio.AioRpcError as exc:
            reason = f"{exc.code().name} {exc.details()}"
        self._lose(reason)

    def _offer(self, event: WatchEvent) -> bool:
        if self.lost:
            return False
        if self._queue.qsize() >= self._limit:
            self._lose(f"it fell behind by {self._limit} events")
            return False
        self._queue.put_nowait(event)
        return True

    def _lose(self, reason: str) -> None:
        if not self.lost:
            self.lost = reason
            self._queue.put_nowait(None)  # the one slot kept free for this
            self._call.cancel()
            self._on_close(self)

    async def __aiter__(self) -> AsyncIterator[WatchEvent]:
        while True:
            event = await self._queue.get()
            if event is None:
                raise WatchLost(f"{self._where}: watch of {self.prefix!r} lost: {self.lost}")
            yield event

    async def close(self) -> None:
        self._lose("closed")
        if self._reader is not None and self._reader is not asyncio.current_task():
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
