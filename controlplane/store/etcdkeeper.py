"""Lease keep-alives on a thread of their own, so that a busy control plane keeps its leases and its verdict.

The control plane's event loop computes tables and serves proxies; at 5,000
replicas one pass holds it for tens of milliseconds, a burst of work for
seconds. Keep-alives that ran on that loop were answered by etcd in time but
read late, past their timeout: the store was reported unreachable and drains
were refused while etcd was fine, and a loop blocked for longer than a TTL
lost its leases. :class:`LeaseKeeper` moves them off it:

- **Own thread, own loop, own channel.** The keeper runs an event loop in a
  daemon thread with its own ``grpc.aio`` channel to etcd (made by the
  store's one helper, so with its TLS and token; after a failed refresh the
  channel is made again, to the endpoint the store now uses) and one shared
  ``LeaseKeepAlive`` stream (:class:`controlplane.store.etcdstreams.KeepAlives`).
  :meth:`LeaseKeeper.refresh`, called on the owner's loop, runs the refresh
  there and returns its answer; :meth:`LeaseKeeper.refresh_all` runs many
  (the members due in one pass) for one hand-off. A thread, not a task priority: asyncio has no
  priorities, and a task on a loop that one computation holds waits for it
  whatever its rank. Python's GIL still switches to the keeper's thread
  every few milliseconds while the owner computes.
- **Timeouts in counted time.** A refresh waits at most ``timeout`` seconds
  of the keeper loop's counted time (:class:`controlplane.store.loopclock.LoopClock`):
  when the keeper itself is late (a long GIL hold), that lateness is not
  etcd's silence. The verdict ``unreachable`` (``on_outcome``) comes only from
  etcd not answering, or the stream failing.
- **Standing in.** The owner keeps refreshing its leases as before (the
  election every third of its TTL, the members at each sync). While the
  owner's loop is stalled (its :class:`LoopClock` has not ticked for
  ``stall_seconds``, 0.25 s) the keeper refreshes in its stead every lease
  the owner was refreshing when it stalled (asked for within one TTL before
  the stall) once half of that lease's TTL has passed since its last answered
  refresh, for at most ``stand_in_seconds`` (10 s) of stall: a busy control
  plane keeps its leases, a wedged one loses them. When the owner's loop runs,
  the keeper refreshes nothing on its own: a lease the owner stops refreshing
  (a node gone) runs out as before.
- A lease granted (:meth:`LeaseKeeper.granted`) counts as refreshed by the
  owner at the grant.
- :meth:`LeaseKeeper.confirmed_at` is when the last answered refresh of a
  lease was sent (the owner's or a stand-in): the election's fencing
  (:mod:`controlplane.cluster.election`) counts from it, so that leadership
  does not flicker after a stall.

Bounds: the held leases are those refreshed within ``2 x TTL`` (older ones are
dropped while the owner runs); at most ``max_pending`` refreshes wait at once.
Cost: a thread, a loop waking every ``tick`` (0.1 s), one message each way per
refresh, one cross-thread hand-off per owner call.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from aetcd import rpc as etcd

from controlplane.store.base import LeaseNotFound
from controlplane.store.etcdstreams import KeepAlives
from controlplane.store.loopclock import LoopClock
from ferry.errors import FerryError, Unavailable

log = logging.getLogger(__name__)


@dataclass
class Held:
    """One lease as the keeper knows it: its TTL, the owner's last ask, the last answered send."""

    ttl: float = 0.0
    asked: float = float("-inf")  # when the owner last asked for a refresh (keeper clock)
    sent: float = float("-inf")  # when the last refresh etcd answered was sent
    pending: bool = False


def stand_ins(held: Mapping[int, Held], *, now: float, stalled: float, stall_seconds: float,
              stand_in_seconds: float) -> tuple[list[int], list[int]]:
    """The keeper's decision at ``now``: (leases to refresh in the owner's stead, leases to forget).

    ``stalled``: seconds since the owner's loop last ticked. Standing in while ``stall_seconds <=
    stalled <= stand_in_seconds``: a lease not being refreshed already, whose TTL is known, that the
    owner asked for within one TTL before its loop stalled, and whose last answered refresh was sent
    half a TTL ago or more. Forgotten while the owner runs: a lease not asked for in two TTLs.
    """
    refresh: list[int] = []
    drop: list[int] = []
    standing_in = stall_seconds <= stalled <= stand_in_seconds
    for lease, h in held.items():
        if not standing_in:
            if stalled < stall_seconds and h.ttl and now - h.asked > 2 * h.ttl:
                drop.append(lease)
        elif not h.pending and h.ttl and h.asked >= now - stalled - h.ttl and now - h.sent >= h.ttl / 2:
            refresh.append(lease)
    return refresh, drop


class LeaseKeeper:
    """Lease refreshes of one store client on a thread of their own (see the module docstring).

    Parameters: ``open_channel`` (makes a channel to the store's current endpoint, with its TLS and token:
    :func:`controlplane.store.etcdaccess.open_channel`; called on the keeper's thread), ``endpoint`` (the store's
    current endpoint: after a failed refresh the channel is made again when it differs), ``where`` (names etcd in
    errors), ``timeout`` (counted seconds a refresh waits), ``owner`` (the owner loop's clock),
    ``on_outcome`` (called on the keeper's thread with "" after an answer, else the error),
    ``stall_seconds``, ``stand_in_seconds``, ``tick``, ``max_pending``, ``clock``.
    """

    def __init__(
        self,
        open_channel: Callable[[], grpc.aio.Channel],
        endpoint: Callable[[], str],
        *,
        where: str,
        timeout: float,
        owner: LoopClock,
        on_outcome: Callable[[str], None],
        stall_seconds: float = 0.25,
        stand_in_seconds: float = 10.0,
        tick: float = 0.1,
        max_pending: int = 4096,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._open_channel = open_channel
        self._endpoint = endpoint
        self._target = ""  # the endpoint the keeper's channel goes to
        self._where = where
        self._timeout = timeout
        self._owner = owner
        self._on_outcome = on_outcome
        self._stall = stall_seconds
        self._stand_in_for = stand_in_seconds
        self._tick = tick
        self._max_pending = max_pending
        self._clock = clock
        self._held: dict[int, Held] = {}  # touched on the keeper's loop only
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._lock = threading.Lock()
        self._channel: grpc.aio.Channel | None = None
        self._keepalives: KeepAlives | None = None
        self._stub: Any = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.clock = LoopClock(clock=clock)  # the keeper loop's own counted time
        self.stood_in = 0  # refreshes sent in the owner's stead

    # -- the owner's side (any thread)

    def _start(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name="etcd-lease-keeper", daemon=True)
                self._thread.start()
        self._ready.wait()
        assert self._loop is not None
        return self._loop

    async def refresh(self, lease: int) -> int:
        """Refresh ``lease`` on the keeper's thread; its TTL. LeaseNotFound, Unavailable as etcd answers."""
        loop = self._start()
        asked = self._clock()
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(self._refresh(lease, asked), loop))

    async def refresh_all(self, leases: Sequence[int]) -> list[FerryError | None]:
        """Refresh every one of ``leases`` on the keeper's thread, handed over once; each one's error or None."""
        if not leases:
            return []
        loop = self._start()
        asked = self._clock()
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(self._refresh_all(leases, asked), loop))

    def granted(self, lease: int, ttl: float, sent: float) -> None:
        """``lease`` (TTL ``ttl``) was granted by a call sent at ``sent``: known, as if just refreshed."""
        loop = self._start()
        loop.call_soon_threadsafe(self._granted, lease, ttl, sent)

    def _granted(self, lease: int, ttl: float, sent: float) -> None:
        held = self._held.setdefault(lease, Held())
        held.ttl, held.asked, held.sent = ttl, max(held.asked, sent), max(held.sent, sent)

    def forget(self, lease: int) -> None:
        """Stop knowing ``lease`` (revoked): it is no longer stood in for."""
        if self._loop is not None:
            with contextlib.suppress(RuntimeError):  # the keeper is closing: nothing to forget
                self._loop.call_soon_threadsafe(self._held.pop, lease, None)

    def confirmed_at(self, lease: int) -> float:
        """When (keeper clock) the last refresh of ``lease`` that etcd answered was sent; -inf when none."""
        held = self._held.get(lease)
        return held.sent if held is not None else float("-inf")

    async def close(self) -> None:
        """Stop the keeper's loop and thread (the pending refreshes fail with Unavailable)."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        with contextlib.suppress(RuntimeError):
            await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(self._shutdown(), loop))
            loop.call_soon_threadsafe(loop.stop)
        await asyncio.to_thread(thread.join, 5.0)
        self._thread = self._loop = None

    # -- the keeper's thread

    def _serve(self) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        self._loop = loop
        loop.call_soon(self._begin)
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            loop.close()

    def _begin(self) -> None:
        self.clock.start()
        self._target = self._endpoint()
        self._channel = self._open_channel()  # the store's helper: its endpoint, TLS and token
        self._stub = etcd.LeaseStub(self._channel)
        self._keepalives = KeepAlives(lambda: self._stub, where=self._where, timeout=self._timeout,
                                      max_pending=self._max_pending, wait=self.clock.wait)
        self._spawn(self._stand_in_loop())

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _refresh(self, lease: int, asked: float) -> int:
        assert self._keepalives is not None
        held = self._held.setdefault(lease, Held())
        held.asked = max(held.asked, asked)
        held.pending = True
        sent = self._clock()
        try:
            ttl = await self._keepalives.refresh(lease)
        except LeaseNotFound:
            self._held.pop(lease, None)
            self._on_outcome("")
            raise
        except Unavailable as exc:
            self._on_outcome(str(exc))
            await self._reopen()
            raise
        finally:
            held.pending = False
        held.ttl, held.sent = float(ttl), max(held.sent, sent)
        self._on_outcome("")
        return ttl

    async def _refresh_all(self, leases: Sequence[int], asked: float) -> list[FerryError | None]:
        outcomes = await asyncio.gather(*(self._refresh(lease, asked) for lease in leases), return_exceptions=True)
        out: list[FerryError | None] = []
        for outcome in outcomes:
            if isinstance(outcome, FerryError):
                out.append(outcome)
            elif isinstance(outcome, BaseException):
                raise outcome  # a bug or a cancellation: not a lease's answer
            else:
                out.append(None)
        return out

    async def _reopen(self) -> None:
        """A new channel when the store has moved to another endpoint; the next stream opens on it."""
        if self._endpoint() == self._target:
            return
        self._target = self._endpoint()
        old, self._channel = self._channel, self._open_channel()
        self._stub = etcd.LeaseStub(self._channel)
        if old is not None:
            await old.close()

    async def _stand_in_loop(self) -> None:
        while True:
            await asyncio.sleep(self._tick)
            try:
                self._stand_in()
            except Exception:  # the keeper must outlive a bug in one pass
                log.exception("lease keeper pass failed")

    def _stand_in(self) -> None:
        """Refresh, in the owner's stead, the leases it was keeping when its loop stalled; prune the others."""
        refresh, drop = stand_ins(self._held, now=self._clock(), stalled=self._owner.stalled_for(),
                                  stall_seconds=self._stall, stand_in_seconds=self._stand_in_for)
        for lease in drop:
            del self._held[lease]  # the owner stopped refreshing it: left to run out
        for lease in refresh:
            self.stood_in += 1
            self._spawn(self._quiet_refresh(lease, self._held[lease].asked))

    async def _quiet_refresh(self, lease: int, asked: float) -> None:
        with contextlib.suppress(Unavailable):  # the verdict is reported; the owner sees the rest when it asks
            await self._refresh(lease, asked)

    async def _shutdown(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._keepalives is not None:
            await self._keepalives.close()
        if self._channel is not None:
            await self._channel.close()
        await self.clock.stop()
