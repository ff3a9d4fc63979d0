"""What the proxies of each region are sent: every version serialized once, as a full table and as a delta.

:class:`Feed` keeps, per region, the last ``keep`` (8) versions this control
plane published or adopted, each a :class:`Push`: the snapshot, the version
before it here (its delta's base) and, computed at most once and only when a
proxy needs them, the serialized full table and the serialized delta
(:func:`controlplane.tables.delta.table_delta`; none when the table must go
in full, or when the delta would not be smaller). Every proxy of the region
is sent those same bytes with its own nonce appended (:func:`stamp`: a
protobuf message's bytes followed by one more field parse as the message
with that field set), so a change costs one serialization whatever the
number of proxies.

:meth:`Feed.chain` is the deltas that take a proxy from the version it holds
to a newer one (empty when it holds it already), or None when they are not
all kept or pass through a version whose
delta no proxy needed (a proxy behind every other: one delta computation,
O(replicas), for it alone costs more than its full table's shared bytes;
computed all the same for a proxy that subscribes with the version it holds,
as proxies moving from a control plane that stopped arrive together): the
proxy is then sent the table in full. A region that is dropped is forgotten.

Bounds: ``keep`` versions per region, the full bytes of the newest only (an
older version's are released when a newer one is published). Cost: one
delta computation (in a worker thread: the event loop keeps answering the
store and the agents meanwhile) and one serialization per version (see
:mod:`controlplane.tables.delta`), O(keep) per chain.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field

from controlplane.tables.delta import table_delta
from ferry.v1 import tables_pb2

NONCE_TAG = b"\x12"  # field 2 (TableSnapshot.nonce), wire type 2 (length-delimited)


def stamp(body: bytes, nonce: str) -> bytes:
    """``body`` (a serialized TableSnapshot without a nonce) with ``nonce`` set, without parsing it."""
    raw = nonce.encode()
    size = len(raw)
    prefix = bytearray()
    while True:
        byte = size & 0x7F
        size >>= 7
        if size:
            prefix.append(byte | 0x80)
        else:
            prefix.append(byte)
            break
    return body + NONCE_TAG + bytes(prefix) + raw


@dataclass(eq=False)
class Push:
    """One version of a region's table as its proxies get it; ``base`` is the version before it here (0: none)."""

    snapshot: tables_pb2.TableSnapshot
    base: int
    _previous: tables_pb2.TableSnapshot | None = field(default=None, repr=False)
    _full: bytes | None = field(default=None, repr=False)
    _delta: bytes | None = field(default=None, repr=False)
    _delta_done: bool = False
    _computing: asyncio.Future[None] | None = field(default=None, repr=False)
    full_size: int = 0

    @property
    def version(self) -> int:
        return self.snapshot.version

    @property
    def region(self) -> str:
        return self.snapshot.region

    def full(self) -> bytes:
        """The whole table, serialized once (nonce unset)."""
        if self._full is None:
            self._full = bytes(self.snapshot.SerializeToString())
            self.full_size = len(self._full)
        return self._full

    def size(self) -> int:
        """The bytes of the whole table."""
        if not self.full_size:
            self.full_size = self.snapshot.ByteSize()
        return self.full_size

    def delta(self) -> bytes | None:
        """The delta from ``base``, serialized once (nonce unset); None when the table goes in full.

        Computed here, on the caller's thread, if it was not yet: the watchers use :meth:`delta_async`.
        """
        if not self._delta_done:
            self._compute()
        return self._delta

    async def delta_async(self) -> bytes | None:
        """:meth:`delta`, computed once in a worker thread: the event loop (store answers, agents' streams)
        is not held for the O(replicas) comparison; every watcher awaiting it shares the one computation."""
        if not self._delta_done:
            if self._computing is None:
                self._computing = asyncio.ensure_future(asyncio.to_thread(self._compute))
            await asyncio.shield(self._computing)
        return self._delta

    def _compute(self) -> None:
        previous, self._previous = self._previous, None  # the delta is all that is needed of it now
        if previous is not None:
            message = table_delta(previous, self.snapshot)
            if message is not None:
                raw = bytes(message.SerializeToString())
                self._delta = raw if len(raw) < self.size() else None
        self._delta_done = True

    @property
    def delta_ready(self) -> bool:
        """Whether the delta was computed already (it may be None: the table goes in full)."""
        return self._delta_done

    def release(self) -> None:
        """A newer version exists: keep the delta, let the full bytes go."""
        self._full = None


def empty_delta(push: Push) -> bytes:
    """A delta from ``push``'s version to itself (a proxy that subscribes holding the current version)."""
    message = tables_pb2.TableSnapshot(version=push.version, region=push.region, computed_at=push.snapshot.computed_at)
    message.delta.base_version = push.version
    return bytes(message.SerializeToString())


class Feed:
    """The last versions of each region, their full and delta bytes."""

    def __init__(self, keep: int = 8) -> None:
        self._keep = max(1, keep)
        self._regions: dict[str, deque[Push]] = {}

    def publish(self, snapshot: tables_pb2.TableSnapshot) -> Push:
        """A new version of a region (published or adopted); its delta's base is the version before it here."""
        kept = self._regions.setdefault(snapshot.region, deque(maxlen=self._keep))
        last = kept[-1] if kept else None
        if last is not None and last.version == snapshot.version:
            return last
        push = Push(snapshot, base=last.version if last is not None else 0,
                    _previous=last.snapshot if last is not None else None)
        if last is not None:
            last.release()
        kept.append(push)
        return push

    def current(self, region: str) -> Push | None:
        """The newest version of ``region`` here, or None."""
        kept = self._regions.get(region)
        return kept[-1] if kept else None

    def drop(self, region: str) -> None:
        """Forget ``region`` (it has neither nodes nor watchers any more)."""
        self._regions.pop(region, None)

    def chain(self, held: int, target: Push, *, compute: bool = False) -> list[Push] | None:
        """The pushes whose deltas lead from ``held`` to ``target`` (oldest first), or None (send it in full).

        Nothing is computed here. Unless ``compute`` (a proxy that subscribes with the version it holds),
        every push before ``target`` must have its delta computed already: a chain through a version whose
        delta no proxy needed (every proxy skipped it) goes in full rather than cost a computation for one
        proxy behind. A push whose delta turns out to be None is sent in full when its turn comes.
        """
        if held == target.version:
            return []
        by_version = {p.version: p for p in self._regions.get(target.region, ())}
        path = [target]
        while path[-1].base != held:
            earlier = by_version.get(path[-1].base)
            if path[-1].base == 0 or earlier is None or len(path) >= self._keep:
                return None
            if not compute and not (earlier.delta_ready and earlier.delta() is not None):
                return None
            path.append(earlier)
        path.reverse()
        return path
