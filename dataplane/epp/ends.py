"""How each handed-off request ended, heard from the forwarder's reports: Envoy's gRPC access-log service.

The picker's processor stream ends with the decision (a picker that dies
afterwards cuts no stream), so the end of a request reaches it another way:
Envoy sends every picker an entry for each request as it ends, batched every
``report_flush_ms`` (:mod:`dataplane.envoy.bootstrap`), from two places:

- ``UpstreamEnd``, from the router, per attempt: the replica finished (a
  response code), or refused or reset the attempt (none: Envoy goes on down
  the fallbacks). The first answered attempt ends the request for the
  picker's accounting: the replica's slot is free although a slow client
  may still be reading what Envoy buffered.
- ``DownstreamEnd``, from the connection manager: the client has its whole
  answer, or left, or nothing could be reached; it ends what is still open.

Each entry names the request by ``x-request-id`` (which the picker sets on
the request), the endpoint that served, the status and timings. An entry for
a request this picker did not decide is skipped (every picker hears every
request). :class:`Ends` holds the decided requests until their end is heard,
bounded by ``max_pending``; one that is never heard of (a forwarder that
sends no reports, a lost batch) is closed when its deadline plus ``grace``
has passed, and counted (:meth:`Ends.sweep`). The lag of each report (now,
against the end Envoy measured) is a histogram.

Cost per request: one entry of a batch to read per picker (a dictionary
look-up for those of other pickers); memory: the pending requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, Generic, TypeVar

from envoy.data.accesslog.v3 import accesslog_pb2
from envoy.service.accesslog.v3 import als_pb2, als_pb2_grpc
from prometheus_client import CollectorRegistry, Counter, Histogram

from ferry.metrics import LATENCY_BUCKETS, name

UPSTREAM_END = accesslog_pb2.AccessLogType.UpstreamEnd
DOWNSTREAM_END = accesslog_pb2.AccessLogType.DownstreamEnd
SWEEP_SECONDS = 1.0  # how often requests past their deadline are looked for
F = TypeVar("F")


@dataclasses.dataclass(frozen=True, slots=True)
class Ended:
    """How a request ended: the HTTP status (0: none), the ``ip:port`` that served ("" : none), and how the picker
    knows: ``upstream`` (a replica answered), ``downstream`` (the client's side ended), ``expired`` (no report)."""

    status: int
    served: str
    how: str


@dataclasses.dataclass(slots=True)
class _Pending(Generic[F]):
    """A request awaiting its end: its flow, and when to give up waiting (its deadline and the grace)."""

    flow: F
    expires: float


def _address(common: Any) -> str:
    socket = common.upstream_remote_address.socket_address
    return f"{socket.address}:{socket.port_value}" if socket.port_value else ""


class Ends(als_pb2_grpc.AccessLogServiceServicer, Generic[F]):  # type: ignore[misc]
    """The requests handed off and not yet heard of as ended; the access-log servicer that hears of them."""

    def __init__(self, close: Callable[[F, Ended], None], *, registry: CollectorRegistry,
                 clock: Callable[[], float], wall: Callable[[], float] = time.time, max_pending: int = 65_536,
                 grace: float = 5.0) -> None:
        self._close = close
        self._clock = clock
        self._wall = wall
        self.max_pending = max_pending
        self.grace = grace
        self.pending: dict[str, _Pending[F]] = {}
        self.lag = Histogram(name("picker_report_lag_seconds"),
                             "From a request's end, as the forwarder measured it, to its report at the picker.",
                             ["end"], buckets=LATENCY_BUCKETS, registry=registry)
        self.expired = Counter(name("picker_report_expired_total"),
                               "Requests closed at their deadline because no report of their end came.",
                               registry=registry)
        self.refused = Counter(name("picker_report_overflow_total"),
                               "Requests decided while max_pending requests awaited their end: closed at once.",
                               registry=registry)

    def expect(self, request_id: str, flow: F, deadline: float) -> bool:
        """Hold ``flow`` until its end is heard (or ``deadline`` + ``grace``); False when ``max_pending`` are held
        already (the caller closes it itself) or the id is taken."""
        if len(self.pending) >= self.max_pending or request_id in self.pending:
            self.refused.inc()
            return False
        self.pending[request_id] = _Pending(flow, deadline + self.grace)
        return True

    def heard(self, entry: Any) -> bool:
        """One report entry (an ``HTTPAccessLogEntry``); True when it ended a pending request."""
        common = entry.common_properties
        request_id = entry.request.request_id
        pending = self.pending.get(request_id)
        if pending is None:
            return False
        kind = common.access_log_type
        status = entry.response.response_code.value
        if kind == UPSTREAM_END:
            if not status:  # an attempt refused or reset before answering: Envoy goes on down the fallbacks
                return False
            ended, last = Ended(status, _address(common), "upstream"), common.time_to_last_upstream_rx_byte
        elif kind == DOWNSTREAM_END:
            ended, last = Ended(status, _address(common), "downstream"), common.time_to_last_downstream_tx_byte
        else:
            return False
        del self.pending[request_id]
        if common.HasField("start_time"):
            end = common.start_time.ToNanoseconds() / 1e9 + last.ToNanoseconds() / 1e9
            self.lag.labels(ended.how).observe(max(0.0, self._wall() - end))
        self._close(pending.flow, ended)
        return True

    async def StreamAccessLogs(self, requests: AsyncIterator[als_pb2.StreamAccessLogsMessage],
                               context: Any) -> als_pb2.StreamAccessLogsResponse:
        async for message in requests:
            for entry in message.http_logs.log_entry:
                self.heard(entry)
        return als_pb2.StreamAccessLogsResponse()

    def sweep(self) -> int:
        """Close the requests whose deadline and grace have passed with no report; how many."""
        now = self._clock()
        late = [key for key, pending in self.pending.items() if pending.expires <= now]
        for key in late:
            pending = self.pending.pop(key)
            self.expired.inc()
            self._close(pending.flow, Ended(0, "", "expired"))
        return len(late)

    async def run(self, stop: asyncio.Event) -> None:
        """Sweep every ``SWEEP_SECONDS`` until ``stop`` is set."""
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), SWEEP_SECONDS)
            self.sweep()
