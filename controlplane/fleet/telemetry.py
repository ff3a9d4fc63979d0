"""Hostile-telemetry checks: every load value typed, in range and about a replica the node holds.

Applied to each ``Telemetry`` message before any of it reaches the fleet
view, so one bad value rejects the whole message (INVALID_ARGUMENT naming the
field, e.g. ``telemetry.replicas[1].gpu_utilization``) and nothing of it is
applied. Checks, per load:

- ``replica_id``: at most once per message. A load of a replica the node does
  not hold (never registered, or lost to a conflict) is not an error here: the
  fleet view ignores it and counts it (``unknown_replica``), so it never
  reaches the table, and an agent that raced a removal is not disconnected;
- ``state``: a known enum value;
- ``gpu_utilization``: finite, in [0, 1];
- ``queued``, ``running``: at most :data:`MAX_REQUESTS`; ``kv_blocks_total``
  at most :data:`MAX_KV_BLOCKS` and ``kv_blocks_free`` at most it;
- at most ``max_replicas_per_node`` loads per message.

:class:`TelemetryRate` bounds messages per stream with a token bucket
(``rate`` per second, ``burst``); over it, :class:`ferry.errors.Overloaded`
with a retry-after. Pure, the clock injected. Cost: O(loads).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from ferry.errors import InvalidArgument, Overloaded
from ferry.v1 import common_pb2, fleet_pb2

MAX_REQUESTS = 1_000_000  # queued or running on one replica
MAX_KV_BLOCKS = 1 << 26
STATES = frozenset(common_pb2.ReplicaState.values())


def check_loads(telemetry: fleet_pb2.Telemetry, max_loads: int) -> None:
    """Raise InvalidArgument naming the first hostile field of ``telemetry.replicas``."""
    if len(telemetry.replicas) > max_loads:
        raise InvalidArgument("telemetry.replicas", f"more than {max_loads} loads")
    seen: set[str] = set()
    for i, load in enumerate(telemetry.replicas):
        field = f"telemetry.replicas[{i}]"
        if load.replica_id in seen:
            raise InvalidArgument(f"{field}.replica_id", "appears twice")
        seen.add(load.replica_id)
        if load.state not in STATES:
            raise InvalidArgument(f"{field}.state", f"unknown state {load.state}")
        u = load.gpu_utilization
        if not math.isfinite(u) or not 0.0 <= u <= 1.0:
            raise InvalidArgument(f"{field}.gpu_utilization", f"{u!r} is not in [0, 1]")
        for name in ("queued", "running"):
            if getattr(load, name) > MAX_REQUESTS:
                raise InvalidArgument(f"{field}.{name}", f"more than {MAX_REQUESTS}")
        if load.kv_blocks_total > MAX_KV_BLOCKS:
            raise InvalidArgument(f"{field}.kv_blocks_total", f"more than {MAX_KV_BLOCKS}")
        if load.kv_blocks_free > load.kv_blocks_total:
            raise InvalidArgument(f"{field}.kv_blocks_free", "more than kv_blocks_total")


class TelemetryRate:
    """A token bucket of telemetry messages for one agent stream."""

    def __init__(self, *, rate: float = 50.0, burst: float = 100.0, clock: Callable[[], float]) -> None:
        self._rate = rate
        self._burst = burst
        self._tokens = burst
        self._clock = clock
        self._at = clock()

    def take(self) -> None:
        """Spend one message or raise Overloaded with the seconds until one is allowed."""
        now = self._clock()
        self._tokens = min(self._burst, self._tokens + (now - self._at) * self._rate)
        self._at = now
        if self._tokens < 1.0:
            raise Overloaded(f"telemetry: more than {self._rate:g} messages per second",
                             retry_after=(1.0 - self._tokens) / self._rate)
        self._tokens -= 1.0
