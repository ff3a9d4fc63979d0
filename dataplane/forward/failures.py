"""How a forward failed, read off its error: whether the request never reached its replica, or was served nothing.

The forward's lowest layer: :mod:`.kserve` classifies its own errors with it,
and the retry policy and budget above it (:mod:`dataplane.failover`) read the
same marks. Pure; O(marks) per error.
"""

from __future__ import annotations

from ferry.errors import FerryError, ReplicaFailed

UNREACHABLE = ("failed to connect", "connection refused")
TRANSPORT_LOST = ("socket closed", "connection reset", "broken pipe", "goaway", "connection aborted",
                  "end of tcp stream", "stream removed", "keepalive watchdog")


def _marked(error: FerryError, marks: tuple[str, ...]) -> bool:
    if not isinstance(error, ReplicaFailed) or getattr(error, "kind", "unavailable") != "unavailable":
        return False
    reason = error.reason.lower()
    return any(mark in reason for mark in marks)


def unreached(error: FerryError) -> bool:
    """Whether ``error`` says the request never reached its replica (the connection was refused or failed)."""
    return _marked(error, UNREACHABLE)


def unserved(error: FerryError) -> bool:
    """Whether the replica served nothing of the request: it was never reached, or the connection to it broke
    before any output (the replica's transport UNAVAILABLE, not an UNAVAILABLE the replica answered)."""
    return (_marked(error, UNREACHABLE + TRANSPORT_LOST) and isinstance(error, ReplicaFailed)
            and not error.output_started)
