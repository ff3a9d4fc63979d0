"""Agent streams: one session per connected node, each with a bounded queue of commands.

A session (its commands in a bounded FIFO :class:`controlplane.mailbox.Mailbox`) is
opened when a stream's ``register`` is accepted and belongs to
the member that registration created. A node that registers again on another
stream replaces the session: the earlier stream is closed with a reason and
its handler ends it with ABORTED. Commands wait in the session's outbox until
the stream's writer sends them.

Bounds and outcomes: at most ``max_streams`` (``max_agents``, 4,096) agent
streams open at once, a further one is refused with ``Overloaded``
(RESOURCE_EXHAUSTED); at most ``queue_size`` (``command_queue_size``, 64)
commands waiting per agent, a further one raises ``Overloaded`` to the caller.
Cost: O(1) per operation.
"""

from __future__ import annotations

import itertools

from controlplane.fleet.view import Member
from controlplane.mailbox import Mailbox
from ferry.errors import Overloaded
from ferry.v1 import fleet_pb2


class AgentSession:
    """The control plane's side of one registered agent stream."""

    def __init__(self, member: Member, queue_size: int) -> None:
        self.member = member
        self._limit = queue_size
        self._outbox: Mailbox[fleet_pb2.Command] = Mailbox.fifo(queue_size)

    @property
    def closed_reason(self) -> str | None:
        return self._outbox.closed_reason

    @property
    def node(self) -> str:
        return self.member.node

    def send(self, command: fleet_pb2.Command) -> None:
        """Queue ``command`` for the agent; ``Overloaded`` when the outbox is full or the stream closed."""
        if self.closed_reason is not None:
            raise Overloaded(f"agent stream of node {self.node!r} is closed: {self.closed_reason}", retry_after=1.0)
        if not self._outbox.offer(command):
            raise Overloaded(f"command queue of node {self.node!r} is full ({self._limit})", retry_after=1.0)

    async def next_command(self) -> fleet_pb2.Command | None:
        """The next command to send, or None once the session is closed."""
        return await self._outbox.next()

    def close(self, reason: str) -> None:
        self._outbox.close(reason)


class Agents:
    """Open agent streams and the session of each node."""

    def __init__(self, *, control_plane_id: str, max_streams: int, queue_size: int) -> None:
        self._id = control_plane_id
        self._max_streams = max_streams
        self._queue_size = queue_size
        self._streams = 0
        self._sessions: dict[str, AgentSession] = {}
        self._command_ids = itertools.count(1)

    def open_stream(self) -> None:
        if self._streams >= self._max_streams:
            raise Overloaded(f"{self._max_streams} agent streams are open", retry_after=1.0)
        self._streams += 1

    def close_stream(self) -> None:
        self._streams -= 1

    def attach(self, member: Member) -> AgentSession:
        """A session for ``member``; the node's earlier session, if any, is closed."""
        old = self._sessions.get(member.node)
        if old is not None:
            old.close(f"node {member.node!r} registered again on another stream")
        self._sessions[member.node] = session = AgentSession(member, self._queue_size)
        return session

    def detach(self, session: AgentSession) -> None:
        session.close("stream ended")
        if self._sessions.get(session.node) is session:
            del self._sessions[session.node]

    def get(self, node: str) -> AgentSession | None:
        return self._sessions.get(node)

    def command(self, kind: fleet_pb2.Command.Kind, replica_id: str) -> fleet_pb2.Command:
        """A new command with an id unique to this control plane."""
        return fleet_pb2.Command(command_id=f"{self._id}/{next(self._command_ids)}", kind=kind, replica_id=replica_id)

    def close_all(self, reason: str) -> None:
        for session in list(self._sessions.values()):
            session.close(reason)
