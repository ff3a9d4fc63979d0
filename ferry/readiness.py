"""Readiness and drain of one gRPC server: its health (``grpc.health.v1``) says whether it can do its job.

:class:`Readiness` is the server's ``grpc.health.v1.Health`` servicer, one
status for every service of the server (and for the server as a whole, the
empty name): ``Check`` answers it, ``Watch`` streams each change. A server
starts NOT_SERVING when it is built with ``ready=False`` and turns SERVING
when its owner says it can do its job (:meth:`Readiness.set`, no I/O: the proxy once
a table is applied, the control plane while its store answers and a leader
is known); it goes back to NOT_SERVING when the owner says so.
:meth:`Readiness.drain` is the first step of a graceful stop: NOT_SERVING
for good (later :meth:`set` calls are ignored), every ``Watch`` stream gets
NOT_SERVING and then ends (so that it does not hold the server's grace
open), and the owner keeps serving for ``delay`` seconds, so that load
balancers take the endpoint out before it stops accepting.

:class:`DrainTimes` is the pair of settings both planes read
(``drain_delay_seconds``: serve that long after NOT_SERVING;
``drain_grace_seconds``: then let calls in flight finish that long, default
60 s), checked here once: each must be within 0 to :data:`MAX_DRAIN_SECONDS`,
and a bad one raises ConfigError naming ``<section>.<key>``.
Cost: O(services) per change, O(watchers) notified.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Sequence
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from ferry.errors import ConfigError

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
MAX_DRAIN_SECONDS = 3600.0  # an hour: a bound for either setting (rule 4)
MAX_WATCHERS = 1024  # Watch streams open at once; more are refused RESOURCE_EXHAUSTED


@dataclasses.dataclass(frozen=True, kw_only=True)
class DrainTimes:
    """How a server stops on SIGTERM: serve ``delay`` s after NOT_SERVING, then give calls ``grace`` s."""

    delay: float = 0.0
    grace: float = 60.0

    @classmethod
    def checked(cls, delay: float, grace: float, section: str) -> DrainTimes:
        """Both values within 0 to :data:`MAX_DRAIN_SECONDS`; ConfigError naming ``section.drain_*`` otherwise."""
        for key, value in (("drain_delay_seconds", delay), ("drain_grace_seconds", grace)):
            if not 0 <= value <= MAX_DRAIN_SECONDS:  # also rejects NaN
                raise ConfigError(f"{section}.{key}", f"must be seconds from 0 to {MAX_DRAIN_SECONDS:g}")
        return cls(delay=float(delay), grace=float(grace))


class Readiness(health_pb2_grpc.HealthServicer):  # type: ignore[misc]
    """One server's health: one status for all its services; see the module docstring.

    ``ready``: the status at start (True: SERVING). ``names``: the services it answers for (the empty
    name, the server as a whole, is always among them); another name is NOT_FOUND, as the protocol says.
    """

    def __init__(self, *, ready: bool = True, names: Sequence[str] = ()) -> None:
        self.names = frozenset(("", *names))
        self.live: frozenset[str] = frozenset()  # names that say only that the process answers: always SERVING
        self.serving = ready
        self.draining = False
        self._changed = asyncio.Event()  # set, and replaced, at each change
        self._version = 0  # counts changes, so a watcher misses none
        self._watchers = 0

    def add_names(self, names: Sequence[str], *, live: bool = False) -> None:
        """Answer for these services too (the server's, known once they are registered).

        ``live``: liveness names (the endpoint-picker protocol's ``liveness``), SERVING while the process
        answers at all, whatever the readiness."""
        self.names = self.names | frozenset(names)
        if live:
            self.live = self.live | frozenset(names)

    @property
    def status(self) -> health_pb2.HealthCheckResponse.ServingStatus.ValueType:
        return SERVING if self.serving and not self.draining else NOT_SERVING

    def set(self, serving: bool) -> None:
        """SERVING or NOT_SERVING from now on (ignored once draining); watchers are told of a change."""
        if self.draining or serving == self.serving:
            return
        self.serving = serving
        self._notify()

    async def drain(self, delay: float = 0.0) -> None:
        """NOT_SERVING for good, watch streams ended, then ``delay`` seconds while the server still serves."""
        if not self.draining:
            self.draining = True
            self._notify()
        if delay > 0:
            await asyncio.sleep(delay)

    def _notify(self) -> None:
        self._version += 1
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def Check(self, request: health_pb2.HealthCheckRequest, context: Any) -> health_pb2.HealthCheckResponse:
        if request.service not in self.names:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"service: unknown service {request.service[:128]!r}")
        return health_pb2.HealthCheckResponse(status=SERVING if request.service in self.live else self.status)

    async def Watch(self, request: health_pb2.HealthCheckRequest,
                    context: Any) -> AsyncIterator[health_pb2.HealthCheckResponse]:
        if self._watchers >= MAX_WATCHERS:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                f"too many health watchers (limit {MAX_WATCHERS})")
        known = request.service in self.names
        self._watchers += 1
        try:
            last = None
            while True:
                seen = self._version
                status = (health_pb2.HealthCheckResponse.SERVICE_UNKNOWN if not known
                          else SERVING if request.service in self.live else self.status)
                if status != last:
                    yield health_pb2.HealthCheckResponse(status=status)
                    last = status
                if self.draining:
                    return  # NOT_SERVING was sent: the stream ends, the server's grace is for real work
                if self._version == seen:  # nothing changed while the answer was written
                    await self._changed.wait()
        finally:
            self._watchers -= 1
