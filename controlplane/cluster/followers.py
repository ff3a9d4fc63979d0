"""The leader's side of ``Admin.Follow``: one session per follower control plane.

A session holds what the follower last reported (its regions, when) and a
keep-latest :class:`controlplane.mailbox.Mailbox` of tables to send, one slot per region: a newer table of a region
replaces one not yet sent, so a slow follower gets the latest version of each
region, never a backlog. A follower that opens a second stream replaces its
first, which is closed with a reason.

Bounds and outcomes: at most ``max_followers`` (16) sessions, a further one
raises ``Overloaded`` (RESOURCE_EXHAUSTED); regions per session at most
``max_regions`` (256, more are ignored). Cost: O(sessions) per published
table, O(1) per report.
"""

from __future__ import annotations

from collections.abc import Callable

from controlplane.mailbox import Mailbox
from ferry.errors import Overloaded
from ferry.v1 import tables_pb2


class FollowerSession:
    """One follower's stream: its reported regions and the tables waiting to be sent."""

    def __init__(self, cp_id: str, now: float) -> None:
        self.cp_id = cp_id
        self.opened_at = now
        self.last_report_at = now
        self.regions: frozenset[str] = frozenset()
        self._outbox: Mailbox[tables_pb2.TableSnapshot] = Mailbox.latest(key=lambda s: s.region)

    @property
    def closed_reason(self) -> str | None:
        return self._outbox.closed_reason

    def offer(self, snapshot: tables_pb2.TableSnapshot) -> None:
        self._outbox.offer(snapshot)

    def close(self, reason: str) -> None:
        self._outbox.close(reason)

    async def next(self) -> tables_pb2.TableSnapshot | None:
        """The next table to send (regions in name order); None once the session is closed."""
        return await self._outbox.next()


class Followers:
    """Open follower sessions by control-plane id."""

    def __init__(self, *, max_followers: int, clock: Callable[[], float], max_regions: int = 256) -> None:
        self._max = max_followers
        self._clock = clock
        self._max_regions = max_regions
        self._open: dict[str, FollowerSession] = {}

    def attach(self, cp_id: str) -> FollowerSession:
        old = self._open.get(cp_id)
        if old is None and len(self._open) >= self._max:
            raise Overloaded(f"{self._max} follower streams are open", retry_after=1.0)
        if old is not None:
            old.close(f"control plane {cp_id!r} follows again on another stream")
        self._open[cp_id] = session = FollowerSession(cp_id, self._clock())
        return session

    def detach(self, session: FollowerSession) -> None:
        session.close("stream ended")
        if self._open.get(session.cp_id) is session:
            del self._open[session.cp_id]

    def reported(self, session: FollowerSession, regions: list[str]) -> None:
        session.last_report_at = self._clock()
        session.regions = frozenset(sorted(regions)[: self._max_regions])

    def offer(self, snapshot: tables_pb2.TableSnapshot) -> None:
        for session in self._open.values():
            session.offer(snapshot)

    def regions(self) -> set[str]:
        return {r for s in self._open.values() for r in s.regions}

    def sessions(self) -> list[FollowerSession]:
        return sorted(self._open.values(), key=lambda s: s.cp_id)

    def close_all(self, reason: str) -> None:
        for session in list(self._open.values()):
            session.close(reason)
