"""Table watchers (proxy streams) and what each proxy last applied.

Each watch stream has a :class:`Watcher` with a one-slot keep-latest
:class:`controlplane.mailbox.Mailbox` of the region's newest
:class:`controlplane.tables.feed.Push`: a newer table replaces one not yet
sent, so a slow proxy gets the latest version, never a backlog (bounded
memory per stream; the skipped versions are superseded). What goes out are
the push's bytes, serialized once for every proxy, with the stream's nonce
appended (:func:`controlplane.tables.feed.stamp`). A proxy that subscribed
with ``deltas`` is sent, from the version the watcher believes it holds (its
``have_version``, then each version sent), the chain of deltas the feed
keeps (:meth:`controlplane.tables.feed.Feed.chain`; an empty delta when it
holds the newest already, at subscribe), else the full table; any other proxy
always the full table. A NACK (``applied`` false) makes the holding unknown:
the next version goes in full; a resync (``Ack.resync``) sends the newest
version in full at once.
Every send carries a nonce, the stream's send count; an ``Ack`` is taken only
for a nonce this stream sent and newer than the last one acked (as xDS drops
stale nonces); the rest are ignored and counted by the caller.

:class:`ProxyStatus` is kept per proxy id beyond its stream, for
``Admin.GetTable``: the version it applied, the reason of its last rejection,
connected or not, when it last acked (before its first ack: when it subscribed), and the router config
version it runs or refused (:mod:`controlplane.routerconfig`). Lag is the region's version minus the
applied one (versions of a region grow by one per change); before its first
ack, the versions of the region since the first one sent to it.

Bounds and outcomes: ``max_watchers`` (1,024) streams at once, a further
subscribe raises ``Overloaded`` (RESOURCE_EXHAUSTED); ``max_proxies`` (4,096)
statuses, a new proxy beyond it evicts the disconnected one seen longest ago;
rejection reasons are cut to 1,024 characters. A proxy id that subscribes
again replaces its earlier stream, which is closed with a reason.
Cost: O(watchers of the region) per published version, O(1) per ack, one
copy of the bytes per send (the nonce appended).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from controlplane.mailbox import Mailbox
from controlplane.tables.feed import Feed, Push, empty_delta, stamp
from ferry.errors import Overloaded
from ferry.v1 import tables_pb2

MAX_ERROR_CHARS = 1024


@dataclass
class ProxyStatus:
    """One proxy as its table stream shows it: region, when seen, connected, and the versions sent and applied."""

    proxy_id: str
    region: str
    subscribed_at: float
    last_seen: float
    connected: bool = True
    applied_version: int = 0
    first_sent_version: int = 0
    last_error: str = ""
    last_ack_at: float | None = None
    router_version: int = 0  # the router config version it runs (Ack.router_version; controlplane.routerconfig)
    router_refused: int = 0  # a router config version it refused, and why (Ack.router_refused, router_error)
    router_error: str = ""

    def lag(self, region_version: int) -> int:
        """Versions the proxy is behind ``region_version``."""
        if self.applied_version:
            return max(0, region_version - self.applied_version)
        if self.first_sent_version:
            return max(0, region_version - self.first_sent_version + 1)
        return 0


@dataclass(frozen=True, slots=True)
class Send:
    """One message for a proxy: its bytes (nonce included), version, and whether it is a delta."""

    data: bytes
    version: int
    delta: bool


class Watcher:
    """One watch stream: a one-slot mailbox of the region's newest push, and the deltas still to send."""

    def __init__(self, status: ProxyStatus, feed: Feed, *, deltas: bool = False, have_version: int = 0) -> None:
        self.status = status
        self._feed = feed
        self._outbox: Mailbox[Push] = Mailbox.latest()
        self._queue: deque[tuple[Push, bool]] = deque()  # (push, as a delta) still to send
        self.deltas = deltas
        self.held = have_version if deltas else 0  # the version the proxy holds, as far as this stream knows
        self._initial = True  # the first push goes out even when the proxy holds it (an empty delta then)
        self._full_next = False
        self.sent = 0
        self.acked_nonce = 0
        self.bytes_sent = 0
        self.deltas_sent = 0  # of ``sent``, the deltas (the rest went in full)

    @property
    def region(self) -> str:
        return self.status.region

    @property
    def closed_reason(self) -> str | None:
        return self._outbox.closed_reason

    def offer(self, push: Push) -> None:
        self._outbox.offer(push)

    def close(self, reason: str) -> None:
        self._outbox.close(reason)

    def rejected(self) -> None:
        """The proxy NACKed: what it holds is unknown; the next version goes in full."""
        self.held = 0
        self._queue.clear()

    def resync(self, push: Push | None) -> None:
        """The proxy could not apply a delta: send ``push`` (the newest) in full."""
        self.rejected()
        self._full_next = True
        if push is not None:
            self._outbox.offer(push)

    def _plan(self, push: Push) -> None:
        initial, self._initial = self._initial, False
        if self._full_next or not self.deltas:
            self._full_next = False
            self._queue.append((push, False))
            return
        chain = self._feed.chain(self.held, push, compute=initial) if self.held else None
        if chain is None:
            self._queue.append((push, False))
        elif chain:
            self._queue.extend((p, True) for p in chain)
        elif initial:
            self._queue.append((push, True))  # it holds the newest: an empty delta

    async def next(self) -> Send | None:
        """The next message to send, stamped with its nonce; None once the watcher is closed."""
        while not self._queue:
            push = await self._outbox.next()
            if push is None:
                return None
            self._plan(push)
        push, as_delta = self._queue.popleft()
        body = None
        if as_delta and push.version == self.held:
            body = empty_delta(push)
        elif as_delta and push.base == self.held:
            body = await push.delta_async()
            if push.base != self.held:  # a NACK or a resync came meanwhile: what the proxy holds changed
                body = None
        if body is None:
            body, as_delta = push.full(), False
        self.sent += 1
        data = stamp(body, str(self.sent))
        self.bytes_sent += len(data)
        self.deltas_sent += as_delta
        self.held = push.version
        if not self.status.first_sent_version:
            self.status.first_sent_version = push.version
        return Send(data, push.version, as_delta)


class Watchers:
    """Open watch streams by proxy id, and the status of every proxy remembered."""

    def __init__(self, *, max_watchers: int, max_proxies: int, clock: Callable[[], float],
                 feed: Feed | None = None) -> None:
        self.feed = feed if feed is not None else Feed()
        self._max_watchers = max_watchers
        self._max_proxies = max_proxies
        self._clock = clock
        self._open: dict[str, Watcher] = {}
        self._status: dict[str, ProxyStatus] = {}

    def subscribe(self, proxy_id: str, region: str, *, deltas: bool = False, have_version: int = 0) -> Watcher:
        """A watcher for ``proxy_id`` in ``region``; the proxy's earlier stream, if any, is closed."""
        old = self._open.get(proxy_id)
        if old is None and len(self._open) >= self._max_watchers:
            raise Overloaded(f"{self._max_watchers} table watchers are open", retry_after=1.0)
        if old is not None:
            old.close(f"proxy {proxy_id!r} subscribed again on another stream")
        if proxy_id not in self._status and len(self._status) >= self._max_proxies:
            gone = [s for s in self._status.values() if not s.connected]
            del self._status[min(gone, key=lambda s: s.last_seen).proxy_id]  # max_proxies >= max_watchers
        now = self._clock()
        status = ProxyStatus(proxy_id, region, subscribed_at=now, last_seen=now)
        self._status[proxy_id] = status
        self._open[proxy_id] = watcher = Watcher(status, self.feed, deltas=deltas, have_version=have_version)
        return watcher

    def unsubscribe(self, watcher: Watcher) -> None:
        watcher.close("stream ended")
        pid = watcher.status.proxy_id
        if self._open.get(pid) is watcher:
            del self._open[pid]
            watcher.status.connected = False
            watcher.status.last_seen = self._clock()

    def regions(self) -> set[str]:
        return {w.region for w in self._open.values()}

    def of_region(self, region: str) -> list[Watcher]:
        return [w for w in self._open.values() if w.region == region]

    def statuses(self) -> list[ProxyStatus]:
        return sorted(self._status.values(), key=lambda s: s.proxy_id)

    def ack(self, watcher: Watcher, ack: tables_pb2.Ack) -> str | None:
        """Record an ack; returns the reason it was ignored, or None."""
        try:
            nonce = int(ack.nonce)
        except ValueError:
            return "ack_nonce"
        if not 0 < nonce <= watcher.sent:
            return "ack_nonce"
        if nonce <= watcher.acked_nonce:
            return "ack_stale"
        watcher.acked_nonce = nonce
        status = watcher.status
        status.last_ack_at = status.last_seen = self._clock()
        if ack.applied:
            status.applied_version = ack.version
            status.router_version, status.router_refused = ack.router_version, ack.router_refused
            status.router_error = ack.router_error[:MAX_ERROR_CHARS]
        else:
            status.last_error = (ack.error or "rejected without a reason")[:MAX_ERROR_CHARS]
            if ack.resync:
                watcher.resync(self.feed.current(watcher.region))
            else:
                watcher.rejected()
        return None

    def close_all(self, reason: str) -> None:
        for watcher in list(self._open.values()):
            watcher.close(reason)
