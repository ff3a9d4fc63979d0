"""The agent's per-replica state machine (pure: plain data in, plain data out).

States (docs/design.md, vocabulary): ``warming`` -> ``ready``; ``ready`` + drain ->
``draining``; ``draining`` with nothing queued or running -> ``drained``;
undrain -> ``ready``; endpoint unreachable -> ``dead``, and back to what the
next observation says once it answers.

The operator's drain intent is kept apart from the state (``drain``), so that
a replica that dies while draining comes back draining, not ready, and a
warming replica drained before it is ready never takes work.

Transitions:

| event | condition | next state |
| --- | --- | --- |
| observed | endpoint unreachable | dead |
| observed | reachable, model not ready | warming |
| observed | ready, no drain | ready |
| observed | ready, drain, queued + running > 0 | draining |
| observed | ready, drain, queued + running == 0 | drained |
| drain | ready | draining (drained at the next idle observation) |
| drain | warming, dead, draining, drained | unchanged (intent recorded) |
| undrain | draining, drained | ready |
| undrain | warming, dead, ready | unchanged (intent cleared) |

Cost: O(1) per event.
"""

from __future__ import annotations

import dataclasses
import enum


class State(enum.StrEnum):
    """Lifecycle of a replica as its agent reports it."""

    WARMING = "warming"
    READY = "ready"
    DRAINING = "draining"
    DRAINED = "drained"
    DEAD = "dead"


class Command(enum.StrEnum):
    """Operator commands the state machine understands."""

    DRAIN = "drain"
    UNDRAIN = "undrain"


@dataclasses.dataclass(frozen=True)
class Observed:
    """One poll of a replica's endpoint."""

    reachable: bool
    ready: bool = False
    queued: int = 0
    running: int = 0


@dataclasses.dataclass(frozen=True)
class ReplicaStatus:
    """A replica's state and the operator's drain intent."""

    state: State = State.WARMING
    drain: bool = False


def observe(status: ReplicaStatus, seen: Observed) -> ReplicaStatus:
    """The status after a poll of the replica's endpoint."""
    if not seen.reachable:
        state = State.DEAD
    elif not seen.ready:
        state = State.WARMING
    elif not status.drain:
        state = State.READY
    else:
        state = State.DRAINED if seen.queued + seen.running == 0 else State.DRAINING
    return dataclasses.replace(status, state=state)


def command(status: ReplicaStatus, cmd: Command) -> ReplicaStatus:
    """The status after an operator command."""
    state: State = status.state
    if cmd is Command.DRAIN:
        return ReplicaStatus(state=State.DRAINING if state is State.READY else state, drain=True)
    return ReplicaStatus(state=State.READY if state in (State.DRAINING, State.DRAINED) else state, drain=False)
